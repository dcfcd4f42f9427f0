/* Distance correlation and its gradient (kernels/dcor.h). Every sum runs
 * in one fixed order, row by row with j ascending, and rows are what the
 * threads split, so the result is the same for any thread count; the CUDA
 * kernel keeps the same order. */
#include <math.h>
#include <stddef.h>

#include "kernels/dcor.h"
#include "kernels/dcor_elem.h"

size_t kernels_dcor_scratch_doubles(int n) {
    size_t m = n > 0 ? (size_t)n : 0;
    return 2 * m * m + 5 * m;
}

/* d[i,j] = |v_i - v_j| over the n rows of v [n,w], and r[i] its row means. */
static void distances(double *d, double *r, const float *v, int n, int w) {
#pragma omp parallel for schedule(static) if ((long)n * n * w > 100000)
    for (int i = 0; i < n; i++) {
        const float *vi = v + (size_t)i * w;
        double *di = d + (size_t)i * n;
        double rs = 0.0;
        for (int j = 0; j < n; j++) {
            const float *vj = v + (size_t)j * w;
            double s = 0.0;
            for (int k = 0; k < w; k++) {
                double t = (double)vi[k] - (double)vj[k];
                s += t * t;
            }
            di[j] = sqrt(s);
            rs += di[j];
        }
        r[i] = rs / (double)n;
    }
}

static double grand_mean(const double *r, int n) {
    double g = 0.0;
    for (int i = 0; i < n; i++) g += r[i];
    return g / (double)n;
}

double kernels_dcor(float *dZ, const float *X, const float *Z, int n, int p, int q, float alpha,
                    double *scratch) {
    if (n < 2 || n > KERNELS_DCOR_MAX_N || p < 1 || q < 1) return 0.0;
    size_t nn = (size_t)n * n;
    double *a = scratch, *b = a + nn, *ra = b + nn, *rb = ra + n, *pxz = rb + n, *pxx = pxz + n,
           *pzz = pxx + n;
    distances(a, ra, X, n, p);
    distances(b, rb, Z, n, q);
    double ga = grand_mean(ra, n), gb = grand_mean(rb, n);
#pragma omp parallel for schedule(static) if ((long)n * n > 100000)
    for (int i = 0; i < n; i++) {
        double sxz = 0.0, sxx = 0.0, szz = 0.0;
        for (int j = 0; j < n; j++) {
            double A = dcor_centred(a[(size_t)i * n + j], ra[i], ra[j], ga);
            double B = dcor_centred(b[(size_t)i * n + j], rb[i], rb[j], gb);
            sxz += A * B;
            sxx += A * A;
            szz += B * B;
        }
        pxz[i] = sxz;
        pxx[i] = sxx;
        pzz[i] = szz;
    }
    double sxz = 0.0, sxx = 0.0, szz = 0.0;
    for (int i = 0; i < n; i++) {
        sxz += pxz[i];
        sxx += pxx[i];
        szz += pzz[i];
    }
    double c1, c2;
    double dc = dcor_coeffs(sxz, sxx, szz, n, (double)alpha, &c1, &c2);
    if (dZ == NULL || (c1 == 0.0 && c2 == 0.0)) return dc;
        /* The weights replace the distances of X, which are not needed again. */
#pragma omp parallel for schedule(static) if ((long)n * n > 100000)
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            size_t ij = (size_t)i * n + j;
            double A = dcor_centred(a[ij], ra[i], ra[j], ga);
            double B = dcor_centred(b[ij], rb[i], rb[j], gb);
            a[ij] = dcor_weight(A, B, b[ij], c1, c2);
        }
#pragma omp parallel for schedule(static) if ((long)n * n * q > 100000)
    for (int i = 0; i < n; i++) {
        const double *w = a + (size_t)i * n;
        const float *zi = Z + (size_t)i * q;
        for (int k = 0; k < q; k++) {
            double g = 0.0;
            for (int j = 0; j < n; j++) g += w[j] * ((double)zi[k] - (double)Z[(size_t)j * q + k]);
            dZ[(size_t)i * q + k] += (float)g;
        }
    }
    return dc;
}
