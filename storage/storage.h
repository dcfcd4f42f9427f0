/*
 * storage: every durable fact of a coordinator, in one SQLite database,
 * except the bytes of update bodies: those are appended to segment files
 * in the directory "<database>-bodies/" (made durable before the
 * transaction that points at them commits), because WAL mode would write
 * each of them twice. The directory belongs with the database file: copy
 * or move both.
 *
 * The database runs in WAL mode with synchronous=FULL, so a transaction that
 * has committed survives a crash or power loss: the coordinator acknowledges
 * an upload only after the transaction holding it commits. The schema is
 * created and upgraded by numbered migrations tracked in PRAGMA user_version;
 * each migration runs in its own transaction, so a failure leaves the file
 * at the previous version. All access goes through typed functions backed by
 * cached prepared statements; nothing outside this module sees SQL.
 *
 * Transactions: functions that write one row run in autocommit mode unless
 * the caller opened a transaction with storage_begin, in which case they
 * join it. storage_version_commit always makes its changes atomically, on its
 * own or inside the caller's transaction.
 *
 * Floats in BLOB columns (params, momentum) are raw little-endian IEEE-754
 * binary32, the layout of the model's flat parameter vector.
 */
#ifndef VOLLEY_STORAGE_H
#define VOLLEY_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"


/* An open database. Not thread safe: one storage per thread. */
typedef struct storage storage;

/* ---- opening, migrations, transactions ---------------------------------- */

/* Opens the database at path. With create set, a missing file is created
 * with mode 0600 (the owner alone may read peers' keys and updates);
 * without it a missing file is VL_ENOTFOUND. Sets WAL, synchronous=FULL,
 * foreign keys and a busy timeout, then applies pending migrations. On
 * success *out is owned by the caller (storage_close). */
int storage_open(const char *path, int create, storage **out, vl_error *err) VL_MUST_CHECK;

/* Runs SQLite's integrity_check over the whole database: VL_OK when it
 * answers ok, else VL_EDB with its first complaint in err. */
int storage_integrity_check(storage *st, vl_error *err) VL_MUST_CHECK;

/* Closes the database, rolling back a transaction left open. NULL is a
 * no-op. */
void storage_close(storage *st);

/* How many WAL pages a commit on this connection may leave before that
 * commit copies them back into the database itself (SQLite's
 * wal_autocheckpoint; default 1000). 0 turns it off, for a connection whose
 * commits must not wait for a checkpoint while another one runs them. */
int storage_set_autocheckpoint(storage *st, int pages, vl_error *err) VL_MUST_CHECK;

/* With the automatic checkpoint turned off (storage_set_autocheckpoint 0):
 * how many frames the WAL held after this connection's last commit, so the
 * caller can checkpoint once it is large rather than after every commit.
 * 0 before the first commit, and always while the automatic one is on. */
int storage_wal_frames(const storage *st);

/* A passive checkpoint: copies whatever committed pages the WAL holds back
 * into the database file, neither waiting for nor blocking writers and
 * readers. *wal_pages gets the WAL's size in pages and *done_pages how many
 * of them are in the database now (either may be NULL). */
int storage_checkpoint(storage *st, int *wal_pages, int *done_pages, vl_error *err) VL_MUST_CHECK;

/* A numbered schema migration: the SQL that takes the schema from
 * version - 1 to version. */
typedef struct storage_migration {
    int version;
    const char *sql;
} storage_migration;

/* Schema version the built-in migrations reach. */
int storage_schema_version(void);

/* Current PRAGMA user_version of the open database. */
int storage_user_version(storage *st, int *out, vl_error *err) VL_MUST_CHECK;

/* Inside an open transaction, a savepoint that one unit of work can be
 * undone to without the rest: storage_savepoint_end releases it when ok
 * is set and otherwise first rolls back to it. Savepoints do not nest
 * with each other (storage_version_commit nests inside one). When a
 * failed statement made SQLite roll back the whole transaction (it does
 * on SQLITE_FULL and I/O errors), storage_savepoint_end returns VL_EDB:
 * nothing of the transaction is left, and the caller must not commit. */
