/*
 * round: the Sketched-SGD second round of a sketch run. Its exact values
 * summed as the merge walks a version's updates, the sketch views into
 * the state vector and the accumulation of E (round.c), and the opening
 * of a version's round, which computes and stores its candidates
 * (round_open.c).
 *
 * Contents: coord_round_acc (init, add, free), coord_sketch_view,
 * coord_round_views, coord_round_accumulate, coord_round_open.
 */
#ifndef VOLLEY_COORD_ROUND_H
#define VOLLEY_COORD_ROUND_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "coordinator/run/aggregator.h"

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

/* Opens the second round of the current version: its candidates are
 * computed and stored, after which after runs; srv->sched.opening_round is set
 * until then. VL_ENOMEM when the job cannot be made. */
int coord_round_open(struct coord_server *srv, coord_merge_after_fn after,
                     vl_error *err) VL_MUST_CHECK;

#endif
