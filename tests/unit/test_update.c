/* Sparse (topk) and sketch updates: round trips in F32 and F16, every
 * way an update can be wrong refused with the status class and the error
 * code the coordinator answers with, and a norm that does not depend on
 * where the body lies. */
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

#define N 5003

static compress_update_meta meta(compress_kind kind) {
    compress_update_meta m;
    memset(&m, 0, sizeof m);
    snprintf(m.run, sizeof m.run, "demo");
    m.task = 9;
    m.peer = 4;
    m.base_version = 2;
    m.kind = kind;
    m.num_samples = 512;
    m.local_steps = 20;
    m.loss = 1.75;
    return m;
}

/* Decodes and returns the status class, leaving the error code in *code. */
static int decode(const vl_buf *b, size_t n, const char **code) {
    compress_update u;
    vl_error e = {0};
    int rc = compress_update_decode(b->data, b->len, n, &u, code, &e);
    if (rc == VL_OK)
        compress_update_free(&u);
    else
        assert_true(e.msg[0] != '\0');
    return rc;
}

static void test_topk_round_trip(void **state) {
    (void)state;
    uint32_t idx[] = {0, 3, 17, 1000, N - 1};
    float val[] = {0.5f, -0.25f, 8.0f, -1.0f, 0.125f};
    for (int dt = 0; dt < 2; dt++) {
        vl_buf b;
        vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
        compress_update_meta m = meta(COMPRESS_TOPK);
        OK(compress_update_encode_topk(&m, idx, val, 5, dt ? ST_F16 : ST_F32, &b, &e_));
        compress_update u;
        const char *code = "x";
        OK(compress_update_decode(b.data, b.len, N, &u, &code, &e_));
        assert_null(code);
        assert_int_equal(u.meta.kind, COMPRESS_TOPK);
        assert_int_equal(u.nnz, 5);
        float acc[N];
        memset(acc, 0, sizeof acc);
        OK(compress_update_accumulate(&u, 2.0f, acc, N, &e_));
        for (size_t j = 0; j < 5; j++) assert_true(acc[idx[j]] == 2.0f * val[j]);
        assert_true(acc[1] == 0.0f && acc[N - 2] == 0.0f);
        compress_spec spec = {.kind = COMPRESS_TOPK, .max_nnz = 5};
        OK(compress_update_check_spec(&u, &spec, &code, &e_));
        spec.max_nnz = 4;
        vl_error e = {0};
        assert_int_equal(compress_update_check_spec(&u, &spec, &code, &e), VL_ERANGE);
        assert_string_equal(code, "too_many_entries");
        spec.kind = COMPRESS_SKETCH;
        assert_int_equal(compress_update_check_spec(&u, &spec, &code, &e), VL_ERANGE);
        assert_string_equal(code, "wrong_kind");
        /* A sparse update cannot be added to a sketch. */
        compress_sketch s;
        OK(compress_sketch_init(&s, 3, 64, 1, &e_));
        assert_int_equal(compress_update_accumulate_sketch(&u, 1.0f, &s, &e), VL_EINVAL);
        compress_sketch_free(&s);
        compress_update_free(&u);
        vl_buf_free(&b);
    }
}

/* Hand-built topk updates with indices the encoder would refuse. */
static void build_topk(vl_buf *b, const uint32_t *idx, size_t n_idx, const float *val, size_t n_val,
                       st_dtype idx_dtype) {
    compress_update_meta m = meta(COMPRESS_TOPK);
    st_writer w;
    st_writer_init(&w);
    const char *keys[] = {"run",  "task",        "peer",        "base_version",
                          "kind", "num_samples", "local_steps", "loss"};
    const char *vals[] = {m.run, "9", "4", "2", "topk", "512", "20", "1.75"};
    for (int i = 0; i < 8; i++) assert_int_equal(st_writer_meta(&w, keys[i], vals[i]), VL_OK);
    uint64_t s1[1] = {n_idx}, s2[1] = {n_val};
    assert_int_equal(st_writer_add(&w, "indices", idx_dtype, 1, s1, idx, n_idx * 4), VL_OK);
    assert_int_equal(st_writer_add(&w, "values", ST_F32, 1, s2, val, n_val * 4), VL_OK);
    vl_buf_init(b, VL_BUF_DEFAULT_CAP);
    OK(st_writer_finish(&w, b, &e_));
    st_writer_free(&w);
}

