/* Count Sketch of DESIGN.md: the linear, seeded summary that peers upload
 * instead of a dense delta and that the coordinator sums, keeps momentum
 * and error in, and decodes into heavy hitters. Hashes are recomputed on
 * every call, so the loops that touch all d coordinates (encode, estimate)
 * are the hot ones. With the windowed hash of sketch_hash.h they walk a
 * window of coordinates and a run of consecutive cells side by side: one
 * hash per coordinate for the signs of every row, one per window and row
 * for where the run starts, and loads and adds the compiler vectorises.
 * Those loops are built for several x86-64 levels and the best is chosen
 * when the library loads, and they split the coordinates across OpenMP
 * threads once d is large. The FetchSGD server step, which keeps momentum
 * and error in sketch space, is here too. The hash and the median over
 * rows are in sketch_hash.h, which the CUDA kernels compile too, so both
 * agree bit for bit. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "compress/hot.h"
#include "compress/sketch_hash.h"

/* Coordinates hashed together: enough to fill several vectors per loop,
 * few enough that the per-block arrays stay in L1. */
#define BLK 64

/* Below these sizes the cost of waking threads is more than the work. */
#define ENCODE_PAR_MIN ((size_t)1 << 20)
#define ESTIMATE_PAR_MIN ((size_t)1 << 16)
#define TABLE_PAR_MIN ((size_t)1 << 18)


uint64_t compress_sketch_row_key(uint64_t seed, uint32_t row) {
    return compress_sk_row_key(seed, row);
}

void compress_sketch_hash(uint64_t seed, uint32_t row, uint32_t cols, uint64_t i, uint32_t *bucket,
                          int *sign) {
    *bucket = compress_sk_bucket_of(compress_sk_row_key(seed, row), i, cols);
    *sign = (int)compress_sk_sign(compress_sk_sign_bits(compress_sk_sign_key(seed), i), row);
}

static void row_keys(const compress_sketch *s, uint64_t *keys) {
    for (uint32_t j = 0; j < s->rows; j++) keys[j] = compress_sketch_row_key(s->seed, j);
}

int compress_sketch_init(compress_sketch *s, uint32_t rows, uint32_t cols, uint64_t seed,
                         vl_error *err) {
    memset(s, 0, sizeof *s);
    if (rows < 1 || rows > COMPRESS_SKETCH_MAX_ROWS)
        return vl_fail(err, VL_EINVAL, "sketch rows must be 1..%d, not %u",
                       COMPRESS_SKETCH_MAX_ROWS, rows);
    if (cols < 1) return vl_fail(err, VL_EINVAL, "sketch needs at least one column");
    uint64_t cells = (uint64_t)rows * cols;
    if (cells > COMPRESS_SKETCH_MAX_CELLS)
        return vl_fail(err, VL_EINVAL, "sketch of %u x %u has more than %llu cells", rows, cols,
                       (unsigned long long)COMPRESS_SKETCH_MAX_CELLS);
    s->table = calloc((size_t)cells, sizeof(float));
    if (!s->table) return vl_fail(err, VL_ENOMEM, "out of memory for a %u x %u sketch", rows, cols);
    s->rows = rows;
    s->cols = cols;
    s->seed = seed;
    return VL_OK;
}

void compress_sketch_free(compress_sketch *s) {
    if (!s) return;
    free(s->table);
    memset(s, 0, sizeof *s);
}

static size_t cells_of(const compress_sketch *s) {
    return (size_t)s->rows * s->cols;
}

void compress_sketch_zero(compress_sketch *s) {
    if (s->table) memset(s->table, 0, cells_of(s) * sizeof(float));
}

int compress_sketch_same_shape(const compress_sketch *a, const compress_sketch *b) {
    return a && b && a->seed == b->seed && a->rows == b->rows && a->cols == b->cols;
}

/* ---- encode ------------------------------------------------------------ */

/* Coordinates from i to the end of i's window, at most hi. */
static inline size_t window_run(size_t i, size_t hi, uint32_t wlog) {
    size_t end = ((i >> wlog) + 1) << wlog;
    return (end < hi ? end : hi) - i;
}

/* The signs of coordinates i..i+n-1 for every row, and their values in
 * row j's sign. Always inlined, so that each clone of the callers
 * vectorises them for its own instruction set. */
static inline __attribute__((always_inline)) void sign_bits(uint64_t skey, size_t i, size_t n,
                                                            uint64_t *restrict bits) {
    for (size_t t = 0; t < n; t++) bits[t] = compress_sk_sign_bits(skey, i + t);
}

