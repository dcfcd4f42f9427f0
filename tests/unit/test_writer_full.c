/* coordinator: a full disk under a running coordinator (the event loop,
 * the writer and compute threads, a real run database). The disk is
 * "full" through SQLite's own limit on the writer's connection (PRAGMA
 * max_page_count at the database's size): any write that needs a new page
 * fails with SQLITE_FULL, which is also what SQLite does on ENOSPC, and
 * after which it rolls back the whole transaction, savepoints included.
 *
 * Two acknowledged updates wait for version 1 when the disk fills. The
 * merge must fail, be reported once as a full disk naming the 2 updates
 * waiting (not "no such savepoint" every 5 s), be retried with a growing,
 * capped delay, and an upload arriving meanwhile (its body's write failing
 * with ENOSPC through the fault layer of tests/faults, when it is loaded)
 * must fail, never be told it is stored, and store nothing; once the limit is lifted, the next
 * retry makes version 1 from exactly those two updates, each merged once,
 * the log says the disk has room again, and version 2 follows as usual. */
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
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>
#include <sqlite3.h>

#include "test_util.h"
#include "coordinator/coord.h"
#include "storage/internal.h"
#include "coordinator/cli/cli.h"
#include "coordinator/run/writer.h"
#include "coordinator/sched/schedule.h"
#include "coordinator/server.h"

/* A dense run of two updates a version in dir, served with no listener. */
static coord_server *open_run(const char *dir) {
    char corpus[600], cfg[600], db[600], text[1600];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(cfg, sizeof cfg, "%s/run.json", dir);
    snprintf(db, sizeof db, "%s/run.db", dir);
    test_write_corpus(corpus, "a merge that waits for room on the disk. ");
    snprintf(text, sizeof text,
             "{\"name\": \"full\", \"corpus\": \"%s\", \"model\": {\"vocab_size\": 256, "
             "\"block_size\": 16, \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16}, "
             "\"updates_per_version\": 2, \"max_versions\": 4, \"task_bytes\": 4096, "
             "\"max_loss_rise\": 0, \"outer\": {\"lr\": 1.0, \"momentum\": 0.0}, "
             "\"train\": {\"steps\": 4, \"batch\": 4}}",
             corpus);
    test_write_text(cfg, text);
    OK(coord_cmd_init(db, cfg, &e_));
    coord_server *srv = NULL;
    OK(coord_server_open(db, NULL, &srv, &e_));
    return srv;
}

/* A done task of peer on the current version and its dense update, as an
 * acknowledged upload leaves them; returns the task's id. */
static int64_t store_update(coord_server *srv, storage *db, int64_t peer, uint64_t seed) {
    storage_task t = {.peer_id = peer,
                      .base_version = srv->run.version,
                      .data_offset = 0,
                      .data_length = 4096,
                      .seed = 1,
                      .issued_at = 1000,
                      .deadline = vl_clock_unix_s() + 600,
                      .state = STORAGE_TASK_DONE};
    int64_t tid = 0;
    vl_error e = {0};
    int rc = storage_task_insert(db, &t, &tid, &e);
    if (rc != VL_OK) return rc;
    float *d = random_vec(srv->run.n_params, seed);
    for (size_t i = 0; i < srv->run.n_params; i++) d[i] *= 0.01f;
    compress_update_meta m = {.task = tid,
                              .peer = peer,
                              .base_version = srv->run.version,
                              .num_samples = 10,
                              .local_steps = 2,
                              .loss = 3.0};
    snprintf(m.run, sizeof m.run, "full");
    vl_buf b;
    vl_buf_init(&b, 1 << 24);
    OK(compress_update_encode_dense(&m, d, srv->run.n_params, ST_F32, &b, &e_));
    free(d);
    storage_update u = {.task_id = tid,
                        .peer_id = peer,
                        .base_version = srv->run.version,
                        .num_samples = 10,
                        .local_steps = 2,
                        .loss = 3.0,
                        .nbytes = (int64_t)b.len,
                        .blob = b.data,
                        .received_at = vl_clock_unix_s()};
    snprintf(u.kind, sizeof u.kind, "none");
    rc = storage_update_insert(db, &u, NULL, &e);
    vl_buf_free(&b);
    return rc == VL_OK ? tid : rc;
}

/* A writer job: sets the writer connection's page limit (0: the
 * database's size now, so that nothing more fits; else that many). */
typedef struct limit_job {
    coord_job job;
    int64_t pages;
    int done, rc;
} limit_job;

