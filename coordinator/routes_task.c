/* GET /v1/task: leases, the long-poll waiters, and the lease timer that
 * frees expired slots. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "coordinator/coord.h"
#include "coordinator/scheduler.h"

struct coord_waiter {
    coord_req cr;
    coord_serve_fn serve; /* answers the request and returns 1, or returns 0 */
    struct event *timer;
    struct evhttp_connection *evcon; /* NULL once the connection is gone */
    coord_waiter *prev, *next;
};

static json_t *task_json(const coord_server *srv, const storage_task *t) {
    const coord_config *c = &srv->cfg;
    const coord_train_config *tr = &c->train;
    return json_pack(
        "{s:I, s:s, s:I, s:{s:s, s:I, s:I},"
        " s:{s:I, s:I, s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:I},"
        " s:{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}, s:{s:f, s:I, s:I}, s:I}",
        "task_id", (json_int_t)t->id, "run", c->name, "base_version", (json_int_t)t->base_version,
        "data", "shard", "train", "offset", (json_int_t)t->data_offset, "length",
        (json_int_t)t->data_length, "train", "steps", (json_int_t)tr->steps, "batch",
        (json_int_t)tr->batch, "context", c->model.block_size, "optimizer", tr->optimizer, "lr",
        tr->lr, "beta1", tr->beta1, "beta2", tr->beta2, "eps", tr->eps, "weight_decay",
        tr->weight_decay, "grad_clip", tr->grad_clip, "seed", (json_int_t)t->seed, "compression",
        "kind", c->compression_kind, "dtype", c->compression_dtype, "k", (json_int_t)c->comp_k,
        "rows", (json_int_t)c->comp_rows, "cols", (json_int_t)c->comp_cols, "seed",
        (json_int_t)c->comp_seed, "second_round", (json_int_t)c->second_round, "round_s",
        (json_int_t)c->round_s, "block", (json_int_t)c->comp_block, "decay", c->comp_decay,
        "selsync", "delta", 0.0,
        "h_min", (json_int_t)tr->steps, "h_max", (json_int_t)tr->steps, "deadline",
        (json_int_t)t->deadline);
}

/* Creates the lease in one transaction; the range and seed follow from
 * the task id, which the transaction holds fixed. */
static int issue_task(coord_server *srv, int64_t peer_id, int64_t now, storage_task *t,
                      vl_error *err) {
    memset(t, 0, sizeof *t);
    int rc = storage_begin(srv->db, err);
    if (rc != VL_OK) return rc;
    rc = storage_task_next_id(srv->db, &t->id, err);
    if (rc == VL_OK &&
        coord_sched_task_range((uint64_t)srv->cfg.seed, t->id, srv->corpus.train_len,
                               srv->cfg.task_bytes, &t->data_offset, &t->data_length) != 0)
        rc = vl_fail(err, VL_EINVAL, "the corpus has no training bytes");
    if (rc == VL_OK) {
        t->peer_id = peer_id;
        t->base_version = srv->version;
        t->seed = coord_sched_task_seed((uint64_t)srv->cfg.seed, t->id);
        t->issued_at = now;
        t->deadline = now + srv->cfg.lease_s;
        t->state = STORAGE_TASK_LEASED;
        rc = storage_task_insert(srv->db, t, NULL, err);
    }
    if (rc == VL_OK) rc = storage_peer_touch(srv->db, peer_id, now, err);
    if (rc == VL_OK) return storage_commit(srv->db, err);
    storage_rollback(srv->db);
    return rc;
}

/* Answers cr now if the scheduler allows: 1 when answered (a task, 410 or
 * an error), 0 when the request has to wait. */
