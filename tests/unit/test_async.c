/* Asynchronous merging and churn on the coordinator's side: the staleness
 * functions against their formulas, the async configuration and its
 * normalised form, the storage queries behind stale merges and lease
 * reissue (unmerged updates of any base, expired leases taken over once,
 * per-peer activity, histograms, blobs never pruned before their merge,
 * the oldest-first buffer, staleness counted at
 * the merge), the async outer defaults and refusals,
 * and the writer's group commit: one transaction for a whole queue, a
 * failing job undone alone, done callbacks in submission order and only
 * after the commit, on the loop's thread. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "coordinator/run/aggregator.h"
#include "coordinator/run/factors.h"
#include "coordinator/run/round.h"
#include "coordinator/config/config.h"
#include "coordinator/coord.h"
#include "coordinator/base/sched_rules.h"
#include "coordinator/run/writer.h"
#include "storage/storage.h"
#include "test_util.h"
#include "coordinator/ops/status.h"

/* ---- staleness and configuration ---------------------------------------- */

static void test_staleness_weights(void **state) {
    (void)state;
    coord_staleness poly = {.fn = COORD_STALE_POLYNOMIAL, .a = 0.5, .b = 0, .max = 16};
    for (int64_t tau = 0; tau <= 16; tau++)
        assert_float_equal(coord_staleness_weight(&poly, tau), 1.0 / sqrt(1.0 + (double)tau),
                           1e-12);
    coord_staleness hinge = {.fn = COORD_STALE_HINGE, .a = 0.5, .b = 4, .max = 16};
    for (int64_t tau = 0; tau <= 4; tau++)
        assert_float_equal(coord_staleness_weight(&hinge, tau), 1.0, 0);
    assert_float_equal(coord_staleness_weight(&hinge, 6), 0.5, 1e-12);
    assert_float_equal(coord_staleness_weight(&hinge, 14), 1.0 / 6.0, 1e-12);
    coord_staleness flat = {.fn = COORD_STALE_CONSTANT, .a = 3, .b = 0, .max = 16};
    assert_float_equal(coord_staleness_weight(&flat, 9), 1.0, 0);
    /* Weights never grow with staleness. */
    for (int64_t tau = 1; tau < 40; tau++) {
        assert_true(coord_staleness_weight(&poly, tau) < coord_staleness_weight(&poly, tau - 1));
        assert_true(coord_staleness_weight(&hinge, tau) <= coord_staleness_weight(&hinge, tau - 1));
    }
}

static int parse(const char *json, coord_config *cfg, vl_error *e) {
    memset(e, 0, sizeof *e);
    return coord_config_parse(json, strlen(json), cfg, e);
}

static void test_config_async(void **state) {
    (void)state;
    coord_config cfg, again;
    vl_error e;
    /* Defaults: sync, FedBuff's polynomial a = 0.5 with tau_max 16, fixed
     * H (h_min = steps), blobs kept as long as versions, no deadline. */
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\"}", &cfg, &e), VL_OK);
    assert_false(coord_config_is_async(&cfg));
    assert_int_equal(cfg.staleness.fn, COORD_STALE_POLYNOMIAL);
    assert_true(cfg.staleness.a == 0.5);
    assert_int_equal(cfg.staleness.max, 16);
    assert_int_equal(cfg.selsync_h_min, cfg.train.steps);
    assert_true(cfg.selsync_delta == 0);
    assert_int_equal(cfg.keep_update_blobs, cfg.keep_versions);
    assert_int_equal(cfg.round_deadline_s, 0);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\","
                           " \"updates_per_version\": 3, \"train\": {\"steps\": 40},"
                           " \"staleness\": {\"function\": \"hinge\", \"a\": 2, \"b\": 3,"
                           " \"max\": 8}, \"selsync\": {\"delta\": 0.25, \"h_min\": 5},"
                           " \"keep_update_blobs\": 7}",
                           &cfg, &e),
                     VL_OK);
    assert_true(coord_config_is_async(&cfg));
    assert_int_equal(cfg.staleness.fn, COORD_STALE_HINGE);
    assert_true(cfg.staleness.a == 2 && cfg.staleness.b == 3 && cfg.staleness.max == 8);
    assert_true(cfg.selsync_delta == 0.25);
    assert_int_equal(cfg.selsync_h_min, 5);
    assert_int_equal(cfg.keep_update_blobs, 7);
    char *json = coord_config_to_json(&cfg, 1);
    assert_non_null(json);
    assert_non_null(strstr(json, "\"function\":\"hinge\""));
    assert_int_equal(parse(json, &again, &e), VL_OK);
    assert_memory_equal(&cfg, &again, sizeof cfg);
    free(json);
    /* A sync deadline is kept too. */
    assert_int_equal(
        parse("{\"name\": \"d\", \"corpus\": \"c\", \"round_deadline_s\": 30}", &cfg, &e), VL_OK);
    assert_int_equal(cfg.round_deadline_s, 30);
    json = coord_config_to_json(&cfg, 1);
    assert_int_equal(parse(json, &again, &e), VL_OK);
    assert_memory_equal(&cfg, &again, sizeof cfg);
    free(json);
}

