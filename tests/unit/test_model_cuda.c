/*
 * The GPT's CUDA kernels and the CUDA training step against the CPU.
 * Without a usable device the program reports itself skipped (exit 77)
 * before any test runs, so a machine without a GPU never counts it as
 * passed. Every comparison prints what it measured, one line each, so a
 * run on a GPU shows how close each is to its bound.
 *
 * Tolerances (err = max |gpu - cpu| over a tensor / max |cpu| over it,
 * which is what float rounding in a different summation order moves):
 *  - fp32 kernels: 1e-5 (forward), 1e-4 (backward, which sums over rows
 *    with atomics in no fixed order);
 *  - fp32 training step: loss relative 1e-5, every parameter tensor's
 *    gradient 1e-4, parameters after AdamW within 5 % of the learning rate
 *    (one step moves a parameter by about lr) wherever the gradient is not
 *    rounding noise (at least 1e-3 of its tensor's largest);
 *  - bf16 matrix products (8-bit significand inputs, fp32 accumulation):
 *    each element within 2^-7 + 2^-16 + K 2^-24 of the sum of the
 *    magnitudes of its K products, sum_k |a_ik| |b_kj| (rounding each of
 *    two inputs to bf16 moves a product by at most (1 + 2^-8)^2 - 1 of
 *    itself, and the fp32 sum adds up to 2^-24 per term), plus 4 fp32
 *    ulps of the result for the fp32 values added in (bias, earlier
 *    gradients). A relative error would be meaningless where the products
 *    cancel, as a single product plus a bias can; bf16 training step:
 *    loss relative 2e-2, gradient vector relative L2 error 5e-2;
 *  - AdamW from the same gradients and state (fp32): moments to 1e-6
 *    relative, parameters to 4 ulps plus 1e-5 of the learning rate.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/common.h"
#include "kernels/cuda_model.h"
#include "kernels/kernels.h"
#include "model/gpt_cuda.h"
#include "model/model.h"
#include "cuda_skip.h"
#include "gpt_cuda_fixtures.h"
#include "test_util.h"

/* ---- LayerNorm ------------------------------------------------------------------ */

static void test_layernorm(void **state) {
    (void)state;
    const int shapes[][2] = {{1, 1}, {7, 33}, {130, 1000}, {3, 2050}, {257, 96}};
    vl_rng r;
    vl_rng_seed(&r, 11);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        size_t NC = (size_t)N * C;
        float *x = hbuf(NC), *w = hbuf(C), *b = hbuf(C), *out = hbuf(NC), *mean = hbuf(N),
              *rstd = hbuf(N), *dy = hbuf(NC), *dx = hbuf(NC), *dw = hbuf(C), *db = hbuf(C);
        fill(x, NC, &r, 2.0f, 3.0f); /* a large mean, as the two-pass form is for */
        fill(w, C, &r, 0.5f, 1.0f);
        fill(b, C, &r, 0.5f, 0.0f);
        fill(dy, NC, &r, 1.0f, 0.0f);
        fill(dx, NC, &r, 1.0f, 0.0f); /* backward adds into what is there */
        fill(dw, C, &r, 1.0f, 0.0f);
        fill(db, C, &r, 1.0f, 0.0f);
        float *d_x = devf(x, NC), *d_w = devf(w, C), *d_b = devf(b, C), *d_out = devf(out, NC),
              *d_mean = devf(mean, N), *d_rstd = devf(rstd, N), *d_dy = devf(dy, NC),
              *d_dx = devf(dx, NC), *d_dw = devf(dw, C), *d_db = devf(db, C);
        vl_error err = {0};
        kernels_layernorm_forward(out, mean, rstd, x, w, b, N, C);
        ok(kernels_cuda_layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, &err), &err,
           "layernorm forward");
        expect("layernorm out", d_out, out, NC, 1e-5);
        expect("layernorm mean", d_mean, mean, N, 1e-5);
        expect("layernorm rstd", d_rstd, rstd, N, 1e-5);
        kernels_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C);
        ok(kernels_cuda_layernorm_backward(d_dx, d_dw, d_db, d_dy, d_x, d_w, d_mean, d_rstd, N, C,
                                           &err),
           &err, "layernorm backward");
        expect("layernorm dinp", d_dx, dx, NC, 1e-4);
        expect("layernorm dweight", d_dw, dw, C, 1e-4);
        expect("layernorm dbias", d_db, db, C, 1e-4);
        float *hs[] = {x, w, b, out, mean, rstd, dy, dx, dw, db};
        float *ds[] = {d_x, d_w, d_b, d_out, d_mean, d_rstd, d_dy, d_dx, d_dw, d_db};
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) {
            free(hs[i]);
            kernels_cuda_free(ds[i]);
        }
    }
}

/* ---- matrix products ------------------------------------------------------------------ */

/* Adds sum_k |a(i,k)| |b(k,j)| into s[i*J + j] for i < I, j < J, where
 * a(i,k) = a[i*ai + k*ak] and b(k,j) = b[k*bk + j*bj] (the strides make
 * the transposes): how large the products behind each element of a
 * product are, which is what rounding its inputs to bf16 is relative to. */
