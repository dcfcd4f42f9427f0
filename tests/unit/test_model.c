/*
 * Unit tests for the GPT: configuration, tensor table, initialisation, the
 * full-model gradient against finite differences, the linear-layer hook
 * against the gradients it must reproduce, loss at initialisation,
 * overfitting one batch with AdamW, reproducibility, evaluation and the
 * AdamW decay policy.
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

static model_gpt *make(model_gpt_config c, uint64_t seed) {
    model_gpt *m = NULL;
    vl_error err = {0};
    if (model_gpt_create(&c, &m, &err) != 0) fail_msg("create: %s", err.msg);
    model_gpt_init_weights(m, seed);
    return m;
}

#include "tests/unit/test_util.h"

/* ---- configuration and table -------------------------------------------- */

static void test_config_validate(void **state) {
    (void)state;
    vl_error err = {0};
    model_gpt_config c = model_gpt_config_default();
    assert_int_equal(model_gpt_config_validate(&c, &err), 0);
    assert_int_equal(c.vocab_size, 256);
    c.n_head = 5; /* 128 % 5 != 0 */
    assert_int_equal(model_gpt_config_validate(&c, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "multiple"));
    c = model_gpt_config_default();
    c.n_layer = 0;
    assert_int_equal(model_gpt_config_validate(&c, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "n_layer"));
    c = model_gpt_config_default();
    c.vocab_size = -1;
    assert_int_equal(model_gpt_config_validate(&c, &err), VL_EINVAL);
    c = model_gpt_config_default();
    c.n_embd = 16384, c.n_layer = 256, c.n_head = 1; /* ~8e11 parameters */
    assert_int_equal(model_gpt_config_validate(&c, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "parameters"));
    model_gpt *m = (model_gpt *)&err;
    assert_int_equal(model_gpt_create(&c, &m, &err), VL_EINVAL);
    assert_null(m);
    assert_int_equal(model_gpt_config_num_params(&c), 0);
}

static void test_tensor_table(void **state) {
    (void)state;
    model_gpt_config c = model_gpt_config_default();
    model_gpt *m = make(c, 1);
    const model_tensor *t;
    int n = model_gpt_tensors(m, &t);
    assert_int_equal(n, 4 + 12 * c.n_layer);
    size_t C = 128, off = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(t[i].offset, off); /* contiguous, in table order */
        size_t numel = t[i].shape[0] * (t[i].ndim == 2 ? t[i].shape[1] : 1);
        assert_int_equal(t[i].numel, numel);
        off += numel;
    }
    assert_int_equal(off, model_gpt_num_params(m));
    assert_int_equal(off, model_gpt_config_num_params(&c));
    assert_int_equal(off, 256 * C + 64 * C + 2 * (12 * C * C + 13 * C) + 2 * C);
    assert_string_equal(t[0].name, "wte.weight");
    assert_string_equal(t[1].name, "wpe.weight");
    const model_tensor *q = model_gpt_find_tensor(m, "h.1.attn.c_attn.weight");
    assert_non_null(q);
    assert_int_equal(q->ndim, 2);
    assert_int_equal(q->shape[0], C);
    assert_int_equal(q->shape[1], 3 * C);
    q = model_gpt_find_tensor(m, "h.0.mlp.c_proj.weight");
    assert_non_null(q);
    assert_int_equal(q->shape[0], 4 * C);
    assert_int_equal(q->shape[1], C);
    assert_non_null(model_gpt_find_tensor(m, "h.1.mlp.c_fc.bias"));
    assert_non_null(model_gpt_find_tensor(m, "ln_f.bias"));
    assert_null(model_gpt_find_tensor(m, "h.2.ln_1.weight"));
    assert_string_equal(t[n - 1].name, "ln_f.bias");
    model_gpt_config got = model_gpt_config_get(m);
    assert_memory_equal(&got, &c, sizeof c);
    assert_null(model_gpt_grads(m)); /* allocated lazily */
    assert_null(model_gpt_output(m));
    model_gpt_free(m);
    model_gpt_free(NULL);
}

static double tensor_std(model_gpt *m, const char *name, double *mean) {
    const model_tensor *t = model_gpt_find_tensor(m, name);
    assert_non_null(t);
    const float *p = model_gpt_params(m) + t->offset;
    double s = 0, ss = 0;
    for (size_t i = 0; i < t->numel; i++) s += p[i], ss += (double)p[i] * p[i];
    *mean = s / t->numel;
    return sqrt(ss / t->numel - *mean * *mean);
}

