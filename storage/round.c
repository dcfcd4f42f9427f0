/* Second-round state of sketch runs: candidates per version and the exact
 * values peers reported for them. */
#include <stdlib.h>
#include <string.h>

#include "storage/internal.h"

/* A round's candidates and values are bounded by the sketch, itself at
 * most COMPRESS_SKETCH_MAX_CELLS cells; this keeps a damaged row from
 * asking for an absurd allocation. */
#define ROUND_MAX_N ((size_t)1 << 28)

int storage_update_find(storage *st, int64_t task_id, int64_t *id, int64_t *base_version,
                        int64_t *merged_version, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_UPDATE_FIND, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, task_id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *id = sqlite3_column_int64(s, 0);
        *base_version = sqlite3_column_int64(s, 1);
        *merged_version =
            sqlite3_column_type(s, 2) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, 2);
        q_done(s);
        return VL_OK;
    }
    int ret = rc == SQLITE_DONE
                  ? vl_fail(err, VL_ENOTFOUND, "task %lld has no update", (long long)task_id)
                  : q_fail(st, err, "find update");
    q_done(s);
    return ret;
}

int storage_round_insert(storage *st, const storage_round *r, vl_error *err) {
    if (r->n == 0 || r->n > ROUND_MAX_N || !r->candidates)
        return vl_fail(err, VL_EINVAL, "a round needs 1 to %zu candidates, not %zu", ROUND_MAX_N,
                       r->n);
    sqlite3_stmt *s = q_get(st, Q_ROUND_INSERT, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, r->version);
    sqlite3_bind_int64(s, 2, (int64_t)r->n);
    sqlite3_bind_blob64(s, 3, r->candidates, (sqlite3_uint64)r->n * 4, SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, r->opened_at);
    sqlite3_bind_int64(s, 5, r->deadline);
    int rc = q_exec(st, s, "insert round", err);
    if (rc == VL_ECONFLICT)
        return vl_fail(err, VL_ECONFLICT, "version %lld already has a round",
                       (long long)r->version);
    return rc;
}

int storage_round_get(storage *st, int64_t version, storage_round *out, vl_error *err) {
    memset(out, 0, sizeof *out);
    sqlite3_stmt *s = q_get(st, Q_ROUND_GET, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, version);
    int rc = sqlite3_step(s);
    if (rc != SQLITE_ROW) {
        int ret = rc == SQLITE_DONE
                      ? vl_fail(err, VL_ENOTFOUND, "version %lld has no round", (long long)version)
                      : q_fail(st, err, "read round");
        q_done(s);
        return ret;
    }
    int64_t n = sqlite3_column_int64(s, 0);
    const void *blob = sqlite3_column_blob(s, 1);
    int bytes = sqlite3_column_bytes(s, 1);
    if (n <= 0 || (uint64_t)n > ROUND_MAX_N || !blob || (int64_t)bytes != 4 * n) {
        q_done(s);
        return vl_fail(err, VL_EDB, "database: the round of version %lld is damaged",
                       (long long)version);
    }
    out->candidates = malloc((size_t)bytes);
    if (!out->candidates) {
        q_done(s);
        return vl_fail(err, VL_ENOMEM, "out of memory reading a round");
    }
    memcpy(out->candidates, blob, (size_t)bytes);
    out->version = version;
    out->n = (size_t)n;
    out->opened_at = sqlite3_column_int64(s, 2);
    out->deadline = sqlite3_column_int64(s, 3);
    q_done(s);
    return VL_OK;
}

void storage_round_free(storage_round *r) {
    if (!r) return;
    free(r->candidates);
    memset(r, 0, sizeof *r);
}

int storage_round_values_insert(storage *st, int64_t update_id, int64_t version, const float *vals,
                                size_t n, int64_t now, vl_error *err) {
    if (n == 0 || n > ROUND_MAX_N || !vals)
        return vl_fail(err, VL_EINVAL, "round values need 1 to %zu entries, not %zu", ROUND_MAX_N,
                       n);
    sqlite3_stmt *s = q_get(st, Q_VALUES_INSERT, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, update_id);
    sqlite3_bind_int64(s, 2, version);
    sqlite3_bind_int64(s, 3, (int64_t)n);
    sqlite3_bind_blob64(s, 4, vals, (sqlite3_uint64)n * 4, SQLITE_STATIC);
    sqlite3_bind_int64(s, 5, now);
    int rc = q_exec(st, s, "insert round values", err);
    if (rc == VL_ECONFLICT)
        return vl_fail(err, VL_ECONFLICT, "update %lld already has its round values",
                       (long long)update_id);
    return rc;
}

int storage_round_values_count(storage *st, int64_t version, int64_t *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_VALUES_COUNT, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, version);
    return q_int(st, s, 0, out, "count round values", err);
}

int storage_round_values_has(storage *st, int64_t update_id, int *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_VALUES_HAS, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, update_id);
    int64_t n = 0;
    int rc = q_int(st, s, 0, &n, "find round values", err);
    if (rc == VL_OK) *out = n > 0;
    return rc;
}

int storage_round_values_each(storage *st, int64_t version, storage_values_fn fn, void *ctx,
                              vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_VALUES_EACH, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, version);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t id = sqlite3_column_int64(s, 0);
        int64_t n = sqlite3_column_int64(s, 1);
        const uint8_t *vals = sqlite3_column_blob(s, 2);
        int bytes = sqlite3_column_bytes(s, 2);
        if (n <= 0 || !vals || (int64_t)bytes != 4 * n) {
            q_done(s);
            return vl_fail(err, VL_EDB, "database: the round values of update %lld are damaged",
                           (long long)id);
        }
        int r = fn(ctx, id, vals, (size_t)n);
        if (r != 0) {
            q_done(s);
            return r;
        }
    }
    int ret = rc == SQLITE_DONE ? VL_OK : q_fail(st, err, "read round values");
    q_done(s);
    return ret;
}
