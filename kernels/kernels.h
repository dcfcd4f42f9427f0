/*
 * kernels: the arithmetic of a GPT-2 style decoder on float32 tensors,
 * forward and backward, plus the AdamW update and gradient-norm helpers
 * and the 2-D convolution of the classifier's image front end.
 * The model module strings these together; nothing here allocates or does
 * I/O.
 *
 * Conventions shared by every kernel:
 *  - Tensors are dense row-major float arrays; B = batch, T = sequence
 *    length, C = channels, N = rows (usually B*T), V = vocabulary,
 *    NH = attention heads. Shapes are given in brackets, e.g. [N,C].
 *  - Linear weights are stored [in, out] (the Hugging Face GPT-2 Conv1D
 *    layout), so y[N,out] = x[N,in] @ W[in,out] + b.
 *  - Backward kernels ADD into every gradient they produce (dinp, dweight,
 *    dbias), so gradients from several consumers of one tensor accumulate
 *    naturally; the caller zeroes buffers when it wants a fresh gradient.
 *    The single exception is kernels_softmax_xent_backward, which starts the
 *    chain and overwrites.
 *  - Loops are parallelised with OpenMP without atomics: every output
 *    element is produced by one thread in a fixed order, so the same inputs
 *    and thread count give bitwise-identical results run after run (the
 *    non-BLAS kernels even across thread counts).
 *  - Matrix products go to OpenBLAS sgemm, which the kernels run
 *    single-threaded inside their own OpenMP team: they switch OpenBLAS to
 *    one thread (openblas_set_num_threads(1), process-wide) because its
 *    spinning thread pool and an OpenMP team on the same cores slow each
 *    other down more than the extra core gives. The thread count is
 *    OpenMP's (OMP_NUM_THREADS, omp_set_num_threads or
 *    kernels_set_num_threads).
 *  - Callers pass valid shapes and token ids; the kernels do not check them
 *    (the model module does, once, before calling in).
 */
#ifndef VOLLEY_KERNELS_H
#define VOLLEY_KERNELS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
/* common.h is plain C; CUDA sources include this header as C++. */
extern "C" {
#endif

#include "common/common.h"

/* ---- threads ------------------------------------------------------------- */

/* Uses n threads (n >= 1) for kernels called from this thread afterwards:
 * sets OpenMP's count for the calling thread and makes OpenBLAS
 * single-threaded. */
void kernels_set_num_threads(int n);

/* ---- token + position embedding ---------------------------------------- */

/* out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :]. wte is [V,C], wpe is at
 * least [T,C]; tokens must lie in [0, V). */
void kernels_encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                             int B, int T, int C);

/* dwte[tokens[b,t], :] += dout[b,t,:] and dwpe[t,:] += dout[b,t,:]. */
void kernels_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B,
                              int T, int C);

/* ---- LayerNorm (eps 1e-5, biased variance) ------------------------------ */

/* out[N,C] = (inp - mean) * rstd * weight + bias per row; mean[N] and
 * rstd[N] are saved for the backward pass. */
void kernels_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int N, int C);

/* Adds the gradients of kernels_layernorm_forward into dinp[N,C],
 * dweight[C] and dbias[C], given dout[N,C] and the saved inp, mean, rstd. */
void kernels_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, int N, int C);

/* ---- matrix products ----------------------------------------------------- */

/* out[N,OUT] = inp[N,IN] @ weight[IN,OUT] + bias[OUT]; bias may be NULL. */
void kernels_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                            int N, int IN, int OUT);

/* dinp[N,IN] += dout @ weight^T, dweight[IN,OUT] += inp^T @ dout,
 * dbias[OUT] += column sums of dout. dinp and dbias may be NULL (skipped). */
void kernels_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int IN, int OUT);

/* The same product with the weight stored transposed, as the tied LM head
 * needs: out[N,OUT] = inp[N,IN] @ weight_t^T, weight_t is [OUT,IN] (the
 * token embedding [V,C]). No bias. */
void kernels_matmul_wt_forward(float *out, const float *inp, const float *weight_t, int N, int IN,
                               int OUT);

/* dinp[N,IN] += dout @ weight_t, dweight_t[OUT,IN] += dout^T @ inp.
 * dinp may be NULL. */
void kernels_matmul_wt_backward(float *dinp, float *dweight_t, const float *dout, const float *inp,
                                const float *weight_t, int N, int IN, int OUT);

/* ---- 2-D convolution (conv.c) -------------------------------------------- */

/* One convolution layer's geometry. Images are NCHW: a batch of B images
 * [B, ci, h, w], each image one contiguous row of ci*h*w floats, so the
 * model can treat a batch of images as a [B, width] matrix like any other
 * activation. Padding is "same"-style, pad = k/2 zeros on every side, and
 * the output is [B, co, ho, wo] with ho = kernels_conv2d_out_size(h, k,
 * stride) (likewise wo). The weight is [co, ci*k*k] row-major (one row per
 * output channel, ordered ci, then kernel row, then kernel column: the
 * memory order of PyTorch's [co, ci, k, k]) and the bias [co]. */
