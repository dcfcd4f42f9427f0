/* peer: the record of a peer's work (peer/progress.h) and `status`. A
 * saved record reads back as it was; a missing one is a peer that did
 * nothing yet; a damaged one is refused naming the file and the field;
 * status prints the peer's identity and counts, and refuses a directory
 * that never joined. */
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
#include "peer/progress.h"

static char dir[64];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/volley-progress.XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_missing_is_zero(void **state) {
    (void)state;
    peer_progress p;
    memset(&p, 0x5a, sizeof p);
    vl_error e = {0};
    assert_int_equal(peer_progress_load(dir, &p, &e), VL_OK);
    assert_int_equal(p.accepted, 0);
    assert_int_equal(p.last_task, 0);
    assert_string_equal(p.device, "");
}

static void test_round_trip(void **state) {
    (void)state;
    peer_progress p = {.accepted = 41,
                       .dropped = 3,
                       .last_task = 977,
                       .last_version = 52,
                       .last_loss = 2.5,
                       .last_at = 1795000000,
                       .bytes_up = 123456789};
    snprintf(p.device, sizeof p.device, "CPU, 2 threads");
    vl_error e = {0};
    assert_int_equal(peer_progress_save(dir, &p, &e), VL_OK);
    peer_progress q;
    assert_int_equal(peer_progress_load(dir, &q, &e), VL_OK);
    assert_int_equal(q.accepted, 41);
    assert_int_equal(q.dropped, 3);
    assert_int_equal(q.last_task, 977);
    assert_int_equal(q.last_version, 52);
    assert_true(q.last_loss == 2.5);
    assert_int_equal(q.last_at, 1795000000);
    assert_int_equal(q.bytes_up, 123456789);
    assert_string_equal(q.device, "CPU, 2 threads");
}

static void test_damaged_refused(void **state) {
    (void)state;
    static const struct {
        const char *text, *names;
    } bad[] = {
        {"not json", "progress.json"},
        {"[1, 2]", "progress.json"},
        {"{\"accepted\": -1}", "accepted"},
        {"{\"dropped\": 1.5}", "dropped"},
        {"{\"last_loss\": \"low\"}", "last_loss"},
        {"{\"accepted\": 1, \"accepted\": 2}", "progress.json"},
        {"{\"device\": 7}", "device"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(PEER_PROGRESS_FILE, bad[i].text);
        peer_progress p;
        vl_error e = {0};
        assert_int_equal(peer_progress_load(dir, &p, &e), VL_EINVAL);
        assert_non_null(strstr(e.msg, bad[i].names));
        assert_int_equal(p.accepted, 0); /* nothing half-read */
    }
}

static void test_status(void **state) {
    (void)state;
    vl_error e = {0};
    FILE *out = tmpfile();
    assert_non_null(out);
    /* Never joined: no peer.json. */
    assert_int_equal(peer_status_print(dir, 0, out, &e), VL_ENOTFOUND);
    peer_state st;
    memset(&st, 0, sizeof st);
    snprintf(st.coordinator, sizeof st.coordinator, "https://volley.example.org:8443");
    st.peer_id = 17;
    snprintf(st.run, sizeof st.run, "demo");
    snprintf(st.name, sizeof st.name, "lab-box");
    assert_int_equal(peer_state_save(dir, &st, &e), VL_OK);
    peer_progress p = {.accepted = 5,
                       .dropped = 1,
                       .last_task = 88,
                       .last_version = 9,
                       .last_loss = 3.25,
                       .last_at = 1795000000,
                       .bytes_up = 4000};
    assert_int_equal(peer_progress_save(dir, &p, &e), VL_OK);
    assert_int_equal(peer_status_print(dir, 0, out, &e), VL_OK);
    char text[2048];
    rewind(out);
    size_t n = fread(text, 1, sizeof text - 1, out);
    text[n] = '\0';
    fclose(out);
    assert_non_null(strstr(text, "peer:        17 (lab-box)"));
    assert_non_null(strstr(text, "https://volley.example.org:8443"));
    assert_non_null(strstr(text, "5 accepted, 1 dropped"));
    assert_non_null(strstr(text, "last task:   88 on version 9, training loss 3.2500"));
    assert_non_null(strstr(text, "2026-11-18T"));
    assert_non_null(strstr(text, "pending upload (sent again at the next start): no"));
    assert_non_null(strstr(text, "progress:    at least version 9, the base of this peer's last "
                                 "task (what this directory knows; the coordinator was not asked "
                                 "(--offline))\n"));
}

/* The run's progress line from a GET /v1/status answer, whole however
 * long, and without one. */
static void test_run_line(void **state) {
    (void)state;
    peer_progress p = {.last_task = 4, .last_version = 15};
    char out[1024];
    const char *body =
        "{\"run\": \"r\", \"status\": \"running\", \"version\": 16, "
        "\"max_versions\": 40, \"versions\": [{\"version\": 0, \"val_loss\": 5.5268}, "
        "{\"version\": 15, \"val_loss\": 3.25}, {\"version\": 16, \"val_loss\": null}]}";
    peer_status_run_line(body, strlen(body), &p, "", out, sizeof out);
    assert_string_equal(out, "version 16 of 40 (running); validation loss 3.2500 at version 15, "
                             "5.5268 at the start (from the coordinator)");
    const char *fresh = "{\"status\": \"running\", \"version\": 0, \"max_versions\": 3, "
                        "\"versions\": [{\"version\": 0, \"val_loss\": null}]}";
    peer_status_run_line(fresh, strlen(fresh), &p, "", out, sizeof out);
    assert_string_equal(out, "version 0 of 3 (running) (from the coordinator)");
    /* Not a status answer: what the directory knows, and why. */
    const char *why = "did not answer (gave up after 1 attempts to reach the coordinator at "
                      "https://volley.example.org:8443 (connection refused; GET /v1/status: "
                      "Failed to connect))";
    peer_status_run_line("{\"error\"", 9, &p, why, out, sizeof out);
    char want[600];
    snprintf(want, sizeof want,
             "at least version 15, the base of this peer's last task (what this directory "
             "knows; the coordinator %s)",
             why);
    assert_string_equal(out, want); /* whole: longer than any terminal */
    peer_progress none = {0};
    peer_status_run_line(NULL, 0, &none, "was not asked (--offline)", out, sizeof out);
    assert_string_equal(out, "not known: no task done yet (what this directory knows; the "
                             "coordinator was not asked (--offline))");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_missing_is_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status, setup, teardown),
        cmocka_unit_test(test_run_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
