/* Merging a version's updates into the next version: the job that
 * computes it and the writer job that stores it (opening a second round,
 * which reads the updates the same way, is round_open.c). When either
 * runs, and what follows it, is decided in sched/schedule.c, which starts
 * them and is called back when they are over. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "coordinator/run/aggregator.h"
#include "coordinator/run/factors.h"
#include "coordinator/run/round.h"
#include "coordinator/coord.h"
#include "coordinator/run/split.h"
#include "coordinator/base/robust.h"
#include "coordinator/run/score.h"
#include "coordinator/base/sched_rules.h"
#include "kernels/kernels.h"
#include "coordinator/base/counters.h"
#include "coordinator/base/outer.h"
#include "coordinator/config/config.h"
#include "coordinator/run/model.h"
#include "coordinator/run/run.h"
#include "coordinator/run/writer.h"
#include "coordinator/run/merge_internal.h"


/* An update's norm over the square root of its local steps: what
 * max_norm "auto" bounds. Honest peers that train a different number of
 * steps (dynamic_steps, down to an eighth) then stay within a factor of
 * about three of each other whether their norms grow with the steps or
 * with their square root. */
static double unit_norm(double norm, int64_t steps) {
    return norm / sqrt((double)(steps > 1 ? steps : 1));
}

/* Notes u as part of the version (its id and peer, to be marked merged)
 * with the norm it was sent with (NAN: set aside). */
static int note_update(merge_ctx *m, const storage_update *u, double norm) {
    if (m->n_ids == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        int64_t *ids = realloc(m->ids, cap * sizeof *ids);
        if (ids) m->ids = ids;
        double *norms = realloc(m->norms, cap * sizeof *norms);
        if (norms) m->norms = norms;
        double *units = realloc(m->units, cap * sizeof *units);
        if (units) m->units = units;
        int64_t *peers = realloc(m->peers, cap * sizeof *peers);
        if (peers) m->peers = peers;
        if (!ids || !norms || !units || !peers)
            return vl_fail(m->err, VL_ENOMEM, "out of memory merging updates");
        m->cap = cap;
    }
    m->units[m->n_ids] = unit_norm(norm, u->local_steps);
    m->norms[m->n_ids] = norm;
    m->peers[m->n_ids] = u->peer_id;
    m->ids[m->n_ids++] = u->id;
    return VL_OK;
}

/* An update whose stored body the disk lost, or that no longer decodes
 * (stored updates passed every check on arrival): it cannot be merged,
 * and retrying would stall the run for good, so it is left out of the
 * version, marked merged there so nothing offers it again, and logged. */
static int set_aside(merge_ctx *m, const storage_update *u, const char *why) {
    vl_log_warn("update %lld of peer %lld is left out of version %lld: %s", (long long)u->id,
                (long long)u->peer_id, (long long)m->version + 1, why);
    m->set_aside++;
    return note_update(m, u, NAN);
}

int coord_merge_one(void *arg, const storage_update *u) {
    merge_ctx *m = arg;
    if (!u->blob) return set_aside(m, u, u->lost ? u->lost : "its stored body is gone");
    compress_update cu;
    vl_error e = {0};
    int rc = compress_update_decode(u->blob, (size_t)u->nbytes, m->n_params, &cu, NULL, &e);
    if (rc == VL_ENOMEM)
        return vl_fail(m->err, rc, "out of memory decoding update %lld", (long long)u->id);
    if (rc != VL_OK) {
        char why[sizeof e.msg + 48];
        snprintf(why, sizeof why, "its stored body no longer decodes: %s", e.msg);
        return set_aside(m, u, why);
    }
    /* FedBuff: an update's weight is its sample count times s(tau), tau
     * counted as the commit will store it: versions made between its base
     * and the one it goes into. */
    int64_t tau = m->version - u->base_version;
    if (tau < 0) tau = 0;
    float w = (float)((double)u->num_samples * coord_staleness_weight(&m->cfg->staleness, tau));
    /* Stored with the update when it was accepted (the same function on
     * the same bytes); an update stored before migration 14 has none. */
    double norm = u->has_norm ? u->norm : compress_update_norm(&cu);
    /* The bound in m->robust is per square-root step when derived, and
     * every update is held to it at the run's full task length
     * (coord_norm_bound_held says why). */
    double bn = m->cfg->robust.auto_norm && m->cfg->robust.max_norm <= 0
                    ? unit_norm(norm, m->cfg->train.steps)
                    : norm;
    if (m->rb) {
        rc = coord_robust_acc_add(m->rb, &cu, (double)w, bn, m->err);
    } else {
        /* robust.max_norm's clip scales the update, not its weight. */
        double s = coord_robust_bound_scale(&m->robust, bn);
        float ws = (float)((double)w * s);
        if (s < 1) m->bounded++;
        rc = m->sk ? compress_update_accumulate_sketch(&cu, ws, m->sk, m->err)
                   : compress_update_accumulate(&cu, ws, m->sum, m->n_params, m->err);
        if (rc == VL_OK && m->round) rc = coord_round_acc_add(m->round, u->id, &cu, ws, m->err);
    }
    if (rc == VL_OK && m->factors) rc = coord_factors_add(m->factors, &cu, u->id, m->err);
    if (rc == VL_OK && cu.meta.has_accuracy) {
        m->acc_sum += (double)w * cu.meta.accuracy;
        m->acc_w += (double)w;
    }
    compress_update_free(&cu);
    if (rc == VL_OK) rc = note_update(m, u, norm);
    if (rc != VL_OK) return rc;
    m->samples += (double)w;
    m->loss_sum += u->loss;
    m->bytes += u->nbytes;
    if (u->base_version < m->version) m->stale++;
    return VL_OK;
}


