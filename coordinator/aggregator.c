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

int coord_outer_step_sparse(float *theta, float *m, float *e, const float *dbar, size_t n,
                            double lr, double mu, size_t apply_k, uint32_t *idx, size_t *nnz,
                            vl_error *err) {
    for (size_t i = 0; i < n; i++) {
        double mi = mu * (double)m[i] + (double)dbar[i];
        m[i] = (float)mi;
        e[i] = (float)((double)e[i] + lr * ((double)dbar[i] + mu * mi));
    }
    int rc = compress_topk(e, n, apply_k, idx, nnz, err);
    if (rc != VL_OK) return rc;
    for (size_t j = 0; j < *nnz; j++) {
        uint32_t i = idx[j];
        theta[i] -= e[i];
        e[i] = 0;
    }
    return VL_OK;
}

size_t coord_change(const float *before, const float *after, size_t n, const uint32_t *cand,
                    size_t n_cand, uint32_t *idx, float *val) {
    size_t k = 0;
    size_t m = cand ? n_cand : n;
    for (size_t j = 0; j < m; j++) {
        size_t i = cand ? cand[j] : j;
        if (i >= n || after[i] == before[i]) continue;
        idx[k] = (uint32_t)i;
        val[k++] = after[i] - before[i];
    }
    return k;
}

