/* Softmax over the vocabulary fused with the cross-entropy loss on the
 * GPU: one block per row (a vocabulary of 50257 is too long for a warp). */
#include <float.h>
#include <math.h>

#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"
#include "kernels/cuda_bf16.h"

/* Rows of V values, ld apart. */
__global__ static void softmax_xent_forward_kernel(float *probs, float *losses, const float *logits,
                                                   const int *targets, int V, int ld) {
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    const float *x = logits + row * (size_t)ld;
    float *p = probs + row * (size_t)ld;
    /* The target logit is read before probs (which may alias logits) is
     * written below; every thread reads it, none writes before the
     * barriers in the reductions. */
    float xt = targets ? x[targets[row]] : 0.0f;
    /* One read for the maximum and the sum together: each thread keeps
     * its sum relative to its own running maximum, rescaled when that
     * grows, and the block rescales every thread's to the row's. */
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = x[i];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    float mx = kc_block_max(m, sh);
    s = kc_block_sum(m == -INFINITY ? 0.0f : s * expf(m - mx), sh);
    float inv = 1.0f / s;
    /* A thread reads and then writes only its own elements here. */
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = expf(x[i] - mx) * inv;
        p[i] = v < FLT_MIN ? 0.0f : v;
    }
    if (targets && threadIdx.x == 0) losses[row] = mx + logf(s) - xt;
}

/* Out is float (may alias probs) or __nv_bfloat16 (a separate buffer).
 * A block per row (grid-stride over rows), so no thread divides to find
 * its row. Columns V..ld-1 of dlogits are written zero, so a product may
 * run over the padded width. */
template <typename Out>
__global__ static void softmax_xent_backward_kernel(Out *dlogits, const float *probs,
                                                    const int *targets, float scale, int N, int V,
                                                    int ld) {
    for (size_t row = blockIdx.x; row < (size_t)N; row += gridDim.x) {
        int t = targets[row];
        const float *p = probs + row * (size_t)ld;
        Out *d = dlogits + row * (size_t)ld;
        for (int col = threadIdx.x; col < V; col += blockDim.x)
            kc_put(&d[col], scale * (p[col] - (col == t ? 1.0f : 0.0f)));
        for (int col = V + threadIdx.x; col < ld; col += blockDim.x) kc_put(&d[col], 0.0f);
    }
}

extern "C" int kernels_cuda_softmax_xent_forward_ld(float *d_probs, float *d_losses,
                                                    const float *d_logits, const int *d_targets,
                                                    int N, int V, int ld, vl_error *err) {
    if (d_probs == NULL || d_logits == NULL || (d_targets && d_losses == NULL))
        return vl_fail(err, VL_EINVAL, "cuda softmax_xent: NULL pointer");
    if (N < 1 || V < 1 || ld < V)
        return vl_fail(err, VL_EINVAL, "cuda softmax_xent: N=%d V=%d ld=%d", N, V, ld);
    softmax_xent_forward_kernel<<<(unsigned)N, KC_THREADS>>>(d_probs, d_losses, d_logits, d_targets,
                                                             V, ld);
    return kc_launched(err, "softmax_xent forward");
}

extern "C" int kernels_cuda_softmax_xent_forward(float *d_probs, float *d_losses,
                                                 const float *d_logits, const int *d_targets, int N,
                                                 int V, vl_error *err) {
    return kernels_cuda_softmax_xent_forward_ld(d_probs, d_losses, d_logits, d_targets, N, V, V,
                                                err);
}

template <typename Out>
static int xent_backward(Out *d_dlogits, const float *d_probs, const int *d_targets, float scale,
                         int N, int V, int ld, vl_error *err) {
    if (d_dlogits == NULL || d_probs == NULL || d_targets == NULL)
        return vl_fail(err, VL_EINVAL, "cuda softmax_xent backward: NULL pointer");
    if (N < 1 || V < 1 || ld < V)
        return vl_fail(err, VL_EINVAL, "cuda softmax_xent backward: N=%d V=%d ld=%d", N, V, ld);
    unsigned blocks = (unsigned)N < KC_MAX_BLOCKS ? (unsigned)N : KC_MAX_BLOCKS;
    softmax_xent_backward_kernel<Out>
        <<<blocks, KC_THREADS>>>(d_dlogits, d_probs, d_targets, scale, N, V, ld);
    return kc_launched(err, "softmax_xent backward");
}

extern "C" int kernels_cuda_softmax_xent_backward(float *d_dlogits, const float *d_probs,
                                                  const int *d_targets, float scale, int N, int V,
                                                  vl_error *err) {
    return xent_backward(d_dlogits, d_probs, d_targets, scale, N, V, V, err);
}

extern "C" int kernels_cuda_softmax_xent_backward_bf16(kernels_bf16 *d_dlogits_h,
                                                       const float *d_probs, const int *d_targets,
                                                       float scale, int N, int V, int ld,
                                                       vl_error *err) {
    return xent_backward((__nv_bfloat16 *)d_dlogits_h, d_probs, d_targets, scale, N, V, ld, err);
}
