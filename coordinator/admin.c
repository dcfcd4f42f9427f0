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
#include <time.h>

#include "coordinator/coord.h"

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

/* Reads the configuration at config_path into *cfg and reads its data
 * through as a run needs them (paths made absolute; the corpus, shards or
 * test set opened and checked): what init builds on and check --config
 * reports. On failure nothing is left open or owned; on success the
 * caller closes the three data objects and frees cfg. */
static int open_config(const char *config_path, coord_config *cfg, coord_corpus *corpus,
                       coord_shards *shards, coord_testset *test, vl_error *err) {
    memset(corpus, 0, sizeof *corpus);
    memset(shards, 0, sizeof *shards);
    memset(test, 0, sizeof *test);
    vl_buf text;
    vl_buf_init(&text, CONFIG_MAX_BYTES);
    int rc = vl_buf_read_file(&text, config_path, err);
    if (rc == VL_OK) rc = coord_config_parse((const char *)text.data, text.len, cfg, err);
    vl_buf_free(&text);
    if (rc != VL_OK) return rc;
    rc = resolve_data(config_path, cfg, err);
    if (rc == VL_OK)
        rc = cfg->net == COORD_NET_MLP ? coord_testset_open(test, cfg, 0, NULL, err)
             : cfg->shards             ? coord_shards_open(shards, cfg, 0, NULL, err)
                                       : coord_corpus_open(corpus, cfg->corpus, cfg, 0, NULL, err);
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
    /* The data are checked before the database is created, so that bad
     * data leave nothing behind. */
    int rc = open_config(config_path, &cfg, &corpus, &shards, &test, err);
    if (rc != VL_OK) return rc;
    storage *db = NULL;
    coord_net net;
    memset(&net, 0, sizeof net);
    char *config_json = NULL;
    /* A live server's database is refused before it is opened. */
    storage_lock *lock = NULL;
    rc = storage_lock_take(db_path, &lock, err);
    if (rc == VL_OK) rc = storage_open(db_path, 1, &db, err);
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
    rc = coord_net_create(&cfg, &net, err);
    if (rc != VL_OK) goto out;
    coord_net_init_weights(&net, (uint64_t)cfg.seed);
    float val_loss = NAN;
    double accuracy = NAN;
    vl_error everr = {0};
    if (coord_net_score(&cfg, &corpus, &shards, &test, &net, &val_loss, &accuracy, &everr) != VL_OK)
        vl_log_warn("validation of version 0 failed: %s", everr.msg);
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
                          .params = coord_net_params(&net),
                          .momentum = NULL,
                          .n = coord_net_num_params(&net),
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
    coord_net_destroy(&net);
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
    char token[CRYPTO_TOKEN_LEN + 1];
    crypto_token_generate(token);
    char hash[CRYPTO_HASH_HEX + 1];
    crypto_hash_hex(token, strlen(token), hash);
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
    char pk[CRYPTO_PK_B64_LEN + 1], joined[32], seen[32];
    crypto_pk_encode(a->public_key, pk);
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
    int rc = open_config(config_path, &cfg, &corpus, &shards, &test, err);
    if (rc != VL_OK) return rc;
    char *json = NULL;
    if (!(json = coord_config_to_json(&cfg, 1))) rc = vl_fail(err, VL_ENOMEM, "out of memory");
    if (rc == VL_OK) {
        size_t n = coord_config_num_params(&cfg);
        int64_t dense = (int64_t)n * 4, data = coord_config_update_data_bytes(&cfg);
        fprintf(out, "%s\n", json);
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
        fflush(out);
    }
    free(json);
    coord_testset_close(&test);
    coord_shards_close(&shards);
    coord_corpus_close(&corpus);
    coord_config_free(&cfg);
    return rc;
}