static void test_init(void **state) {
    (void)state;
    model_gpt_config c = model_gpt_config_default();
    c.n_layer = 4;
    model_gpt *a = make(c, 7), *b = make(c, 7), *d = make(c, 8);
    size_t n = model_gpt_num_params(a);
    assert_memory_equal(model_gpt_params(a), model_gpt_params(b), n * sizeof(float));
    assert_memory_not_equal(model_gpt_params(a), model_gpt_params(d), n * sizeof(float));
    double mean;
    assert_near(tensor_std(a, "wte.weight", &mean), 0.02, 0.001);
    assert_near(mean, 0.0, 0.001);
    assert_near(tensor_std(a, "h.0.attn.c_attn.weight", &mean), 0.02, 0.001);
    assert_near(tensor_std(a, "h.3.mlp.c_fc.weight", &mean), 0.02, 0.001);
    double proj = 0.02 / sqrt(2.0 * c.n_layer);
    assert_near(tensor_std(a, "h.2.attn.c_proj.weight", &mean), proj, proj * 0.05);
    assert_near(tensor_std(a, "h.1.mlp.c_proj.weight", &mean), proj, proj * 0.05);
    assert_near(tensor_std(a, "h.1.ln_2.weight", &mean), 0.0, 0);
    assert_near(mean, 1.0, 0);
    const char *zero[] = {"h.0.ln_1.bias", "h.0.attn.c_attn.bias", "h.3.mlp.c_proj.bias",
                          "ln_f.bias"};
    for (int i = 0; i < 4; i++) {
        assert_near(tensor_std(a, zero[i], &mean), 0.0, 0);
        assert_near(mean, 0.0, 0);
    }
    assert_near(tensor_std(a, "ln_f.weight", &mean), 0.0, 0);
    assert_near(mean, 1.0, 0);
    model_gpt_free(a), model_gpt_free(b), model_gpt_free(d);
}

/* The initialisation drawn in chunks on several threads is, bit for bit,
 * the plain sequential draw: every 2-D tensor std * vl_rng_normal in table
 * order from one stream, and vl_rng_normal_skip steps that stream exactly as
 * the draws would. wte here spans several chunks and ends inside one. */
static void test_init_sequential(void **state) {
    (void)state;
    vl_rng a, b;
    vl_rng_seed(&a, 11);
    vl_rng_seed(&b, 11);
    vl_rng_normal_skip(&a, 1001);
    for (int i = 0; i < 1001; i++) (void)vl_rng_normal(&b);
    assert_true(vl_rng_u64(&a) == vl_rng_u64(&b));

    model_gpt_config c = {
        .vocab_size = 5003, .block_size = 16, .n_layer = 2, .n_head = 4, .n_embd = 32};
    model_gpt *m = make(c, 99);
    const float *p = model_gpt_params(m);
    const model_tensor *t;
    int n = model_gpt_tensors(m, &t);
    vl_rng r;
    vl_rng_seed(&r, 99);
    float proj = 0.02f / sqrtf(2.0f * (float)c.n_layer);
    for (int i = 0; i < n; i++) {
        if (t[i].ndim != 2) continue;
        float std = strstr(t[i].name, ".c_proj.weight") ? proj : 0.02f;
        for (size_t k = 0; k < t[i].numel; k++) {
            float want = std * vl_rng_normal(&r);
            if (memcmp(&want, p + t[i].offset + k, sizeof want) != 0)
                fail_msg("%s[%zu] = %.9g, sequentially %.9g", t[i].name, k,
                         (double)p[t[i].offset + k], (double)want);
        }
    }
    model_gpt_free(m);
}

/* ---- forward -------------------------------------------------------------- */

static void random_tokens(int *x, size_t n, int V, vl_rng *r) {
    for (size_t i = 0; i < n; i++) x[i] = (int)vl_rng_below(r, (uint32_t)V);
}

