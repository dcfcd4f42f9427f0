/* Hot loops are built for several x86-64 levels and the best is picked
 * when the program starts (an ifunc), so one binary runs everywhere.
 * ThreadSanitizer's runtime cannot run ifunc resolvers, which the loader
 * calls before it has started, so its builds get the plain loops. Private
 * to compress/. */
#ifndef VOLLEY_COMPRESS_HOT_H
#define VOLLEY_COMPRESS_HOT_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define COMPRESS_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
/* x86-64-v4 comes before plain AVX-512F for AVX-512DQ's 64-bit multiply,
 * which the sketch hash needs twice per coordinate and row; without it each
 * multiply is emulated with three 32-bit ones, which slows the hash down
 * markedly (docs/benchmarks.md). */
#define COMPRESS_HOT_V4 \
    __attribute__((target_clones("arch=x86-64-v4", "avx512f", "avx2", "default")))
#else
#define COMPRESS_HOT
#define COMPRESS_HOT_V4
#endif

#endif
