/* Leases: what a task lease holds and how it is written (the data range
 * and seed, taking over an expired lease's data first), the leases on
 * their way to the database, and the async rules for when a peer's next
 * lease must wait (a version being made, lease_wait's own update). GET
 * /v1/task (api/routes_task.c) and an upload that asks for its next lease
 * (api/routes_updates.c) both come here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/base/sched_rules.h"
#include "coordinator/coord.h"
#include "coordinator/sched/schedule.h"
#include "coordinator/config/config.h"

/* The task's data: a byte range of the text corpus's "train" shard, or a
 * token range inside one training shard (the stored offset counts over
 * the shards laid end to end). NULL when the stored range fits no shard,
 * which only a damaged database could give. */
static json_t *data_json(const coord_server *srv, const storage_task *t) {
    /* A classifier's coordinator without a test set asks its peers. */
    if (coord_config_is_local(&srv->run.cfg))
        return json_pack("{s:s, s:b}", "kind", "local", "report_accuracy",
                         srv->run.net.mlp && srv->run.test.n == 0);
    if (!srv->run.cfg.shards)
        return json_pack("{s:s, s:s, s:I, s:I}", "kind", "bytes", "shard", "train", "offset",
                         (json_int_t)t->data_offset, "length", (json_int_t)t->data_length);
    int shard;
    int64_t local;
    if (coord_sched_token_locate(srv->run.shards.ntok, srv->run.shards.n, t->data_offset,
                                 t->data_length, &shard, &local) != 0) {
        vl_log_error("task %lld: its token range %lld+%lld lies in no training shard",
                     (long long)t->id, (long long)t->data_offset, (long long)t->data_length);
        return NULL;
    }
    return json_pack("{s:s, s:i, s:I, s:I}", "kind", "tokens", "shard", shard, "offset",
                     (json_int_t)local, "length", (json_int_t)t->data_length);
}

json_t *coord_lease_task_json(const coord_server *srv, const storage_task *t) {
    const coord_config *c = &srv->run.cfg;
    const coord_train_config *tr = &c->train;
    json_t *data = data_json(srv, t);
    if (!data) return NULL;
    int64_t steps = coord_speed_steps(srv, t);
    int64_t h_min = c->selsync_h_min < steps ? c->selsync_h_min : steps;
    json_t *o = json_pack(
        "{s:I, s:s, s:I, s:o,"
        " s:{s:I, s:I, s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:I},"
        " s:{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}, s:{s:f, s:I, s:I}, s:I}",
        "task_id", (json_int_t)t->id, "run", c->name, "base_version", (json_int_t)t->base_version,
        "data", data, "train", "steps", (json_int_t)steps, "batch", (json_int_t)tr->batch,
        "context", c->net == COORD_NET_MLP ? 1 : c->model.block_size, "optimizer", tr->optimizer,
        "lr", coord_sched_lr(tr, t->base_version, c->max_versions), "beta1", tr->beta1, "beta2",
        tr->beta2, "eps", tr->eps, "weight_decay", tr->weight_decay, "grad_clip", tr->grad_clip,
        "seed", (json_int_t)t->seed, "compression", "kind", c->compression_kind, "dtype",
        c->compression_dtype, "k", (json_int_t)c->comp_k, "rows", (json_int_t)c->comp_rows, "cols",
        (json_int_t)c->comp_cols, "seed", (json_int_t)c->comp_seed, "second_round",
        (json_int_t)c->second_round, "round_s", (json_int_t)c->round_s, "block",
        (json_int_t)c->comp_block, "decay", c->comp_decay, "selsync", "delta", c->selsync_delta,
        "h_min", (json_int_t)h_min, "h_max", (json_int_t)steps, "deadline",
        (json_int_t)t->deadline);
    /* The sketch's hash, so a peer that computes another refuses the task
     * instead of uploading tables this run cannot use. */
    if (o && strcmp(c->compression_kind, "sketch") == 0 &&
        json_object_set_new(json_object_get(o, "compression"), "hash",
                            json_string(COMPRESS_SKETCH_HASH)) != 0) {
        json_decref(o);
        o = NULL;
    }
    /* K-FAC's settings likewise, with the newest merged factors when the
     * run shares them, so the peer starts from the pooled estimate. */
    if (o && strcmp(tr->optimizer, "kfac") == 0) {
        json_t *k = json_pack("{s:f, s:{s:f, s:f, s:I, s:f, s:b, s:s}}", "momentum", tr->momentum,
                              "kfac", "damping", tr->kfac.damping, "decay", tr->kfac.decay,
                              "inverse_every", (json_int_t)tr->kfac.inverse_every, "kl_clip",
                              tr->kfac.kl_clip, "share", tr->kfac.share, "dtype", tr->kfac.dtype);
        if (k && tr->kfac.share && srv->run.factors_version >= 0 &&
            json_object_set_new(json_object_get(k, "kfac"), "factors_version",
                                json_integer((json_int_t)srv->run.factors_version)) != 0) {
            json_decref(k);
            k = NULL;
        }
        if (!k || json_object_update(json_object_get(o, "train"), k) != 0) {
            json_decref(o);
            o = NULL;
        }
        json_decref(k);
    }
    /* Where the model is cut, what NoPeek weighs and how activations
     * travel: what a split peer needs beyond a classifier's task. */
    if (o && coord_config_is_split(c)) {
        json_t *sp = json_pack("{s:i, s:f, s:s, s:b, s:i}", "cut", c->split_cut, "alpha",
                               c->split_alpha, "dtype", c->split_dtype, "u_shape", c->split_u,
                               "in_flight", c->split_in_flight);
        if (!sp || json_object_set_new(o, "split", sp) != 0) {
            json_decref(o);
            o = NULL;
        }
    }
    /* An async run lets the peer lease its next task while this one's
     * update is still uploading (GET /v1/task?uploading=), so a slow
     * uplink does not leave its processor idle. */
    if (o && coord_config_is_async(c) && json_object_set_new(o, "overlap", json_true()) != 0) {
        json_decref(o);
        o = NULL;
    }
    /* SGD's settings travel only in SGD runs, which peers of an AdamW run
     * would not know what to do with. */
    if (o && strcmp(tr->optimizer, "sgd") == 0) {
        json_t *sgd = json_pack("{s:f, s:b}", "momentum", tr->momentum, "nesterov", tr->nesterov);
        if (!sgd || json_object_update(json_object_get(o, "train"), sgd) != 0) {
            json_decref(o);
            o = NULL;
        }
        json_decref(sgd);
    }
    return o;
}

