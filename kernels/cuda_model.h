/*
 * kernels/cuda_model.h: the GPT's layers on a CUDA device, forward and
 * backward, with the semantics of their CPU counterparts in
 * kernels/kernels.h (same shapes, layouts and "backward ADDS into every
 * gradient" rule; see there for what each computes). model/gpt_cuda.h
 * strings them into a training step. Only in builds with VOLLEY_HAVE_CUDA,
 * library volley_kernels_cuda.
 *
 * Conventions beyond kernels.h:
 *  - Every tensor argument is a device pointer (d_ prefix); token ids and
 *    targets too. Nothing here allocates except the context and the
 *    explicit memory helpers.
 *  - All work is queued on the legacy default stream in call order, the
 *    stream kernels_cuda_adamw_step uses too, so calls are ordered with
 *    each other and with the memory helpers without any event. Functions
 *    return once the work is queued: 0 means it was launched; an error the
 *    device meets while running it is reported by the next
 *    kernels_cuda_sync (or a download).
 *  - Matrix products go to cuBLAS through a kernels_cuda_ctx, whose math
 *    mode decides their precision (below). Everything else is computed in
 *    float32 by this library's own kernels.
 *  - Sums over rows of a parameter gradient (LayerNorm gains, biases, the
 *    token embedding) use float atomics, so unlike the CPU kernels the last
 *    bits of those gradients can differ from run to run.
 *  - Shapes are trusted as in kernels.h; negative or zero sizes and NULL
 *    pointers are refused with VL_EINVAL before anything is launched.
 */
#ifndef VOLLEY_KERNELS_CUDA_MODEL_H
#define VOLLEY_KERNELS_CUDA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(VOLLEY_HAVE_CUDA)

/* Precision of the matrix products. Storage is always float32. */
typedef enum kernels_cuda_math {
    /* float32 inputs and arithmetic (no tensor-core down-conversion). */
    KERNELS_CUDA_FP32 = 0,
    /* Inputs rounded to TF32 (10-bit mantissa) on tensor cores, float32
     * accumulation. */
    KERNELS_CUDA_TF32 = 1,
    /* Inputs rounded to bfloat16 on tensor cores, float32 accumulation and
     * output: mixed precision with float32 master weights and
     * activations. The functions here round float32 operands as cuBLAS
     * reads them (TF32's speed); kernels/cuda_bf16.h has the layers on
     * operands stored as bfloat16, which the device GPT uses in this
     * mode. */
    KERNELS_CUDA_BF16 = 2
} kernels_cuda_math;

/* Short name of a math mode ("fp32", "tf32", "bf16"; "?" if unknown). */
const char *kernels_cuda_math_name(kernels_cuda_math math);

/* A cuBLAS handle (on the default stream) and a math mode. Opaque. */
typedef struct kernels_cuda_ctx kernels_cuda_ctx;

/* Creates a context on the current device. On success *out is owned by the
 * caller and released with kernels_cuda_ctx_destroy. Returns 0, VL_EINVAL
 * (bad mode) or VL_ERR (no device, cuBLAS failed to start). */
int kernels_cuda_ctx_create(kernels_cuda_math math, kernels_cuda_ctx **out,
                            vl_error *err) VL_MUST_CHECK;

/* Releases the handle (after waiting for queued work). NULL is a no-op. */
void kernels_cuda_ctx_destroy(kernels_cuda_ctx *ctx);

/* The context's math mode. */
kernels_cuda_math kernels_cuda_ctx_math(const kernels_cuda_ctx *ctx);

/* Waits for all queued work; returns 0 or VL_ERR with the first error the
 * device met. */
int kernels_cuda_sync(vl_error *err) VL_MUST_CHECK;

/* ---- device memory ----------------------------------------------------------- */

/* cudaMalloc of bytes (> 0) into *d_out, owned by the caller and released
 * with kernels_cuda_free. Returns 0, VL_EINVAL, VL_ENOMEM (the card's
 * memory or the cap of kernels_cuda_set_mem_cap is exhausted) or VL_ERR. */
int kernels_cuda_alloc(void **d_out, size_t bytes, vl_error *err) VL_MUST_CHECK;

/* Frees what kernels_cuda_alloc returned, after the device has finished
 * the work queued before the call. NULL is a no-op. */
void kernels_cuda_free(void *d);

/* Caps the device memory this process holds through kernels_cuda_alloc at
 * bytes, summed over all devices (0: no cap, the default). An allocation
 * that would pass it fails with VL_ENOMEM as one past the card's memory
 * does. Buffers already held are kept. The CUDA context and cuBLAS's
 * workspace are not counted. Thread-safe. */
