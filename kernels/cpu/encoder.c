/* Token + position embedding. */
#include <stddef.h>

#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"

void kernels_encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                             int B, int T, int C) {
    long rows = (long)B * T;
#pragma omp parallel for schedule(static) if (rows * C > KV_PAR_MIN)
    for (long r = 0; r < rows; r++) {
        int t = (int)(r % T);
        const float *e = wte + (size_t)tokens[r] * C;
        const float *p = wpe + (size_t)t * C;
        float *o = out + (size_t)r * C;
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

/* Channel blocks wide enough that each thread streams whole cache lines. */
#define ENC_BLOCK 32

void kernels_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B,
                              int T, int C) {
    /* Position gradient: each thread owns whole rows of dwpe and sums the
     * batch in order. */
#pragma omp parallel for schedule(static) if ((long)B * T * C > KV_PAR_MIN)
    for (int t = 0; t < T; t++) {
        float *dp = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) dp[c] += d[c];
        }
    }
    /* Token gradient: the same token can appear at many positions, so
     * threads split the channels instead of the positions and each walks all
     * positions in order; no two threads touch the same element. */
    int nblocks = (C + ENC_BLOCK - 1) / ENC_BLOCK;
    long rows = (long)B * T;
#pragma omp parallel for schedule(static) if (rows * C > KV_PAR_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * ENC_BLOCK;
        int c1 = c0 + ENC_BLOCK < C ? c0 + ENC_BLOCK : C;
        for (long r = 0; r < rows; r++) {
            float *dw = dwte + (size_t)tokens[r] * C;
            const float *d = dout + (size_t)r * C;
            for (int c = c0; c < c1; c++) dw[c] += d[c];
        }
    }
}
