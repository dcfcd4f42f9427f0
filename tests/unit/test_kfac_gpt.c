/*
 * Unit tests for K-FAC as the GPT's optimiser (model/kfac_gpt.c): the
 * update of every linear layer equals lr (A + λ_A I)⁻¹ ∇ (G + λ_G I)⁻¹
 * with the factors built by plain loops from the layer inputs and output
 * gradients a separate backward pass recorded, and the inverses by
 * Gauss-Jordan in double; the other parameters move by lr ∇; KL clipping
 * scales the linear layers by the hand-computed ν; a second step uses the
 * moving-average factors, momentum and the first step's inverses (T > 1),
 * and a refresh inverts again. Also: the layer table, configuration and
 * argument refusals, set_factors, reset, and a tiny GPT whose training
 * loss falls.
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
#include "model/model.h"
#include "tests/unit/test_util.h"
#include "tests/unit/kfac_ref.h"

static const model_gpt_config CFG = {
    .vocab_size = 29, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 8};
#define B 2
#define T 6
#define NL 8 /* 4 n_layer */

static model_gpt *make_gpt(void) {
    model_gpt *m = NULL;
    OK(model_gpt_create(&CFG, &m, &e_));
    model_gpt_init_weights(m, 3);
    return m;
}

static void batch(uint64_t seed, int *in, int *tg) {
    vl_rng r;
    vl_rng_seed(&r, seed);
    for (int i = 0; i < B * T; i++) {
        in[i] = (int)vl_rng_below(&r, (uint32_t)CFG.vocab_size);
        tg[i] = (int)vl_rng_below(&r, (uint32_t)CFG.vocab_size);
    }
}

/* ---- what a plain backward shows the hook ------------------------------------ */

typedef struct rec {
    int n;
    char name[NL][MODEL_TENSOR_NAME_MAX];
    float *x[NL], *dy[NL];
    int rows[NL], in[NL], out[NL];
} rec;

static void rec_hook(void *ctx, const char *name, const float *x, const float *dy, int n, int in,
                     int out) {
    rec *r = ctx;
    assert_true(r->n < NL);
    int i = r->n++;
    snprintf(r->name[i], sizeof r->name[i], "%s", name);
    r->x[i] = malloc((size_t)n * in * sizeof(float));
    r->dy[i] = malloc((size_t)n * out * sizeof(float));
    assert_non_null(r->x[i]);
    assert_non_null(r->dy[i]);
    memcpy(r->x[i], x, (size_t)n * in * sizeof(float));
    memcpy(r->dy[i], dy, (size_t)n * out * sizeof(float));
    r->rows[i] = n, r->in[i] = in, r->out[i] = out;
}

static void rec_free(rec *r) {
    for (int i = 0; i < r->n; i++) free(r->x[i]), free(r->dy[i]);
    memset(r, 0, sizeof *r);
}

/* Forward and backward of one batch on m with the recording hook; the
 * gradients are left in m. */
static void recorded_pass(model_gpt *m, uint64_t seed, rec *r) {
    int in[B * T], tg[B * T];
    batch(seed, in, tg);
    memset(r, 0, sizeof *r);
    OK(model_gpt_zero_grad(m, &e_));
    OK(model_gpt_forward(m, in, tg, B, T, NULL, &e_));
    model_gpt_set_linear_hook(m, rec_hook, r);
    OK(model_gpt_backward(m, &e_));
    model_gpt_set_linear_hook(m, NULL, NULL);
    assert_int_equal(r->n, NL);
}

static void kfac_pass(model_kfac_gpt *o, model_gpt *m, uint64_t seed) {
    int in[B * T], tg[B * T];
    batch(seed, in, tg);
    OK(model_gpt_zero_grad(m, &e_));
    OK(model_gpt_forward(m, in, tg, B, T, NULL, &e_));
    OK(model_kfac_gpt_backward(o, m, &e_));
}

/* Index into the recording of the layer whose weight is `weight`. */
static int rec_find(const rec *r, const char *weight) {
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->name[i], weight) == 0) return i;
    fail_msg("layer %s was not recorded", weight);
    return -1;
}

/* ---- the reference -------------------------------------------------------------- */

/* Damped inverses of double factors A [da,da] and G [out,out] with the π
 * split of λ, into Ai and Gi. */
