/*
 * dcor: the distance correlation of DESIGN.md's NoPeek, which a split
 * learning peer adds, scaled by alpha, to the loss at its cut layer so
 * that the activations Z it sends reveal less of its inputs X. Plain
 * Euclidean distances a_ij = |x_i - x_j|, b_ij = |z_i - z_j|, double
 * centring, V_XZ = (1/n^2) sum A_ij B_ij, dCor^2 = V_XZ / sqrt(V_X V_Z),
 * all accumulated in double in a fixed order (so results do not depend on
 * the thread count, and the CUDA version in kernels/cuda_compress.h
 * follows the same order). Like the other kernels it does not allocate:
 * the caller passes scratch memory.
 */
#ifndef VOLLEY_KERNELS_DCOR_H
#define VOLLEY_KERNELS_DCOR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest batch the dcor kernels take: the scratch grows as n^2. */
#define KERNELS_DCOR_MAX_N 16384

/* Doubles of scratch kernels_dcor needs for n rows: 2 n^2 + 5 n. */
size_t kernels_dcor_scratch_doubles(int n);

/* Returns dCor(X, Z) in [0, 1] for X [n,p] and Z [n,q] (rows are the
 * samples; 2 <= n <= KERNELS_DCOR_MAX_N, p, q >= 1), 0 when X or Z has no
 * spread, or for fewer than two rows. When dZ is non-NULL it ADDS
 * alpha * d dCor / dZ into dZ[n,q], as backward kernels do (nothing where
 * dCor is 0, which has no gradient). scratch: caller-owned,
 * kernels_dcor_scratch_doubles(n) doubles, clobbered. */
double kernels_dcor(float *dZ, const float *X, const float *Z, int n, int p, int q, float alpha,
                    double *scratch);

#ifdef __cplusplus
}
#endif

#endif
