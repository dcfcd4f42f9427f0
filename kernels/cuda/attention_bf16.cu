/* Causal self-attention with bfloat16 operands (kernels/cuda_bf16.h): the
 * same strided-batched products over the heads of a sequence as
 * attention.cu, on cuBLAS's bf16 kernels. The scores and the gradient of
 * the probabilities come out of their products in float32, where the
 * softmax and its backward read them; what those kernels write (the
 * probabilities, the scores' gradient) is only ever an operand of the
 * next product, so it is stored as bfloat16, half the bytes of the
 * largest tensors of the layer. */
#include <float.h>
#include <limits.h>
#include <math.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"
#include "kernels/cuda_bf16.h"

/* Row r of the B*NH*T rows is query t = r % T: p = softmax of the scores
 * over 0..t, zero after; below FLT_MIN flushed as on the CPU. */
__global__ static void causal_softmax_bf16_kernel(__nv_bfloat16 *p_h, const float *scores,
                                                  size_t rows, int T) {
    size_t row = (size_t)blockIdx.x * KC_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float *s = scores + row * (size_t)T;
    __nv_bfloat16 *p = p_h + row * (size_t)T;
    int t = (int)(row % (size_t)T);
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, s[j]);
    mx = kc_warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) sum += expf(s[j] - mx);
    float inv = 1.0f / kc_warp_sum(sum);
    for (int j = lane; j < T; j += 32) {
        float v = j <= t ? expf(s[j] - mx) * inv : 0.0f;
        p[j] = __float2bfloat16_rn(v < FLT_MIN ? 0.0f : v);
    }
}

/* ds = p * (dp - sum_j p_j dp_j) * scale over 0..t, zero after. */
__global__ static void causal_softmax_backward_bf16_kernel(__nv_bfloat16 *ds_h, const float *dp,
                                                           const __nv_bfloat16 *p_h, size_t rows,
                                                           int T, float scale) {
    size_t row = (size_t)blockIdx.x * KC_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const __nv_bfloat16 *p = p_h + row * (size_t)T;
    const float *d = dp + row * (size_t)T;
    __nv_bfloat16 *o = ds_h + row * (size_t)T;
    int t = (int)(row % (size_t)T);
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32) s += __bfloat162float(p[j]) * d[j];
    s = kc_warp_sum(s);
    for (int j = lane; j < T; j += 32)
        o[j] = __float2bfloat16_rn(j <= t ? __bfloat162float(p[j]) * (d[j] - s) * scale : 0.0f);
}

extern "C" int kernels_cuda_attention_forward_bf16(kernels_cuda_ctx *ctx, kernels_bf16 *d_out_h,
                                                   float *d_scores, kernels_bf16 *d_att_h,
                                                   const kernels_bf16 *d_qkv_h, int B, int T, int C,
                                                   int NH, vl_error *err) {
    int rc = kc_check_attention(ctx, d_out_h, d_scores, d_att_h, d_qkv_h, B, T, C, NH,
                                "attention bf16", err);
    if (rc != 0) return rc;
    int hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long tt = (long long)T * T;
    for (int b = 0; b < B && rc == 0; b++) {
        const kernels_bf16 *q = d_qkv_h + (size_t)b * T * ld;
        rc = kc_gemm_bf16(ctx, 0, 1, T, T, hs, scale, q, ld, hs, q + C, ld, hs, 0.0f,
                          d_scores + (size_t)b * NH * tt, 0, T, tt, NH, err);
    }
    if (rc != 0) return rc;
    size_t rows = (size_t)B * NH * T;
    causal_softmax_bf16_kernel<<<kc_row_blocks(rows), KC_THREADS>>>((__nv_bfloat16 *)d_att_h,
                                                                    d_scores, rows, T);
    if ((rc = kc_launched(err, "attention softmax")) != 0) return rc;
    for (int b = 0; b < B && rc == 0; b++) {
        const kernels_bf16 *v = d_qkv_h + (size_t)b * T * ld + 2 * (size_t)C;
        rc = kc_gemm_bf16(ctx, 0, 0, T, hs, T, 1.0f, d_att_h + (size_t)b * NH * tt, T, tt, v, ld,
                          hs, 0.0f, d_out_h + (size_t)b * T * C, 1, C, hs, NH, err);
    }
    return rc;
}

extern "C" int kernels_cuda_attention_backward_bf16(kernels_cuda_ctx *ctx, float *d_dqkv,
                                                    float *d_dp, kernels_bf16 *d_ds_h,
                                                    const kernels_bf16 *d_dout_h,
                                                    const kernels_bf16 *d_qkv_h,
                                                    const kernels_bf16 *d_att_h, int B, int T,
                                                    int C, int NH, vl_error *err) {
    int rc = kc_check_attention(ctx, d_dqkv, d_dp, d_ds_h, d_dout_h, B, T, C, NH,
                                "attention bf16 backward", err);
    if (rc == 0 && (d_qkv_h == NULL || d_att_h == NULL))
        rc = vl_fail(err, VL_EINVAL, "cuda attention bf16 backward: NULL pointer");
    if (rc != 0) return rc;
    int hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long tt = (long long)T * T;
    for (int b = 0; b < B && rc == 0; b++) {
        const kernels_bf16 *v = d_qkv_h + (size_t)b * T * ld + 2 * (size_t)C;
        const kernels_bf16 *dy = d_dout_h + (size_t)b * T * C;
        const kernels_bf16 *p = d_att_h + (size_t)b * NH * tt;
        float *dv = d_dqkv + (size_t)b * T * ld + 2 * (size_t)C;
        /* dp = dy v^T; dv = p^T dy */
        rc = kc_gemm_bf16(ctx, 0, 1, T, T, hs, 1.0f, dy, C, hs, v, ld, hs, 0.0f,
                          d_dp + (size_t)b * NH * tt, 0, T, tt, NH, err);
        if (rc == 0)
            rc = kc_gemm_bf16(ctx, 1, 0, T, hs, T, 1.0f, p, T, tt, dy, C, hs, 0.0f, dv, 0, ld, hs,
                              NH, err);
    }
    if (rc != 0) return rc;
    size_t rows = (size_t)B * NH * T;
    causal_softmax_backward_bf16_kernel<<<kc_row_blocks(rows), KC_THREADS>>>(
        (__nv_bfloat16 *)d_ds_h, d_dp, (const __nv_bfloat16 *)d_att_h, rows, T, scale);
    if ((rc = kc_launched(err, "attention softmax backward")) != 0) return rc;
    for (int b = 0; b < B && rc == 0; b++) {
        const kernels_bf16 *q = d_qkv_h + (size_t)b * T * ld;
        const kernels_bf16 *ds = d_ds_h + (size_t)b * NH * tt;
        float *dq = d_dqkv + (size_t)b * T * ld;
        /* dq = ds k; dk = ds^T q */
        rc = kc_gemm_bf16(ctx, 0, 0, T, hs, T, 1.0f, ds, T, tt, q + C, ld, hs, 0.0f, dq, 0, ld, hs,
                          NH, err);
        if (rc == 0)
            rc = kc_gemm_bf16(ctx, 1, 0, T, hs, T, 1.0f, ds, T, tt, q, ld, hs, 0.0f, dq + C, 0, ld,
                              hs, NH, err);
    }
    return rc;
}
