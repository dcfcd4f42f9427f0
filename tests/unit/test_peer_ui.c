/* peer: what a volunteer sees (peer/ui.h). The status line for given
 * values, exactly, and on narrow terminals with the least useful parts
 * dropped first; JSON lines for given values, exactly, with strings
 * escaped and over-long messages cut yet whole JSON; --log-format
 * values; through the log: JSON lines, a status line cleared before each
 * log line and drawn at most a few times a second, "cannot reach the
 * coordinator" said once per reason and its return said once; refusals
 * explained. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "peer/peer.h"
#include "peer/ui.h"

#define CLEAR "\r\033[K"

static peer_ui_status full(void) {
    peer_ui_status s = {.task = 12,
                        .step = 3,
                        .steps = 8,
                        .loss = 4.23101,
                        .tokens_per_s = 1234.4,
                        .device = "cpu",
                        .up_done = 400000,
                        .up_total = 1100000,
                        .up_rate = 30000,
                        .saved = 12345678};
    return s;
}

static void expect_status(const peer_ui_status *s, size_t width, const char *want) {
    char out[512];
    size_t n = peer_ui_status_format(s, width, out, sizeof out);
    assert_string_equal(out, want);
    assert_int_equal(n, strlen(want));
}

static void test_status_line(void **state) {
    (void)state;
    peer_ui_status s = full();
    expect_status(&s, 200,
                  "task 12 | step 3/8 | loss 4.2310 | 1234 tok/s | cpu | up 0.4/1.1 MB "
                  "at 30.0 kB/s | saved 12.3 MB");
    /* No task yet, nothing known but what it does. */
    peer_ui_status idle = {.phase = "waiting for a task", .loss = NAN};
    expect_status(&idle, 80, "waiting for a task");
    /* After an accepted update: the version it goes into, not "uploading". */
    peer_ui_status after = {
        .task = 12, .phase = "waiting for version 16", .loss = NAN, .saved = 2000000};
    expect_status(&after, 80, "task 12 | waiting for version 16 | saved 2.0 MB");
    /* A download shows how far it got. */
    peer_ui_status down = {.task = 5,
                           .phase = "fetching the model",
                           .loss = NAN,
                           .down_done = 1200000,
                           .down_total = 3400000,
                           .device = "cuda"};
    expect_status(&down, 80, "task 5 | fetching the model 1.2/3.4 MB | cuda");
    /* Fast training reads in thousands; an upload without a rate yet. */
    peer_ui_status fast = {.task = 7,
                           .step = 1,
                           .steps = 2,
                           .loss = 2,
                           .tokens_per_s = 123456,
                           .up_done = 10,
                           .up_total = 512};
    expect_status(&fast, 80, "task 7 | step 1/2 | loss 2.0000 | 123.5k tok/s | up 10/512 B");
    /* Control characters never reach the terminal. */
    peer_ui_status odd = {.phase = "a\tb\033c", .loss = NAN};
    expect_status(&odd, 80, "a b c");
}

static void test_status_narrow(void **state) {
    (void)state;
    peer_ui_status s = full();
    /* The full line is 96 bytes: at 97 columns it fits, at 96 the
     * saving goes (the last column stays free), then the rest in turn. */
    expect_status(&s, 97,
                  "task 12 | step 3/8 | loss 4.2310 | 1234 tok/s | cpu | up 0.4/1.1 MB "
                  "at 30.0 kB/s | saved 12.3 MB");
    expect_status(&s, 96,
                  "task 12 | step 3/8 | loss 4.2310 | 1234 tok/s | cpu | up 0.4/1.1 MB "
                  "at 30.0 kB/s");
    expect_status(&s, 80,
                  "task 12 | step 3/8 | loss 4.2310 | 1234 tok/s | up 0.4/1.1 MB at "
                  "30.0 kB/s");
    expect_status(&s, 74, "task 12 | step 3/8 | loss 4.2310 | up 0.4/1.1 MB at 30.0 kB/s");
    expect_status(&s, 61, "task 12 | step 3/8 | loss 4.2310");
    expect_status(&s, 32, "task 12 | step 3/8");
    expect_status(&s, 18, "step 3/8");
    expect_status(&s, 6, "step ");
    expect_status(&s, 1, "");
    expect_status(&s, 0, "");
    /* A small buffer cuts too, and says how much it wrote. */
    char out[8];
    assert_int_equal(peer_ui_status_format(&s, 200, out, sizeof out), 7);
    assert_string_equal(out, "task 12");
}

