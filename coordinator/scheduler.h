/*
 * Scheduling rules of sync mode, as pure functions: which answer a task
 * request gets, whether a late upload may still take its slot, and where a
 * task's data comes from. Version v needs updates_per_version updates; each
 * task for v holds one slot while it is leased and unexpired or done, and a
 * new task is issued only while a slot is free. Keeping these free of I/O
 * lets the tests pin them down exactly.
 */
#ifndef VOLLEY_COORD_SCHEDULER_H
#define VOLLEY_COORD_SCHEDULER_H

#include <stdint.h>

typedef enum {
    COORD_SCHED_FINISHED = 0, /* the run is over: 410 */
    COORD_SCHED_SAME_TASK,    /* the peer holds an unexpired lease: hand it back */
    COORD_SCHED_NEW_TASK,     /* a slot is free: issue a task */
    COORD_SCHED_WAIT,         /* every slot is taken: long-poll or 204 */
} coord_sched_action;

/* The answer to a task request. finished: the run reached its last version.
 * has_lease: the peer holds an unexpired lease on the current version.
 * slots_taken: tasks for the current version that are done or leased and
 * unexpired. */
coord_sched_action coord_sched_decide(int finished, int has_lease, int64_t slots_taken,
                                      int64_t updates_per_version);

/* Whether an upload for a task whose lease has expired is still taken:
 * only while its version is current (current) and no other task has taken
 * the slot it gave up (slots_taken counts the others). */
int coord_sched_accept_late(int current, int64_t slots_taken, int64_t updates_per_version);

/* The byte range of task task_id inside a training part of train_len
 * bytes: length min(task_bytes, train_len) at an offset drawn uniformly
 * from the valid offsets, deterministic from (run_seed, task_id). Returns 0,
 * or -1 when train_len or task_bytes is not positive. */
int coord_sched_task_range(uint64_t run_seed, int64_t task_id, int64_t train_len,
                           int64_t task_bytes, int64_t *offset, int64_t *length);

/* The training seed of task task_id: deterministic from (run_seed,
 * task_id), in [0, 2^31) so every JSON reader takes it exactly. */
int64_t coord_sched_task_seed(uint64_t run_seed, int64_t task_id);

#endif
