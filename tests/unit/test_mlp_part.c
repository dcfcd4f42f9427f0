/*
 * Unit tests for the split-learning parts of the MLP (model/mlp_part.h):
 * split at every cut, the chained parts give the whole model's loss, logits
 * and gradients, and accumulate as it does; the U-shaped three-part split
 * does too; the gradient a peer backpropagates with the NoPeek term added
 * at its cut matches central finite differences of sum(Z * R) +
 * alpha * dCor(X, Z), and differs from the gradient without it; slices and
 * widths agree with the whole model's tensor table; bad ranges, batch
 * sizes, labels and call orders are refused with VL_EINVAL.
 *
 * With a convolution front end: the whole model's loss and logits against
 * a direct-loop double-precision reference and every gradient against
 * central differences of it; parts at every cut (after each conv layer
 * too), in twos, threes and U shapes, against the whole model; a batch
 * larger than a conv layer's chunk against its rows one at a time; the
 * slices; and K-FAC's accessors refusing a model with conv layers.
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
#include "kernels/dcor.h"
#include "model/mlp_part.h"
#include "model/model.h"
#include "tests/unit/test_util.h"

/* The whole model: init_weights, then small random biases so that a bias
 * sliced into the wrong place changes the forward pass too. */
static model_mlp *make_model(model_mlp_config c, uint64_t seed) {
    model_mlp *m = NULL;
    OK(model_mlp_create(&c, &m, &e_));
    model_mlp_init_weights(m, seed);
    const model_tensor *t = NULL;
    int nt = model_mlp_tensors(m, &t);
    vl_rng r;
    vl_rng_seed(&r, seed + 1000);
    float *p = model_mlp_params(m);
    for (int i = 1; i < nt; i += 2)
        for (size_t k = 0; k < t[i].numel; k++) p[t[i].offset + k] = 0.1f * vl_rng_normal(&r);
    return m;
}

/* Part [first, last) holding its slice of m's parameters. */
static model_mlp_part *make_part(model_mlp *m, int first, int last) {
    model_mlp_config c = model_mlp_config_get(m);
    model_mlp_part *p = NULL;
    size_t off = 0, n = 0;
    OK(model_mlp_part_offset(&c, first, last, &off, &n, &e_));
    OK(model_mlp_part_create(&c, first, last, &p, &e_));
    assert_int_equal(model_mlp_part_num_params(p), n);
    memcpy(model_mlp_part_params(p), model_mlp_params(m) + off, n * sizeof(float));
    return p;
}

static int *random_labels(int n, int C, uint64_t seed) {
    int *y = malloc((size_t)n * sizeof *y);
    assert_non_null(y);
    vl_rng r;
    vl_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) y[i] = (int)vl_rng_below(&r, (uint32_t)C);
    return y;
}

static void assert_rel(double a, double b, double tol, const char *what) {
    double scale = fabs(b) > 1.0 ? fabs(b) : 1.0;
    if (!(fabs(a - b) <= tol * scale)) fail_msg("%s: %.9g, expected %.9g", what, a, b);
}

/* Runs the chain of parts on (x, y): forwards bottom to top, the loss on
 * the top, backwards top to bottom with each part's dx as the dy of the
 * part below. Returns the loss. */
static float run_chain(model_mlp_part **parts, int n, const float *x, const int *y, int B) {
    const float *in = x;
    for (int i = 0; i < n; i++) {
        OK(model_mlp_part_forward(parts[i], in, B, &e_));
        in = model_mlp_part_output(parts[i]);
        assert_non_null(in);
        assert_int_equal(model_mlp_part_batch(parts[i]), B);
    }
    float loss = NAN;
    assert_true(model_mlp_part_has_head(parts[n - 1]));
    OK(model_mlp_part_loss(parts[n - 1], y, &loss, &e_));
    float *dy = NULL;
    for (int i = n - 1; i >= 0; i--) {
        float *dx = NULL;
        if (i > 0) {
            dx = malloc((size_t)B * (size_t)model_mlp_part_in_dim(parts[i]) * sizeof *dx);
            assert_non_null(dx);
        }
        OK(model_mlp_part_backward(parts[i], dy, dx, &e_));
        free(dy);
        dy = dx;
    }
    return loss;
}

