/* Typed queries on the run, join tokens and peers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/internal.h"

static const char *run_status_name(storage_run_status s) {
    return s == STORAGE_RUN_FINISHED ? "finished" : "running";
}

int storage_run_insert(storage *st, const storage_run *run, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_RUN_INSERT, err);
    if (!s) return VL_EDB;
    sqlite3_bind_text(s, 1, run->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, run->config, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, run->corpus_path, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, run->corpus_size);
    sqlite3_bind_text(s, 5, run->corpus_hash, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 6, run->current_version);
    sqlite3_bind_text(s, 7, run_status_name(run->status), -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 8, run->created_at);
    int rc = q_exec(st, s, "insert run", err);
    if (rc == VL_ECONFLICT) return vl_fail(err, VL_ECONFLICT, "the database already holds a run");
    return rc;
}

int storage_run_get(storage *st, storage_run *out, vl_error *err) {
    memset(out, 0, sizeof *out);
    sqlite3_stmt *s = q_get(st, Q_RUN_GET, err);
    if (!s) return VL_EDB;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
        q_done(s);
        return vl_fail(err, VL_ENOTFOUND, "the database holds no run (not initialised)");
    }
    if (rc != SQLITE_ROW) {
        rc = q_fail(st, err, "read run");
        q_done(s);
        return rc;
    }
    const char *name = (const char *)sqlite3_column_text(s, 0);
    const char *hash = (const char *)sqlite3_column_text(s, 4);
    const char *status = (const char *)sqlite3_column_text(s, 6);
    snprintf(out->name, sizeof out->name, "%s", name ? name : "");
    snprintf(out->corpus_hash, sizeof out->corpus_hash, "%s", hash ? hash : "");
    out->corpus_size = sqlite3_column_int64(s, 3);
    out->current_version = sqlite3_column_int64(s, 5);
    out->status =
        status && strcmp(status, "finished") == 0 ? STORAGE_RUN_FINISHED : STORAGE_RUN_RUNNING;
    out->created_at = sqlite3_column_int64(s, 7);
    rc = q_strdup(s, 1, &out->config, err);
    if (rc == VL_OK) rc = q_strdup(s, 2, &out->corpus_path, err);
    q_done(s);
    if (rc != VL_OK) storage_run_free(out);
    return rc;
}

void storage_run_free(storage_run *run) {
    if (!run) return;
    free(run->config);
    free(run->corpus_path);
    run->config = NULL;
    run->corpus_path = NULL;
}

/* ---- tokens ------------------------------------------------------------- */

int storage_token_insert(storage *st, const char *hash_hex, int64_t uses, int64_t expires_at,
                         int64_t now, int64_t *id, vl_error *err) {
    if (uses < 1) return vl_fail(err, VL_EINVAL, "a token needs at least one use");
    sqlite3_stmt *s = q_get(st, Q_TOKEN_INSERT, err);
    if (!s) return VL_EDB;
    sqlite3_bind_text(s, 1, hash_hex, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, uses);
    sqlite3_bind_int64(s, 3, expires_at);
    sqlite3_bind_int64(s, 4, now);
    int rc = q_exec(st, s, "insert token", err);
    if (rc == VL_OK && id) *id = sqlite3_last_insert_rowid(st->db);
    return rc;
}

int storage_token_check(storage *st, const char *hash_hex, int64_t now, int64_t *id,
                        vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TOKEN_CHECK, err);
    if (!s) return VL_EDB;
    sqlite3_bind_text(s, 1, hash_hex, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, now);
    return q_int(st, s, 0, id, "token", err);
}

int storage_token_find(storage *st, const char *hash_hex, int64_t *id, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TOKEN_FIND, err);
    if (!s) return VL_EDB;
    sqlite3_bind_text(s, 1, hash_hex, -1, SQLITE_STATIC);
    return q_int(st, s, 0, id, "token", err);
}

int storage_token_use(storage *st, int64_t id, int64_t now, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TOKEN_USE, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int64(s, 2, now);
    int rc = q_exec(st, s, "use token", err);
    if (rc == VL_OK && q_changes(st) != 1)
        return vl_fail(err, VL_ENOTFOUND, "token is revoked, expired or used up");
    return rc;
}

int storage_token_each(storage *st, storage_token_fn fn, void *ctx, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TOKEN_EACH, err);
    if (!s) return VL_EDB;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        storage_token t;
        memset(&t, 0, sizeof t);
        t.id = sqlite3_column_int64(s, 0);
        const char *hash = (const char *)sqlite3_column_text(s, 1);
        snprintf(t.hash_prefix, sizeof t.hash_prefix, "%s", hash ? hash : "");
        t.uses_left = sqlite3_column_int64(s, 2);
        t.expires_at = sqlite3_column_int64(s, 3);
        t.created_at = sqlite3_column_int64(s, 4);
        t.revoked = sqlite3_column_int(s, 5) != 0;
        t.peers = sqlite3_column_int64(s, 6);
        int r = fn(ctx, &t);
        if (r != 0) {
            q_done(s);
            return r;
        }
    }
    int ret = rc == SQLITE_DONE ? VL_OK : q_fail(st, err, "list tokens");
    q_done(s);
    return ret;
}

