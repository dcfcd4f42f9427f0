/* storage: updates and the versions they are merged into: pending updates,
 * version commits and pruning, the atomicity of a commit, an update merged
 * only once, rounds, refused versions, a validation loss set later, and
 * K-FAC factors committed with their version (runs, tokens, peers and
 * tasks are test_storage.c's). Each test works on a fresh database in a
 * temporary directory. */
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

#include <sqlite3.h>

#include "storage/internal.h"
#include "storage/storage.h"
#include "test_util.h"
#include "storage_fixtures.h"

struct collect {
    int n;
    int64_t ids[8];
    int64_t bytes;
};

static int collect_cb(void *ctx, const storage_update *u) {
    struct collect *c = ctx;
    if (c->n < 8) c->ids[c->n++] = u->id;
    c->bytes += u->blob ? u->nbytes : 0;
    assert_string_equal(u->kind, "dense");
    assert_int_equal(u->num_samples, 64);
    return 0;
}

static void test_updates_round_trip(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 4);
    int64_t p = add_peer(f->st, 3);
    int64_t t1 = add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE);
    int64_t t2 = add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE);
    int64_t u1 = add_update(f->st, t1, p, 0);
    int64_t u2 = add_update(f->st, t2, p, 0);
    static const uint8_t blob[] = {9};
    storage_update dup = {.task_id = t1,
                          .peer_id = p,
                          .kind = "dense",
                          .num_samples = 1,
                          .local_steps = 1,
                          .nbytes = 1,
                          .blob = blob};
    assert_int_equal(storage_update_insert(f->st, &dup, NULL, &e), VL_ECONFLICT);
    int exists = 0;
    assert_int_equal(storage_update_exists(f->st, t1, &exists, &e), VL_OK);
    assert_int_equal(exists, 1);
    assert_int_equal(storage_update_exists(f->st, 999, &exists, &e), VL_OK);
    assert_int_equal(exists, 0);
    struct collect c = {0};
    assert_int_equal(storage_update_each_pending(f->st, 0, collect_cb, &c, &e), VL_OK);
    assert_int_equal(c.n, 2);
    assert_int_equal(c.ids[0], u1);
    assert_int_equal(c.ids[1], u2);
    assert_int_equal(c.bytes, 10);
    int64_t total = 0;
    assert_int_equal(storage_update_count(f->st, &total, &e), VL_OK);
    assert_int_equal(total, 2);
}

static void test_version_commit_and_prune(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 2);
    int64_t p = add_peer(f->st, 4);
    int64_t ids[3];
    for (int v = 1; v <= 3; v++) {
        int64_t t = add_task(f->st, p, v - 1, 2000, STORAGE_TASK_DONE);
        ids[v - 1] = add_update(f->st, t, p, v - 1);
        commit_version(f->st, v, (float)v * 10, &ids[v - 1], 1, 2);
    }
    storage_run r;
    assert_int_equal(storage_run_get(f->st, &r, &e), VL_OK);
    assert_int_equal(r.current_version, 3);
    storage_run_free(&r);
    storage_version v;
    assert_int_equal(storage_version_get(f->st, 3, 1, &v, &e), VL_OK);
    assert_int_equal(v.n, 4);
    assert_true(v.params[1] == 31.0f);
    assert_true(v.momentum[0] == -30.0f);
    assert_true(v.val_loss == 2.0);
    assert_true(v.train_loss == 4.0);
    assert_int_equal(v.num_updates, 1);
    storage_version_free(&v);
    /* keep_versions = 2: versions 2 and 3 keep params, 0 and 1 are pruned,
     * and so is the blob of the update merged into version 1. */
    assert_int_equal(storage_version_get(f->st, 2, 1, &v, &e), VL_OK);
    assert_non_null(v.params);
    storage_version_free(&v);
    assert_int_equal(storage_version_get(f->st, 1, 1, &v, &e), VL_OK);
    assert_null(v.params);
    assert_null(v.momentum);
    assert_true(v.val_loss == 4.0);
    storage_version_free(&v);
    assert_int_equal(storage_version_get(f->st, 0, 1, &v, &e), VL_OK);
    assert_null(v.params);
    assert_true(isnan(v.train_loss));
    storage_version_free(&v);
    assert_int_equal(storage_version_get(f->st, 9, 0, &v, &e), VL_ENOTFOUND);
    /* Version numbers must follow on. */
    float x[4] = {0};
    storage_version skip = {.version = 5, .params = x, .n = 4};
    assert_int_equal(storage_version_commit(f->st, &skip, NULL, 0, COMMIT_OPTS(2, 0, 0), &e),
                     VL_ECONFLICT);
}

