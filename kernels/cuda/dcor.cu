/* Distance correlation on the GPU (kernels/dcor.h), summing in double in
 * the order kernels/cpu/dcor.c uses: one thread per distance, per row sum
 * or gradient entry, each looping over j (or the features) in ascending
 * order, and the few sums over rows done on the host in row order, so
 * every entry follows the CPU's operations (the per-element arithmetic is
 * kernels/dcor_elem.h, shared with it). Simple rather than fast: the batch
 * is at most a few thousand rows. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/cuda/compress_util.cuh"
#include "kernels/dcor.h"
#include "kernels/dcor_elem.h"

#define DC_THREADS 128

/* d[i,j] = |v_i - v_j| for v [n,w]; row i is blockIdx.y. */
__global__ static void dist_kernel(const float *v, int n, int w, double *d) {
    int i = blockIdx.y;
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || j >= n) return;
    const float *vi = v + (size_t)i * w, *vj = v + (size_t)j * w;
    double s = 0.0;
    for (int k = 0; k < w; k++) {
        double t = (double)vi[k] - (double)vj[k];
        s += t * t;
    }
    d[(size_t)i * n + j] = sqrt(s);
}

/* r[i] = mean of row i of d [n,n]. */
__global__ static void row_mean_kernel(const double *d, int n, double *r) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const double *di = d + (size_t)i * n;
    double s = 0.0;
    for (int j = 0; j < n; j++) s += di[j];
    r[i] = s / (double)n;
}

/* Per row: the sums over j of A B, A^2 and B^2. */
__global__ static void vsum_kernel(const double *a, const double *b, const double *ra,
                                   const double *rb, double ga, double gb, int n, double *pxz,
                                   double *pxx, double *pzz) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
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

/* a[i,j] becomes the gradient weight of the pair; row i is blockIdx.y. */
__global__ static void weight_kernel(double *a, const double *b, const double *ra, const double *rb,
                                     double ga, double gb, int n, double c1, double c2) {
    int i = blockIdx.y;
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || j >= n) return;
    size_t ij = (size_t)i * n + j;
    double A = dcor_centred(a[ij], ra[i], ra[j], ga);
    double B = dcor_centred(b[ij], rb[i], rb[j], gb);
    a[ij] = dcor_weight(A, B, b[ij], c1, c2);
}

/* dZ[i,k] += sum_j w[i,j] (z_ik - z_jk); row i is blockIdx.y. */
__global__ static void grad_kernel(const double *w, const float *z, int n, int q, float *dz) {
    int i = blockIdx.y;
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || k >= q) return;
    const double *wi = w + (size_t)i * n;
    double zi = (double)z[(size_t)i * q + k];
    double g = 0.0;
    for (int j = 0; j < n; j++) g += wi[j] * (zi - (double)z[(size_t)j * q + k]);
    dz[(size_t)i * q + k] += (float)g;
}

/* Sum of n doubles in index order, on the host. */
static double host_sum(const double *v, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += v[i];
    return s;
}

static int check_dims(int n, int p, int q, vl_error *err) {
    if (n < 2 || n > KERNELS_DCOR_MAX_N || p < 1 || q < 1)
        return vl_fail(err, VL_EINVAL, "dcor: n = %d (2..%d), p = %d, q = %d (>= 1)", n,
                       KERNELS_DCOR_MAX_N, p, q);
    return 0;
}