void kernels_cuda_set_mem_cap(size_t bytes);

/* Bytes currently held through kernels_cuda_alloc. */
size_t kernels_cuda_mem_in_use(void);

/* Copies bytes host -> device or device -> host, after the queued work
 * (synchronous for the host). Returns 0 or VL_ERR. */
int kernels_cuda_upload(void *d_dst, const void *src, size_t bytes, vl_error *err) VL_MUST_CHECK;
int kernels_cuda_download(void *dst, const void *d_src, size_t bytes, vl_error *err) VL_MUST_CHECK;

/* Copies rows rows of width bytes from the device (rows spitch bytes apart)
 * to the host (dpitch apart), after the queued work. Returns 0, VL_EINVAL
 * (a pitch below width) or VL_ERR. */
int kernels_cuda_download_rows(void *dst, size_t dpitch, const void *d_src, size_t spitch,
                               size_t width, size_t rows, vl_error *err) VL_MUST_CHECK;

/* Copies bytes from d_src to d_dst, both device memory (not overlapping),
 * in order with the queued work. Returns 0 or VL_ERR. */
int kernels_cuda_copy(void *d_dst, const void *d_src, size_t bytes, vl_error *err) VL_MUST_CHECK;

/* Queues zeroing of bytes at d. Returns 0 or VL_ERR. */
int kernels_cuda_zero(void *d, size_t bytes, vl_error *err) VL_MUST_CHECK;

/* ---- matrix products (cuBLAS, in the context's math mode) ------------------- */

/* Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C with op = transpose
 * when ta/tb is set and leading dimensions (row strides) lda, ldb, ldc:
 * kv_sgemm's contract on device pointers. */
int kernels_cuda_gemm(kernels_cuda_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha,
                      const float *d_A, int lda, const float *d_B, int ldb, float beta, float *d_C,
                      int ldc, vl_error *err) VL_MUST_CHECK;

/* kernels_matmul_forward: out[N,OUT] = inp[N,IN] @ weight[IN,OUT] + bias;
 * d_bias may be NULL. */
int kernels_cuda_matmul_forward(kernels_cuda_ctx *ctx, float *d_out, const float *d_inp,
                                const float *d_weight, const float *d_bias, int N, int IN, int OUT,
                                vl_error *err) VL_MUST_CHECK;

/* kernels_matmul_backward: adds into dinp (may be NULL), dweight and dbias
 * (may be NULL). */
int kernels_cuda_matmul_backward(kernels_cuda_ctx *ctx, float *d_dinp, float *d_dweight,
                                 float *d_dbias, const float *d_dout, const float *d_inp,
                                 const float *d_weight, int N, int IN, int OUT,
                                 vl_error *err) VL_MUST_CHECK;

/* kernels_matmul_wt_forward: out[N,OUT] = inp[N,IN] @ weight_t[OUT,IN]^T. */
int kernels_cuda_matmul_wt_forward(kernels_cuda_ctx *ctx, float *d_out, const float *d_inp,
                                   const float *d_weight_t, int N, int IN, int OUT,
                                   vl_error *err) VL_MUST_CHECK;

/* kernels_matmul_wt_backward: adds into dinp (may be NULL) and dweight_t. */
int kernels_cuda_matmul_wt_backward(kernels_cuda_ctx *ctx, float *d_dinp, float *d_dweight_t,
                                    const float *d_dout, const float *d_inp,
                                    const float *d_weight_t, int N, int IN, int OUT,
                                    vl_error *err) VL_MUST_CHECK;

/* ---- causal self-attention (strided-batched cuBLAS + softmax kernels) ------- */

/* kernels_attention_forward: out[B,T,C] and att[B,NH,T,T] from qkv[B,T,3C].
 * The scores are computed for the whole T x T square; the softmax zeroes
 * the masked half. */
int kernels_cuda_attention_forward(kernels_cuda_ctx *ctx, float *d_out, float *d_att,
                                   const float *d_qkv, int B, int T, int C, int NH,
                                   vl_error *err) VL_MUST_CHECK;

/* Floats of device scratch kernels_cuda_attention_backward needs:
 * B*NH*T*T (0 if that overflows size_t). */
size_t kernels_cuda_attention_scratch_floats(int B, int T, int NH);

/* kernels_attention_backward: adds into dqkv[B,T,3C]. d_scratch holds
 * kernels_cuda_attention_scratch_floats floats, clobbered. */
int kernels_cuda_attention_backward(kernels_cuda_ctx *ctx, float *d_dqkv, float *d_scratch,
                                    const float *d_dout, const float *d_qkv, const float *d_att,
                                    int B, int T, int C, int NH, vl_error *err) VL_MUST_CHECK;

