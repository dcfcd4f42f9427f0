/* coordinator: the writer's group commit when the COMMIT itself fails.
 * Every job of the batch ran and succeeded inside the transaction, so
 * only the commit's own result tells the writer that none of it is
 * stored; each job must then be answered with an error (an upload told
 * 202 here would be lost while its peer believes it delivered), no commit
 * counted, and the connection left fit for the next batch.
 *
 * The failure is SQLite's commit hook on the writer's own connection: a
 * hook that returns non-zero turns the COMMIT into a ROLLBACK and makes it
 * fail, deterministically and after every statement of the batch has
 * succeeded, which is where a full disk or a failed fsync of the WAL
 * would strike. */
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

#include "coordinator/run/writer.h"
#include "storage/internal.h"
#include "storage/storage.h"
#include "test_util.h"
#include "storage_fixtures.h"

/* Commits the hook still refuses (it refuses while this is above 0). */
static int commits_to_fail;
static int hook_calls;

static int refuse_commit(void *arg) {
    (void)arg;
    hook_calls++;
    if (commits_to_fail > 0) {
        commits_to_fail--;
        return 1;
    }
    return 0;
}

typedef struct token_job {
    coord_job job;
    char hash[65];
    int hook; /* set: installs the commit hook on the writer's connection */
    int ran, done_rc, n_done;
} token_job;

static int token_run(storage *db, coord_job *job, vl_error *err) {
    token_job *j = (token_job *)job;
    j->ran = 1;
    if (j->hook) sqlite3_commit_hook(db->db, refuse_commit, NULL);
    return storage_token_insert(db, j->hash, 1, 9999999999, 100, NULL, err);
}

static void token_done(coord_job *job, int rc, const vl_error *err) {
    token_job *j = (token_job *)job;
    j->done_rc = rc;
    j->n_done++;
    /* An error comes with its message, for the log and the answer. */
    if (rc != VL_OK) assert_true(err->msg[0] != '\0');
}

static void make_jobs(token_job *jobs, int n, int first) {
    memset(jobs, 0, (size_t)n * sizeof *jobs);
    for (int i = 0; i < n; i++) {
        jobs[i].job.run = token_run;
        jobs[i].job.done = token_done;
        jobs[i].done_rc = 12345;
        snprintf(jobs[i].hash, sizeof jobs[i].hash, "%064d", first + i);
    }
}

static int stored(storage *st, const char *hash) {
    int64_t id = 0;
    vl_error e = {0};
    int rc = storage_token_check(st, hash, 100, &id, &e);
    if (rc != VL_OK && rc != VL_ENOTFOUND) fail_msg("token check: %s", e.msg);
    return rc == VL_OK;
}

static void test_failed_commit_fails_every_job(void **state) {
    fixture *f = *state;
    coord_writer *w = NULL;
    OK(coord_writer_start_sync(f->path, &w, &e_));
    enum { N = 6 };
    token_job jobs[N];
    make_jobs(jobs, N, 0);
    jobs[0].hook = 1;
    commits_to_fail = 1;
    hook_calls = 0;
    for (int i = 0; i < N; i++) coord_writer_submit(w, &jobs[i].job);
    assert_int_equal(coord_writer_run_once(w), N);
    /* The hook was asked, so the batch did reach its COMMIT. */
    assert_int_equal(hook_calls, 1);
    assert_int_equal(commits_to_fail, 0);
    for (int i = 0; i < N; i++) {
        assert_true(jobs[i].ran);
        assert_int_equal(jobs[i].n_done, 1);
        if (jobs[i].done_rc >= 0)
            fail_msg("job %d of a batch whose COMMIT failed was told %d, not an error", i,
                     jobs[i].done_rc);
    }
    coord_writer_stats ws;
    coord_writer_stats_get(w, &ws);
    assert_int_equal(ws.commits, 0);
    assert_int_equal(ws.jobs, N);
    assert_int_equal(ws.failed, N);
    uint64_t timed = 0;
    for (int b = 0; b <= COORD_WRITER_COMMIT_BUCKETS; b++) timed += ws.commit_hist[b];
    assert_int_equal(timed, 0);
    assert_int_equal(coord_writer_settled(w), N);
    /* Nothing of the batch is in the database, seen from another
     * connection. */
    for (int i = 0; i < N; i++) assert_false(stored(f->st, jobs[i].hash));

    /* The next batch commits on the same connection (no transaction was
     * left open) and is the first commit counted. */
    token_job more[N];
    make_jobs(more, N, 100);
    for (int i = 0; i < N; i++) coord_writer_submit(w, &more[i].job);
    assert_int_equal(coord_writer_run_once(w), N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(more[i].done_rc, VL_OK);
        assert_true(stored(f->st, more[i].hash));
        assert_false(stored(f->st, jobs[i].hash));
    }
    coord_writer_stats_get(w, &ws);
    assert_int_equal(ws.commits, 1);
    assert_int_equal(ws.failed, N);
    coord_writer_stop(w);
}

int main(void) {
    /* The writer logs the failed transaction, as it should. */
    vl_log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_failed_commit_fails_every_job, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
