/* Typed queries on tasks, updates and versions, and the atomic version
 * commit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/internal.h"

/* ---- tasks -------------------------------------------------------------- */

static const char *task_state_name(storage_task_state s) {
    switch (s) {
    case STORAGE_TASK_DONE: return "done";
    case STORAGE_TASK_EXPIRED: return "expired";
    default: return "leased";
    }
}

static storage_task_state task_state_parse(const char *s) {
    if (s && strcmp(s, "done") == 0) return STORAGE_TASK_DONE;
    if (s && strcmp(s, "expired") == 0) return STORAGE_TASK_EXPIRED;
    return STORAGE_TASK_LEASED;
}

int storage_task_next_id(storage *st, int64_t *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_NEXT_ID, err);
    if (!s) return VL_EDB;
    return q_int(st, s, 1, out, "next task id", err);
}

int storage_task_insert(storage *st, const storage_task *t, int64_t *id, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_INSERT, err);
    if (!s) return VL_EDB;
    if (t->id > 0)
        sqlite3_bind_int64(s, 1, t->id);
    else
        sqlite3_bind_null(s, 1);
    sqlite3_bind_int64(s, 2, t->peer_id);
    sqlite3_bind_int64(s, 3, t->base_version);
    sqlite3_bind_int64(s, 4, t->data_offset);
    sqlite3_bind_int64(s, 5, t->data_length);
    sqlite3_bind_int64(s, 6, t->seed);
    sqlite3_bind_int64(s, 7, t->issued_at);
    sqlite3_bind_int64(s, 8, t->deadline);
    sqlite3_bind_text(s, 9, task_state_name(t->state), -1, SQLITE_STATIC);
    if (t->reissue_of > 0)
        sqlite3_bind_int64(s, 10, t->reissue_of);
    else
        sqlite3_bind_null(s, 10);
    int rc = q_exec(st, s, "insert task", err);
    if (rc == VL_OK && id) *id = sqlite3_last_insert_rowid(st->db);
    return rc;
}

static int read_task(storage *st, sqlite3_stmt *s, storage_task *out, vl_error *err) {
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        out->id = sqlite3_column_int64(s, 0);
        out->peer_id = sqlite3_column_int64(s, 1);
        out->base_version = sqlite3_column_int64(s, 2);
        out->data_offset = sqlite3_column_int64(s, 3);
        out->data_length = sqlite3_column_int64(s, 4);
        out->seed = sqlite3_column_int64(s, 5);
        out->issued_at = sqlite3_column_int64(s, 6);
        out->deadline = sqlite3_column_int64(s, 7);
        out->state = task_state_parse((const char *)sqlite3_column_text(s, 8));
        out->reissue_of = sqlite3_column_int64(s, 9);
        rc = VL_OK;
    } else if (rc == SQLITE_DONE) {
        rc = vl_fail(err, VL_ENOTFOUND, "no such task");
    } else {
        rc = q_fail(st, err, "read task");
    }
    q_done(s);
    return rc;
}

int storage_task_get(storage *st, int64_t id, storage_task *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_GET, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, id);
    return read_task(st, s, out, err);
}

int storage_task_find_lease(storage *st, int64_t peer_id, int64_t base_version, int64_t now,
                            storage_task *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_FIND_LEASE, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, peer_id);
    sqlite3_bind_int64(s, 2, base_version);
    sqlite3_bind_int64(s, 3, now);
    return read_task(st, s, out, err);
}

int storage_task_find_any_lease(storage *st, int64_t peer_id, int64_t now, int64_t except,
                                storage_task *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_FIND_ANY_LEASE, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, peer_id);
    sqlite3_bind_int64(s, 2, now);
    sqlite3_bind_int64(s, 3, except);
    return read_task(st, s, out, err);
}

int storage_task_count_leased(storage *st, int64_t now, int64_t *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_COUNT_LEASED, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, now);
    return q_int(st, s, 0, out, "count leases", err);
}

int storage_task_next_deadline_any(storage *st, int64_t now, int64_t *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_NEXT_DEADLINE_ANY, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, now);
    return q_int(st, s, 0, out, "next deadline", err);
}

