/* Private helpers of the CUDA compressors (sketch.cu, select.cu, gaussk.cu,
 * sparse.cu, dcor.cu): launch shapes, scoped device memory, checked
 * copies, and the sign-cleared float key that selection ranks by. */
#ifndef VOLLEY_KERNELS_CUDA_COMPRESS_UTIL_CUH
#define VOLLEY_KERNELS_CUDA_COMPRESS_UTIL_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda_compress.h"
#include "kernels/cuda_model.h"

#define CC_THREADS 256
#define CC_MAX_BLOCKS 65535u

/* Blocks of CC_THREADS for a grid-stride loop over n items (at least 1). */
static inline unsigned cc_blocks(size_t n)
{
    size_t b = (n + CC_THREADS - 1) / CC_THREADS;
    if (b < 1)
        b = 1;
    return b > CC_MAX_BLOCKS ? CC_MAX_BLOCKS : (unsigned)b;
}

/* Device memory that is freed when it goes out of scope, so every early
 * return releases what the call allocated. It goes through
 * kernels_cuda_alloc, so the process's device-memory cap counts it, and
 * kernels_cuda_free waits for queued work before releasing it: kernels
 * launched on the buffer finish before it can be handed out again. */
struct cc_dev {
    void *p = nullptr;
    cc_dev() = default;
    cc_dev(const cc_dev &) = delete;
    cc_dev &operator=(const cc_dev &) = delete;
    ~cc_dev() { kernels_cuda_free(p); }
    /* Allocates bytes (at least 1); frees what it held before. */
    int alloc(size_t bytes, vl_error *err)
    {
        kernels_cuda_free(p);
        p = nullptr;
        return kernels_cuda_alloc(&p, bytes ? bytes : 1, err);
    }
    template <class T> T *as() const { return static_cast<T *>(p); }
};

/* The error of the launch just made, if any. */
static inline int cc_launched(vl_error *err, const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_fail(err, e, what);
}

/* Waits for the device; a kernel's failure surfaces here. */
static inline int cc_sync(vl_error *err, const char *what)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    return cuda_fail(err, e, what);
}

/* cudaMemcpy of n bytes (synchronous for host memory); 0 bytes is a no-op. */
static inline int cc_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                          vl_error *err)
{
    if (n == 0)
        return 0;
    cudaError_t e = cudaMemcpy(dst, src, n, kind);
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    return cuda_fail(err, e, kind == cudaMemcpyHostToDevice   ? "cudaMemcpy to device"
                             : kind == cudaMemcpyDeviceToHost ? "cudaMemcpy to host"
                                                              : "cudaMemcpy");
}

/* Allocates dev for n items of T and copies them from host (n may be 0). */
template <class T>
static inline int cc_upload(cc_dev &dev, const T *host, size_t n, vl_error *err)
{
    if (n > SIZE_MAX / sizeof(T))
        return vl_fail(err, VL_ETOOBIG, "%zu items are too many for device memory", n);
    int rc = dev.alloc(n * sizeof(T), err);
    if (rc == 0 && host)
        rc = cc_copy(dev.p, host, n * sizeof(T), cudaMemcpyHostToDevice, err);
    return rc;
}

/* For finite values, the unsigned order of the sign-cleared bits is the
 * order of |x| (compress/scan.h ranks by the same key). */
__device__ __forceinline__ uint32_t cc_key(float v)
{
    return __float_as_uint(v) & 0x7fffffffu;
}

/* ---- selection, shared by top-k, heavy hitters and Gaussian-k (select.cu) ---- */

/* Where a radix select for the k-th largest key ended: the key t, how many
 * keys lie above it and how many equal it, and how many of those equal
 * ones the top k takes (from the lowest positions). The counts are of the
 * whole input; vals/map/n are the array the select ended on, the input or
 * (when few enough) a copy of its keys >= some bound, with map giving
 * their indices in the input, in ascending order. */
struct cc_sel {
    uint32_t t = 0;
    size_t gt = 0, eq = 0, need = 0;
    const float *vals = nullptr;
    const uint32_t *map = nullptr;
    size_t n = 0;
    cc_dev cval, cmap;
};

/* Finds the k-th largest key of d_x[0, n) (1 <= k < n <= UINT32_MAX). */
int cc_select_find(const float *d_x, size_t n, size_t k, cc_sel *s, vl_error *err);

/* Writes in ascending order the input index of every key of s's array
 * above t and of those equal to t at positions <= cut (-1: none; INT64_MAX:
 * all). expect is the count this must give (checked). */
int cc_select_emit(const float *vals, const uint32_t *map, size_t n, uint32_t t, int64_t cut,
                   uint32_t *d_out, size_t expect, vl_error *err);

/* The position in s's array of the s->need-th key equal to s->t, or
 * INT64_MAX when the top k takes all of them. */
int cc_select_cut(const cc_sel *s, int64_t *cut, vl_error *err);

/* d_out[i] = i for i < n. */
int cc_iota(uint32_t *d_out, size_t n, vl_error *err);

#endif
