/*
 * Token shards on the coordinator: the run configuration's "data" section
 * (good and bad inputs, the normalised form, no leaks on any refusal), the
 * token ranges tasks get (inside one shard, uniform over every start,
 * deterministic, and split back into shard and offset), and opening the
 * shards a run names (validation with the shard's own message, the
 * recorded hash, the validation tokens and their loss).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>

#include <cmocka.h>

#include "coordinator/config/config.h"
#include "coordinator/coord.h"
#include "coordinator/base/sched_rules.h"
#include "crypto/crypto.h"

#include "tests/unit/test_util.h"
#include "coordinator/run/run.h"

/* ---- configuration -------------------------------------------------------- */

#define MODEL_50K                                                             \
    "\"model\": {\"vocab_size\": 50257, \"block_size\": 32, \"n_layer\": 1, " \
    "\"n_head\": 2, \"n_embd\": 32}, \"max_body_bytes\": 16777216"
#define SHARDS                                                             \
    "\"data\": {\"kind\": \"shards\", \"train\": [\"a.bin\", \"b.bin\"], " \
    "\"val\": \"v.bin\"}"

static int parse(const char *json, coord_config *cfg, vl_error *e) {
    memset(e, 0, sizeof *e);
    return coord_config_parse(json, strlen(json), cfg, e);
}

/* Refused with VL_EINVAL and a message holding needle; nothing is left
 * to free (ASan's leak check holds the test to that). */
static void expect_error(const char *json, const char *needle) {
    coord_config cfg;
    vl_error e;
    assert_int_equal(parse(json, &cfg, &e), VL_EINVAL);
    if (!strstr(e.msg, needle)) fprintf(stderr, "message: %s (wanted '%s')\n", e.msg, needle);
    assert_non_null(strstr(e.msg, needle));
    assert_null(cfg.train_shards);
    assert_int_equal(cfg.n_train_shards, 0);
}

static void test_config_shards(void **state) {
    (void)state;
    coord_config cfg, again;
    vl_error e;
    const char *json = "{\"name\": \"tok\", " SHARDS ", " MODEL_50K ", \"task_tokens\": 1000}";
    assert_int_equal(parse(json, &cfg, &e), VL_OK);
    assert_true(cfg.shards);
    assert_int_equal(cfg.n_train_shards, 2);
    assert_string_equal(cfg.train_shards[0], "a.bin");
    assert_string_equal(cfg.train_shards[1], "b.bin");
    assert_string_equal(cfg.val_shard, "v.bin");
    assert_int_equal(cfg.task_tokens, 1000);
    assert_int_equal(cfg.model.vocab_size, 50257);

    /* The normalised form parses back to the same run, paths included. */
    char *text = coord_config_to_json(&cfg, 1);
    assert_non_null(text);
    assert_null(strstr(text, "val_fraction"));
    assert_null(strstr(text, "task_bytes"));
    assert_null(strstr(text, "corpus"));
    assert_int_equal(parse(text, &again, &e), VL_OK);
    assert_int_equal(again.n_train_shards, 2);
    assert_string_equal(again.train_shards[1], "b.bin");
    assert_string_equal(again.val_shard, "v.bin");
    assert_int_equal(again.task_tokens, 1000);
    char *text2 = coord_config_to_json(&again, 1);
    assert_string_equal(text, text2);
    free(text);
    free(text2);
    coord_config_free(&again);
    coord_config_free(&again); /* twice is harmless */

    /* Peers get the kind of data, not the paths. */
    text = coord_config_to_json(&cfg, 0);
    assert_non_null(strstr(text, "\"data\":{\"kind\":\"shards\"}"));
    assert_null(strstr(text, "a.bin"));
    assert_null(strstr(text, "v.bin"));
    free(text);
    coord_config_free(&cfg);
    assert_null(cfg.train_shards);

    /* Defaults: 65536 tokens a task; any vocabulary, even below 256. */
    assert_int_equal(
        parse("{\"name\": \"t\", " SHARDS ", \"model\": {\"vocab_size\": 100}}", &cfg, &e), VL_OK);
    assert_int_equal(cfg.task_tokens, 65536);
    coord_config_free(&cfg);
    /* A text corpus keeps its rules: vocab_size >= 256, and any above. */
    expect_error("{\"name\": \"t\", \"corpus\": \"c\", \"model\": {\"vocab_size\": 100}}",
                 "at least 256 for a byte corpus");
    assert_int_equal(parse("{\"name\": \"t\", \"corpus\": \"c\", " MODEL_50K "}", &cfg, &e), VL_OK);
    assert_false(cfg.shards);
    assert_null(cfg.train_shards);
    coord_config_free(&cfg);
}