/* Parses text, checks that its stored form parses to the same, and
 * returns what parse returned. */
static int parse_round_trip(const char *text, coord_config *cfg, vl_error *e) {
    int rc = parse(text, cfg, e);
    if (rc != VL_OK) return rc;
    coord_config again;
    char *json = coord_config_to_json(cfg, 1);
    assert_non_null(json);
    assert_int_equal(parse(json, &again, e), VL_OK);
    assert_memory_equal(cfg, &again, sizeof *cfg);
    free(json);
    return VL_OK;
}

/* Async runs get an outer step that converges, and the combination that
 * diverged is refused with a line that names it. */
static void test_config_async_outer(void **state) {
    (void)state;
    coord_config cfg;
    vl_error e;
    assert_int_equal(parse_round_trip("{\"name\": \"d\", \"corpus\": \"c\"}", &cfg, &e), VL_OK);
    assert_int_equal(cfg.outer_delay, 1);
    assert_false(cfg.train.dynamic_steps);
    assert_true(cfg.lease_wait == 0);
    /* By default an async run's peers wait for their own updates'
     * version, so the updates are fresh and take the synchronous step. */
    assert_int_equal(
        parse_round_trip("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\"}", &cfg, &e),
        VL_OK);
    assert_true(cfg.lease_wait == COORD_ASYNC_LEASE_WAIT);
    assert_true(cfg.outer_lr == COORD_ASYNC_WAIT_OUTER_LR);
    assert_true(cfg.outer_momentum == COORD_ASYNC_WAIT_OUTER_MOMENTUM);
    assert_int_equal(cfg.outer_delay, 1);
    assert_true(cfg.train.dynamic_steps);
    assert_int_equal(parse_round_trip("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\","
                                      " \"lease_wait\": 2.5, \"outer\": {\"lr\": 0.5,"
                                      " \"momentum\": 0.8}}",
                                      &cfg, &e),
                     VL_OK);
    assert_true(cfg.lease_wait == 2.5);
    assert_int_equal(cfg.outer_delay, 1);
    /* A run stored before lease_wait goes on without it; one stored
     * since keeps what it was made with. */
    assert_int_equal(coord_config_parse_stored("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": "
                                               "\"async\", \"outer\": {\"lr\": 0.5, "
                                               "\"momentum\": 0.8, \"delay\": 2}}",
                                               &cfg, &e),
                     VL_OK);
    assert_true(cfg.lease_wait == 0 && cfg.val_check_tokens == 0);
    assert_int_equal(cfg.outer_delay, 2);
    assert_int_equal(coord_config_parse_stored("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": "
                                               "\"async\", \"lease_wait\": 1}",
                                               &cfg, &e),
                     VL_OK);
    assert_true(cfg.lease_wait == 1);
    assert_int_equal(coord_config_parse_stored(
                         "{\"name\": \"d\", \"corpus\": \"c\", \"lease_wait\": 1}", &cfg, &e),
                     VL_EINVAL);
    /* Without the wait: delayed Nesterov. */
    assert_int_equal(parse_round_trip("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\","
                                      " \"lease_wait\": 0}",
                                      &cfg, &e),
                     VL_OK);
    assert_true(cfg.outer_lr == COORD_ASYNC_OUTER_LR);
    assert_true(cfg.outer_momentum == COORD_ASYNC_OUTER_MOMENTUM);
    assert_int_equal(cfg.outer_delay, COORD_ASYNC_OUTER_DELAY);
    /* Momentum without a delay gets the async delay; FedAvg needs none. */
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\","
                           " \"lease_wait\": 0, \"outer\": {\"lr\": 0.5, \"momentum\": 0.8}}",
                           &cfg, &e),
                     VL_OK);
    assert_int_equal(cfg.outer_delay, COORD_ASYNC_OUTER_DELAY);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\","
                           " \"outer\": {\"lr\": 1, \"momentum\": 0}}",
                           &cfg, &e),
                     VL_OK);
    assert_int_equal(cfg.outer_delay, 1);
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\","
                           " \"train\": {\"dynamic_steps\": false}}",
                           &cfg, &e),
                     VL_OK);
    assert_false(cfg.train.dynamic_steps);
    /* Refused: momentum every version of an async run that does not
     * wait, a lease_wait in a sync run or out of range, a delay in a
     * sketch run, dynamic steps in a sync run, a delay of 0. */
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\","
                           " \"lease_wait\": 0,"
                           " \"outer\": {\"lr\": 0.7, \"momentum\": 0.9, \"delay\": 1}}",
                           &cfg, &e),
                     VL_EINVAL);
    assert_non_null(strstr(e.msg, "diverges"));
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"lease_wait\": 1}", &cfg, &e),
                     VL_EINVAL);
    assert_non_null(strstr(e.msg, "lease_wait is for async runs"));
    const char *bad_waits[] = {"-1", "101", "\"1\"", "true"};
    for (size_t i = 0; i < sizeof bad_waits / sizeof *bad_waits; i++) {
        char text[160];
        snprintf(text, sizeof text,
                 "{\"name\": \"d\", \"corpus\": \"c\", \"mode\": \"async\", \"lease_wait\": %s}",
                 bad_waits[i]);
        assert_int_equal(parse(text, &cfg, &e), VL_EINVAL);
        assert_non_null(strstr(e.msg, "lease_wait must be"));
    }
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\", \"outer\": {\"delay\": 3},"
                           " \"compression\": {\"kind\": \"sketch\", \"ratio\": 10}}",
                           &cfg, &e),
                     VL_EINVAL);
    assert_non_null(strstr(e.msg, "outer.delay"));
    assert_int_equal(parse("{\"name\": \"d\", \"corpus\": \"c\","
                           " \"train\": {\"dynamic_steps\": true}}",
                           &cfg, &e),
                     VL_EINVAL);
    assert_non_null(strstr(e.msg, "dynamic_steps"));
    assert_int_equal(
        parse("{\"name\": \"d\", \"corpus\": \"c\", \"outer\": {\"delay\": 0}}", &cfg, &e),
        VL_EINVAL);
    /* The deployable async example parses to an async run with the
     * defaults its kind measured best with. */
    vl_buf text;
    vl_buf_init(&text, 1 << 20);
    OK(vl_buf_read_file(&text, VOLLEY_SOURCE_DIR "/deploy/coordinator.async.example.json", &e_));
    OK(coord_config_parse((const char *)text.data, text.len, &cfg, &e_));
    vl_buf_free(&text);
    assert_true(coord_config_is_async(&cfg));
    /* Its top-k updates get the sparse kinds' outer step, no momentum:
     * measured against 0.7 / 0.9 every 2 versions, which fell 27-43 %
     * behind the synchronous dense loss where this fell 5-11 %. */
    assert_true(cfg.outer_lr == COORD_SPARSE_OUTER_LR && cfg.outer_momentum == 0);
    assert_int_equal(cfg.outer_delay, 1);
    assert_true(cfg.train.dynamic_steps);
    /* Volunteers are strangers: a robust rule and the derived bound. */
    assert_int_equal(cfg.robust.rule, COORD_RULE_TRIMMED_MEAN);
    assert_true(cfg.robust.auto_norm && cfg.robust.refuse_excess);
    /* A sync run may use the delay too. */
    assert_int_equal(
        parse("{\"name\": \"d\", \"corpus\": \"c\", \"outer\": {\"delay\": 2}}", &cfg, &e), VL_OK);
    assert_int_equal(cfg.outer_delay, 2);
}

