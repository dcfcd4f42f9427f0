/*
 * Unit tests for the CPU kernels: every backward pass against central finite
 * differences of its forward pass, forward passes against plain double
 * precision references, AdamW against a scalar reference, and
 * reproducibility across runs and thread counts.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <omp.h>

#include "common/common.h"
#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"
#include "tests/unit/test_util.h"

/* ---- helpers -------------------------------------------------------------- */

/* cmocka's assert_float_equal compares in float; these checks need double. */
static float *falloc(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

static void fill_normal(float *x, size_t n, vl_rng *r, float scale, float shift) {
    for (size_t i = 0; i < n; i++) x[i] = shift + scale * vl_rng_normal(r);
}

/* One differentiable input of a layer: its values and the analytic gradient
 * the backward kernel produced for it. */
typedef struct gc_input {
    const char *name;
    float *x;
    const float *dx;
    size_t n;
} gc_input;

/* A layer under test: forward() recomputes out from the inputs held in ctx;
 * the scalar loss is sum(out * proj) accumulated in double, so the gradient
 * fed to backward is exactly proj. */
typedef struct gc_case {
    void (*forward)(void *ctx);
    void *ctx;
    const float *out;
    size_t nout;
    const float *proj;
} gc_case;

static double gc_loss(const gc_case *c) {
    c->forward(c->ctx);
    double s = 0.0;
    for (size_t i = 0; i < c->nout; i++) s += (double)c->out[i] * (double)c->proj[i];
    return s;
}

/* Compares the analytic gradient of each input with central differences at
 * up to max_samples elements per input. Fails when the relative error of the
 * whole sample (L2) exceeds tol or any element is far off. */
static void gc_check(const char *layer, const gc_case *c, const gc_input *in, int nin,
                     int max_samples, float h, double tol) {
    vl_rng r;
    vl_rng_seed(&r, 1234);
    for (int k = 0; k < nin; k++) {
        size_t n = in[k].n;
        size_t ns = n <= (size_t)max_samples ? n : (size_t)max_samples;
        double dd = 0.0, nn = 0.0, aa = 0.0, worst = 0.0;
        double *num = calloc(ns, sizeof(double));
        double *ana = calloc(ns, sizeof(double));
        assert_non_null(num);
        assert_non_null(ana);
        for (size_t s = 0; s < ns; s++) {
            size_t i = ns == n ? s : (size_t)vl_rng_below(&r, (uint32_t)n);
            float saved = in[k].x[i];
            in[k].x[i] = saved + h;
            double lp = gc_loss(c);
            in[k].x[i] = saved - h;
            double lm = gc_loss(c);
            in[k].x[i] = saved;
            num[s] = (lp - lm) / (2.0 * (double)h);
            ana[s] = in[k].dx[i];
            dd += (num[s] - ana[s]) * (num[s] - ana[s]);
            nn += num[s] * num[s];
            aa += ana[s] * ana[s];
        }
        double rms = sqrt((nn + aa) / (2.0 * (double)ns));
        for (size_t s = 0; s < ns; s++) {
            double e = fabs(num[s] - ana[s]) / (fabs(num[s]) + fabs(ana[s]) + 0.1 * rms + 1e-12);
            if (e > worst) worst = e;
        }
        double rel = sqrt(dd) / (sqrt(nn) + sqrt(aa) + 1e-12);
        if (rel > tol || worst > 10 * tol)
            fail_msg("%s: gradient of %s off: relative L2 error %.3g, worst element %.3g "
                     "(tol %.3g, %zu samples)",
                     layer, in[k].name, rel, worst, tol, ns);
        free(num);
        free(ana);
    }
    /* Leave the forward state consistent with the unperturbed inputs. */
    (void)gc_loss(c);
}

typedef struct shape {
    int B, T, C, NH, V;
} shape;

/* Odd sizes on purpose: C not a multiple of 8, T = 1, single heads. The
 * last is large enough that products are split across threads and
 * attention takes several query blocks (T > 64, not a multiple of it). */
static const shape SHAPES[] = {
    {2, 5, 12, 3, 11}, {1, 1, 4, 1, 3},   {3, 7, 20, 5, 37},
    {2, 9, 18, 2, 64}, {1, 17, 36, 4, 5}, {2, 130, 24, 3, 300},
};
#define NSHAPES (int)(sizeof(SHAPES) / sizeof(SHAPES[0]))

/* ---- encoder -------------------------------------------------------------- */

typedef struct enc_ctx {
    float *out, *wte, *wpe;
    int *tok;
    int B, T, C;
} enc_ctx;

static void enc_fwd(void *p) {
    enc_ctx *c = p;
    kernels_encoder_forward(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
}

static void test_encoder_grad(void **state) {
    (void)state;
    for (int si = 0; si < NSHAPES; si++) {
        shape s = SHAPES[si];
        vl_rng r;
        vl_rng_seed(&r, 10 + si);
        size_t BT = (size_t)s.B * s.T;
        enc_ctx c = {falloc(BT * s.C),
                     falloc((size_t)s.V * s.C),
                     falloc((size_t)s.T * s.C),
                     calloc(BT, sizeof(int)),
                     s.B,
                     s.T,
                     s.C};
        assert_non_null(c.tok);
        for (size_t i = 0; i < BT; i++)
            c.tok[i] = (int)vl_rng_below(&r, (uint32_t)(i % 3 == 0 ? 2 : s.V)); /* repeats */
        fill_normal(c.wte, (size_t)s.V * s.C, &r, 1.0f, 0.0f);
        fill_normal(c.wpe, (size_t)s.T * s.C, &r, 1.0f, 0.0f);
        float *proj = falloc(BT * s.C), *dwte = falloc((size_t)s.V * s.C),
              *dwpe = falloc((size_t)s.T * s.C);
        fill_normal(proj, BT * s.C, &r, 1.0f, 0.0f);
        enc_fwd(&c);
        kernels_encoder_backward(dwte, dwpe, proj, c.tok, s.B, s.T, s.C);
        gc_case gc = {enc_fwd, &c, c.out, BT * s.C, proj};
        gc_input in[] = {{"wte", c.wte, dwte, (size_t)s.V * s.C},
                         {"wpe", c.wpe, dwpe, (size_t)s.T * s.C}};
        gc_check("encoder", &gc, in, 2, 200, 1e-2f, 1e-3);
        free(c.out), free(c.wte), free(c.wpe), free(c.tok), free(proj), free(dwte), free(dwpe);
    }
}

/* ---- layernorm ------------------------------------------------------------ */

typedef struct ln_ctx {
    float *out, *mean, *rstd, *inp, *w, *b;
    int N, C;
} ln_ctx;

static void ln_fwd(void *p) {
    ln_ctx *c = p;
    kernels_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
}

static void test_layernorm_forward_ref(void **state) {
    (void)state;
    vl_rng r;
    vl_rng_seed(&r, 3);
    int N = 7, C = 37;
    ln_ctx c = {falloc((size_t)N * C),
                falloc(N),
                falloc(N),
                falloc((size_t)N * C),
                falloc(C),
                falloc(C),
                N,
                C};
    fill_normal(c.inp, (size_t)N * C, &r, 3.0f, 5.0f); /* large mean on purpose */
    fill_normal(c.w, C, &r, 0.5f, 1.0f);
    fill_normal(c.b, C, &r, 0.5f, 0.0f);
    ln_fwd(&c);
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += c.inp[n * C + i];
        m /= C;
        for (int i = 0; i < C; i++) v += (c.inp[n * C + i] - m) * (c.inp[n * C + i] - m);
        v /= C;
        double rs = 1.0 / sqrt(v + 1e-5);
        assert_near(c.mean[n], m, 1e-5 * fabs(m) + 1e-6);
        assert_near(c.rstd[n], rs, 1e-5 * rs);
        for (int i = 0; i < C; i++) {
            double want = (c.inp[n * C + i] - m) * rs * c.w[i] + c.b[i];
            assert_near(c.out[n * C + i], want, 1e-5 * (1 + fabs(want)));
        }
    }
    free(c.out), free(c.mean), free(c.rstd), free(c.inp), free(c.w), free(c.b);
}

static void test_layernorm_grad(void **state) {
    (void)state;
    for (int si = 0; si < NSHAPES; si++) {
        shape s = SHAPES[si];
        if (s.C < 2) continue;
        vl_rng r;
        vl_rng_seed(&r, 20 + si);
        int N = s.B * s.T, C = s.C;
        size_t NC = (size_t)N * C;
        ln_ctx c = {falloc(NC), falloc(N), falloc(N), falloc(NC), falloc(C), falloc(C), N, C};
        fill_normal(c.inp, NC, &r, 1.0f, 0.3f);
        fill_normal(c.w, C, &r, 0.5f, 1.0f);
        fill_normal(c.b, C, &r, 0.5f, 0.0f);
        float *proj = falloc(NC), *dinp = falloc(NC), *dw = falloc(C), *db = falloc(C);
        fill_normal(proj, NC, &r, 1.0f, 0.0f);
        ln_fwd(&c);
        kernels_layernorm_backward(dinp, dw, db, proj, c.inp, c.w, c.mean, c.rstd, N, C);
        gc_case gc = {ln_fwd, &c, c.out, NC, proj};
        gc_input in[] = {{"inp", c.inp, dinp, NC}, {"weight", c.w, dw, C}, {"bias", c.b, db, C}};
        gc_check("layernorm", &gc, in, 3, 200, 1e-2f, 1e-2);
        free(c.out), free(c.mean), free(c.rstd), free(c.inp), free(c.w), free(c.b);
        free(proj), free(dinp), free(dw), free(db);
    }
}

/* ---- matmul --------------------------------------------------------------- */

typedef struct mm_ctx {
    float *out, *inp, *w, *b;
    int N, IN, OUT, transposed;
} mm_ctx;

static void mm_fwd(void *p) {
    mm_ctx *c = p;
    if (c->transposed)
        kernels_matmul_wt_forward(c->out, c->inp, c->w, c->N, c->IN, c->OUT);
    else
        kernels_matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->IN, c->OUT);
}