static void test_bytes(void **state) {
    (void)state;
    char b[32];
    peer_ui_bytes(512, b, sizeof b);
    assert_string_equal(b, "512 B");
    peer_ui_bytes(3200, b, sizeof b);
    assert_string_equal(b, "3.2 kB");
    peer_ui_bytes(14000000, b, sizeof b);
    assert_string_equal(b, "14.0 MB");
    peer_ui_bytes(2500000000LL, b, sizeof b);
    assert_string_equal(b, "2.5 GB");
    peer_ui_bytes(-2000, b, sizeof b);
    assert_string_equal(b, "-2.0 kB");
}

static const struct timespec TS = {.tv_sec = 1716206400, .tv_nsec = 123456789};

static void test_json_line(void **state) {
    (void)state;
    char out[1024];
    peer_ui_field f[] = {PEER_UI_INT("task", 12),
                         PEER_UI_NUM("loss", 4.5),
                         PEER_UI_NUM("tokens_per_s", 1234.5678),
                         PEER_UI_NUM("bad", NAN),
                         PEER_UI_STR("url", "https://h:1"),
                         PEER_UI_STR("none", NULL)};
    size_t n = peer_ui_json_line(out, sizeof out, &TS, LOG_WARN, "volley-peer", "task_end", f,
                                 PEER_UI_NFIELDS(f), "done\n");
    assert_string_equal(out, "{\"ts\":\"2024-05-20T12:00:00.123Z\",\"level\":\"warn\","
                             "\"program\":\"volley-peer\",\"event\":\"task_end\",\"task\":12,"
                             "\"loss\":4.5,\"tokens_per_s\":1234.57,\"bad\":null,"
                             "\"url\":\"https://h:1\",\"none\":null,\"msg\":\"done\"}\n");
    assert_int_equal(n, strlen(out));
    /* Quotes, backslashes and control characters escaped; UTF-8 kept;
     * bytes that are not UTF-8 become U+FFFD. */
    peer_ui_json_line(out, sizeof out, &TS, LOG_INFO, "p", "log", NULL, 0,
                      "a\"b\\c\td\x01 caf\xc3\xa9 \xff\xc3 \xed\xa0\x80!");
    assert_string_equal(out, "{\"ts\":\"2024-05-20T12:00:00.123Z\",\"level\":\"info\","
                             "\"program\":\"p\",\"event\":\"log\",\"msg\":\"a\\\"b\\\\c\\u0009d"
                             "\\u0001 caf\xc3\xa9 \\ufffd\\ufffd \\ufffd\\ufffd\\ufffd!\"}\n");
}

static void test_json_cut(void **state) {
    (void)state;
    char big[6000], out[256];
    memset(big, 'm', sizeof big - 1); /* a long message of one letter */
    big[sizeof big - 1] = '\0';
    big[100] = '"'; /* an escape near the cut must not be split */
    peer_ui_field f[] = {PEER_UI_INT("task", 1)};
    size_t n = peer_ui_json_line(out, sizeof out, &TS, LOG_ERROR, "p", "e", f, 1, big);
    assert_int_equal(n, strlen(out));
    assert_true(n <= sizeof out - 1 && n > 200);
    assert_memory_equal(out + n - 6, "...\"}\n", 6);
    assert_non_null(strstr(out, "\"task\":1,\"msg\":\"mmm"));
    /* A cut never lands inside an escape: the byte before the mark is
     * 'm' or the end of a whole escape. */
    assert_int_equal(out[n - 7], 'm');
    /* Fields that do not fit are left out whole; the line stays JSON. */
    char tiny[100];
    peer_ui_field many[] = {PEER_UI_STR("long", "yyyyyyyyyyyyyyyyyyyyyyyyyyyyyy"),
                            PEER_UI_INT("n", 5)};
    n = peer_ui_json_line(tiny, sizeof tiny, &TS, LOG_INFO, "p", "e", many, 2, "hi");
    assert_string_equal(tiny, "{\"ts\":\"2024-05-20T12:00:00.123Z\",\"level\":\"info\","
                              "\"program\":\"p\",\"event\":\"e\",\"n\":5,\"msg\":\"hi\"}\n");
    assert_int_equal(n, strlen(tiny));
}

