/* Plain scalar references of the Count Sketch (DESIGN.md), written
 * independently of compress/sketch.c, for the sketch and FetchSGD tests. */
#ifndef VOLLEY_TEST_SKETCH_REF_H
#define VOLLEY_TEST_SKETCH_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "compress/compress.h"
#include "test_util.h"

/* ---- plain references ----------------------------------------------------- */

/* The windowed hash of docs/design.md, spelled out from the formulas. */
static inline void ref_hash(uint64_t seed, uint32_t row, uint32_t cols, uint64_t i,
                            uint32_t *bucket, float *sign) {
    uint64_t key = vl_splitmix64(seed ^ ((uint64_t)row + 1));
    uint32_t wlog = 0;
    while (wlog < 10 && ((uint64_t)2 << wlog) <= cols) wlog++;
    uint64_t h = vl_splitmix64(key ^ (i >> wlog));
    uint64_t base = ((h >> 32) * (uint64_t)cols) >> 32;
    *bucket = (uint32_t)((base + (i & (((uint64_t)1 << wlog) - 1))) % cols);
    *sign = ((vl_splitmix64(vl_splitmix64(seed) ^ i) >> row) & 1) ? -1.0f : 1.0f;
}

/* table += S(x), coordinate by coordinate in increasing order per row. */
static inline void ref_encode(float *table, uint32_t rows, uint32_t cols, uint64_t seed,
                              const float *x, size_t d) {
    for (uint32_t j = 0; j < rows; j++) {
        for (size_t i = 0; i < d; i++) {
            uint32_t b;
            float sg;
            ref_hash(seed, j, cols, i, &b, &sg);
            table[(size_t)j * cols + b] += sg * x[i];
        }
    }
}

/* Sum of |x_i| over the coordinates that land in each cell: the scale of
 * the rounding error a different summation order may introduce. */
static inline void ref_abs_mass(double *mass, uint32_t rows, uint32_t cols, uint64_t seed,
                                const float *x, size_t d) {
    for (uint32_t j = 0; j < rows; j++) {
        for (size_t i = 0; i < d; i++) {
            uint32_t b;
            float sg;
            ref_hash(seed, j, cols, i, &b, &sg);
            mass[(size_t)j * cols + b] += fabs((double)x[i]);
        }
    }
}

static inline int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static inline void ref_estimate(const compress_sketch *s, size_t d, float *out) {
    float v[COMPRESS_SKETCH_MAX_ROWS];
    for (size_t i = 0; i < d; i++) {
        for (uint32_t j = 0; j < s->rows; j++) {
            uint32_t b;
            float sg;
            ref_hash(s->seed, j, s->cols, i, &b, &sg);
            v[j] = sg * s->table[(size_t)j * s->cols + b];
        }
        qsort(v, s->rows, sizeof v[0], cmp_float);
        uint32_t r = s->rows;
        out[i] = (r & 1) ? v[r / 2] : 0.5f * (v[r / 2 - 1] + v[r / 2]);
    }
}

typedef struct {
    float mag;
    uint32_t idx;
} ranked;

static inline int cmp_ranked(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->mag != y->mag) return x->mag < y->mag ? 1 : -1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static inline int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Top k of |est| by full sort (ties to the lower index), ascending indices. */
static inline size_t ref_topk(const float *est, size_t d, size_t k, uint32_t *idx, float *val) {
    ranked *r = malloc(d * sizeof *r);
    assert_non_null(r);
    for (size_t i = 0; i < d; i++) r[i] = (ranked){fabsf(est[i]), (uint32_t)i};
    qsort(r, d, sizeof *r, cmp_ranked);
    size_t n = k < d ? k : d;
    for (size_t t = 0; t < n; t++) idx[t] = r[t].idx;
    qsort(idx, n, sizeof *idx, cmp_u32);
    for (size_t t = 0; t < n; t++) val[t] = est[idx[t]];
    free(r);
    return n;
}

#endif
