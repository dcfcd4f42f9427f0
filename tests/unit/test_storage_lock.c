/* storage: the server's lock beside the database, and writes on a full
 * disk.
 *
 * The lock (flock on "<database>-lock"): taken once, a second take is
 * refused (flock conflicts between two open files of one process as
 * between two processes) with the holder's pid and command line; released,
 * it can be taken again and its file is empty. A child process that takes
 * it and is killed leaves it free for the next one.
 *
 * A full disk, as SQLite's max_page_count on the connection: a write that
 * needs a new page fails with VL_EFULL and a message that says so;
 * inside a transaction with a savepoint, that failure makes SQLite roll
 * the whole transaction back, which storage_savepoint_end reports as an
 * error instead of a "no such savepoint" from a ROLLBACK TO, and nothing of
 * the transaction is stored; with room again the same write works. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "storage/internal.h"
#include "storage/storage.h"
#include "test_util.h"
#include "storage_fixtures.h"

/* The fixture's lock file, removed so its directory can go. */
static void lock_file(const fixture *f, char *out, size_t cap) {
    OK(storage_lock_path(f->path, out, cap, &e_));
}

static int64_t file_bytes(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (int64_t)sb.st_size : -1;
}

static void test_lock_refuses_a_second_holder(void **state) {
    fixture *f = *state;
    char path[256];
    lock_file(f, path, sizeof path);
    storage_lock *a = NULL, *b = NULL;
    OK(storage_lock_take(f->path, &a, &e_));
    assert_non_null(a);
    vl_error e = {0};
    assert_int_equal(storage_lock_take(f->path, &b, &e), VL_ECONFLICT);
    assert_null(b);
    char want[64];
    snprintf(want, sizeof want, "in use by process %ld (", (long)getpid());
    if (!strstr(e.msg, want) || !strstr(e.msg, "test_storage_lock") || !strstr(e.msg, path))
        fail_msg("the refusal does not name this process, its command and the lock: %s", e.msg);
    storage_lock_release(a);
    assert_int_equal(file_bytes(path), 0);
    OK(storage_lock_take(f->path, &b, &e_));
    assert_true(file_bytes(path) > 0);
    storage_lock_release(b);
    unlink(path);
}

static void test_lock_dies_with_its_holder(void **state) {
    fixture *f = *state;
    char path[256];
    lock_file(f, path, sizeof path);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        storage_lock *l = NULL;
        vl_error e = {0};
        char ok = storage_lock_take(f->path, &l, &e) == VL_OK ? 'y' : 'n';
        if (write(ready[1], &ok, 1) != 1) _exit(2);
        pause(); /* killed below, holding the lock */
        _exit(0);
    }
    close(ready[1]);
    char ok = 0;
    assert_int_equal(read(ready[0], &ok, 1), 1);
    close(ready[0]);
    assert_int_equal(ok, 'y');
    storage_lock *l = NULL;
    vl_error e = {0};
    assert_int_equal(storage_lock_take(f->path, &l, &e), VL_ECONFLICT);
    char want[48];
    snprintf(want, sizeof want, "process %ld", (long)pid);
    if (!strstr(e.msg, want)) fail_msg("the holder %ld is not named: %s", (long)pid, e.msg);
    /* A kill leaves no stale lock: the kernel drops it with the process. */
    kill(pid, SIGKILL);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    OK(storage_lock_take(f->path, &l, &e_));
    storage_lock_release(l);
    unlink(path);
}

/* Limits the connection to the pages the database has now. */
static void fill_disk(storage *st) {
    sqlite3_stmt *s = NULL;
    assert_int_equal(sqlite3_prepare_v2(st->db, "PRAGMA page_count", -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    long long pages = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA max_page_count = %lld", pages);
    assert_int_equal(sqlite3_exec(st->db, sql, NULL, NULL, NULL), SQLITE_OK);
}

static void make_room(storage *st) {
    assert_int_equal(sqlite3_exec(st->db, "PRAGMA max_page_count = 1073741823", NULL, NULL, NULL),
                     SQLITE_OK);
}

/* Inserts tokens with hashes from first on until one fails; returns its
 * code (how many went in: *n). */
static int insert_until_full(storage *st, int first, int *n, vl_error *e) {
    for (*n = 0; *n < 100000; (*n)++) {
        char hash[65];
        snprintf(hash, sizeof hash, "%064d", first + *n);
        int rc = storage_token_insert(st, hash, 1, 9999999999, 100, NULL, e);
        if (rc != VL_OK) return rc;
    }
    return VL_OK;
}

static int64_t tokens(storage *st) {
    sqlite3_stmt *s = NULL;
    assert_int_equal(sqlite3_prepare_v2(st->db, "SELECT count(*) FROM tokens", -1, &s, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return n;
}

static void test_full_disk_is_named_and_rolls_back(void **state) {
    fixture *f = *state;
    insert_run(f->st);
    fill_disk(f->st);
    /* Outside a transaction: the write that needs a page fails as full. */
    int n = 0;
    vl_error e = {0};
    assert_int_equal(insert_until_full(f->st, 0, &n, &e), VL_EFULL);
    if (strncmp(e.msg, "disk full writing run.db", 24) != 0)
        fail_msg("the message does not say the disk is full: %s", e.msg);
    int64_t before = tokens(f->st);
    assert_int_equal(before, n);
    /* In a writer's transaction and a job's savepoint: the failure takes
     * the whole transaction, which the savepoint's end says. */
    OK(storage_begin(f->st, &e_));
    OK(storage_savepoint(f->st, &e_));
    int m = 0;
    memset(&e, 0, sizeof e);
    assert_int_equal(insert_until_full(f->st, 1000000, &m, &e), VL_EFULL);
    vl_error se = {0};
    int rc = storage_savepoint_end(f->st, 0, &se);
    assert_int_equal(rc, VL_EDB);
    if (strstr(se.msg, "no such savepoint")) fail_msg("%s", se.msg);
    assert_false(storage_in_transaction(f->st));
    storage_rollback(f->st); /* a no-op now, as the writer calls it */
    assert_int_equal(tokens(f->st), before);
    /* With room again the same write goes in. */
    make_room(f->st);
    OK(storage_begin(f->st, &e_));
    OK(storage_savepoint(f->st, &e_));
    OK(storage_token_insert(f->st,
                            "f000000000000000000000000000000000000000000000000000000000000000", 1,
                            9999999999, 100, NULL, &e_));
    OK(storage_savepoint_end(f->st, 1, &e_));
    OK(storage_commit(f->st, &e_));
    assert_int_equal(tokens(f->st), before + 1);
}

int main(void) {
    vl_log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lock_refuses_a_second_holder, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_dies_with_its_holder, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_disk_is_named_and_rolls_back, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