int storage_savepoint(storage *st, vl_error *err) VL_MUST_CHECK;
int storage_savepoint_end(storage *st, int ok, vl_error *err) VL_MUST_CHECK;

/* For tests: applies the given migrations (versions ascending, starting at
 * 1) instead of the built-in ones, each in its own transaction. A failing
 * migration is rolled back and the database stays at the version before it;
 * the return value is then VL_EDB. The list is borrowed for the call. */
int storage_migrate_with(storage *st, const storage_migration *migrations, size_t n,
                         vl_error *err) VL_MUST_CHECK;

/* Opens an explicit write transaction (BEGIN IMMEDIATE, so the write lock is
 * taken up front and a later statement cannot fail with SQLITE_BUSY on lock
 * upgrade). Transactions do not nest. */
int storage_begin(storage *st, vl_error *err) VL_MUST_CHECK;
/* Commits the transaction opened by storage_begin. On failure the
 * transaction is rolled back before returning. */
int storage_commit(storage *st, vl_error *err) VL_MUST_CHECK;
/* Rolls back the open transaction; a no-op when none is open. */
void storage_rollback(storage *st);
/* 1 while an explicit transaction is open. */
int storage_in_transaction(storage *st);

/* ---- the server's lock ----------------------------------------------------- */

/* An advisory lock (flock) on the file "<database>-lock" beside the
 * database, held by the one process that may run the run: `serve`, and
 * `init` while it creates the database. Commands of one short transaction
 * need none. The kernel drops it when its holder exits, crash included. */
typedef struct storage_lock storage_lock;

/* Writes "<db_path>-lock" into out (cap bytes); VL_ETOOBIG when it does not
 * fit. */
int storage_lock_path(const char *db_path, char *out, size_t cap, vl_error *err) VL_MUST_CHECK;

/* Takes the lock of the database at db_path without waiting, creating the
 * lock file (mode 0600) when missing, and writes this process's pid and
 * command line into it. VL_ECONFLICT when another process holds it, err
 * then naming that process ("run.db is in use by process 1234
 * (volley-coordinator serve --db run.db ...)"); VL_EIO when the file cannot
 * be opened or locked. Touches nothing but the lock file. On success *out
 * is the caller's (storage_lock_release). */
int storage_lock_take(const char *db_path, storage_lock **out, vl_error *err) VL_MUST_CHECK;

/* Empties the lock file and drops the lock. NULL is a no-op. */
void storage_lock_release(storage_lock *l);

/* ---- run ---------------------------------------------------------------- */

#define STORAGE_NAME_MAX 64

typedef enum { STORAGE_RUN_RUNNING = 0, STORAGE_RUN_FINISHED = 1 } storage_run_status;

/* The single run a database holds. config and corpus_path are heap strings
 * owned by the struct (storage_run_free). */
typedef struct storage_run {
    char name[STORAGE_NAME_MAX];
    char *config;      /* normalised run configuration, JSON */
    char *corpus_path; /* absolute path of the corpus file */
    int64_t corpus_size;
    char corpus_hash[65]; /* hex BLAKE2b-256 of the corpus */
    int64_t current_version;
    storage_run_status status;
    int64_t created_at;
} storage_run;

/* Inserts the run row. VL_ECONFLICT when the database already holds one. The
 * struct is only read; current_version and status are taken from it. */
int storage_run_insert(storage *st, const storage_run *run, vl_error *err) VL_MUST_CHECK;
/* Reads the run into *out (caller frees with storage_run_free).
 * VL_ENOTFOUND when the database has not been initialised. */
int storage_run_get(storage *st, storage_run *out, vl_error *err) VL_MUST_CHECK;
/* Releases the strings of a run read by storage_run_get. */
void storage_run_free(storage_run *run);

/* ---- tokens ------------------------------------------------------------- */

/* Stores a join token by the hex hash of its text; the token itself is never
 * stored. *id (may be NULL) receives the row id. */