void coord_merge_bufs_free(merge_bufs *b) {
    free(b->next);
    free(b->state);
    free(b->cand);
    free(b->idx);
    free(b->val);
    free(b->scratch);
    compress_sketch_free(&b->sk);
    /* mom and err borrow their tables from state. */
}

/* The second round's step: every value applied is exact (the mean of the
 * reported values at the chosen candidates, see compress_round_take), fed
 * through the run's outer step like a dense update that is zero
 * elsewhere, so the momentum of earlier versions carries on everywhere. */
static int round_step(const coord_config *cfg, size_t n, const merge_ctx *m, merge_bufs *b,
                      float *theta, size_t *n_cand, vl_error *err) {
    const coord_round_acc *a = m->round;
    compress_sketch E;
    float *mom, *age;
    coord_round_views(cfg, n, b->state, &E, &mom, &age);
    float *exact = malloc(a->n_cand * sizeof *exact + 1);
    float *val = malloc(a->n_cand * sizeof *val + 1);
    int rc = exact && val ? coord_round_accumulate(&E, &b->sk, err)
                          : vl_fail(err, VL_ENOMEM, "out of memory merging");
    size_t got = 0;
    /* With no answer at all there is nothing exact to apply this time;
     * E keeps the round's mass for later. */
    if (rc == VL_OK && a->weight > 0) {
        for (size_t t = 0; t < a->n_cand; t++) exact[t] = (float)(a->sum[t] / a->weight);
        rc = compress_round_take(&E, a->cand, exact, a->n_cand, age, n, COORD_ROUND_MAX_GAP,
                                 (size_t)cfg->apply_k, b->cand, val, &got, err);
    }
    if (rc == VL_OK) {
        memset(b->scratch, 0, n * sizeof *b->scratch);
        for (size_t j = 0; j < got; j++) b->scratch[b->cand[j]] = val[j];
        coord_outer_step(theta, mom, b->scratch, n, cfg->outer_lr, cfg->outer_momentum);
        /* The momentum moves every coordinate: the change is found by
         * comparing them all. */
        free(b->cand);
        b->cand = NULL;
        *n_cand = n;
    }
    free(exact);
    free(val);
    return rc;
}

/* Applies the merged updates to theta (a copy of the model's parameters)
 * according to the run's compression; leaves the candidate coordinates in
 * b->cand (NULL: all of them). */