/* ---- storage behind stale merges and reissue --------------------------- */

typedef struct db_fixture {
    char dir[64];
    char path[128];
    storage *st;
    int64_t peer[2];
} db_fixture;

static void insert_version(storage *st, int64_t v, const int64_t *ids, size_t n,
                           int64_t keep_blobs) {
    float params[4] = {0};
    storage_version ver = {.version = v,
                           .created_at = 100 + v,
                           .params = params,
                           .n = 4,
                           .val_loss = NAN,
                           .train_loss = NAN,
                           .num_updates = (int64_t)n};
    storage_commit_opts o = {
        .keep_versions = 100, .keep_changes = 100, .keep_update_blobs = keep_blobs};
    OK(storage_version_commit(st, &ver, ids, n, &o, &e_));
}

static int db_setup(void **state) {
    db_fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/volley-test-async-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/run.db", f->dir);
    vl_error e = {0};
    if (storage_open(f->path, 1, &f->st, &e) != VL_OK) return -1;
    storage_run r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "demo");
    r.config = "{}";
    r.corpus_path = "/c";
    snprintf(r.corpus_hash, sizeof r.corpus_hash, "%064d", 1);
    if (storage_run_insert(f->st, &r, &e) != VL_OK) return -1;
    for (int i = 0; i < 2; i++) {
        uint8_t pk[32] = {(uint8_t)(i + 1)};
        char name[8];
        snprintf(name, sizeof name, "p%d", i);
        if (storage_peer_insert(f->st, pk, name, "{}", 0, 100 + i, &f->peer[i], &e) != VL_OK)
            return -1;
    }
    *state = f;
    return 0;
}

