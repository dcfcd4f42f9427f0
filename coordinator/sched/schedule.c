/* The loop's timers for merges, second rounds and leases, and what
 * follows each version, round and expiry (schedule.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "coordinator/run/aggregator.h"
#include "coordinator/run/factors.h"
#include "coordinator/run/round.h"
#include "coordinator/coord.h"
#include "coordinator/sched/schedule.h"
#include "coordinator/base/sched_rules.h"
#include "coordinator/config/config.h"
#include "coordinator/run/writer.h"

/* A merge that failed (the database was busy or full) is retried, and so
 * is the opening of a round. */
#define MERGE_RETRY_S 5

/* A timeval of s >= 0 seconds. */
static struct timeval timeval_of(double s) {
    return (struct timeval){(time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6)};
}

/* *ev, created on first use; NULL (logged as what) when it cannot be. */
static struct event *timer_of(coord_server *srv, struct event **ev, event_callback_fn cb,
                              const char *what) {
    if (!*ev) {
        *ev = evtimer_new(srv->base, cb, srv);
        if (!*ev) vl_log_error("%s", what);
    }
    return *ev;
}

/* ---- a full disk ----------------------------------------------------------- */

/* The backoff's defaults, in seconds. */
#define DISK_RETRY_FIRST_S 5.0
#define DISK_RETRY_MAX_S 60.0

static void disk_defaults(coord_disk *d) {
    if (d->first_s <= 0) d->first_s = DISK_RETRY_FIRST_S;
    if (d->max_s < d->first_s)
        d->max_s = d->first_s > DISK_RETRY_MAX_S ? d->first_s : DISK_RETRY_MAX_S;
}

/* The disk took a write again after it was reported full. */
static void disk_room(coord_server *srv, const char *what) {
    coord_disk *d = &srv->sched.disk;
    const char *slash = strrchr(srv->run.db_path, '/');
    d->full = 0;
    vl_log_info("disk has room again for %s after %.0f s and %lld merge retries: %s",
                slash ? slash + 1 : srv->run.db_path, vl_clock_mono_s() - d->since,
                (long long)d->retries, what);
}

void coord_disk_note(void *arg, int full, const vl_error *err) {
    coord_server *srv = arg;
    coord_disk *d = &srv->sched.disk;
    disk_defaults(d);
    if (full) {
        if (d->full) return;
        const char *slash = strrchr(srv->run.db_path, '/');
        const char *name = slash ? slash + 1 : srv->run.db_path;
        d->full = 1;
        d->since = vl_clock_mono_s();
        d->reports++;
        /* A read: it needs no room. */
        int64_t waiting = -1;
        vl_error e = {0};
        if (storage_update_count_unmerged(srv->run.db, &waiting, &e) != VL_OK) waiting = -1;
        char what[96];
        if (waiting >= 0)
            snprintf(what, sizeof what,
                     "%lld uploads acknowledged and waiting for a merge are safe",
                     (long long)waiting);
        else
            snprintf(what, sizeof what,
                     "the uploads acknowledged and waiting for a merge are safe");
        vl_log_error("disk full writing %s: %s; merges paused, retrying after %g s and then less "
                     "often, up to every %g s; uploads get 503 until there is room (%s)",
                     name, what, d->first_s, d->max_s, err && err->msg[0] ? err->msg : "no detail");
        return;
    }
    /* A small write may find room where a version does not: while a
     * merge waits for room, only its own commit ends the report
     * (disk_room), else the two would take turns in the log. */
    if (d->full && d->retry_s <= 0) disk_room(srv, "uploads resume");
}

/* ---- the merge timer ----------------------------------------------------- */

static void merge_cb(evutil_socket_t fd, short what, void *arg);

static void merge_retry(coord_server *srv, int rc, const char *why) {
    coord_disk *d = &srv->sched.disk;
    if (rc == VL_EFULL || d->full) {
        /* Reported once, by coord_disk_note; retried less and less often. */
        disk_defaults(d);
        double delay = d->retry_s > 0 ? d->retry_s : d->first_s;
        d->retries++;
        d->retry_s = delay * 2 < d->max_s ? delay * 2 : d->max_s;
        vl_log_debug("merge of version %lld waits for room, retrying in %g s: %s",
                     (long long)srv->run.version, delay, why);
        if (!timer_of(srv, &srv->sched.merge_event, merge_cb,
                      "cannot schedule a merge: out of memory"))
            return;
        /* At its time, whatever was asked for sooner meanwhile. */
        evtimer_del(srv->sched.merge_event);
        srv->sched.merge_scheduled = 1;
        struct timeval tv = timeval_of(delay);
        evtimer_add(srv->sched.merge_event, &tv);
        return;
    }
    vl_log_error("merge of version %lld failed, retrying in %d s: %s", (long long)srv->run.version,
                 MERGE_RETRY_S, why);
    coord_schedule_merge_in(srv, MERGE_RETRY_S);
}

