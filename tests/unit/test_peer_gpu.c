/* peer on a GPU: an AdamW task trained wholly on the device, an SGD task's
 * forward and backward there, and an update compressed there, against the
 * host doing the same from the same delta. Without a usable device the
 * program reports itself skipped (exit 77) before any test runs, so a
 * machine without a GPU never counts it as passed. Every comparison with a
 * tolerance prints what it measured.
 *
 * What must agree: an AdamW and an SGD task's delta with the CPU's to 0.1
 * relative L2 (bf16 products), leaving out the attention key bias, whose
 * gradient is rounding noise (key_bias_mask); the device's delta and the
 * host's bit for bit (the same subtraction of the same floats); top-k's
 * indices, values and residual bit for bit (exact selection, element-wise
 * feedback); a sketch's table to float rounding (the device adds with
 * atomics); Gaussian-k its contract (count within 5 % of k) and
 * conservation (what was sent plus the new residual is the old residual
 * plus the delta). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cuda_model.h"
#include "peer/peer.h"
#include "cuda_skip.h"
#include "peer_fixtures.h"

/* A trainer holding TINY that has run task on kind (fallback: whether a
 * GPU failure moves it to the CPU, as under --device auto). */
static void trained_on(peer_trainer *t, peer_device_kind kind, int fallback, const peer_task *task,
                       peer_train_result *res) {
    vl_error e = {0};
    peer_trainer_init(t);
    assert_int_equal(peer_trainer_init_model(t, &TINY, 0, &e), VL_OK);
    t->device = kind;
    t->gpu_fallback = fallback;
    peer_task k = *task;
    if (peer_trainer_run(t, &k, TEXT, 17, res, &e) != VL_OK)
        fail_msg("task on the %s: %s", kind == PEER_DEVICE_CUDA ? "GPU" : "CPU", e.msg);
    if (t->device != kind) fail_msg("the GPU failed and the task ran on the CPU (see the warning)");
}

/* A trainer that has run a 5-step AdamW task on the GPU. */
static void trained_on_gpu(peer_trainer *t, peer_train_result *res) {
    peer_task task = tiny_task(5);
    trained_on(t, PEER_DEVICE_CUDA, 0, &task, res);
    assert_true(peer_gpu_has_delta(t));
}

/* The attention key bias (the middle third of each layer's qkv bias, q |
 * k | v as model/gpt.c lays it out and kernels_attention_forward reads
 * it): its true gradient is zero, since it adds one constant to all of a
 * query's scores and softmax ignores that. Its gradient is rounding noise
 * on either side, which AdamW turns into steps of +-lr in any direction,
 * so it says nothing about whether two trainings agree. Returns a mask of
 * n_params bytes, nonzero there. */
static uint8_t *key_bias_mask(const peer_trainer *t) {
    size_t C = (size_t)t->cfg.n_embd;
    uint8_t *mask = calloc(t->n_params, 1);
    assert_non_null(mask);
    for (int l = 0; l < t->cfg.n_layer; l++) {
        char name[MODEL_TENSOR_NAME_MAX];
        snprintf(name, sizeof name, "h.%d.attn.c_attn.bias", l);
        const model_tensor *b = model_gpt_find_tensor(t->gpt, name);
        assert_non_null(b);
        assert_int_equal(b->numel, 3 * C);
        memset(mask + b->offset + C, 1, C);
    }
    return mask;
}

/* Holds the GPU's delta to the CPU's in relative L2 (bound), leaving out
 * the key bias, and prints the measured figures. */
static void expect_deltas_close(const char *what, const peer_trainer *g, const peer_trainer *c,
                                double bound) {
    assert_int_equal(g->n_params, c->n_params);
    uint8_t *skip = key_bias_mask(c);
    double dd = 0, dn = 0, dmax = 0, cmax = 0;
    size_t left_out = 0;
    for (size_t i = 0; i < c->n_params; i++) {
        if (skip[i]) {
            left_out++;
            continue;
        }
        double d = (double)g->delta[i] - c->delta[i];
        dd += d * d;
        dn += (double)c->delta[i] * c->delta[i];
        if (!(fabs(d) <= dmax)) dmax = isnan(d) ? INFINITY : fabs(d);
        cmax = fmax(cmax, fabs(c->delta[i]));
    }
    free(skip);
    double rel = dn > 0 ? sqrt(dd / dn) : sqrt(dd);
    printf("%s: delta relative L2 %.3g (bound %.2g), max |GPU - CPU| %.3g (CPU's largest "
           "%.3g), %zu key-bias coordinates left out\n",
           what, rel, bound, dmax, cmax, left_out);
    if (!(rel <= bound))
        fail_msg("%s: GPU and CPU deltas differ by %.3g of the CPU's norm (bound %.2g)", what, rel,
                 bound);
}