static void test_format_option(void **state) {
    (void)state;
    peer_log_format f = PEER_LOG_JSON;
    assert_int_equal(peer_log_format_parse("text", &f), VL_OK);
    assert_int_equal(f, PEER_LOG_TEXT);
    assert_int_equal(peer_log_format_parse("json", &f), VL_OK);
    assert_int_equal(f, PEER_LOG_JSON);
    assert_int_equal(peer_log_format_parse("JSON", &f), VL_EINVAL);
    assert_int_equal(peer_log_format_parse("", &f), VL_EINVAL);
    assert_int_equal(peer_log_format_parse(NULL, &f), VL_EINVAL);
}

static void test_refusal_explained(void **state) {
    (void)state;
    vl_error e = {0};
    const char *body = "{\"error\":{\"code\":\"unknown_peer\",\"message\":\"no such key\"}}";
    assert_int_equal(
        peer_refusal(&e, "task request refused", 401, (const uint8_t *)body, strlen(body)),
        PEER_EREFUSED);
    assert_string_equal(e.msg, "task request refused: 401 unknown_peer: the coordinator does "
                               "not know this peer (removed, or another run); join again with "
                               "a new token; it said: no such key");
    body = "{\"error\":{\"code\":\"revoked\"}}";
    peer_refusal(&e, "upload refused", 403, (const uint8_t *)body, strlen(body));
    assert_string_equal(e.msg, "upload refused: 403 revoked: the operator has revoked this "
                               "peer; it cannot take part any more");
    /* A code without words of its own is passed on as it came. */
    body = "{\"error\":{\"code\":\"not_your_task\",\"message\":\"m\"}}";
    peer_refusal(&e, "upload refused", 403, (const uint8_t *)body, strlen(body));
    assert_string_equal(e.msg, "upload refused: 403 not_your_task: m");
}

/* ---- through the log ----------------------------------------------------- */

static int cap_fd = -1, saved_fd = -1;
static char cap_path[] = "/tmp/volley-ui-XXXXXX";

static void capture_begin(void) {
    strcpy(cap_path, "/tmp/volley-ui-XXXXXX");
    cap_fd = mkstemp(cap_path);
    assert_true(cap_fd >= 0);
    fflush(stderr);
    saved_fd = dup(STDERR_FILENO);
    assert_true(saved_fd >= 0);
    assert_true(dup2(cap_fd, STDERR_FILENO) >= 0);
}

static void capture_end(char *out, size_t cap) {
    assert_true(dup2(saved_fd, STDERR_FILENO) >= 0);
    close(saved_fd);
    ssize_t n = pread(cap_fd, out, cap - 1, 0);
    assert_true(n >= 0);
    out[n] = '\0';
    close(cap_fd);
    unlink(cap_path);
}