/* run[t] += sign_j(t) * x[t] for n consecutive cells: bit 31 of each value
 * flipped by its sign bit, which is the exact product by +-1. */
static inline __attribute__((always_inline)) void add_run(float *restrict run,
                                                          const float *restrict x,
                                                          const uint64_t *restrict bits, uint32_t j,
                                                          size_t n) {
    for (size_t t = 0; t < n; t++) run[t] += compress_sk_sign(bits[t], j) * x[t];
}

/* Coordinates lo..hi-1 of x into table: window by window, each row's cells
 * of a window one run (two where it wraps past the row's end). */
COMPRESS_HOT_V4
static void encode_range(float *table, uint32_t rows, uint32_t cols, uint64_t skey,
                         const uint64_t *keys, const float *x, size_t lo, size_t hi) {
    uint32_t wlog = compress_sk_window_log(cols);
    uint64_t bits[1u << COMPRESS_SK_WINDOW_LOG_MAX];
    for (size_t i = lo; i < hi;) {
        size_t n = window_run(i, hi, wlog);
        sign_bits(skey, i, n, bits);
        uint32_t off = (uint32_t)(i & ((1u << wlog) - 1));
        for (uint32_t j = 0; j < rows; j++) {
            float *row = table + (size_t)j * cols;
            uint32_t b0 =
                compress_sk_wrap(compress_sk_window_base(keys[j], i >> wlog, cols), off, cols);
            size_t m = cols - b0 < n ? cols - b0 : n;
            add_run(row + b0, x + i, bits, j, m);
            if (m < n) add_run(row, x + i + m, bits + m, j, n - m);
        }
        i += n;
    }
}

/* Thread t's share of [0, d), cut at multiples of BLK so every thread but
 * the last runs only full blocks. */
static void share(size_t d, int t, int nt, size_t *lo, size_t *hi) {
    size_t nblk = (d + BLK - 1) / BLK;
    size_t per = (nblk + (size_t)nt - 1) / (size_t)nt;
    size_t a = per * (size_t)t * BLK, b = a + per * BLK;
    *lo = a < d ? a : d;
    *hi = b < d ? b : d;
}

void compress_sketch_encode(compress_sketch *s, const float *x, size_t d) {
    if (d == 0) return;
    uint64_t keys[COMPRESS_SKETCH_MAX_ROWS];
    row_keys(s, keys);
    uint64_t skey = compress_sk_sign_key(s->seed);
    size_t cells = cells_of(s);
    int nt = omp_get_max_threads();
    /* Threads add into private tables that are summed at the end, which
     * only pays when summing them is small next to hashing d coordinates;
     * otherwise, or when the tables cannot be had, one thread does it. */
    float *priv = NULL;
    if (nt > 1 && d >= ENCODE_PAR_MIN && cells <= d / (4 * (size_t)nt))
        priv = calloc((size_t)(nt - 1) * cells, sizeof(float));
    if (!priv) {
        encode_range(s->table, s->rows, s->cols, skey, keys, x, 0, d);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        size_t lo, hi;
        share(d, t, n, &lo, &hi);
        /* Nobody else touches s->table until the barrier, so thread 0 can
         * add straight into it and one private table is saved. */
        float *tab = t == 0 ? s->table : priv + (size_t)(t - 1) * cells;
        encode_range(tab, s->rows, s->cols, skey, keys, x, lo, hi);
#pragma omp barrier
#pragma omp for schedule(static)
        for (size_t c = 0; c < cells; c++) {
            float a = 0.0f;
            for (int u = 1; u < n; u++) a += priv[(size_t)(u - 1) * cells + c];
            s->table[c] += a;
        }
    }
    free(priv);
}

int compress_sketch_add(compress_sketch *dst, const compress_sketch *src, float w, vl_error *err) {
    if (!compress_sketch_same_shape(dst, src))
        return vl_fail(
            err, VL_EINVAL, "cannot add sketches of different seed or shape (%u x %u vs %u x %u)",
            dst ? dst->rows : 0, dst ? dst->cols : 0, src ? src->rows : 0, src ? src->cols : 0);
    size_t cells = cells_of(dst);
    float *restrict a = dst->table;
    const float *restrict b = src->table;
#pragma omp parallel for simd schedule(static) if (cells >= TABLE_PAR_MIN)
    for (size_t c = 0; c < cells; c++) a[c] += w * b[c];
    return VL_OK;
}

/* ---- estimate ------------------------------------------------------------ */