static void add_abs_products(double *s, const float *a, size_t ai, size_t ak, const float *b,
                             size_t bk, size_t bj, int I, int J, int K) {
    for (int i = 0; i < I; i++)
        for (int j = 0; j < J; j++) {
            double sum = 0;
            for (int k = 0; k < K; k++)
                sum += fabs((double)a[(size_t)i * ai + (size_t)k * ak]) *
                       fabs((double)b[(size_t)k * bk + (size_t)j * bj]);
            s[(size_t)i * J + j] += sum;
        }
}

static double *dbuf(size_t n) {
    double *p = calloc(n ? n : 1, sizeof(double));
    assert_non_null(p);
    return p;
}

/* Compares device d with host c over n floats of a bf16 product: each
 * element within tol * s[i] (s: add_abs_products' sums behind it) plus
 * 4 fp32 ulps of c[i] for what was added in fp32. Prints the worst
 * |gpu - cpu| / (s + 4 ulps / tol), which the test holds to tol. */
static void expect_products(const char *what, const float *d, const float *c, const double *s,
                            size_t n, double tol) {
    float *g = back(d, n);
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)g[i] - c[i]);
        double scale = s[i] + 4 * FLT_EPSILON * fabs(c[i]) / tol;
        double q = e == 0 ? 0 : scale > 0 ? e / scale : INFINITY;
        if (!(q <= worst)) worst = isnan(q) ? INFINITY : q, at = i;
    }
    printf("%s: worst |GPU - CPU| / sum|a||b| %.3g (tolerance %.3g)\n", what, worst, tol);
    if (!(worst <= tol))
        fail_msg("%s: element %zu is %.9g on the GPU, %.9g on the CPU, sum|a||b| %.3g: "
                 "%.3g of it (tolerance %.3g)",
                 what, at, (double)g[at], (double)c[at], s[at], worst, tol);
    free(g);
}

/* One comparison of a matmul case: a relative error in fp32, the product
 * bound in bf16. */
static void expect_mm(const char *shape, const char *what, const float *d, const float *c,
                      const double *s, size_t n, int bf16, double tol) {
    char label[192];
    snprintf(label, sizeof label, "%s %s", shape, what);
    if (bf16)
        expect_products(label, d, c, s, n, tol);
    else
        expect(label, d, c, n, tol);
}

/* The matrix products against the CPU's. tol: the relative error in fp32;
 * in bf16, the bound per product magnitude (the fp32 sum's K 2^-24 is
 * added here). */
