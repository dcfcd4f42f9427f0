/* coordinator: the run configuration as coord_config_parse reads it (its
 * defaults, validation held-out sizes, compression ratios, the sketch
 * outer step, the refusal of a version whose loss blew up, the
 * learning-rate schedule), errors that name the field, the corpus checks
 * and durations. The outer step and the scheduler are test_coordinator.c's. */
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
#include "coordinator/config/config.h"
#include "coordinator/base/sched_rules.h"

/* ---- configuration ------------------------------------------------------- */

static int parse(const char *json, coord_config *cfg, vl_error *e) {
    memset(e, 0, sizeof *e);
    return coord_config_parse(json, strlen(json), cfg, e);
}

static void expect_config_error(const char *json, const char *needle) {
    coord_config cfg;
    vl_error e;
    assert_int_equal(parse(json, &cfg, &e), VL_EINVAL);
    if (!strstr(e.msg, needle)) fprintf(stderr, "message: %s (wanted '%s')\n", e.msg, needle);
    assert_non_null(strstr(e.msg, needle));
}

/* How much held-out data validation scores: val_tokens rounded up to
 * whole batches of 8 windows, 0 for all, or val_batches; not both. The
 * loss check before serving (val_check_tokens): 4 Ki in an async run
 * that waits (lease_wait, on by default), else off unless given, rounded
 * up to whole batches, off when it would cover the full score, and the
 * same after the stored form is parsed again. */
static void test_config_val_tokens(void **state) {
    (void)state;
    static const struct {
        const char *given;
        int64_t batches, tokens, check_batches, check_tokens;
    } cases[] = {
        {"\"val_tokens\": 1000", 2, 1024, 0, 0}, /* two batches of 8 x 64 */
        {"\"val_tokens\": 0", 0, 0, 0, 0},
        {"\"val_batches\": 3", 3, 3 * 8 * 64, 0, 0},
        {"\"mode\": \"async\", \"val_tokens\": 65536", 128, 65536, 8, 4096},
        {"\"mode\": \"async\", \"lease_wait\": 0, \"val_tokens\": 65536", 128, 65536, 0, 0},
        {"\"mode\": \"async\", \"val_tokens\": 65536, \"val_check_tokens\": 0", 128, 65536, 0, 0},
        {"\"mode\": \"async\", \"val_tokens\": 4096", 8, 4096, 0, 0},
        {"\"mode\": \"async\", \"val_tokens\": 65536, \"val_check_tokens\": 4096", 128, 65536, 8,
         4096},
        {"\"val_tokens\": 8192, \"val_check_tokens\": 600", 16, 8192, 2, 1024},
        {"\"val_tokens\": 1024, \"val_check_tokens\": 600", 2, 1024, 0, 0},
    };
    const char *base = "{\"name\": \"v\", \"corpus\": \"c.txt\", \"model\": "
                       "{\"block_size\": 64}, ";
    char json[512];
    coord_config cfg, again;
    vl_error e;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(json, sizeof json, "%s%s}", base, cases[i].given);
        assert_int_equal(parse(json, &cfg, &e), VL_OK);
        char *stored = coord_config_to_json(&cfg, 1);
        assert_non_null(stored);
        assert_int_equal(parse(stored, &again, &e), VL_OK);
        free(stored);
        const coord_config *c[2] = {&cfg, &again};
        for (int k = 0; k < 2; k++) {
            assert_int_equal(c[k]->val_batches, cases[i].batches);
            assert_int_equal(c[k]->val_tokens, cases[i].tokens);
            assert_int_equal(c[k]->val_check_batches, cases[i].check_batches);
            assert_int_equal(c[k]->val_check_tokens, cases[i].check_tokens);
        }
        coord_config_free(&again);
        coord_config_free(&cfg);
    }
    snprintf(json, sizeof json, "%s\"val_batches\": 3, \"val_tokens\": 100}", base);
    expect_config_error(json, "not both");
    snprintf(json, sizeof json, "%s\"val_tokens\": -1}", base);
    expect_config_error(json, "val_tokens");
    snprintf(json, sizeof json, "%s\"val_check_tokens\": -5}", base);
    expect_config_error(json, "val_check_tokens");
}

