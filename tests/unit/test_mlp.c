/*
 * Unit tests for the MLP classifier: the forward pass against a naive
 * double-precision reference, every gradient against central finite
 * differences of that reference, the loss at initialisation, overfitting
 * a batch with plain SGD, reproducibility, activation re-planning,
 * evaluation in chunks. The synthetic federated data it trains on in the
 * runs are tested in test_fed_synth.c.
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
#include "model/model.h"
#include "tests/unit/mlp_fixtures.h"
#include "tests/unit/test_util.h"

/* The small odd shape the exact checks use: D 5, hidden {7, 3}, C 4. */
static model_mlp_config small_config(void) {
    model_mlp_config c = {.in_dim = 5, .n_hidden = 2, .hidden = {7, 3}, .n_classes = 4};
    return c;
}

/* Perturbs every parameter, biases included, so no gradient is trivially
 * zero and the GELUs see both signs. */
static void randomise(model_mlp *m, uint64_t seed) {
    vl_rng r;
    vl_rng_seed(&r, seed);
    float *p = model_mlp_params(m);
    for (size_t i = 0; i < model_mlp_num_params(m); i++) p[i] = 0.8f * vl_rng_normal(&r);
}

static void random_labels(int *y, int n, int C, uint64_t seed) {
    vl_rng r;
    vl_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) y[i] = (int)vl_rng_below(&r, (uint32_t)C);
}

/* ---- the naive reference ------------------------------------------------ */