int storage_task_take_expired(storage *st, storage_task *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_TAKE_EXPIRED, err);
    if (!s) return VL_EDB;
    int rc = read_task(st, s, out, err);
    if (rc != VL_OK) return rc;
    if (!(s = q_get(st, Q_TASK_MARK_REISSUED, err))) return VL_EDB;
    sqlite3_bind_int64(s, 1, out->id);
    if ((rc = q_exec(st, s, "mark task reissued", err)) != VL_OK) return rc;
    if (q_changes(st) != 1)
        return vl_fail(err, VL_ECONFLICT, "task %lld was reissued already", (long long)out->id);
    return VL_OK;
}

int storage_task_count_slots(storage *st, int64_t base_version, int64_t now, int64_t *out,
                             vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_COUNT_SLOTS, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, base_version);
    sqlite3_bind_int64(s, 2, now);
    return q_int(st, s, 0, out, "count slots", err);
}

int storage_task_count_done(storage *st, int64_t base_version, int64_t *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_COUNT_DONE, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, base_version);
    return q_int(st, s, 0, out, "count done", err);
}

int storage_task_next_deadline(storage *st, int64_t base_version, int64_t now, int64_t *out,
                               vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_NEXT_DEADLINE, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, base_version);
    sqlite3_bind_int64(s, 2, now);
    return q_int(st, s, 0, out, "next deadline", err);
}

int storage_task_expire(storage *st, int64_t now, int64_t *n, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_EXPIRE, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, now);
    int rc = q_exec(st, s, "expire tasks", err);
    if (rc == VL_OK && n) *n = q_changes(st);
    return rc;
}

int storage_task_set_state(storage *st, int64_t id, storage_task_state state, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_SET_STATE, err);
    if (!s) return VL_EDB;
    sqlite3_bind_text(s, 1, task_state_name(state), -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, id);
    int rc = q_exec(st, s, "set task state", err);
    if (rc == VL_OK && q_changes(st) != 1)
        return vl_fail(err, VL_ENOTFOUND, "no task %lld", (long long)id);
    return rc;
}

int storage_task_release(storage *st, int64_t id, int64_t peer_id, int64_t *n, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TASK_RELEASE, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int64(s, 2, peer_id);
    int rc = q_exec(st, s, "release a task", err);
    if (rc == VL_OK && n) *n = q_changes(st);
    return rc;
}

/* ---- updates ------------------------------------------------------------ */

static int update_insert_steps(storage *st, const storage_update *u, int64_t *id, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_UPDATE_INSERT, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, u->task_id);
    sqlite3_bind_int64(s, 2, u->peer_id);
    sqlite3_bind_int64(s, 3, u->base_version);
    sqlite3_bind_text(s, 4, u->kind, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 5, u->num_samples);
    sqlite3_bind_int64(s, 6, u->local_steps);
    sqlite3_bind_double(s, 7, u->loss);
    sqlite3_bind_int64(s, 8, u->nbytes);
    sqlite3_bind_int64(s, 9, u->received_at);
    sqlite3_bind_int64(s, 10, u->staleness);
    if (u->has_norm)
        sqlite3_bind_double(s, 11, u->norm);
    else
        sqlite3_bind_null(s, 11);
    int rc = q_exec(st, s, "insert update", err);
    if (rc == VL_ECONFLICT) return vl_fail(err, VL_ECONFLICT, "the task already has an update");
    if (rc != VL_OK) return rc;
    int64_t uid = sqlite3_last_insert_rowid(st->db);
    if (u->nbytes > 0) {
        int64_t seg, off;
        rc = body_append(&st->bodies, u->blob, (size_t)u->nbytes, &seg, &off, err);
        if (rc != VL_OK) return rc;
        if (!(s = q_get(st, Q_UPDATE_BODY_INSERT, err))) return VL_EDB;
        sqlite3_bind_int64(s, 1, uid);
        sqlite3_bind_int64(s, 2, seg);
        sqlite3_bind_int64(s, 3, off);
        if ((rc = q_exec(st, s, "insert update body", err)) != VL_OK) return rc;
    } else {
        if (!(s = q_get(st, Q_UPDATE_BLOB_INSERT, err))) return VL_EDB;
        sqlite3_bind_int64(s, 1, uid);
        sqlite3_bind_blob64(s, 2, "", 0, SQLITE_STATIC);
        if ((rc = q_exec(st, s, "insert update body", err)) != VL_OK) return rc;
    }
    if (id) *id = uid;
    return VL_OK;
}

