/* For the GPU test programs: without a usable CUDA device, one line says
 * why and the program exits with ctest's skip code before any test runs,
 * so a machine without a GPU never counts them as passed. */
#ifndef VOLLEY_TESTS_CUDA_SKIP_H
#define VOLLEY_TESTS_CUDA_SKIP_H

#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"

/* ctest's SKIP_RETURN_CODE for these programs. */
#define TEST_CUDA_SKIPPED 77

/* Returns when a device is usable (after naming it); exits otherwise. */
static inline void test_cuda_require_device(void) {
    char desc[256];
    kernels_cuda_describe(desc, sizeof desc);
    if (kernels_cuda_device_count() == 0) {
        printf("SKIPPED: no CUDA device (%s)\n", desc);
        exit(TEST_CUDA_SKIPPED);
    }
    printf("CUDA device: %s\n", desc);
}

#endif
