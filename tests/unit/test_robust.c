/* Robust aggregation: the rules against a naive reference written here
 * (odd and even counts, ties, all-equal values, the qsort path for many
 * updates), norm clipping, update norms, a merge's updates held and
 * combined for dense, sparse (over the union of indices, equal to the rule
 * on the densified updates) and sketch updates, and the run
 * configuration's robust section. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compress/compress.h"
#include "test_util.h"
#include "coordinator/config/config.h"
#include "coordinator/base/robust.h"

/* ---- the naive reference ------------------------------------------------------ */

typedef struct ref_item {
    float v;
    size_t i;
} ref_item;

/* Bubble sort by (value, update index). */
static void ref_sort(ref_item *it, size_t k) {
    for (size_t a = 0; a < k; a++)
        for (size_t b = 0; b + 1 < k - a; b++) {
            int swap = it[b].v > it[b + 1].v || (it[b].v == it[b + 1].v && it[b].i > it[b + 1].i);
            if (swap) {
                ref_item t = it[b];
                it[b] = it[b + 1];
                it[b + 1] = t;
            }
        }
}

/* One coordinate: the rule applied to values v[0..k) with weights w. */
static double ref_coord(coord_rule rule, size_t b, const float *v, const double *w, size_t k) {
    ref_item it[64];
    for (size_t i = 0; i < k; i++) it[i] = (ref_item){v[i], i};
    size_t lo = 0, hi = k;
    switch (rule) {
    case COORD_RULE_MEDIAN:
        ref_sort(it, k);
        return k % 2 ? it[k / 2].v : ((double)it[k / 2 - 1].v + (double)it[k / 2].v) / 2;
    case COORD_RULE_TRIMMED_MEAN:
        ref_sort(it, k);
        lo = b;
        hi = k - b;
        break;
    default: break;
    }
    double s = 0, sw = 0;
    for (size_t a = lo; a < hi; a++) {
        s += w[it[a].i] * it[a].v;
        sw += w[it[a].i];
    }
    return s / sw;
}

static void expect_like_reference(coord_rule rule, double trim, float **rows, const double *w,
                                  size_t k, size_t d) {
    float *out = malloc(d * sizeof *out);
    float *col = malloc(k * sizeof *col);
    assert_non_null(out);
    assert_non_null(col);
    OK(coord_robust_combine(rule, trim, (const float *const *)rows, w, k, d, out, &e_));
    size_t b = rule == COORD_RULE_TRIMMED_MEAN ? coord_config_trim_count(trim, k) : 0;
    for (size_t j = 0; j < d; j++) {
        for (size_t i = 0; i < k; i++) col[i] = rows[i][j];
        double want = ref_coord(rule, b, col, w, k);
        assert_float_equal(out[j], want, 1e-6 * (1 + fabs(want)));
    }
    free(out);
    free(col);
}

/* ---- the rules ------------------------------------------------------------------ */

static void test_trim_count(void **state) {
    (void)state;
    assert_int_equal(coord_config_trim_count(0.2, 10), 2);
    assert_int_equal(coord_config_trim_count(0.29, 100), 29); /* 0.29 * 100 = 28.999... */
    assert_int_equal(coord_config_trim_count(0.1, 5), 0);
    assert_int_equal(coord_config_trim_count(0.49, 3), 1);
    assert_int_equal(coord_config_trim_count(0.49, 2), 0);
    assert_int_equal(coord_config_trim_count(0.4, 1), 0);
    /* Never so many that nothing is left. */
    assert_int_equal(coord_config_trim_count(0.5, 4), 1);
    assert_int_equal(coord_config_trim_count(0.9, 10), 4);
    assert_int_equal(coord_config_trim_count(0, 10), 0);
}

