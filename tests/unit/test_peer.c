/* The peer's pure parts: the retry schedule, task and error-body parsing,
 * the state file, key generation, and one task of local training on a tiny
 * model. The network loop itself is exercised by the integration tests
 * against a real coordinator. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "peer/peer.h"
#include "peer_fixtures.h"
#include "test_util.h"

/* ---- fixtures ------------------------------------------------------------ */

static const char GOOD_TASK[] =
    "{\"task_id\": 17, \"run\": \"demo\", \"base_version\": 5,"
    " \"data\": {\"shard\": \"train\", \"offset\": 123456, \"length\": 65536},"
    " \"train\": {\"steps\": 10, \"batch\": 8, \"context\": 64, \"optimizer\": \"adamw\","
    "   \"lr\": 0.001, \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-8,"
    "   \"weight_decay\": 0.0, \"grad_clip\": 1.0, \"seed\": 99173},"
    " \"compression\": {\"kind\": \"dense\", \"dtype\": \"F32\"},"
    " \"selsync\": {\"delta\": 0.0, \"h_min\": 10, \"h_max\": 10},"
    " \"deadline\": 1795000000}";

/* GOOD_TASK with the first occurrence of from replaced by to. */
static char *task_with(const char *from, const char *to) {
    const char *p = strstr(GOOD_TASK, from);
    assert_non_null(p);
    size_t a = (size_t)(p - GOOD_TASK), fl = strlen(from), tl = strlen(to);
    char *s = malloc(sizeof GOOD_TASK + tl);
    assert_non_null(s);
    memcpy(s, GOOD_TASK, a);
    memcpy(s + a, to, tl);
    memcpy(s + a + tl, p + fl, sizeof GOOD_TASK - a - fl);
    return s;
}

/* Parses a variant that must fail and checks the message names the fault. */
static void task_rejected(const char *from, const char *to, const char *needle) {
    char *s = task_with(from, to);
    peer_task t;
    vl_error e = {0};
    assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_EINVAL);
    if (!strstr(e.msg, needle)) fail_msg("message '%s' lacks '%s'", e.msg, needle);
    free(s);
}


/* ---- retries ------------------------------------------------------------- */

static void test_backoff_window(void **state) {
    (void)state;
    unsetenv("VOLLEY_PEER_BACKOFF_CAP_S");
    peer_retry_policy p;
    /* By default a request is tried until it is answered, up to 5 min
     * apart. */
    peer_retry_default(&p);
    assert_int_equal(p.max_attempts, 0);
    assert_float_equal(p.give_up_s, 0, 0);
    assert_float_equal(peer_backoff_window(&p, 1), 0.5, 1e-12);
    assert_float_equal(peer_backoff_window(&p, 10), 256.0, 1e-12);
    assert_float_equal(peer_backoff_window(&p, 11), 300.0, 1e-12); /* 512 capped */
    assert_float_equal(peer_backoff_window(&p, 1000000), 300.0, 1e-12);
    /* --give-up-after alone keeps that schedule. */
    peer_retry_for(&p, 0, 90);
    assert_int_equal(p.max_attempts, 0);
    assert_float_equal(p.give_up_s, 90, 0);
    assert_float_equal(peer_backoff_window(&p, 11), 300.0, 1e-12);
    /* A test's shorter cap; nonsense is ignored. */
    setenv("VOLLEY_PEER_BACKOFF_CAP_S", "2", 1);
    peer_retry_default(&p);
    assert_float_equal(peer_backoff_window(&p, 3), 2.0, 1e-12);
    assert_float_equal(peer_backoff_window(&p, 40), 2.0, 1e-12);
    const char *bad[] = {"0", "-3", "1000", "2x", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("VOLLEY_PEER_BACKOFF_CAP_S", bad[i], 1);
        peer_retry_default(&p);
        assert_float_equal(p.cap_s, 300.0, 0);
    }
    unsetenv("VOLLEY_PEER_BACKOFF_CAP_S");
    /* --retries N: N attempts on the 30 s schedule scripts count with. */
    peer_retry_for(&p, 8, 0);
    assert_int_equal(p.max_attempts, 8);
    assert_float_equal(peer_backoff_window(&p, 1), 0.5, 1e-12);
    assert_float_equal(peer_backoff_window(&p, 2), 1.0, 1e-12);
    assert_float_equal(peer_backoff_window(&p, 3), 2.0, 1e-12);
    assert_float_equal(peer_backoff_window(&p, 6), 16.0, 1e-12);
    assert_float_equal(peer_backoff_window(&p, 7), 30.0, 1e-12); /* 32 capped */
    assert_float_equal(peer_backoff_window(&p, 1000000), 30.0, 1e-12);
    assert_float_equal(peer_backoff_window(&p, 0), 0.5, 1e-12);
}

static void test_backoff_jitter_range(void **state) {
    (void)state;
    unsetenv("VOLLEY_PEER_BACKOFF_CAP_S");
    peer_retry_policy p;
    peer_retry_default(&p);
    vl_rng r;
    vl_rng_seed(&r, 42);
    /* Past the cap every delay stays under 5 min and still spreads. */
    for (int n = 1; n <= 16; n++) {
        double w = peer_backoff_window(&p, n), lo = w, hi = 0;
        for (int i = 0; i < 2000; i++) {
            double d = peer_backoff_delay(&p, n, -1, vl_rng_uniform(&r));
            assert_true(d >= 0 && d < w);
            lo = d < lo ? d : lo;
            hi = d > hi ? d : hi;
        }
        /* Full jitter spreads over the whole window, not just its top. */
        assert_true(lo < 0.05 * w);
        assert_true(hi > 0.95 * w);
    }
    assert_true(peer_backoff_delay(&p, 30, -1, 0.999999) < 300.0);
    assert_float_equal(peer_backoff_delay(&p, 3, -1, 0.0), 0.0, 1e-12);
    assert_true(peer_backoff_delay(&p, 3, -1, 1.0) < 2.0);
    assert_float_equal(peer_backoff_delay(&p, 3, -1, 0.5), 1.0, 1e-12);
}