/* The peers whose leases are with the writer. A second task request from
 * a peer whose first lease is not committed yet would find no lease in
 * the database and be given another: it waits for the first instead.
 * Bounded, so a burst cannot grow it without limit; when full, requests
 * wait like any other. */
#define COORD_MAX_ISSUING 65536

coord_issuing *coord_lease_issuing_find(const coord_server *srv, int64_t peer_id) {
    for (int64_t i = 0; i < srv->sched.issuing; i++)
        if (srv->sched.issuing_leases[i].peer_id == peer_id) return &srv->sched.issuing_leases[i];
    return NULL;
}

int coord_lease_issuing_has(const coord_server *srv, int64_t peer_id) {
    return coord_lease_issuing_find(srv, peer_id) != NULL;
}

static void issuing_remove(coord_server *srv, int64_t peer_id) {
    coord_issuing *l = coord_lease_issuing_find(srv, peer_id);
    if (!l) return;
    *l = srv->sched.issuing_leases[--srv->sched.issuing];
}

/* Slots of version v held by leases on their way to the database that
 * the database does not show yet. settled is coord_writer_settled(),
 * read before the database is: a lease the writer commits in between is
 * then counted both there and here, a slot taken twice for an instant
 * (its done callback wakes the waiters again), never in neither. Counting
 * every lease until its done callback ran instead took each committed
 * one twice for as long as the loop had not delivered it: the wake-up
 * after a version handed out fewer slots than were free, and the last
 * waiters were left for a later wake-up while new requests took them. */
int64_t coord_lease_issuing_unsettled(const coord_server *srv, int64_t version, uint64_t settled) {
    int64_t n = 0;
    for (int64_t i = 0; i < srv->sched.issuing; i++)
        n += srv->sched.issuing_leases[i].version == version &&
             srv->sched.issuing_leases[i].seq > settled;
    return n;
}

/* Room for one more lease in flight: 0, or -1 when there is none. */
int coord_lease_issuing_room(coord_server *srv) {
    if ((size_t)srv->sched.issuing < srv->sched.cap_issuing) return 0;
    if (srv->sched.cap_issuing >= COORD_MAX_ISSUING) return -1;
    size_t cap = srv->sched.cap_issuing ? srv->sched.cap_issuing * 2 : 16;
    coord_issuing *p = realloc(srv->sched.issuing_leases, cap * sizeof *p);
    if (!p) return -1;
    srv->sched.issuing_leases = p;
    srv->sched.cap_issuing = cap;
    return 0;
}

