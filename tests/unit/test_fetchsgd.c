/* The one-round FetchSGD server step: it matches a plain reference
 * (accumulate, estimate, heavy hitters, soft threshold at the universal
 * threshold of the estimates' noise, the change's sketch subtracted from
 * E); noise alone is not applied while a planted heavy hitter is; and on
 * flat pseudo-gradients at 100x, where collision noise swamps every
 * estimate, training a quadratic never ends above where it started. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compress/compress.h"
#include "test_util.h"

#include "sketch_ref.h"

static size_t cells(const compress_sketch *s) {
    return (size_t)s->rows * s->cols;
}

static void fill_table(compress_sketch *s, uint64_t seed) {
    vl_rng g;
    vl_rng_seed(&g, seed);
    for (size_t c = 0; c < cells(s); c++) s->table[c] = vl_rng_normal(&g);
}

/* sigma of the estimates' noise: median |est| of 4096 evenly spaced
 * probes over 0.6745. */
static double ref_noise(const float *est, size_t d) {
    size_t n = d < 4096 ? d : 4096;
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t t = 0; t < n; t++) p[t] = fabsf(est[t * d / n]);
    qsort(p, n, sizeof *p, cmp_float);
    double s = (double)p[n / 2] / 0.6745;
    free(p);
    return s;
}

static void test_noise_of_gaussian_estimates(void **state) {
    (void)state;
    const size_t d = 100000;
    float *x = random_vec(d, 17);
    for (size_t i = 0; i < d; i++) x[i] *= 3.0f;
    double s = compress_sketch_noise(x, d);
    assert_true(fabs(s - 3.0) < 0.15);
    assert_true(compress_sketch_noise(x, 0) == 0.0);
    free(x);
}

static void test_encode_sparse_matches_dense(void **state) {
    (void)state;
    const size_t d = 5000;
    compress_sketch a, b;
    OK(compress_sketch_init(&a, 3, 101, 5, &e_));
    OK(compress_sketch_init(&b, 3, 101, 5, &e_));
    float *x = calloc(d, sizeof *x);
    assert_non_null(x);
    uint32_t idx[4] = {4, 77, 3000, 4999};
    float val[4] = {1.5f, -2.0f, 0.25f, 8.0f};
    for (int t = 0; t < 4; t++) x[idx[t]] = -0.5f * val[t];
    compress_sketch_encode(&a, x, d);
    compress_sketch_encode_sparse(&b, idx, val, 4, -0.5f);
    for (size_t c = 0; c < cells(&a); c++) assert_float_equal(a.table[c], b.table[c], 1e-6);
    free(x);
    compress_sketch_free(&a);
    compress_sketch_free(&b);
}

static void test_fetchsgd_matches_reference(void **state) {
    (void)state;
    const size_t d = 3001, k = 40;
    const uint32_t r = 5, c = 97;
    const double lr = 0.1, mu = 0.9;
    compress_sketch V, E, S;
    OK(compress_sketch_init(&V, r, c, 4242, &e_));
    OK(compress_sketch_init(&E, r, c, 4242, &e_));
    OK(compress_sketch_init(&S, r, c, 4242, &e_));
    fill_table(&V, 1);
    fill_table(&E, 2);
    float *x = random_vec(d, 3);
    x[5] = 400.0f;
    x[2999] = -350.0f;
    compress_sketch_encode(&S, x, d);

    size_t n = cells(&V);
    float *rv = malloc(n * sizeof *rv), *re = malloc(n * sizeof *re);
    float *est = malloc(d * sizeof *est), *scratch = malloc(d * sizeof *scratch);
    assert_non_null(rv);
    assert_non_null(re);
    assert_non_null(est);
    assert_non_null(scratch);
    const float muf = (float)mu, lrf = (float)lr;
    for (size_t t = 0; t < n; t++) {
        float g = S.table[t];
        rv[t] = muf * V.table[t] + g;
        re[t] = E.table[t] + lrf * (g + muf * rv[t]);
    }
    compress_sketch ref_e = E;
    ref_e.table = re;
    ref_estimate(&ref_e, d, est);
    uint32_t ridx[40], idx[40];
    float rval[40], val[40];
    size_t rn = ref_topk(est, d, k, ridx, rval);
    float thr = (float)(ref_noise(est, d) * sqrt(2.0 * log((double)d + 1.0)));
    size_t kept = 0;
    for (size_t t = 0; t < rn; t++) {
        if (!(fabsf(rval[t]) > thr)) continue;
        ridx[kept] = ridx[t];
        rval[kept++] = copysignf(fabsf(rval[t]) - thr, rval[t]);
    }
    for (uint32_t j = 0; j < r; j++)
        for (size_t t = 0; t < kept; t++) {
            uint32_t b;
            float sg;
            ref_hash(E.seed, j, c, ridx[t], &b, &sg);
            re[(size_t)j * c + b] += sg * -rval[t];
        }

    size_t nnz = 0;
    OK(compress_fetchsgd_step(&V, &E, &S, lr, mu, d, k, scratch, idx, val, &nnz, &e_));
    assert_int_equal(nnz, kept);
    int found5 = 0, found2999 = 0;
    for (size_t t = 0; t < kept; t++) {
        assert_int_equal(idx[t], ridx[t]);
        assert_true(val[t] == rval[t]);
        found5 |= idx[t] == 5;
        found2999 |= idx[t] == 2999;
    }
    assert_true(found5 && found2999);
    /* Only what stood out of the noise was applied. */
    assert_true(kept < k);
    for (size_t t = 0; t < n; t++) {
        if (V.table[t] != rv[t] || E.table[t] != re[t])
            fail_msg("cell %zu: V %.9g/%.9g E %.9g/%.9g", t, (double)V.table[t], (double)rv[t],
                     (double)E.table[t], (double)re[t]);
    }
    compress_sketch_free(&V);
    compress_sketch_free(&E);
    compress_sketch_free(&S);
    free(rv);
    free(re);
    free(est);
    free(scratch);
    free(x);
}

