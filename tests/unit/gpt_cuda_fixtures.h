/* What the device GPT's test programs share (test_model_cuda.c,
 * test_model_cuda_dp.c, test_model_cuda_multi.c, test_model_cuda_bf16.c):
 * the optimizer's settings, a small GPT, failing on an error, device
 * copies and comparisons against the CPU, and the plain single-device
 * model as the reference the data-parallel one is held to. Include after
 * <cmocka.h>. */
#ifndef VOLLEY_TESTS_GPT_CUDA_FIXTURES_H
#define VOLLEY_TESTS_GPT_CUDA_FIXTURES_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "kernels/cuda_model.h"
#include "kernels/kernels.h"
#include "model/gpt_cuda.h"
#include "model/gpt_cuda_dp.h"
#include "model/model.h"
#include "test_util.h"

/* AdamW's settings in every comparison. */
static const float LR = 1e-3f, B1 = 0.9f, B2 = 0.95f, EPS = 1e-8f, WD = 0.1f;

/* A small GPT with sizes off every block multiple of the kernels. */
static const model_gpt_config CFG = {
    .vocab_size = 67, .block_size = 24, .n_layer = 2, .n_head = 3, .n_embd = 48};

/* Fails the test with what and err's message when rc is not 0. */
static inline void ok(int rc, const vl_error *err, const char *what) {
    if (rc != 0) fail_msg("%s failed: %s", what, err->msg);
}

/* n zeroed floats on the heap (caller frees). */
static inline float *hbuf(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

/* ---- device copies and comparisons (test_model_cuda*.c) ---------------------- */

/* x[i] = offset + scale * N(0, 1). */
static inline void fill(float *x, size_t n, vl_rng *r, float scale, float offset) {
    for (size_t i = 0; i < n; i++) x[i] = offset + scale * vl_rng_normal(r);
}

/* A device copy of bytes of host memory (freed with kernels_cuda_free). */
static inline void *dev(const void *h, size_t bytes) {
    vl_error err = {0};
    void *d = NULL;
    if (kernels_cuda_alloc(&d, bytes, &err) != 0 || kernels_cuda_upload(d, h, bytes, &err) != 0)
        fail_msg("device copy of %zu bytes: %s", bytes, err.msg);
    return d;
}

static inline float *devf(const float *h, size_t n) {
    return dev(h, n * sizeof(float));
}

/* Downloads n floats of d into a new host buffer (caller frees). */
static inline float *back(const float *d, size_t n) {
    float *h = hbuf(n);
    vl_error err = {0};
    if (kernels_cuda_download(h, d, n * sizeof(float), &err) != 0)
        fail_msg("download: %s", err.msg);
    return h;
}

/* Compares host g (the device's result) with c over n floats by
 * test_max_rel_err, and prints the error. */
static inline void check(const char *what, const float *g, const float *c, size_t n, double tol) {
    double e = test_max_rel_err(g, c, n);
    printf("%s: error %.3g (tolerance %.1g)\n", what, e, tol);
    if (!(e <= tol)) fail_msg("%s: GPU and CPU differ by %.3g (tolerance %.1g)", what, e, tol);
}

/* A cuBLAS context in math mode (the caller destroys it). */
static inline kernels_cuda_ctx *ctx_of(kernels_cuda_math math) {
    kernels_cuda_ctx *ctx = NULL;
    vl_error err = {0};
    ok(kernels_cuda_ctx_create(math, &ctx, &err), &err, "context");
    return ctx;
}

/* check() on n floats of device memory d. */
static inline void expect(const char *what, const float *d, const float *c, size_t n, double tol) {
    float *g = back(d, n);
    check(what, g, c, n, tol);
    free(g);
}

/* The data-parallel model promises device 0 current after every call. */
static inline void expect_device_0(const char *after) {
    int d = -1;
    vl_error err = {0};
    ok(kernels_cuda_get_device(&d, &err), &err, "current device");
    if (d != 0) fail_msg("device %d is current after %s", d, after);
}

/* Fails at the first float whose bits differ. */
static inline void expect_bits(const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: element %zu differs (%.9g vs %.9g)", what, i, (double)a[i], (double)b[i]);
}

/* inputs: distinct tokens (a prefix of a shuffled vocabulary, so n <= V),
 * so the embedding gradient's atomics add one value per element; targets:
 * any. */
static inline void batch(int *in, int *tg, int n, vl_rng *r) {
    int V = CFG.vocab_size, perm[256];
    assert_true(n <= V && V <= 256);
    for (int i = 0; i < V; i++) perm[i] = i;
    for (int i = V - 1; i > 0; i--) {
        int j = (int)vl_rng_below(r, (uint32_t)i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < n; i++) {
        in[i] = perm[i];
        tg[i] = (int)vl_rng_below(r, (uint32_t)V);
    }
}

/* A host GPT of CFG with weights from seed. */
static inline model_gpt *host_model(uint64_t seed) {
    model_gpt *m = NULL;
    vl_error err = {0};
    ok(model_gpt_create(&CFG, &m, &err), &err, "host model");
    model_gpt_init_weights(m, seed);
    return m;
}

/* The plain model's gradient of one batch, the reference the data-parallel
 * one is held to, copied into grads (np floats). */
static inline void plain_grads(model_gpt_cuda *g, const int *in, const int *tg, int B, int T,
                               float *loss, float *grads, size_t np) {
    vl_error err = {0};
    ok(model_gpt_cuda_zero_grad(g, &err), &err, "plain zero_grad");
    ok(model_gpt_cuda_forward(g, in, tg, B, T, loss, &err), &err, "plain forward");
    ok(model_gpt_cuda_backward(g, &err), &err, "plain backward");
    ok(model_gpt_cuda_download_grads(g, grads, np, &err), &err, "plain grads");
}

/* One batch of B rows of T tokens from r through both models: the plain
 * model's loss into *lp and its gradient into pg (np floats), the
 * data-parallel model's loss into *ld (its gradient stays on the
 * devices). */
static inline void both_grads(model_gpt_cuda *plain, model_gpt_cuda_dp *dp, int B, int T, vl_rng *r,
                              float *lp, float *ld, float *pg, size_t np) {
    int in[64], tg[64];
    assert_true(B * T <= 64);
    batch(in, tg, B * T, r);
    plain_grads(plain, in, tg, B, T, lp, pg, np);
    vl_error err = {0};
    ok(model_gpt_cuda_dp_grads(dp, in, tg, B, T, ld, &err), &err, "dp grads");
    expect_device_0("grads");
}

/* Clips the plain model's gradient at half its norm, so clipping always
 * scales; *g2 gets the squared norm before clipping and the threshold is
 * returned, for the data-parallel model to clip at the same one. */
static inline double plain_clip(model_gpt_cuda *g, double *g2) {
    vl_error err = {0};
    double again = 0;
    ok(model_gpt_cuda_clip_grads(g, 0, g2, &err), &err, "plain norm");
    double max_norm = 0.5 * sqrt(*g2);
    ok(model_gpt_cuda_clip_grads(g, max_norm, &again, &err), &err, "plain clip");
    return max_norm;
}

#endif
