/* The model bytes the coordinator serves, shared by the responses still
 * sending them: blobs with their reference counts and the budget on what
 * they may hold at once, the model file of a version (the current one
 * built once and kept, retained ones read back from the database), a
 * version's K-FAC factors file, and the SHA-256 digest of a version's
 * parameters. */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "coordinator/coord.h"
#include "coordinator/run/split.h"
#include "model/mlp_io.h"
#include "coordinator/config/config.h"
#include "coordinator/conn/limits_types.h"
#include "coordinator/run/model.h"
#include "coordinator/run/model_types.h"
#include "coordinator/run/run.h"

int coord_params_digest(const float *theta, size_t n, char out[65], vl_error *err) {
    vcrypto_digest *d = vcrypto_digest_new(VCRYPTO_DIGEST_SHA256);
    if (!d) return vl_fail(err, VL_ENOMEM, "out of memory hashing a version");
    vcrypto_digest_update(d, theta, n * sizeof *theta);
    uint8_t md[VCRYPTO_DIGEST_MAX];
    size_t len = vcrypto_digest_final(d, md);
    vcrypto_digest_free(d);
    if (len != 32) return vl_fail(err, VL_ERR, "cannot hash a version");
    vl_hex_encode(md, 32, out);
    return VL_OK;
}

/* Live blob bytes; blobs are made and dropped on the loop and compute
 * threads alike. */
static int64_t live_blob_bytes;

coord_blob *coord_blob_wrap(uint8_t *data, size_t len, int64_t version) {
    coord_blob *b = calloc(1, sizeof *b);
    if (!b) {
        free(data);
        return NULL;
    }
    b->refs = 1;
    b->len = len;
    b->data = data;
    b->version = version;
    __atomic_add_fetch(&live_blob_bytes, (int64_t)len, __ATOMIC_RELAXED);
    return b;
}

coord_blob *coord_blob_ref(coord_blob *b) {
    b->refs++;
    return b;
}

void coord_blob_unref(coord_blob *b) {
    if (!b || --b->refs > 0) return;
    __atomic_sub_fetch(&live_blob_bytes, (int64_t)b->len, __ATOMIC_RELAXED);
    free(b->data);
    free(b);
}

int64_t coord_blob_live_bytes(void) {
    return __atomic_load_n(&live_blob_bytes, __ATOMIC_RELAXED);
}

int coord_download_room(const coord_server *srv, int64_t need) {
    int64_t budget = srv->conns.limits.download_budget;
    if (budget <= 0) {
        budget = COORD_DOWNLOAD_BUDGET_MODELS * (int64_t)srv->run.n_params * 4;
        if (budget < ((int64_t)256 << 20)) budget = (int64_t)256 << 20;
    }
    return coord_blob_live_bytes() + need <= budget;
}

/* Serialises gpt as the /v1/model file: the parameters under their
 * Hugging Face names plus run, version and model metadata. */
int coord_model_file(const coord_config *cfg, const coord_model *net, int64_t version,
                     double val_loss, vl_buf *out, vl_error *err) {
    char vstr[24], mjson[MODEL_MLP_JSON_MAX], nats[32], bits[32];
    snprintf(vstr, sizeof vstr, "%lld", (long long)version);
    snprintf(nats, sizeof nats, "%.6f", val_loss);
    snprintf(bits, sizeof bits, "%.6f", val_loss / M_LN2);
    st_writer w;
    st_writer_init(&w);
    int rc = coord_config_model_json(cfg, mjson, sizeof mjson);
    if (!rc && net->gpt) rc = model_gpt_write_config_meta(net->gpt, &w);
    if (!rc) rc = st_writer_meta(&w, "run", cfg->name);
    if (!rc) rc = st_writer_meta(&w, "version", vstr);
    if (!rc) rc = st_writer_meta(&w, "model", mjson);
    /* Bits per byte compare across vocabularies and with published
     * figures; a token-shard run's loss is per token. */
    if (!rc && isfinite(val_loss)) rc = st_writer_meta(&w, "val_loss", nats);
    if (!rc && isfinite(val_loss) && net->gpt)
        rc = st_writer_meta(&w, cfg->shards ? "val_bits_per_token" : "val_bits_per_byte", bits);
    if (!rc) rc = coord_model_write_tensors(net, &w);
    if (rc)
        rc = vl_fail(err, rc, "cannot describe the model of version %lld", (long long)version);
    else
        rc = st_writer_finish(&w, out, err);
    st_writer_free(&w);
    return rc;
}

