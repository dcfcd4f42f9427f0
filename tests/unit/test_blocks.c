/* Block top-k and decaying error feedback: each slice's entries equal a
 * sorting reference's top of that slice, with the slices and shares
 * computed here from the rule compress.h states; the shares always sum to
 * k and reach every slice; one slice is exactly compress_topk; the
 * threaded path equals the serial one; decayed feedback is b*e + delta bit for bit, and sent + residual still
 * equals that input exactly. */
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

/* Top m of x[lo, lo + n) by |x|, ties to the lower index, ascending. */
static void ref_slice(const float *x, size_t lo, size_t n, size_t m, uint32_t *out) {
    ref_pair *p = malloc((n ? n : 1) * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) {
        p[i].mag = fabsf(x[lo + i]);
        p[i].idx = (uint32_t)(lo + i);
    }
    qsort(p, n, sizeof *p, by_mag_desc_idx_asc);
    for (size_t j = 0; j < m; j++) out[j] = p[j].idx;
    qsort(out, m, sizeof *out, by_u32);
    free(p);
}

/* The whole expected answer, slices and shares from the stated rule:
 * nb = min(ceil(d/block), k) when d >= k + nb, else one slice. */
static size_t ref_blocks(const float *x, size_t d, size_t k, size_t block, uint32_t *out) {
    size_t m = k < d ? k : d;
    size_t nb = 1;
    if (block > 0 && block < d) {
        nb = (d + block - 1) / block;
        if (nb > k) nb = k;
        if (d < k + nb) nb = 1;
    }
    size_t at = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = d * b / nb, hi = d * (b + 1) / nb;
        size_t share = nb == 1 ? m : k * (b + 1) / nb - k * b / nb;
        assert_true(share <= hi - lo);
        if (nb > 1) assert_true(share >= 1);
        ref_slice(x, lo, hi - lo, share, out + at);
        at += share;
    }
    assert_int_equal(at, m);
    return m;
}

static void check_blocks(const float *x, size_t d, size_t k, size_t block) {
    size_t m = k < d ? k : d;
    uint32_t *got = malloc((m ? m : 1) * sizeof *got), *want = malloc((m ? m : 1) * sizeof *want);
    assert_non_null(got);
    assert_non_null(want);
    size_t wn = ref_blocks(x, d, k, block, want), nnz = 12345;
    OK(compress_topk_blocks(x, d, k, block, got, &nnz, &e_));
    if (nnz != wn) fail_msg("d=%zu k=%zu block=%zu: nnz %zu, want %zu", d, k, block, nnz, wn);
    for (size_t j = 0; j < wn; j++) {
        if (got[j] != want[j])
            fail_msg("d=%zu k=%zu block=%zu: idx[%zu] = %u, want %u", d, k, block, j, got[j],
                     want[j]);
        if (j > 0 && got[j] <= got[j - 1])
            fail_msg("d=%zu k=%zu block=%zu: not ascending at %zu", d, k, block, j);
    }
    free(got);
    free(want);
}

static void test_blocks_against_reference(void **state) {
    (void)state;
    static const size_t ds[] = {1, 2, 7, 64, 100, 1000, 4099, 20011};
    static const size_t blocks[] = {0, 1, 3, 16, 100, 512, 4096, 1u << 20};
    for (size_t a = 0; a < sizeof ds / sizeof *ds; a++) {
        size_t d = ds[a];
        float *x = random_vec(d, 300 + a);
        size_t ks[] = {1, 2, 3, d / 100, d / 10, d / 3, d - 1, d, d + 5};
        for (size_t b = 0; b < sizeof ks / sizeof *ks; b++)
            for (size_t c = 0; c < sizeof blocks / sizeof *blocks; c++)
                check_blocks(x, d, ks[b], blocks[c]);
        free(x);
    }
}

/* Shares above the short-list path's 32 go through the radix select. */
static void test_blocks_large_shares(void **state) {
    (void)state;
    size_t d = 100003;
    float *x = random_vec(d, 311);
    check_blocks(x, d, 5000, 10000);       /* 11 slices, about 454 each */
    check_blocks(x, d, 33 * 7, d / 7 + 1); /* exactly 33 per slice */
    check_blocks(x, d, 32 * 7, d / 7 + 1); /* exactly 32: the short list */
    free(x);
}

/* Ties and zeros: within each slice the lowest indices win. */
static void test_blocks_ties(void **state) {
    (void)state;
    size_t d = 10007;
    float *x = calloc(d, sizeof *x);
    assert_non_null(x);
    check_blocks(x, d, 100, 512);
    vl_rng r;
    vl_rng_seed(&r, 9);
    static const float vals[3] = {-1.0f, 0.0f, 1.0f};
    for (size_t i = 0; i < d; i++) x[i] = vals[vl_rng_below(&r, 3)];
    check_blocks(x, d, 100, 512);
    check_blocks(x, d, 1000, 64);
    free(x);
}

/* Every slice moves: with k spread over d/512 slices no slice is left
 * out, even when one holds all the large values. */
