/* GET /v1/task: leases (written by the writer thread, answered when
 * committed), given out in the order the requests came. Requests that
 * must wait park in the waiting queue (schedule_wait.c), their turn kept;
 * the lease timer that frees expired slots is in schedule.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"
#include "coordinator/sched/schedule.h"
#include "coordinator/base/sched_rules.h"
#include "coordinator/api/api.h"
#include "coordinator/config/config.h"
#include "coordinator/http/http.h"
#include "coordinator/run/writer.h"

/* A lease on its way to the database on its own (GET /v1/task). */
typedef struct issue_job {
    coord_job job;
    coord_req cr;
    coord_lease lease;
} issue_job;

static int issue_run(storage *db, coord_job *job, vl_error *err) {
    return coord_lease_write(db, &((issue_job *)job)->lease, err);
}

static void issue_done(coord_job *job, int rc, const vl_error *err) {
    issue_job *j = (issue_job *)job;
    coord_server *srv = j->cr.srv;
    if (rc != VL_OK) {
        coord_lease_abandoned(srv, &j->lease);
        coord_reply_internal(&j->cr, err);
    } else {
        coord_reply_json(&j->cr, 200, coord_lease_committed(srv, &j->lease));
    }
    free(j);
    /* The peer's other task requests waited for this lease (lease_owed),
     * and a request that found the lease both committed and in flight
     * counts its slot once now. */
    coord_wake_waiters(srv);
}

static int issue_task(coord_req *cr, int64_t now) {
    coord_server *srv = cr->srv;
    issue_job *j = calloc(1, sizeof *j);
    if (!j) {
        coord_reply_oom(cr, "issuing a task");
        return COORD_SERVED;
    }
    j->job.run = issue_run;
    j->job.done = issue_done;
    j->cr = *cr;
    coord_lease_prepare(srv, cr->peer_id, now, &j->lease);
    uint64_t seq = coord_writer_submit(srv->run.writer, &j->job);
    coord_issuing *l = coord_lease_issuing_find(srv, cr->peer_id);
    if (l) l->seq = seq;
    return COORD_DEFERRED;
}

/* Answers cr now if the scheduler allows (COORD_SERVED: a task, 410 or
 * an error), hands it to a lease being written (COORD_DEFERRED), or
 * leaves it waiting (COORD_WAITING). behind: a task request parked
 * before this one still waits for a slot, so this one may not take a
 * new lease (it may still get the lease it holds). */
static int serve_task(coord_req *cr, int behind) {
    coord_server *srv = cr->srv;
    int64_t now = vl_clock_unix_s();
    vl_error e = {0};
    storage_task t;
    int has_lease = 0;
    int64_t slots = 0;
    int async = coord_config_is_async(&srv->run.cfg);
    /* Before any read of the database (coord_lease_issuing_unsettled). */
    uint64_t settled = coord_writer_settled(srv->run.writer);
    /* The peer's lease is being written: this request gets it once it is
     * committed (issue_done wakes the waiters). */
    if (!srv->run.finished && coord_lease_issuing_has(srv, cr->peer_id)) return COORD_WAITING;
    if (!srv->run.finished) {
        /* An async peer keeps its lease across versions; a sync lease is
         * for the current version only. */
        int rc =
            async
                ? storage_task_find_any_lease(srv->run.db, cr->peer_id, now, cr->uploading, &t, &e)
                : storage_task_find_lease(srv->run.db, cr->peer_id, srv->run.version, now, &t, &e);
        if (rc != VL_OK && rc != VL_ENOTFOUND) {
            coord_reply_internal(cr, &e);
            return COORD_SERVED;
        }
        has_lease = rc == VL_OK;
        if (!has_lease && !async) {
            if (storage_task_count_slots(srv->run.db, srv->run.version, now, &slots, &e)) {
                coord_reply_internal(cr, &e);
                return COORD_SERVED;
            }
            /* Leases being written hold their slots already. */
            slots += coord_lease_issuing_unsettled(srv, srv->run.version, settled);
        }
        if (async && !has_lease) {
            /* An update on its way (?uploading=) counts as waiting, as
             * the upload that asks for the next lease does, until it is
             * stored (and counted among the unmerged). */
            int pending = 0;
            if (cr->uploading) {
                storage_task up;
                int grc = storage_task_get(srv->run.db, cr->uploading, &up, &e);
                if (grc != VL_OK && grc != VL_ENOTFOUND) {
                    coord_reply_internal(cr, &e);
                    return COORD_SERVED;
                }
                pending =
                    grc == VL_OK && up.peer_id == cr->peer_id && up.state == STORAGE_TASK_LEASED;
            }
            int64_t waiting;
            int hold = coord_lease_async_hold(srv, pending, &waiting, &e);
            /* A peer that asked to train while it uploads (--overlap) is
             * not held for that upload's version. */
            if (hold == VL_OK && !pending)
                hold = coord_lease_own_wait(srv, cr->peer_id, 0, waiting, &e);
            /* Woken when the version is committed. */
            if (hold == VL_AGAIN) return COORD_WAITING;
            if (hold != VL_OK) {
                coord_reply_internal(cr, &e);
                return COORD_SERVED;
            }
        }
    }
    coord_sched_action act = async ? coord_sched_decide_async(srv->run.finished, has_lease)
                                   : coord_sched_decide(srv->run.finished, has_lease, slots,
                                                        srv->run.cfg.updates_per_version);
    switch (act) {
    case COORD_SCHED_FINISHED:
        coord_reply_error(cr, 410, "run_finished", "the run reached its last version (%lld)",
                          (long long)srv->run.version);
        return COORD_SERVED;
    case COORD_SCHED_SAME_TASK:
        coord_reply_json(cr, 200, coord_lease_task_json(srv, &t));
        return COORD_SERVED;
    case COORD_SCHED_NEW_TASK:
        if (behind || coord_lease_issuing_room(srv) != 0) return COORD_WAITING;
        return issue_task(cr, now);
    case COORD_SCHED_WAIT: break;
    }
    return COORD_WAITING;
}