/* Call coord_lease_issuing_room first. */
void coord_lease_prepare(coord_server *srv, int64_t peer_id, int64_t now, coord_lease *l) {
    *l = (coord_lease){.t = {.peer_id = peer_id,
                             .base_version = srv->run.version,
                             .issued_at = now,
                             .deadline = now + srv->run.cfg.lease_s,
                             .state = STORAGE_TASK_LEASED},
                       .run_seed = (uint64_t)srv->run.cfg.seed,
                       .train_len = srv->run.corpus.train_len,
                       .task_bytes = srv->run.cfg.task_bytes};
    l->local = coord_config_is_local(&srv->run.cfg);
    if (l->local) l->task_bytes = srv->run.cfg.train.steps * srv->run.cfg.train.batch;
    if (srv->run.cfg.shards) {
        l->ntok = srv->run.shards.ntok;
        l->n_shards = srv->run.shards.n;
        l->task_tokens = srv->run.cfg.task_tokens;
    }
    /* Its job's number is known once submitted (issue_task); an offered
     * lease rides in its upload's job and keeps UINT64_MAX, in flight
     * until done, which only async runs offer and they count no slots. */
    srv->sched.issuing_leases[srv->sched.issuing++] =
        (coord_issuing){.peer_id = peer_id, .version = srv->run.version, .seq = UINT64_MAX};
}

/* Takes over the data range and seed of the oldest expired lease that
 * never got its update, so no part of the data is skipped because a peer
 * vanished; otherwise the range and seed follow from the new id. */
int coord_lease_write(storage *db, coord_lease *l, vl_error *err) {
    storage_task *t = &l->t;
    int rc = storage_task_next_id(db, &t->id, err);
    if (rc != VL_OK) return rc;
    storage_task old;
    rc = storage_task_take_expired(db, &old, err);
    if (rc == VL_OK) {
        t->data_offset = old.data_offset;
        t->data_length = old.data_length;
        t->seed = old.seed;
        t->reissue_of = old.id;
        l->reissued = 1;
    } else if (rc == VL_ENOTFOUND && l->local) {
        /* The peers' own data: a task is its seed, and its length counts
         * the samples it trains on (task_bytes holds that in a local run). */
        t->data_offset = 0;
        t->data_length = l->task_bytes;
        t->seed = coord_sched_task_seed(l->run_seed, t->id);
    } else if (rc == VL_ENOTFOUND) {
        if (l->ntok ? coord_sched_token_range(l->run_seed, t->id, l->ntok, l->n_shards,
                                              l->task_tokens, &t->data_offset, &t->data_length) != 0
                    : coord_sched_task_range(l->run_seed, t->id, l->train_len, l->task_bytes,
                                             &t->data_offset, &t->data_length) != 0)
            return vl_fail(err, VL_EINVAL, "the run has no training data");
        t->seed = coord_sched_task_seed(l->run_seed, t->id);
    } else {
        return rc;
    }
    rc = storage_task_insert(db, t, NULL, err);
    if (rc == VL_OK) rc = storage_peer_touch(db, t->peer_id, t->issued_at, err);
    return rc;
}


json_t *coord_lease_committed(coord_server *srv, const coord_lease *l) {
    issuing_remove(srv, l->t.peer_id);
    coord_speed_lease(srv, l->t.peer_id, l->t.id);
    if (l->reissued)
        vl_log_info("task %lld leased to peer %lld redoes the data of expired task %lld",
                    (long long)l->t.id, (long long)l->t.peer_id, (long long)l->t.reissue_of);
    else
        vl_log_debug("task %lld leased to peer %lld until %lld", (long long)l->t.id,
                     (long long)l->t.peer_id, (long long)l->t.deadline);
    coord_arm_lease_timer(srv);
    return coord_lease_task_json(srv, &l->t);
}

void coord_lease_abandoned(coord_server *srv, const coord_lease *l) {
    issuing_remove(srv, l->t.peer_id);
}

