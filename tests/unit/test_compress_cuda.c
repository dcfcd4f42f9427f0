/*
 * The CUDA compressors and dCor (kernels/cuda_compress.h) against their CPU
 * counterparts, at sizes around and between multiples of the block size.
 * What must agree bit for bit does: sketch hashes (the golden vectors of
 * test_sketch included), estimates and heavy hitters, top-k index sets,
 * sparse gather/scatter and error feedback. Sketch encode adds with
 * atomics in no fixed order, so on Gaussian data a cell is checked within
 * the rounding its sum can carry (1e-5 of the |x| mass it holds), and on
 * small-integer data, where every partial sum is exact and order cannot
 * matter, bit for bit. Gaussian-k is checked against its contract and the
 * CPU's threshold. Without a usable device the program reports itself
 * skipped (exit 77) before any test runs.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/common.h"
#include "compress/compress.h"
#include "kernels/cuda_compress.h"
#include "kernels/dcor.h"
#include "kernels/kernels.h"
#include "sketch_golden.h"
#include "test_util.h"
#include "cuda_skip.h"

/* Sizes around and between multiples of the 256-thread block. */
static const size_t SIZES[] = {1, 255, 1000, 65537, ((size_t)1 << 20) + 3};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz);
    assert_non_null(p);
    return p;
}

/* ---- Count Sketch ------------------------------------------------------------ */

static void test_hash_golden_on_gpu(void **state)
{
    (void)state;
    for (size_t t = 0; t < sizeof GOLDEN / sizeof GOLDEN[0]; t++) {
        const struct golden *g = &GOLDEN[t];
        uint32_t bucket[COMPRESS_SKETCH_MAX_ROWS];
        int8_t sign[COMPRESS_SKETCH_MAX_ROWS];
        OK(kernels_cuda_sketch_hash_host(g->seed, g->rows, g->cols, &g->i, 1, bucket, sign, &e_));
        assert_int_equal(bucket[g->row], g->bucket);
        assert_int_equal(sign[g->row], g->sign);
    }
}

/* Every row's bucket and sign of coordinates near 0, near 2^32 and far
 * beyond, as the CPU computes them. */
static void test_hash_matches_cpu(void **state)
{
    (void)state;
    enum { N = 4096 };
    uint64_t *coords = xcalloc(N, sizeof *coords);
    uint32_t *bucket = xcalloc((size_t)15 * N, sizeof *bucket);
    int8_t *sign = xcalloc((size_t)15 * N, sizeof *sign);
    rng r;
    rng_seed(&r, 5);
    for (size_t t = 0; t < N; t++)
        coords[t] = t < 1024 ? t : t < 2048 ? 0xFFFFFF00ull + t : rng_u64(&r);
    const uint32_t shapes[][2] = {{1, 1}, {5, 2000}, {15, 17895697}, {7, 1u << 20}};
    for (size_t s = 0; s < 4; s++) {
        uint32_t rows = shapes[s][0], cols = shapes[s][1];
        uint64_t seed = 0x9E3779B97F4A7C15ull * (s + 1);
        OK(kernels_cuda_sketch_hash_host(seed, rows, cols, coords, N, bucket, sign, &e_));
        for (uint32_t j = 0; j < rows; j++)
            for (size_t t = 0; t < N; t++) {
                uint32_t b;
                int sg;
                compress_sketch_hash(seed, j, cols, coords[t], &b, &sg);
                if (bucket[(size_t)j * N + t] != b || sign[(size_t)j * N + t] != sg)
                    fail_msg("row %u coord %llu: GPU (%u, %d), CPU (%u, %d)", j,
                             (unsigned long long)coords[t], bucket[(size_t)j * N + t],
                             sign[(size_t)j * N + t], b, sg);
            }
    }
    free(coords), free(bucket), free(sign);
}

/* The GPU encode lands a one-hot vector exactly where the golden hash says. */
static void test_encode_golden_one_hot(void **state)
{
    (void)state;
    for (size_t t = 0; t < sizeof GOLDEN / sizeof GOLDEN[0]; t++) {
        const struct golden *g = &GOLDEN[t];
        if (g->i > 100000 || (uint64_t)g->rows * g->cols > 100000000)
            continue;
        size_t d = (size_t)g->i + 1;
        float *x = xcalloc(d, sizeof *x);
        x[g->i] = 2.5f;
        compress_sketch s;
        OK(compress_sketch_init(&s, g->rows, g->cols, g->seed, &e_));
        OK(kernels_cuda_sketch_encode_host(&s, x, d, &e_));
        const float *row = s.table + (size_t)g->row * g->cols;
        for (uint32_t c = 0; c < g->cols; c++)
            assert_true(row[c] == (c == g->bucket ? 2.5f * (float)g->sign : 0.0f));
        compress_sketch_free(&s);
        free(x);
    }
}

