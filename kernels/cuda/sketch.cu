/* Count Sketch on the GPU with the windowed hash and the median of
 * compress/sketch_hash.h, the code the CPU sketch compiles too. A warp
 * takes 128 consecutive coordinates of one window at a time: lane j
 * hashes where row j's run of cells starts and passes it round the warp,
 * each lane hashes its four coordinates' signs once for every row, and
 * then every row gets four fire-and-forget reductions from each lane,
 * 32 consecutive cells per instruction, which the L2 takes as whole
 * sectors instead of one scattered cell per coordinate and row. Estimate
 * reads the same runs and takes the median with the row count a template
 * constant, so the sorting network stays in registers. Rows narrower than
 * 128 cells have windows narrower than a warp's span: there every
 * coordinate hashes its own buckets. */
#include <stdint.h>

#include "compress/sketch_hash.h"
#include "kernels/cuda/compress_util.cuh"

/* The hash keys of a sketch's rows, passed to kernels by value. */
struct row_keys {
    uint64_t k[COMPRESS_SKETCH_MAX_ROWS];
};

static int check_shape(uint32_t rows, uint32_t cols, vl_error *err) {
    if (rows < 1 || rows > COMPRESS_SKETCH_MAX_ROWS || cols < 1 ||
        (uint64_t)rows * cols > COMPRESS_SKETCH_MAX_CELLS)
        return vl_fail(err, VL_EINVAL,
                       "sketch of %u x %u: rows must be 1..%d, cols >= 1, "
                       "at most %llu cells",
                       rows, cols, COMPRESS_SKETCH_MAX_ROWS,
                       (unsigned long long)COMPRESS_SKETCH_MAX_CELLS);
    return 0;
}

static row_keys keys_of(uint64_t seed, uint32_t rows) {
    row_keys k = {};
    for (uint32_t j = 0; j < rows; j++) k.k[j] = compress_sk_row_key(seed, j);
    return k;
}

/* ---- encode ---------------------------------------------------------------------- */

/* Coordinates a warp takes at a time: four per lane. */
#define WARP_SPAN 128u

/* keys.k[lane] for lanes below rows (0 past them), selected with constant
 * indices: a kernel parameter indexed by a variable is first copied to
 * every thread's local memory. */
__device__ __forceinline__ uint64_t lane_key(const row_keys &keys, uint32_t rows, uint32_t lane) {
    uint64_t k = 0;
#pragma unroll
    for (uint32_t j = 0; j < COMPRESS_SKETCH_MAX_ROWS; j++)
        if (j == lane && j < rows) k = keys.k[j];
    return k;
}

/* A warp's walk over the chunks of WARP_SPAN coordinates: which chunks
 * are its own, and its lane's row key (rows past the last: none). */
struct warp_walk {
    uint32_t lane, wmask, wlog, rows, cols;
    size_t first, stride, chunks;
    uint64_t key;
};

__device__ __forceinline__ warp_walk walk_of(const row_keys &keys, uint32_t rows, uint32_t cols,
                                             uint32_t wlog, size_t d) {
    warp_walk w;
    w.lane = threadIdx.x & 31;
    w.first = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    w.stride = ((size_t)gridDim.x * blockDim.x) >> 5;
    w.chunks = (d + WARP_SPAN - 1) / WARP_SPAN;
    w.key = lane_key(keys, rows, w.lane);
    w.wlog = wlog;
    w.wmask = (1u << wlog) - 1;
    w.rows = rows;
    w.cols = cols;
    return w;
}

/* Where the run of chunk i0's window starts in the lane's row (lanes past
 * the rows: 0); __shfl_sync(.., base, j) hands row j's to every lane. */
__device__ __forceinline__ uint32_t walk_base(const warp_walk &w, size_t i0) {
    return w.lane < w.rows ? compress_sk_window_base(w.key, i0 >> w.wlog, w.cols) : 0;
}

/* *p += v where nothing reads the result: a fire-and-forget reduction,
 * spelled out rather than left to the compiler. */
__device__ __forceinline__ void cell_add(float *p, float v) {
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}

/* Windows of at least WARP_SPAN coordinates (wlog >= 7): chunk c of the
 * grid's warps is coordinates [128 c, 128 c + 128), all in one window. */
