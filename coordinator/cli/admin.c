/* Operator commands that work on the database directly: init, tokens
 * (create, list, revoke) and peers (list, revoke). They are the only
 * administration there is: no HTTP route changes tokens or peers, so no
 * peer key can reach them; whoever may run them is whoever may open the
 * database file (mode 0600). */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coordinator/coord.h"
#include "coordinator/cli/cli.h"
#include "coordinator/config/config.h"
#include "coordinator/config/fields.h"
#include "coordinator/run/model.h"
#include "coordinator/run/model_types.h"
#include "coordinator/run/run.h"

#define CONFIG_MAX_BYTES ((size_t)1 << 20)

/* A relative corpus or shard path is taken relative to the config file,
 * so a run directory can be moved as a whole; the stored path is
 * absolute. field names it in messages. */
static int resolve_path(const char *config_path, const char *field, const char *corpus, char *out,
                        size_t cap, vl_error *err) {
    char joined[COORD_PATH_MAX * 2];
    if (corpus[0] == '/') {
        snprintf(joined, sizeof joined, "%s", corpus);
    } else {
        char tmp[COORD_PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", config_path);
        snprintf(joined, sizeof joined, "%s/%s", dirname(tmp), corpus);
    }
    char real[PATH_MAX];
    if (!realpath(joined, real))
        return vl_fail(err, VL_EIO, "config: %s %s: %s", field, joined, strerror(errno));
    if (strlen(real) >= cap) return vl_fail(err, VL_EINVAL, "config: %s path too long", field);
    snprintf(out, cap, "%s", real);
    return VL_OK;
}

/* Every data path of cfg made absolute (resolve_path). */
static int resolve_data(const char *config_path, coord_config *cfg, vl_error *err) {
    if (cfg->net == COORD_NET_MLP) {
        if (!cfg->test_images[0]) return VL_OK;
        int rc = resolve_path(config_path, "data.test_images", cfg->test_images, cfg->test_images,
                              sizeof cfg->test_images, err);
        return rc ? rc
                  : resolve_path(config_path, "data.test_labels", cfg->test_labels,
                                 cfg->test_labels, sizeof cfg->test_labels, err);
    }
    if (!cfg->shards)
        return resolve_path(config_path, "corpus", cfg->corpus, cfg->corpus, sizeof cfg->corpus,
                            err);
    char abs[COORD_PATH_MAX], field[32];
    for (int i = 0; i < cfg->n_train_shards; i++) {
        snprintf(field, sizeof field, "data.train[%d]", i);
        int rc = resolve_path(config_path, field, cfg->train_shards[i], abs, sizeof abs, err);
        if (rc != VL_OK) return rc;
        char *dup = strdup(abs);
        if (!dup) return vl_fail(err, VL_ENOMEM, "out of memory");
        free(cfg->train_shards[i]);
        cfg->train_shards[i] = dup;
    }
    return resolve_path(config_path, "data.val", cfg->val_shard, cfg->val_shard,
                        sizeof cfg->val_shard, err);
}

/* "12.3 MB": a size in decimal units, for the progress lines. */
static void fmt_bytes(int64_t n, char *out, size_t cap) {
    if (n < 1000)
        snprintf(out, cap, "%lld bytes", (long long)n);
    else if (n < 1000000)
        snprintf(out, cap, "%.1f KB", (double)n / 1e3);
    else if (n < 1000000000)
        snprintf(out, cap, "%.1f MB", (double)n / 1e6);
    else
        snprintf(out, cap, "%.2f GB", (double)n / 1e9);
}

/* The size of the file at path, or -1 when it cannot be read. */
static int64_t file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (int64_t)sb.st_size : -1;
}

/* Data from this size on are announced before they are read (reading
 * and hashing them takes a noticeable time): smaller ones are only named
 * once read, so that a refusal of what they hold stays one line. */
#define SAY_READING_BYTES ((int64_t)16 << 20)

/* What the data of cfg are, and how much, into what ("corpus FILE (12.3
 * MB)"); announced when large. The checks that need only the corpus's
 * size come first, so that one too small for the model is refused in
 * one line whatever its size. */