static int db_teardown(void **state) {
    db_fixture *f = *state;
    storage_close(f->st);
    test_remove_db(f->path);
    rmdir(f->dir);
    free(f);
    return 0;
}

static void add_task(storage *st, int64_t id, int64_t peer, int64_t base, int64_t deadline) {
    storage_task t = {.id = id,
                      .peer_id = peer,
                      .base_version = base,
                      .data_offset = 10 * id,
                      .data_length = 5,
                      .seed = 1000 + id,
                      .issued_at = 100,
                      .deadline = deadline,
                      .state = STORAGE_TASK_LEASED};
    OK(storage_task_insert(st, &t, NULL, &e_));
}

static int64_t add_update(storage *st, int64_t task, int64_t peer, int64_t base, int64_t staleness,
                          int64_t steps) {
    static const uint8_t blob[3] = {1, 2, 3};
    storage_update u = {.task_id = task,
                        .peer_id = peer,
                        .base_version = base,
                        .num_samples = 10,
                        .local_steps = steps,
                        .loss = 1.0,
                        .nbytes = 3,
                        .blob = blob,
                        .received_at = 200,
                        .staleness = staleness};
    snprintf(u.kind, sizeof u.kind, "dense");
    int64_t id = 0;
    OK(storage_update_insert(st, &u, &id, &e_));
    OK(storage_task_set_state(st, task, STORAGE_TASK_DONE, &e_));
    return id;
}

typedef struct seen {
    int64_t ids[16];
    int64_t staleness[16];
    int blobs;
    int n;
} seen;

static int see(void *ctx, const storage_update *u) {
    seen *s = ctx;
    s->ids[s->n] = u->id;
    s->staleness[s->n++] = u->staleness;
    s->blobs += u->blob != NULL;
    return 0;
}

static int count_hist(void *ctx, int64_t value, int64_t count) {
    int64_t *h = ctx;
    if (value >= 0 && value < 8) h[value] = count;
    return 0;
}

static int see_peer(void *ctx, const storage_peer_activity *a) {
    storage_peer_activity *out = ctx;
    out[a->id - 1] = *a;
    return 0;
}

