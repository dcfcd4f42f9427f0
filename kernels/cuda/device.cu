/* CUDA device discovery and selection. */
#include <stdio.h>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_util.h"
#include "kernels/kernels.h"

extern "C" int kernels_cuda_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* Clear the sticky error so later calls are not confused by it. */
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" void kernels_cuda_describe(char *out, size_t out_len)
{
    if (out == NULL || out_len == 0)
        return;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(out, out_len, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        return;
    }
    if (n == 0) {
        snprintf(out, out_len, "the CUDA runtime reports no devices");
        return;
    }
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(out, out_len, "device 0: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        return;
    }
    int rt = 0, drv = 0;
    (void)cudaRuntimeGetVersion(&rt);
    (void)cudaDriverGetVersion(&drv);
    snprintf(out, out_len, "%s, compute %d.%d, %.1f GiB, %d SMs, %d device(s), runtime %d, driver %d",
             prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), prop.multiProcessorCount,
             n, rt, drv);
}

extern "C" int kernels_cuda_set_device(int ordinal, vl_error *err)
{
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

extern "C" int kernels_cuda_get_device(int *ordinal, vl_error *err)
{
    if (ordinal == NULL)
        return vl_fail(err, VL_EINVAL, "CUDA device: no output pointer");
    cudaError_t e = cudaGetDevice(ordinal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(err, e, "cudaGetDevice");
    }
    return 0;
}
