/* peer on a GPU: an AdamW task trained wholly on the device, and its
 * update compressed there, against the host doing the same from the same
 * delta. Without a usable device the program reports itself skipped (exit
 * 77) before any test runs, so a machine without a GPU never counts it as
 * passed.
 *
 * What must agree: the device's delta and the host's bit for bit (the
 * same subtraction of the same floats); top-k's indices, values and
 * residual bit for bit (exact selection, element-wise feedback); a
 * sketch's table to float rounding (the device adds with atomics);
 * Gaussian-k its contract (count within 5 % of k) and conservation (what
 * was sent plus the new residual is the old residual plus the delta). */
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

/* A trainer that has run a 5-step AdamW task on the GPU. */
static void trained_on_gpu(peer_trainer *t, peer_train_result *res) {
    vl_error e = {0};
    peer_trainer_init(t);
    assert_int_equal(peer_trainer_init_model(t, &TINY, 0, &e), VL_OK);
    t->device = PEER_DEVICE_CUDA;
    t->gpu_fallback = 0;
    peer_task task = tiny_task(5);
    if (peer_trainer_run(t, &task, TEXT, 17, res, &e) != VL_OK) fail_msg("GPU task: %s", e.msg);
    assert_int_equal(t->device, PEER_DEVICE_CUDA);
    assert_true(peer_gpu_has_delta(t));
}

static void test_task_on_gpu(void **state) {
    (void)state;
    peer_trainer t, cpu;
    peer_train_result res, cres;
    trained_on_gpu(&t, &res);
    vl_error e = {0};
    peer_trainer_init(&cpu);
    assert_int_equal(peer_trainer_init_model(&cpu, &TINY, 0, &e), VL_OK);
    peer_task task = tiny_task(5);
    assert_int_equal(peer_trainer_run(&cpu, &task, TEXT, 17, &cres, &e), VL_OK);
    /* bf16 products: the same training, not the same bits. */
    assert_int_equal(res.steps, cres.steps);
    assert_float_equal(res.first_loss, cres.first_loss, 2e-2);
    assert_float_equal(res.last_loss, cres.last_loss, 5e-2);
    assert_int_equal(t.opt.step, cpu.opt.step);
    double dd = 0, dn = 0;
    for (size_t i = 0; i < t.n_params; i++) {
        dd += (double)(t.delta[i] - cpu.delta[i]) * (t.delta[i] - cpu.delta[i]);
        dn += (double)cpu.delta[i] * cpu.delta[i];
    }
    if (!(sqrt(dd) <= 0.1 * sqrt(dn)))
        fail_msg("GPU and CPU deltas differ by %.3g of the CPU's norm", sqrt(dd / dn));
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
    double scale = 0;
    for (size_t i = 0; i < 5 * 311; i++) scale = fmax(scale, fabs(h.table[i]));
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
    rng r;
    rng_seed(&r, 3);
    for (size_t i = 0; i < n; i++) r0[i] = t.residual[i] = rng_normal(&r) * 1e-3f;
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
        assert_true(fabs((double)nnz - (double)k) <= k / 20.0 + 1);
        /* Conservation: sent + kept = decayed old residual + delta. */
        float *sum = malloc(n * sizeof *sum);
        assert_non_null(sum);
        memcpy(sum, t.residual, n * sizeof *sum);
        for (size_t j = 0; j < nnz; j++) {
            if (j > 0) assert_true(t.sel_idx[j] > t.sel_idx[j - 1]);
            sum[t.sel_idx[j]] += t.sel_val[j];
        }
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
        cmocka_unit_test(test_task_on_gpu),
        cmocka_unit_test(test_sketch_on_gpu),
        cmocka_unit_test(test_topk_on_gpu),
        cmocka_unit_test(test_gaussk_on_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
