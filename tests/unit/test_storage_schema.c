/* storage: the schema and its migrations, file modes, the change log,
 * checkpoints and explicit transactions. Each test works on a fresh
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

#include <sqlite3.h>

#include "storage/internal.h"
#include "storage/storage.h"
#include "test_util.h"
#include "storage_fixtures.h"

/* A new database, the -wal and -shm files SQLite makes beside it, and the
 * update bodies' directory and segment files are the owner's alone (0600,
 * the directory 0700) whatever the umask: they hold token hashes, peer
 * keys and uploads. */
static void test_file_modes(void **state) {
    (void)state;
    const mode_t masks[] = {0, 022, 0277};
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        char *d = test_temp_dir("/tmp/volley-test-modes-XXXXXX");
        char path[256];
        snprintf(path, sizeof path, "%s/run.db", d);
        mode_t old = umask(masks[i]);
        storage *st = NULL;
        vl_error e = {0};
        if (storage_open(path, 1, &st, &e) != VL_OK)
            fail_msg("umask %03o: %s", (unsigned)masks[i], e.msg);
        insert_run(st);
        commit_version(st, 0, 0.0f, NULL, 0, 4);
        int64_t p = add_peer(st, 1);
        add_update(st, add_task(st, p, 0, 2000, STORAGE_TASK_DONE), p, 0);
        umask(old);
        char seg[300];
        snprintf(seg, sizeof seg, "%s-bodies/%016d.seg", path, 0);
        const char *files[] = {"", "-wal", "-shm", "-bodies", seg};
        for (int k = 0; k < 5; k++) {
            char f[300];
            snprintf(f, sizeof f, "%s", k < 4 ? path : "");
            snprintf(f + strlen(f), sizeof f - strlen(f), "%s", files[k]);
            struct stat sb;
            if (stat(f, &sb) != 0) fail_msg("umask %03o: no %s", (unsigned)masks[i], f);
            unsigned want = k == 3 ? 0700 : 0600;
            if ((sb.st_mode & 0777) != want)
                fail_msg("umask %03o: %s has mode %03o", (unsigned)masks[i], f,
                         (unsigned)(sb.st_mode & 0777));
        }
        storage_close(st);
        test_remove_db(path);
        test_remove_tree(d);
        free(d);
    }
}

/* Sums the changes handed to it into a 4-vector and checks their order. */
typedef struct change_sum {
    float x[4];
    int64_t last;
    int calls;
} change_sum;

static int sum_change(void *ctx, const storage_change *c) {
    change_sum *s = ctx;
    assert_true(c->version > s->last);
    s->last = c->version;
    s->calls++;
    for (size_t j = 0; j < c->nnz; j++) {
        uint32_t i;
        float v;
        memcpy(&i, c->idx + 4 * j, 4);
        memcpy(&v, c->val + 4 * j, 4);
        assert_true(i < 4);
        s->x[i] += v;
    }
    return 0;
}

/* Each version's sparse change commits with it; a range of them walks in
 * order; pruned or missing ones make the whole range VL_ENOTFOUND before
 * anything is handed out; a failed commit leaves no change behind. */