static int say_reading(const coord_config *cfg, char *what, size_t cap, vl_error *err) {
    char size[32];
    int64_t total = 0;
    if (cfg->net == COORD_NET_MLP) {
        if (!cfg->test_images[0]) {
            snprintf(what, cap, "no data of its own");
            return VL_OK;
        }
        total = file_size(cfg->test_images) + file_size(cfg->test_labels);
        fmt_bytes(total, size, sizeof size);
        snprintf(what, cap, "test images %s and labels %s (%s)", cfg->test_images, cfg->test_labels,
                 size);
    } else if (cfg->shards) {
        total = file_size(cfg->val_shard);
        for (int i = 0; i < cfg->n_train_shards; i++) total += file_size(cfg->train_shards[i]);
        fmt_bytes(total, size, sizeof size);
        snprintf(what, cap, "%d training shards and validation shard %s (%s)", cfg->n_train_shards,
                 cfg->val_shard, size);
    } else {
        total = file_size(cfg->corpus);
        if (total >= 0) {
            int rc = coord_config_check_corpus(cfg, total, err);
            if (rc != VL_OK) return rc;
        }
        fmt_bytes(total, size, sizeof size);
        snprintf(what, cap, "corpus %s (%s)", cfg->corpus, size);
    }
    if (total >= SAY_READING_BYTES) vl_log_info("reading %s...", what);
    return VL_OK;
}

/* How long scoring version 0 of a GPT run will take on this machine: a
 * batch or two are scored and timed, and the rest scaled from them. 0 in *est_s
 * for a classifier (its test set is scored in one call) or a failure. */
static void estimate_score(const coord_config *cfg, const coord_corpus *corpus,
                           const coord_shards *shards, coord_model *net, int64_t *tokens,
                           double *est_s) {
    *tokens = 0;
    *est_s = 0;
    if (!net->gpt) return;
    *tokens = coord_val_scored_tokens(cfg, corpus, shards, cfg->val_batches);
    int64_t per_batch = (int64_t)COORD_VAL_BATCH * cfg->model.block_size;
    int64_t batches = (*tokens + per_batch - 1) / per_batch;
    float loss = NAN;
    vl_error e = {0};
    /* The first batch pays for the threads and buffers starting up (a
     * tenth of a second, more than a small run's whole score): timed
     * are the two after it. */
    if (coord_val_loss(cfg, corpus, shards, net->gpt, 1, &loss, &e) != VL_OK) return;
    int timed = batches < 2 ? (int)batches : 2;
    double t0 = vl_clock_mono_s();
    if (coord_val_loss(cfg, corpus, shards, net->gpt, timed, &loss, &e) != VL_OK) return;
    *est_s = (vl_clock_mono_s() - t0) / timed * (double)batches;
}

/* "about 12 s", "about 4.2 s", "about 0.35 s" or "less than 0.01 s". */
static void fmt_seconds(double s, char *out, size_t cap) {
    if (s >= 10)
        snprintf(out, cap, "about %.0f s", s);
    else if (s >= 1)
        snprintf(out, cap, "about %.1f s", s);
    else if (s >= 0.01)
        snprintf(out, cap, "about %.2f s", s);
    else
        snprintf(out, cap, "less than 0.01 s");
}

/* Every field given in the configuration whose value the resolved one
 * holds otherwise ("dense" that became "none", a relative corpus path made
 * absolute), one line each: the field's path, what was given, what it
 * became. Fields given but not kept as such (a ratio that became k) are
 * the summary's to explain. Returns how many lines it wrote. */
static int note_changes(FILE *out, const char *path, json_t *given, json_t *resolved) {
    if (json_is_object(given) && json_is_object(resolved)) {
        int n = 0;
        const char *key;
        json_t *v;
        json_object_foreach(given, key, v) {
            json_t *r = json_object_get(resolved, key);
            if (!r) continue;
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", key);
            n += note_changes(out, sub, v, r);
        }
        return n;
    }
    if (json_is_number(given) && json_is_number(resolved) &&
        json_number_value(given) == json_number_value(resolved))
        return 0;
    if (json_equal(given, resolved)) return 0;
    char *g = json_dumps(given, JSON_COMPACT | JSON_ENCODE_ANY);
    char *r = json_dumps(resolved, JSON_COMPACT | JSON_ENCODE_ANY);
    fprintf(out, "normalised %s: %s became %s\n", path, g ? g : "?", r ? r : "?");
    free(g);
    free(r);
    return 1;
}