int storage_update_insert(storage *st, const storage_update *u, int64_t *id, vl_error *err) {
    if (u->nbytes < 0 || (u->nbytes > 0 && !u->blob))
        return vl_fail(err, VL_EINVAL, "update blob missing");
    /* SQLite would store a NaN as NULL, which reads back as "not known",
     * and the schema's CHECK refuses a negative one as a database error:
     * both are the caller's mistake, and said so. */
    if (u->has_norm && !(isfinite(u->norm) && u->norm >= 0))
        return vl_fail(err, VL_EINVAL, "update norm %g is not a norm", u->norm);
    /* The row and its body are stored together or not at all. */
    int nested;
    int rc = q_tx_begin(st, &nested, err);
    if (rc != VL_OK) return rc;
    rc = update_insert_steps(st, u, id, err);
    if (rc != VL_OK) {
        q_tx_end(st, nested, 0, NULL);
        return rc;
    }
    return q_tx_end(st, nested, 1, err);
}

int storage_update_exists(storage *st, int64_t task_id, int *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_UPDATE_EXISTS, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, task_id);
    int64_t n = 0;
    int rc = q_int(st, s, 0, &n, "find update", err);
    if (rc == VL_OK) *out = n > 0;
    return rc;
}

int q_body_seg_unused(storage *st, int64_t seg, int *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_BODY_SEG_USED, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, seg);
    int64_t used = 0;
    int rc = q_int(st, s, 0, &used, "find segment use", err);
    if (rc == VL_ENOTFOUND)
        used = 0;
    else if (rc != VL_OK)
        return rc;
    *out = used == 0;
    return VL_OK;
}

static int each_update(storage *st, sqlite3_stmt *s, storage_update_fn fn, void *ctx,
                       vl_error *err) {
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        storage_update u;
        memset(&u, 0, sizeof u);
        u.id = sqlite3_column_int64(s, 0);
        u.task_id = sqlite3_column_int64(s, 1);
        u.peer_id = sqlite3_column_int64(s, 2);
        u.base_version = sqlite3_column_int64(s, 3);
        const char *kind = (const char *)sqlite3_column_text(s, 4);
        snprintf(u.kind, sizeof u.kind, "%s", kind ? kind : "");
        u.num_samples = sqlite3_column_int64(s, 5);
        u.local_steps = sqlite3_column_int64(s, 6);
        u.loss = sqlite3_column_double(s, 7);
        u.nbytes = sqlite3_column_int64(s, 8);
        u.blob = sqlite3_column_blob(s, 9);
        if (u.blob && sqlite3_column_bytes(s, 9) != u.nbytes) {
            q_done(s);
            return vl_fail(err, VL_EDB, "database: update %lld is truncated", (long long)u.id);
        }
        vl_error lost = {0};
        if (!u.blob && sqlite3_column_type(s, 12) != SQLITE_NULL) {
            int rc2 = body_read(&st->bodies, sqlite3_column_int64(s, 12),
                                sqlite3_column_int64(s, 13), u.nbytes, &u.blob, &lost);
            /* A body the disk no longer has is the caller's to set aside;
             * running out of memory is an error like any other. */
            if (rc2 == VL_EDB) {
                u.blob = NULL;
                u.lost = lost.msg;
            } else if (rc2 != VL_OK) {
                *err = lost;
                q_done(s);
                return rc2;
            }
        }
        u.received_at = sqlite3_column_int64(s, 10);
        u.staleness = sqlite3_column_int64(s, 11);
        /* NULL: stored without one (before migration 14). */
        u.has_norm = sqlite3_column_type(s, 14) != SQLITE_NULL;
        if (u.has_norm) u.norm = sqlite3_column_double(s, 14);
        u.merged_version = -1;
        int r = fn(ctx, &u);
        if (r != 0) {
            q_done(s);
            return r;
        }
    }
    int ret = rc == SQLITE_DONE ? VL_OK : q_fail(st, err, "read updates");
    q_done(s);
    return ret;
}

