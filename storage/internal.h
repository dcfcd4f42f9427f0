/* Private to storage/: the handle, the statement cache and small helpers
 * shared by the query files. */
#ifndef VOLLEY_STORAGE_INTERNAL_H
#define VOLLEY_STORAGE_INTERNAL_H

#include <sqlite3.h>

#include "storage/storage.h"

/* Every statement the module runs, prepared once on first use and kept for
 * the life of the handle. */
typedef enum {
    Q_BEGIN,
    Q_COMMIT,
    Q_ROLLBACK,
    Q_SAVEPOINT,
    Q_RELEASE,
    Q_ROLLBACK_TO,
    Q_JOB_SAVEPOINT,
    Q_JOB_RELEASE,
    Q_JOB_ROLLBACK_TO,
    Q_RUN_INSERT,
    Q_RUN_GET,
    Q_RUN_SET_VERSION,
    Q_TOKEN_INSERT,
    Q_TOKEN_CHECK,
    Q_TOKEN_FIND,
    Q_TOKEN_USE,
    Q_PEER_INSERT,
    Q_PEER_GET,
    Q_PEER_FIND_KEY,
    Q_PEER_TOUCH,
    Q_PEER_REVOKE,
    Q_PEER_COUNT,
    Q_TASK_NEXT_ID,
    Q_TASK_INSERT,
    Q_TASK_GET,
    Q_TASK_FIND_LEASE,
    Q_TASK_COUNT_SLOTS,
    Q_TASK_COUNT_DONE,
    Q_TASK_NEXT_DEADLINE,
    Q_TASK_EXPIRE,
    Q_TASK_EXPIRE_OLD,
    Q_TASK_SET_STATE,
    Q_TASK_RELEASE,
    Q_TASK_FIND_ANY_LEASE,
    Q_TASK_COUNT_LEASED,
    Q_TASK_NEXT_DEADLINE_ANY,
    Q_TASK_TAKE_EXPIRED,
    Q_TASK_MARK_REISSUED,
    Q_UPDATE_INSERT,
    Q_UPDATE_BLOB_INSERT,
    Q_UPDATE_BODY_INSERT,
    Q_UPDATE_PRUNE_BODIES,
    Q_BODY_SEG_USED,
    Q_UPDATE_EXISTS,
    Q_UPDATE_PENDING,
    Q_UPDATE_UNMERGED,
    Q_UPDATE_OLDEST,
    Q_UPDATE_COUNT_UNMERGED,
    Q_UPDATE_HIST_STEPS,
    Q_UPDATE_HIST_STALENESS,
    Q_PEER_EACH,
    Q_UPDATE_COUNT,
    Q_UPDATE_MERGE,
    Q_UPDATE_PRUNE,
    Q_VERSION_MAX,
    Q_VERSION_INSERT,
    Q_VERSION_GET,
    Q_VERSION_EACH,
    Q_VERSION_BEST,
    Q_VERSION_SET_LOSS,
    Q_VERSION_NORMS,
    Q_BEGIN_READ,
    Q_KEY_RETIRED,
    Q_VERSION_PRUNE,
    Q_CHANGE_INSERT,
    Q_CHANGE_RANGE,
    Q_CHANGE_PRUNE,
    Q_UPDATE_FIND,
    Q_ROUND_INSERT,
    Q_ROUND_GET,
    Q_ROUND_PRUNE,
    Q_VALUES_INSERT,
    Q_VALUES_COUNT,
    Q_VALUES_HAS,
    Q_VALUES_EACH,
    Q_VALUES_PRUNE,
    Q_TOKEN_EACH,
    Q_TOKEN_REVOKE,
    Q_PEER_SET_KEY,
    Q_FACTORS_INSERT,
    Q_FACTORS_GET,
    Q_FACTORS_LATEST,
    Q_FACTORS_PRUNE,
    Q_COUNT
} q_id;

/* Update bodies: append-only segment files in "<database>-bodies/"
 * (bodies.c, which says why). Each connection appends to a segment of its
 * own and reads through a few cached descriptors. */
#define BODY_READ_FDS 4
/* Unused segments one transaction notes for deletion (more wait for the
 * next prune). */
#define BODY_PRUNE_MAX 256