/* A parked task request is owed an answer while its peer's lease is
 * being written (issue_done wakes the waiters once it is committed). */
static int lease_owed(const coord_req *cr) {
    return coord_lease_issuing_has(cr->srv, cr->peer_id);
}

/* ---- the route -------------------------------------------------------------- */

/* The rest of GET /v1/task, once its query is read and a lease it
 * released is ended. */
static void route_task_go(coord_req *cr, int64_t wait) {
    coord_server *srv = cr->srv;
    if (srv->draining) {
        coord_reply_error(cr, 503, "draining", "the coordinator is shutting down");
        return;
    }
    /* Requests parked before this one go first. A slot can free with no
     * wake-up to hand it on (a lease reaching its deadline before the
     * lease timer has run), and a request that looked for itself alone
     * would take it from the oldest waiter. */
    int behind = srv->sched.waiters ? coord_wake_waiters(srv) : 0;
    if (serve_task(cr, behind) != COORD_WAITING) return;
    if (wait == 0) {
        coord_reply(cr, 204, NULL, NULL);
        return;
    }
    if (coord_waiter_add_turn(cr, wait, serve_task, lease_owed) != 0) {
        coord_reply_oom(cr, "registering a waiter");
    }
}

/* ?release=T: the peer is done with its lease T although no update of it
 * was taken (the coordinator turned the update down for what it held, or
 * the peer is stopping mid-task), so the lease ends now rather than at
 * its deadline, and the peer's next lease (or another peer's) need not
 * wait for it. Written by the writer; the request goes on once it is
 * committed: to a new lease, or with next=0 (a peer leaving) to 204. */
typedef struct release_job {
    coord_job job;
    coord_req cr;
    int64_t task_id, wait, n;
    int next;
} release_job;

static void release_then(coord_req *cr, int64_t wait, int next) {
    if (next)
        route_task_go(cr, wait);
    else
        coord_reply(cr, 204, NULL, NULL);
}

static int release_run(storage *db, coord_job *job, vl_error *err) {
    release_job *j = (release_job *)job;
    return storage_task_release(db, j->task_id, j->cr.peer_id, &j->n, err);
}

static void release_done(coord_job *job, int rc, const vl_error *err) {
    release_job *j = (release_job *)job;
    coord_server *srv = j->cr.srv;
    if (rc != VL_OK) {
        coord_reply_internal(&j->cr, err);
    } else {
        if (j->n > 0) {
            vl_log_info("peer %lld released task %lld; its data goes to the next tasks",
                        (long long)j->cr.peer_id, (long long)j->task_id);
            /* A sync slot is free, and the version may wait on it. */
            coord_arm_lease_timer(srv);
            coord_schedule_merge(srv);
        }
        release_then(&j->cr, j->wait, j->next);
    }
    free(j);
}

/* Checks ?release=T against the task's owner and starts its job; with
 * nothing to release (the lease ended already, or its update is stored)
 * the request goes on at once. */
