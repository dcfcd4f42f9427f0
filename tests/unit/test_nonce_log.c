/* coordinator: the nonce journal (nonce_log.h), on the clock the test
 * gives it. A nonce noted is written and read back on start, so it stays
 * a replay across a restart; and a nonce whose created was up to a window
 * ahead of the clock stays one until its own expiry (created + window),
 * across any number of rotations and a restart, while nonces past their
 * expiry are dropped and the files keep rotating. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"
#include "coordinator/conn/nonce_log.h"
#include "crypto/crypto.h"

#define W VCRYPTO_TS_WINDOW_S

/* The test's clock starts at the real one: a close flushes what is
 * pending on the real clock, which is then well inside the first window. */
static int64_t T0;

static const char *const NF = "f00df00df00df00df00df00df00df00d"; /* created a window ahead */
static const char *const NG = "0123456789abcdef0123456789abcdef";
static const char *const NH = "aaaabbbbccccddddeeeeffff00001111";

typedef struct fixture {
    char *dir;
    char db[600], cur[640], old[640];
} fixture;

static int setup(void **state) {
    if (vcrypto_init() != VL_OK) return -1;
    T0 = vl_clock_unix_s();
    fixture *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    fx->dir = test_temp_dir("/tmp/volley-nonce-log.XXXXXX");
    snprintf(fx->db, sizeof fx->db, "%s/run.db", fx->dir);
    snprintf(fx->cur, sizeof fx->cur, "%s-nonces", fx->db);
    snprintf(fx->old, sizeof fx->old, "%s-nonces.old", fx->db);
    *state = fx;
    return 0;
}

static int teardown(void **state) {
    fixture *fx = *state;
    test_remove_tree(fx->dir);
    free(fx->dir);
    free(fx);
    return 0;
}

/* Whether the file at path (missing: no) has a line naming nonce. */
static int file_has(const char *path, const char *nonce) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, nonce) != NULL;
    fclose(f);
    return found;
}

/* Accepts nonce into cache at now and notes it in the journal, as the
 * coordinator does for a request it takes. */
static void accept_at(coord_nonce_log *l, vcrypto_nonce_cache *c, int64_t peer, const char *nonce,
                      int64_t created, int64_t now) {
    assert_int_equal(vcrypto_nonce_check(c, peer, nonce, created, now), VL_OK);
    coord_nonce_log_add(l, peer, nonce, created);
}

/* A restart: a fresh cache filled from the journal at now. */
static coord_nonce_log *reopen(const fixture *fx, vcrypto_nonce_cache **c, int64_t now) {
    vcrypto_nonce_cache_free(*c);
    *c = vcrypto_nonce_cache_new(1024, W);
    assert_non_null(*c);
    coord_nonce_log *l = NULL;
    OK(coord_nonce_log_open_at(fx->db, *c, NULL, now, &l, &e_));
    assert_non_null(l);
    return l;
}

/* Written at the flush and on close, read back on open: the nonce is a
 * replay for the new cache, while one never noted is not, and one past
 * its expiry is forgotten. */
static void test_written_and_loaded(void **state) {
    fixture *fx = *state;
    vcrypto_nonce_cache *c = NULL;
    coord_nonce_log *l = reopen(fx, &c, T0);
    accept_at(l, c, 7, NG, T0, T0);
    assert_false(file_has(fx->cur, NG)); /* pending until the flush */
    OK(coord_nonce_log_flush_at(l, T0 + 1, &e_));
    assert_true(file_has(fx->cur, NG));
    accept_at(l, c, 7, NH, T0 + 1, T0 + 1);
    coord_nonce_log_close(l); /* writes what is pending */
    assert_true(file_has(fx->cur, NH));

    l = reopen(fx, &c, T0 + 10);
    assert_int_equal(vcrypto_nonce_check(c, 7, NG, T0, T0 + 10), VL_ECONFLICT);
    assert_int_equal(vcrypto_nonce_check(c, 7, NH, T0 + 1, T0 + 10), VL_ECONFLICT);
    /* Another peer's, or a nonce never seen, is new. */
    assert_int_equal(vcrypto_nonce_check(c, 8, NG, T0, T0 + 10), VL_OK);
    assert_int_equal(vcrypto_nonce_check(c, 7, NF, T0, T0 + 10), VL_OK);
    coord_nonce_log_close(l);

    /* Still remembered at the last second it could pass, gone after. */
    l = reopen(fx, &c, T0 + W);
    assert_int_equal(vcrypto_nonce_check(c, 7, NG, T0, T0 + W), VL_ECONFLICT);
    coord_nonce_log_close(l);
    l = reopen(fx, &c, T0 + W + 1);
    assert_false(file_has(fx->cur, NG));
    assert_int_equal(vcrypto_nonce_check(c, 7, NG, T0, T0 + W + 1), VL_OK);
    coord_nonce_log_close(l);
    vcrypto_nonce_cache_free(c);
}

/* A request created a window ahead, accepted just before a rotation, is
 * valid until created + window: nearly two windows later. It must stay a
 * replay after the next rotation and a restart, in memory and on disk. */
