/* POST /v1/updates: validation in the order of protocol.md on the loop,
 * then the insert on the writer thread, and 202 only after the
 * transaction that holds it has committed. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "coordinator/coord.h"
#include "coordinator/api/api.h"
#include "coordinator/config/config.h"
#include "coordinator/http/http.h"
#include "coordinator/run/run.h"
#include "coordinator/run/writer.h"
#include "coordinator/sched/schedule.h"

/* The metadata of an update that parsed but failed a range check (shape,
 * dtype, finiteness): decoding stopped before filling it in, and the
 * checks that come first in protocol order still need it. */
static int read_meta(const uint8_t *body, size_t len, compress_update_meta *m) {
    st_file f;
    if (st_parse(body, len, &f, NULL) != VL_OK) return -1;
    const char *run = st_meta_get(&f, "run");
    const char *task = st_meta_get(&f, "task");
    const char *peer = st_meta_get(&f, "peer");
    const char *base = st_meta_get(&f, "base_version");
    const char *kind = st_meta_get(&f, "kind");
    int ok = run && strlen(run) < sizeof m->run && task && peer && base && kind &&
             vl_parse_i64(task, 1, INT64_MAX, &m->task) == VL_OK &&
             vl_parse_i64(peer, 1, INT64_MAX, &m->peer) == VL_OK &&
             vl_parse_i64(base, 0, INT64_MAX, &m->base_version) == VL_OK &&
             compress_kind_parse(kind, &m->kind) == VL_OK;
    if (ok) snprintf(m->run, sizeof m->run, "%s", run);
    st_free(&f);
    return ok ? 0 : -1;
}

/* Checks the task side of an update in protocol order; answers and
 * returns COORD_ANSWERED on the first failure. On success *tau is the update's
 * staleness: how many versions were made since its base. */
static int check_task(coord_req *cr, const compress_update_meta *m, storage_task *t, int64_t *tau) {
    coord_server *srv = cr->srv;
    vl_error e = {0};
    if (coord_check_task_owner(cr, "update", m->run, m->peer, m->task, t) != 0)
        return COORD_ANSWERED;
    int exists = 0;
    if (storage_update_exists(srv->run.db, t->id, &exists, &e) != VL_OK) {
        coord_reply_internal(cr, &e);
        return COORD_ANSWERED;
    }
    if (exists || t->state == STORAGE_TASK_DONE) {
        coord_reply_error(cr, 409, "duplicate_update", "task %lld already has its update",
                          (long long)t->id);
        return COORD_ANSWERED;
    }
    if (m->base_version != t->base_version) {
        coord_reply_error(cr, 422, "wrong_version",
                          "update says base version %lld; task %lld "
                          "is based on %lld",
                          (long long)m->base_version, (long long)t->id, (long long)t->base_version);
        return COORD_ANSWERED;
    }
    /* Late and stale updates are merged, weighted down, as long as their
     * base is within the bound: an expired lease's work is not wasted,
     * and the task has no update yet, so it cannot be merged twice. */
    *tau = srv->run.version - t->base_version;
    if (*tau > srv->run.cfg.staleness.max) {
        coord_reply_error(cr, 409, "stale_update",
                          "update is based on version %lld, %lld "
                          "versions behind the current %lld; at most %lld are taken",
                          (long long)t->base_version, (long long)*tau, (long long)srv->run.version,
                          (long long)srv->run.cfg.staleness.max);
        return COORD_ANSWERED;
    }
    const char *want = coord_config_update_kind(&srv->run.cfg);
    if (strcmp(compress_kind_name(m->kind), want) != 0) {
        coord_reply_error(cr, 422, "wrong_kind", "this run takes \"%s\" updates, not \"%s\"", want,
                          compress_kind_name(m->kind));
        return COORD_ANSWERED;
    }
    return 0;
}

/* The K-FAC factors an update carries: required in runs that share them
 * (and checked against the model's layers), refused in the others. */