static void test_changes(void **state) {
    fixture *f = *state;
    insert_run(f->st);
    commit_version(f->st, 0, 0, NULL, 0, 0);
    float params[4] = {0};
    vl_error e = {0};
    for (int64_t v = 1; v <= 5; v++) {
        uint32_t idx[2] = {(uint32_t)(v % 4), 3};
        float val[2] = {(float)v, 0.5f};
        size_t nnz = v % 4 == 3 ? 1 : 2;
        storage_version ver = {.version = v,
                               .created_at = 2000 + v,
                               .params = params,
                               .n = 4,
                               .val_loss = 1,
                               .train_loss = 1,
                               .has_change = 1,
                               .change_idx = idx,
                               .change_val = val,
                               .change_nnz = nnz};
        assert_int_equal(storage_version_commit(f->st, &ver, NULL, 0, COMMIT_OPTS(0, 3, 0), &e),
                         VL_OK);
    }
    /* keep_changes 3 at version 5 keeps 3, 4 and 5. */
    change_sum s = {{0}, 2, 0};
    assert_int_equal(storage_change_each(f->st, 2, 5, sum_change, &s, &e), VL_OK);
    assert_int_equal(s.calls, 3);
    /* versions 3 (index 3 only), 4 (index 0 and 3), 5 (index 1 and 3) */
    assert_true(s.x[0] == 4.0f && s.x[1] == 5.0f && s.x[2] == 0.0f);
    assert_true(s.x[3] == 3.0f + 0.5f + 0.5f);
    change_sum none = {{0}, 0, 0};
    assert_int_equal(storage_change_each(f->st, 1, 5, sum_change, &none, &e), VL_ENOTFOUND);
    assert_int_equal(none.calls, 0);
    assert_int_equal(storage_change_each(f->st, 4, 6, sum_change, &none, &e), VL_ENOTFOUND);
    assert_int_equal(storage_change_each(f->st, 5, 5, sum_change, &none, &e), VL_EINVAL);
    assert_int_equal(none.calls, 0);
    /* A version that fails to commit (it skips one) stores no change. */
    uint32_t idx[1] = {1};
    float val[1] = {9};
    storage_version bad = {.version = 7,
                           .created_at = 1,
                           .params = params,
                           .n = 4,
                           .has_change = 1,
                           .change_idx = idx,
                           .change_val = val,
                           .change_nnz = 1};
    assert_int_equal(storage_version_commit(f->st, &bad, NULL, 0, COMMIT_OPTS(0, 3, 0), &e),
                     VL_ECONFLICT);
    bad.version = 6;
    bad.change_nnz = 0;
    assert_int_equal(storage_version_commit(f->st, &bad, NULL, 0, COMMIT_OPTS(0, 3, 0), &e), VL_OK);
    change_sum last = {{0}, 5, 0};
    assert_int_equal(storage_change_each(f->st, 5, 6, sum_change, &last, &e), VL_OK);
    assert_int_equal(last.calls, 1);
    assert_true(last.x[1] == 0.0f);
}


