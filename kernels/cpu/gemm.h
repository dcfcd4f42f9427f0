/*
 * Private: matrix products for the CPU kernels. OpenBLAS runs
 * single-threaded and the kernels split each product across their own
 * OpenMP team, so only one pool of threads ever competes for the cores (an
 * OpenBLAS pool spinning next to an OpenMP team on the same cores costs
 * more than the second core gives).
 */
#ifndef VOLLEY_KERNELS_CPU_GEMM_H
#define VOLLEY_KERNELS_CPU_GEMM_H

/* Makes OpenBLAS single-threaded if it is not already. Call outside
 * parallel regions. */
void kv_blas_single(void);

/* C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major, op = transpose when
 * ta/tb is set. Large products are split into one block of rows (or of
 * columns, when C is wide) per OpenMP thread; each element is still
 * computed by one sgemm, so no sums are reordered across threads. */
void kv_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

#endif