typedef struct values_seen {
    int64_t ids[4];
    float first[4];
    int n;
} values_seen;

static int values_cb(void *ctx, int64_t update_id, const uint8_t *vals, size_t n) {
    values_seen *v = ctx;
    assert_int_equal(n, 3);
    assert_true(v->n < 4);
    v->ids[v->n] = update_id;
    memcpy(&v->first[v->n], vals, 4);
    v->n++;
    return 0;
}

/* A round's candidates and values round-trip; a second round for the same
 * version and a second set of values for the same update are conflicts;
 * both go with the update bodies when their version is pruned. */
static void test_rounds(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 1);
    int64_t p = add_peer(f->st, 5);
    int64_t t1 = add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE);
    int64_t t2 = add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE);
    int64_t u1 = add_update(f->st, t1, p, 0);
    int64_t u2 = add_update(f->st, t2, p, 0);
    int64_t id = 0, base = 0, merged = 0;
    assert_int_equal(storage_update_find(f->st, t2, &id, &base, &merged, &e), VL_OK);
    assert_int_equal(id, u2);
    assert_int_equal(base, 0);
    assert_int_equal(merged, -1);
    assert_int_equal(storage_update_find(f->st, 999, &id, &base, &merged, &e), VL_ENOTFOUND);

    uint32_t cand[3] = {2, 7, 11};
    storage_round r = {.version = 0, .n = 3, .candidates = cand, .opened_at = 10, .deadline = 40};
    storage_round got;
    assert_int_equal(storage_round_get(f->st, 0, &got, &e), VL_ENOTFOUND);
    assert_int_equal(storage_round_insert(f->st, &r, &e), VL_OK);
    assert_int_equal(storage_round_insert(f->st, &r, &e), VL_ECONFLICT);
    storage_round empty = {.version = 1, .n = 0, .candidates = cand};
    assert_int_equal(storage_round_insert(f->st, &empty, &e), VL_EINVAL);
    assert_int_equal(storage_round_get(f->st, 0, &got, &e), VL_OK);
    assert_int_equal(got.n, 3);
    assert_int_equal(got.candidates[2], 11);
    assert_int_equal(got.deadline, 40);
    storage_round_free(&got);

    float v1[3] = {1.5f, -2, 3}, v2[3] = {4, 5, 6};
    assert_int_equal(storage_round_values_insert(f->st, u2, 0, v2, 3, 20, &e), VL_OK);
    assert_int_equal(storage_round_values_insert(f->st, u2, 0, v1, 3, 21, &e), VL_ECONFLICT);
    assert_int_equal(storage_round_values_insert(f->st, u1, 0, v1, 3, 22, &e), VL_OK);
    int64_t count = 0;
    assert_int_equal(storage_round_values_count(f->st, 0, &count, &e), VL_OK);
    assert_int_equal(count, 2);
    values_seen seen = {{0}, {0}, 0};
    assert_int_equal(storage_round_values_each(f->st, 0, values_cb, &seen, &e), VL_OK);
    assert_int_equal(seen.n, 2);
    assert_int_equal(seen.ids[0], u1);
    assert_true(seen.first[0] == 1.5f && seen.first[1] == 4.0f);

    /* keep_versions 1: version 2 prunes version 1 and what was merged
     * into it, so the round of version 0 goes too. */
    int64_t ids[2] = {u1, u2};
    commit_version(f->st, 1, 1.0f, ids, 2, 1);
    assert_int_equal(storage_round_get(f->st, 0, &got, &e), VL_OK);
    storage_round_free(&got);
    commit_version(f->st, 2, 2.0f, NULL, 0, 1);
    assert_int_equal(storage_round_get(f->st, 0, &got, &e), VL_ENOTFOUND);
    assert_int_equal(storage_round_values_count(f->st, 0, &count, &e), VL_OK);
    assert_int_equal(count, 0);
}