static int try_serve(coord_req *cr) {
    coord_server *srv = cr->srv;
    int64_t now = clock_unix_s();
    vl_error e = {0};
    storage_task t;
    int has_lease = 0;
    int64_t slots = 0;
    if (!srv->finished) {
        int rc = storage_task_find_lease(srv->db, cr->peer_id, srv->version, now, &t, &e);
        if (rc != VL_OK && rc != VL_ENOTFOUND) {
            coord_reply_internal(cr, &e);
            return 1;
        }
        has_lease = rc == VL_OK;
        if (!has_lease && storage_task_count_slots(srv->db, srv->version, now, &slots, &e)) {
            coord_reply_internal(cr, &e);
            return 1;
        }
    }
    switch (coord_sched_decide(srv->finished, has_lease, slots, srv->cfg.updates_per_version)) {
    case COORD_SCHED_FINISHED:
        coord_reply_error(cr, 410, "run_finished", "the run reached its last version (%lld)",
                          (long long)srv->version);
        return 1;
    case COORD_SCHED_SAME_TASK:
        coord_reply_json(cr, 200, task_json(srv, &t));
        return 1;
    case COORD_SCHED_NEW_TASK:
        if (issue_task(srv, cr->peer_id, now, &t, &e) != VL_OK) {
            coord_reply_internal(cr, &e);
            return 1;
        }
        log_debug("task %lld leased to peer %lld until %lld", (long long)t.id,
                  (long long)cr->peer_id, (long long)t.deadline);
        coord_reply_json(cr, 200, task_json(srv, &t));
        coord_arm_lease_timer(srv);
        return 1;
    case COORD_SCHED_WAIT:
        break;
    }
    return 0;
}

/* ---- waiters ------------------------------------------------------------ */

static void waiter_unlink(coord_server *srv, coord_waiter *w) {
    if (w->prev) w->prev->next = w->next;
    else srv->waiters = w->next;
    if (w->next) w->next->prev = w->prev;
    else srv->waiters_tail = w->prev;
    srv->n_waiters--;
    if (w->evcon) evhttp_connection_set_closecb(w->evcon, NULL, NULL);
    if (w->timer) event_free(w->timer);
    free(w);
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    coord_waiter *w = arg;
    coord_server *srv = w->cr.srv;
    /* The wait may end just as a slot frees without a wake-up reaching it;
     * one last look costs a query. */
    if (!w->serve(&w->cr)) coord_reply(&w->cr, 204, NULL, NULL);
    waiter_unlink(srv, w);
}

static void waiter_closed(struct evhttp_connection *evcon, void *arg) {
    (void)evcon;
    coord_waiter *w = arg;
    coord_server *srv = w->cr.srv;
    w->evcon = NULL; /* being freed: do not touch it again */
    if (evhttp_request_get_connection(w->cr.req)) {
        /* libevent frees a request still attached to a dying connection,
         * without its completion callback. */
        if (srv->inflight > 0) srv->inflight--;
        log_info("%s %s client gone while waiting", w->cr.method, w->cr.path);
    } else {
        /* A detached request is ours to free; sending does that. */
        log_info("%s %s client gone while waiting", w->cr.method, w->cr.path);
        if (srv->inflight > 0) srv->inflight--;
        evhttp_send_reply(w->cr.req, 204, "No Content", NULL);
    }
    waiter_unlink(srv, w);
}

int coord_waiter_add(coord_req *cr, int64_t wait_s, coord_serve_fn serve) {
    coord_server *srv = cr->srv;
    coord_waiter *w = calloc(1, sizeof *w);
    if (!w) return -1;
    w->cr = *cr;
    w->serve = serve;
    w->timer = evtimer_new(srv->base, waiter_timeout, w);
    w->evcon = evhttp_request_get_connection(cr->req);
    if (!w->timer || !w->evcon) {
        if (w->timer) event_free(w->timer);
        free(w);
        return -1;
    }
    struct timeval tv = {(time_t)wait_s, 0};
    evtimer_add(w->timer, &tv);
    evhttp_connection_set_closecb(w->evcon, waiter_closed, w);
    /* libevent does not read while a request awaits its answer, so a
     * client that gives up would go unnoticed until the wait ends. Reading
     * with no read callback lets end-of-stream reach libevent's error
     * callback, which frees the connection (and calls waiter_closed),
     * while any early bytes of a next request just stay buffered; replying
     * restores libevent's own callbacks. */
    struct bufferevent *bev = evhttp_connection_get_bufferevent(w->evcon);
    if (bev) {
        bufferevent_data_cb rd, wr;
        bufferevent_event_cb ev;
        void *cbarg;
        bufferevent_getcb(bev, &rd, &wr, &ev, &cbarg);
        bufferevent_setcb(bev, NULL, wr, ev, cbarg);
        bufferevent_enable(bev, EV_READ);
    }
    w->prev = srv->waiters_tail;
    if (srv->waiters_tail) srv->waiters_tail->next = w;
    else srv->waiters = w;
    srv->waiters_tail = w;
    srv->n_waiters++;
    return 0;
}

