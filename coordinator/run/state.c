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
    srv->factors_version = -1;
    if (!coord_config_shares_factors(&srv->cfg)) return VL_OK;
    int n = model_gpt_kfac_layer_count(&srv->cfg.model);
    srv->factor_layers = calloc((size_t)n, sizeof *srv->factor_layers);
    if (!srv->factor_layers) return vl_fail(err, VL_ENOMEM, "out of memory");
    int rc = model_gpt_kfac_factor_layers(&srv->cfg.model, srv->factor_layers, n, err);
    if (rc < 0) return rc;
    srv->n_factor_layers = rc;
    rc = storage_factors_latest(srv->db, &srv->factors_version, err);
    if (rc == VL_ENOTFOUND) {
        srv->factors_version = -1;
        return VL_OK;
    }
    return rc;
}

int coord_state_load(coord_server *srv, vl_error *err) {
    storage_run run;
    int rc = storage_run_get(srv->db, &run, err);
    if (rc != VL_OK) return rc;
    vl_error cerr = {0};
    rc = coord_config_parse_stored(run.config, &srv->cfg, &cerr);
    if (rc != VL_OK) {
        vl_fail(err, rc, "the stored run configuration is invalid: %s", cerr.msg);
        goto out;
    }
    /* Its error sketch and its peers' uploads are in a hash this volley no
     * longer computes: serving it would sum two hashes into noise. */
    if (strcmp(srv->cfg.compression_kind, "sketch") == 0 && !coord_config_names_hash(run.config)) {
        rc = vl_fail(err, VL_EINVAL,
                     "this sketch run was made by a volley whose Count Sketch hashed every "
                     "coordinate on its own; this one uses the \"%s\" hash and cannot go on "
                     "with it: finish the run with the volley that made it, or start a new one "
                     "(init)",
                     COMPRESS_SKETCH_HASH);
        goto out;
    }
    srv->peer_config = coord_config_to_json(&srv->cfg, 0);
    if (!srv->peer_config) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory");
        goto out;
    }
    rc = srv->cfg.net == COORD_NET_MLP
             ? coord_testset_open(&srv->test, &srv->cfg, run.corpus_size, run.corpus_hash, err)
         : srv->cfg.shards
             ? coord_shards_open(&srv->shards, &srv->cfg, run.corpus_size, run.corpus_hash, err)
             : coord_corpus_open(&srv->corpus, run.corpus_path, &srv->cfg, run.corpus_size,
                                 run.corpus_hash, err);
    if (rc != VL_OK) goto out;
    rc = coord_net_create(&srv->cfg, &srv->net, err);
    if (rc != VL_OK) goto out;
    srv->n_params = coord_net_num_params(&srv->net);

    storage_version v;
    rc = storage_version_get(srv->db, run.current_version, 1, &v, err);
    if (rc != VL_OK) goto out;
    if (!v.params || v.n != srv->n_params) {
        storage_version_free(&v);
        rc = vl_fail(err, VL_EDB, "version %lld has no parameters of the model's size",
                     (long long)run.current_version);
        goto out;
    }
    memcpy(coord_net_params(&srv->net), v.params, v.n * sizeof(float));
    srv->val_loss = v.val_loss;
    srv->val_accuracy = NAN;
    /* Accuracy is not stored with a version: a classifier's is scored
     * again (its test set is small). */
    if (srv->net.mlp && srv->test.n > 0) {
        float ignored;
        vl_error serr = {0};
        if (coord_net_score(&srv->cfg, NULL, NULL, &srv->test, &srv->net, &ignored,
                            &srv->val_accuracy, &serr) != VL_OK)
            vl_log_warn("scoring version %lld: %s", (long long)run.current_version, serr.msg);
    }
    if ((rc = storage_version_best_loss(srv->db, &srv->best_val_loss, err)) != VL_OK) {
        storage_version_free(&v);
        goto out;
    }
    srv->n_state = coord_state_size(&srv->cfg, srv->n_params);
    coord_config_spec(&srv->cfg, &srv->spec);
    /* A run stored before outer.delay existed has no delayed-Nesterov
     * buffer yet (an async run with momentum now gets a delay): it starts
     * empty, as at the start of a cycle. */
    if (v.momentum && srv->cfg.outer_delay > 1 && v.n_state + srv->n_params == srv->n_state) {
        float *grown = realloc(v.momentum, srv->n_state * sizeof(float));
        if (!grown) {
            storage_version_free(&v);
            rc = vl_fail(err, VL_ENOMEM, "out of memory");
            goto out;
        }
        memset(grown + v.n_state, 0, srv->n_params * sizeof(float));
        v.momentum = grown;
        v.n_state = srv->n_state;
        vl_log_info("version %lld: delayed Nesterov's buffer starts empty (the run was stored "
                    "without one)",
                    (long long)run.current_version);
    }
    if (v.momentum && v.n_state != srv->n_state) {
        storage_version_free(&v);
        rc = vl_fail(err, VL_EDB, "version %lld has optimiser state of the wrong size",
                     (long long)run.current_version);
        goto out;
    }
    srv->momentum = v.momentum;
    v.momentum = NULL;
    if (!srv->momentum) srv->momentum = calloc(srv->n_state ? srv->n_state : 1, sizeof(float));
    storage_version_free(&v);
    if (!srv->momentum) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory");
        goto out;
    }
    srv->version = run.current_version;
    coord_norm_bound_refresh(srv);
    srv->digest_version = -1;
    /* The stored time is whole seconds, cut down: taken as the end of that
     * second, the age is never overstated, so a deadline is never early
     * (at most a second late, once, after a restart). */
    int64_t stored_age = vl_clock_unix_s() - v.created_at - 1;
    srv->version_born = vl_clock_mono_s() - (double)(stored_age > 0 ? stored_age : 0);
    srv->finished =
        run.status == STORAGE_RUN_FINISHED || run.current_version >= srv->cfg.max_versions;
    srv->nonces = vcrypto_nonce_cache_new(NONCE_SLOTS, VCRYPTO_TS_WINDOW_S);
    if (!srv->nonces) rc = vl_fail(err, VL_ENOMEM, "out of memory");
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
    if (srv->model_blob) coord_blob_unref(srv->model_blob);
    srv->model_blob = NULL;
    if (srv->delta_blob) coord_blob_unref(srv->delta_blob);
    srv->delta_blob = NULL;
    if (srv->old_blob) coord_blob_unref(srv->old_blob);
    srv->old_blob = NULL;
    if (srv->factors_blob) coord_blob_unref(srv->factors_blob);
    srv->factors_blob = NULL;
    free(srv->factor_layers);
    srv->factor_layers = NULL;
    srv->n_factor_layers = 0;
    coord_split_close(srv);
    coord_net_destroy(&srv->net);
    coord_net_destroy(&srv->eval);
    coord_net_destroy(&srv->scorer);
    coord_testset_close(&srv->test);
    free(srv->momentum);
    json_decref(srv->status_cache);
    srv->status_cache = NULL;
    free(srv->issuing_leases);
    srv->issuing_leases = NULL;
    srv->cap_issuing = 0;
    free(srv->speeds);
    srv->speeds = NULL;
    srv->n_speeds = srv->cap_speeds = 0;
    srv->momentum = NULL;
    free(srv->peer_config);
    srv->peer_config = NULL;
    coord_corpus_close(&srv->corpus);
    coord_shards_close(&srv->shards);
    coord_config_free(&srv->cfg);
    vcrypto_nonce_cache_free(srv->nonces);
    srv->nonces = NULL;
}
