/* LayerNorm on the GPU: one warp per row for the normalisation and the
 * input gradient (rows are short enough, C in the hundreds or thousands,
 * that 32 lanes stream them without shared memory or barriers), and a
 * strip-by-slab column sum for the gain and bias gradients. */
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"
#include "kernels/cuda_bf16.h"

#define LN_EPS 1e-5f

/* Out is float or __nv_bfloat16: the statistics are float32 either way. */
template <typename Out>
__global__ static void ln_forward_kernel(Out *out, float *mean, float *rstd, const float *inp,
                                         const float *weight, const float *bias, int N, int C) {
    int row = blockIdx.x * KC_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) /* whole warps leave together, so the shuffles see 32 lanes */
        return;
    const float *x = inp + (size_t)row * C;
    Out *o = out + (size_t)row * C;
    /* Two passes, mean then centred variance, as the CPU kernel does. */
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = kc_warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = x[c] - m;
        v += d * d;
    }
    float rs = 1.0f / sqrtf(kc_warp_sum(v) / (float)C + LN_EPS);
    for (int c = lane; c < C; c += 32) kc_put(&o[c], (x[c] - m) * rs * weight[c] + bias[c]);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
}

/* dx += rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)). */
__global__ static void ln_backward_input_kernel(float *dinp, const float *dout, const float *inp,
                                                const float *weight, const float *mean,
                                                const float *rstd, int N, int C) {
    int row = blockIdx.x * KC_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    const float *dy = dout + (size_t)row * C;
    float *dx = dinp + (size_t)row * C;
    float m = mean[row], rs = rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float xhat = (x[c] - m) * rs;
        float dxhat = dy[c] * weight[c];
        s1 += dxhat;
        s2 += dxhat * xhat;
    }
    s1 = kc_warp_sum(s1) / (float)C;
    s2 = kc_warp_sum(s2) / (float)C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (x[c] - m) * rs;
        float dxhat = dy[c] * weight[c];
        dx[c] += rs * (dxhat - s1 - xhat * s2);
    }
}

/* dweight[c] += sum_n dy[n,c] xhat[n,c], dbias[c] += sum_n dy[n,c]: each
 * block sums its slab of rows for 32 channels, then one atomic per channel
 * and gradient. */
__global__ static void ln_backward_params_kernel(float *dweight, float *dbias, const float *dout,
                                                 const float *inp, const float *mean,
                                                 const float *rstd, int N, int C,
                                                 int rows_per_block) {
    __shared__ float pw[KC_WARPS][33], pb[KC_WARPS][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * rows_per_block;
    int r1 = min(N, r0 + rows_per_block);
    float sw = 0.0f, sb = 0.0f;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += KC_WARPS) {
            size_t i = (size_t)r * C + c;
            sw += dout[i] * (inp[i] - mean[r]) * rstd[r];
            sb += dout[i];
        }
    pw[threadIdx.y][threadIdx.x] = sw;
    pb[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int k = 0; k < KC_WARPS; k++) {
            tw += pw[k][threadIdx.x];
            tb += pb[k][threadIdx.x];
        }
        atomicAdd(&dweight[c], tw);
        atomicAdd(&dbias[c], tb);
    }
}

static unsigned row_blocks(int N) {
    return (unsigned)((N + KC_WARPS - 1) / KC_WARPS);
}

template <typename Out>
static int ln_forward(Out *d_out, float *d_mean, float *d_rstd, const float *d_inp,
                      const float *d_weight, const float *d_bias, int N, int C, vl_error *err) {
    if (!d_out || !d_mean || !d_rstd || !d_inp || !d_weight || !d_bias)
        return vl_fail(err, VL_EINVAL, "cuda layernorm: NULL pointer");
    if (N < 1 || C < 1) return vl_fail(err, VL_EINVAL, "cuda layernorm: N=%d C=%d", N, C);
    ln_forward_kernel<Out>
        <<<row_blocks(N), KC_THREADS>>>(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C);
    return kc_launched(err, "layernorm forward");
}

extern "C" int kernels_cuda_layernorm_forward(float *d_out, float *d_mean, float *d_rstd,
                                              const float *d_inp, const float *d_weight,
                                              const float *d_bias, int N, int C, vl_error *err) {
    return ln_forward(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C, err);
}

extern "C" int kernels_cuda_layernorm_forward_bf16(kernels_bf16 *d_out, float *d_mean,
                                                   float *d_rstd, const float *d_inp,
                                                   const float *d_weight, const float *d_bias,
                                                   int N, int C, vl_error *err) {
    return ln_forward((__nv_bfloat16 *)d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C, err);
}

extern "C" int kernels_cuda_layernorm_backward(float *d_dinp, float *d_dweight, float *d_dbias,
                                               const float *d_dout, const float *d_inp,
                                               const float *d_weight, const float *d_mean,
                                               const float *d_rstd, int N, int C, vl_error *err) {
    if (!d_dinp || !d_dweight || !d_dbias || !d_dout || !d_inp || !d_weight || !d_mean || !d_rstd)
        return vl_fail(err, VL_EINVAL, "cuda layernorm backward: NULL pointer");
    if (N < 1 || C < 1) return vl_fail(err, VL_EINVAL, "cuda layernorm backward: N=%d C=%d", N, C);
    ln_backward_input_kernel<<<row_blocks(N), KC_THREADS>>>(d_dinp, d_dout, d_inp, d_weight, d_mean,
                                                            d_rstd, N, C);
    int rc = kc_launched(err, "layernorm backward (input)");
    if (rc != 0) return rc;
    dim3 grid;
    int rows;
    kc_colsum_grid(N, C, &grid, &rows);
    ln_backward_params_kernel<<<grid, dim3(32, KC_WARPS)>>>(d_dweight, d_dbias, d_dout, d_inp,
                                                            d_mean, d_rstd, N, C, rows);
    return kc_launched(err, "layernorm backward (parameters)");
}