static int count_cb(void *ctx, const storage_version *v) {
    (void)v;
    (*(int *)ctx)++;
    return 0;
}

/* A failure after the version row is written (here: an update id that
 * does not exist) must leave nothing of the commit visible: no version
 * row, the run's version unchanged, no update marked, no lease expired. */
static void test_version_commit_is_atomic(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 4);
    int64_t p = add_peer(f->st, 5);
    int64_t ta = add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE);
    int64_t tb = add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE);
    int64_t tl = add_task(f->st, p, 0, 3000, STORAGE_TASK_LEASED);
    int64_t ua = add_update(f->st, ta, p, 0);
    int64_t ub = add_update(f->st, tb, p, 0);
    int64_t bad_ids[3] = {ua, ub, ub + 1000};
    float params[4] = {1, 2, 3, 4};
    storage_version v1 = {.version = 1,
                          .created_at = 3000,
                          .params = params,
                          .n = 4,
                          .val_loss = 1.0,
                          .train_loss = 2.0,
                          .num_updates = 3};
    assert_int_equal(storage_version_commit(f->st, &v1, bad_ids, 3, COMMIT_OPTS(4, 0, 0), &e),
                     VL_ECONFLICT);
    assert_false(storage_in_transaction(f->st));
    storage_version got;
    assert_int_equal(storage_version_get(f->st, 1, 0, &got, &e), VL_ENOTFOUND);
    storage_run r;
    assert_int_equal(storage_run_get(f->st, &r, &e), VL_OK);
    assert_int_equal(r.current_version, 0);
    storage_run_free(&r);
    struct collect c = {0};
    assert_int_equal(storage_update_each_pending(f->st, 0, collect_cb, &c, &e), VL_OK);
    assert_int_equal(c.n, 2);
    storage_task t;
    assert_int_equal(storage_task_get(f->st, tl, &t, &e), VL_OK);
    assert_int_equal(t.state, STORAGE_TASK_LEASED);

    /* The same failure inside a caller's transaction rolls back only the
     * commit's savepoint; the caller's earlier write survives. */
    assert_int_equal(storage_begin(f->st, &e), VL_OK);
    assert_int_equal(storage_peer_touch(f->st, p, 7777, &e), VL_OK);
    assert_int_equal(storage_version_commit(f->st, &v1, bad_ids, 3, COMMIT_OPTS(4, 0, 0), &e),
                     VL_ECONFLICT);
    assert_true(storage_in_transaction(f->st));
    assert_int_equal(storage_commit(f->st, &e), VL_OK);
    assert_int_equal(storage_version_get(f->st, 1, 0, &got, &e), VL_ENOTFOUND);
    storage_peer pe;
    assert_int_equal(storage_peer_get(f->st, p, &pe, &e), VL_OK);
    assert_int_equal(pe.last_seen, 7777);
    storage_peer_free(&pe);

    /* A correct commit then does everything at once. */
    int64_t good[2] = {ua, ub};
    v1.num_updates = 2;
    assert_int_equal(storage_version_commit(f->st, &v1, good, 2, COMMIT_OPTS(4, 0, 1), &e), VL_OK);
    assert_int_equal(storage_run_get(f->st, &r, &e), VL_OK);
    assert_int_equal(r.current_version, 1);
    assert_int_equal(r.status, STORAGE_RUN_FINISHED);
    storage_run_free(&r);
    assert_int_equal(storage_task_get(f->st, tl, &t, &e), VL_OK);
    assert_int_equal(t.state, STORAGE_TASK_EXPIRED);
    memset(&c, 0, sizeof c);
    assert_int_equal(storage_update_each_pending(f->st, 0, collect_cb, &c, &e), VL_OK);
    assert_int_equal(c.n, 0);
    int nv = 0;
    assert_int_equal(storage_version_each(f->st, count_cb, &nv, &e), VL_OK);
    assert_int_equal(nv, 2);
}

/* Every row of the tables a version commit writes, in rowid order, as one
 * byte string: two equal snapshots mean the commit changed nothing. */