static void test_topk_bad_indices_and_values(void **state) {
    (void)state;
    float val[4] = {1, 2, 3, 4};
    struct {
        uint32_t idx[4];
        const char *code;
    } cases[] = {
        {{1, 2, 3, N}, "bad_indices"},                                          /* out of range */
        {{1, 2, 3, 0xFFFFFFFFu}, "bad_indices"}, {{1, 3, 2, 4}, "bad_indices"}, /* not ascending */
        {{1, 2, 2, 4}, "bad_indices"},                                          /* duplicated */
        {{5, 0, 1, 2}, "bad_indices"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        vl_buf b;
        build_topk(&b, cases[c].idx, 4, val, 4, ST_U32);
        const char *code = NULL;
        assert_int_equal(decode(&b, N, &code), VL_ERANGE);
        assert_string_equal(code, cases[c].code);
        vl_buf_free(&b);
    }
    uint32_t good[4] = {1, 2, 3, 4};
    float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        float v[4] = {1, 2, 3, 4};
        v[k + 1] = bad[k];
        vl_buf b;
        build_topk(&b, good, 4, v, 4, ST_U32);
        const char *code = NULL;
        assert_int_equal(decode(&b, N, &code), VL_ERANGE);
        assert_string_equal(code, "non_finite");
        vl_buf_free(&b);
    }
    /* Mismatched lengths, a signed index type and more entries than the
     * model has parameters are shape errors. */
    vl_buf b;
    const char *code = NULL;
    build_topk(&b, good, 4, val, 3, ST_U32);
    assert_int_equal(decode(&b, N, &code), VL_ERANGE);
    assert_string_equal(code, "bad_shape");
    vl_buf_free(&b);
    build_topk(&b, good, 4, val, 4, ST_I32);
    assert_int_equal(decode(&b, N, &code), VL_ERANGE);
    assert_string_equal(code, "bad_shape");
    vl_buf_free(&b);
    build_topk(&b, good, 4, val, 4, ST_U32);
    assert_int_equal(decode(&b, 3, &code), VL_ERANGE);
    assert_string_equal(code, "bad_shape");
    vl_buf_free(&b);
    /* The encoder refuses what the decoder would. */
    uint32_t desc[2] = {5, 1};
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    compress_update_meta m = meta(COMPRESS_TOPK);
    vl_error e = {0};
    assert_int_equal(compress_update_encode_topk(&m, desc, val, 2, ST_F32, &b, &e), VL_EINVAL);
    assert_false(compress_indices_valid(desc, 2, N));
    assert_true(compress_indices_valid(good, 4, 5));
    assert_false(compress_indices_valid(good, 4, 4));
    vl_buf_free(&b);
}

static void test_sketch_round_trip_and_spec(void **state) {
    (void)state;
    compress_sketch s, acc;
    OK(compress_sketch_init(&s, 5, 101, 77, &e_));
    OK(compress_sketch_init(&acc, 5, 101, 77, &e_));
    float x[N];
    for (size_t i = 0; i < N; i++) x[i] = (float)((int)(i % 9) - 4) * 0.25f;
    compress_sketch_encode(&s, x, N);
    for (int dt = 0; dt < 2; dt++) {
        vl_buf b;
        vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
        compress_update_meta m = meta(COMPRESS_SKETCH);
        OK(compress_update_encode_sketch(&m, &s, dt ? ST_F16 : ST_F32, &b, &e_));
        compress_update u;
        OK(compress_update_decode(b.data, b.len, N, &u, NULL, &e_));
        assert_int_equal(u.rows, 5);
        assert_int_equal(u.cols, 101);
        assert_true(u.meta.seed == 77);
        compress_spec spec = {.kind = COMPRESS_SKETCH, .rows = 5, .cols = 101, .seed = 77};
        const char *code = "x";
        OK(compress_update_check_spec(&u, &spec, &code, &e_));
        assert_null(code);
        compress_sketch_zero(&acc);
        OK(compress_update_accumulate_sketch(&u, 1.0f, &acc, &e_));
        for (size_t c = 0; c < 5 * 101; c++) {
            float want = dt ? vl_f16_to_f32(vl_f32_to_f16(s.table[c])) : s.table[c];
            assert_true(acc.table[c] == want);
        }
        vl_error e = {0};
        compress_spec other = spec;
        other.seed = 78;
        assert_int_equal(compress_update_check_spec(&u, &other, &code, &e), VL_ERANGE);
        assert_string_equal(code, "wrong_sketch");
        other = spec;
        other.cols = 100;
        assert_int_equal(compress_update_check_spec(&u, &other, &code, &e), VL_ERANGE);
        assert_string_equal(code, "wrong_sketch");
        other = spec;
        other.rows = 3;
        assert_int_equal(compress_update_check_spec(&u, &other, &code, &e), VL_ERANGE);
        assert_string_equal(code, "wrong_sketch");
        float dst[N];
        assert_int_equal(compress_update_accumulate(&u, 1.0f, dst, N, &e), VL_EINVAL);
        compress_sketch wrong;
        OK(compress_sketch_init(&wrong, 5, 101, 78, &e_));
        assert_int_equal(compress_update_accumulate_sketch(&u, 1.0f, &wrong, &e), VL_EINVAL);
        compress_sketch_free(&wrong);
        compress_update_free(&u);
        vl_buf_free(&b);
    }
    /* A non-finite cell is refused. */
    s.table[42] = NAN;
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    compress_update_meta m = meta(COMPRESS_SKETCH);
    OK(compress_update_encode_sketch(&m, &s, ST_F32, &b, &e_));
    const char *code = NULL;
    assert_int_equal(decode(&b, N, &code), VL_ERANGE);
    assert_string_equal(code, "non_finite");
    vl_buf_free(&b);
    compress_sketch_free(&s);
    compress_sketch_free(&acc);
}

