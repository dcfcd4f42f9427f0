/* Element-wise layers: GELU and the residual connection. */
#include <math.h>
#include <stddef.h>

#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

void kernels_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for schedule(static) if (n > KV_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        out[i] = 0.5f * x * (1.0f + kv_tanh(u));
    }
}

void kernels_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for schedule(static) if (n > KV_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        float th = kv_tanh(u);
        float sech2 = 1.0f - th * th;
        float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
        dinp[i] += g * dout[i];
    }
}

void kernels_residual_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static) if (n > 4 * KV_PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void kernels_residual_backward(float *da, float *db, const float *dout, size_t n) {
#pragma omp parallel for schedule(static) if (n > 4 * KV_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}
