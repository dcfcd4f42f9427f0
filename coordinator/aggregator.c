/* Merging a version's updates into the next version. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "compress/compress.h"
#include "coordinator/aggregator.h"
#include "coordinator/coord.h"

/* Validation batches are 8 windows of block_size bytes (protocol.md). */
#define VAL_BATCH 8
/* A merge that failed (the database was busy or full) is retried. */
#define MERGE_RETRY_S 5

void coord_outer_step(float *theta, float *momentum, const float *dbar, size_t n, double lr,
                      double mu) {
    for (size_t i = 0; i < n; i++) {
        double m = mu * (double)momentum[i] + (double)dbar[i];
        momentum[i] = (float)m;
        theta[i] = (float)((double)theta[i] - lr * ((double)dbar[i] + mu * m));
    }
}

void coord_scale(float *x, size_t n, double s) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)x[i] * s);
}

typedef struct merge_ctx {
    size_t n_params;
    float *sum;      /* Σ nᵢ Δᵢ */
    int64_t *ids;
    size_t n_ids, cap;
    double samples;  /* Σ nᵢ */
    double loss_sum;
    vl_error *err;
} merge_ctx;

static int merge_one(void *arg, const storage_update *u) {
    merge_ctx *m = arg;
    if (!u->blob)
        return vl_fail(m->err, VL_EDB, "update %lld has lost its stored body", (long long)u->id);
    if (m->n_ids == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        int64_t *ids = realloc(m->ids, cap * sizeof *ids);
        if (!ids) return vl_fail(m->err, VL_ENOMEM, "out of memory merging updates");
        m->ids = ids;
        m->cap = cap;
    }
    /* Stored updates passed these checks on arrival; failing now means the
     * database was damaged, which must stop the merge, not skew it. */
    compress_update cu;
    vl_error e = {0};
    if (compress_update_decode(u->blob, (size_t)u->nbytes, m->n_params, &cu, &e) != VL_OK)
        return vl_fail(m->err, VL_EDB, "stored update %lld no longer decodes: %s",
                       (long long)u->id, e.msg);
    int rc = compress_update_accumulate(&cu, (float)u->num_samples, m->sum, m->n_params, m->err);
    compress_update_free(&cu);
    if (rc != VL_OK) return rc;
    m->ids[m->n_ids++] = u->id;
    m->samples += (double)u->num_samples;
    m->loss_sum += u->loss;
    return VL_OK;
}

static float eval_val(coord_server *srv) {
    float loss = NAN;
    vl_error e = {0};
    const coord_corpus *c = &srv->corpus;
    if (model_gpt_eval_bytes(srv->gpt, c->val, (size_t)c->val_len, VAL_BATCH,
                             srv->cfg.model.block_size, (int)srv->cfg.val_batches, &loss,
                             &e) != VL_OK) {
        log_warn("validation failed: %s", e.msg);
        return NAN;
    }
    return loss;
}

int coord_merge_if_ready(coord_server *srv, vl_error *err) {
    if (srv->finished) return 0;
    int64_t done = 0;
    int rc = storage_task_count_done(srv->db, srv->version, &done, err);
    if (rc != VL_OK) return rc;
    if (done < srv->cfg.updates_per_version) return 0;

    size_t n = srv->n_params;
    merge_ctx m = {.n_params = n, .err = err};
    m.sum = calloc(n, sizeof(float));
    float *backup = malloc(n * sizeof(float));
    float *mom = malloc(n * sizeof(float));
    if (!m.sum || !backup || !mom) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory merging version %lld",
                     (long long)srv->version);
        goto out;
    }
    rc = storage_update_each_pending(srv->db, srv->version, merge_one, &m, err);
    if (rc != VL_OK) goto out;
    if ((int64_t)m.n_ids < srv->cfg.updates_per_version || m.samples <= 0) {
        rc = vl_fail(err, VL_EDB, "version %lld has %lld done tasks but %zu stored updates",
                     (long long)srv->version, (long long)done, m.n_ids);
        goto out;
    }
    coord_scale(m.sum, n, 1.0 / m.samples);

    float *theta = model_gpt_params(srv->gpt);
    memcpy(backup, theta, n * sizeof(float));
    memcpy(mom, srv->momentum, n * sizeof(float));
    coord_outer_step(theta, mom, m.sum, n, srv->cfg.outer_lr, srv->cfg.outer_momentum);
    float val_loss = eval_val(srv);

    int64_t next = srv->version + 1;
    int finished = next >= srv->cfg.max_versions;
    storage_version ver = {.version = next, .created_at = clock_unix_s(), .params = theta,
                           .momentum = mom, .n = n, .val_loss = val_loss,
                           .train_loss = m.loss_sum / (double)m.n_ids,
                           .num_updates = (int64_t)m.n_ids};
    rc = storage_version_commit(srv->db, &ver, m.ids, m.n_ids, srv->cfg.keep_versions, finished,
                                err);
    if (rc != VL_OK) {
        /* Memory goes back to the committed state, so what is served stays
         * what the database holds. */
        memcpy(theta, backup, n * sizeof(float));
        goto out;
    }
    float *old = srv->momentum;
    srv->momentum = mom;
    mom = old;
    srv->version = next;
    srv->finished = finished;
    if (srv->model_blob) {
        coord_blob_unref(srv->model_blob);
        srv->model_blob = NULL;
    }
    log_info("version %lld val_loss %.6f (train_loss %.6f, %zu updates)%s", (long long)next,
             (double)val_loss, ver.train_loss, m.n_ids, finished ? "; the run is finished" : "");
    rc = 1;
out:
    free(m.sum);
    free(m.ids);
    free(backup);
    free(mom);
    if (rc == 1) {
        coord_wake_waiters(srv);
        coord_arm_lease_timer(srv);
    }
    return rc;
}

static void merge_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    coord_server *srv = arg;
    srv->merge_scheduled = 0;
    vl_error err = {0};
    int rc = coord_merge_if_ready(srv, &err);
    if (rc < 0) {
        log_error("merge of version %lld failed, retrying in %d s: %s",
                  (long long)srv->version, MERGE_RETRY_S, err.msg);
        struct timeval tv = {MERGE_RETRY_S, 0};
        srv->merge_scheduled = 1;
        evtimer_add(srv->merge_event, &tv);
    }
}

void coord_schedule_merge(coord_server *srv) {
    if (!srv->merge_event) {
        srv->merge_event = evtimer_new(srv->base, merge_cb, srv);
        if (!srv->merge_event) {
            log_error("cannot schedule a merge: out of memory");
            return;
        }
    }
    if (srv->merge_scheduled) return;
    /* A few milliseconds let the 202 that completed the version leave
     * before the merge holds the loop. */
    struct timeval tv = {0, 5000};
    srv->merge_scheduled = 1;
    evtimer_add(srv->merge_event, &tv);
}
