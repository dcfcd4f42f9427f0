/*
 * model/gpt_cuda.h: the GPT of model/model.h trained on a CUDA device.
 * Parameters, gradients, AdamW state and activations live on the device;
 * the forward and backward passes are the CPU model's, layer for layer, on
 * the kernels of kernels/cuda_model.h, and AdamW is
 * kernels_cuda_adamw_step. The parameter vector has the CPU model's layout
 * (its tensor table), so parameters move between the two with one copy.
 *
 * A separate header (and library, volley_model_cuda) rather than a section
 * of model.h: only builds with VOLLEY_HAVE_CUDA have it, and programs that
 * never use a GPU do not link the CUDA runtime.
 *
 * Precision: the parameters, their gradients and the AdamW state are
 * float32 (the master weights), and so is everything that is summed into.
 * The matrix products run in the kernels_cuda_math mode given at creation;
 * in KERNELS_CUDA_BF16 (mixed precision) they read bfloat16 copies of
 * their operands (kernels/cuda_bf16.h, model/gpt_cuda_bf16.c), kept beside
 * the float32 activations for the backward pass. Loss and
 * gradients match the CPU model within rounding in KERNELS_CUDA_FP32 (see
 * tests/unit/test_model_cuda.c for the tolerances held).
 *
 * Not thread safe; one thread at a time. Every function returns 0 or a
 * negative VL_E* code with the reason in err (which may be NULL). The K-FAC
 * linear hook of the CPU model is not available here.
 */
#ifndef VOLLEY_MODEL_GPT_CUDA_H
#define VOLLEY_MODEL_GPT_CUDA_H

#include <stddef.h>

#include "common/common.h"
#include "kernels/cuda_model.h"
#include "model/model.h"

#if defined(VOLLEY_HAVE_CUDA)

typedef struct model_gpt_cuda model_gpt_cuda;

/* A device copy of host: its configuration, tensor table and current
 * parameters; zeroed gradients and AdamW state (step 0). host is only read
 * and may be destroyed afterwards. On success *out is owned by the caller
 * and released with model_gpt_cuda_free. Returns 0, VL_EINVAL, VL_ENOMEM
 * (host or device memory) or VL_ERR (no usable device). */
int model_gpt_cuda_create(const model_gpt *host, kernels_cuda_math math, model_gpt_cuda **out,
                          vl_error *err) VL_MUST_CHECK;

/* Frees all device and host memory of g. NULL is a no-op. */
void model_gpt_cuda_free(model_gpt_cuda *g);

/* Number of parameters (the host model's model_gpt_num_params). */
size_t model_gpt_cuda_num_params(const model_gpt_cuda *g);

/* Copies host's parameters to the device, or the device's into host's
 * parameter vector. host must have g's configuration (VL_EINVAL
 * otherwise). Uploading forgets the last forward pass. */
int model_gpt_cuda_upload_params(model_gpt_cuda *g, const model_gpt *host,
                                 vl_error *err) VL_MUST_CHECK;
int model_gpt_cuda_download_params(model_gpt_cuda *g, model_gpt *host, vl_error *err) VL_MUST_CHECK;

/* Copies the gradient vector (n must be model_gpt_cuda_num_params) into
 * the caller's out, laid out like the parameters. */
int model_gpt_cuda_download_grads(model_gpt_cuda *g, float *out, size_t n,
                                  vl_error *err) VL_MUST_CHECK;

/* Zeroes the gradient vector. */
int model_gpt_cuda_zero_grad(model_gpt_cuda *g, vl_error *err) VL_MUST_CHECK;

/* model_gpt_forward on the device: host arrays inputs[B,T] and (optional)
 * targets[B,T], checked the same way; with targets the mean loss goes to
 * *loss (loss may be NULL without targets). Activation memory, for both
 * passes, is planned for the largest B*T and B*T*T seen so far. Waits for
 * the device (the loss is summed on the host). */
int model_gpt_cuda_forward(model_gpt_cuda *g, const int *inputs, const int *targets, int B, int T,
                           float *loss, vl_error *err) VL_MUST_CHECK;

/* Copies the [B,T,V] output of the last forward (logits without targets,
 * probabilities with them) into out, n = B*T*V floats. VL_EINVAL when
 * there is no output (none yet, or a backward consumed it) or n differs. */
int model_gpt_cuda_download_output(model_gpt_cuda *g, float *out, size_t n,
                                   vl_error *err) VL_MUST_CHECK;

/* model_gpt_backward on the device: ADDS the gradient of the last
 * forward's mean loss into the gradient vector and consumes the forward.
 * VL_EINVAL when there is no forward-with-targets to differentiate. Queues
 * the work and returns (errors the device meets surface at the next call
 * that waits: forward, a download, or model_gpt_cuda_adamw_step). */
int model_gpt_cuda_backward(model_gpt_cuda *g, vl_error *err) VL_MUST_CHECK;

/* One AdamW step with the current gradients, as model_adamw_step with the
 * same hyper-parameters (checked as model_adamw_init does): weight decay on
 * 2-D tensors only, bias correction from the step count g keeps (the first
 * call is step 1). Waits for the device. */
int model_gpt_cuda_adamw_step(model_gpt_cuda *g, float lr, float beta1, float beta2, float eps,
                              float weight_decay, vl_error *err) VL_MUST_CHECK;

/* Global L2 gradient clipping on the device, the peer's host rule: *g2
 * gets the squared norm of the gradient vector (summed in double in a
 * fixed order, so the same gradients always give the same bits); when
 * max_norm > 0 and the norm is finite and above it, the gradients are
 * scaled down to norm max_norm. Waits for the device. */
int model_gpt_cuda_clip_grads(model_gpt_cuda *g, double max_norm, double *g2,
                              vl_error *err) VL_MUST_CHECK;

/* The AdamW state in and out, so a host optimizer (model_adamw) and the
 * device take turns: set copies moments m and v (n floats each, n =
 * model_gpt_cuda_num_params) and the count of steps taken; m and v NULL
 * with step 0 zero the moments. get copies them out. Both wait for the
 * device. */
int model_gpt_cuda_set_adamw(model_gpt_cuda *g, const float *m, const float *v, size_t n, long step,
                             vl_error *err) VL_MUST_CHECK;
int model_gpt_cuda_get_adamw(model_gpt_cuda *g, float *m, float *v, size_t n, long *step,
                             vl_error *err) VL_MUST_CHECK;

/* The device's parameter and gradient vectors (num_params floats each,
 * the host model's layout), for collective operations and device-side
 * compression. Owned by g; valid until it is destroyed. NULL for NULL. */
float *model_gpt_cuda_params_device(model_gpt_cuda *g);
float *model_gpt_cuda_grads_device(model_gpt_cuda *g);

#endif /* VOLLEY_HAVE_CUDA */

#endif
