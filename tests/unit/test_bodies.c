/* storage: update bodies in segment files beside the database. They read
 * back byte for byte, stay out of SQLite, vanish with a rolled-back
 * transaction, and their files go once no update points at them, while a
 * connection whose segment was removed under it starts another. Where the
 * file system takes O_DIRECT they are written as aligned blocks. */
#define _GNU_SOURCE /* O_DIRECT */
#include <dirent.h>
#include <fcntl.h>
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

#include <sqlite3.h>

#include "storage/storage.h"
#include "test_util.h"
#include "storage_fixtures.h"

/* A body of n bytes whose content depends on tag, so mixing two up shows. */
static uint8_t *make_body(size_t n, uint8_t tag) {
    uint8_t *b = malloc(n);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(i * 31 + tag);
    return b;
}

static int64_t insert_body(storage *st, int64_t task, int64_t peer, const uint8_t *body, size_t n) {
    int64_t id = 0;
    OK(insert_update_body(st, task, peer, body, n, &id, &e_));
    return id;
}

typedef struct seen {
    int64_t ids[8];
    uint8_t *bodies[8];
    size_t lens[8];
    int n;
} seen;

static int keep_cb(void *ctx, const storage_update *u) {
    seen *s = ctx;
    assert_true(s->n < 8);
    s->ids[s->n] = u->id;
    s->lens[s->n] = (size_t)u->nbytes;
    s->bodies[s->n] = NULL;
    if (u->blob) {
        s->bodies[s->n] = malloc((size_t)u->nbytes);
        assert_non_null(s->bodies[s->n]);
        memcpy(s->bodies[s->n], u->blob, (size_t)u->nbytes);
    }
    s->n++;
    return 0;
}

static void seen_free(seen *s) {
    for (int i = 0; i < s->n; i++) free(s->bodies[i]);
    memset(s, 0, sizeof *s);
}

/* How many segment files the database's body directory holds. */
static int count_segments(const char *db_path) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s-bodies", db_path);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".seg")) n++;
    closedir(d);
    return n;
}

static int64_t count_rows(sqlite3 *db, const char *sql) {
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return n;
}

/* Whether the file system under the database accepts O_DIRECT, as the
 * segment writer asks it to (the bodies are then block-aligned). */
static int direct_io_works(const char *db_path) {
    char probe[300];
    snprintf(probe, sizeof probe, "%s-probe", db_path);
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    int fl = fcntl(fd, F_GETFL);
    int ok = fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
    close(fd);
    assert_int_equal(unlink(probe), 0);
    return ok;
}

static void test_bodies_round_trip_outside_sqlite(void **state) {
    fixture *f = *state;
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 4);
    int64_t p = add_peer(f->st, 1);
    size_t n1 = 200000, n2 = 4099;
    uint8_t *b1 = make_body(n1, 1), *b2 = make_body(n2, 2);
    int64_t u1 = insert_body(f->st, add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE), p, b1, n1);
    int64_t u2 = insert_body(f->st, add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE), p, b2, n2);
    assert_int_equal(count_segments(f->path), 1);
    /* Read on a second connection, as the compute thread does. */
    storage *other;
    OK(storage_open(f->path, 0, &other, &e_));
    seen s = {0};
    OK(storage_update_each_unmerged(other, keep_cb, &s, &e_));
    assert_int_equal(s.n, 2);
    assert_int_equal(s.ids[0], u1);
    assert_int_equal(s.ids[1], u2);
    assert_int_equal(s.lens[0], n1);
    assert_memory_equal(s.bodies[0], b1, n1);
    assert_memory_equal(s.bodies[1], b2, n2);
    seen_free(&s);
    storage_close(other);
    /* SQLite holds where the bodies are, not their bytes. */
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(count_rows(db, "SELECT count(*) FROM update_blobs"), 0);
    assert_int_equal(count_rows(db, "SELECT count(*) FROM update_bodies"), 2);
    /* Where the file system takes O_DIRECT, each body starts on a block. */
    int64_t second = count_rows(db, "SELECT off FROM update_bodies ORDER BY update_id DESC");
    assert_int_equal(second, direct_io_works(f->path) ? 200704 : (int64_t)n1);
    sqlite3_close(db);
    free(b1);
    free(b2);
}

static void test_rolled_back_body_is_not_seen(void **state) {
    fixture *f = *state;
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 4);
    int64_t p = add_peer(f->st, 1);
    int64_t t1 = add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE);
    int64_t t2 = add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE);
    uint8_t *b1 = make_body(5000, 7), *b2 = make_body(6000, 9);
    OK(storage_begin(f->st, &e_));
    insert_body(f->st, t1, p, b1, 5000);
    storage_rollback(f->st);
    int64_t u2 = insert_body(f->st, t2, p, b2, 6000);
    seen s = {0};
    OK(storage_update_each_unmerged(f->st, keep_cb, &s, &e_));
    assert_int_equal(s.n, 1);
    assert_int_equal(s.ids[0], u2);
    assert_memory_equal(s.bodies[0], b2, 6000);
    seen_free(&s);
    free(b1);
    free(b2);
}