/* ---- LayerNorm, embedding, element-wise, loss (own kernels) ------------------ */

/* kernels_layernorm_forward (eps 1e-5, biased variance, one warp per row). */
int kernels_cuda_layernorm_forward(float *d_out, float *d_mean, float *d_rstd, const float *d_inp,
                                   const float *d_weight, const float *d_bias, int N, int C,
                                   vl_error *err) VL_MUST_CHECK;

/* kernels_layernorm_backward: adds into dinp, dweight and dbias. */
int kernels_cuda_layernorm_backward(float *d_dinp, float *d_dweight, float *d_dbias,
                                    const float *d_dout, const float *d_inp, const float *d_weight,
                                    const float *d_mean, const float *d_rstd, int N, int C,
                                    vl_error *err) VL_MUST_CHECK;

/* kernels_encoder_forward; d_tokens must lie in [0, V) (not checked). */
int kernels_cuda_encoder_forward(float *d_out, const int *d_tokens, const float *d_wte,
                                 const float *d_wpe, int B, int T, int C,
                                 vl_error *err) VL_MUST_CHECK;

/* kernels_encoder_backward: adds into dwte and dwpe. */
int kernels_cuda_encoder_backward(float *d_dwte, float *d_dwpe, const float *d_dout,
                                  const int *d_tokens, int B, int T, int C,
                                  vl_error *err) VL_MUST_CHECK;

/* kernels_gelu_forward (tanh approximation); out may alias inp. */
int kernels_cuda_gelu_forward(float *d_out, const float *d_inp, size_t n,
                              vl_error *err) VL_MUST_CHECK;

/* kernels_gelu_backward: dinp += gelu'(inp) * dout. */
int kernels_cuda_gelu_backward(float *d_dinp, const float *d_inp, const float *d_dout, size_t n,
                               vl_error *err) VL_MUST_CHECK;

/* kernels_residual_forward: out = a + b (out may alias a or b). */
int kernels_cuda_residual_forward(float *d_out, const float *d_a, const float *d_b, size_t n,
                                  vl_error *err) VL_MUST_CHECK;

/* kernels_residual_backward: da += dout, db += dout. */
int kernels_cuda_residual_backward(float *d_da, float *d_db, const float *d_dout, size_t n,
                                   vl_error *err) VL_MUST_CHECK;

/* kernels_softmax_xent_forward (one block per row): probs may alias
 * logits; d_targets may be NULL (then d_losses is not written and may be
 * NULL). */
int kernels_cuda_softmax_xent_forward(float *d_probs, float *d_losses, const float *d_logits,
                                      const int *d_targets, int N, int V,
                                      vl_error *err) VL_MUST_CHECK;

/* kernels_softmax_xent_backward: OVERWRITES dlogits = scale * (probs -
 * onehot(targets)); dlogits may alias probs. */
int kernels_cuda_softmax_xent_backward(float *d_dlogits, const float *d_probs, const int *d_targets,
                                       float scale, int N, int V, vl_error *err) VL_MUST_CHECK;

/* ---- vectors: norm and scaling (gradient clipping), difference ---------------------------------------------- */

/* Doubles of device scratch kernels_cuda_sumsq needs (its partial sums and
 * the result). */
#define KERNELS_CUDA_SUMSQ_SCRATCH 1024
#define KERNELS_CUDA_SUMSQ_SCRATCH_DOUBLES (KERNELS_CUDA_SUMSQ_SCRATCH + 1)

/* *out (host) = sum of d_x[i]^2 over n floats, accumulated in double in a
 * fixed order: the same bits on every run for the same vector. d_scratch
 * holds KERNELS_CUDA_SUMSQ_SCRATCH_DOUBLES doubles, clobbered. Waits for
 * the device (the result is read back). */
int kernels_cuda_sumsq(const float *d_x, size_t n, double *d_scratch, double *out,
                       vl_error *err) VL_MUST_CHECK;

/* d_x[i] *= s for n floats (queued). */
int kernels_cuda_scale(float *d_x, size_t n, float s, vl_error *err) VL_MUST_CHECK;

/* d_out[i] = d_a[i] - d_b[i] for n floats (queued), compress_dense_delta's
 * arithmetic, so the same inputs give the same bits; d_out may alias
 * either input. */
int kernels_cuda_sub(float *d_out, const float *d_a, const float *d_b, size_t n,
                     vl_error *err) VL_MUST_CHECK;

#endif /* VOLLEY_HAVE_CUDA */

#ifdef __cplusplus
}
#endif

#endif
