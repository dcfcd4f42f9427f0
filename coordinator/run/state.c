/* The coordinator's in-memory state: run configuration, data, and the
 * current model and momentum, loaded from the latest committed version so
 * a restart continues where the run left off. */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"
#include "coordinator/run/split.h"
#include "model/mlp_io.h"
#include "coordinator/config/config.h"
#include "coordinator/run/model.h"
#include "coordinator/run/run.h"

/* Replay cache slots: enough for a few thousand requests per second over
 * the whole timestamp window. */
#define NONCE_SLOTS ((size_t)1 << 21)

/* The factor layers of a run that shares K-FAC factors, and the newest
 * version whose merged factors were committed. */
static int load_factors(coord_server *srv, vl_error *err) {
    srv->run.factors_version = -1;
    if (!coord_config_shares_factors(&srv->run.cfg)) return VL_OK;
    int n = model_gpt_kfac_layer_count(&srv->run.cfg.model);
    srv->run.factor_layers = calloc((size_t)n, sizeof *srv->run.factor_layers);
    if (!srv->run.factor_layers) return vl_fail(err, VL_ENOMEM, "out of memory");
    int rc = model_gpt_kfac_factor_layers(&srv->run.cfg.model, srv->run.factor_layers, n, err);
    if (rc < 0) return rc;
    srv->run.n_factor_layers = rc;
    rc = storage_factors_latest(srv->run.db, &srv->run.factors_version, err);
    if (rc == VL_ENOTFOUND) {
        srv->run.factors_version = -1;
        return VL_OK;
    }
    return rc;
}

int coord_state_load(coord_server *srv, vl_error *err) {
    /* 1. The run's stored configuration, and what the peers are sent of it. */
    storage_run run;
    int rc = storage_run_get(srv->run.db, &run, err);
    if (rc != VL_OK) return rc;
    vl_error cerr = {0};
    rc = coord_config_parse_stored(run.config, &srv->run.cfg, &cerr);
    if (rc != VL_OK) {
        vl_fail(err, rc, "the stored run configuration is invalid: %s", cerr.msg);
        goto out;
    }
    /* Its error sketch and its peers' uploads are in a hash this volley no
     * longer computes: serving it would sum two hashes into noise. */
    if (strcmp(srv->run.cfg.compression_kind, "sketch") == 0 &&
        !coord_config_names_hash(run.config)) {
        rc = vl_fail(err, VL_EINVAL,
                     "this sketch run was made by a volley whose Count Sketch hashed every "
                     "coordinate on its own; this one uses the \"%s\" hash and cannot go on "
                     "with it: finish the run with the volley that made it, or start a new one "
                     "(init)",
                     COMPRESS_SKETCH_HASH);
        goto out;
    }
    srv->run.peer_config = coord_config_to_json(&srv->run.cfg, 0);
    if (!srv->run.peer_config) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory");
        goto out;
    }
    /* 2. Its data, checked against the run record. */
    rc = srv->run.cfg.net == COORD_NET_MLP
             ? coord_testset_open(&srv->run.test, &srv->run.cfg, run.corpus_size, run.corpus_hash,
                                  err)
         : srv->run.cfg.shards ? coord_shards_open(&srv->run.shards, &srv->run.cfg, run.corpus_size,
                                                   run.corpus_hash, err)
                               : coord_corpus_open(&srv->run.corpus, run.corpus_path, &srv->run.cfg,
                                                   run.corpus_size, run.corpus_hash, err);
    if (rc != VL_OK) goto out;
    /* 3. The model, from the current version's parameters. */
    rc = coord_model_create(&srv->run.cfg, &srv->run.net, err);
    if (rc != VL_OK) goto out;
    srv->run.n_params = coord_model_num_params(&srv->run.net);

    storage_version v;
    rc = storage_version_get(srv->run.db, run.current_version, 1, &v, err);
    if (rc != VL_OK) goto out;
    if (!v.params || v.n != srv->run.n_params) {
        storage_version_free(&v);
        rc = vl_fail(err, VL_EDB, "version %lld has no parameters of the model's size",
                     (long long)run.current_version);
        goto out;
    }
    memcpy(coord_model_params(&srv->run.net), v.params, v.n * sizeof(float));
    srv->run.val_loss = v.val_loss;
    srv->run.val_accuracy = NAN;
    /* Accuracy is not stored with a version: a classifier's is scored
     * again (its test set is small). */
    if (srv->run.net.mlp && srv->run.test.n > 0) {
        float ignored;
        vl_error serr = {0};
        if (coord_model_score(&srv->run.cfg, NULL, NULL, &srv->run.test, &srv->run.net, &ignored,
                              &srv->run.val_accuracy, &serr) != VL_OK)
            vl_log_warn("scoring version %lld: %s", (long long)run.current_version, serr.msg);
    }
    if ((rc = storage_version_best_loss(srv->run.db, &srv->run.best_val_loss, err)) != VL_OK) {
        storage_version_free(&v);
        goto out;
    }
    /* 4. The outer optimiser's state, of the size the configuration needs. */
    srv->run.n_state = coord_state_size(&srv->run.cfg, srv->run.n_params);
    coord_config_spec(&srv->run.cfg, &srv->run.spec);
    /* A run stored before outer.delay existed has no delayed-Nesterov
     * buffer yet (an async run with momentum now gets a delay): it starts
     * empty, as at the start of a cycle. */
    if (v.momentum && srv->run.cfg.outer_delay > 1 &&
        v.n_state + srv->run.n_params == srv->run.n_state) {
        float *grown = realloc(v.momentum, srv->run.n_state * sizeof(float));
        if (!grown) {
            storage_version_free(&v);
            rc = vl_fail(err, VL_ENOMEM, "out of memory");
            goto out;
        }
        memset(grown + v.n_state, 0, srv->run.n_params * sizeof(float));
        v.momentum = grown;
        v.n_state = srv->run.n_state;
        vl_log_info("version %lld: delayed Nesterov's buffer starts empty (the run was stored "
                    "without one)",
                    (long long)run.current_version);
    }
    if (v.momentum && v.n_state != srv->run.n_state) {
        storage_version_free(&v);
        rc = vl_fail(err, VL_EDB, "version %lld has optimiser state of the wrong size",
                     (long long)run.current_version);
        goto out;
    }
    srv->run.momentum = v.momentum;
    v.momentum = NULL;
    if (!srv->run.momentum)
        srv->run.momentum = calloc(srv->run.n_state ? srv->run.n_state : 1, sizeof(float));
    storage_version_free(&v);
    if (!srv->run.momentum) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory");
        goto out;
    }
    /* 5. The version's clock, the replay cache, factors and split layers. */
    srv->run.version = run.current_version;
    coord_norm_bound_refresh(srv);
    srv->caches.digest_version = -1;
    /* The stored time is whole seconds, cut down: taken as the end of that
     * second, the age is never overstated, so a deadline is never early
     * (at most a second late, once, after a restart). */
    int64_t stored_age = vl_clock_unix_s() - v.created_at - 1;
    srv->run.version_born = vl_clock_mono_s() - (double)(stored_age > 0 ? stored_age : 0);
    srv->run.finished =
        run.status == STORAGE_RUN_FINISHED || run.current_version >= srv->run.cfg.max_versions;
    srv->conns.nonces = vcrypto_nonce_cache_new(NONCE_SLOTS, VCRYPTO_TS_WINDOW_S);
    if (!srv->conns.nonces) rc = vl_fail(err, VL_ENOMEM, "out of memory");
    if (rc == VL_OK) rc = load_factors(srv, err);
    if (rc == VL_OK) rc = coord_split_open(srv, err);
