/* Local training on the GPU (--device cuda, or auto with a usable GPU).
 *
 * AdamW tasks, the common case, run wholly on the device: parameters,
 * gradients and moments go there once at the start of a task and come back
 * once at its end, and every step in between moves only its tokens in and
 * its loss and gradient norm out. The end-of-task copy of the moments is
 * the price of the crash-safe trainer state (trainer.st), which the peer
 * writes before every upload. SGD tasks run forward and backward on the
 * device and keep the optimizer on the host (peer_gpu_grads), paying two
 * copies of the parameters per step.
 *
 * The task's delta is made on the device too, where gpu_encode.c can
 * compress it. A machine with several GPUs trains on all of them at once
 * (model/gpt_cuda_dp.h: the batch split by rows, gradients summed by an
 * NCCL all-reduce) and is still one peer; the delta and its compression
 * are device 0's. Matrix products run in bf16 on float32 master weights. */
#include <math.h>
#include <stdio.h>

#include "peer/peer.h"

#if defined(VOLLEY_HAVE_CUDA)
#include "model/gpt_cuda_dp.h"

void peer_gpu_free(peer_trainer *t) {
    model_gpt_cuda_dp_free(t->gpu);
    kernels_cuda_free(t->gpu_vec);
    t->gpu = NULL;
    t->gpu_vec = NULL;
    t->gpu_delta = 0;
}

int peer_gpu_has_delta(const peer_trainer *t) {
    return t->gpu && t->gpu_vec && t->gpu_delta;
}

/* Device copies holding the host model's current parameters: one replica
 * per visible GPU (CUDA_VISIBLE_DEVICES chooses them), trained
 * data-parallel when there are several. */
static int load_params(peer_trainer *t, vl_error *err) {
    if (!t->gpt) return vl_fail(err, VL_EINVAL, "no model to train");
    if (t->gpu) return model_gpt_cuda_dp_upload_params(t->gpu, t->gpt, err);
    int rc = model_gpt_cuda_dp_create(t->gpt, KERNELS_CUDA_BF16, 0, &t->gpu, err);
    if (!rc && model_gpt_cuda_dp_devices(t->gpu) > 1)
        vl_log_info("GPU: training data-parallel on %d devices", model_gpt_cuda_dp_devices(t->gpu));
    return rc;
}

/* Replica 0's parameters, where the delta is made. */
static float *params0(peer_trainer *t) {
    return model_gpt_cuda_params_device(model_gpt_cuda_dp_first(t->gpu));
}

/* After a failure the device copy may be half-updated: start afresh. */
static int failed(peer_trainer *t, int rc) {
    if (rc) peer_gpu_free(t);
    return rc;
}

int peer_gpu_grads(peer_trainer *t, const int *inputs, const int *targets, int B, int T,
                   float *loss, vl_error *err) {
    int rc = load_params(t, err);
    /* The host model of a fresh trainer has no gradient buffer until its
     * first zero_grad or backward, and the device's gradients land there. */
    if (!rc && !model_gpt_grads(t->gpt)) rc = model_gpt_zero_grad(t->gpt, err);
    if (!rc) rc = model_gpt_cuda_dp_grads(t->gpu, inputs, targets, B, T, loss, err);
    if (!rc)
        rc = model_gpt_cuda_dp_download_grads(t->gpu, model_gpt_grads(t->gpt), t->n_params, err);
    return failed(t, rc);
}

int peer_gpu_begin(peer_trainer *t, vl_error *err) {
    if (!t->have_opt || t->opt.n != t->n_params)
        return vl_fail(err, VL_EINVAL, "no AdamW state for the model");
    t->gpu_delta = 0;
    int rc = load_params(t, err);
    size_t bytes = t->n_params * sizeof(float);
    if (!rc && !t->gpu_vec) rc = kernels_cuda_alloc((void **)&t->gpu_vec, 2 * bytes, err);
    /* The base stays on the device for the delta at the task's end. */
    if (!rc) rc = kernels_cuda_copy(t->gpu_vec, params0(t), bytes, err);
    if (!rc)
        rc = model_gpt_cuda_dp_set_adamw(t->gpu, t->opt.m, t->opt.v, t->opt.n, t->opt.step, err);
    return failed(t, rc);
}

int peer_gpu_step(peer_trainer *t, int B, int T, double max_norm, float *loss, double *g2,
                  vl_error *err) {
    if (!t->gpu) return vl_fail(err, VL_EINVAL, "no task begun on the GPU");
    *g2 = NAN;
    int rc = model_gpt_cuda_dp_grads(t->gpu, t->inputs, t->targets, B, T, loss, err);
    if (!rc && !isfinite(*loss)) return VL_OK; /* a diverged loss steps nothing */
    if (!rc) rc = model_gpt_cuda_dp_clip_grads(t->gpu, max_norm, g2, err);
    if (!rc && isfinite(*g2))
        rc = model_gpt_cuda_dp_adamw_step(t->gpu, t->opt.lr, t->opt.beta1, t->opt.beta2, t->opt.eps,
                                          t->opt.weight_decay, err);
    return failed(t, rc);
}

int peer_gpu_finish(peer_trainer *t, vl_error *err) {
    if (!t->gpu) return vl_fail(err, VL_EINVAL, "no task begun on the GPU");
    long step = 0;
    int rc = model_gpt_cuda_dp_download_params(t->gpu, t->gpt, err);
    if (!rc) rc = model_gpt_cuda_dp_get_adamw(t->gpu, t->opt.m, t->opt.v, t->opt.n, &step, err);
    if (!rc) t->opt.step = step;
    /* delta = base - local, compress_dense_delta's arithmetic. */
    if (!rc)
        rc = kernels_cuda_sub(t->gpu_vec + t->n_params, t->gpu_vec, params0(t), t->n_params, err);
    if (!rc) t->gpu_delta = 1;
    return failed(t, rc);
}

#else

static int no_cuda(vl_error *err) {
    return vl_fail(err, VL_EINVAL, "this volley-peer was built without CUDA");
}

void peer_gpu_free(peer_trainer *t) {
    t->gpu = NULL;
    t->gpu_vec = NULL;
    t->gpu_delta = 0;
}

int peer_gpu_has_delta(const peer_trainer *t) {
    (void)t;
    return 0;
}

int peer_gpu_sketch(peer_trainer *t, compress_sketch *s, vl_error *err) {
    (void)t, (void)s;
    return no_cuda(err);
}

int peer_gpu_select(peer_trainer *t, const peer_task *k, size_t *nnz, vl_error *err) {
    (void)t, (void)k, (void)nnz;
    return no_cuda(err);
}

int peer_gpu_grads(peer_trainer *t, const int *inputs, const int *targets, int B, int T,
                   float *loss, vl_error *err) {
    (void)t, (void)inputs, (void)targets, (void)B, (void)T, (void)loss;
    return no_cuda(err);
}

int peer_gpu_begin(peer_trainer *t, vl_error *err) {
    (void)t;
    return no_cuda(err);
}

int peer_gpu_step(peer_trainer *t, int B, int T, double max_norm, float *loss, double *g2,
                  vl_error *err) {
    (void)t, (void)B, (void)T, (void)max_norm, (void)loss, (void)g2;
    return no_cuda(err);
}

int peer_gpu_finish(peer_trainer *t, vl_error *err) {
    (void)t;
    return no_cuda(err);
}

#endif
