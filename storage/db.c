/* Opening the database, migrations, transactions and the statement cache. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/internal.h"

#define BUSY_TIMEOUT_MS 5000

/* Column lists shared by the statements that read whole rows, in the order
 * read_task and read_update expect. An update's body lives in update_blobs
 * (no column names clash, so the list reads the same over the join). */
#define TASK_COLS                                                                            \
    "id, peer_id, base_version, data_offset, data_length, seed, issued_at, deadline, state," \
    " coalesce(reissue_of, 0)"
#define UPDATE_COLS                                                                           \
    "id, task_id, peer_id, base_version, kind, num_samples, local_steps, loss, nbytes, blob," \
    " received_at, staleness, seg, off, norm"
#define UPDATE_FROM                                        \
    "updates LEFT JOIN update_blobs b ON b.update_id = id" \
    " LEFT JOIN update_bodies s ON s.update_id = id"

static const char *const SQL[Q_COUNT] = {
    [Q_BEGIN] = "BEGIN IMMEDIATE",
    [Q_BEGIN_READ] = "BEGIN DEFERRED",
    [Q_COMMIT] = "COMMIT",
    [Q_ROLLBACK] = "ROLLBACK",
    [Q_SAVEPOINT] = "SAVEPOINT storage_atomic",
    [Q_RELEASE] = "RELEASE storage_atomic",
    [Q_ROLLBACK_TO] = "ROLLBACK TO storage_atomic",
    [Q_JOB_SAVEPOINT] = "SAVEPOINT storage_job",
    [Q_JOB_RELEASE] = "RELEASE storage_job",
    [Q_JOB_ROLLBACK_TO] = "ROLLBACK TO storage_job",
    [Q_RUN_INSERT] = "INSERT INTO run (id, name, config, corpus_path, corpus_size, corpus_hash,"
                     " current_version, status, created_at) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?)",
    [Q_RUN_GET] = "SELECT name, config, corpus_path, corpus_size, corpus_hash, current_version,"
                  " status, created_at FROM run WHERE id = 1",
    [Q_RUN_SET_VERSION] = "UPDATE run SET current_version = ?, status = ? WHERE id = 1",
    [Q_TOKEN_INSERT] = "INSERT INTO tokens (hash, uses_left, expires_at, created_at)"
                       " VALUES (?, ?, ?, ?)",
    [Q_TOKEN_CHECK] = "SELECT id FROM tokens WHERE hash = ? AND revoked = 0 AND uses_left > 0"
                      " AND expires_at > ?",
    [Q_TOKEN_FIND] = "SELECT id FROM tokens WHERE hash = ? AND revoked = 0",
    [Q_TOKEN_USE] = "UPDATE tokens SET uses_left = uses_left - 1 WHERE id = ? AND uses_left > 0"
                    " AND revoked = 0 AND expires_at > ?",
    [Q_KEY_RETIRED] = "SELECT count(*) FROM retired_keys WHERE public_key = ?",
    [Q_PEER_INSERT] = "INSERT INTO peers (public_key, name, hardware, token_id, joined_at,"
                      " last_seen) VALUES (?, ?, ?, ?, ?, ?)",
    [Q_PEER_GET] = "SELECT id, public_key, name, hardware, token_id, joined_at, last_seen,"
                   " revoked FROM peers WHERE id = ?",
    [Q_PEER_FIND_KEY] = "SELECT id, public_key, name, hardware, token_id, joined_at, last_seen,"
                        " revoked FROM peers WHERE public_key = ?",
    [Q_PEER_TOUCH] = "UPDATE peers SET last_seen = max(last_seen, ?) WHERE id = ?",
    [Q_PEER_REVOKE] = "UPDATE peers SET revoked = 1 WHERE id = ?",
    [Q_PEER_COUNT] = "SELECT count(*) FROM peers",
    [Q_TASK_NEXT_ID] = "SELECT coalesce(max(id), 0) + 1 FROM tasks",
    [Q_TASK_INSERT] = "INSERT INTO tasks (id, peer_id, base_version, data_offset, data_length,"
                      " seed, issued_at, deadline, state, reissue_of)"
                      " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    [Q_TASK_GET] = "SELECT " TASK_COLS " FROM tasks WHERE id = ?",
    [Q_TASK_FIND_LEASE] = "SELECT " TASK_COLS " FROM tasks WHERE peer_id = ? AND"
                          " base_version = ? AND state = 'leased' AND deadline > ?"
                          " ORDER BY id LIMIT 1",
    [Q_TASK_FIND_ANY_LEASE] = "SELECT " TASK_COLS " FROM tasks WHERE peer_id = ? AND"
                              " state = 'leased' AND deadline > ? AND id != ? ORDER BY id"
                              " LIMIT 1",
    [Q_TASK_COUNT_LEASED] = "SELECT count(*) FROM tasks WHERE state = 'leased' AND deadline > ?",
    [Q_TASK_NEXT_DEADLINE_ANY] = "SELECT min(deadline) FROM tasks WHERE state = 'leased' AND"
                                 " deadline > ?",
    [Q_TASK_TAKE_EXPIRED] = "SELECT " TASK_COLS " FROM tasks WHERE state = 'expired' AND"
                            " reissued = 0 AND NOT EXISTS (SELECT 1 FROM updates u WHERE"
                            " u.task_id = tasks.id) ORDER BY id LIMIT 1",
    [Q_TASK_MARK_REISSUED] = "UPDATE tasks SET reissued = 1 WHERE id = ? AND reissued = 0",
    [Q_TASK_COUNT_SLOTS] = "SELECT count(*) FROM tasks WHERE base_version = ? AND"
                           " (state = 'done' OR (state = 'leased' AND deadline > ?))",
    [Q_TASK_COUNT_DONE] = "SELECT count(*) FROM tasks WHERE base_version = ? AND state = 'done'",
    [Q_TASK_NEXT_DEADLINE] = "SELECT min(deadline) FROM tasks WHERE base_version = ? AND"
                             " state = 'leased' AND deadline > ?",
    [Q_TASK_EXPIRE] = "UPDATE tasks SET state = 'expired' WHERE state = 'leased' AND"
                      " deadline <= ?",
    [Q_TASK_EXPIRE_OLD] = "UPDATE tasks SET state = 'expired' WHERE state = 'leased' AND"
                          " base_version < ?",
    [Q_TASK_SET_STATE] = "UPDATE tasks SET state = ? WHERE id = ?",
    [Q_TASK_RELEASE] = "UPDATE tasks SET state = 'expired' WHERE id = ? AND peer_id = ? AND"
                       " state = 'leased'",
    [Q_UPDATE_INSERT] = "INSERT INTO updates (task_id, peer_id, base_version, kind, num_samples,"
                        " local_steps, loss, nbytes, received_at, staleness, norm)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    [Q_UPDATE_BLOB_INSERT] = "INSERT INTO update_blobs (update_id, blob) VALUES (?, ?)",
    [Q_UPDATE_BODY_INSERT] = "INSERT INTO update_bodies (update_id, seg, off) VALUES (?, ?, ?)",
    [Q_UPDATE_PRUNE_BODIES] = "DELETE FROM update_bodies WHERE update_id IN"
                              " (SELECT id FROM updates WHERE merged_version <= ?)",
    [Q_BODY_SEG_USED] = "SELECT 1 FROM update_bodies WHERE seg = ? LIMIT 1",
    [Q_UPDATE_EXISTS] = "SELECT count(*) FROM updates WHERE task_id = ?",
    [Q_UPDATE_PENDING] = "SELECT " UPDATE_COLS " FROM " UPDATE_FROM
                         " WHERE base_version = ? AND merged_version IS NULL ORDER BY id",
    [Q_UPDATE_UNMERGED] =
        "SELECT " UPDATE_COLS " FROM " UPDATE_FROM " WHERE merged_version IS NULL ORDER BY id",
    [Q_UPDATE_OLDEST] = "SELECT " UPDATE_COLS " FROM " UPDATE_FROM
                        " WHERE merged_version IS NULL ORDER BY id LIMIT ?",
    [Q_UPDATE_COUNT_UNMERGED] = "SELECT count(*) FROM updates WHERE merged_version IS NULL",
    [Q_UPDATE_HIST_STEPS] = "SELECT local_steps, count(*) FROM updates GROUP BY local_steps"
                            " ORDER BY local_steps",
    [Q_UPDATE_HIST_STALENESS] = "SELECT staleness, count(*) FROM updates GROUP BY staleness"
                                " ORDER BY staleness",
    [Q_PEER_EACH] = "SELECT p.id, p.name, p.last_seen, p.revoked,"
                    " (SELECT count(*) FROM tasks t WHERE t.peer_id = p.id AND"
                    "  t.state = 'leased' AND t.deadline > ?),"
                    " (SELECT count(*) FROM updates u WHERE u.peer_id = p.id),"
                    " p.public_key, p.joined_at"
                    " FROM peers p ORDER BY p.id",
    [Q_UPDATE_COUNT] = "SELECT count(*) FROM updates",
    [Q_UPDATE_MERGE] = "UPDATE updates SET merged_version = ?1, staleness = ?1 - 1 - base_version"
                       " WHERE id = ?2 AND merged_version IS NULL",
    [Q_UPDATE_PRUNE] = "DELETE FROM update_blobs WHERE update_id IN"
                       " (SELECT id FROM updates WHERE merged_version <= ?)",
    [Q_VERSION_MAX] = "SELECT max(version) FROM versions",
    [Q_VERSION_INSERT] = "INSERT INTO versions (version, created_at, params, momentum, val_loss,"
                         " train_loss, num_updates, refused, refused_val_loss, update_norm)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    [Q_VERSION_BEST] = "SELECT min(val_loss) FROM versions",
    [Q_VERSION_SET_LOSS] =
        "UPDATE versions SET val_loss = ? WHERE version = ? AND val_loss IS NULL",
    [Q_VERSION_NORMS] = "SELECT update_norm FROM versions WHERE version BETWEEN 1 AND ?"
                        " AND update_norm IS NOT NULL ORDER BY update_norm",
    [Q_VERSION_GET] = "SELECT version, created_at, val_loss, train_loss, num_updates, params,"
                      " momentum FROM versions WHERE version = ?",
    [Q_VERSION_EACH] = "SELECT version, created_at, val_loss, train_loss, num_updates,"
                       " (SELECT avg(nbytes) FROM updates WHERE merged_version = version),"
                       " refused, refused_val_loss FROM versions ORDER BY version",
    [Q_CHANGE_INSERT] = "INSERT INTO changes (version, nnz, indices, vals) VALUES (?, ?, ?, ?)",
    [Q_CHANGE_RANGE] = "SELECT version, nnz, indices, vals FROM changes WHERE version > ? AND"
                       " version <= ? ORDER BY version",
    [Q_CHANGE_PRUNE] = "DELETE FROM changes WHERE version <= ?",
    [Q_UPDATE_FIND] = "SELECT id, base_version, merged_version FROM updates WHERE task_id = ?",
    [Q_ROUND_INSERT] = "INSERT INTO rounds (version, n, candidates, opened_at, deadline)"
                       " VALUES (?, ?, ?, ?, ?)",
    [Q_ROUND_GET] = "SELECT n, candidates, opened_at, deadline FROM rounds WHERE version = ?",
    [Q_ROUND_PRUNE] = "DELETE FROM rounds WHERE version <= ?",
    [Q_VALUES_INSERT] = "INSERT INTO round_values (update_id, version, n, vals, received_at)"
                        " VALUES (?, ?, ?, ?, ?)",
    [Q_VALUES_COUNT] = "SELECT count(*) FROM round_values WHERE version = ?",
    [Q_VALUES_HAS] = "SELECT count(*) FROM round_values WHERE update_id = ?",
    [Q_VALUES_EACH] = "SELECT update_id, n, vals FROM round_values WHERE version = ?"
                      " ORDER BY update_id",
    [Q_VALUES_PRUNE] = "DELETE FROM round_values WHERE version <= ?",
    [Q_TOKEN_EACH] = "SELECT t.id, t.hash, t.uses_left, t.expires_at, t.created_at, t.revoked,"
                     " (SELECT count(*) FROM peers p WHERE p.token_id = t.id)"
                     " FROM tokens t ORDER BY t.id",
    [Q_TOKEN_REVOKE] = "UPDATE tokens SET revoked = 1 WHERE id = ?",
    [Q_PEER_SET_KEY] = "UPDATE peers SET public_key = ? WHERE id = ? AND public_key = ? AND"
                       " revoked = 0",
    [Q_VERSION_PRUNE] = "UPDATE versions SET params = NULL, momentum = NULL WHERE version <= ?"
                        " AND (params IS NOT NULL OR momentum IS NOT NULL)",
    [Q_FACTORS_INSERT] = "INSERT INTO factors (version, samples, peers, blob) VALUES (?, ?, ?, ?)",
    [Q_FACTORS_GET] = "SELECT samples, peers, blob FROM factors WHERE version = ?",
    [Q_FACTORS_LATEST] = "SELECT max(version) FROM factors",
    [Q_FACTORS_PRUNE] = "DELETE FROM factors WHERE version <= ?",
};