out:
    storage_run_free(&run);
    return rc;
}

size_t coord_state_size(const coord_config *cfg, size_t n_params) {
    size_t cells = (size_t)cfg->comp_rows * (size_t)cfg->comp_cols;
    if (strcmp(cfg->compression_kind, "sketch") == 0)
        return coord_config_round_candidates(cfg) > 0 ? cells + 2 * n_params : 2 * cells;
    /* m, e for the sparse kinds, then delayed Nesterov's buffer. */
    size_t n = strcmp(cfg->compression_kind, "none") == 0 ? n_params : 2 * n_params;
    return cfg->outer_delay > 1 ? n + n_params : n;
}

void coord_state_free(coord_server *srv) {
    if (srv->caches.model_blob) coord_blob_unref(srv->caches.model_blob);
    srv->caches.model_blob = NULL;
    if (srv->caches.delta_blob) coord_blob_unref(srv->caches.delta_blob);
    srv->caches.delta_blob = NULL;
    if (srv->caches.old_blob) coord_blob_unref(srv->caches.old_blob);
    srv->caches.old_blob = NULL;
    if (srv->caches.factors_blob) coord_blob_unref(srv->caches.factors_blob);
    srv->caches.factors_blob = NULL;
    free(srv->run.factor_layers);
    srv->run.factor_layers = NULL;
    srv->run.n_factor_layers = 0;
    coord_split_close(srv);
    coord_model_free(&srv->run.net);
    coord_model_free(&srv->run.eval);
    coord_model_free(&srv->run.scorer);
    coord_testset_close(&srv->run.test);
    free(srv->run.momentum);
    json_decref(srv->caches.status_cache);
    srv->caches.status_cache = NULL;
    free(srv->sched.issuing_leases);
    srv->sched.issuing_leases = NULL;
    srv->sched.cap_issuing = 0;
    free(srv->sched.speeds);
    srv->sched.speeds = NULL;
    srv->sched.n_speeds = srv->sched.cap_speeds = 0;
    srv->run.momentum = NULL;
    free(srv->run.peer_config);
    srv->run.peer_config = NULL;
    coord_corpus_close(&srv->run.corpus);
    coord_shards_close(&srv->run.shards);
    coord_config_free(&srv->run.cfg);
    vcrypto_nonce_cache_free(srv->conns.nonces);
    srv->conns.nonces = NULL;
}