static void test_future_created_across_rotations(void **state) {
    fixture *fx = *state;
    vcrypto_nonce_cache *c = NULL;
    coord_nonce_log *l = reopen(fx, &c, T0);
    const int64_t created = T0 + W - 1 + W; /* accepted at T0 + W - 1, a window ahead */
    const int64_t expiry = created + W;     /* the last second it can pass */
    accept_at(l, c, 7, NF, created, T0 + W - 1);
    OK(coord_nonce_log_flush_at(l, T0 + W - 1, &e_));
    OK(coord_nonce_log_flush_at(l, T0 + W, &e_)); /* the first rotation */
    assert_true(file_has(fx->old, NF));
    accept_at(l, c, 7, NG, T0 + W, T0 + W);
    /* A window later the current file is due, but the old one still holds
     * a live nonce: it must not be replaced. */
    OK(coord_nonce_log_flush_at(l, T0 + 2 * W, &e_));
    OK(coord_nonce_log_flush_at(l, T0 + 2 * W + 100, &e_));
    assert_true(file_has(fx->cur, NF) || file_has(fx->old, NF));
    /* In memory it is a replay until its expiry. */
    assert_int_equal(vcrypto_nonce_check(c, 7, NF, created, expiry), VL_ECONFLICT);
    coord_nonce_log_close(l);

    /* The restart, just after the second rotation would have been due. */
    const int64_t restart = T0 + 2 * W + 101;
    l = reopen(fx, &c, restart);
    if (vcrypto_nonce_check(c, 7, NF, created, restart) != VL_ECONFLICT)
        fail_msg("a nonce created %d s ahead was forgotten after a rotation and a restart", W);
    /* One accepted at the first rotation has expired by now: not read back. */
    assert_int_equal(vcrypto_nonce_check(c, 7, NG, T0 + W, restart), VL_OK);
    accept_at(l, c, 7, NH, restart, restart);
    OK(coord_nonce_log_flush_at(l, restart, &e_));
    coord_nonce_log_close(l);
    /* And after another restart at the last second it can pass. */
    l = reopen(fx, &c, expiry);
    assert_int_equal(vcrypto_nonce_check(c, 7, NF, created, expiry), VL_ECONFLICT);
    coord_nonce_log_close(l);

    /* Past its expiry it is dropped: read back no more, and rotated out
     * of both files once nothing in the old one is live. */
    l = reopen(fx, &c, expiry + 1);
    assert_int_equal(vcrypto_nonce_check(c, 7, NF, created, expiry + 1), VL_OK);
    assert_int_equal(vcrypto_nonce_check(c, 7, NH, restart, expiry + 1), VL_ECONFLICT);
    OK(coord_nonce_log_flush_at(l, expiry + 1 + W, &e_));
    assert_true(file_has(fx->old, NH));
    OK(coord_nonce_log_flush_at(l, expiry + 1 + 2 * W, &e_));
    assert_false(file_has(fx->cur, NF) || file_has(fx->old, NF));
    assert_false(file_has(fx->cur, NH) || file_has(fx->old, NH));
    coord_nonce_log_close(l);
    vcrypto_nonce_cache_free(c);
}

/* What a start reads back keeps its own expiry too: a nonce created a
 * window ahead, read back and not seen since, outlives the rotations after
 * that start up to its last second. */
static void test_read_back_keeps_expiry(void **state) {
    fixture *fx = *state;
    char text[256];
    snprintf(text, sizeof text, "7 %lld %s\n", (long long)(T0 + W), NF);
    test_write_text(fx->cur, text);
    vcrypto_nonce_cache *c = NULL;
    coord_nonce_log *l = reopen(fx, &c, T0);
    OK(coord_nonce_log_flush_at(l, T0 + W, &e_));     /* rotated */
    OK(coord_nonce_log_flush_at(l, T0 + 2 * W, &e_)); /* due, but the old file is live */
    coord_nonce_log_close(l);
    l = reopen(fx, &c, T0 + 2 * W);
    assert_int_equal(vcrypto_nonce_check(c, 7, NF, T0 + W, T0 + 2 * W), VL_ECONFLICT);
    coord_nonce_log_close(l);
    vcrypto_nonce_cache_free(c);
}

/* A torn last line (a crash mid-write) is skipped, the rest read. */
static void test_torn_line(void **state) {
    fixture *fx = *state;
    char text[256];
    snprintf(text, sizeof text, "7 %lld %s\n7 %lld %.10s", (long long)T0, NG, (long long)T0, NH);
    test_write_text(fx->cur, text);
    vcrypto_nonce_cache *c = NULL;
    coord_nonce_log *l = reopen(fx, &c, T0 + 5);
    assert_int_equal(vcrypto_nonce_check(c, 7, NG, T0, T0 + 5), VL_ECONFLICT);
    assert_int_equal(vcrypto_nonce_check(c, 7, NH, T0, T0 + 5), VL_OK);
    coord_nonce_log_close(l);
    vcrypto_nonce_cache_free(c);
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_written_and_loaded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_future_created_across_rotations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_back_keeps_expiry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_torn_line, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