/* Median over R rows of each of the BLK lanes of v, n of them to out. With
 * R a constant the compare-exchange network of compress_sk_median unrolls into
 * min/max instructions on registers, and the loop over lanes vectorises. */
static inline __attribute__((always_inline)) void median_fixed(const float (*v)[BLK], uint32_t R,
                                                               size_t n, float *out) {
    float m[BLK];
    for (size_t b = 0; b < BLK; b++) {
        float t[COMPRESS_SKETCH_MAX_ROWS];
        for (uint32_t j = 0; j < R; j++) t[j] = v[j][b];
        m[b] = compress_sk_median(t, R);
    }
    if (n == BLK)
        memcpy(out, m, sizeof m);
    else
        memcpy(out, m, n * sizeof(float));
}

COMPRESS_HOT_V4
static void estimate_range(const float *table, uint32_t rows, uint32_t cols, uint64_t skey,
                           const uint64_t *keys, size_t lo, size_t hi, float *out) {
    /* Lanes past a short block's n are sorted too, never written out:
     * zeroed once so they hold numbers. */
    float v[COMPRESS_SKETCH_MAX_ROWS][BLK] = {{0}};
    uint64_t bits[BLK];
    uint32_t wlog = compress_sk_window_log(cols);
    for (size_t i0 = lo; i0 < hi;) {
        /* Up to BLK lanes, all in one window. */
        size_t n = window_run(i0, hi, wlog);
        n = n < BLK ? n : BLK;
        sign_bits(skey, i0, n, bits);
        uint32_t off = (uint32_t)(i0 & ((1u << wlog) - 1));
        for (uint32_t j = 0; j < rows; j++) {
            const float *row = table + (size_t)j * cols;
            uint32_t b0 =
                compress_sk_wrap(compress_sk_window_base(keys[j], i0 >> wlog, cols), off, cols);
            for (size_t b = 0; b < n; b++) {
                uint32_t c = b0 + (uint32_t)b;
                v[j][b] = compress_sk_sign(bits[b], j) * row[c >= cols ? c - cols : c];
            }
        }
        /* One instance per row count, so that each is straight-line code. */
        switch (rows) {
        case 1: median_fixed(v, 1, n, out + i0); break;
        case 2: median_fixed(v, 2, n, out + i0); break;
        case 3: median_fixed(v, 3, n, out + i0); break;
        case 4: median_fixed(v, 4, n, out + i0); break;
        case 5: median_fixed(v, 5, n, out + i0); break;
        case 6: median_fixed(v, 6, n, out + i0); break;
        case 7: median_fixed(v, 7, n, out + i0); break;
        case 8: median_fixed(v, 8, n, out + i0); break;
        case 9: median_fixed(v, 9, n, out + i0); break;
        case 10: median_fixed(v, 10, n, out + i0); break;
        case 11: median_fixed(v, 11, n, out + i0); break;
        case 12: median_fixed(v, 12, n, out + i0); break;
        case 13: median_fixed(v, 13, n, out + i0); break;
        case 14: median_fixed(v, 14, n, out + i0); break;
        default: median_fixed(v, 15, n, out + i0); break;
        }
        i0 += n;
    }
}

