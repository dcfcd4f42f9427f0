/*
 * Unit tests for K-FAC on linear layers: the factors against a plain
 * double-loop reference (one batch and a moving average over two), the
 * preconditioned gradient against explicit Gauss-Jordan inverses of the
 * damped factors, the undamped case against (A ⊗ G)⁻¹ vec(∇) built as a
 * Kronecker product, the π damping split, refusal of factors that are not
 * positive definite (with the previous inverses kept), the KL-clipping
 * factor on hand-computed values and its guards, weighted averaging of
 * factors, argument refusals, and a small MLP trained with K-FAC-
 * preconditioned SGD against plain SGD at the same learning rate.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/common.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "tests/unit/test_util.h"
#include "tests/unit/kfac_ref.h"

static model_kfac_layer *make(int in, int out) {
    model_kfac_layer *l = NULL;
    vl_error err = {0};
    if (model_kfac_layer_create(in, out, &l, &err) != 0)
        fail_msg("create %d x %d: %s", in, out, err.msg);
    return l;
}

/* ---- factors ---------------------------------------------------------------- */

static void test_factors_one_batch(void **state) {
    (void)state;
    int in = 5, out = 3, N = 7, da = in + 1;
    float *X = random_vec((size_t)N * in, 1), *dY = random_vec((size_t)N * out, 2);
    double *A = dalloc((size_t)da * da), *G = dalloc((size_t)out * out);
    ref_factors(X, dY, N, in, out, A, G);
    model_kfac_layer *l = make(in, out);
    assert_int_equal(l->updates, 0);
    OK(model_kfac_update_factors(l, X, dY, N, 0.95f, &e_));
    assert_int_equal(l->updates, 1);
    /* the first update takes the batch whatever ρ is */
    assert_rel(l->A, A, (size_t)da * da, 1e-6);
    assert_rel(l->G, G, (size_t)out * out, 1e-6);
    /* both triangles are stored, exactly symmetric */
    for (int r = 0; r < da; r++)
        for (int c = 0; c < da; c++) assert_true(l->A[r * da + c] == l->A[c * da + r]);
    for (int r = 0; r < out; r++)
        for (int c = 0; c < out; c++) assert_true(l->G[r * out + c] == l->G[c * out + r]);
    assert_true(l->A[da * da - 1] == 1.0f);
    model_kfac_layer_free(l);
    free(X), free(dY), free(A), free(G);
}

static void test_factors_moving_average(void **state) {
    (void)state;
    int in = 5, out = 3, N = 7, N2 = 4, da = in + 1;
    float rho = 0.8f;
    float *X1 = random_vec((size_t)N * in, 3), *dY1 = random_vec((size_t)N * out, 4);
    float *X2 = random_vec((size_t)N2 * in, 5), *dY2 = random_vec((size_t)N2 * out, 6);
    double *A1 = dalloc((size_t)da * da), *G1 = dalloc((size_t)out * out);
    double *A2 = dalloc((size_t)da * da), *G2 = dalloc((size_t)out * out);
    ref_factors(X1, dY1, N, in, out, A1, G1);
    ref_factors(X2, dY2, N2, in, out, A2, G2);
    for (int i = 0; i < da * da; i++) A1[i] = rho * A1[i] + (1.0 - rho) * A2[i];
    for (int i = 0; i < out * out; i++) G1[i] = rho * G1[i] + (1.0 - rho) * G2[i];
    model_kfac_layer *l = make(in, out);
    OK(model_kfac_update_factors(l, X1, dY1, N, rho, &e_));
    OK(model_kfac_update_factors(l, X2, dY2, N2, rho, &e_));
    assert_int_equal(l->updates, 2);
    assert_rel(l->A, A1, (size_t)da * da, 1e-6);
    assert_rel(l->G, G1, (size_t)out * out, 1e-6);
    /* ρ = 0 forgets the past, ρ = 1 keeps it */
    OK(model_kfac_update_factors(l, X2, dY2, N2, 0.0f, &e_));
    assert_rel(l->A, A2, (size_t)da * da, 1e-6);
    assert_rel(l->G, G2, (size_t)out * out, 1e-6);
    OK(model_kfac_update_factors(l, X1, dY1, N, 1.0f, &e_));
    assert_rel(l->A, A2, (size_t)da * da, 1e-6);
    model_kfac_layer_free(l);
    free(X1), free(dY1), free(X2), free(dY2), free(A1), free(G1), free(A2), free(G2);
}