int storage_token_revoke(storage *st, int64_t id, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_TOKEN_REVOKE, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, id);
    int rc = q_exec(st, s, "revoke token", err);
    if (rc == VL_OK && q_changes(st) != 1)
        return vl_fail(err, VL_ENOTFOUND, "no token %lld", (long long)id);
    return rc;
}

/* ---- peers -------------------------------------------------------------- */

int storage_peer_insert(storage *st, const uint8_t public_key[STORAGE_PK_BYTES], const char *name,
                        const char *hardware_json, int64_t token_id, int64_t now, int64_t *id,
                        vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_PEER_INSERT, err);
    if (!s) return VL_EDB;
    sqlite3_bind_blob(s, 1, public_key, STORAGE_PK_BYTES, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, hardware_json, -1, SQLITE_STATIC);
    if (token_id > 0)
        sqlite3_bind_int64(s, 4, token_id);
    else
        sqlite3_bind_null(s, 4);
    sqlite3_bind_int64(s, 5, now);
    sqlite3_bind_int64(s, 6, now);
    int rc = q_exec(st, s, "insert peer", err);
    if (rc == VL_ECONFLICT) return vl_fail(err, VL_ECONFLICT, "this key is already registered");
    if (rc == VL_OK && id) *id = sqlite3_last_insert_rowid(st->db);
    return rc;
}

static int read_peer(storage *st, sqlite3_stmt *s, storage_peer *out, vl_error *err) {
    memset(out, 0, sizeof *out);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
        q_done(s);
        return vl_fail(err, VL_ENOTFOUND, "no such peer");
    }
    if (rc != SQLITE_ROW) {
        rc = q_fail(st, err, "read peer");
        q_done(s);
        return rc;
    }
    out->id = sqlite3_column_int64(s, 0);
    const void *pk = sqlite3_column_blob(s, 1);
    if (pk && sqlite3_column_bytes(s, 1) == STORAGE_PK_BYTES)
        memcpy(out->public_key, pk, STORAGE_PK_BYTES);
    out->token_id = sqlite3_column_int64(s, 4);
    out->joined_at = sqlite3_column_int64(s, 5);
    out->last_seen = sqlite3_column_int64(s, 6);
    out->revoked = sqlite3_column_int(s, 7) != 0;
    rc = q_strdup(s, 2, &out->name, err);
    if (rc == VL_OK) rc = q_strdup(s, 3, &out->hardware, err);
    q_done(s);
    if (rc != VL_OK) storage_peer_free(out);
    return rc;
}

int storage_peer_get(storage *st, int64_t id, storage_peer *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_PEER_GET, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, id);
    return read_peer(st, s, out, err);
}

int storage_peer_find_key(storage *st, const uint8_t public_key[STORAGE_PK_BYTES],
                          storage_peer *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_PEER_FIND_KEY, err);
    if (!s) return VL_EDB;
    sqlite3_bind_blob(s, 1, public_key, STORAGE_PK_BYTES, SQLITE_STATIC);
    return read_peer(st, s, out, err);
}

void storage_peer_free(storage_peer *p) {
    if (!p) return;
    free(p->name);
    free(p->hardware);
    p->name = NULL;
    p->hardware = NULL;
}

int storage_peer_touch(storage *st, int64_t id, int64_t now, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_PEER_TOUCH, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, now);
    sqlite3_bind_int64(s, 2, id);
    return q_exec(st, s, "touch peer", err);
}

int storage_peer_revoke(storage *st, int64_t id, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_PEER_REVOKE, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, id);
    int rc = q_exec(st, s, "revoke peer", err);
    if (rc == VL_OK && q_changes(st) != 1)
        return vl_fail(err, VL_ENOTFOUND, "no peer %lld", (long long)id);
    return rc;
}

int storage_peer_set_key(storage *st, int64_t id, const uint8_t old_pk[STORAGE_PK_BYTES],
                         const uint8_t new_pk[STORAGE_PK_BYTES], vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_PEER_SET_KEY, err);
    if (!s) return VL_EDB;
    sqlite3_bind_blob(s, 1, new_pk, STORAGE_PK_BYTES, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, id);
    sqlite3_bind_blob(s, 3, old_pk, STORAGE_PK_BYTES, SQLITE_STATIC);
    int rc = q_exec(st, s, "set peer key", err);
    if (rc == VL_ECONFLICT)
        return vl_fail(err, VL_ECONFLICT, "the new key is registered already or retired");
    if (rc == VL_OK && q_changes(st) != 1)
        return vl_fail(err, VL_ENOTFOUND, "peer %lld is unknown, revoked, or has another key now",
                       (long long)id);
    return rc;
}

int storage_key_retired(storage *st, const uint8_t public_key[STORAGE_PK_BYTES], int *out,
                        vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_KEY_RETIRED, err);
    if (!s) return VL_EDB;
    sqlite3_bind_blob(s, 1, public_key, STORAGE_PK_BYTES, SQLITE_STATIC);
    int64_t n = 0;
    int rc = q_int(st, s, 0, &n, "retired key", err);
    if (rc == VL_OK) *out = n > 0;
    return rc;
}

int storage_peer_count(storage *st, int64_t *out, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_PEER_COUNT, err);
    if (!s) return VL_EDB;
    return q_int(st, s, 0, out, "count peers", err);
}