static void merge_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    coord_server *srv = arg;
    srv->sched.merge_scheduled = 0;
    vl_error err = {0};
    int rc = coord_merge_if_ready(srv, &err);
    if (rc != VL_OK && rc != VL_AGAIN) merge_retry(srv, rc, err.msg);
}


/* Arms ev to fire in delay_s seconds unless it is pending to fire sooner
 * (a later one is brought forward). */
static void arm_sooner(struct event *ev, double delay_s) {
    if (delay_s < 0) delay_s = 0;
    struct timeval tv = timeval_of(delay_s);
    struct timeval left;
    if (evtimer_pending(ev, &left)) {
        struct timeval now;
        evutil_gettimeofday(&now, NULL);
        struct timeval want;
        evutil_timeradd(&now, &tv, &want);
        if (evutil_timercmp(&left, &want, <=)) return;
    }
    evtimer_del(ev);
    evtimer_add(ev, &tv);
}

void coord_schedule_merge_in(coord_server *srv, double delay_s) {
    /* A merge waiting for room on the disk keeps its time: each upload
     * that still fits would otherwise bring it forward, and make a version
     * that cannot be stored once per upload. */
    if (srv->sched.disk.retry_s > 0 && srv->sched.merge_scheduled) return;
    if (!timer_of(srv, &srv->sched.merge_event, merge_cb, "cannot schedule a merge: out of memory"))
        return;
    /* The merge callback clears merge_scheduled before it runs. */
    if (!srv->sched.merge_scheduled) evtimer_del(srv->sched.merge_event);
    srv->sched.merge_scheduled = 1;
    arm_sooner(srv->sched.merge_event, delay_s);
}

void coord_schedule_merge(coord_server *srv) {
    /* A few milliseconds let the 202 that completed the version leave
     * before the merge holds the loop. */
    coord_schedule_merge_in(srv, 0.005);
}

void coord_note_update(coord_server *srv) {
    coord_schedule_merge(srv);
}

/* ---- the round timer ----------------------------------------------------- */

static void round_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    coord_schedule_merge(arg);
}

void coord_arm_round_timer(coord_server *srv, double delay_s) {
    if (!timer_of(srv, &srv->sched.round_timer, round_timer_cb, "cannot create the round timer"))
        return;
    /* Deadlines are whole seconds of the coordinator's clock; a little
     * past it the round is surely over. */
    if (delay_s < 0) delay_s = 0;
    delay_s += 0.05;
    struct timeval tv = timeval_of(delay_s);
    evtimer_del(srv->sched.round_timer);
    evtimer_add(srv->sched.round_timer, &tv);
}

/* ---- when a version is made ---------------------------------------------- */

/* After a version's job: the waiters may be served by it, the lease
 * timer follows the new version's leases, and in an async run the next
 * buffer may be full already. A failed one is tried again later. */
static void version_made(coord_server *srv, int rc, const vl_error *err) {
    if (rc != VL_OK) {
        merge_retry(srv, rc, err->msg);
        return;
    }
    srv->sched.disk.retry_s = 0;
    if (srv->sched.disk.full) disk_room(srv, "the paused merge is done, merges and uploads resume");
    coord_wake_waiters(srv);
    coord_arm_lease_timer(srv);
    coord_schedule_merge(srv);
}

/* After a round's opening: its waiters get the candidates, and its
 * deadline closes it; one that failed to open is tried again. */
static void round_opened(coord_server *srv, int rc, const vl_error *err) {
    (void)err; /* logged by the engine */
    if (rc != VL_OK) {
        coord_arm_round_timer(srv, MERGE_RETRY_S);
        return;
    }
    coord_wake_waiters(srv);
    coord_arm_round_timer(srv, (double)srv->run.cfg.round_s);
}

/* Whether the waiting updates are due; when they are not but a sync
 * deadline will make them so, a merge is scheduled for then. */
static int merge_due(coord_server *srv, int64_t *done, vl_error *err) {
    int64_t unmerged = 0;
    *done = 0;
    int rc = storage_update_count_unmerged(srv->run.db, &unmerged, err);
    if (rc == VL_OK) rc = storage_task_count_done(srv->run.db, srv->run.version, done, err);
    if (rc != VL_OK) return rc;
    const coord_config *cfg = &srv->run.cfg;
    double age = vl_clock_mono_s() - srv->run.version_born;
    int async = coord_config_is_async(cfg);
    if (coord_sched_merge_due(async, unmerged, *done, cfg->updates_per_version, age,
                              cfg->round_deadline_s))
        return VL_OK;
    if (!async && cfg->round_deadline_s > 0 && unmerged > 0)
        coord_schedule_merge_in(srv, (double)cfg->round_deadline_s - age + 0.05);
    return VL_AGAIN;
}

/* Where the current version stands with its second round, once all its
 * n_updates updates are in: VL_OK when it can be merged now (every update
 * has its values or the deadline passed; *r then holds the round, which
 * the caller frees), VL_AGAIN when it must wait (the round was just
 * opened, or is still open: the round timer merges at its deadline), or
 * another VL_E* code. */
