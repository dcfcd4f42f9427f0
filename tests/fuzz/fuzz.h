/* What the libFuzzer targets share. A target returns 0 for every input;
 * anything it finds wrong beyond what the sanitizers catch (a broken
 * invariant of a function that accepted the input) stops the run through
 * FUZZ_CHECK, and libFuzzer keeps the input as a crash artifact. */
#ifndef VOLLEY_FUZZ_H
#define VOLLEY_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"

/* fuzz_http's keys: key i (0: peer 1, 1: peer 2, 2: the joining key) is
 * the Ed25519 key of the 32-byte seed filled with FUZZ_HTTP_KEY_SEED(i),
 * so that make_seeds.c can write requests that name them. */
#define FUZZ_HTTP_KEY_SEED(i) ((uint8_t)(0x40 + (i)))
/* The join token fuzz_http registers. */
#define FUZZ_HTTP_TOKEN "vlt_fuzz"

/* fuzz_peer_files' held model: this configuration at version 3 of run
 * "fuzz"; its model files name version 4, its deltas go from 3 to 4. */
#define FUZZ_PEER_CONFIG \
    { 256, 8, 1, 2, 8 }
#define FUZZ_PEER_HELD 3
#define FUZZ_PEER_NEXT 4

#define FUZZ_CHECK(cond, ...)                                                                    \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "fuzz: invariant broken at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                        \
            fputc('\n', stderr);                                                                 \
            abort();                                                                             \
        }                                                                                        \
    } while (0)

/* Functions under test log what they refuse; thousands of lines a second
 * would only slow the run down. Errors still show. */
static inline void fuzz_quiet(void) {
    vl_log_set_level(LOG_ERROR);
}

/* A NUL-terminated heap copy of n bytes (the caller frees it), for
 * functions that take C strings. */
static inline char *fuzz_cstr(const uint8_t *data, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    for (size_t i = 0; i < n; i++) s[i] = (char)data[i];
    s[n] = '\0';
    return s;
}

/* Reads a little-endian u32 from the first 4 bytes (0 when fewer). */
static inline uint32_t fuzz_u32(const uint8_t *p, size_t n) {
    if (n < 4) return 0;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