/* TLS failures in words: each verify result to its fault and fix. */
static void test_tls_advice(void **state) {
    (void)state;
    char b[400];
    const char *base = "https://[::1]:8443";
    assert_int_equal(peer_tls_advice(60, 20, "x", "ca.pem", base, b, sizeof b), 1);
    assert_string_equal(b, "the coordinator's certificate is not signed by the CA in --cacert "
                           "ca.pem; use the CA file the operator gave you");
    assert_int_equal(peer_tls_advice(60, 18, "x", NULL, base, b, sizeof b), 1);
    assert_non_null(strstr(b, "is self-signed and no --cacert was given; join with --cacert"));
    assert_int_equal(peer_tls_advice(60, 20, "x", "", base, b, sizeof b), 1);
    assert_non_null(strstr(b, "not signed by a CA this system trusts and no --cacert"));
    assert_int_equal(peer_tls_advice(60, 10, "x", "ca.pem", base, b, sizeof b), 1);
    assert_non_null(strstr(b, "certificate has expired; tell its operator"));
    assert_int_equal(peer_tls_advice(60, 9, "x", "ca.pem", base, b, sizeof b), 1);
    assert_non_null(strstr(b, "is not valid yet; check this machine's clock"));
    assert_int_equal(peer_tls_advice(60, 1,
                                     "SSL: no alternative certificate subject name matches "
                                     "target host name '::1'",
                                     "ca.pem", base, b, sizeof b),
                     1);
    assert_string_equal(b, "the coordinator's certificate does not name ::1; use the address the "
                           "operator gave you (the one its certificate names)");
    assert_int_equal(peer_tls_advice(60, 62, "", NULL, "https://c.example:1/", b, sizeof b), 1);
    assert_non_null(strstr(b, "does not name c.example;"));
    assert_int_equal(peer_tls_advice(77, 0, "", "ca.pem", base, b, sizeof b), 1);
    assert_non_null(strstr(b, "the CA file ca.pem (--cacert) is not a PEM certificate"));
    /* No words for others: curl's text stands. */
    assert_int_equal(peer_tls_advice(60, 1, "other", "ca.pem", base, b, sizeof b), 0);
    assert_int_equal(peer_tls_advice(60, 50, "name", "ca.pem", base, b, sizeof b), 0);
    assert_int_equal(peer_tls_advice(7, 0, "", "ca.pem", base, b, sizeof b), 0);
}

static void test_duration_parse(void **state) {
    (void)state;
    struct {
        const char *s;
        double want;
    } ok[] = {{"0", 0}, {"30", 30}, {"30s", 30}, {"10m", 600}, {"1.5h", 5400}, {"720h", 2592000}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        double v = -1;
        assert_int_equal(peer_duration_parse(ok[i].s, &v), 0);
        assert_float_equal(v, ok[i].want, 1e-9);
    }
    const char *bad[] = {"", "s", "-1s", "10 m", "10x", "3d", "721h", "nan", "1e400"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        double v = 7;
        if (peer_duration_parse(bad[i], &v) == 0) fail_msg("'%s' was taken as %g s", bad[i], v);
        assert_float_equal(v, 7, 0);
    }
}

static void test_backoff_retry_after(void **state) {
    (void)state;
    unsetenv("VOLLEY_PEER_BACKOFF_CAP_S");
    peer_retry_policy p;
    peer_retry_for(&p, 8, 0);
    /* Honoured when longer than the jittered delay, even past the cap. */
    assert_float_equal(peer_backoff_delay(&p, 1, 5, 0.9), 5.0, 1e-12);
    assert_float_equal(peer_backoff_delay(&p, 8, 120, 0.9), 120.0, 1e-12);
    /* A shorter Retry-After does not shorten the backoff. */
    assert_float_equal(peer_backoff_delay(&p, 8, 1, 0.5), 15.0, 1e-12);
    /* An absurd one is clamped. */
    assert_float_equal(peer_backoff_delay(&p, 1, 1e9, 0.1), 300.0, 1e-12);
    assert_float_equal(peer_backoff_delay(&p, 1, 0, 0.5), 0.25, 1e-12);
}

static void test_retry_after_parse(void **state) {
    (void)state;
    const int64_t now = 1445412470; /* 2015-10-21 07:27:50 UTC */
    assert_float_equal(peer_retry_after_parse("120", now), 120, 0);
    assert_float_equal(peer_retry_after_parse("  7 \r\n", now), 7, 0);
    assert_float_equal(peer_retry_after_parse("Wed, 21 Oct 2015 07:28:00 GMT", now), 10, 0);
    assert_float_equal(peer_retry_after_parse("Wed, 21 Oct 2015 07:00:00 GMT", now), 0, 0);
    assert_true(peer_retry_after_parse("soon", now) < 0);
    assert_true(peer_retry_after_parse("", now) < 0);
    assert_true(peer_retry_after_parse("-5", now) < 0);
}

static void test_retryable_statuses(void **state) {
    (void)state;
    assert_true(peer_status_retryable(429));
    assert_true(peer_status_retryable(500));
    assert_true(peer_status_retryable(502));
    assert_true(peer_status_retryable(503));
    assert_false(peer_status_retryable(200));
    assert_false(peer_status_retryable(204));
    assert_false(peer_status_retryable(304));
    assert_false(peer_status_retryable(400));
    assert_false(peer_status_retryable(401));
    assert_false(peer_status_retryable(404));
    assert_false(peer_status_retryable(409));
    assert_false(peer_status_retryable(413));
}