static void test_storage_unmerged_and_reissue(void **state) {
    db_fixture *f = *state;
    storage *st = f->st;
    insert_version(st, 0, NULL, 0, 1);
    add_task(st, 1, f->peer[0], 0, 500);
    add_task(st, 2, f->peer[1], 0, 150);
    add_task(st, 3, f->peer[1], 0, 160);
    int64_t u1 = add_update(st, 1, f->peer[0], 0, 0, 20);
    insert_version(st, 1, &u1, 1, 1);
    /* A stale update based on 0 arrives at version 1; unmerged walks see it
     * whatever its base, the per-base walk of version 1 does not. */
    add_task(st, 4, f->peer[0], 1, 600);
    int64_t u4 = add_update(st, 4, f->peer[0], 1, 0, 7);
    int64_t u3 = add_update(st, 3, f->peer[1], 0, 1, 20);
    seen s = {0};
    OK(storage_update_each_unmerged(st, see, &s, &e_));
    assert_int_equal(s.n, 2);
    assert_true(s.ids[0] == u4 && s.ids[1] == u3);
    assert_int_equal(s.staleness[1], 1);
    int64_t n = 0;
    OK(storage_update_count_unmerged(st, &n, &e_));
    assert_int_equal(n, 2);
    memset(&s, 0, sizeof s);
    OK(storage_update_each_pending(st, 1, see, &s, &e_));
    assert_int_equal(s.n, 1);

    /* Task 2's lease ran out with no update: its data goes to exactly one
     * later task; done task 3 and leased task 4 are never taken. */
    OK(storage_task_expire(st, 300, &n, &e_));
    assert_int_equal(n, 1);
    storage_task t;
    OK(storage_task_take_expired(st, &t, &e_));
    assert_int_equal(t.id, 2);
    assert_true(t.data_offset == 20 && t.seed == 1002);
    vl_error e = {0};
    assert_int_equal(storage_task_take_expired(st, &t, &e), VL_ENOTFOUND);
    storage_task nt = {.id = 5,
                       .peer_id = f->peer[0],
                       .base_version = 1,
                       .data_offset = 20,
                       .data_length = 5,
                       .seed = 1002,
                       .issued_at = 300,
                       .deadline = 700,
                       .state = STORAGE_TASK_LEASED,
                       .reissue_of = 2};
    OK(storage_task_insert(st, &nt, NULL, &e_));
    OK(storage_task_get(st, 5, &t, &e_));
    assert_int_equal(t.reissue_of, 2);
    OK(storage_task_get(st, 1, &t, &e_));
    assert_int_equal(t.reissue_of, 0);

    /* Leases of any base: peer 0 holds task 5 (base 1) and task 4 is done. */
    OK(storage_task_find_any_lease(st, f->peer[0], 300, 0, &t, &e_));
    assert_int_equal(t.id, 5);
    /* Past the lease whose upload is on its way there is none. */
    assert_int_equal(storage_task_find_any_lease(st, f->peer[0], 300, 5, &t, &e), VL_ENOTFOUND);
    assert_int_equal(storage_task_find_any_lease(st, f->peer[1], 300, 0, &t, &e), VL_ENOTFOUND);
    OK(storage_task_count_leased(st, 300, &n, &e_));
    assert_int_equal(n, 1);
    OK(storage_task_next_deadline_any(st, 300, &n, &e_));
    assert_int_equal(n, 700);

    /* Histograms and activity. */
    int64_t steps[8] = {0}, stale[8] = {0};
    OK(storage_update_histogram(st, STORAGE_HIST_LOCAL_STEPS, count_hist, steps, &e_));
    assert_true(steps[7] == 1);
    OK(storage_update_histogram(st, STORAGE_HIST_STALENESS, count_hist, stale, &e_));
    assert_true(stale[0] == 2 && stale[1] == 1);
    storage_peer_activity act[2];
    memset(act, 0, sizeof act);
    OK(storage_peer_each(st, 300, see_peer, act, &e_));
    assert_true(act[0].leases == 1 && act[0].updates == 2);
    assert_true(act[1].leases == 0 && act[1].updates == 1);
    assert_string_equal(act[1].name, "p1");

    /* Blobs: keep_update_blobs 1 prunes what was merged into version 1 once
     * version 2 exists, never the unmerged one. */
    insert_version(st, 2, &u4, 1, 1);
    memset(&s, 0, sizeof s);
    OK(storage_update_each_unmerged(st, see, &s, &e_));
    assert_true(s.n == 1 && s.blobs == 1);
    insert_version(st, 3, NULL, 0, 1);
    memset(&s, 0, sizeof s);
    OK(storage_update_each_unmerged(st, see, &s, &e_));
    assert_true(s.n == 1 && s.blobs == 1);
    int64_t merged = 0, base = 0, mv = 0;
    OK(storage_update_find(st, 1, &merged, &base, &mv, &e_));
    assert_int_equal(mv, 1);
}

