/*
 * model/gpt_cuda_dp.h: one GPT trained data-parallel over several GPUs of
 * one machine, so that a peer with several GPUs still acts as one peer:
 * the coordinator sees one gradient, one loss and one set of parameters,
 * whatever the number of devices behind them.
 *
 * Each device holds a full replica (a model_gpt_cuda of model/gpt_cuda.h);
 * replica r lives on device r, counted as the CUDA runtime numbers the
 * visible devices (CUDA_VISIBLE_DEVICES picks and orders them). A batch is
 * split by rows across the replicas, each computes the gradient of its
 * rows, and an NCCL all-reduce leaves every replica with the gradient of
 * the whole batch's mean loss. Clipping and AdamW then run on every
 * replica with identical inputs, so the replicas stay identical without
 * ever exchanging parameters.
 *
 * Builds with VOLLEY_HAVE_NCCL (defined by the volley_model_cuda library
 * when CMake found NCCL) support any number of devices; builds without it
 * support exactly one, and with one device nothing here involves NCCL:
 * every function then does exactly what its model/gpt_cuda.h counterpart
 * does, bit for bit.
 *
 * Device state: every function that touches a replica makes its device
 * current first and leaves device 0 current when it returns, failure
 * included, so single-device code that runs afterwards finds the device it
 * expects.
 *
 * Not thread safe; one thread at a time. Every int function returns 0 or
 * a negative VL_E* code with the reason in err (which may be NULL). After
 * a failure the replicas may disagree (one stepped, another not);
 * model_gpt_cuda_dp_upload_params and model_gpt_cuda_dp_set_adamw bring
 * them back in line.
 */
#ifndef VOLLEY_MODEL_GPT_CUDA_DP_H
#define VOLLEY_MODEL_GPT_CUDA_DP_H

#include <stddef.h>

#include "common/common.h"
#include "kernels/cuda_model.h"
#include "model/gpt_cuda.h"
#include "model/model.h"

#if defined(VOLLEY_HAVE_CUDA)

typedef struct model_gpt_cuda_dp model_gpt_cuda_dp;

/* Replicas of host on devices 0 .. ndev-1, each as model_gpt_cuda_create
 * makes it (math is the matrix products' precision), joined by one NCCL
 * communicator per device when ndev > 1. ndev <= 0 takes every visible
 * device (one in builds without NCCL). host is only read and may be
 * destroyed afterwards. On success *out is owned by the caller and
 * released with model_gpt_cuda_dp_free; on failure everything made so
 * far is released and *out is NULL. Returns 0; VL_EINVAL for NULL
 * arguments, more devices than are visible, or ndev > 1 in a build
 * without NCCL; VL_ENOMEM; VL_ERR when there is no usable device or NCCL
 * fails to start. */
int model_gpt_cuda_dp_create(const model_gpt *host, kernels_cuda_math math, int ndev,
                             model_gpt_cuda_dp **out, vl_error *err) VL_MUST_CHECK;

/* Releases the communicators, the replicas and dp itself. NULL is a
 * no-op. */
void model_gpt_cuda_dp_free(model_gpt_cuda_dp *dp);

/* Number of devices (replicas) dp trains on; 0 for NULL. */
int model_gpt_cuda_dp_devices(const model_gpt_cuda_dp *dp);

/* Number of parameters (the host model's model_gpt_num_params); 0 for
 * NULL. */
size_t model_gpt_cuda_dp_num_params(const model_gpt_cuda_dp *dp);

/* Replica 0, on device 0 (owned by dp; NULL for NULL): for work on the
 * trained parameters where they already are, such as making and
 * compressing a peer's update on the device. Device 0 is current between
 * calls, so device pointers of replica 0 can be used directly. */
model_gpt_cuda *model_gpt_cuda_dp_first(model_gpt_cuda_dp *dp);

/* Copies host's parameters to every replica (VL_EINVAL when host has
 * another configuration). */