/* The refusal of a version whose loss blew up: the rule by hand, and its
 * setting's default, range and place in the stored configuration. */
static void test_version_refusal(void **state) {
    (void)state;
    assert_false(coord_sched_version_refused(2.3, 2.0, 0.2));
    assert_false(coord_sched_version_refused(2.4, 2.0, 0.2)); /* exactly 20 % above: kept */
    assert_true(coord_sched_version_refused(2.41, 2.0, 0.2));
    assert_true(coord_sched_version_refused(NAN, 2.0, 0.2));
    assert_true(coord_sched_version_refused(INFINITY, NAN, 0.2));
    assert_true(coord_sched_version_refused(NAN, 2.0, 0));     /* not a number: always */
    assert_false(coord_sched_version_refused(50.0, 2.0, 0));   /* 0: only that */
    assert_false(coord_sched_version_refused(50.0, NAN, 0.2)); /* no best yet */
    assert_false(coord_sched_version_refused(1.0, 2.0, 0.2));  /* better is kept */

    coord_config cfg;
    vl_error e;
    const char *base = "{\"name\": \"v\", \"corpus\": \"c.txt\", ";
    char json[256];
    snprintf(json, sizeof json, "%s\"seed\": 1}", base);
    assert_int_equal(parse(json, &cfg, &e), VL_OK);
    assert_true(cfg.max_loss_rise == COORD_MAX_LOSS_RISE_DEFAULT);
    coord_config_free(&cfg);
    snprintf(json, sizeof json, "%s\"max_loss_rise\": 0.5}", base);
    assert_int_equal(parse(json, &cfg, &e), VL_OK);
    assert_true(cfg.max_loss_rise == 0.5);
    char *text = coord_config_to_json(&cfg, 1);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"max_loss_rise\""));
    coord_config again;
    assert_int_equal(coord_config_parse(text, strlen(text), &again, &e), VL_OK);
    assert_true(again.max_loss_rise == 0.5);
    coord_config_free(&again);
    free(text);
    coord_config_free(&cfg);
    /* What one version may take: sync twice its updates, async exactly. */
    snprintf(json, sizeof json, "%s\"updates_per_version\": 4}", base);
    assert_int_equal(parse(json, &cfg, &e), VL_OK);
    assert_int_equal(coord_config_merge_max(&cfg), 4 * COORD_SYNC_MERGE_FACTOR);
    coord_config_free(&cfg);
    snprintf(json, sizeof json, "%s\"updates_per_version\": 4, \"mode\": \"async\"}", base);
    assert_int_equal(parse(json, &cfg, &e), VL_OK);
    assert_int_equal(coord_config_merge_max(&cfg), 4);
    coord_config_free(&cfg);
    snprintf(json, sizeof json, "%s\"max_loss_rise\": -0.1}", base);
    expect_config_error(json, "max_loss_rise");
    snprintf(json, sizeof json, "%s\"max_loss_rise\": \"high\"}", base);
    expect_config_error(json, "max_loss_rise");
}