__global__ static void encode_warp_kernel(float *table, uint32_t rows, uint32_t cols, uint32_t wlog,
                                          uint64_t skey, row_keys keys, const float *x, size_t d) {
    warp_walk w = walk_of(keys, rows, cols, wlog, d);
    uint32_t lane = w.lane;
    for (size_t c = w.first; c < w.chunks; c += w.stride) {
        size_t i0 = c * WARP_SPAN;
        uint32_t base = walk_base(w, i0);
        float v[4];
        uint64_t bits[4];
#pragma unroll
        for (uint32_t k = 0; k < 4; k++) {
            size_t i = i0 + lane + 32 * k;
            v[k] = i < d ? __ldcs(x + i) : 0.0f;
            bits[k] = compress_sk_sign_bits(skey, i);
        }
        uint32_t off = (uint32_t)(i0 & w.wmask) + lane;
        for (uint32_t j = 0; j < rows; j++) {
            uint32_t b = __shfl_sync(0xffffffffu, base, j);
            float *row = table + (size_t)j * cols;
#pragma unroll
            for (uint32_t k = 0; k < 4; k++)
                if (i0 + lane + 32 * k < d)
                    cell_add(row + compress_sk_wrap(b, off + 32 * k, cols),
                             compress_sk_sign(bits[k], j) * v[k]);
        }
    }
}

/* Narrow rows (windows under WARP_SPAN): every coordinate on its own. */
__global__ static void encode_each_kernel(float *table, uint32_t rows, uint32_t cols, uint64_t skey,
                                          row_keys keys, const float *x, size_t d) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < d; i += stride) {
        float v = x[i];
        uint64_t bits = compress_sk_sign_bits(skey, i);
#pragma unroll
        for (uint32_t j = 0; j < COMPRESS_SKETCH_MAX_ROWS; j++)
            if (j < rows)
                cell_add(table + (size_t)j * cols + compress_sk_bucket_of(keys.k[j], i, cols),
                         compress_sk_sign(bits, j) * v);
    }
}

/* Blocks of CC_THREADS for the warp kernel: enough to fill the device,
 * no more than there are chunks for. */
static int warp_blocks(size_t d, unsigned *blocks, vl_error *err) {
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return cuda_fail(err, e, "device attributes");
    size_t warps = (d + WARP_SPAN - 1) / WARP_SPAN;
    size_t want = (warps + CC_THREADS / 32 - 1) / (CC_THREADS / 32);
    size_t full = (size_t)(sms > 0 ? sms : 1) * 8;
    *blocks = (unsigned)(want < full ? want : full);
    return 0;
}

extern "C" int kernels_cuda_sketch_encode(float *d_table, uint32_t rows, uint32_t cols,
                                          uint64_t seed, const float *d_x, size_t d,
                                          vl_error *err) {
    int rc = check_shape(rows, cols, err);
    if (rc) return rc;
    if (d == 0) return 0;
    if (!d_table || !d_x) return vl_fail(err, VL_EINVAL, "sketch encode: null device pointer");
    row_keys keys = keys_of(seed, rows);
    uint64_t skey = compress_sk_sign_key(seed);
    uint32_t wlog = compress_sk_window_log(cols);
    if ((1u << wlog) >= WARP_SPAN) {
        unsigned blocks = 1;
        if ((rc = warp_blocks(d, &blocks, err)) != 0) return rc;
        encode_warp_kernel<<<blocks, CC_THREADS>>>(d_table, rows, cols, wlog, skey, keys, d_x, d);
    } else {
        encode_each_kernel<<<cc_blocks(d), CC_THREADS>>>(d_table, rows, cols, skey, keys, d_x, d);
    }
    rc = cc_launched(err, "sketch encode launch");
    return rc ? rc : cc_sync(err, "sketch encode");
}

extern "C" int kernels_cuda_sketch_encode_host(compress_sketch *s, const float *x, size_t d,
                                               vl_error *err) {
    if (!s || !s->table || (d > 0 && !x))
        return vl_fail(err, VL_EINVAL, "sketch encode: null argument");
    int rc = check_shape(s->rows, s->cols, err);
    if (rc) return rc;
    size_t cells = (size_t)s->rows * s->cols;
    cc_dev dt, dx;
    if ((rc = cc_upload(dt, s->table, cells, err)) != 0 || (rc = cc_upload(dx, x, d, err)) != 0)
        return rc;
    rc = kernels_cuda_sketch_encode(dt.as<float>(), s->rows, s->cols, s->seed, dx.as<float>(), d,
                                    err);
    if (rc == 0) rc = cc_copy(s->table, dt.p, cells * sizeof(float), cudaMemcpyDeviceToHost, err);
    return rc;
}

/* ---- estimate --------------------------------------------------------------------- */