static void test_update_refusals(void **state) {
    (void)state;
    int in = 3, out = 2, N = 4;
    float *X = random_vec((size_t)N * in, 7), *dY = random_vec((size_t)N * out, 8);
    model_kfac_layer *l = make(in, out);
    vl_error err = {0};
    assert_int_equal(model_kfac_update_factors(l, X, dY, 0, 0.9f, &err), VL_EINVAL);
    assert_int_equal(model_kfac_update_factors(l, NULL, dY, N, 0.9f, &err), VL_EINVAL);
    assert_int_equal(model_kfac_update_factors(l, X, dY, N, 1.5f, &err), VL_EINVAL);
    assert_int_equal(model_kfac_update_factors(l, X, dY, N, NAN, &err), VL_EINVAL);
    assert_int_equal(model_kfac_update_factors(l, X, dY, N, -0.1f, &err), VL_EINVAL);
    OK(model_kfac_update_factors(l, X, dY, N, 0.9f, &e_));
    float A0[16], G0[4];
    memcpy(A0, l->A, sizeof A0);
    memcpy(G0, l->G, sizeof G0);
    X[5] = NAN;
    assert_int_equal(model_kfac_update_factors(l, X, dY, N, 0.9f, &err), VL_ERANGE);
    assert_non_null(strstr(err.msg, "inputs"));
    X[5] = 0.0f;
    dY[3] = INFINITY;
    assert_int_equal(model_kfac_update_factors(l, X, dY, N, 0.9f, &err), VL_ERANGE);
    assert_non_null(strstr(err.msg, "gradients"));
    /* a refused batch leaves the averages alone */
    assert_memory_equal(A0, l->A, sizeof A0);
    assert_memory_equal(G0, l->G, sizeof G0);
    assert_int_equal(l->updates, 1);

    model_kfac_layer *bad = (model_kfac_layer *)1;
    assert_int_equal(model_kfac_layer_create(0, 3, &bad, &err), VL_EINVAL);
    assert_null(bad);
    assert_int_equal(model_kfac_layer_create(3, MODEL_KFAC_MAX_DIM + 1, &bad, &err), VL_EINVAL);
    assert_int_equal(model_kfac_layer_create(3, 3, NULL, &err), VL_EINVAL);
    model_kfac_layer_free(NULL);
    model_kfac_layer_free(l);
    free(X), free(dY);
}

/* ---- preconditioning ---------------------------------------------------------- */

/* THE check: the preconditioned gradient equals (A + λ_A I)⁻¹ ∇ (G + λ_G I)⁻¹
 * with the factors and both inverses computed independently in double,
 * ∇ = [∇W; ∇b] of shape [(in+1), out]. Tolerance 1e-4 relative to the
 * largest entry: float storage of the factors and inverses, nothing more. */
