/* Count Sketch on the GPU with the hash and median of
 * compress/sketch_hash.h, the code the CPU sketch compiles too. Encode
 * adds each coordinate's signed value to its cell in every row with
 * atomics, four coordinates per thread read as one float4: into a copy of
 * the table in shared memory when the table fits there (one per block,
 * added to the global table at the end), straight into the global table
 * otherwise. Estimate hashes each coordinate in every row, reads the cells
 * and takes the median with the row count a template constant, so the
 * sorting network stays in registers. */
#include <stdint.h>

#include "compress/sketch_hash.h"
#include "kernels/cuda/compress_util.cuh"

/* The hash keys of a sketch's rows, passed to kernels by value. */
struct row_keys {
    uint64_t k[COMPRESS_SKETCH_MAX_ROWS];
};

static int check_shape(uint32_t rows, uint32_t cols, vl_error *err)
{
    if (rows < 1 || rows > COMPRESS_SKETCH_MAX_ROWS || cols < 1 ||
        (uint64_t)rows * cols > COMPRESS_SKETCH_MAX_CELLS)
        return vl_fail(err, VL_EINVAL, "sketch of %u x %u: rows must be 1..%d, cols >= 1, "
                       "at most %llu cells", rows, cols, COMPRESS_SKETCH_MAX_ROWS,
                       (unsigned long long)COMPRESS_SKETCH_MAX_CELLS);
    return 0;
}

static row_keys keys_of(uint64_t seed, uint32_t rows)
{
    row_keys k = {};
    for (uint32_t j = 0; j < rows; j++)
        k.k[j] = compress_sk_row_key(seed, j);
    return k;
}

/* ---- encode ---------------------------------------------------------------------- */

/* The row keys into shared memory, where any thread can index them: a
 * kernel parameter indexed by a variable is copied to every thread's
 * local memory first. One thread copies them with constant indices (the
 * loop unrolls), so the parameter is read in place. Ends with a barrier. */
__device__ __forceinline__ void keys_to_shared(const row_keys &keys, uint32_t rows,
                                               uint64_t *sk)
{
    if (threadIdx.x == 0) {
#pragma unroll
        for (uint32_t j = 0; j < COMPRESS_SKETCH_MAX_ROWS; j++)
            if (j < rows)
                sk[j] = keys.k[j];
    }
    __syncthreads();
}

/* *p += v where nothing reads the result: for the global table a
 * fire-and-forget reduction, spelled out rather than left to the
 * compiler; shared memory takes the plain atomic. */
template <bool GLOBAL> __device__ __forceinline__ void cell_add(float *p, float v)
{
    if (GLOBAL)
        asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
    else
        atomicAdd(p, v);
}

/* tab += coordinate i's signed value v in every row. */
template <bool GLOBAL>
__device__ __forceinline__ void encode_one(float *tab, uint32_t rows, uint32_t cols,
                                           const uint64_t *keys, size_t i, float v)
{
    for (uint32_t j = 0; j < rows; j++) {
        uint64_t h = compress_sk_coord_hash(keys[j], i);
        cell_add<GLOBAL>(&tab[(size_t)j * cols + compress_sk_bucket(h, cols)],
                         compress_sk_sign(h) * v);
    }
}

/* The same for coordinates i..i+3: four hashes per row are independent,
 * so their multiplies overlap, and the adds (whose results go unused, so
 * they are fire-and-forget reductions) go out four at a time. */
template <bool GLOBAL>
__device__ __forceinline__ void encode_quad(float *tab, uint32_t rows, uint32_t cols,
                                            const uint64_t *keys, size_t i, float4 v)
{
    for (uint32_t j = 0; j < rows; j++) {
        uint64_t key = keys[j];
        float *row = tab + (size_t)j * cols;
        uint64_t h0 = compress_sk_coord_hash(key, i), h1 = compress_sk_coord_hash(key, i + 1);
        uint64_t h2 = compress_sk_coord_hash(key, i + 2), h3 = compress_sk_coord_hash(key, i + 3);
        cell_add<GLOBAL>(&row[compress_sk_bucket(h0, cols)], compress_sk_sign(h0) * v.x);
        cell_add<GLOBAL>(&row[compress_sk_bucket(h1, cols)], compress_sk_sign(h1) * v.y);
        cell_add<GLOBAL>(&row[compress_sk_bucket(h2, cols)], compress_sk_sign(h2) * v.z);
        cell_add<GLOBAL>(&row[compress_sk_bucket(h3, cols)], compress_sk_sign(h3) * v.w);
    }
}