static void test_exit_status(void **state) {
    (void)state;
    assert_int_equal(peer_exit_status(VL_OK), PEER_EXIT_OK);
    assert_int_equal(peer_exit_status(PEER_ESTOPPED), PEER_EXIT_OK);
    assert_int_equal(peer_exit_status(PEER_EREFUSED), PEER_EXIT_REFUSED);
    assert_int_equal(peer_exit_status(PEER_ENETWORK), PEER_EXIT_NETWORK);
    assert_int_equal(peer_exit_status(VL_EINVAL), PEER_EXIT_FAIL);
    assert_int_equal(peer_exit_status(VL_EIO), PEER_EXIT_FAIL);
}

/* ---- error bodies -------------------------------------------------------- */

static void parse_body(const char *body, char *code, char *msg) {
    peer_error_parse((const uint8_t *)body, strlen(body), code, 64, msg, 200);
}

static void test_error_parse(void **state) {
    (void)state;
    char code[64], msg[200];
    parse_body("{\"error\": {\"code\": \"stale_update\", \"message\": \"update is based on "
               "version 3; current is 5\"}}",
               code, msg);
    assert_string_equal(code, "stale_update");
    assert_string_equal(msg, "update is based on version 3; current is 5");

    parse_body("<html>\n<body>Bad Gateway</body></html>", code, msg);
    assert_string_equal(code, "");
    assert_string_equal(msg, "<html>");

    parse_body("  \n upstream timed out\tbadly\n", code, msg);
    assert_string_equal(code, "");
    assert_string_equal(msg, "upstream timed out badly");

    parse_body("", code, msg);
    assert_string_equal(code, "");
    assert_string_equal(msg, "");

    parse_body("{\"error\": \"nope\"}", code, msg);
    assert_string_equal(code, "");
    assert_string_equal(msg, "{\"error\": \"nope\"}");

    /* Newlines in a message cannot break the one-line rule. */
    parse_body("{\"error\": {\"code\": \"bad\\nrequest\", \"message\": \"a\\u0001b\"}}", code, msg);
    assert_string_equal(code, "bad");
    assert_string_equal(msg, "a b");

    /* Truncation to the caller's capacity. */
    char small[8];
    const char *dup = "{\"error\":{\"code\":\"duplicate_update\"}}";
    peer_error_parse((const uint8_t *)dup, strlen(dup), small, sizeof small, msg, sizeof msg);
    assert_string_equal(small, "duplica");
    assert_string_equal(msg, "");

    uint8_t bin[] = {0xff, 0x00, 0x01, 'x'};
    peer_error_parse(bin, sizeof bin, code, sizeof code, msg, sizeof msg);
    assert_string_equal(code, "");
}

static void test_refusal_line(void **state) {
    (void)state;
    vl_error e = {0};
    const char *body = "{\"error\":{\"code\":\"stale_update\",\"message\":\"update is based on "
                       "version 3; current is 5\"}}";
    assert_int_equal(peer_refusal(&e, "upload refused", 409, (const uint8_t *)body, strlen(body)),
                     PEER_EREFUSED);
    assert_string_equal(e.msg, "upload refused: 409 stale_update: update is based on version 3; "
                               "current is 5");
    assert_int_equal(e.code, PEER_EREFUSED);
    peer_refusal(&e, "task request refused", 401, (const uint8_t *)"denied", 6);
    assert_string_equal(e.msg, "task request refused: 401 denied");
    peer_refusal(&e, "join refused", 403, NULL, 0);
    assert_string_equal(e.msg, "join refused: HTTP 403");
}

/* ---- tasks --------------------------------------------------------------- */

static void test_task_good(void **state) {
    (void)state;
    peer_task t;
    vl_error e = {0};
    assert_int_equal(peer_task_parse(GOOD_TASK, strlen(GOOD_TASK), &t, &e), VL_OK);
    assert_int_equal(t.task_id, 17);
    assert_string_equal(t.run, "demo");
    assert_int_equal(t.base_version, 5);
    assert_string_equal(t.shard, "train");
    assert_int_equal(t.offset, 123456);
    assert_int_equal(t.length, 65536);
    assert_int_equal(t.steps, 10);
    assert_int_equal(t.batch, 8);
    assert_int_equal(t.context, 64);
    assert_float_equal(t.lr, 0.001, 1e-15);
    assert_float_equal(t.beta2, 0.95, 1e-15);
    assert_float_equal(t.eps, 1e-8, 1e-20);
    assert_float_equal(t.grad_clip, 1.0, 0);
    assert_int_equal(t.seed, 99173);
    assert_int_equal(t.kind, COMPRESS_DENSE);
    assert_int_equal(t.dtype, ST_F32);
    assert_int_equal(t.h_min, 10);
    assert_int_equal(t.deadline, 1795000000);

    model_gpt_config cfg = {256, 64, 2, 4, 128};
    assert_int_equal(peer_task_check_model(&t, &cfg, &e), VL_OK);

    /* selsync is optional, extra fields are ignored, F16 is fine. */
    char *s = task_with(", \"selsync\": {\"delta\": 0.0, \"h_min\": 10, \"h_max\": 10}",
                        ", \"future\": [1, 2]");
    assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_OK);
    assert_int_equal(t.h_min, 10);
    assert_float_equal(t.selsync_delta, 0, 0);
    free(s);
    s = task_with("\"F32\"", "\"F16\"");
    assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_OK);
    assert_int_equal(t.dtype, ST_F16);
    free(s);
    s = task_with("\"h_min\": 10", "\"h_min\": 2");
    assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_OK);
    assert_int_equal(t.h_min, 2);
    free(s);
    assert_false(t.sgd);
    s = task_with("\"adamw\",", "\"sgd\", \"momentum\": 0.8, \"nesterov\": true,");
    assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_OK);
    assert_true(t.sgd && t.nesterov);
    assert_float_equal(t.momentum, 0.8, 0);
    free(s);
}