static void test_median_and_clip_scales(void **state) {
    (void)state;
    double odd[] = {5, 1, 3}, even[] = {4, 1, 3, 2}, one[] = {7}, tied[] = {2, 2, 1, 2};
    assert_true(coord_robust_median(odd, 3) == 3);
    assert_true(coord_robust_median(even, 4) == 2.5);
    assert_true(coord_robust_median(one, 1) == 7);
    assert_true(coord_robust_median(tied, 4) == 2);
    /* median 2.5, times 2: 5; only the 100 is above. */
    double norms[] = {1, 2, 3, 100, 0}, scale[5];
    coord_robust_clip_scales(norms, 4, 2.0, scale);
    assert_true(scale[0] == 1 && scale[1] == 1 && scale[2] == 1);
    assert_float_equal(scale[3], 0.05, 1e-12);
    /* A zero norm is never scaled; the median of {0, 1, 3} is 1. */
    double n2[] = {0, 1, 3}, s2[3];
    coord_robust_clip_scales(n2, 3, 1.0, s2);
    assert_true(s2[0] == 1 && s2[1] == 1);
    assert_float_equal(s2[2], 1.0 / 3, 1e-12);
    coord_robust_config r = {.max_norm = 2};
    assert_float_equal(coord_robust_bound_scale(&r, 8), 0.25, 1e-12);
    assert_true(coord_robust_bound_scale(&r, 2) == 1);
    r.max_norm = 0;
    assert_true(coord_robust_bound_scale(&r, 1e30) == 1);
}

/* Random values, some coordinates drawn from few levels so ties are
 * common, for counts from 1 to beyond the insertion sort's 32. */
static void test_combine_against_reference(void **state) {
    (void)state;
    static const size_t ks[] = {1, 2, 3, 4, 5, 6, 7, 10, 11, 33, 40};
    enum { D = 40 };
    vl_rng r;
    vl_rng_seed(&r, 99);
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        size_t k = ks[t];
        float **rows = malloc(k * sizeof *rows);
        double *w = malloc(k * sizeof *w);
        assert_non_null(rows);
        assert_non_null(w);
        for (size_t i = 0; i < k; i++) {
            rows[i] = malloc(D * sizeof **rows);
            assert_non_null(rows[i]);
            w[i] = 0.1 + 10 * vl_rng_uniform(&r);
            for (size_t j = 0; j < D; j++)
                rows[i][j] = j % 3 == 0 ? (float)vl_rng_below(&r, 3) - 1 : vl_rng_normal(&r);
        }
        static const coord_rule rules[] = {COORD_RULE_MEAN, COORD_RULE_TRIMMED_MEAN,
                                           COORD_RULE_MEDIAN, COORD_RULE_NORM_CLIP};
        for (size_t q = 0; q < 4; q++) {
            expect_like_reference(rules[q], 0.2, rows, w, k, D);
            expect_like_reference(rules[q], 0.34, rows, w, k, D);
        }
        for (size_t i = 0; i < k; i++) free(rows[i]);
        free(rows);
        free(w);
    }
}

/* Equal values come out exactly, whatever the rule and weights. */
static void test_combine_all_equal(void **state) {
    (void)state;
    enum { K = 6, D = 3 };
    float a[D] = {0.1f, -3.5f, 0}, *rows[K];
    double w[K] = {1, 2, 3, 4, 5, 6};
    for (int i = 0; i < K; i++) rows[i] = a;
    float out[D];
    for (coord_rule q = COORD_RULE_MEAN; q <= COORD_RULE_NORM_CLIP; q++) {
        OK(coord_robust_combine(q, 0.2, (const float *const *)rows, w, K, D, out, &e_));
        assert_memory_equal(out, a, sizeof a);
    }
}

/* By hand: values 0 1 1 2 2, cut one at each end. The cut 2 is the later
 * one (equal values in update order), so its weight 10 does not count:
 * (1 + 1 + 2) / 3. The median is the middle 1; an outlier moves neither. */