static void test_config_shards_refused(void **state) {
    (void)state;
    expect_error("{\"name\": \"t\"}", "corpus is required");
    expect_error("{\"name\": \"t\", \"corpus\": \"c\", " SHARDS "}", "exclude each other");
    expect_error("{\"name\": \"t\", \"data\": [1]}", "data must be an object");
    expect_error("{\"name\": \"t\", \"data\": {}}", "data needs kind");
    expect_error("{\"name\": \"t\", \"data\": {\"kind\": \"shards\", \"val\": \"v\"}}",
                 "data needs kind");
    expect_error("{\"name\": \"t\", \"data\": {\"kind\": \"text\", \"train\": [\"a\"], "
                 "\"val\": \"v\"}}",
                 "data.kind must be one of \"shards\"");
    expect_error("{\"name\": \"t\", \"data\": {\"kind\": \"shards\", \"train\": [\"a\"], "
                 "\"val\": \"v\", \"test\": \"x\"}}",
                 "unknown field 'data.test'");
    expect_error("{\"name\": \"t\", \"data\": {\"kind\": \"shards\", \"train\": [], "
                 "\"val\": \"v\"}}",
                 "data.train must be an array of 1 to 4096");
    expect_error("{\"name\": \"t\", \"data\": {\"kind\": \"shards\", \"train\": \"a\", "
                 "\"val\": \"v\"}}",
                 "data.train must be an array");
    expect_error("{\"name\": \"t\", \"data\": {\"kind\": \"shards\", \"train\": [\"a\", 7], "
                 "\"val\": \"v\"}}",
                 "data.train[1] must be a string");
    expect_error("{\"name\": \"t\", \"data\": {\"kind\": \"shards\", \"train\": [\"a\", \"\"], "
                 "\"val\": \"v\"}}",
                 "data.train[1] must be a non-empty string");
    expect_error("{\"name\": \"t\", \"data\": {\"kind\": \"shards\", \"train\": [\"a\"], "
                 "\"val\": 3}}",
                 "data.val must be a string");
    expect_error("{\"name\": \"t\", " SHARDS ", \"val_fraction\": 0.1}",
                 "val_fraction is for a text corpus");
    expect_error("{\"name\": \"t\", " SHARDS ", \"task_bytes\": 1000}",
                 "task_bytes is for a text corpus");
    expect_error("{\"name\": \"t\", \"corpus\": \"c\", \"task_tokens\": 1000}",
                 "task_tokens is for token shards");
    expect_error("{\"name\": \"t\", " SHARDS ", \"task_tokens\": 64}",
                 "task_tokens must be at least model.block_size + 1 (65)");
    expect_error("{\"name\": \"t\", " SHARDS ", \"task_tokens\": 536870913}",
                 "task_tokens must be between 2 and 536870912");
    /* Refusals after the paths were read free them (the leak check). */
    expect_error("{\"name\": \"t\", " SHARDS ", \"model\": {\"n_head\": 3}}", "config: model");
    expect_error("{\"name\": \"t\", " SHARDS ", \"train\": {\"lr\": 0}}", "train.lr");

    /* 4096 shards are fine, 4097 are not. */
    size_t cap = 4097 * 8 + 256;
    char *big = malloc(cap);
    assert_non_null(big);
    for (int n = 4096; n <= 4097; n++) {
        size_t used = (size_t)snprintf(big, cap,
                                       "{\"name\": \"t\", \"data\": {\"kind\": "
                                       "\"shards\", \"val\": \"v\", \"train\": [");
        for (int i = 0; i < n; i++)
            used += (size_t)snprintf(big + used, cap - used, "%s\"s%d\"", i ? "," : "", i);
        snprintf(big + used, cap - used, "]}}");
        coord_config cfg;
        vl_error e;
        int rc = parse(big, &cfg, &e);
        if (n == 4096) {
            assert_int_equal(rc, VL_OK);
            assert_int_equal(cfg.n_train_shards, 4096);
            assert_string_equal(cfg.train_shards[4095], "s4095");
            coord_config_free(&cfg);
        } else {
            assert_int_equal(rc, VL_EINVAL);
            assert_non_null(strstr(e.msg, "1 to 4096"));
        }
    }
    free(big);
}

