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
#include "compress/compress.h"

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

/* Appends the n tensors of a table, read from params (which must stay
 * valid until st_writer_finish), to w as F32. Returns st_writer_add's
 * result. */
int model_tensors_write(const model_tensor *tensors, int n, const float *params,
                        st_writer *w) VL_MUST_CHECK;

/* Reads a table's tensors from f into params (num_params floats): every
 * name, shape and dtype (F32 or F16) is checked and every value converted
 * before params changes, so a bad file leaves it as it was. `what` names
 * the file in messages. Returns 0, VL_ENOTFOUND (missing tensor),
 * VL_EINVAL (extra tensor, shape or dtype), VL_ERANGE (NaN/Inf),
 * VL_ENOMEM. */
int model_tensors_load(const model_tensor *tensors, int n, size_t num_params, float *params,
                       const st_file *f, const char *what, vl_error *err) VL_MUST_CHECK;

/* ---- the model ---------------------------------------------------------------- */

typedef struct model_gpt model_gpt;

/* Validates cfg and creates a model with zeroed parameters (call
 * model_gpt_init_weights or model_gpt_load_safetensors next). Gradients and
 * activations are allocated on first use, so a model that is only
 * evaluated never pays for gradient memory. On success *out is owned by the
 * caller and released with model_gpt_free. */
int model_gpt_create(const model_gpt_config *cfg, model_gpt **out, vl_error *err) VL_MUST_CHECK;

/* Frees everything the model owns. NULL is a no-op. */
void model_gpt_free(model_gpt *m);

/* GPT-2 initialisation from the deterministic common vl_rng (same seed, same
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

/* Observer of one linear layer y = x W + b during model_gpt_backward, for
 * curvature estimates such as K-FAC, which need per-layer inputs and output
 * gradients that the backward pass keeps only briefly (it reuses one
 * scratch buffer per kind across layers). weight_name is the layer's
 * weight in the tensor table ("h.0.attn.c_attn.weight"); x [n,in] is the
 * layer's input and dy [n,out] the gradient of the mean loss with respect
 * to its output (bias included), n = B*T, row-major, W being [in,out]. So
 * the pass adds x^T dy to the weight's gradient and dy's column sums to the
 * bias's. x, dy and weight_name are owned by the model and valid only
 * during the call; the parameter gradients may or may not yet include this
 * layer's contribution. Runs on the caller's thread, inside backward, so
 * it must not run a pass on, or change, the model. */
typedef void (*model_gpt_linear_fn)(void *ctx, const char *weight_name, const float *x,
                                    const float *dy, int n, int in, int out);

/* Installs fn (with ctx passed back to it) to be called by every later
 * model_gpt_backward once per plain linear layer: for each block i,
 * h.i.mlp.c_proj, h.i.mlp.c_fc, h.i.attn.c_proj, h.i.attn.c_attn, in that
 * order, from the last block down to block 0 (the order backward reaches
 * them), so 4 n_layer calls a pass. The tied LM head is not reported: it
 * multiplies by wte transposed, without a bias, and wte also takes the
 * embedding gradient, so it is not a product of this form. fn NULL turns the
 * hook off; unset, it costs one not-taken branch per linear layer. */
void model_gpt_set_linear_hook(model_gpt *m, model_gpt_linear_fn fn, void *ctx);

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

/* model_gpt_eval_bytes over n tokens (each < vocab_size), for token
 * shards: the same windows, batches and averaging. */