/* Compressed kinds: what they need, and what they refuse. */
static void test_task_compression(void **state) {
    (void)state;
    peer_task t;
    vl_error e = {0};
    char *s = task_with("{\"kind\": \"dense\", \"dtype\": \"F32\"}",
                        "{\"kind\": \"topk\", \"dtype\": \"F16\", \"k\": 100}");
    assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_OK);
    assert_int_equal(t.method, PEER_METHOD_TOPK);
    assert_int_equal(t.kind, COMPRESS_TOPK);
    assert_int_equal(t.comp_k, 100);
    /* Without block and decay: plain top-k, classic feedback. */
    assert_int_equal(t.comp_block, 0);
    assert_true(t.comp_decay == 1.0f);
    free(s);
    s = task_with("{\"kind\": \"dense\", \"dtype\": \"F32\"}",
                  "{\"kind\": \"topk\", \"dtype\": \"F16\", \"k\": 100, \"block\": 512, "
                  "\"decay\": 0.9}");
    assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_OK);
    assert_int_equal(t.comp_block, 512);
    assert_true(t.comp_decay == 0.9f);
    free(s);
    s = task_with("{\"kind\": \"dense\", \"dtype\": \"F32\"}",
                  "{\"kind\": \"sketch\", \"dtype\": \"F32\", \"k\": 10, \"rows\": 3, "
                  "\"cols\": 50, \"seed\": 5, \"hash\": \"window\"}");
    assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_OK);
    assert_int_equal(t.method, PEER_METHOD_SKETCH);
    assert_int_equal(t.kind, COMPRESS_SKETCH);
    assert_true(t.comp_rows == 3 && t.comp_cols == 50 && t.comp_seed == 5);
    assert_int_equal(t.second_round, 0);
    free(s);
    /* A second round comes with its length. */
    s = task_with("{\"kind\": \"dense\", \"dtype\": \"F32\"}",
                  "{\"kind\": \"sketch\", \"dtype\": \"F32\", \"k\": 10, \"rows\": 3, "
                  "\"cols\": 50, \"seed\": 5, \"hash\": \"window\", \"second_round\": 4, "
                  "\"round_s\": 20}");
    assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_OK);
    assert_true(t.second_round == 4 && t.round_s == 20);
    free(s);
    /* A coordinator that names no hash (one from before the windowed
     * hash) or another one is refused, saying why. */
    const char *hashes[] = {"", ", \"hash\": \"mix\""};
    for (size_t h = 0; h < 2; h++) {
        char cmp[256];
        snprintf(cmp, sizeof cmp,
                 "{\"kind\": \"sketch\", \"dtype\": \"F32\", \"k\": 10, \"rows\": 3, "
                 "\"cols\": 50, \"seed\": 5%s}",
                 hashes[h]);
        s = task_with("{\"kind\": \"dense\", \"dtype\": \"F32\"}", cmp);
        assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_EINVAL);
        assert_non_null(strstr(e.msg, "\"window\" hash"));
        free(s);
    }
    const char *bad[][2] = {
        {"{\"kind\": \"topk\", \"dtype\": \"F32\"}", "compression.k"},
        {"{\"kind\": \"gaussk\", \"dtype\": \"F32\", \"k\": 0}", "compression.k"},
        {"{\"kind\": \"sketch\", \"dtype\": \"F32\", \"k\": 1, \"rows\": 16, "
         "\"cols\": 5, \"seed\": 1}",
         "compression.rows"},
        {"{\"kind\": \"sketch\", \"dtype\": \"F32\", \"k\": 1, \"rows\": 15, "
         "\"cols\": 268435456, \"seed\": 1}",
         "too large"},
        {"{\"kind\": \"randk\", \"dtype\": \"F32\"}", "not supported"},
        {"{\"kind\": \"topk\", \"dtype\": \"F32\", \"k\": 5, \"block\": -2}", "compression.block"},
        {"{\"kind\": \"topk\", \"dtype\": \"F32\", \"k\": 5, \"decay\": 0}", "compression.decay"},
        {"{\"kind\": \"gaussk\", \"dtype\": \"F32\", \"k\": 5, \"decay\": 1.01}",
         "compression.decay"},
        {"{\"kind\": \"topk\", \"dtype\": \"F32\", \"k\": 5, \"decay\": \"x\"}",
         "compression.decay"},
        {"{\"kind\": \"sketch\", \"dtype\": \"F32\", \"k\": 1, \"rows\": 3, "
         "\"cols\": 5, \"seed\": 1, \"hash\": \"window\", \"second_round\": 2}",
         "compression.round_s"},
        {"{\"kind\": \"sketch\", \"dtype\": \"F32\", \"k\": 1, \"rows\": 3, "
         "\"cols\": 5, \"seed\": 1, \"hash\": \"window\", \"second_round\": 65, "
         "\"round_s\": 5}",
         "compression.second_round"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s = task_with("{\"kind\": \"dense\", \"dtype\": \"F32\"}", bad[i][0]);
        vl_error e2 = {0};
        assert_int_not_equal(peer_task_parse(s, strlen(s), &t, &e2), VL_OK);
        if (!strstr(e2.msg, bad[i][1])) fail_msg("'%s' lacks '%s'", e2.msg, bad[i][1]);
        free(s);
    }
    /* k above the model's parameter count is refused against the model. */
    s = task_with("{\"kind\": \"dense\", \"dtype\": \"F32\"}",
                  "{\"kind\": \"topk\", \"dtype\": \"F32\", \"k\": 99999999}");
    assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_OK);
    model_gpt_config cfg = {256, 64, 2, 4, 128};
    assert_int_equal(peer_task_check_model(&t, &cfg, &e), VL_EINVAL);
    free(s);
}