static int apply_step(coord_server *srv, merge_ctx *m, merge_bufs *b, float *theta, size_t *n_cand,
                      vl_error *err) {
    const coord_config *cfg = &srv->run.cfg;
    size_t n = srv->run.n_params;
    const char *kind = cfg->compression_kind;
    /* The weighted sum becomes the weighted mean, in vector or sketch; a
     * robust rule writes its combination there instead. */
    if (m->rb) {
        int rc = coord_robust_acc_finish(m->rb, m->sk ? m->sk->table : m->sum, err);
        if (rc != VL_OK) return rc;
    } else if (m->sk) {
        coord_scale(m->sk->table, (size_t)m->sk->rows * m->sk->cols, 1.0 / m->samples);
    } else {
        coord_scale(m->sum, n, 1.0 / m->samples);
    }
    /* After refused versions the step backs off, halved for each refusal
     * in a row: a refusal restarts the outer momentum, and the first step
     * from rest (1 + mu times the mean update) can overshoot the guard
     * again and again on skewed updates, which would hold the run at its
     * version forever. */
    if (srv->run.refused_streak > 0) {
        int k = srv->run.refused_streak < COORD_MAX_BACKOFF ? srv->run.refused_streak
                                                            : COORD_MAX_BACKOFF;
        double s = ldexp(1.0, -k);
        if (m->sk)
            coord_scale(m->sk->table, (size_t)m->sk->rows * m->sk->cols, s);
        else
            coord_scale(m->sum, n, s);
    }
    int dense = strcmp(kind, "none") == 0;
    if (cfg->outer_delay > 1 && strcmp(kind, "sketch") != 0) {
        /* Delayed Nesterov: the optimiser state is [m, e (sparse kinds),
         * buf], and the step lands in theta (dense) or e (sparse). */
        float *acc = b->state + (dense ? n : 2 * n);
        coord_outer_delayed(m->sum, b->state, acc, n, cfg->outer_lr, cfg->outer_momentum,
                            cfg->outer_delay,
                            coord_outer_delay_due(m->version + 1, cfg->outer_delay));
        if (dense) {
            for (size_t i = 0; i < n; i++) theta[i] -= m->sum[i];
            *n_cand = n;
            return VL_OK;
        }
        float *e = b->state + n;
        for (size_t i = 0; i < n; i++) e[i] += m->sum[i];
        b->cand = malloc((size_t)cfg->apply_k * sizeof *b->cand + 1);
        if (!b->cand) return vl_fail(err, VL_ENOMEM, "out of memory merging");
        return coord_apply_largest(theta, e, n, (size_t)cfg->apply_k, b->cand, n_cand, err);
    }
    /* An async version of mostly stale updates takes no momentum step. */
    int plain = coord_config_is_async(cfg) && cfg->outer_momentum > 0 &&
                !coord_outer_momentum_due(m->stale, m->n_ids);
    m->plain = plain;
    if (dense) {
        if (plain)
            coord_outer_plain(theta, m->sum, n, cfg->outer_lr);
        else
            coord_outer_step(theta, b->state, m->sum, n, cfg->outer_lr, cfg->outer_momentum);
        *n_cand = n;
        return VL_OK;
    }
    size_t apply_k = (size_t)cfg->apply_k;
    /* A second round picks from its candidates in place. */
    size_t room = m->round && m->round->n_cand > apply_k ? m->round->n_cand : apply_k;
    b->cand = malloc(room * sizeof *b->cand + 1);
    if (!b->cand) return vl_fail(err, VL_ENOMEM, "out of memory merging");
    if (plain && strcmp(kind, "sketch") != 0)
        return coord_outer_plain_sparse(theta, b->state + n, m->sum, n, cfg->outer_lr, apply_k,
                                        b->cand, n_cand, err);
    if (strcmp(kind, "sketch") != 0) {
        return coord_outer_step_sparse(theta, b->state, b->state + n, m->sum, n, cfg->outer_lr,
                                       cfg->outer_momentum, apply_k, b->cand, n_cand, err);
    }
    b->scratch = malloc(n * sizeof(float) + 1);
    if (!b->scratch) return vl_fail(err, VL_ENOMEM, "out of memory merging");
    if (coord_config_round_candidates(cfg) > 0) {
        /* A version closed by its deadline before its round opened has no
         * exact values: E takes its sketch and nothing is applied. */
        if (m->round) return round_step(cfg, n, m, b, theta, n_cand, err);
        compress_sketch E;
        float *mom, *age;
        coord_round_views(cfg, n, b->state, &E, &mom, &age);
        *n_cand = 0;
        return coord_round_accumulate(&E, &b->sk, err);
    }
    size_t cells = (size_t)cfg->comp_rows * (size_t)cfg->comp_cols;
    coord_sketch_view(&b->mom, cfg, b->state);
    coord_sketch_view(&b->err, cfg, b->state + cells);
    float *val = malloc(room * sizeof(float) + 1);
    int rc =
        val ? compress_fetchsgd_step(&b->mom, &b->err, &b->sk, cfg->outer_lr, cfg->outer_momentum,
                                     n, apply_k, b->scratch, b->cand, val, n_cand, err)
            : vl_fail(err, VL_ENOMEM, "out of memory merging");
    if (rc == VL_OK)
        for (size_t j = 0; j < *n_cand; j++) theta[b->cand[j]] -= val[j];
    free(val);
    return rc;
}