sqlite3_stmt *q_get(storage *st, q_id id, vl_error *err) {
    sqlite3_stmt *s = st->stmts[id];
    if (!s) {
        int rc = sqlite3_prepare_v3(st->db, SQL[id], -1, SQLITE_PREPARE_PERSISTENT, &s, NULL);
        if (rc != SQLITE_OK) {
            vl_fail(err, VL_EDB, "database: cannot prepare statement: %s", sqlite3_errmsg(st->db));
            return NULL;
        }
        st->stmts[id] = s;
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return s;
}

void q_done(sqlite3_stmt *s) {
    if (s) sqlite3_reset(s);
}

/* SQLite says SQLITE_FULL when a write finds no room (or the
 * max_page_count); a sync or truncate that fails for want of room comes as
 * an I/O error whose errno says so. */
static int is_full(sqlite3 *db) {
    int ext = sqlite3_extended_errcode(db);
    if ((ext & 0xff) == SQLITE_FULL) return 1;
    int e = sqlite3_system_errno(db);
    return (ext & 0xff) == SQLITE_IOERR && (e == ENOSPC || e == EDQUOT);
}

int q_fail(storage *st, vl_error *err, const char *what) {
    if (is_full(st->db))
        return vl_fail(err, VL_EFULL, "disk full writing %s: database: %s: %s", st->name, what,
                       sqlite3_errmsg(st->db));
    return vl_fail(err, VL_EDB, "database: %s: %s", what, sqlite3_errmsg(st->db));
}

int q_exec(storage *st, sqlite3_stmt *s, const char *what, vl_error *err) {
    int rc = sqlite3_step(s);
    int ext = sqlite3_extended_errcode(st->db);
    int out = VL_OK;
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        if ((ext & 0xff) == SQLITE_CONSTRAINT &&
            (ext == SQLITE_CONSTRAINT_UNIQUE || ext == SQLITE_CONSTRAINT_PRIMARYKEY))
            out = vl_fail(err, VL_ECONFLICT, "database: %s: already exists", what);
        else if (ext == SQLITE_CONSTRAINT_TRIGGER)
            out = vl_fail(err, VL_ECONFLICT, "database: %s: %s", what, sqlite3_errmsg(st->db));
        else
            out = q_fail(st, err, what);
    }
    sqlite3_reset(s);
    return out;
}