/* The chain's loss, logits and every gradient (concatenated, which is the
 * whole model's layout) against the whole model on the same batch. rounds
 * passes without zeroing must give rounds times the whole model's
 * gradient. */
static void check_chain(model_mlp *m, const int *first, int n, int B, int rounds) {
    model_mlp_config c = model_mlp_config_get(m);
    float *x = random_vec((size_t)B * (size_t)c.in_dim, 11);
    int *y = random_labels(B, c.n_classes, 12);
    float ref = NAN;
    model_mlp_zero_grad(m);
    OK(model_mlp_forward(m, x, y, B, &ref, &e_));
    OK(model_mlp_backward(m, &e_));

    model_mlp_part *parts[MODEL_MLP_MAX_LAYERS];
    size_t total = 0;
    int L = model_mlp_config_num_layers(&c);
    for (int i = 0; i < n; i++) {
        int last = i + 1 < n ? first[i + 1] : L;
        parts[i] = make_part(m, first[i], last);
        total += model_mlp_part_num_params(parts[i]);
        assert_int_equal(model_mlp_part_has_head(parts[i]), last == L);
    }
    size_t np = model_mlp_num_params(m);
    assert_int_equal(total, np);
    for (int r = 0; r < rounds; r++) {
        float loss = run_chain(parts, n, x, y, B);
        assert_rel(loss, ref, 1e-5, "chained loss");
    }
    double e = test_max_rel_err(model_mlp_part_output(parts[n - 1]), model_mlp_logits(m),
                                (size_t)B * (size_t)c.n_classes);
    if (!(e <= 1e-5)) fail_msg("logits differ from the whole model's by %.3g", e);

    float *g = malloc(np * sizeof *g), *want = malloc(np * sizeof *want);
    assert_non_null(g);
    assert_non_null(want);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t k = model_mlp_part_num_params(parts[i]);
        memcpy(g + at, model_mlp_part_grads(parts[i]), k * sizeof *g);
        at += k;
    }
    const float *G = model_mlp_grads(m);
    double gmax = 0;
    for (size_t i = 0; i < np; i++) {
        want[i] = (float)rounds * G[i];
        gmax = fabs(G[i]) > gmax ? fabs(G[i]) : gmax;
    }
    assert_true(gmax > 1e-4); /* a real gradient, not zeros compared with zeros */
    e = test_max_rel_err(g, want, np);
    if (!(e <= 1e-5))
        fail_msg("split at %d (%d parts): gradients differ by %.3g relative", first[n - 1], n, e);
    for (int i = 0; i < n; i++) model_mlp_part_free(parts[i]);
    free(g), free(want), free(x), free(y);
}

/* ---- the splits ----------------------------------------------------------------- */

static void test_every_cut(void **state) {
    (void)state;
    model_mlp_config c = {.in_dim = 12, .n_hidden = 2, .hidden = {9, 7}, .n_classes = 5};
    model_mlp *m = make_model(c, 3);
    for (int cut = 1; cut <= c.n_hidden; cut++) {
        int first[2] = {0, cut};
        check_chain(m, first, 2, 6, 1);
    }
    /* Backward adds: two passes without zeroing give twice the gradient. */
    int first[2] = {0, 1};
    check_chain(m, first, 2, 6, 2);
    model_mlp_free(m);
}

static void test_u_shape(void **state) {
    (void)state;
    /* Peer: [0, 1) and the classifier [3, 4); server: [1, 3), two layers. */
    model_mlp_config c = {.in_dim = 12, .n_hidden = 3, .hidden = {9, 7, 6}, .n_classes = 5};
    model_mlp *m = make_model(c, 5);
    int first[3] = {0, 1, c.n_hidden};
    check_chain(m, first, 3, 6, 1);
    model_mlp_free(m);
}

