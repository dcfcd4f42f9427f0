/* The dashboard's figures (dashboard.h). Everything here is read from
 * what already exists: the status builder, the metrics' counters, the
 * writer's statistics and the storage summaries; the page does the
 * arithmetic (rates, ratios) itself, so the JSON holds only what was
 * counted. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"
#include "coordinator/ops/dashboard.h"
#include "coordinator/base/counters.h"
#include "coordinator/base/routes.h"
#include "coordinator/config/config.h"
#include "coordinator/ops/status.h"
#include "coordinator/run/writer.h"

/* A number, or null where there is none yet (NaN: no version validated). */
static json_t *real_or_null(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

/* A peer's name as a JSON string. The activity row holds at most
 * STORAGE_NAME_MAX - 1 bytes of it, which may end inside a UTF-8
 * sequence: that partial character is dropped rather than the page lose
 * its figures to a string jansson refuses. */
static json_t *name_json(const char *name) {
    size_t n = strlen(name);
    for (int k = 0; k < 4 && n > 0; k++, n--) {
        json_t *j = json_stringn(name, n);
        if (j) return j;
    }
    return json_string("");
}

static json_t *u64_array(const uint64_t *v, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer((json_int_t)v[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *writer_json(const coord_writer_stats *ws) {
    json_t *ble = json_array(), *cle = json_array();
    for (size_t i = 0; ble && i < COORD_WRITER_BATCH_BUCKETS; i++)
        json_array_append_new(ble, json_integer((json_int_t)coord_writer_batch_le[i]));
    for (size_t i = 0; cle && i < COORD_WRITER_COMMIT_BUCKETS; i++)
        json_array_append_new(cle, json_real(coord_writer_commit_le[i]));
    /* Per bucket, not cumulative, the last one past every bound. */
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:o, s:f}", "jobs",
                     (json_int_t)ws->jobs, "commits", (json_int_t)ws->commits, "failed",
                     (json_int_t)ws->failed, "max_batch", (json_int_t)ws->max_batch, "queued",
                     (json_int_t)ws->queued, "checkpoints", (json_int_t)ws->checkpoints, "batch_le",
                     ble, "batch_counts", u64_array(ws->batch_hist, COORD_WRITER_BATCH_BUCKETS + 1),
                     "commit_le", cle, "commit_counts",
                     u64_array(ws->commit_hist, COORD_WRITER_COMMIT_BUCKETS + 1), "commit_seconds",
                     ws->commit_seconds);
}

static json_t *metrics_json(const coord_server *srv, const coord_writer_stats *ws) {
    const coord_metrics *m = &srv->ops.metrics;
    json_t *refused = json_object();
    for (size_t i = 0; refused && i < m->n_refused; i++)
        json_object_set_new(refused, m->refused[i].code, json_integer((json_int_t)m->refused[i].n));
    json_t *o = json_pack(
        "{s:I, s:o, s:I, s:I, s:I, s:f, s:o}", "uploads_accepted", (json_int_t)m->uploads_accepted,
        "uploads_refused", refused, "requests_in_flight", (json_int_t)srv->conns.inflight,
        "connections", (json_int_t)srv->conns.n_conns, "versions_made", (json_int_t)m->merge_count,
        "version_seconds", m->merge_sum, "writer", writer_json(ws));
    if (!o) return NULL;
    json_object_set_new(o, "validation_loss", real_or_null(srv->run.val_loss));
    json_object_set_new(o, "best_validation_loss", real_or_null(srv->run.best_val_loss));
    json_object_set_new(o, "training_loss", real_or_null(m->train_loss));
    return o;
}

/* The last hour, a minute at a time, oldest first; minutes nothing came
 * in are there with zeros, so the page draws a steady time axis. */
static json_t *minutes_json(const coord_metrics *m, int64_t now) {
    json_t *a = json_array();
    int64_t last = now / 60;
    for (int64_t k = COORD_METRICS_MINUTES - 1; a && k >= 0; k--) {
        int64_t minute = last - k;
        const coord_metrics_minute *mm = &m->minutes[minute % COORD_METRICS_MINUTES];
        int here = mm->minute == minute;
        json_t *o = json_pack("{s:I, s:I, s:I, s:I}", "t", (json_int_t)(minute * 60), "accepted",
                              (json_int_t)(here ? mm->accepted : 0), "refused",
                              (json_int_t)(here ? mm->refused : 0), "bytes",
                              (json_int_t)(here ? mm->bytes : 0));
        if (!o || json_array_append_new(a, o) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static json_t *refusals_json(const coord_metrics *m) {
    json_t *a = json_array();
    uint64_t n = m->n_recent < COORD_METRICS_RECENT ? m->n_recent : COORD_METRICS_RECENT;
    for (uint64_t i = 0; a && i < n; i++) {
        const coord_metrics_refusal *r = &m->recent[(m->n_recent - 1 - i) % COORD_METRICS_RECENT];
        json_t *o = json_pack("{s:I, s:I, s:s, s:i, s:s, s:s}", "at", (json_int_t)r->at, "peer",
                              (json_int_t)r->peer_id, "route", coord_route_label(r->route),
                              "status", r->status, "code", r->code, "address", r->addr);
        if (!o || json_array_append_new(a, o) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

typedef struct peers_ctx {
    const coord_server *srv;
    json_t *list;
    int64_t now;
    size_t next; /* the list entry the totals walk looks at */
} peers_ctx;

static int add_peer(void *arg, const storage_peer_activity *a) {
    peers_ctx *c = arg;
    const coord_metrics_peer *mp = coord_metrics_peer_find(&c->srv->ops.metrics, a->id);
    json_t *o =
        json_pack("{s:I, s:o, s:s, s:I, s:I, s:I, s:I, s:b, s:I}", "id", (json_int_t)a->id, "name",
                  name_json(a->name), "state", coord_peer_state(a, c->now, c->srv->run.cfg.lease_s),
                  "joined_at", (json_int_t)a->joined_at, "last_seen", (json_int_t)a->last_seen,
                  "leases", (json_int_t)a->leases, "updates", (json_int_t)a->updates, "revoked",
                  a->revoked, "refused", (json_int_t)(mp ? mp->refused : 0));
    if (!o) return VL_ENOMEM;
    json_object_set_new(o, "address", mp && mp->addr[0] ? json_string(mp->addr) : json_null());
    return json_array_append_new(c->list, o) == 0 ? VL_OK : VL_ENOMEM;
}

static int add_totals(void *arg, const storage_peer_totals *t) {
    peers_ctx *c = arg;
    /* Both walks go by id; a peer that joined between them is in this
     * one only, and is left for the next poll. */
    json_t *o = NULL;
    while (c->next < json_array_size(c->list)) {
        json_t *p = json_array_get(c->list, c->next);
        json_int_t id = json_integer_value(json_object_get(p, "id"));
        if (id > t->id) break;
        c->next++;
        if (id == t->id) {
            o = p;
            break;
        }
    }
    if (!o) return VL_OK;
    json_object_set_new(o, "merged", json_integer((json_int_t)t->merged));
    json_object_set_new(o, "mean_staleness", real_or_null(t->mean_staleness));
    json_object_set_new(o, "bytes", json_integer((json_int_t)t->bytes));
    /* Stored as the JSON the peer sent (routes_peers.c checked it); a
     * row that does not parse is shown as its text. */
    json_t *hw = json_loads(t->hardware, JSON_REJECT_DUPLICATES, NULL);
    json_object_set_new(o, "hardware", hw ? hw : json_string(t->hardware));
    return VL_OK;
}

json_t *coord_dashboard_json(coord_server *srv, vl_error *err) {
    int64_t now = vl_clock_unix_s();
    coord_writer_stats ws;
    coord_writer_stats_get(srv->run.writer, &ws);
    json_t *status =
        coord_status_json(srv->run.db, &srv->run.cfg, srv->run.version, srv->run.finished, &ws,
                          srv->run.net.mlp ? &srv->run.val_accuracy : NULL, err);
    if (!status) return NULL;
    peers_ctx pc = {.srv = srv, .list = json_array(), .now = now};
    int rc = pc.list ? VL_OK : vl_fail(err, VL_ENOMEM, "out of memory");
    if (rc == VL_OK) rc = storage_peer_each(srv->run.db, now, add_peer, &pc, err);
    if (rc == VL_OK) rc = storage_peer_totals_each(srv->run.db, add_totals, &pc, err);
    if (rc != VL_OK) {
        if (!err->code) vl_fail(err, rc, "out of memory");
        json_decref(status);
        json_decref(pc.list);
        return NULL;
    }
    char *cfg_text = coord_config_to_json(&srv->run.cfg, 1);
    json_t *cfg = cfg_text ? json_loads(cfg_text, 0, NULL) : NULL;
    free(cfg_text);
    json_t *o = json_pack("{s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:I}", "now", (json_int_t)now,
                          "status", status, "metrics", metrics_json(srv, &ws), "peers", pc.list,
                          "minutes", minutes_json(&srv->ops.metrics, now), "refusals",
                          refusals_json(&srv->ops.metrics), "config", cfg ? cfg : json_null(),
                          "dense_update_bytes",
                          (json_int_t)(coord_config_num_params(&srv->run.cfg) * sizeof(float)));
    if (!o) vl_fail(err, VL_ENOMEM, "out of memory");
    return o;
}