int storage_token_insert(storage *st, const char *hash_hex, int64_t uses, int64_t expires_at,
                         int64_t now, int64_t *id, vl_error *err) VL_MUST_CHECK;
/* Looks up a token by hash and checks it can still be used at now: not
 * revoked, not expired, uses left. VL_ENOTFOUND for an unknown, expired,
 * revoked or used-up token (callers must not tell these apart to clients).
 * *id receives the row id. */
int storage_token_check(storage *st, const char *hash_hex, int64_t now, int64_t *id,
                        vl_error *err) VL_MUST_CHECK;
/* Id of the unrevoked token with this hash whatever its uses and expiry
 * (VL_ENOTFOUND if none): lets a peer whose join reply was lost join again
 * with the one-use token that registered it. */
int storage_token_find(storage *st, const char *hash_hex, int64_t *id, vl_error *err) VL_MUST_CHECK;
/* Takes one use of token id, which must still be usable at now: not
 * revoked, not expired, a use left (VL_ENOTFOUND otherwise). Run it in the
 * transaction that inserts the peer, so a token revoked or expiring
 * between the request's check and its commit admits nobody. */
int storage_token_use(storage *st, int64_t id, int64_t now, vl_error *err) VL_MUST_CHECK;

/* A stored join token as the operator sees it: never the token itself,
 * which is not stored, only the start of its hash to tell tokens apart. */
typedef struct storage_token {
    int64_t id;
    char hash_prefix[13]; /* first 12 hex digits of the token's hash */
    int64_t uses_left;
    int64_t expires_at;
    int64_t created_at;
    int revoked;
    int64_t peers; /* peers it registered */
} storage_token;
/* Called once per token, by id; non-zero stops the walk and is returned. */
typedef int (*storage_token_fn)(void *ctx, const storage_token *t);
/* Walks every stored token, by id. */
int storage_token_each(storage *st, storage_token_fn fn, void *ctx, vl_error *err) VL_MUST_CHECK;
/* Revokes token id: from now on it admits nobody, not even a key it
 * registered before (peers it registered stay registered). Revoking a
 * revoked token again is no error; VL_ENOTFOUND if there is no such
 * token. */
int storage_token_revoke(storage *st, int64_t id, vl_error *err) VL_MUST_CHECK;

/* ---- peers -------------------------------------------------------------- */

#define STORAGE_PK_BYTES 32

/* A registered peer. name and hardware are heap strings owned by the struct
 * (storage_peer_free). */
typedef struct storage_peer {
    int64_t id;
    uint8_t public_key[STORAGE_PK_BYTES];
    char *name;
    char *hardware; /* JSON object */
    int64_t token_id;
    int64_t joined_at;
    int64_t last_seen;
    int revoked;
} storage_peer;

/* Inserts a peer; *id receives its id. VL_ECONFLICT when the key is already
 * registered. Strings are copied. */
int storage_peer_insert(storage *st, const uint8_t public_key[STORAGE_PK_BYTES], const char *name,
                        const char *hardware_json, int64_t token_id, int64_t now, int64_t *id,
                        vl_error *err) VL_MUST_CHECK;
/* Reads peer id into *out (caller frees with storage_peer_free);
 * VL_ENOTFOUND if there is no such peer. */
int storage_peer_get(storage *st, int64_t id, storage_peer *out, vl_error *err) VL_MUST_CHECK;
/* Reads the peer with this public key; VL_ENOTFOUND if none. */
int storage_peer_find_key(storage *st, const uint8_t public_key[STORAGE_PK_BYTES],
                          storage_peer *out, vl_error *err) VL_MUST_CHECK;
/* Releases the strings of a peer read by storage_peer_get/find_key. */
void storage_peer_free(storage_peer *p);
/* Records activity of peer id at now. */
int storage_peer_touch(storage *st, int64_t id, int64_t now, vl_error *err) VL_MUST_CHECK;
/* Marks peer id revoked (every later request is refused with 403).
 * VL_ENOTFOUND if there is no such peer. */
