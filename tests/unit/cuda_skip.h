/* For the GPU test programs: on a machine without a GPU, one line says why
 * and the program exits with ctest's skip code before any test runs, so it
 * is never counted as passed there. A GPU that is present but unusable (a
 * driver too old for the runtime, say) is a failure, not a skip: otherwise
 * a broken GPU machine would pass every GPU test by skipping it. */
#ifndef VOLLEY_TESTS_CUDA_SKIP_H
#define VOLLEY_TESTS_CUDA_SKIP_H

#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"

/* ctest's SKIP_RETURN_CODE for these programs. */
#define TEST_CUDA_SKIPPED 77

/* Returns when a device is usable (after naming it); exits 77 when there is
 * no GPU, 1 when CUDA is present but unusable. */
static inline void test_cuda_require_device(void) {
    char why[256];
    int n = 0;
    int st = kernels_cuda_probe(&n, why, sizeof why);
    if (st == KERNELS_CUDA_ABSENT) {
        printf("SKIPPED: no CUDA device (%s)\n", why);
        exit(TEST_CUDA_SKIPPED);
    }
    if (st != KERNELS_CUDA_OK) {
        printf("FAILED: CUDA is present but unusable (%s)\n", why);
        exit(1);
    }
    kernels_cuda_describe(why, sizeof why);
    printf("CUDA device: %s\n", why);
}

#endif
