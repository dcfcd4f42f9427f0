/* The merged K-FAC factors stored with versions. */
#include <stdlib.h>
#include <string.h>

#include "storage/internal.h"

int q_factors_commit(storage *st, const storage_version *v, int64_t keep_versions, vl_error *err) {
    if (!v->factors) return VL_OK;
    if (v->factors_len == 0 || v->factors_len > (size_t)INT32_MAX || v->factors_samples < 1 ||
        v->factors_peers < 1)
        return vl_fail(err, VL_EINVAL,
                       "version %lld: merged factors of %zu bytes from %lld "
                       "updates cannot be stored",
                       (long long)v->version, v->factors_len, (long long)v->factors_peers);
    sqlite3_stmt *s = q_get(st, Q_FACTORS_INSERT, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, v->version);
    sqlite3_bind_int64(s, 2, v->factors_samples);
    sqlite3_bind_int64(s, 3, v->factors_peers);
    sqlite3_bind_blob64(s, 4, v->factors, (sqlite3_uint64)v->factors_len, SQLITE_STATIC);
    int rc = q_exec(st, s, "insert factors", err);
    if (rc != VL_OK || keep_versions <= 0 || v->version < keep_versions) return rc;
    if (!(s = q_get(st, Q_FACTORS_PRUNE, err))) return VL_EDB;
    sqlite3_bind_int64(s, 1, v->version - keep_versions);
    return q_exec(st, s, "prune factors", err);
}

int storage_factors_latest(storage *st, int64_t *version, vl_error *err) {
    sqlite3_stmt *s = q_get(st, Q_FACTORS_LATEST, err);
    if (!s) return VL_EDB;
    int rc = q_int(st, s, -1, version, "latest factors", err);
    if (rc == VL_OK && *version < 0)
        return vl_fail(err, VL_ENOTFOUND, "no version has merged factors");
    return rc;
}

int storage_factors_get(storage *st, int64_t version, uint8_t **blob, size_t *len, int64_t *samples,
                        int64_t *peers, vl_error *err) {
    *blob = NULL;
    *len = 0;
    sqlite3_stmt *s = q_get(st, Q_FACTORS_GET, err);
    if (!s) return VL_EDB;
    sqlite3_bind_int64(s, 1, version);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
        q_done(s);
        return vl_fail(err, VL_ENOTFOUND, "version %lld has no merged factors stored",
                       (long long)version);
    }
    if (rc != SQLITE_ROW) {
        rc = q_fail(st, err, "read factors");
        q_done(s);
        return rc;
    }
    if (samples) *samples = sqlite3_column_int64(s, 0);
    if (peers) *peers = sqlite3_column_int64(s, 1);
    const void *p = sqlite3_column_blob(s, 2);
    int n = sqlite3_column_bytes(s, 2);
    rc = VL_OK;
    if (!p || n <= 0) {
        rc = vl_fail(err, VL_EDB, "database: the factors of version %lld are empty",
                     (long long)version);
    } else if (!(*blob = malloc((size_t)n))) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory reading factors");
    } else {
        memcpy(*blob, p, (size_t)n);
        *len = (size_t)n;
    }
    q_done(s);
    return rc;
}