static void test_task_rejected(void **state) {
    (void)state;
    task_rejected(", \"seed\": 99173", "", "train.seed");
    task_rejected("\"task_id\": 17, ", "", "task_id");
    task_rejected("\"steps\": 10", "\"steps\": -3", "train.steps");
    task_rejected("\"steps\": 10", "\"steps\": 0", "train.steps");
    task_rejected("\"steps\": 10", "\"steps\": 1.5", "train.steps");
    task_rejected("\"batch\": 8", "\"batch\": \"8\"", "train.batch");
    task_rejected("\"dense\"", "\"sketchy\"", "compression kind 'sketchy' is not supported");
    task_rejected("\"F32\"", "\"U8\"", "dtype");
    task_rejected("\"adamw\"", "\"lion\"", "optimizer 'lion'");
    /* SGD needs its momentum, in [0, 1), and Nesterov only with some. */
    task_rejected("\"adamw\"", "\"sgd\"", "train.momentum");
    task_rejected("\"adamw\",", "\"sgd\", \"momentum\": 1.0,", "train.momentum");
    task_rejected("\"adamw\",", "\"sgd\", \"momentum\": 0.9, \"nesterov\": 1,", "nesterov");
    task_rejected("\"adamw\",", "\"sgd\", \"momentum\": 0, \"nesterov\": true,", "Nesterov");
    task_rejected("\"lr\": 0.001", "\"lr\": 0", "train.lr");
    task_rejected("\"beta2\": 0.95", "\"beta2\": 1.0", "train.beta2");
    task_rejected("\"grad_clip\": 1.0", "\"grad_clip\": -1", "train.grad_clip");
    task_rejected("\"offset\": 123456", "\"offset\": -1", "data.offset");
    task_rejected("\"length\": 65536", "\"length\": 64", "context + 1");
    task_rejected("\"length\": 65536", "\"length\": 4611686018427387904", "data.length");
    task_rejected(" \"data\": {\"shard\": \"train\", \"offset\": 123456, \"length\": 65536},", "",
                  "missing section 'data'");
    task_rejected("\"shard\": \"train\"", "\"shard\": \"../x\"", "data.shard");
    task_rejected("\"run\": \"demo\"", "\"run\": \"\"", "'run'");
    task_rejected("\"h_max\": 10", "\"h_max\": 20", "selsync.h_max");
    task_rejected("\"h_min\": 10", "\"h_min\": 0", "selsync.h_min");
    task_rejected("\"batch\": 8, \"context\": 64", "\"batch\": 4096, \"context\": 2048",
                  "batch * context");
    task_rejected("{\"kind\": \"dense\", \"dtype\": \"F32\"}", "\"dense\"",
                  "'compression' must be an object");
    task_rejected("\"data\"", "\"task_id\"", "not valid JSON");

    peer_task t;
    vl_error e = {0};
    assert_int_equal(peer_task_parse("[1]", 3, &t, &e), VL_EINVAL);
    assert_int_equal(peer_task_parse("not json", 8, &t, &e), VL_EINVAL);

    /* Context beyond what the model was built for. */
    assert_int_equal(peer_task_parse(GOOD_TASK, strlen(GOOD_TASK), &t, &e), VL_OK);
    model_gpt_config cfg = {256, 32, 2, 4, 128};
    assert_int_equal(peer_task_check_model(&t, &cfg, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "context 64 exceeds the model's block size 32"));
    cfg.block_size = 64;
    cfg.vocab_size = 100;
    assert_int_equal(peer_task_check_model(&t, &cfg, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "vocabulary"));
}

static void test_model_config_parse(void **state) {
    (void)state;
    model_gpt_config c;
    vl_error e = {0};
    assert_int_equal(peer_model_config_parse("{\"vocab_size\":256,\"block_size\":64,\"n_layer\":2,"
                                             "\"n_head\":4,\"n_embd\":128,\"extra\":1}",
                                             &c, &e),
                     VL_OK);
    assert_int_equal(c.vocab_size, 256);
    assert_int_equal(c.block_size, 64);
    assert_int_equal(c.n_layer, 2);
    assert_int_equal(c.n_head, 4);
    assert_int_equal(c.n_embd, 128);
    assert_int_equal(peer_model_config_parse("{\"vocab_size\":256,\"block_size\":64,\"n_layer\":2,"
                                             "\"n_head\":3,\"n_embd\":128}",
                                             &c, &e),
                     VL_EINVAL);
    assert_int_equal(peer_model_config_parse("{\"vocab_size\":256,\"block_size\":64,"
                                             "\"n_head\":4,\"n_embd\":128}",
                                             &c, &e),
                     VL_EINVAL);
    assert_non_null(strstr(e.msg, "n_layer"));
    assert_int_equal(peer_model_config_parse("nope", &c, &e), VL_EINVAL);
}

/* ---- directory and state --------------------------------------------------- */

static void test_url_check(void **state) {
    (void)state;
    char out[256];
    vl_error e = {0};
    assert_int_equal(peer_url_check("https://coord.example.org:8443", out, sizeof out, &e), 0);
    assert_string_equal(out, "https://coord.example.org:8443");
    assert_int_equal(peer_url_check("https://127.0.0.1:8443/", out, sizeof out, &e), 0);
    assert_string_equal(out, "https://127.0.0.1:8443");
    assert_int_equal(peer_url_check("https://[::1]:8443", out, sizeof out, &e), 0);
    assert_int_equal(peer_url_check("https://host", out, sizeof out, &e), 0);
    assert_int_equal(peer_url_check("http://host:80", out, sizeof out, &e), VL_EINVAL);
    assert_int_equal(peer_url_check("https://", out, sizeof out, &e), VL_EINVAL);
    assert_int_equal(peer_url_check("https://host:0", out, sizeof out, &e), VL_EINVAL);
    assert_int_equal(peer_url_check("https://host:99999", out, sizeof out, &e), VL_EINVAL);
    assert_int_equal(peer_url_check("https://host/v1", out, sizeof out, &e), VL_EINVAL);
    assert_int_equal(peer_url_check("https://user@host", out, sizeof out, &e), VL_EINVAL);
    assert_int_equal(peer_url_check("https://host?x=1", out, sizeof out, &e), VL_EINVAL);
    assert_int_equal(peer_url_check("https://host:12a", out, sizeof out, &e), VL_EINVAL);
}

