/*
 * Private helpers for the CPU kernels: short vector loops written so the
 * compiler vectorises them without reassociating floating-point sums
 * (each lane keeps its own partial sum and the lanes are combined in a
 * fixed order), which keeps results reproducible.
 */
#ifndef VOLLEY_KERNELS_CPU_VEC_H
#define VOLLEY_KERNELS_CPU_VEC_H

#include <stddef.h>
#include <stdint.h>

#define KV_LANES 8

/* Below this many scalar operations a parallel region costs more than it
 * saves. */
#define KV_PAR_MIN 16384

static inline float kv_dot(const float *a, const float *b, int n) {
    float acc[KV_LANES] = {0};
    int i = 0;
    for (; i + KV_LANES <= n; i += KV_LANES)
        for (int l = 0; l < KV_LANES; l++) acc[l] += a[i + l] * b[i + l];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) +
           tail;
}

/* y += a * x */
static inline void kv_axpy(float *restrict y, float a, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* exp(x) for float, branch-free so loops calling it vectorise (libm's
 * expf does not without -ffast-math). Relative error about 2 ulp over the
 * whole range; inputs are clamped to [-87.3, 88.3], so it never returns Inf
 * or a denormal (exp(-87.3) ~ 1.2e-38 stands in for smaller results).
 * Method: x = n ln2 + r with |r| <= ln2/2, a degree-7 Taylor polynomial for
 * e^r (truncation error < 1e-8) and 2^n built in the exponent bits. */
static inline float kv_exp(float x) {
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    /* Round x/ln2 to nearest by adding and subtracting 1.5 * 2^23. A NaN
     * input (a diverged model's scores) gets n = 0, so the conversion to
     * int below stays defined and the NaN comes out through p. */
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    n = n == n ? n : 0.0f;
    /* ln2 split in two so r = x - n ln2 is exact to float precision. */
    float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale;
    scale.i = ((int32_t)n + 127) << 23;
    return p * scale.f;
}

/* tanh via exp: 1 - 2/(e^{2x}+1). Absolute error ~1e-7 (relative error is
 * larger only where |tanh x| < 1e-3, which GELU adds to 1 anyway). */
static inline float kv_tanh(float x) {
    return 1.0f - 2.0f / (kv_exp(2.0f * x) + 1.0f);
}

#endif