/* GPU encode onto a table that already holds a sketch, against the CPU:
 * bit for bit for small integers, within rounding for Gaussian values. */
static void encode_compare(uint32_t rows, uint32_t cols, size_t d, int integers)
{
    uint64_t seed = 1000 + d + rows;
    float *x = random_vec(d, seed);
    if (integers)
        for (size_t i = 0; i < d; i++)
            x[i] = (float)((int)lrintf(x[i] * 2.0f) % 4);
    float *pre = random_vec(rows, seed + 1);
    compress_sketch g, c;
    OK(compress_sketch_init(&g, rows, cols, seed, &e_));
    OK(compress_sketch_init(&c, rows, cols, seed, &e_));
    size_t cells = (size_t)rows * cols;
    /* Both start from the same non-zero table (integers stay exact). */
    for (uint32_t j = 0; j < rows; j++)
        g.table[(size_t)j * cols] = c.table[(size_t)j * cols] = integers ? (float)j : pre[j];
    OK(kernels_cuda_sketch_encode_host(&g, x, d, &e_));
    compress_sketch_encode(&c, x, d);
    double *mass = integers ? NULL : xcalloc(cells, sizeof *mass);
    if (mass)
        for (uint32_t j = 0; j < rows; j++)
            for (size_t i = 0; i < d; i++) {
                uint32_t b;
                int sg;
                compress_sketch_hash(seed, j, cols, i, &b, &sg);
                mass[(size_t)j * cols + b] += fabs((double)x[i]);
            }
    for (size_t k = 0; k < cells; k++) {
        double tol = mass ? 1e-5 * mass[k] + 1e-6 : 0.0;
        if (!(fabs((double)g.table[k] - (double)c.table[k]) <= tol))
            fail_msg("encode %u x %u, d=%zu, %s: cell %zu GPU %.9g CPU %.9g", rows, cols, d,
                     integers ? "integers" : "gaussian", k, (double)g.table[k],
                     (double)c.table[k]);
    }
    compress_sketch_free(&g), compress_sketch_free(&c);
    free(mass), free(x), free(pre);
}

static void test_encode_matches_cpu(void **state)
{
    (void)state;
    /* 3 x 1000 and 5 x 8192 fit shared memory (used once d >= 4 cells);
     * 5 x 2^20 takes the global-atomic path; 1 x 1 collides everything. */
    const uint32_t shapes[][2] = {{1, 1}, {3, 1000}, {5, 8192}, {5, 1u << 20}};
    for (size_t s = 0; s < 4; s++)
        for (size_t n = 0; n < NSIZES; n++) {
            encode_compare(shapes[s][0], shapes[s][1], SIZES[n], 1);
            encode_compare(shapes[s][0], shapes[s][1], SIZES[n], 0);
        }
}

/* Estimates and heavy hitters from the same table, bit for bit. */
static void test_estimate_heavy_match_cpu(void **state)
{
    (void)state;
    const uint32_t rows_of[] = {1, 2, 3, 4, 5, 7, 14, 15};
    for (size_t r = 0; r < sizeof rows_of / sizeof rows_of[0]; r++)
        for (size_t n = 0; n < NSIZES; n++) {
            size_t d = SIZES[n];
            uint32_t rows = rows_of[r], cols = (uint32_t)(d / 8 + 3);
            compress_sketch s;
            OK(compress_sketch_init(&s, rows, cols, 77 + d, &e_));
            float *x = random_vec(d, 9 + d);
            for (size_t i = 0; i < d; i += 97)
                x[i] *= 50.0f; /* heavy coordinates */
            compress_sketch_encode(&s, x, d);
            float *eg = xcalloc(d, sizeof *eg), *ec = xcalloc(d, sizeof *ec);
            OK(kernels_cuda_sketch_estimate_host(&s, d, eg, &e_));
            compress_sketch_estimate(&s, d, ec);
            if (memcmp(eg, ec, d * sizeof *eg) != 0)
                fail_msg("estimate r=%u d=%zu differs from the CPU's", rows, d);
            size_t k = d / 100 + 1;
            uint32_t *ig = xcalloc(k, sizeof *ig), *ic = xcalloc(k, sizeof *ic);
            float *vg = xcalloc(k, sizeof *vg), *vc = xcalloc(k, sizeof *vc);
            size_t ng = 0, nc = 0;
            OK(kernels_cuda_sketch_heavy_host(&s, d, k, ig, vg, &ng, &e_));
            OK(compress_sketch_heavy(&s, d, k, ec, ic, vc, &nc, &e_));
            assert_int_equal(ng, nc);
            assert_memory_equal(ig, ic, nc * sizeof *ig);
            assert_memory_equal(vg, vc, nc * sizeof *vg);
            compress_sketch_free(&s);
            free(x), free(eg), free(ec), free(ig), free(ic), free(vg), free(vc);
        }
}

