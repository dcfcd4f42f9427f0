/*
 * When the coordinator's background work runs, on the loop: the next
 * merge, the close of a second round, the expiry of leases, and the next
 * look at requests that long-poll. base/sched_rules.h holds the pure rules
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
 *
 * Contents: coord_merge_if_ready, coord_schedule_merge,
 * coord_schedule_merge_in, coord_note_update, coord_arm_round_timer,
 * coord_disk_note, coord_expire_leases, coord_arm_lease_timer,
 * coord_arm_wait_timer, coord_serve_fn, coord_waiter_add,
 * coord_serve_turn_fn, coord_owed_fn, coord_waiter_add_turn,
 * coord_wake_waiters, coord_drain_waiters, coord_lease_task_json,
 * coord_lease_issuing_find, coord_lease_issuing_has,
 * coord_lease_issuing_unsettled, coord_lease_issuing_room,
 * coord_lease_prepare, coord_lease_async_hold, coord_lease_own_wait,
 * coord_lease_offer, coord_lease_write, coord_lease_committed,
 * coord_lease_abandoned, coord_speed_lease, coord_speed_note,
 * coord_speed_steps, coord_speed_wait_left, coord_speed_due, COORD_WAITING,
 * COORD_SERVED, COORD_DEFERRED.
 */
#ifndef VOLLEY_COORD_SCHEDULE_H
#define VOLLEY_COORD_SCHEDULE_H

#include <stdint.h>

#include "common/common.h"
#include "coordinator/coord.h"

struct coord_server;
struct coord_req;

/* ---- merging and the second round (schedule.c) --------------------------- */

/* Makes the next version if the waiting updates are due
 * (coord_sched_merge_due), a sync deadline scheduling the merge for later
 * when they are not; in a run with a second round, once the version's
 * own updates are in, first opens the round or waits for its values or
 * its deadline. The version is computed and handed to the writer
 * (coord_merge_start); the server moves to it once that has committed.
 * Returns VL_OK when a version was handed over, VL_AGAIN when none is
 * due (or one is already being written), or another VL_E* code. */
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

/* ---- leases (lease.c) ---------------------------------------------------- */

/* The task as peers get it (a new JSON reference; NULL when out of memory
 * or the stored range fits no shard). */
json_t *coord_lease_task_json(const coord_server *srv, const storage_task *t);
/* The entry of peer_id among the leases with the writer, NULL when none. */
coord_issuing *coord_lease_issuing_find(const coord_server *srv, int64_t peer_id);
/* Whether a lease of peer_id is with the writer. */
int coord_lease_issuing_has(const coord_server *srv, int64_t peer_id);
/* Leases of version with the writer whose jobs were submitted after
 * settled (a submission number) or not yet. */
int64_t coord_lease_issuing_unsettled(const coord_server *srv, int64_t version, uint64_t settled);
/* Room for one more lease with the writer: 0, or -1 when full or out of
 * memory (the request then waits like any other). */
int coord_lease_issuing_room(coord_server *srv);
/* Fills l for a new lease of peer_id at now (unix s) from the current
 * version and records it with the writer; call coord_lease_issuing_room
 * first. */
void coord_lease_prepare(coord_server *srv, int64_t peer_id, int64_t now, coord_lease *l);
/* Async: VL_AGAIN when the next lease must wait for the version being
 * made (a merge runs, or a version's worth of updates waits; pending: the
 * asking upload counts as one), VL_OK, or a VL_E* code. *waiting: stored
 * updates not merged yet. */
int coord_lease_async_hold(coord_server *srv, int pending, int64_t *waiting, vl_error *err);
/* lease_wait: VL_AGAIN when peer_id's next lease waits for the version
 * that merges its last task's update (a wake-up armed for the wait's
 * end), VL_OK, or a VL_E* code; uploading: the task whose update is on its way (0:
 * none), waiting: coord_lease_async_hold's count. */
int coord_lease_own_wait(coord_server *srv, int64_t peer_id, int64_t uploading, int64_t waiting,
                         vl_error *err);

/* Whether peer_id, whose lease done_task is being uploaded, gets its next
 * task with the upload's answer: only in async runs (a sync peer waits for
 * the next version), while the run goes on, and when the peer holds no
 * other live lease. Returns VL_OK with *l prepared (then exactly one of
 * coord_lease_committed or coord_lease_abandoned must follow), VL_AGAIN
 * when not (the peer asks GET /v1/task), or a VL_E* code with err set.
 * Loop thread. */
int coord_lease_offer(coord_server *srv, int64_t peer_id, int64_t done_task, coord_lease *l,
                      vl_error *err) VL_MUST_CHECK;
/* Writer thread, inside the job's savepoint: inserts l's task, taking over
 * the data range and seed of an expired lease when one waits. */
int coord_lease_write(storage *db, coord_lease *l, vl_error *err) VL_MUST_CHECK;
/* Loop thread, after the commit: the task as peers get it (a new JSON
 * reference, NULL when out of memory), and the lease timer re-armed. */
json_t *coord_lease_committed(coord_server *srv, const coord_lease *l);
/* Loop thread, when the job holding the lease l failed. */
void coord_lease_abandoned(coord_server *srv, const coord_lease *l);

/* ---- dynamic local steps (speed.c) --------------------------------------- */

/* Task task_id is being leased to peer_id now: returns the local steps it
 * gets (train.steps unless the run has train.dynamic_steps) and starts
 * timing it. */
int64_t coord_speed_lease(coord_server *srv, int64_t peer_id, int64_t task_id);
/* The update of task_id arrived after local_steps steps that took the
 * peer train_s seconds (0: not reported): its pace becomes train_s per
 * step, and the rest of the time since the lease its overhead (with no
 * train_s: the whole time per step, no overhead), each averaged with
 * earlier ones. */
void coord_speed_note(coord_server *srv, int64_t peer_id, int64_t task_id, int64_t local_steps,
                      double train_s);
/* The local steps task t was leased with (train.steps when not known,
 * such as after a restart). */
int64_t coord_speed_steps(const coord_server *srv, const storage_task *t);
/* lease_wait: the seconds peer_id's next lease may still wait for the
 * version that merges the update of its last task, whose id goes to
 * *task_id (0 when the peer is not known); the wait's clock starts at the
 * first call for that task. 0 when the run does not wait, no peer is timed
 * yet, or the wait is over (coord_sched_wait_left). */
double coord_speed_wait_left(coord_server *srv, int64_t peer_id, int64_t *task_id);
/* How many peers other than peer_id hold a lease whose update their pace
 * says is due within horizon_s seconds from now (overdue by less than
 * one of their own tasks), counting those whose pace is not measured yet:
 * the updates a wait of that long may see arrive. */
int64_t coord_speed_due(const coord_server *srv, int64_t peer_id, double horizon_s);

#endif
