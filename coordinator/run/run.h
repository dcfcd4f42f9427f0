/*
 * run: the run on the coordinator, below the requests: its data (the
 * text corpus, the token shards, the held-out scoring), the state loaded
 * at start and kept as versions are made, the model bytes served (blobs,
 * model and factors files, the parameters' digest), and the derived
 * update-norm bound. The merge itself is aggregator.h; background
 * scoring score.h; the writer thread writer.h; split learning split.h.
 *
 * Contents: corpus; shards; validation loss; blobs; state; model files;
 * digest; the update-norm bound.
 */
#ifndef VOLLEY_COORD_RUN_RUN_H
#define VOLLEY_COORD_RUN_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator/coord.h"
#include "coordinator/config/config.h"
#include "coordinator/run/model_types.h"

/* Opens the corpus at path, hashing it and loading its validation slice
 * (split per cfg). With expect_hash set, a size or hash that differs is
 * VL_ECONFLICT ("the corpus changed since init"). c is owned by the caller
 * (coord_corpus_close). */
int coord_corpus_open(coord_corpus *c, const char *path, const coord_config *cfg,
                      int64_t expect_size, const char *expect_hash, vl_error *err) VL_MUST_CHECK;
/* Checks the open file still has the size and modification time it had
 * when opened (it is served straight from disk). */
int coord_corpus_check(const coord_corpus *c, vl_error *err) VL_MUST_CHECK;
void coord_corpus_close(coord_corpus *c);

/* Opens and validates every shard cfg names (model_shard_open: header,
 * size, every token below model.vocab_size), each at least block_size + 1
 * tokens long, hashes them (training shards in order, then validation)
 * and loads the validation tokens. The first bad shard fails it with the
 * shard's own one-line message ("token shard PATH: ..."). With
 * expect_hash set, a total size or hash that differs from the recorded
 * one is VL_ECONFLICT ("changed since init"). s is owned by the caller
 * (coord_shards_close), and is empty after a failure. */
int coord_shards_open(coord_shards *s, const coord_config *cfg, int64_t expect_size,
                      const char *expect_hash, vl_error *err) VL_MUST_CHECK;
/* Checks training shard i still has the size and modification time it
 * had when opened (it is served straight from disk). */
int coord_shards_check(const coord_shards *s, int i, vl_error *err) VL_MUST_CHECK;
void coord_shards_close(coord_shards *s);

/* The validation loss of m on the run's held-out data: the text corpus's
 * validation slice or the validation shard's tokens, the first batches
 * batches of COORD_VAL_BATCH windows of block_size tokens (0: every
 * window; val_batches for the full score, val_check_batches for the
 * check). Reads only what is fixed once the run is open, so the compute
 * and background threads may call it, each with its own m. */
int coord_val_loss(const coord_config *cfg, const coord_corpus *corpus, const coord_shards *shards,
                   model_gpt *m, int64_t batches, float *loss, vl_error *err) VL_MUST_CHECK;

/* The held-out tokens (bytes of a text run) coord_val_loss scores for
 * batches (0: every window): batches of COORD_VAL_BATCH windows, or the
 * whole held-out data when that is shorter. What the logs report. */
int64_t coord_val_scored_tokens(const coord_config *cfg, const coord_corpus *corpus,
                                const coord_shards *shards, int64_t batches);

/* A blob of len bytes that owns data (malloc'd; freed with the blob), one
 * reference; NULL (data freed) on allocation failure. Every live blob's
 * bytes are counted (coord_blob_live_bytes), so what downloads in flight
 * hold can be bounded. */
coord_blob *coord_blob_wrap(uint8_t *data, size_t len, int64_t version);
/* Takes one more reference to b and returns b, so that sharing a blob is
 * one expression (*out = coord_blob_ref(srv->old_blob)). The count is not
 * atomic: blobs are shared and dropped on the loop thread only (one built
 * on a compute thread is handed over with its single reference). */
coord_blob *coord_blob_ref(coord_blob *b);
/* Drops one reference to b, freeing it and its bytes with the last.
 * Safe on NULL. */
void coord_blob_unref(coord_blob *b);
/* Bytes held by all live blobs (any thread). */
int64_t coord_blob_live_bytes(void);

/* Loads the run, its corpus (verified), the model and momentum of the
 * latest version from srv->run.db into srv. */
int coord_state_load(coord_server *srv, vl_error *err) VL_MUST_CHECK;
/* Floats of outer optimiser state the run's compression keeps: momentum
 * (none), momentum and error vectors (topk, gaussk), momentum and error
 * sketches (sketch), or with a second round the error sketch, the dense
 * momentum and each coordinate's versions since it was last applied; with
 * outer.delay > 1 (not sketch) a buffer of n_params for delayed Nesterov
 * follows. */
