/* SGD with momentum: steps against a plain double reference, the GPT path
 * against the per-tensor decay rule, learning on a tiny GPT, refusals. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model.h"
#include "test_util.h"

/* Three steps of the rule written out in double: b = mu b + g;
 * d = b or g + mu b; p -= lr d + lr wd p. */
static void reference(double *p, double *b, const float *const g[3], size_t n, double lr, double mu,
                      double wd, int nesterov) {
    for (int s = 0; s < 3; s++)
        for (size_t i = 0; i < n; i++) {
            b[i] = mu * b[i] + g[s][i];
            double d = nesterov ? g[s][i] + mu * b[i] : b[i];
            p[i] -= lr * d + lr * wd * p[i];
        }
}

static void check_against_reference(int nesterov, int decay) {
    enum { N = 37 };
    float *p = random_vec(N, 1);
    float *g[3] = {random_vec(N, 2), random_vec(N, 3), random_vec(N, 4)};
    double pr[N], br[N] = {0};
    for (int i = 0; i < N; i++) pr[i] = p[i];
    const float lr = 0.05f, mu = 0.9f, wd = 0.1f;
    reference(pr, br, (const float *const *)g, N, lr, mu, decay ? wd : 0.0, nesterov);
    model_sgd opt;
    OK(model_sgd_init(&opt, N, lr, mu, wd, nesterov, &e_));
    for (int s = 0; s < 3; s++) OK(model_sgd_step(&opt, p, g[s], N, decay, &e_));
    assert_int_equal(opt.step, 3);
    for (int i = 0; i < N; i++) {
        if (fabs(p[i] - pr[i]) > 1e-5 * (1 + fabs(pr[i])))
            fail_msg("nesterov %d decay %d: p[%d] = %.8g, reference %.8g", nesterov, decay, i,
                     (double)p[i], pr[i]);
        assert_true(fabs(opt.buf[i] - br[i]) <= 1e-5 * (1 + fabs(br[i])));
    }
    /* reset forgets the momentum: the next step is plain SGD again. */
    model_sgd_reset(&opt);
    assert_int_equal(opt.step, 0);
    float q = p[0];
    OK(model_sgd_step(&opt, p, g[0], N, 0, &e_));
    assert_float_equal(p[0], q - lr * (nesterov ? g[0][0] + mu * g[0][0] : g[0][0]), 1e-6);
    model_sgd_free(&opt);
    model_sgd_free(&opt); /* twice is fine */
    for (int s = 0; s < 3; s++) free(g[s]);
    free(p);
}

static void test_sgd_reference(void **state) {
    (void)state;
    for (int nesterov = 0; nesterov < 2; nesterov++)
        for (int decay = 0; decay < 2; decay++) check_against_reference(nesterov, decay);
}

/* One batch of the tiny GPT: forward and backward, leaving gradients. */
static float grads_of_batch(model_gpt *m, const int *in, const int *tg, int B, int T) {
    float loss = 0;
    OK(model_gpt_zero_grad(m, &e_));
    OK(model_gpt_forward(m, in, tg, B, T, &loss, &e_));
    OK(model_gpt_backward(m, &e_));
    return loss;
}

/* On the GPT, 2-D tensors decay and 1-D ones (biases, LayerNorm) do not;
 * the first step is p - lr g - lr wd [2-D] p exactly; and momentum SGD
 * overfits one batch. */