/* The warp layout of encode_warp_kernel, reading the runs instead. */
template <uint32_t R>
__global__ static void estimate_warp_kernel(const float *table, uint32_t cols, uint32_t wlog,
                                            uint64_t skey, row_keys keys, size_t d, float *out) {
    warp_walk w = walk_of(keys, R, cols, wlog, d);
    uint32_t lane = w.lane;
    for (size_t c = w.first; c < w.chunks; c += w.stride) {
        size_t i0 = c * WARP_SPAN;
        uint32_t base = walk_base(w, i0);
        uint32_t b[R];
#pragma unroll
        for (uint32_t j = 0; j < R; j++) b[j] = __shfl_sync(0xffffffffu, base, j);
        uint32_t off = (uint32_t)(i0 & w.wmask) + lane;
#pragma unroll
        for (uint32_t k = 0; k < 4; k++) {
            size_t i = i0 + lane + 32 * k;
            if (i >= d) break;
            uint64_t bits = compress_sk_sign_bits(skey, i);
            float t[R];
#pragma unroll
            for (uint32_t j = 0; j < R; j++)
                t[j] = compress_sk_sign(bits, j) *
                       table[(size_t)j * cols + compress_sk_wrap(b[j], off + 32 * k, cols)];
            out[i] = compress_sk_median(t, R);
        }
    }
}

template <uint32_t R>
__global__ static void estimate_each_kernel(const float *table, uint32_t cols, uint64_t skey,
                                            row_keys keys, size_t d, float *out) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < d; i += stride) {
        uint64_t bits = compress_sk_sign_bits(skey, i);
        float t[R];
#pragma unroll
        for (uint32_t j = 0; j < R; j++)
            t[j] = compress_sk_sign(bits, j) *
                   table[(size_t)j * cols + compress_sk_bucket_of(keys.k[j], i, cols)];
        out[i] = compress_sk_median(t, R);
    }
}

#define EST_CASE(R)                                                                  \
    case R:                                                                          \
        if (warp)                                                                    \
            estimate_warp_kernel<R>                                                  \
                <<<blocks, CC_THREADS>>>(d_table, cols, wlog, skey, keys, d, d_out); \
        else                                                                         \
            estimate_each_kernel<R>                                                  \
                <<<cc_blocks(d), CC_THREADS>>>(d_table, cols, skey, keys, d, d_out); \
        break;

extern "C" int kernels_cuda_sketch_estimate(const float *d_table, uint32_t rows, uint32_t cols,
                                            uint64_t seed, size_t d, float *d_out, vl_error *err) {
    int rc = check_shape(rows, cols, err);
    if (rc) return rc;
    if (d == 0) return 0;
    if (!d_table || !d_out) return vl_fail(err, VL_EINVAL, "sketch estimate: null device pointer");
    row_keys keys = keys_of(seed, rows);
    uint64_t skey = compress_sk_sign_key(seed);
    uint32_t wlog = compress_sk_window_log(cols);
    int warp = (1u << wlog) >= WARP_SPAN;
    unsigned blocks = 1;
    if (warp && (rc = warp_blocks(d, &blocks, err)) != 0) return rc;
    /* The cases are macro calls, which clang-format cannot lay out. */
    // clang-format off
    switch (rows) {
        EST_CASE(1) EST_CASE(2) EST_CASE(3) EST_CASE(4) EST_CASE(5)
        EST_CASE(6) EST_CASE(7) EST_CASE(8) EST_CASE(9) EST_CASE(10)
        EST_CASE(11) EST_CASE(12) EST_CASE(13) EST_CASE(14) EST_CASE(15)
    }
    // clang-format on
    rc = cc_launched(err, "sketch estimate launch");
    return rc ? rc : cc_sync(err, "sketch estimate");
}

extern "C" int kernels_cuda_sketch_estimate_host(const compress_sketch *s, size_t d, float *out,
                                                 vl_error *err) {
    if (!s || !s->table || (d > 0 && !out))
        return vl_fail(err, VL_EINVAL, "sketch estimate: null argument");
    int rc = check_shape(s->rows, s->cols, err);
    if (rc) return rc;
    cc_dev dt, dout;
    if ((rc = cc_upload(dt, s->table, (size_t)s->rows * s->cols, err)) != 0 ||
        (rc = cc_upload<float>(dout, nullptr, d, err)) != 0)
        return rc;
    rc = kernels_cuda_sketch_estimate(dt.as<float>(), s->rows, s->cols, s->seed, d,
                                      dout.as<float>(), err);
    if (rc == 0) rc = cc_copy(out, dout.p, d * sizeof(float), cudaMemcpyDeviceToHost, err);
    return rc;
}

/* ---- heavy hitters ------------------------------------------------------------------ */

