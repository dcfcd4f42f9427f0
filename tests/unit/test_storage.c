/* storage: typed round trips of runs, tokens, peers and tasks (updates,
 * versions, rounds and factors are test_storage_versions.c's, the schema
 * and migrations test_storage_schema.c's). Each test works on a fresh
 * database in a temporary directory. */
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

#include "storage/storage.h"
#include "test_util.h"
#include "storage_fixtures.h"

static void test_run_round_trip(void **state) {
    fixture *f = *state;
    storage_run r;
    vl_error e = {0};
    assert_int_equal(storage_run_get(f->st, &r, &e), VL_ENOTFOUND);
    insert_run(f->st);
    assert_int_equal(storage_run_get(f->st, &r, &e), VL_OK);
    assert_string_equal(r.name, "demo");
    assert_string_equal(r.config, "{\"name\":\"demo\"}");
    assert_string_equal(r.corpus_path, "/data/corpus.txt");
    assert_int_equal(r.corpus_size, 12345);
    assert_int_equal(strlen(r.corpus_hash), 64);
    assert_int_equal(r.current_version, 0);
    assert_int_equal(r.status, STORAGE_RUN_RUNNING);
    storage_run_free(&r);
    /* A second run is refused. */
    storage_run r2 = {.config = "{}", .corpus_path = "/x"};
    assert_int_equal(storage_run_insert(f->st, &r2, &e), VL_ECONFLICT);
}

static void test_tokens(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    int64_t id = 0, got = 0;
    assert_int_equal(storage_token_insert(f->st, "aa", 2, 5000, 1000, &id, &e), VL_OK);
    assert_int_equal(storage_token_check(f->st, "aa", 1000, &got, &e), VL_OK);
    assert_int_equal(got, id);
    assert_int_equal(storage_token_check(f->st, "bb", 1000, &got, &e), VL_ENOTFOUND);
    assert_int_equal(storage_token_check(f->st, "aa", 5000, &got, &e), VL_ENOTFOUND);
    assert_int_equal(storage_token_use(f->st, id, 5000, &e), VL_ENOTFOUND); /* expired */
    assert_int_equal(storage_token_use(f->st, id, 1000, &e), VL_OK);
    assert_int_equal(storage_token_use(f->st, id, 1000, &e), VL_OK);
    assert_int_equal(storage_token_check(f->st, "aa", 1000, &got, &e), VL_ENOTFOUND);
    assert_int_equal(storage_token_use(f->st, id, 1000, &e), VL_ENOTFOUND);
    assert_int_equal(storage_token_insert(f->st, "aa", 1, 5000, 1000, &id, &e), VL_ECONFLICT);
    /* Revoked between the check and the use: the use is refused. */
    int64_t rid = 0;
    assert_int_equal(storage_token_insert(f->st, "cc", 5, 5000, 1000, &rid, &e), VL_OK);
    assert_int_equal(storage_token_check(f->st, "cc", 1000, &got, &e), VL_OK);
    assert_int_equal(storage_token_revoke(f->st, rid, &e), VL_OK);
    assert_int_equal(storage_token_use(f->st, rid, 1000, &e), VL_ENOTFOUND);
}

static int see_name(void *ctx, const storage_peer_activity *a) {
    snprintf(ctx, STORAGE_PEER_NAME_MAX + 2, "%s", a->name);
    return 0;
}

/* A name of the longest length a join takes comes back whole from every
 * reader: the peer row and the activity the dashboard and peer list use. */
static void test_peer_name_longest(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    char name[STORAGE_PEER_NAME_MAX + 1];
    memset(name, 'n', STORAGE_PEER_NAME_MAX);
    name[STORAGE_PEER_NAME_MAX] = '\0';
    uint8_t pk[STORAGE_PK_BYTES];
    memset(pk, 0xCD, sizeof pk);
    int64_t id = 0;
    assert_int_equal(storage_peer_insert(f->st, pk, name, "{}", 0, 1000, &id, &e), VL_OK);
    storage_peer p;
    assert_int_equal(storage_peer_get(f->st, id, &p, &e), VL_OK);
    assert_string_equal(p.name, name);
    storage_peer_free(&p);
    char seen[STORAGE_PEER_NAME_MAX + 2] = "";
    assert_int_equal(storage_peer_each(f->st, 1000, see_name, seen, &e), VL_OK);
    assert_string_equal(seen, name);
}