int storage_peer_revoke(storage *st, int64_t id, vl_error *err) VL_MUST_CHECK;
/* *out = 1 when public_key was some peer's key before a rotation (retired:
 * no peer may take it again), else 0. */
int storage_key_retired(storage *st, const uint8_t public_key[STORAGE_PK_BYTES], int *out,
                        vl_error *err) VL_MUST_CHECK;
/* Key rotation: replaces peer id's public key old_pk by new_pk, provided
 * the peer is not revoked and old_pk is still its key. VL_ENOTFOUND when
 * that does not hold (unknown or revoked peer, or its key changed
 * meanwhile); VL_ECONFLICT when new_pk is registered to a peer already or
 * retired. old_pk is retired for good (schema migration 10). */
int storage_peer_set_key(storage *st, int64_t id, const uint8_t old_pk[STORAGE_PK_BYTES],
                         const uint8_t new_pk[STORAGE_PK_BYTES], vl_error *err) VL_MUST_CHECK;
/* Number of registered peers, revoked ones included. */
int storage_peer_count(storage *st, int64_t *out, vl_error *err) VL_MUST_CHECK;

/* ---- tasks -------------------------------------------------------------- */

typedef enum {
    STORAGE_TASK_LEASED = 0,
    STORAGE_TASK_DONE = 1,
    STORAGE_TASK_EXPIRED = 2,
} storage_task_state;

typedef struct storage_task {
    int64_t id;
    int64_t peer_id;
    int64_t base_version;
    int64_t data_offset;
    int64_t data_length;
    int64_t seed;
    int64_t issued_at;
    int64_t deadline; /* the lease ends when the clock reaches it */
    storage_task_state state;
    int64_t reissue_of; /* 0, or the expired task whose data this one redoes */
} storage_task;

/* The id the next inserted task will get. Call inside the transaction that
 * inserts it, so that nothing else can take the id in between. */
int storage_task_next_id(storage *st, int64_t *out, vl_error *err) VL_MUST_CHECK;
/* Inserts t (t->id > 0 to choose the id, 0 for the next free one); *id
 * (may be NULL) receives the id. */
int storage_task_insert(storage *st, const storage_task *t, int64_t *id,
                        vl_error *err) VL_MUST_CHECK;
/* Reads task id into *out; VL_ENOTFOUND if none. */
int storage_task_get(storage *st, int64_t id, storage_task *out, vl_error *err) VL_MUST_CHECK;
/* The oldest task of peer_id for base_version that is leased with deadline
 * after now; VL_ENOTFOUND if none. */
int storage_task_find_lease(storage *st, int64_t peer_id, int64_t base_version, int64_t now,
                            storage_task *out, vl_error *err) VL_MUST_CHECK;
/* The oldest leased task of peer_id other than task except (0: none
 * excepted), whatever its base version, with deadline after now (async
 * runs); VL_ENOTFOUND if none. A peer whose upload of task except is
 * still on its way asks for its next lease past that one. */
int storage_task_find_any_lease(storage *st, int64_t peer_id, int64_t now, int64_t except,
                                storage_task *out, vl_error *err) VL_MUST_CHECK;
/* Leased tasks of every version whose deadline is after now. */
int storage_task_count_leased(storage *st, int64_t now, int64_t *out, vl_error *err) VL_MUST_CHECK;
/* Earliest deadline after now among leased tasks of every version; 0 when
 * there is none. */
int storage_task_next_deadline_any(storage *st, int64_t now, int64_t *out,
                                   vl_error *err) VL_MUST_CHECK;
/* The oldest task whose lease expired with no update and whose data no
 * other task has taken over yet: marks it reissued and copies it into
 * *out, so the caller can hand its data range and seed to a new task
 * (run it in the transaction that inserts that task). VL_ENOTFOUND when
 * there is none. */
int storage_task_take_expired(storage *st, storage_task *out, vl_error *err) VL_MUST_CHECK;
/* Counts the tasks for base_version that hold a slot at now: done ones and
 * leased ones whose deadline is after now. */
