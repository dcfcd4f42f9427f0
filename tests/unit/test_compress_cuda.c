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
 * CPU's threshold. The compressors keep their scratch in a workspace
 * cached across calls, so calls of growing and shrinking sizes, calls
 * after a refused one, calls from two threads and calls after the cache
 * was released are checked as well. Without a usable device the program reports itself
 * skipped (exit 77) before any test runs.
 */
#include <math.h>
#include <pthread.h>
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
#include "kernels/cuda_model.h"
#include "kernels/dcor.h"
#include "kernels/kernels.h"
#include "sketch_golden.h"
#include "test_util.h"
#include "cuda_skip.h"

/* Sizes around and between multiples of the 256-thread block. */
static const size_t SIZES[] = {1, 255, 1000, 65537, ((size_t)1 << 20) + 3};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    assert_non_null(p);
    return p;
}

/* ---- Count Sketch ------------------------------------------------------------ */

static void test_hash_golden_on_gpu(void **state) {
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
static void test_hash_matches_cpu(void **state) {
    (void)state;
    enum { N = 4096 };
    uint64_t *coords = xcalloc(N, sizeof *coords);
    uint32_t *bucket = xcalloc((size_t)15 * N, sizeof *bucket);
    int8_t *sign = xcalloc((size_t)15 * N, sizeof *sign);
    vl_rng r;
    vl_rng_seed(&r, 5);
    for (size_t t = 0; t < N; t++)
        coords[t] = t < 1024 ? t : t < 2048 ? 0xFFFFFF00ull + t : vl_rng_u64(&r);
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
static void test_encode_golden_one_hot(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof GOLDEN / sizeof GOLDEN[0]; t++) {
        const struct golden *g = &GOLDEN[t];
        if (g->i > 100000 || (uint64_t)g->rows * g->cols > 100000000) continue;
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
static void encode_compare(uint32_t rows, uint32_t cols, size_t d, int integers) {
    uint64_t seed = 1000 + d + rows;
    float *x = random_vec(d, seed);
    if (integers)
        for (size_t i = 0; i < d; i++) x[i] = (float)((int)lrintf(x[i] * 2.0f) % 4);
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
                     integers ? "integers" : "gaussian", k, (double)g.table[k], (double)c.table[k]);
    }
    compress_sketch_free(&g), compress_sketch_free(&c);
    free(mass), free(x), free(pre);
}

static void test_encode_matches_cpu(void **state) {
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
static void test_estimate_heavy_match_cpu(void **state) {
    (void)state;
    const uint32_t rows_of[] = {1, 2, 3, 4, 5, 7, 14, 15};
    for (size_t r = 0; r < sizeof rows_of / sizeof rows_of[0]; r++)
        for (size_t n = 0; n < NSIZES; n++) {
            size_t d = SIZES[n];
            uint32_t rows = rows_of[r], cols = (uint32_t)(d / 8 + 3);
            compress_sketch s;
            OK(compress_sketch_init(&s, rows, cols, 77 + d, &e_));
            float *x = random_vec(d, 9 + d);
            for (size_t i = 0; i < d; i += 97) x[i] *= 50.0f; /* heavy coordinates */
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
static float *make_vec(size_t d, int kind, uint64_t seed) {
    float *x = random_vec(d, seed);
    for (size_t i = 0; i < d; i++) {
        if (kind == 1)
            x[i] = floorf(x[i] * 2.0f) / 2.0f;
        else if (kind == 2)
            x[i] = i % 1009 == 3 ? 1e30f * x[i] : (i & 1) ? -0.0f : 0.0f;
    }
    return x;
}

static void test_topk_matches_cpu(void **state) {
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
                    fail_msg("topk d=%zu k=%zu kind %d: GPU %zu entries differ from CPU %zu", d, k,
                             kind, ng, nc);
                free(ig), free(ic);
            }
            free(x);
        }
    }
}

/* The GPU's Gaussian-k meets compress_gaussk's contract and lands near the
 * CPU's threshold. */
static void test_gaussk_contract(void **state) {
    (void)state;
    for (size_t n = 0; n < NSIZES; n++) {
        size_t d = SIZES[n];
        size_t ks[] = {1, d / 1000, d / 100, d / 10, d};
        for (int kind = 0; kind < 3; kind++) {
            float *x = make_vec(d, kind, 57 + d + (size_t)kind);
            for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
                size_t k = ks[t];
                if (k == 0) continue;
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
                    if (j) assert_true(ig[j] > ig[j - 1]);
                    sel[ig[j]] = 1;
                    assert_true(fabs((double)x[ig[j]]) >= tg);
                }
                for (size_t i = 0; i < d; i++)
                    if (!sel[i] && fabs((double)x[i]) >= tg && !(ng == m && fabs(x[i]) == tg))
                        fail_msg("gaussk d=%zu k=%zu kind %d: |x[%zu]| = %g >= thr %g left out", d,
                                 k, kind, i, fabs((double)x[i]), tg);
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

static void test_sparse_and_feedback_match_cpu(void **state) {
    (void)state;
    for (size_t n = 0; n < NSIZES; n++) {
        size_t d = SIZES[n];
        float *x = random_vec(d, 3 + d), *delta = random_vec(d, 4 + d);
        /* Values beyond F16's range and below its normal range too. */
        for (size_t i = 0; i < d; i += 7) x[i] *= i % 2 ? 1e5f : 1e-6f;
        /* Every third coordinate: ascending, and holding values of every
         * size above. */
        size_t nnz = (d + 2) / 3;
        uint32_t *idx = xcalloc(nnz, sizeof *idx);
        for (size_t j = 0; j < nnz; j++) idx[j] = (uint32_t)(3 * j);

        float *vg = xcalloc(nnz, sizeof *vg), *vc = xcalloc(nnz, sizeof *vc);
        OK(kernels_cuda_sparse_gather_host(x, d, idx, nnz, vg, &e_));
        for (size_t j = 0; j < nnz; j++) vc[j] = x[idx[j]];
        assert_memory_equal(vg, vc, nnz * sizeof *vg);

        float *dg = xcalloc(d, sizeof *dg), *dc = xcalloc(d, sizeof *dc);
        memcpy(dg, delta, d * sizeof *dg);
        memcpy(dc, delta, d * sizeof *dc);
        OK(kernels_cuda_sparse_scatter_add_host(dg, d, idx, vc, nnz, 0.3f, &e_));
        for (size_t j = 0; j < nnz; j++) dc[idx[j]] += 0.3f * vc[j];
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
static void test_sparse_rejects_bad_indices(void **state) {
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

/* ---- the cached workspace ------------------------------------------------------------ */

/* Encode from device pointers 0..3 floats past a 16-byte boundary (the
 * float4 path starts after a head taken one by one) and of lengths that
 * leave a tail, bit for bit on small integers. */
static void test_encode_unaligned_input(void **state) {
    (void)state;
    const size_t lens[] = {1, 3, 4, 5, 7, 1031, 65539};
    const uint32_t shapes[][2] = {{3, 1000}, {5, 1u << 20}};
    for (size_t s = 0; s < 2; s++)
        for (size_t n = 0; n < sizeof lens / sizeof lens[0]; n++)
            for (size_t off = 0; off < 4; off++) {
                uint32_t rows = shapes[s][0], cols = shapes[s][1];
                size_t d = lens[n], cells = (size_t)rows * cols;
                float *x = random_vec(d + off, 70 + d + off);
                for (size_t i = 0; i < d + off; i++) x[i] = (float)((int)lrintf(x[i] * 3.0f) % 5);
                compress_sketch c;
                OK(compress_sketch_init(&c, rows, cols, 5 + off, &e_));
                compress_sketch_encode(&c, x + off, d);
                float *d_x = NULL, *d_t = NULL;
                OK(kernels_cuda_alloc((void **)&d_x, (d + off) * sizeof(float), &e_));
                OK(kernels_cuda_alloc((void **)&d_t, cells * sizeof(float), &e_));
                OK(kernels_cuda_upload(d_x, x, (d + off) * sizeof(float), &e_));
                OK(kernels_cuda_zero(d_t, cells * sizeof(float), &e_));
                OK(kernels_cuda_sketch_encode(d_t, rows, cols, 5 + off, d_x + off, d, &e_));
                float *g = xcalloc(cells, sizeof *g);
                OK(kernels_cuda_download(g, d_t, cells * sizeof(float), &e_));
                for (size_t i = 0; i < cells; i++)
                    if (!(g[i] == c.table[i]))
                        fail_msg("encode %u x %u d=%zu at offset %zu: cell %zu GPU %g CPU %g", rows,
                                 cols, d, off, i, (double)g[i], (double)c.table[i]);
                kernels_cuda_free(d_x);
                kernels_cuda_free(d_t);
                compress_sketch_free(&c);
                free(g), free(x);
            }
}

static void topk_check(const float *x, size_t d, size_t k, const char *what) {
    size_t m = k < d ? k : d;
    uint32_t *ig = xcalloc(m, sizeof *ig), *ic = xcalloc(m, sizeof *ic);
    size_t ng = 0, nc = 0;
    OK(kernels_cuda_topk_host(x, d, k, ig, &ng, &e_));
    OK(compress_topk(x, d, k, ic, &nc, &e_));
    if (ng != nc || memcmp(ig, ic, nc * sizeof *ig) != 0)
        fail_msg("topk %s d=%zu k=%zu: GPU %zu entries differ from CPU %zu", what, d, k, ng, nc);
    free(ig), free(ic);
}

/* Ties at the k-th key that the top k takes only in part, spread over
 * many of the cut search's 8192-position tiles: among copied-out
 * candidates (few ties) and on the whole vector (ties everywhere). */
static void test_topk_ties_across_tiles(void **state) {
    (void)state;
    size_t d = 200003;
    float *x = random_vec(d, 91);
    for (size_t i = 0; i < d; i++)
        x[i] = i % 10 == 7 ? (i % 20 == 7 ? 1.0f : -1.0f) : 0.4f * tanhf(x[i]);
    const size_t ks[] = {1, 8191, 8192, 8193, 10000, 19999, 20000, 20001};
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) topk_check(x, d, ks[t], "few ties");
    for (size_t i = 0; i < d; i++) x[i] = i % 3 ? 2.0f : -2.0f;
    const size_t kall[] = {1, 8192, 8193, 100000, d - 1};
    for (size_t t = 0; t < sizeof kall / sizeof kall[0]; t++) topk_check(x, d, kall[t], "all tied");
    free(x);
}

/* Sizes that grow and shrink between calls reuse or replace the cached
 * workspace; released in between, it comes back. Results stay the CPU's. */
static void test_workspace_reuse(void **state) {
    (void)state;
    const size_t ds[] = {65537, 1000, ((size_t)1 << 20) + 3, 255, ((size_t)1 << 20) + 3, 7};
    /* What earlier tests left cached is not this test's. */
    kernels_cuda_compress_release();
    size_t base = kernels_cuda_mem_in_use();
    for (int round = 0; round < 2; round++)
        for (size_t n = 0; n < sizeof ds / sizeof ds[0]; n++) {
            size_t d = ds[n];
            float *x = make_vec(d, (int)(n % 3), 400 + d);
            topk_check(x, d, d / 100 + 1, "reuse");
            topk_check(x, d, d / 3 + 1, "reuse");
            size_t k = d / 50 + 1, cap = COMPRESS_GAUSSK_CAP(k);
            uint32_t *ig = xcalloc(cap, sizeof *ig);
            size_t ng = 0, ng2 = 0;
            double tg = 0, tg2 = 0;
            OK(kernels_cuda_gaussk_host(x, d, k, ig, &ng, &tg, &e_));
            /* The same call again gives the same answer. */
            uint32_t *ig2 = xcalloc(cap, sizeof *ig2);
            OK(kernels_cuda_gaussk_host(x, d, k, ig2, &ng2, &tg2, &e_));
            assert_int_equal(ng, ng2);
            assert_true(tg == tg2);
            assert_memory_equal(ig, ig2, ng * sizeof *ig);
            free(ig), free(ig2), free(x);
            if (round == 1 && n % 2 == 1) {
                kernels_cuda_compress_release();
                assert_int_equal(kernels_cuda_compress_cached(), 0);
            }
        }
    kernels_cuda_compress_release();
    assert_int_equal(kernels_cuda_compress_cached(), 0);
    assert_int_equal(kernels_cuda_mem_in_use(), base);
}

/* A refused index list leaves its flag behind; the calls after it are
 * not refused for it, and a list refused on device pointers changes
 * nothing there either. */
static void test_sparse_after_refusal(void **state) {
    (void)state;
    size_t d = 1000, nnz = 300;
    float *dst = random_vec(d, 61), *val = random_vec(nnz, 62), *want = xcalloc(d, sizeof *want);
    uint32_t *idx = xcalloc(nnz, sizeof *idx), *bad = xcalloc(nnz, sizeof *bad);
    for (size_t j = 0; j < nnz; j++) idx[j] = bad[j] = (uint32_t)(3 * j + 1);
    bad[nnz - 1] = (uint32_t)d; /* one past the end, last of the list */
    float *d_dst = NULL, *d_val = NULL;
    uint32_t *d_idx = NULL, *d_bad = NULL;
    OK(kernels_cuda_alloc((void **)&d_dst, d * sizeof(float), &e_));
    OK(kernels_cuda_alloc((void **)&d_val, nnz * sizeof(float), &e_));
    OK(kernels_cuda_alloc((void **)&d_idx, nnz * sizeof(uint32_t), &e_));
    OK(kernels_cuda_alloc((void **)&d_bad, nnz * sizeof(uint32_t), &e_));
    OK(kernels_cuda_upload(d_dst, dst, d * sizeof(float), &e_));
    OK(kernels_cuda_upload(d_val, val, nnz * sizeof(float), &e_));
    OK(kernels_cuda_upload(d_idx, idx, nnz * sizeof(uint32_t), &e_));
    OK(kernels_cuda_upload(d_bad, bad, nnz * sizeof(uint32_t), &e_));
    memcpy(want, dst, d * sizeof *want);
    vl_error err = {0};
    for (int rep = 0; rep < 3; rep++) {
        assert_int_equal(kernels_cuda_sparse_scatter_add(d_dst, d, d_bad, d_val, nnz, 2.0f, &err),
                         VL_EINVAL);
        float *got = xcalloc(d, sizeof *got);
        OK(kernels_cuda_download(got, d_dst, d * sizeof(float), &e_));
        assert_memory_equal(got, want, d * sizeof *got);
        OK(kernels_cuda_sparse_scatter_add(d_dst, d, d_idx, d_val, nnz, 2.0f, &e_));
        for (size_t j = 0; j < nnz; j++) want[idx[j]] += 2.0f * val[j];
        OK(kernels_cuda_download(got, d_dst, d * sizeof(float), &e_));
        assert_memory_equal(got, want, d * sizeof *got);
        assert_int_equal(kernels_cuda_sparse_gather(d_dst, d, d_bad, nnz, d_val, &err), VL_EINVAL);
        OK(kernels_cuda_sparse_gather(d_dst, d, d_idx, nnz, d_val, &e_));
        OK(kernels_cuda_download(val, d_val, nnz * sizeof(float), &e_));
        for (size_t j = 0; j < nnz; j++) assert_true(val[j] == want[idx[j]]);
        if (rep == 1) kernels_cuda_compress_release();
        free(got);
    }
    kernels_cuda_free(d_dst), kernels_cuda_free(d_val);
    kernels_cuda_free(d_idx), kernels_cuda_free(d_bad);
    free(dst), free(val), free(want), free(idx), free(bad);
}

/* Two threads selecting at once take turns at the workspace. */
struct topk_job {
    const float *x;
    size_t d, k;
    uint32_t *idx;
    size_t nnz;
    int rc;
};

static void *topk_thread(void *arg) {
    struct topk_job *j = arg;
    vl_error err = {0};
    for (int r = 0; r < 20 && j->rc == 0; r++)
        j->rc = kernels_cuda_topk_host(j->x, j->d, j->k, j->idx, &j->nnz, &err);
    return NULL;
}

static void test_workspace_two_threads(void **state) {
    (void)state;
    struct topk_job jobs[2];
    float *xs[2];
    pthread_t th[2];
    for (int t = 0; t < 2; t++) {
        size_t d = t ? 300007 : 65537;
        xs[t] = make_vec(d, t, 800 + (uint64_t)t);
        jobs[t] =
            (struct topk_job){xs[t], d, d / 100 + 1, xcalloc(d / 100 + 1, sizeof(uint32_t)), 0, 0};
        assert_int_equal(pthread_create(&th[t], NULL, topk_thread, &jobs[t]), 0);
    }
    for (int t = 0; t < 2; t++) {
        assert_int_equal(pthread_join(th[t], NULL), 0);
        assert_int_equal(jobs[t].rc, 0);
        uint32_t *ic = xcalloc(jobs[t].k, sizeof *ic);
        size_t nc = 0;
        OK(compress_topk(xs[t], jobs[t].d, jobs[t].k, ic, &nc, &e_));
        assert_int_equal(jobs[t].nnz, nc);
        assert_memory_equal(jobs[t].idx, ic, nc * sizeof *ic);
        free(ic), free(jobs[t].idx), free(xs[t]);
    }
}

/* ---- dCor ------------------------------------------------------------------------------ */

static void dcor_compare(int n, int p, int q, int constant_z) {
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
    if (constant_z) assert_true(vg == 0.0);
    double gmax = 0;
    for (size_t i = 0; i < (size_t)n * q; i++) gmax = fmax(gmax, fabs((double)gc[i]));
    for (size_t i = 0; i < (size_t)n * q; i++)
        if (!(fabs((double)gg[i] - (double)gc[i]) <= 1e-6 * gmax + 1e-12))
            fail_msg("dcor grad n=%d p=%d q=%d [%zu]: GPU %.9g CPU %.9g", n, p, q, i, (double)gg[i],
                     (double)gc[i]);
    free(X), free(Z), free(gg), free(gc), free(scratch);
}

static void test_dcor_matches_cpu(void **state) {
    (void)state;
    dcor_compare(2, 1, 1, 0);
    dcor_compare(3, 5, 2, 0);
    dcor_compare(17, 8, 3, 0);
    dcor_compare(130, 40, 16, 0);
    dcor_compare(300, 3, 257, 0);
    dcor_compare(64, 4, 4, 1);
}

/* ---- arguments ------------------------------------------------------------------------- */

static void test_rejects_bad_args(void **state) {
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

int main(void) {
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
        cmocka_unit_test(test_encode_unaligned_input),
        cmocka_unit_test(test_topk_ties_across_tiles),
        cmocka_unit_test(test_workspace_reuse),
        cmocka_unit_test(test_sparse_after_refusal),
        cmocka_unit_test(test_workspace_two_threads),
        cmocka_unit_test(test_dcor_matches_cpu),
        cmocka_unit_test(test_rejects_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
