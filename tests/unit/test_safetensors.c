/* Unit tests for the safetensors codec: round trips through the writer and
 * parser, and rejection of every malformed input the parser promises to
 * catch. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

/* Builds a file from a literal header and a data block of data_len bytes
 * (filled with a pattern). With pad, spaces are appended to the header so
 * the data block starts 8-aligned, as real writers do. */
static uint8_t *make_file(const char *json, size_t data_len, int pad, size_t *len) {
    size_t hl = strlen(json);
    size_t padded = pad ? hl + (8 - (8 + hl) % 8) % 8 : hl;
    *len = 8 + padded + data_len;
    uint8_t *p = malloc(*len + 1);
    assert_non_null(p);
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(p + 8, json, hl);
    memset(p + 8 + hl, ' ', padded - hl);
    for (size_t i = 0; i < data_len; i++) p[8 + padded + i] = (uint8_t)(i * 13 + 1);
    return p;
}

/* Asserts that st_parse rejects the input with code and a message, leaving
 * nothing allocated (ASan's leak checker verifies the latter). */
static void expect_reject_bytes(const uint8_t *p, size_t len, int code, const char *what) {
    st_file f;
    vl_error e = {0};
    int rc = st_parse(p, len, &f, &e);
    if (rc == VL_OK) {
        st_free(&f);
        fail_msg("accepted: %s", what);
    }
    if (code && rc != code) fail_msg("%s: got %d (%s), want %d", what, rc, e.msg, code);
    assert_int_equal(e.code, rc);
    assert_true(strlen(e.msg) > 0);
    assert_null(f.tensors);
    assert_int_equal(f.ntensors, 0);
}

static void expect_reject(const char *json, size_t data_len, int code) {
    size_t len;
    uint8_t *p = make_file(json, data_len, 1, &len);
    expect_reject_bytes(p, len, code, json);
    free(p);
}

static void expect_accept(const char *json, size_t data_len, int ntensors) {
    size_t len;
    uint8_t *p = make_file(json, data_len, 1, &len);
    st_file f;
    vl_error e = {0};
    if (st_parse(p, len, &f, &e) != VL_OK) fail_msg("rejected %s: %s", json, e.msg);
    assert_int_equal(f.ntensors, ntensors);
    st_free(&f);
    free(p);
}

/* ---- round trips ------------------------------------------------------- */

typedef struct {
    const char *name;
    st_dtype dt;
    int ndim;
    uint64_t shape[ST_MAX_DIMS];
} spec;

static const spec specs[] = {
    {"u8.odd", ST_U8, 1, {3}},
    {"weights", ST_F32, 2, {2, 3}},
    {"half", ST_F16, 1, {5}},
    {"scalar", ST_F32, 0, {0}},
    {"empty", ST_F32, 2, {0, 5}},
    {"bf", ST_BF16, 3, {1, 1, 3}},
    {"idx", ST_U32, 1, {4}},
    {"i32", ST_I32, 1, {1}},
    {"u16", ST_U16, 1, {3}},
    {"big", ST_I64, 1, {2}},
    {"dbl", ST_F64, 2, {1, 1}},
    {"u8.empty", ST_U8, 1, {0}},
    {"8d", ST_U8, 8, {1, 2, 1, 1, 1, 1, 1, 1}},
};
#define NSPECS (int)(sizeof specs / sizeof specs[0])

static size_t spec_bytes(const spec *s) {
    size_t n = st_dtype_size(s->dt);
    for (int d = 0; d < s->ndim; d++) n *= (size_t)s->shape[d];
    return n;
}