static void test_init_loss_is_uniform(void **state) {
    (void)state;
    model_gpt *m = make(model_gpt_config_default(), 42);
    int B = 4, T = 64;
    int in[4 * 64], tg[4 * 64];
    vl_rng r;
    vl_rng_seed(&r, 5);
    random_tokens(in, (size_t)B * T, 256, &r);
    random_tokens(tg, (size_t)B * T, 256, &r);
    float loss = 0;
    OK(model_gpt_forward(m, in, tg, B, T, &loss, &e_));
    assert_near(loss, log(256.0), 0.05);
    /* With targets the output is probabilities. */
    const float *p = model_gpt_output(m);
    assert_non_null(p);
    double s = 0;
    for (int v = 0; v < 256; v++) s += p[v];
    assert_near(s, 1.0, 1e-5);
    model_gpt_free(m);
}

static void test_forward_errors(void **state) {
    (void)state;
    model_gpt_config c = model_gpt_config_default();
    c.block_size = 8;
    model_gpt *m = make(c, 1);
    vl_error err = {0};
    int in[16] = {0}, tg[16] = {0};
    float loss;
    assert_int_equal(model_gpt_backward(m, &err), VL_EINVAL);
    assert_int_equal(model_gpt_forward(m, in, tg, 1, 9, &loss, &err), VL_EINVAL);
    assert_int_equal(model_gpt_forward(m, in, tg, 0, 4, &loss, &err), VL_EINVAL);
    assert_int_equal(model_gpt_forward(m, NULL, tg, 1, 4, &loss, &err), VL_EINVAL);
    in[3] = 256;
    assert_int_equal(model_gpt_forward(m, in, tg, 2, 8, &loss, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "inputs[3]"));
    in[3] = 0;
    tg[5] = -1;
    assert_int_equal(model_gpt_forward(m, in, tg, 2, 8, &loss, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "targets[5]"));
    tg[5] = 0;
    /* logits only: no backward possible */
    OK(model_gpt_forward(m, in, NULL, 2, 8, NULL, &e_));
    assert_non_null(model_gpt_output(m));
    assert_int_equal(model_gpt_backward(m, &err), VL_EINVAL);
    OK(model_gpt_forward(m, in, tg, 2, 8, &loss, &e_));
    OK(model_gpt_backward(m, &e_));
    assert_int_equal(model_gpt_backward(m, &err), VL_EINVAL); /* consumed */
    model_gpt_free(m);
}

/* Shapes that grow B*T, then B*T*T with the same B*T, then shrink, all give
 * the same logits as a freshly created model. */
static void test_replanning(void **state) {
    (void)state;
    model_gpt_config c = model_gpt_config_default();
    c.block_size = 16, c.n_embd = 32, c.n_head = 2;
    model_gpt *m = make(c, 3);
    vl_rng r;
    vl_rng_seed(&r, 9);
    int in[64];
    random_tokens(in, 64, 256, &r);
    const int shapes[][2] = {{2, 4}, {4, 4}, {1, 16}, {2, 3}, {4, 16}};
    for (int s = 0; s < 5; s++) {
        int B = shapes[s][0], T = shapes[s][1];
        OK(model_gpt_forward(m, in, NULL, B, T, NULL, &e_));
        model_gpt *f = make(c, 3);
        OK(model_gpt_forward(f, in, NULL, B, T, NULL, &e_));
        assert_memory_equal(model_gpt_output(m), model_gpt_output(f),
                            (size_t)B * T * 256 * sizeof(float));
        model_gpt_free(f);
    }
    model_gpt_free(m);
}

/* ---- gradient ------------------------------------------------------------- */