/* 20,000 flat coordinates in 3 x 500 cells: every estimate is mostly
 * collision noise, and nearly nothing of it may be applied; one planted
 * heavy coordinate is, close to its value. */
static void test_fetchsgd_applies_signal_not_noise(void **state) {
    (void)state;
    const size_t d = 20000, k = 250;
    compress_sketch V, E, S;
    OK(compress_sketch_init(&V, 3, 500, 8, &e_));
    OK(compress_sketch_init(&E, 3, 500, 8, &e_));
    OK(compress_sketch_init(&S, 3, 500, 8, &e_));
    float *x = random_vec(d, 9);
    x[1234] = 200.0f;
    compress_sketch_encode(&S, x, d);
    float *scratch = malloc(d * sizeof *scratch);
    assert_non_null(scratch);
    uint32_t idx[250];
    float val[250];
    size_t nnz = 0;
    OK(compress_fetchsgd_step(&V, &E, &S, 1.0, 0.0, d, k, scratch, idx, val, &nnz, &e_));
    int found = 0;
    double noise = 0;
    for (size_t t = 0; t < nnz; t++) {
        if (idx[t] == 1234) {
            found = 1;
            assert_true(val[t] > 150.0f && val[t] <= 200.0f);
        } else {
            noise += fabs((double)val[t]);
        }
    }
    assert_true(found);
    /* The raw estimates of the other k - 1 would sum to hundreds. */
    assert_true(nnz <= 5);
    assert_true(noise < 10.0);
    free(scratch);
    free(x);
    compress_sketch_free(&V);
    compress_sketch_free(&E);
    compress_sketch_free(&S);
}

/* The divergence of sketch runs, in miniature: pseudo-gradients that are
 * flat (each coordinate moves by about the same step towards its target,
 * as after many AdamW steps), sketched at 100x less than F32 (F16 cells),
 * fed through the FetchSGD step with the DiLoCo outer step (0.7, 0.9) for
 * 40 versions. Applying collision estimates drove such runs far above the
 * starting loss (several times it). Flat vectors hold almost nothing that
 * stands out of the collision noise, so the step applies a handful of
 * coordinates, of which one can be wrong: over 20 seeds the worst version
 * ended 0.3 % above the start (0.6 % with the hash per coordinate this
 * project had before the windowed one). The bound is 1 %, on four hash
 * seeds. */
