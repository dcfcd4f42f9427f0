/* Read-only summaries for the status endpoint, the operator's CLI and
 * dashboard: distributions over the stored updates and each peer's
 * activity and totals. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "storage/internal.h"

int storage_update_histogram(storage *st, storage_hist what, storage_count_fn fn, void *ctx,
                             vl_error *err) {
    q_id id = what == STORAGE_HIST_STALENESS ? Q_UPDATE_HIST_STALENESS : Q_UPDATE_HIST_STEPS;
    sqlite3_stmt *s = q_get(st, id, err);
    if (!s) return VL_EDB;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int r = fn(ctx, sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1));
        if (r != 0) {
            q_done(s);
            return r;
        }
    }
    int ret = rc == SQLITE_DONE ? VL_OK : q_fail(st, err, "update histogram");
    q_done(s);
    return ret;
}

int storage_peer_each(storage *st, int64_t now, storage_peer_fn fn, void *ctx, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_PEER_EACH, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, now);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        storage_peer_activity a;
        memset(&a, 0, sizeof a);
        a.id = sqlite3_column_int64(s, 0);
        const char *name = (const char *)sqlite3_column_text(s, 1);
        snprintf(a.name, sizeof a.name, "%s", name ? name : "");
        a.last_seen = sqlite3_column_int64(s, 2);
        a.revoked = sqlite3_column_int(s, 3) != 0;
        a.leases = sqlite3_column_int64(s, 4);
        a.updates = sqlite3_column_int64(s, 5);
        const void *pk = sqlite3_column_blob(s, 6);
        if (pk && sqlite3_column_bytes(s, 6) == STORAGE_PK_BYTES)
            memcpy(a.public_key, pk, STORAGE_PK_BYTES);
        a.joined_at = sqlite3_column_int64(s, 7);
        int r = fn(ctx, &a);
        if (r != 0) {
            q_done(s);
            return r;
        }
    }
    int ret = rc == SQLITE_DONE ? VL_OK : q_fail(st, err, "list peers");
    q_done(s);
    return ret;
}

int storage_peer_totals_each(storage *st, storage_peer_totals_fn fn, void *ctx, vl_error *err) {
    /* Prepared on each call, not kept with the statements the server runs
     * per request (db.c): only the dashboard asks, every few seconds. One
     * pass over updates_by_peer. */
    static const char *SQL =
        "SELECT p.id, p.hardware, count(u.id), count(u.merged_version), avg(u.staleness),"
        " coalesce(sum(u.nbytes), 0)"
        " FROM peers p LEFT JOIN updates u ON u.peer_id = p.id GROUP BY p.id ORDER BY p.id";
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db, SQL, -1, &s, NULL) != SQLITE_OK)
        return q_fail(st, err, "prepare peer totals");
    int rc, ret = VL_OK;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        storage_peer_totals t;
        t.id = sqlite3_column_int64(s, 0);
        const char *hw = (const char *)sqlite3_column_text(s, 1);
        t.hardware = hw ? hw : "";
        t.stored = sqlite3_column_int64(s, 2);
        t.merged = sqlite3_column_int64(s, 3);
        t.mean_staleness =
            sqlite3_column_type(s, 4) == SQLITE_NULL ? NAN : sqlite3_column_double(s, 4);
        t.bytes = sqlite3_column_int64(s, 5);
        if ((ret = fn(ctx, &t)) != 0) break;
    }
    if (ret == VL_OK && rc != SQLITE_DONE) ret = q_fail(st, err, "peer totals");
    sqlite3_finalize(s);
    return ret;
}
