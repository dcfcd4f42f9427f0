/*
 * model (coord_model): the run's model as the coordinator holds it, whichever kind the run
 * trains: the GPT of a text or token run, or the MLP classifier of a run
 * whose peers keep their own labelled images. Versions, deltas, updates
 * and the outer step only see the flat parameter vector; what depends on
 * the kind is here: creating the model, writing its file, and scoring a
 * version on held-out data (for a classifier, the coordinator's own test
 * images, with accuracy beside the loss).
 *
 * Contents: coord_model_create, coord_model_free, coord_model_init_weights,
 * coord_model_num_params, coord_model_params, coord_model_write_tensors,
 * coord_testset_open, coord_testset_close, coord_model_score,
 * coord_model_check, coord_model_log_version.
 */
#ifndef VOLLEY_COORD_RUN_MODEL_H
#define VOLLEY_COORD_RUN_MODEL_H

#include "common/common.h"
#include "coordinator/config/config.h"
#include "model/images.h"
#include "model/model.h"
#include "coordinator/run/model_types.h"
#include "coordinator/coord.h"


/* Creates the run's model with zeroed parameters into *n (which the
 * caller frees with coord_model_free, also after a failure). Returns 0,
 * VL_EINVAL, VL_ENOMEM. */
int coord_model_create(const coord_config *cfg, coord_model *n, vl_error *err) VL_MUST_CHECK;
/* Frees the model; *n becomes empty. Safe on an empty one. */
void coord_model_free(coord_model *n);
/* Deterministic weights from seed (the run's first version). */
void coord_model_init_weights(coord_model *n, uint64_t seed);
/* The length of the flat parameter vector; 0 when empty. */
size_t coord_model_num_params(const coord_model *n);
/* The flat parameter vector, owned by the model; NULL when empty. */
float *coord_model_params(coord_model *n);
/* Appends the model's tensors to w (which reads the parameters when
 * finished). Returns 0 or st_writer's error. */
int coord_model_write_tensors(const coord_model *n, st_writer *w) VL_MUST_CHECK;


/* Loads cfg's test_images/test_labels (an empty set when the run has
 * none) and checks they fit the model: the image size is model.in_dim and
 * every label below model.classes. With expect_hash set, a size or hash
 * that differs is VL_ECONFLICT ("changed since init"). t is owned by the
 * caller (coord_testset_close), and empty after a failure. */
int coord_testset_open(coord_testset *t, const coord_config *cfg, int64_t expect_size,
                       const char *expect_hash, vl_error *err) VL_MUST_CHECK;
void coord_testset_close(coord_testset *t);

/* Scores the model on the run's held-out data into *loss (mean nats) and,
 * for a classifier with a test set, its top-1 accuracy into *accuracy
 * (NaN otherwise; may be NULL). A classifier without a test set has no
 * loss of its own: *loss is NaN and the caller uses what the peers
 * report. Returns 0 or the scoring's error. */
struct coord_corpus;
struct coord_shards;
int coord_model_score(const coord_config *cfg, const struct coord_corpus *corpus,
                      const struct coord_shards *shards, const coord_testset *test, coord_model *n,
                      float *loss, double *accuracy, vl_error *err) VL_MUST_CHECK;

/* The loss check a GPT run with val_check_batches > 0 makes before it
 * serves a version: the loss on the first val_check_batches batches of
 * the held-out data, into *loss. VL_EINVAL for any other run. */
int coord_model_check(const coord_config *cfg, const struct coord_corpus *corpus,
                      const struct coord_shards *shards, coord_model *n, float *loss,
                      vl_error *err) VL_MUST_CHECK;

/* Logs a classifier run's new version v: its loss, test accuracy, the
 * updates it merged, and, in a split run, the mean loss of the batches its
 * coordinator layers stepped on since the last one. Loop thread. */
struct coord_server;
struct storage_version;
void coord_model_log_version(const struct coord_server *srv, const struct storage_version *v,
                             size_t updates, size_t stale, double bytes_per_update, double merge_s,
                             double split_loss);

#endif