/* A version being made: computed on the compute thread from the updates
 * stored when it was due, then committed by the writer. */
typedef struct merge_job {
    coord_job job;
    coord_server *srv;
    merge_bufs b;
    merge_ctx m;
    vl_error merr;        /* merge_ctx reports here on the compute thread */
    storage_round rnd;    /* a second round's candidates (n = 0: none) */
    coord_round_acc racc; /* and its values */
    coord_robust_acc rb;  /* the updates, for a rule other than mean */
    storage_version ver;
    storage_commit_opts opts;
    compress_factors_sum fsum; /* K-FAC runs that share factors */
    vl_buf fbuf;               /* and the merged factors file */
    double compute_s, eval_s;  /* what the compute thread spent, validation included */
    /* Taken on the loop when the merge starts (the background scores
     * change the server's): the loss a version is held against (the best
     * check loss, or the best validation loss where there is no check),
     * and the current version's validation loss when it is known. */
    double best_loss, cur_loss;
    double check_loss;      /* the version's check loss (its validation loss without a check) */
    double accuracy;        /* a classifier's on the test set (NaN: none) */
    double split_loss;      /* split runs: mean loss of the batches since the last */
    int64_t bound_quorum;   /* coord_norm_bound_quorum, taken on the loop */
    char digest[65];        /* the version's parameter digest ("": not computed) */
    coord_blob *model_blob; /* the version's model file (NULL: built on demand) */
    coord_merge_after_fn after;
} merge_job;

static int merge_run(storage *db, coord_job *job, vl_error *err) {
    merge_job *j = (merge_job *)job;
    return storage_version_commit(db, &j->ver, j->m.ids, j->m.n_ids, &j->opts, err);
}

static void merge_job_free(merge_job *j) {
    if (j->model_blob) coord_blob_unref(j->model_blob);
    compress_factors_sum_free(&j->fsum);
    vl_buf_free(&j->fbuf);
    coord_round_acc_free(&j->racc);
    storage_round_free(&j->rnd);
    coord_robust_acc_free(&j->rb);
    free(j->m.sum);
    free(j->m.ids);
    free(j->m.peers);
    free(j->m.norms);
    free(j->m.units);
    coord_merge_bufs_free(&j->b);
    free(j);
}

static void merge_failed(coord_server *srv, merge_job *j, int rc, const vl_error *err) {
    srv->sched.merging = 0;
    /* Before the job goes: err lives in it. */
    j->after(srv, rc, err);
    merge_job_free(j);
}

/* A refused version, with the updates that made it (update:peer), so an
 * operator can see whose they were. */