int storage_task_count_slots(storage *st, int64_t base_version, int64_t now, int64_t *out,
                             vl_error *err) VL_MUST_CHECK;
/* Counts the done tasks for base_version. */
int storage_task_count_done(storage *st, int64_t base_version, int64_t *out,
                            vl_error *err) VL_MUST_CHECK;
/* Earliest deadline after now among leased tasks for base_version, or 0 in
 * *out when there is none. */
int storage_task_next_deadline(storage *st, int64_t base_version, int64_t now, int64_t *out,
                               vl_error *err) VL_MUST_CHECK;
/* Marks every leased task whose deadline is at or before now as expired;
 * *n (may be NULL) receives how many. */
int storage_task_expire(storage *st, int64_t now, int64_t *n, vl_error *err) VL_MUST_CHECK;
/* Ends peer_id's lease of task id now, before its deadline, as if it had
 * expired (its data goes to a later task): only while the task is leased
 * to that peer, so an update stored meanwhile keeps it done. *n (may be
 * NULL) receives 1 when it was released, 0 when there was nothing to
 * release. */
int storage_task_release(storage *st, int64_t id, int64_t peer_id, int64_t *n,
                         vl_error *err) VL_MUST_CHECK;
/* Sets the state of task id. VL_ENOTFOUND if there is no such task. */
int storage_task_set_state(storage *st, int64_t id, storage_task_state state,
                           vl_error *err) VL_MUST_CHECK;

/* ---- updates ------------------------------------------------------------ */

#define STORAGE_KIND_MAX 16

/* An uploaded update. blob points to nbytes of the update as received; on
 * insert it is only read, on reads it points into storage-owned memory that
 * stays valid only during the callback it was handed to. */
typedef struct storage_update {
    int64_t id;
    int64_t task_id;
    int64_t peer_id;
    int64_t base_version;
    char kind[STORAGE_KIND_MAX];
    int64_t num_samples;
    int64_t local_steps;
    double loss;
    int64_t nbytes;
    const uint8_t *blob; /* NULL once pruned, or when it cannot be read */
    /* Only set by the update walks: why the stored body cannot be read
     * (its segment is missing or short after a disk fault), with blob
     * NULL; NULL otherwise. Valid during the callback. */
    const char *lost;
    int64_t received_at;
    int64_t merged_version; /* -1 while not merged */
    /* Versions made between base_version and the version the update is
     * merged into: the current version minus base_version on arrival,
     * raised to (merged_version - 1) - base_version when it is merged. */
    int64_t staleness;
    /* The update's L2 norm, compress_update_norm of its body as decoded
     * when it was accepted, when has_norm is set (schema migration 14).
     * Unset for updates stored before that migration, and by a caller
     * that did not compute it: the merge computes the norm itself then. */
    int has_norm;
    double norm;
} storage_update;

/* Inserts u (id and merged_version are ignored); *id (may be NULL) receives
 * the id. VL_ECONFLICT if the task already has an update; VL_EINVAL when
 * has_norm is set with a norm that is negative or not finite. */
int storage_update_insert(storage *st, const storage_update *u, int64_t *id,
                          vl_error *err) VL_MUST_CHECK;
/* Sets *out to 1 if task_id has an update, else 0. */
int storage_update_exists(storage *st, int64_t task_id, int *out, vl_error *err) VL_MUST_CHECK;

/* Called once per row; returning non-zero stops the walk and becomes the
 * walk's return value. The row and its blob are valid only during the
 * call. */
typedef int (*storage_update_fn)(void *ctx, const storage_update *u);
/* Calls fn for every update based on base_version that is not merged yet,
 * in id order, blob included. */
int storage_update_each_pending(storage *st, int64_t base_version, storage_update_fn fn, void *ctx,
                                vl_error *err) VL_MUST_CHECK;
/* Calls fn for every update not merged yet, whatever its base version, in
 * id order, blob included. */
int storage_update_each_unmerged(storage *st, storage_update_fn fn, void *ctx,
                                 vl_error *err) VL_MUST_CHECK;
