/*
 * The distance correlation of kernels/dcor.h against a plain double
 * precision reference written here from DESIGN.md (full centred matrices,
 * row and column means taken separately), its known values (1 for a
 * similarity transform of X, 0 for a constant), its gradient against
 * central finite differences, and its independence of the thread count.
 */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/common.h"
#include "kernels/dcor.h"
#include "test_util.h"

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    assert_non_null(p);
    return p;
}

/* Distance matrix of v [n,w], double centred with separate row and column
 * means, into C [n,n]. */
static void ref_centred(const float *v, int n, int w, double *C) {
    double *d = xcalloc((size_t)n * n, sizeof *d), *row = xcalloc(n, sizeof *row),
           *col = xcalloc(n, sizeof *col), all = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k < w; k++) {
                double t = (double)v[i * w + k] - (double)v[j * w + k];
                s += t * t;
            }
            d[i * n + j] = sqrt(s);
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            row[i] += d[i * n + j] / n;
            col[j] += d[i * n + j] / n;
            all += d[i * n + j] / ((double)n * n);
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) C[i * n + j] = d[i * n + j] - row[i] - col[j] + all;
    free(d), free(row), free(col);
}

static double ref_dcor(const float *X, const float *Z, int n, int p, int q) {
    double *A = xcalloc((size_t)n * n, sizeof *A), *B = xcalloc((size_t)n * n, sizeof *B);
    ref_centred(X, n, p, A);
    ref_centred(Z, n, q, B);
    double xz = 0, xx = 0, zz = 0;
    for (size_t i = 0; i < (size_t)n * n; i++) {
        xz += A[i] * B[i];
        xx += A[i] * A[i];
        zz += B[i] * B[i];
    }
    free(A), free(B);
    if (xx <= 0 || zz <= 0) return 0;
    double r = xz / sqrt(xx * zz);
    return r > 0 ? sqrt(r) : 0;
}

static double dcor_of(const float *X, const float *Z, int n, int p, int q) {
    double *scratch = xcalloc(kernels_dcor_scratch_doubles(n), sizeof *scratch);
    double v = kernels_dcor(NULL, X, Z, n, p, q, 1.0f, scratch);
    free(scratch);
    return v;
}

static void test_matches_reference(void **state) {
    (void)state;
    const int dims[][3] = {{2, 1, 1}, {3, 4, 2}, {10, 3, 7}, {64, 16, 8}, {97, 5, 33}};
    for (size_t t = 0; t < sizeof dims / sizeof dims[0]; t++) {
        int n = dims[t][0], p = dims[t][1], q = dims[t][2];
        float *X = random_vec((size_t)n * p, 10 + t), *Z = random_vec((size_t)n * q, 20 + t);
        /* Partly dependent: Z borrows X's first column. */
        for (int i = 0; i < n; i++) Z[i * q] += 2.0f * X[i * p];
        double got = dcor_of(X, Z, n, p, q), want = ref_dcor(X, Z, n, p, q);
        if (!(fabs(got - want) <= 1e-10))
            fail_msg("n=%d p=%d q=%d: dcor %.15g, reference %.15g", n, p, q, got, want);
        assert_true(got > 0 && got <= 1 + 1e-12);
        free(X), free(Z);
    }
}

static void test_known_values(void **state) {
    (void)state;
    int n = 40, p = 6;
    float *X = random_vec((size_t)n * p, 3), *Y = xcalloc((size_t)n * p, sizeof *Y);
    /* Distances scale with X, so a scaled and shifted copy has dCor 1. */
    for (int i = 0; i < n * p; i++) Y[i] = 3.0f * X[i] + 1.0f;
    assert_true(fabs(dcor_of(X, Y, n, p, p) - 1.0) < 1e-6);
    assert_true(fabs(dcor_of(X, X, n, p, p) - 1.0) < 1e-12);
    for (int i = 0; i < n * p; i++) Y[i] = 2.5f;
    assert_true(dcor_of(X, Y, n, p, p) == 0.0);
    /* Fewer than two rows: nothing to correlate. */
    assert_true(dcor_of(X, X, 1, p, p) == 0.0);
    /* No gradient is added where dCor is 0. */
    float *g = xcalloc((size_t)n * p, sizeof *g);
    double *scratch = xcalloc(kernels_dcor_scratch_doubles(n), sizeof *scratch);
    assert_true(kernels_dcor(g, X, Y, n, p, p, 1.0f, scratch) == 0.0);
    for (int i = 0; i < n * p; i++) assert_true(g[i] == 0.0f);
    free(X), free(Y), free(g), free(scratch);
}

/* alpha * d dCor / dZ against central differences; the gradient adds. */
static void test_gradient_finite_differences(void **state) {
    (void)state;
    int n = 12, p = 5, q = 3;
    float *X = random_vec((size_t)n * p, 41), *Z = random_vec((size_t)n * q, 42);
    for (int i = 0; i < n; i++) Z[i * q + 1] += X[i * p + 2];
    float *g = xcalloc((size_t)n * q, sizeof *g);
    double *scratch = xcalloc(kernels_dcor_scratch_doubles(n), sizeof *scratch);
    const float alpha = 0.75f;
    for (int i = 0; i < n * q; i++) g[i] = 1.0f;
    kernels_dcor(g, X, Z, n, p, q, alpha, scratch);
    for (int i = 0; i < n * q; i++) {
        float z0 = Z[i];
        Z[i] = z0 + 1e-2f;
        double up = dcor_of(X, Z, n, p, q), hu = (double)Z[i] - z0;
        Z[i] = z0 - 1e-2f;
        double dn = dcor_of(X, Z, n, p, q), hd = (double)z0 - Z[i];
        Z[i] = z0;
        double fd = alpha * (up - dn) / (hu + hd);
        double an = (double)g[i] - 1.0;
        if (!(fabs(an - fd) <= 1e-3 * fabs(fd) + 1e-5))
            fail_msg("dZ[%d]: analytic %.9g, finite difference %.9g", i, an, fd);
    }
    free(X), free(Z), free(g), free(scratch);
}

static void test_thread_count_invariant(void **state) {
    (void)state;
    int n = 300, p = 20, q = 10;
    float *X = random_vec((size_t)n * p, 7), *Z = random_vec((size_t)n * q, 8);
    float *g1 = xcalloc((size_t)n * q, sizeof *g1), *g2 = xcalloc((size_t)n * q, sizeof *g2);
    double *scratch = xcalloc(kernels_dcor_scratch_doubles(n), sizeof *scratch);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    double v1 = kernels_dcor(g1, X, Z, n, p, q, 1.0f, scratch);
    omp_set_num_threads(threads > 1 ? threads : 2);
    double v2 = kernels_dcor(g2, X, Z, n, p, q, 1.0f, scratch);
    omp_set_num_threads(threads);
    assert_true(v1 == v2);
    assert_memory_equal(g1, g2, (size_t)n * q * sizeof *g1);
    free(X), free(Z), free(g1), free(g2), free(scratch);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_known_values),
        cmocka_unit_test(test_gradient_finite_differences),
        cmocka_unit_test(test_thread_count_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