void compress_sketch_estimate(const compress_sketch *s, size_t d, float *out) {
    if (d == 0) return;
    uint64_t keys[COMPRESS_SKETCH_MAX_ROWS];
    row_keys(s, keys);
    uint64_t skey = compress_sk_sign_key(s->seed);
    if (d < ESTIMATE_PAR_MIN || omp_get_max_threads() < 2) {
        estimate_range(s->table, s->rows, s->cols, skey, keys, 0, d, out);
        return;
    }
#pragma omp parallel
    {
        size_t lo, hi;
        share(d, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        estimate_range(s->table, s->rows, s->cols, skey, keys, lo, hi, out);
    }
}

int compress_sketch_heavy(const compress_sketch *s, size_t d, size_t k, float *scratch,
                          uint32_t *idx, float *val, size_t *nnz, vl_error *err) {
    *nnz = 0;
    if (d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "heavy hitters of %zu coordinates: indices are 32-bit", d);
    if (d == 0 || k == 0) return VL_OK;
    compress_sketch_estimate(s, d, scratch);
    int rc = compress_topk(scratch, d, k, idx, nnz, err);
    if (rc) return rc;
    for (size_t t = 0; t < *nnz; t++) val[t] = scratch[idx[t]];
    return VL_OK;
}

void compress_sketch_encode_sparse(compress_sketch *s, const uint32_t *idx, const float *val,
                                   size_t n, float w) {
    uint64_t skey = compress_sk_sign_key(s->seed);
    for (uint32_t j = 0; j < s->rows; j++) {
        uint64_t key = compress_sk_row_key(s->seed, j);
        float *row = s->table + (size_t)j * s->cols;
        for (size_t t = 0; t < n; t++)
            row[compress_sk_bucket_of(key, idx[t], s->cols)] +=
                compress_sk_sign(compress_sk_sign_bits(skey, idx[t]), j) * (w * val[t]);
    }
}

/* Estimates probed to measure the noise: enough for a stable median,
 * few enough to sort in microseconds. */
#define NOISE_PROBES 4096

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

double compress_sketch_noise(const float *est, size_t d) {
    if (d == 0) return 0.0;
    float probe[NOISE_PROBES];
    size_t n = d < NOISE_PROBES ? d : NOISE_PROBES;
    /* Evenly spaced probes: deterministic, and spread over every layer. */
    for (size_t t = 0; t < n; t++) probe[t] = fabsf(est[t * d / n]);
    qsort(probe, n, sizeof *probe, cmp_float);
    /* For Gaussian noise the median of |x| is 0.6745 sigma. */
    return (double)probe[n / 2] / 0.6745;
}

/* ---- FetchSGD ------------------------------------------------------------ */

int compress_fetchsgd_accumulate(compress_sketch *V, compress_sketch *E, const compress_sketch *S,
                                 double lr, double mu, vl_error *err) {
    if (!compress_sketch_same_shape(V, E) || !compress_sketch_same_shape(V, S))
        return vl_fail(err, VL_EINVAL,
                       "fetchsgd: momentum, error and update sketches must share seed and shape");
    if (V == E || S == V || S == E)
        return vl_fail(err, VL_EINVAL, "fetchsgd: momentum, error and update must be distinct");
    if (!isfinite(lr) || !isfinite(mu))
        return vl_fail(err, VL_EINVAL, "fetchsgd: learning rate and momentum must be finite");
    size_t cells = cells_of(V);
    float muf = (float)mu, lrf = (float)lr;
    float *restrict v = V->table;
    float *restrict e = E->table;
    const float *s = S->table;
#pragma omp parallel for simd schedule(static) if (cells >= TABLE_PAR_MIN)
    for (size_t c = 0; c < cells; c++) {
        float g = s[c];
        float m = muf * v[c] + g;
        v[c] = m;
        e[c] += lrf * (g + muf * m);
    }
    return VL_OK;
}

int compress_fetchsgd_step(compress_sketch *V, compress_sketch *E, const compress_sketch *S,
                           double lr, double mu, size_t d, size_t k, float *scratch, uint32_t *idx,
                           float *val, size_t *nnz, vl_error *err) {
    *nnz = 0;
    if (k > d)
        return vl_fail(err, VL_EINVAL, "fetchsgd: k = %zu is more than the %zu coordinates", k, d);
    if (d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "fetchsgd: %zu coordinates: indices are 32-bit", d);
    /* Checks the sketches before it changes anything. */
    int rc = compress_fetchsgd_accumulate(V, E, S, lr, mu, err);
    if (rc) return rc;
    size_t got = 0;
    rc = compress_sketch_heavy(E, d, k, scratch, idx, val, &got, err);
    if (rc) return rc;
    /* Each estimate is its coordinate's value plus the sum of every other
     * coordinate in its buckets, a noise that for flat vectors is several
     * times the values themselves. Only what stands out of that noise by
     * the universal threshold sigma * sqrt(2 ln d) is applied, shrunk by
     * the threshold, so that a coordinate that is noise alone is almost
     * never applied at all. */
    double sigma = compress_sketch_noise(scratch, d);
    float thr = (float)(sigma * sqrt(2.0 * log((double)d + 1.0)));
    size_t kept = 0;
    for (size_t t = 0; t < got; t++) {
        float a = fabsf(val[t]);
        if (!(a > thr)) continue;
        idx[kept] = idx[t];
        val[kept++] = copysignf(a - thr, val[t]);
    }
    *nnz = kept;
    /* What is applied leaves E exactly (the sketch is linear), so E stays
     * the sketch of the movement not yet applied, the error feedback of
     * FetchSGD without zeroing whole cells, which would drop the mass of
     * every other coordinate in them. */
    compress_sketch_encode_sparse(E, idx, val, kept, -1.0f);
    return VL_OK;
}
