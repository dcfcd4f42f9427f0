/* Plain double references for the K-FAC tests (test_kfac.c,
 * test_kfac_gpt.c): the factors by loops, inverses by Gauss-Jordan,
 * matrix products, and a relative-error check. Include after <cmocka.h>. */
#ifndef VOLLEY_TEST_KFAC_REF_H
#define VOLLEY_TEST_KFAC_REF_H

#include <math.h>
#include <stdlib.h>

/* Largest |got - want| over the largest |want|, the relative error the
 * checks state their tolerances in. */
static inline double rel_err_f(const float *got, const double *want, size_t n) {
    double d = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)got[i] - want[i]));
        m = fmax(m, fabs(want[i]));
    }
    return m > 0.0 ? d / m : d;
}

#define assert_rel(got, want, n, tol)                                                            \
    do {                                                                                         \
        double r_ = rel_err_f((got), (want), (n));                                               \
        if (!(r_ <= (tol)))                                                                      \
            fail_msg("line %d: %s vs %s: relative error %.3g > %.3g", __LINE__, #got, #want, r_, \
                     (double)(tol));                                                             \
    } while (0)

/* ---- double references ----------------------------------------------------- */

/* A = (1/N) Σ x̄ x̄ᵀ with x̄ = [x, 1], G = N Σ dy dyᵀ, by plain loops. */
static inline void ref_factors(const float *X, const float *dY, int N, int in, int out, double *A,
                               double *G) {
    int da = in + 1;
    for (int r = 0; r < da; r++)
        for (int c = 0; c < da; c++) {
            double s = 0.0;
            for (int i = 0; i < N; i++) {
                double xr = r < in ? X[i * in + r] : 1.0, xc = c < in ? X[i * in + c] : 1.0;
                s += xr * xc;
            }
            A[r * da + c] = s / N;
        }
    for (int r = 0; r < out; r++)
        for (int c = 0; c < out; c++) {
            double s = 0.0;
            for (int i = 0; i < N; i++) s += (double)dY[i * out + r] * dY[i * out + c];
            G[r * out + c] = N * s;
        }
}

/* inv = a⁻¹ by Gauss-Jordan elimination with partial pivoting (a is
 * clobbered); fails the test on a singular matrix. */
static inline void gj_inverse(double *a, int n, double *inv) {
    for (int r = 0; r < n; r++)
        for (int c = 0; c < n; c++) inv[r * n + c] = r == c;
    for (int col = 0; col < n; col++) {
        int p = col;
        for (int r = col + 1; r < n; r++)
            if (fabs(a[r * n + col]) > fabs(a[p * n + col])) p = r;
        assert_true(fabs(a[p * n + col]) > 1e-300);
        for (int c = 0; c < n; c++) {
            double t = a[col * n + c];
            a[col * n + c] = a[p * n + c];
            a[p * n + c] = t;
            t = inv[col * n + c];
            inv[col * n + c] = inv[p * n + c];
            inv[p * n + c] = t;
        }
        double d = a[col * n + col];
        for (int c = 0; c < n; c++) {
            a[col * n + c] /= d;
            inv[col * n + c] /= d;
        }
        for (int r = 0; r < n; r++) {
            if (r == col) continue;
            double f = a[r * n + col];
            for (int c = 0; c < n; c++) {
                a[r * n + c] -= f * a[col * n + c];
                inv[r * n + c] -= f * inv[col * n + c];
            }
        }
    }
}

/* out[n,p] = a[n,m] b[m,p]. */
static inline void matmul_d(const double *a, const double *b, int n, int m, int p, double *out) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < p; j++) {
            double s = 0.0;
            for (int k = 0; k < m; k++) s += a[i * m + k] * b[k * p + j];
            out[i * p + j] = s;
        }
}

static inline double *dalloc(size_t n) {
    double *d = calloc(n, sizeof *d);
    assert_non_null(d);
    return d;
}

#endif