int q_int(storage *st, sqlite3_stmt *s, int64_t null_value, int64_t *out, const char *what,
          vl_error *err) {
    int rc = sqlite3_step(s);
    int ret = VL_OK;
    if (rc == SQLITE_ROW) {
        *out = sqlite3_column_type(s, 0) == SQLITE_NULL ? null_value : sqlite3_column_int64(s, 0);
    } else if (rc == SQLITE_DONE) {
        ret = vl_fail(err, VL_ENOTFOUND, "database: %s: not found", what);
    } else {
        ret = q_fail(st, err, what);
    }
    sqlite3_reset(s);
    return ret;
}

int64_t q_changes(storage *st) {
    return sqlite3_changes64(st->db);
}

int q_strdup(sqlite3_stmt *s, int col, char **out, vl_error *err) {
    const unsigned char *t = sqlite3_column_text(s, col);
    int n = sqlite3_column_bytes(s, col);
    char *p = malloc((size_t)n + 1);
    if (!p) return vl_fail(err, VL_ENOMEM, "database: out of memory");
    if (n > 0 && t) memcpy(p, t, (size_t)n);
    p[n] = '\0';
    *out = p;
    return VL_OK;
}

static int run_simple(storage *st, q_id id, const char *what, vl_error *err) {
    sqlite3_stmt *s = q_get(st, id, err);
    if (!s) return VL_EDB;
    return q_exec(st, s, what, err);
}

