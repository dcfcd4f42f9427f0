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
static inline unsigned cc_blocks(size_t n) {
    size_t b = (n + CC_THREADS - 1) / CC_THREADS;
    if (b < 1) b = 1;
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
    ~cc_dev() {
        kernels_cuda_free(p);
    }
    /* Allocates bytes (at least 1); frees what it held before. */
    int alloc(size_t bytes, vl_error *err) {
        kernels_cuda_free(p);
        p = nullptr;
        return kernels_cuda_alloc(&p, bytes ? bytes : 1, err);
    }
    template <class T> T *as() const {
        return static_cast<T *>(p);
    }
};

/* The error of the launch just made, if any. */
static inline int cc_launched(vl_error *err, const char *what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_fail(err, e, what);
}

/* Waits for the device; a kernel's failure surfaces here. */
static inline int cc_sync(vl_error *err, const char *what) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) return 0;
    (void)cudaGetLastError();
    return cuda_fail(err, e, what);
}

/* cudaMemcpy of n bytes (synchronous for host memory); 0 bytes is a no-op. */
static inline int cc_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                          vl_error *err) {
    if (n == 0) return 0;
    cudaError_t e = cudaMemcpy(dst, src, n, kind);
    if (e == cudaSuccess) return 0;
    (void)cudaGetLastError();
    return cuda_fail(err, e,
                     kind == cudaMemcpyHostToDevice   ? "cudaMemcpy to device"
                     : kind == cudaMemcpyDeviceToHost ? "cudaMemcpy to host"
                                                      : "cudaMemcpy");
}

/* Allocates dev for n items of T and copies them from host (n may be 0). */
template <class T>
static inline int cc_upload(cc_dev &dev, const T *host, size_t n, vl_error *err) {
    if (n > SIZE_MAX / sizeof(T))
        return vl_fail(err, VL_ETOOBIG, "%zu items are too many for device memory", n);
    int rc = dev.alloc(n * sizeof(T), err);
    if (rc == 0 && host) rc = cc_copy(dev.p, host, n * sizeof(T), cudaMemcpyHostToDevice, err);
    return rc;
}

/* For finite values, the unsigned order of the sign-cleared bits is the
 * order of |x| (compress/scan.h ranks by the same key). */
__device__ __forceinline__ uint32_t cc_key(float v) {
    return __float_as_uint(v) & 0x7fffffffu;
}

/* The sum of every thread's c, in thread 0 of the block (what the others
 * get is unspecified), through 32 shared slots: within each warp by
 * shuffles, then over the warps, so a block costs one write where a
 * count needs one. blockDim.x a multiple of 32; every thread must call. */
template <class T> __device__ __forceinline__ T cc_block_sum(T c, T *part) {
    for (int off = 16; off > 0; off /= 2) c += __shfl_down_sync(0xffffffffu, c, off);
    if ((threadIdx.x & 31u) == 0) part[threadIdx.x / 32] = c;
    __syncthreads();
    T sum = 0;
    if (threadIdx.x == 0)
        for (unsigned w = 0; w < blockDim.x / 32; w++) sum += part[w];
    return sum;
}

/* ---- the cached workspace (workspace.cu) -------------------------------------------
 * Scratch that every call used to cudaMalloc and cudaFree (each free
 * waiting for the device) is kept per device and reused. A call opens a
 * lease, which holds the workspace's lock until the call returns (calls
 * from several threads take turns), and asks it for each slot's bytes: a
 * slot that is too small is replaced (its old contents are dropped, and
 * the new one starts zeroed), one that is large enough is handed out as
 * it is. Past CC_WS_CAP bytes cached per device, a request gets a buffer
 * of its own that the lease frees at the end of the call, so a one-off
 * huge call does not pin memory for good. kernels_cuda_compress_release
 * frees everything cached. */
/* SMALL: a select's state, histograms and CUB's scratch; BIG: a select's
 * candidates; FLAG: the index checks' flag, which nothing else writes. */
enum { CC_WS_SMALL = 0, CC_WS_BIG = 1, CC_WS_FLAG = 2, CC_WS_SLOTS = 3 };
#define CC_WS_CAP ((size_t)256 << 20)
/* Bytes of pinned host memory a lease offers for readbacks. */
#define CC_WS_PINNED 32768u

struct cc_ws;