/* ---- selection ------------------------------------------------------------------ */

/* x of one of several kinds: Gaussian; coarse (many ties, and +-0); a few
 * huge values among zeros. */
static float *make_vec(size_t d, int kind, uint64_t seed)
{
    float *x = random_vec(d, seed);
    for (size_t i = 0; i < d; i++) {
        if (kind == 1)
            x[i] = floorf(x[i] * 2.0f) / 2.0f;
        else if (kind == 2)
            x[i] = i % 1009 == 3 ? 1e30f * x[i] : (i & 1) ? -0.0f : 0.0f;
    }
    return x;
}

static void test_topk_matches_cpu(void **state)
{
    (void)state;
    for (size_t n = 0; n < NSIZES; n++) {
        size_t d = SIZES[n];
        /* Small k copies candidates out; k near d runs every level on the
         * whole vector; k >= d takes everything. */
        size_t ks[] = {1, 7, d / 1000, d / 100, d / 2, d - 1, d, d + 5};
        for (int kind = 0; kind < 3; kind++) {
            float *x = make_vec(d, kind, 31 + d + (size_t)kind);
            for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
                size_t k = ks[t], m = k < d ? k : d;
                uint32_t *ig = xcalloc(m, sizeof *ig), *ic = xcalloc(m, sizeof *ic);
                size_t ng = 99, nc = 0;
                OK(kernels_cuda_topk_host(x, d, k, ig, &ng, &e_));
                OK(compress_topk(x, d, k, ic, &nc, &e_));
                if (ng != nc || memcmp(ig, ic, nc * sizeof *ig) != 0)
                    fail_msg("topk d=%zu k=%zu kind %d: GPU %zu entries differ from CPU %zu", d,
                             k, kind, ng, nc);
                free(ig), free(ic);
            }
            free(x);
        }
    }
}

/* The GPU's Gaussian-k meets compress_gaussk's contract and lands near the
 * CPU's threshold. */
static void test_gaussk_contract(void **state)
{
    (void)state;
    for (size_t n = 0; n < NSIZES; n++) {
        size_t d = SIZES[n];
        size_t ks[] = {1, d / 1000, d / 100, d / 10, d};
        for (int kind = 0; kind < 3; kind++) {
            float *x = make_vec(d, kind, 57 + d + (size_t)kind);
            for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
                size_t k = ks[t];
                if (k == 0)
                    continue;
                size_t cap = COMPRESS_GAUSSK_CAP(k);
                uint32_t *ig = xcalloc(cap, sizeof *ig), *ic = xcalloc(cap, sizeof *ic);
                size_t ng = 0, nc = 0;
                double tg = 0, tc = 0;
                OK(kernels_cuda_gaussk_host(x, d, k, ig, &ng, &tg, &e_));
                OK(compress_gaussk(x, d, k, ic, &nc, &tc, &e_));
                size_t m = k < d ? k : d;
                if (!(ng == m || (ng >= m - m / 20 && ng <= m + m / 20)))
                    fail_msg("gaussk d=%zu k=%zu kind %d: count %zu", d, k, kind, ng);
                /* Ascending, and every |x| >= thr selected (ties at thr may
                 * be cut only when exactly k are taken). */
                uint8_t *sel = xcalloc(d, 1);
                for (size_t j = 0; j < ng; j++) {
                    assert_true(ig[j] < d);
                    if (j)
                        assert_true(ig[j] > ig[j - 1]);
                    sel[ig[j]] = 1;
                    assert_true(fabs((double)x[ig[j]]) >= tg);
                }
                for (size_t i = 0; i < d; i++)
                    if (!sel[i] && fabs((double)x[i]) >= tg && !(ng == m && fabs(x[i]) == tg))
                        fail_msg("gaussk d=%zu k=%zu kind %d: |x[%zu]| = %g >= thr %g left out",
                                 d, k, kind, i, fabs((double)x[i]), tg);
                /* Both start from the same model threshold; they may settle
                 * on neighbouring values within the band. */
                if (kind == 0 && k < d && k >= 100 && fabs(tg - tc) > 0.05 * tc)
                    fail_msg("gaussk d=%zu k=%zu: GPU thr %.9g, CPU thr %.9g", d, k, tg, tc);
                free(sel), free(ig), free(ic);
            }
            free(x);
        }
    }
}

