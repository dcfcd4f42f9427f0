/* Opening a sketch run's second round (Sketched-SGD): the candidates of
 * the current version, the heavy hitters of the error sketch after this
 * version's updates are accumulated, computed on the compute thread and
 * stored by the writer. The round's values are summed in round.c; when a
 * round opens and closes is sched/schedule.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "compress/compress.h"
#include "coordinator/run/aggregator.h"
#include "coordinator/run/factors.h"
#include "coordinator/run/round.h"
#include "coordinator/coord.h"
#include "coordinator/run/split.h"
#include "coordinator/base/robust.h"
#include "coordinator/run/score.h"
#include "coordinator/base/sched_rules.h"
#include "kernels/kernels.h"
#include "coordinator/base/counters.h"
#include "coordinator/base/outer.h"
#include "coordinator/config/config.h"
#include "coordinator/run/model.h"
#include "coordinator/run/run.h"
#include "coordinator/run/writer.h"
#include "coordinator/run/merge_internal.h"

/* A round's candidates on their way to the database; after runs once
 * they are there or could not be stored. */
typedef struct round_job {
    coord_job job;
    coord_server *srv;
    storage_round r; /* candidates owned */
    size_t n_updates;
    coord_merge_after_fn after;
} round_job;

static int round_run(storage *db, coord_job *job, vl_error *err) {
    return storage_round_insert(db, &((round_job *)job)->r, err);
}

static void round_done(coord_job *job, int rc, const vl_error *err) {
    round_job *j = (round_job *)job;
    coord_server *srv = j->srv;
    srv->sched.opening_round = 0;
    if (rc != VL_OK) /* a full disk is reported once, by coord_disk_note */
        vl_log_msg(rc == VL_EFULL ? LOG_DEBUG : LOG_ERROR,
                   "cannot open the second round of version %lld: %s", (long long)j->r.version,
                   err->msg);
    else
        vl_log_info("version %lld: second round open, %zu candidates, asking the peers of its %zu "
                    "updates for %lld s",
                    (long long)j->r.version, j->r.n, j->n_updates, (long long)srv->run.cfg.round_s);
    /* err lives in the job. */
    j->after(srv, rc, err);
    free(j->r.candidates);
    free(j);
}

/* The candidates of the current version's second round: the heavy
 * hitters of E after this round's accumulation, computed on copies
 * (nothing of the state changes until the version is made). On the
 * compute thread, with its read connection db: decoding every pending
 * sketch and a pass over all coordinates is no work for the loop. The
 * served state it reads does not change meanwhile, since no version is
 * made while a round is being opened (srv->sched.opening_round). */
static int round_compute(storage *db, coord_job *job, vl_error *err) {
    round_job *j = (round_job *)job;
    coord_server *srv = j->srv;
    const coord_config *cfg = &srv->run.cfg;
    size_t n = srv->run.n_params, cells = (size_t)cfg->comp_rows * (size_t)cfg->comp_cols;
    size_t n_cand = (size_t)coord_config_round_candidates(cfg);
    if (srv->run.compute_threads > 0) kernels_set_num_threads(srv->run.compute_threads);
    merge_ctx m = {.cfg = cfg, .n_params = n, .err = err, .robust = cfg->robust};
    m.robust.max_norm = coord_norm_bound(srv);
    merge_bufs b;
    memset(&b, 0, sizeof b);
    b.state = malloc(srv->run.n_state * sizeof(float) + 1);
    b.scratch = malloc(n * sizeof(float) + 1);
    b.cand = malloc(n_cand * sizeof *b.cand + 1);
    b.val = malloc(n_cand * sizeof *b.val + 1);
    int rc = compress_sketch_init(&b.sk, (uint32_t)cfg->comp_rows, (uint32_t)cfg->comp_cols,
                                  (uint64_t)cfg->comp_seed, err);
    if (rc == VL_OK && (!b.state || !b.scratch || !b.cand || !b.val))
        rc = vl_fail(err, VL_ENOMEM, "out of memory opening a second round");
    m.sk = &b.sk;
    if (rc == VL_OK) rc = storage_update_each_pending(db, j->r.version, coord_merge_one, &m, err);
    if (rc == VL_OK && m.samples <= 0)
        rc = vl_fail(err, VL_EDB, "version %lld has no stored updates to open a round on",
                     (long long)j->r.version);
    size_t got = 0;
    compress_sketch E;
    float *mom, *age;
    if (rc == VL_OK) {
        coord_scale(b.sk.table, cells, 1.0 / m.samples);
        memcpy(b.state, srv->run.momentum, srv->run.n_state * sizeof(float));
        coord_round_views(cfg, n, b.state, &E, &mom, &age);
        rc = coord_round_accumulate(&E, &b.sk, err);
    }
    if (rc == VL_OK)
        rc = compress_round_candidates(&E, age, n, n_cand, b.scratch, b.cand, &got, err);
    if (rc == VL_OK && got == 0) rc = vl_fail(err, VL_EINVAL, "a second round needs candidates");
    if (rc == VL_OK) {
        int64_t now = vl_clock_unix_s();
        j->n_updates = m.n_ids;
        j->r.n = got;
        j->r.candidates = b.cand;
        j->r.opened_at = now;
        j->r.deadline = now + cfg->round_s;
        b.cand = NULL; /* the job's now */
    }
    free(m.ids);
    free(m.peers);
    free(m.norms);
    free(m.units);
    coord_merge_bufs_free(&b);
    return rc;
}

/* Back on the loop: the candidates go to the writer. */
static void round_computed(coord_job *job, int rc, const vl_error *err) {
    round_job *j = (round_job *)job;
    if (rc != VL_OK) {
        round_done(job, rc, err);
        return;
    }
    j->job.run = round_run;
    j->job.done = round_done;
    coord_writer_submit(j->srv->run.writer, &j->job);
}

/* Its candidates are computed on the compute thread (round_compute),
 * then stored. */
int coord_round_open(coord_server *srv, coord_merge_after_fn after, vl_error *err) {
    round_job *j = calloc(1, sizeof *j);
    if (!j) return vl_fail(err, VL_ENOMEM, "out of memory opening a second round");
    j->job.run = round_compute;
    j->job.done = round_computed;
    j->srv = srv;
    j->r.version = srv->run.version;
    j->after = after;
    srv->sched.opening_round = 1;
    coord_writer_compute(srv->run.writer, &j->job);
    return VL_OK;
}