int model_gpt_cuda_dp_upload_params(model_gpt_cuda_dp *dp, const model_gpt *host,
                                    vl_error *err) VL_MUST_CHECK;

/* Copies replica 0's parameters into host's parameter vector (all
 * replicas hold the same ones after every successful call here). */
int model_gpt_cuda_dp_download_params(model_gpt_cuda_dp *dp, model_gpt *host,
                                      vl_error *err) VL_MUST_CHECK;

/* Copies replica 0's gradient vector into out (n must be
 * model_gpt_cuda_dp_num_params), laid out like the parameters. */
int model_gpt_cuda_dp_download_grads(model_gpt_cuda_dp *dp, float *out, size_t n,
                                     vl_error *err) VL_MUST_CHECK;

/* Copies one replica's parameters and/or gradients (either may be NULL,
 * not both; n floats each, n = model_gpt_cuda_dp_num_params), to check
 * that the replicas agree. VL_EINVAL when replica is out of range. */
int model_gpt_cuda_dp_download_replica(model_gpt_cuda_dp *dp, int replica, float *params,
                                       float *grads, size_t n, vl_error *err) VL_MUST_CHECK;

/* Zeroes every replica's gradient vector. */
int model_gpt_cuda_dp_zero_grad(model_gpt_cuda_dp *dp, vl_error *err) VL_MUST_CHECK;

/* The gradient of the mean loss over host arrays inputs[B,T] and
 * targets[B,T] (checked as model_gpt_forward checks them, before any
 * device work), REPLACING every replica's gradient vector. The rows are
 * split in order: replica r takes a contiguous block of B/ndev rows, one
 * more for the first B % ndev replicas, so with B < ndev the last
 * replicas get none and contribute nothing. A replica's forward pass
 * waits for its loss but its backward pass is only queued, so one
 * device's backward overlaps the next device's forward. The per-replica
 * gradients, weighted by their share of the rows, are then summed by an
 * all-reduce: afterwards every replica holds the full batch's gradient,
 * equal to one device's up to rounding. *loss (loss may be
 * NULL) gets the batch's mean loss, the replicas' losses weighted by
 * their rows. Waits for the devices, so device errors are reported
 * here. */
int model_gpt_cuda_dp_grads(model_gpt_cuda_dp *dp, const int *inputs, const int *targets, int B,
                            int T, float *loss, vl_error *err) VL_MUST_CHECK;

/* model_gpt_cuda_clip_grads on every replica; *g2 gets replica 0's
 * squared norm. The replicas' gradients are identical after
 * model_gpt_cuda_dp_grads and the norm is summed in a fixed order, so
 * every replica computes the same norm and clips the same way. */
int model_gpt_cuda_dp_clip_grads(model_gpt_cuda_dp *dp, double max_norm, double *g2,
                                 vl_error *err) VL_MUST_CHECK;

/* model_gpt_cuda_adamw_step on every replica (same hyper-parameters and
 * checks). Identical gradients, moments and parameters in give identical
 * ones out, so the replicas stay equal. */
int model_gpt_cuda_dp_adamw_step(model_gpt_cuda_dp *dp, float lr, float beta1, float beta2,
                                 float eps, float weight_decay, vl_error *err) VL_MUST_CHECK;

/* model_gpt_cuda_set_adamw on every replica (the same moments and step
 * count everywhere), and model_gpt_cuda_get_adamw from replica 0. */
int model_gpt_cuda_dp_set_adamw(model_gpt_cuda_dp *dp, const float *m, const float *v, size_t n,
                                long step, vl_error *err) VL_MUST_CHECK;
int model_gpt_cuda_dp_get_adamw(model_gpt_cuda_dp *dp, float *m, float *v, size_t n, long *step,
                                vl_error *err) VL_MUST_CHECK;

#endif /* VOLLEY_HAVE_CUDA */

#endif
