/* Parallel GEMM over single-threaded OpenBLAS calls. */
#include <cblas.h>
#include <omp.h>

#include "kernels/cpu/gemm.h"
#include "kernels/kernels.h"

/* Below this many multiply-adds one thread is faster than splitting. */
#define GEMM_PAR_MIN (1L << 18)
/* Blocks are multiples of this many rows/columns (OpenBLAS micro-tiles). */
#define GEMM_ALIGN 16

void kv_blas_single(void) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

void kernels_set_num_threads(int n) {
    omp_set_num_threads(n > 0 ? n : 1);
    kv_blas_single();
}

static void sgemm1(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void kv_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    kv_blas_single();
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    long work = (long)M * N * K;
    if (threads <= 1 || work < GEMM_PAR_MIN) {
        sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int split_rows = M >= N;
    int len = split_rows ? M : N;
    int chunk = (len + threads - 1) / threads;
    chunk = (chunk + GEMM_ALIGN - 1) / GEMM_ALIGN * GEMM_ALIGN;
    int parts = (len + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(parts)
    for (int p = 0; p < parts; p++) {
        int lo = p * chunk, n = len - lo < chunk ? len - lo : chunk;
        if (split_rows) {
            /* Rows lo.. of C come from rows lo.. of op(A). */
            const float *a = ta ? A + lo : A + (long)lo * lda;
            sgemm1(ta, tb, n, N, K, alpha, a, lda, B, ldb, beta, C + (long)lo * ldc, ldc);
        } else {
            /* Columns lo.. of C come from columns lo.. of op(B). */
            const float *b = tb ? B + (long)lo * ldb : B + lo;
            sgemm1(ta, tb, M, n, K, alpha, A, lda, b, ldb, beta, C + lo, ldc);
        }
    }
}