static void check_precondition(int in, int out, int N, float damping, uint64_t seed) {
    int da = in + 1;
    float *X = random_vec((size_t)N * in, seed), *dY = random_vec((size_t)N * out, seed + 1);
    float *gW = random_vec((size_t)in * out, seed + 2), *gb = random_vec((size_t)out, seed + 3);
    double *A = dalloc((size_t)da * da), *G = dalloc((size_t)out * out);
    ref_factors(X, dY, N, in, out, A, G);

    model_kfac_layer *l = make(in, out);
    OK(model_kfac_update_factors(l, X, dY, N, 0.9f, &e_));
    OK(model_kfac_invert(l, damping, &e_));
    assert_int_equal(l->inversions, 1);

    /* the π split: λ_A λ_G = λ and λ_A / λ_G = π² */
    double ta = 0.0, tg = 0.0;
    for (int i = 0; i < da; i++) ta += A[i * da + i];
    for (int i = 0; i < out; i++) tg += G[i * out + i];
    double pi = sqrt((ta / da) / (tg / out));
    assert_true(fabs(l->damping_a - pi * sqrt(damping)) <= 1e-5 * pi * sqrt(damping));
    assert_true(fabs(l->damping_g - sqrt(damping) / pi) <= 1e-5 * sqrt(damping) / pi);

    for (int i = 0; i < da; i++) A[i * da + i] += l->damping_a;
    for (int i = 0; i < out; i++) G[i * out + i] += l->damping_g;
    double *Ai = dalloc((size_t)da * da), *Gi = dalloc((size_t)out * out);
    gj_inverse(A, da, Ai);
    gj_inverse(G, out, Gi);
    assert_rel(l->A_inv, Ai, (size_t)da * da, 1e-4);
    assert_rel(l->G_inv, Gi, (size_t)out * out, 1e-4);

    double *grad = dalloc((size_t)da * out), *tmp = dalloc((size_t)da * out);
    double *want = dalloc((size_t)da * out);
    for (int i = 0; i < in * out; i++) grad[i] = gW[i];
    for (int o = 0; o < out; o++) grad[in * out + o] = gb[o];
    matmul_d(Ai, grad, da, da, out, tmp);
    matmul_d(tmp, Gi, da, out, out, want);

    float *got = calloc((size_t)da * out, sizeof *got);
    assert_non_null(got);
    OK(model_kfac_precondition(l, gW, gb, got, got + (size_t)in * out, &e_));
    assert_rel(got, want, (size_t)da * out, 1e-4);
    /* in place gives the same bits */
    OK(model_kfac_precondition(l, gW, gb, gW, gb, &e_));
    assert_memory_equal(gW, got, (size_t)in * out * sizeof(float));
    assert_memory_equal(gb, got + (size_t)in * out, (size_t)out * sizeof(float));

    model_kfac_layer_free(l);
    free(X), free(dY), free(gW), free(gb), free(A), free(G), free(Ai), free(Gi);
    free(grad), free(tmp), free(want), free(got);
}

static void test_precondition_explicit(void **state) {
    (void)state;
    check_precondition(4, 3, 9, 0.1f, 11);
    check_precondition(6, 5, 13, 0.03f, 21);
    check_precondition(6, 5, 3, 0.5f, 31); /* rank-deficient factors, damping makes them PD */
    check_precondition(2, 7, 16, 1e-3f, 41);
}

/* With no damping and full-rank factors the result is exactly the Kronecker
 * form: vec(Δ) = (A ⊗ G)⁻¹ vec(∇) for the row-major vec that stacks ∇'s
 * rows (index i*out + o). A ⊗ G is built explicitly and inverted by
 * Gauss-Jordan. Tolerance 1e-3 relative: with λ = 0 the factors' condition
 * numbers multiply, so float storage costs more than in the damped test. */
static void test_precondition_kronecker(void **state) {
    (void)state;
    int in = 2, out = 3, N = 12, da = in + 1, n = da * out;
    float *X = random_vec((size_t)N * in, 51), *dY = random_vec((size_t)N * out, 52);
    float *g = random_vec((size_t)n, 53);
    double *A = dalloc((size_t)da * da), *G = dalloc((size_t)out * out);
    ref_factors(X, dY, N, in, out, A, G);
    double *K = dalloc((size_t)n * n), *Ki = dalloc((size_t)n * n), *v = dalloc((size_t)n);
    double *want = dalloc((size_t)n);
    for (int i = 0; i < da; i++)
        for (int o = 0; o < out; o++)
            for (int j = 0; j < da; j++)
                for (int p = 0; p < out; p++)
                    K[(i * out + o) * n + (j * out + p)] = A[i * da + j] * G[o * out + p];
    gj_inverse(K, n, Ki);
    for (int i = 0; i < n; i++) v[i] = g[i];
    matmul_d(Ki, v, n, n, 1, want);

    model_kfac_layer *l = make(in, out);
    OK(model_kfac_update_factors(l, X, dY, N, 0.5f, &e_));
    OK(model_kfac_invert(l, 0.0f, &e_));
    assert_true(l->damping_a == 0.0f && l->damping_g == 0.0f);
    float got[9];
    OK(model_kfac_precondition(l, g, g + in * out, got, got + in * out, &e_));
    assert_rel(got, want, (size_t)n, 1e-3);
    model_kfac_layer_free(l);
    free(X), free(dY), free(g), free(A), free(G), free(K), free(Ki), free(v), free(want);
}

