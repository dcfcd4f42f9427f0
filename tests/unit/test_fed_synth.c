/*
 * Unit tests for the synthetic federated classification data (the runs'
 * default when peers bring no images): determinism per sample index,
 * label ranges, the Dirichlet sampler's moments, label skew at small
 * alpha and near-uniformity at large alpha, the balanced validation set,
 * refusal of bad configurations, and that an MLP can learn the task.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/common.h"
#include "model/model.h"
#include "tests/unit/mlp_fixtures.h"
#include "tests/unit/test_util.h"

static void expect_bad_fed(model_fed_synth_config c, const char *needle) {
    vl_error err = {0};
    float x[64];
    int y[2];
    double p[64];
    assert_int_equal(model_fed_synth_config_validate(&c, &err), VL_EINVAL);
    if (strstr(err.msg, needle) == NULL)
        fail_msg("message \"%s\" does not name \"%s\"", err.msg, needle);
    assert_int_equal(model_fed_synth_peer(&c, 0, 0, 1, x, y, &err), VL_EINVAL);
    assert_int_equal(model_fed_synth_validation(&c, 0, 1, x, y, &err), VL_EINVAL);
    assert_int_equal(model_fed_synth_label_dist(&c, 0, p, &err), VL_EINVAL);
}

static void test_fed_config(void **state) {
    (void)state;
    model_fed_synth_config d = model_fed_synth_config_default();
    OK(model_fed_synth_config_validate(&d, &e_));
    model_fed_synth_config bad[12];
    const char *field[12] = {"dim",   "n_classes",  "modes",      "modes", "alpha", "alpha",
                             "alpha", "separation", "separation", "noise", "noise", "limit"};
    for (int i = 0; i < 12; i++) bad[i] = d;
    bad[0].dim = 0, bad[1].n_classes = 1, bad[2].modes = 0;
    bad[3].modes = MODEL_FED_MAX_MODES + 1, bad[4].alpha = 0.0f, bad[5].alpha = NAN;
    bad[6].alpha = 1e7f, bad[7].separation = 0.0f, bad[8].separation = INFINITY;
    bad[9].noise = -1.0f, bad[10].noise = NAN;
    bad[11].dim = 1 << 16, bad[11].n_classes = 1 << 12; /* 2^28 centre floats */
    for (int i = 0; i < 12; i++) expect_bad_fed(bad[i], field[i]);

    vl_error err = {0};
    float x[32];
    int y[1];
    double p[10];
    assert_int_equal(model_fed_synth_config_validate(NULL, &err), VL_EINVAL);
    assert_int_equal(model_fed_synth_peer(&d, -1, 0, 1, x, y, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "peer"));
    assert_int_equal(model_fed_synth_label_dist(&d, 0, NULL, &err), VL_EINVAL);
    assert_int_equal(model_fed_synth_label_dist(&d, MODEL_FED_MAX_PEER + 1, p, &err), VL_EINVAL);
    assert_int_equal(model_fed_synth_peer(&d, 0, 0, 0, x, y, &err), VL_EINVAL);
    assert_int_equal(model_fed_synth_peer(&d, 0, 0, 1, NULL, y, &err), VL_EINVAL);
    assert_int_equal(model_fed_synth_peer(&d, 0, 0, 1, x, NULL, &err), VL_EINVAL);
    assert_int_equal(model_fed_synth_peer(&d, 0, UINT64_MAX, 1, x, y, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "range"));
    assert_int_equal(model_fed_synth_validation(&d, (uint64_t)1 << 62, 1, x, y, &err), VL_EINVAL);
    assert_int_equal(model_fed_synth_validation(&d, 0, -3, x, y, &err), VL_EINVAL);
}

