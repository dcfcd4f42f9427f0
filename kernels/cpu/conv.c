/*
 * 2-D convolution (NCHW, "same"-style zero padding) through im2col and
 * sgemm. The whole batch goes into one im2col matrix [ci*k*k, B*ho*wo],
 * sample b's output positions in columns [b*ho*wo, (b+1)*ho*wo), so the
 * forward product, the weight gradient and the input gradient are each one
 * large sgemm that kv_sgemm can split across threads, instead of B small
 * ones that each run on one core. The price is a transposed copy of the
 * output ([co, B*ho*wo] against NCHW's [B, co, ho*wo]); both keep sample
 * b's channel c as one contiguous run of ho*wo floats, so the copy is a
 * set of memcpy-sized moves.
 *
 * Every output element is written by one thread in a fixed order (the
 * bias sums in double, row by row), so results repeat bitwise for a given
 * thread count.
 */
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"

/* The shape with everything derived from it that the loops need. */
typedef struct geom {
    int ci, h, w, co, k, s, pad, ho, wo;
    size_t hw;   /* h*w: one input plane */
    size_t hwo;  /* ho*wo: one output plane */
    size_t rows; /* ci*k*k: rows of the im2col matrix, columns of the weight */
    size_t ld;   /* B*ho*wo: columns of the im2col matrix */
} geom;

int kernels_conv2d_out_size(int n, int k, int stride) {
    /* n + 2*(k/2) - k is n (even k) or n - 1 (odd k): never negative. */
    return (int)(((long long)n + 2 * (k / 2) - k) / stride + 1);
}

static void make_geom(geom *g, const kernels_conv2d_shape *s, int B) {
    g->ci = s->ci;
    g->h = s->h;
    g->w = s->w;
    g->co = s->co;
    g->k = s->k;
    g->s = s->stride;
    g->pad = s->k / 2;
    g->ho = kernels_conv2d_out_size(s->h, s->k, s->stride);
    g->wo = kernels_conv2d_out_size(s->w, s->k, s->stride);
    g->hw = (size_t)s->h * (size_t)s->w;
    g->hwo = (size_t)g->ho * (size_t)g->wo;
    g->rows = (size_t)s->ci * (size_t)s->k * (size_t)s->k;
    g->ld = (size_t)B * g->hwo;
}

size_t kernels_conv2d_scratch_floats(const kernels_conv2d_shape *s, int B) {
    if (s == NULL || B < 1 || s->ci < 1 || s->h < 1 || s->w < 1 || s->co < 1 || s->k < 1 ||
        s->stride < 1)
        return 0;
    /* Output sides computed wide: an even kernel's output is one larger
     * than its input, which int need not hold. */
    size_t pad2 = 2 * (size_t)(s->k / 2), k = (size_t)s->k, st = (size_t)s->stride;
    size_t ho = ((size_t)s->h + pad2 - k) / st + 1, wo = ((size_t)s->w + pad2 - k) / st + 1;
    size_t rows, per, n;
    if (__builtin_mul_overflow(k, k, &rows) || __builtin_mul_overflow(rows, (size_t)s->ci, &rows) ||
        __builtin_add_overflow(rows, (size_t)s->co, &per) || __builtin_mul_overflow(ho, wo, &n) ||
        __builtin_mul_overflow(n, (size_t)B, &n) || __builtin_mul_overflow(n, per, &n))
        return 0;
    return n;
}

/* The output positions o in [0, n_out) whose input coordinate o*s - pad +
 * kk lies inside [0, n_in): the range [*lo, *hi), empty when the kernel
 * offset kk only ever lands in the padding. */
static void valid_range(int n_out, int n_in, int s, int pad, int kk, int *lo, int *hi) {
    int need = pad - kk; /* o*s >= need */
    int l = need <= 0 ? 0 : (need + s - 1) / s;
    int last = n_in - 1 + pad - kk; /* o*s <= last */
    int h = last < 0 ? 0 : last / s + 1;
    h = h < n_out ? h : n_out;
    *lo = l < h ? l : h;
    *hi = h;
}

/* cols[r, b*hwo + oy*wo + ox] = inp[b, c, oy*s - pad + ky, ox*s - pad + kx]
 * (0 in the padding) for r = (c*k + ky)*k + kx. One (r, b) segment per
 * iteration, each written whole by one thread. */
static void im2col(float *cols, const float *inp, const geom *g, int B) {
    size_t n = g->rows * (size_t)B, kk = (size_t)g->k * (size_t)g->k;
#pragma omp parallel for schedule(static) if (n * g->hwo > KV_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        size_t r = i / (size_t)B, b = i % (size_t)B;
        size_t c = r / kk;
        int ky = (int)(r % kk) / g->k, kx = (int)(r % kk) % g->k;
        const float *plane = inp + (b * (size_t)g->ci + c) * g->hw;
        float *dst = cols + r * g->ld + b * g->hwo;
        int y0, y1, x0, x1;
        valid_range(g->ho, g->h, g->s, g->pad, ky, &y0, &y1);
        valid_range(g->wo, g->w, g->s, g->pad, kx, &x0, &x1);
        memset(dst, 0, (size_t)y0 * (size_t)g->wo * sizeof(float));
        for (int oy = y0; oy < y1; oy++) {
            float *row = dst + (size_t)oy * (size_t)g->wo;
            const float *src = plane + (size_t)(oy * g->s - g->pad + ky) * (size_t)g->w;
            for (int ox = 0; ox < x0; ox++) row[ox] = 0.0f;
            if (g->s == 1) {
                if (x1 > x0)
                    memcpy(row + x0, src + (x0 - g->pad + kx), (size_t)(x1 - x0) * sizeof(float));
            } else {
                for (int ox = x0; ox < x1; ox++) row[ox] = src[ox * g->s - g->pad + kx];
            }
            for (int ox = x1; ox < g->wo; ox++) row[ox] = 0.0f;
        }
        memset(dst + (size_t)y1 * (size_t)g->wo, 0,
               (size_t)(g->ho - y1) * (size_t)g->wo * sizeof(float));
    }
}

