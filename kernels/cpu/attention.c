/* Causal multi-head self-attention with the softmax inside.
 *
 * Each (batch, head) pair is handled by one thread with single-threaded
 * sgemm calls. Queries are taken in blocks of ATT_BLOCK rows; a block only
 * needs the keys up to its last row, so the products skip most of the
 * masked upper triangle. */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"

#define ATT_BLOCK 64

static void gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Softmax of row t of the scores over positions 0..t, zero after. */
static void causal_softmax_row(float *p, int t, int T) {
    float mx = -INFINITY;
    for (int j = 0; j <= t; j++) mx = p[j] > mx ? p[j] : mx;
    for (int j = 0; j <= t; j++) p[j] = kv_exp(p[j] - mx);
    /* A separate in-order sum, so the exp loop above vectorises. */
    float sum = 0.0f;
    for (int j = 0; j <= t; j++) sum += p[j];
    float inv = 1.0f / sum;
    /* Probabilities below FLT_MIN are flushed to zero: kv_exp stops at
     * about FLT_MIN, and normalising such a value leaves a subnormal,
     * which every later product touching it (here and in backward) pays
     * for many times over on x86. A saturated softmax has many of them. */
    for (int j = 0; j <= t; j++) {
        float v = p[j] * inv;
        p[j] = v < FLT_MIN ? 0.0f : v;
    }
    for (int j = t + 1; j < T; j++) p[j] = 0.0f;
}

void kernels_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                               int NH) {
    kv_blas_single();
    int hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    int units = B * NH;
#pragma omp parallel for schedule(dynamic, 1) if ((long)units * T * T * hs > KV_PAR_MIN)
    for (int u = 0; u < units; u++) {
        int b = u / NH, h = u % NH;
        const float *q = qkv + (size_t)b * T * ld + (size_t)h * hs;
        const float *k = q + C, *v = q + 2 * (size_t)C;
        float *p = att + (size_t)u * T * T;
        float *o = out + (size_t)b * T * C + (size_t)h * hs;
        for (int i0 = 0; i0 < T; i0 += ATT_BLOCK) {
            int rows = T - i0 < ATT_BLOCK ? T - i0 : ATT_BLOCK, cols = i0 + rows;
            float *pb = p + (size_t)i0 * T;
            /* scores = scale * q k^T for keys 0..cols-1 */
            gemm(0, 1, rows, cols, hs, scale, q + (size_t)i0 * ld, ld, k, ld, 0.0f, pb, T);
            for (int r = 0; r < rows; r++) causal_softmax_row(pb + (size_t)r * T, i0 + r, T);
            /* out = p v */
            gemm(0, 0, rows, hs, cols, 1.0f, pb, T, v, ld, 0.0f, o + (size_t)i0 * C, C);
        }
    }
}

size_t kernels_attention_scratch_floats(int B, int T, int NH) {
    size_t rows = T < ATT_BLOCK ? (size_t)T : ATT_BLOCK;
    return (size_t)B * NH * rows * T;
}

void kernels_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                const float *att, int B, int T, int C, int NH) {
    kv_blas_single();
    int hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    int units = B * NH;
    size_t per_unit = (T < ATT_BLOCK ? (size_t)T : ATT_BLOCK) * (size_t)T;
    /* One thread owns a whole (batch, head): its key and value gradients
     * collect contributions from every query block in order, so no two
     * threads write the same element and the sums are reproducible. */
#pragma omp parallel for schedule(dynamic, 1) if ((long)units * T * T * hs > KV_PAR_MIN)
    for (int u = 0; u < units; u++) {
        int b = u / NH, h = u % NH;
        const float *q = qkv + (size_t)b * T * ld + (size_t)h * hs;
        const float *k = q + C, *v = q + 2 * (size_t)C;
        float *dq = dqkv + (size_t)b * T * ld + (size_t)h * hs;
        float *dk = dq + C, *dv = dq + 2 * (size_t)C;
        const float *dy = dout + (size_t)b * T * C + (size_t)h * hs;
        const float *p = att + (size_t)u * T * T;
        float *ds = scratch + (size_t)u * per_unit; /* [rows, T] */
        for (int i0 = 0; i0 < T; i0 += ATT_BLOCK) {
            int rows = T - i0 < ATT_BLOCK ? T - i0 : ATT_BLOCK, cols = i0 + rows;
            const float *pb = p + (size_t)i0 * T;
            const float *dyb = dy + (size_t)i0 * C;
            /* dp = dy v^T; dv += p^T dy */
            gemm(0, 1, rows, cols, hs, 1.0f, dyb, C, v, ld, 0.0f, ds, T);
            gemm(1, 0, cols, hs, rows, 1.0f, pb, T, dyb, C, 1.0f, dv, ld);
            /* Softmax backward: ds = p * (dp - sum_j p_j dp_j), with the
             * score scale folded in. */
            for (int r = 0; r < rows; r++) {
                int t = i0 + r;
                const float *pr = pb + (size_t)r * T;
                float *d = ds + (size_t)r * T;
                float s = 0.0f;
                for (int j = 0; j <= t; j++) s += pr[j] * d[j];
                for (int j = 0; j <= t; j++) d[j] = pr[j] * (d[j] - s) * scale;
                for (int j = t + 1; j < cols; j++) d[j] = 0.0f;
            }
            /* dq += ds k; dk += ds^T q */
            gemm(0, 0, rows, hs, cols, 1.0f, ds, T, k, ld, 1.0f, dq + (size_t)i0 * ld, ld);
            gemm(1, 0, cols, hs, rows, 1.0f, ds, T, q + (size_t)i0 * ld, ld, 1.0f, dk, ld);
        }
    }
}
