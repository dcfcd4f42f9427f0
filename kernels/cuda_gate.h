/* For programs that need a GPU (the GPU test programs and benchmarks): on a
 * machine without a GPU, one line says why and the program exits with
 * ctest's skip code, so it is never counted as passed there. A GPU that is
 * present but unusable (a driver too old for the runtime, say) is a
 * failure, not a skip: otherwise a broken GPU machine would pass every GPU
 * check by skipping it. Header-only, for programs, since it exits. */
#ifndef VOLLEY_KERNELS_CUDA_GATE_H
#define VOLLEY_KERNELS_CUDA_GATE_H

#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"

/* ctest's SKIP_RETURN_CODE for programs that need a GPU. */
#define KERNELS_CUDA_SKIPPED 77

/* Returns when a device is usable, with desc (desc_len bytes) naming it;
 * prints one line (prefixed with prog and ": " when prog is not NULL) and
 * exits 77 when there is no GPU, 1 when CUDA is present but unusable. */
static inline void kernels_cuda_gate(const char *prog, char *desc, size_t desc_len) {
    const char *sep = prog ? ": " : "";
    prog = prog ? prog : "";
    int st = kernels_cuda_probe(NULL, desc, desc_len);
    if (st == KERNELS_CUDA_ABSENT) {
        printf("%s%sSKIPPED: no CUDA device (%s)\n", prog, sep, desc);
        exit(KERNELS_CUDA_SKIPPED);
    }
    if (st != KERNELS_CUDA_OK) {
        printf("%s%sFAILED: CUDA is present but unusable (%s)\n", prog, sep, desc);
        exit(1);
    }
    kernels_cuda_describe(desc, desc_len);
}

#endif
