/* bfloat16 operands: conversion to and from float32, and the linear layers
 * on cuBLAS's bf16 kernels (kernels/cuda_bf16.h). The layers follow
 * blas.cu's float32 ones; the differences are the operand type and that
 * an input gradient is written, not added to (beta 0), so the caller need
 * not zero it. */
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"
#include "kernels/cuda_bf16.h"

/* Two values per thread from one 8-byte load where the pointers allow it;
 * the caller checks the alignment. */
__global__ static void to_bf16_pairs_kernel(__nv_bfloat162 *dst, const float2 *src, size_t n2) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n2;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float22bfloat162_rn(src[i]);
}

__global__ static void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ static void from_bf16_kernel(float *dst, const __nv_bfloat16 *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

extern "C" int kernels_cuda_to_bf16(kernels_bf16 *d_dst, const float *d_src, size_t n,
                                    vl_error *err) {
    if (d_dst == NULL || d_src == NULL)
        return vl_fail(err, VL_EINVAL, "cuda to_bf16: NULL pointer");
    if (n == 0) return 0;
    if (n % 2 == 0 && ((uintptr_t)d_dst % 4) == 0 && ((uintptr_t)d_src % 8) == 0)
        to_bf16_pairs_kernel<<<kc_blocks(n / 2), KC_THREADS>>>((__nv_bfloat162 *)d_dst,
                                                               (const float2 *)d_src, n / 2);
    else
        to_bf16_kernel<<<kc_blocks(n), KC_THREADS>>>((__nv_bfloat16 *)d_dst, d_src, n);
    return kc_launched(err, "to bf16");
}

extern "C" int kernels_cuda_from_bf16(float *d_dst, const kernels_bf16 *d_src, size_t n,
                                      vl_error *err) {
    if (d_dst == NULL || d_src == NULL)
        return vl_fail(err, VL_EINVAL, "cuda from_bf16: NULL pointer");
    if (n == 0) return 0;
    from_bf16_kernel<<<kc_blocks(n), KC_THREADS>>>(d_dst, (const __nv_bfloat16 *)d_src, n);
    return kc_launched(err, "from bf16");
}

extern "C" int kernels_cuda_gemm_bf16(kernels_cuda_ctx *ctx, int ta, int tb, int M, int N, int K,
                                      float alpha, const kernels_bf16 *d_A, int lda,
                                      const kernels_bf16 *d_B, int ldb, float beta, float *d_C,
                                      int ldc, vl_error *err) {
    if (ctx == NULL || d_A == NULL || d_B == NULL || d_C == NULL)
        return vl_fail(err, VL_EINVAL, "cuda gemm bf16: NULL context or pointer");
    if (M < 1 || N < 1 || K < 1)
        return vl_fail(err, VL_EINVAL, "cuda gemm bf16: M=%d N=%d K=%d", M, N, K);
    return kc_gemm_bf16(ctx, ta, tb, M, N, K, alpha, d_A, lda, 0, d_B, ldb, 0, beta, d_C, 0, ldc, 0,
                        1, err);
}

extern "C" int kernels_cuda_matmul_forward_bf16(kernels_cuda_ctx *ctx, float *d_out,
                                                const kernels_bf16 *d_inp,
                                                const kernels_bf16 *d_weight, const float *d_bias,
                                                int N, int IN, int OUT, vl_error *err) {
    int rc = kc_check_mm(ctx, d_out, d_inp, d_weight, N, IN, OUT, "matmul bf16", err);
    if (rc != 0) return rc;
    float beta = 0.0f;
    if (d_bias) {
        if ((rc = kc_seed_bias(d_out, d_bias, (size_t)N * OUT, OUT, err)) != 0) return rc;
        beta = 1.0f;
    }
    return kc_gemm_bf16(ctx, 0, 0, N, OUT, IN, 1.0f, d_inp, IN, 0, d_weight, OUT, 0, beta, d_out, 0,
                        OUT, 0, 1, err);
}

extern "C" int kernels_cuda_matmul_backward_bf16(kernels_cuda_ctx *ctx, float *d_dinp,
                                                 float *d_dweight, float *d_dbias,
                                                 const float *d_dout, const kernels_bf16 *d_dout_h,
                                                 const kernels_bf16 *d_inp,
                                                 const kernels_bf16 *d_weight, int N, int IN,
                                                 int OUT, vl_error *err) {
    int rc = kc_check_mm(ctx, d_dweight, d_dout_h, d_inp, N, IN, OUT, "matmul bf16 backward", err);
    if (rc == 0 && d_dinp && d_weight == NULL)
        rc = vl_fail(err, VL_EINVAL, "cuda matmul bf16 backward: dinp without weight");
    if (rc == 0 && d_dbias && d_dout == NULL)
        rc = vl_fail(err, VL_EINVAL, "cuda matmul bf16 backward: dbias without dout");
    if (rc == 0 && d_dinp)
        rc = kc_gemm_bf16(ctx, 0, 1, N, IN, OUT, 1.0f, d_dout_h, OUT, 0, d_weight, OUT, 0, 0.0f,
                          d_dinp, 0, IN, 0, 1, err);
    if (rc == 0)
        rc = kc_gemm_bf16(ctx, 1, 0, IN, OUT, N, 1.0f, d_inp, IN, 0, d_dout_h, OUT, 0, 1.0f,
                          d_dweight, 0, OUT, 0, 1, err);
    if (rc == 0 && d_dbias) rc = kc_colsum_add(d_dbias, d_dout, N, OUT, err);
    return rc;
}

extern "C" int kernels_cuda_matmul_wt_forward_bf16(kernels_cuda_ctx *ctx, float *d_out, int ld,
                                                   const kernels_bf16 *d_inp,
                                                   const kernels_bf16 *d_weight_t, int N, int IN,
                                                   int OUT, vl_error *err) {
    int rc = kc_check_mm(ctx, d_out, d_inp, d_weight_t, N, IN, OUT, "matmul_wt bf16", err);
    if (rc == 0 && ld < OUT)
        rc = vl_fail(err, VL_EINVAL, "cuda matmul_wt bf16: row stride %d below %d", ld, OUT);
    if (rc != 0) return rc;
    return kc_gemm_bf16(ctx, 0, 1, N, OUT, IN, 1.0f, d_inp, IN, 0, d_weight_t, IN, 0, 0.0f, d_out,
                        0, ld, 0, 1, err);
}

extern "C" int kernels_cuda_matmul_wt_backward_bf16(kernels_cuda_ctx *ctx, float *d_dinp,
                                                    float *d_dweight_t,
                                                    const kernels_bf16 *d_dout_h, int ld,
                                                    const kernels_bf16 *d_inp,
                                                    const kernels_bf16 *d_weight_t, int N, int IN,
                                                    int OUT, vl_error *err) {
    int rc =
        kc_check_mm(ctx, d_dweight_t, d_dout_h, d_inp, N, IN, OUT, "matmul_wt bf16 backward", err);
    if (rc == 0 && ld < OUT)
        rc = vl_fail(err, VL_EINVAL, "cuda matmul_wt bf16 backward: row stride %d below %d", ld,
                     OUT);
    if (rc == 0 && d_dinp && d_weight_t == NULL)
        rc = vl_fail(err, VL_EINVAL, "cuda matmul_wt bf16 backward: dinp without weight");
    if (rc == 0 && d_dinp)
        rc = kc_gemm_bf16(ctx, 0, 0, N, IN, OUT, 1.0f, d_dout_h, ld, 0, d_weight_t, IN, 0, 0.0f,
                          d_dinp, 0, IN, 0, 1, err);
    if (rc == 0)
        rc = kc_gemm_bf16(ctx, 1, 0, OUT, IN, N, 1.0f, d_dout_h, ld, 0, d_inp, IN, 0, 1.0f,
                          d_dweight_t, 0, IN, 0, 1, err);
    return rc;
}

/* ---- a linear layer's bias, added where its output is next read -------------- */

/* Row-wise kernels: a block per row (grid-stride over rows), threads over
 * its W columns, so no thread divides to find its column. */
static unsigned row_grid(int N) {
    return (unsigned)N < KC_MAX_BLOCKS ? (unsigned)N : KC_MAX_BLOCKS;
}

__global__ static void bias_to_bf16_kernel(__nv_bfloat16 *out, const float *x, const float *bias,
                                           int N, int W) {
    for (size_t r = blockIdx.x; r < (size_t)N; r += gridDim.x)
        for (int c = threadIdx.x; c < W; c += blockDim.x)
            out[r * W + c] = __float2bfloat16_rn(x[r * W + c] + bias[c]);
}

__global__ static void residual_bias_kernel(float *out, const float *a, const float *b,
                                            const float *bias, int N, int W) {
    for (size_t r = blockIdx.x; r < (size_t)N; r += gridDim.x)
        for (int c = threadIdx.x; c < W; c += blockDim.x) {
            size_t i = r * W + c;
            out[i] = a[i] + (b[i] + bias[c]);
        }
}

__global__ static void bias_gelu_kernel(float *x, __nv_bfloat16 *out, const float *bias, int N,
                                        int W) {
    for (size_t r = blockIdx.x; r < (size_t)N; r += gridDim.x)
        for (int c = threadIdx.x; c < W; c += blockDim.x) {
            size_t i = r * W + c;
            float v = x[i] + bias[c];
            x[i] = v;
            out[i] = __float2bfloat16_rn(kc_gelu(v));
        }
}

static int check_rows(const void *a, const void *b, const void *c, int N, int W, const char *what,
                      vl_error *err) {
    if (a == NULL || b == NULL || c == NULL)
        return vl_fail(err, VL_EINVAL, "cuda %s: NULL pointer", what);
    if (N < 1 || W < 1) return vl_fail(err, VL_EINVAL, "cuda %s: N=%d W=%d", what, N, W);
    return 0;
}

extern "C" int kernels_cuda_bias_to_bf16(kernels_bf16 *d_out, const float *d_x, const float *d_bias,
                                         int N, int W, vl_error *err) {
    int rc = check_rows(d_out, d_x, d_bias, N, W, "bias to bf16", err);
    if (rc != 0) return rc;
    bias_to_bf16_kernel<<<row_grid(N), KC_THREADS>>>((__nv_bfloat16 *)d_out, d_x, d_bias, N, W);
    return kc_launched(err, "bias to bf16");
}

extern "C" int kernels_cuda_residual_bias_forward(float *d_out, const float *d_a, const float *d_b,
                                                  const float *d_bias, int N, int W,
                                                  vl_error *err) {
    int rc = check_rows(d_out, d_a, d_b, N, W, "residual with bias", err);
    if (rc == 0 && d_bias == NULL)
        rc = vl_fail(err, VL_EINVAL, "cuda residual with bias: NULL pointer");
    if (rc != 0) return rc;
    residual_bias_kernel<<<row_grid(N), KC_THREADS>>>(d_out, d_a, d_b, d_bias, N, W);
    return kc_launched(err, "residual with bias");
}

extern "C" int kernels_cuda_bias_gelu_forward_bf16(float *d_x, kernels_bf16 *d_out,
                                                   const float *d_bias, int N, int W,
                                                   vl_error *err) {
    int rc = check_rows(d_x, d_out, d_bias, N, W, "bias and gelu", err);
    if (rc != 0) return rc;
    bias_gelu_kernel<<<row_grid(N), KC_THREADS>>>(d_x, (__nv_bfloat16 *)d_out, d_bias, N, W);
    return kc_launched(err, "bias and gelu");
}
