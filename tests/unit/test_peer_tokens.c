/* The peer's side of token shards: leases that name a token range (and
 * the byte leases they sit beside), and local training on a token shard,
 * which must be exactly local training on the same tokens held as bytes
 * whenever they fit in a byte. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "peer/peer.h"
#include "peer_fixtures.h"
#include "test_util.h"

static const char TOKEN_TASK[] =
    "{\"task_id\": 17, \"run\": \"demo\", \"base_version\": 5,"
    " \"data\": {\"kind\": \"tokens\", \"shard\": 3, \"offset\": 1000, \"length\": 65536},"
    " \"train\": {\"steps\": 10, \"batch\": 8, \"context\": 64, \"optimizer\": \"adamw\","
    "   \"lr\": 0.001, \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-8,"
    "   \"weight_decay\": 0.0, \"grad_clip\": 1.0, \"seed\": 99173},"
    " \"compression\": {\"kind\": \"none\", \"dtype\": \"F32\"},"
    " \"deadline\": 1795000000}";

/* TOKEN_TASK with from replaced by to (first occurrence); parse result. */
static int parse_variant(const char *from, const char *to, peer_task *t, vl_error *e) {
    const char *p = strstr(TOKEN_TASK, from);
    assert_non_null(p);
    size_t a = (size_t)(p - TOKEN_TASK), fl = strlen(from), tl = strlen(to);
    char *s = malloc(sizeof TOKEN_TASK + tl);
    assert_non_null(s);
    memcpy(s, TOKEN_TASK, a);
    memcpy(s + a, to, tl);
    memcpy(s + a + tl, p + fl, sizeof TOKEN_TASK - a - fl);
    int rc = peer_task_parse(s, strlen(s), t, e);
    free(s);
    return rc;
}

static void rejected(const char *from, const char *to, const char *needle) {
    peer_task t;
    vl_error e = {0};
    assert_int_equal(parse_variant(from, to, &t, &e), VL_EINVAL);
    if (!strstr(e.msg, needle)) fail_msg("message '%s' lacks '%s'", e.msg, needle);
}

static void test_token_task(void **state) {
    (void)state;
    peer_task t;
    OK(peer_task_parse(TOKEN_TASK, strlen(TOKEN_TASK), &t, &e_));
    assert_true(t.tokens);
    assert_int_equal(t.shard_index, 3);
    assert_int_equal(t.offset, 1000);
    assert_int_equal(t.length, 65536);
    /* The largest range a peer takes on: 2^29 tokens (1 GiB on disk). */
    OK(parse_variant("\"length\": 65536", "\"length\": 536870912", &t, &e_));
    assert_int_equal(t.length, (int64_t)1 << 29);

    /* Byte leases, with or without a kind, are what they were. */
    const char *bytes = "\"data\": {\"shard\": \"train\", \"offset\": 9, \"length\": 65536}";
    OK(parse_variant("\"data\": {\"kind\": \"tokens\", \"shard\": 3, \"offset\": 1000, "
                     "\"length\": 65536}",
                     bytes, &t, &e_));
    assert_false(t.tokens);
    assert_string_equal(t.shard, "train");
    assert_int_equal(t.offset, 9);
    OK(parse_variant("\"kind\": \"tokens\", \"shard\": 3",
                     "\"kind\": \"bytes\", \"shard\": \"train\"", &t, &e_));
    assert_false(t.tokens);
    assert_int_equal(t.offset, 1000);
    /* Bytes stay capped at 2^30, tokens at 2^29. */
    OK(parse_variant("\"kind\": \"tokens\", \"shard\": 3, \"offset\": 1000, \"length\": 65536",
                     "\"kind\": \"bytes\", \"shard\": \"train\", \"offset\": 0, "
                     "\"length\": 1073741824",
                     &t, &e_));
    rejected("\"length\": 65536", "\"length\": 536870913", "'data.length' = 536870913");

    rejected("\"kind\": \"tokens\"", "\"kind\": \"words\"", "data kind 'words' is not supported");
    rejected("\"kind\": \"tokens\"", "\"kind\": 1", "'data.kind' must be a string");
    rejected("\"shard\": 3", "\"shard\": \"train\"", "'data.shard' must be an integer");
    rejected("\"shard\": 3", "\"shard\": -1", "'data.shard' = -1 is outside");
    rejected("\"shard\": 3", "\"shard\": 1048577", "'data.shard' = 1048577 is outside");
    rejected("\"shard\": 3, ", "", "missing field 'data.shard'");
    rejected("\"offset\": 1000", "\"offset\": -5", "'data.offset' = -5");
    rejected("\"length\": 65536", "\"length\": 64", "shorter than context + 1");
    rejected("\"length\": 65536", "\"length\": 0", "'data.length' = 0");
}

