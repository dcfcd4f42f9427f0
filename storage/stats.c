/* Read-only summaries for the status endpoint and the operator's CLI:
 * distributions over the stored updates and each peer's activity. */
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
