/*
 * The data-parallel GPT (model/gpt_cuda_dp.h) on one device against the
 * single-device one, and its refusals. Without a usable device the program
 * reports itself skipped (exit 77) before any test runs, so a machine
 * without a GPU never counts it as passed. Training on two devices is
 * test_model_cuda_multi.c's, a program of its own so that it can skip
 * itself whole where there are fewer than two devices or no NCCL.
 *
 * What is held: loss, gradients, clipping norm, AdamW state and parameters
 * bit for bit equal to a plain model_gpt_cuda's over two steps. The
 * batches use every token at most once, so the embedding gradient's
 * atomics add one value per element and both models' sums are fixed (the
 * other row sums take one atomic per column at this size), which is what
 * makes bitwise equality a fair demand; and device 0 current after every
 * call.
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
#include "kernels/cuda_model.h"
#include "kernels/kernels.h"
#include "model/gpt_cuda.h"
#include "model/gpt_cuda_dp.h"
#include "model/model.h"
#include "cuda_skip.h"
#include "gpt_cuda_fixtures.h"

/* ---- one device ------------------------------------------------------------------- */

static void test_one_device_is_the_plain_model(void **state) {
    (void)state;
    int B = 3, T = 19;
    vl_error err = {0};
    model_gpt *host = host_model(31), *dl = host_model(0);
    model_gpt_cuda *plain = NULL;
    model_gpt_cuda_dp *dp = NULL;
    ok(model_gpt_cuda_create(host, KERNELS_CUDA_FP32, &plain, &err), &err, "plain model");
    ok(model_gpt_cuda_dp_create(host, KERNELS_CUDA_FP32, 1, &dp, &err), &err, "dp model");
    expect_device_0("create");
    assert_int_equal(model_gpt_cuda_dp_devices(dp), 1);
    size_t np = model_gpt_cuda_num_params(plain);
    assert_int_equal(model_gpt_cuda_dp_num_params(dp), np);
    float *pg = hbuf(np), *dg = hbuf(np), *pp = hbuf(np), *pm = hbuf(np), *pv = hbuf(np),
          *dm = hbuf(np), *dv = hbuf(np);
    vl_rng r;
    vl_rng_seed(&r, 32);
    for (int step = 1; step <= 2; step++) {
        float lp = 0, ld = 0;
        double g2p = 0, g2d = 0;
        both_grads(plain, dp, B, T, &r, &lp, &ld, pg, np);
        expect_bits("loss", &ld, &lp, 1);
        ok(model_gpt_cuda_dp_download_grads(dp, dg, np, &err), &err, "dp grads");
        expect_bits("gradients", dg, pg, np);
        double mn = plain_clip(plain, &g2p);
        ok(model_gpt_cuda_dp_clip_grads(dp, mn, &g2d, &err), &err, "dp clip");
        if (memcmp(&g2p, &g2d, sizeof g2p) != 0)
            fail_msg("step %d: squared norm %.17g, plain %.17g", step, g2d, g2p);
        ok(model_gpt_cuda_download_grads(plain, pg, np, &err), &err, "plain grads");
        ok(model_gpt_cuda_dp_download_grads(dp, dg, np, &err), &err, "dp grads");
        expect_bits("clipped gradients", dg, pg, np);
        ok(model_gpt_cuda_adamw_step(plain, LR, B1, B2, EPS, WD, &err), &err, "plain adamw");
        ok(model_gpt_cuda_dp_adamw_step(dp, LR, B1, B2, EPS, WD, &err), &err, "dp adamw");
        expect_device_0("adamw_step");
        ok(model_gpt_cuda_download_params(plain, dl, &err), &err, "plain params");
        memcpy(pp, model_gpt_params(dl), np * sizeof(float));
        ok(model_gpt_cuda_dp_download_params(dp, dl, &err), &err, "dp params");
        expect_bits("parameters after AdamW", model_gpt_params(dl), pp, np);
        long sp = 0, sd = 0;
        ok(model_gpt_cuda_get_adamw(plain, pm, pv, np, &sp, &err), &err, "plain state");
        ok(model_gpt_cuda_dp_get_adamw(dp, dm, dv, np, &sd, &err), &err, "dp state");
        assert_int_equal(sd, sp);
        assert_int_equal(sd, step);
        expect_bits("AdamW m", dm, pm, np);
        expect_bits("AdamW v", dv, pv, np);
        printf("one device, step %d: loss, gradients, norm, AdamW state and parameters bit for "
               "bit the plain model's\n",
               step);
    }
    /* State in and out: the plain model's moments set on dp come back. */
    ok(model_gpt_cuda_dp_set_adamw(dp, pm, pv, np, 7, &err), &err, "set adamw");
    long s = 0;
    ok(model_gpt_cuda_dp_get_adamw(dp, dm, dv, np, &s, &err), &err, "get adamw");
    assert_int_equal(s, 7);
    expect_bits("AdamW m round trip", dm, pm, np);
    ok(model_gpt_cuda_dp_zero_grad(dp, &err), &err, "zero_grad");
    ok(model_gpt_cuda_dp_download_replica(dp, 0, NULL, dg, np, &err), &err, "replica 0");
    for (size_t i = 0; i < np; i++) assert_true(dg[i] == 0.0f);
    free(pg), free(dg), free(pp), free(pm), free(pv), free(dm), free(dv);
    model_gpt_cuda_dp_free(dp);
    model_gpt_cuda_free(plain);
    model_gpt_free(host);
    model_gpt_free(dl);
}

