/* What the dashboard and the writer's histograms count: the per-peer
 * table (addresses, refused uploads, making room when full), the minutes
 * of uploads and the recent refusals (metrics.c), each peer's totals from
 * the database (storage/stats.c), and the writer's batch-size and
 * commit-time histograms (writer.c). The page itself is checked in a
 * browser by tests/integration/dashboard.sh. */
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

#include "coordinator/coord.h"
#include "coordinator/ops/dashboard.h"
#include "storage/storage.h"
#include "test_util.h"

#include "storage_fixtures.h"
#include "coordinator/base/counters.h"
#include "coordinator/base/routes.h"
#include "coordinator/run/writer.h"

static int upload_route(void) {
    return coord_route_index("/v1/updates");
}

static void test_peer_table(void **state) {
    (void)state;
    coord_metrics *m = calloc(1, sizeof *m);
    assert_non_null(m);
    int up = upload_route(), task = coord_route_index("/v1/task");
    assert_int_not_equal(up, COORD_METRICS_ROUTES - 1);
    /* Peers arrive out of order; the table keeps them by id. */
    for (int64_t id = COORD_METRICS_PEERS; id >= 1; id--)
        coord_metrics_answer(m, task, 200, NULL, id, "10.0.0.1", 0, 1000 + id);
    assert_int_equal(m->n_peers, COORD_METRICS_PEERS);
    for (size_t i = 1; i < m->n_peers; i++) assert_true(m->peers[i - 1].id < m->peers[i].id);
    /* Peer 5 changes address and has one upload refused, one accepted;
     * a refusal on another route is not an upload's. */
    coord_metrics_answer(m, up, 422, "norm_exceeded", 5, "192.0.2.7", 4096, 5000);
    coord_metrics_answer(m, up, 202, NULL, 5, "192.0.2.7", 4096, 5001);
    coord_metrics_answer(m, task, 429, "rate_limited", 5, "192.0.2.7", 0, 5002);
    const coord_metrics_peer *p = coord_metrics_peer_find(m, 5);
    assert_non_null(p);
    assert_string_equal(p->addr, "192.0.2.7");
    assert_int_equal(p->refused, 1);
    assert_int_equal(p->seen, 5002);
    /* A full table: a new peer takes the place of the one heard from
     * longest ago (peer 1, last at 1001), and the order holds. */
    coord_metrics_answer(m, task, 200, NULL, 5000, "10.0.0.2", 0, 6000);
    assert_int_equal(m->n_peers, COORD_METRICS_PEERS);
    assert_null(coord_metrics_peer_find(m, 1));
    assert_non_null(coord_metrics_peer_find(m, 2));
    assert_non_null(coord_metrics_peer_find(m, 5000));
    assert_int_equal(coord_metrics_peer_find(m, 5)->refused, 1);
    for (size_t i = 1; i < m->n_peers; i++) assert_true(m->peers[i - 1].id < m->peers[i].id);
    /* Requests from no peer, or with no address, leave the table be. */
    coord_metrics_answer(m, up, 401, "unauthorized", 0, "198.51.100.1", 10, 6001);
    coord_metrics_answer(m, task, 200, NULL, 2, NULL, 0, 6002);
    assert_int_equal(m->n_peers, COORD_METRICS_PEERS);
    assert_string_equal(coord_metrics_peer_find(m, 2)->addr, "10.0.0.1");
    free(m);
}