int storage_update_each_pending(storage *st, int64_t base_version, storage_update_fn fn, void *ctx,
                                vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_UPDATE_PENDING, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, base_version);
    return each_update(st, s, fn, ctx, err);
}

int storage_update_each_unmerged(storage *st, storage_update_fn fn, void *ctx, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_UPDATE_UNMERGED, err);
    if (!s) return VL_EDB;
    return each_update(st, s, fn, ctx, err);
}

int storage_update_each_oldest(storage *st, int64_t limit, storage_update_fn fn, void *ctx,
                               vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_UPDATE_OLDEST, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, limit > 0 ? limit : -1);
    return each_update(st, s, fn, ctx, err);
}

int storage_update_count_unmerged(storage *st, int64_t *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_UPDATE_COUNT_UNMERGED, err);
    if (!s) return VL_EDB;
    return q_int(st, s, 0, out, "count unmerged updates", err);
}

int storage_update_count(storage *st, int64_t *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_UPDATE_COUNT, err);
    if (!s) return VL_EDB;
    return q_int(st, s, 0, out, "count updates", err);
}

/* ---- versions ----------------------------------------------------------- */

static void bind_floats(sqlite3_stmt *s, int col, const float *x, size_t n) {
    if (x)
        sqlite3_bind_blob64(s, col, x, (sqlite3_uint64)n * sizeof(float), SQLITE_STATIC);
    else
        sqlite3_bind_null(s, col);
}

static void bind_real(sqlite3_stmt *s, int col, double x) {
    if (isfinite(x))
        sqlite3_bind_double(s, col, x);
    else
        sqlite3_bind_null(s, col);
}