static void test_blocks_reach_every_slice(void **state) {
    (void)state;
    size_t d = 437760, k = 2918, block = 512;
    float *x = random_vec(d, 321);
    for (size_t i = 0; i < 4096; i++) x[i] *= 1000.0f;
    uint32_t *idx = malloc(k * sizeof *idx);
    assert_non_null(idx);
    size_t nnz = 0;
    OK(compress_topk_blocks(x, d, k, block, idx, &nnz, &e_));
    assert_int_equal(nnz, k);
    size_t nb = compress_blocks_count(d, k, block);
    assert_int_equal(nb, (d + block - 1) / block);
    size_t j = 0, in_head = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t lo, len, share, at;
        compress_blocks_span(d, k, nb, b, &lo, &len, &share, &at);
        assert_int_equal(at, j);
        size_t got = 0;
        while (j < nnz && idx[j] < lo + len) {
            assert_true(idx[j] >= lo);
            got++, j++;
        }
        assert_int_equal(got, share);
        assert_true(got >= 1);
    }
    for (size_t q = 0; q < nnz; q++) in_head += idx[q] < 4096;
    /* A global top-k would have spent all of k on the first 4096. */
    size_t g = 0;
    OK(compress_topk(x, d, k, idx, &g, &e_));
    assert_int_equal(idx[g - 1] < 4096, 1);
    assert_true(in_head < 40);
    free(x);
    free(idx);
}

static void test_blocks_threaded(void **state) {
    (void)state;
    size_t d = ((size_t)1 << 20) + 77, k = d / 100;
    float *x = random_vec(d, 331);
    uint32_t *a = malloc(k * sizeof *a), *b = malloc(k * sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    size_t na = 0, nb = 0;
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    OK(compress_topk_blocks(x, d, k, 512, a, &na, &e_));
    omp_set_num_threads(4);
    OK(compress_topk_blocks(x, d, k, 512, b, &nb, &e_));
    omp_set_num_threads(nt);
    assert_int_equal(na, k);
    assert_int_equal(nb, k);
    assert_memory_equal(a, b, k * sizeof *a);
    check_blocks(x, d, k, 512);
    free(x);
    free(a);
    free(b);
}

static void test_blocks_arguments(void **state) {
    (void)state;
    uint32_t idx[4];
    size_t nnz = 7;
    OK(compress_topk_blocks(NULL, 0, 3, 16, idx, &nnz, &e_));
    assert_int_equal(nnz, 0);
    float x[4] = {1, -2, 3, -4};
    OK(compress_topk_blocks(x, 4, 0, 2, idx, &nnz, &e_));
    assert_int_equal(nnz, 0);
    vl_error e = {0};
    nnz = 7;
    assert_int_equal(compress_topk_blocks(x, (size_t)UINT32_MAX + 2, 3, 16, idx, &nnz, &e),
                     VL_EINVAL);
    assert_int_equal(nnz, 0);
    assert_int_equal(compress_blocks_count(0, 5, 16), 0);
    assert_int_equal(compress_blocks_count(100, 0, 16), 0);
    assert_int_equal(compress_blocks_count(100, 5, 0), 1);
    assert_int_equal(compress_blocks_count(100, 5, 100), 1);
    assert_int_equal(compress_blocks_count(100, 5, 10), 5); /* capped at k */
    assert_int_equal(compress_blocks_count(100, 3, 40), 3);
    assert_int_equal(compress_blocks_count(100, 96, 10), 1); /* 100 < 96 + 10 */
}

/* ---- decaying error feedback ----------------------------------------------- */

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void run_decay(float decay, st_dtype dt) {
    size_t d = 20011, k = 200;
    float *e = calloc(d, sizeof *e), *input = malloc(d * sizeof *input);
    uint32_t *idx = malloc(k * sizeof *idx);
    float *val = malloc(k * sizeof *val);
    assert_non_null(e);
    assert_non_null(input);
    assert_non_null(idx);
    assert_non_null(val);
    for (int round = 0; round < 10; round++) {
        float *delta = random_vec(d, 400 + (uint64_t)round);
        for (size_t i = 0; i < d; i++) input[i] = decay * e[i] + delta[i];
        compress_feedback_add(e, delta, d, decay);
        for (size_t i = 0; i < d; i++)
            if (bits_of(e[i]) != bits_of(input[i]))
                fail_msg("decay %g round %d coord %zu: %a, want %a", decay, round, i, e[i],
                         input[i]);
        size_t nnz = 0;
        OK(compress_topk_blocks(e, d, k, 256, idx, &nnz, &e_));
        compress_feedback_take(e, idx, nnz, dt, val);
        for (size_t j = 0; j < nnz; j++)
            assert_true(bits_of(val[j] + e[idx[j]]) == bits_of(input[idx[j]]));
        free(delta);
    }
    free(e);
    free(input);
    free(idx);
    free(val);
}

static void test_feedback_decay(void **state) {
    (void)state;
    run_decay(0.9f, ST_F32);
    run_decay(0.9f, ST_F16);
    run_decay(0.5f, ST_F32);
    /* A coordinate never sent fades geometrically. */
    float e[3] = {8.0f, -4.0f, 1.0f}, zero[3] = {0};
    for (int r = 0; r < 3; r++) compress_feedback_add(e, zero, 3, 0.5f);
    assert_true(e[0] == 1.0f && e[1] == -0.5f && e[2] == 0.125f);
}

/* Large vectors take the threaded path; it must agree element for element. */
static void test_feedback_decay_large(void **state) {
    (void)state;
    size_t d = ((size_t)1 << 20) + 3;
    float *e = random_vec(d, 61), *delta = random_vec(d, 62);
    float *want = malloc(d * sizeof *want);
    assert_non_null(want);
    for (size_t i = 0; i < d; i++) want[i] = 0.9f * e[i] + delta[i];
    compress_feedback_add(e, delta, d, 0.9f);
    assert_memory_equal(e, want, d * sizeof *e);
    free(e);
    free(delta);
    free(want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_against_reference),
        cmocka_unit_test(test_blocks_large_shares),
        cmocka_unit_test(test_blocks_ties),
        cmocka_unit_test(test_blocks_reach_every_slice),
        cmocka_unit_test(test_blocks_threaded),
        cmocka_unit_test(test_blocks_arguments),
        cmocka_unit_test(test_feedback_decay),
        cmocka_unit_test(test_feedback_decay_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
