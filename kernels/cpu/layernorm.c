/* LayerNorm over the channel dimension. */
#include <math.h>
#include <stddef.h>

#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"

#define LN_EPS 1e-5f
#define LN_BLOCK 32

void kernels_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int N, int C) {
#pragma omp parallel for schedule(static) if ((long)N * C > KV_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        /* Two passes (mean, then centred variance) rather than E[x^2]-E[x]^2,
         * which cancels badly when the mean is large. */
        float s = 0.0f;
        for (int c = 0; c < C; c++) s += x[c];
        float m = s / (float)C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            v += d * d;
        }
        float rs = 1.0f / sqrtf(v / (float)C + LN_EPS);
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = rs;
    }
}

void kernels_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, int N, int C) {
    int par = (long)N * C > KV_PAR_MIN;
    /* Input gradient, row by row:
     * dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)). */
#pragma omp parallel for schedule(static) if (par)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], rs = rstd[n];
        float s1 = 0.0f, s2 = 0.0f;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * rs;
            float dxhat = dy[c] * weight[c];
            s1 += dxhat;
            s2 += dxhat * xhat;
        }
        s1 /= (float)C;
        s2 /= (float)C;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * rs;
            float dxhat = dy[c] * weight[c];
            dx[c] += rs * (dxhat - s1 - xhat * s2);
        }
    }
    /* Parameter gradients are sums over rows; threads split the channels so
     * each sum runs over the rows in order on one thread. */
    int nblocks = (C + LN_BLOCK - 1) / LN_BLOCK;
#pragma omp parallel for schedule(static) if (par)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * LN_BLOCK;
        int c1 = c0 + LN_BLOCK < C ? c0 + LN_BLOCK : C;
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *dy = dout + (size_t)n * C;
            float m = mean[n], rs = rstd[n];
            for (int c = c0; c < c1; c++) {
                dweight[c] += dy[c] * (x[c] - m) * rs;
                dbias[c] += dy[c];
            }
        }
    }
}