static void test_full_model_gradient(void **state) {
    (void)state;
    model_gpt_config c = {
        .vocab_size = 23, .block_size = 7, .n_layer = 2, .n_head = 3, .n_embd = 12};
    model_gpt *m = make(c, 11);
    /* Larger weights than the 0.02 initialisation, so every tensor's
     * gradient is well above float rounding. */
    vl_rng r;
    vl_rng_seed(&r, 12);
    const model_tensor *t;
    int nt = model_gpt_tensors(m, &t);
    float *p = model_gpt_params(m);
    for (int i = 0; i < nt; i++)
        for (size_t k = 0; k < t[i].numel; k++)
            p[t[i].offset + k] += (t[i].ndim == 2 ? 0.3f : 0.2f) * vl_rng_normal(&r);
    int B = 2, T = 5;
    int in[10], tg[10];
    random_tokens(in, 10, c.vocab_size, &r);
    random_tokens(tg, 10, c.vocab_size, &r);
    float loss;
    OK(model_gpt_zero_grad(m, &e_));
    OK(model_gpt_forward(m, in, tg, B, T, &loss, &e_));
    OK(model_gpt_backward(m, &e_));
    const float *g = model_gpt_grads(m);
    assert_non_null(g);
    const float h = 1e-2f;
    for (int i = 0; i < nt; i++) {
        /* The token embedding only gets gradient at used rows and through the
         * head; sample spread over the whole tensor anyway. */
        size_t ns = t[i].numel < 12 ? t[i].numel : 12;
        double dd = 0, nn = 0, aa = 0;
        for (size_t s = 0; s < ns; s++) {
            size_t k =
                t[i].offset + (ns == t[i].numel ? s : vl_rng_below(&r, (uint32_t)t[i].numel));
            if (strcmp(t[i].name, "wpe.weight") == 0)
                k = t[i].offset + vl_rng_below(&r, (uint32_t)(T * c.n_embd)); /* rows < T */
            float saved = p[k];
            float lp, lm;
            p[k] = saved + h;
            OK(model_gpt_forward(m, in, tg, B, T, &lp, &e_));
            p[k] = saved - h;
            OK(model_gpt_forward(m, in, tg, B, T, &lm, &e_));
            p[k] = saved;
            double num = ((double)lp - lm) / (2.0 * h);
            dd += (num - g[k]) * (num - g[k]);
            nn += num * num;
            aa += (double)g[k] * g[k];
        }
        double rel = sqrt(dd) / (sqrt(nn) + sqrt(aa) + 1e-12);
        /* Absolute floor: the loss is a float, so differences below ~1e-6/h
         * are noise. */
        if (rel > 2e-2 && sqrt(dd / ns) > 2e-4)
            fail_msg("gradient of %s off: relative %.3g (|num| %.3g |ana| %.3g)", t[i].name, rel,
                     sqrt(nn), sqrt(aa));
        if (sqrt(aa) == 0.0 && strcmp(t[i].name, "wte.weight") != 0)
            fail_msg("gradient of %s is identically zero", t[i].name);
    }
    model_gpt_free(m);
}

static void test_gradient_accumulates(void **state) {
    (void)state;
    model_gpt_config c = {
        .vocab_size = 256, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 16};
    model_gpt *m = make(c, 4);
    int in[16], tg[16];
    vl_rng r;
    vl_rng_seed(&r, 1);
    random_tokens(in, 16, 256, &r);
    random_tokens(tg, 16, 256, &r);
    size_t n = model_gpt_num_params(m);
    float loss;
    OK(model_gpt_forward(m, in, tg, 2, 8, &loss, &e_));
    OK(model_gpt_backward(m, &e_));
    float *once = malloc(n * sizeof(float));
    assert_non_null(once);
    memcpy(once, model_gpt_grads(m), n * sizeof(float));
    OK(model_gpt_forward(m, in, tg, 2, 8, &loss, &e_));
    OK(model_gpt_backward(m, &e_));
    const float *g = model_gpt_grads(m);
    /* The same gradient again; summing onto a nonzero accumulator only
     * changes rounding. */
    for (size_t i = 0; i < n; i++) assert_near(g[i], 2.0 * once[i], 1e-4 * fabs(once[i]) + 1e-9);
    OK(model_gpt_zero_grad(m, &e_));
    for (size_t i = 0; i < n; i++) assert_true(g[i] == 0.0f);
    free(once);
    model_gpt_free(m);
}

/* ---- linear-layer hook ------------------------------------------------------ */

#define HOOK_MAX_CALLS 16

/* What the hook saw: per call the name, shape, and x^T dy and the column
 * sums of dy accumulated in double, which is what the pass adds into the
 * weight and bias gradients. */
typedef struct hook_rec {
    int calls;
    char name[HOOK_MAX_CALLS][MODEL_TENSOR_NAME_MAX];
    int n[HOOK_MAX_CALLS], in[HOOK_MAX_CALLS], out[HOOK_MAX_CALLS];
    double *dw[HOOK_MAX_CALLS], *db[HOOK_MAX_CALLS];
    double *dw_abs[HOOK_MAX_CALLS]; /* sum of |x dy|, the scale of float rounding */
} hook_rec;