void coord_wake_waiters(coord_server *srv) {
    /* Task requests are first come, first served: once one has to keep
     * waiting, so do the task requests behind it (none of them can hold a
     * lease on the current version). Other requests are each served as
     * soon as they can be. */
    int tasks_blocked = 0;
    coord_waiter *w = srv->waiters;
    while (w) {
        coord_waiter *next = w->next;
        int is_task = w->serve == try_serve;
        if (!(is_task && tasks_blocked)) {
            if (w->serve(&w->cr)) waiter_unlink(srv, w);
            else if (is_task) tasks_blocked = 1;
        }
        w = next;
    }
}

void coord_drain_waiters(coord_server *srv) {
    while (srv->waiters) {
        coord_waiter *w = srv->waiters;
        coord_reply_error(&w->cr, 503, "draining", "the coordinator is shutting down");
        waiter_unlink(srv, w);
    }
}

/* ---- lease expiry --------------------------------------------------------- */

static void lease_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    coord_server *srv = arg;
    vl_error e = {0};
    int64_t n = 0;
    if (storage_task_expire(srv->db, clock_unix_s(), &n, &e) != VL_OK)
        log_error("cannot expire leases: %s", e.msg);
    else if (n > 0)
        log_info("%lld lease(s) expired", (long long)n);
    coord_wake_waiters(srv);
    coord_arm_lease_timer(srv);
}

void coord_arm_lease_timer(coord_server *srv) {
    if (!srv->lease_timer) {
        srv->lease_timer = evtimer_new(srv->base, lease_timer_cb, srv);
        if (!srv->lease_timer) {
            log_error("cannot create the lease timer");
            return;
        }
    }
    evtimer_del(srv->lease_timer);
    if (srv->finished) return;
    vl_error e = {0};
    int64_t next = 0;
    if (storage_task_next_deadline(srv->db, srv->version, clock_unix_s(), &next, &e) != VL_OK) {
        log_error("cannot find the next lease deadline: %s", e.msg);
        return;
    }
    if (next <= 0) return;
    /* A lease ends when the whole-second clock reaches its deadline. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    double delay = (double)next - now + 0.01;
    if (delay < 0.01) delay = 0.01;
    struct timeval tv = {(time_t)delay, (suseconds_t)((delay - (double)(time_t)delay) * 1e6)};
    evtimer_add(srv->lease_timer, &tv);
}

/* ---- the route -------------------------------------------------------------- */

void coord_route_task(coord_req *cr) {
    size_t len;
    const uint8_t *body = coord_body(cr, &len);
    if (coord_authenticate(cr, body, len) != 0) return;
    const char *const keys[] = {"wait", NULL};
    int64_t vals[1] = {0};
    unsigned present = 0;
    vl_error e = {0};
    const char *query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(cr->req));
    if (coord_query_ints(query, keys, COORD_MAX_WAIT_S, vals, &present, &e) != VL_OK) {
        coord_reply_error(cr, 400, "bad_request", "%s (wait is 0 to %d)", e.msg,
                          COORD_MAX_WAIT_S);
        return;
    }
    if (cr->srv->draining) {
        coord_reply_error(cr, 503, "draining", "the coordinator is shutting down");
        return;
    }
    if (try_serve(cr)) return;
    if (vals[0] == 0) {
        coord_reply(cr, 204, NULL, NULL);
        return;
    }
    if (coord_waiter_add(cr, vals[0], try_serve) != 0) {
        vl_error oom = {.code = VL_ENOMEM};
        snprintf(oom.msg, sizeof oom.msg, "out of memory registering a waiter");
        coord_reply_internal(cr, &oom);
    }
}
