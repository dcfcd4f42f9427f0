/* The requests that long-poll (GET /v1/task, GET /v1/round): each waits in
 * one list, oldest first, with a timer for the end of its wait, and is
 * looked at again whenever something it may be waiting for happens. */
#include <stdlib.h>

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "coordinator/coord.h"
#include "coordinator/sched/schedule.h"
#include "coordinator/http/http.h"

struct coord_waiter {
    coord_req cr;
    coord_serve_fn serve;     /* a request served on its own, or */
    coord_serve_turn_fn turn; /* one that waits its turn, and */
    coord_owed_fn owed;       /* whether its answer is on its way */
    struct event *timer;
    struct evhttp_connection *evcon; /* NULL once the connection is gone */
    /* libevent's own callbacks of the connection, while waiting replaced
     * by ours (see waiter_add). */
    bufferevent_data_cb rd, wr;
    bufferevent_event_cb ev;
    void *cbarg;
    /* A request that waits its turn but is owed an answer (a task request
     * waiting for its peer's lease that was being written) when it parked
     * or was last looked at: that answer may come whatever the requests
     * before it wait for. */
    int own_lease;
    int expired; /* its wait is over: 204 unless the wake-up it is in serves it */
    coord_waiter *prev, *next;
};

/* Gives the connection back to libevent as it was before the wait, for a
 * request that will be answered later (by a job): with reading off again
 * a client that goes away cannot free the request under the job. */
static void waiter_restore(coord_waiter *w) {
    struct bufferevent *bev = w->evcon ? evhttp_connection_get_bufferevent(w->evcon) : NULL;
    if (!bev) return;
    bufferevent_disable(bev, EV_READ);
    bufferevent_setcb(bev, w->rd, w->wr, w->ev, w->cbarg);
}

static void waiter_unlink(coord_server *srv, coord_waiter *w) {
    if (w->prev)
        w->prev->next = w->next;
    else
        srv->sched.waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        srv->sched.waiters_tail = w->prev;
    srv->sched.n_waiters--;
    if (w->evcon) evhttp_connection_set_closecb(w->evcon, NULL, NULL);
    if (w->timer) event_free(w->timer);
    free(w);
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    coord_waiter *w = arg;
    /* The wait may end just as a slot frees without a wake-up reaching it
     * (a lease past its deadline before the lease timer ran). The last
     * look is a wake-up of the whole queue, so such a slot goes to the
     * oldest request, which need not be this one; w gets its 204 there. */
    w->expired = 1;
    coord_wake_waiters(w->cr.srv);
}

static void waiter_closed(struct evhttp_connection *evcon, void *arg) {
    (void)evcon;
    coord_waiter *w = arg;
    coord_server *srv = w->cr.srv;
    w->evcon = NULL; /* being freed: do not touch it again */
    if (evhttp_request_get_connection(w->cr.req)) {
        /* libevent frees a request still attached to a dying connection,
         * without its completion callback. */
        if (srv->conns.inflight > 0) srv->conns.inflight--;
        vl_log_info("%s %s client gone while waiting", w->cr.method, w->cr.path);
    } else {
        /* A detached request is ours to free; sending does that. */
        vl_log_info("%s %s client gone while waiting", w->cr.method, w->cr.path);
        if (srv->conns.inflight > 0) srv->conns.inflight--;
        evhttp_send_reply(w->cr.req, 204, "No Content", NULL);
    }
    waiter_unlink(srv, w);
}

static int waiter_add(coord_req *cr, int64_t wait_s, coord_serve_fn serve, coord_serve_turn_fn turn,
                      coord_owed_fn owed) {
    coord_server *srv = cr->srv;
    coord_waiter *w = calloc(1, sizeof *w);
    if (!w) return -1;
    w->cr = *cr;
    w->serve = serve;
    w->turn = turn;
    w->owed = owed;
    w->own_lease = turn && owed(cr);
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
        bufferevent_getcb(bev, &w->rd, &w->wr, &w->ev, &w->cbarg);
        bufferevent_setcb(bev, NULL, w->wr, w->ev, w->cbarg);
        bufferevent_enable(bev, EV_READ);
    }
    w->prev = srv->sched.waiters_tail;
    if (srv->sched.waiters_tail)
        srv->sched.waiters_tail->next = w;
    else
        srv->sched.waiters = w;
    srv->sched.waiters_tail = w;
    srv->sched.n_waiters++;
    return 0;
}

int coord_waiter_add(coord_req *cr, int64_t wait_s, coord_serve_fn serve) {
    return waiter_add(cr, wait_s, serve, NULL, NULL);
}

int coord_waiter_add_turn(coord_req *cr, int64_t wait_s, coord_serve_turn_fn serve,
                          coord_owed_fn owed) {
    return waiter_add(cr, wait_s, NULL, serve, owed);
}

int coord_wake_waiters(coord_server *srv) {
    /* Task requests are first come, first served: once one has to wait
     * for a slot, so do the task requests behind it, which are not even
     * looked at (none of them can hold a lease on the current version),
     * but for those waiting for their peer's lease being written. Such a
     * request holds up nobody, and once that lease is committed it is
     * answered with it, though not with a new one ahead of the requests
     * blocked before it. Which requests those are is found here, not only
     * when they park: a peer's lease may be asked for by its other request
     * after this one parked. Other requests are each served as soon as
     * they can be. */
    int tasks_blocked = 0;
    coord_waiter *w = srv->sched.waiters;
    while (w) {
        coord_waiter *next = w->next;
        int r = COORD_WAITING;
        if (!w->turn) {
            r = w->serve(&w->cr);
        } else if (!tasks_blocked || w->own_lease) {
            r = w->turn(&w->cr, tasks_blocked);
            if (r == COORD_WAITING) {
                w->own_lease = w->owed(&w->cr);
                if (!w->own_lease) tasks_blocked = 1;
            }
        }
        if (r == COORD_WAITING && w->expired) {
            coord_reply(&w->cr, 204, NULL, NULL);
            r = COORD_SERVED;
        }
        if (r == COORD_DEFERRED) waiter_restore(w);
        if (r != COORD_WAITING) waiter_unlink(srv, w);
        w = next;
    }
    return tasks_blocked;
}

void coord_drain_waiters(coord_server *srv) {
    while (srv->sched.waiters) {
        coord_waiter *w = srv->sched.waiters;
        coord_reply_error(&w->cr, 503, "draining", "the coordinator is shutting down");
        waiter_unlink(srv, w);
    }
}