static void record_linear(void *ctx, const char *weight_name, const float *x, const float *dy,
                          int n, int in, int out) {
    hook_rec *h = ctx;
    if (h->calls >= HOOK_MAX_CALLS)
        fail_msg("linear hook called more than %d times", HOOK_MAX_CALLS);
    int c = h->calls++;
    snprintf(h->name[c], sizeof h->name[c], "%s", weight_name);
    h->n[c] = n, h->in[c] = in, h->out[c] = out;
    h->dw[c] = calloc((size_t)in * out, sizeof(double));
    h->dw_abs[c] = calloc((size_t)in * out, sizeof(double));
    h->db[c] = calloc((size_t)out, sizeof(double));
    assert_true(h->dw[c] && h->dw_abs[c] && h->db[c]);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < in; i++)
            for (int o = 0; o < out; o++) {
                double v = (double)x[(size_t)r * in + i] * dy[(size_t)r * out + o];
                h->dw[c][(size_t)i * out + o] += v;
                h->dw_abs[c][(size_t)i * out + o] += fabs(v);
            }
    for (int r = 0; r < n; r++)
        for (int o = 0; o < out; o++) h->db[c][o] += dy[(size_t)r * out + o];
}

static void hook_rec_free(hook_rec *h) {
    for (int c = 0; c < h->calls; c++) {
        free(h->dw[c]);
        free(h->dw_abs[c]);
        free(h->db[c]);
    }
    memset(h, 0, sizeof *h);
}

/* zero_grad, forward and backward on fixed tokens; returns a copy of the
 * gradient vector (caller frees). */
static float *hook_pass(model_gpt *m, const int *in, const int *tg, int B, int T) {
    float loss;
    OK(model_gpt_zero_grad(m, &e_));
    OK(model_gpt_forward(m, in, tg, B, T, &loss, &e_));
    OK(model_gpt_backward(m, &e_));
    size_t np = model_gpt_num_params(m);
    float *g = malloc(np * sizeof(float));
    assert_non_null(g);
    memcpy(g, model_gpt_grads(m), np * sizeof(float));
    return g;
}

static const model_gpt_config hook_cfg = {
    .vocab_size = 97, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 24};

static model_gpt *hook_model(int *in, int *tg, size_t bt) {
    model_gpt *m = make(hook_cfg, 31);
    /* Larger weights than the initialisation, so every layer's gradient
     * stands well clear of zero. */
    vl_rng r;
    vl_rng_seed(&r, 32);
    const model_tensor *t;
    int nt = model_gpt_tensors(m, &t);
    float *p = model_gpt_params(m);
    for (int i = 0; i < nt; i++)
        for (size_t k = 0; k < t[i].numel; k++) p[t[i].offset + k] += 0.1f * vl_rng_normal(&r);
    random_tokens(in, bt, hook_cfg.vocab_size, &r);
    random_tokens(tg, bt, hook_cfg.vocab_size, &r);
    return m;
}

static void test_linear_hook_matches_gradients(void **state) {
    (void)state;
    enum { B = 3, T = 5 };
    int in[B * T], tg[B * T];
    model_gpt *m = hook_model(in, tg, B * T);
    const int L = hook_cfg.n_layer, C = hook_cfg.n_embd;
    hook_rec h = {0};
    model_gpt_set_linear_hook(m, record_linear, &h);
    float *g = hook_pass(m, in, tg, B, T);
    assert_int_equal(h.calls, 4 * L);

    /* Backward reaches the layers from the top block down, the MLP first. */
    static const struct {
        const char *layer;
        int in, out;
    } per_block[4] = {
        {"mlp.c_proj", 4, 1}, {"mlp.c_fc", 1, 4}, {"attn.c_proj", 1, 1}, {"attn.c_attn", 1, 3}};
    for (int c = 0; c < h.calls; c++) {
        int l = L - 1 - c / 4, k = c % 4;
        char want[MODEL_TENSOR_NAME_MAX], bias[MODEL_TENSOR_NAME_MAX];
        snprintf(want, sizeof want, "h.%d.%s.weight", l, per_block[k].layer);
        snprintf(bias, sizeof bias, "h.%d.%s.bias", l, per_block[k].layer);
        assert_string_equal(h.name[c], want);
        assert_int_equal(h.n[c], B * T);
        assert_int_equal(h.in[c], per_block[k].in * C);
        assert_int_equal(h.out[c], per_block[k].out * C);

        const model_tensor *tw = model_gpt_find_tensor(m, want);
        const model_tensor *tb = model_gpt_find_tensor(m, bias);
        assert_non_null(tw);
        assert_non_null(tb);
        assert_int_equal(tw->shape[0], h.in[c]);
        assert_int_equal(tw->shape[1], h.out[c]);
        assert_int_equal(tb->numel, h.out[c]);
        double biggest = 0;
        for (size_t j = 0; j < tw->numel; j++) {
            test_assert_near_at(g[tw->offset + j], h.dw[c][j], 1e-5 * h.dw_abs[c][j] + 1e-12, want,
                                __LINE__);
            biggest = fmax(biggest, fabs(h.dw[c][j]));
        }
        if (!(biggest > 1e-6))
            fail_msg("%s: the hook's x^T dy is all but zero (%.3g)", want, biggest);
        for (size_t j = 0; j < tb->numel; j++)
            test_assert_near_at(g[tb->offset + j], h.db[c][j], 1e-5 * fabs(h.db[c][j]) + 1e-7, bias,
                                __LINE__);
    }
    free(g);
    hook_rec_free(&h);

    /* Every backward reports again; after unsetting, none does. */
    free(hook_pass(m, in, tg, B, T));
    assert_int_equal(h.calls, 4 * L);
    hook_rec_free(&h);
    model_gpt_set_linear_hook(m, NULL, &h);
    free(hook_pass(m, in, tg, B, T));
    assert_int_equal(h.calls, 0);
    model_gpt_free(m);
}