/* An async version takes the oldest updates_per_version updates, and
 * staleness is stored as the merge saw it. */
static void test_storage_buffer_order(void **state) {
    db_fixture *f = *state;
    storage *st = f->st;
    insert_version(st, 0, NULL, 0, 100);
    for (int64_t t = 1; t <= 3; t++) add_task(st, t, f->peer[t == 2], 0, 500);
    int64_t u1 = add_update(st, 1, f->peer[0], 0, 0, 20);
    int64_t u2 = add_update(st, 2, f->peer[1], 0, 0, 20);
    int64_t u3 = add_update(st, 3, f->peer[0], 0, 0, 20);
    seen s = {0};
    OK(storage_update_each_oldest(st, 2, see, &s, &e_));
    assert_int_equal(s.n, 2);
    assert_true(s.ids[0] == u1 && s.ids[1] == u2);
    memset(&s, 0, sizeof s);
    OK(storage_update_each_oldest(st, 0, see, &s, &e_));
    assert_int_equal(s.n, 3);
    int64_t first[2] = {u1, u2};
    insert_version(st, 1, first, 2, 100);
    /* u3 arrived fresh (staleness 0) and is merged into version 3: two
     * versions were made since its base, and that is what is stored. */
    insert_version(st, 2, NULL, 0, 100);
    insert_version(st, 3, &u3, 1, 100);
    int64_t stale[8] = {0};
    OK(storage_update_histogram(st, STORAGE_HIST_STALENESS, count_hist, stale, &e_));
    assert_true(stale[0] == 2 && stale[2] == 1);
}

static void test_peer_states(void **state) {
    (void)state;
    storage_peer_activity a = {.id = 1, .last_seen = 1000};
    assert_string_equal(coord_peer_state(&a, 1100, 120), "active");
    assert_string_equal(coord_peer_state(&a, 1200, 120), "idle");
    assert_string_equal(coord_peer_state(&a, 1000 + 3 * 120 + 1, 120), "gone");
    a.leases = 1;
    assert_string_equal(coord_peer_state(&a, 5000, 120), "active");
    a.revoked = 1;
    assert_string_equal(coord_peer_state(&a, 1000, 120), "revoked");
}

/* ---- the writer ------------------------------------------------------------ */

typedef struct token_job {
    coord_job job;
    int index;
    char hash[65];
    int64_t id;
    int done_rc;
    int *order;
    int *n_done;
    pthread_t done_thread;
} token_job;

static int token_run(storage *db, coord_job *job, vl_error *err) {
    token_job *j = (token_job *)job;
    return storage_token_insert(db, j->hash, 1, 9999999999, 100, &j->id, err);
}

static void token_done(coord_job *job, int rc, const vl_error *err) {
    (void)err;
    token_job *j = (token_job *)job;
    j->done_rc = rc;
    j->done_thread = pthread_self();
    j->order[(*j->n_done)++] = j->index;
}

