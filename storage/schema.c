/* The schema, as numbered migrations. Append new migrations; never edit one
 * that has shipped, since databases in the field already ran it. */
#include "storage/internal.h"

static const storage_migration MIGRATIONS[] = {
    {1,
     /* One run per database file. */
     "CREATE TABLE run ("
     " id INTEGER PRIMARY KEY CHECK (id = 1),"
     " name TEXT NOT NULL,"
     " config TEXT NOT NULL,"
     " corpus_path TEXT NOT NULL,"
     " corpus_size INTEGER NOT NULL CHECK (corpus_size >= 0),"
     " corpus_hash TEXT NOT NULL,"
     " current_version INTEGER NOT NULL DEFAULT 0,"
     " status TEXT NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'finished')),"
     " created_at INTEGER NOT NULL);"
     "CREATE TABLE tokens ("
     " id INTEGER PRIMARY KEY,"
     " hash TEXT NOT NULL UNIQUE,"
     " uses_left INTEGER NOT NULL CHECK (uses_left >= 0),"
     " expires_at INTEGER NOT NULL,"
     " created_at INTEGER NOT NULL,"
     " revoked INTEGER NOT NULL DEFAULT 0 CHECK (revoked IN (0, 1)));"
     "CREATE TABLE peers ("
     " id INTEGER PRIMARY KEY,"
     " public_key BLOB NOT NULL UNIQUE CHECK (length(public_key) = 32),"
     " name TEXT NOT NULL,"
     " hardware TEXT NOT NULL,"
     " token_id INTEGER REFERENCES tokens(id),"
     " joined_at INTEGER NOT NULL,"
     " last_seen INTEGER NOT NULL,"
     " revoked INTEGER NOT NULL DEFAULT 0 CHECK (revoked IN (0, 1)));"
     "CREATE TABLE versions ("
     " version INTEGER PRIMARY KEY CHECK (version >= 0),"
     " created_at INTEGER NOT NULL,"
     " params BLOB,"
     " momentum BLOB,"
     " val_loss REAL,"
     " train_loss REAL,"
     " num_updates INTEGER NOT NULL DEFAULT 0);"
     "CREATE TABLE tasks ("
     " id INTEGER PRIMARY KEY,"
     " peer_id INTEGER NOT NULL REFERENCES peers(id),"
     " base_version INTEGER NOT NULL REFERENCES versions(version),"
     " data_offset INTEGER NOT NULL CHECK (data_offset >= 0),"
     " data_length INTEGER NOT NULL CHECK (data_length > 0),"
     " seed INTEGER NOT NULL,"
     " issued_at INTEGER NOT NULL,"
     " deadline INTEGER NOT NULL,"
     " state TEXT NOT NULL CHECK (state IN ('leased', 'done', 'expired')));"
     "CREATE INDEX tasks_by_version ON tasks(base_version, state, deadline);"
     "CREATE INDEX tasks_by_peer ON tasks(peer_id, base_version, state);"
     "CREATE TABLE updates ("
     " id INTEGER PRIMARY KEY,"
     " task_id INTEGER NOT NULL UNIQUE REFERENCES tasks(id),"
     " peer_id INTEGER NOT NULL REFERENCES peers(id),"
     " base_version INTEGER NOT NULL,"
     " kind TEXT NOT NULL,"
     " num_samples INTEGER NOT NULL CHECK (num_samples > 0),"
     " local_steps INTEGER NOT NULL CHECK (local_steps > 0),"
     " loss REAL NOT NULL,"
     " nbytes INTEGER NOT NULL CHECK (nbytes >= 0),"
     " blob BLOB,"
     " received_at INTEGER NOT NULL,"
     " merged_version INTEGER REFERENCES versions(version));"
     "CREATE INDEX updates_pending ON updates(base_version, merged_version);"
     "CREATE INDEX updates_merged ON updates(merged_version);"},
    {2,
     /* What each version changed, theta_v - theta_(v-1), as ascending U32
      * indices and F32 values: peers that are behind fetch the sum of a few
      * of these instead of the whole model. */
     "CREATE TABLE changes ("
     " version INTEGER PRIMARY KEY REFERENCES versions(version) CHECK (version > 0),"
     " nnz INTEGER NOT NULL CHECK (nnz >= 0),"
     " indices BLOB NOT NULL CHECK (length(indices) = 4 * nnz),"
     " vals BLOB NOT NULL CHECK (length(vals) = 4 * nnz));"},
    {3,
     /* The Sketched-SGD second round of sketch runs: the candidate
      * coordinates chosen once a version has all its updates, and the exact
      * values each update's peer reported for them. Both outlive a restart,
      * so a round carries on where it stopped. */
     "CREATE TABLE rounds ("
     " version INTEGER PRIMARY KEY REFERENCES versions(version),"
     " n INTEGER NOT NULL CHECK (n > 0),"
     " candidates BLOB NOT NULL CHECK (length(candidates) = 4 * n),"
     " opened_at INTEGER NOT NULL,"
     " deadline INTEGER NOT NULL);"
     "CREATE TABLE round_values ("
     " update_id INTEGER PRIMARY KEY REFERENCES updates(id),"
     " version INTEGER NOT NULL REFERENCES rounds(version),"
     " n INTEGER NOT NULL CHECK (n > 0),"
     " vals BLOB NOT NULL CHECK (length(vals) = 4 * n),"
     " received_at INTEGER NOT NULL);"
     "CREATE INDEX round_values_by_version ON round_values(version);"},
    {4,
     /* Asynchronous merging and churn: how many versions old each update's
      * base was when it arrived (its weight depends on it), and which
      * expired leases had their data handed to another task. Unmerged
      * updates are looked up whatever their base. */
     "ALTER TABLE updates ADD COLUMN staleness INTEGER NOT NULL DEFAULT 0"
     " CHECK (staleness >= 0);"
     "ALTER TABLE tasks ADD COLUMN reissue_of INTEGER REFERENCES tasks(id);"
     "ALTER TABLE tasks ADD COLUMN reissued INTEGER NOT NULL DEFAULT 0"
     " CHECK (reissued IN (0, 1));"
     "CREATE INDEX updates_unmerged ON updates(id) WHERE merged_version IS NULL;"
     "CREATE INDEX tasks_expired ON tasks(id) WHERE state = 'expired' AND reissued = 0;"
     "CREATE INDEX tasks_by_deadline ON tasks(deadline) WHERE state = 'leased';"},
    {5,
     /* Update bodies in a table of their own. SQLite rewrites a whole row,
      * overflow pages included, when any column changes, so with the body
      * inside `updates` marking a version's updates merged rewrote
      * megabytes, and pruning a body was an UPDATE of the same size. Now
      * both touch small rows, and pruning is a DELETE. */
     "CREATE TABLE update_blobs ("
     " update_id INTEGER PRIMARY KEY REFERENCES updates(id),"
     " blob BLOB NOT NULL);"
     "INSERT INTO update_blobs (update_id, blob)"
     " SELECT id, blob FROM updates WHERE blob IS NOT NULL;"
     "ALTER TABLE updates DROP COLUMN blob;"},
    {6,
     /* New bodies live in segment files beside the database (bodies.c):
      * written once, where the WAL would have written them twice. Bodies
      * stored before stay in update_blobs and are read from there. */
     "CREATE TABLE update_bodies ("
     " update_id INTEGER PRIMARY KEY REFERENCES updates(id),"
     " seg INTEGER NOT NULL CHECK (seg >= 0),"
     " off INTEGER NOT NULL CHECK (off >= 0));"
     "CREATE INDEX update_bodies_by_seg ON update_bodies(seg);"},
    {7,
     /* K-FAC runs that share factors: the weighted mean of the factors the
      * updates merged into a version carried, as the file peers download,
      * committed with the version. */
     "CREATE TABLE factors ("
     " version INTEGER PRIMARY KEY REFERENCES versions(version),"
     " samples INTEGER NOT NULL CHECK (samples > 0),"
     " peers INTEGER NOT NULL CHECK (peers > 0),"
     " blob BLOB NOT NULL);"},
    {8,
     /* A peer's live lease, looked up on every upload that asks for its
      * next task: tasks_by_peer leads with base_version after peer_id, so
      * without this the lookup walked every task the peer ever had. */
     "CREATE INDEX tasks_leased_by_peer ON tasks(peer_id, id) WHERE state = 'leased';"},
    {9,
     /* A version whose validation loss blew up is refused: it keeps its
      * predecessor's parameters, and the loss its own would have had is
      * kept here (NULL when that was not a number). */
     "ALTER TABLE versions ADD COLUMN refused INTEGER NOT NULL DEFAULT 0"
     " CHECK (refused IN (0, 1));"
     "ALTER TABLE versions ADD COLUMN refused_val_loss REAL;"},
    {10,
     /* A key a peer rotated away from is retired for good: no peer may
      * take it again, by rotation or by joining. A rotation request is
      * signed by the old key, so were the key ever current again, that
      * request, replayed, would flip the peer back. The triggers make the
      * database itself refuse, whatever the code path. */
     "CREATE TABLE retired_keys ("
     " public_key BLOB PRIMARY KEY CHECK (length(public_key) = 32),"
     " peer_id INTEGER NOT NULL REFERENCES peers(id),"
     " retired_at INTEGER NOT NULL);"
     "CREATE TRIGGER peers_key_retires AFTER UPDATE OF public_key ON peers"
     " WHEN OLD.public_key <> NEW.public_key BEGIN"
     " INSERT INTO retired_keys (public_key, peer_id, retired_at)"
     "  VALUES (OLD.public_key, OLD.id, CAST(strftime('%s', 'now') AS INTEGER));"
     " END;"
     "CREATE TRIGGER peers_key_not_retired BEFORE UPDATE OF public_key ON peers"
     " WHEN EXISTS (SELECT 1 FROM retired_keys WHERE public_key = NEW.public_key) BEGIN"
     " SELECT RAISE(ABORT, 'the key is retired');"
     " END;"
     "CREATE TRIGGER peers_join_not_retired BEFORE INSERT ON peers"
     " WHEN EXISTS (SELECT 1 FROM retired_keys WHERE public_key = NEW.public_key) BEGIN"
     " SELECT RAISE(ABORT, 'the key is retired');"
     " END;"},
    {11,
     /* Exactly once is the schema's rule, not only the merge's code path:
      * an update's merged_version is set once and never changes, and an
      * update is stored unmerged. */
     "CREATE TRIGGER updates_merged_once BEFORE UPDATE OF merged_version ON updates"
     " WHEN OLD.merged_version IS NOT NULL BEGIN"
     " SELECT RAISE(ABORT, 'the update is merged already');"
     " END;"
     "CREATE TRIGGER updates_stored_unmerged BEFORE INSERT ON updates"
     " WHEN NEW.merged_version IS NOT NULL BEGIN"
     " SELECT RAISE(ABORT, 'an update is stored unmerged');"
     " END;"},
    {12,
     /* GET /v1/status counts every peer's updates: without this, a scan of
      * all updates per peer, which grows with a swarm's size
      * (docs/benchmarks.md, "Figures the code relies on"). */
     "CREATE INDEX updates_by_peer ON updates(peer_id);"},
    {13,
     /* The median L2 norm of the updates a version merged, as they were
      * sent, each over the square root of its local steps: robust.max_norm
      * "auto" derives its bound from the first versions' (NULL for
      * version 0 and versions made before). */
     "ALTER TABLE versions ADD COLUMN update_norm REAL;"},
    {14,
     /* Each update's L2 norm (compress_update_norm of its body as decoded
      * on arrival), computed once when it is accepted: the merge used to
      * decode every body and make a second pass over its values for the
      * same number. NULL for updates stored before, whose norm the merge
      * still computes itself. */
     "ALTER TABLE updates ADD COLUMN norm REAL CHECK (norm >= 0);"},
};

const storage_migration *storage_builtin_migrations(size_t *n) {
    *n = sizeof MIGRATIONS / sizeof MIGRATIONS[0];
    return MIGRATIONS;
}

int storage_schema_version(void) {
    return MIGRATIONS[sizeof MIGRATIONS / sizeof MIGRATIONS[0] - 1].version;
}
