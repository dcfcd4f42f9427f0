/* Background scoring of served versions (score.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"
#include "coordinator/run/score.h"
#include "coordinator/run/model.h"
#include "coordinator/run/model_types.h"
#include "coordinator/run/run.h"
#include "coordinator/run/writer.h"

/* A scratch model n (srv->run.eval or srv->run.scorer), made on first use,
 * holding theta. */
static int load(coord_server *srv, coord_model *n, const float *theta, vl_error *err) {
    if (!coord_model_params(n)) {
        int rc = coord_model_create(&srv->run.cfg, n, err);
        if (rc != VL_OK) return rc;
    }
    memcpy(coord_model_params(n), theta, srv->run.n_params * sizeof(float));
    return VL_OK;
}

int coord_score_full(coord_server *srv, const float *theta, float *loss, double *accuracy,
                     vl_error *err) {
    int rc = load(srv, &srv->run.eval, theta, err);
    if (rc != VL_OK) return rc;
    return coord_model_score(&srv->run.cfg, &srv->run.corpus, &srv->run.shards, &srv->run.test,
                             &srv->run.eval, loss, accuracy, err);
}

int coord_score_check(coord_server *srv, const float *theta, float *loss, vl_error *err) {
    int rc = load(srv, &srv->run.eval, theta, err);
    if (rc != VL_OK) return rc;
    return coord_model_check(&srv->run.cfg, &srv->run.corpus, &srv->run.shards, &srv->run.eval,
                             loss, err);
}

typedef struct coord_score_job {
    coord_job job;
    coord_server *srv;
    int64_t version;
    float *params; /* the version's, copied when it was queued */
    float loss;
    double seconds; /* the scoring's, on the background thread */
} score_job;

static void score_job_free(score_job *j) {
    free(j->params);
    free(j);
}

/* After the store: the run's figures take the score in, and it is
 * logged. */
static void stored(coord_job *job, int rc, const vl_error *err) {
    score_job *j = (score_job *)job;
    coord_server *srv = j->srv;
    if (rc != VL_OK) {
        vl_log_msg(rc == VL_EFULL ? LOG_DEBUG : LOG_WARN,
                   "version %lld: storing its validation loss failed: %s", (long long)j->version,
                   err ? err->msg : "");
        score_job_free(j);
        return;
    }
    /* A newer version may have its loss already: the one that finished
     * the run, scored before it was served. */
    if (j->version >= srv->run.val_loss_version) {
        srv->run.val_loss = j->loss;
        srv->run.val_loss_version = j->version;
    }
    if (!isfinite(srv->run.best_val_loss) || j->loss < srv->run.best_val_loss)
        srv->run.best_val_loss = j->loss;
    vl_log_info("version %lld val_loss %.6f (%.4f bits per %s; scored on %lld held-out %s in "
                "the background, %.2f s)",
                (long long)j->version, (double)j->loss, (double)j->loss / M_LN2,
                srv->run.cfg.shards ? "token" : "byte",
                (long long)coord_val_scored_tokens(&srv->run.cfg, &srv->run.corpus,
                                                   &srv->run.shards, srv->run.cfg.val_batches),
                srv->run.cfg.shards ? "tokens" : "bytes", j->seconds);
    score_job_free(j);
}

static int store(storage *db, coord_job *job, vl_error *err) {
    score_job *j = (score_job *)job;
    int changed = 0;
    return storage_version_set_val_loss(db, j->version, j->loss, &changed, err);
}

/* On the background thread: its own model, created on first use. */
static int score(storage *db, coord_job *job, vl_error *err) {
    (void)db;
    score_job *j = (score_job *)job;
    coord_server *srv = j->srv;
    double t0 = vl_clock_mono_s();
    int rc = load(srv, &srv->run.scorer, j->params, err);
    if (rc != VL_OK) return rc;
    rc = coord_model_score(&srv->run.cfg, &srv->run.corpus, &srv->run.shards, &srv->run.test,
                           &srv->run.scorer, &j->loss, NULL, err);
    if (rc == VL_OK && !isfinite(j->loss))
        rc = vl_fail(err, VL_ERANGE, "its validation loss is not finite");
    j->seconds = vl_clock_mono_s() - t0;
    return rc;
}

/* Back on the loop: the score goes to the writer, and the version that
 * waits, if any, to the background thread. */
static void scored(coord_job *job, int rc, const vl_error *err) {
    score_job *j = (score_job *)job;
    coord_server *srv = j->srv;
    srv->run.score_busy = 0;
    if (srv->run.score_waiting) {
        score_job *next = srv->run.score_waiting;
        srv->run.score_waiting = NULL;
        srv->run.score_busy = 1;
        coord_writer_background(srv->run.writer, &next->job);
    }
    if (rc != VL_OK) {
        vl_log_warn("version %lld: scoring it in the background failed: %s", (long long)j->version,
                    err ? err->msg : "");
        score_job_free(j);
        return;
    }
    free(j->params);
    j->params = NULL;
    j->job.run = store;
    j->job.done = stored;
    coord_writer_submit(srv->run.writer, &j->job);
}

void coord_score_queue(coord_server *srv, int64_t version, const float *params) {
    score_job *j = srv->run.score_waiting;
    if (j) {
        /* Overtaken before its turn: the newer version is the one worth
         * knowing, and scoring every one would take the CPU the peers and
         * merges need whenever versions come faster than scores. */
        vl_log_debug("version %lld is left without its full validation loss: version %lld "
                     "came before it was scored",
                     (long long)j->version, (long long)version);
    } else {
        j = calloc(1, sizeof *j);
        if (j) j->params = malloc(srv->run.n_params * sizeof(float) + 1);
        if (!j || !j->params) {
            free(j);
            vl_log_warn("version %lld is left without its full validation loss: out of memory",
                        (long long)version);
            return;
        }
        j->srv = srv;
        j->job.run = score;
        j->job.done = scored;
    }
    memcpy(j->params, params, srv->run.n_params * sizeof(float));
    j->version = version;
    j->loss = NAN;
    if (srv->run.score_busy) {
        srv->run.score_waiting = j;
        return;
    }
    srv->run.score_waiting = NULL;
    srv->run.score_busy = 1;
    coord_writer_background(srv->run.writer, &j->job);
}
int coord_score_start(coord_server *srv, vl_error *err) {
    srv->run.best_check_loss = NAN;
    srv->run.val_loss_version = srv->run.version;
    if (srv->run.cfg.val_check_batches <= 0) return VL_OK;
    const float *theta = coord_model_params(&srv->run.net);
    float check = NAN;
    int rc = coord_score_check(srv, theta, &check, err);
    if (rc != VL_OK) return rc;
    srv->run.best_check_loss = check;
    if (!isfinite(srv->run.val_loss)) coord_score_queue(srv, srv->run.version, theta);
    return VL_OK;
}