static void ref_inverses(const double *A, const double *G, int da, int out, double damping,
                         double *Ai, double *Gi) {
    double ta = 0.0, tg = 0.0;
    for (int i = 0; i < da; i++) ta += A[i * da + i];
    for (int i = 0; i < out; i++) tg += G[i * out + i];
    double pi = sqrt((ta / da) / (tg / out));
    double la = pi * sqrt(damping), lg = sqrt(damping) / pi;
    double *a = dalloc((size_t)da * da), *g = dalloc((size_t)out * out);
    memcpy(a, A, (size_t)da * da * sizeof *a);
    memcpy(g, G, (size_t)out * out * sizeof *g);
    for (int i = 0; i < da; i++) a[i * da + i] += la;
    for (int i = 0; i < out; i++) g[i * out + i] += lg;
    gj_inverse(a, da, Ai);
    gj_inverse(g, out, Gi);
    free(a), free(g);
}

/* nat = Ai [gW; gb] Gi for a layer whose weight and bias gradients are
 * the (in+1)·out floats at grad. */
static void ref_nat(const double *Ai, const double *Gi, int in, int out, const float *grad,
                    double *nat) {
    int da = in + 1;
    double *g = dalloc((size_t)da * out), *tmp = dalloc((size_t)da * out);
    for (int i = 0; i < da * out; i++) g[i] = grad[i];
    matmul_d(Ai, g, da, da, out, tmp);
    matmul_d(tmp, Gi, da, out, out, nat);
    free(g), free(tmp);
}

/* Per layer of the table: reference factors (from a recording), their
 * inverses and the natural gradient. */
typedef struct ref_layer {
    int in, out;
    size_t off; /* of the weight in the flat vectors */
    double *A, *G, *Ai, *Gi, *nat;
} ref_layer;

static void ref_build(ref_layer *R, const model_gpt *m, const rec *r, double damping,
                      const float *grads) {
    for (int i = 0; i < NL; i++) {
        char name[64], weight[80];
        int in, out;
        OK(model_gpt_kfac_layer(&CFG, i, name, sizeof name, &in, &out, &e_));
        snprintf(weight, sizeof weight, "%s.weight", name);
        const model_tensor *t = model_gpt_find_tensor(m, weight);
        assert_non_null(t);
        int k = rec_find(r, weight), da = in + 1;
        assert_int_equal(r->in[k], in);
        assert_int_equal(r->out[k], out);
        ref_layer *L = &R[i];
        L->in = in, L->out = out, L->off = t->offset;
        L->A = dalloc((size_t)da * da), L->G = dalloc((size_t)out * out);
        L->Ai = dalloc((size_t)da * da), L->Gi = dalloc((size_t)out * out);
        L->nat = dalloc((size_t)da * out);
        ref_factors(r->x[k], r->dy[k], r->rows[k], in, out, L->A, L->G);
        ref_inverses(L->A, L->G, da, out, damping, L->Ai, L->Gi);
        ref_nat(L->Ai, L->Gi, in, out, grads + t->offset, L->nat);
    }
}

static void ref_free(ref_layer *R) {
    for (int i = 0; i < NL; i++)
        free(R[i].A), free(R[i].G), free(R[i].Ai), free(R[i].Gi), free(R[i].nat);
}

/* 1 when flat index j lies in one of the K-FAC layers (weight or bias). */
static int in_layer(const ref_layer *R, size_t j) {
    for (int i = 0; i < NL; i++)
        if (j >= R[i].off && j < R[i].off + (size_t)(R[i].in + 1) * R[i].out) return 1;
    return 0;
}

/* A parameter change measured as before - after in float is exact to a
 * few roundings of the parameter itself, and want to 1e-5. */
static int close_step(double got, double want, double before) {
    return fabs(got - want) <= 4.0 * FLT_EPSILON * fabs(before) + 1e-5 * fabs(want) + 1e-12;
}

/* Checks the parameter change before - after against lr·scale·nat on the
 * layers and lr·grad elsewhere, each layer to 1e-4 of its largest entry. */