/* Slices and widths agree with the whole model's tensor table. */
static void test_slices(void **state) {
    (void)state;
    model_mlp_config c = {.in_dim = 12, .n_hidden = 3, .hidden = {9, 7, 6}, .n_classes = 5};
    model_mlp *m = make_model(c, 1);
    const model_tensor *t = NULL;
    int nt = model_mlp_tensors(m, &t);
    int width[] = {12, 9, 7, 6, 5};
    for (int f = 0; f <= c.n_hidden; f++)
        for (int l = f + 1; l <= c.n_hidden + 1; l++) {
            size_t off = 0, n = 0;
            int in = 0, out = 0;
            OK(model_mlp_part_offset(&c, f, l, &off, &n, &e_));
            OK(model_mlp_part_dims(&c, f, l, &in, &out, &e_));
            size_t end = l < c.n_hidden + 1 ? t[2 * l].offset : model_mlp_num_params(m);
            assert_int_equal(off, t[2 * f].offset);
            assert_int_equal(n, end - off);
            assert_int_equal(in, width[f]);
            assert_int_equal(out, width[l]);
            model_mlp_part *p = NULL;
            OK(model_mlp_part_create(&c, f, l, &p, &e_));
            assert_int_equal(model_mlp_part_in_dim(p), in);
            assert_int_equal(model_mlp_part_out_dim(p), out);
            assert_int_equal(model_mlp_part_num_params(p), n);
            int pf = -1, pl = -1;
            model_mlp_part_range(p, &pf, &pl);
            assert_int_equal(pf, f);
            assert_int_equal(pl, l);
            assert_null(model_mlp_part_output(p));
            assert_int_equal(model_mlp_part_batch(p), 0);
            model_mlp_part_free(p);
        }
    assert_int_equal(nt, 2 * (c.n_hidden + 1));
    model_mlp_free(m);
}

/* ---- NoPeek inside the peer's step ---------------------------------------------- */

/* J = sum(Z * R) + alpha * dCor(X, Z) with Z the lower part's output. */
static double objective(model_mlp_part *p, const float *X, const float *R, int B, float alpha) {
    OK(model_mlp_part_forward(p, X, B, &e_));
    const float *Z = model_mlp_part_output(p);
    int D = model_mlp_part_in_dim(p), q = model_mlp_part_out_dim(p);
    double s = 0.0, dc = 0.0;
    for (int i = 0; i < B * q; i++) s += (double)Z[i] * R[i];
    OK(model_mlp_part_nopeek(X, D, Z, q, B, alpha, NULL, &dc, NULL, &e_));
    return s + alpha * dc;
}

/* The gradient the peer backpropagates: dZ = R (the server's dL/dZ), plus
 * alpha * d dCor / dZ when alpha is not 0, through the lower part. */
static void peer_gradient(model_mlp_part *p, const float *X, const float *R, int B, float alpha,
                          double *scratch, float *g) {
    int D = model_mlp_part_in_dim(p), q = model_mlp_part_out_dim(p);
    float *dZ = malloc((size_t)B * q * sizeof *dZ);
    assert_non_null(dZ);
    memcpy(dZ, R, (size_t)B * q * sizeof *dZ);
    model_mlp_part_zero_grad(p);
    OK(model_mlp_part_forward(p, X, B, &e_));
    if (alpha != 0.0f) {
        double dc = -1.0;
        OK(model_mlp_part_nopeek(X, D, model_mlp_part_output(p), q, B, alpha, dZ, &dc, scratch,
                                 &e_));
        assert_true(dc > 0.05 && dc <= 1.0);
    }
    OK(model_mlp_part_backward(p, dZ, NULL, &e_));
    memcpy(g, model_mlp_part_grads(p), model_mlp_part_num_params(p) * sizeof *g);
    free(dZ);
}