static void test_peers(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    int64_t tok = 0;
    assert_int_equal(storage_token_insert(f->st, "cc", 1, 5000, 1000, &tok, &e), VL_OK);
    uint8_t pk[STORAGE_PK_BYTES];
    memset(pk, 0xAB, sizeof pk);
    int64_t id = 0;
    assert_int_equal(
        storage_peer_insert(f->st, pk, "lab-3", "{\"gpu\":\"none\"}", tok, 1000, &id, &e), VL_OK);
    assert_true(id > 0);
    assert_int_equal(storage_peer_insert(f->st, pk, "again", "{}", tok, 1001, NULL, &e),
                     VL_ECONFLICT);
    storage_peer p;
    assert_int_equal(storage_peer_get(f->st, id, &p, &e), VL_OK);
    assert_memory_equal(p.public_key, pk, sizeof pk);
    assert_string_equal(p.name, "lab-3");
    assert_string_equal(p.hardware, "{\"gpu\":\"none\"}");
    assert_int_equal(p.token_id, tok);
    assert_int_equal(p.revoked, 0);
    storage_peer_free(&p);
    assert_int_equal(storage_peer_touch(f->st, id, 1234, &e), VL_OK);
    assert_int_equal(storage_peer_revoke(f->st, id, &e), VL_OK);
    assert_int_equal(storage_peer_find_key(f->st, pk, &p, &e), VL_OK);
    assert_int_equal(p.id, id);
    assert_int_equal(p.last_seen, 1234);
    assert_int_equal(p.revoked, 1);
    storage_peer_free(&p);
    assert_int_equal(storage_peer_get(f->st, id + 100, &p, &e), VL_ENOTFOUND);
    assert_int_equal(storage_peer_revoke(f->st, id + 100, &e), VL_ENOTFOUND);
    int64_t n = 0;
    assert_int_equal(storage_peer_count(f->st, &n, &e), VL_OK);
    assert_int_equal(n, 1);
}

typedef struct token_list {
    int n;
    storage_token t[4];
} token_list;

static int collect_token(void *ctx, const storage_token *t) {
    token_list *l = ctx;
    if (l->n >= 4) return VL_ETOOBIG;
    l->t[l->n++] = *t;
    return VL_OK;
}

/* The list shows what the operator needs and nothing that could be used
 * to join; a revoked token admits nobody, not even the key it registered. */
static void test_token_list_and_revoke(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    int64_t a = 0, b = 0, got = 0;
    const char *ha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    OK(storage_token_insert(f->st, ha, 3, 5000, 1000, &a, &e_));
    OK(storage_token_insert(f->st, "ffee", 1, 9000, 1001, &b, &e_));
    uint8_t pk[STORAGE_PK_BYTES];
    memset(pk, 0x11, sizeof pk);
    OK(storage_token_use(f->st, a, 1000, &e_));
    OK(storage_peer_insert(f->st, pk, "p", "{}", a, 1000, NULL, &e_));
    token_list l = {0};
    OK(storage_token_each(f->st, collect_token, &l, &e_));
    assert_int_equal(l.n, 2);
    assert_int_equal(l.t[0].id, a);
    assert_string_equal(l.t[0].hash_prefix, "0123456789ab");
    assert_int_equal(l.t[0].uses_left, 2);
    assert_int_equal(l.t[0].expires_at, 5000);
    assert_int_equal(l.t[0].created_at, 1000);
    assert_int_equal(l.t[0].revoked, 0);
    assert_int_equal(l.t[0].peers, 1);
    assert_int_equal(l.t[1].id, b);
    assert_int_equal(l.t[1].peers, 0);

    OK(storage_token_revoke(f->st, a, &e_));
    OK(storage_token_revoke(f->st, a, &e_)); /* again: no error */
    assert_int_equal(storage_token_revoke(f->st, b + 100, &e), VL_ENOTFOUND);
    assert_int_equal(storage_token_check(f->st, ha, 1000, &got, &e), VL_ENOTFOUND);
    assert_int_equal(storage_token_find(f->st, ha, &got, &e), VL_ENOTFOUND);
    assert_int_equal(storage_token_check(f->st, "ffee", 1000, &got, &e), VL_OK);
    memset(&l, 0, sizeof l);
    OK(storage_token_each(f->st, collect_token, &l, &e_));
    assert_int_equal(l.t[0].revoked, 1);
    assert_int_equal(l.t[1].revoked, 0);
    /* A walk stopped by its callback returns the callback's value. */
    l.n = 4;
    assert_int_equal(storage_token_each(f->st, collect_token, &l, &e), VL_ETOOBIG);
}

