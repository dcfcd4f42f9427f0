/* Selection and error feedback: exact top-k and the exact candidate select
 * agree with a sorting reference on random, tied, zero, denormal and large
 * (threaded) inputs; Gaussian-k lands within 5 % of k on normal and
 * heavy-tailed data and always terminates; error feedback loses nothing,
 * bit for bit, in F32 and F16. */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compress/compress.h"
#include "test_util.h"

/* ---- reference ----------------------------------------------------------- */

typedef struct ref_pair {
    float mag;
    uint32_t idx;
} ref_pair;

static int by_mag_desc_idx_asc(const void *a, const void *b) {
    const ref_pair *p = a, *q = b;
    if (p->mag != q->mag) return p->mag > q->mag ? -1 : 1;
    return (p->idx > q->idx) - (p->idx < q->idx);
}

static int by_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The min(k, n) largest |val| (ties to lower idx), as indices ascending. */
static size_t ref_topk(const float *val, const uint32_t *idx, size_t n, size_t k, uint32_t *out) {
    ref_pair *p = malloc((n ? n : 1) * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) {
        p[i].mag = fabsf(val[i]);
        p[i].idx = idx ? idx[i] : (uint32_t)i;
    }
    qsort(p, n, sizeof *p, by_mag_desc_idx_asc);
    size_t m = k < n ? k : n;
    for (size_t j = 0; j < m; j++) out[j] = p[j].idx;
    qsort(out, m, sizeof *out, by_u32);
    free(p);
    return m;
}

static void check_topk(const float *x, size_t d, size_t k) {
    size_t m = k < d ? k : d;
    uint32_t *got = malloc((m ? m : 1) * sizeof *got), *want = malloc((m ? m : 1) * sizeof *want);
    assert_non_null(got);
    assert_non_null(want);
    size_t nnz = 12345, wn = ref_topk(x, NULL, d, k, want);
    OK(compress_topk(x, d, k, got, &nnz, &e_));
    if (nnz != wn) fail_msg("d=%zu k=%zu: nnz %zu, want %zu", d, k, nnz, wn);
    for (size_t j = 0; j < wn; j++)
        if (got[j] != want[j])
            fail_msg("d=%zu k=%zu: idx[%zu] = %u, want %u", d, k, j, got[j], want[j]);
    free(got);
    free(want);
}

static float *gaussian(size_t d, uint64_t seed) {
    float *x = malloc((d ? d : 1) * sizeof *x);
    assert_non_null(x);
    vl_rng r;
    vl_rng_seed(&r, seed);
    for (size_t i = 0; i < d; i++) x[i] = vl_rng_normal(&r);
    return x;
}

/* ---- exact top-k ------------------------------------------------------------ */

static void test_topk_gaussian(void **state) {
    (void)state;
    static const size_t ds[] = {1, 2, 3, 4, 5, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4097, 100003};
    for (size_t a = 0; a < sizeof ds / sizeof *ds; a++) {
        size_t d = ds[a];
        float *x = gaussian(d, 100 + a);
        size_t ks[] = {1, 2, 3, d / 1000, d / 100, d / 10, d / 2, d - 1, d, d + 1, d + 7};
        for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) check_topk(x, d, ks[b]);
        free(x);
    }
}

static void test_topk_edge_arguments(void **state) {
    (void)state;
    float x[4] = {1, -2, 3, -4};
    uint32_t idx[4];
    size_t nnz = 99;
    OK(compress_topk(x, 4, 0, idx, &nnz, &e_));
    assert_int_equal(nnz, 0);
    nnz = 99;
    OK(compress_topk(NULL, 0, 3, NULL, &nnz, &e_));
    assert_int_equal(nnz, 0);
    vl_error e = {0};
    assert_int_equal(compress_topk(NULL, 4, 2, idx, &nnz, &e), VL_EINVAL);
    OK(compress_topk(x, 4, 2, idx, &nnz, &e_));
    assert_int_equal(nnz, 2);
    assert_int_equal(idx[0], 2);
    assert_int_equal(idx[1], 3);
}