static void test_minutes_and_recent(void **state) {
    (void)state;
    coord_metrics *m = calloc(1, sizeof *m);
    assert_non_null(m);
    int up = upload_route();
    int64_t t0 = 1700000000;
    coord_metrics_answer(m, up, 202, NULL, 3, "a", 100, t0);
    coord_metrics_answer(m, up, 202, NULL, 3, "a", 50, t0 + 1);
    coord_metrics_answer(m, up, 409, "stale_update", 3, "a", 70, t0 + 2);
    const coord_metrics_minute *mm = &m->minutes[(t0 / 60) % COORD_METRICS_MINUTES];
    assert_int_equal(mm->minute, t0 / 60);
    assert_int_equal(mm->accepted, 2);
    assert_int_equal(mm->refused, 1);
    assert_int_equal(mm->bytes, 220);
    /* An hour later the same slot starts again from nothing. */
    int64_t t1 = t0 + 60 * COORD_METRICS_MINUTES;
    coord_metrics_answer(m, up, 202, NULL, 3, "a", 9, t1);
    assert_int_equal(mm->minute, t1 / 60);
    assert_int_equal(mm->accepted, 1);
    assert_int_equal(mm->refused, 0);
    assert_int_equal(mm->bytes, 9);
    /* Refusals of every route are kept, the newest COORD_METRICS_RECENT;
     * successes are not. */
    assert_int_equal(m->n_recent, 1);
    for (int i = 0; i < COORD_METRICS_RECENT + 5; i++)
        coord_metrics_answer(m, coord_route_index("/v1/task"), 400 + i % 3, "bad_request", 0, "b",
                             0, t1 + i);
    assert_int_equal(m->n_recent, COORD_METRICS_RECENT + 6);
    const coord_metrics_refusal *newest = &m->recent[(m->n_recent - 1) % COORD_METRICS_RECENT];
    assert_int_equal(newest->at, t1 + COORD_METRICS_RECENT + 4);
    assert_string_equal(newest->code, "bad_request");
    assert_string_equal(coord_route_label(newest->route), "/v1/task");
    /* A code too long for the entry is cut, not overrun. */
    char longcode[100];
    memset(longcode, 'x', sizeof longcode - 1);
    longcode[sizeof longcode - 1] = 0;
    coord_metrics_answer(m, up, 400, longcode, 0, NULL, 0, t1 + 100);
    newest = &m->recent[(m->n_recent - 1) % COORD_METRICS_RECENT];
    assert_int_equal(strlen(newest->code), sizeof newest->code - 1);
    assert_string_equal(newest->addr, "");
    free(m);
}

/* The storage tests' temporary database (storage_fixtures.h) with a run
 * and two peers, whose ids are here. */
static int64_t peer_ids[2];

static int db_setup(void **state) {
    if (setup(state) != 0) return -1;
    fixture *f = *state;
    insert_run(f->st);
    const char *hw[2] = {"{\"cpus\":8,\"gpu\":\"none\"}", "{}"};
    vl_error e = {0};
    for (int i = 0; i < 2; i++) {
        uint8_t pk[32] = {(uint8_t)(i + 1)};
        if (storage_peer_insert(f->st, pk, i ? "second" : "first", hw[i], 0, 100, &peer_ids[i],
                                &e) != VL_OK)
            return -1;
    }
    return 0;
}

typedef struct totals_seen {
    int n;
    storage_peer_totals t[4];
    char hw[4][64];
} totals_seen;

static int collect(void *ctx, const storage_peer_totals *t) {
    totals_seen *s = ctx;
    if (s->n == 4) return VL_ERR;
    s->t[s->n] = *t;
    snprintf(s->hw[s->n], sizeof s->hw[0], "%s", t->hardware);
    s->n++;
    return VL_OK;
}

static void test_peer_totals(void **state) {
    fixture *f = *state;
    float params[4] = {0};
    storage_version v0 = {.version = 0,
                          .created_at = 100,
                          .params = params,
                          .n = 4,
                          .val_loss = NAN,
                          .train_loss = NAN};
    storage_commit_opts o = {.keep_versions = 100, .keep_changes = 100, .keep_update_blobs = 100};
    OK(storage_version_commit(f->st, &v0, NULL, 0, &o, &e_));
    /* The first peer sends two updates (100 and 300 bytes, staleness 1
     * and 2 on arrival); one is merged into version 1, which sets its
     * staleness to 0. The second peer sends nothing. */
    uint8_t body[300] = {0};
    int64_t ids[2];
    for (int i = 0; i < 2; i++) {
        storage_task t = {.peer_id = peer_ids[0],
                          .base_version = 0,
                          .data_length = 1,
                          .issued_at = 100,
                          .deadline = 200,
                          .state = STORAGE_TASK_DONE};
        int64_t task;
        OK(storage_task_insert(f->st, &t, &task, &e_));
        storage_update u = {.task_id = task,
                            .peer_id = peer_ids[0],
                            .base_version = 0,
                            .num_samples = 1,
                            .local_steps = 4,
                            .loss = 1.0,
                            .nbytes = i ? 300 : 100,
                            .blob = body,
                            .received_at = 150,
                            .staleness = i + 1};
        snprintf(u.kind, sizeof u.kind, "dense");
        OK(storage_update_insert(f->st, &u, &ids[i], &e_));
    }
    storage_version v1 = {.version = 1,
                          .created_at = 160,
                          .params = params,
                          .n = 4,
                          .val_loss = NAN,
                          .train_loss = NAN,
                          .num_updates = 1};
    OK(storage_version_commit(f->st, &v1, ids, 1, &o, &e_));
    totals_seen s = {0};
    OK(storage_peer_totals_each(f->st, collect, &s, &e_));
    assert_int_equal(s.n, 2);
    assert_int_equal(s.t[0].id, peer_ids[0]);
    assert_int_equal(s.t[0].stored, 2);
    assert_int_equal(s.t[0].merged, 1);
    assert_int_equal(s.t[0].bytes, 400);
    assert_true(fabs(s.t[0].mean_staleness - 1.0) < 1e-12); /* (0 + 2) / 2 */
    assert_string_equal(s.hw[0], "{\"cpus\":8,\"gpu\":\"none\"}");
    assert_int_equal(s.t[1].id, peer_ids[1]);
    assert_int_equal(s.t[1].stored, 0);
    assert_int_equal(s.t[1].merged, 0);
    assert_int_equal(s.t[1].bytes, 0);
    assert_true(isnan(s.t[1].mean_staleness));
    /* A callback that stops the walk has its code returned. */
    s.n = 4;
    vl_error e = {0};
    assert_int_equal(storage_peer_totals_each(f->st, collect, &s, &e), VL_ERR);
}