static double gelu_ref(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

/* Mean cross-entropy of the MLP with parameters p (double, the model's flat
 * layout: per layer W[in,out] then b[out]) on x[B,D], y[B], in double with
 * plain loops. logits and probs ([B,C]) may be NULL. */
static double ref_forward(const model_mlp_config *c, const double *p, const float *x, const int *y,
                          int B, double *logits, double *probs) {
    int width[MODEL_MLP_MAX_HIDDEN + 2];
    width[0] = c->in_dim;
    for (int l = 0; l < c->n_hidden; l++) width[l + 1] = c->hidden[l];
    width[c->n_hidden + 1] = c->n_classes;
    double loss = 0.0;
    double cur[64], next[64];
    for (int b = 0; b < B; b++) {
        for (int j = 0; j < width[0]; j++) cur[j] = x[b * width[0] + j];
        const double *q = p;
        for (int l = 0; l <= c->n_hidden; l++) {
            int in = width[l], out = width[l + 1];
            assert_true(in <= 64 && out <= 64);
            const double *W = q, *bias = q + in * out;
            for (int o = 0; o < out; o++) {
                double s = bias[o];
                for (int i = 0; i < in; i++) s += cur[i] * W[i * out + o];
                next[o] = l < c->n_hidden ? gelu_ref(s) : s;
            }
            memcpy(cur, next, (size_t)out * sizeof(double));
            q += in * out + out;
        }
        int C = c->n_classes;
        double mx = cur[0];
        for (int k = 1; k < C; k++) mx = cur[k] > mx ? cur[k] : mx;
        double z = 0.0;
        for (int k = 0; k < C; k++) z += exp(cur[k] - mx);
        for (int k = 0; k < C; k++) {
            if (logits) logits[b * C + k] = cur[k];
            if (probs) probs[b * C + k] = exp(cur[k] - mx) / z;
        }
        if (y) loss += mx + log(z) - cur[y[b]];
    }
    return loss / B;
}

static double *params_double(model_mlp *m) {
    size_t n = model_mlp_num_params(m);
    double *d = malloc(n * sizeof *d);
    assert_non_null(d);
    for (size_t i = 0; i < n; i++) d[i] = model_mlp_params(m)[i];
    return d;
}

/* ---- configuration and table ---------------------------------------------- */

static void expect_bad(model_mlp_config c, const char *needle) {
    vl_error err = {0};
    assert_int_equal(model_mlp_config_validate(&c, &err), VL_EINVAL);
    if (strstr(err.msg, needle) == NULL)
        fail_msg("message \"%s\" does not name \"%s\"", err.msg, needle);
    model_mlp *m = (model_mlp *)&err;
    assert_int_equal(model_mlp_create(&c, &m, &err), VL_EINVAL);
    assert_null(m);
}

static void test_config_validate(void **state) {
    (void)state;
    vl_error err = {0};
    model_mlp_config c = small_config();
    OK(model_mlp_config_validate(&c, &e_));
    model_mlp_config bad[6];
    const char *field[6] = {"n_hidden",  "n_hidden",  "in_dim",
                            "n_classes", "hidden[1]", "hidden[0]"};
    for (int i = 0; i < 6; i++) bad[i] = c;
    bad[0].n_hidden = 0, bad[1].n_hidden = MODEL_MLP_MAX_HIDDEN + 1, bad[2].in_dim = 0;
    bad[3].n_classes = 1, bad[4].hidden[1] = 0, bad[5].hidden[0] = MODEL_MLP_MAX_WIDTH + 1;
    for (int i = 0; i < 6; i++) expect_bad(bad[i], field[i]);
    /* 4 layers of 2^16 x 2^16: every width allowed, the total is not */
    c = (model_mlp_config){.in_dim = 1 << 16,
                           .n_hidden = 4,
                           .hidden = {1 << 16, 1 << 16, 1 << 16, 1 << 16},
                           .n_classes = 2};
    expect_bad(c, "parameters");
    assert_int_equal(model_mlp_config_validate(NULL, &err), VL_EINVAL);
    assert_int_equal(model_mlp_create(&c, NULL, &err), VL_EINVAL);
}

static void test_tensor_table(void **state) {
    (void)state;
    model_mlp_config c = small_config();
    model_mlp *m = mlp_make(c, 1);
    const model_tensor *t;
    int n = model_mlp_tensors(m, &t);
    assert_int_equal(n, 6);
    const size_t shapes[6][2] = {{5, 7}, {7, 0}, {7, 3}, {3, 0}, {3, 4}, {4, 0}};
    const char *names[6] = {"fc.0.weight", "fc.0.bias",   "fc.1.weight",
                            "fc.1.bias",   "fc.2.weight", "fc.2.bias"};
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        assert_string_equal(t[i].name, names[i]);
        assert_int_equal(t[i].ndim, i % 2 ? 1 : 2);
        assert_int_equal(t[i].shape[0], shapes[i][0]);
        assert_int_equal(t[i].shape[1], shapes[i][1]);
        assert_int_equal(t[i].offset, off);
        off += t[i].numel;
    }
    assert_int_equal(off, model_mlp_num_params(m));
    assert_int_equal(off, 5 * 7 + 7 + 7 * 3 + 3 + 3 * 4 + 4);
    model_mlp_config got = model_mlp_config_get(m);
    assert_memory_equal(&got, &c, sizeof c);
    /* gradients exist from the start and are zero */
    const float *g = model_mlp_grads(m);
    assert_non_null(g);
    for (size_t i = 0; i < off; i++) assert_true(g[i] == 0.0f);
    assert_null(model_mlp_logits(m));
    assert_null(model_mlp_probs(m));
    model_mlp_free(m);
    model_mlp_free(NULL);
}

/* ---- forward -------------------------------------------------------------- */

static void test_forward_matches_reference(void **state) {
    (void)state;
    model_mlp_config c = small_config();
    model_mlp *m = mlp_make(c, 3);
    randomise(m, 4);
    int B = 3, C = c.n_classes;
    float *x = random_vec((size_t)B * c.in_dim, 5);
    int y[3];
    random_labels(y, B, C, 6);
    double *p = params_double(m);
    double lg[12], pr[12];
    double want = ref_forward(&c, p, x, y, B, lg, pr);
    float loss = -1;
    OK(model_mlp_forward(m, x, y, B, &loss, &e_));
    /* Float against double through three small layers: agreement to a few
     * float ulps of the values involved (they are O(1)). */
    assert_near(loss, want, 1e-5 * (1 + fabs(want)));
    const float *logits = model_mlp_logits(m), *probs = model_mlp_probs(m);
    assert_non_null(logits);
    assert_non_null(probs);
    for (int i = 0; i < B * C; i++) {
        assert_near(logits[i], lg[i], 1e-5 * (1 + fabs(lg[i])));
        assert_near(probs[i], pr[i], 1e-6);
    }
    /* Inference: the same outputs without labels; no loss needed. */
    OK(model_mlp_forward(m, x, NULL, B, NULL, &e_));
    for (int i = 0; i < B * C; i++) assert_near(model_mlp_probs(m)[i], pr[i], 1e-6);
    free(p);
    free(x);
    model_mlp_free(m);
}

