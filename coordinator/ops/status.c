/* The run's summary (GET /v1/status, and `volley-coordinator status`
 * for a stopped coordinator or a copy of its database): versions and
 * their losses, peers by state, the local-steps and staleness
 * distributions, from the database; a running server adds its writer's
 * counters and a classifier's accuracy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"
#include "coordinator/config/config.h"
#include "coordinator/ops/status.h"
#include "coordinator/run/writer.h"

static int add_version(void *ctx, const storage_version *v) {
    json_t *arr = ctx;
    json_t *o = json_pack("{s:I, s:I, s:I}", "version", (json_int_t)v->version, "created_at",
                          (json_int_t)v->created_at, "num_updates", (json_int_t)v->num_updates);
    if (!o) return VL_ENOMEM;
    json_object_set_new(o, "val_loss",
                        isfinite(v->val_loss) ? json_real(v->val_loss) : json_null());
    json_object_set_new(o, "val_bits",
                        isfinite(v->val_loss) ? json_real(v->val_loss / M_LN2) : json_null());
    json_object_set_new(o, "train_loss",
                        isfinite(v->train_loss) ? json_real(v->train_loss) : json_null());
    json_object_set_new(o, "bytes_per_update",
                        isfinite(v->bytes_per_update) ? json_real(v->bytes_per_update)
                                                      : json_null());
    json_object_set_new(o, "refused", json_boolean(v->refused));
    if (v->refused)
        json_object_set_new(o, "refused_val_loss",
                            isfinite(v->refused_val_loss) ? json_real(v->refused_val_loss)
                                                          : json_null());
    return json_array_append_new(arr, o) == 0 ? VL_OK : VL_ENOMEM;
}

/* How a peer stands: active while it holds a lease or was seen within a
 * lease's length, gone once silent for COORD_GONE_LEASES leases, idle in
 * between. */
const char *coord_peer_state(const storage_peer_activity *a, int64_t now, int64_t lease_s) {
    if (a->revoked) return "revoked";
    if (a->leases > 0 || now - a->last_seen <= lease_s) return "active";
    if (now - a->last_seen > COORD_GONE_LEASES * lease_s) return "gone";
    return "idle";
}

typedef struct peers_ctx {
    json_t *list;
    int64_t now, lease_s;
    int64_t active, idle, gone;
} peers_ctx;

static int add_peer(void *arg, const storage_peer_activity *a) {
    peers_ctx *c = arg;
    const char *state = coord_peer_state(a, c->now, c->lease_s);
    c->active += strcmp(state, "active") == 0;
    c->idle += strcmp(state, "idle") == 0;
    c->gone += strcmp(state, "gone") == 0;
    /* No name: /v1/status answers anyone, and a volunteer's name is
     * personal (the operator has `volley-coordinator peer list`). */
    json_t *o = json_pack("{s:I, s:s, s:I, s:I, s:I}", "id", (json_int_t)a->id, "state", state,
                          "last_seen", (json_int_t)a->last_seen, "leases", (json_int_t)a->leases,
                          "updates", (json_int_t)a->updates);
    if (!o) return VL_ENOMEM;
    return json_array_append_new(c->list, o) == 0 ? VL_OK : VL_ENOMEM;
}

/* {"value": count, ...} as an object keyed by the value. */
static int add_count(void *arg, int64_t value, int64_t count) {
    char key[24];
    snprintf(key, sizeof key, "%lld", (long long)value);
    return json_object_set_new(arg, key, json_integer((json_int_t)count)) == 0 ? VL_OK : VL_ENOMEM;
}

