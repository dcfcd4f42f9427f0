/*
 * kernels/cuda_bf16.h: the GPT's layers with bfloat16 operands, for mixed
 * precision on tensor cores. The matrix products of kernels/cuda_model.h
 * take float32 tensors and let cuBLAS round them as it reads
 * (CUBLAS_COMPUTE_32F_FAST_16BF), which runs at the speed of TF32; these
 * take operands already stored as bfloat16, so cuBLAS runs its bf16
 * kernels. Every product still accumulates in float32, and every output
 * that is summed into later (the residual stream, parameter gradients,
 * LayerNorm statistics, the loss) stays float32: only the operands of the
 * products are rounded, which is the rounding the FAST_16BF mode applies
 * too, done once where the operand is produced instead of on every read.
 *
 * Conventions are those of kernels/cuda_model.h (device pointers, the
 * default stream, queued work, VL_EINVAL before any launch), with two
 * differences the names call out: a kernels_bf16 argument holds bfloat16
 * bits, and the input gradient of a product (dinp) is OVERWRITTEN, not
 * added to, since in a GPT step every such gradient is a fresh buffer
 * (this saves zeroing it first). Parameter gradients are still added to.
 * model/gpt_cuda.c uses these in KERNELS_CUDA_BF16 mode.
 */
#ifndef VOLLEY_KERNELS_CUDA_BF16_H
#define VOLLEY_KERNELS_CUDA_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda_model.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(VOLLEY_HAVE_CUDA)

/* The bits of one bfloat16 (the upper half of a float32). */
typedef uint16_t kernels_bf16;

/* d_dst[i] = d_src[i] rounded to the nearest bfloat16 (ties to even), n
 * values. */
int kernels_cuda_to_bf16(kernels_bf16 *d_dst, const float *d_src, size_t n,
                         vl_error *err) VL_MUST_CHECK;

/* d_dst[i] = the float32 value of d_src[i], n values. */
int kernels_cuda_from_bf16(float *d_dst, const kernels_bf16 *d_src, size_t n,
                           vl_error *err) VL_MUST_CHECK;

/* Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C with bfloat16 A and
 * B, float32 accumulation and a float32 C: kernels_cuda_gemm's contract. */
int kernels_cuda_gemm_bf16(kernels_cuda_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha,
                           const kernels_bf16 *d_A, int lda, const kernels_bf16 *d_B, int ldb,
                           float beta, float *d_C, int ldc, vl_error *err) VL_MUST_CHECK;

/* out[N,OUT] (float32) = inp[N,IN] @ weight[IN,OUT] + bias (float32, may be
 * NULL). */
int kernels_cuda_matmul_forward_bf16(kernels_cuda_ctx *ctx, float *d_out, const kernels_bf16 *d_inp,
                                     const kernels_bf16 *d_weight, const float *d_bias, int N,
                                     int IN, int OUT, vl_error *err) VL_MUST_CHECK;

/* The backward of kernels_cuda_matmul_forward_bf16 from the output
 * gradient in both precisions (dout_h is dout rounded): OVERWRITES dinp
 * (may be NULL) = dout_h @ weight^T; adds inp^T @ dout_h into dweight and
 * the column sums of the float32 dout into dbias (may be NULL; then dout
 * may be NULL too). */
int kernels_cuda_matmul_backward_bf16(kernels_cuda_ctx *ctx, float *d_dinp, float *d_dweight,
                                      float *d_dbias, const float *d_dout,
                                      const kernels_bf16 *d_dout_h, const kernels_bf16 *d_inp,
                                      const kernels_bf16 *d_weight, int N, int IN, int OUT,
                                      vl_error *err) VL_MUST_CHECK;

/* out[N,OUT] = inp[N,IN] @ weight_t[OUT,IN]^T (the tied output head), out
 * with row stride ld >= OUT: a vocabulary such as GPT-2's 50257 is an odd
 * row length, and rows that do not start on 16-byte boundaries keep
 * cuBLAS off its fast kernels, so the model pads them (columns OUT..ld-1
 * are not written). */
int kernels_cuda_matmul_wt_forward_bf16(kernels_cuda_ctx *ctx, float *d_out, int ld,
                                        const kernels_bf16 *d_inp, const kernels_bf16 *d_weight_t,
                                        int N, int IN, int OUT, vl_error *err) VL_MUST_CHECK;

/* Its backward from dout_h with row stride ld (columns beyond OUT are not
 * read): OVERWRITES dinp (may be NULL) = dout_h @ weight_t; adds dout_h^T
 * @ inp into dweight_t. */
