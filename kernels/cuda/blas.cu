/* The cuBLAS context, device memory helpers and the linear layers.
 *
 * cuBLAS is column-major; a row-major matrix X[R,C] with row stride ld is
 * the column-major X^T with the same ld. So the row-major product
 * C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T:
 * the operands swap places and keep their transpose flags. */
#include <stdint.h>
#include <stdlib.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

struct kernels_cuda_ctx {
    cublasHandle_t handle;
    kernels_cuda_math math;
    cublasComputeType_t compute;
};

static int cublas_fail(vl_error *err, cublasStatus_t s, const char *what) {
    return vl_fail(err, s == CUBLAS_STATUS_ALLOC_FAILED ? VL_ENOMEM : VL_ERR,
                   "cuBLAS %s failed: %s", what, cublasGetStatusString(s));
}

extern "C" const char *kernels_cuda_math_name(kernels_cuda_math math) {
    switch (math) {
    case KERNELS_CUDA_FP32: return "fp32";
    case KERNELS_CUDA_TF32: return "tf32";
    case KERNELS_CUDA_BF16: return "bf16";
    }
    return "?";
}

extern "C" int kernels_cuda_ctx_create(kernels_cuda_math math, kernels_cuda_ctx **out,
                                       vl_error *err) {
    if (out == NULL) return vl_fail(err, VL_EINVAL, "cuda ctx: no output pointer");
    *out = NULL;
    cublasComputeType_t compute;
    switch (math) {
    case KERNELS_CUDA_FP32: compute = CUBLAS_COMPUTE_32F; break;
    case KERNELS_CUDA_TF32: compute = CUBLAS_COMPUTE_32F_FAST_TF32; break;
    case KERNELS_CUDA_BF16: compute = CUBLAS_COMPUTE_32F_FAST_16BF; break;
    default: return vl_fail(err, VL_EINVAL, "cuda ctx: unknown math mode %d", (int)math);
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(err, e, "cudaGetDeviceCount");
    }
    if (n == 0) return vl_fail(err, VL_ERR, "cuda ctx: no CUDA device");
    kernels_cuda_ctx *ctx = (kernels_cuda_ctx *)calloc(1, sizeof *ctx);
    if (ctx == NULL) return vl_fail(err, VL_ENOMEM, "cuda ctx: out of memory");
    cublasStatus_t s = cublasCreate(&ctx->handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(ctx);
        return cublas_fail(err, s, "cublasCreate");
    }
    /* Host-side alpha and beta; the legacy default stream. */
    if ((s = cublasSetPointerMode(ctx->handle, CUBLAS_POINTER_MODE_HOST)) !=
            CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetStream(ctx->handle, 0)) != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(ctx->handle);
        free(ctx);
        return cublas_fail(err, s, "handle setup");
    }
    ctx->math = math;
    ctx->compute = compute;
    *out = ctx;
    return 0;
}

extern "C" void kernels_cuda_ctx_destroy(kernels_cuda_ctx *ctx) {
    if (ctx == NULL) return;
    (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
    cublasDestroy(ctx->handle);
    free(ctx);
}

extern "C" kernels_cuda_math kernels_cuda_ctx_math(const kernels_cuda_ctx *ctx) {
    return ctx->math;
}

extern "C" int kernels_cuda_sync(vl_error *err) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(err, e, "queued work");
    }
    return 0;
}

/* ---- memory ------------------------------------------------------------------ */

/* kernels_cuda_alloc and kernels_cuda_free are in memory.cu. */

static int copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, vl_error *err) {
    if (bytes == 0) return 0;
    if (dst == NULL || src == NULL) return vl_fail(err, VL_EINVAL, "cuda copy: NULL pointer");
    cudaError_t e = cudaMemcpy(dst, src, bytes, kind);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(err, e,
                         kind == cudaMemcpyHostToDevice   ? "copy to device"
                         : kind == cudaMemcpyDeviceToHost ? "copy to host"
                                                          : "copy on the device");
    }
    return 0;
}

extern "C" int kernels_cuda_upload(void *d_dst, const void *src, size_t bytes, vl_error *err) {
    return copy(d_dst, src, bytes, cudaMemcpyHostToDevice, err);
}

extern "C" int kernels_cuda_download(void *dst, const void *d_src, size_t bytes, vl_error *err) {
    return copy(dst, d_src, bytes, cudaMemcpyDeviceToHost, err);
}

extern "C" int kernels_cuda_download_rows(void *dst, size_t dpitch, const void *d_src,
                                          size_t spitch, size_t width, size_t rows, vl_error *err) {
    if (width == 0 || rows == 0) return 0;
    if (dst == NULL || d_src == NULL) return vl_fail(err, VL_EINVAL, "cuda copy: NULL pointer");
    if (dpitch < width || spitch < width)
        return vl_fail(err, VL_EINVAL, "cuda copy: pitch below the row width");
    cudaError_t e = cudaMemcpy2D(dst, dpitch, d_src, spitch, width, rows, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(err, e, "copy to host");
    }
    return 0;
}