static token_job *make_jobs(int n, int *order, int *n_done) {
    token_job *jobs = calloc((size_t)n, sizeof *jobs);
    assert_non_null(jobs);
    for (int i = 0; i < n; i++) {
        jobs[i].job.run = token_run;
        jobs[i].job.done = token_done;
        jobs[i].index = i;
        jobs[i].done_rc = 12345;
        jobs[i].order = order;
        jobs[i].n_done = n_done;
        /* Job 7 repeats job 3's hash: the UNIQUE constraint fails it. */
        snprintf(jobs[i].hash, sizeof jobs[i].hash, "%064d", i == 7 ? 3 : i);
    }
    return jobs;
}

static void test_writer_group_commit(void **state) {
    db_fixture *f = *state;
    coord_writer *w = NULL;
    OK(coord_writer_start_sync(f->path, &w, &e_));
    enum { N = 50 };
    int order[N], n_done = 0;
    token_job *jobs = make_jobs(N, order, &n_done);
    for (int i = 0; i < N; i++) coord_writer_submit(w, &jobs[i].job);
    assert_int_equal(coord_writer_pending(w), N);
    /* Nothing is done, nor visible to another connection, before the batch. */
    assert_int_equal(n_done, 0);
    int64_t id = 0;
    vl_error e = {0};
    assert_int_equal(storage_token_check(f->st, jobs[0].hash, 100, &id, &e), VL_ENOTFOUND);
    assert_int_equal(coord_writer_run_once(w), N);
    assert_int_equal(n_done, N);
    assert_int_equal(coord_writer_pending(w), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(order[i], i);
        assert_int_equal(jobs[i].done_rc, i == 7 ? VL_ECONFLICT : VL_OK);
    }
    /* Every other job's row is there; the failed one left nothing. */
    for (int i = 0; i < N; i++) {
        if (i == 7) continue;
        OK(storage_token_check(f->st, jobs[i].hash, 100, &id, &e_));
        assert_int_equal(id, jobs[i].id);
    }
    coord_writer_stats ws;
    coord_writer_stats_get(w, &ws);
    assert_int_equal(ws.commits, 1);
    assert_int_equal(ws.jobs, N);
    assert_int_equal(ws.failed, 1);
    assert_int_equal(ws.max_batch, N);
    assert_int_equal(coord_writer_run_once(w), 0);
    coord_writer_stop(w);
    free(jobs);
}

typedef struct loop_ctx {
    struct event_base *base;
    int *n_done;
    int want;
} loop_ctx;

static void poll_done(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    loop_ctx *c = arg;
    if (*c->n_done >= c->want) event_base_loopbreak(c->base);
}

/* Runs base's loop until *n_done reaches want (20 s at most), and checks
 * that it did. */
static void run_loop_until(struct event_base *base, int *n_done, int want) {
    loop_ctx c = {base, n_done, want};
    struct event *tick = event_new(base, -1, EV_PERSIST, poll_done, &c);
    assert_non_null(tick);
    struct timeval tv = {0, 2000};
    event_add(tick, &tv);
    struct timeval limit = {20, 0};
    event_base_loopexit(base, &limit);
    event_base_dispatch(base);
    event_free(tick);
    assert_int_equal(*n_done, want);
}

static void test_writer_thread(void **state) {
    db_fixture *f = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    coord_writer *w = NULL;
    OK(coord_writer_start(f->path, base, &w, &e_));
    enum { N = 300 };
    int order[N], n_done = 0;
    token_job *jobs = make_jobs(N, order, &n_done);
    for (int i = 0; i < N; i++) coord_writer_submit(w, &jobs[i].job);
    run_loop_until(base, &n_done, N);
    pthread_t me = pthread_self();
    for (int i = 0; i < N; i++) {
        assert_int_equal(order[i], i);
        assert_true(pthread_equal(jobs[i].done_thread, me));
        assert_int_equal(jobs[i].done_rc, i == 7 ? VL_ECONFLICT : VL_OK);
    }
    coord_writer_stats ws;
    coord_writer_stats_get(w, &ws);
    assert_int_equal(ws.jobs, N);
    assert_true(ws.commits >= 1 && ws.commits <= N);
    coord_writer_stop(w);
    event_base_free(base);
    free(jobs);
}