static void test_combine_by_hand(void **state) {
    (void)state;
    float v[5][1] = {{0}, {1}, {1}, {2}, {2}};
    float *rows[5] = {v[0], v[1], v[2], v[3], v[4]};
    double w[5] = {1, 1, 1, 1, 10};
    float out;
    OK(coord_robust_combine(COORD_RULE_TRIMMED_MEAN, 0.2, (const float *const *)rows, w, 5, 1, &out,
                            &e_));
    assert_float_equal(out, 4.0f / 3, 1e-6);
    OK(coord_robust_combine(COORD_RULE_MEDIAN, 0.2, (const float *const *)rows, w, 5, 1, &out,
                            &e_));
    assert_true(out == 1);
    v[4][0] = 1e30f;
    OK(coord_robust_combine(COORD_RULE_MEDIAN, 0.2, (const float *const *)rows, w, 5, 1, &out,
                            &e_));
    assert_true(out == 1);
    OK(coord_robust_combine(COORD_RULE_TRIMMED_MEAN, 0.2, (const float *const *)rows, w, 5, 1, &out,
                            &e_));
    assert_float_equal(out, 4.0f / 3, 1e-6);
    /* Even count: the mean of the two middle values. */
    OK(coord_robust_combine(COORD_RULE_MEDIAN, 0.2, (const float *const *)rows, w, 4, 1, &out,
                            &e_));
    assert_true(out == 1);
    v[2][0] = 2;
    OK(coord_robust_combine(COORD_RULE_MEDIAN, 0.2, (const float *const *)rows, w, 4, 1, &out,
                            &e_));
    assert_true(out == 1.5f);
    vl_error e = {0};
    assert_int_equal(
        coord_robust_combine(COORD_RULE_MEDIAN, 0.2, (const float *const *)rows, w, 0, 1, &out, &e),
        VL_EINVAL);
}

/* ---- updates --------------------------------------------------------------------- */

static compress_update_meta meta_of(compress_kind kind) {
    return (compress_update_meta){.run = "r",
                                  .task = 1,
                                  .peer = 1,
                                  .kind = kind,
                                  .num_samples = 1,
                                  .local_steps = 1,
                                  .loss = 1.0};
}

/* Encodes and decodes; the decoded update points into *b. */
static void dense_update(const float *x, size_t n, st_dtype dt, vl_buf *b, compress_update *u) {
    compress_update_meta m = meta_of(COMPRESS_DENSE);
    vl_buf_init(b, 0);
    OK(compress_update_encode_dense(&m, x, n, dt, b, &e_));
    OK(compress_update_decode(b->data, b->len, n, u, NULL, &e_));
}

static void topk_update(const uint32_t *idx, const float *v, size_t nnz, size_t n, vl_buf *b,
                        compress_update *u) {
    compress_update_meta m = meta_of(COMPRESS_TOPK);
    vl_buf_init(b, 0);
    OK(compress_update_encode_topk(&m, idx, v, nnz, ST_F32, b, &e_));
    OK(compress_update_decode(b->data, b->len, n, u, NULL, &e_));
}