static void test_matmul_forward_ref(void **state) {
    (void)state;
    vl_rng r;
    vl_rng_seed(&r, 4);
    int N = 13, IN = 19, OUT = 23;
    for (int tr = 0; tr < 2; tr++) {
        mm_ctx c = {falloc((size_t)N * OUT),
                    falloc((size_t)N * IN),
                    falloc((size_t)IN * OUT),
                    falloc(OUT),
                    N,
                    IN,
                    OUT,
                    tr};
        fill_normal(c.inp, (size_t)N * IN, &r, 1, 0);
        fill_normal(c.w, (size_t)IN * OUT, &r, 1, 0);
        fill_normal(c.b, OUT, &r, 1, 0);
        mm_fwd(&c);
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OUT; o++) {
                double s = tr ? 0.0 : c.b[o];
                for (int i = 0; i < IN; i++)
                    s += (double)c.inp[n * IN + i] *
                         (tr ? c.w[(size_t)o * IN + i] : c.w[(size_t)i * OUT + o]);
                assert_near(c.out[n * OUT + o], s, 1e-4 * (1 + fabs(s)));
            }
        free(c.out), free(c.inp), free(c.w), free(c.b);
    }
}

/* Products big enough to be split across threads, by rows and by
 * columns, against double-precision references. */
