/* GET /v1/status: the run's summary for anyone who asks (ops/status.c
 * builds it), made at most once per COORD_STATUS_CACHE_S on the loop. */
#include "coordinator/coord.h"
#include "coordinator/api/api.h"
#include "coordinator/http/http.h"
#include "coordinator/ops/status.h"
#include "coordinator/run/writer.h"

void coord_route_status(coord_req *cr) {
    coord_server *srv = cr->srv;
    /* Anyone may ask, as often as the address limit allows: the answer
     * is built at most once per COORD_STATUS_CACHE_S on the loop. */
    double mono = vl_clock_mono_s();
    if (srv->caches.status_cache && mono - srv->caches.status_at < COORD_STATUS_CACHE_S) {
        coord_reply_json(cr, 200, json_incref(srv->caches.status_cache));
        return;
    }
    vl_error e = {0};
    coord_writer_stats ws;
    coord_writer_stats_get(srv->run.writer, &ws);
    json_t *o = coord_status_json(srv->run.db, &srv->run.cfg, srv->run.version, srv->run.finished,
                                  &ws, srv->run.net.mlp ? &srv->run.val_accuracy : NULL, &e);
    if (!o) {
        coord_reply_internal(cr, &e);
        return;
    }
    json_decref(srv->caches.status_cache);
    srv->caches.status_cache = json_incref(o);
    srv->caches.status_at = mono;
    coord_reply_json(cr, 200, o);
}
