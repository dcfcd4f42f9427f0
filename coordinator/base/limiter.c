/* Token buckets in a bounded open-addressing table. */
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <sodium.h>

#include "coordinator/base/limiter.h"

/* Slots a key may occupy, from its home slot on. */
#define PROBE 32

typedef struct slot {
    uint64_t key;  /* hash of the key; 0 = never used */
    double tokens; /* as of `at` */
    double at;
    uint64_t used; /* l->clock at the last take: ties go to the idlest */
} slot;

struct coord_limiter {
    slot *slots;
    size_t mask;
    coord_rate r;
    uint64_t clock; /* takes so far */
    uint8_t hash_key[crypto_shorthash_KEYBYTES];
};

coord_limiter *coord_limiter_new(size_t slots, coord_rate r) {
    size_t n = 1024;
    while (n < slots && n < ((size_t)1 << 26)) n <<= 1;
    coord_limiter *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->slots = calloc(n, sizeof *l->slots);
    if (!l->slots) {
        free(l);
        return NULL;
    }
    l->mask = n - 1;
    l->r = r;
    if (l->r.burst < 1) l->r.burst = 1;
    crypto_shorthash_keygen(l->hash_key);
    return l;
}

void coord_limiter_free(coord_limiter *l) {
    if (!l) return;
    free(l->slots);
    free(l);
}

/* Tokens in s at now: what it held plus the refill since, capped. */
static double level(const coord_limiter *l, const slot *s, double now) {
    double dt = now > s->at ? now - s->at : 0;
    double t = s->tokens + dt * l->r.rate;
    return t < l->r.burst ? t : l->r.burst;
}

double coord_limiter_take(coord_limiter *l, const void *key, size_t len, double now) {
    if (!l || l->r.rate <= 0) return 0;
    uint8_t h[crypto_shorthash_BYTES];
    crypto_shorthash(h, key, len, l->hash_key);
    uint64_t k;
    memcpy(&k, h, sizeof k);
    if (k == 0) k = 1;
    /* Slots are never emptied, only taken over, so a key is never found
     * past the first empty slot of its run. */
    slot *found = NULL, *empty = NULL, *refilled = NULL, *fullest = NULL;
    double fullest_level = -1;
    for (size_t i = 0; i < PROBE; i++) {
        slot *s = &l->slots[(k + i) & l->mask];
        if (s->key == k) {
            found = s;
            break;
        }
        if (s->key == 0) {
            empty = s;
            break;
        }
        double lv = level(l, s, now);
        if (!refilled && lv >= l->r.burst) refilled = s;
        /* Among equally full slots the one idle longest goes: a key that
         * is sending now would otherwise lose its partly drained bucket
         * to a neighbour and come back with a whole burst. */
        if (lv > fullest_level || (lv == fullest_level && s->used < fullest->used)) {
            fullest_level = lv;
            fullest = s;
        }
    }
    if (!found) {
        found = empty ? empty : refilled ? refilled : fullest;
        found->key = k;
        found->tokens = l->r.burst;
        found->at = now;
    }
    found->tokens = level(l, found, now);
    if (now > found->at) found->at = now;
    found->used = ++l->clock;
    if (found->tokens >= 1) {
        found->tokens -= 1;
        return 0;
    }
    return (1 - found->tokens) / l->r.rate;
}

size_t coord_limiter_addr_key(const struct sockaddr *sa, uint8_t out[COORD_ADDR_KEY_MAX]) {
    if (!sa) return 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        out[0] = 4;
        memcpy(out + 1, &a->sin_addr, 4);
        return 5;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        const uint8_t *b = a->sin6_addr.s6_addr;
        static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(b, mapped, sizeof mapped) == 0) {
            out[0] = 4;
            memcpy(out + 1, b + 12, 4);
            return 5;
        }
        out[0] = 6;
        memcpy(out + 1, b, 8);
        return 9;
    }
    return 0;
}