static void check_step(const ref_layer *R, const float *before, const float *after,
                       const float *grads, size_t n, double lr, double scale) {
    float *got = malloc(n * sizeof *got);
    assert_non_null(got);
    for (size_t j = 0; j < n; j++) got[j] = before[j] - after[j];
    for (int i = 0; i < NL; i++) {
        size_t len = (size_t)(R[i].in + 1) * R[i].out;
        double *want = dalloc(len);
        for (size_t j = 0; j < len; j++) want[j] = lr * scale * R[i].nat[j];
        assert_rel(got + R[i].off, want, len, 1e-4);
        free(want);
    }
    for (size_t j = 0; j < n; j++)
        if (!in_layer(R, j)) assert_true(close_step(got[j], lr * grads[j], before[j]));
    free(got);
}

/* ---- the step against the reference ----------------------------------------------- */

static model_kfac_gpt_config plain_cfg(void) {
    model_kfac_gpt_config c = model_kfac_gpt_config_default();
    c.lr = 0.5f, c.momentum = 0.0f, c.damping = 1e-2f, c.decay = 0.8f, c.inverse_every = 10;
    c.kl_clip = 0.0f, c.weight_decay = 0.0f;
    return c;
}

static void test_step_equals_explicit(void **state) {
    (void)state;
    model_gpt *ref = make_gpt(), *m = make_gpt();
    size_t n = model_gpt_num_params(m);
    rec r;
    recorded_pass(ref, 101, &r);
    const float *grads = model_gpt_grads(ref);
    model_kfac_gpt_config c = plain_cfg();
    ref_layer R[NL];
    ref_build(R, ref, &r, c.damping, grads);

    model_kfac_gpt o;
    OK(model_kfac_gpt_init(&o, m, &c, &e_));
    assert_int_equal(o.n_layers, NL);
    kfac_pass(&o, m, 101);
    /* the hook only observes: the gradients are the plain pass's */
    assert_memory_equal(model_gpt_grads(m), grads, n * sizeof(float));
    assert_int_equal(o.rows, B * T);
    float *before = malloc(n * sizeof *before);
    assert_non_null(before);
    memcpy(before, model_gpt_params(m), n * sizeof *before);
    OK(model_kfac_gpt_step(&o, m, &e_));
    assert_int_equal(o.step, 1);
    for (int i = 0; i < NL; i++) {
        int da = R[i].in + 1;
        assert_rel(o.layers[i]->A, R[i].A, (size_t)da * da, 1e-5);
        assert_rel(o.layers[i]->G, R[i].G, (size_t)R[i].out * R[i].out, 1e-5);
        assert_int_equal(o.layers[i]->inversions, 1);
    }
    assert_true(o.last_scale == 1.0f);
    check_step(R, before, model_gpt_params(m), grads, n, c.lr, 1.0);

    /* The same with KL clipping tight enough to bite: ν from
     * q = lr² Σ <∇, nat> over the linear layers only. */
    model_kfac_gpt_free(&o);
    model_gpt_free(m);
    m = make_gpt();
    double dot = 0.0;
    for (int i = 0; i < NL; i++)
        for (size_t j = 0; j < (size_t)(R[i].in + 1) * R[i].out; j++)
            dot += (double)grads[R[i].off + j] * R[i].nat[j];
    c.kl_clip = (float)(0.01 * c.lr * c.lr * dot);
    double nu = sqrt((double)c.kl_clip / (c.lr * c.lr * dot));
    OK(model_kfac_gpt_init(&o, m, &c, &e_));
    kfac_pass(&o, m, 101);
    OK(model_kfac_gpt_step(&o, m, &e_));
    assert_true(fabs(o.last_scale - nu) <= 1e-5 * nu);
    check_step(R, before, model_gpt_params(m), grads, n, c.lr, nu);

    model_kfac_gpt_free(&o);
    model_gpt_free(m);
    model_gpt_free(ref);
    ref_free(R);
    rec_free(&r);
    free(before);
}

/* Two steps: the second batch's factors join a moving average, but with
 * T = 10 the first step's inverses still precondition it, and momentum
 * carries the first step: Δ₂ = lr (μ nat₁ + nat₂). After a refresh the
 * next step inverts the averaged factors. */