static void test_init_loss_is_uniform(void **state) {
    (void)state;
    model_mlp_config c = {.in_dim = 20, .n_hidden = 2, .hidden = {64, 32}, .n_classes = 10};
    model_mlp *m = mlp_make(c, 42);
    int B = 128;
    float *x = random_vec((size_t)B * c.in_dim, 7);
    int *y = malloc((size_t)B * sizeof *y);
    assert_non_null(y);
    random_labels(y, B, c.n_classes, 8);
    float loss;
    OK(model_mlp_forward(m, x, y, B, &loss, &e_));
    /* Output weights of std 0.1/sqrt(fan_in) give logits of std ~0.1:
     * the loss sits within about var/2 (+ sampling noise of the labels)
     * of ln C. 0.03 is a few times that. */
    assert_near(loss, log(10.0), 0.03);
    free(x);
    free(y);
    model_mlp_free(m);
}

/* ---- gradient ------------------------------------------------------------- */

static void test_gradient_finite_differences(void **state) {
    (void)state;
    model_mlp_config c = small_config();
    model_mlp *m = mlp_make(c, 11);
    randomise(m, 12);
    int B = 3;
    float *x = random_vec((size_t)B * c.in_dim, 13);
    int y[3];
    random_labels(y, B, c.n_classes, 14);
    float loss;
    model_mlp_zero_grad(m);
    OK(model_mlp_forward(m, x, y, B, &loss, &e_));
    OK(model_mlp_backward(m, &e_));
    const float *g = model_mlp_grads(m);
    /* Central differences of the double reference at the model's float
     * parameters: truncation error ~h^2 = 1e-10 and rounding ~1e-16/h, so
     * the numerical gradient is exact to ~1e-9 and any real discrepancy is
     * the analytic gradient's. That one is float arithmetic on O(1) values,
     * good to ~1e-6 (here ~2e-7): the tolerances below (relative 1e-5 per
     * tensor, 2e-6 per element) leave a margin of ten and are far below the
     * O(1) relative error of a wrong term. */
    const double h = 1e-5;
    double *p = params_double(m);
    const model_tensor *t;
    int nt = model_mlp_tensors(m, &t);
    for (int i = 0; i < nt; i++) {
        double dd = 0, nn = 0, worst = 0;
        for (size_t k = t[i].offset; k < t[i].offset + t[i].numel; k++) {
            double saved = p[k];
            p[k] = saved + h;
            double lp = ref_forward(&c, p, x, y, B, NULL, NULL);
            p[k] = saved - h;
            double lm = ref_forward(&c, p, x, y, B, NULL, NULL);
            p[k] = saved;
            double num = (lp - lm) / (2 * h);
            double d = fabs(num - g[k]);
            dd += d * d;
            nn += num * num;
            worst = d > worst ? d : worst;
        }
        double rel = sqrt(dd) / (sqrt(nn) + 1e-30);
        if (rel > 1e-5 || worst > 2e-6)
            fail_msg("gradient of %s off: relative %.3g, worst element %.3g (|num| %.3g)",
                     t[i].name, rel, worst, sqrt(nn));
        if (nn == 0.0)
            fail_msg("gradient of %s is identically zero: the check would be vacuous", t[i].name);
    }
    free(p);
    free(x);
    model_mlp_free(m);
}

static void test_gradient_accumulates(void **state) {
    (void)state;
    model_mlp_config c = small_config();
    model_mlp *m = mlp_make(c, 21);
    randomise(m, 22);
    float *x = random_vec(3 * 5, 23);
    int y[3] = {0, 3, 1};
    size_t n = model_mlp_num_params(m);
    float loss;
    OK(model_mlp_forward(m, x, y, 3, &loss, &e_));
    OK(model_mlp_backward(m, &e_));
    float *once = malloc(n * sizeof(float));
    assert_non_null(once);
    memcpy(once, model_mlp_grads(m), n * sizeof(float));
    /* The caller's input buffer may change between forward and backward. */
    OK(model_mlp_forward(m, x, y, 3, &loss, &e_));
    memset(x, 0, 15 * sizeof(float));
    OK(model_mlp_backward(m, &e_));
    const float *g = model_mlp_grads(m);
    for (size_t i = 0; i < n; i++) assert_near(g[i], 2.0 * once[i], 1e-6 * fabs(once[i]) + 1e-9);
    model_mlp_zero_grad(m);
    for (size_t i = 0; i < n; i++) assert_true(g[i] == 0.0f);
    free(once);
    free(x);
    model_mlp_free(m);
}