/* Jobs still queued at stop are run and answered, never dropped. */
static void test_writer_stop_finishes(void **state) {
    db_fixture *f = *state;
    struct event_base *base = event_base_new();
    coord_writer *w = NULL;
    OK(coord_writer_start(f->path, base, &w, &e_));
    enum { N = 20 };
    int order[N], n_done = 0;
    token_job *jobs = make_jobs(N, order, &n_done);
    for (int i = 0; i < N; i++) coord_writer_submit(w, &jobs[i].job);
    coord_writer_stop(w);
    assert_int_equal(n_done, N);
    int64_t id;
    OK(storage_token_check(f->st, jobs[N - 1].hash, 100, &id, &e_));
    event_base_free(base);
    free(jobs);
}

/* ---- the background thread ------------------------------------------------ */

typedef struct bg_job {
    coord_job job;
    int index;
    int *order, *n_done;
    int had_db; /* the job was given a connection (it must not be) */
    int nice;   /* the thread's nice value while the job ran */
    pthread_t run_thread, done_thread;
    coord_writer *w;     /* set: the done callback queues one more job */
    struct bg_job *then; /* that job */
} bg_job;

static int bg_run(storage *db, coord_job *job, vl_error *err) {
    (void)err;
    bg_job *j = (bg_job *)job;
    j->had_db = db != NULL;
    j->run_thread = pthread_self();
    errno = 0;
    j->nice = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    return VL_OK;
}

static void bg_done(coord_job *job, int rc, const vl_error *err) {
    (void)err;
    bg_job *j = (bg_job *)job;
    assert_int_equal(rc, VL_OK);
    j->done_thread = pthread_self();
    j->order[(*j->n_done)++] = j->index;
    if (j->w && j->then) coord_writer_background(j->w, &j->then->job);
}

/* Background jobs run in order on a thread of their own at nice 19, with
 * no database connection, and come back on the loop; those queued at stop,
 * and one queued by a done callback while stopping, run before stop
 * returns. */
static void test_writer_background(void **state) {
    db_fixture *f = *state;
    struct event_base *base = event_base_new();
    assert_non_null(base);
    coord_writer *w = NULL;
    OK(coord_writer_start(f->path, base, &w, &e_));
    enum { N = 6 };
    int order[N + 1], n_done = 0;
    bg_job jobs[N + 1];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i <= N; i++)
        jobs[i] = (bg_job){.job = {.run = bg_run, .done = bg_done},
                           .index = i,
                           .order = order,
                           .n_done = &n_done,
                           .nice = -100};
    for (int i = 0; i < 3; i++) coord_writer_background(w, &jobs[i].job);
    run_loop_until(base, &n_done, 3);
    pthread_t me = pthread_self();
    for (int i = 0; i < 3; i++) {
        assert_int_equal(order[i], i);
        assert_false(jobs[i].had_db);
        assert_false(pthread_equal(jobs[i].run_thread, me));
        assert_true(pthread_equal(jobs[i].done_thread, me));
        assert_int_equal(jobs[i].nice, 19);
    }
    /* Queued, then stopped at once: all of them run, and so does the one
     * the last done callback queues. */
    jobs[N - 1].w = w;
    jobs[N - 1].then = &jobs[N];
    for (int i = 3; i < N; i++) coord_writer_background(w, &jobs[i].job);
    coord_writer_stop(w);
    assert_int_equal(n_done, N + 1);
    for (int i = 3; i <= N; i++) assert_int_equal(order[i], i);
    event_base_free(base);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_staleness_weights),
        cmocka_unit_test(test_config_async),
        cmocka_unit_test(test_config_async_outer),
        cmocka_unit_test(test_peer_states),
        cmocka_unit_test_setup_teardown(test_storage_unmerged_and_reissue, db_setup, db_teardown),
        cmocka_unit_test_setup_teardown(test_storage_buffer_order, db_setup, db_teardown),
        cmocka_unit_test_setup_teardown(test_writer_group_commit, db_setup, db_teardown),
        cmocka_unit_test_setup_teardown(test_writer_thread, db_setup, db_teardown),
        cmocka_unit_test_setup_teardown(test_writer_stop_finishes, db_setup, db_teardown),
        cmocka_unit_test_setup_teardown(test_writer_background, db_setup, db_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