int q_run(storage *st, q_id id, const char *what, vl_error *err) {
    return run_simple(st, id, what, err);
}

int storage_begin(storage *st, vl_error *err) {
    if (!sqlite3_get_autocommit(st->db))
        return vl_fail(err, VL_EDB, "database: a transaction is already open");
    return run_simple(st, Q_BEGIN, "begin", err);
}

int storage_commit(storage *st, vl_error *err) {
    /* Bodies first: a committed row must never point at bytes the disk
     * might not have. */
    int rc = body_sync(&st->bodies, err);
    if (rc == VL_OK) rc = run_simple(st, Q_COMMIT, "commit", err);
    if (rc != VL_OK)
        storage_rollback(st);
    else
        body_committed(&st->bodies);
    return rc;
}

void storage_rollback(storage *st) {
    if (!st || sqlite3_get_autocommit(st->db)) return;
    body_rolled_back(&st->bodies);
    /* Statements still stepping would keep the transaction open. */
    for (int i = 0; i < Q_COUNT; i++)
        if (st->stmts[i]) sqlite3_reset(st->stmts[i]);
    if (run_simple(st, Q_ROLLBACK, "rollback", NULL) != VL_OK)
        vl_log_error("database: rollback failed: %s", sqlite3_errmsg(st->db));
}

