/* Private helpers shared by the CUDA sources. */
#ifndef VOLLEY_KERNELS_CUDA_UTIL_H
#define VOLLEY_KERNELS_CUDA_UTIL_H

#include <cuda_runtime.h>

#include "kernels/kernels.h"

/* Turns a failed CUDA call into VL_ERR (VL_ENOMEM for allocation failures)
 * with the call site and the runtime's message. */
static inline int cuda_fail(vl_error *err, cudaError_t e, const char *what) {
    int code = e == cudaErrorMemoryAllocation ? VL_ENOMEM : VL_ERR;
    return vl_fail(err, code, "CUDA %s failed: %s (%s)", what, cudaGetErrorName(e),
                   cudaGetErrorString(e));
}

#endif
