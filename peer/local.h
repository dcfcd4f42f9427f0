/*
 * local: training on data that never leaves the peer. In a classifier run
 * (data "local" in its tasks) the peer reads its own labelled images
 * (--data, IDX files, plain or gzip), optionally keeps only its share of
 * them (--partition i/N, IID or label-skewed by a Dirichlet(beta) draw, so
 * one public data set can stand in for a federation), and trains the run's
 * MLP classifier on batches drawn with the task's seed. Only the update
 * travels; the coordinator never receives an image or a label.
 */
#ifndef VOLLEY_PEER_LOCAL_H
#define VOLLEY_PEER_LOCAL_H

#include "model/images.h"
#include "peer/peer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A peer's own data: labelled images and the share of them it trains on
 * (a classifier run), or a text file or token shard (a GPT run). */
typedef struct peer_local {
    model_images *images; /* owned; NULL for text or tokens */
    uint8_t *bytes;       /* owned: a text file's bytes (the tokens of a byte model) */
    size_t len;
    model_shard *shard; /* owned: a token shard, opened for shard_vocab */
    int shard_vocab;
    char path[4096]; /* the --data path, to reopen the shard for a model's vocab */
    uint32_t *idx;   /* owned: the indices of the share, ascending */
    size_t n;        /* images in the share, >= 1 */
    float *x;        /* owned batch buffers, grown to the largest batch */
    int *y;
    int cap;
} peer_local;

/* What --data and --partition ask for: the data path (IDX images, a
 * token shard, recognised by its header, or else text), labels path (labels
 * NULL: derived from the images' name, "-images-idx3-" becoming
 * "-labels-idx1-", as the MNIST family names its files), and part `part`
 * of `parts` (parts 1: all of it) with label skew beta (<= 0: IID), cut
 * with seed. */
typedef struct peer_local_opts {
    const char *images, *labels;
    int part, parts;
    double beta;
    uint64_t seed;
} peer_local_opts;

/* The seed --partition uses unless --partition-seed says otherwise: peers
 * of one federation must agree on it. */
#define PEER_PARTITION_SEED 20240520

/* Parses "i/N" (0 <= i < N <= MODEL_PARTITION_MAX_PARTS). Returns 0 or
 * VL_EINVAL with the reason. */
int peer_local_parse_part(const char *s, int *part, int *parts, vl_error *err) VL_MUST_CHECK;

/* Loads the images and cuts the share into *l (caller frees with
 * peer_local_free, also after a failure), and logs what it holds. An empty share is VL_EINVAL:
 * the peer would have nothing to train on. Returns 0, VL_EINVAL, VL_EIO,
 * VL_ENOTFOUND (a file that is not there), VL_ENOMEM. */
int peer_local_open(peer_local *l, const peer_local_opts *o, vl_error *err) VL_MUST_CHECK;
void peer_local_free(peer_local *l);

/* Whether task k fits the trainer's model and the local data. For a
 * classifier: images whose size is the model's input, every label below
 * its class count, and a sparse k at most the parameter count. For a GPT:
 * text or tokens (the shard reopened for the model's vocabulary, so every
 * token is checked) and the task's own checks (peer_task_check_model).
 * VL_EINVAL otherwise. */
int peer_local_check(const peer_trainer *t, const peer_task *k, peer_local *l,
                     vl_error *err) VL_MUST_CHECK;

/* When task k asks for it (report_accuracy, a classifier run whose
 * coordinator has no test set), scores the base version on a fixed sample
 * of the share (its first 512 images) into res->accuracy and sets
 * res->has_accuracy; nothing otherwise. Leaves the model's parameters at
 * the base. Returns 0, VL_EINVAL, VL_ENOMEM. */
int peer_local_accuracy(peer_trainer *t, const peer_task *k, peer_local *l, peer_train_result *res,
                        vl_error *err) VL_MUST_CHECK;

/* Trains a local task from the base parameters: up to k->steps steps of
 * the task's optimizer on batches of k->batch images drawn uniformly from
 * the share with the task's seed, gradients clipped to grad_clip, SelSync
 * early stop; leaves delta = base - local in t->delta. res->tokens counts
 * images. PEER_ESTOPPED when a stop was requested between steps;
 * VL_ERANGE when the loss, the gradient or the delta stops being finite
 * (the optimizer is reset). */
int peer_trainer_run_local(peer_trainer *t, const peer_task *k, peer_local *l,
                           peer_train_result *res, vl_error *err) VL_MUST_CHECK;

/* Grows l's batch buffers to B images of d pixels. Returns 0 or
 * VL_ENOMEM. */
int peer_local_reserve(peer_local *l, int B, int d, vl_error *err) VL_MUST_CHECK;

/* Draws B images uniformly (with replacement) from the share with r into
 * l->x and l->y (reserved first). Returns 0 or VL_EINVAL. */
int peer_local_batch(peer_local *l, int B, vl_rng *r, vl_error *err) VL_MUST_CHECK;

/* A split-learning task (k->split_cut > 0): like peer_trainer_run_local,
 * but only the layers below the cut are here (and, U-shaped, the
 * classifier layer and the loss). For every batch their output Z and the
 * labels go to POST /v1/split/forward (through http, with rs as the
 * response buffer, signed as peer_id); U-shaped, Z alone goes, the head
 * and loss run on the coordinator's output, and Z with the gradient there
 * goes to POST /v1/split/backward. The answer's dL/dZ gets NoPeek's
 * k->split_alpha * d dCor(X, Z)/dZ added, and the peer's layers step on
 * the backward pass. Leaves the delta of the whole model (zero in the
 * coordinator's layers) in t->delta. A refusal of a batch (the lease
 * expired, the run over) is VL_ERANGE: the task is dropped. */
int peer_trainer_run_split(peer_trainer *t, const peer_task *k, peer_local *l, peer_http *http,
                           peer_response *rs, int64_t peer_id, peer_train_result *res,
                           vl_error *err) VL_MUST_CHECK;

#ifdef __cplusplus
}
#endif

/* ---- a task in the mode it calls for (train_task.c) ---------------------- */

/* What a task may train on and talk to; the mode reads the fields it
 * needs. */
typedef struct peer_task_data {
    peer_local *local;    /* the peer's own data (--data): local and split tasks */
    model_shard *tokens;  /* a token task's downloaded range (borrowed) */
    const uint8_t *bytes; /* a text task's downloaded range (borrowed) */
    size_t len;
    peer_http *http; /* split tasks send their activations on it */
    peer_response *rs;
    int64_t peer_id;
} peer_task_data;

/* Runs task k on t in the mode the task and the model call for: split
 * learning (a split cut), a GPT on the peer's own text or shard, the
 * classifier on the peer's own images, a GPT on a downloaded token range
 * or text range. Returns what that mode returns (VL_ERANGE: diverged). */
int peer_trainer_run_task(peer_trainer *t, const peer_task *k, const peer_task_data *d,
                          peer_train_result *res, vl_error *err) VL_MUST_CHECK;

#endif