static void test_not_positive_definite(void **state) {
    (void)state;
    vl_error err = {0};
    /* A from 3 samples of 5 inputs has rank <= 3 of 6 */
    int in = 5, out = 2, N = 3;
    float *X = random_vec((size_t)N * in, 61), *dY = random_vec((size_t)N * out, 62);
    model_kfac_layer *l = make(in, out);
    assert_int_equal(model_kfac_invert(l, 0.1f, &err), VL_EINVAL); /* nothing to invert */
    assert_non_null(strstr(err.msg, "no factor updates"));
    float g[12] = {0}, o[12];
    assert_int_equal(model_kfac_precondition(l, g, g + 10, o, o + 10, &err), VL_EINVAL);
    OK(model_kfac_update_factors(l, X, dY, N, 0.9f, &e_));
    OK(model_kfac_invert(l, 1.0f, &e_));
    float keep[36];
    memcpy(keep, l->A_inv, sizeof keep);
    float da = l->damping_a;
    err = (vl_error){0};
    assert_int_equal(model_kfac_invert(l, 0.0f, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "factor A"));
    assert_non_null(strstr(err.msg, "not positive definite"));
    assert_non_null(strstr(err.msg, "raise the damping"));
    /* the refused inversion changed nothing */
    assert_memory_equal(keep, l->A_inv, sizeof keep);
    assert_true(l->damping_a == da);
    assert_int_equal(l->inversions, 1);
    assert_int_equal(model_kfac_invert(l, -1.0f, &err), VL_EINVAL);
    assert_int_equal(model_kfac_invert(l, NAN, &err), VL_EINVAL);
    assert_int_equal(model_kfac_invert(l, INFINITY, &err), VL_EINVAL);
    model_kfac_layer_free(l);
    free(X), free(dY);

    /* G from 3 samples of 4 outputs has rank <= 3 of 4; A (2 x 2) is fine */
    in = 1, out = 4, N = 3;
    X = random_vec((size_t)N * in, 63), dY = random_vec((size_t)N * out, 64);
    l = make(in, out);
    OK(model_kfac_update_factors(l, X, dY, N, 0.9f, &e_));
    err = (vl_error){0};
    assert_int_equal(model_kfac_invert(l, 0.0f, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "factor G"));
    assert_int_equal(l->inversions, 0);
    OK(model_kfac_invert(l, 1e-2f, &e_));
    model_kfac_layer_free(l);
    free(X), free(dY);
}

/* ---- KL clipping ------------------------------------------------------------- */

