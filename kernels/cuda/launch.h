/* Private helpers of the GPT layer kernels: reductions within a warp or a
 * block, grid sizing and launch checks. CUDA sources only. */
#ifndef VOLLEY_KERNELS_CUDA_LAUNCH_H
#define VOLLEY_KERNELS_CUDA_LAUNCH_H

#include <math.h>
#include <stddef.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda_model.h"

/* Threads per block of the element-wise and row kernels (a multiple of 32). */
#define KC_THREADS 256
#define KC_WARPS (KC_THREADS / 32)
/* Grid-stride loops cover any length; more blocks than this only queue. */
#define KC_MAX_BLOCKS 65535u

/* Blocks for a grid-stride loop over n elements (n > 0). */
static inline unsigned kc_blocks(size_t n) {
    size_t b = (n + KC_THREADS - 1) / KC_THREADS;
    return b > KC_MAX_BLOCKS ? KC_MAX_BLOCKS : (unsigned)b;
}

/* Row-major C = alpha op(A) op(B) + beta C in the context's math mode,
 * batched over count products (operand i at base + i * stride; strides
 * are ignored when count is 1). Defined in blas.cu. */
int kc_gemm(kernels_cuda_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
            int lda, long long sa, const float *B, int ldb, long long sb, float beta, float *C,
            int ldc, long long sc, int count, vl_error *err);

/* kc_gemm with bfloat16 A and B, float32 accumulation, and C float32 or,
 * with c_bf16 set, bfloat16. Defined in blas.cu. */
int kc_gemm_bf16(kernels_cuda_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha,
                 const void *A, int lda, long long sa, const void *B, int ldb, long long sb,
                 float beta, void *C, int c_bf16, int ldc, long long sc, int count, vl_error *err);

/* The argument checks of the linear layers (blas.cu) and of attention
 * (attention.cu): VL_EINVAL naming what for a NULL pointer or a bad size,
 * else 0. kc_check_attention also refuses more rows than its softmax
 * grids address. */
int kc_check_mm(kernels_cuda_ctx *ctx, const void *a, const void *b, const void *c, int N, int IN,
                int OUT, const char *what, vl_error *err);
int kc_check_attention(kernels_cuda_ctx *ctx, const void *a, const void *b, const void *c,
                       const void *d, int B, int T, int C, int NH, const char *what, vl_error *err);

/* Blocks of the attention softmax kernels (a warp per row, KC_WARPS rows
 * a block) for rows rows. */
static inline unsigned kc_row_blocks(size_t rows) {
    return (unsigned)((rows + KC_WARPS - 1) / KC_WARPS);
}

/* Queues out[r, c] = bias[c] over n = rows * OUT floats, and dst[c] +=
 * the sum over rows of src[N, W]: a linear layer's bias and its gradient.
 * Defined in blas.cu. */
int kc_seed_bias(float *out, const float *bias, size_t n, int OUT, vl_error *err);
int kc_colsum_add(float *dst, const float *src, int N, int W, vl_error *err);

/* Rows per block of the column-sum kernels (parameter gradients summed
 * over rows), whose blocks are 32 columns by KC_WARPS rows of threads: a
 * grid of 32-column strips by slabs of *rows_per_block rows. Defined in
 * blas.cu. */
void kc_colsum_grid(int N, int W, dim3 *grid, int *rows_per_block);

/* Reports a failed launch (bad configuration, no device) right after it. */
static inline int kc_launched(vl_error *err, const char *what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_fail(err, e, what);
}

/* Sum / max over the 32 lanes of a warp; every lane gets the result. All
 * 32 lanes must call it. */
__device__ __forceinline__ float kc_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float kc_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum / max over the block (blockDim.x a multiple of 32, at most 1024);
 * every thread gets the result. Every thread of the block must call it.
 * sh is 32 floats of shared memory; the first barrier keeps a call from
 * overwriting partials a slow warp is still reading from the previous
 * call. */
__device__ __forceinline__ float kc_block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = kc_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : 0.0f;
    return kc_warp_sum(v);
}

__device__ __forceinline__ float kc_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = kc_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : -INFINITY;
    return kc_warp_max(v);
}

/* GELU (tanh approximation) and its derivative, shared by the float32 and
 * bfloat16 kernels so both compute the same values. */
#define KC_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define KC_GELU_A 0.044715f

__device__ __forceinline__ float kc_gelu(float x) {
    float u = KC_GELU_K * (x + KC_GELU_A * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float kc_gelu_grad(float x) {
    float u = KC_GELU_K * (x + KC_GELU_A * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    float du = KC_GELU_K * (1.0f + 3.0f * KC_GELU_A * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
}

/* Stores v in a float32 or (rounded to nearest even) bfloat16 output. */
__device__ __forceinline__ void kc_put(float *p, float v) {
    *p = v;
}
__device__ __forceinline__ void kc_put(__nv_bfloat16 *p, float v) {
    *p = __float2bfloat16_rn(v);
}

#endif
