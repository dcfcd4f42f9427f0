/* One local step's forward and backward on the GPU (--device cuda, or auto
 * with a usable GPU).
 *
 * The device holds a copy of the trainer's model (model/gpt_cuda.h) and
 * does the passes, where nearly all of a step's FLOPs are, with bf16
 * matrix products on float32 master weights. The gradient then comes back
 * to the host, where clipping, the optimizer and its state stay exactly as
 * on the CPU, so a task's state file, resume and every optimizer behave
 * the same on either device. The price is two copies of the parameters
 * over PCIe per step; moving the optimizer onto the device is what
 * removes it. */
#include <stdio.h>

#include "peer/peer.h"

#if defined(VOLLEY_HAVE_CUDA)
#include "model/gpt_cuda.h"

void peer_gpu_free(peer_trainer *t) {
    model_gpt_cuda_destroy(t->gpu);
    t->gpu = NULL;
}

int peer_gpu_grads(peer_trainer *t, const int *inputs, const int *targets, int B, int T,
                   float *loss, vl_error *err) {
    if (!t->gpt) return vl_fail(err, VL_EINVAL, "no model to train");
    int rc = VL_OK;
    if (!t->gpu) rc = model_gpt_cuda_create(t->gpt, KERNELS_CUDA_BF16, &t->gpu, err);
    else rc = model_gpt_cuda_upload_params(t->gpu, t->gpt, err);
    if (!rc) rc = model_gpt_cuda_zero_grad(t->gpu, err);
    if (!rc) rc = model_gpt_cuda_forward(t->gpu, inputs, targets, B, T, loss, err);
    if (!rc) rc = model_gpt_cuda_backward(t->gpu, err);
    if (!rc)
        rc = model_gpt_cuda_download_grads(t->gpu, model_gpt_grads(t->gpt), t->n_params, err);
    /* After a failure the device copy may be half-updated: start afresh. */
    if (rc) peer_gpu_free(t);
    return rc;
}

#else

void peer_gpu_free(peer_trainer *t) { t->gpu = NULL; }

int peer_gpu_grads(peer_trainer *t, const int *inputs, const int *targets, int B, int T,
                   float *loss, vl_error *err) {
    (void)t, (void)inputs, (void)targets, (void)B, (void)T, (void)loss;
    return vl_fail(err, VL_EINVAL, "this volley-peer was built without CUDA");
}

#endif