typedef struct kernels_conv2d_shape {
    int ci, h, w; /* input channels and image size, each >= 1 */
    int co;       /* output channels, >= 1 */
    int k;        /* kernel side, >= 1 */
    int stride;   /* >= 1 */
} kernels_conv2d_shape;

/* Output side for an input side n: (n + 2*(k/2) - k) / stride + 1, always
 * >= 1 for n, k, stride >= 1 (n itself for odd k and stride 1). */
int kernels_conv2d_out_size(int n, int k, int stride);

/* Floats of caller-owned scratch the conv2d kernels need for a batch of
 * B: (ci*k*k + co) * B * ho * wo (the batch's im2col matrix and one
 * transposed copy of the output). Returns 0 when an argument is below 1
 * or the count does not fit in size_t. */
size_t kernels_conv2d_scratch_floats(const kernels_conv2d_shape *s, int B);

/* out[B, co, ho, wo] = conv(inp[B, ci, h, w], weight) + bias, through an
 * im2col matrix in scratch and one sgemm. bias may be NULL. scratch holds
 * kernels_conv2d_scratch_floats(s, B) floats and is clobbered; it must not
 * overlap the other arguments. B * ho * wo * (ci*k*k + co) must not exceed
 * INT_MAX (sgemm's dimensions are int). */
void kernels_conv2d_forward(float *out, const float *inp, const float *weight, const float *bias,
                            float *scratch, const kernels_conv2d_shape *s, int B);

/* Adds the gradients of kernels_conv2d_forward given dout[B, co, ho, wo]
 * and the forward's inp: dinp[B, ci, h, w] += d/dinp, dweight[co, ci*k*k]
 * += d/dweight, dbias[co] += d/dbias (summed over the batch in double). All
 * three ADD, as the other backward kernels do; dinp and dbias may be NULL
 * (skipped). scratch as for the forward (its contents from the forward
 * are not needed: the im2col matrix is rebuilt). */
void kernels_conv2d_backward(float *dinp, float *dweight, float *dbias, float *scratch,
                             const float *dout, const float *inp, const float *weight,
                             const kernels_conv2d_shape *s, int B);

/* ---- causal multi-head self-attention ----------------------------------- */

/* qkv[B,T,3C] holds q | k | v per position, head h in channels
 * [h*C/NH, (h+1)*C/NH) of each part. Writes out[B,T,C] and the attention
 * probabilities att[B,NH,T,T] (row t is softmax over positions <= t, zero
 * above the diagonal), which the backward pass needs. C % NH must be 0. */
void kernels_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                               int NH);

/* Floats of scratch memory kernels_attention_backward needs for these
 * sizes (at most B*NH*T*T; grows with each argument). */
size_t kernels_attention_scratch_floats(int B, int T, int NH);

/* Adds the gradient with respect to qkv into dqkv[B,T,3C], given dout[B,T,C]
 * and the forward's qkv and att. scratch is caller-owned memory of
 * kernels_attention_scratch_floats() floats, clobbered. */
void kernels_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                const float *att, int B, int T, int C, int NH);

/* ---- element-wise --------------------------------------------------------- */

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * out may alias inp. */
void kernels_gelu_forward(float *out, const float *inp, size_t n);
/* dinp += gelu'(inp) * dout. */
void kernels_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* out = a + b (out may alias a or b). */
void kernels_residual_forward(float *out, const float *a, const float *b, size_t n);
/* da += dout, db += dout. */
void kernels_residual_backward(float *da, float *db, const float *dout, size_t n);

/* ---- softmax + cross-entropy over the vocabulary ------------------------- */

/* probs[N,V] = softmax of each row of logits; probs may alias logits. When
 * targets is non-NULL, losses[N] = -log softmax(logits)[target] computed
 * stably from the logits (log-sum-exp), so it is finite even where a
 * probability underflows. targets must lie in [0, V). */
void kernels_softmax_xent_forward(float *probs, float *losses, const float *logits,
                                  const int *targets, int N, int V);

/* OVERWRITES dlogits[N,V] = scale * (probs - onehot(targets)), the gradient
 * of scale * sum of the losses (scale = 1/N for a mean). dlogits may alias
 * probs. */
void kernels_softmax_xent_backward(float *dlogits, const float *probs, const int *targets,
                                   float scale, int N, int V);

/* ---- optimiser ------------------------------------------------------------ */

/* AdamW hyper-parameters for one step. step is the 1-based index of the
 * step being taken (used for bias correction). */
typedef struct kernels_adamw_hparams {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
    long step;
} kernels_adamw_hparams;

