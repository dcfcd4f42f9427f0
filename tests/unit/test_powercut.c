/* storage under power cuts and disk faults at chosen moments, with the
 * layer of tests/faults loaded (LD_PRELOAD): a child process writes and
 * is cut, with everything it had not made durable dropped, and the parent
 * reads what the disk kept. A commit that succeeded is whole after the
 * cut (bodies included), whatever failed around it:
 *  - a segment write that fails after another body of the same
 *    transaction was appended (that body must be made durable before the
 *    commit, or the commit must fail);
 *  - a segment fdatasync that fails (its bytes are lost even if a later
 *    sync succeeds, as on Linux: the commit must fail, and later ones must
 *    not lean on that file);
 *  - a failed WAL sync (the commit fails; the next one works);
 *  - the bodies directory created by the transaction (its entry in the
 *    parent directory must be synced too). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "storage/storage.h"
#include "test_util.h"
#include "storage_fixtures.h"

#define CUT_EXIT 86

static void (*fail_next)(const char *what, int err);
static void (*cut_now)(void);

/* A body whose bytes depend on tag. */
static uint8_t *make_body(size_t n, uint8_t tag) {
    uint8_t *b = malloc(n);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(i * 131 + tag * 7 + 1);
    return b;
}

/* One job as the coordinator's writer runs it: in a savepoint, undone
 * alone when it fails. */
static int job(storage *st, int64_t task, int64_t peer, const uint8_t *body, size_t n) {
    vl_error e = {0};
    if (storage_savepoint(st, &e) != VL_OK) return -1;
    int rc = insert_update_body(st, task, peer, body, n, NULL, &e);
    vl_error se = {0};
    if (storage_savepoint_end(st, rc == VL_OK, &se) != VL_OK) return -2;
    return rc;
}

typedef struct {
    int64_t peer, task[4];
} world;

/* A run, version 0, a peer and four tasks, all committed; the fixture's
 * connection is closed so that only the child writes from here on. */
static world prepare(fixture *f) {
    world w = {0};
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 4);
    w.peer = add_peer(f->st, 1);
    for (int i = 0; i < 4; i++) w.task[i] = add_task(f->st, w.peer, 0, 2000, STORAGE_TASK_DONE);
    storage_close(f->st);
    f->st = NULL;
    return w;
}

/* Runs fn in a child on its own connection, then cuts the power there;
 * returns what fn returned (a bit set per commit that succeeded). */
static int run_then_cut(fixture *f, const world *w, int (*fn)(storage *, const world *)) {
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        storage *st = NULL;
        vl_error e = {0};
        if (storage_open(f->path, 0, &st, &e) != VL_OK) _exit(2);
        int got = fn(st, w);
        if (write(pipefd[1], &got, sizeof got) != (ssize_t)sizeof got) _exit(2);
        cut_now();
    }
    close(pipefd[1]);
    int got = -1;
    assert_int_equal(read(pipefd[0], &got, sizeof got), (ssize_t)sizeof got);
    close(pipefd[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), CUT_EXIT);
    return got;
}

typedef struct {
    int64_t task[8];
    int readable[8];
    int n;
} after;

static int seen_cb(void *ctx, const storage_update *u) {
    after *a = ctx;
    assert_true(a->n < 8);
    a->task[a->n] = u->task_id;
    a->readable[a->n] = 0;
    if (u->blob) {
        uint8_t *want = make_body((size_t)u->nbytes, (uint8_t)u->task_id);
        a->readable[a->n] = memcmp(want, u->blob, (size_t)u->nbytes) == 0;
        free(want);
    }
    a->n++;
    return 0;
}

/* What the disk kept: the stored updates, and whether each body reads
 * back as written. */
static after read_back(fixture *f) {
    storage *st = NULL;
    OK(storage_open(f->path, 0, &st, &e_));
    OK(storage_integrity_check(st, &e_));
    after a = {0};
    OK(storage_update_each_unmerged(st, seen_cb, &a, &e_));
    storage_close(st);
    return a;
}

static int find(const after *a, int64_t task) {
    for (int i = 0; i < a->n; i++)
        if (a->task[i] == task) return i;
    return -1;
}

#define BODY 70000

/* Body of task t, tagged with t so that read_back can tell them apart. */
static int job_t(storage *st, const world *w, int i) {
    uint8_t *b = make_body(BODY, (uint8_t)w->task[i]);
    int rc = job(st, w->task[i], w->peer, b, BODY);
    free(b);
    return rc;
}

static int commit(storage *st) {
    vl_error e = {0};
    if (storage_commit(st, &e) == VL_OK) return 1;
    storage_rollback(st);
    return 0;
}