static void test_kl_scale(void **state) {
    (void)state;
    /* Σ <nat, grad> = (1·3 + 2·4) + 1·5 = 16; lr 0.5 gives q = 4 */
    float g0[] = {1, 2}, n0[] = {3, 4}, g1[] = {1}, n1[] = {5};
    const float *g[] = {g0, g1}, *n[] = {n0, n1};
    size_t lens[] = {2, 1};
    assert_true(fabsf(model_kfac_kl_scale(g, n, lens, 2, 0.5f, 1.0f) - 0.5f) < 1e-7f);
    assert_true(fabsf(model_kfac_kl_scale(g, n, lens, 2, 0.5f, 0.01f) - 0.05f) < 1e-7f);
    assert_true(fabsf(model_kfac_kl_scale(g, n, lens, 2, 1.0f, 4.0f) - 0.5f) < 1e-7f);
    /* at or below the clip: 1 */
    assert_true(model_kfac_kl_scale(g, n, lens, 2, 0.5f, 4.0f) == 1.0f);
    assert_true(model_kfac_kl_scale(g, n, lens, 2, 0.5f, 100.0f) == 1.0f);
    /* clipping off or nothing to clip: 1 */
    assert_true(model_kfac_kl_scale(g, n, lens, 2, 0.5f, 0.0f) == 1.0f);
    assert_true(model_kfac_kl_scale(g, n, lens, 2, 0.5f, -1.0f) == 1.0f);
    assert_true(model_kfac_kl_scale(g, n, lens, 2, 0.5f, NAN) == 1.0f);
    assert_true(model_kfac_kl_scale(g, n, lens, 2, 0.5f, INFINITY) == 1.0f);
    assert_true(model_kfac_kl_scale(g, n, lens, 0, 0.5f, 1.0f) == 1.0f);
    assert_true(model_kfac_kl_scale(g, n, lens, 2, 0.0f, 1.0f) == 1.0f);
    float z[] = {0, 0}, neg[] = {-3, -4};
    const float *gz[] = {z, z}, *nneg[] = {neg, n1};
    assert_true(model_kfac_kl_scale(gz, n, lens, 2, 0.5f, 1.0f) == 1.0f);   /* zero step */
    assert_true(model_kfac_kl_scale(g, nneg, lens, 2, 0.5f, 1.0f) == 1.0f); /* -11 + 5 < 0 */
    /* non-finite: no step */
    float gn[] = {1, NAN}, gi[] = {INFINITY, 0};
    const float *gnan[] = {gn, g1}, *ginf[] = {gi, g1};
    assert_true(model_kfac_kl_scale(gnan, n, lens, 2, 0.5f, 1.0f) == 0.0f);
    assert_true(model_kfac_kl_scale(ginf, n, lens, 2, 0.5f, 1.0f) == 0.0f);
    assert_true(model_kfac_kl_scale(g, n, lens, 2, NAN, 1.0f) == 0.0f);
    assert_true(model_kfac_kl_scale(g, n, lens, 2, INFINITY, 1.0f) == 0.0f);
    assert_true(model_kfac_kl_scale(NULL, n, lens, 2, 0.5f, 1.0f) == 0.0f);
    const float *gmiss[] = {g0, NULL};
    assert_true(model_kfac_kl_scale(gmiss, n, lens, 2, 0.5f, 1.0f) == 0.0f);
}

/* ---- averaging --------------------------------------------------------------- */

static void test_average(void **state) {
    (void)state;
    int in = 3, out = 4, da = in + 1;
    model_kfac_layer *s[3];
    for (int k = 0; k < 3; k++) {
        int N = 5 + k;
        float *X = random_vec((size_t)N * in, 70 + k), *dY = random_vec((size_t)N * out, 80 + k);
        s[k] = make(in, out);
        for (int u = 0; u <= k; u++) OK(model_kfac_update_factors(s[k], X, dY, N, 0.9f, &e_));
        free(X), free(dY);
    }
    double w[] = {1.0, 2.0, 0.5}, wsum = 3.5;
    double *A = dalloc((size_t)da * da), *G = dalloc((size_t)out * out);
    for (int e = 0; e < da * da; e++)
        A[e] = (w[0] * s[0]->A[e] + w[1] * s[1]->A[e] + w[2] * s[2]->A[e]) / wsum;
    for (int e = 0; e < out * out; e++)
        G[e] = (w[0] * s[0]->G[e] + w[1] * s[1]->G[e] + w[2] * s[2]->G[e]) / wsum;
    const model_kfac_layer *src[] = {s[0], s[1], s[2]};

    model_kfac_layer *d = make(in, out);
    OK(model_kfac_average(d, src, w, 3, &e_));
    assert_rel(d->A, A, (size_t)da * da, 1e-6);
    assert_rel(d->G, G, (size_t)out * out, 1e-6);
    assert_int_equal(d->updates, 3);
    /* the destination may be a source */
    OK(model_kfac_average(s[1], src, w, 3, &e_));
    assert_memory_equal(s[1]->A, d->A, (size_t)da * da * sizeof(float));
    assert_memory_equal(s[1]->G, d->G, (size_t)out * out * sizeof(float));
    /* the average is a valid factor: it inverts */
    OK(model_kfac_invert(d, 1e-3f, &e_));

    vl_error err = {0};
    float keep[16];
    memcpy(keep, d->A, sizeof keep);
    model_kfac_layer *other = make(in, out + 1), *empty = make(in, out);
    const model_kfac_layer *mixed[] = {s[0], other}, *with_empty[] = {s[0], empty};
    double w2[] = {1.0, 1.0}, wneg[] = {1.0, -0.5}, wzero[] = {0.0, 0.0}, wnan[] = {1.0, NAN};
    assert_int_equal(model_kfac_average(d, mixed, w2, 2, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "3 x 5"));
    assert_int_equal(model_kfac_average(other, src, w, 3, &err), VL_EINVAL);
    assert_int_equal(model_kfac_average(d, with_empty, w2, 2, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "no factor updates"));
    assert_int_equal(model_kfac_average(d, src, wneg, 2, &err), VL_EINVAL);
    assert_int_equal(model_kfac_average(d, src, wzero, 2, &err), VL_EINVAL);
    assert_int_equal(model_kfac_average(d, src, wnan, 2, &err), VL_EINVAL);
    assert_int_equal(model_kfac_average(d, src, w, 0, &err), VL_EINVAL);
    assert_int_equal(model_kfac_average(d, NULL, w, 1, &err), VL_EINVAL);
    assert_memory_equal(keep, d->A, sizeof keep);

    for (int k = 0; k < 3; k++) model_kfac_layer_free(s[k]);
    model_kfac_layer_free(d);
    model_kfac_layer_free(other);
    model_kfac_layer_free(empty);
    free(A), free(G);
}