/* What each layer saw and the gradient at its output, as K-FAC reads them:
 * for every layer the weight gradient backward computed (checked against
 * finite differences above) equals x^T dy from the accessor, and the bias
 * gradient the column sums of dy; recomputing the output gradients for the
 * same labels gives the same bits; the last layer's dy is (p - onehot)/B. */
static void test_layer_io(void **state) {
    (void)state;
    model_mlp_config c = small_config();
    model_mlp *m = mlp_make(c, 31);
    randomise(m, 32);
    enum { B = 6 };
    float *x = random_vec(B * 5, 33);
    int y[B], other[B];
    random_labels(y, B, 4, 34);
    random_labels(other, B, 4, 35);
    const float *lx, *ly;
    int nb = 0;
    vl_error e = {0};
    float loss;
    OK(model_mlp_forward(m, x, y, B, &loss, &e_));
    assert_int_equal(model_mlp_layer_io(m, 0, &lx, &ly, &nb, &e), VL_EINVAL); /* no backward yet */
    model_mlp_zero_grad(m);
    OK(model_mlp_backward(m, &e_));
    const model_tensor *t = NULL;
    int nt = model_mlp_tensors(m, &t);
    const float *g = model_mlp_grads(m);
    float *saved[3];
    for (int l = 0; l < nt / 2; l++) {
        OK(model_mlp_layer_io(m, l, &lx, &ly, &nb, &e_));
        assert_int_equal(nb, B);
        int in = (int)t[2 * l].shape[0], out = (int)t[2 * l].shape[1];
        if (l == 0) assert_memory_equal(lx, x, sizeof(float) * B * 5);
        for (int a = 0; a < in; a++)
            for (int b = 0; b < out; b++) {
                double w = 0;
                for (int i = 0; i < B; i++) w += (double)lx[i * in + a] * ly[i * out + b];
                assert_near(g[t[2 * l].offset + (size_t)a * out + b], w, 1e-5 * (1 + fabs(w)));
            }
        for (int b = 0; b < out; b++) {
            double sb = 0;
            for (int i = 0; i < B; i++) sb += ly[i * out + b];
            assert_near(g[t[2 * l + 1].offset + b], sb, 1e-5 * (1 + fabs(sb)));
        }
        saved[l] = malloc(sizeof(float) * B * out);
        assert_non_null(saved[l]);
        memcpy(saved[l], ly, sizeof(float) * B * out);
    }
    const float *probs = model_mlp_probs(m);
    OK(model_mlp_layer_io(m, 2, &lx, &ly, &nb, &e_));
    for (int i = 0; i < B; i++)
        for (int k = 0; k < 4; k++)
            assert_near(ly[i * 4 + k], (probs[i * 4 + k] - (k == y[i])) / B, 1e-7);
    /* Other labels change every dy; the same labels give the same bits, and
     * the parameter gradients stay as they were. */
    float *before = malloc(model_mlp_num_params(m) * sizeof(float));
    assert_non_null(before);
    memcpy(before, g, model_mlp_num_params(m) * sizeof(float));
    OK(model_mlp_output_grads(m, other, &e_));
    OK(model_mlp_layer_io(m, 2, &lx, &ly, &nb, &e_));
    assert_true(memcmp(ly, saved[2], sizeof(float) * B * 4) != 0);
    OK(model_mlp_output_grads(m, y, &e_));
    for (int l = 0; l < nt / 2; l++) {
        OK(model_mlp_layer_io(m, l, &lx, &ly, &nb, &e_));
        assert_memory_equal(ly, saved[l], sizeof(float) * B * t[2 * l].shape[1]);
        free(saved[l]);
    }
    assert_memory_equal(g, before, model_mlp_num_params(m) * sizeof(float));
    /* Refusals: a layer that does not exist, bad labels, and anything after
     * a new forward until its backward. */
    assert_int_equal(model_mlp_layer_io(m, 3, &lx, &ly, &nb, &e), VL_EINVAL);
    assert_int_equal(model_mlp_layer_io(m, -1, &lx, &ly, &nb, &e), VL_EINVAL);
    other[0] = 4;
    assert_int_equal(model_mlp_output_grads(m, other, &e), VL_EINVAL);
    assert_int_equal(model_mlp_output_grads(m, NULL, &e), VL_EINVAL);
    OK(model_mlp_forward(m, x, y, B, &loss, &e_));
    assert_int_equal(model_mlp_layer_io(m, 0, &lx, &ly, &nb, &e), VL_EINVAL);
    free(before);
    free(x);
    model_mlp_free(m);
}

