/* AdamW update and gradient-norm helpers over flat vectors. */
#include <math.h>
#include <stddef.h>

#include "kernels/adamw_elem.h"
#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"

void kernels_adamw_step(float *param, const float *grad, float *m, float *v,
                        const uint8_t *decay_mask, size_t n, const kernels_adamw_hparams *hp) {
    float b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, eps = hp->eps, wd = hp->weight_decay;
    long step = hp->step > 0 ? hp->step : 1;
    /* Bias corrections in double: beta2^step for large step loses most of
     * its digits in float. */
    float bc1 = (float)(1.0 - pow((double)b1, (double)step));
    float bc2 = (float)(1.0 - pow((double)b2, (double)step));
#pragma omp parallel for schedule(static) if (n > KV_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float decay = (decay_mask == NULL || decay_mask[i]) ? wd : 0.0f;
        param[i] =
            kernels_adamw_elem(param[i], grad[i], &m[i], &v[i], lr, b1, b2, eps, decay, bc1, bc2);
    }
}

/* The vector is cut into this many equal parts whatever the thread count,
 * and the parts are added in order. */
#define SSQ_PARTS 64

double kernels_sum_squares(const float *x, size_t n) {
    double part[SSQ_PARTS];
    size_t chunk = (n + SSQ_PARTS - 1) / SSQ_PARTS;
#pragma omp parallel for schedule(static) if (n > KV_PAR_MIN)
    for (int k = 0; k < SSQ_PARTS; k++) {
        size_t lo = (size_t)k * chunk, hi = lo + chunk;
        if (lo > n) lo = n;
        if (hi > n) hi = n;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
        part[k] = s;
    }
    double total = 0.0;
    for (int k = 0; k < SSQ_PARTS; k++) total += part[k];
    return total;
}

float kernels_clip_grad_norm(float *grad, size_t n, float max_norm) {
    double norm = sqrt(kernels_sum_squares(grad, n));
    if (max_norm > 0.0f && isfinite(norm) && norm > (double)max_norm) {
        float s = (float)((double)max_norm / (norm + 1e-6));
#pragma omp parallel for schedule(static) if (n > KV_PAR_MIN)
        for (size_t i = 0; i < n; i++) grad[i] *= s;
    }
    return (float)norm;
}
