/* GET /v1/model/delta?since=V[&version=W]: the parameters that any of
 * versions V+1..W changed (W defaults to the current version), with their
 * exact values in W, so a peer holding V catches up without downloading
 * the model, bit for bit, and checks the result against W's digest (the
 * SHA-256 of all its parameters) in the file. 410 when a change in the
 * range has been pruned or W is no longer retained. The last delta built
 * is cached: peers of one round ask for the same range. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"
#include "coordinator/api/api.h"
#include "coordinator/http/http.h"
#include "coordinator/run/model.h"
#include "coordinator/run/run.h"

typedef struct delta_acc {
    size_t n;
    uint8_t *touched; /* n flags: changed by some version of the range */
    size_t nnz;
    vl_error *err;
} delta_acc;

static int add_change(void *arg, const storage_change *c) {
    delta_acc *a = arg;
    uint32_t prev = 0;
    for (size_t j = 0; j < c->nnz; j++) {
        uint32_t i;
        memcpy(&i, c->idx + 4 * j, 4);
        if (i >= a->n || (j > 0 && i <= prev))
            return vl_fail(a->err, VL_EDB, "the stored change of version %lld is damaged",
                           (long long)c->version);
        prev = i;
        a->nnz += !a->touched[i];
        a->touched[i] = 1;
    }
    return VL_OK;
}

/* Version W's parameters and digest: the current model's (its digest
 * cached for the version), or a retained version's from the database
 * (*owned then holds what to free). VL_ENOTFOUND when W is not retained. */
static int version_params(coord_server *srv, int64_t version, const float **theta,
                          storage_version *owned, char digest[65], vl_error *err) {
    memset(owned, 0, sizeof *owned);
    if (version == srv->run.version) {
        *theta = coord_model_params(&srv->run.net);
        if (srv->caches.digest_version != version) {
            int rc = coord_params_digest(*theta, srv->run.n_params, srv->caches.digest_hex, err);
            if (rc != VL_OK) return rc;
            srv->caches.digest_version = version;
        }
        memcpy(digest, srv->caches.digest_hex, 65);
        return VL_OK;
    }
    int rc = storage_version_get(srv->run.db, version, 1, owned, err);
    if (rc != VL_OK) return rc;
    if (!owned->params || owned->n != srv->run.n_params) {
        storage_version_free(owned);
        memset(owned, 0, sizeof *owned);
        return vl_fail(err, VL_ENOTFOUND, "version %lld is no longer retained", (long long)version);
    }
    *theta = owned->params;
    return coord_params_digest(*theta, srv->run.n_params, digest, err);
}

/* Builds the delta file: metadata run/since/version/sha256, U32 `indices`
 * (ascending) and F32 `values` (version W's own at those indices). */
static int build_delta(coord_server *srv, int64_t since, int64_t version, coord_blob **out,
                       vl_error *err) {
    size_t n = srv->run.n_params;
    delta_acc a = {.n = n, .err = err};
    a.touched = calloc(n ? n : 1, 1);
    uint32_t *idx = NULL;
    float *val = NULL;
    const float *theta = NULL;
    storage_version owned;
    memset(&owned, 0, sizeof owned);
    char digest[65] = "";
    st_writer w;
    st_writer_init(&w);
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    int rc = VL_OK;
    if (!a.touched) rc = vl_fail(err, VL_ENOMEM, "out of memory building a delta");
    if (rc == VL_OK) rc = storage_change_each(srv->run.db, since, version, add_change, &a, err);
    if (rc == VL_OK) rc = version_params(srv, version, &theta, &owned, digest, err);
    if (rc == VL_OK) {
        idx = malloc(a.nnz * sizeof *idx + 1);
        val = malloc(a.nnz * sizeof *val + 1);
        if (!idx || !val) rc = vl_fail(err, VL_ENOMEM, "out of memory building a delta");
    }
    if (rc == VL_OK) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (!a.touched[i]) continue;
            idx[k] = (uint32_t)i;
            val[k++] = theta[i];
        }
        char s1[24], s2[24];
        snprintf(s1, sizeof s1, "%lld", (long long)since);
        snprintf(s2, sizeof s2, "%lld", (long long)version);
        uint64_t shape[1] = {a.nnz};
        rc = st_writer_meta(&w, "run", srv->run.cfg.name);
        if (!rc) rc = st_writer_meta(&w, "since", s1);
        if (!rc) rc = st_writer_meta(&w, "version", s2);
        if (!rc) rc = st_writer_meta(&w, "sha256", digest);
        if (!rc) rc = st_writer_add(&w, "indices", ST_U32, 1, shape, idx, a.nnz * 4);
        if (!rc) rc = st_writer_add(&w, "values", ST_F32, 1, shape, val, a.nnz * 4);
        if (rc)
            rc = vl_fail(err, rc, "cannot describe the delta");
        else
            rc = st_writer_finish(&w, &b, err);
    }
    if (rc == VL_OK) {
        size_t len;
        uint8_t *data = vl_buf_steal(&b, &len);
        *out = coord_blob_wrap(data, len, version);
        if (!*out) rc = vl_fail(err, VL_ENOMEM, "out of memory building a delta");
    }
    vl_buf_free(&b);
    st_writer_free(&w);
    storage_version_free(&owned);
    free(idx);
    free(val);
    free(a.touched);
    return rc;
}

void coord_route_delta(coord_req *cr) {
    coord_server *srv = cr->srv;
    const char *const keys[] = {"since", "version", NULL};
    int64_t vals[2] = {0, 0};
    unsigned present = 0;
    int64_t version = 0;
    vl_error e = {0};
    if (coord_req_version(cr, keys, vals, &present, srv->run.version, &version) != 0) return;
    if (!(present & 1u)) {
        coord_reply_error(cr, 400, "bad_request", "the query needs since=VERSION");
        return;
    }
    int64_t since = vals[0];
    if (coord_req_version_made(cr, version) != 0) return;
    if (since >= version) {
        coord_reply_error(cr, 400, "bad_request", "since (%lld) must be below version (%lld)",
                          (long long)since, (long long)version);
        return;
    }
    char etag[48];
    snprintf(etag, sizeof etag, "\"%lld\"", (long long)version);
    coord_set_header(cr, "ETag", etag);
    coord_blob *blob = NULL;
    if (srv->caches.delta_blob && srv->caches.delta_since == since &&
        srv->caches.delta_version == version) {
        blob = coord_blob_ref(srv->caches.delta_blob);
    } else {
        /* Building marks the changed parameters (a byte each) and may
         * read a retained version (4 bytes each) before the file exists. */
        if (!coord_download_room(srv, 5 * (int64_t)srv->run.n_params)) {
            coord_set_header(cr, "Retry-After", "2");
            coord_reply_error(cr, 503, "overloaded",
                              "downloads in flight hold the coordinator's "
                              "download budget; retry shortly");
            return;
        }
        int rc = build_delta(srv, since, version, &blob, &e);
        if (rc == VL_ENOTFOUND) {
            coord_reply_error(cr, 410, "version_pruned", "%s; fetch the whole model", e.msg);
            return;
        }
        if (rc != VL_OK) {
            coord_reply_internal(cr, &e);
            return;
        }
        if (srv->caches.delta_blob) coord_blob_unref(srv->caches.delta_blob);
        srv->caches.delta_blob = coord_blob_ref(blob);
        srv->caches.delta_since = since;
        srv->caches.delta_version = version;
    }
    coord_reply_blob(cr, blob);
}