static void test_fresh_database_reaches_latest_schema(void **state) {
    fixture *f = *state;
    int v = -1;
    vl_error e = {0};
    assert_int_equal(storage_user_version(f->st, &v, &e), VL_OK);
    assert_int_equal(v, storage_schema_version());
    assert_true(v >= 1);
    struct stat sb;
    assert_int_equal(stat(f->path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    /* Reopening applies nothing and keeps the version. */
    storage_close(f->st);
    assert_int_equal(storage_open(f->path, 0, &f->st, &e), VL_OK);
    assert_int_equal(storage_user_version(f->st, &v, &e), VL_OK);
    assert_int_equal(v, storage_schema_version());
    /* Without create, a missing file is not made. */
    char other[160];
    snprintf(other, sizeof other, "%s/missing.db", f->dir);
    storage *st2 = NULL;
    assert_int_equal(storage_open(other, 0, &st2, &e), VL_ENOTFOUND);
    assert_null(st2);
    assert_int_equal(access(other, F_OK), -1);
}

typedef struct {
    int n;
    int64_t nbytes;
    uint8_t first, last;
} body_seen;

static int see_body(void *ctx, const storage_update *u) {
    body_seen *b = ctx;
    b->n++;
    b->nbytes = u->nbytes;
    if (u->blob && u->nbytes > 0) {
        b->first = u->blob[0];
        b->last = u->blob[u->nbytes - 1];
    }
    return 0;
}

/* A run, a peer, version 0 and a done task, as every schema since the
 * first stores them: what an old database's update belongs to. */
#define OLD_ROWS                                                                            \
    "INSERT INTO run (id, name, config, corpus_path, corpus_size, corpus_hash, created_at)" \
    " VALUES (1, 'r', '{}', '/c', 1, 'h', 1);"                                              \
    "INSERT INTO peers (id, public_key, name, hardware, joined_at, last_seen)"              \
    " VALUES (1, zeroblob(32), 'p', '', 1, 1);"                                             \
    "INSERT INTO versions (version, created_at) VALUES (0, 1);"                             \
    "INSERT INTO tasks (id, peer_id, base_version, data_offset, data_length, seed,"         \
    " issued_at, deadline, state) VALUES (1, 1, 0, 0, 10, 1, 1, 2, 'done');"

/* A database built by the real migrations up to schema upto, holding
 * rows (SQL), in the fixture's folder at old_path, then opened as the
 * coordinator opens it: it must reach the latest schema. */
static void open_migrated(fixture *f, int upto, const char *rows, char *old_path, size_t cap,
                          storage **st) {
    snprintf(old_path, cap, "%s/old.db", f->dir);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(old_path, &db), SQLITE_OK);
    size_t n = 0;
    const storage_migration *m = storage_builtin_migrations(&n);
    for (size_t i = 0; i < n && m[i].version <= upto; i++)
        assert_int_equal(sqlite3_exec(db, m[i].sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, rows, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
    vl_error e = {0};
    assert_int_equal(storage_open(old_path, 0, st, &e), VL_OK);
    int v = 0;
    assert_int_equal(storage_user_version(*st, &v, &e), VL_OK);
    assert_int_equal(v, storage_schema_version());
}

/* Migration 5 moves update bodies out of `updates`: a database made at
 * schema 4 with a stored body opens at the latest schema with the same
 * bytes readable, and the old column is gone. */
static void test_migration_moves_update_bodies(void **state) {
    fixture *f = *state;
    const char *rows = "PRAGMA user_version = 4;" OLD_ROWS
                       "INSERT INTO updates (id, task_id, peer_id, base_version, kind, num_samples,"
                       " local_steps, loss, nbytes, blob, received_at)"
                       " VALUES (1, 1, 1, 0, 'dense', 1, 1, 1.0, 3, X'07FF09', 1);";
    storage *st = NULL;
    vl_error e = {0};
    char old_path[160];
    open_migrated(f, 4, rows, old_path, sizeof old_path, &st);
    body_seen b = {0};
    assert_int_equal(storage_update_each_unmerged(st, see_body, &b, &e), VL_OK);
    assert_int_equal(b.n, 1);
    assert_int_equal(b.nbytes, 3);
    assert_int_equal(b.first, 0x07);
    assert_int_equal(b.last, 0x09);
    storage_close(st);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(old_path, &db), SQLITE_OK);
    assert_int_not_equal(sqlite3_exec(db, "SELECT blob FROM updates", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    test_remove_db(old_path);
}

typedef struct norms_seen {
    int n;
    int64_t id[4];
    int has[4];
    double norm[4];
} norms_seen;

static int see_norm(void *ctx, const storage_update *u) {
    norms_seen *s = ctx;
    assert_true(s->n < 4);
    s->id[s->n] = u->id;
    s->has[s->n] = u->has_norm;
    s->norm[s->n++] = u->norm;
    return 0;
}

/* An update of a new done task by peer p with body blob and, when
 * has_norm, that norm. */
static storage_update norm_update(fixture *f, int64_t p, const uint8_t *blob, size_t len,
                                  int has_norm, double norm) {
    return (storage_update){.task_id = add_task(f->st, p, 0, 5000, STORAGE_TASK_DONE),
                            .peer_id = p,
                            .kind = "dense",
                            .num_samples = 1,
                            .local_steps = 1,
                            .nbytes = (int64_t)len,
                            .blob = blob,
                            .has_norm = has_norm,
                            .norm = norm};
}

/* An update's norm (migration 14) reads back with the same bits it was
 * stored with, since the merge uses it where it computed the number
 * before; an update stored without one reads back without one; and what
 * is not a norm is refused before anything is stored. */
static void test_update_norm_round_trip(void **state) {
    fixture *f = *state;
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 0);
    int64_t p = add_peer(f->st, 4);
    /* A third, a subnormal and the largest double: no decimal rounding,
     * no loss at either end of the range. */
    const double norms[3] = {1.0 / 3.0, 4.9406564584124654e-324, 1.7976931348623157e308};
    static const uint8_t blob[] = {1, 2, 3};
    vl_error e = {0};
    for (int i = 0; i < 4; i++) {
        storage_update u = norm_update(f, p, blob, sizeof blob, i < 3, i < 3 ? norms[i] : 0);
        assert_int_equal(storage_update_insert(f->st, &u, NULL, &e), VL_OK);
    }
    norms_seen s = {0};
    assert_int_equal(storage_update_each_unmerged(f->st, see_norm, &s, &e), VL_OK);
    assert_int_equal(s.n, 4);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(s.has[i], 1);
        assert_memory_equal(&s.norm[i], &norms[i], sizeof norms[i]);
    }
    assert_int_equal(s.has[3], 0);
    const double bad[] = {-1.0, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        storage_update u = norm_update(f, p, blob, sizeof blob, 1, bad[i]);
        assert_int_equal(storage_update_insert(f->st, &u, NULL, &e), VL_EINVAL);
    }
    int64_t total = 0;
    assert_int_equal(storage_update_count(f->st, &total, &e), VL_OK);
    assert_int_equal(total, 4);
}

/* Migration 14 adds the norm column: a database made at schema 13 with an
 * unmerged update opens at the latest schema with that update's norm
 * unknown (NULL, which the merge computes itself) and its body intact,
 * and takes new updates with their norms beside it. */
static void test_migration_adds_update_norms(void **state) {
    fixture *f = *state;
    const char *rows = "PRAGMA user_version = 13;" OLD_ROWS
                       "INSERT INTO updates (id, task_id, peer_id, base_version, kind, num_samples,"
                       " local_steps, loss, nbytes, received_at)"
                       " VALUES (1, 1, 1, 0, 'dense', 1, 1, 1.0, 3, 1);"
                       "INSERT INTO update_blobs (update_id, blob) VALUES (1, X'07FF09');";
    storage *st = NULL;
    vl_error e = {0};
    char old_path[160];
    open_migrated(f, 13, rows, old_path, sizeof old_path, &st);
    body_seen b = {0};
    assert_int_equal(storage_update_each_unmerged(st, see_body, &b, &e), VL_OK);
    assert_true(b.n == 1 && b.nbytes == 3 && b.first == 0x07 && b.last == 0x09);
    storage_task t = {.peer_id = 1,
                      .base_version = 0,
                      .data_offset = 10,
                      .data_length = 10,
                      .seed = 1,
                      .issued_at = 1,
                      .deadline = 2,
                      .state = STORAGE_TASK_DONE};
    int64_t tid = 0;
    assert_int_equal(storage_task_insert(st, &t, &tid, &e), VL_OK);
    static const uint8_t blob[] = {5};
    storage_update u = {.task_id = tid,
                        .peer_id = 1,
                        .kind = "dense",
                        .num_samples = 1,
                        .local_steps = 1,
                        .nbytes = sizeof blob,
                        .blob = blob,
                        .has_norm = 1,
                        .norm = 0.75};
    int64_t uid = 0;
    assert_int_equal(storage_update_insert(st, &u, &uid, &e), VL_OK);
    norms_seen s = {0};
    assert_int_equal(storage_update_each_unmerged(st, see_norm, &s, &e), VL_OK);
    assert_int_equal(s.n, 2);
    assert_true(s.id[0] == 1 && s.has[0] == 0);
    assert_true(s.id[1] == uid && s.has[1] == 1 && s.norm[1] == 0.75);
    storage_close(st);
    /* What the migration added is a column of its own, NULL for the old
     * row rather than some number that could pass for a norm. */
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(old_path, &db), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    assert_int_equal(
        sqlite3_prepare_v2(db, "SELECT id FROM updates WHERE norm IS NULL", -1, &q, NULL),
        SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(q, 0), 1);
    assert_int_equal(sqlite3_step(q), SQLITE_DONE);
    sqlite3_finalize(q);
    sqlite3_close(db);
    test_remove_db(old_path);
}

/* With its own checkpoints off, a connection's commits leave pages in the
 * WAL; a passive checkpoint then copies every one of them back. */
static void test_checkpoint(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    assert_int_equal(storage_set_autocheckpoint(f->st, -1, &e), VL_EINVAL);
    assert_int_equal(storage_set_autocheckpoint(f->st, 0, &e), VL_OK);
    insert_run(f->st);
    int wal = -1, done = -1;
    assert_int_equal(storage_checkpoint(f->st, &wal, &done, &e), VL_OK);
    assert_true(wal > 0);
    assert_int_equal(done, wal);
}

static void test_failing_migration_rolls_back(void **state) {
    fixture *f = *state;
    int base = storage_schema_version();
    storage_migration list[32];
    size_t n = 0;
    assert_true(base + 3 <= 32);
    for (int i = 1; i <= base; i++) list[n++] = (storage_migration){i, "SELECT 1"};
    list[n++] = (storage_migration){base + 1, "CREATE TABLE extra_a (x INTEGER);"};
    /* The first statement succeeds, the second fails: neither may stay. */
    list[n++] = (storage_migration){base + 2, "CREATE TABLE extra_b (x INTEGER);"
                                              "INSERT INTO no_such_table VALUES (1);"};
    list[n++] = (storage_migration){base + 3, "CREATE TABLE extra_c (x INTEGER);"};
    vl_error e = {0};
    assert_int_equal(storage_migrate_with(f->st, list, n, &e), VL_EDB);
    assert_non_null(strstr(e.msg, "migration"));
    int v = -1;
    assert_int_equal(storage_user_version(f->st, &v, &e), VL_OK);
    assert_int_equal(v, base + 1);
    /* extra_a exists (its migration committed); extra_b and extra_c do not. A
     * new migration run that creates extra_b must therefore succeed. */
    list[n - 2] = (storage_migration){base + 2, "CREATE TABLE extra_b (x INTEGER);"};
    assert_int_equal(storage_migrate_with(f->st, list, n, &e), VL_OK);
    assert_int_equal(storage_user_version(f->st, &v, &e), VL_OK);
    assert_int_equal(v, base + 3);
    /* A database newer than the program is refused. */
    assert_int_equal(storage_migrate_with(f->st, list, n - 1, &e), VL_EDB);
}

/* The schema itself keeps exactly-once: a merged update's merged_version
 * cannot be changed or cleared, and no update is stored merged, even by a
 * statement that bypasses the storage API. */
static void test_merged_once_in_schema(void **state) {
    fixture *f = *state;
    insert_run(f->st);
    commit_version(f->st, 0, 0.0f, NULL, 0, 0);
    int64_t p = add_peer(f->st, 9);
    int64_t t = add_task(f->st, p, 0, 5000, STORAGE_TASK_DONE);
    int64_t u = add_update(f->st, t, p, 0);
    commit_version(f->st, 1, 1.0f, &u, 1, 0);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 1000);
    char sql[320];
    snprintf(sql, sizeof sql, "UPDATE updates SET merged_version = 2 WHERE id = %lld",
             (long long)u);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_CONSTRAINT);
    snprintf(sql, sizeof sql, "UPDATE updates SET merged_version = NULL WHERE id = %lld",
             (long long)u);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_CONSTRAINT);
    int64_t t2 = add_task(f->st, p, 1, 5000, STORAGE_TASK_DONE);
    snprintf(sql, sizeof sql,
             "INSERT INTO updates (task_id, peer_id, base_version, kind, num_samples, local_steps,"
             " loss, nbytes, received_at, staleness, merged_version)"
             " VALUES (%lld, %lld, 1, 'dense', 1, 1, 1.0, 1, 1000, 0, 1)",
             (long long)t2, (long long)p);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_CONSTRAINT);
    sqlite3_stmt *s = NULL;
    snprintf(sql, sizeof sql, "SELECT merged_version FROM updates WHERE id = %lld", (long long)u);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(s, 0), 1);
    sqlite3_finalize(s);
    sqlite3_close(db);
}

static void test_explicit_transaction_rollback(void **state) {
    fixture *f = *state;
    vl_error e = {0};
    assert_int_equal(storage_begin(f->st, &e), VL_OK);
    assert_int_equal(storage_begin(f->st, &e), VL_EDB);
    assert_int_equal(storage_token_insert(f->st, "dd", 1, 5000, 1000, NULL, &e), VL_OK);
    storage_rollback(f->st);
    int64_t id;
    assert_int_equal(storage_token_check(f->st, "dd", 1000, &id, &e), VL_ENOTFOUND);
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_modes),
        cmocka_unit_test_setup_teardown(test_fresh_database_reaches_latest_schema, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failing_migration_rolls_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migration_moves_update_bodies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_update_norm_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migration_adds_update_norms, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_changes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_merged_once_in_schema, setup, teardown),
        cmocka_unit_test_setup_teardown(test_explicit_transaction_rollback, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