static void snapshot(storage *st, vl_buf *out) {
    static const char *const tables[] = {"run",     "versions",     "updates", "update_blobs",
                                         "tasks",   "changes",      "rounds",  "round_values",
                                         "factors", "update_bodies"};
    vl_buf_init(out, 1 << 24);
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
        char sql[96];
        snprintf(sql, sizeof sql, "SELECT * FROM %s ORDER BY rowid", tables[t]);
        sqlite3_stmt *s = NULL;
        assert_int_equal(sqlite3_prepare_v2(st->db, sql, -1, &s, NULL), SQLITE_OK);
        OK(vl_buf_printf(out, "[%s]", tables[t]));
        while (sqlite3_step(s) == SQLITE_ROW) {
            for (int c = 0; c < sqlite3_column_count(s); c++) {
                const void *p = sqlite3_column_blob(s, c);
                int n = sqlite3_column_bytes(s, c);
                OK(vl_buf_printf(out, "|%d:%d:", sqlite3_column_type(s, c), n));
                if (p && n > 0) OK(vl_buf_append(out, p, (size_t)n));
            }
            OK(vl_buf_append(out, "\n", 1));
        }
        sqlite3_finalize(s);
    }
}

static void expect_unchanged(storage *st, const vl_buf *before, const char *what) {
    vl_buf after;
    snapshot(st, &after);
    if (after.len != before->len || memcmp(after.data, before->data, after.len) != 0)
        fail_msg("%s changed what is stored", what);
    vl_buf_free(&after);
}

/* An update merged into one version cannot be merged into another, nor
 * twice into the same one: its delta would count twice in the model. The
 * commit is refused, and its earlier steps (the version row, the other
 * updates it marked, the leases it expired) are undone, alone or inside a
 * caller's transaction. */
static void test_version_refuses_merged_update(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 4);
    int64_t p = add_peer(f->st, 6);
    int64_t ta = add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE);
    int64_t tb = add_task(f->st, p, 0, 2000, STORAGE_TASK_DONE);
    int64_t ua = add_update(f->st, ta, p, 0);
    int64_t ub = add_update(f->st, tb, p, 0);
    commit_version(f->st, 1, 10.0f, &ua, 1, 4);
    /* A lease on version 1, which a commit of version 2 would expire. */
    int64_t tl = add_task(f->st, p, 1, 5000, STORAGE_TASK_LEASED);
    vl_buf before;
    snapshot(f->st, &before);

    float params[4] = {7, 7, 7, 7};
    storage_version v2 = {.version = 2,
                          .created_at = 4000,
                          .params = params,
                          .n = 4,
                          .val_loss = 1.0,
                          .train_loss = 1.0,
                          .num_updates = 2};
    /* ub first, so the commit has marked it before it reaches ua. */
    int64_t again[2] = {ub, ua};
    assert_int_equal(storage_version_commit(f->st, &v2, again, 2, COMMIT_OPTS(4, 0, 0), &e),
                     VL_ECONFLICT);
    assert_false(storage_in_transaction(f->st));
    expect_unchanged(f->st, &before, "a commit merging an update version 1 merged");
    int64_t twice[2] = {ub, ub};
    assert_int_equal(storage_version_commit(f->st, &v2, twice, 2, COMMIT_OPTS(4, 0, 0), &e),
                     VL_ECONFLICT);
    expect_unchanged(f->st, &before, "a commit merging one update twice");

    /* Inside a caller's transaction only the commit's own savepoint goes. */
    assert_int_equal(storage_begin(f->st, &e), VL_OK);
    assert_int_equal(storage_version_commit(f->st, &v2, again, 2, COMMIT_OPTS(4, 0, 0), &e),
                     VL_ECONFLICT);
    assert_true(storage_in_transaction(f->st));
    assert_int_equal(storage_commit(f->st, &e), VL_OK);
    expect_unchanged(f->st, &before, "a refused commit inside a transaction");

    /* The typed view agrees: ua still belongs to version 1, ub to none,
     * version 1 is current, the lease holds. */
    int64_t id = 0, base = 0, merged = 0;
    assert_int_equal(storage_update_find(f->st, ta, &id, &base, &merged, &e), VL_OK);
    assert_int_equal(merged, 1);
    assert_int_equal(storage_update_find(f->st, tb, &id, &base, &merged, &e), VL_OK);
    assert_int_equal(merged, -1);
    storage_run r;
    assert_int_equal(storage_run_get(f->st, &r, &e), VL_OK);
    assert_int_equal(r.current_version, 1);
    storage_run_free(&r);
    storage_version got;
    assert_int_equal(storage_version_get(f->st, 2, 0, &got, &e), VL_ENOTFOUND);
    storage_task t;
    assert_int_equal(storage_task_get(f->st, tl, &t, &e), VL_OK);
    assert_int_equal(t.state, STORAGE_TASK_LEASED);

    /* Without the merged update the same version commits. */
    v2.num_updates = 1;
    assert_int_equal(storage_version_commit(f->st, &v2, &ub, 1, COMMIT_OPTS(4, 0, 0), &e), VL_OK);
    assert_int_equal(storage_update_find(f->st, tb, &id, &base, &merged, &e), VL_OK);
    assert_int_equal(merged, 2);
    vl_buf_free(&before);
}