static void test_config_defaults(void **state) {
    (void)state;
    coord_config cfg;
    vl_error e;
    assert_int_equal(parse("{\"name\": \"demo\", \"corpus\": \"c.txt\"}", &cfg, &e), VL_OK);
    assert_string_equal(cfg.name, "demo");
    assert_string_equal(cfg.corpus, "c.txt");
    assert_true(cfg.val_fraction == 0.1);
    assert_int_equal(cfg.seed, 1337);
    assert_int_equal(cfg.model.block_size, 64);
    assert_int_equal(cfg.model.n_embd, 128);
    assert_string_equal(cfg.mode, "sync");
    assert_int_equal(cfg.updates_per_version, 4);
    assert_int_equal(cfg.max_versions, 30);
    assert_int_equal(cfg.train.steps, 10);
    assert_string_equal(cfg.train.optimizer, "adamw");
    assert_true(cfg.train.eps == 1e-8);
    assert_true(cfg.outer_lr == 0.7);
    assert_true(cfg.outer_momentum == 0.9);
    assert_string_equal(cfg.compression_kind, "none");
    assert_string_equal(cfg.compression_dtype, "F32");
    assert_int_equal(cfg.task_bytes, 65536);
    assert_int_equal(cfg.lease_s, 120);
    assert_int_equal(cfg.max_body_bytes, 67108864);
    /* 256 Ki held-out tokens in batches of 8 windows of block_size. */
    assert_int_equal(cfg.val_tokens, COORD_VAL_TOKENS_DEFAULT);
    assert_int_equal(cfg.val_batches, (COORD_VAL_TOKENS_DEFAULT + 8 * cfg.model.block_size - 1) /
                                          (8 * cfg.model.block_size));
    assert_int_equal(cfg.keep_versions, 4);
    /* The normalised JSON parses back to the same configuration. */
    char *json = coord_config_to_json(&cfg, 1);
    assert_non_null(json);
    coord_config again;
    assert_int_equal(parse(json, &again, &e), VL_OK);
    assert_memory_equal(&cfg, &again, sizeof cfg);
    free(json);
    /* Peers' copy leaves the corpus path out. */
    json = coord_config_to_json(&cfg, 0);
    assert_null(strstr(json, "corpus"));
    free(json);
}

/* Without an "outer" object a sketch run takes its own outer step (with
 * and without a second round); given, it is the run's; other kinds keep
 * DiLoCo's. An async sketch run may turn the second round off. */
static void test_config_sketch_outer_default(void **state) {
    (void)state;
    coord_config cfg, again;
    vl_error e;
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"sketch\", \"ratio\": 10}}",
                           &cfg, &e),
                     VL_OK);
    assert_true(cfg.outer_lr == COORD_SKETCH_ROUND_LR);
    assert_true(cfg.outer_momentum == COORD_SKETCH_ROUND_MOMENTUM);
    char *json = coord_config_to_json(&cfg, 1);
    assert_int_equal(parse(json, &again, &e), VL_OK);
    assert_memory_equal(&cfg, &again, sizeof cfg);
    free(json);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\", "
                           "\"compression\": {\"kind\": \"sketch\", \"ratio\": 10, "
                           "\"second_round\": 0}}",
                           &cfg, &e),
                     VL_OK);
    assert_int_equal(cfg.second_round, 0);
    assert_true(cfg.outer_lr == COORD_SKETCH_LR);
    assert_true(cfg.outer_momentum == COORD_SKETCH_MOMENTUM);
    assert_int_equal(coord_config_round_candidates(&cfg), 0);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"outer\": {\"lr\": 0.3}, "
                           "\"compression\": {\"kind\": \"sketch\", \"ratio\": 10}}",
                           &cfg, &e),
                     VL_OK);
    assert_true(cfg.outer_lr == 0.3);
    assert_true(cfg.outer_momentum == 0.9);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"topk\", \"ratio\": 10}}",
                           &cfg, &e),
                     VL_OK);
    assert_true(cfg.outer_lr == COORD_SPARSE_OUTER_LR && cfg.outer_momentum == 0);
    assert_int_equal(cfg.second_round, 0);
}

/* A compression ratio R makes an update R times smaller than a dense F32
 * one; what the ratio resolves to is stored, so it parses back the same. */