/* Writes all specs with distinct byte patterns plus metadata into out. */
static void write_sample(vl_buf *out, uint8_t **payloads) {
    st_writer w;
    st_writer_init(&w);
    assert_int_equal(st_writer_meta(&w, "run", "r1"), VL_OK);
    assert_int_equal(st_writer_meta(&w, "kind", "dense"), VL_OK);
    assert_int_equal(st_writer_meta(&w, "quote\"key", "line\nbreak \"q\" \\ \xc3\xa9"), VL_OK);
    for (int i = 0; i < NSPECS; i++) {
        size_t nb = spec_bytes(&specs[i]);
        payloads[i] = malloc(nb ? nb : 1);
        assert_non_null(payloads[i]);
        for (size_t j = 0; j < nb; j++) payloads[i][j] = (uint8_t)(i * 37 + j * 11 + 5);
        assert_int_equal(st_writer_add(&w, specs[i].name, specs[i].dt, specs[i].ndim,
                                       specs[i].shape, payloads[i], nb),
                         VL_OK);
    }
    vl_error e = {0};
    assert_int_equal(st_writer_finish(&w, out, &e), VL_OK);
    st_writer_free(&w);
}

static void check_sample(const uint8_t *bytes, size_t len, uint8_t **payloads) {
    st_file f;
    vl_error e = {0};
    if (st_parse(bytes, len, &f, &e) != VL_OK) fail_msg("parse: %s", e.msg);
    assert_int_equal(f.ntensors, NSPECS);
    for (int i = 0; i < NSPECS; i++) {
        const st_tensor *t = &f.tensors[i];
        assert_string_equal(t->name, specs[i].name); /* file order kept */
        assert_ptr_equal(st_find(&f, specs[i].name), t);
        assert_int_equal(t->dtype, specs[i].dt);
        assert_int_equal(t->ndim, specs[i].ndim);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            assert_true(t->shape[d] == specs[i].shape[d]);
            numel *= t->shape[d];
        }
        assert_true(t->numel == numel);
        size_t nb = spec_bytes(&specs[i]);
        assert_int_equal(t->nbytes, nb);
        assert_true(t->data >= bytes + 8 && t->data + nb <= bytes + len);
        if (nb) {
            assert_memory_equal(t->data, payloads[i], nb);
            assert_int_equal((size_t)(t->data - bytes) % st_dtype_size(t->dtype), 0);
        }
    }
    assert_null(st_find(&f, "missing"));
    assert_null(st_find(&f, "__metadata__"));
    assert_int_equal(f.nmeta, 3);
    assert_string_equal(st_meta_get(&f, "run"), "r1");
    assert_string_equal(st_meta_get(&f, "kind"), "dense");
    assert_string_equal(st_meta_get(&f, "quote\"key"), "line\nbreak \"q\" \\ \xc3\xa9");
    assert_null(st_meta_get(&f, "absent"));
    st_free(&f);
    assert_null(f.tensors);
}

static void test_roundtrip(void **state) {
    (void)state;
    uint8_t *payloads[NSPECS];
    vl_buf out;
    vl_buf_init(&out, 1 << 20);
    assert_int_equal(vl_buf_append(&out, "prefix", 6), VL_OK); /* finish appends */
    write_sample(&out, payloads);
    const uint8_t *file = out.data + 6;
    size_t len = out.len - 6;
    assert_memory_equal(out.data, "prefix", 6);

    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | file[i];
    assert_int_equal((8 + hlen) % 8, 0);
    assert_true(8 + hlen <= len);
    assert_memory_equal(file + 8, "{\"__metadata__\":{\"run\":\"r1\"", 27);
    /* Header keys follow insertion order. */
    const char *h = (const char *)file + 8;
    const char *prev = h;
    for (int i = 0; i < NSPECS; i++) {
        char key[160];
        snprintf(key, sizeof key, "\"%s\":{", specs[i].name);
        const char *at = strstr(h, key);
        assert_non_null(at);
        assert_true(at > prev);
        prev = at;
    }
    check_sample(file, len, payloads);

    /* Alignment is judged on file offsets, so the same bytes at an odd
     * address parse identically. */
    uint8_t *odd = malloc(len + 1);
    assert_non_null(odd);
    memcpy(odd + 1, file, len);
    check_sample(odd + 1, len, payloads);
    free(odd);

    for (int i = 0; i < NSPECS; i++) free(payloads[i]);
    vl_buf_free(&out);
}