static void test_topk_ties(void **state) {
    (void)state;
    static const float vals[4] = {-1.0f, 0.0f, 1.0f, 2.0f};
    vl_rng r;
    vl_rng_seed(&r, 7);
    size_t d = 10007;
    float *x = malloc(d * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < d; i++) x[i] = vals[vl_rng_below(&r, 4)];
    size_t ks[] = {1, 10, 100, 1000, 2000, 2600, 5000, 7000, 9000, d - 1};
    for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) check_topk(x, d, ks[b]);
    /* +v and -v tie on magnitude; the lower index wins either way round. */
    for (size_t i = 0; i < d; i++)
        x[i] = (i % 3 == 0) ? 0.5f : (i % 3 == 1) ? -0.5f : 0.25f * (float)(i % 5);
    for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) check_topk(x, d, ks[b]);
    /* Values that share the top histogram bits and differ only in the last
     * mantissa bits. */
    for (size_t i = 0; i < d; i++)
        x[i] = nextafterf(1.0f, 2.0f) * (1.0f + (float)(vl_rng_below(&r, 50)) * 0x1p-23f) *
               ((i & 1) ? -1.0f : 1.0f);
    for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) check_topk(x, d, ks[b]);
    free(x);
}

static void test_topk_zeros_and_denormals(void **state) {
    (void)state;
    size_t d = 5003;
    float *x = calloc(d, sizeof *x);
    uint32_t *idx = malloc(d * sizeof *idx);
    assert_non_null(x);
    assert_non_null(idx);
    /* All zero, some of them negative zero: the lowest indices. */
    for (size_t i = 0; i < d; i += 3) x[i] = -0.0f;
    size_t nnz;
    OK(compress_topk(x, d, 100, idx, &nnz, &e_));
    assert_int_equal(nnz, 100);
    for (size_t j = 0; j < nnz; j++) assert_int_equal(idx[j], j);
    check_topk(x, d, 1);
    check_topk(x, d, d - 1);
    /* Denormals (and a few zeros) order like any other magnitude. */
    vl_rng r;
    vl_rng_seed(&r, 11);
    for (size_t i = 0; i < d; i++) {
        uint32_t bits = vl_rng_below(&r, 0x00800000u) | ((i & 1) ? 0x80000000u : 0u);
        if (i % 7 == 0) bits &= 0x80000000u;
        memcpy(&x[i], &bits, sizeof bits);
    }
    size_t ks[] = {1, 5, 50, 500, 2500, d - 1};
    for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) check_topk(x, d, ks[b]);
    free(x);
    free(idx);
}

/* Past the threading cutoff, with an uneven thread count so chunk edges
 * fall mid-block, and with ties that straddle chunks. */
static void test_topk_large_threaded(void **state) {
    (void)state;
    int saved = omp_get_max_threads();
    omp_set_num_threads(3);
    size_t d = ((size_t)1 << 21) + 13;
    float *x = gaussian(d, 5);
    vl_rng r;
    vl_rng_seed(&r, 6);
    for (int h = 0; h < 20; h++)
        x[vl_rng_below(&r, (uint32_t)d)] = 50.0f * (vl_rng_uniform(&r) - 0.5f);
    check_topk(x, d, d / 1000);
    check_topk(x, d, d / 100);
    check_topk(x, d, d / 3); /* the wide bucket: a second pass over the data */
    check_topk(x, d, d - 5);
    for (size_t i = 0; i < d; i++) x[i] = (float)vl_rng_below(&r, 3) - 1.0f;
    check_topk(x, d, d / 2);
    check_topk(x, d, 1000);
    memset(x, 0, d * sizeof *x);
    check_topk(x, d, d / 2 + 1);
    free(x);
    omp_set_num_threads(saved);
}

/* Vectors large enough that top-k first guesses its threshold from a sample
 * of runs at even steps; also data built to fool that sample both ways,
 * which must fall back to the full select with the same answer. */