struct cc_lease {
    cc_ws *ws = nullptr;
    cc_dev own[CC_WS_SLOTS];
    cc_lease() = default;
    cc_lease(const cc_lease &) = delete;
    cc_lease &operator=(const cc_lease &) = delete;
    ~cc_lease();
    /* Takes the current device's workspace. */
    int open(vl_error *err);
    /* *p = at least bytes of device memory for slot (valid until the
     * lease ends or the slot is asked for again). */
    int get(int slot, size_t bytes, void **p, vl_error *err);
    /* CC_WS_PINNED bytes of pinned host memory. */
    void *pinned() const;
    /* The device's multiprocessor count. */
    int sms() const;
    /* A value no earlier call on this device used, never 0: index checks
     * flag a bad list by writing it, so the flag needs no reset. */
    unsigned long long next_epoch();
};

/* The first bytes of d_src (at most CC_WS_PINNED) into dst, through the
 * lease's pinned buffer; waits for the device. */
int cc_readback(const cc_lease &ws, void *dst, const void *d_src, size_t bytes, vl_error *err);

/* Drops the cached workspaces when no call holds them; 1 when that freed
 * anything. memory.cu tries it before refusing an allocation. */
extern "C" int cc_ws_release_idle(void);

/* Round up to a multiple of 256 bytes (the alignment cudaMalloc gives). */
static inline size_t cc_align(size_t n) {
    return (n + 255) & ~(size_t)255;
}

/* ---- selection, shared by top-k, heavy hitters and Gaussian-k (select.cu) ---- */

/* The select's state in device memory, so the kernels of one select pass
 * it along without a trip to the host: the bucket prefix found so far
 * (after the last level, the key t itself), the count of keys above the
 * current bucket (gt), the count in it (in; at the last level the count
 * equal to t), how many of those the top k still takes (need), the
 * position of the last tie taken (cut), the counts the compactions
 * found, and for Gaussian-k a count and a minimum. */
#define CC_SEL_CHECKS 4
struct cc_sel_state {
    unsigned long long need, gt, in, ge;
    long long cut;
    long long count[CC_SEL_CHECKS];
    uint32_t prefix, kmin, min_above;
    int fail;
};

/* A select over at most n values: its device state and scratch, taken
 * from a lease, and where it ended. After cc_select_find the array the
 * select ended on (vals/map/n: the input, or when few enough a copy of its
 * keys >= some bound with map giving their input indices, ascending) is
 * known on the host; t, gt, eq and need only after cc_select_fetch. */
struct cc_sel {
    cc_lease *ws = nullptr;
    cc_sel_state *st = nullptr;
    uint32_t *hist = nullptr, *tiles = nullptr;
    void *tmp = nullptr;
    size_t tmp_bytes = 0, max_n = 0;
    float *cval = nullptr;
    uint32_t *cmap = nullptr, *pos = nullptr;
    int checks = 0;
    size_t expect[CC_SEL_CHECKS] = {};
    uint32_t t = 0;
    size_t gt = 0, eq = 0, need = 0;
    const float *vals = nullptr;
    const uint32_t *map = nullptr;
    size_t n = 0;
    /* Gaussian-k's per-block partial sums (2 * extra doubles). */
    double *part = nullptr;
};

/* Sets s up for selects over at most n values with the lease's small
 * slot, room for extra_doubles doubles in s->part. */
int cc_select_open(cc_lease *ws, size_t n, size_t extra_doubles, cc_sel *s, vl_error *err);

/* Finds the k-th largest key of d_x[0, n) (1 <= k < n <= s->max_n). */
int cc_select_find(const float *d_x, size_t n, size_t k, cc_sel *s, vl_error *err);

/* Reads the select's state back: t, gt, eq and need, and checks that
 * every level found its bucket. */
int cc_select_fetch(cc_sel *s, vl_error *err);

/* Writes in ascending order the input index of the top k the find ended
 * on: every key above t and the ties at t of lowest index (found on the
 * device). expect is k. */
int cc_select_emit_top(cc_sel *s, uint32_t *d_out, size_t expect, vl_error *err);

/* Writes in ascending order the input index of every key of (vals, map,
 * n) above t and of those equal to t at positions <= cut (-1: none;
 * INT64_MAX: all). expect is the count this must give. */
int cc_select_emit(cc_sel *s, const float *vals, const uint32_t *map, size_t n, uint32_t t,
                   int64_t cut, uint32_t *d_out, size_t expect, vl_error *err);

/* Waits for the device, and checks that every compaction found the count
 * expected and every level its bucket; the final state to *out (may be
 * NULL). */
int cc_select_check(cc_sel *s, cc_sel_state *out, vl_error *err);

/* d_out[i] = i for i < n. */
int cc_iota(uint32_t *d_out, size_t n, vl_error *err);

#endif