/* Connection A appends to segment 0, connection B to segment 1. Once the
 * updates in segment 0 are merged and past retention, B's version commit
 * notes that file (not its own, not the highest) and B's next one, after
 * the first committed, removes it; A's next append sees its segment gone
 * and starts a third, and every unmerged body reads. */
/* A run with one body in segment 0 (written by f's connection) and one in
 * segment 1 (by another connection, which the caller closes). */
typedef struct two_segments {
    storage *other;
    int64_t peer, ua, ub;
    uint8_t *body; /* 3000 bytes, the caller's to free */
} two_segments;

static void two_segments_make(fixture *f, two_segments *t) {
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 1);
    t->peer = add_peer(f->st, 1);
    t->body = make_body(3000, 3);
    t->ua = insert_body(f->st, add_task(f->st, t->peer, 0, 2000, STORAGE_TASK_DONE), t->peer,
                        t->body, 3000);
    OK(storage_open(f->path, 0, &t->other, &e_));
    t->ub = insert_body(t->other, add_task(t->other, t->peer, 0, 2000, STORAGE_TASK_DONE), t->peer,
                        t->body, 3000);
}

/* The transaction whose pruning made a segment unused rolls back: the
 * segment stays (deleted at once, as before, the restored rows would point
 * at no file). Committed, it goes at the next version's prune. */
static void test_prune_rolled_back_keeps_segment(void **state) {
    fixture *f = *state;
    two_segments t;
    two_segments_make(f, &t);
    storage *other = t.other;
    uint8_t *b = t.body;
    int64_t ids[2] = {t.ua, t.ub};
    commit_version(other, 1, 1.0f, ids, 2, 1); /* merged into 1: prunable at 2 */
    OK(storage_begin(other, &e_));
    commit_version(other, 2, 2.0f, NULL, 0, 1); /* in a savepoint of the open transaction */
    storage_rollback(other);
    assert_int_equal(count_segments(f->path), 2);
    commit_version(other, 2, 2.0f, NULL, 0, 1);
    assert_int_equal(count_segments(f->path), 2);
    commit_version(other, 3, 3.0f, NULL, 0, 1);
    assert_int_equal(count_segments(f->path), 1);
    storage_close(other);
    free(b);
}

static void test_unused_segments_are_removed(void **state) {
    fixture *f = *state;
    two_segments t;
    two_segments_make(f, &t);
    storage *other = t.other;
    int64_t p = t.peer, ua = t.ua, ub = t.ub;
    uint8_t *b = t.body;
    assert_int_equal(count_segments(f->path), 2);
    int64_t ids[2] = {ua, ub};
    commit_version(other, 1, 1.0f, ids, 2, 1); /* merged into 1: prunable at 2 */
    assert_int_equal(count_segments(f->path), 2);
    commit_version(other, 2, 2.0f, NULL, 0, 1);
    assert_int_equal(count_segments(f->path), 2); /* noted, kept until committed */
    commit_version(other, 3, 3.0f, NULL, 0, 1);
    assert_int_equal(count_segments(f->path), 1);
    uint8_t *c = make_body(3000, 5);
    int64_t uc = insert_body(f->st, add_task(f->st, p, 3, 5000, STORAGE_TASK_DONE), p, c, 3000);
    assert_int_equal(count_segments(f->path), 2);
    seen s = {0};
    OK(storage_update_each_unmerged(other, keep_cb, &s, &e_));
    assert_int_equal(s.n, 1);
    assert_int_equal(s.ids[0], uc);
    assert_memory_equal(s.bodies[0], c, 3000);
    seen_free(&s);
    storage_close(other);
    free(b);
    free(c);
}

/* A body whose segment is cut short or gone is handed to the caller as
 * lost (blob NULL, lost saying why), so it can be set aside; it is not a
 * short or wrong read, and not an error that stops the walk. */
static int lost_cb(void *ctx, const storage_update *u) {
    char *why = ctx;
    assert_null(u->blob);
    assert_non_null(u->lost);
    snprintf(why, 256, "%s", u->lost);
    return 0;
}

static void test_missing_segment_is_lost(void **state) {
    fixture *f = *state;
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 4);
    int64_t p = add_peer(f->st, 1);
    uint8_t *b = make_body(1000, 4);
    insert_body(f->st, add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE), p, b, 1000);
    char seg[256];
    snprintf(seg, sizeof seg, "%s-bodies/%016d.seg", f->path, 0);
    assert_int_equal(truncate(seg, 10), 0);
    storage *other;
    OK(storage_open(f->path, 0, &other, &e_));
    char why[256] = "";
    OK(storage_update_each_unmerged(other, lost_cb, why, &e_));
    assert_non_null(strstr(why, "short"));
    assert_int_equal(unlink(seg), 0);
    storage_close(other);
    OK(storage_open(f->path, 0, &other, &e_));
    why[0] = '\0';
    OK(storage_update_each_unmerged(other, lost_cb, why, &e_));
    assert_non_null(strstr(why, "cannot open"));
    storage_close(other);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bodies_round_trip_outside_sqlite, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rolled_back_body_is_not_seen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unused_segments_are_removed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prune_rolled_back_keeps_segment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_segment_is_lost, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
