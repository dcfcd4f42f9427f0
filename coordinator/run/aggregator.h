/*
 * aggregator: making the next version from a version's updates (the
 * merge job on the compute thread and the writer job that commits it).
 * The outer optimiser's arithmetic it applies is base/outer.h; a second
 * round's accumulation is round.h, K-FAC's merged factors factors.h.
 *
 * Contents: coord_merge_after_fn, coord_merge_start.
 */
#ifndef VOLLEY_COORD_AGGREGATOR_H
#define VOLLEY_COORD_AGGREGATOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "coordinator/coord.h"

struct coord_server;
struct storage_round;

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

#endif
