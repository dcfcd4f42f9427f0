/* Count Sketch hash values pinned for the CPU (test_sketch) and the GPU
 * (test_compress_cuda) tests alike. */
#ifndef VOLLEY_TEST_SKETCH_GOLDEN_H
#define VOLLEY_TEST_SKETCH_GOLDEN_H

#include <stdint.h>

/* Computed with Python integers masked to 64 bits, from the windowed hash
 * as docs/design.md states it, alone. */
static const struct golden {
    uint64_t seed;
    uint32_t rows, cols, row;
    uint64_t i;
    uint64_t key;
    uint32_t bucket;
    int sign;
} GOLDEN[] = {
    {0x000000000000002Aull, 5, 2000u, 0, 0x0ull, 0xBA69EC90EB4FEF88ull, 1687u, 1},
    /* base 1037 + offset 999 wraps past the row's end */
    {0x000000000000002Aull, 5, 2000u, 4, 0x3E7ull, 0x7BB3C45C597CDB85ull, 36u, 1},
    {0xDEADBEEFCAFEF00Dull, 7, 1000003u, 6, 0x123456789ull, 0xBE32FFE50DB1D874ull, 239693u, 1},
    /* 3 columns: windows of 2 */
    {0x0000000000000000ull, 1, 3u, 0, 0x3039ull, 0x910A2DEC89025CC1ull, 0u, -1},
    {0xFFFFFFFFFFFFFFFFull, 15, 17895697u, 14, 0x10000000007ull, 0x4AC78209F18552C9ull, 2388065u,
     -1},
    {0xDEADBEEFCAFEF00Dull, 3, 1u, 2, 0x4Dull, 0x5F770395662E1FCCull, 0u, 1},
    /* the last coordinate of window 0 and the first two of window 1 */
    {0x000000000000002Aull, 5, 2000u, 1, 0x3FFull, 0x369EAE0B0CA19112ull, 1107u, 1},
    {0x000000000000002Aull, 5, 2000u, 1, 0x400ull, 0x369EAE0B0CA19112ull, 1770u, -1},
    {0x000000000000002Aull, 5, 2000u, 1, 0x401ull, 0x369EAE0B0CA19112ull, 1771u, 1},
};

#endif