static void test_linear_hook_only_observes(void **state) {
    (void)state;
    enum { B = 3, T = 5 };
    int in[B * T], tg[B * T];
    model_gpt *m = hook_model(in, tg, B * T);
    size_t bytes = model_gpt_num_params(m) * sizeof(float);
    float *plain = hook_pass(m, in, tg, B, T); /* no hook ever set */
    hook_rec h = {0};
    model_gpt_set_linear_hook(m, record_linear, &h);
    float *hooked = hook_pass(m, in, tg, B, T);
    assert_int_equal(h.calls, 4 * hook_cfg.n_layer);
    model_gpt_set_linear_hook(m, NULL, NULL);
    float *unset = hook_pass(m, in, tg, B, T);
    assert_int_equal(h.calls, 4 * hook_cfg.n_layer);
    assert_memory_equal(plain, hooked, bytes);
    assert_memory_equal(plain, unset, bytes);
    free(plain);
    free(hooked);
    free(unset);
    hook_rec_free(&h);
    model_gpt_free(m);
}

/* ---- training ------------------------------------------------------------- */

static void test_overfit_one_batch(void **state) {
    (void)state;
    model_gpt_config c = {
        .vocab_size = 256, .block_size = 16, .n_layer = 2, .n_head = 4, .n_embd = 32};
    model_gpt *m = make(c, 1);
    int B = 4, T = 16;
    int in[64], tg[64];
    vl_rng r;
    vl_rng_seed(&r, 77);
    random_tokens(in, 64, 256, &r);
    random_tokens(tg, 64, 256, &r);
    model_adamw opt;
    OK(model_adamw_init(&opt, model_gpt_num_params(m), 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, &e_));
    float first = 0, loss = 0;
    for (int step = 0; step < 200; step++) {
        OK(model_gpt_zero_grad(m, &e_));
        OK(model_gpt_forward(m, in, tg, B, T, &loss, &e_));
        if (step == 0) first = loss;
        OK(model_gpt_backward(m, &e_));
        OK(model_adamw_step(&opt, m, &e_));
    }
    OK(model_gpt_forward(m, in, tg, B, T, &loss, &e_));
    if (!(loss < first / 20)) fail_msg("did not overfit: loss %.4f -> %.4f", first, loss);
    assert_int_equal(opt.step, 200);
    model_adamw_free(&opt);
    model_gpt_free(m);
}