/* ---- K-FAC on the MLP ----------------------------------------------------------- */

/* A small full-batch problem: D 10, one hidden layer of 16, C 4, N 64
 * samples of near-IID synthetic data. */
#define TR_N 64
#define TR_STEPS 30
#define TR_INVERT_EVERY 5

typedef struct trainer {
    model_mlp *m;
    const model_tensor *t;
    int width[3];
    float x[TR_N * 10];
    int y[TR_N];
    float h[TR_N * 16]; /* the second layer's input */
    float dy0[TR_N * 16], dy1[TR_N * 4];
    float g[16 * 16 + 16]; /* one layer's saved gradient */
} trainer;

static void trainer_init(trainer *tr) {
    model_mlp_config c = {.in_dim = 10, .n_hidden = 1, .hidden = {16}, .n_classes = 4};
    model_fed_synth_config d = model_fed_synth_config_default();
    d.dim = 10, d.n_classes = 4, d.alpha = 1000.0f, d.noise = 1.5f, d.seed = 9;
    OK(model_fed_synth_peer(&d, 0, 0, TR_N, tr->x, tr->y, &e_));
    OK(model_mlp_create(&c, &tr->m, &e_));
    model_mlp_init_weights(tr->m, 5);
    assert_int_equal(model_mlp_tensors(tr->m, &tr->t), 4);
    tr->width[0] = 10, tr->width[1] = 16, tr->width[2] = 4;
}

/* Per-example output gradients for the Fisher, with labels sampled from
 * the model's own predictions (the true Fisher, as K-FAC prescribes): a
 * batch-of-one backward leaves example i's own loss gradient g_i in each
 * bias gradient, and dY_i = g_i / N is the mean-loss gradient
 * model_kfac_update_factors expects. The MLP's own backward does the work,
 * so nothing here re-derives it. */
static void fisher_batch(trainer *tr, vl_rng *r) {
    model_mlp *m = tr->m;
    OK(model_mlp_forward(m, tr->x, NULL, TR_N, NULL, &e_));
    const float *probs = model_mlp_probs(m);
    int yhat[TR_N];
    for (int i = 0; i < TR_N; i++) {
        float u = vl_rng_uniform(r), acc = 0.0f;
        yhat[i] = 3;
        for (int k = 0; k < 4; k++) {
            acc += probs[i * 4 + k];
            if (u < acc) {
                yhat[i] = k;
                break;
            }
        }
    }
    const float *P = model_mlp_params(m), *G = model_mlp_grads(m);
    kernels_matmul_forward(tr->h, tr->x, P + tr->t[0].offset, P + tr->t[1].offset, TR_N, 10, 16);
    kernels_gelu_forward(tr->h, tr->h, (size_t)TR_N * 16);
    for (int i = 0; i < TR_N; i++) {
        model_mlp_zero_grad(m);
        OK(model_mlp_forward(m, tr->x + i * 10, &yhat[i], 1, NULL, &e_));
        OK(model_mlp_backward(m, &e_));
        for (int o = 0; o < 16; o++) tr->dy0[i * 16 + o] = G[tr->t[1].offset + o] / TR_N;
        for (int o = 0; o < 4; o++) tr->dy1[i * 4 + o] = G[tr->t[3].offset + o] / TR_N;
    }
}

