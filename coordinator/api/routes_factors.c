/* GET /v1/factors: the merged K-FAC factors of a version, for the peers
 * of a run that shares them (run/factors.c makes them with the version). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"
#include "coordinator/api/api.h"
#include "coordinator/config/config.h"
#include "coordinator/http/http.h"
#include "coordinator/run/run.h"

/* GET /v1/factors[?version=V]: the merged factors of version V (default:
 * the newest that has them). */
void coord_route_factors(coord_req *cr) {
    coord_server *srv = cr->srv;
    const char *const keys[] = {"version", NULL};
    int64_t vals[1] = {0};
    unsigned present = 0;
    int64_t version = 0;
    vl_error e = {0};
    if (coord_req_version(cr, keys, vals, &present, srv->run.factors_version, &version) != 0)
        return;
    if (!coord_config_shares_factors(&srv->run.cfg)) {
        coord_reply_error(cr, 404, "unknown_factors", "this run does not share K-FAC factors");
        return;
    }
    if (version < 0 || version > srv->run.factors_version) {
        coord_reply_error(cr, 404, "unknown_factors",
                          "no merged factors for version %lld "
                          "(the newest are version %lld's)",
                          (long long)version, (long long)srv->run.factors_version);
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