/* Every coordinate of x[0, d) into tab, by the threads of the grid: x
 * from coordinate head on (16-byte aligned there) in quads read as
 * float4, the head before and the tail past the last quad one by one. The
 * reads of x are streaming (each value is read once), so they do not push
 * the table out of L2, where its atomics land. */
template <bool GLOBAL>
__device__ __forceinline__ void encode_span(float *tab, uint32_t rows, uint32_t cols,
                                            const uint64_t *keys, const float *x, size_t d,
                                            size_t head)
{
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t nq = (d - head) / 4, tail = head + 4 * nq;
    const float4 *x4 = reinterpret_cast<const float4 *>(x + head);
    for (size_t q = tid; q < nq; q += stride)
        encode_quad<GLOBAL>(tab, rows, cols, keys, head + 4 * q, __ldcs(x4 + q));
    for (size_t i = tid; i < head; i += stride)
        encode_one<GLOBAL>(tab, rows, cols, keys, i, x[i]);
    for (size_t i = tail + tid; i < d; i += stride)
        encode_one<GLOBAL>(tab, rows, cols, keys, i, x[i]);
}

__global__ static void encode_global_kernel(float *table, uint32_t rows, uint32_t cols,
                                            row_keys keys, const float *x, size_t d, size_t head)
{
    __shared__ uint64_t sk[COMPRESS_SKETCH_MAX_ROWS];
    keys_to_shared(keys, rows, sk);
    encode_span<true>(table, rows, cols, sk, x, d, head);
}

/* The same into a block-private table in dynamic shared memory (rows *
 * cols floats), then added into the global one. Cells the block left at
 * zero are skipped, which can at most keep a -0.0 cell from turning +0.0. */
__global__ static void encode_shared_kernel(float *table, uint32_t rows, uint32_t cols,
                                            row_keys keys, const float *x, size_t d, size_t head)
{
    extern __shared__ float tab[];
    __shared__ uint64_t sk[COMPRESS_SKETCH_MAX_ROWS];
    uint32_t cells = rows * cols;
    for (uint32_t c = threadIdx.x; c < cells; c += blockDim.x)
        tab[c] = 0.0f;
    keys_to_shared(keys, rows, sk);
    encode_span<false>(tab, rows, cols, sk, x, d, head);
    __syncthreads();
    for (uint32_t c = threadIdx.x; c < cells; c += blockDim.x)
        if (tab[c] != 0.0f)
            atomicAdd(&table[c], tab[c]);
}

#define ENCODE_SHARED_THREADS 512

extern "C" int kernels_cuda_sketch_encode(float *d_table, uint32_t rows, uint32_t cols,
                                          uint64_t seed, const float *d_x, size_t d,
                                          vl_error *err)
{
    int rc = check_shape(rows, cols, err);
    if (rc)
        return rc;
    if (d == 0)
        return 0;
    if (!d_table || !d_x)
        return vl_fail(err, VL_EINVAL, "sketch encode: null device pointer");
    row_keys keys = keys_of(seed, rows);
    size_t bytes = (size_t)rows * cols * sizeof(float);
    /* Coordinates before the first 16-byte boundary of d_x go one by one
     * (all of them when d_x is not even float-aligned). */
    uintptr_t addr = (uintptr_t)d_x;
    size_t head = addr % 4 ? d : (16 - addr % 16) % 16 / 4;
    head = head < d ? head : d;
    /* Work items for the grid's size: the quads, and the coordinates
     * outside them. */
    size_t quads = (d - head) / 4 + head + 3;
    int dev = 0, optin = 0, per_sm = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "device attributes");
    /* A private table pays while zeroing and adding it in is small next
     * to the block's share of coordinates. */
    if (bytes + sizeof(row_keys) <= (size_t)optin && d >= 4 * (size_t)rows * cols) {
        e = cudaFuncSetAttribute(encode_shared_kernel,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (e != cudaSuccess)
            return cuda_fail(err, e, "cudaFuncSetAttribute");
        size_t fit = (size_t)per_sm / (bytes + sizeof(row_keys) + 1024);
        fit = fit < 1 ? 1 : fit > 4 ? 4 : fit;
        size_t blocks = (size_t)sms * fit;
        size_t want = (quads + ENCODE_SHARED_THREADS - 1) / ENCODE_SHARED_THREADS;
        blocks = blocks < want ? blocks : want;
        encode_shared_kernel<<<(unsigned)blocks, ENCODE_SHARED_THREADS, bytes>>>(
            d_table, rows, cols, keys, d_x, d, head);
    } else {
        encode_global_kernel<<<cc_blocks(quads), CC_THREADS>>>(d_table, rows, cols, keys, d_x, d,
                                                                head);
    }
    rc = cc_launched(err, "sketch encode launch");
    return rc ? rc : cc_sync(err, "sketch encode");
}