int model_gpt_eval_tokens(model_gpt *m, const uint16_t *tokens, size_t n, int B, int T,
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
int model_data_sample(const uint8_t *bytes, size_t len, int B, int T, vl_rng *r, int *inputs,
                      int *targets, vl_error *err) VL_MUST_CHECK;

/* ---- token shards (shard.c) ------------------------------------------------------ */

/* A training set of GPT-2 (or other) tokens in llm.c's shard format, read
 * from disk window by window so a multi-gigabyte shard costs no memory: a
 * header of 256 little-endian int32 (magic MODEL_SHARD_MAGIC, version
 * MODEL_SHARD_VERSION, token count N, the rest unused) followed by N
 * little-endian uint16 tokens, and nothing else. A model_shard is used by
 * one thread at a time. */
typedef struct model_shard model_shard;

#define MODEL_SHARD_MAGIC 20240520
#define MODEL_SHARD_VERSION 1
#define MODEL_SHARD_HEADER_BYTES 1024
/* The validating scan reads the tokens this many bytes at a time. */
#define MODEL_SHARD_CHUNK_BYTES ((size_t)1 << 20)

/* Writes the header of a shard of ntok tokens (1 <= ntok <= INT32_MAX)
 * into out: magic, version and ntok as little-endian int32, zeros after.
 * Returns 0 or VL_EINVAL. */
int model_shard_header(uint8_t out[MODEL_SHARD_HEADER_BYTES], int64_t ntok) VL_MUST_CHECK;

/* Opens path and validates all of it before anything trains on it: the
 * header (present, magic, version, N >= 1), the file size (exactly
 * 1024 + 2N bytes, so a truncated download or trailing bytes are caught)
 * and every token < vocab_size (1 <= vocab_size <= MODEL_MAX_VOCAB), in
 * one sequential pass of MODEL_SHARD_CHUNK_BYTES reads. Every message
 * names the file; a bad token's message gives its index and value. On
 * success *out is owned by the caller (release with model_shard_close),
 * and keeps the file open; on failure *out is NULL. Returns 0,
 * VL_ENOTFOUND (no such file), VL_EIO (cannot open or read, or the file
 * shrank while being read), VL_EINVAL (not a regular file, bad header,
 * size or token, bad vocab_size), VL_ENOMEM. */
int model_shard_open(const char *path, int vocab_size, model_shard **out,
                     vl_error *err) VL_MUST_CHECK;

/* The number of tokens N in the shard. */
int64_t model_shard_tokens(const model_shard *s);

/* model_data_sample for a shard: B windows of T+1 consecutive tokens at
 * uniformly random offsets in [0, N-T) (with replacement), drawn from r
 * exactly as model_data_sample draws them for a byte string of length N,
 * so a seed gives the same offsets in both. inputs[b*T + t] = window[t],
 * targets[b*T + t] = window[t+1]; both are caller-owned arrays of B*T ints.
 * Each window is one pread of 2(T+1) bytes. Tokens are checked against
 * vocab_size again, since the file may have changed since it was opened.
 * Requires B >= 1, T >= 1 and N >= T+1. Returns 0, VL_EINVAL (bad
 * arguments, or a token out of range), VL_EIO (read failed or the file
 * shrank), VL_ENOMEM; on failure inputs and targets are unspecified. */
int model_shard_sample(model_shard *s, int B, int T, vl_rng *r, int *inputs, int *targets,
                       vl_error *err) VL_MUST_CHECK;

/* Reads the n consecutive tokens starting at token offset into out
 * (caller-owned, n entries), checking each against vocab_size again.
 * Requires 0 <= offset and offset + n <= N. Returns 0, VL_EINVAL (range
 * or token), VL_EIO, VL_ENOMEM; on failure out is unspecified. */
int model_shard_read(model_shard *s, int64_t offset, size_t n, uint16_t *out,
                     vl_error *err) VL_MUST_CHECK;

/* Closes the file and frees the shard. NULL is a no-op. */
void model_shard_close(model_shard *s);

/* ---- MLP classifier and federated data (mlp.c) ------------------------------------- */

/* A multi-layer perceptron classifier for the federated-learning
 * experiments: x[D] -> (Linear -> GELU) x n_hidden -> Linear -> logits[C],
 * trained on the mean softmax cross-entropy over a batch. GELU is the
 * kernels' tanh approximation (kernels_gelu_forward). Like the GPT, the
 * parameters are one flat float vector in tensor-table order ("fc.0.weight"
 * [D,h0], "fc.0.bias" [h0], ..., "fc.<n_hidden>.weight" [h_last,C], then its
 * bias; weights [in,out] row-major as in kernels.h), and the gradients a
 * second vector with the same layout. Not thread safe; results are bitwise
 * reproducible for a given thread count.
 *
 * Optionally a small CNN: n_conv layers Conv2d -> GELU (NCHW, zero padding
 * kernel/2, kernels_conv2d_forward) first, on x read as an image [C,H,W] =
 * image[], the dense layers taking the last one's [channels, H', W']
 * output flattened. Layers are numbered conv first, then the dense hidden
 * layers, then the classifier: model_mlp_config_num_layers = n_conv +
 * n_hidden + 1. Conv layer i's tensors are "conv.<i>.weight" [channels,
 * C_in*kernel*kernel] (PyTorch's [out, in, k, k] in memory order) and
 * "conv.<i>.bias"; dense layers keep fc.0 .. fc.<n_hidden>, counted among
 * the dense ones, so a model without conv layers is the plain MLP. The
 * table and flat vector go in layer order: entries 2l and 2l+1 are layer
 * l's weight and bias. */

#define MODEL_MLP_MAX_HIDDEN 4
#define MODEL_MLP_MAX_CONV 4 /* conv layers, in front of the dense ones */
#define MODEL_MLP_MAX_LAYERS (MODEL_MLP_MAX_CONV + MODEL_MLP_MAX_HIDDEN + 1) /* all kinds */
#define MODEL_MLP_MAX_WIDTH (1 << 16) /* bound on D, every layer's output width and C */
#define MODEL_MLP_MAX_PARAMS ((size_t)1 << 30)
#define MODEL_MLP_MAX_KERNEL 15
#define MODEL_MLP_MAX_STRIDE 8
/* Bound on one image's conv scratch (kernels_conv2d_scratch_floats), 16 MB:
 * im2col is k*k times a layer's input, up to 15*15 * 2^16 floats. */
#define MODEL_MLP_MAX_CONV_SCRATCH ((size_t)1 << 22)

/* One convolution layer of model_mlp_config. */
typedef struct model_mlp_conv {
    int channels; /* output channels, >= 1 (the output C*H'*W' <= MODEL_MLP_MAX_WIDTH) */
    int kernel;   /* square kernel side, 1 .. MODEL_MLP_MAX_KERNEL */
    int stride;   /* 1 .. MODEL_MLP_MAX_STRIDE */
} model_mlp_conv;

typedef struct model_mlp_config {
    int in_dim;                       /* D */
    int n_hidden;                     /* 1 .. MODEL_MLP_MAX_HIDDEN */
    int hidden[MODEL_MLP_MAX_HIDDEN]; /* widths of the hidden layers; first n_hidden used */
    int n_classes;                    /* C >= 2 */
    /* The conv front end; all 0 (a designated initialiser's default) is none. */
    int n_conv;                              /* 0 .. MODEL_MLP_MAX_CONV */
    int image[3];                            /* [C, H, W] of an input, C*H*W = D, when n_conv > 0 */
    model_mlp_conv conv[MODEL_MLP_MAX_CONV]; /* first n_conv used */
} model_mlp_config;

typedef struct model_mlp model_mlp;

/* Checks every width is in [1, MODEL_MLP_MAX_WIDTH] (C in [2, ...]), the
 * hidden-layer count, the conv layers (count, image shape against D, each
 * kernel, stride, output width and per-image scratch under
 * MODEL_MLP_MAX_CONV_SCRATCH), and that the parameter count stays under
 * MODEL_MLP_MAX_PARAMS. Every product is formed in 64 bits, so any int
 * values can be checked. Returns 0 or VL_EINVAL naming the field. */
int model_mlp_config_validate(const model_mlp_config *cfg, vl_error *err) VL_MUST_CHECK;

/* The number of layers of a valid cfg, n_conv + n_hidden + 1: what layer
 * indices (split learning's cuts, model_mlp_part ranges) run up to. */
int model_mlp_config_num_layers(const model_mlp_config *cfg);

/* Whether two valid configurations describe the same model: every field
 * that is in use equal (unused hidden and conv entries ignored). 1 or 0. */
int model_mlp_config_equal(const model_mlp_config *a, const model_mlp_config *b);

/* Validates cfg and creates a model with zeroed parameters and zeroed
 * gradients (both allocated here, so model_mlp_grads is never NULL);
 * activations are planned on the first forward. On success *out is owned by
 * the caller (model_mlp_free); on failure *out is NULL. Returns 0,
 * VL_EINVAL, VL_ENOMEM. */
int model_mlp_create(const model_mlp_config *cfg, model_mlp **out, vl_error *err) VL_MUST_CHECK;

/* Frees everything the model owns. NULL is a no-op. */
void model_mlp_free(model_mlp *m);

/* Deterministic initialisation from the common vl_rng (same seed, same weights
 * everywhere), layer by layer in table order: conv and hidden weights
 * normal with variance 2/fan_in (He, suited to GELU; a conv layer's fan_in
 * is C_in*kernel*kernel), output weights with variance 0.01/fan_in so the
 * initial logits are nearly equal and the loss starts near ln C, all
 * biases 0. */
void model_mlp_init_weights(model_mlp *m, uint64_t seed);

model_mlp_config model_mlp_config_get(const model_mlp *m);
size_t model_mlp_num_params(const model_mlp *m);

/* The flat parameter and gradient vectors (model_mlp_num_params floats
 * each, tensor-table order), owned by the model; read and write in place. */
float *model_mlp_params(model_mlp *m);
float *model_mlp_grads(model_mlp *m);

/* Sets *out to the tensor table (owned by the model) and returns its length
 * 2 * (n_conv + n_hidden + 1). */
int model_mlp_tensors(const model_mlp *m, const model_tensor **out);

/* Forward pass over x[B,D] (row-major). With labels[B] (each in [0, C)) it
 * writes the mean cross-entropy to *loss and keeps what model_mlp_backward
 * needs; with labels NULL it only computes logits and probabilities (loss
 * may be NULL). Activation memory is planned for the largest B seen so far
 * and reused. Returns 0, VL_EINVAL (NULL x, B < 1, B too large, label out of
 * range), VL_ENOMEM. */
int model_mlp_forward(model_mlp *m, const float *x, const int *labels, int B, float *loss,
                      vl_error *err) VL_MUST_CHECK;

/* The [B,C] logits and softmax probabilities of the last forward pass,
 * owned by the model and valid until the next forward or evaluation. NULL
 * before any forward. Backward leaves them intact. */
const float *model_mlp_logits(const model_mlp *m);
const float *model_mlp_probs(const model_mlp *m);

/* ADDS the gradient of the last forward-with-labels' mean loss into the
 * gradient vector, so several backward passes accumulate. Consumes the
 * forward state: a second backward needs a new forward. Returns 0 or
 * VL_EINVAL when there is no forward-with-labels to differentiate. */
int model_mlp_backward(model_mlp *m, vl_error *err) VL_MUST_CHECK;

/* Recomputes the output gradients of every layer (what model_mlp_layer_io
 * returns) for other labels[B] on the last forward pass, without touching
 * the parameter gradients: K-FAC's Fisher wants labels drawn from the
 * model's own predictions rather than the training labels. Dense-only
 * models. Returns 0 or VL_EINVAL (conv layers, no forward pass, labels
 * missing or out of range). */
int model_mlp_output_grads(model_mlp *m, const int *labels, vl_error *err) VL_MUST_CHECK;

/* Layer l's (0 .. n_hidden) input x [B, in] and the gradient of the mean
 * loss with respect to its output (before the activation) dy [B, out], as
 * the last model_mlp_backward or model_mlp_output_grads left them: what
 * K-FAC folds into its factors. Both are owned by the model and valid
 * until the next forward or evaluation; *B gets the batch size. Dense-only
 * models. Returns 0 or VL_EINVAL (conv layers, l out of range, or no
 * backward since the last forward). */
int model_mlp_layer_io(const model_mlp *m, int l, const float **x, const float **dy, int *B,
                       vl_error *err) VL_MUST_CHECK;

/* Zeroes the gradient vector. */
void model_mlp_zero_grad(model_mlp *m);

/* Mean cross-entropy and top-1 accuracy (ties go to the lower class) over
 * n samples x[n,D], labels[n], evaluated in chunks so any n works without
 * growing the activation plan past max(current plan, 256 rows). Either
 * result pointer may be NULL. Deterministic. Clobbers the forward state (a
 * backward afterwards fails). Returns 0, VL_EINVAL, VL_ENOMEM. */
int model_mlp_evaluate(model_mlp *m, const float *x, const int *labels, int n, double *mean_loss,
                       double *accuracy, vl_error *err) VL_MUST_CHECK;

/* model_mlp_evaluate for the accuracy alone. */
int model_mlp_accuracy(model_mlp *m, const float *x, const int *labels, int B, double *acc,
                       vl_error *err) VL_MUST_CHECK;

/* Synthetic federated classification data with per-peer label skew. The
 * task is shared: the C * modes class centres (centre coordinates
 * normal(0, separation^2)) come from cfg->seed alone, so every peer learns
 * the same classes. A sample is x = centre[y][k] + normal(0, noise^2) per
 * coordinate with its mode k uniform. What differs is the label mix: peer p
 * draws y from its own distribution pi_p ~ Dirichlet(alpha, ..., alpha),
 * sampled from (seed, p) as normalised Gamma(alpha) draws (Marsaglia-Tsang,
 * with the U^(1/alpha) boost for alpha < 1, normalised in log space so tiny
 * alphas cannot underflow to an all-zero vector). Small alpha (0.1) gives
 * each peer a few dominant classes; large alpha (100) is close to IID.
 * Sample i of peer p depends only on (seed, p, i), so any index range can be
 * generated independently (a peer's data range, a resumed peer). */
typedef struct model_fed_synth_config {
    int dim;          /* D, 1 .. MODEL_MLP_MAX_WIDTH */
    int n_classes;    /* C, 2 .. MODEL_MLP_MAX_WIDTH */
    int modes;        /* centres per class, 1 .. MODEL_FED_MAX_MODES; several make a
                       * class a mixture that can need a nonlinear boundary */
    float alpha;      /* Dirichlet concentration, MODEL_FED_MIN_ALPHA .. MODEL_FED_MAX_ALPHA */
    float separation; /* std of the centre coordinates, > 0 and finite */
    float noise;      /* std of the per-coordinate sample noise, >= 0 and finite */
    uint64_t seed;    /* the task: centres, peer distributions and samples */
} model_fed_synth_config;

#define MODEL_FED_MAX_MODES 16
#define MODEL_FED_MIN_ALPHA 1e-3f
#define MODEL_FED_MAX_ALPHA 1e6f
#define MODEL_FED_MAX_PEER (1 << 30)
#define MODEL_FED_MAX_CENTRE_FLOATS ((size_t)1 << 26) /* bound on n_classes * modes * dim */

/* D 32, C 10, 1 mode, alpha 0.5, separation 1, noise 1, seed 1. */
model_fed_synth_config model_fed_synth_config_default(void);

/* Checks every field's range and n_classes * modes * dim <=
 * MODEL_FED_MAX_CENTRE_FLOATS. Returns 0 or VL_EINVAL naming the field. */
int model_fed_synth_config_validate(const model_fed_synth_config *cfg, vl_error *err) VL_MUST_CHECK;

/* Peer p's label distribution pi_p into probs[C] (caller-owned; sums to 1).
 * 0 <= peer <= MODEL_FED_MAX_PEER. Returns 0 or VL_EINVAL. */
int model_fed_synth_label_dist(const model_fed_synth_config *cfg, int peer, double *probs,
                               vl_error *err) VL_MUST_CHECK;

/* Samples first .. first+n-1 of peer p's stream into x[n,D] and y[n]
 * (caller-owned). n >= 1, first + n <= 2^62. Every call regenerates the
 * centres (C * modes * D normal draws, the only allocation), so large
 * configurations should ask for many samples per call. Returns 0,
 * VL_EINVAL, VL_ENOMEM. */
int model_fed_synth_peer(const model_fed_synth_config *cfg, int peer, uint64_t first, int n,
                         float *x, int *y, vl_error *err) VL_MUST_CHECK;

/* Samples first .. first+n-1 of the held-out IID validation stream (its own
 * noise, never a peer's sample): balanced by construction, y[i] =
 * (first + i) mod C, so every C consecutive samples hold each class once.
 * Same arguments and errors as model_fed_synth_peer. cfg->alpha is
 * validated but not used. */
int model_fed_synth_validation(const model_fed_synth_config *cfg, uint64_t first, int n, float *x,
                               int *y, vl_error *err) VL_MUST_CHECK;

/* ---- SGD with momentum (sgd.c) ---------------------------------------------------- */

/* SGD with momentum: b ← μ·b + g, then p ← p − lr·d − lr·wd·p with d = b,
 * or d = g + μ·b for Nesterov momentum. Weight decay is decoupled, as in
 * AdamW. The buffer b starts at zero, so the first step is plain SGD. The
 * fields are public so a caller can change lr (schedules) between steps;
 * vl_buf is owned by the optimiser. */
typedef struct model_sgd {
    float *buf; /* momentum b, n floats */
    size_t n;
    float lr, momentum, weight_decay;
    int nesterov;
    long step; /* steps taken so far */
} model_sgd;

/* Allocates a zeroed buffer for n parameters. Returns 0, VL_EINVAL (lr or
 * weight decay negative or not finite, momentum outside [0, 1), Nesterov
 * with momentum 0, n == 0), VL_ENOMEM. On failure opt is left empty
 * (model_sgd_free is still safe). */
int model_sgd_init(model_sgd *opt, size_t n, float lr, float momentum, float weight_decay,
                   int nesterov, vl_error *err) VL_MUST_CHECK;

/* One step on any flat vector: params[n] updated in place from grads[n];
 * decay says whether weight decay applies to them. Returns 0 or VL_EINVAL
 * (n differs from the optimiser's, missing vectors). */
int model_sgd_step(model_sgd *opt, float *params, const float *grads, size_t n, int decay,
                   vl_error *err) VL_MUST_CHECK;

/* One step on the GPT with its current gradients, decaying 2-D tensors
 * only (as model_adamw_step does). Returns 0 or VL_EINVAL. */
int model_sgd_step_gpt(model_sgd *opt, model_gpt *m, vl_error *err) VL_MUST_CHECK;

/* Zeroes the buffer and the step count (memory kept). */
void model_sgd_reset(model_sgd *opt);

/* Releases the buffer; opt becomes empty. Safe on a zeroed or freed struct. */
void model_sgd_free(model_sgd *opt);

/* ---- K-FAC for linear layers (kfac.c) ---------------------------------------------- */

/* Kronecker-factored approximate curvature (Martens & Grosse 2015) for one
 * linear layer y = x W + b, W [in,out] row-major as everywhere here. The
 * bias is folded in as a last input row, so the layer's parameters are the
 * stacked matrix [W; b] of shape [(in+1), out] and the Fisher block of that
 * matrix (row-major vec) is approximated by A ⊗ G, where over a batch of N
 *   A = (1/N) Σ_i x̄_i x̄_iᵀ,   x̄_i = [x_i, 1]        [(in+1), (in+1)]
 *   G = (1/N) Σ_i g_i g_iᵀ,   g_i = N · dY_i         [out, out]
 * with dY the gradient of the MEAN batch loss with respect to y, so g_i is
 * example i's own loss gradient and G = N · dYᵀ dY. (Pass dY from labels
 * sampled from the model's predictions for the true Fisher, from the
 * training labels for the empirical Fisher.) The preconditioned gradient is
 *   Δ = (A + λ_A I)⁻¹ ∇ (G + λ_G I)⁻¹,   ∇ = [∇W; ∇b]
 * which is (A ⊗ G)⁻¹ vec(∇) when λ_A = λ_G = 0. The damping λ is split by
 * Martens & Grosse's π rule, λ_A = π √λ, λ_G = √λ / π with
 * π = sqrt((tr A / (in+1)) / (tr G / out)), so the larger factor takes the
 * larger share (π = 1 when a trace is not positive). A layer is used by one
 * thread at a time; calls go to OpenBLAS. */

#define MODEL_KFAC_MAX_DIM (1 << 14) /* bound on in and out */

/* One layer's K-FAC state, one allocation owned by the layer. Callers read
 * the fields and never write them; matrices are row-major and stored in
 * full (both triangles). */
typedef struct model_kfac_layer {
    int in, out;                /* the layer: W [in,out], b [out] */
    float *A;                   /* [(in+1),(in+1)] running input factor */
    float *G;                   /* [out,out] running output-gradient factor */
    float *A_inv;               /* (A + damping_a I)⁻¹ as of the last model_kfac_invert */
    float *G_inv;               /* (G + damping_g I)⁻¹ */
    float damping_a, damping_g; /* the split the last inversion used */
    long updates;               /* factor updates folded in; 0: A and G hold nothing yet */
    long inversions;            /* successful inversions; 0: no inverses yet */
    float *work;                /* [(in+1),out] scratch for model_kfac_precondition */
} model_kfac_layer;

/* Creates the state of a layer with in inputs and out outputs (each in
 * [1, MODEL_KFAC_MAX_DIM]): factors and inverses zeroed, no updates. On
 * success *layer is owned by the caller (model_kfac_layer_free); on failure
 * it is NULL. Returns 0, VL_EINVAL, VL_ENOMEM. */
int model_kfac_layer_create(int in, int out, model_kfac_layer **layer, vl_error *err) VL_MUST_CHECK;

/* Frees the layer and everything it owns. NULL is a no-op. */
void model_kfac_layer_free(model_kfac_layer *layer);

/* Folds one batch into the factors: X [N,in] holds the layer's inputs and
 * dY [N,out] the gradient of the mean batch loss with respect to its
 * outputs (see above for the scaling). The first update sets A and G to the
 * batch's factors; later ones keep an exponential moving average,
 * F ← ρ F + (1 − ρ) F_batch, ρ in [0, 1]. The inverses are not touched
 * (K-FAC refreshes them every few steps with model_kfac_invert). Returns 0,
 * VL_EINVAL (missing arrays, N < 1, ρ outside [0, 1]), VL_ERANGE (a NaN or
 * infinity in X or dY; the factors are then unchanged). */
int model_kfac_update_factors(model_kfac_layer *layer, const float *X, const float *dY, int N,
                              float rho, vl_error *err) VL_MUST_CHECK;

/* Computes A_inv and G_inv from the current factors with damping λ >= 0
 * (split by the π rule into damping_a and damping_g), by Cholesky
 * factorisation in double precision (LAPACK dpotrf/dpotri from OpenBLAS).
 * A damped factor is refused as not positive definite when the
 * factorisation breaks down or a pivot² falls below n · FLT_EPSILON times
 * its row's damped diagonal entry: the factors are float sums, so a smaller
 * pivot is rounding noise and its inverse would be meaningless. On failure
 * the previous inverses, dampings and count are kept. Returns 0, VL_EINVAL
 * (λ negative or not finite, no factor updates yet, a factor not positive
 * definite: the message names the factor and says to raise the damping),
 * VL_ERANGE (an inverse overflowed float), VL_ENOMEM. */
int model_kfac_invert(model_kfac_layer *layer, float damping, vl_error *err) VL_MUST_CHECK;

/* The preconditioned gradient of the layer: [outW; outb] = A_inv [gW; gb]
 * G_inv, with gW [in,out] and gb [out] the layer's gradients and outW
 * [in,out], outb [out] caller-owned. outW may be gW and outb may be gb (in
 * place). Uses the inverses of the last model_kfac_invert and the layer's
 * scratch, so it allocates nothing. Returns 0 or VL_EINVAL (missing arrays,
 * no inversion yet). */
int model_kfac_precondition(model_kfac_layer *layer, const float *gW, const float *gb, float *outW,
                            float *outb, vl_error *err) VL_MUST_CHECK;

/* The KL-clipping factor ν by which to scale the preconditioned step of all
 * n_layers layers (Ba, Grosse & Martens 2017): with q = lr² Σ_l <nat_l,
 * grad_l> (each inner product over lens[l] floats, accumulated in double),
 * ν = min(1, sqrt(kl_clip / q)), so that the step lr ν nat has
 * (lr ν)² <nat, grad> <= kl_clip: twice the quadratic estimate of the KL
 * divergence between the model's predictions before and after the step.
 * Returns 1 (nothing to clip) when kl_clip is not a finite positive number
 * (clipping off), n_layers < 1, or q <= 0 (a zero step; q < 0 can only come
 * from rounding, the preconditioner being positive definite); returns 0
 * (take no step) when q is NaN or infinite or an array is missing, since a
 * step along a non-finite direction must not be taken. */
float model_kfac_kl_scale(const float *const *grads, const float *const *nat, const size_t *lens,
                          int n_layers, float lr, float kl_clip);

/* Replaces dst's factors by the weighted average of n sources' factors,
 * A = Σ w_k A_k / Σ w_k and likewise G (averaging the factors, never the
 * inverses, keeps the result a K-FAC estimate of the pooled data). dst may
 * be one of the sources. dst->updates becomes the sources' largest, so the
 * next update continues the moving average; dst's inverses are untouched
 * until the next model_kfac_invert. Returns 0 or VL_EINVAL (n < 1, missing
 * layers or weights, a weight negative or not finite, weights summing to
 * zero, a source with no updates, or any shape differing from dst's). */
int model_kfac_average(model_kfac_layer *dst, const model_kfac_layer *const *src,
                       const double *weights, int n, vl_error *err) VL_MUST_CHECK;

/* Replaces the layer's factors by copies of A [(in+1),(in+1)] and G
 * [out,out] (a peer adopting the factors averaged over all peers, or its
 * own restored from disk), as if `updates` (>= 1) factor updates had built
 * them, so the next update continues the moving average. The inverses are
 * untouched until the next model_kfac_invert. Returns 0, VL_EINVAL
 * (missing arrays, updates < 1), VL_ERANGE (a NaN or infinity; the layer is
 * then unchanged). */
int model_kfac_set_factors(model_kfac_layer *layer, const float *A, const float *G, long updates,
                           vl_error *err) VL_MUST_CHECK;

/* ---- K-FAC for the GPT (kfac_gpt.c) --------------------------------------------------- */

/* K-FAC as the GPT's inner optimiser. Every plain linear layer (per block
 * attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj; see
 * model_gpt_set_linear_hook) keeps a model_kfac_layer whose factors are
 * folded in during model_kfac_gpt_backward from the empirical Fisher (the
 * output gradients of the training targets, which backward computes
 * anyway; each token counts as one example). A step preconditions those
 * layers' gradients, scales them by the KL-clipping factor ν computed over
 * the preconditioned layers, and then takes one SGD-with-momentum step
 * over every parameter with the same lr and decoupled weight decay on 2-D
 * tensors (model_sgd_step_gpt): the preconditioned layers move along the
 * clipped natural gradient, the others (token and position embeddings,
 * which the tied LM head shares, and LayerNorm gains and biases) along
 * their plain gradient. Inverses are refreshed on the first step, every
 * inverse_every steps after that, and on the step after
 * model_kfac_gpt_refresh. */
typedef struct model_kfac_gpt_config {
    float lr;           /* > 0 */
    float momentum;     /* [0, 1) */
    float damping;      /* λ > 0, split between A and G by the π rule */
    float decay;        /* ρ of the factors' moving average, [0, 1) */
    int inverse_every;  /* T >= 1 */
    float kl_clip;      /* > 0; 0 turns the clipping off */
    float weight_decay; /* >= 0 */
} model_kfac_gpt_config;

/* lr 0.1, momentum 0, damping 1e-3, decay 0.95, inverse_every 1,
 * kl_clip 1e-2, weight_decay 0: the best of bench_kfac's sweep on the
 * default byte GPT (docs/results/kfac.md). */
model_kfac_gpt_config model_kfac_gpt_config_default(void);

/* Checks every field's range (finite, as above; inverse_every at most
 * 1e6). Returns 0 or VL_EINVAL naming the field. */
int model_kfac_gpt_config_validate(const model_kfac_gpt_config *cfg, vl_error *err) VL_MUST_CHECK;

/* The K-FAC layers of a GPT of configuration cfg: 4 n_layer of them, in
 * tensor-table order. model_gpt_kfac_layer gives layer i's name (its
 * weight's name without ".weight", e.g. "h.0.attn.c_attn") in name (cap
 * bytes) and its widths: in inputs (A is (in+1) x (in+1)) and out outputs
 * (G is out x out). Returns 0 or VL_EINVAL (i out of range, cfg invalid,
 * name too small). */
int model_gpt_kfac_layer_count(const model_gpt_config *cfg);
int model_gpt_kfac_layer(const model_gpt_config *cfg, int i, char *name, size_t cap, int *in,
                         int *out, vl_error *err) VL_MUST_CHECK;

/* The factor files' layer list for cfg (compress/compress.h): layer i of
 * model_gpt_kfac_layer as {name, in + 1, out}, into out (cap entries, at
 * least model_gpt_kfac_layer_count). Returns the count, or VL_EINVAL. */
int model_gpt_kfac_factor_layers(const model_gpt_config *cfg, compress_factor_layer *out, int cap,
                                 vl_error *err);

/* The optimiser's state. cfg may be changed between steps (lr schedules,
 * hyper-parameters that follow the task); the rest is read-only to
 * callers. layers[i] is the model_gpt_kfac_layer i. */
typedef struct model_kfac_gpt {
    model_kfac_gpt_config cfg;
    int n_layers;
    model_kfac_layer **layers; /* owned */
    int *tensor;               /* layer i's weight is tensor[i], its bias tensor[i] + 1 */
    size_t n_params;
    model_sgd sgd;      /* momentum over every parameter (owned) */
    float *nat;         /* n_params scratch: the preconditioned gradients */
    long step;          /* steps taken */
    long since_invert;  /* steps since the inverses were refreshed; < 0: refresh next step */
    long kept_inverses; /* refreshes that failed and kept a layer's previous inverses */
    int64_t rows;       /* rows (tokens) folded into the factors so far */
    float last_scale;   /* ν of the last step */
    /* what the hook needs during model_kfac_gpt_backward */
    const model_gpt *hook_model;
    int hook_calls, hook_rc, hook_rows;
    vl_error hook_err;
} model_kfac_gpt;

/* Sets up the state for model m (which is only read): empty factors, zero
 * momentum. Returns 0, VL_EINVAL (bad cfg, layers wider than
 * MODEL_KFAC_MAX_DIM), VL_ENOMEM; on failure opt is left empty
 * (model_kfac_gpt_free is still safe). */
int model_kfac_gpt_init(model_kfac_gpt *opt, const model_gpt *m, const model_kfac_gpt_config *cfg,
                        vl_error *err) VL_MUST_CHECK;

/* Releases everything; opt becomes empty. Safe on a zeroed or freed struct. */
void model_kfac_gpt_free(model_kfac_gpt *opt);

/* Forgets the factors, inverses, momentum and counts (memory kept). */
void model_kfac_gpt_reset(model_kfac_gpt *opt);

/* Makes the next step refresh every inverse: after the factors were
 * replaced (model_kfac_set_factors), or at the start of a task so that a
 * task's steps depend only on the state saved between tasks. */
void model_kfac_gpt_refresh(model_kfac_gpt *opt);

/* model_gpt_backward on m that also folds every linear layer's input and
 * output gradient into its factors (ρ = cfg.decay). The hook is installed
 * for this call only. Returns what backward returns, or VL_ERANGE when a
 * layer's inputs or gradients were not finite (the gradients are then
 * computed, but no factor changed after that layer), or VL_EINVAL when m is
 * not the model opt was made for. */
int model_kfac_gpt_backward(model_kfac_gpt *opt, model_gpt *m, vl_error *err) VL_MUST_CHECK;

/* Points A[i] and G[i] (caller's arrays of n_layers entries) at layer i's
 * factors, owned by opt and valid until it changes them: what a peer
 * attaches to its update. VL_EINVAL before the first factor update. */
int model_kfac_gpt_factors(const model_kfac_gpt *opt, const float **A, const float **G,
                           vl_error *err) VL_MUST_CHECK;

/* Replaces every layer's factors by those of v, decoded against
 * model_gpt_kfac_factor_layers of this model (the average over peers, or
 * the state saved in trainer.st), as if `updates` (>= 1) factor updates
 * had made them, and refreshes the inverses at the next step. All or
 * nothing: on failure no factor changed. Returns 0, VL_EINVAL (v has
 * another layer count), VL_ERANGE (a value that is not finite), VL_ENOMEM. */
int model_kfac_gpt_adopt(model_kfac_gpt *opt, const compress_factors_view *v, long updates,
                         vl_error *err) VL_MUST_CHECK;

/* One step with m's current gradients (which it overwrites with the step
 * direction before the update). Needs factors (a model_kfac_gpt_backward
 * since the last reset). A layer whose refresh fails keeps its previous
 * inverses (kept_inverses counts these); one that has none fails the step
 * with VL_EINVAL before any parameter changed. Returns 0, VL_EINVAL (m of
 * another shape, no gradients or factors), VL_ERANGE (the step direction
 * is not finite; nothing changed), VL_ENOMEM. */
int model_kfac_gpt_step(model_kfac_gpt *opt, model_gpt *m, vl_error *err) VL_MUST_CHECK;

#endif