static void test_empty_file(void **state) {
    (void)state;
    st_writer w;
    st_writer_init(&w);
    vl_buf out;
    vl_buf_init(&out, 1024);
    vl_error e = {0};
    assert_int_equal(st_writer_finish(&w, &out, &e), VL_OK);
    st_writer_free(&w);
    assert_int_equal(out.len, 16); /* 8 + "{}" padded to 8 */
    assert_memory_equal(out.data + 8, "{}      ", 8);
    st_file f;
    assert_int_equal(st_parse(out.data, out.len, &f, &e), VL_OK);
    assert_int_equal(f.ntensors, 0);
    assert_int_equal(f.nmeta, 0);
    st_free(&f);
    vl_buf_free(&out);

    expect_accept("{}", 0, 0);
    expect_accept("{\"__metadata__\":{}}", 0, 0);
}

static void test_writer_rejects(void **state) {
    (void)state;
    st_writer w;
    st_writer_init(&w);
    uint8_t data[64] = {0};
    uint64_t shape[ST_MAX_DIMS + 1] = {2, 2, 1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(st_writer_add(&w, "a", ST_F32, 2, shape, data, 16), VL_OK);
    assert_int_equal(st_writer_add(&w, "a", ST_F32, 2, shape, data, 16), VL_ECONFLICT);
    assert_int_equal(st_writer_add(&w, "b", ST_F32, 2, shape, data, 15), VL_EINVAL);
    assert_int_equal(st_writer_add(&w, "b", ST_F32, 9, shape, data, 16), VL_EINVAL);
    assert_int_equal(st_writer_add(&w, "b", ST_F32, -1, shape, data, 16), VL_EINVAL);
    assert_int_equal(st_writer_add(&w, "b", (st_dtype)99, 2, shape, data, 16), VL_EINVAL);
    assert_int_equal(st_writer_add(&w, "", ST_F32, 2, shape, data, 16), VL_EINVAL);
    assert_int_equal(st_writer_add(&w, "__metadata__", ST_F32, 2, shape, data, 16), VL_EINVAL);
    assert_int_equal(st_writer_add(&w, "b", ST_F32, 2, shape, NULL, 16), VL_EINVAL);
    char longname[200];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    longname[128] = '\0';
    assert_int_equal(st_writer_add(&w, longname, ST_U8, 0, NULL, data, 1), VL_EINVAL);
    longname[127] = '\0';
    assert_int_equal(st_writer_add(&w, longname, ST_U8, 0, NULL, data, 1), VL_OK);
    uint64_t huge[2] = {UINT64_MAX / 2, 4};
    assert_int_equal(st_writer_add(&w, "huge", ST_U8, 2, huge, data, 0), VL_EINVAL);

    char key[80], val[300];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    memset(val, 'v', sizeof val - 1);
    val[sizeof val - 1] = '\0';
    assert_int_equal(st_writer_meta(&w, key, "x"), VL_ETOOBIG);
    assert_int_equal(st_writer_meta(&w, "x", val), VL_ETOOBIG);
    key[63] = '\0';
    val[255] = '\0';
    assert_int_equal(st_writer_meta(&w, key, val), VL_OK);
    assert_int_equal(st_writer_meta(&w, key, "again"), VL_ECONFLICT);
    for (int i = 1; i < ST_MAX_META; i++) {
        char k[16];
        snprintf(k, sizeof k, "m%d", i);
        assert_int_equal(st_writer_meta(&w, k, "v"), VL_OK);
    }
    assert_int_equal(st_writer_meta(&w, "onemore", "v"), VL_ETOOBIG);

    /* The longest names and values the writer accepts must parse back. */
    vl_buf out;
    vl_buf_init(&out, 1 << 20);
    vl_error e = {0};
    assert_int_equal(st_writer_finish(&w, &out, &e), VL_OK);
    st_file f;
    if (st_parse(out.data, out.len, &f, &e) != VL_OK) fail_msg("parse: %s", e.msg);
    assert_int_equal(f.ntensors, 2);
    assert_int_equal(f.nmeta, ST_MAX_META);
    assert_string_equal(st_meta_get(&f, key), val);
    assert_non_null(st_find(&f, longname));
    st_free(&f);

    /* A buffer too small for the file is left untouched. */
    vl_buf small;
    vl_buf_init(&small, 32);
    assert_int_equal(vl_buf_append(&small, "keep", 4), VL_OK);
    assert_int_equal(st_writer_finish(&w, &small, &e), VL_ETOOBIG);
    assert_int_equal(small.len, 4);
    assert_string_equal((char *)small.data, "keep");
    vl_buf_free(&small);

    /* Invalid UTF-8 cannot be put in a JSON header. */
    st_writer w2;
    st_writer_init(&w2);
    assert_int_equal(st_writer_add(&w2, "bad\xff", ST_U8, 0, NULL, data, 1), VL_OK);
    vl_buf_reset(&out);
    assert_int_equal(st_writer_finish(&w2, &out, &e), VL_EINVAL);
    assert_int_equal(out.len, 0);
    st_writer_free(&w2);

    vl_buf_free(&out);
    st_writer_free(&w);
}

static void test_many_tensors(void **state) {
    (void)state;
    st_writer w;
    st_writer_init(&w);
    uint8_t byte = 7;
    char name[32];
    for (int i = 0; i < ST_MAX_TENSORS; i++) {
        snprintf(name, sizeof name, "t%d", i);
        assert_int_equal(st_writer_add(&w, name, ST_U8, 0, NULL, &byte, 1), VL_OK);
    }
    assert_int_equal(st_writer_add(&w, "over", ST_U8, 0, NULL, &byte, 1), VL_ETOOBIG);
    vl_buf out;
    vl_buf_init(&out, 1 << 22);
    vl_error e = {0};
    assert_int_equal(st_writer_finish(&w, &out, &e), VL_OK);
    st_writer_free(&w);
    st_file f;
    assert_int_equal(st_parse(out.data, out.len, &f, &e), VL_OK);
    assert_int_equal(f.ntensors, ST_MAX_TENSORS);
    assert_non_null(st_find(&f, "t4095"));
    st_free(&f);
    vl_buf_free(&out);

    /* One more than the limit, built by hand. */
    vl_buf j;
    vl_buf_init(&j, 1 << 22);
    assert_int_equal(vl_buf_append_str(&j, "{"), VL_OK);
    for (int i = 0; i <= ST_MAX_TENSORS; i++)
        assert_int_equal(vl_buf_printf(&j,
                                       "%s\"t%d\":{\"dtype\":\"U8\",\"shape\":[1],"
                                       "\"data_offsets\":[%d,%d]}",
                                       i ? "," : "", i, i, i + 1),
                         VL_OK);
    assert_int_equal(vl_buf_append_str(&j, "}"), VL_OK);
    expect_reject((const char *)j.data, ST_MAX_TENSORS + 1, VL_ETOOBIG);
    vl_buf_free(&j);
}

/* ---- rejections -------------------------------------------------------- */

static void test_truncated_prefixes(void **state) {
    (void)state;
    uint8_t *payloads[NSPECS];
    vl_buf out;
    vl_buf_init(&out, 1 << 20);
    write_sample(&out, payloads);
    for (size_t n = 0; n < out.len; n++) {
        /* A fresh allocation of exactly n bytes lets ASan catch any read
         * past the end. */
        uint8_t *p = malloc(n ? n : 1);
        assert_non_null(p);
        memcpy(p, out.data, n);
        char what[64];
        snprintf(what, sizeof what, "prefix of %zu/%zu bytes", n, out.len);
        expect_reject_bytes(p, n, 0, what);
        free(p);
    }
    st_file f;
    vl_error e;
    assert_int_equal(st_parse(NULL, 0, &f, &e), VL_EINVAL);
    for (int i = 0; i < NSPECS; i++) free(payloads[i]);
    vl_buf_free(&out);
}

#define T(dt, shape, b, e) \
    "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_reject_layout(void **state) {
    (void)state;
    /* Sanity: the pieces used below are accepted when consistent. */
    expect_accept("{\"a\":" T("F32", "[2]", 0, 8) ",\"b\":" T("F32", "[1]", 8, 12) "}", 12, 2);
    expect_accept("{\"b\":" T("F32", "[1]", 8, 12) ",\"a\":" T("F32", "[2]", 0, 8) "}", 12, 2);
    expect_accept("{\"a\":" T("F32", "[0]", 0, 0) ",\"b\":" T("F32", "[1]", 0, 4) "}", 4, 2);
    expect_accept("{\"a\":" T("F32", "[1]", 0, 4) ",\"b\":" T("U8", "[0]", 4, 4) "}", 4, 2);

    /* Overlap. */
    expect_reject("{\"a\":" T("F32", "[2]", 0, 8) ",\"b\":" T("F32", "[2]", 4, 12) "}", 12,
                  VL_EINVAL);
    expect_reject("{\"a\":" T("F32", "[2]", 0, 8) ",\"b\":" T("F32", "[2]", 0, 8) "}", 8,
                  VL_EINVAL);
    expect_reject("{\"a\":" T("F32", "[2]", 0, 8) ",\"b\":" T("F32", "[0]", 4, 4) "}", 8,
                  VL_EINVAL);
    /* Gap, trailing bytes, nothing covering the data. */
    expect_reject("{\"a\":" T("F32", "[1]", 0, 4) ",\"b\":" T("F32", "[1]", 8, 12) "}", 12,
                  VL_EINVAL);
    expect_reject("{\"a\":" T("F32", "[2]", 0, 8) "}", 12, VL_EINVAL);
    expect_reject("{\"a\":" T("F32", "[2]", 4, 12) "}", 12, VL_EINVAL);
    expect_reject("{}", 1, VL_EINVAL);
    /* Misaligned: F32 at data offset 1 (after a U8), and an I64 at 4. */
    expect_reject("{\"a\":" T("U8", "[1]", 0, 1) ",\"b\":" T("F32", "[1]", 1, 5) "}", 5, VL_EINVAL);
    expect_reject("{\"a\":" T("F32", "[1]", 0, 4) ",\"b\":" T("I64", "[1]", 4, 12) "}", 12,
                  VL_EINVAL);
    expect_reject("{\"a\":" T("U8", "[2]", 0, 2) ",\"b\":" T("F16", "[1]", 2, 4) ",\"c\":" T(
                      "U8", "[1]", 4, 5) ",\"d\":" T("F16", "[1]", 5, 7) "}",
                  7, VL_EINVAL);
    /* Misaligned because the header is not padded: data starts at 8+3. */
    size_t len;
    uint8_t *p = make_file("{\"a\":" T("F32", "[1]", 0, 4) "}", 4, 0, &len);
    assert_int_not_equal((len - 4) % 4, 0);
    expect_reject_bytes(p, len, VL_EINVAL, "unpadded header");
    free(p);
    /* ...while single bytes need no alignment at all. */
    p = make_file("{\"a\":" T("U8", "[3]", 0, 3) "}", 3, 0, &len);
    st_file f;
    vl_error e;
    assert_int_equal(st_parse(p, len, &f, &e), VL_OK);
    st_free(&f);
    free(p);

    /* Size mismatch between shape and data_offsets, both ways. */
    expect_reject("{\"a\":" T("F32", "[3]", 0, 8) "}", 8, VL_EINVAL);
    expect_reject("{\"a\":" T("F32", "[1]", 0, 8) "}", 8, VL_EINVAL);
    expect_reject("{\"a\":" T("F16", "[2,2]", 0, 4) "}", 4, VL_EINVAL);
    /* Offsets malformed or out of range. */
    expect_reject("{\"a\":" T("F32", "[1]", 4, 0) "}", 4, VL_EINVAL);
    expect_reject("{\"a\":" T("F32", "[1]", -4, 0) "}", 4, VL_EINVAL);
    expect_reject("{\"a\":" T("F32", "[1]", 0, 8) "}", 4, VL_EINVAL);
    expect_reject("{\"a\":" T("F32", "[1]", 8, 12) "}", 4, VL_EINVAL);
    expect_reject("{\"a\":" T("F32", "[1]", 0, 9223372036854775807) "}", 4, VL_EINVAL);
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, VL_EINVAL);
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,4]}}", 4,
                  VL_EINVAL);
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 4,
                  VL_EINVAL);
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0,4\"}}", 4,
                  VL_EINVAL);
}

