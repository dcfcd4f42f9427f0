/* Sparse vectors and peer-side error feedback on the GPU: gather, scatter
 * add, and compress/feedback.c's add and take, element by element with
 * the CPU's operations (no fused multiply-add), so the results are the
 * CPU's bit for bit. An index list is checked by a kernel of its own that
 * flags a bad list in device memory; the kernel that writes runs next on
 * the same stream and reads the flag first, so a bad list changes nothing,
 * and the host reads the flag once, at the end, in place of the wait it
 * owes its caller anyway. The writing kernels also test every index
 * against d, so no list can reach past the vector. */
#include <stdint.h>

#include <cuda_fp16.h>

#include "kernels/cuda/compress_util.cuh"

#define F16_MAX 65504.0f

/* *bad = epoch when an index is >= d or, with ascending set, not above the
 * one before it. The flag is never reset: each call checks for its own
 * epoch, which no earlier call wrote. */
__global__ static void check_idx_kernel(const uint32_t *idx, size_t nnz, size_t d, int ascending,
                                        unsigned long long *bad, unsigned long long epoch) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < nnz; j += stride) {
        uint32_t i = idx[j];
        if ((size_t)i >= d || (ascending && j > 0 && i <= idx[j - 1])) *bad = epoch;
    }
}

/* One checked sparse call: the lease, the flag and this call's epoch. */
struct idx_check {
    cc_lease ws;
    unsigned long long *flag = nullptr;
    unsigned long long epoch = 0;
};

/* Queues the check of the nnz indices (nothing waits for it). */
static int check_idx(idx_check *c, const uint32_t *d_idx, size_t nnz, size_t d, int ascending,
                     vl_error *err) {
    void *p = nullptr;
    int rc = c->ws.open(err);
    if (rc == 0) rc = c->ws.get(CC_WS_FLAG, sizeof(unsigned long long), &p, err);
    if (rc) return rc;
    c->flag = static_cast<unsigned long long *>(p);
    c->epoch = c->ws.next_epoch();
    check_idx_kernel<<<cc_blocks(nnz), CC_THREADS>>>(d_idx, nnz, d, ascending, c->flag, c->epoch);
    return cc_launched(err, "index check launch");
}

/* Waits for the device and reads the flag: 0, or VL_EINVAL naming what
 * when the indices were refused (and nothing was written). */
static int check_done(const idx_check *c, size_t d, int ascending, const char *what,
                      vl_error *err) {
    unsigned long long bad = 0;
    int rc = cc_readback(c->ws, &bad, c->flag, sizeof bad, err);
    if (rc) return rc;
    if (bad == c->epoch)
        return vl_fail(err, VL_EINVAL, "%s: indices must be below %zu%s", what, d,
                       ascending ? " and strictly ascending" : "");
    return 0;
}

/* rc, after waiting for the device, so that nothing a failed call queued
 * still runs once its lease is given back. */
static int cc_fail_sync(int rc, const char *what) {
    vl_error ignore;
    (void)cc_sync(&ignore, what);
    return rc;
}

/* True when this call's check refused the list; every thread of a
 * writing kernel asks before it writes. */
__device__ __forceinline__ bool refused(const unsigned long long *bad, unsigned long long epoch) {
    return *(volatile const unsigned long long *)bad == epoch;
}

/* ---- gather / scatter ------------------------------------------------------------ */

__global__ static void gather_kernel(const float *x, size_t d, const uint32_t *idx, size_t nnz,
                                     float *val, const unsigned long long *bad,
                                     unsigned long long epoch) {
    if (refused(bad, epoch)) return;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < nnz; j += stride) {
        uint32_t i = idx[j];
        if ((size_t)i < d) val[j] = x[i];
    }
}