/* One AdamW step over n elements, in place on param, m and v:
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   param -= lr * (m/(1-b1^step)) / (sqrt(v/(1-b2^step)) + eps)
 *            + lr * wd * param                       (decoupled decay)
 * decay_mask (n bytes, may be NULL) selects which elements are decayed:
 * nonzero = decay; NULL decays every element. Pass weight_decay 0 to skip
 * decay for a whole range (biases, LayerNorm parameters). */
void kernels_adamw_step(float *param, const float *grad, float *m, float *v,
                        const uint8_t *decay_mask, size_t n, const kernels_adamw_hparams *hp);

/* Sum of squares of x, accumulated in double over a fixed partition of the
 * vector, so the result does not depend on the thread count. */
double kernels_sum_squares(const float *x, size_t n);

/* Scales grad so its L2 norm is at most max_norm (no-op when max_norm <= 0
 * or the norm is already within it, or the norm is not finite) and returns
 * the norm before clipping. */
float kernels_clip_grad_norm(float *grad, size_t n, float max_norm);

/* ---- CUDA (only in builds with VOLLEY_HAVE_CUDA, library volley_kernels_cuda)
 *
 * These live in a separate library so programs that never touch a GPU (the
 * coordinator) do not link the CUDA runtime. They never crash on a machine
 * without a driver or device: the count is 0 and the step functions return
 * VL_ERR with the CUDA error text. */
#if defined(VOLLEY_HAVE_CUDA)

/* What kernels_cuda_probe found. */
typedef enum kernels_cuda_state {
    KERNELS_CUDA_OK = 0, /* at least one device is usable */
    KERNELS_CUDA_ABSENT, /* no GPU here: no device, or no NVIDIA driver at all */
    KERNELS_CUDA_BROKEN  /* a driver is installed but the runtime fails */
} kernels_cuda_state;

/* Asks the CUDA runtime for its devices and tells a machine without a GPU
 * from one whose GPU is unusable (a driver too old for the runtime, a
 * device in a bad state), which callers must not take for "no GPU".
 * Returns a kernels_cuda_state:
 *  - KERNELS_CUDA_OK: *count = the number of devices (> 0);
 *  - KERNELS_CUDA_ABSENT: no device (cudaErrorNoDevice, or a count of 0),
 *    or no NVIDIA driver installed (libcuda.so.1 does not load), whatever
 *    the runtime's error;
 *  - KERNELS_CUDA_BROKEN: any other error while libcuda.so.1 loads,
 *    cudaErrorInsufficientDriver included.
 * *count is 0 unless OK. why (may be NULL when why_len is 0) gets one line:
 * the runtime's error name and message when not OK, the device count when
 * OK; always NUL-terminated when why_len > 0. count may be NULL. */
int kernels_cuda_probe(int *count, char *why, size_t why_len);

/* Number of usable CUDA devices; 0 unless kernels_cuda_probe says OK. */
int kernels_cuda_device_count(void);

/* Writes a one-line description of device 0 (name, compute capability,
 * memory) into out, or the reason no device is usable. Always
 * NUL-terminates when out_len > 0. */
void kernels_cuda_describe(char *out, size_t out_len);

/* Makes device ordinal (0 <= ordinal < kernels_cuda_device_count) the
 * calling thread's current device: the one later allocations, contexts
 * and launches of kernels/cuda_model.h go to. Code that drives several
 * GPUs from one thread sets the device before every call that works on
 * one of them.
 * Returns 0, VL_EINVAL (no such device) or VL_ERR (the runtime refused). */
int kernels_cuda_set_device(int ordinal, vl_error *err) VL_MUST_CHECK;

/* *ordinal = the calling thread's current device. Returns 0, VL_EINVAL
 * (NULL ordinal) or VL_ERR (no usable device). */
int kernels_cuda_get_device(int *ordinal, vl_error *err) VL_MUST_CHECK;

/* kernels_adamw_step on device pointers (all of n elements; d_decay_mask may
 * be NULL), on the default stream. Synchronises before returning so errors
 * are reported here. Returns 0 or VL_ERR. */
int kernels_cuda_adamw_step(float *d_param, const float *d_grad, float *d_m, float *d_v,
                            const uint8_t *d_decay_mask, size_t n, const kernels_adamw_hparams *hp,
                            vl_error *err);

/* Convenience for host arrays: copies in, runs kernels_cuda_adamw_step,
 * copies param, m and v back. Device memory is allocated and freed inside.
 * The host arrays are written only after the step succeeded on the device
 * (a failure while copying back, which means the device itself failed, can
 * leave them partly updated). Returns 0, VL_ENOMEM when device memory runs
 * out, or VL_ERR. */
int kernels_cuda_adamw_step_host(float *param, const float *grad, float *m, float *v,
                                 const uint8_t *decay_mask, size_t n,
                                 const kernels_adamw_hparams *hp, vl_error *err);

#endif /* VOLLEY_HAVE_CUDA */

#ifdef __cplusplus
}
#endif

#endif