/* Reads the configuration at config_path into *cfg and reads its data
 * through as a run needs them (paths made absolute; the corpus, shards or
 * test set opened and checked): what init builds on and check --config
 * reports. On failure nothing is left open or owned; on success the
 * caller closes the three data objects and frees cfg. */
static int open_config(const char *config_path, coord_config *cfg, coord_corpus *corpus,
                       coord_shards *shards, coord_testset *test, json_t **given, vl_error *err) {
    memset(corpus, 0, sizeof *corpus);
    memset(shards, 0, sizeof *shards);
    memset(test, 0, sizeof *test);
    if (given) *given = NULL;
    vl_buf text;
    vl_buf_init(&text, CONFIG_MAX_BYTES);
    int rc = vl_buf_read_file(&text, config_path, err);
    if (rc == VL_OK) rc = coord_config_parse((const char *)text.data, text.len, cfg, err);
    /* What was given, beside what it resolved to (check --config). */
    if (rc == VL_OK && given)
        *given = json_loadb((const char *)text.data, text.len, JSON_REJECT_DUPLICATES, NULL);
    vl_buf_free(&text);
    if (rc != VL_OK) return rc;
    rc = resolve_data(config_path, cfg, err);
    double t0 = vl_clock_mono_s();
    char what[COORD_PATH_MAX * 2 + 96];
    if (rc == VL_OK) rc = say_reading(cfg, what, sizeof what, err);
    if (rc == VL_OK)
        rc = cfg->net == COORD_NET_MLP ? coord_testset_open(test, cfg, 0, NULL, err)
             : cfg->shards             ? coord_shards_open(shards, cfg, 0, NULL, err)
                                       : coord_corpus_open(corpus, cfg->corpus, cfg, 0, NULL, err);
    if (rc == VL_OK) vl_log_info("read and checked %s in %.2f s", what, vl_clock_mono_s() - t0);
    if (rc != VL_OK && given) {
        json_decref(*given);
        *given = NULL;
    }
    if (rc != VL_OK) {
        coord_testset_close(test);
        coord_shards_close(shards);
        coord_corpus_close(corpus);
        coord_config_free(cfg);
    }
    return rc;
}