static void test_config_compression(void **state) {
    (void)state;
    coord_config cfg, again;
    vl_error e;
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"topk\", \"ratio\": 100}}",
                           &cfg, &e),
                     VL_OK);
    size_t n = model_gpt_config_num_params(&cfg.model);
    /* Compressed kinds default to F16 values (an entry is 4 + 2 bytes). */
    assert_string_equal(cfg.compression_dtype, "F16");
    assert_int_equal(cfg.comp_k, (int64_t)(4.0 * (double)n / (100.0 * 6.0)));
    assert_int_equal(cfg.apply_k, cfg.comp_k * cfg.updates_per_version);
    assert_string_equal(coord_config_update_kind(&cfg), "topk");
    assert_int_equal(cfg.keep_changes, 1000);
    char *json = coord_config_to_json(&cfg, 1);
    assert_int_equal(parse(json, &again, &e), VL_OK);
    assert_memory_equal(&cfg, &again, sizeof cfg);
    free(json);

    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"seed\": 5, "
                           "\"compression\": {\"kind\": \"sketch\", \"dtype\": \"F16\", "
                           "\"ratio\": 1000, \"rows\": 3}}",
                           &cfg, &e),
                     VL_OK);
    /* A sync sketch run has the second round by default, and the ratio's
     * budget is shared: a tenth for the sketch, the rest for one F16
     * value per candidate. */
    double budget = 4.0 * (double)n / 1000.0;
    assert_int_equal(cfg.comp_rows, 3);
    assert_int_equal(cfg.second_round, COORD_SKETCH_SECOND_ROUND);
    assert_int_equal(cfg.comp_cols, (int64_t)(COORD_SKETCH_SHARE * budget / (3 * 2)));
    assert_int_equal(cfg.apply_k, (int64_t)((budget - COORD_SKETCH_SHARE * budget) / 2.0));
    assert_true((double)(cfg.comp_rows * cfg.comp_cols * 2) +
                    2.0 * (double)coord_config_round_candidates(&cfg) <=
                budget);
    assert_int_equal(cfg.comp_k, cfg.comp_cols / 2);
    assert_int_equal(cfg.comp_seed, 5);
    assert_string_equal(coord_config_update_kind(&cfg), "sketch");
    compress_spec spec;
    coord_config_spec(&cfg, &spec);
    assert_int_equal(spec.kind, COMPRESS_SKETCH);
    assert_int_equal(spec.cols, cfg.comp_cols);
    assert_true(spec.seed == 5);
    coord_config dense;
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\"}", &dense, &e), VL_OK);
    assert_true(coord_config_update_bytes(&dense) > (int64_t)(4 * n));
    assert_true(coord_config_update_bytes(&cfg) < coord_config_update_bytes(&dense) / 100);
    json = coord_config_to_json(&cfg, 1);
    assert_int_equal(parse(json, &again, &e), VL_OK);
    assert_memory_equal(&cfg, &again, sizeof cfg);
    free(json);

    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"gaussk\", \"k\": 1000}}",
                           &cfg, &e),
                     VL_OK);
    coord_config_spec(&cfg, &spec);
    assert_int_equal(spec.kind, COMPRESS_TOPK);
    assert_int_equal(spec.max_nnz, COMPRESS_GAUSSK_CAP(1000));
    /* The second round: sketch runs only; P * apply_k candidates (at most
     * the model); round_s defaults to 30 s; both survive normalisation. */
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"sketch\", \"ratio\": 100, \"second_round\": 3}}",
                           &cfg, &e),
                     VL_OK);
    assert_int_equal(cfg.second_round, 3);
    assert_int_equal(cfg.round_s, 30);
    assert_int_equal(coord_config_round_candidates(&cfg), 3 * cfg.apply_k);
    json = coord_config_to_json(&cfg, 1);
    assert_non_null(strstr(json, "\"second_round\":3"));
    assert_int_equal(parse(json, &again, &e), VL_OK);
    assert_memory_equal(&cfg, &again, sizeof cfg);
    free(json);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"sketch\", \"cols\": 100000, \"k\": 10000, "
                           "\"second_round\": 64}}",
                           &cfg, &e),
                     VL_OK);
    assert_int_equal(coord_config_round_candidates(&cfg), (int64_t)n);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"topk\", \"ratio\": 100, \"second_round\": 2}}",
                           &cfg, &e),
                     VL_EINVAL);
    assert_non_null(strstr(e.msg, "second_round is for sketch runs"));
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"sketch\", \"ratio\": 100, \"second_round\": 65}}",
                           &cfg, &e),
                     VL_EINVAL);
    assert_non_null(strstr(e.msg, "compression.second_round"));
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"sketch\", \"ratio\": 100, \"second_round\": 1, "
                           "\"round_s\": 0}}",
                           &cfg, &e),
                     VL_EINVAL);
    assert_non_null(strstr(e.msg, "compression.round_s"));
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"none\"}}",
                           &cfg, &e),
                     VL_OK);
    assert_int_equal(coord_config_round_candidates(&cfg), 0);
    /* Block top-k and residual decay: classic by default, kept through
     * normalisation, refused where the kind has no use for them. */
    assert_int_equal(cfg.comp_block, 0);
    assert_true(cfg.comp_decay == 1.0);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"topk\", \"ratio\": 100, \"block\": 512, "
                           "\"decay\": 0.9}}",
                           &cfg, &e),
                     VL_OK);
    assert_int_equal(cfg.comp_block, 512);
    assert_true(cfg.comp_decay == 0.9);
    /* The kind and its ratio alone get the settings that met the 100x
     * target: blocks and decay for topk, decay for gaussk, and the sparse
     * kinds' outer step; an "outer" object given is kept. */
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"gaussk\", \"ratio\": 100}}",
                           &cfg, &e),
                     VL_OK);
    assert_int_equal(cfg.comp_block, 0);
    assert_true(cfg.comp_decay == COORD_SPARSE_DECAY);
    assert_true(cfg.outer_lr == COORD_SPARSE_OUTER_LR && cfg.outer_momentum == 0);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"outer\": {\"lr\": 0.5}, "
                           "\"compression\": {\"kind\": \"topk\", \"ratio\": 100}}",
                           &cfg, &e),
                     VL_OK);
    assert_true(cfg.outer_lr == 0.5 && cfg.outer_momentum == 0.9);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"topk\", \"ratio\": 100}}",
                           &cfg, &e),
                     VL_OK);
    assert_int_equal(cfg.comp_block, COORD_TOPK_BLOCK);
    assert_true(cfg.comp_decay == COORD_SPARSE_DECAY);
    assert_true(cfg.outer_lr == COORD_SPARSE_OUTER_LR && cfg.outer_momentum == 0);
    json = coord_config_to_json(&cfg, 1);
    assert_non_null(strstr(json, "\"block\":512"));
    assert_int_equal(parse(json, &again, &e), VL_OK);
    assert_memory_equal(&cfg, &again, sizeof cfg);
    free(json);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"gaussk\", \"ratio\": 100, \"decay\": 0.5}}",
                           &cfg, &e),
                     VL_OK);
    static const char *const bad_fb[][2] = {
        {"{\"kind\": \"gaussk\", \"ratio\": 100, \"block\": 512}", "block is for topk"},
        {"{\"kind\": \"sketch\", \"ratio\": 100, \"block\": 512}", "block is for topk"},
        {"{\"kind\": \"sketch\", \"ratio\": 100, \"decay\": 0.9}", "decay is for topk"},
        {"{\"kind\": \"none\", \"decay\": 0.9}", "do not apply to uncompressed"},
        {"{\"kind\": \"topk\", \"ratio\": 100, \"decay\": 0}", "compression.decay"},
        {"{\"kind\": \"topk\", \"ratio\": 100, \"decay\": 1.5}", "compression.decay"},
        {"{\"kind\": \"topk\", \"ratio\": 100, \"block\": -1}", "compression.block"},
        {"{\"kind\": \"topk\", \"ratio\": 100, \"block\": 1.5}", "compression.block"},
    };
    for (size_t i = 0; i < sizeof bad_fb / sizeof bad_fb[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"name\": \"d\", \"corpus\": \"c\", \"compression\": %s}",
                 bad_fb[i][0]);
        assert_int_equal(parse(text, &cfg, &e), VL_EINVAL);
        if (!strstr(e.msg, bad_fb[i][1])) fail_msg("'%s' lacks '%s'", e.msg, bad_fb[i][1]);
    }
    /* "dense" is the older name of "none". */
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                           "{\"kind\": \"dense\"}}",
                           &cfg, &e),
                     VL_OK);
    assert_string_equal(cfg.compression_kind, "none");
    assert_int_equal(cfg.keep_changes, cfg.keep_versions);
}