static int refused_cb(void *ctx, const storage_version *v) {
    int *seen = ctx;
    if (v->version == 2) {
        assert_true(v->refused);
        assert_true(isnan(v->refused_val_loss));
    } else if (v->version == 3) {
        assert_true(v->refused);
        assert_true(v->refused_val_loss == 9.5);
    } else {
        assert_false(v->refused);
    }
    (*seen)++;
    return 0;
}

/* A refused version is stored as one (with the loss it would have had,
 * NULL when that was not a number), and the best loss is the lowest any
 * version holds. */
static void test_version_refused_round_trip(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    insert_run(f->st);
    double best = 0;
    assert_int_equal(storage_version_best_loss(f->st, &best, &e), VL_OK);
    assert_true(isnan(best));                   /* no version yet */
    commit_version(f->st, 0, 0.0f, NULL, 0, 0); /* val_loss 5 */
    commit_version(f->st, 1, 1.0f, NULL, 0, 0); /* val_loss 4 */
    float params[4] = {1, 2, 3, 4}, mom[4] = {0};
    storage_version v = {.version = 2,
                         .created_at = 2002,
                         .params = params,
                         .momentum = mom,
                         .n = 4,
                         .val_loss = 4.0,
                         .train_loss = 3.0,
                         .refused = 1,
                         .refused_val_loss = NAN};
    assert_int_equal(storage_version_commit(f->st, &v, NULL, 0, COMMIT_OPTS(0, 0, 0), &e), VL_OK);
    v.version = 3;
    v.refused_val_loss = 9.5;
    assert_int_equal(storage_version_commit(f->st, &v, NULL, 0, COMMIT_OPTS(0, 0, 0), &e), VL_OK);
    int seen = 0;
    assert_int_equal(storage_version_each(f->st, refused_cb, &seen, &e), VL_OK);
    assert_int_equal(seen, 4);
    assert_int_equal(storage_version_best_loss(f->st, &best, &e), VL_OK);
    assert_true(best == 4.0);
}

/* A version served on its loss check gets its validation loss later,
 * once: a loss already there, a version that does not exist and a loss
 * that is not finite change nothing. */
static void test_version_set_val_loss(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 0); /* val_loss 5 */
    float params[4] = {1, 2, 3, 4}, mom[4] = {0};
    storage_version v = {.version = 1,
                         .created_at = 2001,
                         .params = params,
                         .momentum = mom,
                         .n = 4,
                         .val_loss = NAN,
                         .train_loss = 3.0,
                         .refused_val_loss = NAN};
    assert_int_equal(storage_version_commit(f->st, &v, NULL, 0, COMMIT_OPTS(0, 0, 0), &e), VL_OK);
    storage_version got;
    assert_int_equal(storage_version_get(f->st, 1, 0, &got, &e), VL_OK);
    assert_true(isnan(got.val_loss));
    storage_version_free(&got);
    int changed = -1;
    assert_int_equal(storage_version_set_val_loss(f->st, 1, NAN, &changed, &e), VL_EINVAL);
    assert_int_equal(changed, 0);
    assert_int_equal(storage_version_set_val_loss(f->st, 1, 3.25, &changed, &e), VL_OK);
    assert_int_equal(changed, 1);
    assert_int_equal(storage_version_set_val_loss(f->st, 1, 9.0, &changed, &e), VL_OK);
    assert_int_equal(changed, 0);
    assert_int_equal(storage_version_set_val_loss(f->st, 0, 1.0, &changed, &e), VL_OK);
    assert_int_equal(changed, 0);
    assert_int_equal(storage_version_set_val_loss(f->st, 7, 1.0, &changed, &e), VL_OK);
    assert_int_equal(changed, 0);
    assert_int_equal(storage_version_get(f->st, 1, 0, &got, &e), VL_OK);
    assert_true(got.val_loss == 3.25);
    storage_version_free(&got);
    double best = 0;
    assert_int_equal(storage_version_best_loss(f->st, &best, &e), VL_OK);
    assert_true(best == 3.25);
}