/* The norm an upload stores is what the merge would compute from the same
 * bytes read back into another buffer: compress_update_norm must not
 * depend on where the body lies (a vectorised sum that first stepped to
 * an aligned address would add in another order). Every offset within
 * 64 bytes, for a sketch (the ingest benchmark's update) and a dense
 * update of odd length, F32 and F16. */
static void test_norm_same_at_any_address(void **state) {
    (void)state;
    compress_sketch s;
    OK(compress_sketch_init(&s, 5, 1001, 77, &e_));
    float *x = random_vec(N, 31);
    compress_sketch_encode(&s, x, N);
    for (int c = 0; c < 4; c++) {
        st_dtype dt = c & 1 ? ST_F16 : ST_F32;
        vl_buf b;
        vl_buf_init(&b, 1 << 20);
        compress_update_meta m = meta(c < 2 ? COMPRESS_SKETCH : COMPRESS_DENSE);
        if (c < 2)
            OK(compress_update_encode_sketch(&m, &s, dt, &b, &e_));
        else
            OK(compress_update_encode_dense(&m, x, N, dt, &b, &e_));
        uint8_t *buf = malloc(b.len + 64);
        assert_non_null(buf);
        double first = 0;
        for (size_t off = 0; off < 64; off++) {
            memcpy(buf + off, b.data, b.len);
            compress_update u;
            OK(compress_update_decode(buf + off, b.len, N, &u, NULL, &e_));
            double norm = compress_update_norm(&u);
            compress_update_free(&u);
            assert_true(norm > 0);
            if (off == 0) first = norm;
            if (memcmp(&norm, &first, sizeof norm) != 0)
                fail_msg("case %d: the norm at offset %zu is %.17g, at 0 %.17g", c, off, norm,
                         first);
        }
        free(buf);
        vl_buf_free(&b);
    }
    free(x);
    compress_sketch_free(&s);
}

/* A sketch update without its seed, or with a table of the wrong rank,
 * is malformed or misshapen; one made with no hash named (as volley made
 * them before the windowed hash) or another hash is the wrong sketch. */