static void matmul_case(kernels_cuda_ctx *ctx, int N, int IN, int OUT, int with_bias, int with_dinp,
                        double tol, vl_rng *r) {
    size_t ni = (size_t)N * IN, no = (size_t)N * OUT, nw = (size_t)IN * OUT;
    float *x = hbuf(ni), *w = hbuf(nw), *bias = hbuf(OUT), *out = hbuf(no), *dy = hbuf(no),
          *dx = hbuf(ni), *dw = hbuf(nw), *db = hbuf(OUT), *ones = hbuf(N);
    fill(x, ni, r, 1.0f, 0.0f);
    fill(w, nw, r, 0.2f, 0.0f);
    fill(bias, OUT, r, 1.0f, 0.0f);
    fill(dy, no, r, 1.0f, 0.0f);
    fill(dx, ni, r, 1.0f, 0.0f);
    fill(dw, nw, r, 1.0f, 0.0f);
    fill(db, OUT, r, 1.0f, 0.0f);
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    float *d_x = devf(x, ni), *d_w = devf(w, nw), *d_bias = devf(bias, OUT), *d_out = devf(out, no),
          *d_dy = devf(dy, no), *d_dx = devf(dx, ni), *d_dw = devf(dw, nw), *d_db = devf(db, OUT);
    int bf16 = kernels_cuda_ctx_math(ctx) == KERNELS_CUDA_BF16;
    if (bf16) {
        int K = N > IN ? N : IN;
        tol += (K > OUT ? K : OUT) * ldexp(1.0, -24);
    }
    /* The product magnitudes behind each output, accumulated like the
     * outputs: dinp and dweight take two backward passes each. */
    double *s_out = dbuf(no), *s_wt = dbuf(no), *s_dx = dbuf(ni), *s_dw = dbuf(nw),
           *s_db = dbuf(OUT);
    add_abs_products(s_out, x, IN, 1, w, OUT, 1, N, OUT, IN);
    if (with_dinp) add_abs_products(s_dx, dy, OUT, 1, w, 1, OUT, N, IN, OUT);
    add_abs_products(s_dw, x, 1, IN, dy, OUT, 1, IN, OUT, N);
    if (with_bias) add_abs_products(s_db, ones, 0, 1, dy, OUT, 1, 1, OUT, N);
    vl_error err = {0};
    char shape[128];
    snprintf(shape, sizeof shape, "matmul N=%d IN=%d OUT=%d bias=%d dinp=%d (%s)", N, IN, OUT,
             with_bias, with_dinp, kernels_cuda_math_name(kernels_cuda_ctx_math(ctx)));
    kernels_matmul_forward(out, x, w, with_bias ? bias : NULL, N, IN, OUT);
    ok(kernels_cuda_matmul_forward(ctx, d_out, d_x, d_w, with_bias ? d_bias : NULL, N, IN, OUT,
                                   &err),
       &err, shape);
    expect_mm(shape, "out", d_out, out, s_out, no, bf16, tol);
    kernels_matmul_backward(with_dinp ? dx : NULL, dw, with_bias ? db : NULL, dy, x, w, N, IN, OUT);
    ok(kernels_cuda_matmul_backward(ctx, with_dinp ? d_dx : NULL, d_dw, with_bias ? d_db : NULL,
                                    d_dy, d_x, d_w, N, IN, OUT, &err),
       &err, shape);
    expect_mm(shape, "dinp", d_dx, dx, s_dx, ni, bf16, tol);
    expect_mm(shape, "dweight", d_dw, dw, s_dw, nw, bf16, tol);
    expect_mm(shape, "dbias", d_db, db, s_db, OUT, bf16, tol);
    /* The tied-head product: w read as [OUT, IN]. */
    add_abs_products(s_wt, x, IN, 1, w, 1, IN, N, OUT, IN);
    if (with_dinp) add_abs_products(s_dx, dy, OUT, 1, w, IN, 1, N, IN, OUT);
    add_abs_products(s_dw, dy, 1, OUT, x, IN, 1, OUT, IN, N);
    kernels_matmul_wt_forward(out, x, w, N, IN, OUT);
    ok(kernels_cuda_matmul_wt_forward(ctx, d_out, d_x, d_w, N, IN, OUT, &err), &err, shape);
    expect_mm(shape, "wt out", d_out, out, s_wt, no, bf16, tol);
    kernels_matmul_wt_backward(with_dinp ? dx : NULL, dw, dy, x, w, N, IN, OUT);
    ok(kernels_cuda_matmul_wt_backward(ctx, with_dinp ? d_dx : NULL, d_dw, d_dy, d_x, d_w, N, IN,
                                       OUT, &err),
       &err, shape);
    expect_mm(shape, "wt dinp", d_dx, dx, s_dx, ni, bf16, tol);
    expect_mm(shape, "wt dweight", d_dw, dw, s_dw, nw, bf16, tol);
    float *hs[] = {x, w, bias, out, dy, dx, dw, db, ones};
    float *ds[] = {d_x, d_w, d_bias, d_out, d_dy, d_dx, d_dw, d_db};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) kernels_cuda_free(ds[i]);
    free(s_out), free(s_wt), free(s_dx), free(s_dw), free(s_db);
}

/* 1x1x1 is a single product plus a bias or an earlier gradient, which can
 * cancel to almost nothing. */
static const int mm_shapes[][3] = {{1, 1, 1}, {7, 33, 65}, {130, 96, 257}, {64, 128, 384}};

static void test_matmul_fp32(void **state) {
    (void)state;
    kernels_cuda_ctx *ctx = ctx_of(KERNELS_CUDA_FP32);
    vl_rng r;
    vl_rng_seed(&r, 12);
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++)
        for (int v = 0; v < 4; v++)
            matmul_case(ctx, mm_shapes[s][0], mm_shapes[s][1], mm_shapes[s][2], v & 1, v >> 1, 1e-5,
                        &r);
    kernels_cuda_ctx_destroy(ctx);
}

/* Rounding each of a product's two inputs to bf16 (8-bit significand,
 * round to nearest) moves it by at most (1 + 2^-8)^2 - 1 of itself. */
#define BF16_PRODUCT_TOL (0x1p-7 + 0x1p-16)

static void test_matmul_bf16(void **state) {
    (void)state;
    kernels_cuda_ctx *ctx = ctx_of(KERNELS_CUDA_BF16);
    vl_rng r;
    vl_rng_seed(&r, 13);
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++)
        matmul_case(ctx, mm_shapes[s][0], mm_shapes[s][1], mm_shapes[s][2], 1, 1, BF16_PRODUCT_TOL,
                    &r);
    kernels_cuda_ctx_destroy(ctx);
}

/* ---- attention ------------------------------------------------------------------------- */