/* ---- sparse vectors and error feedback --------------------------------------------- */

static void test_sparse_and_feedback_match_cpu(void **state)
{
    (void)state;
    for (size_t n = 0; n < NSIZES; n++) {
        size_t d = SIZES[n];
        float *x = random_vec(d, 3 + d), *delta = random_vec(d, 4 + d);
        /* Values beyond F16's range and below its normal range too. */
        for (size_t i = 0; i < d; i += 7)
            x[i] *= i % 2 ? 1e5f : 1e-6f;
        /* Every third coordinate: ascending, and holding values of every
         * size above. */
        size_t nnz = (d + 2) / 3;
        uint32_t *idx = xcalloc(nnz, sizeof *idx);
        for (size_t j = 0; j < nnz; j++)
            idx[j] = (uint32_t)(3 * j);

        float *vg = xcalloc(nnz, sizeof *vg), *vc = xcalloc(nnz, sizeof *vc);
        OK(kernels_cuda_sparse_gather_host(x, d, idx, nnz, vg, &e_));
        for (size_t j = 0; j < nnz; j++)
            vc[j] = x[idx[j]];
        assert_memory_equal(vg, vc, nnz * sizeof *vg);

        float *dg = xcalloc(d, sizeof *dg), *dc = xcalloc(d, sizeof *dc);
        memcpy(dg, delta, d * sizeof *dg);
        memcpy(dc, delta, d * sizeof *dc);
        OK(kernels_cuda_sparse_scatter_add_host(dg, d, idx, vc, nnz, 0.3f, &e_));
        for (size_t j = 0; j < nnz; j++)
            dc[idx[j]] += 0.3f * vc[j];
        assert_memory_equal(dg, dc, d * sizeof *dg);

        const float decays[] = {1.0f, 0.9f};
        for (int t = 0; t < 2; t++) {
            memcpy(dg, x, d * sizeof *dg);
            memcpy(dc, x, d * sizeof *dc);
            OK(kernels_cuda_feedback_add_host(dg, delta, d, decays[t], &e_));
            compress_feedback_add(dc, delta, d, decays[t]);
            assert_memory_equal(dg, dc, d * sizeof *dg);
        }
        const st_dtype dts[] = {ST_F32, ST_F16};
        for (int t = 0; t < 2; t++) {
            memcpy(dg, x, d * sizeof *dg);
            memcpy(dc, x, d * sizeof *dc);
            OK(kernels_cuda_feedback_take_host(dg, d, idx, nnz, dts[t], vg, &e_));
            compress_feedback_take(dc, idx, nnz, dts[t], vc);
            assert_memory_equal(vg, vc, nnz * sizeof *vg);
            assert_memory_equal(dg, dc, d * sizeof *dg);
        }
        free(x), free(delta), free(idx), free(vg), free(vc), free(dg), free(dc);
    }
}

