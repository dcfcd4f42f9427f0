/*
 * Scheduling rules, as pure functions: which answer a task request gets,
 * when the waiting updates make a version, and where a task's data comes
 * from. In a sync run version v needs updates_per_version updates; each
 * task for v holds one slot while it is leased and unexpired or done, and
 * a new task is issued only while a slot is free. In an async run every
 * peer gets a task and every updates_per_version accepted updates make a
 * version. Keeping these free of I/O lets the tests pin them down exactly.
 *
 * Contents: coord_sched_action, coord_sched_decide,
 * coord_sched_decide_async, coord_sched_merge_due,
 * coord_sched_version_refused, coord_sched_dynamic_steps,
 * coord_sched_dynamic_floor, coord_sched_wait_left, coord_sched_lr,
 * coord_sched_task_range, coord_sched_token_range,
 * coord_sched_token_locate, coord_sched_task_seed, COORD_DYNAMIC_SNAP.
 */
#ifndef VOLLEY_COORD_SCHED_RULES_H
#define VOLLEY_COORD_SCHED_RULES_H

#include <stdint.h>
#include "coordinator/config/config.h"

struct coord_train_config;

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

/* The answer to a task request in an async run: every peer gets a lease
 * (the same one while it holds one), whatever the version. */
coord_sched_action coord_sched_decide_async(int finished, int has_lease);

/* Whether the unmerged updates make the next version now. async: once
 * there are updates_per_version of them, whatever their bases (FedBuff's
 * buffer of K). sync: once updates_per_version tasks of the current
 * version are done (done_current), or when the version is deadline_s old
 * (age_s; 0 means no deadline) and at least one update waits. */
int coord_sched_merge_due(int async, int64_t unmerged, int64_t done_current,
                          int64_t updates_per_version, double age_s, int64_t deadline_s);

/* Whether a version whose parameters score val_loss is refused: when the
 * loss is not finite, or max_rise > 0 and it is more than max_rise times
 * best above best, the lowest validation loss of any version so far (not
 * finite: unknown, and then only the first test applies). A refused
 * version keeps its predecessor's parameters and restarts the outer
 * optimiser (DESIGN.md, "Durability"). */
int coord_sched_version_refused(double val_loss, double best, double max_rise);

/* Dynamic local updates (DyLU, Liu et al. 2024): the local steps of a task
 * for a peer whose tasks take overhead_s seconds besides training (its
 * transfers) and sec_per_step a step, when the quickest recent peer's
 * whole task of h_max steps takes task_s: round((task_s - overhead_s) /
 * sec_per_step), clamped to [h_min, h_max], so that every peer's task
 * takes about as long as the quickest one's. With no overheads that is
 * round(h_max * fastest / sec_per_step). A count within COORD_DYNAMIC_SNAP
 * of h_max becomes h_max. h_max when the pace or task_s is unknown (<= 0). */
/* Peers whose pace is within this fraction of the quickest one's train
 * every step. Measured paces of equally quick machines differ by about
 * this much (a busy neighbour, a noisy timing), and the quickest of them
 * sets the reference, so without it the rest lose a step or two on every
 * task: a version then merges fewer steps than its updates could carry,
 * which costs more loss per update than the wait for a slightly slower
 * peer costs in time. */
#define COORD_DYNAMIC_SNAP 0.15
int64_t coord_sched_dynamic_steps(int64_t h_max, int64_t h_min, double sec_per_step,
                                  double overhead_s, double task_s);
/* The fewest local steps dynamic steps give: h_max / 8, at least 1. A
 * peer slower than that still sends updates worth their samples, only
 * later than the others. */
int64_t coord_sched_dynamic_floor(int64_t h_max);
/* lease_wait (config.h): the seconds a peer's next lease may still wait
 * for the version that merges its last update, when that wait began at
 * since and it is now (monotonic seconds): lease_wait times task_s, the
 * quickest recent peer's whole task of h_max steps, from since. 0 when
 * that is over, lease_wait is 0, or task_s is unknown (<= 0). */
double coord_sched_wait_left(double since, double now, double lease_wait, double task_s);

/* The inner learning rate of a task based on version v of a run that ends
 * at max_versions: t->lr × (v + 1) / warmup during the first t->warmup
 * versions, then t->lr ("constant") or min_lr + (lr − min_lr)(1 + cos πp)/2
 * with p = (v − warmup) / (max_versions − warmup) ("cosine"). */
double coord_sched_lr(const struct coord_train_config *t, int64_t v, int64_t max_versions);

/* The byte range of task task_id inside a training part of train_len
 * bytes: length min(task_bytes, train_len) at an offset drawn uniformly
 * from the valid offsets, deterministic from (run_seed, task_id). Returns 0,
 * or -1 when train_len or task_bytes is not positive. */
int coord_sched_task_range(uint64_t run_seed, int64_t task_id, int64_t train_len,
                           int64_t task_bytes, int64_t *offset, int64_t *length);

/* The token range of task task_id in a run of n >= 1 training shards of
 * ntok[i] >= 1 tokens: shard i offers max(ntok[i] - len_i + 1, 1) starts
 * for a range of len_i = min(task_tokens, ntok[i]) tokens, and one start
 * is drawn uniformly from all of them (so a shard is picked in proportion
 * to its starts, and a range never crosses into the next shard),
 * deterministic from (run_seed, task_id). *offset is the range's first
 * token counted over the shards laid end to end, which is what the
 * database stores (coord_sched_token_locate splits it); *length is len_i.
 * Returns 0, or -1 for no shards, an empty shard or task_tokens <= 0. */
int coord_sched_token_range(uint64_t run_seed, int64_t task_id, const int64_t *ntok, int n,
                            int64_t task_tokens, int64_t *offset, int64_t *length);

/* The shard *shard and the offset *local inside it of a range of length
 * tokens starting at offset over the n shards laid end to end. Returns 0,
 * or -1 when the range does not lie inside one shard. */
int coord_sched_token_locate(const int64_t *ntok, int n, int64_t offset, int64_t length, int *shard,
                             int64_t *local);

/* The training seed of task task_id: deterministic from (run_seed,
 * task_id), in [0, 2^31) so every JSON reader takes it exactly. */
int64_t coord_sched_task_seed(uint64_t run_seed, int64_t task_id);

#endif