size_t coord_state_size(const coord_config *cfg, size_t n_params);
/* Frees what coord_state_load set up (not the database). */
void coord_state_free(coord_server *srv);
/* Appends the model as the file of version `version` to out: the run and
 * version it came from, the `model` configuration JSON, and, when
 * val_loss is finite, its validation loss as "val_loss" (nats) and, for a
 * GPT, "val_bits_per_byte" (or "val_bits_per_token" in a token-shard
 * run). A GPT's tensors go under their GPT-2 names with "format": "pt"
 * (transformers refuses a file without it) and the volley.* keys; a
 * classifier's under fc.<layer>.weight/bias. The same bytes serve
 * downloads and `export`. */
int coord_model_file(const coord_config *cfg, const coord_model *net, int64_t version,
                     double val_loss, vl_buf *out, vl_error *err) VL_MUST_CHECK;
/* On the compute thread, with the version being made (it uses
 * srv->run.eval, which only merges touch): the file of version `version`
 * from params, as coord_model_file writes it, into *out (one reference,
 * the caller's). The merge hands it to the loop with the version, so the
 * first download after a merge finds it built. */
int coord_model_blob_build(coord_server *srv, const float *params, int64_t version, double val_loss,
                           coord_blob **out, vl_error *err) VL_MUST_CHECK;
/* The current model as safetensors, built and cached on first use; the
 * caller gets a new reference (coord_blob_unref). NULL on failure. */
coord_blob *coord_model_blob(coord_server *srv, vl_error *err);
/* Whether need more bytes of downloads may be built now: live blobs plus
 * need stay within the run's download budget. */
int coord_download_room(const coord_server *srv, int64_t need);
/* The merged K-FAC factors file of version (the newest one is cached);
 * the caller owns the reference. VL_ENOTFOUND when the run shares no
 * factors or that version has none stored. */
int coord_factors_blob(coord_server *srv, int64_t version, coord_blob **out,
                       vl_error *err) VL_MUST_CHECK;
/* Safetensors of an older version from its stored params; the caller owns
 * the reference. VL_ENOTFOUND when never made or pruned. */
int coord_model_blob_version(coord_server *srv, int64_t version, coord_blob **out,
                             vl_error *err) VL_MUST_CHECK;

/* The L2 norm above which an update is refused or scaled down: the run's
 * robust.max_norm, or with max_norm "auto" the derived bound (0 until it
 * is known), which is per square root of the update's local steps; 0
 * means none. Any thread. */
double coord_norm_bound(const coord_server *srv);
/* The bound every update is held to: the derived one times the square
 * root of the run's train.steps (the most any task trains), max_norm as
 * it is. Not the update's own steps: a short task (dynamic_steps) sends
 * its residual too, whose size does not shrink with its steps, and its
 * honest updates were refused five in a row when held to the square
 * root of one step; a full task's allowance is what any peer may claim
 * anyway, so this loosens nothing a hostile peer could not have. */
double coord_norm_bound_held(const coord_server *srv);
/* With max_norm "auto" and no bound yet: once versions 1 to
 * robust.auto_versions exist, sets the bound to robust.auto_mult times
 * the figure stored with the version it was learnt at (the median of
 * versions 1 to auto_versions' stored norms for an older database), read
 * on the loop's connection, and logs it. Called at start and after each
 * version; a database error leaves the bound unset, to be tried again. */
void coord_norm_bound_refresh(coord_server *srv);
/* Peers whose updates the learning window must hold (min(this, peers
 * registered)), and how many times auto_versions it waits for them. */
#define COORD_BOUND_QUORUM 3
#define COORD_BOUND_WAIT 4
/* Taken on the loop when a merge starts: the quorum the version's
 * figure needs (coord_norm_bound_figure), 0 when no bound is being
 * learnt (not "auto", or learnt already). */
int64_t coord_norm_bound_quorum(coord_server *srv);
/* The median over peers of each peer's median of units (NaN ones left
 * out) of n updates whose peers are peers[i], and in *n_peers how many
 * peers that is; NaN for none or when out of memory. */
double coord_norm_bound_peer_median(const int64_t *peers, const double *units, size_t n,
                                    size_t *n_peers);
/* On the compute thread, for version (being made, not refused) with
 * quorum from coord_norm_bound_quorum: adds its n updates' peers and
 * unit norms to the learning window and returns the bound's figure once
 * the window is complete (version >= auto_versions and quorum peers, or
 * version >= COORD_BOUND_WAIT x auto_versions), to be stored as the
 * version's update_norm; NaN otherwise. One merge at a time calls it. */
double coord_norm_bound_figure(coord_server *srv, int64_t quorum, int64_t version,
                               const int64_t *peers, const double *units, size_t n);
/* Frees the learning window (server close). */
void coord_norm_bound_window_free(coord_server *srv);

/* out = hex SHA-256 of n parameters as little-endian F32 (a version's
 * digest in delta files); any thread. VL_ENOMEM, or VL_ERR. */
int coord_params_digest(const float *theta, size_t n, char out[65], vl_error *err);

#endif
