/* The Sketched-SGD second round: compress_round_take applies exact
 * values scaled by the versions a coordinate missed, takes the largest,
 * subtracts their sketch from E and keeps the ages; on flat updates at
 * 100x the loop it drives learns every version. */
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

/* One version of the flat-update loops: every coordinate moves 0.02
 * towards its target (the sign-like pseudo-gradient of many local steps)
 * into delta, and E <- 0.9 E + S(delta), with S as scratch. */
static void flat_version(const float *theta, const float *target, float *delta, size_t d,
                         compress_sketch *E, compress_sketch *S) {
    for (size_t i = 0; i < d; i++) {
        float g = theta[i] - target[i];
        delta[i] = 0.02f * (float)((g > 0) - (g < 0));
    }
    compress_sketch_zero(S);
    compress_sketch_encode(S, delta, d);
    for (size_t c = 0; c < cells(E); c++) E->table[c] = 0.9f * E->table[c] + S->table[c];
}

/* Values are the exact ones times min(age + 1, max_gap); the k largest
 * are taken, ascending; E loses exactly their sketch; ages restart at 0
 * for them and grow by one everywhere else. */
static void test_round_take_values_and_state(void **state) {
    (void)state;
    const size_t d = 1000, k = 3;
    compress_sketch E;
    OK(compress_sketch_init(&E, 3, 64, 7, &e_));
    float *h = random_vec(d, 4);
    compress_sketch_encode(&E, h, d);
    float *before = malloc(cells(&E) * sizeof *before);
    float *age = calloc(d, sizeof *age), *age0 = malloc(d * sizeof *age0);
    assert_non_null(before);
    assert_non_null(age);
    assert_non_null(age0);
    memcpy(before, E.table, cells(&E) * sizeof *before);
    age[10] = 9.0f; /* capped at max_gap 4 */
    age[20] = 1.0f;
    age[500] = 2.0f;
    memcpy(age0, age, d * sizeof *age0);
    uint32_t cand[5] = {10, 20, 30, 500, 999}, idx[5];
    float exact[5] = {0.5f, -1.5f, 1.9f, 0.1f, -0.2f}, val[5];
    size_t nnz = 0;
    OK(compress_round_take(&E, cand, exact, 5, age, d, 4.0f, k, idx, val, &nnz, &e_));
    /* Values: 0.5*4 = 2, -1.5*2 = -3, 1.9*1, 0.1*3 = 0.3, -0.2*1. */
    assert_int_equal(nnz, 3);
    assert_int_equal(idx[0], 10);
    assert_int_equal(idx[1], 20);
    assert_int_equal(idx[2], 30);
    assert_true(val[0] == 2.0f && val[1] == -3.0f && val[2] == 1.9f);
    for (uint32_t j = 0; j < E.rows; j++)
        for (size_t t = 0; t < nnz; t++) {
            uint32_t b;
            float sg;
            ref_hash(E.seed, j, E.cols, idx[t], &b, &sg);
            before[(size_t)j * E.cols + b] -= sg * val[t];
        }
    for (size_t c = 0; c < cells(&E); c++) assert_float_equal(E.table[c], before[c], 1e-6);
    for (size_t i = 0; i < d; i++) {
        int taken = i == 10 || i == 20 || i == 30;
        assert_true(age[i] == (taken ? 0.0f : age0[i] + 1.0f));
    }
    free(h);
    free(before);
    free(age);
    free(age0);
    compress_sketch_free(&E);
}

/* The round run's loop on flat pseudo-gradients at 100x (the sketch only
 * names candidates; every value applied is exact): a quadratic trained
 * through it falls every version, where applying the sketch's estimates
 * made it rise. */
