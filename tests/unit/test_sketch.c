/* Count Sketch: the hash is pinned to values computed independently
 * (Python big integers), and encode, estimate and heavy hitters are each
 * checked against a plain scalar reference
 * (sketch_ref.h, from DESIGN.md), on both the one-thread and the OpenMP
 * paths and on sizes that leave partial blocks. The FetchSGD step is in
 * test_fetchsgd.c. */
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
#include "sketch_golden.h"
#include "test_util.h"

#include "sketch_ref.h"

static size_t cells(const compress_sketch *s) {
    return (size_t)s->rows * s->cols;
}

/* ---- the hash ---------------------------------------------------------------- */

static void test_hash_golden(void **state) {
    (void)state;
    assert_true(vl_splitmix64(0) == 0xE220A8397B1DCDAFull);
    for (size_t t = 0; t < sizeof GOLDEN / sizeof GOLDEN[0]; t++) {
        const struct golden *g = &GOLDEN[t];
        assert_true(compress_sketch_row_key(g->seed, g->row) == g->key);
        uint32_t b = UINT32_MAX;
        int sg = 0;
        compress_sketch_hash(g->seed, g->row, g->cols, g->i, &b, &sg);
        assert_int_equal(b, g->bucket);
        assert_int_equal(sg, g->sign);
    }
}

/* The vectorised encode lands a one-hot vector exactly where the golden
 * hash says. */
static void test_encode_golden_one_hot(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof GOLDEN / sizeof GOLDEN[0]; t++) {
        const struct golden *g = &GOLDEN[t];
        if (g->i > 100000 || (uint64_t)g->rows * g->cols > 100000000) continue;
        size_t d = (size_t)g->i + 1;
        float *x = calloc(d, sizeof *x);
        assert_non_null(x);
        x[g->i] = 2.5f;
        compress_sketch s;
        OK(compress_sketch_init(&s, g->rows, g->cols, g->seed, &e_));
        compress_sketch_encode(&s, x, d);
        const float *row = s.table + (size_t)g->row * g->cols;
        for (uint32_t c = 0; c < g->cols; c++) {
            float want = c == g->bucket ? 2.5f * (float)g->sign : 0.0f;
            assert_true(row[c] == want);
        }
        compress_sketch_free(&s);
        free(x);
    }
}

/* ---- encode ------------------------------------------------------------------ */

static void check_encode(uint32_t rows, uint32_t cols, uint64_t seed, size_t d, int exact) {
    float *x = random_vec(d, seed + d);
    compress_sketch s;
    OK(compress_sketch_init(&s, rows, cols, seed, &e_));
    float *ref = calloc(cells(&s), sizeof *ref);
    double *mass = calloc(cells(&s), sizeof *mass);
    assert_non_null(ref);
    assert_non_null(mass);
    compress_sketch_encode(&s, x, d);
    ref_encode(ref, rows, cols, seed, x, d);
    ref_abs_mass(mass, rows, cols, seed, x, d);
    for (size_t c = 0; c < cells(&s); c++) {
        if (exact) {
            if (s.table[c] != ref[c])
                fail_msg("d=%zu r=%u c=%u cell %zu: %.9g != %.9g", d, rows, cols, c,
                         (double)s.table[c], (double)ref[c]);
        } else {
            double tol = 1e-5 * mass[c] + 1e-6;
            if (fabs((double)s.table[c] - (double)ref[c]) > tol)
                fail_msg("d=%zu r=%u c=%u cell %zu: %.9g vs %.9g", d, rows, cols, c,
                         (double)s.table[c], (double)ref[c]);
        }
    }
    /* encode adds to what is there. */
    compress_sketch_encode(&s, x, d);
    for (size_t c = 0; c < cells(&s); c++) {
        double tol = 2e-5 * mass[c] + 1e-6;
        assert_true(fabs((double)s.table[c] - 2.0 * ref[c]) <= tol);
    }
    compress_sketch_free(&s);
    free(ref);
    free(mass);
    free(x);
}

