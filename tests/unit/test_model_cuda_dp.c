/*
 * The data-parallel GPT (model/gpt_cuda_dp.h) against the single-device
 * one. Without a usable device the program reports itself skipped (exit
 * 77) before any test runs, so a machine without a GPU never counts it as
 * passed; with one GPU the multi-device test says why it skipped itself.
 *
 * What is held:
 *  - one device: loss, gradients, clipping norm, AdamW state and
 *    parameters bit for bit equal to a plain model_gpt_cuda's over two
 *    steps. The batches use every token at most once, so the embedding
 *    gradient's atomics add one value per element and both models' sums
 *    are fixed (the other row sums take one atomic per column at this
 *    size), which is what makes bitwise equality a fair demand;
 *  - two devices (uneven split, and one idle replica): the tolerances of
 *    test_model_cuda.c for a different summation order in fp32 (loss
 *    relative 1e-5, each tensor's gradient 1e-4 of its largest element,
 *    parameters after AdamW within 5 % of the learning rate where the
 *    gradient is not rounding noise), and the replicas' gradients and
 *    parameters bit for bit equal to each other;
 *  - device 0 current after every call.
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
#include "test_util.h"

static const float LR = 1e-3f, B1 = 0.9f, B2 = 0.95f, EPS = 1e-8f, WD = 0.1f;

/* A small GPT with sizes off every block multiple, as test_model_cuda.c
 * uses. */
static const model_gpt_config CFG = {.vocab_size = 67, .block_size = 24, .n_layer = 2,
                                     .n_head = 3, .n_embd = 48};

static void ok(int rc, const vl_error *err, const char *what)
{
    if (rc != 0)
        fail_msg("%s failed: %s", what, err->msg);
}

static float *hbuf(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

static void expect_device_0(const char *after)
{
    int d = -1;
    vl_error err = {0};
    ok(kernels_cuda_get_device(&d, &err), &err, "current device");
    if (d != 0)
        fail_msg("device %d is current after %s", d, after);
}

/* Fails at the first float whose bits differ. */
static void expect_bits(const char *what, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: element %zu differs (%.9g vs %.9g)", what, i, (double)a[i],
                     (double)b[i]);
}

/* inputs: distinct tokens (a prefix of a shuffled vocabulary, so n <= V);
 * targets: any. */
static void batch(int *in, int *tg, int n, rng *r)
{
    int V = CFG.vocab_size, perm[256];
    assert_true(n <= V && V <= 256);
    for (int i = 0; i < V; i++)
        perm[i] = i;
    for (int i = V - 1; i > 0; i--) {
        int j = (int)rng_below(r, (uint32_t)i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < n; i++) {
        in[i] = perm[i];
        tg[i] = (int)rng_below(r, (uint32_t)V);
    }
}

static model_gpt *host_model(uint64_t seed)
{
    model_gpt *m = NULL;
    vl_error err = {0};
    ok(model_gpt_create(&CFG, &m, &err), &err, "host model");
    model_gpt_init_weights(m, seed);
    return m;
}

/* The plain model's gradient of one batch, the reference the data-parallel
 * one is held to, copied into grads (np floats). */
static void plain_grads(model_gpt_cuda *g, const int *in, const int *tg, int B, int T,
                        float *loss, float *grads, size_t np)
{
    vl_error err = {0};
    ok(model_gpt_cuda_zero_grad(g, &err), &err, "plain zero_grad");
    ok(model_gpt_cuda_forward(g, in, tg, B, T, loss, &err), &err, "plain forward");
    ok(model_gpt_cuda_backward(g, &err), &err, "plain backward");
    ok(model_gpt_cuda_download_grads(g, grads, np, &err), &err, "plain grads");
}

/* Clips the plain model's gradient at half its norm, so clipping always
 * scales; *g2 gets the squared norm before clipping and the threshold is
 * returned, for the data-parallel model to clip at the same one. */
static double plain_clip(model_gpt_cuda *g, double *g2)
{
    vl_error err = {0};
    double again = 0;
    ok(model_gpt_cuda_clip_grads(g, 0, g2, &err), &err, "plain norm");
    double max_norm = 0.5 * sqrt(*g2);
    ok(model_gpt_cuda_clip_grads(g, max_norm, &again, &err), &err, "plain clip");
    return max_norm;
}

/* ---- one device ------------------------------------------------------------------- */

static void test_one_device_is_the_plain_model(void **state)
{
    (void)state;
    int B = 3, T = 19, N = B * T;
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
    int in[64], tg[64];
    float *pg = hbuf(np), *dg = hbuf(np), *pp = hbuf(np), *pm = hbuf(np), *pv = hbuf(np),
          *dm = hbuf(np), *dv = hbuf(np);
    rng r;
    rng_seed(&r, 32);
    for (int step = 1; step <= 2; step++) {
        batch(in, tg, N, &r);
        float lp = 0, ld = 0;
        double g2p = 0, g2d = 0;
        plain_grads(plain, in, tg, B, T, &lp, pg, np);
        ok(model_gpt_cuda_dp_grads(dp, in, tg, B, T, &ld, &err), &err, "dp grads");
        expect_device_0("grads");
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
    }
    /* State in and out: the plain model's moments set on dp come back. */
    ok(model_gpt_cuda_dp_set_adamw(dp, pm, pv, np, 7, &err), &err, "set adamw");
    long s = 0;
    ok(model_gpt_cuda_dp_get_adamw(dp, dm, dv, np, &s, &err), &err, "get adamw");
    assert_int_equal(s, 7);
    expect_bits("AdamW m round trip", dm, pm, np);
    ok(model_gpt_cuda_dp_zero_grad(dp, &err), &err, "zero_grad");
    ok(model_gpt_cuda_dp_download_replica(dp, 0, NULL, dg, np, &err), &err, "replica 0");
    for (size_t i = 0; i < np; i++)
        assert_true(dg[i] == 0.0f);
    free(pg), free(dg), free(pp), free(pm), free(pv), free(dm), free(dv);
    model_gpt_cuda_dp_destroy(dp);
    model_gpt_cuda_destroy(plain);
    model_gpt_destroy(host);
    model_gpt_destroy(dl);
}

/* ---- refusals --------------------------------------------------------------------- */

static void test_bad_args(void **state)
{
    (void)state;
    vl_error err = {0};
    model_gpt *host = host_model(41);
    model_gpt_cuda_dp *dp = (model_gpt_cuda_dp *)host; /* must be reset to NULL */
    int visible = kernels_cuda_device_count();
    assert_int_equal(model_gpt_cuda_dp_create(NULL, KERNELS_CUDA_FP32, 1, &dp, &err),
                     VL_EINVAL);
    assert_int_equal(model_gpt_cuda_dp_create(host, KERNELS_CUDA_FP32, 1, NULL, &err),
                     VL_EINVAL);
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
    model_gpt_cuda_dp_destroy(NULL);

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
    assert_int_equal(model_gpt_cuda_dp_download_replica(dp, 0, NULL, NULL, np, &err),
                     VL_EINVAL);
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
    model_gpt_destroy(wrong);
    model_gpt_cuda_dp_destroy(dp);
    model_gpt_destroy(host);
}

/* ---- two devices ------------------------------------------------------------------ */

#if defined(VOLLEY_HAVE_NCCL)


/* The parameters dp's replicas hold, checked equal to each other and held
 * to the plain model's (pp) where the step's gradient (cg) is not rounding
 * noise; returns the worst difference. */
static double replicas_agree(model_gpt_cuda_dp *dp, const float *pp, const float *cg,
                             const model_tensor *tab, int ntab, size_t np)
{
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
        for (size_t i = 0; i < tab[t].numel; i++)
            gmax = fmax(gmax, fabs(cg[tab[t].offset + i]));
        for (size_t i = 0; i < tab[t].numel; i++) {
            size_t k = tab[t].offset + i;
            if (fabs(cg[k]) >= 1e-3 * gmax)
                worst = fmax(worst, fabs((double)p0[k] - pp[k]));
        }
    }
    free(p0), free(pr), free(g0), free(gr);
    return worst;
}