extern "C" int kernels_cuda_sketch_encode_host(compress_sketch *s, const float *x, size_t d,
                                               vl_error *err)
{
    if (!s || !s->table || (d > 0 && !x))
        return vl_fail(err, VL_EINVAL, "sketch encode: null argument");
    int rc = check_shape(s->rows, s->cols, err);
    if (rc)
        return rc;
    size_t cells = (size_t)s->rows * s->cols;
    cc_dev dt, dx;
    if ((rc = cc_upload(dt, s->table, cells, err)) != 0 || (rc = cc_upload(dx, x, d, err)) != 0)
        return rc;
    rc = kernels_cuda_sketch_encode(dt.as<float>(), s->rows, s->cols, s->seed, dx.as<float>(), d,
                                    err);
    if (rc == 0)
        rc = cc_copy(s->table, dt.p, cells * sizeof(float), cudaMemcpyDeviceToHost, err);
    return rc;
}

/* ---- estimate --------------------------------------------------------------------- */

template <uint32_t R>
__global__ static void estimate_kernel(const float *table, uint32_t cols, row_keys keys,
                                       size_t d, float *out)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < d; i += stride) {
        float t[R];
#pragma unroll
        for (uint32_t j = 0; j < R; j++) {
            uint64_t h = compress_sk_coord_hash(keys.k[j], i);
            t[j] = compress_sk_sign(h) * table[(size_t)j * cols + compress_sk_bucket(h, cols)];
        }
        out[i] = compress_sk_median(t, R);
    }
}

#define EST_CASE(R)                                                                         \
    case R:                                                                                 \
        estimate_kernel<R><<<cc_blocks(d), CC_THREADS>>>(d_table, cols, keys, d, d_out);   \
        break;

extern "C" int kernels_cuda_sketch_estimate(const float *d_table, uint32_t rows, uint32_t cols,
                                            uint64_t seed, size_t d, float *d_out,
                                            vl_error *err)
{
    int rc = check_shape(rows, cols, err);
    if (rc)
        return rc;
    if (d == 0)
        return 0;
    if (!d_table || !d_out)
        return vl_fail(err, VL_EINVAL, "sketch estimate: null device pointer");
    row_keys keys = keys_of(seed, rows);
    switch (rows) {
        EST_CASE(1) EST_CASE(2) EST_CASE(3) EST_CASE(4) EST_CASE(5)
        EST_CASE(6) EST_CASE(7) EST_CASE(8) EST_CASE(9) EST_CASE(10)
        EST_CASE(11) EST_CASE(12) EST_CASE(13) EST_CASE(14) EST_CASE(15)
    }
    rc = cc_launched(err, "sketch estimate launch");
    return rc ? rc : cc_sync(err, "sketch estimate");
}

extern "C" int kernels_cuda_sketch_estimate_host(const compress_sketch *s, size_t d, float *out,
                                                 vl_error *err)
{
    if (!s || !s->table || (d > 0 && !out))
        return vl_fail(err, VL_EINVAL, "sketch estimate: null argument");
    int rc = check_shape(s->rows, s->cols, err);
    if (rc)
        return rc;
    cc_dev dt, dout;
    if ((rc = cc_upload(dt, s->table, (size_t)s->rows * s->cols, err)) != 0 ||
        (rc = cc_upload<float>(dout, nullptr, d, err)) != 0)
        return rc;
    rc = kernels_cuda_sketch_estimate(dt.as<float>(), s->rows, s->cols, s->seed, d,
                                      dout.as<float>(), err);
    if (rc == 0)
        rc = cc_copy(out, dout.p, d * sizeof(float), cudaMemcpyDeviceToHost, err);
    return rc;
}

/* ---- heavy hitters ------------------------------------------------------------------ */

extern "C" int kernels_cuda_sketch_heavy(const float *d_table, uint32_t rows, uint32_t cols,
                                         uint64_t seed, size_t d, size_t k, float *d_scratch,
                                         uint32_t *d_idx, float *d_val, size_t *nnz,
                                         vl_error *err)
{
    if (nnz)
        *nnz = 0;
    if (!nnz)
        return vl_fail(err, VL_EINVAL, "sketch heavy: null argument");
    if ((uint64_t)d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "heavy hitters of %zu coordinates: indices are 32-bit",
                       d);
    int rc = check_shape(rows, cols, err);
    if (rc || d == 0 || k == 0)
        return rc;
    if (!d_table || !d_scratch || !d_idx || !d_val)
        return vl_fail(err, VL_EINVAL, "sketch heavy: null device pointer");
    size_t got = 0;
    if ((rc = kernels_cuda_sketch_estimate(d_table, rows, cols, seed, d, d_scratch, err)) != 0 ||
        (rc = kernels_cuda_topk(d_scratch, d, k, d_idx, &got, err)) != 0 ||
        (rc = kernels_cuda_sparse_gather(d_scratch, d, d_idx, got, d_val, err)) != 0)
        return rc;
    *nnz = got;
    return 0;
}

