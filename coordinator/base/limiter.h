/*
 * Request rate limits: a token bucket per key (a client address, or an
 * authenticated peer). Each bucket holds up to `burst` tokens and refills
 * at `rate` tokens per second; a request takes one token, or is refused
 * with the time until the next token, which becomes the 429's Retry-After.
 *
 * The buckets live in a fixed table, so memory stays bounded however many
 * addresses a flood comes from. A bucket that has refilled to `burst` is
 * the same as no bucket, and its slot is reused; when every slot a key may
 * use holds a bucket still refilling, the fullest of them is given up (of
 * equally full ones, the one idle longest, so two clients that are both
 * sending cannot keep taking each other's slot), and the worst an
 * overflowing table does is grant one client an extra burst.
 * Keys are hashed with a random key (SipHash), so a client cannot aim its
 * keys at one run of slots.
 *
 * Contents: coord_rate, coord_limiter, coord_limiter_new,
 * coord_limiter_free, coord_limiter_take, coord_limiter_addr_key,
 * COORD_ADDR_KEY_MAX.
 */
#ifndef VOLLEY_COORD_LIMITER_H
#define VOLLEY_COORD_LIMITER_H

#include <stddef.h>
#include <stdint.h>

struct sockaddr;

/* rate tokens per second, up to burst; rate <= 0 means no limit. */
typedef struct coord_rate {
    double rate;
    double burst;
} coord_rate;

typedef struct coord_limiter coord_limiter;

/* A limiter of about `slots` buckets (rounded up to a power of two, at
 * least 1024) for rate r (burst is raised to at least 1). Owned by the
 * caller (coord_limiter_free); NULL when out of memory. */
coord_limiter *coord_limiter_new(size_t slots, coord_rate r);
void coord_limiter_free(coord_limiter *l);

/* Takes a token from key's bucket (len bytes of key) at now, monotonic
 * seconds. Returns 0 when the request may go ahead, else the seconds
 * until a token will be there (> 0). A limiter with no limit always
 * returns 0. */
double coord_limiter_take(coord_limiter *l, const void *key, size_t len, double now);

/* Longest address key: a family byte and 16 address bytes. */
#define COORD_ADDR_KEY_MAX 17
/* The key of a client address in out: IPv4 (and IPv4-mapped IPv6)
 * addresses whole, IPv6 by their /64, the block a single subscriber is
 * usually given. Returns the key length, 0 for another family. */
size_t coord_limiter_addr_key(const struct sockaddr *sa, uint8_t out[COORD_ADDR_KEY_MAX]);

#endif
