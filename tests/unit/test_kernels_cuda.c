/*
 * CUDA kernels against their CPU counterparts. Without a usable device the
 * program reports itself skipped (exit 77) before any test runs, so a
 * machine without a GPU never counts it as passed.
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
#include "cuda_skip.h"

static void adamw_compare(size_t n, int with_mask) {
    vl_rng r;
    vl_rng_seed(&r, 1000 + n);
    float *p = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    float *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
    float *cp = malloc(n * sizeof(float)), *cm = calloc(n, sizeof(float)),
          *cv = calloc(n, sizeof(float));
    uint8_t *mask = with_mask ? malloc(n) : NULL;
    assert_true(p && g && m && v && cp && cm && cv && (mask || !with_mask));
    for (size_t i = 0; i < n; i++) {
        p[i] = cp[i] = vl_rng_normal(&r);
        if (mask) mask[i] = (uint8_t)(vl_rng_below(&r, 2));
    }
    kernels_adamw_hparams hp = {3e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 0};
    double worst = 0;
    for (long step = 1; step <= 3; step++) {
        for (size_t i = 0; i < n; i++) g[i] = vl_rng_normal(&r) * 0.1f;
        hp.step = step;
        vl_error err = {0};
        int rc = kernels_cuda_adamw_step_host(p, g, m, v, mask, n, &hp, &err);
        if (rc != 0) fail_msg("CUDA adamw failed at n=%zu: %s", n, err.msg);
        kernels_adamw_step(cp, g, cm, cv, mask, n, &hp);
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)p[i] - cp[i]) / (1e-6 + fabs(cp[i]));
            if (d > worst) worst = d;
            assert_float_equal(m[i], cm[i], 1e-6 * (1 + fabs(cm[i])));
            assert_float_equal(v[i], cv[i], 1e-6 * (1 + fabs(cv[i])));
        }
    }
    if (worst > 1e-6) fail_msg("CUDA and CPU AdamW differ at n=%zu: worst relative %.3g", n, worst);
    free(p), free(g), free(m), free(v), free(cp), free(cm), free(cv), free(mask);
}

static void test_cuda_adamw_matches_cpu(void **state) {
    (void)state;
    /* Sizes around and between multiples of the 256-thread block. */
    size_t sizes[] = {1, 255, 257, 1000, 65537, 1234567};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        adamw_compare(sizes[i], 0);
        adamw_compare(sizes[i], 1);
    }
}

static void test_cuda_adamw_rejects_bad_args(void **state) {
    (void)state;
    vl_error err = {0};
    float x = 0;
    kernels_adamw_hparams hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1};
    assert_int_equal(kernels_cuda_adamw_step(NULL, &x, &x, &x, NULL, 4, &hp, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_adamw_step_host(&x, &x, &x, &x, NULL, 1, NULL, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_adamw_step_host(&x, &x, &x, &x, NULL, 0, &hp, &err), 0);
}

/* The clipping norm: double sums in a fixed order, so the device agrees
 * with a plain double loop to rounding and with itself to the bit. */
static void test_cuda_sumsq_and_scale(void **state) {
    (void)state;
    size_t sizes[] = {1, 255, 257, 1000, 262145, 3000017};
    double *d_scratch = NULL;
    vl_error err = {0};
    assert_int_equal(kernels_cuda_alloc((void **)&d_scratch,
                                        KERNELS_CUDA_SUMSQ_SCRATCH_DOUBLES * sizeof(double), &err),
                     0);
    for (size_t c = 0; c < sizeof(sizes) / sizeof(sizes[0]); c++) {
        size_t n = sizes[c];
        vl_rng r;
        vl_rng_seed(&r, 77 + n);
        float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
        assert_true(x && y);
        double want = 0;
        for (size_t i = 0; i < n; i++) {
            x[i] = vl_rng_normal(&r) * 0.01f;
            want += (double)x[i] * x[i];
        }
        float *d_x = NULL;
        assert_int_equal(kernels_cuda_alloc((void **)&d_x, n * sizeof(float), &err), 0);
        assert_int_equal(kernels_cuda_upload(d_x, x, n * sizeof(float), &err), 0);
        double got = 0, again = 0;
        assert_int_equal(kernels_cuda_sumsq(d_x, n, d_scratch, &got, &err), 0);
        assert_int_equal(kernels_cuda_sumsq(d_x, n, d_scratch, &again, &err), 0);
        if (!(fabs(got - want) <= 1e-12 * want))
            fail_msg("sumsq at n=%zu: %.17g on the device, %.17g on the CPU", n, got, want);
        assert_memory_equal(&got, &again, sizeof got);
        assert_int_equal(kernels_cuda_scale(d_x, n, 0.375f, &err), 0);
        assert_int_equal(kernels_cuda_download(y, d_x, n * sizeof(float), &err), 0);
        for (size_t i = 0; i < n; i++)
            if (y[i] != x[i] * 0.375f)
                fail_msg("scale at n=%zu, i=%zu: %g, not %g", n, i, y[i], x[i] * 0.375f);
        kernels_cuda_free(d_x);
        free(x), free(y);
    }
    double out = 1;
    assert_int_equal(kernels_cuda_sumsq(NULL, 4, d_scratch, &out, &err), VL_EINVAL);
    assert_int_equal(kernels_cuda_sumsq((const float *)d_scratch, 0, d_scratch, &out, &err), 0);
    assert_true(out == 0);
    kernels_cuda_free(d_scratch);
}

int main(void) {
    test_cuda_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_adamw_matches_cpu),
        cmocka_unit_test(test_cuda_adamw_rejects_bad_args),
        cmocka_unit_test(test_cuda_sumsq_and_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
