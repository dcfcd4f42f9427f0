/*
 * The GPT's bfloat16-operand kernels (kernels/cuda_bf16.h) against the CPU
 * kernels. Without a usable device the program reports itself skipped
 * (exit 77) before any test runs.
 *
 * The CPU reference is given the operands already rounded to bfloat16, so
 * a product's inputs are the same on both sides and the products agree to
 * float32 accumulation (err = max |gpu - cpu| / max |cpu| within 1e-5
 * forward, 1e-4 for gradients summed over rows, as the float32 kernels
 * are held). What the device rounds on its own is held to that rounding:
 * an output stored as bfloat16 (8-bit significand, nearest) is off by at
 * most 2^-9 of itself, so by at most 2^-9 of the tensor's largest (bound
 * 4e-3 with the float32 work before it); the attention output and its
 * gradient are computed from such rounded probabilities and score
 * gradients, which move a term by 2^-8 of its size (bounds 1e-2 and 5e-2:
 * the score gradient's row sum is rounded too). An index or layout error
 * moves these by O(1).
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
#include "kernels/cuda_bf16.h"
#include "kernels/cuda_model.h"
#include "kernels/kernels.h"
#include "cuda_skip.h"
#include "gpt_cuda_fixtures.h"
#include "test_util.h"

/* ---- helpers ------------------------------------------------------------------ */

/* x rounded to the nearest bfloat16, ties to even (finite x). */
static uint16_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Fills x and rounds it to bfloat16 values, so host and device agree on
 * the operand. */
static void fill_rounded(float *x, size_t n, vl_rng *r, float scale) {
    fill(x, n, r, scale, 0.0f);
    for (size_t i = 0; i < n; i++) x[i] = bf16_value(bf16_bits(x[i]));
}

/* A device bfloat16 copy of host floats (rounded on the host). */
static kernels_bf16 *devh(const float *h, size_t n) {
    uint16_t *bits = malloc((n ? n : 1) * sizeof *bits);
    assert_non_null(bits);
    for (size_t i = 0; i < n; i++) bits[i] = bf16_bits(h[i]);
    vl_error err = {0};
    void *d = NULL;
    if (kernels_cuda_alloc(&d, (n ? n : 1) * sizeof *bits, &err) != 0 ||
        kernels_cuda_upload(d, bits, n * sizeof *bits, &err) != 0)
        fail_msg("device copy of %zu halves: %s", n, err.msg);
    free(bits);
    return d;
}

static float *back_h(const kernels_bf16 *d, size_t n) {
    uint16_t *bits = malloc((n ? n : 1) * sizeof *bits);
    assert_non_null(bits);
    vl_error err = {0};
    if (kernels_cuda_download(bits, d, n * sizeof *bits, &err) != 0)
        fail_msg("download: %s", err.msg);
    float *h = hbuf(n);
    for (size_t i = 0; i < n; i++) h[i] = bf16_value(bits[i]);
    free(bits);
    return h;
}

static void expect_h(const char *what, const kernels_bf16 *d, const float *c, size_t n,
                     double tol) {
    float *g = back_h(d, n);
    check(what, g, c, n, tol);
    free(g);
}

/* ---- conversion ------------------------------------------------------------------ */

/* Bit for bit against the host's rounding, ties included, on both the
 * paired and the single-value path (an odd length, a misaligned start). */