static void test_nopeek_finite_differences(void **state) {
    (void)state;
    model_mlp_config c = {.in_dim = 12, .n_hidden = 2, .hidden = {9, 7}, .n_classes = 5};
    model_mlp *m = make_model(c, 7);
    model_mlp_part *p = make_part(m, 0, 2);
    const int B = 8, q = model_mlp_part_out_dim(p);
    const float alpha = 0.5f;
    float *X = random_vec((size_t)B * c.in_dim, 21), *R = random_vec((size_t)B * q, 22);
    for (int i = 0; i < B * q; i++)
        R[i] *= 0.1f; /* so the dCor term is a large share of the gradient */
    size_t n = model_mlp_part_num_params(p);
    float *g = malloc(n * sizeof *g), *g0 = malloc(n * sizeof *g0);
    double *scratch = malloc(kernels_dcor_scratch_doubles(B) * sizeof *scratch);
    assert_non_null(g);
    assert_non_null(g0);
    assert_non_null(scratch);
    peer_gradient(p, X, R, B, alpha, scratch, g);
    peer_gradient(p, X, R, B, 0.0f, NULL, g0);
    double gmax = 0.0;
    for (size_t i = 0; i < n; i++) gmax = fabs(g[i]) > gmax ? fabs(g[i]) : gmax;

    /* Every parameter, by central differences with the step actually
     * taken. J is computed from a float forward, whose rounding (about 1e-7
     * of J) puts noise of about 1e-7 / eps on each difference: eps 3e-3
     * keeps that well under the absolute term of the tolerance, while the
     * truncation error, O(eps^2), stays far below the relative one. */
    float *P = model_mlp_part_params(p);
    const float eps = 3e-3f;
    size_t without = 0; /* parameters where the gradient without NoPeek misses */
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        float p0 = P[i];
        P[i] = p0 + eps;
        double hu = (double)P[i] - p0, up = objective(p, X, R, B, alpha);
        P[i] = p0 - eps;
        double hd = (double)p0 - P[i], dn = objective(p, X, R, B, alpha);
        P[i] = p0;
        double fd = (up - dn) / (hu + hd);
        double tol = 5e-3 * fabs(fd) + 5e-4 * gmax;
        double d = fabs((double)g[i] - fd);
        if (!(d <= tol))
            fail_msg("param %zu: analytic %.7g, finite difference %.7g", i, (double)g[i], fd);
        worst = d / tol > worst ? d / tol : worst;
        without += fabs((double)g0[i] - fd) > tol;
    }
    print_message("nopeek: %zu parameters, worst error %.3g of the tolerance, %zu miss without "
                  "dCor\n",
                  n, worst, without);
    /* The dCor term matters: leaving it out misses many parameters. */
    assert_true(without > n / 4);
    model_mlp_part_free(p);
    model_mlp_free(m);
    free(X), free(R), free(g), free(g0), free(scratch);
}

/* ---- refusals ------------------------------------------------------------------- */

static void expect_einval(int rc, vl_error *err, const char *what) {
    if (rc != VL_EINVAL) fail_msg("%s: returned %d, expected VL_EINVAL", what, rc);
    if (err->msg[0] == '\0') fail_msg("%s: no message", what);
    memset(err, 0, sizeof *err);
}