static void test_state_round_trip(void **state) {
    (void)state;
    char *d = test_temp_dir("/tmp/test_peer.XXXXXX");
    peer_state s, r;
    memset(&s, 0, sizeof s);
    snprintf(s.coordinator, sizeof s.coordinator, "https://127.0.0.1:8443");
    s.peer_id = 42;
    snprintf(s.cacert, sizeof s.cacert, "/etc/volley/ca \"quoted\".pem");
    snprintf(s.run, sizeof s.run, "demo");
    snprintf(s.name, sizeof s.name, "lab-3");
    vl_error e = {0};
    assert_int_equal(peer_state_load(d, &r, &e), VL_ENOTFOUND);
    assert_non_null(strstr(e.msg, "join"));
    assert_int_equal(peer_state_save(d, &s, &e), VL_OK);
    assert_int_equal(peer_state_load(d, &r, &e), VL_OK);
    assert_string_equal(r.coordinator, s.coordinator);
    assert_int_equal(r.peer_id, 42);
    assert_string_equal(r.cacert, s.cacert);
    assert_string_equal(r.run, "demo");
    assert_string_equal(r.name, "lab-3");

    char path[PEER_PATH_MAX];
    assert_int_equal(peer_path_join(path, sizeof path, d, PEER_STATE_FILE, &e), VL_OK);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    /* Without a CA file the key is omitted and reads back empty. */
    s.cacert[0] = '\0';
    assert_int_equal(peer_state_save(d, &s, &e), VL_OK);
    assert_int_equal(peer_state_load(d, &r, &e), VL_OK);
    assert_string_equal(r.cacert, "");

    /* A damaged file is refused with its path in the message. */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"coordinator\": \"https://h:1\", \"peer_id\": -4}", f);
    fclose(f);
    assert_int_equal(peer_state_load(d, &r, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "peer_id"));
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"coordinator\": \"ftp://h:1\", \"peer_id\": 4}", f);
    fclose(f);
    assert_int_equal(peer_state_load(d, &r, &e), VL_EINVAL);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("garbage", f);
    fclose(f);
    assert_int_equal(peer_state_load(d, &r, &e), VL_EINVAL);
    test_remove_tree(d);
    free(d);
}

static void test_keygen(void **state) {
    (void)state;
    assert_int_equal(vcrypto_init(), VL_OK);
    char *d = test_temp_dir("/tmp/test_peer.XXXXXX");
    char dir[PEER_PATH_MAX], path[PEER_PATH_MAX], pk1[VCRYPTO_PK_B64_LEN + 1],
        pk2[VCRYPTO_PK_B64_LEN + 1];
    vl_error e = {0};
    snprintf(dir, sizeof dir, "%s/peer", d);
    assert_int_equal(peer_keygen(dir, 0, pk1, &e), VL_OK);
    assert_int_equal(strlen(pk1), VCRYPTO_PK_B64_LEN);
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(peer_path_join(path, sizeof path, dir, PEER_KEY_FILE, &e), VL_OK);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    vcrypto_identity id;
    assert_int_equal(vcrypto_identity_load(&id, path, &e), VL_OK);
    char pk[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(id.pk, pk);
    assert_string_equal(pk, pk1);

    assert_int_equal(peer_keygen(dir, 0, pk2, &e), VL_ECONFLICT);
    assert_non_null(strstr(e.msg, "--force"));
    assert_int_equal(peer_keygen(dir, 1, pk2, &e), VL_OK);
    assert_string_not_equal(pk1, pk2);
    test_remove_tree(d);
    free(d);
}

/* ---- training ------------------------------------------------------------ */


static void test_train_lowers_loss(void **state) {
    (void)state;
    peer_trainer tr;
    peer_trainer_init(&tr);
    vl_error e = {0};
    assert_int_equal(peer_trainer_init_model(&tr, &TINY, 0, &e), VL_OK);
    peer_task task = tiny_task(20);
    size_t n = tr.n_params;
    assert_true(n > 0);

    /* The task's first batch, drawn the way the trainer draws it. */
    int in[64], tg[64];
    vl_rng r;
    vl_rng_seed(&r, task.seed);
    assert_int_equal(model_data_sample(TEXT, 17, 4, 16, &r, in, tg, &e), VL_OK);
    float before, after;
    assert_int_equal(model_gpt_forward(tr.gpt, in, tg, 4, 16, &before, &e), VL_OK);

    peer_train_result res;
    assert_int_equal(peer_trainer_run(&tr, &task, TEXT, 17, &res, &e), VL_OK);
    assert_int_equal(res.steps, 20);
    assert_int_equal(res.tokens, 20 * 4 * 16);
    assert_float_equal(res.first_loss, before, 1e-4);
    assert_true(isfinite(res.mean_loss));
    assert_true(res.last_loss < res.first_loss);
    assert_int_equal(model_gpt_forward(tr.gpt, in, tg, 4, 16, &after, &e), VL_OK);
    assert_true(after < before - 0.1f);

    /* delta = base - local, finite and not zero. */
    const float *local = model_gpt_params(tr.gpt);
    double norm = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(isfinite(tr.delta[i]));
        assert_float_equal(tr.delta[i], tr.base[i] - local[i], 1e-6);
        norm += (double)tr.delta[i] * tr.delta[i];
    }
    assert_true(norm > 0);

    /* The next task starts again from the base, with the optimizer state
     * carried over. */
    long steps_before = tr.opt.step;
    assert_int_equal(peer_trainer_run(&tr, &task, TEXT, 17, &res, &e), VL_OK);
    assert_int_equal(tr.opt.step, steps_before + 20);
    assert_float_equal(res.first_loss, before, 1e-4);
    peer_trainer_free(&tr);
}