static void test_attention(void **state) {
    (void)state;
    const int shapes[][4] = {{1, 1, 8, 2}, {2, 33, 48, 3}, {3, 70, 64, 4}, {1, 129, 32, 1}};
    kernels_cuda_ctx *ctx = ctx_of(KERNELS_CUDA_FP32);
    vl_rng r;
    vl_rng_seed(&r, 14);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
        size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C,
               natt = (size_t)B * NH * T * T;
        float *qkv = hbuf(nqkv), *out = hbuf(nout), *att = hbuf(natt), *dy = hbuf(nout),
              *dqkv = hbuf(nqkv), *scratch = hbuf(kernels_attention_scratch_floats(B, T, NH));
        fill(qkv, nqkv, &r, 1.0f, 0.0f);
        fill(dy, nout, &r, 1.0f, 0.0f);
        fill(dqkv, nqkv, &r, 1.0f, 0.0f);
        size_t nscr = kernels_cuda_attention_scratch_floats(B, T, NH);
        assert_int_equal(nscr, natt);
        float *d_qkv = devf(qkv, nqkv), *d_out = devf(out, nout), *d_att = devf(att, natt),
              *d_dy = devf(dy, nout), *d_dqkv = devf(dqkv, nqkv), *d_scr = devf(att, nscr);
        vl_error err = {0};
        kernels_attention_forward(out, att, qkv, B, T, C, NH);
        ok(kernels_cuda_attention_forward(ctx, d_out, d_att, d_qkv, B, T, C, NH, &err), &err,
           "attention forward");
        expect("attention out", d_out, out, nout, 1e-5);
        expect("attention probabilities", d_att, att, natt, 1e-5);
        kernels_attention_backward(dqkv, scratch, dy, qkv, att, B, T, C, NH);
        ok(kernels_cuda_attention_backward(ctx, d_dqkv, d_scr, d_dy, d_qkv, d_att, B, T, C, NH,
                                           &err),
           &err, "attention backward");
        expect("attention dqkv", d_dqkv, dqkv, nqkv, 1e-4);
        float *hs[] = {qkv, out, att, dy, dqkv, scratch};
        float *ds[] = {d_qkv, d_out, d_att, d_dy, d_dqkv, d_scr};
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) {
            free(hs[i]);
            kernels_cuda_free(ds[i]);
        }
    }
    kernels_cuda_ctx_destroy(ctx);
}

/* ---- element-wise, embedding -------------------------------------------------------------- */

static void test_elementwise(void **state) {
    (void)state;
    const size_t sizes[] = {1, 255, 257, 100003};
    vl_rng r;
    vl_rng_seed(&r, 15);
    vl_error err = {0};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = hbuf(n), *y = hbuf(n), *dy = hbuf(n), *dx = hbuf(n), *db = hbuf(n);
        fill(x, n, &r, 2.0f, 0.0f);
        fill(dy, n, &r, 1.0f, 0.0f);
        fill(dx, n, &r, 1.0f, 0.0f);
        fill(db, n, &r, 1.0f, 0.0f);
        float *d_x = devf(x, n), *d_y = devf(y, n), *d_dy = devf(dy, n), *d_dx = devf(dx, n),
              *d_db = devf(db, n);
        kernels_gelu_forward(y, x, n);
        ok(kernels_cuda_gelu_forward(d_y, d_x, n, &err), &err, "gelu");
        expect("gelu", d_y, y, n, 1e-5);
        kernels_gelu_backward(dx, x, dy, n);
        ok(kernels_cuda_gelu_backward(d_dx, d_x, d_dy, n, &err), &err, "gelu backward");
        expect("gelu backward", d_dx, dx, n, 1e-5);
        kernels_residual_forward(y, x, dy, n);
        ok(kernels_cuda_residual_forward(d_y, d_x, d_dy, n, &err), &err, "residual");
        expect("residual", d_y, y, n, 1e-6);
        kernels_residual_backward(dx, db, dy, n);
        ok(kernels_cuda_residual_backward(d_dx, d_db, d_dy, n, &err), &err, "residual backward");
        expect("residual da", d_dx, dx, n, 1e-5);
        expect("residual db", d_db, db, n, 1e-5);
        float *hs[] = {x, y, dy, dx, db};
        float *ds[] = {d_x, d_y, d_dy, d_dx, d_db};
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) {
            free(hs[i]);
            kernels_cuda_free(ds[i]);
        }
    }
}

static void test_encoder(void **state) {
    (void)state;
    /* B, T, C, V: small vocabularies repeat tokens, which the token
     * gradient's atomics must add up. */
    const int shapes[][4] = {{1, 1, 1, 1}, {2, 33, 50, 7}, {4, 65, 96, 67}};
    vl_rng r;
    vl_rng_seed(&r, 16);
    vl_error err = {0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], V = shapes[s][3];
        size_t bt = (size_t)B * T, n = bt * C;
        int *tok = malloc(bt * sizeof(int));
        assert_non_null(tok);
        for (size_t i = 0; i < bt; i++) tok[i] = (int)vl_rng_below(&r, (uint32_t)V);
        float *wte = hbuf((size_t)V * C), *wpe = hbuf((size_t)T * C), *out = hbuf(n), *dy = hbuf(n);
        fill(wte, (size_t)V * C, &r, 1.0f, 0.0f);
        fill(wpe, (size_t)T * C, &r, 1.0f, 0.0f);
        fill(dy, n, &r, 1.0f, 0.0f);
        int *d_tok = dev(tok, bt * sizeof(int));
        float *d_wte = devf(wte, (size_t)V * C), *d_wpe = devf(wpe, (size_t)T * C),
              *d_out = devf(out, n), *d_dy = devf(dy, n);
        kernels_encoder_forward(out, tok, wte, wpe, B, T, C);
        ok(kernels_cuda_encoder_forward(d_out, d_tok, d_wte, d_wpe, B, T, C, &err), &err,
           "encoder");
        expect("encoder", d_out, out, n, 1e-6);
        /* The gradients add into the (non-zero) tables. */
        kernels_encoder_backward(wte, wpe, dy, tok, B, T, C);
        ok(kernels_cuda_encoder_backward(d_wte, d_wpe, d_dy, d_tok, B, T, C, &err), &err,
           "encoder backward");
        expect("encoder dwte", d_wte, wte, (size_t)V * C, 1e-5);
        expect("encoder dwpe", d_wpe, wpe, (size_t)T * C, 1e-5);
        free(tok);
        kernels_cuda_free(d_tok);
        float *hs[] = {wte, wpe, out, dy};
        float *ds[] = {d_wte, d_wpe, d_out, d_dy};
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) {
            free(hs[i]);
            kernels_cuda_free(ds[i]);
        }
    }
}

