/*
 * When the coordinator's background work runs, on the loop: the next
 * merge, the close of a second round, the expiry of leases, and the next
 * look at requests that long-poll. scheduler.h holds the pure rules
 * (whether a version is due); this module applies them with the loop's
 * timers and decides what follows each piece of work: a version made
 * wakes the waiters, re-arms the lease timer and looks for the next
 * merge; a round opened wakes the waiters and arms its deadline; expired
 * leases wake the waiters and may complete a sync version.
 *
 * The merge engine reports back through the callback it is handed, and
 * the waiting queue serves task requests through the functions they park
 * with, so calls between the coordinator's files go one way:
 *
 *   routes_task.c ──> schedule.c ──> aggregator.c ──> round.c
 *         │               │
 *         └───────────────┴──> schedule_wait.c
 *
 * (routes_updates.c and routes_round.c call into schedule.c and
 * schedule_wait.c as well, server.c at start and at close.)
 */
#ifndef VOLLEY_COORD_SCHEDULE_H
#define VOLLEY_COORD_SCHEDULE_H

#include <stdint.h>

#include "common/common.h"

struct coord_server;
struct coord_req;

/* ---- merging and the second round (schedule.c) --------------------------- */

/* Makes the next version if the waiting updates are due
 * (coord_sched_merge_due), a sync deadline scheduling the merge for later
 * when they are not; in a run with a second round, once the version's
 * own updates are in, first opens the round or waits for its values or
 * its deadline. The version is computed and handed to the writer
 * (coord_merge_start); the server moves to it once that has committed.
 * Returns 1 when a version was handed over, 0 when not due (or one is
 * already being written), or a negative VL_E* code. */
int coord_merge_if_ready(struct coord_server *srv, vl_error *err);
/* Runs coord_merge_if_ready from the loop soon (after pending replies are
 * flushed). */
void coord_schedule_merge(struct coord_server *srv);
/* Runs coord_merge_if_ready in delay_s seconds, or sooner if already
 * scheduled sooner. */
void coord_schedule_merge_in(struct coord_server *srv, double delay_s);
/* An update was stored: makes a version if that completed one. */
void coord_note_update(struct coord_server *srv);
/* Schedules a merge in delay_s seconds (an open round's deadline). */
void coord_arm_round_timer(struct coord_server *srv, double delay_s);

/* ---- a full disk (schedule.c) -------------------------------------------- */

/* What the coordinator knows of its disk filling up. While the writer
 * finds the disk full, merges back off (first_s, doubling up to max_s;
 * 5 and 60 s unless a test shortens them), uploads get 503 unavailable,
 * and the log has one line when it fills and one when it has room again;
 * updates acknowledged before stay stored and are merged once it has. */
typedef struct coord_disk {
    int full;              /* reported full, not yet found room again */
    double since;          /* when it was found full (monotonic seconds) */
    int64_t reports;       /* full disks reported since start */
    int64_t retries;       /* merges tried while full, since start */
    double retry_s;        /* the delay of the next merge retry while full */
    double first_s, max_s; /* the backoff's first and largest delays */
} coord_disk;

/* The writer's full-disk hook (coord_writer_set_full_hook) for srv, which
 * is arg: logs the report (what waits for a merge, what retries) or the
 * return of room, and resets the merge backoff. Loop thread. */
void coord_disk_note(void *arg, int full, const vl_error *err);

/* ---- leases (schedule.c) ------------------------------------------------- */

/* Marks the leases whose deadline has passed as expired (a writer job),
 * then wakes waiters and re-arms the lease timer. Also run at start, for
 * leases that ran out while the coordinator was down. */
void coord_expire_leases(struct coord_server *srv);
/* Arms the lease timer for the earliest unexpired lease of the current
 * version (every version in async runs), or disarms it when there is
 * none. */
void coord_arm_lease_timer(struct coord_server *srv);
/* Wakes the waiters in delay_s seconds (the end of a lease_wait), or
 * sooner if a wake-up is already due sooner. */
void coord_arm_wait_timer(struct coord_server *srv, double delay_s);

/* ---- waiting requests (schedule_wait.c) ---------------------------------- */

/* What a serve function did with a request. */
#define COORD_WAITING 0  /* nothing yet: keep it waiting */
#define COORD_SERVED 1   /* answered */
#define COORD_DEFERRED 2 /* handed to a database job, which will answer it */
/* Tries to answer a waiting request; returns one of the above. */
typedef int (*coord_serve_fn)(struct coord_req *cr);
/* Parks cr (a long-poll) until serve answers it on a wake-up, or for
 * wait_s seconds, after which serve gets one last try and otherwise 204 is
 * sent. Returns 0, or -1 when out of memory (cr is then still the caller's
 * to answer). */
int coord_waiter_add(struct coord_req *cr, int64_t wait_s, coord_serve_fn serve);
/* The serve function of a request that waits its turn (task requests,
 * first come, first served): behind is 1 when a request of its kind that
 * parked earlier still waits, and then it may only get what is already
 * its own. */
typedef int (*coord_serve_turn_fn)(struct coord_req *cr, int behind);
/* Whether cr's answer is on its way already (its peer's lease is being
 * written): such a request holds up nobody behind it. */
typedef int (*coord_owed_fn)(const struct coord_req *cr);
/* coord_waiter_add for a request that waits its turn: once one of them
 * has to keep waiting, those behind it are not looked at, except the ones
 * owed reports as owed an answer. */
int coord_waiter_add_turn(struct coord_req *cr, int64_t wait_s, coord_serve_turn_fn serve,
                          coord_owed_fn owed);
/* Answers waiting requests that can now be served (a lease freed, a
 * version was made, a round opened, the run finished), oldest first, and
 * 204 to those whose wait is over. Returns 1 when a request that waits
 * its turn still waits. */
int coord_wake_waiters(struct coord_server *srv);
/* Answers every waiting request with 503 draining. */
void coord_drain_waiters(struct coord_server *srv);

#endif
