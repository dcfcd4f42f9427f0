/*
 * The Count Sketch hash (docs/design.md) and the median over rows that
 * estimates read, as inline functions that compile both as C (the CPU
 * sketch in compress/sketch.c) and as CUDA (kernels/cuda/sketch.cu), so
 * the CPU and the GPU share one copy of the logic and agree bit for bit:
 * same buckets, same signs, same median of the same values. Private to the
 * sketch code of compress/ and kernels/cuda/.
 */
#ifndef VOLLEY_COMPRESS_SKETCH_HASH_H
#define VOLLEY_COMPRESS_SKETCH_HASH_H

#include <stdint.h>

#ifdef __CUDACC__
#define COMPRESS_SK_HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
/* Unrolled with the row count a constant, the network's array stays in
 * registers rather than local memory (device code only: the host
 * compiler does not know the pragma). */
#define COMPRESS_SK_UNROLL _Pragma("unroll")
#endif
#elif defined(__GNUC__)
#define COMPRESS_SK_HD static inline __attribute__((always_inline, unused))
#else
#define COMPRESS_SK_HD static inline
#endif
#ifndef COMPRESS_SK_UNROLL
#define COMPRESS_SK_UNROLL
#endif

/* vl_splitmix64 of DESIGN.md (the same function as vl_splitmix64() in common; its
 * body is here so that the CPU compiler can vectorise the loops around it
 * and nvcc can compile it for the device; the tests check the two agree). */
COMPRESS_SK_HD uint64_t compress_sk_mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* key_j = vl_splitmix64(seed ^ (j + 1)). */
COMPRESS_SK_HD uint64_t compress_sk_row_key(uint64_t seed, uint32_t row) {
    return compress_sk_mix64(seed ^ ((uint64_t)row + 1));
}

/* The windowed hash. Coordinates fall into windows of W = 2^L consecutive
 * indices (L = compress_sk_window_log(cols), so W <= cols); in row j a
 * window w starts at a bucket drawn from the row's key, and coordinate i
 * of window w = i >> L lands (i mod W) cells further on, wrapping at cols:
 *
 *   base_j(w)    = bucket(vl_splitmix64(key_j ^ w), cols)
 *   bucket_j(i)  = (base_j(i >> L) + (i & (W - 1))) mod cols
 *   sign_j(i)    = bit j of vl_splitmix64(vl_splitmix64(seed) ^ i): 1 is -1
 *
 * Two coordinates of one window never share a cell; two of different
 * windows share one in row j with probability 1/cols, as with a hash per
 * coordinate, and the signs are drawn per coordinate, so an estimate's
 * noise has the variance it had with a hash per coordinate. What changes
 * is the memory: a window's cells are consecutive, so encoding and
 * estimating read and add runs of cells (coalesced on a GPU, in the same
 * cache lines on a CPU) instead of one random cell per coordinate and row,
 * and one hash per coordinate gives the signs of every row. */
#define COMPRESS_SK_WINDOW_LOG_MAX 10u

/* L for a row of cols cells: floor(log2(cols)), at most
 * COMPRESS_SK_WINDOW_LOG_MAX (cols >= 1). */
COMPRESS_SK_HD uint32_t compress_sk_window_log(uint32_t cols) {
    uint32_t l = 0;
    while (l < COMPRESS_SK_WINDOW_LOG_MAX && (2u << l) <= cols) l++;
    return l;
}

/* bucket = ((h >> 32) * cols) >> 32, always below cols. */
COMPRESS_SK_HD uint32_t compress_sk_bucket(uint64_t h, uint32_t cols) {
    return (uint32_t)(((h >> 32) * (uint64_t)cols) >> 32);
}

/* base_j(w): the bucket where window w starts in the row of key_j. */
COMPRESS_SK_HD uint32_t compress_sk_window_base(uint64_t key, uint64_t w, uint32_t cols) {
    return compress_sk_bucket(compress_sk_mix64(key ^ w), cols);
}

/* (base + off) mod cols for base < cols and off < cols. */
COMPRESS_SK_HD uint32_t compress_sk_wrap(uint32_t base, uint32_t off, uint32_t cols) {
    uint32_t b = base + off; /* < 2 cols <= 2^29 */
    return b >= cols ? b - cols : b;
}

/* bucket_j(i) in the row of key_j. */
COMPRESS_SK_HD uint32_t compress_sk_bucket_of(uint64_t key, uint64_t i, uint32_t cols) {
    uint32_t l = compress_sk_window_log(cols);
    return compress_sk_wrap(compress_sk_window_base(key, i >> l, cols),
                            (uint32_t)(i & ((1u << l) - 1)), cols);
}

/* vl_splitmix64(seed): the key of the signs (row keys hash seed ^ (j + 1),
 * never seed itself). */
COMPRESS_SK_HD uint64_t compress_sk_sign_key(uint64_t seed) {
    return compress_sk_mix64(seed);
}

/* Coordinate i's sign bits, bit j for row j. */
COMPRESS_SK_HD uint64_t compress_sk_sign_bits(uint64_t skey, uint64_t i) {
    return compress_sk_mix64(skey ^ i);
}

/* Row j's sign as a float, exactly +1 or -1: encode adds sign * x and
 * estimate reads sign * cell, both exact. */
COMPRESS_SK_HD float compress_sk_sign(uint64_t bits, uint32_t row) {
    return (float)(1 - 2 * (int32_t)((bits >> row) & 1));
}

/* Median of t[0..R) (1 <= R <= 15), t clobbered: an odd-even transposition
 * sort (R passes sort fully) of compare-exchanges, then the middle value,
 * or for even R the mean of the two middle ones. With R a compile-time
 * constant the network unrolls into min/max on registers. The exchange
 * keeps the order of operands that do not compare less, so -0.0 and +0.0
 * and the operands of the final mean land where they do on every machine. */
COMPRESS_SK_HD float compress_sk_median(float *t, uint32_t R) {
    COMPRESS_SK_UNROLL
    for (uint32_t pass = 0; pass < (R + 1) / 2; pass++) {
        COMPRESS_SK_UNROLL
        for (uint32_t q = 0; q < R / 2; q++) {
            float a = t[2 * q], c = t[2 * q + 1];
            t[2 * q] = a < c ? a : c;
            t[2 * q + 1] = a < c ? c : a;
        }
        COMPRESS_SK_UNROLL
        for (uint32_t q = 0; q < (R - 1) / 2; q++) {
            float a = t[2 * q + 1], c = t[2 * q + 2];
            t[2 * q + 1] = a < c ? a : c;
            t[2 * q + 2] = a < c ? c : a;
        }
    }
    return (R & 1) ? t[R / 2] : 0.5f * (t[R / 2 - 1] + t[R / 2]);
}

#endif
