/*
 * The data-parallel GPT (model/gpt_cuda_dp.h) trained on two devices
 * against the single-device one. It needs a GPU, a second one and NCCL:
 * where any is missing the program says which in one line and exits 77
 * (ctest's skip) before any test runs, so a machine that cannot run it
 * never counts it as passed. A GPU that is present but unusable fails it
 * (tests/unit/cuda_skip.h).
 *
 * What is held, for an uneven split of the batch and for one replica
 * idle: the tolerances of test_model_cuda.c for a different summation
 * order in fp32 (loss relative 1e-5, each tensor's gradient 1e-4 of its
 * largest element, the squared gradient norm relative 2e-4, parameters
 * after AdamW within 5 % of the learning rate where the gradient is not
 * rounding noise); the replicas' gradients and parameters bit for bit
 * equal to each other; device 0 current after every call. Each
 * comparison prints what it measured.
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
#include "kernels/kernels.h"
#include "model/gpt_cuda.h"
#include "model/gpt_cuda_dp.h"
#include "model/model.h"
#include "cuda_skip.h"
#include "gpt_cuda_fixtures.h"
#include "test_util.h"

#if defined(VOLLEY_HAVE_NCCL)

/* The parameters dp's replicas hold, checked equal to each other and held
 * to the plain model's (pp) where the step's gradient (cg) is not rounding
 * noise; returns the worst difference. */
static double replicas_agree(model_gpt_cuda_dp *dp, const float *pp, const float *cg,
                             const model_tensor *tab, int ntab, size_t np) {
    vl_error err = {0};
    float *p0 = hbuf(np), *pr = hbuf(np), *g0 = hbuf(np), *gr = hbuf(np);
    ok(model_gpt_cuda_dp_download_replica(dp, 0, p0, g0, np, &err), &err, "replica 0");
    for (int r = 1; r < model_gpt_cuda_dp_devices(dp); r++) {
        ok(model_gpt_cuda_dp_download_replica(dp, r, pr, gr, np, &err), &err, "replica");
        expect_bits("replica gradients", gr, g0, np);
        expect_bits("replica parameters", pr, p0, np);
    }
    expect_device_0("download_replica");
    double worst = 0;
    for (int t = 0; t < ntab; t++) {
        double gmax = 0;
        for (size_t i = 0; i < tab[t].numel; i++) gmax = fmax(gmax, fabs(cg[tab[t].offset + i]));
        for (size_t i = 0; i < tab[t].numel; i++) {
            size_t k = tab[t].offset + i;
            double d = fabs((double)p0[k] - pp[k]);
            if (fabs(cg[k]) >= 1e-3 * gmax && !(d <= worst))
                worst = isnan(d) ? INFINITY : d; /* a NaN must not hide */
        }
    }
    free(p0), free(pr), free(g0), free(gr);
    return worst;
}

