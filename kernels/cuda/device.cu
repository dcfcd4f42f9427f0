/* CUDA device discovery and selection. */
#include <dlfcn.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_util.h"
#include "kernels/kernels.h"

/* Whether an NVIDIA driver is installed at all. The runtime reports a
 * missing libcuda.so.1 as cudaErrorInsufficientDriver, the same error a
 * driver too old for the runtime gives, so only the library itself tells
 * "no GPU here" from "a GPU we cannot use". The runtime has already tried
 * to load it, so RTLD_NOLOAD finds it when it is there; the plain dlopen
 * covers a runtime that unloaded it after failing. */
static bool driver_installed(void) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (h == NULL) h = dlopen("libcuda.so.1", RTLD_LAZY);
    if (h == NULL) return false;
    dlclose(h);
    return true;
}

extern "C" int kernels_cuda_probe(int *count, char *why, size_t why_len) {
    /* snprintf with a size of 0 writes nothing, so a NULL why is safe. */
    if (why == NULL) why_len = 0;
    if (count != NULL) *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess) {
        if (n <= 0) {
            snprintf(why, why_len, "the CUDA runtime reports no devices");
            return KERNELS_CUDA_ABSENT;
        }
        if (count != NULL) *count = n;
        snprintf(why, why_len, "%d CUDA device(s)", n);
        return KERNELS_CUDA_OK;
    }
    /* Clear the error so later calls are not confused by it. */
    (void)cudaGetLastError();
    if (e == cudaErrorNoDevice) {
        snprintf(why, why_len, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        return KERNELS_CUDA_ABSENT;
    }
    if (!driver_installed()) {
        snprintf(why, why_len, "no NVIDIA driver, libcuda.so.1 does not load (%s: %s)",
                 cudaGetErrorName(e), cudaGetErrorString(e));
        return KERNELS_CUDA_ABSENT;
    }
    /* The versions are what an operator needs for the commonest case, a
     * driver older than the runtime. */
    int rt = 0, drv = 0;
    (void)cudaRuntimeGetVersion(&rt);
    (void)cudaDriverGetVersion(&drv);
    (void)cudaGetLastError();
    if (drv > 0)
        snprintf(why, why_len, "%s: %s; the driver supports CUDA %d.%d, the runtime is %d.%d",
                 cudaGetErrorName(e), cudaGetErrorString(e), drv / 1000, drv % 1000 / 10, rt / 1000,
                 rt % 1000 / 10);
    else
        snprintf(why, why_len, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    return KERNELS_CUDA_BROKEN;
}

extern "C" int kernels_cuda_device_count(void) {
    int n = 0;
    return kernels_cuda_probe(&n, NULL, 0) == KERNELS_CUDA_OK ? n : 0;
}

extern "C" void kernels_cuda_describe(char *out, size_t out_len) {
    if (out == NULL || out_len == 0) return;
    int n = 0;
    if (kernels_cuda_probe(&n, out, out_len) != KERNELS_CUDA_OK) return;
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(out, out_len, "device 0: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        return;
    }
    int rt = 0, drv = 0;
    (void)cudaRuntimeGetVersion(&rt);
    (void)cudaDriverGetVersion(&drv);
    snprintf(out, out_len,
             "%s, compute %d.%d, %.1f GiB, %d SMs, %d device(s), runtime %d, driver %d", prop.name,
             prop.major, prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
             prop.multiProcessorCount, n, rt, drv);
}

extern "C" int kernels_cuda_set_device(int ordinal, vl_error *err) {
    int n = kernels_cuda_device_count();
    if (ordinal < 0 || ordinal >= n)
        return vl_fail(err, VL_EINVAL, "CUDA device %d does not exist (%d visible)", ordinal, n);
    cudaError_t e = cudaSetDevice(ordinal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(err, e, "cudaSetDevice");
    }
    return 0;
}

extern "C" int kernels_cuda_get_device(int *ordinal, vl_error *err) {
    if (ordinal == NULL) return vl_fail(err, VL_EINVAL, "CUDA device: no output pointer");
    cudaError_t e = cudaGetDevice(ordinal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(err, e, "cudaGetDevice");
    }
    return 0;
}