static int version_steps(storage *st, const storage_version *v, const int64_t *update_ids,
                         size_t n_updates, const storage_commit_opts *o, vl_error *err) {
    int64_t keep_versions = o->keep_versions, keep_changes = o->keep_changes;
    sqlite3_stmt *s = q_get(st, Q_VERSION_MAX, err);
    if (!s) return VL_EDB;
    int64_t latest;
    int rc = q_int(st, s, -1, &latest, "latest version", err);
    if (rc != VL_OK) return rc;
    if (v->version != latest + 1)
        return vl_fail(err, VL_ECONFLICT, "version %lld cannot follow version %lld",
                       (long long)v->version, (long long)latest);

    if (!(s = q_get(st, Q_VERSION_INSERT, err))) return VL_EDB;
    sqlite3_bind_int64(s, 1, v->version);
    sqlite3_bind_int64(s, 2, v->created_at);
    bind_floats(s, 3, v->params, v->n);
    bind_floats(s, 4, v->momentum, v->n_state ? v->n_state : v->n);
    bind_real(s, 5, v->val_loss);
    bind_real(s, 6, v->train_loss);
    sqlite3_bind_int64(s, 7, v->num_updates);
    sqlite3_bind_int(s, 8, v->refused ? 1 : 0);
    if (v->refused)
        bind_real(s, 9, v->refused_val_loss);
    else
        sqlite3_bind_null(s, 9);
    /* 0 is what a version made without norms (version 0) holds. */
    if (v->update_norm > 0)
        bind_real(s, 10, v->update_norm);
    else
        sqlite3_bind_null(s, 10);
    if ((rc = q_exec(st, s, "insert version", err)) != VL_OK) return rc;

    if (v->has_change) {
        if (v->change_nnz > (size_t)INT32_MAX / 4)
            return vl_fail(err, VL_EINVAL, "a change of %zu entries is too large to store",
                           v->change_nnz);
        if (!(s = q_get(st, Q_CHANGE_INSERT, err))) return VL_EDB;
        sqlite3_uint64 bytes = (sqlite3_uint64)v->change_nnz * 4;
        static const char empty[1] = {0};
        sqlite3_bind_int64(s, 1, v->version);
        sqlite3_bind_int64(s, 2, (int64_t)v->change_nnz);
        sqlite3_bind_blob64(s, 3, bytes ? (const void *)v->change_idx : empty, bytes,
                            SQLITE_STATIC);
        sqlite3_bind_blob64(s, 4, bytes ? (const void *)v->change_val : empty, bytes,
                            SQLITE_STATIC);
        if ((rc = q_exec(st, s, "insert change", err)) != VL_OK) return rc;
    }

    if ((rc = q_factors_commit(st, v, keep_versions, err)) != VL_OK) return rc;

    for (size_t i = 0; i < n_updates; i++) {
        if (!(s = q_get(st, Q_UPDATE_MERGE, err))) return VL_EDB;
        sqlite3_bind_int64(s, 1, v->version);
        sqlite3_bind_int64(s, 2, update_ids[i]);
        if ((rc = q_exec(st, s, "merge update", err)) != VL_OK) return rc;
        if (q_changes(st) != 1)
            return vl_fail(err, VL_ECONFLICT, "update %lld is unknown or already merged",
                           (long long)update_ids[i]);
    }

    if (o->expire_old_leases) {
        if (!(s = q_get(st, Q_TASK_EXPIRE_OLD, err))) return VL_EDB;
        sqlite3_bind_int64(s, 1, v->version);
        if ((rc = q_exec(st, s, "expire old leases", err)) != VL_OK) return rc;
    }

    if (!(s = q_get(st, Q_RUN_SET_VERSION, err))) return VL_EDB;
    sqlite3_bind_int64(s, 1, v->version);
    sqlite3_bind_text(s, 2, o->finished ? "finished" : "running", -1, SQLITE_STATIC);
    if ((rc = q_exec(st, s, "set current version", err)) != VL_OK) return rc;
    if (q_changes(st) != 1) return vl_fail(err, VL_ENOTFOUND, "the database holds no run");

    if (keep_versions > 0 && v->version >= keep_versions) {
        int64_t upto = v->version - keep_versions;
        if (!(s = q_get(st, Q_VERSION_PRUNE, err))) return VL_EDB;
        sqlite3_bind_int64(s, 1, upto);
        if ((rc = q_exec(st, s, "prune versions", err)) != VL_OK) return rc;
        /* A round belongs to the updates of its base version, which were
         * merged into the next one. */
        if (!(s = q_get(st, Q_VALUES_PRUNE, err))) return VL_EDB;
        sqlite3_bind_int64(s, 1, upto - 1);
        if ((rc = q_exec(st, s, "prune round values", err)) != VL_OK) return rc;
        if (!(s = q_get(st, Q_ROUND_PRUNE, err))) return VL_EDB;
        sqlite3_bind_int64(s, 1, upto - 1);
        if ((rc = q_exec(st, s, "prune rounds", err)) != VL_OK) return rc;
    }
    /* Only merged updates qualify: an update waiting to be merged keeps
     * its blob however old it is. */
    if (o->keep_update_blobs > 0 && v->version >= o->keep_update_blobs) {
        if (!(s = q_get(st, Q_UPDATE_PRUNE, err))) return VL_EDB;
        sqlite3_bind_int64(s, 1, v->version - o->keep_update_blobs);
        if ((rc = q_exec(st, s, "prune updates", err)) != VL_OK) return rc;
        if (!(s = q_get(st, Q_UPDATE_PRUNE_BODIES, err))) return VL_EDB;
        sqlite3_bind_int64(s, 1, v->version - o->keep_update_blobs);
        if ((rc = q_exec(st, s, "prune update bodies", err)) != VL_OK) return rc;
        if ((rc = body_prune(st, err)) != VL_OK) return rc;
    }
    if (keep_changes > 0 && v->version >= keep_changes) {
        if (!(s = q_get(st, Q_CHANGE_PRUNE, err))) return VL_EDB;
        sqlite3_bind_int64(s, 1, v->version - keep_changes);
        if ((rc = q_exec(st, s, "prune changes", err)) != VL_OK) return rc;
    }
    return VL_OK;
}

