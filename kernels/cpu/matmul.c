/* Linear layers. Weights are [in, out] row-major. */
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"

#define MM_BLOCK 64

void kernels_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                            int N, int IN, int OUT) {
    float beta = 0.0f;
    if (bias) {
        /* Seed every row with the bias and let sgemm accumulate onto it,
         * instead of a second pass over the output. */
#pragma omp parallel for schedule(static) if ((long)N * OUT > KV_PAR_MIN)
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OUT, bias, (size_t)OUT * sizeof(float));
        beta = 1.0f;
    }
    kv_sgemm(0, 0, N, OUT, IN, 1.0f, inp, IN, weight, OUT, beta, out, OUT);
}

static void column_sums_add(float *dst, const float *src, int N, int W) {
    int nblocks = (W + MM_BLOCK - 1) / MM_BLOCK;
#pragma omp parallel for schedule(static) if ((long)N * W > KV_PAR_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * MM_BLOCK;
        int c1 = c0 + MM_BLOCK < W ? c0 + MM_BLOCK : W;
        for (int n = 0; n < N; n++) {
            const float *row = src + (size_t)n * W;
            for (int c = c0; c < c1; c++) dst[c] += row[c];
        }
    }
}

void kernels_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int IN, int OUT) {
    if (dinp) kv_sgemm(0, 1, N, IN, OUT, 1.0f, dout, OUT, weight, OUT, 1.0f, dinp, IN);
    kv_sgemm(1, 0, IN, OUT, N, 1.0f, inp, IN, dout, OUT, 1.0f, dweight, OUT);
    if (dbias) column_sums_add(dbias, dout, N, OUT);
}

void kernels_matmul_wt_forward(float *out, const float *inp, const float *weight_t, int N, int IN,
                               int OUT) {
    kv_sgemm(0, 1, N, OUT, IN, 1.0f, inp, IN, weight_t, IN, 0.0f, out, OUT);
}

void kernels_matmul_wt_backward(float *dinp, float *dweight_t, const float *dout, const float *inp,
                                const float *weight_t, int N, int IN, int OUT) {
    if (dinp) kv_sgemm(0, 0, N, IN, OUT, 1.0f, dout, OUT, weight_t, IN, 1.0f, dinp, IN);
    kv_sgemm(1, 0, OUT, IN, N, 1.0f, dout, OUT, inp, IN, 1.0f, dweight_t, IN);
}