static void test_fed_deterministic(void **state) {
    (void)state;
    model_fed_synth_config c = model_fed_synth_config_default();
    c.dim = 7, c.n_classes = 5, c.modes = 3;
    int n = 100, D = 7;
    float *x1 = malloc((size_t)n * D * sizeof(float)), *x2 = malloc((size_t)n * D * sizeof(float));
    int y1[100], y2[100];
    assert_non_null(x1);
    assert_non_null(x2);
    OK(model_fed_synth_peer(&c, 3, 1000, n, x1, y1, &e_));
    OK(model_fed_synth_peer(&c, 3, 1000, n, x2, y2, &e_));
    assert_memory_equal(x1, x2, (size_t)n * D * sizeof(float));
    assert_memory_equal(y1, y2, sizeof y1);
    /* Sample i depends only on (seed, peer, i): two pieces make the whole. */
    OK(model_fed_synth_peer(&c, 3, 1000, 37, x2, y2, &e_));
    OK(model_fed_synth_peer(&c, 3, 1037, n - 37, x2 + 37 * D, y2 + 37, &e_));
    assert_memory_equal(x1, x2, (size_t)n * D * sizeof(float));
    assert_memory_equal(y1, y2, sizeof y1);
    for (int i = 0; i < n; i++) assert_true(y1[i] >= 0 && y1[i] < 5);
    /* Another peer, another seed, the validation stream: all different. */
    OK(model_fed_synth_peer(&c, 4, 1000, n, x2, y2, &e_));
    assert_memory_not_equal(x1, x2, (size_t)n * D * sizeof(float));
    OK(model_fed_synth_validation(&c, 1000, n, x2, y2, &e_));
    assert_memory_not_equal(x1, x2, (size_t)n * D * sizeof(float));
    model_fed_synth_config c2 = c;
    c2.seed = 2;
    OK(model_fed_synth_peer(&c2, 3, 1000, n, x2, y2, &e_));
    assert_memory_not_equal(x1, x2, (size_t)n * D * sizeof(float));
    /* The validation stream is index-addressable too. */
    OK(model_fed_synth_validation(&c, 0, n, x1, y1, &e_));
    OK(model_fed_synth_validation(&c, 50, n - 50, x2, y2, &e_));
    assert_memory_equal(x1 + 50 * D, x2, (size_t)(n - 50) * D * sizeof(float));
    assert_memory_equal(y1 + 50, y2, (size_t)(n - 50) * sizeof(int));
    free(x1);
    free(x2);
}

/* Dirichlet(alpha) on C classes has E[p_k] = 1/C and
 * Var[p_k] = (1/C)(1 - 1/C)/(C alpha + 1); checks both Gamma branches
 * (alpha < 1 with the boost, alpha >= 1 direct) over many peers. */
static void test_fed_dirichlet_moments(void **state) {
    (void)state;
    const float alphas[] = {0.3f, 2.5f};
    for (int a = 0; a < 2; a++) {
        model_fed_synth_config c = model_fed_synth_config_default();
        c.n_classes = 4, c.alpha = alphas[a];
        int peers = 20000;
        double s = 0, ss = 0;
        for (int p = 0; p < peers; p++) {
            double pi[4];
            OK(model_fed_synth_label_dist(&c, p, pi, &e_));
            assert_near(pi[0] + pi[1] + pi[2] + pi[3], 1.0, 1e-12);
            for (int k = 0; k < 4; k++) {
                s += pi[k];
                ss += pi[k] * pi[k];
            }
        }
        double n = 4.0 * peers, mean = s / n, var = ss / n - mean * mean;
        double want = 0.25 * 0.75 / (4.0 * alphas[a] + 1.0);
        assert_near(mean, 0.25, 1e-9); /* rows sum to 1 */
        /* Over 20000 peers the sample variance has a standard error of
         * about 1 %; 5 % still fails a sampler with the wrong shape (a
         * missing alpha < 1 boost is off by a factor of 3). */
        assert_near(var, want, 0.05 * want);
    }
    /* A tiny alpha cannot underflow to an all-zero vector. */
    model_fed_synth_config c = model_fed_synth_config_default();
    c.alpha = MODEL_FED_MIN_ALPHA;
    double pi[10], sum = 0;
    OK(model_fed_synth_label_dist(&c, 9, pi, &e_));
    for (int k = 0; k < 10; k++) {
        assert_true(isfinite(pi[k]) && pi[k] >= 0);
        sum += pi[k];
    }
    assert_near(sum, 1.0, 1e-12);
}

/* Per-peer label histograms: share of the most common class, and which
 * class it is. */
static void histograms(const model_fed_synth_config *c, int peers, int n, double *max_share,
                       int *dominant) {
    float *x = malloc((size_t)n * c->dim * sizeof(float));
    int *y = malloc((size_t)n * sizeof(int));
    int *h = calloc((size_t)c->n_classes, sizeof(int));
    double *pi = malloc((size_t)c->n_classes * sizeof(double));
    assert_true(x && y && h && pi);
    for (int p = 0; p < peers; p++) {
        OK(model_fed_synth_peer(c, p, 0, n, x, y, &e_));
        OK(model_fed_synth_label_dist(c, p, pi, &e_));
        memset(h, 0, (size_t)c->n_classes * sizeof(int));
        for (int i = 0; i < n; i++) {
            assert_true(y[i] >= 0 && y[i] < c->n_classes);
            h[y[i]]++;
        }
        int best = 0;
        for (int k = 0; k < c->n_classes; k++) {
            /* The histogram follows the peer's distribution (binomial std
             * <= 0.5/sqrt(n) ~ 0.011; 0.05 is > 4 of those). */
            assert_near((double)h[k] / n, pi[k], 0.05);
            best = h[k] > h[best] ? k : best;
        }
        max_share[p] = (double)h[best] / n;
        dominant[p] = best;
    }
    free(x), free(y), free(h), free(pi);
}