static void test_conversion(void **state) {
    (void)state;
    const size_t n = 10001;
    float *x = hbuf(n + 1);
    vl_rng r;
    vl_rng_seed(&r, 31);
    fill(x, n + 1, &r, 100.0f, 0.0f);
    /* Exact ties: halfway between two bfloat16 values, even and odd below. */
    const uint32_t ties[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x47ff8000u};
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++)
        memcpy(&x[i], &ties[i], sizeof(float));
    float *d_x = devf(x, n + 1);
    vl_error err = {0};
    kernels_bf16 *d_h = NULL;
    float *d_back = NULL;
    ok(kernels_cuda_alloc((void **)&d_h, (n + 1) * sizeof(kernels_bf16), &err), &err, "alloc");
    ok(kernels_cuda_alloc((void **)&d_back, (n + 1) * sizeof(float), &err), &err, "alloc");
    const size_t starts[] = {0, 1, 0}, lens[] = {n - 1, n - 1, n};
    for (size_t c = 0; c < 3; c++) {
        size_t s = starts[c], len = lens[c];
        ok(kernels_cuda_to_bf16(d_h, d_x + s, len, &err), &err, "to_bf16");
        uint16_t *bits = malloc(len * sizeof *bits);
        assert_non_null(bits);
        ok(kernels_cuda_download(bits, d_h, len * sizeof *bits, &err), &err, "download");
        for (size_t i = 0; i < len; i++)
            if (bits[i] != bf16_bits(x[s + i]))
                fail_msg("to_bf16 of %.9g (start %zu, length %zu): 0x%04x, not 0x%04x",
                         (double)x[s + i], s, len, bits[i], bf16_bits(x[s + i]));
        ok(kernels_cuda_from_bf16(d_back, d_h, len, &err), &err, "from_bf16");
        float *y = back(d_back, len);
        for (size_t i = 0; i < len; i++)
            if (y[i] != bf16_value(bits[i]))
                fail_msg("from_bf16 of 0x%04x gave %.9g", bits[i], (double)y[i]);
        free(y);
        free(bits);
    }
    printf("conversion: %zu values bit for bit, ties to even\n", n);
    assert_int_equal(kernels_cuda_to_bf16(NULL, d_x, 1, &err), VL_EINVAL);
    kernels_cuda_free(d_x);
    kernels_cuda_free(d_h);
    kernels_cuda_free(d_back);
    free(x);
}

/* ---- linear layers ----------------------------------------------------------------- */