static void test_reject_entries(void **state) {
    (void)state;
    /* Unknown or malformed dtype. */
    expect_reject("{\"a\":" T("Q4", "[1]", 0, 4) "}", 4, VL_EINVAL);
    expect_reject("{\"a\":" T("f32", "[1]", 0, 4) "}", 4, VL_EINVAL);
    expect_reject("{\"a\":" T("", "[1]", 0, 4) "}", 4, VL_EINVAL);
    expect_reject("{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, VL_EINVAL);
    /* Bad shapes. */
    expect_reject("{\"a\":" T("U8", "[-1]", 0, 0) "}", 0, VL_EINVAL);
    expect_reject("{\"a\":" T("U8", "[2.0]", 0, 2) "}", 2, VL_EINVAL);
    expect_reject("{\"a\":" T("U8", "[\"2\"]", 0, 2) "}", 2, VL_EINVAL);
    expect_reject("{\"a\":" T("U8", "[true]", 0, 1) "}", 1, VL_EINVAL);
    expect_reject("{\"a\":" T("U8", "2", 0, 2) "}", 2, VL_EINVAL);
    expect_reject("{\"a\":" T("U8", "[1,1,1,1,1,1,1,1,1]", 0, 1) "}", 1, VL_EINVAL);
    expect_accept("{\"a\":" T("U8", "[1,1,1,1,1,1,1,1]", 0, 1) "}", 1, 1);
    expect_reject("{\"a\":" T("U8", "[4294967296,4294967296,16]", 0, 0) "}", 0, VL_EINVAL);
    expect_reject("{\"a\":" T("F32", "[4611686018427387904,4]", 0, 0) "}", 0, VL_EINVAL);
    expect_reject("{\"a\":" T("U8", "[99999999999999999999]", 0, 0) "}", 0, VL_EINVAL);
    /* Zero in any dimension makes the tensor empty even with huge others. */
    expect_accept("{\"a\":" T("F64", "[0,9223372036854775807]", 0, 0) "}", 0, 1);
    /* Missing, extra or mistyped fields. */
    expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, VL_EINVAL);
    expect_reject("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, VL_EINVAL);
    expect_reject("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, VL_EINVAL);
    expect_reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1,
                  VL_EINVAL);
    expect_reject("{\"a\":[1]}", 0, VL_EINVAL);
    expect_reject("{\"a\":\"U8\"}", 0, VL_EINVAL);
    /* Duplicate names, and a duplicated field inside an entry. */
    expect_reject("{\"a\":" T("U8", "[1]", 0, 1) ",\"a\":" T("U8", "[1]", 1, 2) "}", 2, VL_EINVAL);
    expect_reject(
        "{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
        VL_EINVAL);
    /* Names: empty, too long for the struct, exactly the longest. */
    expect_reject("{\"\":" T("U8", "[1]", 0, 1) "}", 1, VL_EINVAL);
    char json[1024];
    char name[200];
    memset(name, 'n', 128);
    name[128] = '\0';
    snprintf(json, sizeof json, "{\"%s\":" T("U8", "[1]", 0, 1) "}", name);
    expect_reject(json, 1, VL_EINVAL);
    name[127] = '\0';
    snprintf(json, sizeof json, "{\"%s\":" T("U8", "[1]", 0, 1) "}", name);
    expect_accept(json, 1, 1);
    /* NUL inside a name. */
    expect_reject("{\"a\\u0000b\":" T("U8", "[1]", 0, 1) "}", 1, VL_EINVAL);
}

static void test_reject_header(void **state) {
    (void)state;
    /* Not an object, or not JSON. */
    expect_reject("[1,2]", 0, VL_EINVAL);
    expect_reject("\"x\"", 0, VL_EINVAL);
    expect_reject("null", 0, VL_EINVAL);
    expect_reject("{", 0, VL_EINVAL);
    expect_reject("{\"a\":" T("U8", "[1]", 0, 1) "} x", 1, VL_EINVAL);
    expect_reject("", 0, VL_EINVAL);
    expect_reject("{\"a\xff\":" T("U8", "[1]", 0, 1) "}", 1, VL_EINVAL);

    /* Header length over the cap (ETOOBIG) or past the end (EINVAL). */
    uint8_t small[64] = {0};
    uint64_t hl = (uint64_t)ST_MAX_HEADER + 1;
    for (int i = 0; i < 8; i++) small[i] = (uint8_t)(hl >> (8 * i));
    expect_reject_bytes(small, sizeof small, VL_ETOOBIG, "header over ST_MAX_HEADER");
    memset(small, 0xff, 8);
    expect_reject_bytes(small, sizeof small, VL_ETOOBIG, "header length 2^64-1");
    memset(small, 0, 8);
    small[0] = 57; /* 8 + 57 = 65 > 64 */
    expect_reject_bytes(small, sizeof small, VL_EINVAL, "header past the end");
    small[0] = 56;
    memcpy(small + 8, "{}", 2);
    memset(small + 10, ' ', 54);
    st_file f;
    vl_error e;
    assert_int_equal(st_parse(small, sizeof small, &f, &e), VL_OK);
    st_free(&f);
    expect_reject_bytes(small, 7, VL_EINVAL, "7 bytes");
}

static void test_reject_metadata(void **state) {
    (void)state;
    expect_reject("{\"__metadata__\":[\"a\"]}", 0, VL_EINVAL);
    expect_reject("{\"__metadata__\":\"a\"}", 0, VL_EINVAL);
    expect_reject("{\"__metadata__\":{\"k\":1}}", 0, VL_EINVAL);
    expect_reject("{\"__metadata__\":{\"k\":null}}", 0, VL_EINVAL);
    expect_reject("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, VL_EINVAL);
    expect_reject("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, VL_EINVAL);
    expect_reject("{\"__metadata__\":{},\"__metadata__\":{}}", 0, VL_EINVAL);

    char json[20000];
    char big[300];
    memset(big, 'k', 64);
    big[64] = '\0';
    snprintf(json, sizeof json, "{\"__metadata__\":{\"%s\":\"v\"}}", big);
    expect_reject(json, 0, VL_EINVAL);
    big[63] = '\0';
    snprintf(json, sizeof json, "{\"__metadata__\":{\"%s\":\"v\"}}", big);
    expect_accept(json, 0, 0);
    memset(big, 'v', 256);
    big[256] = '\0';
    snprintf(json, sizeof json, "{\"__metadata__\":{\"k\":\"%s\"}}", big);
    expect_reject(json, 0, VL_EINVAL);
    big[255] = '\0';
    snprintf(json, sizeof json, "{\"__metadata__\":{\"k\":\"%s\"}}", big);
    expect_accept(json, 0, 0);
    expect_reject("{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0, VL_EINVAL);

    /* Entry-count limit. */
    size_t o = (size_t)snprintf(json, sizeof json, "{\"__metadata__\":{");
    for (int i = 0; i <= ST_MAX_META; i++)
        o += (size_t)snprintf(json + o, sizeof json - o, "%s\"k%d\":\"v\"", i ? "," : "", i);
    snprintf(json + o, sizeof json - o, "}}");
    expect_reject(json, 0, VL_ETOOBIG);
}

/* ---- conversion -------------------------------------------------------- */

static void test_to_f32(void **state) {
    (void)state;
    float src[5] = {1.0f, -2.5f, 0.0f, 65504.0f, 3.0e-5f};
    uint16_t half[5];
    for (int i = 0; i < 5; i++) half[i] = vl_f32_to_f16(src[i]);
    uint8_t bytes[4] = {1, 2, 3, 4};
    uint64_t five = 5, four = 4;
    st_writer w;
    st_writer_init(&w);
    assert_int_equal(st_writer_add(&w, "f", ST_F32, 1, &five, src, sizeof src), VL_OK);
    assert_int_equal(st_writer_add(&w, "h", ST_F16, 1, &five, half, sizeof half), VL_OK);
    assert_int_equal(st_writer_add(&w, "u", ST_U8, 1, &four, bytes, sizeof bytes), VL_OK);
    vl_buf out;
    vl_buf_init(&out, 4096);
    vl_error e = {0};
    assert_int_equal(st_writer_finish(&w, &out, &e), VL_OK);
    st_writer_free(&w);

    /* Parse from an odd address to exercise the unaligned loads. */
    uint8_t *odd = malloc(out.len + 1);
    assert_non_null(odd);
    memcpy(odd + 1, out.data, out.len);
    st_file f;
    assert_int_equal(st_parse(odd + 1, out.len, &f, &e), VL_OK);
    float dst[5];
    assert_int_equal(st_tensor_to_f32(st_find(&f, "f"), dst, 5, &e), VL_OK);
    assert_memory_equal(dst, src, sizeof src);
    assert_int_equal(st_tensor_to_f32(st_find(&f, "h"), dst, 5, &e), VL_OK);
    assert_true(dst[0] == 1.0f && dst[1] == -2.5f && dst[2] == 0.0f && dst[3] == 65504.0f);
    assert_true(fabsf(dst[4] - 3.0e-5f) < 1e-7f);
    assert_true(dst[4] == vl_f16_to_f32(half[4]));
    assert_int_equal(st_tensor_to_f32(st_find(&f, "f"), dst, 4, &e), VL_EINVAL);
    assert_true(strlen(e.msg) > 0);
    assert_int_equal(st_tensor_to_f32(st_find(&f, "u"), dst, 4, &e), VL_EINVAL);
    st_free(&f);
    free(odd);
    vl_buf_free(&out);
}

static void test_dtypes(void **state) {
    (void)state;
    const char *names[] = {"F32", "F16", "BF16", "U32", "I32", "U16", "U8", "I64", "F64"};
    const size_t sizes[] = {4, 2, 2, 4, 4, 2, 1, 8, 8};
    for (int i = 0; i < 9; i++) {
        st_dtype dt;
        assert_int_equal(st_dtype_parse(names[i], &dt), VL_OK);
        assert_int_equal(dt, i);
        assert_string_equal(st_dtype_name(dt), names[i]);
        assert_int_equal(st_dtype_size(dt), sizes[i]);
    }
    st_dtype dt;
    assert_int_equal(st_dtype_parse("F8", &dt), VL_EINVAL);
    assert_int_equal(st_dtype_parse("BOOL", &dt), VL_EINVAL);
    assert_int_equal(st_dtype_parse(NULL, &dt), VL_EINVAL);
    assert_int_equal(st_dtype_size((st_dtype)42), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtypes),        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_empty_file),    cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_many_tensors),  cmocka_unit_test(test_truncated_prefixes),
        cmocka_unit_test(test_reject_layout), cmocka_unit_test(test_reject_entries),
        cmocka_unit_test(test_reject_header), cmocka_unit_test(test_reject_metadata),
        cmocka_unit_test(test_to_f32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