static void test_update_norm_and_values(void **state) {
    (void)state;
    enum { N = 300 };
    float *x = random_vec(N, 5);
    double ss = 0;
    for (int i = 0; i < N; i++) ss += (double)x[i] * x[i];
    vl_buf b;
    compress_update u;
    dense_update(x, N, ST_F32, &b, &u);
    assert_int_equal(compress_update_count(&u), N);
    assert_float_equal(compress_update_norm(&u), sqrt(ss), 1e-9 * sqrt(ss));
    float back[N];
    compress_update_values(&u, NULL, back);
    assert_memory_equal(back, x, sizeof back);
    compress_update_free(&u);
    vl_buf_free(&b);
    /* F16: the norm of the values as stored. */
    dense_update(x, N, ST_F16, &b, &u);
    compress_update_values(&u, NULL, back);
    double s16 = 0;
    for (int i = 0; i < N; i++) {
        assert_true(back[i] == vl_f16_to_f32(vl_f32_to_f16(x[i])));
        s16 += (double)back[i] * back[i];
    }
    assert_float_equal(compress_update_norm(&u), sqrt(s16), 1e-9 * sqrt(s16));
    compress_update_free(&u);
    vl_buf_free(&b);
    /* topk: the norm of the values sent, indices as sent. */
    uint32_t idx[3] = {2, 50, 299}, got_i[3];
    float v[3] = {3, -4, 12}, got_v[3];
    topk_update(idx, v, 3, N, &b, &u);
    assert_float_equal(compress_update_norm(&u), 13, 1e-12);
    compress_update_values(&u, got_i, got_v);
    assert_memory_equal(got_i, idx, sizeof idx);
    assert_memory_equal(got_v, v, sizeof v);
    compress_update_free(&u);
    vl_buf_free(&b);
    /* A sketch: the table's Frobenius norm over sqrt(rows). */
    compress_sketch s;
    OK(compress_sketch_init(&s, 4, 64, 9, &e_));
    compress_sketch_encode(&s, x, N);
    double ts = 0;
    for (int c = 0; c < 4 * 64; c++) ts += (double)s.table[c] * s.table[c];
    compress_update_meta m = meta_of(COMPRESS_SKETCH);
    vl_buf_init(&b, 0);
    OK(compress_update_encode_sketch(&m, &s, ST_F32, &b, &e_));
    OK(compress_update_decode(b.data, b.len, N, &u, NULL, &e_));
    assert_int_equal(compress_update_count(&u), 4 * 64);
    assert_float_equal(compress_update_norm(&u), sqrt(ts / 4), 1e-9 * sqrt(ts));
    compress_update_free(&u);
    vl_buf_free(&b);
    compress_sketch_free(&s);
    free(x);
}

/* Dense updates held and combined equal the rule on the raw vectors; one
 * over max_norm is scaled down to it first. */