/* The adjoint of im2col: dinp[b, c, iy, ix] += every dcols entry that
 * im2col copied from there. One (b, c) plane per iteration, so each input
 * element is summed by one thread, always in the same order. */
static void col2im_add(float *dinp, const float *dcols, const geom *g, int B) {
    size_t n = (size_t)B * (size_t)g->ci;
#pragma omp parallel for schedule(static) if (n * g->rows * g->hwo / (size_t)g->ci > KV_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        size_t b = i / (size_t)g->ci, c = i % (size_t)g->ci;
        float *plane = dinp + i * g->hw;
        for (int ky = 0; ky < g->k; ky++) {
            int y0, y1;
            valid_range(g->ho, g->h, g->s, g->pad, ky, &y0, &y1);
            for (int kx = 0; kx < g->k; kx++) {
                int x0, x1;
                valid_range(g->wo, g->w, g->s, g->pad, kx, &x0, &x1);
                size_t r = (c * (size_t)g->k + (size_t)ky) * (size_t)g->k + (size_t)kx;
                const float *src = dcols + r * g->ld + b * g->hwo;
                for (int oy = y0; oy < y1; oy++) {
                    float *row = plane + (size_t)(oy * g->s - g->pad + ky) * (size_t)g->w;
                    const float *sr = src + (size_t)oy * (size_t)g->wo;
                    for (int ox = x0; ox < x1; ox++) row[ox * g->s - g->pad + kx] += sr[ox];
                }
            }
        }
    }
}

void kernels_conv2d_forward(float *out, const float *inp, const float *weight, const float *bias,
                            float *scratch, const kernels_conv2d_shape *s, int B) {
    geom g;
    make_geom(&g, s, B);
    float *cols = scratch, *tmp = scratch + g.rows * g.ld;
    im2col(cols, inp, &g, B);
    /* tmp[co, B*hwo] = weight[co, rows] @ cols[rows, B*hwo] */
    kv_sgemm(0, 0, g.co, (int)g.ld, (int)g.rows, 1.0f, weight, (int)g.rows, cols, (int)g.ld, 0.0f,
             tmp, (int)g.ld);
    size_t n = (size_t)B * (size_t)g.co;
#pragma omp parallel for schedule(static) if (n * g.hwo > KV_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        size_t b = i / (size_t)g.co, c = i % (size_t)g.co;
        const float *src = tmp + c * g.ld + b * g.hwo;
        float *dst = out + i * g.hwo;
        float bv = bias ? bias[c] : 0.0f;
        for (size_t p = 0; p < g.hwo; p++) dst[p] = src[p] + bv;
    }
}

void kernels_conv2d_backward(float *dinp, float *dweight, float *dbias, float *scratch,
                             const float *dout, const float *inp, const float *weight,
                             const kernels_conv2d_shape *s, int B) {
    geom g;
    make_geom(&g, s, B);
    float *cols = scratch, *tmp = scratch + g.rows * g.ld;
    /* dout in the im2col column order: tmp[co, B*hwo]. */
    size_t n = (size_t)B * (size_t)g.co;
#pragma omp parallel for schedule(static) if (n * g.hwo > KV_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        size_t b = i / (size_t)g.co, c = i % (size_t)g.co;
        memcpy(tmp + c * g.ld + b * g.hwo, dout + i * g.hwo, g.hwo * sizeof(float));
    }
    if (dbias) {
        /* Up to B*ho*wo terms per channel: summed in double so a large
         * batch does not lose the small ones. */
#pragma omp parallel for schedule(static) if ((size_t)g.co * g.ld > KV_PAR_MIN)
        for (int c = 0; c < g.co; c++) {
            const float *row = tmp + (size_t)c * g.ld;
            double sum = 0.0;
            for (size_t p = 0; p < g.ld; p++) sum += row[p];
            dbias[c] += (float)sum;
        }
    }
    im2col(cols, inp, &g, B);
    /* dweight[co, rows] += tmp[co, B*hwo] @ cols^T */
    kv_sgemm(0, 1, g.co, (int)g.rows, (int)g.ld, 1.0f, tmp, (int)g.ld, cols, (int)g.ld, 1.0f,
             dweight, (int)g.rows);
    if (dinp == NULL) return;
    /* The im2col matrix is spent: its room takes d(cols)[rows, B*hwo] =
     * weight^T @ tmp, which col2im folds back onto the images. */
    kv_sgemm(1, 0, (int)g.rows, (int)g.ld, g.co, 1.0f, weight, (int)g.rows, tmp, (int)g.ld, 0.0f,
             cols, (int)g.ld);
    col2im_add(dinp, cols, &g, B);
}