static void test_matmul_split_ref(void **state) {
    (void)state;
    vl_rng r;
    vl_rng_seed(&r, 8);
    const int dims[][3] = {{301, 70, 130}, {37, 150, 260}}; /* N, IN, OUT */
    for (int d = 0; d < 2; d++) {
        int N = dims[d][0], IN = dims[d][1], OUT = dims[d][2];
        size_t NI = (size_t)N * IN, NO = (size_t)N * OUT, W = (size_t)IN * OUT;
        float *x = falloc(NI), *w = falloc(W), *b = falloc(OUT), *y = falloc(NO), *dy = falloc(NO),
              *dx = falloc(NI), *dw = falloc(W), *db = falloc(OUT);
        fill_normal(x, NI, &r, 1, 0);
        fill_normal(w, W, &r, 1, 0);
        fill_normal(b, OUT, &r, 1, 0);
        fill_normal(dy, NO, &r, 1, 0);
        kernels_matmul_forward(y, x, w, b, N, IN, OUT);
        kernels_matmul_backward(dx, dw, db, dy, x, w, N, IN, OUT);
        for (int n = 0; n < N; n += 7)
            for (int o = 0; o < OUT; o++) {
                double s = b[o];
                for (int i = 0; i < IN; i++)
                    s += (double)x[(size_t)n * IN + i] * w[(size_t)i * OUT + o];
                assert_near(y[(size_t)n * OUT + o], s, 1e-4 * (1 + fabs(s)));
            }
        for (int n = 0; n < N; n += 5)
            for (int i = 0; i < IN; i++) {
                double s = 0;
                for (int o = 0; o < OUT; o++)
                    s += (double)dy[(size_t)n * OUT + o] * w[(size_t)i * OUT + o];
                assert_near(dx[(size_t)n * IN + i], s, 1e-4 * (1 + fabs(s)));
            }
        for (int i = 0; i < IN; i += 3)
            for (int o = 0; o < OUT; o++) {
                double s = 0;
                for (int n = 0; n < N; n++)
                    s += (double)x[(size_t)n * IN + i] * dy[(size_t)n * OUT + o];
                assert_near(dw[(size_t)i * OUT + o], s, 1e-4 * (1 + fabs(s)));
            }
        for (int o = 0; o < OUT; o++) {
            double s = 0;
            for (int n = 0; n < N; n++) s += dy[(size_t)n * OUT + o];
            assert_near(db[o], s, 1e-4 * (1 + fabs(s)));
        }
        free(x), free(w), free(b), free(y), free(dy), free(dx), free(dw), free(db);
    }
}

