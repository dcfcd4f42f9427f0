/* K-FAC runs that share factors: the weighted mean of the factors a
 * version's updates carried, made with the version and committed with it,
 * and GET /v1/factors, which serves it to peers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/aggregator.h"
#include "coordinator/coord.h"

int coord_factors_add(compress_factors_sum *s, const compress_update *u, int64_t update_id,
                      vl_error *err) {
    compress_factors_view v;
    vl_error e = {0};
    int rc = compress_factors_decode(&u->file, s->layers, s->n, &v, NULL, &e);
    if (rc == VL_ENOMEM) return vl_fail(err, rc, "%s", e.msg);
    if (rc != VL_OK)
        return vl_fail(err, VL_EDB, "stored update %lld: its factors no longer decode: %s",
                       (long long)update_id, e.msg);
    /* Weighted by the samples behind them, as the protocol says: a peer
     * that trained on more tokens has the better estimate. */
    rc = compress_factors_sum_add(s, &v, (double)v.samples, err);
    compress_factors_view_free(&v);
    return rc;
}

int coord_factors_merged(coord_server *srv, compress_factors_sum *s, int64_t version, vl_buf *out,
                         storage_version *v, vl_error *err) {
    vl_buf_init(out, (size_t)coord_config_factor_bytes(&srv->cfg) + ((size_t)1 << 20));
    if (s->count == 0) return VL_OK;
    const float **A = calloc(2 * (size_t)s->n, sizeof *A);
    if (!A) return vl_fail(err, VL_ENOMEM, "out of memory merging factors");
    const float **G = A + s->n;
    int rc = compress_factors_sum_mean(s, A, G, err);
    if (rc == VL_OK) {
        st_dtype dt = strcmp(srv->cfg.train.kfac.dtype, "F16") == 0 ? ST_F16 : ST_F32;
        compress_factors f = {
            .layers = s->layers, .n = s->n, .A = A, .G = G, .samples = s->samples, .dtype = dt};
        rc = compress_factors_encode_file(&f, srv->cfg.name, version, out, err);
    }
    free(A);
    if (rc != VL_OK) return rc;
    v->factors = out->data;
    v->factors_len = out->len;
    v->factors_samples = s->samples;
    v->factors_peers = s->count;
    return VL_OK;
}

/* GET /v1/factors[?version=V]: the merged factors of version V (default:
 * the newest that has them). */
void coord_route_factors(coord_req *cr) {
    coord_server *srv = cr->srv;
    if (coord_authenticate(cr) != 0) return;
    const char *const keys[] = {"version", NULL};
    int64_t vals[1] = {0};
    unsigned present = 0;
    vl_error e = {0};
    if (coord_req_query(cr, keys, INT64_MAX, vals, &present, NULL) != 0) return;
    if (!coord_config_shares_factors(&srv->cfg)) {
        coord_reply_error(cr, 404, "unknown_factors", "this run does not share K-FAC factors");
        return;
    }
    int64_t version = present ? vals[0] : srv->factors_version;
    if (version < 0 || version > srv->factors_version) {
        coord_reply_error(cr, 404, "unknown_factors",
                          "no merged factors for version %lld "
                          "(the newest are version %lld's)",
                          (long long)version, (long long)srv->factors_version);
        return;
    }
    coord_blob *blob = NULL;
    int rc = coord_factors_blob(srv, version, &blob, &e);
    if (rc == VL_ENOTFOUND) {
        coord_reply_error(cr, 404, "unknown_factors", "%s", e.msg);
        return;
    }
    if (rc != VL_OK) {
        coord_reply_internal(cr, &e);
        return;
    }
    char etag[32];
    snprintf(etag, sizeof etag, "\"%lld\"", (long long)version);
    coord_set_header(cr, "ETag", etag);
    coord_reply_blob(cr, blob);
}