/* Same seed, same data: bitwise-identical losses and parameters. */
static void train_run(float *losses, int steps, float **params_out, size_t *n_out) {
    model_gpt_config c = {
        .vocab_size = 256, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 24};
    model_gpt *m = make(c, 2024);
    static const char text[] =
        "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.";
    vl_rng r;
    vl_rng_seed(&r, 31337);
    int in[8 * 16], tg[8 * 16];
    model_adamw opt;
    OK(model_adamw_init(&opt, model_gpt_num_params(m), 3e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, &e_));
    for (int s = 0; s < steps; s++) {
        OK(model_data_sample((const uint8_t *)text, sizeof text - 1, 8, 16, &r, in, tg, &e_));
        OK(model_gpt_zero_grad(m, &e_));
        OK(model_gpt_forward(m, in, tg, 8, 16, &losses[s], &e_));
        OK(model_gpt_backward(m, &e_));
        OK(model_adamw_step(&opt, m, &e_));
    }
    *n_out = model_gpt_num_params(m);
    *params_out = malloc(*n_out * sizeof(float));
    assert_non_null(*params_out);
    memcpy(*params_out, model_gpt_params(m), *n_out * sizeof(float));
    model_adamw_free(&opt);
    model_gpt_free(m);
}

static void test_deterministic_training(void **state) {
    (void)state;
    float l1[15], l2[15];
    float *p1, *p2;
    size_t n1, n2;
    train_run(l1, 15, &p1, &n1);
    train_run(l2, 15, &p2, &n2);
    assert_memory_equal(l1, l2, sizeof l1);
    assert_int_equal(n1, n2);
    assert_memory_equal(p1, p2, n1 * sizeof(float));
    assert_true(l1[14] < l1[0]);
    free(p1), free(p2);
}

/* ---- evaluation ----------------------------------------------------------- */

static void test_eval_bytes(void **state) {
    (void)state;
    model_gpt_config c = {
        .vocab_size = 256, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 16};
    model_gpt *m = make(c, 6);
    uint8_t data[100];
    for (int i = 0; i < 100; i++) data[i] = (uint8_t)(i * 37 + 11);
    int T = 8;
    /* 99 / 8 = 12 windows; compute the reference window by window. */
    double ref = 0;
    for (int w = 0; w < 12; w++) {
        int in[8], tg[8];
        for (int t = 0; t < T; t++) in[t] = data[w * T + t], tg[t] = data[w * T + t + 1];
        float l;
        OK(model_gpt_forward(m, in, tg, 1, T, &l, &e_));
        ref += l;
    }
    ref /= 12;
    float a, b, d;
    OK(model_gpt_eval_bytes(m, data, sizeof data, 5, T, 0, &a, &e_)); /* 5+5+2 */
    OK(model_gpt_eval_bytes(m, data, sizeof data, 5, T, 0, &b, &e_));
    assert_memory_equal(&a, &b, sizeof a);
    assert_near(a, ref, 1e-5);
    OK(model_gpt_eval_bytes(m, data, sizeof data, 1, T, 12, &d, &e_));
    assert_near(d, ref, 1e-5);
    /* max_batches: only the first 2 windows */
    OK(model_gpt_eval_bytes(m, data, sizeof data, 2, T, 1, &d, &e_));
    OK(model_gpt_eval_bytes(m, data, 17, 4, T, 0, &b, &e_)); /* len 17: windows 0 and 1 */
    assert_memory_equal(&d, &b, sizeof d);
    vl_error err = {0};
    assert_int_equal(model_gpt_eval_bytes(m, data, 8, 1, 8, 0, &d, &err), VL_EINVAL);
    assert_int_equal(model_gpt_eval_bytes(m, data, 100, 1, 9, 0, &d, &err), VL_EINVAL);
    assert_int_equal(model_gpt_backward(m, &err), VL_EINVAL);
    model_gpt_free(m);
    c.vocab_size = 100;
    m = make(c, 6);
    assert_int_equal(model_gpt_eval_bytes(m, data, 100, 1, 8, 0, &d, &err), VL_EINVAL);
    model_gpt_free(m);
}

/* ---- AdamW policy and data ------------------------------------------------ */