/* Merged K-FAC factors commit with their version, or not at all, are read
 * back byte for byte, and outlive later versions that have none until
 * newer factors push them past keep_versions. */
static void test_factors_with_versions(void **state) {
    fixture *f = *state;
    insert_run(f->st);
    vl_error e = {0};
    int64_t latest = 0;
    assert_int_equal(storage_factors_latest(f->st, &latest, &e), VL_ENOTFOUND);
    commit_version(f->st, 0, 0.0f, NULL, 0, 2);
    float params[4] = {0};
    uint8_t blob[3][40];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 40; i++) blob[k][i] = (uint8_t)(k * 40 + i);
    /* v1 with factors, v2 and v3 without, v4 with, v5 with */
    for (int64_t v = 1; v <= 5; v++) {
        int k = v == 1 ? 0 : v == 4 ? 1 : 2;
        int has = v == 1 || v >= 4;
        storage_version ver = {.version = v,
                               .created_at = 3000 + v,
                               .params = params,
                               .n = 4,
                               .val_loss = 1.0,
                               .train_loss = 1.0,
                               .has_change = 0,
                               .factors = has ? blob[k] : NULL,
                               .factors_len = 40,
                               .factors_samples = 100 * v,
                               .factors_peers = 2};
        assert_int_equal(storage_version_commit(f->st, &ver, NULL, 0, COMMIT_OPTS(2, 0, 0), &e),
                         VL_OK);
        assert_int_equal(storage_factors_latest(f->st, &latest, &e), VL_OK);
        assert_int_equal(latest, v <= 3 ? 1 : v);
    }
    uint8_t *got = NULL;
    size_t len = 0;
    int64_t samples = 0, peers = 0;
    assert_int_equal(storage_factors_get(f->st, 5, &got, &len, &samples, &peers, &e), VL_OK);
    assert_int_equal(len, 40);
    assert_memory_equal(got, blob[2], 40);
    assert_int_equal(samples, 500);
    assert_int_equal(peers, 2);
    free(got);
    assert_int_equal(storage_factors_get(f->st, 4, &got, &len, NULL, NULL, &e), VL_OK);
    assert_memory_equal(got, blob[1], 40);
    free(got);
    /* v1's went when v4's came (4 - 2 >= 1) */
    assert_int_equal(storage_factors_get(f->st, 1, &got, &len, NULL, NULL, &e), VL_ENOTFOUND);
    assert_null(got);
    assert_int_equal(storage_factors_get(f->st, 3, &got, &len, NULL, NULL, &e), VL_ENOTFOUND);
    /* a commit that fails stores no factors; bad factors fail it */
    storage_version bad = {.version = 6,
                           .params = params,
                           .n = 4,
                           .factors = blob[0],
                           .factors_len = 40,
                           .factors_samples = 1,
                           .factors_peers = 1};
    int64_t missing = 999;
    assert_int_equal(storage_version_commit(f->st, &bad, &missing, 1, COMMIT_OPTS(2, 0, 0), &e),
                     VL_ECONFLICT);
    assert_int_equal(storage_factors_get(f->st, 6, &got, &len, NULL, NULL, &e), VL_ENOTFOUND);
    bad.factors_samples = 0;
    assert_int_equal(storage_version_commit(f->st, &bad, NULL, 0, COMMIT_OPTS(2, 0, 0), &e),
                     VL_EINVAL);
    assert_int_equal(storage_factors_latest(f->st, &latest, &e), VL_OK);
    assert_int_equal(latest, 5);
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_updates_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_version_commit_and_prune, setup, teardown),
        cmocka_unit_test_setup_teardown(test_version_commit_is_atomic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_version_refuses_merged_update, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_version_set_val_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_version_refused_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_factors_with_versions, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