/* Below the threshold for threads the order of additions is the
 * reference's, so the tables agree bit for bit. */
static void test_encode_small_matches_reference(void **state) {
    (void)state;
    static const size_t ds[] = {1,   7,   15,  16,   17,   63,   64,    65,
                                127, 128, 129, 4095, 4096, 4097, 10000, 1000003};
    for (size_t t = 0; t < sizeof ds / sizeof ds[0]; t++) {
        check_encode(5, 1000, 42, ds[t], 1);
        check_encode(1, 7, 0xDEADBEEFCAFEF00Dull, ds[t], 1);
    }
    check_encode(15, 3, 9, 1000, 1);
    check_encode(2, 1, 9, 1000, 1);
    check_encode(4, 100003, 77, 20000, 1);
}

/* The threaded path sums per-thread tables, so only rounding may differ. */
static void test_encode_threads_match_reference(void **state) {
    (void)state;
    int saved = omp_get_max_threads();
    for (int nt = 2; nt <= 3; nt++) {
        omp_set_num_threads(nt);
        check_encode(3, 1000, 0xDEADBEEFCAFEF00Dull, 3000017, 0);
        check_encode(5, 64, 5, (size_t)1 << 21, 0);
    }
    omp_set_num_threads(saved);
}

static void test_encode_empty(void **state) {
    (void)state;
    compress_sketch s;
    OK(compress_sketch_init(&s, 3, 10, 1, &e_));
    float x = 1.0f;
    compress_sketch_encode(&s, &x, 0);
    for (size_t c = 0; c < cells(&s); c++) assert_true(s.table[c] == 0.0f);
    compress_sketch_free(&s);
    compress_sketch_free(&s); /* a freed sketch is empty, so freeing again is harmless */
    assert_null(s.table);
}

/* ---- linearity ---------------------------------------------------------------- */

static void test_linearity(void **state) {
    (void)state;
    size_t d = 50021;
    float *a = random_vec(d, 1), *b = random_vec(d, 2), *ab = malloc(d * sizeof *ab);
    assert_non_null(ab);
    const float w = -0.75f;
    compress_sketch sa, sb, sab, sw;
    OK(compress_sketch_init(&sa, 5, 977, 1234, &e_));
    OK(compress_sketch_init(&sb, 5, 977, 1234, &e_));
    OK(compress_sketch_init(&sab, 5, 977, 1234, &e_));
    OK(compress_sketch_init(&sw, 5, 977, 1234, &e_));
    compress_sketch_encode(&sa, a, d);
    compress_sketch_encode(&sb, b, d);
    for (size_t i = 0; i < d; i++) ab[i] = a[i] + b[i];
    compress_sketch_encode(&sab, ab, d);
    for (size_t i = 0; i < d; i++) ab[i] = a[i] + w * b[i];
    compress_sketch_encode(&sw, ab, d);

    double *mass = calloc(cells(&sa), sizeof *mass);
    assert_non_null(mass);
    ref_abs_mass(mass, 5, 977, 1234, a, d);
    ref_abs_mass(mass, 5, 977, 1234, b, d);

    compress_sketch acc;
    OK(compress_sketch_init(&acc, 5, 977, 1234, &e_));
    OK(compress_sketch_add(&acc, &sa, 1.0f, &e_));
    OK(compress_sketch_add(&acc, &sb, 1.0f, &e_));
    for (size_t c = 0; c < cells(&acc); c++)
        assert_true(fabs((double)acc.table[c] - sab.table[c]) <= 1e-5 * mass[c] + 1e-6);

    compress_sketch_zero(&acc);
    for (size_t c = 0; c < cells(&acc); c++) assert_true(acc.table[c] == 0.0f);
    OK(compress_sketch_add(&acc, &sa, 1.0f, &e_));
    OK(compress_sketch_add(&acc, &sb, w, &e_));
    for (size_t c = 0; c < cells(&acc); c++)
        assert_true(fabs((double)acc.table[c] - sw.table[c]) <= 1e-5 * mass[c] + 1e-6);

    /* Exactly w * src on a zero table. */
    compress_sketch_zero(&acc);
    OK(compress_sketch_add(&acc, &sb, w, &e_));
    for (size_t c = 0; c < cells(&acc); c++) assert_true(acc.table[c] == w * sb.table[c]);

    compress_sketch_free(&acc);
    compress_sketch_free(&sa);
    compress_sketch_free(&sb);
    compress_sketch_free(&sab);
    compress_sketch_free(&sw);
    free(mass);
    free(a);
    free(b);
    free(ab);
}