/* Rotation swaps the key only from the current one, never onto a key
 * another peer holds or any peer has left, and never for a revoked peer. */
static void test_peer_set_key(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    uint8_t k1[STORAGE_PK_BYTES], k2[STORAGE_PK_BYTES], k3[STORAGE_PK_BYTES];
    memset(k1, 1, sizeof k1);
    memset(k2, 2, sizeof k2);
    memset(k3, 3, sizeof k3);
    int64_t a = 0, b = 0;
    OK(storage_peer_insert(f->st, k1, "a", "{}", 0, 1000, &a, &e_));
    OK(storage_peer_insert(f->st, k2, "b", "{}", 0, 1000, &b, &e_));
    assert_int_equal(storage_peer_set_key(f->st, a, k1, k2, &e), VL_ECONFLICT);
    assert_int_equal(storage_peer_set_key(f->st, a, k3, k1, &e), VL_ENOTFOUND);
    OK(storage_peer_set_key(f->st, a, k1, k3, &e_));
    storage_peer p;
    OK(storage_peer_get(f->st, a, &p, &e_));
    assert_memory_equal(p.public_key, k3, sizeof k3);
    storage_peer_free(&p);
    assert_int_equal(storage_peer_find_key(f->st, k1, &p, &e), VL_ENOTFOUND);
    /* The old key no longer matches: a second rotation from it fails. */
    assert_int_equal(storage_peer_set_key(f->st, a, k1, k1, &e), VL_ENOTFOUND);
    /* k1 is retired: the schema refuses it as a rotation's target and as
     * a new peer's key, whatever the caller checked. */
    int retired = 0;
    OK(storage_key_retired(f->st, k1, &retired, &e_));
    assert_true(retired);
    OK(storage_key_retired(f->st, k3, &retired, &e_));
    assert_false(retired);
    assert_int_equal(storage_peer_set_key(f->st, a, k3, k1, &e), VL_ECONFLICT);
    assert_int_equal(storage_peer_insert(f->st, k1, "c", "{}", 0, 1000, NULL, &e), VL_ECONFLICT);
    OK(storage_peer_get(f->st, a, &p, &e_));
    assert_memory_equal(p.public_key, k3, sizeof k3);
    storage_peer_free(&p);
    OK(storage_peer_revoke(f->st, b, &e_));
    assert_int_equal(storage_peer_set_key(f->st, b, k2, k1, &e), VL_ENOTFOUND);
    assert_int_equal(storage_peer_set_key(f->st, b + 100, k2, k1, &e), VL_ENOTFOUND);
}

