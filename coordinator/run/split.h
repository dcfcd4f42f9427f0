/*
 * split: the coordinator's side of split learning. In a run of mode
 * "split" the peers keep the classifier's layers below split.cut and their
 * inputs; for every batch a peer sends the cut layer's activations Z and
 * the labels to POST /v1/split/forward, and the coordinator runs its own
 * layers forward and backward on them, takes one AdamW step on those
 * layers, and answers with dL/dZ and the loss. In a U-shaped run the peer
 * keeps the classifier layer and the loss as well: a forward request gets
 * the coordinator's output, and a backward request (the same Z with the
 * gradient of the peer's loss at that output) gets dL/dZ and the step.
 *
 * The coordinator's layers live here between versions; every version it
 * makes carries their current values in its slice of the parameter vector
 * (the peers' updates never touch that slice), so they are stored with the
 * version and a restarted coordinator continues from the last one. The
 * batches run on the compute thread, one at a time in arrival order,
 * which is the order their steps are applied in; a version is made on the
 * same thread, between two batches, so it never sees a half-applied step.
 * A peer may have split.in_flight batches queued or running at once (a
 * peer on a slow link sends the next before the last one's answer is
 * back); one more is refused with 429, so no peer can fill the queue.
 *
 * Contents: coord_split, coord_split_open, coord_split_close,
 * coord_split_into, coord_split_batch_take, coord_split_batch_give.
 */
#ifndef VOLLEY_COORD_SPLIT_H
#define VOLLEY_COORD_SPLIT_H

#include "common/common.h"
#include "model/model.h"
#include "coordinator/coord.h"

struct coord_server;
struct coord_req;
struct model_mlp_part;

typedef struct coord_split {
    struct model_mlp_part *upper; /* layers [cut, n_hidden + 1) */
    model_adamw opt;
    size_t offset, count;    /* their slice of the flat parameter vector */
    int q;                   /* width of the activations at the cut */
    int h;                   /* width of the layers' output */
    int u_shape;             /* the peers keep the head and the loss */
    int in_flight;           /* split.in_flight: a peer's outstanding batches */
    struct split_busy *busy; /* owned: outstanding batches by peer, or NULL */
    int64_t steps;           /* batches stepped on since start */
    double loss_sum;         /* and their losses since the last version */
    int64_t batches;
} coord_split;

/* Sets up srv->run.split from the current version's parameters (srv->run.net),
 * for split runs; nothing for the others. Loop thread, before serving.
 * Returns 0, VL_EINVAL, VL_ENOMEM. */
int coord_split_open(struct coord_server *srv, vl_error *err) VL_MUST_CHECK;
/* Frees srv->run.split (NULL is a no-op). */
void coord_split_close(struct coord_server *srv);
/* Copies the coordinator's layers as they are now into their slice of
 * theta (a version about to be made), and returns the mean loss of the
 * batches since the last call (NaN when none). Compute thread. */
double coord_split_into(coord_split *s, float *theta);

/* Counts one more batch of peer at the coordinator against s->in_flight:
 * 0, -1 when the peer has that many already, -2 when there is no room to
 * count it (thousands of peers with batches at once, or no memory).
 * coord_split_batch_give counts one off when its answer is sent. Loop
 * thread. */
int coord_split_batch_take(coord_split *s, int64_t peer) VL_MUST_CHECK;
void coord_split_batch_give(coord_split *s, int64_t peer);


#endif