extern "C" int kernels_cuda_dcor(float *d_dZ, const float *d_X, const float *d_Z, int n, int p,
                                 int q, float alpha, double *d_scratch, double *dcor,
                                 vl_error *err) {
    int rc = check_dims(n, p, q, err);
    if (rc) return rc;
    if (!d_X || !d_Z || !d_scratch || !dcor) return vl_fail(err, VL_EINVAL, "dcor: null argument");
    size_t nn = (size_t)n * n;
    double *a = d_scratch, *b = a + nn, *ra = b + nn, *rb = ra + n, *pxz = rb + n, *pxx = pxz + n,
           *pzz = pxx + n;
    dim3 pairs((unsigned)((n + DC_THREADS - 1) / DC_THREADS), (unsigned)n);
    unsigned rows = (unsigned)((n + DC_THREADS - 1) / DC_THREADS);
    dist_kernel<<<pairs, DC_THREADS>>>(d_X, n, p, a);
    dist_kernel<<<pairs, DC_THREADS>>>(d_Z, n, q, b);
    row_mean_kernel<<<rows, DC_THREADS>>>(a, n, ra);
    row_mean_kernel<<<rows, DC_THREADS>>>(b, n, rb);
    if ((rc = cc_launched(err, "dcor distance launch")) != 0) return rc;
    /* Row means, then the three row partials: 5n doubles on the host. */
    double *h = (double *)malloc(5 * (size_t)n * sizeof(double));
    if (!h) return vl_fail(err, VL_ENOMEM, "dcor: no host memory for %d rows", n);
    double *hra = h, *hrb = h + n, *hp = h + 2 * (size_t)n;
    double ga = 0, gb = 0, c1 = 0, c2 = 0, dc = 0;
    rc = cc_copy(h, ra, 2 * (size_t)n * sizeof(double), cudaMemcpyDeviceToHost, err);
    if (rc == 0) {
        ga = host_sum(hra, n) / (double)n;
        gb = host_sum(hrb, n) / (double)n;
        vsum_kernel<<<rows, DC_THREADS>>>(a, b, ra, rb, ga, gb, n, pxz, pxx, pzz);
        rc = cc_launched(err, "dcor sums launch");
    }
    if (rc == 0) rc = cc_copy(hp, pxz, 3 * (size_t)n * sizeof(double), cudaMemcpyDeviceToHost, err);
    if (rc == 0)
        dc = dcor_coeffs(host_sum(hp, n), host_sum(hp + n, n), host_sum(hp + 2 * (size_t)n, n), n,
                         (double)alpha, &c1, &c2);
    free(h);
    if (rc) return rc;
    if (d_dZ != NULL && (c1 != 0.0 || c2 != 0.0)) {
        weight_kernel<<<pairs, DC_THREADS>>>(a, b, ra, rb, ga, gb, n, c1, c2);
        dim3 grads((unsigned)((q + DC_THREADS - 1) / DC_THREADS), (unsigned)n);
        grad_kernel<<<grads, DC_THREADS>>>(a, d_Z, n, q, d_dZ);
        if ((rc = cc_launched(err, "dcor gradient launch")) != 0 ||
            (rc = cc_sync(err, "dcor gradient")) != 0)
            return rc;
    }
    *dcor = dc;
    return 0;
}

extern "C" int kernels_cuda_dcor_host(float *dZ, const float *X, const float *Z, int n, int p,
                                      int q, float alpha, double *dcor, vl_error *err) {
    int rc = check_dims(n, p, q, err);
    if (rc) return rc;
    if (!X || !Z || !dcor) return vl_fail(err, VL_EINVAL, "dcor: null argument");
    size_t nz = (size_t)n * q;
    cc_dev dx, dz, dg, ds;
    if ((rc = cc_upload(dx, X, (size_t)n * p, err)) != 0 || (rc = cc_upload(dz, Z, nz, err)) != 0 ||
        (dZ && (rc = cc_upload(dg, dZ, nz, err)) != 0) ||
        (rc = cc_upload<double>(ds, nullptr, kernels_dcor_scratch_doubles(n), err)) != 0 ||
        (rc = kernels_cuda_dcor(dZ ? dg.as<float>() : nullptr, dx.as<float>(), dz.as<float>(), n, p,
                                q, alpha, ds.as<double>(), dcor, err)) != 0)
        return rc;
    return dZ ? cc_copy(dZ, dg.p, nz * sizeof(float), cudaMemcpyDeviceToHost, err) : 0;
}