int coord_cmd_init(const char *db_path, const char *config_path, vl_error *err) {
    coord_config cfg;
    coord_corpus corpus;
    coord_shards shards;
    coord_testset test;
    /* 1. The lock, then the configuration and its data. */
    /* A live server's database is refused first, before its data are
     * read at length; the lock file a refused configuration made goes
     * again, as the data are checked before the database is created, so
     * that bad data leave nothing behind. */
    char lock_path[COORD_PATH_MAX + 8];
    storage_lock *lock = NULL;
    int rc = storage_lock_path(db_path, lock_path, sizeof lock_path, err);
    int had_lock = rc == VL_OK && access(lock_path, F_OK) == 0;
    if (rc == VL_OK) rc = storage_lock_take(db_path, &lock, err);
    if (rc != VL_OK) return rc;
    rc = open_config(config_path, &cfg, &corpus, &shards, &test, NULL, err);
    if (rc != VL_OK) {
        if (!had_lock) unlink(lock_path);
        storage_lock_release(lock);
        return rc;
    }
    storage *db = NULL;
    coord_model net;
    memset(&net, 0, sizeof net);
    char *config_json = NULL;
    /* 2. The database, which must not hold a run yet. */
    rc = storage_open(db_path, 1, &db, err);
    if (rc != VL_OK) goto out;
    storage_run existing;
    vl_error probe = {0};
    int prc = storage_run_get(db, &existing, &probe);
    if (prc == VL_OK) {
        storage_run_free(&existing);
        rc = vl_fail(err, VL_ECONFLICT, "%s already holds run \"%s\"; refusing to overwrite it",
                     db_path, existing.name);
        goto out;
    }
    if (prc != VL_ENOTFOUND) {
        rc = vl_fail(err, prc, "%s", probe.msg);
        goto out;
    }
    /* 3. Version 0: its weights and its score. */
    rc = coord_model_create(&cfg, &net, err);
    if (rc != VL_OK) goto out;
    coord_model_init_weights(&net, (uint64_t)cfg.seed);
    float val_loss = NAN;
    double accuracy = NAN;
    vl_error everr = {0};
    int64_t tokens = 0;
    double est_s = 0;
    estimate_score(&cfg, &corpus, &shards, &net, &tokens, &est_s);
    char about[48];
    fmt_seconds(est_s, about, sizeof about);
    if (net.gpt)
        vl_log_info("scoring version 0 on %lld held-out %s (%s on this machine)...",
                    (long long)tokens, cfg.shards ? "tokens" : "bytes", about);
    else if (test.n)
        vl_log_info("scoring version 0 on %d test images...", test.n);
    double t0 = vl_clock_mono_s();
    if (coord_model_score(&cfg, &corpus, &shards, &test, &net, &val_loss, &accuracy, &everr) !=
        VL_OK)
        vl_log_warn("validation of version 0 failed: %s", everr.msg);
    else if (net.gpt || test.n)
        vl_log_info("scored version 0 in %.2f s (estimated %s)", vl_clock_mono_s() - t0,
                    net.gpt ? about : "none");
    /* 4. The run and version 0, stored in one transaction. */
    config_json = coord_config_to_json(&cfg, 1);
    if (!config_json) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory");
        goto out;
    }
    storage_run run;
    memset(&run, 0, sizeof run);
    snprintf(run.name, sizeof run.name, "%s", cfg.name);
    run.config = config_json;
    /* A shard run records its validation shard as the path; the size and
     * hash cover every shard. */
    run.corpus_path = cfg.shards ? cfg.val_shard : cfg.corpus;
    run.corpus_size = cfg.shards ? shards.size : corpus.size;
    snprintf(run.corpus_hash, sizeof run.corpus_hash, "%s", cfg.shards ? shards.hash : corpus.hash);
    /* A classifier run records its test set (or nothing: the data stay
     * on the peers). */
    if (cfg.net == COORD_NET_MLP) {
        run.corpus_path = cfg.test_images;
        run.corpus_size = test.size;
        snprintf(run.corpus_hash, sizeof run.corpus_hash, "%s", test.hash);
    }
    run.created_at = vl_clock_unix_s();
    storage_version v0 = {.version = 0,
                          .created_at = run.created_at,
                          .params = coord_model_params(&net),
                          .momentum = NULL,
                          .n = coord_model_num_params(&net),
                          .val_loss = val_loss,
                          .train_loss = NAN,
                          .num_updates = 0};
    /* The run and its first version appear together or not at all. */
    rc = storage_begin(db, err);
    if (rc == VL_OK) rc = storage_run_insert(db, &run, err);
    storage_commit_opts opts = {.keep_versions = cfg.keep_versions,
                                .keep_changes = cfg.keep_changes,
                                .keep_update_blobs = cfg.keep_update_blobs};
    if (rc == VL_OK) rc = storage_version_commit(db, &v0, NULL, 0, &opts, err);
    if (rc == VL_OK)
        rc = storage_commit(db, err);
    else
        storage_rollback(db);
    /* 5. What was made, in the log. */
    if (rc == VL_OK && cfg.net == COORD_NET_MLP)
        vl_log_info("initialised run \"%s\": an mlp classifier of %zu parameters on the peers' "
                    "own data; %s%d test images, version 0 loss %.6f, accuracy %.4f",
                    cfg.name, v0.n, test.n ? "" : "no held-out set of its own, ", test.n,
                    (double)val_loss, accuracy);
    else if (rc == VL_OK && cfg.shards)
        vl_log_info("initialised run \"%s\": %zu parameters, %d training shards (%lld tokens), "
                    "validation shard %s (%lld tokens), version 0 val_loss %.6f (%.4f bits per "
                    "token)",
                    cfg.name, v0.n, shards.n, (long long)shards.train_tokens, cfg.val_shard,
                    (long long)shards.val_tokens, (double)val_loss, (double)val_loss / M_LN2);
    else if (rc == VL_OK)
        vl_log_info(
            "initialised run \"%s\": %zu parameters, corpus %s (%lld bytes, %lld held out), "
            "version 0 val_loss %.6f (%.4f bits per byte)",
            cfg.name, v0.n, cfg.corpus, (long long)corpus.size, (long long)corpus.val_len,
            (double)val_loss, (double)val_loss / M_LN2);