static void test_tasks_and_slots(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 4);
    int64_t p1 = add_peer(f->st, 1), p2 = add_peer(f->st, 2);
    int64_t next = 0;
    assert_int_equal(storage_task_next_id(f->st, &next, &e), VL_OK);
    assert_int_equal(next, 1);
    storage_task t = {.id = next,
                      .peer_id = p1,
                      .base_version = 0,
                      .data_offset = 7,
                      .data_length = 64,
                      .seed = 99,
                      .issued_at = 1000,
                      .deadline = 1120,
                      .state = STORAGE_TASK_LEASED};
    int64_t t1 = 0;
    assert_int_equal(storage_task_insert(f->st, &t, &t1, &e), VL_OK);
    assert_int_equal(t1, 1);
    int64_t t2 = add_task(f->st, p2, 0, 1060, STORAGE_TASK_LEASED);
    int64_t t3 = add_task(f->st, p2, 0, 1200, STORAGE_TASK_DONE);
    storage_task got;
    assert_int_equal(storage_task_get(f->st, t1, &got, &e), VL_OK);
    assert_int_equal(got.data_offset, 7);
    assert_int_equal(got.seed, 99);
    assert_int_equal(got.state, STORAGE_TASK_LEASED);
    int64_t n = 0;
    assert_int_equal(storage_task_count_slots(f->st, 0, 1000, &n, &e), VL_OK);
    assert_int_equal(n, 3);
    /* Past t2's deadline its slot is free even before it is marked. */
    assert_int_equal(storage_task_count_slots(f->st, 0, 1060, &n, &e), VL_OK);
    assert_int_equal(n, 2);
    assert_int_equal(storage_task_find_lease(f->st, p2, 0, 1000, &got, &e), VL_OK);
    assert_int_equal(got.id, t2);
    assert_int_equal(storage_task_find_lease(f->st, p2, 0, 1060, &got, &e), VL_ENOTFOUND);
    int64_t dl = 0;
    assert_int_equal(storage_task_next_deadline(f->st, 0, 1000, &dl, &e), VL_OK);
    assert_int_equal(dl, 1060);
    assert_int_equal(storage_task_expire(f->st, 1060, &n, &e), VL_OK);
    assert_int_equal(n, 1);
    assert_int_equal(storage_task_get(f->st, t2, &got, &e), VL_OK);
    assert_int_equal(got.state, STORAGE_TASK_EXPIRED);
    assert_int_equal(storage_task_count_done(f->st, 0, &n, &e), VL_OK);
    assert_int_equal(n, 1);
    assert_int_equal(storage_task_set_state(f->st, t1, STORAGE_TASK_DONE, &e), VL_OK);
    assert_int_equal(storage_task_set_state(f->st, 999, STORAGE_TASK_DONE, &e), VL_ENOTFOUND);
    assert_int_equal(storage_task_count_done(f->st, 0, &n, &e), VL_OK);
    assert_int_equal(n, 2);
    /* A release ends only the releasing peer's lease, and only once;
     * a done task (t3) stays done. */
    int64_t t4 = add_task(f->st, p1, 0, 5000, STORAGE_TASK_LEASED);
    assert_int_equal(storage_task_release(f->st, t4, p2, &n, &e), VL_OK);
    assert_int_equal(n, 0);
    assert_int_equal(storage_task_release(f->st, t4, p1, &n, &e), VL_OK);
    assert_int_equal(n, 1);
    assert_int_equal(storage_task_get(f->st, t4, &got, &e), VL_OK);
    assert_int_equal(got.state, STORAGE_TASK_EXPIRED);
    assert_int_equal(storage_task_release(f->st, t4, p1, &n, &e), VL_OK);
    assert_int_equal(n, 0);
    assert_int_equal(storage_task_release(f->st, t3, p2, &n, &e), VL_OK);
    assert_int_equal(n, 0);
    assert_int_equal(storage_task_get(f->st, t3, &got, &e), VL_OK);
    assert_int_equal(got.state, STORAGE_TASK_DONE);
    /* A task for a version that does not exist violates its foreign key. */
    storage_task bad = t;
    bad.id = 0;
    bad.base_version = 7;
    assert_int_equal(storage_task_insert(f->st, &bad, NULL, &e), VL_EDB);
}
int main(void) {
    vl_log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_run_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_name_longest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_token_list_and_revoke, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_set_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tasks_and_slots, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