extern "C" int kernels_cuda_sparse_gather(const float *d_x, size_t d, const uint32_t *d_idx,
                                          size_t nnz, float *d_val, vl_error *err) {
    if (nnz == 0) return 0;
    if (!d_x || !d_idx || !d_val)
        return vl_fail(err, VL_EINVAL, "sparse gather: null device pointer");
    idx_check c;
    int rc = check_idx(&c, d_idx, nnz, d, 0, err);
    if (rc == 0) {
        gather_kernel<<<cc_blocks(nnz), CC_THREADS>>>(d_x, d, d_idx, nnz, d_val, c.flag, c.epoch);
        rc = cc_launched(err, "sparse gather launch");
    }
    return rc ? cc_fail_sync(rc, "sparse gather") : check_done(&c, d, 0, "sparse gather", err);
}

extern "C" int kernels_cuda_sparse_gather_host(const float *x, size_t d, const uint32_t *idx,
                                               size_t nnz, float *val, vl_error *err) {
    if (nnz == 0) return 0;
    if (!x || !idx || !val) return vl_fail(err, VL_EINVAL, "sparse gather: null argument");
    cc_dev dx, di, dv;
    int rc;
    if ((rc = cc_upload(dx, x, d, err)) != 0 || (rc = cc_upload(di, idx, nnz, err)) != 0 ||
        (rc = cc_upload<float>(dv, nullptr, nnz, err)) != 0 ||
        (rc = kernels_cuda_sparse_gather(dx.as<float>(), d, di.as<uint32_t>(), nnz, dv.as<float>(),
                                         err)) != 0)
        return rc;
    return cc_copy(val, dv.p, nnz * sizeof(float), cudaMemcpyDeviceToHost, err);
}

__global__ static void scatter_add_kernel(float *dst, size_t d, const uint32_t *idx,
                                          const float *val, size_t nnz, float w,
                                          const unsigned long long *bad, unsigned long long epoch) {
    if (refused(bad, epoch)) return;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < nnz; j += stride) {
        uint32_t i = idx[j];
        if ((size_t)i < d) dst[i] += w * val[j];
    }
}

extern "C" int kernels_cuda_sparse_scatter_add(float *d_dst, size_t d, const uint32_t *d_idx,
                                               const float *d_val, size_t nnz, float w,
                                               vl_error *err) {
    if (nnz == 0) return 0;
    if (!d_dst || !d_idx || !d_val)
        return vl_fail(err, VL_EINVAL, "sparse scatter: null device pointer");
    idx_check c;
    int rc = check_idx(&c, d_idx, nnz, d, 1, err);
    if (rc == 0) {
        scatter_add_kernel<<<cc_blocks(nnz), CC_THREADS>>>(d_dst, d, d_idx, d_val, nnz, w, c.flag,
                                                           c.epoch);
        rc = cc_launched(err, "sparse scatter launch");
    }
    return rc ? cc_fail_sync(rc, "sparse scatter") : check_done(&c, d, 1, "sparse scatter", err);
}

extern "C" int kernels_cuda_sparse_scatter_add_host(float *dst, size_t d, const uint32_t *idx,
                                                    const float *val, size_t nnz, float w,
                                                    vl_error *err) {
    if (nnz == 0) return 0;
    if (!dst || !idx || !val) return vl_fail(err, VL_EINVAL, "sparse scatter: null argument");
    cc_dev dd, di, dv;
    int rc;
    if ((rc = cc_upload(dd, dst, d, err)) != 0 || (rc = cc_upload(di, idx, nnz, err)) != 0 ||
        (rc = cc_upload(dv, val, nnz, err)) != 0 ||
        (rc = kernels_cuda_sparse_scatter_add(dd.as<float>(), d, di.as<uint32_t>(), dv.as<float>(),
                                              nnz, w, err)) != 0)
        return rc;
    return cc_copy(dst, dd.p, d * sizeof(float), cudaMemcpyDeviceToHost, err);
}

/* ---- error feedback ------------------------------------------------------------------ */

__global__ static void feedback_add_kernel(float *e, const float *delta, size_t d, float decay) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < d; i += stride)
        e[i] = decay * e[i] + delta[i];
}

extern "C" int kernels_cuda_feedback_add(float *d_e, const float *d_delta, size_t d, float decay,
                                         vl_error *err) {
    if (d == 0) return 0;
    if (!d_e || !d_delta) return vl_fail(err, VL_EINVAL, "feedback add: null device pointer");
    feedback_add_kernel<<<cc_blocks(d), CC_THREADS>>>(d_e, d_delta, d, decay);
    int rc = cc_launched(err, "feedback add launch");
    return rc ? rc : cc_sync(err, "feedback add");
}