static void test_topk_sampled(void **state) {
    (void)state;
    int saved = omp_get_max_threads();
    omp_set_num_threads(2);
    size_t sizes[] = {(size_t)1 << 18, ((size_t)1 << 21) + 13};
    for (size_t a = 0; a < 2; a++) {
        size_t d = sizes[a];
        float *x = gaussian(d, 70 + a);
        check_topk(x, d, d / 1000);
        check_topk(x, d, d / 100);
        check_topk(x, d, d / 64);
        vl_rng r;
        vl_rng_seed(&r, 80 + a);
        /* Many copies of each of 1000 levels: ties at the threshold. */
        for (size_t i = 0; i < d; i++)
            x[i] = (float)vl_rng_below(&r, 1000) * ((i & 1) ? 0.001f : -0.001f);
        check_topk(x, d, d / 200);
        check_topk(x, d, 3);
        /* The sampled runs start at (d - 256) * j / 63: big values only
         * there, so the sample overrates the tail (too few reach it)... */
        for (size_t i = 0; i < d; i++) x[i] = 0.001f * vl_rng_normal(&r);
        for (size_t j = 0; j < 64; j++)
            for (size_t i = 0; i < 256; i++) x[(d - 256) * j / 63 + i] = 100.0f + (float)i;
        check_topk(x, d, d / 100);
        /* (also with more big values between the first two runs, but
         * still fewer than k of them reach the bound) */
        for (size_t i = 0; i < d / 128; i++) x[256 + i] = 1000.0f;
        check_topk(x, d, d / 100);
        /* ...or only elsewhere, so it underrates it (far too many do). */
        for (size_t i = 0; i < d; i++) x[i] = 1.0f + 0.001f * (float)(i % 7);
        for (size_t j = 0; j < 64; j++)
            for (size_t i = 0; i < 256; i++) x[(d - 256) * j / 63 + i] = 0.0f;
        check_topk(x, d, d / 1000);
        free(x);
    }
    omp_set_num_threads(saved);
}

/* ---- exact candidate select ------------------------------------------------ */

static void check_select(const uint32_t *idx0, const float *val0, size_t n, size_t k) {
    uint32_t *idx = malloc((n ? n : 1) * sizeof *idx), *want = malloc((n ? n : 1) * sizeof *want);
    float *val = malloc((n ? n : 1) * sizeof *val);
    assert_non_null(idx);
    assert_non_null(want);
    assert_non_null(val);
    if (n) {
        memcpy(idx, idx0, n * sizeof *idx);
        memcpy(val, val0, n * sizeof *val);
    }
    size_t wn = ref_topk(val0, idx0, n, k, want);
    size_t nnz = 999;
    OK(compress_select_exact(idx, val, n, k, &nnz, &e_));
    if (nnz != wn) fail_msg("n=%zu k=%zu: nnz %zu, want %zu", n, k, nnz, wn);
    for (size_t j = 0; j < wn; j++) {
        if (idx[j] != want[j])
            fail_msg("n=%zu k=%zu: idx[%zu] = %u, want %u", n, k, j, idx[j], want[j]);
        size_t at = 0;
        while (idx0[at] != idx[j]) at++;
        assert_true(val[j] == val0[at]);
    }
    free(idx);
    free(want);
    free(val);
}

static void test_select_exact(void **state) {
    (void)state;
    vl_rng r;
    vl_rng_seed(&r, 21);
    size_t n = 3001;
    uint32_t *idx = malloc(n * sizeof *idx);
    float *val = malloc(n * sizeof *val);
    assert_non_null(idx);
    assert_non_null(val);
    uint32_t at = 0;
    for (size_t i = 0; i < n; i++) {
        at += 1 + vl_rng_below(&r, 1000);
        idx[i] = at;
        val[i] = vl_rng_normal(&r);
    }
    size_t ks[] = {0, 1, 2, 30, 300, 1500, n - 1, n, n + 3};
    for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) check_select(idx, val, n, ks[b]);
    for (size_t i = 0; i < n; i++) val[i] = (float)((int)vl_rng_below(&r, 5) - 2);
    for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) check_select(idx, val, n, ks[b]);
    /* Out of order input still yields the lower-index ties, ascending. */
    for (size_t i = 0; i + 1 < n; i += 2) {
        uint32_t t = idx[i];
        idx[i] = idx[i + 1];
        idx[i + 1] = t;
    }
    for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) check_select(idx, val, n, ks[b]);
    check_select(idx, val, 1, 1);
    check_select(idx, val, 0, 4);
    free(idx);
    free(val);
}

/* ---- Gaussian-k ----------------------------------------------------------- */

/* Runs gaussk and checks the count band, ascending order and that the
 * threshold separates chosen from unchosen. Returns the count. */