/* Two steps on 2 devices against one device, batches of B rows. */
static void two_devices(int B)
{
    int T = 19, N = B * T;
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
    int in[64], tg[64];
    float *pg = hbuf(np), *dg = hbuf(np), *pp = hbuf(np);
    rng r;
    rng_seed(&r, 52);
    for (int step = 1; step <= 2; step++) {
        batch(in, tg, N, &r);
        float lp = 0, ld = 0;
        double g2p = 0, g2d = 0;
        plain_grads(plain, in, tg, B, T, &lp, pg, np);
        ok(model_gpt_cuda_dp_grads(dp, in, tg, B, T, &ld, &err), &err, "dp grads");
        expect_device_0("grads");
        double lrel = fabs((double)ld - lp) / fabs((double)lp);
        if (!(lrel <= 1e-5))
            fail_msg("B=%d step %d: loss %.7f on 2 devices, %.7f on one", B, step, (double)ld,
                     (double)lp);
        ok(model_gpt_cuda_dp_download_grads(dp, dg, np, &err), &err, "dp grads");
        for (int t = 0; t < ntab; t++) {
            double e = test_max_rel_err(dg + tab[t].offset, pg + tab[t].offset, tab[t].numel);
            if (!(e <= 1e-4))
                fail_msg("B=%d step %d: gradient of %s differs by %.3g", B, step, tab[t].name,
                         e);
        }
        double mn = plain_clip(plain, &g2p);
        ok(model_gpt_cuda_dp_clip_grads(dp, mn, &g2d, &err), &err, "dp clip");
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
        if (!(worst <= 0.05 * LR))
            fail_msg("B=%d step %d: parameters after AdamW differ by %.3g (lr %g)", B, step,
                     worst, (double)LR);
        /* Step 2 from the plain model's parameters: one step's difference
         * again, not accumulated drift; this also puts new parameters on
         * every replica. */
        ok(model_gpt_cuda_dp_upload_params(dp, dl, &err), &err, "upload");
    }
    free(pg), free(dg), free(pp);
    model_gpt_cuda_dp_destroy(dp);
    expect_device_0("destroy");
    model_gpt_cuda_destroy(plain);
    model_gpt_destroy(host);
    model_gpt_destroy(dl);
}

#endif /* VOLLEY_HAVE_NCCL */

static void test_two_devices(void **state)
{
    (void)state;
    int visible = kernels_cuda_device_count();
    if (visible < 2) {
        printf("multi-GPU part skipped: %d CUDA device(s) visible, it needs 2\n", visible);
        skip();
    }
#if defined(VOLLEY_HAVE_NCCL)
    two_devices(3); /* rows 2 + 1 */
    two_devices(1); /* replica 1 idle, contributing zeros */
#else
    printf("multi-GPU part skipped: this build has no NCCL\n");
    skip();
#endif
}

int main(void)
{
    test_cuda_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_device_is_the_plain_model),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_two_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
