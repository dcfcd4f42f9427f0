/* What the trainers of peer/train.c (text and token tasks), peer/local.c
 * (a classifier on local data) and peer/split.c (split learning) share of
 * a training step; not for use outside the peer's training. */
#ifndef VOLLEY_PEER_TRAIN_INTERNAL_H
#define VOLLEY_PEER_TRAIN_INTERNAL_H

#include "peer/peer.h"

/* Global L2 clipping of g[n] to max_norm (0: none); returns the squared
 * norm before clipping, which is also SelSync's g_t. */
double peer_clip_grads(float *g, size_t n, double max_norm);

/* A diverged step: resets every optimizer (their moments would poison the
 * next task too) and returns VL_ERANGE naming what and the step. */
int peer_trainer_diverged(peer_trainer *t, vl_error *err, const char *what, double x, int step);

/* Sleeps after a step that began at step_t0 as --step-delay and
 * --slowdown ask; PEER_ESTOPPED when a stop was requested meanwhile. */
int peer_trainer_pace(peer_trainer *t, double step_t0, vl_error *err) VL_MUST_CHECK;

/* Frees the trainer's model and everything shaped after it (base, delta,
 * optimizer state, residual, the GPU copies), leaving no model. */
void peer_trainer_drop_model(peer_trainer *t);

#endif