static void test_acc_dense(void **state) {
    (void)state;
    enum { K = 5, N = 64 };
    float *x[K];
    double w[K] = {1, 2, 3, 1, 1}, norms[K];
    for (int i = 0; i < K; i++) {
        x[i] = random_vec(N, 100 + (uint64_t)i);
        double ss = 0;
        for (int j = 0; j < N; j++) ss += (double)x[i][j] * x[i][j];
        norms[i] = sqrt(ss);
    }
    for (int j = 0; j < N; j++) x[4][j] *= 100; /* the attacker */
    norms[4] *= 100;
    float got[N];
    for (coord_rule q = COORD_RULE_MEAN; q <= COORD_RULE_NORM_CLIP; q++) {
        coord_robust_config cfg = {.rule = q, .trim = 0.2, .clip_mult = 1.5};
        coord_robust_acc a;
        coord_robust_acc_init(&a, &cfg, COMPRESS_DENSE, N);
        vl_buf b[K];
        compress_update u[K];
        for (int i = 0; i < K; i++) {
            dense_update(x[i], N, ST_F32, &b[i], &u[i]);
            OK(coord_robust_acc_add(&a, &u[i], w[i], compress_update_norm(&u[i]), &e_));
            compress_update_free(&u[i]);
            vl_buf_free(&b[i]);
        }
        OK(coord_robust_acc_finish(&a, got, &e_));
        /* The reference: clip by hand for norm_clip, then the rule. */
        float *rows[K], clipped[N];
        for (int i = 0; i < K; i++) rows[i] = x[i];
        if (q == COORD_RULE_NORM_CLIP) {
            double sorted[K];
            memcpy(sorted, norms, sizeof sorted);
            double bound = 1.5 * coord_robust_median(sorted, K);
            for (int j = 0; j < N; j++) clipped[j] = (float)(x[4][j] * (bound / norms[4]));
            rows[4] = clipped;
            assert_int_equal(a.clipped, 1);
        }
        float want[N];
        OK(coord_robust_combine(q, 0.2, (const float *const *)rows, w, K, N, want, &e_));
        for (int j = 0; j < N; j++)
            assert_float_equal(got[j], want[j], 1e-5 * (1 + fabsf(want[j])));
        coord_robust_acc_free(&a);
    }
    /* max_norm: the attacker scaled to the bound, its direction kept. */
    coord_robust_config cfg = {.rule = COORD_RULE_MEDIAN, .max_norm = 2.0};
    coord_robust_acc a;
    coord_robust_acc_init(&a, &cfg, COMPRESS_DENSE, N);
    vl_buf b;
    compress_update u;
    dense_update(x[4], N, ST_F32, &b, &u);
    OK(coord_robust_acc_add(&a, &u, 1, compress_update_norm(&u), &e_));
    assert_int_equal(a.bounded, 1);
    assert_float_equal(a.norm[0], 2.0, 1e-9);
    for (int j = 0; j < N; j++) assert_float_equal(a.vals[0][j], x[4][j] * (2.0 / norms[4]), 1e-5);
    /* Nor does a dense update of another size. */
    vl_buf b2;
    compress_update u2;
    dense_update(x[0], N - 1, ST_F32, &b2, &u2);
    vl_error e2 = {0};
    assert_int_equal(coord_robust_acc_add(&a, &u2, 1, 1, &e2), VL_EINVAL);
    compress_update_free(&u2);
    vl_buf_free(&b2);
    /* A sketch does not join dense updates. */
    compress_update_meta m = meta_of(COMPRESS_SKETCH);
    compress_update other = {.meta = m};
    vl_error e = {0};
    assert_int_equal(coord_robust_acc_add(&a, &other, 1, 1, &e), VL_EINVAL);
    compress_update_free(&u);
    vl_buf_free(&b);
    coord_robust_acc_free(&a);
    coord_robust_acc_init(&a, &cfg, COMPRESS_DENSE, N);
    assert_int_equal(coord_robust_acc_finish(&a, got, &e), VL_EINVAL);
    for (int i = 0; i < K; i++) free(x[i]);
}

/* Sparse updates over the union of their indices give what the rule gives
 * on the same updates written out densely, zeros elsewhere. */
static void test_acc_sparse_union(void **state) {
    (void)state;
    enum { K = 5, N = 40 };
    static const uint32_t idx[K][4] = {
        {1, 5, 9, 30}, {5, 9, 11, 39}, {0, 5, 30, 31}, {5, 9, 30, 39}, {2, 5, 12, 30}};
    static const size_t nnz[K] = {4, 4, 4, 4, 2};
    float val[K][4];
    vl_rng r;
    vl_rng_seed(&r, 3);
    float dense[K][N];
    memset(dense, 0, sizeof dense);
    for (int i = 0; i < K; i++)
        for (size_t t = 0; t < nnz[i]; t++) {
            val[i][t] = vl_rng_normal(&r);
            dense[i][idx[i][t]] = val[i][t];
        }
    double w[K] = {2, 1, 1, 3, 1};
    for (coord_rule q = COORD_RULE_MEAN; q <= COORD_RULE_NORM_CLIP; q++) {
        coord_robust_config cfg = {.rule = q, .trim = 0.2, .clip_mult = 1.0};
        coord_robust_acc a;
        coord_robust_acc_init(&a, &cfg, COMPRESS_TOPK, N);
        float *rows[K];
        double norms[K];
        for (int i = 0; i < K; i++) {
            vl_buf b;
            compress_update u;
            topk_update(idx[i], val[i], nnz[i], N, &b, &u);
            norms[i] = compress_update_norm(&u);
            OK(coord_robust_acc_add(&a, &u, w[i], norms[i], &e_));
            compress_update_free(&u);
            vl_buf_free(&b);
            rows[i] = dense[i];
        }
        float got[N], want[N], clipped[K][N];
        for (int j = 0; j < N; j++) got[j] = 99; /* finish writes every coordinate */
        OK(coord_robust_acc_finish(&a, got, &e_));
        assert_int_equal(a.union_n, 9); /* 0 1 2 5 9 11 30 31 39 */
        if (q == COORD_RULE_NORM_CLIP) {
            double scale[K];
            coord_robust_clip_scales(norms, K, 1.0, scale);
            for (int i = 0; i < K; i++) {
                for (int j = 0; j < N; j++) clipped[i][j] = (float)(dense[i][j] * scale[i]);
                rows[i] = clipped[i];
            }
        }
        OK(coord_robust_combine(q, 0.2, (const float *const *)rows, w, K, N, want, &e_));
        for (int j = 0; j < N; j++) assert_float_equal(got[j], want[j], 1e-6);
        /* Index 5, sent by all, survives the median; 1, sent by one, not. */
        if (q == COORD_RULE_MEDIAN) {
            assert_true(got[1] == 0);
            assert_true(got[5] != 0);
        }
        coord_robust_acc_free(&a);
    }
}

