/* Scheduling rules of sync and async runs. */
#include "coordinator/base/sched_rules.h"

#include <math.h>
#include <string.h>

#include "coordinator/config/config.h"

#include "common/common.h"

coord_sched_action coord_sched_decide(int finished, int has_lease, int64_t slots_taken,
                                      int64_t updates_per_version) {
    if (finished) return COORD_SCHED_FINISHED;
    if (has_lease) return COORD_SCHED_SAME_TASK;
    if (slots_taken < updates_per_version) return COORD_SCHED_NEW_TASK;
    return COORD_SCHED_WAIT;
}

coord_sched_action coord_sched_decide_async(int finished, int has_lease) {
    if (finished) return COORD_SCHED_FINISHED;
    return has_lease ? COORD_SCHED_SAME_TASK : COORD_SCHED_NEW_TASK;
}

int coord_sched_merge_due(int async, int64_t unmerged, int64_t done_current,
                          int64_t updates_per_version, double age_s, int64_t deadline_s) {
    if (async) return unmerged >= updates_per_version;
    if (done_current >= updates_per_version) return 1;
    return deadline_s > 0 && age_s >= (double)deadline_s && unmerged > 0;
}

int64_t coord_sched_dynamic_steps(int64_t h_max, int64_t h_min, double sec_per_step,
                                  double overhead_s, double task_s) {
    if (h_min < 1) h_min = 1;
    if (h_min > h_max) h_min = h_max;
    if (!(sec_per_step > 0) || !(task_s > 0)) return h_max;
    if (!(overhead_s > 0)) overhead_s = 0;
    double raw = (task_s - overhead_s) / sec_per_step;
    if (raw >= (double)h_max * (1.0 - COORD_DYNAMIC_SNAP)) return h_max;
    double h = floor(raw + 0.5);
    if (h <= (double)h_min) return h_min;
    return (int64_t)h;
}

int64_t coord_sched_dynamic_floor(int64_t h_max) {
    return h_max / 8 > 1 ? h_max / 8 : 1;
}

double coord_sched_wait_left(double since, double now, double lease_wait, double task_s) {
    if (!(lease_wait > 0) || !(task_s > 0)) return 0;
    double left = since + lease_wait * task_s - now;
    return left > 0 ? left : 0;
}

/* Separate streams for ranges and seeds, so neither is a function of the
 * other. */
#define RANGE_STREAM 0x52414E4745ULL /* "RANGE" */
#define SEED_STREAM 0x53454544ULL    /* "SEED" */

static uint64_t mix(uint64_t run_seed, int64_t task_id, uint64_t stream) {
    return vl_splitmix64(vl_splitmix64(run_seed ^ stream) ^ (uint64_t)task_id);
}

/* A draw in [0, choices) for the task, exactly uniform: rejection
 * sampling removes the bias of a plain modulo. */
static uint64_t range_draw(uint64_t run_seed, int64_t task_id, uint64_t choices) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % choices;
    uint64_t x = mix(run_seed, task_id, RANGE_STREAM);
    while (x >= limit) x = vl_splitmix64(x);
    return x % choices;
}

int coord_sched_task_range(uint64_t run_seed, int64_t task_id, int64_t train_len,
                           int64_t task_bytes, int64_t *offset, int64_t *length) {
    if (train_len <= 0 || task_bytes <= 0) return -1;
    int64_t len = task_bytes < train_len ? task_bytes : train_len;
    *offset = (int64_t)range_draw(run_seed, task_id, (uint64_t)(train_len - len) + 1);
    *length = len;
    return 0;
}

int coord_sched_token_range(uint64_t run_seed, int64_t task_id, const int64_t *ntok, int n,
                            int64_t task_tokens, int64_t *offset, int64_t *length) {
    if (n < 1 || task_tokens <= 0) return -1;
    uint64_t starts = 0;
    for (int i = 0; i < n; i++) {
        if (ntok[i] <= 0) return -1;
        int64_t len = task_tokens < ntok[i] ? task_tokens : ntok[i];
        starts += (uint64_t)(ntok[i] - len) + 1;
    }
    uint64_t x = range_draw(run_seed, task_id, starts);
    int64_t first = 0; /* of shard i in the concatenation */
    for (int i = 0;; first += ntok[i], i++) {
        int64_t len = task_tokens < ntok[i] ? task_tokens : ntok[i];
        uint64_t here = (uint64_t)(ntok[i] - len) + 1;
        if (x < here) {
            *offset = first + (int64_t)x;
            *length = len;
            return 0;
        }
        x -= here;
    }
}

int coord_sched_token_locate(const int64_t *ntok, int n, int64_t offset, int64_t length, int *shard,
                             int64_t *local) {
    if (offset < 0 || length < 1) return -1;
    for (int i = 0; i < n; i++) {
        if (offset < ntok[i]) {
            if (length > ntok[i] - offset) return -1;
            *shard = i;
            *local = offset;
            return 0;
        }
        offset -= ntok[i];
    }
    return -1;
}

int64_t coord_sched_task_seed(uint64_t run_seed, int64_t task_id) {
    return (int64_t)(mix(run_seed, task_id, SEED_STREAM) >> 33);
}

double coord_sched_lr(const coord_train_config *t, int64_t v, int64_t max_versions) {
    if (v < 0) v = 0;
    if (t->warmup > 0 && v < t->warmup) return t->lr * (double)(v + 1) / (double)t->warmup;
    if (strcmp(t->schedule, "cosine") != 0) return t->lr;
    double span = (double)(max_versions - t->warmup);
    double p = span > 0 ? (double)(v - t->warmup) / span : 1.0;
    if (p > 1) p = 1;
    return t->min_lr + (t->lr - t->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}

int coord_sched_version_refused(double val_loss, double best, double max_rise) {
    if (!isfinite(val_loss)) return 1;
    return max_rise > 0 && isfinite(best) && val_loss > best + max_rise * fabs(best);
}