static void matmul_case(kernels_cuda_ctx *ctx, int N, int IN, int OUT, vl_rng *r) {
    size_t ni = (size_t)N * IN, nw = (size_t)IN * OUT, no = (size_t)N * OUT;
    float *x = hbuf(ni), *w = hbuf(nw), *bias = hbuf(OUT), *out = hbuf(no), *dy = hbuf(no),
          *dx = hbuf(ni), *dw = hbuf(nw), *db = hbuf(OUT), *junk = hbuf(ni > no ? ni : no);
    fill_rounded(x, ni, r, 1.0f);
    fill_rounded(w, nw, r, 0.5f);
    fill(bias, OUT, r, 1.0f, 0.0f);
    fill_rounded(dy, no, r, 1.0f);
    fill(dw, nw, r, 1.0f, 0.0f); /* parameter gradients are added into */
    fill(db, OUT, r, 1.0f, 0.0f);
    fill(junk, ni > no ? ni : no, r, 9.0f, 5.0f); /* dinp is overwritten */
    kernels_bf16 *h_x = devh(x, ni), *h_w = devh(w, nw), *h_dy = devh(dy, no);
    float *d_bias = devf(bias, OUT), *d_out = devf(junk, no), *d_dy = devf(dy, no),
          *d_dx = devf(junk, ni), *d_dw = devf(dw, nw), *d_db = devf(db, OUT);
    char what[128];
    snprintf(what, sizeof what, "bf16 matmul N=%d IN=%d OUT=%d", N, IN, OUT);
    vl_error err = {0};
    kernels_matmul_forward(out, x, w, bias, N, IN, OUT);
    ok(kernels_cuda_matmul_forward_bf16(ctx, d_out, h_x, h_w, d_bias, N, IN, OUT, &err), &err,
       what);
    expect(what, d_out, out, no, 1e-5);
    kernels_matmul_backward(dx, dw, db, dy, x, w, N, IN, OUT);
    ok(kernels_cuda_matmul_backward_bf16(ctx, d_dx, d_dw, d_db, d_dy, h_dy, h_x, h_w, N, IN, OUT,
                                         &err),
       &err, what);
    expect("  dinp (overwritten)", d_dx, dx, ni, 1e-4);
    expect("  dweight (added)", d_dw, dw, nw, 1e-4);
    expect("  dbias (added)", d_db, db, OUT, 1e-4);
    /* The tied head: w read as [OUT, IN] (IN * OUT values either way),
     * with the output and its gradient in rows padded to ld; the padding
     * of dy holds junk that must not be read. */
    int ld = OUT + 8 + (8 - OUT % 8) % 8;
    size_t np = (size_t)N * ld;
    float *dyp = hbuf(np), *outp = NULL;
    for (size_t i = 0; i < np; i++)
        dyp[i] = (int)(i % (size_t)ld) < OUT ? dy[i / ld * OUT + i % ld] : 1e4f;
    kernels_bf16 *h_dyp = devh(dyp, np);
    float *d_outp = devf(dyp, np);
    kernels_matmul_wt_forward(out, x, w, N, IN, OUT);
    ok(kernels_cuda_matmul_wt_forward_bf16(ctx, d_outp, ld, h_x, h_w, N, IN, OUT, &err), &err,
       what);
    outp = back(d_outp, np);
    for (size_t i = 0; i < np; i++) {
        if ((int)(i % (size_t)ld) < OUT)
            dyp[i / ld * OUT + i % ld] = outp[i];
        else if (outp[i] != 1e4f)
            fail_msg("%s: wt forward wrote padding column %zu", what, i % ld);
    }
    check("  wt out (rows padded)", dyp, out, no, 1e-5);
    memset(dx, 0, ni * sizeof(float));
    ok(kernels_cuda_upload(d_dx, junk, ni * sizeof(float), &err), &err, "upload");
    kernels_matmul_wt_backward(dx, dw, dy, x, w, N, IN, OUT);
    ok(kernels_cuda_matmul_wt_backward_bf16(ctx, d_dx, d_dw, h_dyp, ld, h_x, h_w, N, IN, OUT, &err),
       &err, what);
    expect("  wt dinp (overwritten)", d_dx, dx, ni, 1e-4);
    expect("  wt dweight (added)", d_dw, dw, nw, 1e-4);
    assert_int_equal(
        kernels_cuda_matmul_wt_forward_bf16(ctx, d_outp, OUT - 1, h_x, h_w, N, IN, OUT, &err),
        VL_EINVAL);
    free(dyp);
    free(outp);
    kernels_cuda_free(h_dyp);
    kernels_cuda_free(d_outp);
    float *hs[] = {x, w, bias, out, dy, dx, dw, db, junk};
    void *ds[] = {h_x, h_w, h_dy, d_bias, d_out, d_dy, d_dx, d_dw, d_db};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) kernels_cuda_free(ds[i]);
}

static void test_matmul(void **state) {
    (void)state;
    const int shapes[][3] = {{1, 1, 1}, {7, 33, 65}, {130, 96, 257}, {64, 128, 384}};
    kernels_cuda_ctx *ctx = ctx_of(KERNELS_CUDA_BF16);
    vl_rng r;
    vl_rng_seed(&r, 32);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        matmul_case(ctx, shapes[s][0], shapes[s][1], shapes[s][2], &r);
    /* The plain product, used by the benchmark's baseline. */
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, -1, 2, 0.5f, 0.25f}, c[4] = {0};
    kernels_bf16 *h_a = devh(a, 6), *h_b = devh(b, 6);
    float *d_c = devf(c, 4);
    vl_error err = {0};
    ok(kernels_cuda_gemm_bf16(ctx, 0, 0, 2, 2, 3, 1.0f, h_a, 3, h_b, 2, 0.0f, d_c, 2, &err), &err,
       "gemm bf16");
    /* [1 2 3; 4 5 6] @ [1 0; -1 2; 0.5 0.25], every value exact. */
    const float want[4] = {0.5f, 4.75f, 2.0f, 11.5f};
    expect("gemm bf16 2x3x2", d_c, want, 4, 0.0);
    assert_int_equal(
        kernels_cuda_gemm_bf16(ctx, 0, 0, 0, 2, 3, 1.0f, h_a, 3, h_b, 2, 0.0f, d_c, 2, &err),
        VL_EINVAL);
    kernels_cuda_free(h_a);
    kernels_cuda_free(h_b);
    kernels_cuda_free(d_c);
    kernels_cuda_ctx_destroy(ctx);
}