static void test_matmul_grad(void **state) {
    (void)state;
    for (int si = 0; si < NSHAPES; si++) {
        shape s = SHAPES[si];
        for (int tr = 0; tr < 2; tr++) {
            vl_rng r;
            vl_rng_seed(&r, 30 + si * 2 + tr);
            /* Odd output widths: 3C (qkv), V (head). */
            int N = s.B * s.T, IN = s.C, OUT = tr ? s.V : 3 * s.C + 1;
            size_t NI = (size_t)N * IN, NO = (size_t)N * OUT, W = (size_t)IN * OUT;
            mm_ctx c = {falloc(NO), falloc(NI), falloc(W), falloc(OUT), N, IN, OUT, tr};
            fill_normal(c.inp, NI, &r, 1, 0);
            fill_normal(c.w, W, &r, 1, 0);
            fill_normal(c.b, OUT, &r, 1, 0);
            float *proj = falloc(NO), *dinp = falloc(NI), *dw = falloc(W), *db = falloc(OUT);
            fill_normal(proj, NO, &r, 1, 0);
            mm_fwd(&c);
            if (tr)
                kernels_matmul_wt_backward(dinp, dw, proj, c.inp, c.w, N, IN, OUT);
            else
                kernels_matmul_backward(dinp, dw, db, proj, c.inp, c.w, N, IN, OUT);
            gc_case gc = {mm_fwd, &c, c.out, NO, proj};
            gc_input in[] = {
                {"inp", c.inp, dinp, NI}, {"weight", c.w, dw, W}, {"bias", c.b, db, OUT}};
            gc_check(tr ? "matmul_wt" : "matmul", &gc, in, tr ? 2 : 3, 150, 1e-2f, 2e-3);
            free(c.out), free(c.inp), free(c.w), free(c.b), free(proj), free(dinp), free(dw),
                free(db);
        }
    }
}

/* ---- attention ------------------------------------------------------------ */

typedef struct att_ctx {
    float *out, *att, *qkv;
    int B, T, C, NH;
} att_ctx;

static void att_fwd(void *p) {
    att_ctx *c = p;
    kernels_attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
}