int kernels_cuda_matmul_wt_backward_bf16(kernels_cuda_ctx *ctx, float *d_dinp, float *d_dweight_t,
                                         const kernels_bf16 *d_dout_h, int ld,
                                         const kernels_bf16 *d_inp, const kernels_bf16 *d_weight_t,
                                         int N, int IN, int OUT, vl_error *err) VL_MUST_CHECK;

/* Causal attention from qkv_h[B,T,3C]: out_h[B,T,C] (bfloat16, the next
 * product's operand) and the probabilities att_h[B,NH,T,T] (bfloat16, zero
 * above the diagonal). d_scores holds B*NH*T*T floats of scratch for the
 * float32 scores, clobbered. */
int kernels_cuda_attention_forward_bf16(kernels_cuda_ctx *ctx, kernels_bf16 *d_out_h,
                                        float *d_scores, kernels_bf16 *d_att_h,
                                        const kernels_bf16 *d_qkv_h, int B, int T, int C, int NH,
                                        vl_error *err) VL_MUST_CHECK;

/* Its backward from dout_h[B,T,C]: OVERWRITES dqkv[B,T,3C] (float32).
 * d_dp holds B*NH*T*T floats and d_ds_h as many bfloat16, both clobbered. */
int kernels_cuda_attention_backward_bf16(kernels_cuda_ctx *ctx, float *d_dqkv, float *d_dp,
                                         kernels_bf16 *d_ds_h, const kernels_bf16 *d_dout_h,
                                         const kernels_bf16 *d_qkv_h, const kernels_bf16 *d_att_h,
                                         int B, int T, int C, int NH, vl_error *err) VL_MUST_CHECK;

/* kernels_cuda_layernorm_forward with the normalised output stored as
 * bfloat16 (mean and rstd stay float32 for the backward). */
int kernels_cuda_layernorm_forward_bf16(kernels_bf16 *d_out, float *d_mean, float *d_rstd,
                                        const float *d_inp, const float *d_weight,
                                        const float *d_bias, int N, int C,
                                        vl_error *err) VL_MUST_CHECK;

/* kernels_cuda_gelu_forward with a bfloat16 output. */
int kernels_cuda_gelu_forward_bf16(kernels_bf16 *d_out, const float *d_inp, size_t n,
                                   vl_error *err) VL_MUST_CHECK;

/* GELU's backward, OVERWRITING dinp = gelu'(inp) * dout and storing it
 * rounded in dinp_h too. */
int kernels_cuda_gelu_backward_bf16(float *d_dinp, kernels_bf16 *d_dinp_h, const float *d_inp,
                                    const float *d_dout, size_t n, vl_error *err) VL_MUST_CHECK;

/* A linear layer's bias added where its output is next read, so the
 * product itself runs without one (no pass to seed the output with the
 * bias, no read of it inside the product). Each over N rows of W values:
 *  - bias_to_bf16: out_h = x + bias, rounded (the attention's qkv);
 *  - residual_bias_forward: out = a + (b + bias) (a projection into the
 *    residual stream); out may alias a or b;
 *  - bias_gelu_forward_bf16: x += bias in place (GELU's backward reads
 *    the biased pre-activation) and out_h = gelu(x), rounded. */
int kernels_cuda_bias_to_bf16(kernels_bf16 *d_out, const float *d_x, const float *d_bias, int N,
                              int W, vl_error *err) VL_MUST_CHECK;
int kernels_cuda_residual_bias_forward(float *d_out, const float *d_a, const float *d_b,
                                       const float *d_bias, int N, int W,
                                       vl_error *err) VL_MUST_CHECK;
int kernels_cuda_bias_gelu_forward_bf16(float *d_x, kernels_bf16 *d_out, const float *d_bias, int N,
                                        int W, vl_error *err) VL_MUST_CHECK;

/* kernels_cuda_softmax_xent_forward on rows with stride ld >= V (a padded
 * vocabulary; columns V..ld-1 are neither read nor written). */
int kernels_cuda_softmax_xent_forward_ld(float *d_probs, float *d_losses, const float *d_logits,
                                         const int *d_targets, int N, int V, int ld,
                                         vl_error *err) VL_MUST_CHECK;

/* kernels_cuda_softmax_xent_backward with a bfloat16 output (the next
 * product's operand), probs and dlogits_h both with row stride ld >= V;
 * columns V..ld-1 of dlogits_h are written zero (so a product can run
 * over the padded width) and those of probs are not read. dlogits_h does
 * not alias probs. */
int kernels_cuda_softmax_xent_backward_bf16(kernels_bf16 *d_dlogits_h, const float *d_probs,
                                            const int *d_targets, float scale, int N, int V, int ld,
                                            vl_error *err) VL_MUST_CHECK;

#endif /* VOLLEY_HAVE_CUDA */

#ifdef __cplusplus
}
#endif

#endif
