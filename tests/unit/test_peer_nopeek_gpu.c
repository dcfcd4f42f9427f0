/* peer: NoPeek's term in a split-learning step on the GPU (peer/nopeek.h)
 * against the same term on the CPU, at the sizes a Fashion-MNIST split
 * run uses and at edge sizes, and the peer moving to the CPU after a
 * device failure. Without a usable device the program reports itself
 * skipped (exit 77) before any test runs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda_skip.h"
#include "peer/nopeek.h"
#include "test_util.h"

/* Both devices on one batch whose Z depends on X (so dCor is well away
 * from 0), starting from the same incoming gradient; two batches, so the
 * device buffers are reused. */
static void compare(int B, int p, int q) {
    peer_nopeek g, c;
    vl_error e = {0};
    if (peer_nopeek_init(&g, 1, B, p, q, &e) != VL_OK) fail_msg("GPU init: %s", e.msg);
    assert_int_equal(g.on_gpu, 1);
    assert_int_equal(peer_nopeek_init(&c, 0, B, p, q, &e), VL_OK);
    for (int round = 0; round < 2; round++) {
        float *X = random_vec((size_t)B * p, 10 + round),
              *Z = random_vec((size_t)B * q, 20 + round);
        for (int i = 0; i < B; i++)
            for (int k = 0; k < q; k++) Z[(size_t)i * q + k] += 2 * X[(size_t)i * p + k % p];
        float *dg = random_vec((size_t)B * q, 30 + round), *dc = malloc((size_t)B * q * sizeof *dc);
        assert_non_null(dc);
        memcpy(dc, dg, (size_t)B * q * sizeof *dc);
        double vg = -1, vc = -2;
        if (peer_nopeek_add(&g, X, Z, 3.0f, dg, &vg, &e) != VL_OK) fail_msg("GPU: %s", e.msg);
        assert_int_equal(peer_nopeek_add(&c, X, Z, 3.0f, dc, &vc, &e), VL_OK);
        double worst = 0, gmax = 0;
        for (size_t i = 0; i < (size_t)B * q; i++) {
            worst = fmax(worst, fabs((double)dg[i] - dc[i]));
            gmax = fmax(gmax, fabs((double)dc[i]));
        }
        printf("B=%d p=%d q=%d: dCor GPU %.12f CPU %.12f, gradient max difference %.3g of "
               "%.3g\n",
               B, p, q, vg, vc, worst, gmax);
        /* Two rows are always perfectly correlated: dCor is then exactly 1. */
        assert_true(vc > 0.05 && vc <= 1);
        /* The same sums in the same order; only sqrt may round apart. */
        assert_true(fabs(vg - vc) <= 1e-12);
        assert_true(worst <= 1e-6 * gmax + 1e-12);
        free(X), free(Z), free(dg), free(dc);
    }
    peer_nopeek_free(&g);
    peer_nopeek_free(&c);
}

static void test_gpu_matches_cpu(void **state) {
    (void)state;
    compare(2, 1, 1);
    compare(64, 784, 128);
    compare(256, 784, 256);
    compare(257, 13, 300);
}

/* After peer_nopeek_to_cpu the same object goes on, on the CPU, with the
 * CPU's bits. */
static void test_move_to_cpu(void **state) {
    (void)state;
    const int B = 40, p = 9, q = 5;
    peer_nopeek g, c;
    vl_error e = {0};
    if (peer_nopeek_init(&g, 1, B, p, q, &e) != VL_OK) fail_msg("GPU init: %s", e.msg);
    assert_int_equal(peer_nopeek_init(&c, 0, B, p, q, &e), VL_OK);
    peer_nopeek_to_cpu(&g);
    assert_int_equal(g.on_gpu, 0);
    assert_null(g.d_x);
    float *X = random_vec((size_t)B * p, 5), *Z = random_vec((size_t)B * q, 6);
    float *a = calloc((size_t)B * q, sizeof *a), *b = calloc((size_t)B * q, sizeof *b);
    assert_true(a && b);
    double va, vb;
    assert_int_equal(peer_nopeek_add(&g, X, Z, 1.0f, a, &va, &e), VL_OK);
    assert_int_equal(peer_nopeek_add(&c, X, Z, 1.0f, b, &vb, &e), VL_OK);
    assert_true(va == vb);
    assert_memory_equal(a, b, (size_t)B * q * sizeof *a);
    peer_nopeek_free(&g);
    peer_nopeek_free(&c);
    free(X), free(Z), free(a), free(b);
}

int main(void) {
    test_cuda_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_matches_cpu),
        cmocka_unit_test(test_move_to_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
