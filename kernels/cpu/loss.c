/* Softmax over the vocabulary fused with the cross-entropy loss. */
#include <float.h>
#include <math.h>
#include <stddef.h>

#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"

void kernels_softmax_xent_forward(float *probs, float *losses, const float *logits,
                                  const int *targets, int N, int V) {
#pragma omp parallel for schedule(static) if ((long)N * V > KV_PAR_MIN / 4)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V;
        float mx = -INFINITY;
        for (int i = 0; i < V; i++)
            if (x[i] > mx) mx = x[i];
        /* Read the target logit before probs (which may alias logits) is
         * written. */
        float xt = targets ? x[targets[n]] : 0.0f;
        for (int i = 0; i < V; i++) p[i] = kv_exp(x[i] - mx);
        /* The normaliser of a large vocabulary is summed in double, in
         * order. */
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += p[i];
        float inv = (float)(1.0 / sum);
        /* Flushed below FLT_MIN, as in the attention softmax: subnormal
         * probabilities would slow every product of the backward pass. */
        for (int i = 0; i < V; i++) {
            float v = p[i] * inv;
            p[i] = v < FLT_MIN ? 0.0f : v;
        }
        if (targets) losses[n] = (float)((double)mx + log(sum) - (double)xt);
    }
}

void kernels_softmax_xent_backward(float *dlogits, const float *probs, const int *targets,
                                   float scale, int N, int V) {
#pragma omp parallel for schedule(static) if ((long)N * V > KV_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        int tgt = targets[n];
        for (int i = 0; i < V; i++) d[i] = scale * (p[i] - (i == tgt ? 1.0f : 0.0f));
    }
}
