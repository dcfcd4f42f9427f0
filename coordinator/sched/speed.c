/* Dynamic local updates: what each peer's tasks took, and the local steps
 * its next task gets so that slow and fast peers' updates arrive at the
 * same pace; and the pace that bounds lease_wait. Kept in memory only:
 * after a restart every peer starts again at train.steps until its first
 * update is timed. Async runs only: a sync version waits for its tasks. */
#include <stdlib.h>

#include "coordinator/coord.h"
#include "coordinator/base/robust.h"
#include "coordinator/base/sched_rules.h"
#include "coordinator/config/config.h"
#include "coordinator/sched/schedule.h"

/* Peers timed at once; beyond it the one seen longest ago is forgotten. */
#define SPEED_MAX_PEERS 4096
/* Only peers heard from this recently set the pace. */
#define SPEED_WINDOW_S 600.0
/* New timings count this much against the running average, so a peer
 * whose machine gets busy is followed within a few tasks. */
#define SPEED_EMA 0.5

static coord_speed *find(coord_server *srv, int64_t peer_id) {
    for (size_t i = 0; i < srv->sched.n_speeds; i++)
        if (srv->sched.speeds[i].peer_id == peer_id) return &srv->sched.speeds[i];
    return NULL;
}

static coord_speed *find_or_add(coord_server *srv, int64_t peer_id, double now) {
    coord_speed *s = find(srv, peer_id);
    if (s) return s;
    if (srv->sched.n_speeds == srv->sched.cap_speeds && srv->sched.cap_speeds < SPEED_MAX_PEERS) {
        size_t cap = srv->sched.cap_speeds ? srv->sched.cap_speeds * 2 : 16;
        if (cap > SPEED_MAX_PEERS) cap = SPEED_MAX_PEERS;
        coord_speed *p = realloc(srv->sched.speeds, cap * sizeof *p);
        if (!p) return NULL; /* the peer just runs at train.steps */
        srv->sched.speeds = p;
        srv->sched.cap_speeds = cap;
    }
    if (srv->sched.n_speeds < srv->sched.cap_speeds) {
        s = &srv->sched.speeds[srv->sched.n_speeds++];
    } else {
        s = &srv->sched.speeds[0];
        for (size_t i = 1; i < srv->sched.n_speeds; i++)
            if (srv->sched.speeds[i].seen < s->seen) s = &srv->sched.speeds[i];
    }
    *s = (coord_speed){.peer_id = peer_id, .seen = now};
    return s;
}

/* How many of the n quickest recent peers the pace passes over: as many
 * as the merge rule cuts from each end of a version (the trimmed mean's
 * share, all but the middle for the median), so that a peer the rule
 * would not let steer the model, say a hostile one that answers each
 * lease at once with whatever it likes, cannot shrink every other
 * peer's steps either. */
static size_t pace_skip(const coord_config *cfg, size_t n) {
    if (cfg->robust.rule == COORD_RULE_TRIMMED_MEAN)
        return coord_config_trim_count(cfg->robust.trim, n);
    if (cfg->robust.rule == COORD_RULE_MEDIAN) return n > 0 ? (n - 1) / 2 : 0;
    return 0;
}

/* The whole task of h_max steps, in seconds, of the quickest recent peer
 * once pace_skip of them are passed over: the pace the others' steps are
 * scaled to; 0 when none is timed. */
static double quickest_task(const coord_server *srv, double now) {
    double tasks[SPEED_MAX_PEERS];
    size_t n = 0;
    double h_max = (double)srv->run.cfg.train.steps;
    for (size_t i = 0; i < srv->sched.n_speeds && n < SPEED_MAX_PEERS; i++) {
        const coord_speed *s = &srv->sched.speeds[i];
        if (s->sec_per_step <= 0 || now - s->seen > SPEED_WINDOW_S) continue;
        tasks[n++] = h_max * s->sec_per_step + s->overhead_s;
    }
    if (n == 0) return 0;
    size_t skip = pace_skip(&srv->run.cfg, n);
    if (skip == 0) {
        double best = tasks[0];
        for (size_t i = 1; i < n; i++)
            if (tasks[i] < best) best = tasks[i];
        return best;
    }
    coord_robust_sort(tasks, n);
    return tasks[skip];
}

