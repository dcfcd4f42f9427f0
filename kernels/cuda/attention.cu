/* Causal multi-head self-attention on the GPU as strided-batched cuBLAS
 * products over the heads of one sequence, with the causal softmax and its
 * backward in a kernel (one warp per row of scores). Scores are computed
 * for the whole T x T square and the masked half zeroed: twice the FLOPs
 * of the triangle, in exchange for plain GEMMs and no fused kernel.
 *
 * Layouts, as in the CPU kernel: head h of sequence b reads q, k and v
 * from qkv[b, :, h*hs + (0, C, 2C)] with row stride 3C, writes out[b, :,
 * h*hs] with row stride C, and owns att[b, h] ([T,T], row t = query t).
 * Consecutive heads are hs floats apart, so one batched call covers the
 * NH heads of a sequence. */
#include <float.h>
#include <limits.h>
#include <math.h>

#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

/* Row r of the B*NH*T rows of scores is query t = r % T: softmax over
 * 0..t, zero after. Probabilities below FLT_MIN are flushed as on the CPU. */
__global__ static void causal_softmax_kernel(float *att, size_t rows, int T) {
    size_t row = (size_t)blockIdx.x * KC_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float *p = att + row * (size_t)T;
    int t = (int)(row % (size_t)T);
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, p[j]);
    mx = kc_warp_max(mx);
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32) {
        float e = expf(p[j] - mx);
        p[j] = e;
        s += e;
    }
    float inv = 1.0f / kc_warp_sum(s);
    /* Each lane rewrites only the elements it wrote above. */
    for (int j = lane; j < T; j += 32) {
        float v = j <= t ? p[j] * inv : 0.0f;
        p[j] = v < FLT_MIN ? 0.0f : v;
    }
}

/* ds = p * (dp - sum_j p_j dp_j) * scale over 0..t, zero after; ds holds
 * dp on entry. */
__global__ static void causal_softmax_backward_kernel(float *ds, const float *att, size_t rows,
                                                      int T, float scale) {
    size_t row = (size_t)blockIdx.x * KC_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float *p = att + row * (size_t)T;
    float *d = ds + row * (size_t)T;
    int t = (int)(row % (size_t)T);
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32) s += p[j] * d[j];
    s = kc_warp_sum(s);
    for (int j = lane; j < T; j += 32) d[j] = j <= t ? p[j] * (d[j] - s) * scale : 0.0f;
}

int kc_check_attention(kernels_cuda_ctx *ctx, const void *a, const void *b, const void *c,
                       const void *d, int B, int T, int C, int NH, const char *what,
                       vl_error *err) {
    if (ctx == NULL || a == NULL || b == NULL || c == NULL || d == NULL)
        return vl_fail(err, VL_EINVAL, "cuda %s: NULL context or pointer", what);
    if (B < 1 || T < 1 || C < 1 || NH < 1 || C % NH != 0)
        return vl_fail(err, VL_EINVAL, "cuda %s: B=%d T=%d C=%d NH=%d", what, B, T, C, NH);
    /* Row counts for the softmax grid, in blocks of KC_WARPS rows. */
    if ((size_t)B * NH * T / KC_WARPS >= (size_t)INT_MAX || C > INT_MAX / 3)
        return vl_fail(err, VL_EINVAL, "cuda %s: too many rows", what);
    return 0;
}