/* Like storage_update_each_unmerged, but only the limit oldest (lowest
 * id) of them; limit <= 0 means all. An async version merges exactly its
 * buffer's worth, oldest first, so an update that arrives while a merge
 * is computed waits for the next version rather than making this one
 * larger. */
int storage_update_each_oldest(storage *st, int64_t limit, storage_update_fn fn, void *ctx,
                               vl_error *err) VL_MUST_CHECK;
/* Number of updates not merged yet. */
int storage_update_count_unmerged(storage *st, int64_t *out, vl_error *err) VL_MUST_CHECK;
/* Total number of updates stored. */
int storage_update_count(storage *st, int64_t *out, vl_error *err) VL_MUST_CHECK;

/* ---- versions ----------------------------------------------------------- */

/* A model version. params holds n floats and momentum, the outer
 * optimiser's state, n_state floats (NULL: zeros; its layout is the
 * aggregator's, e.g. momentum and error vectors or sketches). When read
 * with storage_version_get they are heap copies owned by the struct
 * (storage_version_free), NULL once pruned; when passed to
 * storage_version_commit they are only read. */
typedef struct storage_version {
    int64_t version;
    int64_t created_at;
    float *params;
    float *momentum;
    size_t n;
    size_t n_state;    /* on commit, 0 means n */
    double val_loss;   /* NaN when unknown */
    double train_loss; /* NaN for version 0 */
    int64_t num_updates;
    /* Only filled in by storage_version_each: the mean body size of the
     * updates merged into it, as uploaded (NaN for version 0, or once
     * they are gone). */
    double bytes_per_update;
    /* A refused version (its candidate's validation loss blew up) keeps
     * its predecessor's parameters; refused_val_loss is what the candidate
     * scored (NaN: not a number). Read back by storage_version_each only. */
    int refused;
    double refused_val_loss;
    /* Only read by storage_version_commit: the median L2 norm of the
     * updates it merged, as sent, each over the square root of its local
     * steps (0 or NaN: none, or not known). */
    double update_norm;
    /* Only read by storage_version_commit: what this version changed,
     * theta_v - theta_(v-1), as change_nnz ascending indices and values.
     * Stored when has_change is set (every version but 0). */
    int has_change;
    const uint32_t *change_idx;
    const float *change_val;
    size_t change_nnz;
    /* Only read by storage_version_commit: the merged K-FAC factors of the
     * updates this version merged (a compress_factors_encode_file file of
     * factors_len bytes), the samples behind them and how many updates'
     * factors they average. NULL: none. */
    const uint8_t *factors;
    size_t factors_len;
    int64_t factors_samples, factors_peers;
} storage_version;

/* What a version commit keeps and does besides inserting the version. */
typedef struct storage_commit_opts {
    /* Params and momentum of versions at or below v - keep_versions are
     * set NULL, with the second rounds of the updates based on the
     * versions before them (<= 0 keeps all). */
    int64_t keep_versions;
    /* Changes of versions at or below v - keep_changes are deleted. */
    int64_t keep_changes;
    /* Blobs of updates merged into versions at or below v -
     * keep_update_blobs are set NULL; an unmerged update keeps its blob
     * however old. */
    int64_t keep_update_blobs;
    int finished;          /* the run ends with this version */
    int expire_old_leases; /* sync runs: leases on older versions end now */
} storage_commit_opts;

/* Atomically: inserts version v->version with its params, momentum,
 * change and merged factors (when it has them, which also prunes the
 * factors of versions at or below v - keep_versions, so the newest factors
 * stay whatever later versions lack), marks each of the n_updates updates merged into it (each must
 * exist and be unmerged, else VL_ECONFLICT), expires leases still held on
 * older versions when o asks, sets the run's current version to it (it
 * must be the current version + 1, or 0 for the first), marks the run
 * finished when o says so, and prunes as o says. Version 0 is stored the
 * same way with no updates. On any failure nothing of it is visible.
 * Inside a caller's transaction it runs in a savepoint. */