static void attention_forward_ref(int B, int T, int C, int NH) {
    vl_rng r;
    vl_rng_seed(&r, 5);
    int hs = C / NH;
    att_ctx c = {falloc((size_t)B * T * C),
                 falloc((size_t)B * NH * T * T),
                 falloc((size_t)B * T * 3 * C),
                 B,
                 T,
                 C,
                 NH};
    fill_normal(c.qkv, (size_t)B * T * 3 * C, &r, 1, 0);
    att_fwd(&c);
    double *pr = calloc((size_t)T, sizeof(double));
    assert_non_null(pr);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = c.qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -1e300, sum = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = c.qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++) d += (double)q[i] * k[i];
                    pr[t2] = d / sqrt(hs);
                    if (pr[t2] > mx) mx = pr[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) sum += (pr[t2] = exp(pr[t2] - mx));
                const float *arow = c.att + (((size_t)b * NH + h) * T + t) * T;
                for (int t2 = 0; t2 < T; t2++)
                    assert_near(arow[t2], t2 <= t ? pr[t2] / sum : 0.0, 1e-6);
                for (int i = 0; i < hs; i++) {
                    double o = 0;
                    for (int t2 = 0; t2 <= t; t2++)
                        o +=
                            pr[t2] / sum * c.qkv[((size_t)b * T + t2) * 3 * C + 2 * C + h * hs + i];
                    assert_near(c.out[((size_t)b * T + t) * C + h * hs + i], o, 1e-5);
                }
            }
    free(pr);
    free(c.out), free(c.att), free(c.qkv);
}

static void test_attention_forward_ref(void **state) {
    (void)state;
    attention_forward_ref(2, 6, 15, 3);
    attention_forward_ref(3, 129, 40, 4); /* three query blocks, split across threads */
}

static void test_attention_grad(void **state) {
    (void)state;
    for (int si = 0; si < NSHAPES; si++) {
        shape s = SHAPES[si];
        vl_rng r;
        vl_rng_seed(&r, 40 + si);
        size_t BT = (size_t)s.B * s.T, n3 = BT * 3 * s.C;
        att_ctx c = {falloc(BT * s.C),
                     falloc((size_t)s.B * s.NH * s.T * s.T),
                     falloc(n3),
                     s.B,
                     s.T,
                     s.C,
                     s.NH};
        fill_normal(c.qkv, n3, &r, 1, 0);
        float *proj = falloc(BT * s.C), *dqkv = falloc(n3),
              *scratch = falloc(kernels_attention_scratch_floats(s.B, s.T, s.NH));
        fill_normal(proj, BT * s.C, &r, 1, 0);
        att_fwd(&c);
        kernels_attention_backward(dqkv, scratch, proj, c.qkv, c.att, s.B, s.T, s.C, s.NH);
        gc_case gc = {att_fwd, &c, c.out, BT * s.C, proj};
        gc_input in[] = {{"qkv", c.qkv, dqkv, n3}};
        gc_check("attention", &gc, in, 1, 300, 1e-2f, 1e-2);
        free(c.out), free(c.att), free(c.qkv), free(proj), free(dqkv), free(scratch);
    }
}

/* ---- gelu, residual ------------------------------------------------------- */

typedef struct ew_ctx {
    float *out, *a, *b;
    size_t n;
    int which; /* 0 gelu, 1 residual */
} ew_ctx;

static void ew_fwd(void *p) {
    ew_ctx *c = p;
    if (c->which == 0)
        kernels_gelu_forward(c->out, c->a, c->n);
    else
        kernels_residual_forward(c->out, c->a, c->b, c->n);
}

static void test_gelu_values(void **state) {
    (void)state;
    float x[] = {-3.0f, -1.0f, 0.0f, 0.5f, 2.0f};
    float y[5];
    kernels_gelu_forward(y, x, 5);
    for (int i = 0; i < 5; i++) {
        double u = sqrt(2.0 / M_PI) * (x[i] + 0.044715 * pow(x[i], 3));
        assert_near(y[i], 0.5 * x[i] * (1 + tanh(u)), 1e-6);
    }
}