int storage_in_transaction(storage *st) {
    return !sqlite3_get_autocommit(st->db);
}

int q_tx_begin(storage *st, int *nested, vl_error *err) {
    *nested = storage_in_transaction(st);
    return run_simple(st, *nested ? Q_SAVEPOINT : Q_BEGIN, "begin", err);
}

int q_tx_end(storage *st, int nested, int ok, vl_error *err) {
    if (!nested) {
        if (ok) return storage_commit(st, err);
        storage_rollback(st);
        return VL_OK;
    }
    /* A full disk (or an I/O error) may have made SQLite roll back the
     * whole transaction, savepoints and all: nothing is left to undo. */
    if (!ok && !storage_in_transaction(st)) return VL_OK;
    if (!ok && run_simple(st, Q_ROLLBACK_TO, "rollback to savepoint", NULL) != VL_OK)
        vl_log_error("database: rollback to savepoint failed: %s", sqlite3_errmsg(st->db));
    int rc = run_simple(st, Q_RELEASE, "release savepoint", err);
    return ok ? rc : VL_OK;
}

int storage_savepoint(storage *st, vl_error *err) {
    if (!storage_in_transaction(st))
        return vl_fail(err, VL_EDB, "database: a savepoint needs an open transaction");
    return run_simple(st, Q_JOB_SAVEPOINT, "savepoint", err);
}

int storage_savepoint_end(storage *st, int ok, vl_error *err) {
    /* The failed statement rolled back the whole transaction (SQLite does
     * on SQLITE_FULL and I/O errors): the savepoint is gone with it, and
     * so is every job's work before it. */
    if (!storage_in_transaction(st)) {
        body_rolled_back(&st->bodies);
        return vl_fail(err, VL_EDB, "database: the transaction was rolled back by the failure");
    }
    if (!ok) {
        /* A failed statement may still be mid-step. */
        for (int i = 0; i < Q_COUNT; i++)
            if (st->stmts[i]) sqlite3_reset(st->stmts[i]);
        if (run_simple(st, Q_JOB_ROLLBACK_TO, "rollback to savepoint", err) != VL_OK) return VL_EDB;
    }
    return run_simple(st, Q_JOB_RELEASE, "release savepoint", err);
}

int storage_user_version(storage *st, int *out, vl_error *err) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK)
        return q_fail(st, err, "user_version");
    int rc = sqlite3_step(s);
    int ret = VL_OK;
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int(s, 0);
    else
        ret = q_fail(st, err, "user_version");
    sqlite3_finalize(s);
    return ret;
}

/* A migration and the user_version bump that records it commit together,
 * so a crash or a failing statement leaves the previous version intact. */