static int round_ready(coord_server *srv, int64_t n_updates, storage_round *r, vl_error *err) {
    if (srv->sched.opening_round) return VL_AGAIN; /* its job re-arms the timer */
    int rc = storage_round_get(srv->run.db, srv->run.version, r, err);
    if (rc == VL_ENOTFOUND)
        return coord_round_open(srv, round_opened, err) == VL_OK ? VL_AGAIN : VL_ERR;
    if (rc != VL_OK) return rc;
    int64_t have = 0;
    if ((rc = storage_round_values_count(srv->run.db, srv->run.version, &have, err)) != VL_OK) {
        storage_round_free(r);
        return rc;
    }
    int64_t now = vl_clock_unix_s();
    if (have < n_updates && now < r->deadline) {
        coord_arm_round_timer(srv, (double)(r->deadline - now));
        storage_round_free(r);
        return VL_AGAIN;
    }
    return VL_OK;
}

int coord_merge_if_ready(coord_server *srv, vl_error *err) {
    if (srv->run.finished || srv->sched.merging) return VL_AGAIN;
    int64_t done = 0;
    int rc = merge_due(srv, &done, err);
    if (rc != VL_OK) return rc;
    /* A second round is for the current version's own updates; one closed
     * by a deadline before they all came has none. */
    storage_round r = {0};
    int with_round = 0;
    if (coord_config_round_candidates(&srv->run.cfg) > 0 && done > 0) {
        rc = round_ready(srv, done, &r, err);
        if (rc != VL_OK) return rc;
        with_round = 1;
    }
    return coord_merge_start(srv, with_round ? &r : NULL, version_made, err);
}

/* ---- lease expiry ---------------------------------------------------------- */

typedef struct expire_job {
    coord_job job;
    coord_server *srv;
    int64_t now, n;
} expire_job;

static int expire_run(storage *db, coord_job *job, vl_error *err) {
    expire_job *j = (expire_job *)job;
    return storage_task_expire(db, j->now, &j->n, err);
}

static void expire_done(coord_job *job, int rc, const vl_error *err) {
    expire_job *j = (expire_job *)job;
    coord_server *srv = j->srv;
    srv->sched.expiring = 0;
    if (rc != VL_OK) /* a full disk is reported once, by coord_disk_note */
        vl_log_msg(rc == VL_EFULL ? LOG_DEBUG : LOG_ERROR, "cannot expire leases: %s", err->msg);
    else if (j->n > 0)
        vl_log_info("%lld lease(s) expired; their data goes to the next tasks", (long long)j->n);
    free(j);
    coord_wake_waiters(srv);
    coord_arm_lease_timer(srv);
    /* A sync round that was waiting on a vanished peer may be due now. */
    coord_schedule_merge(srv);
}

static void lease_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    coord_expire_leases(arg);
}

void coord_expire_leases(coord_server *srv) {
    if (srv->sched.expiring) return; /* the job in flight re-arms the timer */
    if (!timer_of(srv, &srv->sched.lease_timer, lease_timer_cb, "cannot create the lease timer"))
        return;
    expire_job *j = calloc(1, sizeof *j);
    if (!j) {
        vl_log_error("cannot expire leases: out of memory; retrying");
        struct timeval tv = {1, 0};
        evtimer_add(srv->sched.lease_timer, &tv);
        return;
    }
    j->job.run = expire_run;
    j->job.done = expire_done;
    j->srv = srv;
    j->now = vl_clock_unix_s();
    srv->sched.expiring = 1;
    coord_writer_submit(srv->run.writer, &j->job);
}

static void wait_timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    coord_wake_waiters(arg);
}

void coord_arm_wait_timer(coord_server *srv, double delay_s) {
    if (!timer_of(srv, &srv->sched.wait_timer, wait_timer_cb, "cannot create the wait timer"))
        return;
    arm_sooner(srv->sched.wait_timer, delay_s);
}

void coord_arm_lease_timer(coord_server *srv) {
    if (!timer_of(srv, &srv->sched.lease_timer, lease_timer_cb, "cannot create the lease timer"))
        return;
    evtimer_del(srv->sched.lease_timer);
    if (srv->run.finished) return;
    vl_error e = {0};
    int64_t next = 0;
    int rc = coord_config_is_async(&srv->run.cfg)
                 ? storage_task_next_deadline_any(srv->run.db, vl_clock_unix_s(), &next, &e)
                 : storage_task_next_deadline(srv->run.db, srv->run.version, vl_clock_unix_s(),
                                              &next, &e);
    if (rc != VL_OK) {
        vl_log_error("cannot find the next lease deadline: %s", e.msg);
        return;
    }
    if (next <= 0) return;
    /* A lease ends when the whole-second clock reaches its deadline. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    double delay = (double)next - now + 0.01;
    if (delay < 0.01) delay = 0.01;
    struct timeval tv = timeval_of(delay);
    evtimer_add(srv->sched.lease_timer, &tv);
}