/* ---- token ranges --------------------------------------------------------- */

static void test_token_ranges(void **state) {
    (void)state;
    const int64_t ntok[3] = {1000, 100, 5000};
    const int64_t first[3] = {0, 1000, 1100};
    const int64_t task = 300;
    /* Starts: 701 in shard 0, 1 in shard 1 (the whole shard), 4701 in 2. */
    const double starts[3] = {701, 1, 4701}, total = 5403;
    int64_t hits[3] = {0, 0, 0}, covered[5000] = {0};
    const int draws = 20000;
    for (int64_t id = 1; id <= draws; id++) {
        int64_t off, len, local, off2, len2;
        int shard;
        assert_int_equal(coord_sched_token_range(7, id, ntok, 3, task, &off, &len), 0);
        assert_int_equal(coord_sched_token_range(7, id, ntok, 3, task, &off2, &len2), 0);
        assert_int_equal(off, off2); /* deterministic */
        assert_int_equal(len, len2);
        assert_int_equal(coord_sched_token_locate(ntok, 3, off, len, &shard, &local), 0);
        assert_int_equal(off, first[shard] + local);
        assert_int_equal(len, ntok[shard] < task ? ntok[shard] : task);
        assert_true(local >= 0 && local + len <= ntok[shard]);
        hits[shard]++;
        if (shard == 2) covered[local]++;
    }
    /* Each shard in proportion to its starts (binomial, 5 sigma). */
    for (int i = 0; i < 3; i++) {
        double p = starts[i] / total, mean = draws * p, sd = sqrt(draws * p * (1 - p));
        if (fabs((double)hits[i] - mean) > 5 * sd + 1)
            fail_msg("shard %d: %lld ranges, expected %.0f", i, (long long)hits[i], mean);
    }
    /* Every start of shard 2 is reachable, the last one included. */
    int64_t reached = 0;
    for (int i = 0; i <= 4700; i++) reached += covered[i] > 0;
    assert_true(reached > 4700 * 9 / 10);
    for (int i = 4701; i < 5000; i++) assert_int_equal(covered[i], 0);
    /* Another run seed draws other ranges. */
    int64_t a, b, l;
    int differ = 0;
    for (int64_t id = 1; id <= 20; id++) {
        assert_int_equal(coord_sched_token_range(7, id, ntok, 3, task, &a, &l), 0);
        assert_int_equal(coord_sched_token_range(8, id, ntok, 3, task, &b, &l), 0);
        differ += a != b;
    }
    assert_true(differ > 15);

    /* Bad inputs. */
    const int64_t empty[2] = {10, 0};
    assert_int_equal(coord_sched_token_range(7, 1, ntok, 0, task, &a, &l), -1);
    assert_int_equal(coord_sched_token_range(7, 1, ntok, 3, 0, &a, &l), -1);
    assert_int_equal(coord_sched_token_range(7, 1, empty, 2, task, &a, &l), -1);

    /* Locating: every edge of every shard, and ranges that cross one. */
    int shard;
    int64_t local;
    assert_int_equal(coord_sched_token_locate(ntok, 3, 0, 1000, &shard, &local), 0);
    assert_int_equal(shard, 0);
    assert_int_equal(coord_sched_token_locate(ntok, 3, 999, 1, &shard, &local), 0);
    assert_int_equal(local, 999);
    assert_int_equal(coord_sched_token_locate(ntok, 3, 1000, 100, &shard, &local), 0);
    assert_int_equal(shard, 1);
    assert_int_equal(local, 0);
    assert_int_equal(coord_sched_token_locate(ntok, 3, 6099, 1, &shard, &local), 0);
    assert_int_equal(shard, 2);
    assert_int_equal(local, 4999);
    assert_int_equal(coord_sched_token_locate(ntok, 3, 999, 2, &shard, &local), -1);
    assert_int_equal(coord_sched_token_locate(ntok, 3, 1050, 51, &shard, &local), -1);
    assert_int_equal(coord_sched_token_locate(ntok, 3, 6099, 2, &shard, &local), -1);
    assert_int_equal(coord_sched_token_locate(ntok, 3, 6100, 1, &shard, &local), -1);
    assert_int_equal(coord_sched_token_locate(ntok, 3, -1, 1, &shard, &local), -1);
    assert_int_equal(coord_sched_token_locate(ntok, 3, 5, 0, &shard, &local), -1);
}