static void release_lease(coord_req *cr, int64_t task_id, int64_t wait, int next) {
    coord_server *srv = cr->srv;
    storage_task t;
    vl_error e = {0};
    int rc = storage_task_get(srv->run.db, task_id, &t, &e);
    if (rc == VL_ENOTFOUND) {
        coord_reply_error(cr, 404, "unknown_task", "no task %lld", (long long)task_id);
        return;
    }
    if (rc != VL_OK) {
        coord_reply_internal(cr, &e);
        return;
    }
    if (t.peer_id != cr->peer_id) {
        coord_reply_error(cr, 403, "not_your_task", "task %lld is not leased to you",
                          (long long)task_id);
        return;
    }
    if (t.state != STORAGE_TASK_LEASED) {
        release_then(cr, wait, next);
        return;
    }
    release_job *j = calloc(1, sizeof *j);
    if (!j) {
        coord_reply_oom(cr, "releasing a task");
        return;
    }
    j->job.run = release_run;
    j->job.done = release_done;
    j->cr = *cr;
    j->task_id = task_id;
    j->wait = wait;
    j->next = next;
    coord_writer_submit(srv->run.writer, &j->job);
}

/* ?uploading=T names a task of the caller's, as ?release=T does: one
 * never leased is 404 unknown_task, another peer's 403 not_your_task, so
 * a peer cannot make its lease look past someone else's task. Whatever
 * T's state (its update stored meanwhile, its lease over), the request
 * goes on: then no update of it is pending. 0, or answers and COORD_ANSWERED. */
static int uploading_check(coord_req *cr, int64_t task_id) {
    storage_task t;
    vl_error e = {0};
    int rc = storage_task_get(cr->srv->run.db, task_id, &t, &e);
    if (rc == VL_ENOTFOUND) {
        coord_reply_error(cr, 404, "unknown_task", "no task %lld", (long long)task_id);
        return COORD_ANSWERED;
    }
    if (rc != VL_OK) {
        coord_reply_internal(cr, &e);
        return COORD_ANSWERED;
    }
    if (t.peer_id != cr->peer_id) {
        coord_reply_error(cr, 403, "not_your_task", "task %lld is not leased to you",
                          (long long)task_id);
        return COORD_ANSWERED;
    }
    return 0;
}

void coord_route_task(coord_req *cr) {
    const char *const keys[] = {"wait", "uploading", "release", "next", NULL};
    int64_t vals[4] = {0, 0, 0, 1};
    unsigned present = 0;
    static const char hint[] =
        "wait is 0 to " VL_STR(COORD_MAX_WAIT_S) ", uploading and release task ids, next 0 or 1";
    if (coord_req_query(cr, keys, INT64_MAX, vals, &present, hint) != 0) return;
    coord_server *srv = cr->srv;
    if (vals[0] > COORD_MAX_WAIT_S) {
        coord_reply_error(cr, 400, "bad_request", "wait is 0 to " VL_STR(COORD_MAX_WAIT_S));
        return;
    }
    /* Only an async run lets a peer's next lease overlap its last upload:
     * a sync version takes one update per lease and would count the two
     * leases as two of its slots. */
    if ((present & 2u) && !coord_config_is_async(&srv->run.cfg)) {
        coord_reply_error(cr, 400, "bad_request",
                          "uploading is for async runs; this run is synchronous");
        return;
    }
    if ((present & 2u) && vals[1] <= 0) {
        coord_reply_error(cr, 400, "bad_request", "uploading is a task id, 1 or more");
        return;
    }
    if ((present & 4u) && vals[2] <= 0) {
        coord_reply_error(cr, 400, "bad_request", "release is a task id, 1 or more");
        return;
    }
    if ((present & 4u) && vals[2] == vals[1]) {
        coord_reply_error(cr, 400, "bad_request", "a task cannot be released while it uploads");
        return;
    }
    if ((present & 8u) && vals[3] > 1) {
        coord_reply_error(cr, 400, "bad_request", "next is 0 or 1");
        return;
    }
    /* next=0 asks for no lease: only a release can give it meaning. */
    if (vals[3] == 0 && !(present & 4u)) {
        coord_reply_error(cr, 400, "bad_request", "next=0 goes with release");
        return;
    }
    if (srv->draining) {
        coord_reply_error(cr, 503, "draining", "the coordinator is shutting down");
        return;
    }
    if ((present & 2u) && uploading_check(cr, vals[1]) != 0) return;
    cr->uploading = vals[1];
    if (present & 4u) {
        release_lease(cr, vals[2], vals[0], (int)vals[3]);
        return;
    }
    route_task_go(cr, vals[0]);
}
