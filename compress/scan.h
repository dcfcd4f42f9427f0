/*
 * Private to compress/: the scanning primitives that exact top-k and
 * Gaussian-k share. Selection works on the sign-cleared bit pattern of a
 * float ("key"): for finite values it orders like |x|, so thresholds and
 * histograms are integer compares, and -0.0 equals +0.0.
 */
#ifndef VOLLEY_COMPRESS_SCAN_H
#define VOLLEY_COMPRESS_SCAN_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compress/hot.h"

/* Values scanned per block when skipping blocks with no candidate. */
#define SCAN_BLOCK 32

static inline uint32_t key_at(const float *x, size_t i) {
    uint32_t u;
    memcpy(&u, x + i, sizeof u);
    return u & 0x7fffffffu;
}

/* Largest key of x[i .. i+SCAN_BLOCK). */
static inline uint32_t block_max(const float *x, size_t i) {
    uint32_t m = 0;
    for (size_t j = 0; j < SCAN_BLOCK; j++) {
        uint32_t u = key_at(x, i + j);
        m = u > m ? u : m;
    }
    return m;
}

/* Makes room for at least SCAN_BLOCK more candidates in a chunk's growing
 * (index, value) lists holding used entries of *alloc, doubling them. 0,
 * or -1 when out of memory (the lists stay valid for the caller to free). */
__attribute__((unused)) static int scan_grow(uint32_t **idx, float **val, size_t *alloc,
                                             size_t used) {
    if (*alloc - used >= SCAN_BLOCK) return 0;
    size_t na = *alloc ? 2 * *alloc : 1024;
    uint32_t *ni = realloc(*idx, na * sizeof *ni);
    if (!ni) return -1;
    *idx = ni;
    float *nv = realloc(*val, na * sizeof *nv);
    if (!nv) return -1;
    *val = nv;
    *alloc = na;
    return 0;
}

/* Copies (index, |x|) of the values with key >= kmin from x[*pos, hi)
 * into cidx/cval until fewer than SCAN_BLOCK slots of room are left;
 * advances *pos and returns the count. Blocks with a hit (usually one or
 * two at random places) are copied without branches: every slot is
 * written and kept by advancing n, which room - n >= SCAN_BLOCK makes
 * safe. */
__attribute__((unused)) COMPRESS_HOT static size_t scan_collect_some(const float *x, size_t *pos,
                                                                     size_t hi, uint32_t kmin,
                                                                     uint32_t *cidx, float *cval,
                                                                     size_t room) {
    size_t n = 0, i = *pos;
    while (i < hi && room - n >= SCAN_BLOCK) {
        size_t end = i + SCAN_BLOCK <= hi ? i + SCAN_BLOCK : hi;
        if (end - i == SCAN_BLOCK && block_max(x, i) < kmin) {
            i = end;
            continue;
        }
        for (; i < end; i++) {
            uint32_t u = key_at(x, i);
            cidx[n] = (uint32_t)i;
            cval[n] = fabsf(x[i]);
            n += u >= kmin;
        }
    }
    *pos = i;
    return n;
}

#endif
