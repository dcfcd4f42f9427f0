/* K-FAC runs that share factors: the weighted mean of the factors a
 * version's updates carried, made with the version and committed with it
 * (GET /v1/factors, which serves it to peers, is api/routes_factors.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/run/aggregator.h"
#include "coordinator/run/factors.h"
#include "coordinator/run/round.h"
#include "coordinator/coord.h"
#include "coordinator/config/config.h"

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
    vl_buf_init(out, (size_t)coord_config_factor_bytes(&srv->run.cfg) + ((size_t)1 << 20));
    if (s->count == 0) return VL_OK;
    const float **A = calloc(2 * (size_t)s->n, sizeof *A);
    if (!A) return vl_fail(err, VL_ENOMEM, "out of memory merging factors");
    const float **G = A + s->n;
    int rc = compress_factors_sum_mean(s, A, G, err);
    if (rc == VL_OK) {
        st_dtype dt = strcmp(srv->run.cfg.train.kfac.dtype, "F16") == 0 ? ST_F16 : ST_F32;
        compress_factors f = {
            .layers = s->layers, .n = s->n, .A = A, .G = G, .samples = s->samples, .dtype = dt};
        rc = compress_factors_encode_file(&f, srv->run.cfg.name, version, out, err);
    }
    free(A);
    if (rc != VL_OK) return rc;
    v->factors = out->data;
    v->factors_len = out->len;
    v->factors_samples = s->samples;
    v->factors_peers = s->count;
    return VL_OK;
}