/* Two steps on 2 devices against one device, batches of B rows. */
static void two_devices(int B) {
    int T = 19;
    vl_error err = {0};
    model_gpt *host = host_model(51), *dl = host_model(0);
    model_gpt_cuda *plain = NULL;
    model_gpt_cuda_dp *dp = NULL;
    ok(model_gpt_cuda_create(host, KERNELS_CUDA_FP32, &plain, &err), &err, "plain model");
    ok(model_gpt_cuda_dp_create(host, KERNELS_CUDA_FP32, 2, &dp, &err), &err, "dp model");
    expect_device_0("create");
    assert_int_equal(model_gpt_cuda_dp_devices(dp), 2);
    size_t np = model_gpt_cuda_dp_num_params(dp);
    const model_tensor *tab = NULL;
    int ntab = model_gpt_tensors(host, &tab);
    float *pg = hbuf(np), *dg = hbuf(np), *pp = hbuf(np);
    vl_rng r;
    vl_rng_seed(&r, 52);
    for (int step = 1; step <= 2; step++) {
        float lp = 0, ld = 0;
        double g2p = 0, g2d = 0;
        both_grads(plain, dp, B, T, &r, &lp, &ld, pg, np);
        double lrel = fabs((double)ld - lp) / fabs((double)lp);
        printf("B=%d step %d: loss relative error %.3g (tolerance 1e-5)\n", B, step, lrel);
        if (!(lrel <= 1e-5))
            fail_msg("B=%d step %d: loss %.7f on 2 devices, %.7f on one", B, step, (double)ld,
                     (double)lp);
        ok(model_gpt_cuda_dp_download_grads(dp, dg, np, &err), &err, "dp grads");
        double gworst = 0;
        int gt = 0;
        for (int t = 0; t < ntab; t++) {
            double e = test_max_rel_err(dg + tab[t].offset, pg + tab[t].offset, tab[t].numel);
            if (!(e <= gworst)) gworst = e, gt = t;
        }
        printf("B=%d step %d: worst tensor gradient error %.3g, %s (tolerance 1e-4)\n", B, step,
               gworst, tab[gt].name);
        if (!(gworst <= 1e-4))
            fail_msg("B=%d step %d: gradient of %s differs by %.3g", B, step, tab[gt].name, gworst);
        double mn = plain_clip(plain, &g2p);
        ok(model_gpt_cuda_dp_clip_grads(dp, mn, &g2d, &err), &err, "dp clip");
        printf("B=%d step %d: squared norm relative error %.3g (tolerance 2e-4)\n", B, step,
               fabs(g2d - g2p) / g2p);
        if (!(fabs(g2d - g2p) <= 2e-4 * g2p))
            fail_msg("B=%d step %d: squared norm %.9g on 2 devices, %.9g on one", B, step, g2d,
                     g2p);
        /* The clipped gradient picks out which parameters moved by more
         * than rounding noise. */
        ok(model_gpt_cuda_download_grads(plain, pg, np, &err), &err, "plain grads");
        ok(model_gpt_cuda_adamw_step(plain, LR, B1, B2, EPS, WD, &err), &err, "plain adamw");
        ok(model_gpt_cuda_dp_adamw_step(dp, LR, B1, B2, EPS, WD, &err), &err, "dp adamw");
        ok(model_gpt_cuda_download_params(plain, dl, &err), &err, "plain params");
        memcpy(pp, model_gpt_params(dl), np * sizeof(float));
        double worst = replicas_agree(dp, pp, pg, tab, ntab, np);
        printf("B=%d step %d: parameters after AdamW differ by at most %.3g lr (tolerance "
               "0.05 lr)\n",
               B, step, worst / LR);
        if (!(worst <= 0.05 * LR))
            fail_msg("B=%d step %d: parameters after AdamW differ by %.3g (lr %g)", B, step, worst,
                     (double)LR);
        /* Step 2 from the plain model's parameters: one step's difference
         * again, not accumulated drift; this also puts new parameters on
         * every replica. */
        ok(model_gpt_cuda_dp_upload_params(dp, dl, &err), &err, "upload");
    }
    free(pg), free(dg), free(pp);
    model_gpt_cuda_dp_free(dp);
    expect_device_0("destroy");
    model_gpt_cuda_free(plain);
    model_gpt_free(host);
    model_gpt_free(dl);
}

static void test_uneven_split(void **state) {
    (void)state;
    two_devices(3); /* rows 2 + 1 */
}

static void test_one_replica_idle(void **state) {
    (void)state;
    two_devices(1); /* replica 1 gets no rows and contributes zeros */
}

#endif /* VOLLEY_HAVE_NCCL */

int main(void) {
    test_cuda_require_device();
#if !defined(VOLLEY_HAVE_NCCL)
    printf("SKIPPED: this build has no NCCL, which training on several GPUs needs\n");
    return TEST_CUDA_SKIPPED;
#else
    int visible = kernels_cuda_device_count();
    if (visible < 2) {
        printf("SKIPPED: %d CUDA device visible, training on several GPUs needs 2\n", visible);
        return TEST_CUDA_SKIPPED;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uneven_split),
        cmocka_unit_test(test_one_replica_idle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
