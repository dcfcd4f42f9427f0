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
        for (size_t i = 0; i < d; i++) {
            float g = theta[i] - target[i];
            delta[i] = 0.02f * (float)((g > 0) - (g < 0));
        }
        compress_sketch_zero(&S);
        compress_sketch_encode(&S, delta, d);
        for (size_t c = 0; c < cells(&E); c++) E.table[c] = 0.9f * E.table[c] + S.table[c];
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
    assert_int_equal(
        compress_round_take(&E, out, exact, 2, age, 100, 4, 1, idx, val, &nnz, NULL),
        VL_EINVAL);
    uint32_t ok[2] = {2, 5};
    assert_int_equal(compress_round_take(&E, ok, exact, 2, age, 100, 0.5f, 1, idx, val, &nnz,
                                         NULL),
                     VL_EINVAL);
    assert_int_equal(compress_round_take(&E, ok, exact, 2, age, 100, NAN, 1, idx, val, &nnz,
                                         NULL),
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