static int apply_one(storage *st, const storage_migration *m, vl_error *err) {
    char *msg = NULL;
    if (sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, &msg) != SQLITE_OK) {
        vl_fail(err, VL_EDB, "database: migration %d: begin: %s", m->version,
                msg ? msg : "unknown error");
        sqlite3_free(msg);
        return VL_EDB;
    }
    char bump[64];
    snprintf(bump, sizeof bump, "PRAGMA user_version = %d", m->version);
    if (sqlite3_exec(st->db, m->sql, NULL, NULL, &msg) != SQLITE_OK ||
        sqlite3_exec(st->db, bump, NULL, NULL, &msg) != SQLITE_OK) {
        vl_fail(err, VL_EDB, "database: migration %d failed: %s", m->version,
                msg ? msg : "unknown error");
        sqlite3_free(msg);
        sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
        return VL_EDB;
    }
    if (sqlite3_exec(st->db, "COMMIT", NULL, NULL, &msg) != SQLITE_OK) {
        vl_fail(err, VL_EDB, "database: migration %d: commit: %s", m->version,
                msg ? msg : "unknown error");
        sqlite3_free(msg);
        sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
        return VL_EDB;
    }
    return VL_OK;
}

int storage_migrate_with(storage *st, const storage_migration *migrations, size_t n,
                         vl_error *err) {
    int cur;
    int rc = storage_user_version(st, &cur, err);
    if (rc != VL_OK) return rc;
    if (n > 0 && cur > migrations[n - 1].version)
        return vl_fail(err, VL_EDB,
                       "database schema version %d is newer than this program knows (%d)", cur,
                       migrations[n - 1].version);
    for (size_t i = 0; i < n; i++) {
        if (migrations[i].version != (int)i + 1)
            return vl_fail(err, VL_EINVAL, "migration list is not numbered 1, 2, ...");
        if (migrations[i].version <= cur) continue;
        rc = apply_one(st, &migrations[i], err);
        if (rc != VL_OK) return rc;
        vl_log_debug("database: applied migration %d", migrations[i].version);
    }
    return VL_OK;
}

static int pragma(storage *st, const char *sql, vl_error *err) {
    char *msg = NULL;
    if (sqlite3_exec(st->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        vl_fail(err, VL_EDB, "database: %s: %s", sql, msg ? msg : "unknown error");
        sqlite3_free(msg);
        return VL_EDB;
    }
    return VL_OK;
}

/* journal_mode answers with the mode actually in force; a file on a
 * filesystem without shared memory support silently stays in rollback
 * mode, which we refuse rather than run with weaker guarantees. */
static int enable_wal(storage *st, vl_error *err) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db, "PRAGMA journal_mode=WAL", -1, &s, NULL) != SQLITE_OK)
        return q_fail(st, err, "journal_mode");
    int ret = VL_OK;
    if (sqlite3_step(s) != SQLITE_ROW) {
        ret = q_fail(st, err, "journal_mode");
    } else {
        const char *mode = (const char *)sqlite3_column_text(s, 0);
        if (!mode || strcmp(mode, "wal") != 0)
            ret = vl_fail(err, VL_EDB, "database: cannot enable WAL mode (got %s)",
                          mode ? mode : "nothing");
    }
    sqlite3_finalize(s);
    return ret;
}

/* The database holds token hashes and peer keys: 0600 whatever the umask
 * (fchmod, since open's mode only ever loses bits to it). SQLite gives
 * the -wal and -shm files it creates the database file's mode. */
static int create_file(const char *path, vl_error *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST) return VL_OK;
        return vl_fail(err, VL_EIO, "cannot create %s: %s", path, strerror(errno));
    }
    if (fchmod(fd, 0600) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return vl_fail(err, VL_EIO, "cannot set the mode of %s: %s", path, strerror(e));
    }
    close(fd);
    return VL_OK;
}