/* Sketches are combined cell by cell. */
static void test_acc_sketch(void **state) {
    (void)state;
    enum { K = 4, N = 500, ROWS = 3, COLS = 50 };
    compress_sketch s[K];
    float *rows[K];
    double w[K] = {1, 1, 2, 1};
    for (int i = 0; i < K; i++) {
        float *x = random_vec(N, 40 + (uint64_t)i);
        OK(compress_sketch_init(&s[i], ROWS, COLS, 7, &e_));
        compress_sketch_encode(&s[i], x, N);
        rows[i] = s[i].table;
        free(x);
    }
    for (coord_rule q = COORD_RULE_MEAN; q <= COORD_RULE_MEDIAN; q++) {
        coord_robust_config cfg = {.rule = q, .trim = 0.25};
        coord_robust_acc a;
        coord_robust_acc_init(&a, &cfg, COMPRESS_SKETCH, ROWS * COLS);
        for (int i = 0; i < K; i++) {
            compress_update_meta m = meta_of(COMPRESS_SKETCH);
            vl_buf b;
            vl_buf_init(&b, 0);
            OK(compress_update_encode_sketch(&m, &s[i], ST_F32, &b, &e_));
            compress_update u;
            OK(compress_update_decode(b.data, b.len, N, &u, NULL, &e_));
            OK(coord_robust_acc_add(&a, &u, w[i], compress_update_norm(&u), &e_));
            compress_update_free(&u);
            vl_buf_free(&b);
        }
        float got[ROWS * COLS];
        OK(coord_robust_acc_finish(&a, got, &e_));
        expect_like_reference(q, 0.25, rows, w, K, ROWS * COLS);
        float want[ROWS * COLS];
        OK(coord_robust_combine(q, 0.25, (const float *const *)rows, w, K, ROWS * COLS, want, &e_));
        assert_memory_equal(got, want, sizeof got);
        coord_robust_acc_free(&a);
    }
    for (int i = 0; i < K; i++) compress_sketch_free(&s[i]);
}

/* ---- configuration ---------------------------------------------------------------- */

/* extra: more fields, each followed by a comma; without it the run has 10
 * updates per version. */
static int parse(const char *robust, const char *extra, coord_config *cfg, vl_error *e) {
    char json[1024];
    snprintf(json, sizeof json, "{\"name\": \"d\", \"corpus\": \"c\", %s \"robust\": %s}",
             extra ? extra : "\"updates_per_version\": 10,", robust);
    memset(e, 0, sizeof *e);
    return coord_config_parse(json, strlen(json), cfg, e);
}

