/* peer: NoPeek's term in a split-learning step (peer/nopeek.h) on the CPU,
 * against the plain dCor kernel, and its refusals. The GPU path is held to
 * this one in test_peer_nopeek_gpu. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/dcor.h"
#include "peer/nopeek.h"
#include "test_util.h"

static void test_cpu_matches_kernel(void **state) {
    (void)state;
    const int B = 33, p = 20, q = 7;
    float *X = random_vec((size_t)B * p, 1), *Z = random_vec((size_t)B * q, 2);
    float *dz = random_vec((size_t)B * q, 3), *ref = malloc((size_t)B * q * sizeof *ref);
    assert_non_null(ref);
    memcpy(ref, dz, (size_t)B * q * sizeof *ref);
    double *scratch = malloc(kernels_dcor_scratch_doubles(B) * sizeof *scratch);
    assert_non_null(scratch);
    double want = kernels_dcor(ref, X, Z, B, p, q, 2.5f, scratch);
    peer_nopeek n;
    vl_error e = {0};
    assert_int_equal(peer_nopeek_init(&n, 0, B, p, q, &e), VL_OK);
    assert_int_equal(n.on_gpu, 0);
    double got = -1;
    assert_int_equal(peer_nopeek_add(&n, X, Z, 2.5f, dz, &got, &e), VL_OK);
    assert_true(want > 0 && want < 1);
    /* The same kernel on the same floats: the same bits. */
    assert_true(got == want);
    assert_memory_equal(dz, ref, (size_t)B * q * sizeof *dz);
    peer_nopeek_free(&n);
    peer_nopeek_free(&n); /* zeroed: a second free is harmless */
    free(X), free(Z), free(dz), free(ref), free(scratch);
}

static void test_refusals(void **state) {
    (void)state;
    peer_nopeek n;
    vl_error e = {0};
    assert_int_equal(peer_nopeek_init(&n, 0, 1, 4, 4, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "rows"));
    assert_int_equal(peer_nopeek_init(&n, 0, KERNELS_DCOR_MAX_N + 1, 4, 4, &e), VL_EINVAL);
    assert_int_equal(peer_nopeek_init(&n, 0, 8, 0, 4, &e), VL_EINVAL);
    assert_int_equal(peer_nopeek_init(&n, 0, 8, 4, 0, &e), VL_EINVAL);
#if !defined(VOLLEY_HAVE_CUDA)
    assert_int_equal(peer_nopeek_init(&n, 1, 8, 4, 4, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "CUDA"));
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_matches_kernel),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