/* Loss on the GPU against the CPU's, printed, within tol. */
static void expect_loss(const char *what, float g, float c, double tol) {
    double d = fabs((double)g - c);
    printf("%s: %.6f on the GPU, %.6f on the CPU, difference %.3g (tolerance %.2g)\n", what,
           (double)g, (double)c, d, tol);
    if (!(d <= tol)) fail_msg("%s: GPU %.6f, CPU %.6f", what, (double)g, (double)c);
}

static void test_task_on_gpu(void **state) {
    (void)state;
    peer_trainer t, cpu;
    peer_train_result res, cres;
    trained_on_gpu(&t, &res);
    vl_error e = {0};
    peer_task task = tiny_task(5);
    trained_on(&cpu, PEER_DEVICE_CPU, 0, &task, &cres);
    /* bf16 products: the same training, not the same bits. */
    assert_int_equal(res.steps, cres.steps);
    expect_loss("AdamW first loss", res.first_loss, cres.first_loss, 2e-2);
    expect_loss("AdamW last loss", res.last_loss, cres.last_loss, 5e-2);
    assert_int_equal(t.opt.step, cpu.opt.step);
    expect_deltas_close("AdamW task", &t, &cpu, 0.1);
    /* The device's delta is the host's, bit for bit. */
    float *d = malloc(t.n_params * sizeof *d);
    assert_non_null(d);
    assert_int_equal(kernels_cuda_download(d, t.gpu_vec + t.n_params, t.n_params * sizeof *d, &e),
                     0);
    assert_memory_equal(d, t.delta, t.n_params * sizeof *d);
    free(d);
    /* A second task continues from the moments that came back. */
    assert_int_equal(peer_trainer_run(&t, &task, TEXT, 17, &res, &e), VL_OK);
    assert_int_equal(t.opt.step, 10);
    peer_trainer_free(&t);
    peer_trainer_free(&cpu);
}

/* An SGD task: forward and backward on the device, the optimizer on the
 * host, from a fresh trainer whose host model has no gradients yet. */
static void test_sgd_task_on_gpu(void **state) {
    (void)state;
    peer_task task = tiny_task(5);
    task.sgd = 1;
    task.lr = 0.1;
    task.momentum = 0.9;
    peer_trainer t, cpu;
    peer_train_result res, cres;
    /* With the fallback on, as under --device auto: a GPU failure would
     * leave the trainer on the CPU, which the device check catches. */
    trained_on(&t, PEER_DEVICE_CUDA, 1, &task, &res);
    assert_non_null(t.gpu);
    trained_on(&cpu, PEER_DEVICE_CPU, 0, &task, &cres);
    assert_int_equal(res.steps, cres.steps);
    expect_loss("SGD first loss", res.first_loss, cres.first_loss, 2e-2);
    assert_true(res.last_loss < res.first_loss);
    expect_deltas_close("SGD task", &t, &cpu, 0.1);
    peer_trainer_free(&t);
    peer_trainer_free(&cpu);
}

static void test_sketch_on_gpu(void **state) {
    (void)state;
    peer_trainer t;
    peer_train_result res;
    trained_on_gpu(&t, &res);
    vl_error e = {0};
    compress_sketch g, h;
    assert_int_equal(compress_sketch_init(&g, 5, 311, 99, &e), VL_OK);
    assert_int_equal(compress_sketch_init(&h, 5, 311, 99, &e), VL_OK);
    if (peer_gpu_sketch(&t, &g, &e) != VL_OK) fail_msg("GPU sketch: %s", e.msg);
    compress_sketch_encode(&h, t.delta, t.n_params);
    double scale = 0, worst = 0;
    for (size_t i = 0; i < 5 * 311; i++) scale = fmax(scale, fabs(h.table[i]));
    for (size_t i = 0; i < 5 * 311; i++) {
        double d = fabs(g.table[i] - h.table[i]);
        if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
    }
    printf("sketch table: max |GPU - host| %.3g of the largest cell (tolerance 1e-5)\n",
           scale > 0 ? worst / scale : worst);
    for (size_t i = 0; i < 5 * 311; i++)
        if (!(fabs(g.table[i] - h.table[i]) <= 1e-5 * scale))
            fail_msg("sketch cell %zu: %g on the GPU, %g on the host", i, g.table[i], h.table[i]);
    compress_sketch_free(&g);
    compress_sketch_free(&h);
    peer_trainer_free(&t);
}

