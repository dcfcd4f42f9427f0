/* Clocks, vl_splitmix64 and the xoshiro256** generator. The RNG must produce
 * the same stream on every machine, since peers and coordinator derive
 * shared randomness (initialisation, sampling) from seeds. */
#include "common/common.h"

#include <errno.h>
#include <math.h>
#include <time.h>

int64_t vl_clock_unix_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

double vl_clock_mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void vl_clock_sleep_ms(long ms) {
    if (ms <= 0) return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    /* Resume after signals so callers get at least the delay they asked for. */
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

uint64_t vl_splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The state words are the first four outputs of the SplitMix64 generator
 * started at seed, as the xoshiro authors recommend; vl_splitmix64() adds the
 * increment itself, so output i is vl_splitmix64(seed + i * increment). Being a
 * bijection, it never yields an all-zero state. */
void vl_rng_seed(vl_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = vl_splitmix64(seed + (uint64_t)i * 0x9E3779B97F4A7C15ull);
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t vl_rng_u64(vl_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Lemire's multiply-and-reject: unbiased without a division in the common
 * case. n == 0 has no valid answer; it returns 0 rather than trapping. */
uint32_t vl_rng_below(vl_rng *r, uint32_t n) {
    if (n == 0) return 0;
    uint64_t m = (vl_rng_u64(r) >> 32) * (uint64_t)n;
    uint32_t l = (uint32_t)m;
    if (l < n) {
        uint32_t t = (uint32_t)(-n) % n;
        while (l < t) {
            m = (vl_rng_u64(r) >> 32) * (uint64_t)n;
            l = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

uint64_t vl_rng_below_u64(vl_rng *r, uint64_t n) {
    if (n <= UINT32_MAX) return vl_rng_below(r, (uint32_t)n);
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = vl_rng_u64(r);
    while (x >= limit);
    return x % n;
}

float vl_rng_uniform(vl_rng *r) {
    /* 24 random bits fill a float mantissa exactly, so the result is < 1. */
    return (float)(vl_rng_u64(r) >> 40) * 0x1.0p-24f;
}

/* Box-Muller, one output per call (the vl_rng struct has no room to cache the
 * second), computed in double for accuracy in the tails. */
float vl_rng_normal(vl_rng *r) {
    double u1 = ((double)(vl_rng_u64(r) >> 11) + 1.0) * 0x1.0p-53; /* (0, 1]: log is finite */
    double u2 = (double)(vl_rng_u64(r) >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2));
}

double vl_rng_uniform_open(vl_rng *r) {
    return ((double)(vl_rng_u64(r) >> 11) + 0.5) * 0x1.0p-53;
}

double vl_rng_log_gamma(vl_rng *r, double shape) {
    double boost = 0.0;
    if (shape < 1.0) {
        boost = log(vl_rng_uniform_open(r)) / shape;
        shape += 1.0;
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = vl_rng_normal(r), v = 1.0 + c * x;
        if (v <= 0.0) continue;
        v = v * v * v;
        double u = vl_rng_uniform_open(r), x2 = x * x;
        /* The squeeze accepts most draws without a logarithm. */
        if (u < 1.0 - 0.0331 * x2 * x2 || log(u) < 0.5 * x2 + d * (1.0 - v + log(v)))
            return log(d) + log(v) + boost;
    }
}

void vl_rng_normal_skip(vl_rng *r, uint64_t n) {
    /* vl_rng_normal takes exactly two draws; keep the two in step. */
    for (uint64_t i = 0; i < 2 * n; i++) (void)vl_rng_u64(r);
}