static void test_forward_errors(void **state) {
    (void)state;
    model_mlp *m = mlp_make(small_config(), 1);
    vl_error err = {0};
    float x[4 * 5] = {0}, loss;
    int y[4] = {0, 1, 2, 3};
    assert_int_equal(model_mlp_backward(m, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "forward"));
    assert_int_equal(model_mlp_forward(m, NULL, y, 4, &loss, &err), VL_EINVAL);
    assert_int_equal(model_mlp_forward(m, x, y, 0, &loss, &err), VL_EINVAL);
    assert_int_equal(model_mlp_forward(m, x, y, 1 << 30, &loss, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "too large"));
    y[2] = 4;
    assert_int_equal(model_mlp_forward(m, x, y, 4, &loss, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "labels[2]"));
    y[2] = -1;
    assert_int_equal(model_mlp_forward(m, x, y, 4, &loss, &err), VL_EINVAL);
    y[2] = 2;
    /* inference only: nothing to differentiate */
    OK(model_mlp_forward(m, x, NULL, 4, NULL, &e_));
    assert_int_equal(model_mlp_backward(m, &err), VL_EINVAL);
    OK(model_mlp_forward(m, x, y, 4, &loss, &e_));
    OK(model_mlp_backward(m, &e_));
    assert_non_null(model_mlp_probs(m));                      /* backward leaves the outputs */
    assert_int_equal(model_mlp_backward(m, &err), VL_EINVAL); /* consumed */
    model_mlp_free(m);
}

/* Growing, shrinking and regrowing the batch gives the same outputs as a
 * fresh model. */
static void test_replanning(void **state) {
    (void)state;
    model_mlp_config c = small_config();
    model_mlp *m = mlp_make(c, 3);
    float *x = random_vec(64 * 5, 9);
    const int sizes[] = {2, 8, 3, 64, 1};
    for (int s = 0; s < 5; s++) {
        int B = sizes[s];
        OK(model_mlp_forward(m, x, NULL, B, NULL, &e_));
        model_mlp *f = mlp_make(c, 3);
        OK(model_mlp_forward(f, x, NULL, B, NULL, &e_));
        assert_memory_equal(model_mlp_logits(m), model_mlp_logits(f),
                            (size_t)B * 4 * sizeof(float));
        model_mlp_free(f);
    }
    free(x);
    model_mlp_free(m);
}

/* ---- training ------------------------------------------------------------- */

static void test_overfit_one_batch(void **state) {
    (void)state;
    model_mlp_config c = {.in_dim = 8, .n_hidden = 1, .hidden = {32}, .n_classes = 5};
    model_mlp *m = mlp_make(c, 1);
    int B = 16;
    float *x = random_vec((size_t)B * c.in_dim, 31);
    int y[16];
    random_labels(y, B, c.n_classes, 32);
    float first = 0, loss = 0;
    for (int step = 0; step < 1000; step++) {
        model_mlp_zero_grad(m);
        OK(model_mlp_forward(m, x, y, B, &loss, &e_));
        if (step == 0) first = loss;
        OK(model_mlp_backward(m, &e_));
        mlp_sgd_step(m, 0.5f);
    }
    OK(model_mlp_forward(m, x, y, B, &loss, &e_));
    if (!(loss < 0.05f)) fail_msg("did not overfit: loss %.4f -> %.4f", first, loss);
    double acc;
    OK(model_mlp_accuracy(m, x, y, B, &acc, &e_));
    assert_near(acc, 1.0, 0);
    free(x);
    model_mlp_free(m);
}