/* Bad index lists are refused before anything changes. */
static void test_sparse_rejects_bad_indices(void **state)
{
    (void)state;
    float e[8] = {1, 2, 3, 4, 5, 6, 7, 8}, before[8], val[3] = {0};
    memcpy(before, e, sizeof e);
    uint32_t beyond[3] = {1, 2, 8}, unordered[3] = {4, 2, 6}, repeated[3] = {2, 2, 5};
    vl_error err = {0};
    assert_int_equal(kernels_cuda_sparse_gather_host(e, 8, beyond, 3, val, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_sparse_scatter_add_host(e, 8, unordered, val, 3, 1, &err),
                     VL_EINVAL);
    assert_int_equal(kernels_cuda_feedback_take_host(e, 8, repeated, 3, ST_F16, val, &err),
                     VL_EINVAL);
    assert_int_equal(kernels_cuda_feedback_take_host(e, 8, beyond, 3, ST_F32, val, &err),
                     VL_EINVAL);
    assert_int_equal(kernels_cuda_feedback_take_host(e, 8, repeated, 3, ST_BF16, val, &err),
                     VL_EINVAL);
    assert_memory_equal(e, before, sizeof e);
    /* Gather takes any order. */
    OK(kernels_cuda_sparse_gather_host(e, 8, unordered, 3, val, &e_));
    assert_true(val[0] == 5 && val[1] == 3 && val[2] == 7);
}

/* ---- dCor ------------------------------------------------------------------------------ */

static void dcor_compare(int n, int p, int q, int constant_z)
{
    float *X = random_vec((size_t)n * p, 100 + (size_t)n);
    float *Z = random_vec((size_t)n * q, 200 + (size_t)n);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < q; k++)
            Z[(size_t)i * q + k] =
                constant_z ? 1.5f : 0.5f * Z[(size_t)i * q + k] + X[(size_t)i * p + k % p];
    float *gg = random_vec((size_t)n * q, 300), *gc = xcalloc((size_t)n * q, sizeof *gc);
    memcpy(gc, gg, (size_t)n * q * sizeof *gc);
    double *scratch = xcalloc(kernels_dcor_scratch_doubles(n), sizeof *scratch);
    double vg = -1;
    OK(kernels_cuda_dcor_host(gg, X, Z, n, p, q, 0.7f, &vg, &e_));
    double vc = kernels_dcor(gc, X, Z, n, p, q, 0.7f, scratch);
    /* Same operations in the same order: they should agree to the last
     * bits; the tolerance only allows for a different libm sqrt. */
    if (!(fabs(vg - vc) <= 1e-12))
        fail_msg("dcor n=%d p=%d q=%d: GPU %.17g CPU %.17g", n, p, q, vg, vc);
    if (constant_z)
        assert_true(vg == 0.0);
    double gmax = 0;
    for (size_t i = 0; i < (size_t)n * q; i++)
        gmax = fmax(gmax, fabs((double)gc[i]));
    for (size_t i = 0; i < (size_t)n * q; i++)
        if (!(fabs((double)gg[i] - (double)gc[i]) <= 1e-6 * gmax + 1e-12))
            fail_msg("dcor grad n=%d p=%d q=%d [%zu]: GPU %.9g CPU %.9g", n, p, q, i,
                     (double)gg[i], (double)gc[i]);
    free(X), free(Z), free(gg), free(gc), free(scratch);
}

static void test_dcor_matches_cpu(void **state)
{
    (void)state;
    dcor_compare(2, 1, 1, 0);
    dcor_compare(3, 5, 2, 0);
    dcor_compare(17, 8, 3, 0);
    dcor_compare(130, 40, 16, 0);
    dcor_compare(300, 3, 257, 0);
    dcor_compare(64, 4, 4, 1);
}

/* ---- arguments ------------------------------------------------------------------------- */

static void test_rejects_bad_args(void **state)
{
    (void)state;
    vl_error err = {0};
    float f = 0;
    uint32_t u = 0;
    size_t nnz = 5;
    compress_sketch s = {0, 4, 1, &f};
    assert_int_equal(kernels_cuda_sketch_encode_host(&s, &f, 1, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_sketch_encode(&f, 16, 4, 1, &f, 1, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_sketch_estimate(&f, 1, 0, 1, 1, &f, &err), VL_EINVAL);
    /* Sizes past 32-bit indices are refused before any device access. */
    size_t huge = (size_t)UINT32_MAX + 1;
    assert_int_equal(kernels_cuda_topk(&f, huge, 1, &u, &nnz, &err), VL_EINVAL);
    assert_int_equal(nnz, 0);
    assert_int_equal(kernels_cuda_gaussk(&f, huge, 1, &u, &nnz, NULL, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_topk(NULL, 4, 1, &u, &nnz, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_topk_host(&f, 1, 1, &u, NULL, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_dcor_host(NULL, &f, &f, 1, 1, 1, 1.0f, (double[1]){0}, &err),
                     VL_EINVAL);
    /* Nothing to do is not an error. */
    OK(kernels_cuda_topk_host(&f, 0, 3, &u, &nnz, &e_));
    assert_int_equal(nnz, 0);
    double thr = 0;
    OK(kernels_cuda_gaussk_host(&f, 1, 0, &u, &nnz, &thr, &e_));
    assert_true(thr == HUGE_VAL);
}

int main(void)
{
    test_cuda_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_golden_on_gpu),
        cmocka_unit_test(test_hash_matches_cpu),
        cmocka_unit_test(test_encode_golden_one_hot),
        cmocka_unit_test(test_encode_matches_cpu),
        cmocka_unit_test(test_estimate_heavy_match_cpu),
        cmocka_unit_test(test_topk_matches_cpu),
        cmocka_unit_test(test_gaussk_contract),
        cmocka_unit_test(test_sparse_and_feedback_match_cpu),
        cmocka_unit_test(test_sparse_rejects_bad_indices),
        cmocka_unit_test(test_dcor_matches_cpu),
        cmocka_unit_test(test_rejects_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