/* ---- attention ----------------------------------------------------------------------- */

static void test_attention(void **state) {
    (void)state;
    const int shapes[][4] = {{1, 1, 8, 2}, {2, 33, 48, 3}, {3, 70, 64, 4}, {1, 129, 32, 1}};
    kernels_cuda_ctx *ctx = ctx_of(KERNELS_CUDA_BF16);
    vl_rng r;
    vl_rng_seed(&r, 33);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
        size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C,
               natt = (size_t)B * NH * T * T;
        float *qkv = hbuf(nqkv), *out = hbuf(nout), *att = hbuf(natt), *dy = hbuf(nout),
              *dqkv = hbuf(nqkv), *junk = hbuf(nqkv),
              *scratch = hbuf(kernels_attention_scratch_floats(B, T, NH));
        fill_rounded(qkv, nqkv, &r, 1.0f);
        fill_rounded(dy, nout, &r, 1.0f);
        fill(junk, nqkv, &r, 9.0f, 5.0f);
        kernels_bf16 *h_qkv = devh(qkv, nqkv), *h_dy = devh(dy, nout), *h_out = devh(out, nout),
                     *h_att = devh(att, natt), *h_ds = devh(att, natt);
        float *d_scores = devf(att, natt), *d_dp = devf(att, natt), *d_dqkv = devf(junk, nqkv);
        vl_error err = {0};
        char what[128];
        snprintf(what, sizeof what, "bf16 attention B=%d T=%d C=%d NH=%d", B, T, C, NH);
        kernels_attention_forward(out, att, qkv, B, T, C, NH);
        ok(kernels_cuda_attention_forward_bf16(ctx, h_out, d_scores, h_att, h_qkv, B, T, C, NH,
                                               &err),
           &err, what);
        printf("%s\n", what);
        expect_h("  probabilities", h_att, att, natt, 4e-3);
        expect_h("  out", h_out, out, nout, 1e-2);
        kernels_attention_backward(dqkv, scratch, dy, qkv, att, B, T, C, NH);
        ok(kernels_cuda_attention_backward_bf16(ctx, d_dqkv, d_dp, h_ds, h_dy, h_qkv, h_att, B, T,
                                                C, NH, &err),
           &err, what);
        expect("  dqkv (overwritten)", d_dqkv, dqkv, nqkv, 5e-2);
        float *hs[] = {qkv, out, att, dy, dqkv, junk, scratch};
        void *ds[] = {h_qkv, h_dy, h_out, h_att, h_ds, d_scores, d_dp, d_dqkv};
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
        for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) kernels_cuda_free(ds[i]);
    }
    kernels_cuda_ctx_destroy(ctx);
}

/* ---- LayerNorm, GELU, the loss's gradient ------------------------------------------- */