static void test_adamw_decay_policy(void **state) {
    (void)state;
    model_gpt_config c = {
        .vocab_size = 256, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
    model_gpt *m = make(c, 8);
    size_t n = model_gpt_num_params(m);
    vl_error err = {0};
    model_adamw opt;
    assert_int_equal(model_adamw_step(&(model_adamw){0}, m, &err), VL_EINVAL);
    assert_int_equal(model_adamw_init(&opt, n, 1e-2f, 1.0f, 0.9f, 1e-8f, 0, &err), VL_EINVAL);
    assert_int_equal(model_adamw_init(&opt, n, NAN, 0.9f, 0.9f, 1e-8f, 0, &err), VL_EINVAL);
    assert_int_equal(model_adamw_init(&opt, 0, 1e-2f, 0.9f, 0.9f, 1e-8f, 0, &err), VL_EINVAL);
    model_adamw_free(&opt);
    OK(model_adamw_init(&opt, n, 0.1f, 0.9f, 0.95f, 1e-8f, 0.5f, &e_));
    assert_int_equal(model_adamw_step(&opt, m, &err), VL_EINVAL); /* no grads yet */
    OK(model_gpt_zero_grad(m, &e_));
    float *before = malloc(n * sizeof(float));
    assert_non_null(before);
    /* Give every parameter a nonzero value, then step with zero gradient:
     * only weight decay moves anything. */
    float *p = model_gpt_params(m);
    for (size_t i = 0; i < n; i++) p[i] = 1.0f + (float)(i % 5);
    memcpy(before, p, n * sizeof(float));
    OK(model_adamw_step(&opt, m, &e_));
    const model_tensor *t;
    int nt = model_gpt_tensors(m, &t);
    for (int i = 0; i < nt; i++)
        for (size_t k = t[i].offset; k < t[i].offset + t[i].numel; k++) {
            float want = t[i].ndim == 2 ? before[k] - 0.1f * 0.5f * before[k] : before[k];
            if (fabsf(p[k] - want) > 1e-6f * fabsf(want))
                fail_msg("%s: %g after decay, expected %g", t[i].name, p[k], want);
        }
    model_adamw_reset(&opt);
    assert_int_equal(opt.step, 0);
    model_adamw opt2;
    OK(model_adamw_init(&opt2, n + 1, 0.1f, 0.9f, 0.95f, 1e-8f, 0.5f, &e_));
    assert_int_equal(model_adamw_step(&opt2, m, &err), VL_EINVAL);
    model_adamw_free(&opt2);
    model_adamw_free(&opt);
    model_adamw_free(&opt); /* twice is safe */
    free(before);
    model_gpt_free(m);
}

static void test_data_sample(void **state) {
    (void)state;
    uint8_t data[40];
    for (int i = 0; i < 40; i++) data[i] = (uint8_t)(200 + i); /* value encodes the offset */
    vl_rng r;
    vl_rng_seed(&r, 3);
    int B = 50, T = 9;
    int in[50 * 9], tg[50 * 9];
    int seen[40] = {0};
    OK(model_data_sample(data, sizeof data, B, T, &r, in, tg, &e_));
    for (int b = 0; b < B; b++) {
        int start = in[b * T] - 200;
        assert_true(start >= 0 && start + T + 1 <= 40);
        seen[start] = 1;
        for (int t = 0; t < T; t++) {
            assert_int_equal(in[b * T + t], 200 + start + t);
            assert_int_equal(tg[b * T + t], 200 + start + t + 1);
        }
    }
    int distinct = 0;
    for (int i = 0; i < 40; i++) distinct += seen[i];
    assert_true(distinct > 15); /* 31 possible starts, 50 draws */
    /* Exactly one window fits. */
    OK(model_data_sample(data, (size_t)T + 1, 3, T, &r, in, tg, &e_));
    assert_int_equal(in[2 * T], 200);
    assert_int_equal(tg[2 * T + T - 1], 200 + T);
    vl_error err = {0};
    assert_int_equal(model_data_sample(data, (size_t)T, 1, T, &r, in, tg, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "shorter"));
    assert_int_equal(model_data_sample(data, 40, 0, T, &r, in, tg, &err), VL_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_validate),
        cmocka_unit_test(test_tensor_table),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_init_sequential),
        cmocka_unit_test(test_init_loss_is_uniform),
        cmocka_unit_test(test_forward_errors),
        cmocka_unit_test(test_replanning),
        cmocka_unit_test(test_full_model_gradient),
        cmocka_unit_test(test_gradient_accumulates),
        cmocka_unit_test(test_linear_hook_matches_gradients),
        cmocka_unit_test(test_linear_hook_only_observes),
        cmocka_unit_test(test_overfit_one_batch),
        cmocka_unit_test(test_deterministic_training),
        cmocka_unit_test(test_eval_bytes),
        cmocka_unit_test(test_adamw_decay_policy),
        cmocka_unit_test(test_data_sample),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