static void test_same_shape_refuses_others(void **state) {
    (void)state;
    compress_sketch a, seed2, rows2, cols2, same;
    OK(compress_sketch_init(&a, 3, 100, 7, &e_));
    OK(compress_sketch_init(&seed2, 3, 100, 8, &e_));
    OK(compress_sketch_init(&rows2, 4, 100, 7, &e_));
    OK(compress_sketch_init(&cols2, 3, 101, 7, &e_));
    OK(compress_sketch_init(&same, 3, 100, 7, &e_));
    assert_true(compress_sketch_same_shape(&a, &same));
    assert_false(compress_sketch_same_shape(&a, &seed2));
    assert_false(compress_sketch_same_shape(&a, &rows2));
    assert_false(compress_sketch_same_shape(&a, &cols2));
    assert_false(compress_sketch_same_shape(&a, NULL));
    a.table[0] = 1.0f;
    compress_sketch *bad[] = {&seed2, &rows2, &cols2};
    for (size_t t = 0; t < 3; t++) {
        vl_error e = {0};
        assert_int_equal(compress_sketch_add(&a, bad[t], 1.0f, &e), VL_EINVAL);
        assert_int_equal(e.code, VL_EINVAL);
        assert_true(e.msg[0] != '\0');
        assert_int_equal(compress_sketch_add(bad[t], &a, 1.0f, NULL), VL_EINVAL);
    }
    assert_true(a.table[0] == 1.0f);
    for (size_t c = 0; c < cells(&seed2); c++) assert_true(seed2.table[c] == 0.0f);
    compress_sketch_free(&a);
    compress_sketch_free(&seed2);
    compress_sketch_free(&rows2);
    compress_sketch_free(&cols2);
    compress_sketch_free(&same);
}

/* ---- estimate ------------------------------------------------------------------ */

/* On an arbitrary table the median is a pure selection (or the mean of two
 * selections), so the vectorised estimate equals the reference exactly, for
 * every row count, odd and even. */
static void test_estimate_matches_reference(void **state) {
    (void)state;
    static const size_t ds[] = {1, 5, 64, 1000, 70001};
    for (uint32_t r = 1; r <= COMPRESS_SKETCH_MAX_ROWS; r++) {
        compress_sketch s;
        OK(compress_sketch_init(&s, r, 53, 1000 + r, &e_));
        vl_rng g;
        vl_rng_seed(&g, r);
        for (size_t c = 0; c < cells(&s); c++) s.table[c] = vl_rng_normal(&g);
        for (size_t t = 0; t < sizeof ds / sizeof ds[0]; t++) {
            size_t d = ds[t];
            if (d > 1000 && r % 4 != 1) continue; /* keep the run short */
            float *got = malloc(d * sizeof *got), *want = malloc(d * sizeof *want);
            assert_non_null(got);
            assert_non_null(want);
            compress_sketch_estimate(&s, d, got);
            ref_estimate(&s, d, want);
            for (size_t i = 0; i < d; i++)
                if (got[i] != want[i])
                    fail_msg("r=%u d=%zu i=%zu: %.9g != %.9g", r, d, i, (double)got[i],
                             (double)want[i]);
            free(got);
            free(want);
        }
        compress_sketch_free(&s);
    }
}