static void test_fed_label_skew(void **state) {
    (void)state;
    enum { PEERS = 20, N = 2000 };
    double share[PEERS];
    int dom[PEERS];
    model_fed_synth_config c = model_fed_synth_config_default();
    c.dim = 4, c.n_classes = 10;

    c.alpha = 0.1f;
    histograms(&c, PEERS, N, share, dom);
    int skewed = 0, seen[10] = {0}, distinct = 0;
    for (int p = 0; p < PEERS; p++) {
        skewed += share[p] > 0.5;
        distinct += !seen[dom[p]];
        seen[dom[p]] = 1;
    }
    /* Dirichlet(0.1 x 10): P(largest share > 1/2) is about 2/3. */
    if (skewed < PEERS / 2)
        fail_msg("alpha 0.1: only %d of %d peers have a class over 50 %%", skewed, PEERS);
    if (distinct < 5)
        fail_msg("alpha 0.1: the peers' dominant classes cover only %d classes", distinct);

    c.alpha = 100.0f;
    histograms(&c, PEERS, N, share, dom);
    for (int p = 0; p < PEERS; p++)
        if (!(share[p] < 2.0 / c.n_classes))
            fail_msg("alpha 100: peer %d has a class at %.3f", p, share[p]);
}

static void test_fed_validation_balanced(void **state) {
    (void)state;
    model_fed_synth_config c = model_fed_synth_config_default();
    c.alpha = 0.05f; /* irrelevant to the validation set */
    int n = 1003, C = c.n_classes;
    float *x = malloc((size_t)n * c.dim * sizeof(float));
    int *y = malloc((size_t)n * sizeof(int));
    assert_true(x && y);
    OK(model_fed_synth_validation(&c, 17, n, x, y, &e_));
    int h[10] = {0};
    for (int i = 0; i < n; i++) {
        assert_true(y[i] >= 0 && y[i] < C);
        h[y[i]]++;
    }
    for (int k = 0; k < C; k++)
        if (h[k] < n / C || h[k] > n / C + 1)
            fail_msg("validation class %d has %d of %d samples", k, h[k], n);
    free(x);
    free(y);
}

/* An MLP trained on near-IID peer data reaches high accuracy on the
 * validation set, so the generator produces a learnable task whose classes
 * are the same for peers and validation (mislabelled validation data would
 * score about 1/C). Three modes per class, 12 centres in 4 dimensions, so
 * the boundary is not linear. */
static void test_fed_learnable(void **state) {
    (void)state;
    model_fed_synth_config fc = model_fed_synth_config_default();
    fc.dim = 4, fc.n_classes = 4, fc.modes = 3, fc.alpha = 100.0f, fc.noise = 0.3f;
    model_mlp_config c = {.in_dim = 4, .n_hidden = 1, .hidden = {32}, .n_classes = 4};
    model_mlp *m = mlp_make(c, 3);
    int B = 32, steps = 600, nv = 1000;
    float *x = malloc((size_t)B * 4 * sizeof(float)), *xv = malloc((size_t)nv * 4 * sizeof(float));
    int y[32], *yv = malloc((size_t)nv * sizeof(int));
    assert_true(x && xv && yv);
    for (int s = 0; s < steps; s++) {
        OK(model_fed_synth_peer(&fc, 0, (uint64_t)s * B, B, x, y, &e_));
        float loss;
        model_mlp_zero_grad(m);
        OK(model_mlp_forward(m, x, y, B, &loss, &e_));
        OK(model_mlp_backward(m, &e_));
        mlp_sgd_step(m, 0.2f);
    }
    OK(model_fed_synth_validation(&fc, 0, nv, xv, yv, &e_));
    double loss, acc;
    OK(model_mlp_evaluate(m, xv, yv, nv, &loss, &acc, &e_));
    /* 0.966 here; the overlap of the noisy modes keeps it below 1. */
    if (!(acc > 0.9))
        fail_msg("validation accuracy %.3f (loss %.3f) after %d steps", acc, loss, steps);
    free(x), free(xv), free(yv);
    model_mlp_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fed_config),
        cmocka_unit_test(test_fed_deterministic),
        cmocka_unit_test(test_fed_dirichlet_moments),
        cmocka_unit_test(test_fed_label_skew),
        cmocka_unit_test(test_fed_validation_balanced),
        cmocka_unit_test(test_fed_learnable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