/* ---- opening the shards --------------------------------------------------- */

typedef test_dir_fixture fixture;

/* dir/name: a shard of n tokens, token i = (i * 131 + salt) % 50257. */
static char *write_tokens(fixture *f, const char *name, int64_t n, unsigned salt) {
    snprintf(f->path, sizeof f->path, "%s/%s", f->dir, name);
    uint8_t h[MODEL_SHARD_HEADER_BYTES];
    assert_int_equal(model_shard_header(h, n), 0);
    FILE *fp = fopen(f->path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(h, 1, sizeof h, fp), sizeof h);
    for (int64_t i = 0; i < n; i++) {
        unsigned t = (unsigned)((i * 131 + salt) % 50257);
        uint8_t le[2] = {(uint8_t)(t & 0xff), (uint8_t)(t >> 8)};
        assert_int_equal(fwrite(le, 1, 2, fp), 2);
    }
    assert_int_equal(fclose(fp), 0);
    char *p = strdup(f->path);
    assert_non_null(p);
    return p;
}

/* A parsed shard run over the given files. */
static void shard_config(coord_config *cfg, char *train0, char *train1, const char *val) {
    coord_config_defaults(cfg);
    cfg->shards = 1;
    cfg->model = (model_gpt_config){50257, 16, 1, 2, 16};
    cfg->val_batches = 2;
    cfg->task_tokens = 100;
    cfg->train_shards = calloc(2, sizeof *cfg->train_shards);
    assert_non_null(cfg->train_shards);
    cfg->train_shards[0] = train0;
    cfg->train_shards[1] = train1;
    cfg->n_train_shards = 2;
    snprintf(cfg->val_shard, sizeof cfg->val_shard, "%s", val);
}

static void expect_open_error(const coord_config *cfg, int code, const char *needle) {
    coord_shards s;
    vl_error e = {0};
    assert_int_equal(coord_shards_open(&s, cfg, 0, NULL, &e), code);
    if (!strstr(e.msg, needle)) fprintf(stderr, "message: %s (wanted '%s')\n", e.msg, needle);
    assert_non_null(strstr(e.msg, needle));
    assert_int_equal(s.n, 0);
    assert_null(s.ntok);
}

