/* For the GPU test programs: kernels/cuda_gate.h's rule (skip without a GPU,
 * fail on one CUDA cannot use) before any test runs. */
#ifndef VOLLEY_TESTS_CUDA_SKIP_H
#define VOLLEY_TESTS_CUDA_SKIP_H

#include "kernels/cuda_gate.h"

/* ctest's SKIP_RETURN_CODE for these programs. */
#define TEST_CUDA_SKIPPED KERNELS_CUDA_SKIPPED

/* Returns when a device is usable (after naming it); exits otherwise. */
static inline void test_cuda_require_device(void) {
    char desc[256];
    kernels_cuda_gate(NULL, desc, sizeof desc);
    printf("CUDA device: %s\n", desc);
}

#endif