static void test_second_step_and_refresh(void **state) {
    (void)state;
    model_kfac_gpt_config c = plain_cfg();
    c.momentum = 0.5f;
    model_gpt *ref = make_gpt(), *m = make_gpt();
    size_t n = model_gpt_num_params(m);
    model_kfac_gpt o;
    OK(model_kfac_gpt_init(&o, m, &c, &e_));

    rec r1, r2;
    recorded_pass(ref, 201, &r1);
    ref_layer R1[NL];
    ref_build(R1, ref, &r1, c.damping, model_gpt_grads(ref));
    kfac_pass(&o, m, 201);
    OK(model_kfac_gpt_step(&o, m, &e_));
    float *g1 = malloc(n * sizeof *g1), *before = malloc(n * sizeof *before);
    assert_non_null(g1);
    assert_non_null(before);
    memcpy(g1, model_gpt_grads(ref), n * sizeof *g1);

    /* the reference model follows to the same parameters */
    memcpy(model_gpt_params(ref), model_gpt_params(m), n * sizeof(float));
    recorded_pass(ref, 202, &r2);
    const float *g2 = model_gpt_grads(ref);
    memcpy(before, model_gpt_params(m), n * sizeof *before);
    kfac_pass(&o, m, 202);
    OK(model_kfac_gpt_step(&o, m, &e_));
    assert_int_equal(o.step, 2);
    float *after = model_gpt_params(m);
    for (int i = 0; i < NL; i++) {
        ref_layer *L = &R1[i];
        int da = L->in + 1;
        size_t len = (size_t)da * L->out;
        assert_int_equal(o.layers[i]->inversions, 1); /* not refreshed at step 2 */
        double *nat2 = dalloc(len), *want = dalloc(len);
        ref_nat(L->Ai, L->Gi, L->in, L->out, g2 + L->off, nat2);
        for (size_t j = 0; j < len; j++) want[j] = c.lr * (c.momentum * L->nat[j] + nat2[j]);
        float *got = malloc(len * sizeof *got);
        assert_non_null(got);
        for (size_t j = 0; j < len; j++) got[j] = before[L->off + j] - after[L->off + j];
        assert_rel(got, want, len, 1e-4);
        free(nat2), free(want), free(got);
    }
    /* the other parameters: plain momentum SGD */
    for (size_t j = 0; j < n; j++)
        if (!in_layer(R1, j))
            assert_true(
                close_step(before[j] - after[j], c.lr * (c.momentum * g1[j] + g2[j]), before[j]));
    /* the factors: ρ F₁ + (1 − ρ) F₂ */
    ref_layer R2[NL];
    ref_build(R2, ref, &r2, c.damping, g2);
    for (int i = 0; i < NL; i++) {
        int da = R1[i].in + 1, out = R1[i].out;
        for (int j = 0; j < da * da; j++)
            R2[i].A[j] = c.decay * R1[i].A[j] + (1.0 - c.decay) * R2[i].A[j];
        for (int j = 0; j < out * out; j++)
            R2[i].G[j] = c.decay * R1[i].G[j] + (1.0 - c.decay) * R2[i].G[j];
        assert_rel(o.layers[i]->A, R2[i].A, (size_t)da * da, 1e-5);
        assert_rel(o.layers[i]->G, R2[i].G, (size_t)out * out, 1e-5);
    }
    /* a refresh inverts the averaged factors at the next step */
    model_kfac_gpt_refresh(&o);
    kfac_pass(&o, m, 203);
    OK(model_kfac_gpt_step(&o, m, &e_));
    for (int i = 0; i < NL; i++) assert_int_equal(o.layers[i]->inversions, 2);
    assert_int_equal(o.rows, 3 * B * T);

    model_kfac_gpt_free(&o);
    model_gpt_free(m);
    model_gpt_free(ref);
    ref_free(R1);
    ref_free(R2);
    rec_free(&r1);
    rec_free(&r2);
    free(g1), free(before);
}

/* ---- the layer table, refusals, state handling ------------------------------------- */