typedef struct body_files {
    char dir[4096];
    int wfd; /* segment appended to, -1 before the first append */
    int64_t wseg;
    uint64_t wsize;
    int dirty; /* wfd has bytes not yet fdatasynced */
    /* A failed append could not make the transaction's earlier appends
     * durable: the transaction must not commit (body_sync fails it). */
    int lost;
    int dir_dirty; /* a segment was created since the directory's last fsync */
    int direct;    /* wfd is written with O_DIRECT, in whole aligned blocks */
    uint8_t *abuf; /* aligned staging for direct writes */
    size_t acap;
    int rfd[BODY_READ_FDS];
    int64_t rseg[BODY_READ_FDS];
    size_t rnext;
    uint8_t *rbuf; /* the last body read */
    size_t rcap;
    /* Segments a transaction found unused (its deletions of rows still
     * uncommitted), deleted by a later write transaction once that one
     * committed (ready): deleted at once, a rollback or a power cut before
     * the commit would leave committed rows pointing at no file. */
    int64_t prune[BODY_PRUNE_MAX];
    size_t n_prune;
    int prune_ready;
} body_files;

struct storage {
    sqlite3 *db;
    sqlite3_stmt *stmts[Q_COUNT];
    body_files bodies;
    int wal_frames; /* the WAL's size after the last commit, when counted */
    char name[128]; /* the database file's name, for messages */
};

/* The prepared statement for id, reset and with bindings cleared; NULL (and
 * err set) if it cannot be prepared. */
sqlite3_stmt *q_get(storage *st, q_id id, vl_error *err);
/* Resets s after use so it holds no lock or reference into a row. */
void q_done(sqlite3_stmt *s);
/* Records the connection's last error as VL_EDB (VL_EFULL when the
 * disk is full), prefixed with what. */
int q_fail(storage *st, vl_error *err, const char *what);
/* Steps s once expecting no row (SQLITE_DONE); a constraint violation is
 * VL_ECONFLICT. Resets s in every case. */
int q_exec(storage *st, sqlite3_stmt *s, const char *what, vl_error *err);
/* Steps statement id (no parameters, no rows: BEGIN, COMMIT, ...). */
int q_run(storage *st, q_id id, const char *what, vl_error *err);
/* Steps s expecting one row with one integer column; no row is
 * VL_ENOTFOUND, a NULL value gives null_value. Resets s. */
int q_int(storage *st, sqlite3_stmt *s, int64_t null_value, int64_t *out, const char *what,
          vl_error *err);
/* Rows changed by the last statement. */
int64_t q_changes(storage *st);
/* Duplicates column col of the current row as a heap string (never NULL on
 * success; SQL NULL becomes ""). */
int q_strdup(sqlite3_stmt *s, int col, char **out, vl_error *err);

/* Sets up b for the database at db_path; touches no file. */
void body_init(body_files *b, const char *db_path);
/* Closes b's files; b may be set up again with body_init. */
void body_close(body_files *b);
/* Appends len bytes to this connection's segment (inside a write
 * transaction only) and gives where they went. Not durable before
 * body_sync, which storage_commit calls. */
int body_append(body_files *b, const void *data, size_t len, int64_t *seg, int64_t *off,
                vl_error *err);
/* Makes every append since the last call durable (and a new segment's
 * directory entry). */
int body_sync(body_files *b, vl_error *err);
/* Reads len bytes at (seg, off); *out points into b and stays valid until
 * the next body_read on b. VL_EDB when the bytes are gone for good (no
 * such segment, or it ends before them), VL_EIO for a failure that may
 * pass. */
int body_read(body_files *b, int64_t seg, int64_t off, int64_t len, const uint8_t **out,
              vl_error *err);
/* Inside the caller's write transaction (so no other connection is
 * appending): deletes the segment files the last committed transaction
 * found unused, if they still are, and notes the segments no update
 * points at any more in this one's view, for the next. */
int body_prune(storage *st, vl_error *err);
/* After a commit: the segments the transaction noted may go at the next
 * body_prune. */
void body_committed(body_files *b);
/* After a rollback: forgets what the transaction noted or lost. */
void body_rolled_back(body_files *b);
/* Sets *out to 1 when no update body row, in this transaction's view,
 * points into segment seg (work.c; body_prune decides with it). */
int q_body_seg_unused(storage *st, int64_t seg, int *out, vl_error *err);
/* The part of a version commit that stores v's merged K-FAC factors (when
 * it has them) and prunes factors older than keep_versions below it
 * (factors.c). */
int q_factors_commit(storage *st, const storage_version *v, int64_t keep_versions, vl_error *err);

/* The built-in migrations (schema.c), versions ascending from 1. */
const storage_migration *storage_builtin_migrations(size_t *n);

/* Opens an atomic section: BEGIN IMMEDIATE in autocommit mode, a savepoint
 * inside a caller's transaction. *nested records which, for q_tx_end. */
int q_tx_begin(storage *st, int *nested, vl_error *err);
/* Ends the section opened by q_tx_begin: commits (or releases) when ok is
 * set, else rolls it back. Returns the commit's result when ok. */
int q_tx_end(storage *st, int nested, int ok, vl_error *err);

#endif