static size_t check_gaussk(const float *x, size_t d, size_t k, int exact_threshold) {
    uint32_t *idx = malloc(COMPRESS_GAUSSK_CAP(k) * sizeof *idx);
    char *chosen = calloc(d ? d : 1, 1);
    assert_non_null(idx);
    assert_non_null(chosen);
    size_t nnz = 0;
    double thr = -1;
    OK(compress_gaussk(x, d, k, idx, &nnz, &thr, &e_));
    size_t want = k < d ? k : d;
    assert_true(nnz <= COMPRESS_GAUSSK_CAP(k));
    if (20 * (nnz > want ? nnz - want : want - nnz) > want)
        fail_msg("gaussk d=%zu k=%zu: count %zu is more than 5%% off", d, k, nnz);
    for (size_t j = 0; j < nnz; j++) {
        assert_true(idx[j] < d);
        if (j) assert_true(idx[j] > idx[j - 1]);
        chosen[idx[j]] = 1;
        if (exact_threshold && !(fabsf(x[idx[j]]) >= thr))
            fail_msg("gaussk: chosen |x[%u]| = %g below thr %g", idx[j], fabsf(x[idx[j]]), thr);
    }
    if (exact_threshold)
        for (size_t i = 0; i < d; i++)
            if (!chosen[i] && !(fabsf(x[i]) < thr))
                fail_msg("gaussk: unchosen |x[%zu]| = %g not below thr %g", i, fabsf(x[i]), thr);
    free(idx);
    free(chosen);
    return nnz;
}

static void test_gaussk_gaussian(void **state) {
    (void)state;
    size_t d = 1000000;
    float *x = gaussian(d, 31);
    check_gaussk(x, d, d / 1000, 1);
    check_gaussk(x, d, d / 100, 1);
    check_gaussk(x, d, d / 10, 1);
    /* The threshold comes from the normal model: near 3.29 sigma. */
    uint32_t *idx = malloc(COMPRESS_GAUSSK_CAP(d / 1000) * sizeof *idx);
    assert_non_null(idx);
    size_t nnz;
    double thr;
    OK(compress_gaussk(x, d, d / 1000, idx, &nnz, &thr, &e_));
    assert_true(fabs(thr - 3.2905) < 0.05);
    /* Shifted and scaled: mean and spread are estimated, not assumed. */
    for (size_t i = 0; i < d; i++) x[i] = 0.01f * x[i] + 0.002f;
    check_gaussk(x, d, d / 1000, 1);
    free(idx);
    free(x);
}

/* Phi^-1(p) by bisection on erfc: slow, but an independent reference. */
static double ref_probit(double p) {
    double lo = -40, hi = 40;
    for (int it = 0; it < 200; it++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / sqrt(2.0)) < p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* Values at the normal quantiles (i + 1/2)/d: the model is exact, so the
 * first threshold must already count k to within 1 %, far inside the band
 * a refinement would settle on, and sit at the reference quantile. */
static void test_gaussk_model_threshold(void **state) {
    (void)state;
    size_t d = 200000;
    float *x = malloc(d * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < d / 2; i++) {
        float v = (float)ref_probit(((double)i + 0.5) / (double)d);
        x[2 * i] = v;
        x[2 * i + 1] = -v;
    }
    double m2 = 0;
    for (size_t i = 0; i < d; i++) m2 += (double)x[i] * x[i];
    double sd = sqrt(m2 / (double)d);
    size_t ks[] = {d / 10000, d / 1000, d / 100, d / 10};
    for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) {
        size_t k = ks[b];
        uint32_t *idx = malloc(COMPRESS_GAUSSK_CAP(k) * sizeof *idx);
        assert_non_null(idx);
        size_t nnz;
        double thr;
        OK(compress_gaussk(x, d, k, idx, &nnz, &thr, &e_));
        double want = -ref_probit(0.5 * (double)k / (double)d) * sd;
        if (100 * (nnz > k ? nnz - k : k - nnz) > k || fabs(thr - want) > 1e-4 * want)
            fail_msg("k=%zu: count %zu, thr %.6f (model %.6f)", k, nnz, thr, want);
        free(idx);
    }
    /* Shifted a little, the count stays in the band, so the threshold
     * must be the formula's own |mean| + std * z. */
    double m1 = 0;
    m2 = 0;
    for (size_t i = 0; i < d; i++) {
        x[i] += 0.01f;
        m1 += x[i];
        m2 += (double)x[i] * x[i];
    }
    double mean = m1 / (double)d;
    sd = sqrt(m2 / (double)d - mean * mean);
    for (size_t b = 1; b < sizeof ks / sizeof *ks; b++) {
        size_t k = ks[b];
        uint32_t *idx = malloc(COMPRESS_GAUSSK_CAP(k) * sizeof *idx);
        assert_non_null(idx);
        size_t nnz;
        double thr;
        OK(compress_gaussk(x, d, k, idx, &nnz, &thr, &e_));
        double want = fabs(mean) - ref_probit(0.5 * (double)k / (double)d) * sd;
        if (20 * (nnz > k ? nnz - k : k - nnz) > k || fabs(thr - want) > 1e-4 * want)
            fail_msg("shifted, k=%zu: count %zu, thr %.6f (model %.6f)", k, nnz, thr, want);
        free(idx);
    }
    free(x);
}