/* The estimate writes exactly d values, even when d ends mid-block. */
static void test_estimate_writes_only_d(void **state) {
    (void)state;
    compress_sketch s;
    OK(compress_sketch_init(&s, 3, 10, 4, &e_));
    for (size_t c = 0; c < cells(&s); c++) s.table[c] = 1.0f + (float)c;
    float out[80];
    for (size_t i = 0; i < 80; i++) out[i] = -99.0f;
    compress_sketch_estimate(&s, 67, out);
    for (size_t i = 0; i < 67; i++) assert_true(out[i] != -99.0f);
    for (size_t i = 67; i < 80; i++) assert_true(out[i] == -99.0f);
    compress_sketch_estimate(&s, 0, out);
    compress_sketch_free(&s);
}

/* A sparse vector in a sketch far wider than it comes back exactly. */
static void test_estimate_exact_when_sparse(void **state) {
    (void)state;
    const size_t d = 300;
    float x[300] = {0};
    x[0] = 3.0f;
    x[17] = -1.5f;
    x[64] = 1e-3f;
    x[199] = 1e6f;
    x[299] = -42.0f;
    for (uint32_t r = 1; r <= 6; r++) {
        compress_sketch s;
        OK(compress_sketch_init(&s, r, 200003, 99, &e_));
        compress_sketch_encode(&s, x, d);
        float est[300];
        compress_sketch_estimate(&s, d, est);
        for (size_t i = 0; i < d; i++) assert_true(est[i] == x[i]);
        compress_sketch_free(&s);
    }
}

/* Planted heavy hitters well above the sketch's l2 noise floor are exactly
 * the top k, their estimates are within a small multiple of
 * ||x_tail||_2 / sqrt(c), and so are nearly all the others. The sketch is
 * 200 k wide: a coordinate that meets planted ones in 3 of 5 rows, with
 * agreeing signs, would pass for one of them, and at this width that has
 * odds of about 3 % over all d coordinates. */
static void test_heavy_hitters_planted(void **state) {
    (void)state;
    const size_t d = 100000, k = 20;
    const uint32_t r = 5, c = 4000;
    float *x = random_vec(d, 2024);
    double tail2 = 0.0;
    for (size_t i = 0; i < d; i++) tail2 += (double)x[i] * x[i];
    double floor_ = sqrt(tail2) / sqrt((double)c); /* about 5 here */
    uint32_t planted[20];
    vl_rng g;
    vl_rng_seed(&g, 77);
    for (size_t t = 0; t < k; t++) {
        uint32_t i;
        int again;
        do {
            i = vl_rng_below(&g, (uint32_t)d);
            again = 0;
            for (size_t u = 0; u < t; u++) again |= planted[u] == i;
        } while (again);
        planted[t] = i;
        x[i] = (float)((t & 1) ? -1 : 1) * (float)(8.0 * floor_ + (double)t);
    }
    qsort(planted, k, sizeof planted[0], cmp_u32);

    int saved = omp_get_max_threads();
    for (int nt = 1; nt <= 2; nt++) {
        omp_set_num_threads(nt);
        compress_sketch s;
        OK(compress_sketch_init(&s, r, c, 31337, &e_));
        compress_sketch_encode(&s, x, d);
        float *scratch = malloc(d * sizeof *scratch);
        assert_non_null(scratch);
        uint32_t idx[20];
        float val[20];
        size_t nnz = 0;
        OK(compress_sketch_heavy(&s, d, k, scratch, idx, val, &nnz, &e_));
        assert_int_equal(nnz, k);
        /* The bound holds per coordinate with high probability, not for
         * all of them at once: a coordinate that shares a cell with planted
         * ones in most rows inherits their mass, which is rare. */
        size_t over = 0;
        for (size_t i = 0; i < d; i++) over += fabs((double)scratch[i] - x[i]) > 3.0 * floor_;
        if (over > d / 10000) fail_msg("%zu of %zu estimates off by > 3 x %.3f", over, d, floor_);
        for (size_t t = 0; t < k; t++) {
            assert_int_equal(idx[t], planted[t]);
            assert_true(val[t] == scratch[idx[t]]);
            assert_true(fabs((double)val[t] - x[idx[t]]) <= 3.0 * floor_);
        }
        free(scratch);
        compress_sketch_free(&s);
    }
    omp_set_num_threads(saved);
    free(x);
}