extern "C" int kernels_cuda_sketch_heavy(const float *d_table, uint32_t rows, uint32_t cols,
                                         uint64_t seed, size_t d, size_t k, float *d_scratch,
                                         uint32_t *d_idx, float *d_val, size_t *nnz,
                                         vl_error *err) {
    if (nnz) *nnz = 0;
    if (!nnz) return vl_fail(err, VL_EINVAL, "sketch heavy: null argument");
    if ((uint64_t)d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "heavy hitters of %zu coordinates: indices are 32-bit", d);
    int rc = check_shape(rows, cols, err);
    if (rc || d == 0 || k == 0) return rc;
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
                                              vl_error *err) {
    if (nnz) *nnz = 0;
    if (!s || !s->table || !nnz || (d > 0 && k > 0 && (!idx || !val)))
        return vl_fail(err, VL_EINVAL, "sketch heavy: null argument");
    int rc = check_shape(s->rows, s->cols, err);
    if (rc || d == 0 || k == 0) return rc;
    if ((uint64_t)d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "heavy hitters of %zu coordinates: indices are 32-bit", d);
    size_t m = k < d ? k : d;
    cc_dev dt, ds, di, dv;
    if ((rc = cc_upload(dt, s->table, (size_t)s->rows * s->cols, err)) != 0 ||
        (rc = cc_upload<float>(ds, nullptr, d, err)) != 0 ||
        (rc = cc_upload<uint32_t>(di, nullptr, m, err)) != 0 ||
        (rc = cc_upload<float>(dv, nullptr, m, err)) != 0)
        return rc;
    size_t got = 0;
    rc = kernels_cuda_sketch_heavy(dt.as<float>(), s->rows, s->cols, s->seed, d, k, ds.as<float>(),
                                   di.as<uint32_t>(), dv.as<float>(), &got, err);
    if (rc == 0) rc = cc_copy(idx, di.p, got * sizeof(uint32_t), cudaMemcpyDeviceToHost, err);
    if (rc == 0) rc = cc_copy(val, dv.p, got * sizeof(float), cudaMemcpyDeviceToHost, err);
    if (rc == 0) *nnz = got;
    return rc;
}

/* ---- the hash itself ----------------------------------------------------------------- */

__global__ static void hash_kernel(row_keys keys, uint64_t skey, uint32_t rows, uint32_t cols,
                                   const uint64_t *coords, size_t n, uint32_t *bucket,
                                   int8_t *sign) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride) {
        uint64_t bits = compress_sk_sign_bits(skey, coords[t]);
        for (uint32_t j = 0; j < rows; j++) {
            bucket[(size_t)j * n + t] = compress_sk_bucket_of(keys.k[j], coords[t], cols);
            sign[(size_t)j * n + t] = (int8_t)compress_sk_sign(bits, j);
        }
    }
}

extern "C" int kernels_cuda_sketch_hash_host(uint64_t seed, uint32_t rows, uint32_t cols,
                                             const uint64_t *coords, size_t n, uint32_t *bucket,
                                             int8_t *sign, vl_error *err) {
    int rc = check_shape(rows, cols, err);
    if (rc || n == 0) return rc;
    if (!coords || !bucket || !sign) return vl_fail(err, VL_EINVAL, "sketch hash: null argument");
    if (n > SIZE_MAX / COMPRESS_SKETCH_MAX_ROWS / sizeof(uint64_t))
        return vl_fail(err, VL_ETOOBIG, "sketch hash: %zu coordinates are too many", n);
    size_t m = (size_t)rows * n;
    cc_dev dc, db, ds;
    if ((rc = cc_upload(dc, coords, n, err)) != 0 ||
        (rc = cc_upload<uint32_t>(db, nullptr, m, err)) != 0 ||
        (rc = cc_upload<int8_t>(ds, nullptr, m, err)) != 0)
        return rc;
    hash_kernel<<<cc_blocks(n), CC_THREADS>>>(keys_of(seed, rows), compress_sk_sign_key(seed), rows,
                                              cols, dc.as<uint64_t>(), n, db.as<uint32_t>(),
                                              ds.as<int8_t>());
    if ((rc = cc_launched(err, "sketch hash launch")) != 0 ||
        (rc = cc_sync(err, "sketch hash")) != 0 ||
        (rc = cc_copy(bucket, db.p, m * sizeof(uint32_t), cudaMemcpyDeviceToHost, err)) != 0)
        return rc;
    return cc_copy(sign, ds.p, m * sizeof(int8_t), cudaMemcpyDeviceToHost, err);
}