/* ---- softmax + cross-entropy ---------------------------------------------------------- */

static void test_softmax_xent(void **state) {
    (void)state;
    const int shapes[][2] = {{1, 1}, {5, 257}, {9, 50257}, {33, 1000}};
    vl_rng r;
    vl_rng_seed(&r, 17);
    vl_error err = {0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], V = shapes[s][1];
        size_t n = (size_t)N * V;
        int *tg = malloc((size_t)N * sizeof(int));
        assert_non_null(tg);
        for (int i = 0; i < N; i++) tg[i] = (int)vl_rng_below(&r, (uint32_t)V);
        float *logits = hbuf(n), *probs = hbuf(n), *loss = hbuf(N);
        fill(logits, n, &r, 3.0f, 1.0f);
        int *d_tg = dev(tg, (size_t)N * sizeof(int));
        float *d_logits = devf(logits, n), *d_probs = devf(probs, n), *d_loss = devf(loss, N);
        /* Without targets: probabilities only. */
        kernels_softmax_xent_forward(probs, NULL, logits, NULL, N, V);
        ok(kernels_cuda_softmax_xent_forward(d_probs, NULL, d_logits, NULL, N, V, &err), &err,
           "softmax");
        expect("softmax probabilities", d_probs, probs, n, 1e-5);
        /* With targets, in place (probs aliasing logits) as the model runs
         * it. */
        kernels_softmax_xent_forward(logits, loss, logits, tg, N, V);
        ok(kernels_cuda_softmax_xent_forward(d_logits, d_loss, d_logits, d_tg, N, V, &err), &err,
           "softmax_xent");
        expect("softmax_xent probabilities", d_logits, logits, n, 1e-5);
        expect("softmax_xent losses", d_loss, loss, (size_t)N, 1e-5);
        kernels_softmax_xent_backward(logits, logits, tg, 1.0f / (float)N, N, V);
        ok(kernels_cuda_softmax_xent_backward(d_logits, d_logits, d_tg, 1.0f / (float)N, N, V,
                                              &err),
           &err, "softmax_xent backward");
        expect("softmax_xent dlogits", d_logits, logits, n, 1e-5);
        free(tg), free(logits), free(probs), free(loss);
        kernels_cuda_free(d_tg), kernels_cuda_free(d_logits), kernels_cuda_free(d_probs);
        kernels_cuda_free(d_loss);
    }
}

/* ---- the training step ---------------------------------------------------------------- */

/* Relative L2 distance of a from b. */
static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

/* Two AdamW steps of a small GPT (sizes off every block multiple) on the
 * CPU and the device from the same weights and batches; compares loss,
 * output, gradients and the updated parameters. */