json_t *coord_status_json(storage *db, const coord_config *cfg, int64_t version, int finished,
                          const coord_writer_stats *ws, const double *accuracy, vl_error *err) {
    int64_t peers = 0, updates = 0, slots = 0, unmerged = 0, now = vl_clock_unix_s();
    json_t *versions = json_array(), *steps = json_object(), *stale = json_object();
    peers_ctx pc = {.list = json_array(), .now = now, .lease_s = cfg->lease_s};
    int rc =
        versions && steps && stale && pc.list ? VL_OK : vl_fail(err, VL_ENOMEM, "out of memory");
    if (rc == VL_OK) rc = storage_peer_count(db, &peers, err);
    if (rc == VL_OK) rc = storage_update_count(db, &updates, err);
    if (rc == VL_OK) rc = storage_update_count_unmerged(db, &unmerged, err);
    if (rc == VL_OK)
        rc = coord_config_is_async(cfg) ? storage_task_count_leased(db, now, &slots, err)
                                        : storage_task_count_slots(db, version, now, &slots, err);
    if (rc == VL_OK) rc = storage_version_each(db, add_version, versions, err);
    if (rc == VL_OK) rc = storage_peer_each(db, now, add_peer, &pc, err);
    if (rc == VL_OK)
        rc = storage_update_histogram(db, STORAGE_HIST_LOCAL_STEPS, add_count, steps, err);
    if (rc == VL_OK)
        rc = storage_update_histogram(db, STORAGE_HIST_STALENESS, add_count, stale, err);
    if (rc != VL_OK) {
        json_decref(versions);
        json_decref(steps);
        json_decref(stale);
        json_decref(pc.list);
        return NULL;
    }
    json_t *o =
        json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:{s:I, s:I, s:I, s:o},"
                  " s:o, s:o}",
                  "run", cfg->name, "mode", cfg->mode, "status", finished ? "finished" : "running",
                  "version", (json_int_t)version, "max_versions", (json_int_t)cfg->max_versions,
                  "updates_per_version", (json_int_t)cfg->updates_per_version, "slots_taken",
                  (json_int_t)slots, "peers", (json_int_t)peers, "updates", (json_int_t)updates,
                  "unmerged", (json_int_t)unmerged, "versions", versions, "peer_states", "active",
                  (json_int_t)pc.active, "idle", (json_int_t)pc.idle, "gone", (json_int_t)pc.gone,
                  "list", pc.list, "local_steps", steps, "staleness", stale);
    if (!o) {
        vl_fail(err, VL_ENOMEM, "out of memory");
        return NULL;
    }
    /* The writer's counters exist only in a running server. */
    if (ws)
        json_object_set_new(
            o, "writer",
            json_pack("{s:I, s:I, s:I, s:I, s:I}", "jobs", (json_int_t)ws->jobs, "commits",
                      (json_int_t)ws->commits, "failed", (json_int_t)ws->failed, "max_batch",
                      (json_int_t)ws->max_batch, "checkpoints", (json_int_t)ws->checkpoints));
    /* A classifier's test accuracy, the figure its operators watch. */
    if (accuracy)
        json_object_set_new(o, "accuracy",
                            isfinite(*accuracy) ? json_real(*accuracy) : json_null());
    return o;
}

int coord_cmd_status(const char *db_path, FILE *out, vl_error *err) {
    storage *db = NULL;
    int rc = storage_open(db_path, 0, &db, err);
    if (rc != VL_OK) return rc;
    storage_run run;
    if ((rc = storage_run_get(db, &run, err)) != VL_OK) {
        storage_close(db);
        return rc;
    }
    coord_config cfg;
    vl_error cerr = {0};
    rc = coord_config_parse_stored(run.config, &cfg, &cerr);
    if (rc != VL_OK) {
        vl_fail(err, rc, "the stored run configuration: %s", cerr.msg);
    } else {
        json_t *o = coord_status_json(db, &cfg, run.current_version,
                                      run.status == STORAGE_RUN_FINISHED, NULL, NULL, err);
        /* Reals as the server writes them, so the two answers compare. */
        size_t flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9);
        char *text = o ? json_dumps(o, flags) : NULL;
        if (!o)
            rc = err->code ? err->code : VL_ENOMEM;
        else if (!text)
            rc = vl_fail(err, VL_ENOMEM, "out of memory");
        else
            fprintf(out, "%s\n", text);
        free(text);
        json_decref(o);
        coord_config_free(&cfg);
    }
    fflush(out);
    storage_run_free(&run);
    storage_close(db);
    return rc;
}