/* Same seed, same data: bitwise-identical parameters and losses. */
static float *train_run(float *losses, int steps, size_t *n_out) {
    model_mlp_config c = {.in_dim = 6, .n_hidden = 3, .hidden = {16, 9, 5}, .n_classes = 3};
    model_mlp *m = mlp_make(c, 2024);
    float *x = random_vec(10 * 6, 77);
    int y[10];
    random_labels(y, 10, 3, 78);
    for (int s = 0; s < steps; s++) {
        model_mlp_zero_grad(m);
        OK(model_mlp_forward(m, x, y, 10, &losses[s], &e_));
        OK(model_mlp_backward(m, &e_));
        mlp_sgd_step(m, 0.1f);
    }
    *n_out = model_mlp_num_params(m);
    float *p = malloc(*n_out * sizeof(float));
    assert_non_null(p);
    memcpy(p, model_mlp_params(m), *n_out * sizeof(float));
    free(x);
    model_mlp_free(m);
    return p;
}

static void test_deterministic(void **state) {
    (void)state;
    model_mlp_config c = small_config();
    model_mlp *a = mlp_make(c, 7), *b = mlp_make(c, 7), *d = mlp_make(c, 8);
    size_t n = model_mlp_num_params(a);
    assert_memory_equal(model_mlp_params(a), model_mlp_params(b), n * sizeof(float));
    assert_memory_not_equal(model_mlp_params(a), model_mlp_params(d), n * sizeof(float));
    model_mlp_free(a), model_mlp_free(b), model_mlp_free(d);

    float l1[12], l2[12];
    size_t n1, n2;
    float *p1 = train_run(l1, 12, &n1), *p2 = train_run(l2, 12, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(l1, l2, sizeof l1);
    assert_memory_equal(p1, p2, n1 * sizeof(float));
    assert_true(l1[11] < l1[0]); /* it did train */
    free(p1);
    free(p2);
}

/* Evaluation in chunks agrees with one big forward. */
static void test_evaluate(void **state) {
    (void)state;
    model_mlp_config c = small_config();
    model_mlp *m = mlp_make(c, 5);
    randomise(m, 6);
    int n = 601;
    float *x = random_vec((size_t)n * 5, 7);
    int *y = malloc((size_t)n * sizeof *y);
    assert_non_null(y);
    random_labels(y, n, 4, 8);
    double loss, acc;
    OK(model_mlp_evaluate(m, x, y, n, &loss, &acc, &e_));
    vl_error err = {0};
    assert_int_equal(model_mlp_backward(m, &err), VL_EINVAL);
    float whole;
    OK(model_mlp_forward(m, x, y, n, &whole, &e_));
    const float *lg = model_mlp_logits(m);
    int correct = 0;
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int k = 1; k < 4; k++) best = lg[i * 4 + k] > lg[i * 4 + best] ? k : best;
        correct += best == y[i];
    }
    assert_near(loss, whole, 1e-6 * whole);
    assert_near(acc, (double)correct / n, 0);
    double acc2;
    OK(model_mlp_accuracy(m, x, y, n, &acc2, &e_));
    assert_near(acc2, acc, 0);
    assert_int_equal(model_mlp_evaluate(m, x, NULL, n, &loss, &acc, &err), VL_EINVAL);
    assert_int_equal(model_mlp_evaluate(m, x, y, 0, &loss, &acc, &err), VL_EINVAL);
    y[400] = 9;
    assert_int_equal(model_mlp_evaluate(m, x, y, n, &loss, &acc, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "labels[400]")); /* the index in the set, not the chunk */
    free(x);
    free(y);
    model_mlp_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_validate),
        cmocka_unit_test(test_tensor_table),
        cmocka_unit_test(test_forward_matches_reference),
        cmocka_unit_test(test_init_loss_is_uniform),
        cmocka_unit_test(test_gradient_finite_differences),
        cmocka_unit_test(test_gradient_accumulates),
        cmocka_unit_test(test_layer_io),
        cmocka_unit_test(test_forward_errors),
        cmocka_unit_test(test_replanning),
        cmocka_unit_test(test_overfit_one_batch),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_evaluate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