static void test_sgd_gpt(void **state) {
    (void)state;
    const model_gpt_config cfg = {256, 16, 1, 2, 16};
    model_gpt *m = NULL;
    OK(model_gpt_create(&cfg, &m, &e_));
    model_gpt_init_weights(m, 11);
    enum { B = 4, T = 16 };
    int in[B * T], tg[B * T];
    vl_rng r;
    vl_rng_seed(&r, 5);
    for (int i = 0; i < B * T; i++) {
        in[i] = (int)vl_rng_below(&r, 256);
        tg[i] = (int)vl_rng_below(&r, 256);
    }
    size_t n = model_gpt_num_params(m);
    float first = grads_of_batch(m, in, tg, B, T);
    float *before = malloc(n * sizeof(float));
    assert_non_null(before);
    memcpy(before, model_gpt_params(m), n * sizeof(float));
    const float *g = model_gpt_grads(m);
    const float lr = 0.05f, wd = 0.5f;
    model_sgd opt;
    OK(model_sgd_init(&opt, n, lr, 0.9f, wd, 0, &e_));
    OK(model_sgd_step_gpt(&opt, m, &e_));
    const model_tensor *ts = NULL;
    int nt = model_gpt_tensors(m, &ts);
    int decayed = 0, kept = 0;
    const float *p = model_gpt_params(m);
    for (int t = 0; t < nt; t++) {
        float w = ts[t].ndim == 2 ? wd : 0.0f;
        if (ts[t].ndim == 2)
            decayed++;
        else
            kept++;
        for (size_t i = ts[t].offset; i < ts[t].offset + ts[t].numel; i++) {
            float want = before[i] - (lr * g[i] + lr * w * before[i]);
            if (fabsf(p[i] - want) > 1e-6f * (1 + fabsf(want)))
                fail_msg("%s[%zu]: %.8g, want %.8g", ts[t].name, i - ts[t].offset, (double)p[i],
                         (double)want);
        }
    }
    assert_true(decayed > 0 && kept > 0);
    /* Momentum SGD learns the batch. */
    float loss = first;
    for (int s = 0; s < 60; s++) {
        loss = grads_of_batch(m, in, tg, B, T);
        OK(model_sgd_step_gpt(&opt, m, &e_));
    }
    if (!(loss < 0.5f * first)) fail_msg("loss %.4f -> %.4f: did not halve", first, loss);
    model_sgd_free(&opt);
    free(before);
    model_gpt_free(m);
}

static void test_sgd_refusals(void **state) {
    (void)state;
    model_sgd opt;
    vl_error e = {0};
    assert_int_equal(model_sgd_init(&opt, 0, 0.1f, 0.9f, 0, 0, &e), VL_EINVAL);
    assert_int_equal(model_sgd_init(&opt, 4, -0.1f, 0.9f, 0, 0, &e), VL_EINVAL);
    assert_int_equal(model_sgd_init(&opt, 4, NAN, 0.9f, 0, 0, &e), VL_EINVAL);
    assert_int_equal(model_sgd_init(&opt, 4, 0.1f, 1.0f, 0, 0, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "momentum"));
    assert_int_equal(model_sgd_init(&opt, 4, 0.1f, 0.9f, -1, 0, &e), VL_EINVAL);
    assert_int_equal(model_sgd_init(&opt, 4, 0.1f, 0.0f, 0, 1, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "Nesterov"));
    model_sgd_free(&opt); /* left empty by the refusals */
    float p[4] = {0}, g[4] = {0};
    assert_int_equal(model_sgd_step(&opt, p, g, 4, 0, &e), VL_EINVAL); /* not initialised */
    OK(model_sgd_init(&opt, 4, 0.1f, 0.9f, 0, 0, &e_));
    assert_int_equal(model_sgd_step(&opt, p, g, 5, 0, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "given 5"));
    assert_int_equal(model_sgd_step(&opt, NULL, g, 4, 0, &e), VL_EINVAL);
    model_gpt *m = NULL;
    const model_gpt_config cfg = {256, 16, 1, 2, 16};
    OK(model_gpt_create(&cfg, &m, &e_));
    assert_int_equal(model_sgd_step_gpt(&opt, m, &e), VL_EINVAL); /* wrong size */
    model_sgd_free(&opt);
    OK(model_sgd_init(&opt, model_gpt_num_params(m), 0.1f, 0.9f, 0, 0, &e_));
    assert_int_equal(model_sgd_step_gpt(&opt, m, &e), VL_EINVAL); /* no gradients yet */
    assert_non_null(strstr(e.msg, "gradients"));
    model_sgd_free(&opt);
    model_gpt_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_reference),
        cmocka_unit_test(test_sgd_gpt),
        cmocka_unit_test(test_sgd_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