typedef struct noop_job {
    coord_job job;
    int done;
} noop_job;

static int noop_run(storage *db, coord_job *job, vl_error *err) {
    (void)db;
    (void)job;
    (void)err;
    return VL_OK;
}

static void noop_done(coord_job *job, int rc, const vl_error *err) {
    (void)err;
    ((noop_job *)job)->done = rc == VL_OK ? 1 : -1;
}

static void test_writer_histograms(void **state) {
    fixture *f = *state;
    coord_writer *w = NULL;
    OK(coord_writer_start_sync(f->path, &w, &e_));
    /* Batches of 1, 3 and 40 jobs: buckets le 1, le 4 and le 64. */
    const size_t sizes[3] = {1, 3, 40};
    noop_job jobs[40];
    for (int b = 0; b < 3; b++) {
        memset(jobs, 0, sizeof jobs);
        for (size_t i = 0; i < sizes[b]; i++) {
            jobs[i].job.run = noop_run;
            jobs[i].job.done = noop_done;
            coord_writer_submit(w, &jobs[i].job);
        }
        assert_int_equal(coord_writer_run_once(w), sizes[b]);
        for (size_t i = 0; i < sizes[b]; i++) assert_int_equal(jobs[i].done, 1);
    }
    coord_writer_stats ws;
    coord_writer_stats_get(w, &ws);
    assert_int_equal(ws.commits, 3);
    assert_int_equal(ws.jobs, 44);
    uint64_t batches = 0, commits = 0;
    for (size_t i = 0; i <= COORD_WRITER_BATCH_BUCKETS; i++) batches += ws.batch_hist[i];
    for (size_t i = 0; i <= COORD_WRITER_COMMIT_BUCKETS; i++) commits += ws.commit_hist[i];
    assert_int_equal(batches, 3);
    assert_int_equal(commits, 3);
    assert_int_equal(ws.batch_hist[0], 1); /* le 1 */
    assert_int_equal(ws.batch_hist[2], 1); /* le 4 */
    assert_int_equal(ws.batch_hist[6], 1); /* le 64 */
    assert_true(coord_writer_batch_le[6] == 64);
    assert_true(ws.commit_seconds > 0 && ws.commit_seconds < 60);
    coord_writer_stop(w);
}

static void test_page_is_built_in(void **state) {
    (void)state;
    /* The page the listener serves is the one in the source tree, whole. */
    assert_true(coord_dashboard_html_len > 1000);
    assert_int_equal(coord_dashboard_html[coord_dashboard_html_len], 0);
    const char *page = (const char *)coord_dashboard_html;
    assert_int_equal(strncmp(page, "<!doctype html>", 15), 0);
    assert_non_null(strstr(page, "dashboard.json"));
    assert_non_null(strstr(page, "</html>"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_table),
        cmocka_unit_test(test_minutes_and_recent),
        cmocka_unit_test_setup_teardown(test_peer_totals, db_setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_histograms, db_setup, teardown),
        cmocka_unit_test(test_page_is_built_in),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