static void expect_error(const char *robust, const char *extra, const char *needle) {
    coord_config cfg;
    vl_error e;
    assert_int_equal(parse(robust, extra, &cfg, &e), VL_EINVAL);
    if (!strstr(e.msg, needle)) fprintf(stderr, "message: %s (wanted '%s')\n", e.msg, needle);
    assert_non_null(strstr(e.msg, needle));
}

static void test_config(void **state) {
    (void)state;
    coord_config cfg, again;
    vl_error e;
    assert_int_equal(parse("{}", NULL, &cfg, &e), VL_OK);
    assert_int_equal(cfg.robust.rule, COORD_RULE_MEAN);
    assert_true(cfg.robust.trim == 0.2 && cfg.robust.clip_mult == 2.0);
    assert_true(cfg.robust.max_norm == 0 && !cfg.robust.refuse_excess);
    assert_int_equal(coord_config_max_samples(&cfg), 10 * 8 * 64);
    static const char *const ok[] = {
        "{\"rule\": \"trimmed_mean\", \"trim\": 0.1}",
        "{\"rule\": \"median\", \"max_norm\": 5, \"on_excess\": \"refuse\"}",
        "{\"rule\": \"norm_clip\", \"clip_mult\": 3, \"max_norm\": 0.5, \"on_excess\": \"clip\"}",
        "{\"rule\": \"mean\", \"max_norm\": 1e3}"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(parse(ok[i], NULL, &cfg, &e), VL_OK);
        char *json = coord_config_to_json(&cfg, 1);
        assert_non_null(json);
        memset(&e, 0, sizeof e);
        assert_int_equal(coord_config_parse(json, strlen(json), &again, &e), VL_OK);
        assert_memory_equal(&cfg.robust, &again.robust, sizeof cfg.robust);
        free(json);
    }
    assert_int_equal(parse(ok[1], NULL, &cfg, &e), VL_OK);
    assert_int_equal(cfg.robust.rule, COORD_RULE_MEDIAN);
    assert_true(cfg.robust.max_norm == 5 && cfg.robust.refuse_excess);
    assert_string_equal(coord_rule_name(COORD_RULE_NORM_CLIP), "norm_clip");

    expect_error("{\"rule\": \"krum\"}", NULL, "robust.rule must be one of");
    expect_error("{\"trim\": 0.5}", NULL, "robust.trim");
    expect_error("{\"trim\": 0}", NULL, "robust.trim");
    expect_error("{\"clip_mult\": 0}", NULL, "robust.clip_mult");
    expect_error("{\"max_norm\": -1}", NULL, "robust.max_norm");
    expect_error("{\"on_excess\": \"ignore\"}", NULL, "robust.on_excess");
    expect_error("{\"quorum\": 3}", NULL, "'robust.quorum'");
    expect_error("[]", NULL, "robust must be an object");
    /* Trimming that cuts nothing of 10 updates, or a median of two. */
    expect_error("{\"rule\": \"trimmed_mean\", \"trim\": 0.05}", NULL, "cuts nothing");
    expect_error("{\"rule\": \"median\"}", "\"updates_per_version\": 2,", "median");
    /* Rules cannot be applied to the summed values of a second round. */
    expect_error("{\"rule\": \"median\"}",
                 "\"compression\": {\"kind\": \"sketch\", \"cols\": 100, \"second_round\": 2},",
                 "second_round");
    /* A rule holds every update of a version: refused beyond the cap. */
    expect_error("{\"rule\": \"median\"}", "\"updates_per_version\": 100000,", "in memory");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trim_count),
        cmocka_unit_test(test_median_and_clip_scales),
        cmocka_unit_test(test_combine_against_reference),
        cmocka_unit_test(test_combine_all_equal),
        cmocka_unit_test(test_combine_by_hand),
        cmocka_unit_test(test_update_norm_and_values),
        cmocka_unit_test(test_acc_dense),
        cmocka_unit_test(test_acc_sparse_union),
        cmocka_unit_test(test_acc_sketch),
        cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