static void test_round_take_flat_updates_learn(void **state) {
    (void)state;
    const size_t d = 20000;
    const uint32_t rows = 5, cols = 8; /* 40 cells, a tenth of the budget */
    const size_t k = 360;              /* the rest, as F16 values */
    float *target = random_vec(d, 31), *theta = calloc(d, sizeof(float));
    float *delta = malloc(d * sizeof(float)), *scratch = malloc(d * sizeof(float));
    float *age = calloc(d, sizeof(float)), *exact = malloc(k * sizeof(float));
    uint32_t *cand = malloc(k * sizeof *cand), *idx = malloc(k * sizeof *idx);
    float *cval = malloc(k * sizeof(float)), *val = malloc(k * sizeof(float));
    assert_true(theta && delta && scratch && age && exact && cand && idx && cval && val);
    compress_sketch E, S;
    OK(compress_sketch_init(&E, rows, cols, 3, &e_));
    OK(compress_sketch_init(&S, rows, cols, 3, &e_));
    double prev = 0;
    for (size_t i = 0; i < d; i++) prev += 0.5 * (double)target[i] * target[i];
    const double start = prev;
    for (int v = 0; v < 40; v++) {
        flat_version(theta, target, delta, d, &E, &S);
        size_t nc = 0, nnz = 0;
        OK(compress_sketch_heavy(&E, d, k, scratch, cand, cval, &nc, &e_));
        for (size_t t = 0; t < nc; t++) exact[t] = delta[cand[t]];
        OK(compress_round_take(&E, cand, exact, nc, age, d, 4.0f, k, idx, val, &nnz, &e_));
        assert_true(nnz > 0);
        for (size_t t = 0; t < nnz; t++) {
            /* Never an estimate: a multiple of the exact value. */
            float r = val[t] / delta[idx[t]];
            assert_true(r == 1.0f || r == 2.0f || r == 3.0f || r == 4.0f);
            theta[idx[t]] -= val[t];
        }
        double loss = 0;
        for (size_t i = 0; i < d; i++) {
            double g = (double)theta[i] - target[i];
            loss += 0.5 * g * g;
        }
        assert_true(loss < prev);
        prev = loss;
    }
    assert_true(prev < start);
    compress_sketch_free(&E);
    compress_sketch_free(&S);
    free(target);
    free(theta);
    free(delta);
    free(scratch);
    free(age);
    free(exact);
    free(cand);
    free(idx);
    free(cval);
    free(val);
}

/* The score of compress_round_candidates, by a plain loop, and the k
 * largest by a full sort (ties to the lower index). */
static const float *score_of;

