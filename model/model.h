/*
 * model: the GPT that volley trains, its AdamW optimiser, and the byte data
 * sampler. A GPT-2 style decoder (pre-LayerNorm blocks, learned positions,
 * GELU MLP, tied input/output embeddings) over a byte vocabulary by default.
 * The coordinator uses it to initialise, load, evaluate and save the global
 * model; peers use it to train locally. Parameters live in one flat float
 * vector (in tensor-table order), which is also what updates are computed
 * over, and tensors carry the Hugging Face GPT-2 names so checkpoints load
 * in transformers.GPT2LMHeadModel.
 *
 * A model_gpt is not thread safe: one thread at a time. The passes run on
 * the kernels' OpenMP threads (OMP_NUM_THREADS or kernels_set_num_threads
 * in kernels/kernels.h); results are bitwise reproducible for a given
 * thread count. Functions that can fail return 0 or a negative VL_E* code
 * and describe the failure in err (which may be NULL).
 */
#ifndef VOLLEY_MODEL_H
#define VOLLEY_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* ---- configuration ---------------------------------------------------------- */

typedef struct model_gpt_config {
    int vocab_size; /* V: 256 for bytes, 50257 for GPT-2 tokens */
    int block_size; /* T_max: longest context (rows of wpe) */
    int n_layer;    /* L */
    int n_head;     /* NH; n_embd must be a multiple of it */
    int n_embd;     /* C */
} model_gpt_config;

/* Bounds model_gpt_config_validate enforces. */
#define MODEL_MAX_VOCAB (1 << 20)
#define MODEL_MAX_BLOCK 8192
#define MODEL_MAX_LAYER 256
#define MODEL_MAX_EMBD 16384
#define MODEL_MAX_PARAMS ((size_t)1 << 34)

/* The default byte model: V 256, context 64, 2 layers, 4 heads, width 128. */
model_gpt_config model_gpt_config_default(void);

/* Checks ranges and n_embd % n_head == 0 and that the parameter count stays
 * under MODEL_MAX_PARAMS. Returns 0 or VL_EINVAL. */
int model_gpt_config_validate(const model_gpt_config *cfg, vl_error *err) VL_MUST_CHECK;

/* Number of parameters the configuration has (0 if it is invalid). */
size_t model_gpt_config_num_params(const model_gpt_config *cfg);

/* ---- tensor table ----------------------------------------------------------- */

#define MODEL_TENSOR_NAME_MAX 64
#define MODEL_TENSOR_MAX_DIMS 2

/* One parameter tensor: a view of numel floats at offset into the flat
 * parameter (and gradient, and optimiser state) vector. */
typedef struct model_tensor {
    char name[MODEL_TENSOR_NAME_MAX]; /* Hugging Face GPT-2 name, e.g. "h.0.attn.c_attn.weight" */
    int ndim;                         /* 1 or 2 */
    size_t shape[MODEL_TENSOR_MAX_DIMS];
    size_t offset; /* in floats */
    size_t numel;
} model_tensor;

/* ---- the model ---------------------------------------------------------------- */

typedef struct model_gpt model_gpt;

/* Validates cfg and creates a model with zeroed parameters (call
 * model_gpt_init_weights or model_gpt_load_safetensors next). Gradients and
 * activations are allocated on first use, so a model that is only
 * evaluated never pays for gradient memory. On success *out is owned by the
 * caller and released with model_gpt_destroy. */
int model_gpt_create(const model_gpt_config *cfg, model_gpt **out, vl_error *err) VL_MUST_CHECK;

/* Frees everything the model owns. NULL is a no-op. */
void model_gpt_destroy(model_gpt *m);

/* GPT-2 initialisation from the deterministic common rng (same seed, same
 * weights on every machine): weights normal(0, 0.02), the residual output
 * projections (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2 n_layer),
 * LayerNorm weights 1, all biases 0. */
void model_gpt_init_weights(model_gpt *m, uint64_t seed);

/* The configuration the model was created with. */
model_gpt_config model_gpt_config_get(const model_gpt *m);

/* Total number of parameters (length of the params/grads vectors). */
size_t model_gpt_num_params(const model_gpt *m);

/* The flat parameter vector (model_gpt_num_params floats, tensor-table
 * order), owned by the model; callers may read and write it in place. */
float *model_gpt_params(model_gpt *m);

/* The flat gradient vector, laid out like the parameters and owned by the
 * model; NULL until the first model_gpt_zero_grad or model_gpt_backward
 * allocated it. */
float *model_gpt_grads(model_gpt *m);

/* Sets *out to the model's tensor table (owned by the model, valid until it
 * is destroyed) and returns the number of tensors (2 + 12 n_layer + 2). */
int model_gpt_tensors(const model_gpt *m, const model_tensor **out);

/* Table entry with the given name, or NULL. */
const model_tensor *model_gpt_find_tensor(const model_gpt *m, const char *name);

/* Forward pass over inputs[B,T] (row-major token ids in [0, vocab)).
 * 1 <= T <= block_size. With targets[B,T] (same range) it also computes the
 * mean cross-entropy into *loss and keeps what model_gpt_backward needs;
 * with targets NULL only the logits are produced and loss may be NULL.
 * Activation memory is planned for the largest B*T seen so far and reused.
 * Returns 0, VL_EINVAL for bad shapes or token ids, VL_ENOMEM. */