/* SelSync's rule against values worked out by hand: smoothing weight 0.1,
 * relative change of the smoothed squared norm. */
static void test_selsync_feed(void **state) {
    (void)state;
    peer_selsync s = {0};
    assert_float_equal(peer_selsync_feed(&s, 4), 0, 0);         /* g~ = 4 */
    assert_float_equal(peer_selsync_feed(&s, 4), 0, 1e-15);     /* g~ = 4 */
    assert_float_equal(peer_selsync_feed(&s, 14), 0.25, 1e-12); /* g~ = 3.6 + 1.4 = 5 */
    assert_float_equal(s.smoothed, 5, 1e-12);
    assert_float_equal(peer_selsync_feed(&s, 5), 0, 1e-12);   /* g~ stays 5 */
    assert_float_equal(peer_selsync_feed(&s, 0), 0.1, 1e-12); /* g~ = 4.5 */
    assert_int_equal(s.steps, 5);
    /* A zero norm cannot be divided by: no change is reported after it. */
    peer_selsync z = {0};
    assert_float_equal(peer_selsync_feed(&z, 0), 0, 0);
    assert_float_equal(peer_selsync_feed(&z, 10), 0, 0);
    assert_float_equal(z.smoothed, 1, 1e-12);
}

static void test_train_selsync_and_limits(void **state) {
    (void)state;
    peer_trainer tr;
    peer_trainer_init(&tr);
    vl_error e = {0};
    peer_train_result res;
    peer_task task = tiny_task(10);
    assert_int_equal(peer_trainer_run(&tr, &task, TEXT, 17, &res, &e), VL_EINVAL);
    assert_int_equal(peer_trainer_init_model(&tr, &TINY, 3, &e), VL_OK);

    /* delta 0 means "upload as soon as allowed": after h_min steps. */
    task.h_min = 3;
    assert_int_equal(peer_trainer_run(&tr, &task, TEXT, 17, &res, &e), VL_OK);
    assert_int_equal(res.steps, 3);
    assert_int_equal(res.tokens, 3 * 4 * 16);
    /* A threshold nothing reaches runs all steps. */
    task.selsync_delta = 1e9;
    assert_int_equal(peer_trainer_run(&tr, &task, TEXT, 17, &res, &e), VL_OK);
    assert_int_equal(res.steps, 10);

    task.context = 17; /* over the block size */
    assert_int_equal(peer_trainer_run(&tr, &task, TEXT, 17, &res, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "block size"));
    task.context = 16;
    assert_int_equal(peer_trainer_run(&tr, &task, TEXT, 16, &res, &e), VL_EINVAL);

    /* A stop request abandons the task between steps. */
    peer_stop_request();
    assert_int_equal(peer_trainer_run(&tr, &task, TEXT, 17, &res, &e), PEER_ESTOPPED);
    assert_int_equal(peer_sleep(10), 1);
    peer_stop_reset();
    assert_int_equal(peer_sleep(0.01), 0);
    peer_trainer_free(&tr);
}

/* Over several tasks the top-k uploads plus the residual hold exactly the
 * sum of the deltas; a dropped upload goes back into the residual; a sketch
 * upload leaves no state. */