/* The device's selection and the host's from the same residual. */
static void select_both(peer_method method, int64_t k, int64_t block) {
    peer_trainer t;
    peer_train_result res;
    trained_on_gpu(&t, &res);
    peer_task task = tiny_task(5);
    task.method = method;
    task.comp_k = k;
    task.comp_block = block;
    task.comp_decay = 0.9f;
    size_t n = t.n_params, cap = COMPRESS_GAUSSK_CAP((size_t)k);
    float *r0 = malloc(n * sizeof *r0), *hr = malloc(n * sizeof *hr);
    float *hv = malloc(cap * sizeof *hv);
    uint32_t *hi = malloc(cap * sizeof *hi);
    t.residual = malloc(n * sizeof *t.residual);
    t.sel_idx = malloc(cap * sizeof *t.sel_idx);
    t.sel_val = malloc(cap * sizeof *t.sel_val);
    assert_true(r0 && hr && hv && hi && t.residual && t.sel_idx && t.sel_val);
    t.sel_cap = cap;
    vl_rng r;
    vl_rng_seed(&r, 3);
    for (size_t i = 0; i < n; i++) r0[i] = t.residual[i] = vl_rng_normal(&r) * 1e-3f;
    vl_error e = {0};
    size_t nnz = 0, hn = 0;
    if (peer_gpu_select(&t, &task, &nnz, &e) != VL_OK) fail_msg("GPU select: %s", e.msg);

    memcpy(hr, r0, n * sizeof *hr);
    compress_feedback_add(hr, t.delta, n, task.comp_decay);
    if (method == PEER_METHOD_TOPK) {
        assert_int_equal(compress_topk_blocks(hr, n, (size_t)k, (size_t)block, hi, &hn, &e), 0);
        compress_feedback_take(hr, hi, hn, task.dtype, hv);
        assert_int_equal(nnz, hn);
        assert_memory_equal(t.sel_idx, hi, nnz * sizeof *hi);
        assert_memory_equal(t.sel_val, hv, nnz * sizeof *hv);
        assert_memory_equal(t.residual, hr, n * sizeof *hr);
    } else {
        printf("Gaussian-k: %zu sent for k = %lld (bound: within %.0f)\n", nnz, (long long)k,
               k / 20.0 + 1);
        assert_true(fabs((double)nnz - (double)k) <= k / 20.0 + 1);
        /* Conservation: sent + kept = decayed old residual + delta. */
        float *sum = malloc(n * sizeof *sum);
        assert_non_null(sum);
        memcpy(sum, t.residual, n * sizeof *sum);
        for (size_t j = 0; j < nnz; j++) {
            if (j > 0) assert_true(t.sel_idx[j] > t.sel_idx[j - 1]);
            sum[t.sel_idx[j]] += t.sel_val[j];
        }
        double worst = 0;
        for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)sum[i] - hr[i]));
        printf("Gaussian-k conservation: max error %.3g (tolerance 1e-7)\n", worst);
        for (size_t i = 0; i < n; i++) assert_float_equal(sum[i], hr[i], 1e-7);
        free(sum);
    }
    free(r0), free(hr), free(hv), free(hi);
    peer_trainer_free(&t);
}

static void test_topk_on_gpu(void **state) {
    (void)state;
    select_both(PEER_METHOD_TOPK, 97, 0);
    select_both(PEER_METHOD_TOPK, 97, 1000); /* several slices */
}

static void test_gaussk_on_gpu(void **state) {
    (void)state;
    select_both(PEER_METHOD_GAUSSK, 400, 0);
}

int main(void) {
    test_cuda_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_task_on_gpu),   cmocka_unit_test(test_sgd_task_on_gpu),
        cmocka_unit_test(test_sketch_on_gpu), cmocka_unit_test(test_topk_on_gpu),
        cmocka_unit_test(test_gaussk_on_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