static void test_open_shards(void **state) {
    fixture *f = *state;
    assert_int_equal(vcrypto_init(), VL_OK);
    coord_config cfg;
    char *val = write_tokens(f, "val.bin", 1000, 5);
    shard_config(&cfg, write_tokens(f, "a.bin", 700, 1), write_tokens(f, "b.bin", 300, 2), val);
    free(val);
    coord_shards s;
    OK(coord_shards_open(&s, &cfg, 0, NULL, &e_));
    assert_int_equal(s.n, 2);
    assert_int_equal(s.ntok[0], 700);
    assert_int_equal(s.ntok[1], 300);
    assert_int_equal(s.train_tokens, 1000);
    assert_int_equal(s.val_tokens, 1000);
    assert_int_equal(s.size, 3 * MODEL_SHARD_HEADER_BYTES + 2 * 2000);
    /* val_batches 2 x 8 windows x 16 tokens, and the last target. */
    assert_int_equal(s.val_len, 2 * COORD_VAL_BATCH * 16 + 1);
    for (size_t i = 0; i < s.val_len; i++) assert_int_equal(s.val[i], (i * 131 + 5) % 50257);
    OK(coord_shards_check(&s, 1, &e_));

    /* The validation loss is the model's loss on those tokens. */
    model_gpt *m = NULL;
    OK(model_gpt_create(&cfg.model, &m, &e_));
    model_gpt_init_weights(m, 3);
    float a, b, c, d;
    OK(coord_val_loss(&cfg, NULL, &s, m, cfg.val_batches, &a, &e_));
    OK(model_gpt_eval_tokens(m, s.val, s.val_len, COORD_VAL_BATCH, 16, 2, &b, &e_));
    assert_memory_equal(&a, &b, sizeof a);
    assert_true(fabs(a - log(50257.0)) < 0.3);
    /* The check scores the first batch only. */
    OK(coord_val_loss(&cfg, NULL, &s, m, 1, &c, &e_));
    OK(model_gpt_eval_tokens(m, s.val, s.val_len, COORD_VAL_BATCH, 16, 1, &d, &e_));
    assert_memory_equal(&c, &d, sizeof c);
    assert_true(c != a);
    model_gpt_free(m);

    /* Reopened against what was recorded: the same; a changed shard (same
     * size) is refused. */
    char hash[65];
    int64_t size = s.size;
    memcpy(hash, s.hash, sizeof hash);
    coord_shards_close(&s);
    coord_shards again;
    OK(coord_shards_open(&again, &cfg, size, hash, &e_));
    assert_string_equal(again.hash, hash);
    coord_shards_close(&again);
    free(write_tokens(f, "b.bin", 300, 3));
    vl_error e = {0};
    assert_int_equal(coord_shards_open(&again, &cfg, size, hash, &e), VL_ECONFLICT);
    assert_non_null(strstr(e.msg, "changed since init"));
    assert_int_equal(coord_shards_open(&again, &cfg, size + 2, hash, &e), VL_ECONFLICT);
    assert_non_null(strstr(e.msg, "size differs"));

    /* A shard modified while served is noticed. */
    OK(coord_shards_open(&again, &cfg, 0, NULL, &e_));
    struct timeval tv[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
    assert_int_equal(utimes(cfg.train_shards[0], tv), 0);
    assert_int_equal(coord_shards_check(&again, 0, &e), VL_ECONFLICT);
    assert_int_equal(coord_shards_check(&again, 2, &e), VL_EIO);
    coord_shards_close(&again);
    coord_shards_close(&again); /* twice is harmless */
    coord_config_free(&cfg);
}

static void test_open_shards_refused(void **state) {
    fixture *f = *state;
    assert_int_equal(vcrypto_init(), VL_OK);
    coord_config cfg;
    char *val = write_tokens(f, "val.bin", 1000, 5);
    char *b = write_tokens(f, "b.bin", 300, 2);
    shard_config(&cfg, write_tokens(f, "a.bin", 700, 1), b, val);
    free(val);

    /* Bad magic, in the second shard: its own message, with its path. */
    FILE *fp = fopen(b, "r+b");
    assert_non_null(fp);
    assert_int_equal(fputc(0x77, fp), 0x77);
    assert_int_equal(fclose(fp), 0);
    expect_open_error(&cfg, VL_EINVAL, "bad magic");
    expect_open_error(&cfg, VL_EINVAL, b);
    /* A token at or above vocab_size. */
    free(write_tokens(f, "b.bin", 300, 2));
    cfg.model.vocab_size = 50000;
    expect_open_error(&cfg, VL_EINVAL, "not below vocab_size 50000");
    cfg.model.vocab_size = 50257;
    /* Truncated. */
    assert_int_equal(truncate(b, MODEL_SHARD_HEADER_BYTES + 599), 0);
    expect_open_error(&cfg, VL_EINVAL, "truncated");
    /* Too short for one window. */
    free(write_tokens(f, "b.bin", 16, 2));
    expect_open_error(&cfg, VL_EINVAL, "16 tokens, fewer than one window");
    free(write_tokens(f, "b.bin", 17, 2));
    coord_shards s;
    OK(coord_shards_open(&s, &cfg, 0, NULL, &e_));
    coord_shards_close(&s);
    /* Missing validation shard; a bad one. */
    snprintf(cfg.val_shard, sizeof cfg.val_shard, "%s/none.bin", f->dir);
    expect_open_error(&cfg, VL_ENOTFOUND, "none.bin: cannot open");
    free(write_tokens(f, "short_val.bin", 10, 2));
    snprintf(cfg.val_shard, sizeof cfg.val_shard, "%s", f->path);
    expect_open_error(&cfg, VL_EINVAL, "10 tokens, fewer than one window");
    /* Not a shard run. */
    cfg.shards = 0;
    expect_open_error(&cfg, VL_EINVAL, "no token shards");
    coord_config_free(&cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_shards),
        cmocka_unit_test(test_config_shards_refused),
        cmocka_unit_test(test_token_ranges),
        cmocka_unit_test_setup_teardown(test_open_shards, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_open_shards_refused, test_dir_setup,
                                        test_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
