/* Laying a model's buffers out in one allocation, shared by the GPT and the
 * MLP: run a layout once with base NULL to measure, allocate cv.used floats,
 * then run it again to assign pointers. Sizes are rounded up to 16 floats so
 * every buffer starts on a 64-byte boundary. Private to model/. */
#ifndef VOLLEY_MODEL_CARVE_H
#define VOLLEY_MODEL_CARVE_H

#include <stddef.h>
#include <stdint.h>

typedef struct carver {
    float *base;
    size_t used;
    int overflow; /* set when a size wrapped; used is then meaningless */
} carver;

/* The next a * b floats (NULL while measuring or after an overflow). */
static inline float *carve(carver *cv, size_t a, size_t b) {
    size_t n;
    if (__builtin_mul_overflow(a, b, &n) || n > SIZE_MAX - 16 || cv->used > SIZE_MAX - n - 16) {
        cv->overflow = 1;
        return NULL;
    }
    n = (n + 15) & ~(size_t)15;
    float *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += n;
    return p;
}

#endif