extern "C" int kernels_cuda_copy(void *d_dst, const void *d_src, size_t bytes, vl_error *err) {
    return copy(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, err);
}

extern "C" int kernels_cuda_zero(void *d, size_t bytes, vl_error *err) {
    if (bytes == 0) return 0;
    if (d == NULL) return vl_fail(err, VL_EINVAL, "cuda zero: NULL pointer");
    cudaError_t e = cudaMemsetAsync(d, 0, bytes, 0);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(err, e, "cudaMemsetAsync");
    }
    return 0;
}

/* ---- GEMM ---------------------------------------------------------------------- */

int kc_gemm(kernels_cuda_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
            int lda, long long sa, const float *B, int ldb, long long sb, float beta, float *C,
            int ldc, long long sc, int count, vl_error *err) {
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (count == 1)
        s = cublasGemmEx(ctx->handle, opb, opa, N, M, K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F,
                         lda, &beta, C, CUDA_R_32F, ldc, ctx->compute, CUBLAS_GEMM_DEFAULT);
    else
        s = cublasGemmStridedBatchedEx(ctx->handle, opb, opa, N, M, K, &alpha, B, CUDA_R_32F, ldb,
                                       sb, A, CUDA_R_32F, lda, sa, &beta, C, CUDA_R_32F, ldc, sc,
                                       count, ctx->compute, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : cublas_fail(err, s, "GEMM");
}

int kc_gemm_bf16(kernels_cuda_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha,
                 const void *A, int lda, long long sa, const void *B, int ldb, long long sb,
                 float beta, void *C, int c_bf16, int ldc, long long sc, int count, vl_error *err) {
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t ct = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasStatus_t s;
    if (count == 1)
        s = cublasGemmEx(ctx->handle, opb, opa, N, M, K, &alpha, B, CUDA_R_16BF, ldb, A,
                         CUDA_R_16BF, lda, &beta, C, ct, ldc, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
    else
        s = cublasGemmStridedBatchedEx(ctx->handle, opb, opa, N, M, K, &alpha, B, CUDA_R_16BF, ldb,
                                       sb, A, CUDA_R_16BF, lda, sa, &beta, C, ct, ldc, sc, count,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : cublas_fail(err, s, "bf16 GEMM");
}

extern "C" int kernels_cuda_gemm(kernels_cuda_ctx *ctx, int ta, int tb, int M, int N, int K,
                                 float alpha, const float *d_A, int lda, const float *d_B, int ldb,
                                 float beta, float *d_C, int ldc, vl_error *err) {
    if (ctx == NULL || d_A == NULL || d_B == NULL || d_C == NULL)
        return vl_fail(err, VL_EINVAL, "cuda gemm: NULL context or pointer");
    if (M < 1 || N < 1 || K < 1)
        return vl_fail(err, VL_EINVAL, "cuda gemm: M=%d N=%d K=%d", M, N, K);
    return kc_gemm(ctx, ta, tb, M, N, K, alpha, d_A, lda, 0, d_B, ldb, 0, beta, d_C, ldc, 0, 1,
                   err);
}

/* ---- linear layers ------------------------------------------------------------- */

/* A block per row (grid-stride over rows): no 64-bit remainder per value. */
__global__ static void seed_bias_kernel(float *out, const float *bias, size_t rows, int OUT) {
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x)
        for (int c = threadIdx.x; c < OUT; c += blockDim.x) out[r * (size_t)OUT + c] = bias[c];
}

int kc_seed_bias(float *out, const float *bias, size_t n, int OUT, vl_error *err) {
    size_t rows = n / (size_t)OUT;
    unsigned blocks = rows < KC_MAX_BLOCKS ? (unsigned)rows : KC_MAX_BLOCKS;
    seed_bias_kernel<<<blocks, KC_THREADS>>>(out, bias, rows, OUT);
    return kc_launched(err, "bias seed");
}

/* Rows of one column-sum block; the block's 32 x KC_WARPS threads take 32
 * columns and stride over the rows by KC_WARPS. */
#define COLSUM_ROWS 256

/* dst[c] += sum over rows n of src[n, c]. Each block sums a slab of rows
 * for 32 columns, then adds its partial sums with one atomic per column. */
__global__ static void colsum_add_kernel(float *dst, const float *src, int N, int W,
                                         int rows_per_block) {
    __shared__ float part[KC_WARPS][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * rows_per_block;
    int r1 = min(N, r0 + rows_per_block);
    float s = 0.0f;
    if (c < W)
        for (int r = r0 + threadIdx.y; r < r1; r += KC_WARPS) s += src[(size_t)r * W + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < W) {
        float t = 0.0f;
        for (int k = 0; k < KC_WARPS; k++) t += part[k][threadIdx.x];
        atomicAdd(&dst[c], t);
    }
}

void kc_colsum_grid(int N, int W, dim3 *grid, int *rows_per_block) {
    unsigned gy = (unsigned)((N + COLSUM_ROWS - 1) / COLSUM_ROWS);
    if (gy > KC_MAX_BLOCKS) gy = KC_MAX_BLOCKS;
    *rows_per_block = (int)((N + gy - 1) / gy);
    *grid = dim3((unsigned)((W + 31) / 32), gy);
}

int kc_colsum_add(float *dst, const float *src, int N, int W, vl_error *err) {
    dim3 grid;
    int rows;
    kc_colsum_grid(N, W, &grid, &rows);
    colsum_add_kernel<<<grid, dim3(32, KC_WARPS)>>>(dst, src, N, W, rows);
    return kc_launched(err, "bias gradient");
}

int kc_check_mm(kernels_cuda_ctx *ctx, const void *a, const void *b, const void *c, int N, int IN,
                int OUT, const char *what, vl_error *err) {
    if (ctx == NULL || a == NULL || b == NULL || c == NULL)
        return vl_fail(err, VL_EINVAL, "cuda %s: NULL context or pointer", what);
    if (N < 1 || IN < 1 || OUT < 1)
        return vl_fail(err, VL_EINVAL, "cuda %s: N=%d IN=%d OUT=%d", what, N, IN, OUT);
    return 0;
}

extern "C" int kernels_cuda_matmul_forward(kernels_cuda_ctx *ctx, float *d_out, const float *d_inp,
                                           const float *d_weight, const float *d_bias, int N,
                                           int IN, int OUT, vl_error *err) {
    int rc = kc_check_mm(ctx, d_out, d_inp, d_weight, N, IN, OUT, "matmul", err);
    if (rc != 0) return rc;
    float beta = 0.0f;
    if (d_bias) {
        if ((rc = kc_seed_bias(d_out, d_bias, (size_t)N * OUT, OUT, err)) != 0) return rc;
        beta = 1.0f;
    }
    return kc_gemm(ctx, 0, 0, N, OUT, IN, 1.0f, d_inp, IN, 0, d_weight, OUT, 0, beta, d_out, OUT, 0,
                   1, err);
}

extern "C" int kernels_cuda_matmul_backward(kernels_cuda_ctx *ctx, float *d_dinp, float *d_dweight,
                                            float *d_dbias, const float *d_dout, const float *d_inp,
                                            const float *d_weight, int N, int IN, int OUT,
                                            vl_error *err) {
    int rc = kc_check_mm(ctx, d_dweight, d_dout, d_inp, N, IN, OUT, "matmul backward", err);
    if (rc == 0 && d_dinp && d_weight == NULL)
        rc = vl_fail(err, VL_EINVAL, "cuda matmul backward: dinp without weight");
    if (rc == 0 && d_dinp)
        rc = kc_gemm(ctx, 0, 1, N, IN, OUT, 1.0f, d_dout, OUT, 0, d_weight, OUT, 0, 1.0f, d_dinp,
                     IN, 0, 1, err);
    if (rc == 0)
        rc = kc_gemm(ctx, 1, 0, IN, OUT, N, 1.0f, d_inp, IN, 0, d_dout, OUT, 0, 1.0f, d_dweight,
                     OUT, 0, 1, err);
    if (rc == 0 && d_dbias) rc = kc_colsum_add(d_dbias, d_dout, N, OUT, err);
    return rc;
}

extern "C" int kernels_cuda_matmul_wt_forward(kernels_cuda_ctx *ctx, float *d_out,
                                              const float *d_inp, const float *d_weight_t, int N,
                                              int IN, int OUT, vl_error *err) {
    int rc = kc_check_mm(ctx, d_out, d_inp, d_weight_t, N, IN, OUT, "matmul_wt", err);
    if (rc != 0) return rc;
    return kc_gemm(ctx, 0, 1, N, OUT, IN, 1.0f, d_inp, IN, 0, d_weight_t, IN, 0, 0.0f, d_out, OUT,
                   0, 1, err);
}

extern "C" int kernels_cuda_matmul_wt_backward(kernels_cuda_ctx *ctx, float *d_dinp,
                                               float *d_dweight_t, const float *d_dout,
                                               const float *d_inp, const float *d_weight_t, int N,
                                               int IN, int OUT, vl_error *err) {
    int rc = kc_check_mm(ctx, d_dweight_t, d_dout, d_inp, N, IN, OUT, "matmul_wt backward", err);
    if (rc == 0 && d_dinp && d_weight_t == NULL)
        rc = vl_fail(err, VL_EINVAL, "cuda matmul_wt backward: dinp without weight");
    if (rc == 0 && d_dinp)
        rc = kc_gemm(ctx, 0, 0, N, IN, OUT, 1.0f, d_dout, OUT, 0, d_weight_t, IN, 0, 1.0f, d_dinp,
                     IN, 0, 1, err);
    if (rc == 0)
        rc = kc_gemm(ctx, 1, 0, OUT, IN, N, 1.0f, d_dout, OUT, 0, d_inp, IN, 0, 1.0f, d_dweight_t,
                     IN, 0, 1, err);
    return rc;
}