static void test_refusals(void **state) {
    (void)state;
    model_mlp_config c = {.in_dim = 4, .n_hidden = 2, .hidden = {3, 3}, .n_classes = 3};
    vl_error err = {0};
    model_mlp_part *p = NULL;
    size_t off = 0, n = 0;
    int bad[][2] = {{1, 1}, {2, 1}, {-1, 1}, {0, 4}, {3, 3}, {2, 5}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = (model_mlp_part *)&c; /* any non-NULL value: a refusal sets it to NULL */
        expect_einval(model_mlp_part_create(&c, bad[i][0], bad[i][1], &p, &err), &err, "range");
        assert_null(p);
        expect_einval(model_mlp_part_offset(&c, bad[i][0], bad[i][1], &off, &n, &err), &err,
                      "offset range");
        expect_einval(model_mlp_part_dims(&c, bad[i][0], bad[i][1], NULL, NULL, &err), &err,
                      "dims range");
    }
    model_mlp_config badc = c;
    badc.n_classes = 1;
    expect_einval(model_mlp_part_create(&badc, 0, 1, &p, &err), &err, "config");

    model_mlp_part *lo = NULL, *hi = NULL;
    OK(model_mlp_part_create(&c, 0, 1, &lo, &e_));
    OK(model_mlp_part_create(&c, 1, 3, &hi, &e_));
    float x[4 * 4] = {0}, dy[4 * 3] = {0};
    int y[4] = {0, 1, 2, 0};
    float loss = 0.0f;
    /* Nothing to differentiate or score before a forward. */
    expect_einval(model_mlp_part_backward(lo, dy, NULL, &err), &err, "backward first");
    expect_einval(model_mlp_part_loss(hi, y, &loss, &err), &err, "loss first");
    /* Batch sizes. */
    expect_einval(model_mlp_part_forward(lo, x, 0, &err), &err, "B 0");
    expect_einval(model_mlp_part_forward(lo, x, -3, &err), &err, "B -3");
    expect_einval(model_mlp_part_forward(lo, x, MODEL_MLP_PART_MAX_BATCH + 1, &err), &err,
                  "B over the cap");
    expect_einval(model_mlp_part_forward(lo, NULL, 4, &err), &err, "no inputs");
    assert_null(model_mlp_part_output(lo));
    /* The loss belongs to the part with the head. */
    OK(model_mlp_part_forward(lo, x, 4, &e_));
    expect_einval(model_mlp_part_loss(lo, y, &loss, &err), &err, "loss without the head");
    expect_einval(model_mlp_part_backward(lo, NULL, NULL, &err), &err, "no dy, no loss");
    /* Labels. */
    OK(model_mlp_part_forward(hi, model_mlp_part_output(lo), 4, &e_));
    int neg[4] = {0, -1, 0, 0}, big[4] = {0, 0, 0, 3};
    expect_einval(model_mlp_part_loss(hi, neg, &loss, &err), &err, "label -1");
    expect_einval(model_mlp_part_loss(hi, big, &loss, &err), &err, "label C");
    expect_einval(model_mlp_part_loss(hi, NULL, &loss, &err), &err, "no labels");
    /* The loss gradient is used once. */
    OK(model_mlp_part_loss(hi, y, &loss, &e_));
    assert_true(fabsf(loss - logf(3.0f)) < 1e-6f); /* zero weights: uniform */
    OK(model_mlp_part_backward(hi, NULL, NULL, &e_));
    expect_einval(model_mlp_part_backward(hi, NULL, NULL, &err), &err, "second backward");
    /* NoPeek's batch and widths. */
    float z[4 * 3] = {0};
    expect_einval(model_mlp_part_nopeek(x, 4, z, 3, 1, 1.0f, z, NULL, NULL, &err), &err,
                  "nopeek B 1");
    expect_einval(
        model_mlp_part_nopeek(x, 4, z, 3, KERNELS_DCOR_MAX_N + 1, 1.0f, z, NULL, NULL, &err), &err,
        "nopeek B over the cap");
    expect_einval(model_mlp_part_nopeek(x, 0, z, 3, 4, 1.0f, z, NULL, NULL, &err), &err,
                  "nopeek p 0");
    expect_einval(model_mlp_part_nopeek(x, 4, z, 3, 4, NAN, z, NULL, NULL, &err), &err,
                  "nopeek alpha NaN");
    model_mlp_part_free(lo);
    model_mlp_part_free(hi);
    model_mlp_part_free(NULL);
}

/* ---- the convolution front end ------------------------------------------------ */

/* Image 2x6x5; conv 3 channels k3 s1 (3x6x5 = 90), conv 4 channels k3 s2
 * (4x3x3 = 36); dense 6; 4 classes. Layers 0, 1 conv, 2 hidden, 3 the
 * classifier. */
static const model_mlp_config CNN = {.in_dim = 60,
                                     .n_hidden = 1,
                                     .hidden = {6},
                                     .n_classes = 4,
                                     .n_conv = 2,
                                     .image = {2, 6, 5},
                                     .conv = {{3, 3, 1}, {4, 3, 2}}};
static const int CNN_WIDTH[] = {60, 90, 36, 6, 4};