static void test_rowwise(void **state) {
    (void)state;
    vl_rng r;
    vl_rng_seed(&r, 34);
    vl_error err = {0};
    /* LayerNorm with a bfloat16 output; its statistics stay float32. */
    const int N = 130, C = 1000;
    size_t NC = (size_t)N * C;
    float *x = hbuf(NC), *w = hbuf(C), *b = hbuf(C), *out = hbuf(NC), *mean = hbuf(N),
          *rstd = hbuf(N);
    fill(x, NC, &r, 2.0f, 3.0f);
    fill(w, C, &r, 0.5f, 1.0f);
    fill(b, C, &r, 0.5f, 0.0f);
    float *d_x = devf(x, NC), *d_w = devf(w, C), *d_b = devf(b, C), *d_mean = devf(mean, N),
          *d_rstd = devf(rstd, N);
    kernels_bf16 *h_out = devh(out, NC);
    kernels_layernorm_forward(out, mean, rstd, x, w, b, N, C);
    ok(kernels_cuda_layernorm_forward_bf16(h_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, &err), &err,
       "layernorm bf16");
    expect_h("layernorm bf16 out", h_out, out, NC, 4e-3);
    expect("layernorm bf16 mean", d_mean, mean, N, 1e-5);
    expect("layernorm bf16 rstd", d_rstd, rstd, N, 1e-5);
    /* GELU forward into bfloat16, backward into both precisions. */
    float *dy = hbuf(NC), *y = hbuf(NC), *dx = hbuf(NC), *junk = hbuf(NC);
    fill(dy, NC, &r, 1.0f, 0.0f);
    fill(junk, NC, &r, 9.0f, 5.0f);
    float *d_dy = devf(dy, NC), *d_dx = devf(junk, NC);
    kernels_gelu_forward(y, x, NC);
    ok(kernels_cuda_gelu_forward_bf16(h_out, d_x, NC, &err), &err, "gelu bf16");
    expect_h("gelu bf16", h_out, y, NC, 4e-3);
    kernels_gelu_backward(dx, x, dy, NC);
    ok(kernels_cuda_gelu_backward_bf16(d_dx, h_out, d_x, d_dy, NC, &err), &err,
       "gelu bf16 backward");
    expect("gelu bf16 backward (overwritten)", d_dx, dx, NC, 1e-5);
    expect_h("gelu bf16 backward, rounded", h_out, dx, NC, 4e-3);
    /* The loss: probabilities and the gradient (into bfloat16) on rows
     * padded to ld, whose padding is neither read nor written. */
    const int V = 1000, ld = 1024;
    int *tg = malloc(N * sizeof(int));
    assert_non_null(tg);
    for (int i = 0; i < N; i++) tg[i] = (int)vl_rng_below(&r, (uint32_t)V);
    int *d_tg = NULL;
    ok(kernels_cuda_alloc((void **)&d_tg, N * sizeof(int), &err), &err, "alloc");
    ok(kernels_cuda_upload(d_tg, tg, N * sizeof(int), &err), &err, "upload");
    size_t np = (size_t)N * ld;
    float *logits = hbuf(NC), *probs = hbuf(NC), *dl = hbuf(NC), *loss = hbuf(N),
          *padded = hbuf(np);
    fill(logits, NC, &r, 3.0f, 1.0f);
    for (size_t i = 0; i < np; i++)
        padded[i] = (int)(i % ld) < V ? logits[i / ld * V + i % ld] : NAN;
    float *d_pad = devf(padded, np), *d_loss = devf(loss, N);
    kernels_softmax_xent_forward(probs, loss, logits, tg, N, V);
    ok(kernels_cuda_softmax_xent_forward_ld(d_pad, d_loss, d_pad, d_tg, N, V, ld, &err), &err,
       "xent forward, padded rows");
    expect("softmax_xent padded losses", d_loss, loss, N, 1e-5);
    float *gp = back(d_pad, np), *compact = hbuf(NC);
    for (size_t i = 0; i < np; i++) {
        if ((int)(i % ld) < V)
            compact[i / ld * V + i % ld] = gp[i];
        else if (!isnan(gp[i]))
            fail_msg("xent forward wrote padding column %zu", i % ld);
    }
    check("softmax_xent padded probabilities", compact, probs, NC, 1e-5);
    kernels_bf16 *h_dl = devh(padded, np);
    kernels_softmax_xent_backward(dl, probs, tg, 1.0f / N, N, V);
    ok(kernels_cuda_softmax_xent_backward_bf16(h_dl, d_pad, d_tg, 1.0f / N, N, V, ld, &err), &err,
       "xent bf16 backward");
    float *gl = back_h(h_dl, np);
    for (size_t i = 0; i < np; i++) {
        if ((int)(i % ld) < V)
            compact[i / ld * V + i % ld] = gl[i];
        else if (gl[i] != 0.0f)
            fail_msg("xent bf16 backward: padding column %zu is %g, not 0", i % ld, gl[i]);
    }
    check("softmax_xent bf16 backward, padded rows", compact, dl, NC, 4e-3);
    free(gp);
    free(gl);
    free(compact);
    free(padded);
    free(loss);
    kernels_cuda_free(d_pad);
    kernels_cuda_free(d_loss);
    kernels_cuda_free(h_dl);
    assert_int_equal(kernels_cuda_gelu_backward_bf16(d_dx, NULL, d_x, d_dy, NC, &err), VL_EINVAL);
    float *hs[] = {x, w, b, out, mean, rstd, dy, y, dx, junk, logits, probs, dl};
    void *ds[] = {d_x, d_w, d_b, d_mean, d_rstd, h_out, d_dy, d_dx, d_tg};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) kernels_cuda_free(ds[i]);
    free(tg);
}