/* Folds a new timing into a running average; the first one sets it. */
static double ema(double avg, double x, int first) {
    return first ? x : SPEED_EMA * x + (1 - SPEED_EMA) * avg;
}

int64_t coord_speed_lease(coord_server *srv, int64_t peer_id, int64_t task_id) {
    const coord_config *cfg = &srv->run.cfg;
    int64_t h_max = cfg->train.steps;
    if (!coord_config_is_async(cfg)) return h_max;
    double now = vl_clock_mono_s();
    coord_speed *s = find_or_add(srv, peer_id, now);
    if (!s) return h_max;
    int64_t h =
        cfg->train.dynamic_steps
            ? coord_sched_dynamic_steps(h_max, coord_sched_dynamic_floor(h_max), s->sec_per_step,
                                        s->overhead_s, quickest_task(srv, now))
            : h_max;
    if (s->task_id != task_id) {
        s->prev_task_id = s->task_id;
        s->prev_steps = s->steps;
        s->prev_leased_at = s->leased_at;
    }
    s->task_id = task_id;
    s->steps = h;
    s->leased_at = now;
    return h;
}

void coord_speed_note(coord_server *srv, int64_t peer_id, int64_t task_id, int64_t local_steps,
                      double train_s) {
    if (!coord_config_is_async(&srv->run.cfg) || local_steps < 1) return;
    coord_speed *s = find(srv, peer_id);
    /* Only a task timed from its own lease tells the peer's pace. */
    if (!s) return;
    double *at = s->task_id == task_id        ? &s->leased_at
                 : s->prev_task_id == task_id ? &s->prev_leased_at
                                              : NULL;
    if (!at || *at <= 0) return;
    double now = vl_clock_mono_s();
    double total = now - *at;
    /* Training time the peer reports splits the task into steps and the
     * rest (its transfers), which does not shrink with fewer steps; a
     * figure longer than the whole task is not believed. */
    double train = train_s > 0 && train_s <= total ? train_s : total;
    int first = !(s->sec_per_step > 0);
    s->sec_per_step = ema(s->sec_per_step, train / (double)local_steps, first);
    s->overhead_s = ema(s->overhead_s, total - train, first);
    s->seen = now;
    *at = 0;
}

int64_t coord_speed_steps(const coord_server *srv, const storage_task *t) {
    int64_t h_max = srv->run.cfg.train.steps;
    if (!srv->run.cfg.train.dynamic_steps) return h_max;
    for (size_t i = 0; i < srv->sched.n_speeds; i++)
        if (srv->sched.speeds[i].peer_id == t->peer_id) {
            if (srv->sched.speeds[i].task_id == t->id) return srv->sched.speeds[i].steps;
            if (srv->sched.speeds[i].prev_task_id == t->id) return srv->sched.speeds[i].prev_steps;
        }
    return h_max;
}

double coord_speed_wait_left(coord_server *srv, int64_t peer_id, int64_t *task_id) {
    *task_id = 0;
    if (!(srv->run.cfg.lease_wait > 0)) return 0;
    coord_speed *s = find(srv, peer_id);
    if (!s || s->task_id <= 0) return 0;
    double now = vl_clock_mono_s();
    *task_id = s->task_id;
    if (s->wait_task != s->task_id) {
        s->wait_task = s->task_id;
        s->wait_since = now;
    }
    return coord_sched_wait_left(s->wait_since, now, srv->run.cfg.lease_wait,
                                 quickest_task(srv, now));
}

int64_t coord_speed_due(const coord_server *srv, int64_t peer_id, double horizon_s) {
    double now = vl_clock_mono_s();
    int64_t due = 0;
    for (size_t i = 0; i < srv->sched.n_speeds; i++) {
        const coord_speed *s = &srv->sched.speeds[i];
        if (s->peer_id == peer_id || !(s->leased_at > 0)) continue;
        /* A pace not measured yet may be any: such a lease counts. */
        if (!(s->sec_per_step > 0)) {
            due++;
            continue;
        }
        double task = (double)s->steps * s->sec_per_step + s->overhead_s;
        double at = s->leased_at + task;
        /* Overdue by a whole task of its own, the peer is gone or far
         * slower than it was: its update is not counted on. */
        if (at <= now + horizon_s && at >= now - task) due++;
    }
    return due;
}