out:
    free(config_json);
    coord_model_free(&net);
    coord_testset_close(&test);
    coord_corpus_close(&corpus);
    coord_shards_close(&shards);
    coord_config_free(&cfg);
    storage_close(db);
    storage_lock_release(lock);
    return rc;
}

int coord_open_initialised(const char *db_path, storage **db, vl_error *err) {
    int rc = storage_open(db_path, 0, db, err);
    if (rc != VL_OK) return rc;
    storage_run run;
    rc = storage_run_get(*db, &run, err);
    if (rc != VL_OK) {
        storage_close(*db);
        *db = NULL;
        return rc;
    }
    storage_run_free(&run);
    return VL_OK;
}

int coord_cmd_token_create(const char *db_path, int64_t uses, int64_t ttl_s, char *out,
                           vl_error *err) {
    storage *db = NULL;
    int rc = coord_open_initialised(db_path, &db, err);
    if (rc != VL_OK) return rc;
    char token[VCRYPTO_TOKEN_LEN + 1];
    vcrypto_token_generate(token);
    char hash[VCRYPTO_HASH_HEX + 1];
    vcrypto_hash_hex(token, strlen(token), hash);
    int64_t now = vl_clock_unix_s();
    rc = storage_token_insert(db, hash, uses, now + ttl_s, now, NULL, err);
    storage_close(db);
    if (rc == VL_OK) memcpy(out, token, sizeof token);
    explicit_bzero(token, sizeof token);
    return rc;
}

int coord_cmd_peer_revoke(const char *db_path, int64_t id, vl_error *err) {
    storage *db = NULL;
    int rc = coord_open_initialised(db_path, &db, err);
    if (rc != VL_OK) return rc;
    rc = storage_peer_revoke(db, id, err);
    storage_close(db);
    return rc;
}

int coord_cmd_token_revoke(const char *db_path, int64_t id, vl_error *err) {
    storage *db = NULL;
    int rc = coord_open_initialised(db_path, &db, err);
    if (rc != VL_OK) return rc;
    rc = storage_token_revoke(db, id, err);
    storage_close(db);
    return rc;
}

