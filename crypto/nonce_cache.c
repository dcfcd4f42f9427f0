/* Bounded replay cache. Keys are a keyed hash of (peer, nonce) so a client
 * cannot aim its nonces at one probe chain; linear probing over a
 * power-of-two table with a bounded probe length keeps every lookup O(1). */
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "crypto/crypto.h"

#define MAX_PROBE 64

struct slot {
    uint64_t key; /* 0 = empty */
    int64_t ts;
};

struct vcrypto_nonce_cache {
    struct slot *slots;
    size_t mask;
    int64_t window;
    uint8_t hash_key[crypto_shorthash_KEYBYTES];
};

vcrypto_nonce_cache *vcrypto_nonce_cache_new(size_t capacity, int64_t window_s) {
    size_t n = 1024;
    while (n < capacity && n < ((size_t)1 << 30)) n <<= 1;
    vcrypto_nonce_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->slots = calloc(n, sizeof *c->slots);
    if (!c->slots) {
        free(c);
        return NULL;
    }
    c->mask = n - 1;
    c->window = window_s;
    crypto_shorthash_keygen(c->hash_key);
    return c;
}

void vcrypto_nonce_cache_free(vcrypto_nonce_cache *c) {
    if (!c) return;
    free(c->slots);
    free(c);
}

int vcrypto_nonce_check(vcrypto_nonce_cache *c, int64_t peer_id, const char *nonce, int64_t ts,
                        int64_t now) {
    uint8_t in[8 + VCRYPTO_NONCE_HEX];
    size_t nl = strnlen(nonce, VCRYPTO_NONCE_HEX);
    memcpy(in, &peer_id, 8);
    memcpy(in + 8, nonce, nl);
    uint8_t h[crypto_shorthash_BYTES];
    crypto_shorthash(h, in, 8 + nl, c->hash_key);
    uint64_t key;
    memcpy(&key, h, 8);
    if (key == 0) key = 1;
    /* An entry can be forgotten once its own timestamp can no longer pass
     * the window check, whichever side of the server clock it was on. */
    size_t free_slot = (size_t)-1;
    for (size_t i = 0; i < MAX_PROBE; i++) {
        struct slot *s = &c->slots[(key + i) & c->mask];
        if (s->key == key) return VL_ECONFLICT;
        int live = s->key != 0 && s->ts >= now - c->window;
        if (!live && free_slot == (size_t)-1) free_slot = (key + i) & c->mask;
        if (s->key == 0) break;
    }
    if (free_slot == (size_t)-1) return VL_ETOOBIG;
    c->slots[free_slot].key = key;
    c->slots[free_slot].ts = ts > now ? ts : now;
    return VL_OK;
}