static void test_config_errors_name_the_field(void **state) {
    (void)state;
    expect_config_error("[1]", "top level");
    expect_config_error("{\"name\": \"d\"", "invalid JSON");
    expect_config_error("{\"corpus\": \"c\"}", "name is required");
    expect_config_error("{\"name\": \"d\"}", "corpus is required");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"colour\": 1}", "'colour'");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": {\"speed\": 1}}",
                        "'train.speed'");
    expect_config_error("{\"name\": \"d e\", \"corpus\": \"c\"}", "name may hold");
    expect_config_error("{\"name\": \"d\", \"name\": \"e\", \"corpus\": \"c\"}", "invalid JSON");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": {\"lr\": \"fast\"}}",
                        "train.lr must be a number");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": {\"lr\": 0}}",
                        "train.lr must be in");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"outer\": {\"momentum\": 1.0}}",
                        "outer.momentum");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"val_fraction\": 0}",
                        "val_fraction");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"updates_per_version\": 2.5}",
                        "updates_per_version must be an integer");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"lease_s\": 0}", "lease_s");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"batch\"}", "mode");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"staleness\": "
                        "{\"function\": \"exp\"}}",
                        "staleness.function");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"staleness\": {\"a\": -1}}",
                        "staleness.a");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"staleness\": {\"max\": -1}}",
                        "staleness.max");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"staleness\": "
                        "{\"function\": \"hinge\", \"b\": 5, \"max\": 4}}",
                        "staleness.b");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"staleness\": {\"tau\": 1}}",
                        "'staleness.tau'");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"selsync\": {\"h_min\": 0}}",
                        "selsync.h_min");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"selsync\": {\"h_min\": 11}}",
                        "exceeds train.steps");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"selsync\": {\"delta\": -1}}",
                        "selsync.delta");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\", "
                        "\"round_deadline_s\": 5}",
                        "round_deadline_s is for sync");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\", "
                        "\"compression\": {\"kind\": \"sketch\", \"ratio\": 10, "
                        "\"second_round\": 2}}",
                        "needs a sync run");
    /* The second round is a sketch run's default only in sync runs; an
     * async one must turn it off itself. */
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\", "
                        "\"compression\": {\"kind\": \"sketch\", \"ratio\": 10}}",
                        "must say \"second_round\": 0");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"keep_update_blobs\": 0}",
                        "keep_update_blobs");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": "
                        "{\"schedule\": \"linear\"}}",
                        "train.schedule");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": "
                        "{\"optimizer\": \"lion\"}}",
                        "train.optimizer");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": "
                        "{\"optimizer\": \"sgd\", \"momentum\": 1.0}}",
                        "train.momentum");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": "
                        "{\"nesterov\": true}}",
                        "train.nesterov needs");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": "
                        "{\"optimizer\": \"sgd\", \"momentum\": 0, \"nesterov\": true}}",
                        "train.nesterov needs");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": "
                        "{\"optimizer\": \"sgd\", \"nesterov\": 1}}",
                        "true or false");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": "
                        "{\"lr\": 0.001, \"min_lr\": 0.01}}",
                        "exceeds train.lr");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"max_versions\": 10, "
                        "\"train\": {\"warmup\": 10}}",
                        "train.warmup");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                        "{\"kind\": \"randk\"}}",
                        "compression.kind");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                        "{\"kind\": \"topk\"}}",
                        "compression.topk needs k");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                        "{\"kind\": \"sketch\", \"ratio\": 10, \"cols\": 5}}",
                        "compression.ratio excludes");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                        "{\"kind\": \"topk\", \"k\": 100000000}}",
                        "exceeds the");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                        "{\"kind\": \"sketch\", \"rows\": 16, \"cols\": 10}}",
                        "compression.rows");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"compression\": "
                        "{\"dtype\": \"BF16\"}}",
                        "compression.dtype");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"model\": {\"n_head\": 3}}",
                        "config: model:");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"model\": {\"vocab_size\": 100}}",
                        "model.vocab_size");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"model\": 4}",
                        "model must be an object");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"task_bytes\": 10}", "task_bytes");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"max_body_bytes\": 2048}",
                        "max_body_bytes");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"seed\": -1}", "seed");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": {\"batch\": 4096},"
                        " \"model\": {\"block_size\": 2048}}",
                        "train.batch x model.block_size");
    expect_config_error("{\"name\": \"d\", \"corpus\": \"c\", \"train\": {\"steps\": 100001}}",
                        "train.steps");
}