/* Async: whether peer_id's next lease must wait for the version being
 * made. It must while a merge runs, or when a version's worth of updates
 * is waiting: a lease issued now would be based on the version before it,
 * so its update would arrive at least a version stale (and the peer's own
 * last update may be in that version). Applying a pseudo-gradient to a
 * model one version past its base repeats that version's step, which
 * acts as momentum of 1 on it: with most updates one version stale, the
 * demo run stalled near 2.7 nats where sync reached 2.4 by the same
 * version. The wait is also the run's back-pressure: when merging is slower than the peers, taking
 * exactly updates_per_version updates a version would otherwise let the
 * queue, and with it every update's staleness, grow without bound.
 * pending: 1 when the peer's update is not stored yet (the upload that
 * asks for the lease) and counts as waiting. *waiting gets the stored
 * updates not merged yet. Returns VL_AGAIN (wait), VL_OK, or a VL_E* code. */
int coord_lease_async_hold(coord_server *srv, int pending, int64_t *waiting, vl_error *err) {
    *waiting = 0;
    int rc = storage_update_count_unmerged(srv->run.db, waiting, err);
    if (rc != VL_OK) return rc;
    return srv->sched.merging || *waiting + pending >= srv->run.cfg.updates_per_version ? VL_AGAIN
                                                                                        : VL_OK;
}

/* lease_wait: VL_AGAIN when peer_id's next lease waits for the version that
 * merges the update of its last task (stored and not merged yet, or on its
 * way when uploading names that task), with a wake-up armed for the end
 * of the wait; VL_OK, or a VL_E* code. The peers of a run whose versions take
 * one update from each of them then all start from the version that holds
 * their own last updates, so those arrive fresh, and a slow or vanished
 * peer holds the others up for at most lease_wait task times. A peer
 * does not wait when the updates waiting and the leases out whose updates
 * are due before the wait ends (coord_speed_due; its own counted once, as
 * a lease or as an update) cannot complete the version: with fewer peers
 * than updates_per_version, or the others far slower than it, it would
 * wait in vain.
 * waiting: the stored updates not merged yet (coord_lease_async_hold's count). */
int coord_lease_own_wait(coord_server *srv, int64_t peer_id, int64_t uploading, int64_t waiting,
                         vl_error *err) {
    int64_t task = 0;
    double left = coord_speed_wait_left(srv, peer_id, &task);
    if (left <= 0) return 0;
    int rc;
    if (task != uploading) {
        int64_t id, base, merged;
        rc = storage_update_find(srv->run.db, task, &id, &base, &merged, err);
        if (rc == VL_ENOTFOUND) return 0; /* a task given up: nothing to wait for */
        if (rc != VL_OK) return rc;
        if (merged >= 0) return 0;
    }
    /* Leases whose updates are not due before the wait ends (a slow link,
     * a slow machine) would only make the quick peer sit idle. The peer's
     * own lease, while its upload is on its way, is among the leases.
     * The leases the database holds bound the count (the pace table may
     * remember a lease given up); it is read only when it can matter. */
    int64_t due = coord_speed_due(srv, peer_id, left) + (uploading ? 1 : 0);
    if (waiting + due < srv->run.cfg.updates_per_version) return 0;
    int64_t leased = 0;
    if ((rc = storage_task_count_leased(srv->run.db, vl_clock_unix_s(), &leased, err)) != VL_OK)
        return rc;
    if (waiting + leased < srv->run.cfg.updates_per_version) return 0;
    coord_arm_wait_timer(srv, left);
    return VL_AGAIN;
}

int coord_lease_offer(coord_server *srv, int64_t peer_id, int64_t done_task, coord_lease *l,
                      vl_error *err) {
    if (!coord_config_is_async(&srv->run.cfg) || srv->run.finished || srv->draining)
        return VL_AGAIN;
    int64_t now = vl_clock_unix_s();
    storage_task t;
    int rc = storage_task_find_any_lease(srv->run.db, peer_id, now, 0, &t, err);
    if (rc != VL_OK && rc != VL_ENOTFOUND) return rc;
    /* A peer holding another live lease is sent that one by GET /v1/task. */
    if (rc == VL_OK && t.id != done_task) return VL_AGAIN;
    /* The upload completes a version: GET /v1/task waits for it. */
    int64_t waiting;
    if ((rc = coord_lease_async_hold(srv, 1, &waiting, err)) != VL_OK) return rc;
    if ((rc = coord_lease_own_wait(srv, peer_id, done_task, waiting, err)) != VL_OK) return rc;
    if (coord_lease_issuing_has(srv, peer_id) || coord_lease_issuing_room(srv) != 0)
        return VL_AGAIN;
    coord_lease_prepare(srv, peer_id, now, l);
    return VL_OK;
}