int storage_version_commit(storage *st, const storage_version *v, const int64_t *update_ids,
                           size_t n_updates, const storage_commit_opts *o,
                           vl_error *err) VL_MUST_CHECK;
/* Reads version into *out; with blobs set also copies params and momentum
 * (either NULL when pruned or absent). Caller frees with
 * storage_version_free. VL_ENOTFOUND if the version was never made. */
int storage_version_get(storage *st, int64_t version, int blobs, storage_version *out,
                        vl_error *err) VL_MUST_CHECK;
/* Releases the blobs of a version read by storage_version_get. */
void storage_version_free(storage_version *v);

/* Called once per version, oldest first, without blobs; non-zero stops the
 * walk and becomes its return value. */
typedef int (*storage_version_fn)(void *ctx, const storage_version *v);
/* Walks all versions, oldest first, without blobs. */
int storage_version_each(storage *st, storage_version_fn fn, void *ctx,
                         vl_error *err) VL_MUST_CHECK;

/* The median, over versions 1 to upto that recorded one, of each
 * version's median update norm (storage_version.update_norm), into *out
 * (NaN when none did); *count receives how many did. */
int storage_version_norm_median(storage *st, int64_t upto, double *out, int64_t *count,
                                vl_error *err) VL_MUST_CHECK;

/* Records the validation loss of a version committed without one (a
 * version served after the loss check and scored in full afterwards):
 * sets versions.val_loss where it is NULL. *changed is 1 when it did, 0
 * when the version has a loss already or does not exist. loss must be
 * finite (VL_EINVAL otherwise). Writer connection only. */
int storage_version_set_val_loss(storage *st, int64_t version, double loss, int *changed,
                                 vl_error *err) VL_MUST_CHECK;

/* The lowest validation loss of any version (refused ones record their
 * predecessor's), into *out; NaN when no version has one. */
int storage_version_best_loss(storage *st, double *out, vl_error *err) VL_MUST_CHECK;

/* The update stored for task_id: its id, base version and the version it
 * was merged into (-1 while pending). VL_ENOTFOUND when the task has none. */
int storage_update_find(storage *st, int64_t task_id, int64_t *id, int64_t *base_version,
                        int64_t *merged_version, vl_error *err) VL_MUST_CHECK;

/* ---- K-FAC factors (factors.c) ---------------------------------------------- */

/* The newest version that has merged factors stored; VL_ENOTFOUND when
 * none has. */
int storage_factors_latest(storage *st, int64_t *version, vl_error *err) VL_MUST_CHECK;
/* The merged factors of version: *blob gets a heap copy of the file (the
 * caller frees it) of *len bytes; samples and peers (either may be NULL)
 * what was stored with it. VL_ENOTFOUND when that version has none (never,
 * or pruned). */
int storage_factors_get(storage *st, int64_t version, uint8_t **blob, size_t *len, int64_t *samples,
                        int64_t *peers, vl_error *err) VL_MUST_CHECK;

/* ---- summaries (stats.c) ------------------------------------------------- */

typedef enum { STORAGE_HIST_LOCAL_STEPS = 0, STORAGE_HIST_STALENESS = 1 } storage_hist;
/* Called per distinct value with how many updates have it, ascending. */
typedef int (*storage_count_fn)(void *ctx, int64_t value, int64_t count);
/* The distribution of local steps or of staleness over all stored
 * updates. */
int storage_update_histogram(storage *st, storage_hist what, storage_count_fn fn, void *ctx,
                             vl_error *err) VL_MUST_CHECK;

/* The longest peer name, in bytes: what a join accepts (the coordinator's
 * COORD_JOIN_NAME_MAX is this), so a stored name is never cut short. */
#define STORAGE_PEER_NAME_MAX 64