static void test_encode_feedback(void **state) {
    (void)state;
    peer_trainer tr;
    peer_trainer_init(&tr);
    vl_error e = {0};
    assert_int_equal(peer_trainer_init_model(&tr, &TINY, 0, &e), VL_OK);
    size_t n = tr.n_params;
    double *total = calloc(n, sizeof *total), *sent = calloc(n, sizeof *sent);
    assert_non_null(total);
    assert_non_null(sent);
    peer_task k = tiny_task(2);
    k.method = PEER_METHOD_TOPK;
    k.kind = COMPRESS_TOPK;
    k.comp_k = (int64_t)(n / 20);
    compress_update_meta m;
    memset(&m, 0, sizeof m);
    snprintf(m.run, sizeof m.run, "unit");
    m.task = m.peer = 1;
    m.kind = COMPRESS_TOPK;
    m.num_samples = m.local_steps = 1;
    vl_rng r;
    vl_rng_seed(&r, 3);
    vl_buf b;
    vl_buf_init(&b, 0);
    for (int round = 0; round < 4; round++) {
        for (size_t i = 0; i < n; i++) {
            tr.delta[i] = 0.01f * vl_rng_normal(&r);
            total[i] += tr.delta[i];
        }
        k.method = round == 2 ? PEER_METHOD_GAUSSK : PEER_METHOD_TOPK;
        vl_buf_reset(&b);
        assert_int_equal(peer_encode_update(&tr, &k, &m, &b, &e), VL_OK);
        compress_update u;
        assert_int_equal(compress_update_decode(b.data, b.len, n, &u, NULL, &e), VL_OK);
        assert_true(u.nnz > 0 && u.nnz <= COMPRESS_GAUSSK_CAP((size_t)k.comp_k));
        if (round == 1) {
            /* Dropped by the coordinator: nothing of it is lost. */
            peer_encode_unsent(&tr);
        } else {
            float *acc = calloc(n, sizeof *acc);
            assert_int_equal(compress_update_accumulate(&u, 1.0f, acc, n, &e), VL_OK);
            for (size_t i = 0; i < n; i++) sent[i] += acc[i];
            free(acc);
        }
        compress_update_free(&u);
    }
    for (size_t i = 0; i < n; i++) assert_true(fabs(sent[i] + tr.residual[i] - total[i]) < 1e-5);
    /* Block top-k with a decaying residual: every slice gets its share,
     * and sent + residual is exactly decay * old residual + delta. */
    k.method = PEER_METHOD_TOPK;
    k.comp_block = 64;
    k.comp_decay = 0.5f;
    float *input = malloc(n * sizeof *input);
    assert_non_null(input);
    for (size_t i = 0; i < n; i++) {
        tr.delta[i] = 0.01f * vl_rng_normal(&r);
        input[i] = 0.5f * tr.residual[i] + tr.delta[i];
    }
    vl_buf_reset(&b);
    assert_int_equal(peer_encode_update(&tr, &k, &m, &b, &e), VL_OK);
    {
        compress_update u;
        assert_int_equal(compress_update_decode(b.data, b.len, n, &u, NULL, &e), VL_OK);
        assert_int_equal(u.nnz, (size_t)k.comp_k);
        float *acc = calloc(n, sizeof *acc);
        assert_non_null(acc);
        assert_int_equal(compress_update_accumulate(&u, 1.0f, acc, n, &e), VL_OK);
        for (size_t i = 0; i < n; i++) assert_true(acc[i] + tr.residual[i] == input[i]);
        size_t nb = compress_blocks_count(n, (size_t)k.comp_k, 64);
        assert_true(nb > 1);
        size_t j = 0;
        for (size_t q = 0; q < nb; q++) {
            size_t lo, len, share, at, got = 0;
            compress_blocks_span(n, (size_t)k.comp_k, nb, q, &lo, &len, &share, &at);
            for (; j < u.nnz; j++, got++) {
                uint32_t ix;
                memcpy(&ix, u.indices->data + 4 * j, sizeof ix);
                if (ix >= lo + len) break;
            }
            assert_int_equal(got, share);
        }
        free(acc);
        compress_update_free(&u);
    }
    free(input);
    /* Sketch: the upload holds the sketch of exactly this delta. */
    k.method = PEER_METHOD_SKETCH;
    k.kind = COMPRESS_SKETCH;
    k.comp_rows = 3;
    k.comp_cols = 97;
    k.comp_seed = 11;
    m.kind = COMPRESS_SKETCH;
    vl_buf_reset(&b);
    assert_int_equal(peer_encode_update(&tr, &k, &m, &b, &e), VL_OK);
    compress_update u;
    assert_int_equal(compress_update_decode(b.data, b.len, n, &u, NULL, &e), VL_OK);
    compress_sketch want, got;
    assert_int_equal(compress_sketch_init(&want, 3, 97, 11, &e), VL_OK);
    assert_int_equal(compress_sketch_init(&got, 3, 97, 11, &e), VL_OK);
    compress_sketch_encode(&want, tr.delta, n);
    assert_int_equal(compress_update_accumulate_sketch(&u, 1.0f, &got, &e), VL_OK);
    assert_memory_equal(want.table, got.table, 3 * 97 * sizeof(float));
    /* Second round: the values reported are the delta's own at the
     * candidates, and they survive the values file's round trip. */
    uint32_t cand[4] = {0, 7, 100, (uint32_t)n - 1};
    float vals[4];
    peer_round_values(&tr, cand, 4, vals);
    compress_round_meta rm = {.version = 3, .task = 9, .peer = 2};
    snprintf(rm.run, sizeof rm.run, "demo");
    vl_buf vb;
    vl_buf_init(&vb, VL_BUF_DEFAULT_CAP);
    assert_int_equal(compress_round_encode_values(&rm, vals, 4, &vb, &e), VL_OK);
    compress_round_meta back;
    float *got_vals = NULL;
    size_t got_n = 0;
    const char *code = NULL;
    assert_int_equal(
        compress_round_decode_values(vb.data, vb.len, 4, &back, &got_vals, &got_n, &code, &e),
        VL_OK);
    assert_true(got_n == 4 && back.task == 9 && back.peer == 2 && back.version == 3);
    for (int j = 0; j < 4; j++) assert_true(got_vals[j] == tr.delta[cand[j]]);
    free(got_vals);
    assert_int_equal(
        compress_round_decode_values(vb.data, vb.len, 5, &back, &got_vals, &got_n, &code, &e),
        VL_ERANGE);
    assert_string_equal(code, "bad_shape");
    vl_buf_free(&vb);
    compress_sketch_free(&want);
    compress_sketch_free(&got);
    compress_update_free(&u);
    vl_buf_free(&b);
    free(total);
    free(sent);
    peer_trainer_free(&tr);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backoff_window),
        cmocka_unit_test(test_backoff_jitter_range),
        cmocka_unit_test(test_backoff_retry_after),
        cmocka_unit_test(test_duration_parse),
        cmocka_unit_test(test_tls_advice),
        cmocka_unit_test(test_retry_after_parse),
        cmocka_unit_test(test_retryable_statuses),
        cmocka_unit_test(test_exit_status),
        cmocka_unit_test(test_error_parse),
        cmocka_unit_test(test_refusal_line),
        cmocka_unit_test(test_task_good),
        cmocka_unit_test(test_task_rejected),
        cmocka_unit_test(test_task_compression),
        cmocka_unit_test(test_encode_feedback),
        cmocka_unit_test(test_model_config_parse),
        cmocka_unit_test(test_url_check),
        cmocka_unit_test(test_state_round_trip),
        cmocka_unit_test(test_keygen),
        cmocka_unit_test(test_train_lowers_loss),
        cmocka_unit_test(test_selsync_feed),
        cmocka_unit_test(test_train_selsync_and_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