static int build_blob(coord_server *srv, const coord_model *net, int64_t version, double val_loss,
                      coord_blob **out, vl_error *err) {
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    int rc = coord_model_file(&srv->run.cfg, net, version, val_loss, &b, err);
    if (rc) {
        vl_buf_free(&b);
        return rc;
    }
    size_t len;
    uint8_t *data = vl_buf_steal(&b, &len);
    coord_blob *blob = coord_blob_wrap(data, len, version);
    if (!blob) return vl_fail(err, VL_ENOMEM, "out of memory");
    *out = blob;
    return VL_OK;
}

int coord_model_blob_build(coord_server *srv, const float *params, int64_t version, double val_loss,
                           coord_blob **out, vl_error *err) {
    *out = NULL;
    coord_model *n = &srv->run.eval;
    if (!coord_model_params(n)) {
        int rc = coord_model_create(&srv->run.cfg, n, err);
        if (rc != VL_OK) return rc;
    }
    memcpy(coord_model_params(n), params, srv->run.n_params * sizeof(float));
    return build_blob(srv, n, version, val_loss, out, err);
}

coord_blob *coord_model_blob(coord_server *srv, vl_error *err) {
    /* A version served on its loss check has no validation loss of its
     * own yet (score.h): its file then says none, and keeps saying so,
     * since one version's file does not change under its ETag. */
    double val_loss = srv->run.val_loss_version == srv->run.version ? srv->run.val_loss : NAN;
    if (!srv->caches.model_blob &&
        build_blob(srv, &srv->run.net, srv->run.version, val_loss, &srv->caches.model_blob, err))
        return NULL;
    return coord_blob_ref(srv->caches.model_blob);
}

int coord_model_blob_version(coord_server *srv, int64_t version, coord_blob **out, vl_error *err) {
    if (version == srv->run.version) {
        *out = coord_model_blob(srv, err);
        return *out ? VL_OK : VL_ERR;
    }
    if (version < 0 || version > srv->run.version)
        return vl_fail(err, VL_ENOTFOUND, "version %lld was never made", (long long)version);
    /* Everyone reading one old version shares one built copy. */
    if (srv->caches.old_blob && srv->caches.old_blob->version == version) {
        *out = coord_blob_ref(srv->caches.old_blob);
        return VL_OK;
    }
    /* Building takes a model and its file: twice the parameters. */
    if (!coord_download_room(srv, 2 * (int64_t)srv->run.n_params * 4))
        return vl_fail(err, VL_ETOOBIG,
                       "downloads in flight hold the coordinator's download "
                       "budget");
    storage_version v;
    int rc = storage_version_get(srv->run.db, version, 1, &v, err);
    if (rc != VL_OK) return rc;
    if (!v.params || v.n != srv->run.n_params) {
        storage_version_free(&v);
        return vl_fail(err, VL_ENOTFOUND, "version %lld is no longer retained", (long long)version);
    }
    coord_model net;
    rc = coord_model_create(&srv->run.cfg, &net, err);
    if (rc == VL_OK) {
        memcpy(coord_model_params(&net), v.params, v.n * sizeof(float));
        rc = build_blob(srv, &net, version, v.val_loss, out, err);
    }
    if (rc == VL_OK) {
        if (srv->caches.old_blob) coord_blob_unref(srv->caches.old_blob);
        srv->caches.old_blob = coord_blob_ref(*out);
    }
    coord_model_free(&net);
    storage_version_free(&v);
    return rc;
}

int coord_factors_blob(coord_server *srv, int64_t version, coord_blob **out, vl_error *err) {
    *out = NULL;
    if (!srv->run.factor_layers)
        return vl_fail(err, VL_ENOTFOUND, "this run does not share K-FAC factors");
    if (srv->caches.factors_blob && srv->caches.factors_blob->version == version) {
        *out = coord_blob_ref(srv->caches.factors_blob);
        return VL_OK;
    }
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = storage_factors_get(srv->run.db, version, &data, &len, NULL, NULL, err);
    if (rc != VL_OK) return rc;
    coord_blob *b = coord_blob_wrap(data, len, version);
    if (!b) return vl_fail(err, VL_ENOMEM, "out of memory");
    if (version == srv->run.factors_version) {
        if (srv->caches.factors_blob) coord_blob_unref(srv->caches.factors_blob);
        srv->caches.factors_blob = coord_blob_ref(b);
    }
    *out = b;
    return VL_OK;
}
