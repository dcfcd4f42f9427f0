/* The Sketched-SGD second round (compress_fetchsgd_exact): estimates at
 * chosen coordinates agree with the full estimate bit for bit; with no
 * collisions the round reproduces the plain FetchSGD step; with heavy
 * collisions and fresh state it applies exactly lr*(1+mu) times the
 * reported values, picks the largest of them, and zeroes their cells. */
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

static size_t cells(const compress_sketch *s) {
    return (size_t)s->rows * s->cols;
}

static void test_estimate_at_matches_estimate(void **state) {
    (void)state;
    const size_t d = 5003;
    for (uint32_t rows = 1; rows <= 6; rows++) {
        compress_sketch s;
        OK(compress_sketch_init(&s, rows, 211, 77 + rows, &e_));
        float *x = random_vec(d, rows);
        compress_sketch_encode(&s, x, d);
        float *all = malloc(d * sizeof *all), *some = malloc(d * sizeof *some);
        uint32_t *idx = malloc(d * sizeof *idx);
        assert_non_null(all);
        assert_non_null(some);
        assert_non_null(idx);
        compress_sketch_estimate(&s, d, all);
        /* Every coordinate, backwards, so order does not matter either. */
        for (size_t t = 0; t < d; t++) idx[t] = (uint32_t)(d - 1 - t);
        compress_sketch_estimate_at(&s, idx, d, some);
        for (size_t t = 0; t < d; t++)
            if (memcmp(&some[t], &all[idx[t]], sizeof(float)) != 0)
                fail_msg("rows %u coordinate %u: %.9g vs %.9g", rows, idx[t],
                         (double)some[t], (double)all[idx[t]]);
        free(all);
        free(some);
        free(idx);
        free(x);
        compress_sketch_free(&s);
    }
}

/* Shared set-up: V, E with some history, S the sketch of x. */
typedef struct fixture {
    compress_sketch V, E, S;
    float *x;
    size_t d;
} fixture;

static void fixture_init(fixture *f, size_t d, uint32_t rows, uint32_t cols, int history) {
    f->d = d;
    OK(compress_sketch_init(&f->V, rows, cols, 99, &e_));
    OK(compress_sketch_init(&f->E, rows, cols, 99, &e_));
    OK(compress_sketch_init(&f->S, rows, cols, 99, &e_));
    f->x = random_vec(d, 5);
    /* A few planted heavy coordinates, of both signs. */
    f->x[3] = 30.0f;
    f->x[d / 2] = -25.0f;
    f->x[d - 1] = 20.0f;
    compress_sketch_encode(&f->S, f->x, d);
    if (history) {
        float *h = random_vec(d, 6);
        for (size_t i = 0; i < d; i++) h[i] *= 0.3f;
        compress_sketch_encode(&f->V, h, d);
        for (size_t i = 0; i < d; i++) h[i] *= 0.5f;
        compress_sketch_encode(&f->E, h, d);
        free(h);
    }
}

static void fixture_free(fixture *f) {
    compress_sketch_free(&f->V);
    compress_sketch_free(&f->E);
    compress_sketch_free(&f->S);
    free(f->x);
}

/* With far more columns than coordinates no two collide, so every
 * estimate is exact and the second round must pick and apply what the
 * one-round step does. */
static void test_exact_round_without_collisions_is_the_step(void **state) {
    (void)state;
    const size_t d = 300, k = 10, P = 4;
    const double lr = 0.7, mu = 0.9;
    fixture a, b;
    /* 3 rows of 2^20 columns: for 300 coordinates a collision in the
     * median is vanishingly unlikely, and the assertions would show it. */
    fixture_init(&a, d, 3, 1u << 20, 1);
    fixture_init(&b, d, 3, 1u << 20, 1);
    float *scratch = malloc(d * sizeof *scratch);
    uint32_t idx[10], cand[40], ridx[40];
    float val[10], cval[40], rval[40];
    size_t nnz = 0, nc = 0, rn = 0;
    assert_non_null(scratch);
    OK(compress_fetchsgd_step(&a.V, &a.E, &a.S, lr, mu, d, k, scratch, idx, val, &nnz, &e_));

    OK(compress_fetchsgd_accumulate(&b.V, &b.E, &b.S, lr, mu, &e_));
    OK(compress_sketch_heavy(&b.E, d, P * k, scratch, cand, cval, &nc, &e_));
    assert_int_equal(nc, P * k);
    float exact[40];
    for (size_t t = 0; t < nc; t++) exact[t] = b.x[cand[t]];
    OK(compress_fetchsgd_exact(&b.V, &b.E, &b.S, lr, mu, cand, exact, nc, k, ridx, rval, &rn,
                               &e_));
    assert_int_equal(rn, nnz);
    for (size_t t = 0; t < rn; t++) {
        assert_int_equal(ridx[t], idx[t]);
        assert_float_equal(rval[t], val[t], 1e-4 * (1.0 + fabs(val[t])));
    }
    for (size_t t = 0; t < cells(&a.E); t++) {
        assert_true(b.E.table[t] == a.E.table[t]);
        assert_true(b.V.table[t] == a.V.table[t]);
    }
    free(scratch);
    fixture_free(&a);
    fixture_free(&b);
}