int storage_open(const char *path, int create, storage **out, vl_error *err) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno != ENOENT)
            return vl_fail(err, VL_EIO, "cannot stat %s: %s", path, strerror(errno));
        if (!create) return vl_fail(err, VL_ENOTFOUND, "database %s does not exist", path);
        int rc = create_file(path, err);
        if (rc != VL_OK) return rc;
    } else if (!S_ISREG(sb.st_mode)) {
        return vl_fail(err, VL_EINVAL, "database %s is not a regular file", path);
    }
    storage *st = calloc(1, sizeof *st);
    if (!st) return vl_fail(err, VL_ENOMEM, "out of memory");
    body_init(&st->bodies, path);
    const char *slash = strrchr(path, '/');
    snprintf(st->name, sizeof st->name, "%s", slash ? slash + 1 : path);
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW;
    if (sqlite3_open_v2(path, &st->db, flags, NULL) != SQLITE_OK) {
        vl_fail(err, VL_EDB, "cannot open database %s: %s", path,
                st->db ? sqlite3_errmsg(st->db) : "out of memory");
        sqlite3_close(st->db);
        free(st);
        return VL_EDB;
    }
    sqlite3_extended_result_codes(st->db, 1);
    sqlite3_busy_timeout(st->db, BUSY_TIMEOUT_MS);
    size_t nmig;
    const storage_migration *mig = storage_builtin_migrations(&nmig);
    int rc = enable_wal(st, err);
    if (rc == VL_OK) rc = pragma(st, "PRAGMA synchronous=FULL", err);
    if (rc == VL_OK) rc = pragma(st, "PRAGMA foreign_keys=ON", err);
    /* The journal of a savepoint (each writer job runs in one) holds the
     * old content of pages it reuses; in memory it costs no file writes. */
    if (rc == VL_OK) rc = pragma(st, "PRAGMA temp_store=MEMORY", err);
    if (rc == VL_OK) rc = storage_migrate_with(st, mig, nmig, err);
    if (rc != VL_OK) {
        storage_close(st);
        return rc;
    }
    *out = st;
    return VL_OK;
}

/* Runs after each commit in place of the automatic checkpoint: only notes
 * how large the WAL has grown, for whoever runs the checkpoints. */
static int count_wal(void *arg, sqlite3 *db, const char *name, int frames) {
    (void)db;
    (void)name;
    ((storage *)arg)->wal_frames = frames;
    return SQLITE_OK;
}

int storage_set_autocheckpoint(storage *st, int pages, vl_error *err) {
    if (pages < 0) return vl_fail(err, VL_EINVAL, "autocheckpoint pages must be >= 0");
    if (sqlite3_wal_autocheckpoint(st->db, pages) != SQLITE_OK)
        return q_fail(st, err, "wal_autocheckpoint");
    /* Both are the connection's one WAL hook: the counter replaces none. */
    st->wal_frames = 0;
    if (pages == 0) sqlite3_wal_hook(st->db, count_wal, st);
    return VL_OK;
}

int storage_wal_frames(const storage *st) {
    return st->wal_frames;
}

int storage_checkpoint(storage *st, int *wal_pages, int *done_pages, vl_error *err) {
    int log = 0, done = 0;
    int rc = sqlite3_wal_checkpoint_v2(st->db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
    /* BUSY only means another connection was checkpointing at the time. */
    if (rc != SQLITE_OK && rc != SQLITE_BUSY) return q_fail(st, err, "checkpoint");
    if (wal_pages) *wal_pages = log;
    if (done_pages) *done_pages = done;
    return VL_OK;
}

int storage_integrity_check(storage *st, vl_error *err) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db, "PRAGMA integrity_check(1)", -1, &s, NULL) != SQLITE_OK)
        return q_fail(st, err, "integrity_check");
    int rc = VL_OK;
    if (sqlite3_step(s) != SQLITE_ROW) {
        rc = q_fail(st, err, "integrity_check");
    } else {
        const char *r = (const char *)sqlite3_column_text(s, 0);
        if (!r || strcmp(r, "ok") != 0)
            rc = vl_fail(err, VL_EDB, "database: integrity_check: %s", r ? r : "no answer");
    }
    sqlite3_finalize(s);
    return rc;
}

void storage_close(storage *st) {
    if (!st) return;
    storage_rollback(st);
    for (int i = 0; i < Q_COUNT; i++) sqlite3_finalize(st->stmts[i]);
    if (sqlite3_close(st->db) != SQLITE_OK)
        vl_log_error("database: close failed: %s", sqlite3_errmsg(st->db));
    body_close(&st->bodies);
    free(st);
}