/* Token data need no byte vocabulary; byte data do. */
static void test_token_task_model(void **state) {
    (void)state;
    peer_task t;
    OK(peer_task_parse(TOKEN_TASK, strlen(TOKEN_TASK), &t, &e_));
    model_gpt_config small = {100, 64, 1, 2, 16};
    OK(peer_task_check_model(&t, &small, &e_));
    t.tokens = 0;
    vl_error e = {0};
    assert_int_equal(peer_task_check_model(&t, &small, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "the data is bytes"));
    t.tokens = 1;
    small.block_size = 32;
    assert_int_equal(peer_task_check_model(&t, &small, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "block size"));
}

/* ---- training on a shard -------------------------------------------------- */

typedef test_dir_fixture fixture;

/* Writes tokens as an llm.c shard and opens it for vocab. */
static model_shard *shard_of(fixture *f, const uint16_t *tok, size_t n, int vocab) {
    snprintf(f->path, sizeof f->path, "%s/task.tokens", f->dir);
    uint8_t h[MODEL_SHARD_HEADER_BYTES];
    assert_int_equal(model_shard_header(h, (int64_t)n), 0);
    FILE *fp = fopen(f->path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(h, 1, sizeof h, fp), sizeof h);
    for (size_t i = 0; i < n; i++) {
        uint8_t le[2] = {(uint8_t)(tok[i] & 0xff), (uint8_t)(tok[i] >> 8)};
        assert_int_equal(fwrite(le, 1, 2, fp), 2);
    }
    assert_int_equal(fclose(fp), 0);
    model_shard *s = NULL;
    OK(model_shard_open(f->path, vocab, &s, &e_));
    return s;
}

static void test_train_on_shard(void **state) {
    fixture *f = *state;
    /* 300 bytes of text, and the same values as tokens. */
    uint8_t text[300];
    uint16_t tok[300];
    for (size_t i = 0; i < sizeof text; i++) {
        text[i] = (uint8_t) "volley trains one model on many machines. "[i % 42];
        tok[i] = text[i];
    }
    peer_task k = tiny_task(5);
    k.tokens = 1;
    k.length = 300;
    peer_trainer a, b;
    peer_trainer_init(&a);
    peer_trainer_init(&b);
    OK(peer_trainer_init_model(&a, &TINY, 0, &e_));
    OK(peer_trainer_init_model(&b, &TINY, 0, &e_));
    model_shard *s = shard_of(f, tok, 300, TINY.vocab_size);
    peer_train_result ra, rb;
    OK(peer_trainer_run(&a, &k, text, sizeof text, &ra, &e_));
    OK(peer_trainer_run_shard(&b, &k, s, &rb, &e_));
    /* The same windows in the same order: the same training, bit for bit. */
    assert_int_equal(ra.steps, 5);
    assert_int_equal(rb.steps, 5);
    assert_memory_equal(&ra.first_loss, &rb.first_loss, sizeof ra.first_loss);
    assert_memory_equal(&ra.mean_loss, &rb.mean_loss, sizeof ra.mean_loss);
    assert_memory_equal(a.delta, b.delta, a.n_params * sizeof *a.delta);
    assert_int_equal(rb.tokens, 5 * 4 * 16);
    model_shard_close(s);

    /* A shard shorter than one window is refused before training. */
    s = shard_of(f, tok, 16, TINY.vocab_size);
    vl_error e = {0};
    assert_int_equal(peer_trainer_run_shard(&b, &k, s, &rb, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "16 tokens; a sequence needs 17"));
    model_shard_close(s);
    assert_int_equal(peer_trainer_run_shard(&b, &k, NULL, &rb, &e), VL_EINVAL);
    peer_trainer_free(&a);
    peer_trainer_free(&b);
}

/* GPT-2's vocabulary: ids far above a byte train, from ln V down. */
static void test_train_wide_vocab(void **state) {
    fixture *f = *state;
    const model_gpt_config wide = {50257, 16, 1, 2, 16};
    uint16_t tok[400];
    for (size_t i = 0; i < 400; i++) tok[i] = (uint16_t)(197 * ("abcabd"[i % 6]));
    peer_task k = tiny_task(8);
    k.tokens = 1;
    k.length = 400;
    peer_trainer t;
    peer_trainer_init(&t);
    OK(peer_trainer_init_model(&t, &wide, 0, &e_));
    model_shard *s = shard_of(f, tok, 400, wide.vocab_size);
    peer_train_result r;
    OK(peer_trainer_run_shard(&t, &k, s, &r, &e_));
    assert_true(fabs(r.first_loss - log(50257.0)) < 0.5);
    assert_true(r.last_loss < r.first_loss - 1.0);
    model_shard_close(s);
    peer_trainer_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_task),
        cmocka_unit_test(test_token_task_model),
        cmocka_unit_test_setup_teardown(test_train_on_shard, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_train_wide_vocab, test_dir_setup, test_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