static size_t count(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static void test_status_through_log(void **state) {
    (void)state;
    unsetenv("VOLLEY_LOG");
    vl_log_set_program("volley-peer");
    static char out[1 << 16];
    capture_begin();
    peer_ui_start(PEER_LOG_TEXT, 1);
    peer_ui_device("cpu");
    peer_ui_train_begin(9, 100, 64);
    /* A hundred steps at once: drawn at most once more, not a hundred times. */
    for (int i = 1; i <= 100; i++) peer_ui_step(i, 3.5);
    vl_log_info("between the lines");
    peer_ui_stop();
    vl_log_info("after");
    capture_end(out, sizeof out);
    size_t clears = count(out, CLEAR);
    assert_true(clears >= 2 && clears <= 5);
    /* The log line: cleared before, whole, the status line drawn again
     * after it; the stop clears it; later lines are plain. */
    const char *line = strstr(out, " INFO volley-peer: between the lines\n");
    assert_non_null(line);
    assert_memory_equal(line - 24 - strlen(CLEAR), CLEAR, strlen(CLEAR));
    const char *after = line + strlen(" INFO volley-peer: between the lines\n");
    assert_memory_equal(after, CLEAR "task 9 | step ", strlen(CLEAR "task 9 | step "));
    assert_non_null(strstr(after, " | loss 3.5000 | "));
    const char *plain = strstr(out, " INFO volley-peer: after\n");
    assert_non_null(plain);
    assert_memory_equal(plain - 24 - strlen(CLEAR), CLEAR, strlen(CLEAR));
    assert_null(strstr(plain, CLEAR));
}

static void test_json_and_reach_through_log(void **state) {
    (void)state;
    unsetenv("VOLLEY_LOG");
    vl_log_set_program("volley-peer");
    static char out[1 << 16];
    capture_begin();
    peer_ui_start(PEER_LOG_JSON, 1); /* JSON: no status line, even when asked */
    peer_ui_train_begin(3, 10, 64);
    peer_ui_step(1, 2.0);
    vl_log_info("plain");
    peer_ui_reached("https://c:1"); /* never out of reach: nothing to say */
    for (int i = 0; i < 3; i++)
        peer_ui_unreachable("https://c:1", "connection refused", 0, 1.5, 5 - i, 30, 0);
    peer_ui_unreachable("https://c:1", "503 busy", 1, 2.0, 2, 30, 0);
    peer_ui_reached("https://c:1");
    peer_ui_reached("https://c:1");
    peer_ui_unreachable("https://c:1", "connection refused", 0, 0.5, 7, 30, 0);
    vl_log_set_writer(NULL, NULL);
    capture_end(out, sizeof out);
    assert_null(strstr(out, CLEAR));
    assert_int_equal(count(out, "\n"), 5);
    assert_non_null(strstr(out, "\"level\":\"info\",\"program\":\"volley-peer\",\"event\":\"log\","
                                "\"msg\":\"plain\"}\n"));
    assert_non_null(strstr(out, "\"event\":\"coordinator_unreachable\",\"url\":\"https://c:1\","
                                "\"reason\":\"connection refused\",\"answered\":0,"
                                "\"retry_in_s\":1.5,\"tries_left\":5,\"backoff_cap_s\":30,"
                                "\"give_up_after_s\":0,\"msg\":\"cannot reach the "
                                "coordinator at https://c:1 (connection refused); retrying in "
                                "1.5 s, up to 5 more times before giving up\"}\n"));
    assert_non_null(strstr(out, "\"msg\":\"the coordinator at https://c:1 is not serving "
                                "requests now (503 busy); retrying in 2.0 s, up to 2 more times "
                                "before giving up\"}\n"));
    assert_int_equal(count(out, "\"event\":\"coordinator_reached\""), 1);
    assert_non_null(strstr(out, "\"msg\":\"reached the coordinator at https://c:1 again; "
                                "reconnected after 0 s\"}\n"));
    /* Out of reach again after the return: said again. */
    assert_int_equal(count(out, "\"reason\":\"connection refused\""), 2);
}

/* Without an attempt limit the line names the backoff's cap and how to
 * stop, or the deadline; the return names how long it took. */
static void test_patience_lines(void **state) {
    (void)state;
    unsetenv("VOLLEY_LOG");
    vl_log_set_program("volley-peer");
    static char out[1 << 14];
    peer_ui_reached("https://c:1"); /* whatever an earlier test left */
    capture_begin();
    peer_ui_start(PEER_LOG_TEXT, 0);
    for (int i = 0; i < 4; i++)
        peer_ui_unreachable("https://c:1", "connection refused", 0, 0.5 * (i + 1), -1, 300, 0);
    peer_ui_reached("https://c:1");
    peer_ui_unreachable("https://c:1", "503 busy", 1, 2.0, -1, 300, 600);
    peer_ui_reached("https://c:1");
    vl_log_set_writer(NULL, NULL);
    capture_end(out, sizeof out);
    assert_int_equal(count(out, "unreachable (connection refused)"), 1);
    assert_non_null(strstr(out, "coordinator https://c:1 unreachable (connection refused); trying "
                                "again with backoff up to 5 min; --give-up-after to stop\n"));
    assert_non_null(strstr(out, "coordinator https://c:1 not serving requests now (503 busy); "
                                "trying again with backoff up to 5 min; giving up after 10 min\n"));
    assert_int_equal(count(out, "reconnected after 0 s\n"), 2);
}

static void test_duration(void **state) {
    (void)state;
    struct {
        double s;
        const char *want;
    } c[] = {{0, "0 s"},          {12.4, "12 s"}, {59.6, "1 min"},
             {192, "3 min 12 s"}, {300, "5 min"}, {3600, "1 h"},
             {7500, "2 h 5 min"}, {-5, "0 s"},    {NAN, "0 s"}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char b[32];
        peer_ui_duration(c[i].s, b, sizeof b);
        assert_string_equal(b, c[i].want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_line),
        cmocka_unit_test(test_status_narrow),
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_json_line),
        cmocka_unit_test(test_json_cut),
        cmocka_unit_test(test_format_option),
        cmocka_unit_test(test_refusal_explained),
        cmocka_unit_test(test_status_through_log),
        cmocka_unit_test(test_json_and_reach_through_log),
        cmocka_unit_test(test_patience_lines),
        cmocka_unit_test(test_duration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