static void test_gaussk_heavy_tails(void **state) {
    (void)state;
    size_t d = 1000000;
    float *x = malloc(d * sizeof *x);
    assert_non_null(x);
    vl_rng r;
    vl_rng_seed(&r, 41);
    /* Student-t with 2 degrees of freedom: z / sqrt(chi2_2 / 2). */
    for (size_t i = 0; i < d; i++) {
        float z = vl_rng_normal(&r), u = vl_rng_uniform(&r);
        x[i] = z / sqrtf(-logf(1.0f - u));
    }
    check_gaussk(x, d, d / 1000, 1);
    check_gaussk(x, d, d / 100, 1);
    /* Cauchy: the sample std is meaningless. */
    for (size_t i = 0; i < d; i++) x[i] = tanf(3.14159265f * (vl_rng_uniform(&r) - 0.5f));
    check_gaussk(x, d, d / 1000, 1);
    check_gaussk(x, d, d / 100, 1);
    /* One enormous outlier inflates the std far past every other value. */
    for (size_t i = 0; i < d; i++) x[i] = vl_rng_normal(&r);
    x[12345] = 1e30f;
    check_gaussk(x, d, d / 1000, 1);
    /* Where the first guess samples: the spread must not overflow. */
    x[0] = -3e38f;
    x[d / 2] = 2e38f;
    check_gaussk(x, d, d / 1000, 1);
    /* Uniform: lighter tails than normal; the threshold guess overshoots. */
    for (size_t i = 0; i < d; i++) x[i] = 2.0f * vl_rng_uniform(&r) - 1.0f;
    check_gaussk(x, d, d / 1000, 1);
    check_gaussk(x, d, d / 5, 1);
    free(x);
}

static void test_gaussk_degenerate(void **state) {
    (void)state;
    size_t d = 100000;
    float *x = malloc(d * sizeof *x);
    assert_non_null(x);
    uint32_t idx[COMPRESS_GAUSSK_CAP(1000)];
    size_t nnz;
    double thr;
    /* Constant: every value ties, so the lowest k indices. */
    for (size_t i = 0; i < d; i++) x[i] = (i & 1) ? -3.0f : 3.0f;
    OK(compress_gaussk(x, d, 1000, idx, &nnz, &thr, &e_));
    assert_int_equal(nnz, 1000);
    for (size_t j = 0; j < nnz; j++) assert_int_equal(idx[j], j);
    memset(x, 0, d * sizeof *x);
    check_gaussk(x, d, 1000, 0);
    check_gaussk(x, 1000, 100, 0);
    /* Two levels: the band can only be hit by exact top-k. */
    for (size_t i = 0; i < d; i++) x[i] = (i % 10 == 0) ? 5.0f : 1.0f;
    check_gaussk(x, d, 1000, 0);
    check_gaussk(x, d, d / 10, 1);
    /* Tiny inputs and k at or past d. */
    float t[3] = {0.5f, -2.0f, 1.0f};
    for (size_t dd = 1; dd <= 3; dd++)
        for (size_t k = 1; k <= 5; k++) check_gaussk(t, dd, k, 1);
    OK(compress_gaussk(t, 3, 0, idx, &nnz, &thr, &e_));
    assert_int_equal(nnz, 0);
    OK(compress_gaussk(NULL, 0, 4, idx, &nnz, NULL, &e_));
    assert_int_equal(nnz, 0);
    float *g = gaussian(50, 3);
    for (size_t k = 1; k <= 60; k += 7) check_gaussk(g, 50, k, 1);
    free(g);
    free(x);
}