static void test_elementwise_grad(void **state) {
    (void)state;
    size_t sizes[] = {1, 7, 1001, 40000}; /* the last crosses the threading threshold */
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        for (int which = 0; which < 2; which++) {
            vl_rng r;
            vl_rng_seed(&r, 50 + si * 2 + which);
            ew_ctx c = {falloc(n), falloc(n), falloc(n), n, which};
            fill_normal(c.a, n, &r, 2, 0);
            fill_normal(c.b, n, &r, 2, 0);
            float *proj = falloc(n), *da = falloc(n), *db = falloc(n);
            fill_normal(proj, n, &r, 1, 0);
            ew_fwd(&c);
            if (which == 0)
                kernels_gelu_backward(da, c.a, proj, n);
            else
                kernels_residual_backward(da, db, proj, n);
            gc_case gc = {ew_fwd, &c, c.out, n, proj};
            gc_input in[] = {{"a", c.a, da, n}, {"b", c.b, db, n}};
            gc_check(which ? "residual" : "gelu", &gc, in, which ? 2 : 1, 100, 1e-2f, 2e-3);
            free(c.out), free(c.a), free(c.b), free(proj), free(da), free(db);
        }
    }
}

/* ---- softmax + cross-entropy ---------------------------------------------- */

typedef struct xe_ctx {
    float *probs, *losses, *logits;
    int *tgt;
    int N, V;
} xe_ctx;

static void xe_fwd(void *p) {
    xe_ctx *c = p;
    kernels_softmax_xent_forward(c->probs, c->losses, c->logits, c->tgt, c->N, c->V);
}

static void test_xent(void **state) {
    (void)state;
    for (int si = 0; si < NSHAPES; si++) {
        shape s = SHAPES[si];
        vl_rng r;
        vl_rng_seed(&r, 60 + si);
        int N = s.B * s.T, V = s.V;
        size_t NV = (size_t)N * V;
        xe_ctx c = {falloc(NV), falloc(N), falloc(NV), calloc(N, sizeof(int)), N, V};
        assert_non_null(c.tgt);
        for (int i = 0; i < N; i++) c.tgt[i] = (int)vl_rng_below(&r, (uint32_t)V);
        fill_normal(c.logits, NV, &r, 2, 0);
        xe_fwd(&c);
        for (int n = 0; n < N; n++) {
            double mx = -1e300, sum = 0, psum = 0;
            for (int v = 0; v < V; v++)
                if (c.logits[(size_t)n * V + v] > mx) mx = c.logits[(size_t)n * V + v];
            for (int v = 0; v < V; v++) sum += exp(c.logits[(size_t)n * V + v] - mx);
            for (int v = 0; v < V; v++) psum += c.probs[(size_t)n * V + v];
            assert_near(psum, 1.0, 1e-5);
            double want = mx + log(sum) - c.logits[(size_t)n * V + c.tgt[n]];
            assert_near(c.losses[n], want, 1e-5 * (1 + want));
        }
        float *proj = falloc(N), *dlogits = falloc(NV);
        for (int i = 0; i < N; i++) proj[i] = 1.0f / (float)N;
        kernels_softmax_xent_backward(dlogits, c.probs, c.tgt, 1.0f / (float)N, N, V);
        gc_case gc = {xe_fwd, &c, c.losses, (size_t)N, proj};
        gc_input in[] = {{"logits", c.logits, dlogits, NV}};
        gc_check("softmax_xent", &gc, in, 1, 200, 1e-2f, 1e-2);
        free(c.probs), free(c.losses), free(c.logits), free(c.tgt), free(proj), free(dlogits);
    }
}

static void test_xent_in_place_and_extreme(void **state) {
    (void)state;
    /* probs aliasing logits, and a target whose probability underflows. */
    float logits[4] = {0.0f, 200.0f, -200.0f, 1.0f};
    int tgt = 2;
    float loss = 0;
    kernels_softmax_xent_forward(logits, &loss, logits, &tgt, 1, 4);
    assert_true(isfinite(loss));
    assert_near(loss, 400.0, 1e-3);
    assert_near(logits[1], 1.0, 1e-6);
    kernels_softmax_xent_backward(logits, logits, &tgt, 1.0f, 1, 4);
    assert_near(logits[2], -1.0, 1e-6);
    /* logits-only: no targets, no losses written */
    float l2[3] = {1, 2, 3};
    kernels_softmax_xent_forward(l2, NULL, l2, NULL, 1, 3);
    assert_near(l2[0] + l2[1] + l2[2], 1.0, 1e-6);
}

