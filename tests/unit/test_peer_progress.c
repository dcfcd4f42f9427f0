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
    assert_int_equal(peer_status_print(dir, out, &e), VL_ENOTFOUND);
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
    assert_int_equal(peer_status_print(dir, out, &e), VL_OK);
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
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_missing_is_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