static void gpt_compare(kernels_cuda_math math) {
    int fp32 = math == KERNELS_CUDA_FP32;
    model_gpt_config cfg = CFG;
    int B = 3, T = 19, N = B * T;
    vl_error err = {0};
    model_gpt *cpu = NULL;
    ok(model_gpt_create(&cfg, &cpu, &err), &err, "cpu model");
    model_gpt_init_weights(cpu, 21);
    model_gpt_cuda *gpu = NULL;
    ok(model_gpt_cuda_create(cpu, math, &gpu, &err), &err, "gpu model");
    size_t np = model_gpt_num_params(cpu);
    assert_int_equal(model_gpt_cuda_num_params(gpu), np);
    model_adamw opt;
    ok(model_adamw_init(&opt, np, LR, B1, B2, EPS, WD, &err), &err, "adamw");
    int *in = malloc((size_t)N * sizeof(int)), *tg = malloc((size_t)N * sizeof(int));
    float *g_grads = hbuf(np), *g_out = hbuf((size_t)N * cfg.vocab_size);
    assert_true(in && tg);
    model_gpt *dl = NULL; /* receives the device parameters */
    ok(model_gpt_create(&cfg, &dl, &err), &err, "download model");
    const model_tensor *tab = NULL;
    int ntab = model_gpt_tensors(cpu, &tab);
    vl_rng r;
    vl_rng_seed(&r, 22);
    for (int step = 1; step <= 2; step++) {
        for (int i = 0; i < N; i++) {
            in[i] = (int)vl_rng_below(&r, (uint32_t)cfg.vocab_size);
            tg[i] = (int)vl_rng_below(&r, (uint32_t)cfg.vocab_size);
        }
        float lc = 0, lg = 0;
        ok(model_gpt_zero_grad(cpu, &err), &err, "cpu zero_grad");
        ok(model_gpt_cuda_zero_grad(gpu, &err), &err, "gpu zero_grad");
        ok(model_gpt_forward(cpu, in, tg, B, T, &lc, &err), &err, "cpu forward");
        ok(model_gpt_cuda_forward(gpu, in, tg, B, T, &lg, &err), &err, "gpu forward");
        const char *mn = kernels_cuda_math_name(math);
        double lrel = fabs((double)lg - lc) / fabs((double)lc);
        printf("step %d (%s): loss relative error %.3g (tolerance %.1g)\n", step, mn, lrel,
               fp32 ? 1e-5 : 2e-2);
        if (!(lrel <= (fp32 ? 1e-5 : 2e-2)))
            fail_msg("step %d (%s): loss %.7f on the GPU, %.7f on the CPU", step,
                     kernels_cuda_math_name(math), (double)lg, (double)lc);
        ok(model_gpt_cuda_download_output(gpu, g_out, (size_t)N * cfg.vocab_size, &err), &err,
           "output");
        double oe = test_max_rel_err(g_out, model_gpt_output(cpu), (size_t)N * cfg.vocab_size);
        printf("step %d (%s): probabilities error %.3g (tolerance %.1g)\n", step, mn, oe,
               fp32 ? 1e-5 : 5e-2);
        if (!(oe <= (fp32 ? 1e-5 : 5e-2)))
            fail_msg("step %d: probabilities differ by %.3g", step, oe);
        ok(model_gpt_backward(cpu, &err), &err, "cpu backward");
        ok(model_gpt_cuda_backward(gpu, &err), &err, "gpu backward");
        ok(model_gpt_cuda_download_grads(gpu, g_grads, np, &err), &err, "grads");
        const float *c_grads = model_gpt_grads(cpu);
        if (fp32) {
            double gworst = 0;
            int gt = 0;
            for (int t = 0; t < ntab; t++) {
                double e = test_max_rel_err(g_grads + tab[t].offset, c_grads + tab[t].offset,
                                            tab[t].numel);
                if (!(e <= gworst)) gworst = e, gt = t;
            }
            printf("step %d (fp32): worst tensor gradient error %.3g, %s (tolerance 1e-4)\n", step,
                   gworst, tab[gt].name);
            if (!(gworst <= 1e-4))
                fail_msg("step %d: gradient of %s differs by %.3g", step, tab[gt].name, gworst);
        } else {
            double e = rel_l2(g_grads, c_grads, np);
            printf("step %d (bf16): gradient relative L2 error %.3g (tolerance 5e-2)\n", step, e);
            if (!(e <= 5e-2)) fail_msg("step %d (bf16): gradient relative L2 error %.3g", step, e);
        }
        ok(model_adamw_step(&opt, cpu, &err), &err, "cpu adamw");
        ok(model_gpt_cuda_adamw_step(gpu, LR, B1, B2, EPS, WD, &err), &err, "gpu adamw");
        ok(model_gpt_cuda_download_params(gpu, dl, &err), &err, "params");
        const float *cp = model_gpt_params(cpu), *gp = model_gpt_params(dl);
        /* A parameter whose gradient is rounding noise (the key bias's is
         * zero in exact arithmetic) takes a step of noise/(|noise|+eps) on
         * either side, so only parameters with a gradient of at least 1e-3
         * of their tensor's largest are held to the step. */
        double worst = 0;
        for (int t = 0; t < ntab; t++) {
            const float *cg = c_grads + tab[t].offset;
            double gmax = 0;
            for (size_t i = 0; i < tab[t].numel; i++) gmax = fmax(gmax, fabs(cg[i]));
            for (size_t i = 0; i < tab[t].numel; i++)
                if (fabs(cg[i]) >= 1e-3 * gmax) {
                    size_t k = tab[t].offset + i;
                    double d = fabs((double)gp[k] - cp[k]);
                    if (!(d <= worst)) worst = isnan(d) ? INFINITY : d; /* a NaN must not hide */
                }
        }
        printf("step %d (%s): parameters after AdamW differ by at most %.3g lr (tolerance "
               "%.2g lr)\n",
               step, mn, worst / LR, fp32 ? 0.05 : 2.5);
        /* bf16 gradients move a step's direction, not just its rounding. */
        if (fp32 && !(worst <= 0.05 * LR))
            fail_msg("step %d: parameters after AdamW differ by %.3g (lr %g)", step, worst,
                     (double)LR);
        if (!fp32 && !(worst <= 2.5 * LR))
            fail_msg("step %d (bf16): parameters differ by %.3g", step, worst);
        /* Continue both from the CPU's parameters, so step 2 compares one
         * step again rather than accumulated drift. */
        ok(model_gpt_cuda_upload_params(gpu, cpu, &err), &err, "upload");
    }
    free(in), free(tg), free(g_grads), free(g_out);
    model_adamw_free(&opt);
    model_gpt_free(dl);
    model_gpt_free(cpu);
    model_gpt_cuda_free(gpu);
}