/* ---- AdamW and norms ------------------------------------------------------ */

static void test_adamw_reference(void **state) {
    (void)state;
    size_t n = 40001;
    vl_rng r;
    vl_rng_seed(&r, 70);
    float *p = falloc(n), *g = falloc(n), *m = falloc(n), *v = falloc(n);
    double *rp = calloc(n, sizeof(double)), *rm = calloc(n, sizeof(double)),
           *rv = calloc(n, sizeof(double));
    uint8_t *mask = calloc(n, 1);
    assert_non_null(rp), assert_non_null(rm), assert_non_null(rv), assert_non_null(mask);
    fill_normal(p, n, &r, 1, 0);
    for (size_t i = 0; i < n; i++) {
        rp[i] = p[i];
        mask[i] = (uint8_t)(i % 3 != 0);
    }
    kernels_adamw_hparams hp = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0};
    for (long step = 1; step <= 5; step++) {
        fill_normal(g, n, &r, 1, 0);
        hp.step = step;
        kernels_adamw_step(p, g, m, v, mask, n, &hp);
        double bc1 = 1 - pow(0.9f, (double)step), bc2 = 1 - pow(0.95f, (double)step);
        for (size_t i = 0; i < n; i++) {
            double gi = g[i];
            rm[i] = 0.9f * rm[i] + (1 - 0.9f) * gi;
            rv[i] = 0.95f * rv[i] + (1 - 0.95f) * gi * gi;
            double wd = mask[i] ? 0.1f : 0.0;
            rp[i] =
                rp[i] - 1e-2f * (rm[i] / bc1 / (sqrt(rv[i] / bc2) + 1e-8f)) - 1e-2f * wd * rp[i];
        }
    }
    for (size_t i = 0; i < n; i++) {
        assert_near(p[i], rp[i], 1e-5 * (1 + fabs(rp[i])));
        assert_near(m[i], rm[i], 1e-5 * (1 + fabs(rm[i])));
        assert_near(v[i], rv[i], 1e-5 * (1 + fabs(rv[i])));
    }
    /* weight decay alone (zero gradient, fresh state) scales only masked
     * elements, by exactly 1 - lr*wd */
    float p1[2] = {2.0f, 2.0f}, g1[2] = {0}, m1[2] = {0}, v1[2] = {0};
    uint8_t mk[2] = {1, 0};
    hp.step = 1;
    kernels_adamw_step(p1, g1, m1, v1, mk, 2, &hp);
    assert_near(p1[0], 2.0 * (1 - 1e-3), 1e-6);
    assert_true(p1[1] == 2.0f);
    free(p), free(g), free(m), free(v), free(rp), free(rm), free(rv), free(mask);
}

static void test_norms(void **state) {
    (void)state;
    size_t n = 100003;
    float *x = falloc(n);
    double want = 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)((int)(i % 7) - 3) * 0.5f;
        want += (double)x[i] * x[i];
    }
    assert_near(kernels_sum_squares(x, n), want, 1e-9 * want);
    assert_near(kernels_sum_squares(x, 3), 2.25 + 1.0 + 0.25, 1e-12);
    float norm = kernels_clip_grad_norm(x, n, 1.0f);
    assert_near(norm, sqrt(want), 1e-3);
    assert_near(sqrt(kernels_sum_squares(x, n)), 1.0, 1e-5);
    /* within the bound: untouched */
    float y[2] = {0.3f, 0.4f};
    assert_near(kernels_clip_grad_norm(y, 2, 1.0f), 0.5, 1e-6);
    assert_true(y[0] == 0.3f && y[1] == 0.4f);
    assert_near(kernels_sum_squares(y, 0), 0.0, 0);
    free(x);
}

/* ---- reproducibility ------------------------------------------------------ */

/* Runs the non-BLAS kernels whose parallel split could in principle change
 * summation order, and returns a copy of everything they produced. */