/* The inner learning rate over a run, against values worked out by hand:
 * lr 1e-3, 4 warm-up versions, cosine to 1e-4 at version 14. */
static void test_lr_schedule(void **state) {
    (void)state;
    coord_config cfg;
    vl_error e = {0};
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"max_versions\": 14, "
                           "\"train\": {\"lr\": 0.001, \"schedule\": \"cosine\", "
                           "\"warmup\": 4, \"min_lr\": 0.0001}}",
                           &cfg, &e),
                     VL_OK);
    const coord_train_config *t = &cfg.train;
    assert_float_equal(coord_sched_lr(t, 0, 14), 2.5e-4, 1e-12);
    assert_float_equal(coord_sched_lr(t, 3, 14), 1e-3, 1e-12);
    assert_float_equal(coord_sched_lr(t, 4, 14), 1e-3, 1e-12);   /* p = 0 */
    assert_float_equal(coord_sched_lr(t, 9, 14), 5.5e-4, 1e-12); /* p = 1/2 */
    assert_float_equal(coord_sched_lr(t, 14, 14), 1e-4, 1e-12);  /* p = 1 */
    assert_float_equal(coord_sched_lr(t, 20, 14), 1e-4, 1e-12);  /* past the end */
    /* The default is a constant rate, and it travels with the run. */
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"train\": "
                           "{\"lr\": 0.002}}",
                           &cfg, &e),
                     VL_OK);
    assert_string_equal(cfg.train.schedule, "constant");
    assert_float_equal(coord_sched_lr(&cfg.train, 0, 30), 2e-3, 0);
    assert_float_equal(coord_sched_lr(&cfg.train, 29, 30), 2e-3, 0);
    assert_string_equal(cfg.train.optimizer, "adamw");
    assert_float_equal(cfg.train.momentum, 0.9, 0);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"train\": "
                           "{\"optimizer\": \"sgd\", \"momentum\": 0.8, \"nesterov\": true}}",
                           &cfg, &e),
                     VL_OK);
    assert_string_equal(cfg.train.optimizer, "sgd");
    assert_float_equal(cfg.train.momentum, 0.8, 0);
    assert_true(cfg.train.nesterov);
}

