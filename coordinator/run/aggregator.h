/*
 * aggregator: making the next version from a version's updates (the
 * merge job and the writer job that commits it), opening a version's
 * second round (round.c's accumulation beside it), and K-FAC's merged
 * factors (factors.c). The outer optimiser's arithmetic they apply is
 * base/outer.h.
 */
#ifndef VOLLEY_COORD_AGGREGATOR_H
#define VOLLEY_COORD_AGGREGATOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "coordinator/base/outer.h"
#include "coordinator/config/config.h"
#include "coordinator/coord.h"

/* ---- merged K-FAC factors (factors.c) -------------------------------------- */

struct compress_update;
struct compress_factors_sum;
struct storage_version;
struct coord_server;
struct vl_buf;

/* Adds the factors of update u (stored as update_id, checked on arrival)
 * to s, weighted by the samples they carry. VL_EDB when they no longer
 * decode. */
int coord_factors_add(struct compress_factors_sum *s, const struct compress_update *u,
                      int64_t update_id, vl_error *err) VL_MUST_CHECK;
/* The weighted mean of what s holds as the factors file of `version`
 * (the run's factor dtype) into out (initialised here; the caller frees
 * it), and v's factors fields pointing at it. Nothing when s is empty (a
 * version made only of updates without factors cannot happen in runs that
 * require them, but is not an error). */
int coord_factors_merged(struct coord_server *srv, struct compress_factors_sum *s, int64_t version,
                         struct vl_buf *out, struct storage_version *v,
                         vl_error *err) VL_MUST_CHECK;

/* ---- the Sketched-SGD second round (round.c) ----------------------------- */

struct coord_server;
struct storage_round;
struct compress_update;

/* The round's exact values, summed over a version's updates as the merge
 * walks them: Σ wᵢ·vᵢ at each candidate and Σ wᵢ, over the updates whose
 * peers reported their values vᵢ. A peer that did not answer in time is
 * counted as silent and left out: its sketch could only give collision
 * estimates, and no value applied in a round run is an estimate. */
typedef struct coord_round_acc {
    const uint32_t *cand; /* the round's candidates (borrowed) */
    size_t n_cand;
    double *sum;   /* n_cand */
    double weight; /* Σ wᵢ of the updates that reported */
    int64_t *ids;  /* updates that reported values, ascending */
    float **vals;  /* their values, n_cand each (owned) */
    size_t n_ids;
    size_t reported, silent;
} coord_round_acc;

/* Loads the values reported in the round of r->version. */
int coord_round_acc_init(coord_round_acc *a, struct coord_server *srv,
                         const struct storage_round *r, vl_error *err) VL_MUST_CHECK;
/* Adds update u (id, decoded sketch, weight w) to the sums when its peer
 * reported, else counts it silent. */
int coord_round_acc_add(coord_round_acc *a, int64_t update_id, const struct compress_update *u,
                        float w, vl_error *err) VL_MUST_CHECK;
void coord_round_acc_free(coord_round_acc *a);

struct coord_config;
struct compress_sketch;

/* A sketch header over table (borrowed: rows x cols floats of the run's
 * shape), so that momentum and error sketches live in the version's state
 * vector like any state. */
void coord_sketch_view(struct compress_sketch *s, const struct coord_config *cfg, float *table);

/* A second-round run's state (coord_state_size): E, the sketch of what has
 * not been applied, then the dense momentum of the exact values applied
 * and each coordinate's versions since it was last applied; views into
 * state. */
void coord_round_views(const struct coord_config *cfg, size_t n, float *state,
                       struct compress_sketch *E, float **mom, float **age);

/* E <- COORD_ROUND_DECAY * E + S, the round's first change to the state,
 * made the same way when the round opens (to name its candidates) and when
 * the version is made. The decay forgets what exact values never settled,
 * which would otherwise pile up in E as noise. VL_EINVAL for sketches of
 * different shape. */
int coord_round_accumulate(struct compress_sketch *E, const struct compress_sketch *S,
                           vl_error *err) VL_MUST_CHECK;

/* ---- making versions (aggregator.c) --------------------------------------- */

/* Called on the loop when a job of coord_merge_start or coord_round_open
 * is over: rc VL_OK once it committed (err NULL), else its failure, err
 * valid during the call only. What runs next is the caller's to decide
 * (schedule.c). */
typedef void (*coord_merge_after_fn)(struct coord_server *srv, int rc, const vl_error *err);

/* Starts making the next version of the updates stored now: computed on
 * the compute thread, then committed by the writer, after which the
 * server moves to it and after runs; srv->sched.merging is set until then. r,
 * the current version's second round (NULL: none), is taken over, with
 * the values reported in it so far, whether or not this succeeds.
 * Returns VL_OK once the job is handed over, or a VL_E* code. */
int coord_merge_start(struct coord_server *srv, struct storage_round *r, coord_merge_after_fn after,
                      vl_error *err) VL_MUST_CHECK;

/* Opens the second round of the current version: its candidates are
 * computed and stored, after which after runs; srv->sched.opening_round is set
 * until then. VL_ENOMEM when the job cannot be made. */
int coord_round_open(struct coord_server *srv, coord_merge_after_fn after,
                     vl_error *err) VL_MUST_CHECK;

#endif