static int check_factors(const coord_server *srv, const compress_update *cu, const char **code,
                         vl_error *e) {
    *code = NULL;
    if (!coord_config_shares_factors(&srv->run.cfg)) {
        if (!cu->has_factors) return VL_OK;
        *code = "unexpected_factors";
        return vl_fail(e, VL_ERANGE,
                       "this run does not share K-FAC factors; the update carries "
                       "some");
    }
    if (!cu->has_factors) {
        *code = "missing_factors";
        return vl_fail(e, VL_ERANGE,
                       "this run shares K-FAC factors: an update carries its "
                       "peer's (tensors kfac.<layer>.A and .G)");
    }
    compress_factors_view v;
    int rc = compress_factors_decode(&cu->file, srv->run.factor_layers, srv->run.n_factor_layers,
                                     &v, code, e);
    if (rc == VL_OK) {
        compress_factors_view_free(&v);
        return VL_OK;
    }
    if (rc == VL_ENOMEM) return rc;
    *code = "bad_factors";
    return VL_ERANGE;
}

/* A refusal for what an update holds (422): sending it again cannot
 * cure it, so the task's lease ends with the answer (refuse_held). */
typedef struct held_refusal {
    const char *code;
    char msg[384];
} held_refusal;

static int held(held_refusal *r, const char *code, const char *fmt, ...) VL_PRINTF(3, 4);
static int held(held_refusal *r, const char *code, const char *fmt, ...) {
    r->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* The bounds a hostile peer would exceed: the samples it claims, which
 * weigh its update in the mean, and the run's robust.max_norm when
 * excess is refused. Returns -1 with r filled on a failure. */
static int check_bounds(coord_server *srv, const compress_update_meta *m, double norm,
                        held_refusal *r) {
    const coord_config *cfg = &srv->run.cfg;
    /* What the update says of its training is shown in the version log
     * and /v1/status and averaged into a version's train loss: a task
     * takes at most train.steps local steps, and a cross-entropy is never
     * negative (COORD_MAX_UPDATE_LOSS: far above any run that learns).
     * A model that has been driven far off (an undefended run under
     * attack) makes honest losses large too: the bound grows with the
     * current version's validation loss, so those peers are not refused
     * and dropped for reporting what their model scores. */
    if (m->local_steps > cfg->train.steps)
        return held(r, "too_many_steps",
                    "the update claims %lld local steps; a task of this run takes at most %lld",
                    (long long)m->local_steps, (long long)cfg->train.steps);
    double most_loss = COORD_MAX_UPDATE_LOSS;
    double val = srv->run.val_loss;
    if (isfinite(val) && 10 * val > most_loss) most_loss = 10 * val;
    if (!(m->loss >= 0 && m->loss <= most_loss))
        return held(r, "bad_loss", "the update's training loss %.6g is outside [0, %g]", m->loss,
                    most_loss);
    int64_t most = coord_config_max_samples(cfg);
    if (m->num_samples > most)
        return held(r, "too_many_samples",
                    "the update claims %lld samples; a task of this run trains on at most %lld",
                    (long long)m->num_samples, (long long)most);
    double bound = coord_norm_bound_held(srv);
    if (cfg->robust.refuse_excess && bound > 0 && norm > bound)
        return held(r, "norm_exceeded", "the update's L2 norm %.6g exceeds this run's bound %.6g",
                    norm, bound);
    return 0;
}

/* An update refused for what it holds leaves its task leased to the
 * peer until the deadline (lease_s) unless the lease ends here: a sync
 * version would wait that long for the slot, and an async peer's next
 * lease for it. The peer may say so itself (GET /v1/task?release=T), but
 * a hostile or older client would not. So the lease is ended by the
 * writer, as ?release=T ends it (storage_task_release: only while still
 * leased to the peer, so an update of the task stored meanwhile keeps it
 * done), and the refusal is answered once that has committed, when the
 * slot is already free. An update sent again for the task is still
 * taken as a late one. */
typedef struct refuse_job {
    coord_job job;
    coord_req cr;
    int64_t task_id, n;
    held_refusal r;
} refuse_job;

static int refuse_run(storage *db, coord_job *job, vl_error *err) {
    refuse_job *j = (refuse_job *)job;
    return storage_task_release(db, j->task_id, j->cr.peer_id, &j->n, err);
}

static void refuse_done(coord_job *job, int rc, const vl_error *err) {
    refuse_job *j = (refuse_job *)job;
    coord_server *srv = j->cr.srv;
    if (rc != VL_OK) {
        vl_log_msg(rc == VL_EFULL ? LOG_DEBUG : LOG_WARN,
                   "task %lld: the lease stays until its deadline (%s): %s", (long long)j->task_id,
                   j->r.code, err->msg);
    } else if (j->n > 0) {
        vl_log_info("peer %lld's update of task %lld was refused (%s); the lease ends and its "
                    "data goes to the next tasks",
                    (long long)j->cr.peer_id, (long long)j->task_id, j->r.code);
        /* A sync slot is free, and the version may wait on it. */
        coord_arm_lease_timer(srv);
        coord_schedule_merge(srv);
    }
    coord_reply_error(&j->cr, 422, j->r.code, "%s", j->r.msg);
    free(j);
}

/* Answers 422 with r for task t's update, ending t's lease first. */
static void refuse_held(coord_req *cr, const storage_task *t, const held_refusal *r) {
    refuse_job *j = t->state == STORAGE_TASK_LEASED ? calloc(1, sizeof *j) : NULL;
    if (!j) {
        /* Nothing leased, or no memory: the lease runs out on its own. */
        coord_reply_error(cr, 422, r->code, "%s", r->msg);
        return;
    }
    j->job.run = refuse_run;
    j->job.done = refuse_done;
    j->cr = *cr;
    j->task_id = t->id;
    j->r = *r;
    coord_writer_submit(cr->srv->run.writer, &j->job);
}

/* One accepted update on its way to the database. The body stays in the
 * request's input buffer, which libevent leaves alone until the request
 * is answered, and the request is answered only in done. */
typedef struct upload_job {
    coord_job job;
    coord_req cr;
    storage_update u;
    int64_t id;
    int has_next; /* the peer's next task is written with the update */
    coord_lease next;
    double train_s; /* the peer's training time, as reported (0: not) */
} upload_job;

static int upload_run(storage *db, coord_job *job, vl_error *err) {
    upload_job *j = (upload_job *)job;
    int rc = storage_update_insert(db, &j->u, &j->id, err);
    if (rc == VL_OK) rc = storage_task_set_state(db, j->u.task_id, STORAGE_TASK_DONE, err);
    if (rc == VL_OK) rc = storage_peer_touch(db, j->u.peer_id, j->u.received_at, err);
    if (rc == VL_OK && j->has_next) rc = coord_lease_write(db, &j->next, err);
    return rc;
}

/* The acknowledgement's one promise, checked where the tests ask for it:
 * the update is committed, so another connection already reads it. A
 * writer that answered before (or without) its commit fails here on the
 * first upload rather than by chance in a crash test. */
static void check_acknowledged(coord_server *srv, int64_t task_id) {
    int exists = 0;
    vl_error e = {0};
    if (storage_update_exists(srv->run.db, task_id, &exists, &e) != VL_OK || !exists) {
        vl_log_error("about to acknowledge the update of task %lld, which another connection "
                     "cannot read: %s",
                     (long long)task_id, e.msg[0] ? e.msg : "no such row");
        abort();
    }
}

static void upload_done(coord_job *job, int rc, const vl_error *err) {
    upload_job *j = (upload_job *)job;
    coord_req *cr = &j->cr;
    coord_server *srv = cr->srv;
    if (rc != VL_OK && j->has_next) coord_lease_abandoned(srv, &j->next);
    if (rc == VL_ECONFLICT) {
        coord_reply_error(cr, 409, "duplicate_update", "task %lld already has its update",
                          (long long)j->u.task_id);
    } else if (rc != VL_OK) {
        coord_reply_internal(cr, err);
    } else {
        /* Timed before the next lease, which it paces. */
        coord_speed_note(srv, j->u.peer_id, j->u.task_id, j->u.local_steps, j->train_s);
        json_t *o =
            json_pack("{s:I, s:I, s:I}", "update_id", (json_int_t)j->id, "version",
                      (json_int_t)j->u.base_version, "staleness", (json_int_t)j->u.staleness);
        json_t *next = j->has_next ? coord_lease_committed(srv, &j->next) : NULL;
        if (o && j->has_next && (!next || json_object_set_new(o, "next_task", next) != 0)) {
            /* The update is stored; the lease is too, and GET /v1/task
             * hands it out again, so only the offer is lost. */
            json_decref(o);
            o = NULL;
        }
        if (srv->run.ack_check) check_acknowledged(srv, j->u.task_id);
        coord_reply_json(cr, 202, o);
        coord_note_update(srv);
    }
    /* A task request of the peer's waited for the offered lease. */
    int woke = j->has_next;
    free(j);
    if (woke) coord_wake_waiters(srv);
}

void coord_route_updates(coord_req *cr) {
    coord_server *srv = cr->srv;
    size_t len;
    const uint8_t *body = coord_body(cr, &len);
    /* 1. the query and the run: is an update still taken */
    const char *const keys[] = {"next", NULL};
    int64_t want_next = 0;
    unsigned present = 0;
    if (coord_req_query(cr, keys, 1, &want_next, &present, "next is 0 or 1") != 0) return;
    /* Stored after the last version, an update could never be merged. */
    if (srv->run.finished) {
        coord_reply_error(cr, 410, "run_finished",
                          "the run reached its last version (%lld); "
                          "it takes no more updates",
                          (long long)srv->run.version);
        return;
    }
    if (!body) {
        coord_reply_error(cr, 400, "malformed_update", "the body is empty");
        return;
    }
    /* 2. the body decoded, and the task it answers */
    compress_update cu;
    vl_error e = {0};
    const char *code = "malformed_update";
    int rc = compress_update_decode(body, len, srv->run.n_params, &cu, &code, &e);
    compress_update_meta meta;
    memset(&meta, 0, sizeof meta);
    if (rc == VL_OK) {
        meta = cu.meta;
    } else if (rc != VL_ERANGE || read_meta(body, len, &meta) != 0) {
        coord_reply_error(cr, 400, "malformed_update", "%s", e.msg);
        return;
    }
    storage_task t;
    int64_t tau = 0;
    if (check_task(cr, &meta, &t, &tau) != 0) {
        if (rc == VL_OK) compress_update_free(&cu);
        return;
    }
    held_refusal hr;
    if (rc == VL_ERANGE) {
        held(&hr, code ? code : "bad_shape", "%s", e.msg);
        refuse_held(cr, &t, &hr);
        return;
    }
    /* 3. against the run's shape, factors and bounds (refusals are held
     *    against the task) */
    rc = compress_update_check_spec(&cu, &srv->run.spec, &code, &e);
    if (rc == VL_OK) rc = check_factors(srv, &cu, &code, &e);
    /* Computed once, here, for every update that is stored: a refusing
     * bound needs it now, and the merge reads it back instead of making a
     * second pass over the values. It is compress_update_norm of what the
     * merge will decode from the same bytes, so a version is the same
     * bit for bit as when the merge computed it. */
    double norm = rc == VL_OK ? compress_update_norm(&cu) : 0;
    compress_update_free(&cu);
    if (rc == VL_ENOMEM) {
        coord_reply_oom(cr, "checking an update's factors");
        return;
    }
    if (rc != VL_OK) {
        held(&hr, code ? code : "wrong_sketch", "%s", e.msg);
        refuse_held(cr, &t, &hr);
        return;
    }
    if (check_bounds(srv, &meta, norm, &hr) != 0) {
        refuse_held(cr, &t, &hr);
        return;
    }
    /* 4. to the writer, with the next lease when asked; the 202 goes out
     *    once it committed */
    upload_job *j = calloc(1, sizeof *j);
    if (!j) {
        coord_reply_oom(cr, "queueing an update");
        return;
    }
    if (want_next) {
        int offer = coord_lease_offer(srv, t.peer_id, t.id, &j->next, &e);
        if (offer != VL_OK && offer != VL_AGAIN) {
            free(j);
            coord_reply_internal(cr, &e);
            return;
        }
        j->has_next = offer == VL_OK;
    }
    j->job.run = upload_run;
    j->job.done = upload_done;
    j->cr = *cr;
    j->u = (storage_update){.task_id = t.id,
                            .peer_id = t.peer_id,
                            .base_version = t.base_version,
                            .num_samples = meta.num_samples,
                            .local_steps = meta.local_steps,
                            .loss = meta.loss,
                            .nbytes = (int64_t)len,
                            .blob = body,
                            .received_at = vl_clock_unix_s(),
                            .staleness = tau,
                            .has_norm = 1,
                            .norm = norm};
    snprintf(j->u.kind, sizeof j->u.kind, "%s", compress_kind_name(meta.kind));
    j->train_s = meta.train_seconds;
    coord_writer_submit(srv->run.writer, &j->job);
}