int model_gpt_forward(model_gpt *m, const int *inputs, const int *targets, int B, int T,
                      float *loss, vl_error *err) VL_MUST_CHECK;

/* The [B,T,V] output of the last forward pass, owned by the model and valid
 * until the next forward or backward: logits when it ran without targets,
 * softmax probabilities when it ran with them. NULL before any forward. */
const float *model_gpt_output(const model_gpt *m);

/* Backward pass for the last forward-with-targets: ADDS the gradient of the
 * mean loss into the gradient vector (allocating it, zeroed, on first use),
 * so several backward passes accumulate. Consumes the forward state: a
 * second backward needs a new forward. Returns 0, VL_EINVAL when there is
 * no forward-with-targets to differentiate, VL_ENOMEM. */
int model_gpt_backward(model_gpt *m, vl_error *err) VL_MUST_CHECK;

/* Zeroes the gradient vector, allocating it on first use. Returns 0 or
 * VL_ENOMEM. */
int model_gpt_zero_grad(model_gpt *m, vl_error *err) VL_MUST_CHECK;

/* Mean next-byte loss over consecutive windows of a byte string (each byte
 * is a token, so the vocabulary must be at least 256): window i has inputs
 * bytes[i*T, i*T+T) and targets one byte later. Windows are processed B at
 * a time, at most max_batches batches (<= 0: all windows); every token
 * counts equally. Deterministic. Clobbers the forward state (a backward
 * afterwards fails). Requires len >= T+1. */
int model_gpt_eval_bytes(model_gpt *m, const uint8_t *bytes, size_t len, int B, int T,
                         int max_batches, float *mean_loss, vl_error *err) VL_MUST_CHECK;

/* ---- checkpoints (safetensors) ------------------------------------------------ */

/* Adds every parameter tensor to w as F32 under its Hugging Face name. The
 * tensor data points into the model, which must stay alive and unchanged
 * until st_writer_finish returns. */
int model_gpt_write_safetensors(const model_gpt *m, st_writer *w) VL_MUST_CHECK;

/* Adds the file-level metadata that makes a checkpoint self-describing:
 * "format" = "pt" (required by transformers) and the configuration as
 * "volley.vocab_size", "volley.block_size", "volley.n_layer",
 * "volley.n_head", "volley.n_embd". Optional; call once per writer. */
int model_gpt_write_config_meta(const model_gpt *m, st_writer *w) VL_MUST_CHECK;

/* Reads the configuration written by model_gpt_write_config_meta back from
 * a parsed file and validates it. VL_ENOTFOUND when a key is missing. */
int model_gpt_config_from_safetensors(const st_file *f, model_gpt_config *cfg,
                                      vl_error *err) VL_MUST_CHECK;

/* Loads every parameter by name from a parsed file. Each tensor must be
 * present with exactly the table's shape and dtype F32 or F16, no other
 * tensor may be present, and every value must be finite. On any failure the
 * model is left unchanged. Returns 0, VL_ENOTFOUND (missing tensor),
 * VL_EINVAL (extra tensor, shape or dtype), VL_ERANGE (NaN/Inf), VL_ENOMEM. */
int model_gpt_load_safetensors(model_gpt *m, const st_file *f, vl_error *err) VL_MUST_CHECK;

/* ---- AdamW -------------------------------------------------------------------- */

/* AdamW state for a parameter vector of n floats. The fields are public so
 * a caller can change lr (schedules) between steps. m and v are one
 * allocation owned by the optimiser (m = state, v = state + n). */
typedef struct model_adamw {
    float *m;
    float *v;
    size_t n;
    float lr, beta1, beta2, eps, weight_decay;
    long step; /* steps taken so far */
} model_adamw;

/* Allocates zeroed state. Weight decay is applied to 2-D tensors only (all
 * matmul weights and both embeddings, as in GPT-2/nanoGPT); biases and
 * LayerNorm parameters are never decayed. Returns 0, VL_EINVAL (bad
 * hyper-parameters or n == 0), VL_ENOMEM. On failure opt is left empty
 * (model_adamw_free is still safe). */
int model_adamw_init(model_adamw *opt, size_t n, float lr, float beta1, float beta2, float eps,
                     float weight_decay, vl_error *err) VL_MUST_CHECK;

/* One step on the model's parameters with its current gradients. Fails
 * with VL_EINVAL when n differs from the model's parameter count or the
 * model has no gradients yet. */
int model_adamw_step(model_adamw *opt, model_gpt *m, vl_error *err) VL_MUST_CHECK;

/* Zeroes m, v and the step count (a fresh optimiser, memory kept). */
void model_adamw_reset(model_adamw *opt);

/* Releases the state; opt becomes empty. Safe on a zeroed or freed struct. */
void model_adamw_free(model_adamw *opt);

/* ---- data --------------------------------------------------------------------- */

/* Draws B windows of T+1 consecutive bytes at uniformly random offsets
 * (with replacement) using r: inputs[b*T + t] = window[t], targets[b*T + t]
 * = window[t+1]. inputs and targets are caller-owned arrays of B*T ints.
 * Requires B >= 1, T >= 1 and len >= T+1; returns 0 or VL_EINVAL. */
int model_data_sample(const uint8_t *bytes, size_t len, int B, int T, rng *r, int *inputs,
                      int *targets, vl_error *err) VL_MUST_CHECK;

#endif