static int limit_run(storage *db, coord_job *job, vl_error *err) {
    limit_job *j = (limit_job *)job;
    char sql[64];
    if (j->pages == 0) {
        sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(db->db, "PRAGMA page_count", -1, &s, NULL) != SQLITE_OK ||
            sqlite3_step(s) != SQLITE_ROW) {
            sqlite3_finalize(s);
            return vl_fail(err, VL_EDB, "page_count: %s", sqlite3_errmsg(db->db));
        }
        j->pages = sqlite3_column_int64(s, 0);
        sqlite3_finalize(s);
    }
    snprintf(sql, sizeof sql, "PRAGMA max_page_count = %lld", (long long)j->pages);
    if (sqlite3_exec(db->db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return vl_fail(err, VL_EDB, "max_page_count: %s", sqlite3_errmsg(db->db));
    return VL_OK;
}

/* An upload as routes_updates.c writes it: the update, on the writer. */
typedef struct upload_job {
    coord_job job;
    coord_server *srv;
    int64_t peer, task;
    int done, rc;
} upload_job;

static int upload_run(storage *db, coord_job *job, vl_error *err) {
    upload_job *j = (upload_job *)job;
    int64_t tid = store_update(j->srv, db, j->peer, 77);
    if (tid < 0) return vl_fail(err, (int)tid, "upload failed");
    j->task = tid;
    return VL_OK;
}

static void job_done(coord_job *job, int rc, const vl_error *err) {
    (void)err;
    /* Both job kinds start with their coord_job, then the same tail. */
    if (job->run == limit_run) {
        ((limit_job *)job)->done = 1;
        ((limit_job *)job)->rc = rc;
    } else {
        ((upload_job *)job)->done = 1;
        ((upload_job *)job)->rc = rc;
    }
}

/* Runs the loop for about s seconds, or until *flag is set. */
static void spin(coord_server *srv, double s, const int *flag) {
    double end = vl_clock_mono_s() + s;
    while (vl_clock_mono_s() < end && !(flag && *flag)) {
        struct timeval tv = {0, 5000};
        event_base_loopexit(srv->base, &tv);
        event_base_dispatch(srv->base);
    }
}

static void set_limit(coord_server *srv, int64_t pages) {
    limit_job j = {.job = {.run = limit_run, .done = job_done}, .pages = pages};
    coord_writer_submit(srv->run.writer, &j.job);
    spin(srv, 10, &j.done);
    assert_true(j.done);
    assert_int_equal(j.rc, VL_OK);
}

static int64_t count(coord_server *srv, const char *sql) {
    sqlite3_stmt *s = NULL;
    assert_int_equal(sqlite3_prepare_v2(srv->run.db->db, sql, -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return n;
}

/* Lines of the log file that hold needle. */
static int log_lines(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) n++;
    fclose(f);
    return n;
}

/* Set once the upload on a full disk was checked (the fault layer is
 * loaded). */
static int uploads_checked;

static void test_full_disk_pauses_and_resumes(void **state) {
    (void)state;
    char *dir = test_temp_dir("/tmp/volley-full.XXXXXX");
    char logpath[700];
    snprintf(logpath, sizeof logpath, "%s/log.txt", dir);
    /* The log goes to a file, so the test can count its lines. */
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    FILE *logf = freopen(logpath, "w", stderr);
    assert_non_null(logf);
    setvbuf(stderr, NULL, _IONBF, 0);

    coord_server *srv = open_run(dir);
    srv->sched.disk.first_s = 0.05;
    srv->sched.disk.max_s = 0.2;
    int64_t peer[2];
    for (int k = 0; k < 2; k++) {
        uint8_t pk[VCRYPTO_PK_BYTES];
        memset(pk, k + 1, sizeof pk);
        OK(storage_peer_insert(srv->run.db, pk, "p", "{}", 0, vl_clock_unix_s(), &peer[k], &e_));
    }
    /* Two acknowledged updates, then the disk fills. */
    assert_true(store_update(srv, srv->run.db, peer[0], 1) > 0);
    assert_true(store_update(srv, srv->run.db, peer[1], 2) > 0);
    set_limit(srv, 0);
    vl_error e = {0};
    assert_int_equal(coord_merge_if_ready(srv, &e), VL_OK);
    /* The first try fails, and the retries that follow, each one later,
     * however often an update that fits asks for a merge meanwhile. */
    double until = vl_clock_mono_s() + 1.5;
    while (vl_clock_mono_s() < until) {
        spin(srv, 0.01, NULL);
        coord_note_update(srv);
    }
    assert_int_equal(srv->run.version, 0);
    assert_true(srv->sched.disk.full);
    assert_int_equal(srv->sched.disk.reports, 1);
    int64_t retries = srv->sched.disk.retries;
    /* 0.05, 0.1, 0.2, 0.2, ... s: about 8 in 1.5 s; one every 5 ms
     * without the backoff, none without the retry. */
    if (retries < 3 || retries > 12) fail_msg("%lld merge retries in 1.5 s", (long long)retries);
    assert_true(srv->sched.disk.retry_s <= srv->sched.disk.max_s);
    assert_true(coord_writer_disk_full(srv->run.writer));
    /* An upload now is never told it is stored, and is not. Its body
     * goes to a segment file, not to a page: with the fault layer loaded
     * (LD_PRELOAD, the optimised build), that write fails with ENOSPC. */
    void (*fail_next)(const char *, int) =
        (void (*)(const char *, int))dlsym(RTLD_DEFAULT, "volley_powercut_fail_next");
    if (fail_next) {
        fail_next("segment write", ENOSPC);
        upload_job up = {.job = {.run = upload_run, .done = job_done}, .srv = srv, .peer = peer[0]};
        coord_writer_submit(srv->run.writer, &up.job);
        spin(srv, 10, &up.done);
        assert_true(up.done);
        assert_int_equal(up.rc, VL_EFULL);
        assert_int_equal(count(srv, "SELECT count(*) FROM updates"), 2);
        assert_int_equal(count(srv, "SELECT count(*) FROM tasks"), 2);
        assert_int_equal(srv->sched.disk.reports, 1);
        uploads_checked = 1;
    }

    /* Room again: the next retry makes version 1 of exactly the two. */
    set_limit(srv, (int64_t)1 << 30);
    for (int i = 0; i < 400 && srv->run.version < 1; i++) spin(srv, 0.05, NULL);
    assert_int_equal(srv->run.version, 1);
    assert_false(srv->sched.disk.full);
    assert_int_equal(count(srv, "SELECT count(*) FROM updates WHERE merged_version = 1"), 2);
    assert_int_equal(count(srv, "SELECT count(*) FROM updates WHERE merged_version IS NULL"), 0);
    assert_int_equal(count(srv, "SELECT count(*) FROM versions"), 2);

    /* And the run goes on: version 2 from two more. */
    assert_true(store_update(srv, srv->run.db, peer[0], 3) > 0);
    assert_true(store_update(srv, srv->run.db, peer[1], 4) > 0);
    assert_int_equal(coord_merge_if_ready(srv, &e), VL_OK);
    for (int i = 0; i < 400 && srv->run.version < 2; i++) spin(srv, 0.05, NULL);
    assert_int_equal(srv->run.version, 2);
    assert_int_equal(count(srv, "SELECT count(*) FROM updates WHERE merged_version = 2"), 2);
    assert_int_equal(count(srv, "SELECT count(*) FROM updates WHERE merged_version IS NULL"), 0);
    assert_int_equal(srv->sched.disk.reports, 1);
    retries = srv->sched.disk.retries;
    coord_server_close(srv);

    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    int reports = log_lines(logpath, "disk full writing run.db: 2 uploads acknowledged");
    int room = log_lines(logpath, "disk has room again for run.db");
    int savepoint = log_lines(logpath, "no such savepoint");
    int failed = log_lines(logpath, "failed");
    fprintf(stderr,
            "full disk: %d report, %lld merge retries, %d room-again line, %d savepoint "
            "errors, %d lines saying failed; an upload on the full disk %s\n",
            reports, (long long)retries, room, savepoint, failed,
            uploads_checked ? "refused and not stored"
                            : "not tried (SKIPPED: the fault layer is not loaded)");
    if (reports != 1 || room != 1 || savepoint != 0 || failed != 0) {
        FILE *f = fopen(logpath, "r");
        char line[2048];
        while (f && fgets(line, sizeof line, f)) fputs(line, stderr);
        if (f) fclose(f);
        fail_msg("the log above should hold one report and one room-again line");
    }
    test_remove_tree(dir);
    free(dir);
}

int main(void) {
    vl_log_set_level(LOG_INFO);
    if (vcrypto_init() != VL_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_disk_pauses_and_resumes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