int storage_version_commit(storage *st, const storage_version *v, const int64_t *update_ids,
                           size_t n_updates, const storage_commit_opts *o, vl_error *err) {
    int nested;
    int rc = q_tx_begin(st, &nested, err);
    if (rc != VL_OK) return rc;
    rc = version_steps(st, v, update_ids, n_updates, o, err);
    if (rc != VL_OK) {
        q_tx_end(st, nested, 0, NULL);
        return rc;
    }
    return q_tx_end(st, nested, 1, err);
}

static int copy_floats(sqlite3_stmt *s, int col, float **out, size_t *n, vl_error *err) {
    *out = NULL;
    const void *p = sqlite3_column_blob(s, col);
    int bytes = sqlite3_column_bytes(s, col);
    if (!p) return VL_OK;
    if (bytes % (int)sizeof(float) != 0 || (*n && (size_t)bytes / sizeof(float) != *n))
        return vl_fail(err, VL_EDB, "database: a stored vector has the wrong size");
    *n = (size_t)bytes / sizeof(float);
    float *x = malloc((size_t)bytes + 1);
    if (!x) return vl_fail(err, VL_ENOMEM, "out of memory reading a version");
    memcpy(x, p, (size_t)bytes);
    *out = x;
    return VL_OK;
}

static double column_real(sqlite3_stmt *s, int col) {
    return sqlite3_column_type(s, col) == SQLITE_NULL ? NAN : sqlite3_column_double(s, col);
}

int storage_version_get(storage *st, int64_t version, int blobs, storage_version *out,
                        vl_error *err) {
    memset(out, 0, sizeof *out);
    sqlite3_stmt *s = q_get(st, Q_VERSION_GET, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, version);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
        q_done(s);
        return vl_fail(err, VL_ENOTFOUND, "no version %lld", (long long)version);
    }
    if (rc != SQLITE_ROW) {
        rc = q_fail(st, err, "read version");
        q_done(s);
        return rc;
    }
    out->version = sqlite3_column_int64(s, 0);
    out->created_at = sqlite3_column_int64(s, 1);
    out->val_loss = column_real(s, 2);
    out->train_loss = column_real(s, 3);
    out->num_updates = sqlite3_column_int64(s, 4);
    rc = VL_OK;
    if (blobs) {
        rc = copy_floats(s, 5, &out->params, &out->n, err);
        if (rc == VL_OK) rc = copy_floats(s, 6, &out->momentum, &out->n_state, err);
    }
    q_done(s);
    if (rc != VL_OK) storage_version_free(out);
    return rc;
}

void storage_version_free(storage_version *v) {
    if (!v) return;
    free(v->params);
    free(v->momentum);
    v->params = NULL;
    v->momentum = NULL;
}

int storage_version_each(storage *st, storage_version_fn fn, void *ctx, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_VERSION_EACH, err);
    if (!s) return VL_EDB;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        storage_version v;
        memset(&v, 0, sizeof v);
        v.version = sqlite3_column_int64(s, 0);
        v.created_at = sqlite3_column_int64(s, 1);
        v.val_loss = column_real(s, 2);
        v.train_loss = column_real(s, 3);
        v.num_updates = sqlite3_column_int64(s, 4);
        v.bytes_per_update = column_real(s, 5);
        v.refused = sqlite3_column_int(s, 6);
        v.refused_val_loss = column_real(s, 7);
        int r = fn(ctx, &v);
        if (r != 0) {
            q_done(s);
            return r;
        }
    }
    int ret = rc == SQLITE_DONE ? VL_OK : q_fail(st, err, "read versions");
    q_done(s);
    return ret;
}

int storage_version_best_loss(storage *st, double *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_VERSION_BEST, err);
    if (!s) return VL_EDB;
    int rc = sqlite3_step(s);
    if (rc != SQLITE_ROW) {
        rc = q_fail(st, err, "best validation loss");
        q_done(s);
        return rc;
    }
    *out = column_real(s, 0);
    q_done(s);
    return VL_OK;
}

int storage_version_set_val_loss(storage *st, int64_t version, double loss, int *changed,
                                 vl_error *err) {
    *changed = 0;
    if (!isfinite(loss))
        return vl_fail(err, VL_EINVAL, "version %lld: a validation loss must be finite",
                       (long long)version);
    sqlite3_stmt *s = q_get(st, Q_VERSION_SET_LOSS, err);
    if (!s) return VL_EDB;
    sqlite3_bind_double(s, 1, loss);
    sqlite3_bind_int64(s, 2, version);
    int rc = q_exec(st, s, "set a version's validation loss", err);
    if (rc == VL_OK) *changed = sqlite3_changes(st->db) > 0;
    return rc;
}