static void log_refused(const coord_server *srv, const merge_job *j) {
    char list[512] = "";
    size_t used = 0;
    for (size_t i = 0; i < j->m.n_ids && used < sizeof list; i++) {
        int w = snprintf(list + used, sizeof list - used, "%s%lld:%lld", i ? " " : "",
                         (long long)j->m.ids[i], (long long)j->m.peers[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    if (used >= sizeof list) memcpy(list + sizeof list - 4, "...", 4);
    /* merge_done has counted this refusal already. */
    int k =
        srv->run.refused_streak < COORD_MAX_BACKOFF ? srv->run.refused_streak : COORD_MAX_BACKOFF;
    vl_log_warn("version %lld refused: its validation loss %.6f is not finite or more than "
                "%.0f%% above the best so far (%.6f); it keeps version %lld's parameters, the "
                "outer optimiser restarts from zero and the next step is scaled by 1/%d; its "
                "updates (update:peer) were %s",
                (long long)j->ver.version, j->ver.refused_val_loss,
                srv->run.cfg.max_loss_rise * 100.0, j->best_loss, (long long)j->ver.version - 1,
                1 << k, list);
}

static void merge_done(coord_job *job, int rc, const vl_error *err) {
    merge_job *j = (merge_job *)job;
    coord_server *srv = j->srv;
    if (rc != VL_OK) {
        merge_failed(srv, j, rc, err);
        return;
    }
    srv->sched.merging = 0;
    /* Committed: the served model, optimiser state and version move on. */
    memcpy(coord_model_params(&srv->run.net), j->b.next, srv->run.n_params * sizeof(float));
    /* A refused version keeps its predecessor's parameters and so its
     * accuracy; the next step backs off (apply_step). */
    if (!j->ver.refused) srv->run.val_accuracy = j->accuracy;
    srv->run.refused_streak = j->ver.refused ? srv->run.refused_streak + 1 : 0;
    float *old = srv->run.momentum;
    srv->run.momentum = j->b.state;
    j->b.state = old;
    srv->run.version = j->ver.version;
    if (j->digest[0]) {
        memcpy(srv->caches.digest_hex, j->digest, sizeof j->digest);
        srv->caches.digest_version = srv->run.version;
    }
    coord_metrics_version(&srv->ops.metrics, j->compute_s, j->ver.train_loss);
    coord_norm_bound_refresh(srv);
    int checked = srv->run.cfg.val_check_batches > 0;
    if (isfinite(j->ver.val_loss) || !checked) {
        srv->run.val_loss = j->ver.val_loss;
        srv->run.val_loss_version = srv->run.version;
    }
    if (isfinite(j->ver.val_loss) &&
        (!isfinite(srv->run.best_val_loss) || j->ver.val_loss < srv->run.best_val_loss))
        srv->run.best_val_loss = j->ver.val_loss;
    if (checked && !j->ver.refused && isfinite(j->check_loss) &&
        (!isfinite(srv->run.best_check_loss) || j->check_loss < srv->run.best_check_loss))
        srv->run.best_check_loss = j->check_loss;
    srv->run.version_born = vl_clock_mono_s();
    srv->run.finished = j->opts.finished;
    /* The file built with the version replaces the last one (NULL: the
     * first download builds it). */
    if (srv->caches.model_blob) coord_blob_unref(srv->caches.model_blob);
    srv->caches.model_blob = j->model_blob;
    j->model_blob = NULL;
    if (j->ver.factors) srv->run.factors_version = j->ver.version;
    if (j->ver.refused) log_refused(srv, j);
    if (j->m.plain && !j->ver.refused && srv->run.plain_versions++ % 50 == 0)
        vl_log_warn("version %lld: %zu of its %zu updates were stale, so it took its outer step "
                    "without momentum (%lld such versions so far); updates_per_version below "
                    "the number of peers, or peers slower than lease_wait allows, cause it",
                    (long long)j->ver.version, j->m.stale, j->m.n_ids,
                    (long long)srv->run.plain_versions);
    if (j->m.set_aside)
        vl_log_warn("version %lld: %zu of its %zu updates were set aside, their stored bodies "
                    "unreadable",
                    (long long)j->ver.version, j->m.set_aside, j->m.n_ids);
    if (srv->run.net.mlp)
        coord_model_log_version(srv, &j->ver, j->m.n_ids, j->m.stale,
                                j->m.n_ids ? (double)j->m.bytes / (double)j->m.n_ids : 0.0,
                                j->compute_s, j->split_loss);
    else if (checked && !isfinite(j->ver.val_loss))
        vl_log_info("version %lld check_loss %.6f on %lld held-out %s (train_loss %.6f, %zu "
                    "updates of which %zu stale, %.0f bytes per update, %zu coordinates "
                    "changed; merged in %.2f s, the check %.2f s of it); its val_loss on %lld "
                    "follows from the background",
                    (long long)j->ver.version, j->check_loss,
                    (long long)coord_val_scored_tokens(&srv->run.cfg, &srv->run.corpus,
                                                       &srv->run.shards,
                                                       srv->run.cfg.val_check_batches),
                    srv->run.cfg.shards ? "tokens" : "bytes", j->ver.train_loss, j->m.n_ids,
                    j->m.stale, j->m.n_ids ? (double)j->m.bytes / (double)j->m.n_ids : 0.0,
                    j->ver.change_nnz, j->compute_s, j->eval_s,
                    (long long)coord_val_scored_tokens(&srv->run.cfg, &srv->run.corpus,
                                                       &srv->run.shards, srv->run.cfg.val_batches));
    else /* bits per byte (per token in a shard run) compare across
          * vocabularies and with published figures; nats are what
          * training minimises */
        vl_log_info("version %lld val_loss %.6f (%.4f bits per %s; train_loss %.6f, %zu updates of "
                    "which %zu stale, %.0f bytes per update, %zu coordinates changed%s; merged in "
                    "%.2f s, validation %.2f s of it)%s",
                    (long long)j->ver.version, j->ver.val_loss, j->ver.val_loss / M_LN2,
                    srv->run.cfg.shards ? "token" : "byte", j->ver.train_loss, j->m.n_ids,
                    j->m.stale, j->m.n_ids ? (double)j->m.bytes / (double)j->m.n_ids : 0.0,
                    j->ver.change_nnz, j->ver.factors ? ", K-FAC factors merged" : "", j->compute_s,
                    j->eval_s, srv->run.finished ? "; the run is finished" : "");
    /* Served on its check: its full score follows (score.h). */
    if (checked && !isfinite(j->ver.val_loss))
        coord_score_queue(srv, srv->run.version, coord_model_params(&srv->run.net));
    coord_merge_after_fn after = j->after;
    merge_job_free(j);
    after(srv, VL_OK, NULL);
}

/* What the updates' norms were and what the run's defences did to them;
 * norms far above the median are where hostile peers show. */
static void log_robust(const merge_ctx *m, int64_t next) {
    double max, med = coord_robust_median_known(m->norms, m->n_ids, &max);
    const coord_robust_config *r = &m->cfg->robust;
    size_t bounded = m->rb ? m->rb->bounded : m->bounded;
    vl_log_info("version %lld: %s of %zu updates, norms median %.6g max %.6g; %zu scaled down "
                "to max_norm, %zu clipped by norm_clip",
                (long long)next, coord_rule_name(r->rule), m->n_ids, med, max, bounded,
                m->rb ? m->rb->clipped : 0);
}

/* On the compute thread: every update stored and not yet merged, read on
 * its own connection, summed with its weight, the outer step applied to a
 * copy of the parameters, and the result validated. Nothing here touches
 * what the loop changes: the served parameters are only read (the loop
 * replaces them in merge_done, after this), the eval model is used by
 * merges alone, and one merge runs at a time. */
static int merge_compute(storage *db, coord_job *job, vl_error *err) {
    merge_job *j = (merge_job *)job;
    coord_server *srv = j->srv;
    merge_ctx *m = &j->m;
    merge_bufs *b = &j->b;
    size_t n = srv->run.n_params;
    m->err = &j->merr;
    /* Per thread: only the compute thread's parallel regions change. */
    if (srv->run.compute_threads > 0) kernels_set_num_threads(srv->run.compute_threads);
    /* 1. the updates, decoded, weighed and summed */
    /* Async: exactly the buffer's updates_per_version, oldest first; sync:
     * what waits, up to a bound (coord_config_merge_max). */
    double t0 = vl_clock_mono_s();
    int rc = storage_update_each_oldest(db, coord_config_merge_max(&srv->run.cfg), coord_merge_one,
                                        m, &j->merr);
    if (rc == VL_OK && m->n_ids == 0)
        rc = vl_fail(&j->merr, VL_EDB, "version %lld was due but no stored update was found",
                     (long long)m->version);
    /* 2. the outer step from the current parameters */
    const float *theta = coord_model_params(&srv->run.net);
    size_t n_cand = 0;
    if (rc == VL_OK) {
        memcpy(b->next, theta, n * sizeof(float));
        /* Every update set aside: the version changes nothing and keeps
         * the optimiser state (b->state is the current one), so the run
         * goes on past the damaged bodies. */
        if (m->samples > 0) rc = apply_step(srv, m, b, b->next, &n_cand, &j->merr);
        /* The coordinator's own layers go into the version as they are. */
        if (rc == VL_OK && srv->run.split) {
            j->split_loss = coord_split_into(srv->run.split, b->next);
            /* Its change lies outside any candidate list: compare all. */
            free(b->cand);
            b->cand = NULL;
            n_cand = n;
        }
    }
    if (rc != VL_OK) {
        *err = j->merr;
        return rc;
    }
    /* 3. the version scored: its loss check, or its full score */
    int64_t next = m->version + 1;
    int finishing = next >= srv->run.cfg.max_versions;
    /* A run with a loss check serves a version on it and scores it in
     * full in the background (score.h), except the one that finishes the
     * run, which is also scored here. */
    int checked = srv->run.cfg.val_check_batches > 0;
    double t_eval = vl_clock_mono_s();
    float val_loss = NAN, check_loss = NAN;
    j->accuracy = NAN;
    if (checked) rc = coord_score_check(srv, b->next, &check_loss, &j->merr);
    if (rc == VL_OK && (!checked || finishing))
        rc = coord_score_full(srv, b->next, &val_loss, &j->accuracy, &j->merr);
    if (rc != VL_OK) {
        vl_fail(err, rc, "validating version %lld: %s", (long long)next, j->merr.msg);
        return rc;
    }
    /* A classifier without a test set of its own is judged by the mean
     * loss its peers report (on their batches, before the step). */
    if (srv->run.net.mlp && srv->run.test.n == 0 && m->n_ids > m->set_aside)
        val_loss = (float)(m->loss_sum / (double)(m->n_ids - m->set_aside));
    /* ... and by the accuracy they measured on their own data. */
    if (srv->run.net.mlp && srv->run.test.n == 0 && m->acc_w > 0)
        j->accuracy = m->acc_sum / m->acc_w;
    if (!checked) check_loss = val_loss;
    j->check_loss = check_loss;
    j->eval_s = vl_clock_mono_s() - t_eval;
    /* 4. refused or kept */
    /* A version whose loss blew up is refused, not served: it keeps the
     * current parameters, and the outer optimiser's state (momentum, the
     * sketch's error, the delayed step's buffer) restarts from zero, since
     * that state is what carried the step that failed. Its updates count
     * as merged, so they are not offered again. */
    int refused = coord_sched_version_refused(check_loss, j->best_loss, srv->run.cfg.max_loss_rise);
    if (refused) {
        memcpy(b->next, theta, n * sizeof(float));
        memset(b->state, 0, srv->run.n_state * sizeof(float));
        n_cand = 0;
    }
    /* 5. the version as the writer stores it */
    size_t nnz = coord_change(theta, b->next, n, b->cand, n_cand, b->idx, b->val);
    j->ver = (storage_version){
        .version = next,
        .created_at = vl_clock_unix_s(),
        .params = b->next,
        .momentum = b->state,
        .n = n,
        .n_state = srv->run.n_state,
        .val_loss = refused ? j->cur_loss : val_loss,
        .train_loss =
            m->n_ids > m->set_aside ? m->loss_sum / (double)(m->n_ids - m->set_aside) : NAN,
        .num_updates = (int64_t)m->n_ids,
        .has_change = 1,
        .change_idx = b->idx,
        .change_val = b->val,
        .change_nnz = nnz,
        .refused = refused,
        .refused_val_loss = check_loss,
        .update_norm = refused ? NAN
                               : coord_norm_bound_figure(srv, j->bound_quorum, next, m->peers,
                                                         m->units, m->n_ids)};
    j->opts = (storage_commit_opts){.keep_versions = srv->run.cfg.keep_versions,
                                    .keep_changes = srv->run.cfg.keep_changes,
                                    .keep_update_blobs = srv->run.cfg.keep_update_blobs,
                                    .finished = finishing,
                                    .expire_old_leases = !coord_config_is_async(&srv->run.cfg)};
    if (m->factors &&
        (rc = coord_factors_merged(srv, m->factors, next, &j->fbuf, &j->ver, &j->merr)) != VL_OK) {
        *err = j->merr;
        return rc;
    }
    /* 6. what is served with it, built here rather than on the loop */
    /* Peers of a sparse run catch up by delta, whose file carries the
     * version's digest: computed here rather than by the first delta
     * request on the loop, since hashing every parameter takes long on a
     * large model (docs/benchmarks.md, "Figures the code relies on"). */
    if (strcmp(srv->run.cfg.compression_kind, "none") != 0 &&
        coord_params_digest(b->next, n, j->digest, &j->merr) != VL_OK)
        j->digest[0] = '\0';
    /* The version's file, so that the first GET /v1/model after it does
     * not build it on the loop. Its validation loss as the loop would
     * write it: none for a version served on its check. A failure leaves
     * it to be built on demand, as before. */
    vl_error be = {0};
    double file_loss = isfinite(j->ver.val_loss) || !checked ? j->ver.val_loss : NAN;
    if (coord_model_blob_build(srv, b->next, next, file_loss, &j->model_blob, &be) != VL_OK) {
        vl_log_debug("version %lld: its model file is left to the first download: %s",
                     (long long)next, be.msg);
        j->model_blob = NULL;
    }
    j->compute_s = vl_clock_mono_s() - t0;
    log_robust(m, next);
    if (m->round)
        vl_log_info("version %lld: second round used %zu reported and %zu silent updates over "
                    "%zu candidates",
                    (long long)next, j->racc.reported, j->racc.silent, j->racc.n_cand);
    return VL_OK;
}

/* Back on the loop: the computed version goes to the writer. */
static void merge_computed(coord_job *job, int rc, const vl_error *err) {
    merge_job *j = (merge_job *)job;
    if (rc != VL_OK) {
        merge_failed(j->srv, j, rc, err);
        return;
    }
    j->job.run = merge_run;
    j->job.done = merge_done;
    coord_writer_submit(j->srv->run.writer, &j->job);
}

int coord_merge_start(coord_server *srv, storage_round *r, coord_merge_after_fn after,
                      vl_error *err) {
    size_t n = srv->run.n_params;
    int is_sketch = strcmp(srv->run.cfg.compression_kind, "sketch") == 0;
    merge_job *j = calloc(1, sizeof *j);
    if (!j) {
        if (r) storage_round_free(r);
        return vl_fail(err, VL_ENOMEM, "out of memory merging version %lld",
                       (long long)srv->run.version);
    }
    j->after = after;
    int rc = VL_OK;
    if (r) {
        j->rnd = *r;
        *r = (storage_round){0};
        rc = coord_round_acc_init(&j->racc, srv, &j->rnd, err);
        if (rc != VL_OK) {
            memset(&j->racc, 0, sizeof j->racc);
            merge_job_free(j);
            return rc;
        }
    }
    merge_ctx *m = &j->m;
    merge_bufs *b = &j->b;
    *m = (merge_ctx){.cfg = &srv->run.cfg,
                     .n_params = n,
                     .err = &j->merr,
                     .version = srv->run.version,
                     .robust = srv->run.cfg.robust};
    m->robust.max_norm = coord_norm_bound(srv);
    if (srv->run.cfg.robust.rule != COORD_RULE_MEAN) {
        size_t d = is_sketch ? (size_t)srv->run.cfg.comp_rows * (size_t)srv->run.cfg.comp_cols : n;
        coord_robust_acc_init(&j->rb, &m->robust, srv->run.spec.kind, d);
        m->rb = &j->rb;
    }
    b->next = malloc(n * sizeof(float) + 1);
    b->state = malloc(srv->run.n_state * sizeof(float) + 1);
    b->idx = malloc(n * sizeof *b->idx + 1);
    b->val = malloc(n * sizeof *b->val + 1);
    if (is_sketch) {
        rc = compress_sketch_init(&b->sk, (uint32_t)srv->run.cfg.comp_rows,
                                  (uint32_t)srv->run.cfg.comp_cols,
                                  (uint64_t)srv->run.cfg.comp_seed, err);
        if (rc != VL_OK) goto fail;
        m->sk = &b->sk;
        if (j->rnd.n) m->round = &j->racc;
    } else {
        m->sum = calloc(n, sizeof(float));
    }
    if (!b->next || !b->state || !b->idx || !b->val || (!is_sketch && !m->sum)) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory merging version %lld",
                     (long long)srv->run.version);
        goto fail;
    }
    if (srv->run.factor_layers) {
        rc = compress_factors_sum_init(&j->fsum, srv->run.factor_layers, srv->run.n_factor_layers,
                                       err);
        if (rc != VL_OK) goto fail;
        m->factors = &j->fsum;
    }
    /* The state is copied here, on the loop, which alone replaces it. */
    memcpy(b->state, srv->run.momentum, srv->run.n_state * sizeof(float));
    j->best_loss =
        srv->run.cfg.val_check_batches > 0 ? srv->run.best_check_loss : srv->run.best_val_loss;
    j->cur_loss = srv->run.val_loss_version == srv->run.version ? srv->run.val_loss : NAN;
    j->bound_quorum = coord_norm_bound_quorum(srv);
    j->srv = srv;
    j->job.run = merge_compute;
    j->job.done = merge_computed;
    srv->sched.merging = 1;
    coord_writer_compute(srv->run.writer, &j->job);
    return VL_OK;
fail:
    merge_job_free(j);
    return rc;
}