static double gelu_ref(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

/* Mean cross-entropy of the model with parameters p (double, the flat
 * layout: per layer weight then bias) on x[B, D], y[B], by the plain
 * definitions in double: a convolution as the sum over channels and the
 * kernel window with zeros outside the image, a dense layer as W[in, out].
 * logits[B, C] may be NULL. */
static double ref_loss(const model_mlp_config *c, const double *p, const float *x, const int *y,
                       int B, double *logits) {
    double *cur = malloc(MODEL_MLP_MAX_WIDTH * sizeof *cur);
    double *next = malloc(MODEL_MLP_MAX_WIDTH * sizeof *next);
    assert_non_null(cur);
    assert_non_null(next);
    double loss = 0.0;
    for (int b = 0; b < B; b++) {
        int width = c->in_dim;
        for (int j = 0; j < width; j++) cur[j] = x[(size_t)b * c->in_dim + j];
        const double *q = p;
        int ci = c->image[0], h = c->image[1], w = c->image[2];
        for (int l = 0; l < c->n_conv; l++) {
            int co = c->conv[l].channels, k = c->conv[l].kernel, s = c->conv[l].stride;
            int pad = k / 2, ho = (h + 2 * pad - k) / s + 1, wo = (w + 2 * pad - k) / s + 1;
            const double *W = q, *bias = q + co * ci * k * k;
            for (int o = 0; o < co; o++)
                for (int oy = 0; oy < ho; oy++)
                    for (int ox = 0; ox < wo; ox++) {
                        double sum = bias[o];
                        for (int i = 0; i < ci; i++)
                            for (int ky = 0; ky < k; ky++)
                                for (int kx = 0; kx < k; kx++) {
                                    int iy = oy * s - pad + ky, ix = ox * s - pad + kx;
                                    if (iy >= 0 && iy < h && ix >= 0 && ix < w)
                                        sum += W[((o * ci + i) * k + ky) * k + kx] *
                                               cur[(i * h + iy) * w + ix];
                                }
                        next[(o * ho + oy) * wo + ox] = gelu_ref(sum);
                    }
            q += co * ci * k * k + co;
            ci = co, h = ho, w = wo;
            width = co * ho * wo;
            memcpy(cur, next, (size_t)width * sizeof *cur);
        }
        for (int l = 0; l <= c->n_hidden; l++) {
            int out = l < c->n_hidden ? c->hidden[l] : c->n_classes;
            const double *W = q, *bias = q + width * out;
            for (int o = 0; o < out; o++) {
                double sum = bias[o];
                for (int i = 0; i < width; i++) sum += cur[i] * W[i * out + o];
                next[o] = l < c->n_hidden ? gelu_ref(sum) : sum;
            }
            q += width * out + out;
            width = out;
            memcpy(cur, next, (size_t)out * sizeof *cur);
        }
        int C = c->n_classes;
        double mx = cur[0], z = 0.0;
        for (int k = 1; k < C; k++) mx = cur[k] > mx ? cur[k] : mx;
        for (int k = 0; k < C; k++) z += exp(cur[k] - mx);
        if (logits) memcpy(logits + (size_t)b * C, cur, (size_t)C * sizeof *cur);
        loss += mx + log(z) - cur[y[b]];
    }
    free(cur);
    free(next);
    return loss / B;
}

static void test_conv_model_finite_differences(void **state) {
    (void)state;
    model_mlp *m = make_model(CNN, 31);
    const int B = 3;
    float *x = random_vec((size_t)B * CNN.in_dim, 32);
    int *y = random_labels(B, CNN.n_classes, 33);
    size_t np = model_mlp_num_params(m);
    double *p = malloc(np * sizeof *p), logits[3 * 4];
    assert_non_null(p);
    for (size_t i = 0; i < np; i++) p[i] = model_mlp_params(m)[i];
    float loss = NAN;
    model_mlp_zero_grad(m);
    OK(model_mlp_forward(m, x, y, B, &loss, &e_));
    OK(model_mlp_backward(m, &e_));
    double ref = ref_loss(&CNN, p, x, y, B, logits);
    assert_rel(loss, ref, 1e-5, "loss against the reference");
    const float *lg = model_mlp_logits(m);
    for (int i = 0; i < B * CNN.n_classes; i++)
        assert_rel(lg[i], logits[i], 1e-5, "logit against the reference");

    /* Central differences of the double reference at the model's float
     * parameters: truncation ~h^2 = 1e-10 and rounding ~1e-16/h, so the
     * numerical gradient is exact to ~1e-9 and the error measured is the
     * float backward's (~1e-7 relative). Per tensor: relative 1e-5 of its
     * norm, and no element off by more than 1e-5 of the largest. */
    const double h = 1e-5;
    const float *g = model_mlp_grads(m);
    const model_tensor *t;
    int nt = model_mlp_tensors(m, &t);
    assert_int_equal(nt, 8);
    double worst_rel = 0;
    for (int i = 0; i < nt; i++) {
        double dd = 0, nn = 0, worst = 0, gmax = 0;
        for (size_t k = t[i].offset; k < t[i].offset + t[i].numel; k++) {
            double saved = p[k];
            p[k] = saved + h;
            double lp = ref_loss(&CNN, p, x, y, B, NULL);
            p[k] = saved - h;
            double lm = ref_loss(&CNN, p, x, y, B, NULL);
            p[k] = saved;
            double num = (lp - lm) / (2 * h), d = fabs(num - g[k]);
            dd += d * d;
            nn += num * num;
            worst = d > worst ? d : worst;
            gmax = fabs(num) > gmax ? fabs(num) : gmax;
        }
        if (nn == 0.0)
            fail_msg("gradient of %s is identically zero: the check would be vacuous", t[i].name);
        double rel = sqrt(dd) / sqrt(nn);
        if (rel > 1e-5 || worst > 1e-5 * gmax)
            fail_msg("gradient of %s off: relative %.3g, worst element %.3g of %.3g", t[i].name,
                     rel, worst, gmax);
        worst_rel = rel > worst_rel ? rel : worst_rel;
    }
    print_message("conv model: %zu parameters, worst tensor's gradient error %.3g relative\n", np,
                  worst_rel);
    free(p), free(x), free(y);
    model_mlp_free(m);
}

static void test_conv_every_cut(void **state) {
    (void)state;
    model_mlp *m = make_model(CNN, 41);
    int L = model_mlp_config_num_layers(&CNN);
    assert_int_equal(L, 4);
    /* Two parts at every cut: after conv 0, after conv 1, after the dense
     * hidden layer. */
    for (int cut = 1; cut < L; cut++) {
        int first[2] = {0, cut};
        check_chain(m, first, 2, 5, 1);
    }
    /* Three and four parts, the U shape with a conv layer alone on the
     * peer, and accumulation over two passes. */
    int three[3] = {0, 1, 2}, u[3] = {0, 1, 3}, u2[3] = {0, 2, 3}, four[4] = {0, 1, 2, 3};
    check_chain(m, three, 3, 5, 1);
    check_chain(m, u, 3, 5, 1);
    check_chain(m, u2, 3, 5, 1);
    check_chain(m, four, 4, 5, 2);
    model_mlp_free(m);
}

static void test_conv_slices(void **state) {
    (void)state;
    model_mlp *m = make_model(CNN, 1);
    const model_tensor *t = NULL;
    int nt = model_mlp_tensors(m, &t), L = model_mlp_config_num_layers(&CNN);
    assert_int_equal(nt, 2 * L);
    for (int f = 0; f < L; f++)
        for (int l = f + 1; l <= L; l++) {
            size_t off = 0, n = 0;
            int in = 0, out = 0;
            OK(model_mlp_part_offset(&CNN, f, l, &off, &n, &e_));
            OK(model_mlp_part_dims(&CNN, f, l, &in, &out, &e_));
            size_t end = l < L ? t[2 * l].offset : model_mlp_num_params(m);
            assert_int_equal(off, t[2 * f].offset);
            assert_int_equal(n, end - off);
            assert_int_equal(in, CNN_WIDTH[f]);
            assert_int_equal(out, CNN_WIDTH[l]);
            model_mlp_part *p = NULL;
            OK(model_mlp_part_create(&CNN, f, l, &p, &e_));
            assert_int_equal(model_mlp_part_in_dim(p), in);
            assert_int_equal(model_mlp_part_out_dim(p), out);
            assert_int_equal(model_mlp_part_num_params(p), n);
            assert_int_equal(model_mlp_part_has_head(p), l == L);
            model_mlp_part_free(p);
        }
    vl_error err = {0};
    model_mlp_part *p = NULL;
    assert_int_equal(model_mlp_part_create(&CNN, 0, L + 1, &p, &err), VL_EINVAL);
    assert_null(p);
    assert_int_equal(model_mlp_part_offset(&CNN, L, L + 1, NULL, NULL, &err), VL_EINVAL);
    model_mlp_free(m);
}

/* A conv layer whose scratch per image (81 + 4) * 32 * 32 floats makes it
 * run a batch of 30 in chunks of 12: the batch's logits must be each
 * row's alone, and its gradient the mean of the rows'. */
static void test_conv_chunked_batch(void **state) {
    (void)state;
    const model_mlp_config c = {.in_dim = 1024,
                                .n_hidden = 1,
                                .hidden = {5},
                                .n_classes = 3,
                                .n_conv = 1,
                                .image = {1, 32, 32},
                                .conv = {{4, 9, 1}}};
    const int B = 30;
    model_mlp *m = make_model(c, 51);
    size_t np = model_mlp_num_params(m), D = (size_t)c.in_dim;
    float *x = random_vec((size_t)B * D, 52);
    int *y = random_labels(B, c.n_classes, 53);
    float *g = calloc(np, sizeof *g), *lg = malloc((size_t)B * 3 * sizeof *lg);
    double *mean = calloc(np, sizeof *mean);
    assert_true(g && lg && mean);
    for (int i = 0; i < B; i++) {
        model_mlp_zero_grad(m);
        OK(model_mlp_forward(m, x + (size_t)i * D, y + i, 1, NULL, &e_));
        OK(model_mlp_backward(m, &e_));
        memcpy(lg + (size_t)i * 3, model_mlp_logits(m), 3 * sizeof *lg);
        for (size_t k = 0; k < np; k++) mean[k] += model_mlp_grads(m)[k] / B;
    }
    model_mlp_zero_grad(m);
    OK(model_mlp_forward(m, x, y, B, NULL, &e_));
    OK(model_mlp_backward(m, &e_));
    double e = test_max_rel_err(model_mlp_logits(m), lg, (size_t)B * 3);
    if (!(e <= 1e-5)) fail_msg("batched logits differ from the rows' by %.3g", e);
    for (size_t k = 0; k < np; k++) g[k] = (float)mean[k];
    e = test_max_rel_err(model_mlp_grads(m), g, np);
    if (!(e <= 1e-4)) fail_msg("batched gradient differs from the rows' mean by %.3g", e);
    /* And the parts chunk the same way. */
    int first[2] = {0, 1};
    check_chain(m, first, 2, B, 1);
    free(x), free(y), free(g), free(lg), free(mean);
    model_mlp_free(m);
}

/* K-FAC's per-layer accessors are for dense-only models. */
static void test_conv_kfac_refused(void **state) {
    (void)state;
    model_mlp *m = make_model(CNN, 61);
    float *x = random_vec(2 * (size_t)CNN.in_dim, 62);
    int y[2] = {1, 3};
    OK(model_mlp_forward(m, x, y, 2, NULL, &e_));
    OK(model_mlp_backward(m, &e_));
    const float *X = NULL, *dY = NULL;
    int nb = 0;
    vl_error err = {0};
    assert_int_equal(model_mlp_layer_io(m, 2, &X, &dY, &nb, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "dense-only"));
    memset(&err, 0, sizeof err);
    assert_int_equal(model_mlp_output_grads(m, y, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "dense-only"));
    free(x);
    model_mlp_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_cut),
        cmocka_unit_test(test_u_shape),
        cmocka_unit_test(test_slices),
        cmocka_unit_test(test_nopeek_finite_differences),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_conv_model_finite_differences),
        cmocka_unit_test(test_conv_every_cut),
        cmocka_unit_test(test_conv_slices),
        cmocka_unit_test(test_conv_chunked_batch),
        cmocka_unit_test(test_conv_kfac_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