extern "C" int kernels_cuda_feedback_add_host(float *e, const float *delta, size_t d, float decay,
                                              vl_error *err) {
    if (d == 0) return 0;
    if (!e || !delta) return vl_fail(err, VL_EINVAL, "feedback add: null argument");
    cc_dev de, dd;
    int rc;
    if ((rc = cc_upload(de, e, d, err)) != 0 || (rc = cc_upload(dd, delta, d, err)) != 0 ||
        (rc = kernels_cuda_feedback_add(de.as<float>(), dd.as<float>(), d, decay, err)) != 0)
        return rc;
    return cc_copy(e, de.p, d * sizeof(float), cudaMemcpyDeviceToHost, err);
}

/* val[j] = e[idx[j]] as it will be decoded, e[idx[j]] -= val[j]. For F16
 * the value is clamped to the largest finite half and rounded to nearest
 * even, as common's vl_f32_to_f16 does. */
__global__ static void feedback_take_kernel(float *e, size_t d, const uint32_t *idx, size_t nnz,
                                            int f16, float *val, const unsigned long long *bad,
                                            unsigned long long epoch) {
    if (refused(bad, epoch)) return;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < nnz; j += stride) {
        uint32_t i = idx[j];
        if ((size_t)i >= d) continue;
        float v = e[i];
        if (f16) {
            v = v > F16_MAX ? F16_MAX : v < -F16_MAX ? -F16_MAX : v;
            v = __half2float(__float2half_rn(v));
        }
        val[j] = v;
        e[i] -= v;
    }
}

extern "C" int kernels_cuda_feedback_take(float *d_e, size_t d, const uint32_t *d_idx, size_t nnz,
                                          st_dtype dtype, float *d_val, vl_error *err) {
    if (dtype != ST_F32 && dtype != ST_F16)
        return vl_fail(err, VL_EINVAL, "feedback take: values are F32 or F16, not %s",
                       st_dtype_name(dtype));
    if (nnz == 0) return 0;
    if (!d_e || !d_idx || !d_val)
        return vl_fail(err, VL_EINVAL, "feedback take: null device pointer");
    idx_check c;
    int rc = check_idx(&c, d_idx, nnz, d, 1, err);
    if (rc == 0) {
        feedback_take_kernel<<<cc_blocks(nnz), CC_THREADS>>>(d_e, d, d_idx, nnz, dtype == ST_F16,
                                                             d_val, c.flag, c.epoch);
        rc = cc_launched(err, "feedback take launch");
    }
    return rc ? cc_fail_sync(rc, "feedback take") : check_done(&c, d, 1, "feedback take", err);
}

extern "C" int kernels_cuda_feedback_take_host(float *e, size_t d, const uint32_t *idx, size_t nnz,
                                               st_dtype dtype, float *val, vl_error *err) {
    if (dtype != ST_F32 && dtype != ST_F16)
        return vl_fail(err, VL_EINVAL, "feedback take: values are F32 or F16, not %s",
                       st_dtype_name(dtype));
    if (nnz == 0) return 0;
    if (!e || !idx || !val) return vl_fail(err, VL_EINVAL, "feedback take: null argument");
    cc_dev de, di, dv;
    int rc;
    if ((rc = cc_upload(de, e, d, err)) != 0 || (rc = cc_upload(di, idx, nnz, err)) != 0 ||
        (rc = cc_upload<float>(dv, nullptr, nnz, err)) != 0 ||
        (rc = kernels_cuda_feedback_take(de.as<float>(), d, di.as<uint32_t>(), nnz, dtype,
                                         dv.as<float>(), err)) != 0 ||
        (rc = cc_copy(val, dv.p, nnz * sizeof(float), cudaMemcpyDeviceToHost, err)) != 0)
        return rc;
    return cc_copy(e, de.p, d * sizeof(float), cudaMemcpyDeviceToHost, err);
}