/* Task 0's body appended, task 1's append fails: the commit holds task 0. */
static int failed_append(storage *st, const world *w) {
    vl_error e = {0};
    if (storage_begin(st, &e) != VL_OK) return -1;
    if (job_t(st, w, 0) != VL_OK) return -1;
    fail_next("segment write", ENOSPC);
    if (job_t(st, w, 1) == VL_OK) return -1; /* the fault did not reach it */
    return commit(st);
}

static void test_failed_append_keeps_what_commits(void **state) {
    fixture *f = *state;
    world w = prepare(f);
    int committed = run_then_cut(f, &w, failed_append);
    assert_true(committed == 0 || committed == 1);
    after a = read_back(f);
    assert_int_equal(find(&a, w.task[1]), -1);
    int i = find(&a, w.task[0]);
    if (committed) {
        assert_true(i >= 0);
        assert_true(a.readable[i]); /* acknowledged, so its body is on disk */
    } else {
        assert_int_equal(i, -1);
    }
}

/* A failed segment sync fails its commit; the next transaction commits a
 * body that must not share the fate of the bytes that sync lost. */
static int failed_sync(storage *st, const world *w) {
    vl_error e = {0};
    if (storage_begin(st, &e) != VL_OK || job_t(st, w, 0) != VL_OK) return -1;
    fail_next("segment sync", EIO);
    int first = commit(st);
    if (storage_begin(st, &e) != VL_OK || job_t(st, w, 2) != VL_OK) return -1;
    int second = commit(st);
    return first | second << 1;
}

static void test_failed_sync_fails_its_commit(void **state) {
    fixture *f = *state;
    world w = prepare(f);
    int got = run_then_cut(f, &w, failed_sync);
    assert_int_equal(got, 2); /* the first commit failed, the second held */
    after a = read_back(f);
    assert_int_equal(find(&a, w.task[0]), -1);
    int i = find(&a, w.task[2]);
    assert_true(i >= 0);
    assert_true(a.readable[i]);
}

/* A failed WAL sync: the commit fails and leaves nothing; the next works. */
static int failed_wal_sync(storage *st, const world *w) {
    vl_error e = {0};
    if (storage_begin(st, &e) != VL_OK || job_t(st, w, 0) != VL_OK) return -1;
    fail_next("database sync", EIO);
    int first = commit(st);
    if (storage_begin(st, &e) != VL_OK || job_t(st, w, 3) != VL_OK) return -1;
    int second = commit(st);
    return first | second << 1;
}

static void test_failed_wal_sync_fails_its_commit(void **state) {
    fixture *f = *state;
    world w = prepare(f);
    int got = run_then_cut(f, &w, failed_wal_sync);
    assert_int_equal(got, 2);
    after a = read_back(f);
    int i = find(&a, w.task[3]);
    assert_true(i >= 0);
    assert_true(a.readable[i]);
}

/* The first body ever creates the bodies directory: committed, it must
 * survive the cut with its directory. */
static int first_body(storage *st, const world *w) {
    vl_error e = {0};
    if (storage_begin(st, &e) != VL_OK || job_t(st, w, 0) != VL_OK) return -1;
    return commit(st);
}

static void test_new_directory_survives(void **state) {
    fixture *f = *state;
    world w = prepare(f);
    assert_int_equal(run_then_cut(f, &w, first_body), 1);
    after a = read_back(f);
    int i = find(&a, w.task[0]);
    assert_true(i >= 0);
    assert_true(a.readable[i]);
}

static int teardown_closed(void **state) {
    fixture *f = *state;
    if (f->st) storage_close(f->st);
    f->st = NULL;
    test_remove_db(f->path);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0) return -1;
    free(f);
    return 0;
}

int main(void) {
    fail_next = (void (*)(const char *, int))dlsym(RTLD_DEFAULT, "volley_powercut_fail_next");
    cut_now = (void (*)(void))dlsym(RTLD_DEFAULT, "volley_powercut_now");
    if (!fail_next || !cut_now) {
        fprintf(stderr, "test_powercut: run it with the power-cut layer in LD_PRELOAD\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_failed_append_keeps_what_commits, setup,
                                        teardown_closed),
        cmocka_unit_test_setup_teardown(test_failed_sync_fails_its_commit, setup, teardown_closed),
        cmocka_unit_test_setup_teardown(test_failed_wal_sync_fails_its_commit, setup,
                                        teardown_closed),
        cmocka_unit_test_setup_teardown(test_new_directory_survives, setup, teardown_closed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