extern "C" int kernels_cuda_attention_forward(kernels_cuda_ctx *ctx, float *d_out, float *d_att,
                                              const float *d_qkv, int B, int T, int C, int NH,
                                              vl_error *err) {
    int rc = kc_check_attention(ctx, d_out, d_att, d_qkv, d_qkv, B, T, C, NH, "attention", err);
    if (rc != 0) return rc;
    int hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long tt = (long long)T * T;
    /* scores = scale * q k^T for every head of every sequence */
    for (int b = 0; b < B && rc == 0; b++) {
        const float *q = d_qkv + (size_t)b * T * ld;
        rc = kc_gemm(ctx, 0, 1, T, T, hs, scale, q, ld, hs, q + C, ld, hs, 0.0f,
                     d_att + (size_t)b * NH * tt, T, tt, NH, err);
    }
    if (rc != 0) return rc;
    size_t rows = (size_t)B * NH * T;
    causal_softmax_kernel<<<kc_row_blocks(rows), KC_THREADS>>>(d_att, rows, T);
    if ((rc = kc_launched(err, "attention softmax")) != 0) return rc;
    /* out = p v */
    for (int b = 0; b < B && rc == 0; b++) {
        const float *v = d_qkv + (size_t)b * T * ld + 2 * (size_t)C;
        rc = kc_gemm(ctx, 0, 0, T, hs, T, 1.0f, d_att + (size_t)b * NH * tt, T, tt, v, ld, hs, 0.0f,
                     d_out + (size_t)b * T * C, C, hs, NH, err);
    }
    return rc;
}

extern "C" size_t kernels_cuda_attention_scratch_floats(int B, int T, int NH) {
    if (B < 1 || T < 1 || NH < 1) return 0;
    size_t n = (size_t)B * (size_t)NH;
    if (n > SIZE_MAX / (size_t)T || n * T > SIZE_MAX / (size_t)T) return 0;
    return n * T * T;
}

extern "C" int kernels_cuda_attention_backward(kernels_cuda_ctx *ctx, float *d_dqkv,
                                               float *d_scratch, const float *d_dout,
                                               const float *d_qkv, const float *d_att, int B, int T,
                                               int C, int NH, vl_error *err) {
    int rc = kc_check_attention(ctx, d_dqkv, d_scratch, d_dout, d_qkv, B, T, C, NH,
                                "attention backward", err);
    if (rc == 0 && d_att == NULL)
        rc = vl_fail(err, VL_EINVAL, "cuda attention backward: NULL pointer");
    if (rc != 0) return rc;
    int hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long tt = (long long)T * T;
    for (int b = 0; b < B && rc == 0; b++) {
        const float *v = d_qkv + (size_t)b * T * ld + 2 * (size_t)C;
        const float *dy = d_dout + (size_t)b * T * C;
        const float *p = d_att + (size_t)b * NH * tt;
        float *ds = d_scratch + (size_t)b * NH * tt;
        float *dv = d_dqkv + (size_t)b * T * ld + 2 * (size_t)C;
        /* dp = dy v^T; dv += p^T dy */
        rc = kc_gemm(ctx, 0, 1, T, T, hs, 1.0f, dy, C, hs, v, ld, hs, 0.0f, ds, T, tt, NH, err);
        if (rc == 0)
            rc = kc_gemm(ctx, 1, 0, T, hs, T, 1.0f, p, T, tt, dy, C, hs, 1.0f, dv, ld, hs, NH, err);
    }
    if (rc != 0) return rc;
    size_t rows = (size_t)B * NH * T;
    causal_softmax_backward_kernel<<<kc_row_blocks(rows), KC_THREADS>>>(d_scratch, d_att, rows, T,
                                                                        scale);
    if ((rc = kc_launched(err, "attention softmax backward")) != 0) return rc;
    for (int b = 0; b < B && rc == 0; b++) {
        const float *q = d_qkv + (size_t)b * T * ld;
        const float *ds = d_scratch + (size_t)b * NH * tt;
        float *dq = d_dqkv + (size_t)b * T * ld;
        /* dq += ds k; dk += ds^T q */
        rc =
            kc_gemm(ctx, 0, 0, T, hs, T, 1.0f, ds, T, tt, q + C, ld, hs, 1.0f, dq, ld, hs, NH, err);
        if (rc == 0)
            rc = kc_gemm(ctx, 1, 0, T, hs, T, 1.0f, ds, T, tt, q, ld, hs, 1.0f, dq + C, ld, hs, NH,
                         err);
    }
    return rc;
}