static void test_gpt_step_fp32(void **state) {
    (void)state;
    gpt_compare(KERNELS_CUDA_FP32);
}

static void test_gpt_step_bf16(void **state) {
    (void)state;
    gpt_compare(KERNELS_CUDA_BF16);
}

/* ---- clipping and the optimizer's state ------------------------------------------ */

/* Device clipping against the host rule on the device's own gradients, and
 * AdamW state that goes in, steps, and comes out as the CPU's would. */
static void test_clip_and_adamw_state(void **state) {
    (void)state;
    model_gpt_config cfg = {
        .vocab_size = 29, .block_size = 12, .n_layer = 1, .n_head = 2, .n_embd = 20};
    vl_error err = {0};
    model_gpt *cpu = NULL;
    ok(model_gpt_create(&cfg, &cpu, &err), &err, "cpu model");
    model_gpt_init_weights(cpu, 5);
    model_gpt_cuda *gpu = NULL;
    ok(model_gpt_cuda_create(cpu, KERNELS_CUDA_FP32, &gpu, &err), &err, "gpu model");
    size_t np = model_gpt_num_params(cpu);
    int in[2 * 11], tg[2 * 11];
    for (int i = 0; i < 22; i++)
        in[i] = (i * 7) % cfg.vocab_size, tg[i] = (i * 5 + 3) % cfg.vocab_size;
    float loss = 0;
    ok(model_gpt_cuda_forward(gpu, in, tg, 2, 11, &loss, &err), &err, "forward");
    ok(model_gpt_cuda_backward(gpu, &err), &err, "backward");
    float *g = hbuf(np), *gc = hbuf(np);
    ok(model_gpt_cuda_download_grads(gpu, g, np, &err), &err, "grads");
    double want = 0;
    for (size_t i = 0; i < np; i++) want += (double)g[i] * g[i];
    double g2 = 0;
    ok(model_gpt_cuda_clip_grads(gpu, 1e9, &g2, &err), &err, "norm");
    printf("squared gradient norm: relative error %.3g (tolerance 1e-12)\n",
           fabs(g2 - want) / want);
    assert_true(fabs(g2 - want) <= 1e-12 * want);
    ok(model_gpt_cuda_download_grads(gpu, gc, np, &err), &err, "grads");
    assert_memory_equal(g, gc, np * sizeof(float)); /* under the cap: untouched */
    double cap = sqrt(g2) / 4;
    ok(model_gpt_cuda_clip_grads(gpu, cap, &g2, &err), &err, "clip");
    ok(model_gpt_cuda_download_grads(gpu, gc, np, &err), &err, "grads");
    float scale = (float)(cap / sqrt(g2));
    for (size_t i = 0; i < np; i++)
        if (gc[i] != g[i] * scale)
            fail_msg("clipped gradient %zu: %g, not %g", i, gc[i], g[i] * scale);

    /* State in, one step on each side from it, state out. */
    model_adamw opt;
    ok(model_adamw_init(&opt, np, LR, B1, B2, EPS, WD, &err), &err, "adamw");
    vl_rng r;
    vl_rng_seed(&r, 6);
    for (size_t i = 0; i < np; i++) {
        opt.m[i] = vl_rng_normal(&r) * 1e-3f;
        opt.v[i] = fabsf(vl_rng_normal(&r)) * 1e-6f;
    }
    opt.step = 3;
    ok(model_gpt_cuda_set_adamw(gpu, opt.m, opt.v, np, opt.step, &err), &err, "set");
    /* The host model has no gradient buffer until zero_grad or backward. */
    ok(model_gpt_zero_grad(cpu, &err), &err, "cpu zero_grad");
    memcpy(model_gpt_grads(cpu), gc, np * sizeof(float));
    ok(model_adamw_step(&opt, cpu, &err), &err, "cpu adamw");
    ok(model_gpt_cuda_adamw_step(gpu, LR, B1, B2, EPS, WD, &err), &err, "gpu adamw");
    float *m = hbuf(np), *v = hbuf(np);
    long step = 0;
    ok(model_gpt_cuda_get_adamw(gpu, m, v, np, &step, &err), &err, "get");
    assert_int_equal(step, 4);
    assert_int_equal(opt.step, 4);
    double mw = 0, vw = 0; /* NaN-proof maxima of |GPU - CPU| / (1 + |CPU|) */
    for (size_t i = 0; i < np; i++) {
        double em = fabs((double)m[i] - opt.m[i]) / (1 + fabs(opt.m[i])),
               ev = fabs((double)v[i] - opt.v[i]) / (1 + fabs(opt.v[i]));
        mw = em <= mw ? mw : isnan(em) ? INFINITY : em;
        vw = ev <= vw ? vw : isnan(ev) ? INFINITY : ev;
    }
    printf("AdamW m and v: worst |GPU - CPU| / (1 + |CPU|) %.3g and %.3g (tolerance 1e-6)\n", mw,
           vw);
    assert_true(mw <= 1e-6 && vw <= 1e-6);
    /* The same step from the same floats, in fp32 on both sides: they may
     * differ only in the rounding of the step (a step is about lr) and of
     * the parameter it lands on. */
    model_gpt *dl = NULL;
    ok(model_gpt_create(&cfg, &dl, &err), &err, "download model");
    ok(model_gpt_cuda_download_params(gpu, dl, &err), &err, "params");
    const float *cp = model_gpt_params(cpu), *gp = model_gpt_params(dl);
    double pw = 0, dmax = 0;
    size_t at = 0;
    for (size_t i = 0; i < np; i++) {
        double d = fabs((double)gp[i] - cp[i]);
        double q = d / (4 * FLT_EPSILON * fabs(cp[i]) + 1e-5 * LR);
        if (!(q <= pw)) pw = isnan(q) ? INFINITY : q, at = i;
        dmax = fmax(dmax, d);
    }
    printf("AdamW parameters: max |GPU - CPU| %.3g, worst %.3g of the tolerance (4 ulps + 1e-5 "
           "lr)\n",
           dmax, pw);
    if (!(pw <= 1))
        fail_msg("parameter %zu after AdamW: %.9g on the GPU, %.9g on the CPU", at, (double)gp[at],
                 (double)cp[at]);
    model_gpt_free(dl);
    assert_int_equal(model_gpt_cuda_set_adamw(gpu, NULL, NULL, np, 2, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_get_adamw(gpu, m, v, np - 1, &step, &err), VL_EINVAL);
    ok(model_gpt_cuda_set_adamw(gpu, NULL, NULL, np, 0, &err), &err, "reset");
    ok(model_gpt_cuda_get_adamw(gpu, m, v, np, &step, &err), &err, "get");
    assert_int_equal(step, 0);
    for (size_t i = 0; i < np; i++) assert_true(m[i] == 0 && v[i] == 0);
    free(g), free(gc), free(m), free(v);
    model_adamw_free(&opt);
    model_gpt_cuda_free(gpu);
    model_gpt_free(cpu);
}

/* ---- refusals --------------------------------------------------------------------------- */

static void test_bad_args(void **state) {
    (void)state;
    vl_error err = {0};
    kernels_cuda_ctx *ctx = NULL;
    assert_int_equal(kernels_cuda_ctx_create((kernels_cuda_math)7, &ctx, &err), VL_EINVAL);
    assert_null(ctx);
    float *d = NULL;
    ok(kernels_cuda_alloc((void **)&d, 64 * sizeof(float), &err), &err, "alloc");
    assert_int_equal(kernels_cuda_layernorm_forward(d, d, d, d, d, d, 0, 4, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_gelu_forward(d, d, 0, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_softmax_xent_forward(d, NULL, d, (const int *)d, 2, 2, &err),
                     VL_EINVAL);
    ctx = ctx_of(KERNELS_CUDA_FP32);
    assert_int_equal(kernels_cuda_attention_forward(ctx, d, d, d, 1, 2, 6, 4, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_matmul_forward(ctx, d, d, NULL, NULL, 2, 2, 2, &err), VL_EINVAL);
    kernels_cuda_ctx_destroy(ctx);
    kernels_cuda_free(d);

    model_gpt_config cfg = {
        .vocab_size = 16, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 8};
    model_gpt *cpu = NULL, *other = NULL;
    ok(model_gpt_create(&cfg, &cpu, &err), &err, "cpu model");
    model_gpt_config cfg2 = cfg;
    cfg2.n_embd = 16;
    ok(model_gpt_create(&cfg2, &other, &err), &err, "other model");
    model_gpt_cuda *gpu = NULL;
    ok(model_gpt_cuda_create(cpu, KERNELS_CUDA_FP32, &gpu, &err), &err, "gpu model");
    assert_int_equal(model_gpt_cuda_backward(gpu, &err), VL_EINVAL);
    int in[8] = {0, 1, 2, 3, 4, 5, 6, 16}, tg[8] = {0};
    float loss = 0, g1 = 0;
    assert_int_equal(model_gpt_cuda_forward(gpu, in, tg, 1, 8, &loss, &err), VL_EINVAL);
    in[7] = 7;
    assert_int_equal(model_gpt_cuda_forward(gpu, in, tg, 1, 9, &loss, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_download_grads(gpu, &g1, 1, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_upload_params(gpu, other, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_adamw_step(gpu, NAN, 0.9f, 0.95f, 1e-8f, 0, &err), VL_EINVAL);
    /* Without targets there is an output but nothing to differentiate. */
    ok(model_gpt_cuda_forward(gpu, in, NULL, 1, 8, NULL, &err), &err, "forward");
    assert_int_equal(model_gpt_cuda_backward(gpu, &err), VL_EINVAL);
    model_gpt_cuda_free(gpu);
    model_gpt_free(cpu);
    model_gpt_free(other);
}

int main(void) {
    test_cuda_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_matmul_fp32),
        cmocka_unit_test(test_matmul_bf16),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_encoder),
        cmocka_unit_test(test_softmax_xent),
        cmocka_unit_test(test_gpt_step_fp32),
        cmocka_unit_test(test_gpt_step_bf16),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_clip_and_adamw_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
