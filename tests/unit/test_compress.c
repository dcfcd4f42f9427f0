/* Update encoding and validation: an honest update round trips; every
 * malformed or out-of-bounds one is refused with the code that maps to its
 * HTTP status (VL_EINVAL → 400, VL_ERANGE → 422). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compress/compress.h"

#define N 1031

static compress_update_meta meta(void) {
    compress_update_meta m;
    memset(&m, 0, sizeof m);
    strcpy(m.run, "demo");
    m.task = 3;
    m.peer = 2;
    m.base_version = 5;
    m.kind = COMPRESS_DENSE;
    m.num_samples = 5120;
    m.local_steps = 10;
    m.loss = 2.5;
    return m;
}

static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((int)(i % 17) - 8) * 0.125f;
}

static void test_round_trip_f32_and_f16(void **state) {
    (void)state;
    float delta[N], acc[N];
    fill(delta, N);
    for (int dt = 0; dt < 2; dt++) {
        vl_buf b;
        vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
        compress_update_meta m = meta();
        vl_error e = {0};
        assert_int_equal(compress_update_encode_dense(&m, delta, N, dt ? ST_F16 : ST_F32, &b, &e),
                         VL_OK);
        compress_update u;
        assert_int_equal(compress_update_decode(b.data, b.len, N, &u, NULL, &e), VL_OK);
        assert_string_equal(u.meta.run, "demo");
        assert_int_equal(u.meta.task, 3);
        assert_int_equal(u.meta.peer, 2);
        assert_int_equal(u.meta.base_version, 5);
        assert_int_equal(u.meta.num_samples, 5120);
        assert_int_equal(u.meta.local_steps, 10);
        assert_true(fabs(u.meta.loss - 2.5) < 1e-12);
        memset(acc, 0, sizeof acc);
        assert_int_equal(compress_update_accumulate(&u, 2.0f, acc, N, &e), VL_OK);
        /* Multiples of 1/8 in [-1, 1] are exact in F16 too. */
        for (size_t i = 0; i < N; i++) assert_true(acc[i] == 2.0f * delta[i]);
        compress_update_free(&u);
        vl_buf_free(&b);
    }
}

static int decode_code(const vl_buf *b, size_t n) {
    compress_update u;
    vl_error e = {0};
    int rc = compress_update_decode(b->data, b->len, n, &u, NULL, &e);
    if (rc == VL_OK)
        compress_update_free(&u);
    else
        assert_true(e.msg[0] != '\0');
    return rc;
}

static void test_bad_values_are_422(void **state) {
    (void)state;
    float delta[N];
    float bad[] = {NAN, INFINITY, -INFINITY};
    for (size_t k = 0; k < 3; k++) {
        for (int dt = 0; dt < 2; dt++) {
            fill(delta, N);
            delta[N - 1 - k] = bad[k];
            vl_buf b;
            vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
            compress_update_meta m = meta();
            vl_error e = {0};
            assert_int_equal(
                compress_update_encode_dense(&m, delta, N, dt ? ST_F16 : ST_F32, &b, &e), VL_OK);
            assert_int_equal(decode_code(&b, N), VL_ERANGE);
            vl_buf_free(&b);
        }
    }
    /* Right values, wrong model size. */
    fill(delta, N);
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    compress_update_meta m = meta();
    vl_error e = {0};
    assert_int_equal(compress_update_encode_dense(&m, delta, N, ST_F32, &b, &e), VL_OK);
    assert_int_equal(decode_code(&b, N + 1), VL_ERANGE);
    assert_int_equal(decode_code(&b, N - 1), VL_ERANGE);
    /* A finite F32 that overflows F16 becomes Inf when encoded as F16. */
    vl_buf_reset(&b);
    delta[7] = 1e6f;
    assert_int_equal(compress_update_encode_dense(&m, delta, N, ST_F16, &b, &e), VL_OK);
    assert_int_equal(decode_code(&b, N), VL_ERANGE);
    vl_buf_free(&b);
}

/* Builds an update by hand so metadata and tensors can be wrong. */
static const char *loss_text = "2.5";