static void test_config_corpus_checks(void **state) {
    (void)state;
    coord_config cfg;
    vl_error e;
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"task_bytes\": 1000}", &cfg, &e),
                     VL_OK);
    int64_t train, val;
    coord_config_split(&cfg, 10000, &train, &val);
    assert_int_equal(val, 1000);
    assert_int_equal(train, 9000);
    assert_int_equal(coord_config_check_corpus(&cfg, 10000, &e), VL_OK);
    /* 500 bytes: 50 held out, fewer than a 65-byte window. */
    assert_int_equal(coord_config_check_corpus(&cfg, 500, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "val_fraction"));
    /* 1050 bytes: 105 held out, 945 training bytes < task_bytes. */
    assert_int_equal(coord_config_check_corpus(&cfg, 1050, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "task_bytes"));
}

static void test_durations(void **state) {
    (void)state;
    int64_t s;
    assert_int_equal(coord_parse_duration("7d", &s), VL_OK);
    assert_int_equal(s, 7 * 86400);
    assert_int_equal(coord_parse_duration("24h", &s), VL_OK);
    assert_int_equal(s, 86400);
    assert_int_equal(coord_parse_duration("30m", &s), VL_OK);
    assert_int_equal(s, 1800);
    assert_int_equal(coord_parse_duration("3600s", &s), VL_OK);
    assert_int_equal(s, 3600);
    assert_int_equal(coord_parse_duration("90", &s), VL_OK);
    assert_int_equal(s, 90);
    const char *bad[] = {"", "d", "0s", "-1h", "1.5h", "7w", "1 d", "99999999999d", "+5s"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(coord_parse_duration(bad[i], &s), VL_EINVAL);
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_defaults),
        cmocka_unit_test(test_config_val_tokens),
        cmocka_unit_test(test_version_refusal),
        cmocka_unit_test(test_config_compression),
        cmocka_unit_test(test_config_sketch_outer_default),
        cmocka_unit_test(test_config_errors_name_the_field),
        cmocka_unit_test(test_lr_schedule),
        cmocka_unit_test(test_config_corpus_checks),
        cmocka_unit_test(test_durations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