/* ---- refusals --------------------------------------------------------------------- */

static void test_bad_args(void **state) {
    (void)state;
    vl_error err = {0};
    model_gpt *host = host_model(41);
    model_gpt_cuda_dp *dp = (model_gpt_cuda_dp *)host; /* must be reset to NULL */
    int visible = kernels_cuda_device_count();
    assert_int_equal(model_gpt_cuda_dp_create(NULL, KERNELS_CUDA_FP32, 1, &dp, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_create(host, KERNELS_CUDA_FP32, 1, NULL, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_create(host, KERNELS_CUDA_FP32, visible + 1, &dp, &err),
                     VL_EINVAL);
    assert_null(dp);
    expect_device_0("a refused create");
#if !defined(VOLLEY_HAVE_NCCL)
    if (visible >= 2) {
        assert_int_equal(model_gpt_cuda_dp_create(host, KERNELS_CUDA_FP32, 2, &dp, &err),
                         VL_EINVAL);
        assert_non_null(strstr(err.msg, "NCCL"));
    }
#endif
    /* The NULL model everywhere. */
    float f = 0;
    double d = 0;
    long step = 0;
    int in[8] = {0}, tg[8] = {0};
    assert_int_equal(model_gpt_cuda_dp_devices(NULL), 0);
    assert_int_equal(model_gpt_cuda_dp_num_params(NULL), 0);
    assert_int_equal(model_gpt_cuda_dp_upload_params(NULL, host, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_download_params(NULL, host, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_download_grads(NULL, &f, 1, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_download_replica(NULL, 0, &f, NULL, 1, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_zero_grad(NULL, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_grads(NULL, in, tg, 1, 8, &f, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_clip_grads(NULL, 1.0, &d, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_adamw_step(NULL, LR, B1, B2, EPS, WD, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_set_adamw(NULL, NULL, NULL, 1, 0, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_get_adamw(NULL, &f, &f, 1, &step, &err), VL_EINVAL);
    model_gpt_cuda_dp_free(NULL);

    ok(model_gpt_cuda_dp_create(host, KERNELS_CUDA_FP32, 1, &dp, &err), &err, "dp model");
    size_t np = model_gpt_cuda_dp_num_params(dp);
    assert_int_equal(model_gpt_cuda_dp_grads(dp, in, tg, 0, 8, &f, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_grads(dp, in, tg, -1, 8, &f, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_grads(dp, in, tg, 1, CFG.block_size + 1, &f, &err),
                     VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_grads(dp, NULL, tg, 1, 8, &f, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_grads(dp, in, NULL, 1, 8, &f, &err), VL_EINVAL);
    tg[7] = CFG.vocab_size; /* one token out of range */
    assert_int_equal(model_gpt_cuda_dp_grads(dp, in, tg, 1, 8, &f, &err), VL_EINVAL);
    tg[7] = 0;
    assert_int_equal(model_gpt_cuda_dp_clip_grads(dp, 1.0, NULL, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_download_grads(dp, &f, 1, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_download_replica(dp, 1, &f, NULL, np, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_download_replica(dp, -1, &f, NULL, np, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_download_replica(dp, 0, NULL, NULL, np, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_adamw_step(dp, NAN, B1, B2, EPS, WD, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_set_adamw(dp, NULL, NULL, np, 3, &err), VL_EINVAL);
    model_gpt_config other = CFG;
    other.n_embd = 24;
    model_gpt *wrong = NULL;
    ok(model_gpt_create(&other, &wrong, &err), &err, "other model");
    assert_int_equal(model_gpt_cuda_dp_upload_params(dp, wrong, &err), VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_download_params(dp, wrong, &err), VL_EINVAL);
    expect_device_0("refused calls");
    /* Refusals left it usable. */
    ok(model_gpt_cuda_dp_grads(dp, in, tg, 1, 8, &f, &err), &err, "grads after refusals");
    assert_true(isfinite(f));
    model_gpt_free(wrong);
    model_gpt_cuda_dp_free(dp);
    model_gpt_free(host);
}

int main(void) {
    test_cuda_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_device_is_the_plain_model),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