static void test_layers_and_config(void **state) {
    (void)state;
    assert_int_equal(model_gpt_kfac_layer_count(&CFG), 8);
    static const char *const names[] = {"h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_fc",
                                        "h.0.mlp.c_proj", "h.1.attn.c_attn"};
    static const int ins[] = {8, 8, 8, 32, 8}, outs[] = {24, 8, 32, 8, 24};
    for (int i = 0; i < 5; i++) {
        char name[32];
        int in = 0, out = 0;
        OK(model_gpt_kfac_layer(&CFG, i, name, sizeof name, &in, &out, &e_));
        assert_string_equal(name, names[i]);
        assert_int_equal(in, ins[i]);
        assert_int_equal(out, outs[i]);
    }
    vl_error err = {0};
    char tiny[4];
    assert_int_equal(model_gpt_kfac_layer(&CFG, 8, NULL, 0, NULL, NULL, &err), VL_EINVAL);
    assert_int_equal(model_gpt_kfac_layer(&CFG, -1, NULL, 0, NULL, NULL, &err), VL_EINVAL);
    assert_int_equal(model_gpt_kfac_layer(&CFG, 0, tiny, sizeof tiny, NULL, NULL, &err), VL_EINVAL);

    model_kfac_gpt_config good = model_kfac_gpt_config_default();
    OK(model_kfac_gpt_config_validate(&good, &e_));
    struct {
        const char *field;
        model_kfac_gpt_config c;
    } bad[] = {{"lr", good},          {"lr", good},    {"momentum", good},      {"damping", good},
               {"damping", good},     {"decay", good}, {"inverse_every", good}, {"kl_clip", good},
               {"weight decay", good}};
    bad[0].c.lr = 0.0f;
    bad[1].c.lr = NAN;
    bad[2].c.momentum = 1.0f;
    bad[3].c.damping = 0.0f;
    bad[4].c.damping = INFINITY;
    bad[5].c.decay = 1.0f;
    bad[6].c.inverse_every = 0;
    bad[7].c.kl_clip = -1e-3f;
    bad[8].c.weight_decay = -1.0f;
    model_gpt *m = make_gpt();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = (vl_error){0};
        assert_int_equal(model_kfac_gpt_config_validate(&bad[i].c, &err), VL_EINVAL);
        assert_non_null(strstr(err.msg, bad[i].field));
        model_kfac_gpt o;
        assert_int_equal(model_kfac_gpt_init(&o, m, &bad[i].c, &err), VL_EINVAL);
        model_kfac_gpt_free(&o); /* safe after a failed init */
    }
    model_gpt_free(m);
}

static void test_refusals_and_reset(void **state) {
    (void)state;
    model_gpt *m = make_gpt();
    model_gpt_config other = CFG;
    other.n_layer = 1;
    model_gpt *small = NULL;
    OK(model_gpt_create(&other, &small, &e_));
    model_kfac_gpt_config c = plain_cfg();
    model_kfac_gpt o;
    OK(model_kfac_gpt_init(&o, m, &c, &e_));
    vl_error err = {0};
    /* no gradients, then no factors */
    assert_int_equal(model_kfac_gpt_step(&o, m, &err), VL_EINVAL);
    int in[B * T], tg[B * T];
    batch(301, in, tg);
    OK(model_gpt_zero_grad(m, &e_));
    OK(model_gpt_forward(m, in, tg, B, T, NULL, &e_));
    OK(model_gpt_backward(m, &e_));
    err = (vl_error){0};
    assert_int_equal(model_kfac_gpt_step(&o, m, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "no factors"));
    /* backward without a forward, and another model's shape */
    assert_int_equal(model_kfac_gpt_backward(&o, m, &err), VL_EINVAL);
    assert_int_equal(model_kfac_gpt_backward(&o, small, &err), VL_EINVAL);
    assert_int_equal(model_kfac_gpt_step(&o, small, &err), VL_EINVAL);

    kfac_pass(&o, m, 302);
    OK(model_kfac_gpt_step(&o, m, &e_));
    /* set_factors: copies, refuses non-finite input, keeps the layer */
    model_kfac_layer *l = o.layers[1];
    size_t na = (size_t)(l->in + 1) * (l->in + 1), ng = (size_t)l->out * l->out;
    float *A = malloc(na * sizeof *A), *G = malloc(ng * sizeof *G);
    assert_non_null(A);
    assert_non_null(G);
    for (size_t i = 0; i < na; i++) A[i] = l->A[i] * 2.0f;
    for (size_t i = 0; i < ng; i++) G[i] = l->G[i] * 3.0f;
    OK(model_kfac_set_factors(l, A, G, 7, &e_));
    assert_memory_equal(l->A, A, na * sizeof *A);
    assert_memory_equal(l->G, G, ng * sizeof *G);
    assert_int_equal(l->updates, 7);
    G[2] = NAN;
    assert_int_equal(model_kfac_set_factors(l, A, G, 3, &err), VL_ERANGE);
    assert_int_equal(model_kfac_set_factors(l, A, NULL, 3, &err), VL_EINVAL);
    assert_int_equal(model_kfac_set_factors(l, A, A, 0, &err), VL_EINVAL);
    assert_memory_equal(l->A, A, na * sizeof *A);
    assert_int_equal(l->updates, 7);

    model_kfac_gpt_reset(&o);
    assert_int_equal(o.step, 0);
    assert_int_equal(o.rows, 0);
    for (int i = 0; i < NL; i++) {
        assert_int_equal(o.layers[i]->updates, 0);
        assert_int_equal(o.layers[i]->inversions, 0);
    }
    for (size_t i = 0; i < o.sgd.n; i++) assert_true(o.sgd.buf[i] == 0.0f);
    err = (vl_error){0};
    assert_int_equal(model_kfac_gpt_step(&o, m, &err), VL_EINVAL);

    model_kfac_gpt_free(&o);
    model_kfac_gpt_free(&o); /* twice is safe */
    model_gpt_free(m);
    model_gpt_free(small);
    free(A), free(G);
}