/* Trains TR_STEPS full-batch steps at learning rate lr, plain SGD or K-FAC
 * (factors every step, ρ 0.9, inverses every TR_INVERT_EVERY steps with
 * damping λ, KL clip kl_clip), and returns the final loss; *first gets the
 * initial one. */
static double train(int kfac, float lr, float damping, float kl_clip, double *first) {
    trainer *tr = calloc(1, sizeof *tr);
    assert_non_null(tr);
    trainer_init(tr);
    model_mlp *m = tr->m;
    size_t np = model_mlp_num_params(m);
    float *grad = malloc(np * sizeof *grad), *nat = malloc(np * sizeof *nat);
    assert_non_null(grad);
    assert_non_null(nat);
    model_kfac_layer *layer[2] = {make(10, 16), make(16, 4)};
    vl_rng r;
    vl_rng_seed(&r, 77);
    float loss = 0.0f;
    for (int step = 0; step < TR_STEPS; step++) {
        model_mlp_zero_grad(m);
        OK(model_mlp_forward(m, tr->x, tr->y, TR_N, &loss, &e_));
        OK(model_mlp_backward(m, &e_));
        if (step == 0) *first = loss;
        memcpy(grad, model_mlp_grads(m), np * sizeof *grad);
        float scale = 1.0f;
        if (kfac) {
            fisher_batch(tr, &r);
            OK(model_kfac_update_factors(layer[0], tr->x, tr->dy0, TR_N, 0.9f, &e_));
            OK(model_kfac_update_factors(layer[1], tr->h, tr->dy1, TR_N, 0.9f, &e_));
            for (int l = 0; l < 2; l++) {
                if (step % TR_INVERT_EVERY == 0) OK(model_kfac_invert(layer[l], damping, &e_));
                const model_tensor *w = &tr->t[2 * l], *b = &tr->t[2 * l + 1];
                OK(model_kfac_precondition(layer[l], grad + w->offset, grad + b->offset,
                                           nat + w->offset, nat + b->offset, &e_));
            }
            const float *gs[] = {grad}, *ns[] = {nat};
            scale = model_kfac_kl_scale(gs, ns, &np, 1, lr, kl_clip);
            assert_true(scale > 0.0f && scale <= 1.0f);
        } else {
            memcpy(nat, grad, np * sizeof *nat);
        }
        float *p = model_mlp_params(m);
        for (size_t i = 0; i < np; i++) p[i] -= lr * scale * nat[i];
    }
    double final_loss = 0.0;
    OK(model_mlp_evaluate(m, tr->x, tr->y, TR_N, &final_loss, NULL, &e_));
    model_kfac_layer_free(layer[0]);
    model_kfac_layer_free(layer[1]);
    model_mlp_free(m);
    free(grad), free(nat), free(tr);
    return final_loss;
}

static void test_mlp_kfac_vs_sgd(void **state) {
    (void)state;
    double first_sgd = 0.0, first_kfac = 0.0;
    float lr = 0.1f;
    double sgd = train(0, lr, 0.0f, 0.0f, &first_sgd);
    double kfac = train(1, lr, 1e-2f, 1e-2f, &first_kfac);
    printf("mlp, %d full-batch steps at lr %g: loss %.4f -> SGD %.4f, K-FAC %.4f\n", TR_STEPS,
           (double)lr, first_sgd, sgd, kfac);
    assert_true(first_sgd == first_kfac);
    assert_true(isfinite(kfac));
    assert_true(kfac < first_kfac);
    assert_true(kfac <= sgd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_factors_one_batch),
        cmocka_unit_test(test_factors_moving_average),
        cmocka_unit_test(test_update_refusals),
        cmocka_unit_test(test_precondition_explicit),
        cmocka_unit_test(test_precondition_kronecker),
        cmocka_unit_test(test_not_positive_definite),
        cmocka_unit_test(test_kl_scale),
        cmocka_unit_test(test_average),
        cmocka_unit_test(test_mlp_kfac_vs_sgd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
