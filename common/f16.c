/* IEEE 754 binary16 <-> binary32 conversion in portable integer code, so the
 * result is bit-identical on every host regardless of F16C availability. */
#include "common/common.h"

#include <string.h>

uint16_t vl_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return sign | 0x7c00u;
        /* NaN: keep the top payload bits and force the quiet bit, which also
         * guarantees a non-zero mantissa (else it would read as Inf). */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    /* 65520 is the midpoint between 65504 (max half, odd mantissa) and
     * 2^16; ties-to-even sends it and everything above to Inf. */
    if (ax >= 0x477ff000u) return sign | 0x7c00u;

    if (ax < 0x38800000u) {
        /* Result is a half subnormal (or zero): units of 2^-24. Below 2^-25
         * everything rounds to zero; exactly 2^-25 ties to even, also 0. */
        if (ax <= 0x33000000u) return sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..23 here */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++; /* may carry into the smallest normal, 0x0400: still correct */
        return (uint16_t)(sign | r);
    }

    /* Normal: rebias the exponent (127 -> 15) and round away 13 bits. A
     * mantissa carry correctly bumps the exponent. */
    uint32_t v = ax - 0x38000000u;
    uint32_t r = v >> 13;
    uint32_t rem = v & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

float vl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t x;

    if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else {
            /* Subnormal half: normalise, since every one is a normal float. */
            uint32_t e = 113;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                e--;
            }
            x = sign | (e << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