/* Unix seconds as UTC ISO 8601. */
static void utc(int64_t t, char *out, size_t cap) {
    time_t tt = (time_t)t;
    struct tm tm;
    if (!gmtime_r(&tt, &tm) || strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(out, cap, "%lld", (long long)t);
}

typedef struct list_ctx {
    FILE *out;
    int64_t now;
} list_ctx;

static int print_token(void *arg, const storage_token *t) {
    list_ctx *c = arg;
    char exp[32], made[32];
    utc(t->expires_at, exp, sizeof exp);
    utc(t->created_at, made, sizeof made);
    const char *state = t->revoked                ? "revoked"
                        : t->expires_at <= c->now ? "expired"
                        : t->uses_left == 0       ? "used-up"
                                                  : "active";
    fprintf(c->out, "%-6lld %-12s %9lld %-20s %-20s %5lld %s\n", (long long)t->id, t->hash_prefix,
            (long long)t->uses_left, exp, made, (long long)t->peers, state);
    return VL_OK;
}

int coord_cmd_token_list(const char *db_path, FILE *out, vl_error *err) {
    storage *db = NULL;
    int rc = coord_open_initialised(db_path, &db, err);
    if (rc != VL_OK) return rc;
    list_ctx c = {.out = out, .now = vl_clock_unix_s()};
    fprintf(out, "%-6s %-12s %9s %-20s %-20s %5s %s\n", "id", "hash", "uses_left", "expires",
            "created", "peers", "state");
    rc = storage_token_each(db, print_token, &c, err);
    storage_close(db);
    return rc;
}

static int print_peer(void *arg, const storage_peer_activity *a) {
    list_ctx *c = arg;
    char pk[VCRYPTO_PK_B64_LEN + 1], joined[32], seen[32];
    vcrypto_pk_encode(a->public_key, pk);
    utc(a->joined_at, joined, sizeof joined);
    utc(a->last_seen, seen, sizeof seen);
    fprintf(c->out, "%-6lld %-44s %-20s %-20s %6lld %7lld %-7s %s\n", (long long)a->id, pk, joined,
            seen, (long long)a->leases, (long long)a->updates, a->revoked ? "revoked" : "ok",
            a->name);
    return VL_OK;
}

int coord_cmd_peer_list(const char *db_path, FILE *out, vl_error *err) {
    storage *db = NULL;
    int rc = coord_open_initialised(db_path, &db, err);
    if (rc != VL_OK) return rc;
    list_ctx c = {.out = out, .now = vl_clock_unix_s()};
    fprintf(out, "%-6s %-44s %-20s %-20s %6s %7s %-7s %s\n", "id", "public_key", "joined",
            "last_seen", "leases", "updates", "state", "name");
    rc = storage_peer_each(db, c.now, print_peer, &c, err);
    storage_close(db);
    return rc;
}

int coord_cmd_check_config(const char *config_path, FILE *out, vl_error *err) {
    coord_config cfg;
    coord_corpus corpus;
    coord_shards shards;
    coord_testset test;
    /* The data are read through as init reads them, so that what passes
     * here passes init. */
    json_t *given = NULL;
    int rc = open_config(config_path, &cfg, &corpus, &shards, &test, &given, err);
    if (rc != VL_OK) return rc;
    char *json = NULL, *pretty = NULL;
    json_t *resolved = NULL;
    if (!(json = coord_config_to_json(&cfg, 1)) || !(resolved = json_loads(json, 0, NULL)) ||
        !(pretty = json_dumps(resolved, JSON_INDENT(2) | JSON_REAL_PRECISION(15))))
        rc = vl_fail(err, VL_ENOMEM, "out of memory");
    /* What init would take to score version 0, measured on one batch. */
    coord_model net;
    memset(&net, 0, sizeof net);
    int64_t tokens = 0;
    double est_s = 0;
    if (rc == VL_OK && cfg.net != COORD_NET_MLP &&
        (rc = coord_model_create(&cfg, &net, err)) == VL_OK) {
        coord_model_init_weights(&net, (uint64_t)cfg.seed);
        estimate_score(&cfg, &corpus, &shards, &net, &tokens, &est_s);
        char about[48];
        fmt_seconds(est_s, about, sizeof about);
        vl_log_info("init will score version 0 on %lld held-out %s (%s on this machine)",
                    (long long)tokens, cfg.shards ? "tokens" : "bytes", about);
    }
    coord_model_free(&net);
    if (rc == VL_OK) {
        size_t n = coord_config_num_params(&cfg);
        int64_t dense = (int64_t)n * 4, data = coord_config_update_data_bytes(&cfg);
        fprintf(out, "%s\n", pretty);
        fprintf(out, "model: %zu parameters; a dense F32 update is %lld bytes\n", n,
                (long long)dense);
        fprintf(out, "updates: %s", cfg.compression_kind);
        if (strcmp(cfg.compression_kind, "sketch") == 0)
            fprintf(out, ", %lld x %lld cells", (long long)cfg.comp_rows, (long long)cfg.comp_cols);
        else if (strcmp(cfg.compression_kind, "none") != 0)
            fprintf(out, ", k %lld", (long long)cfg.comp_k);
        fprintf(out,
                " in %s: %lld bytes of values (%.1fx smaller than dense F32), at most "
                "%lld bytes with the header; max_body_bytes %lld\n",
                cfg.compression_dtype, (long long)data,
                data > 0 ? (double)dense / (double)data : 0.0,
                (long long)coord_config_update_bytes(&cfg), (long long)cfg.max_body_bytes);
        const char *src = cfg.net == COORD_NET_MLP ? "local to the peers, scored on a test set"
                          : cfg.shards             ? "token shards, checked"
                                                   : "text corpus, checked";
        fprintf(out, "data: %s\n", src);
        if (coord_config_fields_report(&cfg, given, out) < 0)
            rc = vl_fail(err, VL_ENOMEM, "out of memory");
        if (given) note_changes(out, "", given, resolved);
        fflush(out);
    }
    free(pretty);
    json_decref(resolved);
    json_decref(given);
    free(json);
    coord_testset_close(&test);
    coord_shards_close(&shards);
    coord_corpus_close(&corpus);
    coord_config_free(&cfg);
    return rc;
}