static void test_gaussk_large_threaded(void **state) {
    (void)state;
    int saved = omp_get_max_threads();
    omp_set_num_threads(3);
    size_t d = ((size_t)1 << 21) + 77;
    float *x = gaussian(d, 8);
    check_gaussk(x, d, d / 1000, 1);
    vl_rng r;
    vl_rng_seed(&r, 9);
    for (size_t i = 0; i < d; i++) x[i] /= sqrtf(-logf(1.0f - vl_rng_uniform(&r)));
    check_gaussk(x, d, d / 1000, 1);
    free(x);
    omp_set_num_threads(saved);
}

/* ---- error feedback ------------------------------------------------------ */

static uint32_t bits_of(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static void run_feedback(st_dtype dt, float scale) {
    size_t d = 20011, k = 200;
    float *e = calloc(d, sizeof *e), *before = malloc(d * sizeof *before),
          *delta = malloc(d * sizeof *delta);
    uint32_t *idx = malloc(k * sizeof *idx);
    float *val = malloc(k * sizeof *val);
    assert_non_null(e);
    assert_non_null(before);
    assert_non_null(delta);
    assert_non_null(idx);
    assert_non_null(val);
    vl_rng r;
    vl_rng_seed(&r, 51);
    for (int round = 0; round < 12; round++) {
        for (size_t i = 0; i < d; i++) delta[i] = scale * vl_rng_normal(&r);
        memcpy(before, e, d * sizeof *e);
        compress_feedback_add(e, delta, d, 1.0f);
        for (size_t i = 0; i < d; i++) assert_true(bits_of(e[i]) == bits_of(before[i] + delta[i]));
        memcpy(before, e, d * sizeof *e);
        size_t nnz;
        OK(compress_topk(e, d, k, idx, &nnz, &e_));
        assert_int_equal(nnz, k);
        compress_feedback_take(e, idx, nnz, dt, val);
        size_t j = 0;
        for (size_t i = 0; i < d; i++) {
            if (j < nnz && idx[j] == i) {
                if (dt == ST_F16) {
                    /* What is sent survives the F16 wire unchanged. */
                    assert_true(bits_of(vl_f16_to_f32(vl_f32_to_f16(val[j]))) == bits_of(val[j]));
                    assert_true(fabsf(val[j]) <= 65504.0f);
                }
                if (bits_of(val[j] + e[i]) != bits_of(before[i]))
                    fail_msg("round %d coord %zu: %a + %a != %a", round, i, val[j], e[i],
                             before[i]);
                j++;
            } else if (bits_of(e[i]) != bits_of(before[i])) {
                fail_msg("round %d: untouched coord %zu changed", round, i);
            }
        }
        assert_int_equal(j, nnz);
    }
    free(e);
    free(before);
    free(delta);
    free(idx);
    free(val);
}

static void test_feedback_f32(void **state) {
    (void)state;
    run_feedback(ST_F32, 1.0f);
}

static void test_feedback_f16(void **state) {
    (void)state;
    run_feedback(ST_F16, 1.0f);
    run_feedback(ST_F16, 1e-3f); /* residuals reach the F16 subnormals */
    run_feedback(ST_F16, 3e4f);  /* and past the largest half: clamped */
}

static void test_feedback_large_add(void **state) {
    (void)state;
    size_t d = ((size_t)1 << 20) + 3;
    float *e = gaussian(d, 61), *delta = gaussian(d, 62);
    float *want = malloc(d * sizeof *want);
    assert_non_null(want);
    for (size_t i = 0; i < d; i++) want[i] = e[i] + delta[i];
    compress_feedback_add(e, delta, d, 1.0f);
    assert_memory_equal(e, want, d * sizeof *e);
    free(e);
    free(delta);
    free(want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_gaussian),
        cmocka_unit_test(test_topk_edge_arguments),
        cmocka_unit_test(test_topk_ties),
        cmocka_unit_test(test_topk_zeros_and_denormals),
        cmocka_unit_test(test_topk_large_threaded),
        cmocka_unit_test(test_topk_sampled),
        cmocka_unit_test(test_select_exact),
        cmocka_unit_test(test_gaussk_gaussian),
        cmocka_unit_test(test_gaussk_model_threshold),
        cmocka_unit_test(test_gaussk_heavy_tails),
        cmocka_unit_test(test_gaussk_degenerate),
        cmocka_unit_test(test_gaussk_large_threaded),
        cmocka_unit_test(test_feedback_f32),
        cmocka_unit_test(test_feedback_f16),
        cmocka_unit_test(test_feedback_large_add),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