typedef struct merge_ctx {
    const coord_config *cfg;
    size_t n_params;
    float *sum;          /* Σ nᵢ Δᵢ (dense and topk runs) */
    compress_sketch *sk; /* Σ nᵢ Sᵢ (sketch runs) */
    int64_t *ids;
    size_t n_ids, cap;
    double samples;      /* Σ nᵢ */
    double loss_sum;
    coord_round_acc *round; /* sketch runs with a second round, else NULL */
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
    if (compress_update_decode(u->blob, (size_t)u->nbytes, m->n_params, &cu, NULL, &e) != VL_OK)
        return vl_fail(m->err, VL_EDB, "stored update %lld no longer decodes: %s",
                       (long long)u->id, e.msg);
    float w = (float)u->num_samples;
    int rc = m->sk ? compress_update_accumulate_sketch(&cu, w, m->sk, m->err)
                   : compress_update_accumulate(&cu, w, m->sum, m->n_params, m->err);
    if (rc == VL_OK && m->round) rc = coord_round_acc_add(m->round, u->id, &cu, w, m->err);
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

/* Buffers of one merge, freed together. */
typedef struct merge_bufs {
    float *backup;   /* theta before the step */
    float *state;    /* the new optimiser state (n_state) */
    uint32_t *cand;  /* coordinates the step may have changed */
    uint32_t *idx;   /* the change */
    float *val;
    float *scratch;
    compress_sketch sk, mom, err;
} merge_bufs;

static void bufs_free(merge_bufs *b) {
    free(b->backup);
    free(b->state);
    free(b->cand);
    free(b->idx);
    free(b->val);
    free(b->scratch);
    compress_sketch_free(&b->sk);
    /* mom and err borrow their tables from state. */
}

/* A sketch header over a slice of the state vector, so that the momentum
 * and error sketches are stored in the version row like any state. */
static void sketch_view(compress_sketch *s, const coord_config *cfg, float *table) {
    s->rows = (uint32_t)cfg->comp_rows;
    s->cols = (uint32_t)cfg->comp_cols;
    s->seed = (uint64_t)cfg->comp_seed;
    s->table = table;
}

/* Applies the merged updates to theta (the model's parameters) according
 * to the run's compression; leaves the candidate coordinates in b->cand
 * (NULL: all of them). */
static int apply_step(coord_server *srv, merge_ctx *m, merge_bufs *b, size_t *n_cand,
                      vl_error *err) {
    const coord_config *cfg = &srv->cfg;
    size_t n = srv->n_params;
    float *theta = model_gpt_params(srv->gpt);
    const char *kind = cfg->compression_kind;
    /* The weighted sum becomes the weighted mean, in vector or sketch. */
    if (m->sk) coord_scale(m->sk->table, (size_t)m->sk->rows * m->sk->cols, 1.0 / m->samples);
    else coord_scale(m->sum, n, 1.0 / m->samples);
    if (strcmp(kind, "none") == 0) {
        coord_outer_step(theta, b->state, m->sum, n, cfg->outer_lr, cfg->outer_momentum);
        *n_cand = n;
        return VL_OK;
    }
    size_t apply_k = (size_t)cfg->apply_k;
    /* A second round picks from its candidates in place. */
    size_t room = m->round && m->round->n_cand > apply_k ? m->round->n_cand : apply_k;
    b->cand = malloc(room * sizeof *b->cand + 1);
    if (!b->cand) return vl_fail(err, VL_ENOMEM, "out of memory merging");
    if (strcmp(kind, "sketch") != 0) {
        return coord_outer_step_sparse(theta, b->state, b->state + n, m->sum, n, cfg->outer_lr,
                                       cfg->outer_momentum, apply_k, b->cand, n_cand, err);
    }
    size_t cells = (size_t)cfg->comp_rows * (size_t)cfg->comp_cols;
    sketch_view(&b->mom, cfg, b->state);
    sketch_view(&b->err, cfg, b->state + cells);
    b->scratch = malloc(n * sizeof(float) + 1);
    float *val = malloc(room * sizeof(float) + 1);
    int rc = VL_OK;
    if (!b->scratch || !val) rc = vl_fail(err, VL_ENOMEM, "out of memory merging");
    if (rc == VL_OK && m->round) {
        coord_round_acc *a = m->round;
        for (size_t t = 0; t < a->n_cand; t++) b->scratch[t] = (float)(a->sum[t] / m->samples);
        rc = compress_fetchsgd_accumulate(&b->mom, &b->err, &b->sk, cfg->outer_lr,
                                          cfg->outer_momentum, err);
        if (rc == VL_OK)
            rc = compress_fetchsgd_exact(&b->mom, &b->err, &b->sk, cfg->outer_lr,
                                         cfg->outer_momentum, a->cand, b->scratch, a->n_cand,
                                         apply_k, b->cand, val, n_cand, err);
    } else if (rc == VL_OK) {
        rc = compress_fetchsgd_step(&b->mom, &b->err, &b->sk, cfg->outer_lr,
                                    cfg->outer_momentum, n, apply_k, b->scratch, b->cand, val,
                                    n_cand, err);
    }
    if (rc == VL_OK)
        for (size_t j = 0; j < *n_cand; j++) theta[b->cand[j]] -= val[j];
    free(val);
    return rc;
}

/* Opens the second round of the current version: the candidates are the
 * heavy hitters of E after this round's accumulation, computed on copies
 * (nothing of the state changes until the version is made). */
static int open_round(coord_server *srv, vl_error *err) {
    const coord_config *cfg = &srv->cfg;
    size_t n = srv->n_params, cells = (size_t)cfg->comp_rows * (size_t)cfg->comp_cols;
    size_t n_cand = (size_t)coord_config_round_candidates(cfg);
    merge_ctx m = {.cfg = cfg, .n_params = n, .err = err};
    merge_bufs b;
    memset(&b, 0, sizeof b);
    b.state = malloc(srv->n_state * sizeof(float) + 1);
    b.scratch = malloc(n * sizeof(float) + 1);
    b.cand = malloc(n_cand * sizeof *b.cand + 1);
    b.val = malloc(n_cand * sizeof *b.val + 1);
    int rc = compress_sketch_init(&b.sk, (uint32_t)cfg->comp_rows, (uint32_t)cfg->comp_cols,
                                  (uint64_t)cfg->comp_seed, err);
    if (rc == VL_OK && (!b.state || !b.scratch || !b.cand || !b.val))
        rc = vl_fail(err, VL_ENOMEM, "out of memory opening a second round");
    m.sk = &b.sk;
    if (rc == VL_OK)
        rc = storage_update_each_pending(srv->db, srv->version, merge_one, &m, err);
    if (rc == VL_OK && m.samples <= 0)
        rc = vl_fail(err, VL_EDB, "version %lld has no stored updates to open a round on",
                     (long long)srv->version);
    size_t got = 0;
    if (rc == VL_OK) {
        coord_scale(b.sk.table, cells, 1.0 / m.samples);
        memcpy(b.state, srv->momentum, srv->n_state * sizeof(float));
        sketch_view(&b.mom, cfg, b.state);
        sketch_view(&b.err, cfg, b.state + cells);
        rc = compress_fetchsgd_accumulate(&b.mom, &b.err, &b.sk, cfg->outer_lr,
                                          cfg->outer_momentum, err);
    }
    if (rc == VL_OK)
        rc = compress_sketch_heavy(&b.err, n, n_cand, b.scratch, b.cand, b.val, &got, err);
    if (rc == VL_OK && got == 0)
        rc = vl_fail(err, VL_EINVAL, "a second round needs candidates");
    if (rc == VL_OK) {
        int64_t now = clock_unix_s();
        storage_round r = {.version = srv->version, .n = got, .candidates = b.cand,
                           .opened_at = now, .deadline = now + cfg->round_s};
        rc = storage_round_insert(srv->db, &r, err);
        if (rc == VL_OK)
            log_info("version %lld: second round open, %zu candidates, asking the peers of "
                     "its %zu updates for %lld s", (long long)srv->version, got, m.n_ids,
                     (long long)cfg->round_s);
    }
    free(m.ids);
    bufs_free(&b);
    return rc;
}

int coord_round_ready(coord_server *srv, int64_t n_updates, storage_round *r, vl_error *err) {
    int rc = storage_round_get(srv->db, srv->version, r, err);
    if (rc == VL_ENOTFOUND) {
        if ((rc = open_round(srv, err)) != VL_OK) return rc;
        coord_wake_waiters(srv);
        coord_arm_round_timer(srv, srv->cfg.round_s);
        return 0;
    }
    if (rc != VL_OK) return rc;
    int64_t have = 0;
    if ((rc = storage_round_values_count(srv->db, srv->version, &have, err)) != VL_OK) {
        storage_round_free(r);
        return rc;
    }
    int64_t now = clock_unix_s();
    if (have < n_updates && now < r->deadline) {
        coord_arm_round_timer(srv, (double)(r->deadline - now));
        storage_round_free(r);
        return 0;
    }
    return 1;
}

int coord_merge_if_ready(coord_server *srv, vl_error *err) {
    if (srv->finished) return 0;
    int64_t done = 0;
    int rc = storage_task_count_done(srv->db, srv->version, &done, err);
    if (rc != VL_OK) return rc;
    if (done < srv->cfg.updates_per_version) return 0;
    storage_round rnd;
    memset(&rnd, 0, sizeof rnd);
    coord_round_acc racc;
    memset(&racc, 0, sizeof racc);
    if (coord_config_round_candidates(&srv->cfg) > 0) {
        rc = coord_round_ready(srv, done, &rnd, err);
        if (rc <= 0) return rc;
        rc = coord_round_acc_init(&racc, srv, &rnd, err);
        if (rc != VL_OK) {
            storage_round_free(&rnd);
            return rc;
        }
    }

    size_t n = srv->n_params;
    int is_sketch = strcmp(srv->cfg.compression_kind, "sketch") == 0;
    merge_ctx m = {.cfg = &srv->cfg, .n_params = n, .err = err};
    merge_bufs b;
    memset(&b, 0, sizeof b);
    b.backup = malloc(n * sizeof(float) + 1);
    b.state = malloc(srv->n_state * sizeof(float) + 1);
    b.idx = malloc(n * sizeof *b.idx + 1);
    b.val = malloc(n * sizeof *b.val + 1);
    if (is_sketch) {
        rc = compress_sketch_init(&b.sk, (uint32_t)srv->cfg.comp_rows,
                                  (uint32_t)srv->cfg.comp_cols, (uint64_t)srv->cfg.comp_seed,
                                  err);
        if (rc != VL_OK) goto out;
        m.sk = &b.sk;
        if (rnd.n) m.round = &racc;
    } else {
        m.sum = calloc(n, sizeof(float));
    }
    if (!b.backup || !b.state || !b.idx || !b.val || (!is_sketch && !m.sum)) {
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

    float *theta = model_gpt_params(srv->gpt);
    memcpy(b.backup, theta, n * sizeof(float));
    memcpy(b.state, srv->momentum, srv->n_state * sizeof(float));
    size_t n_cand = 0;
    rc = apply_step(srv, &m, &b, &n_cand, err);
    if (rc != VL_OK) {
        memcpy(theta, b.backup, n * sizeof(float));
        goto out;
    }
    size_t nnz = coord_change(b.backup, theta, n, b.cand, n_cand, b.idx, b.val);
    float val_loss = eval_val(srv);

    int64_t next = srv->version + 1;
    int finished = next >= srv->cfg.max_versions;
    storage_version ver = {.version = next, .created_at = clock_unix_s(), .params = theta,
                           .momentum = b.state, .n = n, .n_state = srv->n_state,
                           .val_loss = val_loss, .train_loss = m.loss_sum / (double)m.n_ids,
                           .num_updates = (int64_t)m.n_ids, .has_change = 1,
                           .change_idx = b.idx, .change_val = b.val, .change_nnz = nnz};
    rc = storage_version_commit(srv->db, &ver, m.ids, m.n_ids, srv->cfg.keep_versions,
                                srv->cfg.keep_changes, finished, err);
    if (rc != VL_OK) {
        /* Memory goes back to the committed state, so what is served stays
         * what the database holds. */
        memcpy(theta, b.backup, n * sizeof(float));
        goto out;
    }
    float *old = srv->momentum;
    srv->momentum = b.state;
    b.state = old;
    srv->version = next;
    srv->finished = finished;
    if (srv->model_blob) {
        coord_blob_unref(srv->model_blob);
        srv->model_blob = NULL;
    }
    log_info("version %lld val_loss %.6f (train_loss %.6f, %zu updates, %zu coordinates "
             "changed)%s", (long long)next, (double)val_loss, ver.train_loss, m.n_ids, nnz,
             finished ? "; the run is finished" : "");
    if (m.round)
        log_info("version %lld: second round used %zu reported and %zu estimated updates over "
                 "%zu candidates", (long long)next, racc.reported, racc.estimated, racc.n_cand);
    rc = 1;
out:
    free(m.sum);
    free(m.ids);
    bufs_free(&b);
    coord_round_acc_free(&racc);
    storage_round_free(&rnd);
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