extern "C" int kernels_cuda_sketch_heavy_host(const compress_sketch *s, size_t d, size_t k,
                                              uint32_t *idx, float *val, size_t *nnz,
                                              vl_error *err)
{
    if (nnz)
        *nnz = 0;
    if (!s || !s->table || !nnz || (d > 0 && k > 0 && (!idx || !val)))
        return vl_fail(err, VL_EINVAL, "sketch heavy: null argument");
    int rc = check_shape(s->rows, s->cols, err);
    if (rc || d == 0 || k == 0)
        return rc;
    if ((uint64_t)d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "heavy hitters of %zu coordinates: indices are 32-bit",
                       d);
    size_t m = k < d ? k : d;
    cc_dev dt, ds, di, dv;
    if ((rc = cc_upload(dt, s->table, (size_t)s->rows * s->cols, err)) != 0 ||
        (rc = cc_upload<float>(ds, nullptr, d, err)) != 0 ||
        (rc = cc_upload<uint32_t>(di, nullptr, m, err)) != 0 ||
        (rc = cc_upload<float>(dv, nullptr, m, err)) != 0)
        return rc;
    size_t got = 0;
    rc = kernels_cuda_sketch_heavy(dt.as<float>(), s->rows, s->cols, s->seed, d, k,
                                   ds.as<float>(), di.as<uint32_t>(), dv.as<float>(), &got, err);
    if (rc == 0)
        rc = cc_copy(idx, di.p, got * sizeof(uint32_t), cudaMemcpyDeviceToHost, err);
    if (rc == 0)
        rc = cc_copy(val, dv.p, got * sizeof(float), cudaMemcpyDeviceToHost, err);
    if (rc == 0)
        *nnz = got;
    return rc;
}

/* ---- the hash itself ----------------------------------------------------------------- */

__global__ static void hash_kernel(row_keys keys, uint32_t rows, uint32_t cols,
                                   const uint64_t *coords, size_t n, uint32_t *bucket,
                                   int8_t *sign)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride)
        for (uint32_t j = 0; j < rows; j++) {
            uint64_t h = compress_sk_coord_hash(keys.k[j], coords[t]);
            bucket[(size_t)j * n + t] = compress_sk_bucket(h, cols);
            sign[(size_t)j * n + t] = (int8_t)compress_sk_sign(h);
        }
}

extern "C" int kernels_cuda_sketch_hash_host(uint64_t seed, uint32_t rows, uint32_t cols,
                                             const uint64_t *coords, size_t n, uint32_t *bucket,
                                             int8_t *sign, vl_error *err)
{
    int rc = check_shape(rows, cols, err);
    if (rc || n == 0)
        return rc;
    if (!coords || !bucket || !sign)
        return vl_fail(err, VL_EINVAL, "sketch hash: null argument");
    if (n > SIZE_MAX / COMPRESS_SKETCH_MAX_ROWS / sizeof(uint64_t))
        return vl_fail(err, VL_ETOOBIG, "sketch hash: %zu coordinates are too many", n);
    size_t m = (size_t)rows * n;
    cc_dev dc, db, ds;
    if ((rc = cc_upload(dc, coords, n, err)) != 0 ||
        (rc = cc_upload<uint32_t>(db, nullptr, m, err)) != 0 ||
        (rc = cc_upload<int8_t>(ds, nullptr, m, err)) != 0)
        return rc;
    hash_kernel<<<cc_blocks(n), CC_THREADS>>>(keys_of(seed, rows), rows, cols,
                                              dc.as<uint64_t>(), n, db.as<uint32_t>(),
                                              ds.as<int8_t>());
    if ((rc = cc_launched(err, "sketch hash launch")) != 0 ||
        (rc = cc_sync(err, "sketch hash")) != 0 ||
        (rc = cc_copy(bucket, db.p, m * sizeof(uint32_t), cudaMemcpyDeviceToHost, err)) != 0)
        return rc;
    return cc_copy(sign, ds.p, m * sizeof(int8_t), cudaMemcpyDeviceToHost, err);
}