/* The fused bias kernels against the host's float arithmetic, which
 * rounds the same way (no contraction): bit for bit where only additions
 * are involved, GELU to its bfloat16 rounding. */
static void test_bias(void **state) {
    (void)state;
    vl_rng r;
    vl_rng_seed(&r, 35);
    vl_error err = {0};
    const int N = 77, W = 300;
    size_t n = (size_t)N * W;
    float *x = hbuf(n), *y = hbuf(n), *bias = hbuf(W), *want = hbuf(n);
    fill(x, n, &r, 2.0f, 0.0f);
    fill(y, n, &r, 2.0f, 0.0f);
    fill(bias, W, &r, 1.0f, 0.0f);
    float *d_x = devf(x, n), *d_y = devf(y, n), *d_bias = devf(bias, W), *d_out = devf(y, n);
    kernels_bf16 *h_out = devh(y, n);
    /* x + bias, rounded. */
    ok(kernels_cuda_bias_to_bf16(h_out, d_x, d_bias, N, W, &err), &err, "bias to bf16");
    float *g = back_h(h_out, n);
    for (size_t i = 0; i < n; i++)
        if (g[i] != bf16_value(bf16_bits(x[i] + bias[i % W])))
            fail_msg("bias to bf16: element %zu is %.9g", i, (double)g[i]);
    free(g);
    /* a + (b + bias), also in place over a. */
    ok(kernels_cuda_residual_bias_forward(d_out, d_x, d_y, d_bias, N, W, &err), &err,
       "residual with bias");
    for (size_t i = 0; i < n; i++) want[i] = x[i] + (y[i] + bias[i % W]);
    expect("residual with bias", d_out, want, n, 0.0);
    ok(kernels_cuda_residual_bias_forward(d_x, d_x, d_y, d_bias, N, W, &err), &err,
       "residual with bias, in place");
    expect("residual with bias, in place", d_x, want, n, 0.0);
    /* x += bias in place, gelu(x) rounded. */
    ok(kernels_cuda_upload(d_x, x, n * sizeof(float), &err), &err, "upload");
    ok(kernels_cuda_bias_gelu_forward_bf16(d_x, h_out, d_bias, N, W, &err), &err, "bias and gelu");
    for (size_t i = 0; i < n; i++) want[i] = x[i] + bias[i % W];
    expect("bias and gelu: biased input", d_x, want, n, 0.0);
    kernels_gelu_forward(y, want, n);
    expect_h("bias and gelu: gelu", h_out, y, n, 4e-3);
    assert_int_equal(kernels_cuda_residual_bias_forward(d_out, d_x, d_y, NULL, N, W, &err),
                     VL_EINVAL);
    assert_int_equal(kernels_cuda_bias_to_bf16(h_out, d_x, d_bias, 0, W, &err), VL_EINVAL);
    free(x), free(y), free(bias), free(want);
    kernels_cuda_free(d_x), kernels_cuda_free(d_y), kernels_cuda_free(d_bias);
    kernels_cuda_free(d_out), kernels_cuda_free(h_out);
}

int main(void) {
    test_cuda_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversion), cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_attention),  cmocka_unit_test(test_rowwise),
        cmocka_unit_test(test_bias),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