static double flat_run(uint64_t hash_seed) {
    const size_t d = 20000;
    const uint32_t rows = 5, cols = (uint32_t)(4 * d / (100 * 2) / rows);
    const size_t k = cols / 2;
    float *target = random_vec(d, 21), *theta = calloc(d, sizeof(float));
    float *delta = malloc(d * sizeof(float)), *scratch = malloc(d * sizeof(float));
    float *jitter = random_vec(d, 22);
    uint32_t *idx = malloc(k * sizeof *idx);
    float *val = malloc(k * sizeof *val);
    assert_non_null(theta);
    assert_non_null(delta);
    assert_non_null(scratch);
    assert_non_null(idx);
    assert_non_null(val);
    compress_sketch V, E, S;
    OK(compress_sketch_init(&V, rows, cols, hash_seed, &e_));
    OK(compress_sketch_init(&E, rows, cols, hash_seed, &e_));
    OK(compress_sketch_init(&S, rows, cols, hash_seed, &e_));
    double start = 0;
    for (size_t i = 0; i < d; i++) start += 0.5 * (double)target[i] * target[i];
    double worst = 0;
    for (int v = 0; v < 40; v++) {
        for (size_t i = 0; i < d; i++) {
            float g = theta[i] - target[i];
            delta[i] = 0.02f * ((g > 0) - (g < 0)) * (1.0f + 0.2f * jitter[(i + (size_t)v) % d]);
        }
        compress_sketch_zero(&S);
        compress_sketch_encode(&S, delta, d);
        size_t nnz = 0;
        OK(compress_fetchsgd_step(&V, &E, &S, 0.7, 0.9, d, k, scratch, idx, val, &nnz, &e_));
        for (size_t t = 0; t < nnz; t++) theta[idx[t]] -= val[t];
        double loss = 0;
        for (size_t i = 0; i < d; i++) {
            double g = (double)theta[i] - target[i];
            loss += 0.5 * g * g;
        }
        if (loss / start > worst) worst = loss / start;
    }
    compress_sketch_free(&V);
    compress_sketch_free(&E);
    compress_sketch_free(&S);
    free(target);
    free(theta);
    free(delta);
    free(scratch);
    free(jitter);
    free(idx);
    free(val);
    return worst;
}

static void test_fetchsgd_flat_updates_do_not_diverge(void **state) {
    (void)state;
    for (uint64_t seed = 3; seed < 7; seed++) {
        double worst = flat_run(seed);
        if (worst > 1.01)
            fail_msg("hash seed %llu: the loss rose to %.4f times where it started",
                     (unsigned long long)seed, worst);
    }
}

static void test_fetchsgd_refuses_bad_input(void **state) {
    (void)state;
    compress_sketch V, E, S, other;
    OK(compress_sketch_init(&V, 3, 50, 1, &e_));
    OK(compress_sketch_init(&E, 3, 50, 1, &e_));
    OK(compress_sketch_init(&S, 3, 50, 1, &e_));
    OK(compress_sketch_init(&other, 3, 50, 2, &e_));
    S.table[7] = 1.0f;
    float scratch[100];
    uint32_t idx[101];
    float val[101];
    size_t nnz = 0;
    vl_error e = {0};
    assert_int_equal(
        compress_fetchsgd_step(&V, &E, &other, 0.1, 0.9, 100, 5, scratch, idx, val, &nnz, &e),
        VL_EINVAL);
    assert_non_null(strstr(e.msg, "shape"));
    assert_int_equal(
        compress_fetchsgd_step(&V, &other, &S, 0.1, 0.9, 100, 5, scratch, idx, val, &nnz, NULL),
        VL_EINVAL);
    assert_int_equal(
        compress_fetchsgd_step(&other, &E, &S, 0.1, 0.9, 100, 5, scratch, idx, val, &nnz, NULL),
        VL_EINVAL);
    assert_int_equal(
        compress_fetchsgd_step(&V, &E, &S, 0.1, 0.9, 100, 101, scratch, idx, val, &nnz, &e),
        VL_EINVAL);
    assert_int_equal(
        compress_fetchsgd_step(&V, &E, &S, NAN, 0.9, 100, 5, scratch, idx, val, &nnz, NULL),
        VL_EINVAL);
    assert_int_equal(
        compress_fetchsgd_step(&V, &V, &S, 0.1, 0.9, 100, 5, scratch, idx, val, &nnz, NULL),
        VL_EINVAL);
    /* Refused steps leave the state alone. */
    for (size_t t = 0; t < cells(&V); t++) {
        assert_true(V.table[t] == 0.0f);
        assert_true(E.table[t] == 0.0f);
    }
    compress_sketch_free(&V);
    compress_sketch_free(&E);
    compress_sketch_free(&S);
    compress_sketch_free(&other);
}

/* ---- parameters ------------------------------------------------------------------ */

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_noise_of_gaussian_estimates),
        cmocka_unit_test(test_encode_sparse_matches_dense),
        cmocka_unit_test(test_fetchsgd_matches_reference),
        cmocka_unit_test(test_fetchsgd_applies_signal_not_noise),
        cmocka_unit_test(test_fetchsgd_flat_updates_do_not_diverge),
        cmocka_unit_test(test_fetchsgd_refuses_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