static void test_sketch_malformed(void **state) {
    (void)state;
    float t[6] = {0};
    for (int variant = 0; variant < 5; variant++) {
        st_writer w;
        st_writer_init(&w);
        const char *keys[] = {"run",  "task",        "peer",        "base_version",
                              "kind", "num_samples", "local_steps", "loss"};
        const char *vals[] = {"demo", "9", "4", "2", "sketch", "512", "20", "1.75"};
        for (int i = 0; i < 8; i++) assert_int_equal(st_writer_meta(&w, keys[i], vals[i]), VL_OK);
        if (variant != 0) assert_int_equal(st_writer_meta(&w, "seed", "7"), VL_OK);
        if (variant != 0 && variant != 3)
            assert_int_equal(st_writer_meta(&w, "hash", variant == 4 ? "mix" : "window"), VL_OK);
        uint64_t s2[2] = {2, 3}, s1[1] = {6};
        if (variant == 2) {
            assert_int_equal(st_writer_add(&w, "table", ST_F32, 1, s1, t, 24), VL_OK);
        } else {
            assert_int_equal(st_writer_add(&w, "table", ST_F32, 2, s2, t, 24), VL_OK);
        }
        vl_buf b;
        vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
        OK(st_writer_finish(&w, &b, &e_));
        st_writer_free(&w);
        const char *code = NULL;
        int rc = decode(&b, N, &code);
        if (variant == 0) assert_int_equal(rc, VL_EINVAL);
        if (variant == 1) assert_int_equal(rc, VL_OK);
        if (variant == 2) {
            assert_int_equal(rc, VL_ERANGE);
            assert_string_equal(code, "bad_shape");
        }
        if (variant >= 3) {
            assert_int_equal(rc, VL_ERANGE);
            assert_string_equal(code, "wrong_sketch");
        }
        vl_buf_free(&b);
    }
}

/* Finite values too large to sum safely, in every kind and in round
 * values, are refused as out_of_bounds; 2^40 itself is taken; a sample
 * count over 2^40 makes the metadata malformed. Found by fuzz_http: a
 * sketch of 3e38 cells made the merged model Inf. */
static void test_value_bounds(void **state) {
    (void)state;
    const float limit = COMPRESS_MAX_ABS, over = nextafterf(COMPRESS_MAX_ABS, INFINITY);
    float *d = calloc(N, sizeof *d);
    assert_non_null(d);
    compress_update_meta m = meta(COMPRESS_DENSE);
    const float vals[] = {limit, -limit, over, -over, 3e38f};
    for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++) {
        d[N / 3] = vals[k];
        vl_buf b;
        vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
        OK(compress_update_encode_dense(&m, d, N, ST_F32, &b, &e_));
        const char *code = NULL;
        int want = k < 2 ? VL_OK : VL_ERANGE;
        assert_int_equal(decode(&b, N, &code), want);
        if (want != VL_OK) assert_string_equal(code, "out_of_bounds");
        vl_buf_free(&b);

        uint32_t idx[2] = {3, 70};
        float tv[2] = {0.5f, vals[k]};
        m.kind = COMPRESS_TOPK;
        vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
        OK(compress_update_encode_topk(&m, idx, tv, 2, ST_F32, &b, &e_));
        assert_int_equal(decode(&b, N, &code), want);
        if (want != VL_OK) assert_string_equal(code, "out_of_bounds");
        vl_buf_free(&b);

        compress_sketch s;
        OK(compress_sketch_init(&s, 2, 16, 7, &e_));
        s.table[5] = vals[k];
        m.kind = COMPRESS_SKETCH;
        vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
        OK(compress_update_encode_sketch(&m, &s, ST_F32, &b, &e_));
        assert_int_equal(decode(&b, N, &code), want);
        if (want != VL_OK) assert_string_equal(code, "out_of_bounds");
        vl_buf_free(&b);
        compress_sketch_free(&s);

        compress_round_meta rm = {.run = "demo", .version = 2, .task = 9, .peer = 4};
        float rv[3] = {1, vals[k], 2};
        vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
        OK(compress_round_encode_values(&rm, rv, 3, &b, &e_));
        compress_round_meta back;
        float *got = NULL;
        size_t n = 0;
        code = NULL;
        vl_error e = {0};
        assert_int_equal(compress_round_decode_values(b.data, b.len, 3, &back, &got, &n, &code, &e),
                         want);
        if (want != VL_OK) assert_string_equal(code, "out_of_bounds");
        free(got);
        vl_buf_free(&b);
        m.kind = COMPRESS_DENSE;
    }
    d[N / 3] = 0;
    const int64_t samples[] = {COMPRESS_MAX_SAMPLES, COMPRESS_MAX_SAMPLES + 1};
    for (int k = 0; k < 2; k++) {
        m.num_samples = samples[k];
        vl_buf b;
        vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
        OK(compress_update_encode_dense(&m, d, N, ST_F32, &b, &e_));
        const char *code = NULL;
        assert_int_equal(decode(&b, N, &code), k ? VL_EINVAL : VL_OK);
        vl_buf_free(&b);
    }
    free(d);
}

/* Round values in F16 come back as the F16 rounding of what was sent;
 * another dtype is refused on both sides. */
