/*
 * The Count Sketch hash of DESIGN.md and the median over rows that
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

/* splitmix64 of DESIGN.md (the same function as splitmix64() in common; its
 * body is here so that the CPU compiler can vectorise the loops around it
 * and nvcc can compile it for the device; the tests check the two agree). */
COMPRESS_SK_HD uint64_t compress_sk_mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* key_j = splitmix64(seed ^ (j + 1)). */
COMPRESS_SK_HD uint64_t compress_sk_row_key(uint64_t seed, uint32_t row)
{
    return compress_sk_mix64(seed ^ ((uint64_t)row + 1));
}

/* h = splitmix64(key_j ^ i) of coordinate i in the row of key_j. */
COMPRESS_SK_HD uint64_t compress_sk_coord_hash(uint64_t key, uint64_t i)
{
    return compress_sk_mix64(key ^ i);
}

/* bucket = ((h >> 32) * cols) >> 32, always below cols. */
COMPRESS_SK_HD uint32_t compress_sk_bucket(uint64_t h, uint32_t cols)
{
    return (uint32_t)(((h >> 32) * (uint64_t)cols) >> 32);
}

/* The sign as a float, exactly +1 or -1: encode adds sign * x and
 * estimate reads sign * cell, both exact. */
COMPRESS_SK_HD float compress_sk_sign(uint64_t h)
{
    return (float)(1 - 2 * (int32_t)(h & 1));
}

/* Median of t[0..R) (1 <= R <= 15), t clobbered: an odd-even transposition
 * sort (R passes sort fully) of compare-exchanges, then the middle value,
 * or for even R the mean of the two middle ones. With R a compile-time
 * constant the network unrolls into min/max on registers. The exchange
 * keeps the order of operands that do not compare less, so -0.0 and +0.0
 * and the operands of the final mean land where they do on every machine. */
COMPRESS_SK_HD float compress_sk_median(float *t, uint32_t R)
{
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