static void build(vl_buf *b, const char *drop_key, const char *kind, const char *task,
                  int extra_tensor, st_dtype dt) {
    static float delta[N];
    fill(delta, N);
    st_writer w;
    st_writer_init(&w);
    const char *keys[] = {"run",  "task",        "peer",        "base_version",
                          "kind", "num_samples", "local_steps", "loss"};
    const char *vals[] = {"demo", task, "2", "5", kind, "100", "10", loss_text};
    for (int i = 0; i < 8; i++)
        if (!drop_key || strcmp(drop_key, keys[i]) != 0)
            assert_int_equal(st_writer_meta(&w, keys[i], vals[i]), VL_OK);
    uint64_t shape[1] = {N};
    size_t esz = dt == ST_F32 ? 4 : dt == ST_F16 ? 2 : 4;
    assert_int_equal(st_writer_add(&w, "delta", dt, 1, shape, delta, N * esz), VL_OK);
    if (extra_tensor)
        assert_int_equal(st_writer_add(&w, "other", ST_F32, 1, shape, delta, N * 4), VL_OK);
    vl_error e = {0};
    vl_buf_init(b, VL_BUF_DEFAULT_CAP);
    assert_int_equal(st_writer_finish(&w, b, &e), VL_OK);
    st_writer_free(&w);
}

static void test_malformed_is_400(void **state) {
    (void)state;
    vl_buf b;
    const char *keys[] = {"run",  "task",        "peer",       "base_version",
                          "kind", "num_samples", "local_steps"};
    for (int i = 0; i < 7; i++) {
        build(&b, keys[i], "dense", "3", 0, ST_F32);
        assert_int_equal(decode_code(&b, N), VL_EINVAL);
        vl_buf_free(&b);
    }
    build(&b, NULL, "sketchy", "3", 0, ST_F32);
    assert_int_equal(decode_code(&b, N), VL_EINVAL);
    vl_buf_free(&b);
    build(&b, NULL, "dense", "-3", 0, ST_F32);
    assert_int_equal(decode_code(&b, N), VL_EINVAL);
    vl_buf_free(&b);
    build(&b, NULL, "dense", "3x", 0, ST_F32);
    assert_int_equal(decode_code(&b, N), VL_EINVAL);
    vl_buf_free(&b);
    build(&b, NULL, "dense", "3", 1, ST_F32);
    assert_int_equal(decode_code(&b, N), VL_EINVAL);
    vl_buf_free(&b);
    /* Wrong dtype for a dense delta: well formed, but not what the run takes. */
    build(&b, NULL, "dense", "3", 0, ST_I32);
    assert_int_equal(decode_code(&b, N), VL_ERANGE);
    vl_buf_free(&b);
    /* Missing loss. */
    build(&b, "loss", "dense", "3", 0, ST_F32);
    assert_int_equal(decode_code(&b, N), VL_EINVAL);
    vl_buf_free(&b);
    /* A loss that is a number but not finite is out of bounds (422); one
     * that is not a number is malformed (400). */
    loss_text = "nan";
    build(&b, NULL, "dense", "3", 0, ST_F32);
    assert_int_equal(decode_code(&b, N), VL_ERANGE);
    vl_buf_free(&b);
    loss_text = "two";
    build(&b, NULL, "dense", "3", 0, ST_F32);
    assert_int_equal(decode_code(&b, N), VL_EINVAL);
    vl_buf_free(&b);
    loss_text = "2.5";
    /* Garbage and truncation. */
    build(&b, NULL, "dense", "3", 0, ST_F32);
    for (size_t cut = 0; cut < b.len; cut += 97) {
        compress_update u;
        vl_error e = {0};
        assert_int_equal(compress_update_decode(b.data, cut, N, &u, NULL, &e), VL_EINVAL);
    }
    vl_buf_free(&b);
}

static void test_delta_and_finite(void **state) {
    (void)state;
    float a[5] = {1, 2, 3, 4, 5}, c[5] = {0.5f, 2, 4, 3, 5}, d[5];
    compress_dense_delta(a, c, d, 5);
    float want[5] = {0.5f, 0, -1, 1, 0};
    assert_memory_equal(d, want, sizeof want);
    assert_true(compress_all_finite(d, 5));
    d[2] = NAN;
    assert_false(compress_all_finite(d, 5));
    compress_kind k;
    assert_int_equal(compress_kind_parse("dense", &k), VL_OK);
    assert_int_equal(k, COMPRESS_DENSE);
    assert_int_equal(compress_kind_parse("Dense", &k), VL_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_f32_and_f16),
        cmocka_unit_test(test_bad_values_are_422),
        cmocka_unit_test(test_malformed_is_400),
        cmocka_unit_test(test_delta_and_finite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
