/* Softmax over the vocabulary fused with the cross-entropy loss on the
 * GPU: one block per row (a vocabulary of 50257 is too long for a warp). */
#include <float.h>
#include <math.h>

#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

__global__ static void softmax_xent_forward_kernel(float *probs, float *losses,
                                                   const float *logits, const int *targets,
                                                   int V)
{
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    const float *x = logits + row * (size_t)V;
    float *p = probs + row * (size_t)V;
    /* The target logit is read before probs (which may alias logits) is
     * written below; every thread reads it, none writes before the
     * barriers in the reductions. */
    float xt = targets ? x[targets[row]] : 0.0f;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, x[i]);
    mx = kc_block_max(mx, sh);
    float s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        s += expf(x[i] - mx);
    s = kc_block_sum(s, sh);
    float inv = 1.0f / s;
    /* A thread reads and then writes only its own elements here. */
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = expf(x[i] - mx) * inv;
        p[i] = v < FLT_MIN ? 0.0f : v;
    }
    if (targets && threadIdx.x == 0)
        losses[row] = mx + logf(s) - xt;
}

__global__ static void softmax_xent_backward_kernel(float *dlogits, const float *probs,
                                                    const int *targets, float scale, size_t n,
                                                    int V)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / (size_t)V;
        int col = (int)(i % (size_t)V);
        dlogits[i] = scale * (probs[i] - (col == targets[row] ? 1.0f : 0.0f));
    }
}

extern "C" int kernels_cuda_softmax_xent_forward(float *d_probs, float *d_losses,
                                                 const float *d_logits, const int *d_targets,
                                                 int N, int V, vl_error *err)
{
    if (d_probs == NULL || d_logits == NULL || (d_targets && d_losses == NULL))
        return vl_fail(err, VL_EINVAL, "cuda softmax_xent: NULL pointer");
    if (N < 1 || V < 1)
        return vl_fail(err, VL_EINVAL, "cuda softmax_xent: N=%d V=%d", N, V);
    softmax_xent_forward_kernel<<<(unsigned)N, KC_THREADS>>>(d_probs, d_losses, d_logits,
                                                             d_targets, V);
    return kc_launched(err, "softmax_xent forward");
}

extern "C" int kernels_cuda_softmax_xent_backward(float *d_dlogits, const float *d_probs,
                                                  const int *d_targets, float scale, int N,
                                                  int V, vl_error *err)
{
    if (d_dlogits == NULL || d_probs == NULL || d_targets == NULL)
        return vl_fail(err, VL_EINVAL, "cuda softmax_xent backward: NULL pointer");
    if (N < 1 || V < 1)
        return vl_fail(err, VL_EINVAL, "cuda softmax_xent backward: N=%d V=%d", N, V);
    size_t n = (size_t)N * V;
    softmax_xent_backward_kernel<<<kc_blocks(n), KC_THREADS>>>(d_dlogits, d_probs, d_targets,
                                                               scale, n, V);
    return kc_launched(err, "softmax_xent backward");
}