static int by_score(const void *a, const void *b) {
    const float *sc = score_of;
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    if (sc[i] != sc[j]) return sc[i] > sc[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

static void test_round_candidates_reference(void **state) {
    (void)state;
    const size_t d = 3000, k = 150;
    compress_sketch E;
    OK(compress_sketch_init(&E, 5, 64, 9, &e_));
    float *x = random_vec(d, 5), *age = malloc(d * sizeof(float));
    float *est = malloc(d * sizeof(float)), *score = malloc(d * sizeof(float));
    float *scratch = malloc(d * sizeof(float));
    uint32_t *order = malloc(d * sizeof *order), *idx = malloc(k * sizeof *idx);
    assert_true(age && est && score && scratch && order && idx);
    for (size_t i = 0; i < 40; i++) x[i * 71] *= 30.0f; /* a few heavy hitters */
    compress_sketch_encode(&E, x, d);
    for (size_t i = 0; i < d; i++) age[i] = (float)((i * 7919) % 13);
    compress_sketch_estimate(&E, d, est);
    float sigma = (float)compress_sketch_noise(est, d);
    assert_true(sigma > 0);
    for (size_t i = 0; i < d; i++) {
        float a = fabsf(est[i]);
        score[i] = (a > sigma ? a : sigma) * (age[i] + 1.0f);
        order[i] = (uint32_t)i;
    }
    score_of = score;
    qsort(order, d, sizeof *order, by_score);
    qsort(order, k, sizeof *order, cmp_u32);
    size_t nnz = 0;
    OK(compress_round_candidates(&E, age, d, k, scratch, idx, &nnz, &e_));
    assert_int_equal(nnz, k);
    assert_memory_equal(idx, order, k * sizeof *idx);
    /* k beyond d gives every coordinate; nothing asked, nothing given. */
    uint32_t *all = malloc(d * sizeof *all);
    assert_non_null(all);
    OK(compress_round_candidates(&E, age, 20, 50, scratch, all, &nnz, &e_));
    assert_int_equal(nnz, 20);
    for (uint32_t i = 0; i < 20; i++) assert_int_equal(all[i], i);
    OK(compress_round_candidates(&E, age, d, 0, scratch, all, &nnz, &e_));
    assert_int_equal(nnz, 0);
    free(all);
    compress_sketch_free(&E);
    free(x);
    free(age);
    free(est);
    free(score);
    free(scratch);
    free(order);
    free(idx);
}

/* Versions until every coordinate has been applied at least once, at most
 * limit, with candidates from compress_round_candidates (rotate) or from
 * E's heavy hitters alone, on flat sign-like updates (the pseudo-gradients
 * of many local steps) of d coordinates, k a version. */
static int versions_to_cover(int rotate, size_t d, size_t k, int limit) {
    float *target = random_vec(d, 77), *theta = calloc(d, sizeof(float));
    float *delta = malloc(d * sizeof(float)), *scratch = malloc(d * sizeof(float));
    float *age = calloc(d, sizeof(float)), *exact = malloc(k * sizeof(float));
    float *cval = malloc(k * sizeof(float)), *val = malloc(k * sizeof(float));
    uint32_t *cand = malloc(k * sizeof *cand), *idx = malloc(k * sizeof *idx);
    unsigned char *seen = calloc(d, 1);
    assert_true(theta && delta && scratch && age && exact && cval && val && cand && idx && seen);
    compress_sketch E, S;
    OK(compress_sketch_init(&E, 5, 16, 3, &e_));
    OK(compress_sketch_init(&S, 5, 16, 3, &e_));
    size_t covered = 0;
    int v = 0;
    for (; v < limit && covered < d; v++) {
        flat_version(theta, target, delta, d, &E, &S);
        size_t nc = 0, nnz = 0;
        if (rotate)
            OK(compress_round_candidates(&E, age, d, k, scratch, cand, &nc, &e_));
        else
            OK(compress_sketch_heavy(&E, d, k, scratch, cand, cval, &nc, &e_));
        for (size_t t = 0; t < nc; t++) exact[t] = delta[cand[t]];
        OK(compress_round_take(&E, cand, exact, nc, age, d, 8.0f, k, idx, val, &nnz, &e_));
        for (size_t t = 0; t < nnz; t++) {
            theta[idx[t]] -= val[t];
            if (!seen[idx[t]]) covered++;
            seen[idx[t]] = 1;
        }
    }
    compress_sketch_free(&E);
    compress_sketch_free(&S);
    free(target);
    free(theta);
    free(delta);
    free(scratch);
    free(age);
    free(exact);
    free(cval);
    free(val);
    free(cand);
    free(idx);
    free(seen);
    return covered == d ? v : limit + 1;
}

/* On flat updates the heavy hitters of E keep naming the same
 * coordinates, and some are never applied (half of the demo model's at
 * 30x in 25 versions); the age in the candidates' score rotates them all
 * through within a few cycles of d / k versions. */
static void test_round_candidates_cover_every_coordinate(void **state) {
    (void)state;
    const size_t d = 20000, k = 1000; /* 20 versions a cycle */
    int heavy = versions_to_cover(0, d, k, 60);
    int rotate = versions_to_cover(1, d, k, 60);
    assert_true(heavy > 60);
    assert_true(rotate <= 40);
}

static void test_round_take_refuses_bad_input(void **state) {
    (void)state;
    compress_sketch E;
    OK(compress_sketch_init(&E, 3, 16, 99, &e_));
    float age[100] = {0};
    uint32_t down[2] = {5, 2}, out[2] = {5, 100}, idx[2];
    float exact[2] = {1, 2}, val[2];
    size_t nnz = 7;
    vl_error e = {0};
    assert_int_equal(compress_round_take(&E, down, exact, 2, age, 100, 4, 1, idx, val, &nnz, &e),
                     VL_EINVAL);
    assert_int_equal(nnz, 0);
    assert_int_equal(compress_round_take(&E, out, exact, 2, age, 100, 4, 1, idx, val, &nnz, NULL),
                     VL_EINVAL);
    uint32_t ok[2] = {2, 5};
    assert_int_equal(compress_round_take(&E, ok, exact, 2, age, 100, 0.5f, 1, idx, val, &nnz, NULL),
                     VL_EINVAL);
    assert_int_equal(compress_round_take(&E, ok, exact, 2, age, 100, NAN, 1, idx, val, &nnz, NULL),
                     VL_EINVAL);
    for (size_t t = 0; t < cells(&E); t++) assert_true(E.table[t] == 0.0f);
    for (size_t i = 0; i < 100; i++) assert_true(age[i] == 0.0f);
    compress_sketch_free(&E);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_take_values_and_state),
        cmocka_unit_test(test_round_take_flat_updates_learn),
        cmocka_unit_test(test_round_take_refuses_bad_input),
        cmocka_unit_test(test_round_candidates_reference),
        cmocka_unit_test(test_round_candidates_cover_every_coordinate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