static void test_round_values_f16(void **state) {
    (void)state;
    compress_round_meta rm = {.run = "demo", .version = 2, .task = 9, .peer = 4};
    float rv[3] = {0.1f, -3.0f, 1e-3f};
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    OK(compress_round_encode_values_as(&rm, rv, 3, ST_F16, &b, &e_));
    compress_round_meta back;
    float *got = NULL;
    size_t n = 0;
    const char *code = NULL;
    OK(compress_round_decode_values(b.data, b.len, 3, &back, &got, &n, &code, &e_));
    assert_int_equal(n, 3);
    assert_int_equal(back.task, 9);
    for (int i = 0; i < 3; i++) assert_true(got[i] == vl_f16_to_f32(vl_f32_to_f16(rv[i])));
    assert_true(got[0] != rv[0]); /* rounded, so F16 really travelled */
    free(got);
    vl_error e = {0};
    assert_int_equal(compress_round_decode_values(b.data, b.len, 4, &back, &got, &n, &code, &e),
                     VL_ERANGE);
    assert_string_equal(code, "bad_shape");
    vl_buf_free(&b);
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    assert_int_equal(compress_round_encode_values_as(&rm, rv, 3, ST_U32, &b, NULL), VL_EINVAL);
    vl_buf_free(&b);
}

/* What a peer may add to its update's metadata. A classifier peer's
 * reported accuracy: absent by default, carried when given, and refused
 * (422 bad_accuracy) outside [0, 1] or (400) when not a number. */
static void test_reported_accuracy(void **state) {
    (void)state;
    float d[16] = {0};
    d[3] = 0.5f;
    compress_update_meta m = meta(COMPRESS_DENSE);
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    vl_error e = {0};
    compress_update u;
    const char *code = NULL;
    OK(compress_update_encode_dense(&m, d, 16, ST_F32, &b, &e));
    OK(compress_update_decode(b.data, b.len, 16, &u, &code, &e));
    assert_false(u.meta.has_accuracy);
    compress_update_free(&u);
    m.has_accuracy = 1;
    m.accuracy = 0.8125;
    b.len = 0;
    OK(compress_update_encode_dense(&m, d, 16, ST_F32, &b, &e));
    OK(compress_update_decode(b.data, b.len, 16, &u, &code, &e));
    assert_true(u.meta.has_accuracy);
    assert_true(fabs(u.meta.accuracy - 0.8125) < 1e-9);
    compress_update_free(&u);
    const double bad[] = {1.5, -0.25, NAN};
    for (int i = 0; i < 3; i++) {
        m.accuracy = bad[i];
        b.len = 0;
        OK(compress_update_encode_dense(&m, d, 16, ST_F32, &b, &e));
        int rc = decode(&b, 16, &code);
        if (isnan(bad[i])) {
            assert_int_equal(rc, VL_EINVAL);
        } else {
            assert_int_equal(rc, VL_ERANGE);
            assert_string_equal(code, "bad_accuracy");
        }
    }
    /* The training time: absent by default, carried when given (six
     * significant digits), refused (400) above 1e7 seconds. */
    m = meta(COMPRESS_DENSE);
    b.len = 0;
    OK(compress_update_encode_dense(&m, d, 16, ST_F32, &b, &e));
    OK(compress_update_decode(b.data, b.len, 16, &u, &code, &e));
    assert_true(u.meta.train_seconds == 0);
    compress_update_free(&u);
    m.train_seconds = 3.14159265;
    b.len = 0;
    OK(compress_update_encode_dense(&m, d, 16, ST_F32, &b, &e));
    OK(compress_update_decode(b.data, b.len, 16, &u, &code, &e));
    assert_true(fabs(u.meta.train_seconds - 3.14159) < 1e-9);
    compress_update_free(&u);
    m.train_seconds = 2e7;
    b.len = 0;
    OK(compress_update_encode_dense(&m, d, 16, ST_F32, &b, &e));
    assert_int_equal(compress_update_decode(b.data, b.len, 16, &u, &code, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "train_seconds"));
    vl_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_round_trip),
        cmocka_unit_test(test_topk_bad_indices_and_values),
        cmocka_unit_test(test_sketch_round_trip_and_spec),
        cmocka_unit_test(test_norm_same_at_any_address),
        cmocka_unit_test(test_sketch_malformed),
        cmocka_unit_test(test_value_bounds),
        cmocka_unit_test(test_round_values_f16),
        cmocka_unit_test(test_reported_accuracy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