/* Heavy hitters are the exact top k of the estimates: ties go to the lower
 * index, indices come out ascending, and k >= d returns every coordinate. */
static void test_heavy_is_topk_of_estimates(void **state) {
    (void)state;
    const size_t d = 777;
    compress_sketch s;
    OK(compress_sketch_init(&s, 3, 40, 5, &e_));
    vl_rng g;
    vl_rng_seed(&g, 3);
    /* Few distinct values, so many estimates tie. */
    for (size_t c = 0; c < cells(&s); c++) s.table[c] = (float)((int)vl_rng_below(&g, 7) - 3);
    float est[777], scratch[777], val[777], rval[777];
    uint32_t idx[777], ridx[777];
    ref_estimate(&s, d, est);
    static const size_t ks[] = {1, 10, 100, 776, 777, 1000};
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        size_t nnz = 0;
        OK(compress_sketch_heavy(&s, d, ks[t], scratch, idx, val, &nnz, &e_));
        size_t rn = ref_topk(est, d, ks[t], ridx, rval);
        assert_int_equal(nnz, rn);
        for (size_t u = 0; u < rn; u++) {
            assert_int_equal(idx[u], ridx[u]);
            assert_true(val[u] == rval[u]);
        }
    }
    size_t nnz = 5;
    OK(compress_sketch_heavy(&s, d, 0, scratch, idx, val, &nnz, &e_));
    assert_int_equal(nnz, 0);
    compress_sketch_free(&s);
}

static void test_init_refuses_bad_shapes(void **state) {
    (void)state;
    static const struct {
        uint32_t rows, cols;
    } bad[] = {
        {0, 10},
        {16, 10},
        {UINT32_MAX, 10},
        {3, 0},
        {15, 17895698}, /* 15 * 17895698 = 2^28 + 14 cells */
        {1, (1u << 28) + 1},
        {2, (1u << 27) + 1},
    };
    for (size_t t = 0; t < sizeof bad / sizeof bad[0]; t++) {
        compress_sketch s;
        memset(&s, 0xAB, sizeof s);
        vl_error e = {0};
        assert_int_equal(compress_sketch_init(&s, bad[t].rows, bad[t].cols, 1, &e), VL_EINVAL);
        assert_int_equal(e.code, VL_EINVAL);
        assert_true(e.msg[0] != '\0');
        assert_null(s.table);
        compress_sketch_free(&s);
    }
    compress_sketch s;
    OK(compress_sketch_init(&s, COMPRESS_SKETCH_MAX_ROWS, 1, 1, &e_));
    compress_sketch_free(&s);
    OK(compress_sketch_init(&s, 1, 1, 1, &e_));
    assert_true(s.table[0] == 0.0f);
    compress_sketch_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_golden),
        cmocka_unit_test(test_encode_golden_one_hot),
        cmocka_unit_test(test_encode_small_matches_reference),
        cmocka_unit_test(test_encode_threads_match_reference),
        cmocka_unit_test(test_encode_empty),
        cmocka_unit_test(test_linearity),
        cmocka_unit_test(test_same_shape_refuses_others),
        cmocka_unit_test(test_estimate_matches_reference),
        cmocka_unit_test(test_estimate_writes_only_d),
        cmocka_unit_test(test_estimate_exact_when_sparse),
        cmocka_unit_test(test_heavy_hitters_planted),
        cmocka_unit_test(test_heavy_is_topk_of_estimates),
        cmocka_unit_test(test_init_refuses_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
