/*
 * cli: the commands other than serve, working on the database or a
 * configuration directly: init, tokens and peers (admin.c), check and
 * check --config (check.c, admin.c), export (export.c) and sample
 * (sample.c). They are the only administration there is: no HTTP route
 * changes tokens or peers.
 *
 * Contents: coord_cmd_init, coord_cmd_token_create, coord_cmd_token_list,
 * coord_cmd_token_revoke, coord_cmd_peer_revoke, coord_cmd_peer_list,
 * coord_open_initialised, coord_cmd_check, coord_cmd_check_config,
 * coord_load_version, coord_cmd_export, coord_sample_opts,
 * coord_cmd_sample, COORD_SAMPLE_MAX_TOKENS, COORD_SAMPLE_MAX_TEMP.
 */
#ifndef VOLLEY_COORD_CLI_CLI_H
#define VOLLEY_COORD_CLI_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "coordinator/coord.h"
#include "coordinator/config/config.h"

/* `init`: creates the database for the run described by config_path. */
int coord_cmd_init(const char *db_path, const char *config_path, vl_error *err) VL_MUST_CHECK;
/* `token create`: stores a new token's hash and writes the token to out
 * (VCRYPTO_TOKEN_LEN + 1 bytes). */
int coord_cmd_token_create(const char *db_path, int64_t uses, int64_t ttl_s, char *out,
                           vl_error *err) VL_MUST_CHECK;
/* `token list`: one line per stored token on out: id, the start of its
 * hash, uses left, expiry, creation, peers it registered, and its state
 * (active, expired, used-up, revoked). The tokens themselves are not
 * stored and cannot be shown. */
int coord_cmd_token_list(const char *db_path, FILE *out, vl_error *err) VL_MUST_CHECK;
/* `token revoke`: token id admits nobody from now on. VL_ENOTFOUND if
 * there is no such token. */
int coord_cmd_token_revoke(const char *db_path, int64_t id, vl_error *err) VL_MUST_CHECK;
/* `peer revoke`: refuses every later request of peer id (403 revoked),
 * checked on each request, so it takes effect on a running coordinator. */
int coord_cmd_peer_revoke(const char *db_path, int64_t id, vl_error *err) VL_MUST_CHECK;
/* `peer list`: one line per registered peer on out: id, public key,
 * joined, last seen, unexpired leases, stored updates, state, name. */
int coord_cmd_peer_list(const char *db_path, FILE *out, vl_error *err) VL_MUST_CHECK;
/* Opens db_path, which must hold an initialised run (VL_ENOTFOUND
 * otherwise); *db is the caller's to storage_close. */
int coord_open_initialised(const char *db_path, storage **db, vl_error *err) VL_MUST_CHECK;
/* `check`: whether the database at db_path is whole after a crash, a
 * power cut or a disk fault: SQLite's integrity_check, and every stored
 * update that still waits for its merge read back from its segment and
 * decoded. Prints what it found to out; *problems receives how many
 * updates cannot be merged (their bodies lost or damaged). Returns VL_OK
 * when it could look, whatever it found, except a database that fails
 * integrity_check (VL_EDB). Changes nothing. */
int coord_cmd_check(const char *db_path, FILE *out, int64_t *problems, vl_error *err) VL_MUST_CHECK;
/* `check --config`: parses the configuration at config_path and reads
 * its data through exactly as `init` does, without touching a database,
 * then prints the resolved configuration (every default filled in, paths
 * absolute) as JSON and a summary: parameters, the compression's k or
 * sketch shape, and the bytes an update may take. Returns VL_OK, or the
 * first problem found (nothing printed then). */
int coord_cmd_check_config(const char *config_path, FILE *out, vl_error *err) VL_MUST_CHECK;


/* The parameters of stored version *version (< 0: the current one) of the
 * run in db_path, opened read-only, in a new model of the run's
 * configuration, which goes to *cfg (its data paths freed: the caller
 * reads no data). On success *gpt is owned by the caller (model_gpt_free)
 * and *version holds the version read, *val_loss (may be NULL) its stored
 * validation loss (NaN when unknown). An unknown or pruned version is
 * VL_ENOTFOUND. */
int coord_load_version(const char *db_path, int64_t *version, coord_config *cfg, model_gpt **gpt,
                       double *val_loss, vl_error *err) VL_MUST_CHECK;

/* `export`: writes stored version `version` (< 0: the current one) as
 * out_dir/model.safetensors and out_dir/config.json, a checkpoint that
 * transformers.GPT2LMHeadModel.from_pretrained(out_dir) loads. out_dir is
 * created if missing (not its parents); an existing non-empty one is
 * refused (VL_ECONFLICT) unless force is set, which overwrites those two
 * files and leaves anything else there alone. An unknown or pruned version
 * is VL_ENOTFOUND. On failure nothing this call wrote is left behind
 * (with force, that includes the two files it was replacing). On success
 * *exported (may be NULL) gets the version written. */
int coord_cmd_export(const char *db_path, int64_t version, const char *out_dir, int force,
                     int64_t *exported, vl_error *err) VL_MUST_CHECK;

/* What `sample` generates: tokens new bytes (1..COORD_SAMPLE_MAX_TOKENS)
 * after prompt, each drawn from the model's distribution at temperature
 * (0: always the most likely byte; else in (0, COORD_SAMPLE_MAX_TEMP]),
 * with an RNG seeded by seed, so a sample can be repeated. */
typedef struct coord_sample_opts {
    const char *prompt; /* not empty; its last block_size bytes are the context */
    int64_t tokens;
    double temperature;
    uint64_t seed;
} coord_sample_opts;

#define COORD_SAMPLE_MAX_TOKENS 4096
#define COORD_SAMPLE_MAX_TEMP 10.0

/* `sample`: writes the prompt and the bytes stored version `version` (< 0:
 * the current one) continues it with to out, each byte that is not
 * printable ASCII, a newline or a tab (and the backslash) written as
 * \xNN so a model's output cannot drive the terminal. Only byte-level
 * models (vocabulary 256) can be sampled here: a run over GPT-2 tokens is
 * refused (VL_EINVAL), as it needs GPT-2's tokenizer (export it and use
 * transformers). On success
 * *sampled (may be NULL) gets the version read and *val_loss (may be NULL)
 * its stored validation loss (NaN when none). Reads the database only. */
int coord_cmd_sample(const char *db_path, int64_t version, const coord_sample_opts *o, FILE *out,
                     int64_t *sampled, double *val_loss, vl_error *err) VL_MUST_CHECK;

#endif