int storage_version_norm_median(storage *st, int64_t upto, double *out, int64_t *count,
                                vl_error *err) {
    *out = NAN;
    *count = 0;
    sqlite3_stmt *s = q_get(st, Q_VERSION_NORMS, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, upto);
    /* Sorted by SQLite; only the middle one or two are kept. */
    double lo = NAN, hi = NAN;
    int64_t n = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) n++;
    if (rc != SQLITE_DONE) {
        rc = q_fail(st, err, "version norms");
        q_done(s);
        return rc;
    }
    sqlite3_reset(s);
    for (int64_t i = 0; i < n && (rc = sqlite3_step(s)) == SQLITE_ROW; i++) {
        if (i == (n - 1) / 2) lo = sqlite3_column_double(s, 0);
        if (i == n / 2) {
            hi = sqlite3_column_double(s, 0);
            break;
        }
    }
    q_done(s);
    if (n > 0) *out = (lo + hi) / 2;
    *count = n;
    return VL_OK;
}

/* ---- changes ------------------------------------------------------------ */

/* Counts the stored changes in (since, until] first, so that a pruned one
 * is reported before the caller has consumed any. */
/* Both passes in one read transaction (one snapshot): between two, a
 * commit could prune a change the first pass counted, and the delta would
 * be short a version with nothing to tell. */
static int change_walk(storage *st, int64_t since, int64_t until, storage_change_fn fn, void *ctx,
                       vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_CHANGE_RANGE, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, since);
    sqlite3_bind_int64(s, 2, until);
    int64_t expect = since + 1;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (sqlite3_column_int64(s, 0) != expect++) break;
    }
    q_done(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return q_fail(st, err, "read changes");
    if (rc == SQLITE_ROW || expect != until + 1)
        return vl_fail(err, VL_ENOTFOUND, "the changes since version %lld are no longer stored",
                       (long long)since);

    if (!(s = q_get(st, Q_CHANGE_RANGE, err))) return VL_EDB;
    sqlite3_bind_int64(s, 1, since);
    sqlite3_bind_int64(s, 2, until);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        storage_change c;
        c.version = sqlite3_column_int64(s, 0);
        int64_t nnz = sqlite3_column_int64(s, 1);
        c.idx = sqlite3_column_blob(s, 2);
        int ib = sqlite3_column_bytes(s, 2);
        c.val = sqlite3_column_blob(s, 3);
        int vb = sqlite3_column_bytes(s, 3);
        if (nnz < 0 || (int64_t)ib != 4 * nnz || (int64_t)vb != 4 * nnz) {
            q_done(s);
            return vl_fail(err, VL_EDB, "database: the change of version %lld is damaged",
                           (long long)c.version);
        }
        c.nnz = (size_t)nnz;
        int r = fn(ctx, &c);
        if (r != 0) {
            q_done(s);
            return r;
        }
    }
    int ret = rc == SQLITE_DONE ? VL_OK : q_fail(st, err, "read changes");
    q_done(s);
    return ret;
}

int storage_change_each(storage *st, int64_t since, int64_t until, storage_change_fn fn, void *ctx,
                        vl_error *err) {
    if (since < 0 || until <= since)
        return vl_fail(err, VL_EINVAL, "no versions between %lld and %lld", (long long)since,
                       (long long)until);
    if (storage_in_transaction(st)) return change_walk(st, since, until, fn, ctx, err);
    int rc = q_run(st, Q_BEGIN_READ, "begin", err);
    if (rc != VL_OK) return rc;
    rc = change_walk(st, since, until, fn, ctx, err);
    /* Nothing was written: ending it either way only lets the snapshot go. */
    if (q_run(st, Q_ROLLBACK, "end read", NULL) != VL_OK)
        vl_log_error("database: ending a read transaction failed: %s", sqlite3_errmsg(st->db));
    return rc;
}
