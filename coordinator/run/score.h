/*
 * Scoring served versions in the background. A GPT run with
 * val_check_batches > 0 (an async run by default) serves a version once
 * it has passed the loss check on the first batches of the held-out data
 * (aggregator.c), so that the peers waiting for it go on at once. Its
 * validation loss on all val_batches is computed afterwards on the
 * writer's background thread, with a model of its own, then stored in
 * versions.val_loss (NULL until then) and logged. The version that
 * finishes the run is scored in full before it is served, so a finished
 * run's last loss is there when it says it is finished. Versions that
 * come faster than they can be scored are skipped (coord_score_queue);
 * what is queued when the coordinator stops is scored before it exits
 * (coord_writer_stop runs it).
 *
 * Contents: coord_score_full, coord_score_check, coord_score_queue,
 * coord_score_start.
 */
#ifndef VOLLEY_COORD_SCORE_H
#define VOLLEY_COORD_SCORE_H

#include <stdint.h>

#include "common/common.h"
#include "coordinator/coord.h"

struct coord_server;

/* The validation loss of the parameters theta (n_params floats) into
 * *loss and, for a classifier with a test set, its accuracy into
 * *accuracy (may be NULL), on the scratch model srv->run.eval, so the served
 * one keeps the current version's until the next is committed. A failure
 * to score (not a loss that is not a number) is returned. Compute thread,
 * or the loop while no merge runs. */
int coord_score_full(struct coord_server *srv, const float *theta, float *loss, double *accuracy,
                     vl_error *err) VL_MUST_CHECK;

/* The loss check of theta on srv->run.eval (coord_model_check): the first
 * val_check_batches batches. Same threads as coord_score_full. */
int coord_score_check(struct coord_server *srv, const float *theta, float *loss,
                      vl_error *err) VL_MUST_CHECK;

/* Queues version, whose parameters params are (copied: n_params floats),
 * for its full score. One version is scored at a time and one more may
 * wait: a newer version takes the waiting one's place, which is then
 * left unscored (its val_loss stays NULL), so the scores take the CPU
 * that is left rather than a share that grows with the rate of versions.
 * Logs and leaves it unscored when memory runs out. Loop thread. */
void coord_score_queue(struct coord_server *srv, int64_t version, const float *params);

/* At start-up of a run with val_check_batches > 0: checks the current
 * version, whose check loss becomes the best so far (a restart forgets
 * the earlier ones), and queues its full score when it has none (the
 * coordinator stopped before it was scored). Loop thread, once the writer
 * has started. Returns 0 or the scoring's error. */
int coord_score_start(struct coord_server *srv, vl_error *err) VL_MUST_CHECK;

#endif