/* One peer's activity. */
typedef struct storage_peer_activity {
    int64_t id;
    char name[STORAGE_PEER_NAME_MAX + 1];
    uint8_t public_key[STORAGE_PK_BYTES];
    int64_t joined_at;
    int64_t last_seen;
    int revoked;
    int64_t leases;  /* leased tasks with deadline after now */
    int64_t updates; /* updates stored from it */
} storage_peer_activity;
typedef int (*storage_peer_fn)(void *ctx, const storage_peer_activity *a);
/* Every registered peer, by id. */
int storage_peer_each(storage *st, int64_t now, storage_peer_fn fn, void *ctx,
                      vl_error *err) VL_MUST_CHECK;

/* What one peer has sent, for the operator's dashboard. */
typedef struct storage_peer_totals {
    int64_t id;
    const char *hardware;  /* as it described itself when joining (JSON text); valid
                           * only during the callback */
    int64_t stored;        /* its updates stored */
    int64_t merged;        /* of them, merged into a version */
    double mean_staleness; /* over its stored updates; NaN when none */
    int64_t bytes;         /* its stored updates' bodies as sent */
} storage_peer_totals;
typedef int (*storage_peer_totals_fn)(void *ctx, const storage_peer_totals *t);
/* Every registered peer's totals, by id; a non-zero return from fn stops
 * the walk and is returned. */
int storage_peer_totals_each(storage *st, storage_peer_totals_fn fn, void *ctx,
                             vl_error *err) VL_MUST_CHECK;

/* ---- second rounds -------------------------------------------------------- */

/* The second round of the updates based on `version`: the n candidate
 * coordinates (ascending) whose exact values their peers are asked for
 * until deadline. From storage_round_get, candidates is a heap copy owned
 * by the struct (storage_round_free). */
typedef struct storage_round {
    int64_t version;
    size_t n;
    uint32_t *candidates;
    int64_t opened_at, deadline;
} storage_round;

/* Stores the round; VL_ECONFLICT when version already has one. */
int storage_round_insert(storage *st, const storage_round *r, vl_error *err) VL_MUST_CHECK;
/* Reads the round of version into *out; VL_ENOTFOUND when there is none. */
int storage_round_get(storage *st, int64_t version, storage_round *out,
                      vl_error *err) VL_MUST_CHECK;
void storage_round_free(storage_round *r);
/* Stores the n values (F32, the candidates' order) reported for update
 * update_id in the round of version; VL_ECONFLICT when that update already
 * has its values. */
int storage_round_values_insert(storage *st, int64_t update_id, int64_t version, const float *vals,
                                size_t n, int64_t now, vl_error *err) VL_MUST_CHECK;
/* *out = 1 when update update_id has reported its round values. */
int storage_round_values_has(storage *st, int64_t update_id, int *out, vl_error *err) VL_MUST_CHECK;
/* How many updates of the round of version have their values. */
int storage_round_values_count(storage *st, int64_t version, int64_t *out,
                               vl_error *err) VL_MUST_CHECK;
/* Called per update of the round that has values, by update id; vals (n
 * little-endian F32, maybe unaligned: read with memcpy) is valid only
 * during the call. Non-zero stops the walk and is returned. */
typedef int (*storage_values_fn)(void *ctx, int64_t update_id, const uint8_t *vals, size_t n);
int storage_round_values_each(storage *st, int64_t version, storage_values_fn fn, void *ctx,
                              vl_error *err) VL_MUST_CHECK;

/* ---- changes ------------------------------------------------------------ */

/* One version's stored change. idx and val point to nnz entries in
 * storage-owned memory, valid only during the callback, and may be
 * unaligned: read them with memcpy. */
typedef struct storage_change {
    int64_t version;
    size_t nnz;
    const uint8_t *idx; /* nnz little-endian U32, ascending */
    const uint8_t *val; /* nnz little-endian F32 */
} storage_change;

typedef int (*storage_change_fn)(void *ctx, const storage_change *c);
/* Calls fn for the changes of versions since+1 .. until, in order.
 * VL_ENOTFOUND (before any call) when one of them is not stored: never
 * made, or pruned. since < until. */
int storage_change_each(storage *st, int64_t since, int64_t until, storage_change_fn fn, void *ctx,
                        vl_error *err) VL_MUST_CHECK;

#endif