/* A tiny GPT on a repeating byte pattern, 40 steps from the same weights
 * on the same batches, with K-FAC's defaults and with plain SGD at the
 * same lr: K-FAC must train (the loss falls well below ln 256) and stay
 * in SGD's league. On so small a model most of the loss is the embeddings'
 * business, which both move the same way, so this is a sanity check of
 * the whole step; the reference tests above check what it computes. */
static float train_tiny(int kfac, float *first) {
    model_gpt_config cfg = {
        .vocab_size = 256, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 16};
    model_gpt *m = NULL;
    OK(model_gpt_create(&cfg, &m, &e_));
    model_gpt_init_weights(m, 9);
    static const char text[] = "the quick brown fox jumps over the lazy dog; ";
    uint8_t data[1024];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)text[i % (sizeof text - 1)];
    model_kfac_gpt o;
    model_kfac_gpt_config c = model_kfac_gpt_config_default();
    model_sgd sgd;
    OK(model_kfac_gpt_init(&o, m, &c, &e_));
    OK(model_sgd_init(&sgd, model_gpt_num_params(m), c.lr, 0.0f, 0.0f, 0, &e_));
    vl_rng r;
    vl_rng_seed(&r, 5);
    int in[8 * 16], tg[8 * 16];
    float last = 0.0f;
    for (int s = 0; s < 40; s++) {
        float loss = 0.0f;
        OK(model_data_sample(data, sizeof data, 8, 16, &r, in, tg, &e_));
        OK(model_gpt_zero_grad(m, &e_));
        OK(model_gpt_forward(m, in, tg, 8, 16, &loss, &e_));
        if (kfac) {
            OK(model_kfac_gpt_backward(&o, m, &e_));
            OK(model_kfac_gpt_step(&o, m, &e_));
        } else {
            OK(model_gpt_backward(m, &e_));
            OK(model_sgd_step_gpt(&sgd, m, &e_));
        }
        if (s == 0) *first = loss;
        last = loss;
    }
    assert_int_equal(o.kept_inverses, 0);
    model_sgd_free(&sgd);
    model_kfac_gpt_free(&o);
    model_gpt_free(m);
    return last;
}

static void test_training_loss_falls(void **state) {
    (void)state;
    float f0 = 0.0f, f1 = 0.0f;
    float kfac = train_tiny(1, &f0), sgd = train_tiny(0, &f1);
    printf("tiny GPT, 40 steps at lr %g: loss %.3f -> K-FAC %.3f, SGD %.3f\n",
           (double)model_kfac_gpt_config_default().lr, (double)f0, (double)kfac, (double)sgd);
    assert_true(f0 == f1);
    assert_true(isfinite(kfac));
    assert_true(kfac < 0.75f * f0);
    assert_true(kfac < sgd + 0.25f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_equals_explicit), cmocka_unit_test(test_second_step_and_refresh),
        cmocka_unit_test(test_layers_and_config),    cmocka_unit_test(test_refusals_and_reset),
        cmocka_unit_test(test_training_loss_falls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