static float *run_parallel_kernels(int threads, size_t *total) {
    omp_set_num_threads(threads);
    int B = 4, T = 100, C = 48, NH = 4, V = 50;
    size_t BT = (size_t)B * T, n3 = BT * 3 * C, natt = (size_t)B * NH * T * T;
    vl_rng r;
    vl_rng_seed(&r, 99);
    float *qkv = falloc(n3), *dout = falloc(BT * C), *wte = falloc((size_t)V * C),
          *wpe = falloc((size_t)T * C);
    int *tok = calloc(BT, sizeof(int));
    assert_non_null(tok);
    fill_normal(qkv, n3, &r, 1, 0);
    fill_normal(dout, BT * C, &r, 1, 0);
    for (size_t i = 0; i < BT; i++) tok[i] = (int)vl_rng_below(&r, 4);
    *total = BT * C + natt + n3 + (size_t)V * C + (size_t)T * C + 2 * (size_t)C + BT * C;
    float *res = falloc(*total), *o = res;
    float *att = o + BT * C, *dqkv = att + natt, *dwte = dqkv + n3, *dwpe = dwte + (size_t)V * C;
    float *dw = dwpe + (size_t)T * C, *db = dw + C, *dln = db + C;
    float *scratch = falloc(kernels_attention_scratch_floats(B, T, NH));
    float *mean = falloc(BT), *rstd = falloc(BT), *w = falloc(C), *lnout = falloc(BT * C);
    fill_normal(w, C, &r, 1, 1);
    kernels_attention_forward(o, att, qkv, B, T, C, NH);
    kernels_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
    kernels_encoder_backward(dwte, dwpe, dout, tok, B, T, C);
    kernels_layernorm_forward(lnout, mean, rstd, qkv, w, w, (int)BT, C);
    kernels_layernorm_backward(dln, dw, db, dout, qkv, w, mean, rstd, (int)BT, C);
    free(qkv), free(dout), free(wte), free(wpe), free(tok), free(scratch), free(mean), free(rstd),
        free(w), free(lnout);
    return res;
}

static void test_reproducible(void **state) {
    (void)state;
    int saved = omp_get_max_threads();
    size_t n1, n2, n3;
    float *a = run_parallel_kernels(2, &n1);
    float *b = run_parallel_kernels(2, &n2);
    float *c = run_parallel_kernels(1, &n3);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1 * sizeof(float));
    /* The split does not depend on the thread count either. */
    assert_memory_equal(a, c, n1 * sizeof(float));
    double s1 = kernels_sum_squares(a, n1);
    omp_set_num_threads(2);
    double s2 = kernels_sum_squares(a, n1);
    assert_memory_equal(&s1, &s2, sizeof(double));
    omp_set_num_threads(saved);
    free(a), free(b), free(c);
}

/* The branch-free exp against libm over its range, clamped outside it,
 * and NaN in, NaN out. NaN reaches it from a diverged model's attention
 * scores; it used to turn into an out-of-range float-to-int conversion
 * (undefined behaviour, found by fuzz_http under clang's UBSan). */
static void test_exp(void **state) {
    (void)state;
    for (double x = -87.0; x <= 88.0; x += 0.37) {
        float xf = (float)x;
        assert_near(kv_exp(xf) / exp((double)xf), 1.0, 1e-6);
    }
    assert_true(kv_exp(-INFINITY) > 0.0f && kv_exp(-INFINITY) < 2e-38f);
    assert_true(isfinite(kv_exp(INFINITY)) && kv_exp(INFINITY) > 1e38f);
    assert_true(isnan(kv_exp(NAN)));
    assert_true(isnan(kv_exp(-NAN)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_encoder_grad),
        cmocka_unit_test(test_layernorm_forward_ref),
        cmocka_unit_test(test_layernorm_grad),
        cmocka_unit_test(test_matmul_forward_ref),
        cmocka_unit_test(test_matmul_split_ref),
        cmocka_unit_test(test_matmul_grad),
        cmocka_unit_test(test_attention_forward_ref),
        cmocka_unit_test(test_attention_grad),
        cmocka_unit_test(test_gelu_values),
        cmocka_unit_test(test_elementwise_grad),
        cmocka_unit_test(test_xent),
        cmocka_unit_test(test_xent_in_place_and_extreme),
        cmocka_unit_test(test_adamw_reference),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_reproducible),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
