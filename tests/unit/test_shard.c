/*
 * Unit tests for llm.c token shards: a good shard opens and samples the
 * same windows a plain in-memory reference would; every malformed shard is
 * refused with the right code and a message that says what is wrong; and
 * the validating scan covers every token across chunk boundaries.
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
#include "model/model.h"

#include "tests/unit/test_util.h"

/* Tokens per chunk of the validating scan. */
#define CHUNK_TOKENS ((int64_t)(MODEL_SHARD_CHUNK_BYTES / 2))

typedef test_dir_fixture fixture;

static void put_i32(uint8_t *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(u >> (8 * i));
}

/* Writes dir/name: a header with the given magic, version and token count,
 * then ntok tokens, then extra zero bytes. Returns the path (in f). */
static const char *write_shard_raw(fixture *f, const char *name, int32_t magic, int32_t version,
                                   int32_t header_n, const uint16_t *tokens, size_t ntok,
                                   size_t extra) {
    assert_true(snprintf(f->path, sizeof f->path, "%s/%s", f->dir, name) < (int)sizeof f->path);
    size_t len = MODEL_SHARD_HEADER_BYTES + 2 * ntok + extra;
    uint8_t *b = calloc(1, len);
    assert_non_null(b);
    put_i32(b, magic);
    put_i32(b + 4, version);
    put_i32(b + 8, header_n);
    for (size_t i = 0; i < ntok; i++) {
        b[MODEL_SHARD_HEADER_BYTES + 2 * i] = (uint8_t)(tokens[i] & 0xff);
        b[MODEL_SHARD_HEADER_BYTES + 2 * i + 1] = (uint8_t)(tokens[i] >> 8);
    }
    FILE *fp = fopen(f->path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(b, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
    free(b);
    return f->path;
}

/* A well-formed shard of the given tokens. */
static const char *write_shard(fixture *f, const char *name, const uint16_t *tokens, size_t ntok) {
    return write_shard_raw(f, name, MODEL_SHARD_MAGIC, MODEL_SHARD_VERSION, (int32_t)ntok, tokens,
                           ntok, 0);
}

/* Writes raw bytes (for files too short to have a header). */
static const char *write_bytes(fixture *f, const char *name, const void *data, size_t len) {
    assert_true(snprintf(f->path, sizeof f->path, "%s/%s", f->dir, name) < (int)sizeof f->path);
    FILE *fp = fopen(f->path, "wb");
    assert_non_null(fp);
    if (len) assert_int_equal(fwrite(data, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
    return f->path;
}

/* token i = (i*7 + 3) % vocab */
static uint16_t *pattern(size_t n, int vocab) {
    uint16_t *t = malloc(n * sizeof *t);
    assert_non_null(t);
    for (size_t i = 0; i < n; i++) t[i] = (uint16_t)((i * 7 + 3) % (size_t)vocab);
    return t;
}

/* Opening must fail with code, the message must contain want and name the
 * file, and *out must be left NULL. */
static void expect_refused(const char *path, int vocab, int code, const char *want) {
    vl_error err = {0};
    model_shard *s = (model_shard *)&err; /* must be overwritten */
    int rc = model_shard_open(path, vocab, &s, &err);
    if (rc != code || strstr(err.msg, want) == NULL || strstr(err.msg, path) == NULL)
        fail_msg("open %s: got %d \"%s\", expected %d with \"%s\"", path, rc, err.msg, code, want);
    assert_int_equal(err.code, code);
    assert_null(s);
}

static model_shard *open_ok(const char *path, int vocab) {
    vl_error err = {0};
    model_shard *s = NULL;
    if (model_shard_open(path, vocab, &s, &err) != 0) fail_msg("open %s: %s", path, err.msg);
    assert_non_null(s);
    return s;
}

/* ---- good shards ---------------------------------------------------------- */

/* Every window must be T+1 consecutive tokens of the file, targets the
 * inputs shifted by one; returns the offset (tokens are unique here, so the
 * first one locates the window). */
static int64_t window_offset(const uint16_t *tok, size_t n, const int *in, const int *tg, int T) {
    int64_t off = -1;
    for (size_t o = 0; o + (size_t)T < n; o++)
        if (tok[o] == in[0]) {
            assert_int_equal(off, -1); /* unique */
            off = (int64_t)o;
        }
    assert_true(off >= 0);
    for (int t = 0; t < T; t++) {
        assert_int_equal(in[t], tok[off + t]);
        assert_int_equal(tg[t], tok[off + t + 1]);
        if (t + 1 < T) assert_int_equal(tg[t], in[t + 1]);
    }
    return off;
}

static void test_open_and_sample(void **state) {
    fixture *f = *state;
    const int V = 50257, B = 16, T = 33;
    const size_t N = 5000; /* < V: every token is distinct */
    uint16_t *tok = pattern(N, V);
    model_shard *s = open_ok(write_shard(f, "good.bin", tok, N), V);
    assert_int_equal(model_shard_tokens(s), (int64_t)N);
    int in[16 * 33], tg[16 * 33];
    vl_rng r;
    vl_rng_seed(&r, 42);
    for (int step = 0; step < 20; step++) {
        OK(model_shard_sample(s, B, T, &r, in, tg, &e_));
        for (int b = 0; b < B; b++) {
            int64_t off = window_offset(tok, N, in + b * T, tg + b * T, T);
            assert_true(off >= 0 && off <= (int64_t)N - T - 1);
        }
    }
    /* Same seed, same batch. */
    int in2[16 * 33], tg2[16 * 33];
    vl_rng r1, r2;
    vl_rng_seed(&r1, 9);
    vl_rng_seed(&r2, 9);
    OK(model_shard_sample(s, B, T, &r1, in, tg, &e_));
    OK(model_shard_sample(s, B, T, &r2, in2, tg2, &e_));
    assert_memory_equal(in, in2, sizeof in);
    assert_memory_equal(tg, tg2, sizeof tg);
    model_shard_close(s);
    model_shard_close(NULL);
    free(tok);
}

/* With vocab <= 256 the same tokens can be written as bytes, and then a
 * seed must give exactly model_data_sample's batch: same offsets, same
 * number of draws from the rng. */
static void test_matches_data_sample(void **state) {
    fixture *f = *state;
    const int V = 251, B = 8;
    const size_t N = 3001;
    uint16_t *tok = pattern(N, V);
    uint8_t *bytes = malloc(N);
    assert_non_null(bytes);
    for (size_t i = 0; i < N; i++) bytes[i] = (uint8_t)tok[i];
    model_shard *s = open_ok(write_shard(f, "bytes.bin", tok, N), V);
    int T_values[] = {1, 17, 64, (int)N - 1};
    for (size_t k = 0; k < sizeof T_values / sizeof T_values[0]; k++) {
        int T = T_values[k];
        size_t n = (size_t)B * T;
        int *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
        int *rin = malloc(n * sizeof *rin), *rtg = malloc(n * sizeof *rtg);
        assert_true(in && tg && rin && rtg);
        vl_rng a, b;
        vl_rng_seed(&a, 1234 + k);
        vl_rng_seed(&b, 1234 + k);
        for (int step = 0; step < 5; step++) {
            OK(model_shard_sample(s, B, T, &a, in, tg, &e_));
            OK(model_data_sample(bytes, N, B, T, &b, rin, rtg, &e_));
            assert_memory_equal(in, rin, n * sizeof *in);
            assert_memory_equal(tg, rtg, n * sizeof *tg);
        }
        assert_int_equal(vl_rng_u64(&a), vl_rng_u64(&b)); /* vl_rng left in the same state */
        free(in), free(tg), free(rin), free(rtg);
    }
    model_shard_close(s);
    free(bytes);
    free(tok);
}

/* Offsets reach both ends: with N = T+3 there are three windows and a few
 * hundred draws hit every one; N = T+1 has only offset 0. */
static void test_sample_edges(void **state) {
    fixture *f = *state;
    const int V = 1000, T = 5;
    uint16_t *tok = pattern(T + 3, V);
    model_shard *s = open_ok(write_shard(f, "edge.bin", tok, T + 3), V);
    int seen[3] = {0};
    int in[5], tg[5];
    vl_rng r;
    vl_rng_seed(&r, 5);
    for (int i = 0; i < 300; i++) {
        OK(model_shard_sample(s, 1, T, &r, in, tg, &e_));
        int64_t off = window_offset(tok, T + 3, in, tg, T);
        assert_true(off >= 0 && off < 3);
        seen[off]++;
    }
    assert_true(seen[0] > 0 && seen[1] > 0 && seen[2] > 0);
    model_shard_close(s);

    s = open_ok(write_shard(f, "exact.bin", tok, T + 1), V);
    for (int i = 0; i < 10; i++) {
        OK(model_shard_sample(s, 1, T, &r, in, tg, &e_));
        assert_int_equal(window_offset(tok, T + 1, in, tg, T), 0);
    }
    model_shard_close(s);
    free(tok);
}

static void test_sample_refused(void **state) {
    fixture *f = *state;
    const int V = 300;
    uint16_t *tok = pattern(10, V);
    const char *path = write_shard(f, "ten.bin", tok, 10);
    model_shard *s = open_ok(path, V);
    int in[64], tg[64];
    vl_rng r;
    vl_rng_seed(&r, 1);
    vl_error err = {0};
    assert_int_equal(model_shard_sample(s, 1, 10, &r, in, tg, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "shorter than one window of 11"));
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(model_shard_sample(s, 0, 4, &r, in, tg, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "B=0"));
    assert_int_equal(model_shard_sample(s, 1, 0, &r, in, tg, &err), VL_EINVAL);
    assert_int_equal(model_shard_sample(s, 1, 4, NULL, in, tg, &err), VL_EINVAL);
    assert_int_equal(model_shard_sample(NULL, 1, 4, &r, in, tg, &err), VL_EINVAL);
    assert_int_equal(model_shard_sample(s, 1, 4, &r, in, NULL, &err), VL_EINVAL);
    OK(model_shard_sample(s, 4, 9, &r, in, tg, &e_)); /* still usable */
    model_shard_close(s);
    free(tok);
}

/* ---- refused shards ------------------------------------------------------- */

static void test_refused_headers(void **state) {
    fixture *f = *state;
    const int V = 256;
    uint16_t *tok = pattern(100, V);
    uint8_t zeros[MODEL_SHARD_HEADER_BYTES] = {0};

    expect_refused(write_bytes(f, "empty.bin", NULL, 0), V, VL_EINVAL, "empty file");
    expect_refused(write_bytes(f, "short.bin", zeros, 1023), V, VL_EINVAL,
                   "1023 bytes, shorter than the 1024-byte header");
    expect_refused(write_shard_raw(f, "magic.bin", 20240521, 1, 100, tok, 100, 0), V, VL_EINVAL,
                   "bad magic 20240521");
    expect_refused(write_bytes(f, "zeros.bin", zeros, sizeof zeros), V, VL_EINVAL, "bad magic 0");
    expect_refused(write_shard_raw(f, "version.bin", MODEL_SHARD_MAGIC, 2, 100, tok, 100, 0), V,
                   VL_EINVAL, "unsupported version 2");
    expect_refused(write_shard_raw(f, "zero.bin", MODEL_SHARD_MAGIC, 1, 0, tok, 0, 0), V, VL_EINVAL,
                   "header says 0 tokens");
    expect_refused(write_shard_raw(f, "neg.bin", MODEL_SHARD_MAGIC, 1, -5, tok, 0, 0), V, VL_EINVAL,
                   "header says -5 tokens");
    /* Truncated: the header promises 100 tokens, 99 are there. */
    expect_refused(write_shard_raw(f, "trunc.bin", MODEL_SHARD_MAGIC, 1, 100, tok, 99, 0), V,
                   VL_EINVAL, "size 1222 bytes, expected 1224 (header + 100 tokens): truncated");
    /* Half a token short. */
    expect_refused(write_shard_raw(f, "odd.bin", MODEL_SHARD_MAGIC, 1, 100, tok, 99, 1), V,
                   VL_EINVAL, "size 1223 bytes, expected 1224");
    expect_refused(write_shard_raw(f, "extra.bin", MODEL_SHARD_MAGIC, 1, 100, tok, 100, 3), V,
                   VL_EINVAL, "size 1227 bytes, expected 1224 (header + 100 tokens): trailing");
    free(tok);
}

static void test_refused_tokens(void **state) {
    fixture *f = *state;
    const int V = 256;
    const size_t N = 1000;
    uint16_t *tok = pattern(N, V);

    tok[417] = (uint16_t)V; /* exactly vocab_size */
    tok[600] = 9999;        /* a later bad one must not be the one reported */
    expect_refused(write_shard(f, "eq.bin", tok, N), V, VL_EINVAL,
                   "token 417 is 256, not below vocab_size 256");
    /* The same file is fine for a larger vocabulary. */
    model_shard *s = open_ok(f->path, 10000);
    model_shard_close(s);

    tok[417] = 3, tok[600] = 10;
    tok[N - 1] = 65535; /* the very last token: the scan reaches the end */
    expect_refused(write_shard(f, "last.bin", tok, N), V, VL_EINVAL,
                   "token 999 is 65535, not below vocab_size 256");
    tok[N - 1] = 0;
    tok[0] = 300; /* and the very first */
    expect_refused(write_shard(f, "first.bin", tok, N), V, VL_EINVAL, "token 0 is 300");
    free(tok);
}

static void test_refused_other(void **state) {
    fixture *f = *state;
    char missing[600];
    assert_true(snprintf(missing, sizeof missing, "%s/missing.bin", f->dir) < (int)sizeof missing);
    expect_refused(missing, 256, VL_ENOTFOUND, "cannot open");
    expect_refused(f->dir, 256, VL_EINVAL, "not a regular file");

    uint16_t *tok = pattern(10, 256);
    const char *path = write_shard(f, "ok.bin", tok, 10);
    expect_refused(path, 0, VL_EINVAL, "vocab_size 0");
    expect_refused(path, MODEL_MAX_VOCAB + 1, VL_EINVAL, "is outside");
    vl_error err = {0};
    assert_int_equal(model_shard_open(NULL, 256, NULL, &err), VL_EINVAL);
    assert_int_equal(model_shard_open(path, 256, NULL, NULL), VL_EINVAL);
    model_shard *s = (model_shard *)&err;
    assert_int_equal(model_shard_open(NULL, 256, &s, NULL), VL_EINVAL);
    assert_null(s);
    /* A NULL err is allowed on failure paths too. */
    assert_int_equal(model_shard_open(missing, 256, &s, NULL), VL_ENOTFOUND);
    free(tok);
}

/* A very long path still leaves room for the detail; the file name stays. */
static void test_long_path_message(void **state) {
    fixture *f = *state;
    char dir[700];
    int n = snprintf(dir, sizeof dir, "%s/", f->dir);
    while (n < 400)
        n += snprintf(dir + n, sizeof dir - (size_t)n, "dir%d/", n); /* NAME_MAX per part */
    assert_true(n < (int)sizeof dir);
    char cmd[900];
    assert_true(snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir) < (int)sizeof cmd);
    assert_int_equal(system(cmd), 0);
    char path[800];
    assert_true(snprintf(path, sizeof path, "%stail_name.bin", dir) < (int)sizeof path);
    uint8_t zeros[10] = {0};
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(zeros, 1, sizeof zeros, fp), sizeof zeros);
    assert_int_equal(fclose(fp), 0);
    vl_error err = {0};
    model_shard *s = NULL;
    assert_int_equal(model_shard_open(path, 256, &s, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "tail_name.bin: no header: 10 bytes, shorter than"));
    assert_non_null(strstr(err.msg, "1024-byte header"));
    assert_true(strlen(err.msg) < sizeof err.msg);
}

/* ---- streaming across chunks ---------------------------------------------- */

static void test_large_shard(void **state) {
    fixture *f = *state;
    const int V = 50257;
    const size_t N = (size_t)3 << 19; /* 3 MiB of tokens: three chunks */
    uint16_t *tok = pattern(N, V);

    model_shard *s = open_ok(write_shard(f, "big.bin", tok, N), V);
    assert_int_equal(model_shard_tokens(s), (int64_t)N);
    int in[4 * 128], tg[4 * 128];
    vl_rng r;
    vl_rng_seed(&r, 77);
    OK(model_shard_sample(s, 4, 128, &r, in, tg, &e_));
    for (int b = 0; b < 4; b++)
        for (int t = 0; t + 1 < 128; t++) assert_int_equal(tg[b * 128 + t], in[b * 128 + t + 1]);
    model_shard_close(s);

    /* One bad token near the end, in the last chunk. */
    size_t bad = N - 12345;
    uint16_t keep = tok[bad];
    tok[bad] = (uint16_t)V;
    char want[96];
    snprintf(want, sizeof want, "token %zu is %d, not below", bad, V);
    expect_refused(write_shard(f, "big_bad.bin", tok, N), V, VL_EINVAL, want);
    tok[bad] = keep;

    /* Either side of each chunk boundary. */
    const size_t edges[] = {(size_t)CHUNK_TOKENS - 1, (size_t)CHUNK_TOKENS,
                            2 * (size_t)CHUNK_TOKENS - 1, 2 * (size_t)CHUNK_TOKENS};
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++) {
        keep = tok[edges[k]];
        tok[edges[k]] = 60000;
        snprintf(want, sizeof want, "token %zu is 60000", edges[k]);
        expect_refused(write_shard(f, "edge.bin", tok, N), V, VL_EINVAL, want);
        tok[edges[k]] = keep;
    }

    /* A shard that does not end on a chunk boundary is scanned to its end. */
    tok[N - 101] = 65535;
    expect_refused(write_shard(f, "ragged.bin", tok, N - 100), V, VL_EINVAL, "is 65535, not below");
    free(tok);
}

/* ---- reading ranges and evaluating ---------------------------------------- */

static void test_read(void **state) {
    fixture *f = *state;
    const int V = 50257;
    const size_t N = (size_t)CHUNK_TOKENS + 5000; /* one chunk and a bit */
    uint16_t *tok = pattern(N, V);
    model_shard *s = open_ok(write_shard(f, "read.bin", tok, N), V);
    uint16_t *out = malloc(N * sizeof *out);
    assert_non_null(out);
    OK(model_shard_read(s, 0, N, out, &e_));
    assert_memory_equal(out, tok, N * sizeof *out);
    /* Across the chunk boundary, from an odd offset. */
    int64_t at = CHUNK_TOKENS - 777;
    OK(model_shard_read(s, at, 2000, out, &e_));
    assert_memory_equal(out, tok + at, 2000 * sizeof *out);
    OK(model_shard_read(s, (int64_t)N, 0, out, &e_));
    vl_error err = {0};
    assert_int_equal(model_shard_read(s, (int64_t)N - 10, 11, out, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "outside its"));
    assert_int_equal(model_shard_read(s, -1, 1, out, &err), VL_EINVAL);
    assert_int_equal(model_shard_read(s, (int64_t)N + 1, 0, out, &err), VL_EINVAL);
    model_shard_close(s);

    /* A token changed after the shard was opened is caught when read. */
    s = open_ok(write_shard(f, "changing.bin", tok, N), V);
    FILE *fp = fopen(f->path, "r+b");
    assert_non_null(fp);
    uint8_t big[2] = {0xff, 0xff};
    assert_int_equal(fseek(fp, MODEL_SHARD_HEADER_BYTES + 2 * 100, SEEK_SET), 0);
    assert_int_equal(fwrite(big, 1, 2, fp), 2);
    assert_int_equal(fclose(fp), 0);
    OK(model_shard_read(s, 0, 100, out, &e_));
    assert_int_equal(model_shard_read(s, 50, 100, out, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "token 100 is 65535"));
    model_shard_close(s);
    free(out);
    free(tok);
}

/* Evaluating tokens is evaluating bytes when the values fit in a byte, bit
 * for bit; and over a wide vocabulary it is the mean of every window's loss
 * as a plain forward pass gives it. */
static void test_eval_tokens(void **state) {
    (void)state;
    model_gpt_config c = {
        .vocab_size = 300, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 16};
    model_gpt *m = NULL;
    OK(model_gpt_create(&c, &m, &e_));
    model_gpt_init_weights(m, 5);
    const int T = 8;
    const size_t N = 8 * 11 + 1; /* 11 windows */
    uint16_t *tok = pattern(N, 256);
    uint8_t bytes[8 * 11 + 1];
    for (size_t i = 0; i < N; i++) bytes[i] = (uint8_t)tok[i];
    float a, b;
    OK(model_gpt_eval_bytes(m, bytes, N, 3, T, 0, &a, &e_));
    OK(model_gpt_eval_tokens(m, tok, N, 3, T, 0, &b, &e_));
    assert_memory_equal(&a, &b, sizeof a);

    for (size_t i = 0; i < N; i++) tok[i] = (uint16_t)((i * 37 + 11) % 300); /* ids above 255 too */
    OK(model_gpt_eval_tokens(m, tok, N, 4, T, 0, &b, &e_));
    double sum = 0;
    int in[8], tg[8];
    for (size_t w = 0; w < 11; w++) {
        for (int t = 0; t < T; t++) {
            in[t] = tok[w * T + (size_t)t];
            tg[t] = tok[w * T + (size_t)t + 1];
        }
        float l;
        OK(model_gpt_forward(m, in, tg, 1, T, &l, &e_));
        sum += l;
    }
    assert_float_equal(b, sum / 11, 1e-5 * fabs(sum / 11));
    /* At most one batch of 4 windows. */
    float one;
    OK(model_gpt_eval_tokens(m, tok, N, 4, T, 1, &one, &e_));
    assert_true(one != b);

    vl_error err = {0};
    assert_int_equal(model_gpt_eval_tokens(m, tok, (size_t)T, 1, T, 0, &a, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "tokens is shorter"));
    tok[3] = 300; /* not below vocab_size */
    assert_int_equal(model_gpt_eval_tokens(m, tok, N, 1, T, 0, &a, &err), VL_EINVAL);
    free(tok);
    model_gpt_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_and_sample, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_matches_data_sample, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_sample_edges, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_sample_refused, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_refused_headers, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_refused_tokens, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_refused_other, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_long_path_message, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_large_shard, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_read, test_dir_setup, test_dir_teardown),
        cmocka_unit_test(test_eval_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