/* Few columns: the estimates are mostly collision noise. With fresh
 * state, the values applied are c * exact (c = lr * (1 + mu)), the k
 * candidates of largest |exact| are chosen whatever the estimates said,
 * and their cells are zeroed in both sketches. */
static void test_exact_round_removes_collision_noise(void **state) {
    (void)state;
    const size_t d = 20000, k = 8, P = 8;
    const double lr = 1.0, mu = 0.5;
    const float c = (float)(lr * (1.0 + mu));
    fixture f;
    fixture_init(&f, d, 5, 64, 0);
    float *scratch = malloc(d * sizeof *scratch);
    uint32_t cand[64], idx[64];
    float cval[64], val[64], exact[64];
    size_t nc = 0, nnz = 0;
    assert_non_null(scratch);
    OK(compress_fetchsgd_accumulate(&f.V, &f.E, &f.S, lr, mu, &e_));
    OK(compress_sketch_heavy(&f.E, d, P * k, scratch, cand, cval, &nc, &e_));
    for (size_t t = 0; t < nc; t++) exact[t] = f.x[cand[t]];
    /* The reference choice: the k candidates of largest |exact|. */
    uint32_t want[64];
    float wval[64];
    memcpy(want, cand, nc * sizeof *want);
    memcpy(wval, exact, nc * sizeof *wval);
    size_t wn = 0;
    OK(compress_select_exact(want, wval, nc, k, &wn, &e_));
    OK(compress_fetchsgd_exact(&f.V, &f.E, &f.S, lr, mu, cand, exact, nc, k, idx, val, &nnz,
                               &e_));
    assert_int_equal(nnz, wn);
    double worst = 0;
    for (size_t t = 0; t < nnz; t++) {
        assert_int_equal(idx[t], want[t]);
        /* E - c*S is zero up to the rounding of the accumulation. */
        double err = fabs((double)val[t] - (double)c * f.x[idx[t]]);
        if (err > worst) worst = err;
    }
    assert_true(worst < 1e-4);
    /* How far off the one-round estimates were, to show the test is not
     * vacuous: at 64 columns for 20,000 coordinates they are far off. */
    double est_err = 0;
    for (size_t t = 0; t < nc; t++) est_err += fabs((double)cval[t] - c * f.x[cand[t]]);
    assert_true(est_err / (double)nc > 1.0);
    for (uint32_t j = 0; j < f.E.rows; j++)
        for (size_t t = 0; t < nnz; t++) {
            uint32_t bkt;
            int sg;
            compress_sketch_hash(f.E.seed, j, f.E.cols, idx[t], &bkt, &sg);
            assert_true(f.E.table[(size_t)j * f.E.cols + bkt] == 0.0f);
            assert_true(f.V.table[(size_t)j * f.V.cols + bkt] == 0.0f);
        }
    free(scratch);
    fixture_free(&f);
}

static void test_exact_round_refuses_bad_input(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f, 100, 3, 16, 0);
    compress_sketch other;
    OK(compress_sketch_init(&other, 3, 17, 99, &e_));
    uint32_t cand[2] = {1, 2}, idx[2];
    float exact[2] = {1, 2}, val[2];
    size_t nnz = 7;
    vl_error e = {0};
    assert_int_equal(compress_fetchsgd_exact(&f.V, &f.E, &other, 1, 0, cand, exact, 2, 1, idx,
                                             val, &nnz, &e),
                     VL_EINVAL);
    assert_int_equal(nnz, 0);
    assert_int_equal(compress_fetchsgd_exact(&f.V, &f.V, &f.S, 1, 0, cand, exact, 2, 1, idx, val,
                                             &nnz, NULL),
                     VL_EINVAL);
    assert_int_equal(compress_fetchsgd_exact(&f.V, &f.E, &f.S, INFINITY, 0, cand, exact, 2, 1,
                                             idx, val, &nnz, NULL),
                     VL_EINVAL);
    assert_int_equal(compress_fetchsgd_accumulate(&f.V, &f.E, &other, 1, 0, NULL), VL_EINVAL);
    assert_int_equal(compress_fetchsgd_accumulate(&f.V, &f.E, &f.S, 1, NAN, NULL), VL_EINVAL);
    for (size_t t = 0; t < cells(&f.E); t++) {
        assert_true(f.E.table[t] == 0.0f);
        assert_true(f.V.table[t] == 0.0f);
    }
    compress_sketch_free(&other);
    fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_estimate_at_matches_estimate),
        cmocka_unit_test(test_exact_round_without_collisions_is_the_step),
        cmocka_unit_test(test_exact_round_removes_collision_noise),
        cmocka_unit_test(test_exact_round_refuses_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
