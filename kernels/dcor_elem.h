/* The per-element arithmetic of the distance correlation, shared by the
 * CPU kernel (kernels/cpu/dcor.c) and the CUDA one (kernels/cuda/dcor.cu)
 * so that both compute every entry with the same operations in the same
 * order. Private to kernels/. */
#ifndef VOLLEY_KERNELS_DCOR_ELEM_H
#define VOLLEY_KERNELS_DCOR_ELEM_H

#include <math.h>

#ifdef __CUDACC__
#define DCOR_HD __host__ __device__ __forceinline__
#else
#define DCOR_HD static inline
#endif

/* The double-centred distance A_ij = a_ij - mean of row i - mean of row j
 * + grand mean (a is symmetric, so row and column means agree). */
DCOR_HD double dcor_centred(double a_ij, double r_i, double r_j, double g) {
    return ((a_ij - r_i) - r_j) + g;
}

/* Weight of (z_i - z_j) in the gradient: (c1 A_ij + c2 B_ij) / b_ij, or 0
 * where z_i = z_j (b_ij = 0, the diagonal included), whose difference is 0
 * anyway. */
DCOR_HD double dcor_weight(double A, double B, double b, double c1, double c2) {
    return b > 0 ? (c1 * A + c2 * B) / b : 0.0;
}

/* From the sums of A_ij B_ij, A_ij^2 and B_ij^2 over all pairs: returns
 * dCor = sqrt(V_XZ / sqrt(V_X V_Z)) (0 when either variance is 0) and the
 * coefficients of the gradient of alpha * dCor with respect to z_i,
 * alpha/(2 dCor) * (dV_XZ/sqrt(V_X V_Z) - dCor^2/(2 V_Z) dV_Z), with
 * dV_XZ = (2/n^2) sum_j A_ij (z_i - z_j)/b_ij and
 * dV_Z = (4/n^2) sum_j B_ij (z_i - z_j)/b_ij: the gradient is
 * sum_j dcor_weight(A_ij, B_ij, b_ij, c1, c2) (z_i - z_j). *c1 = *c2 = 0
 * when dCor is 0, where it has no gradient. */
static inline double dcor_coeffs(double sxz, double sxx, double szz, int n, double alpha,
                                 double *c1, double *c2) {
    double nn = (double)n * (double)n;
    double vxz = sxz / nn, vx = sxx / nn, vz = szz / nn;
    *c1 = 0.0;
    *c2 = 0.0;
    if (!(vx > 0) || !(vz > 0)) return 0.0;
    double den = sqrt(vx * vz);
    double r = vxz / den;
    if (!(r > 0)) return 0.0;
    double dc = sqrt(r);
    double s = alpha / (2.0 * dc);
    *c1 = s * 2.0 / (nn * den);
    *c2 = -s * 0.5 * r / vz * 4.0 / nn;
    return dc;
}

#endif
