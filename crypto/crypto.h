/*
 * crypto: peer identity and request authentication, on libsodium.
 *
 * A peer owns an Ed25519 key pair kept in a 0600 file. Every request after
 * join carries an Authorization header whose signature covers the method,
 * path and query, a timestamp, a random nonce and the BLAKE2b-256 hash of
 * the body, so a captured request can be neither altered nor replayed
 * (the coordinator keeps seen nonces for the timestamp window). Join tokens
 * are random strings of which only a BLAKE2b hash is ever stored. A peer
 * that changes its key proves it holds the new one with a rotation proof.
 *
 *   Authorization: Volley-Ed25519 peer=<id>,ts=<unix s>,nonce=<32 hex>,sig=<base64>
 *   signed message: "VOLLEY1\n" METHOD "\n" PATH?QUERY "\n" ts "\n" nonce "\n"
 *                   hex(BLAKE2b-256(body)) — no trailing newline.
 */
#ifndef VOLLEY_CRYPTO_H
#define VOLLEY_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#define CRYPTO_PK_BYTES 32
#define CRYPTO_SK_BYTES 64
#define CRYPTO_SIG_BYTES 64
#define CRYPTO_PK_B64_LEN 44   /* base64 of 32 bytes, without NUL */
#define CRYPTO_NONCE_HEX 32    /* 16 random bytes as hex */
#define CRYPTO_HASH_HEX 64     /* BLAKE2b-256 as hex */
#define CRYPTO_TOKEN_LEN 68    /* "vlt_" + 64 hex */
#define CRYPTO_AUTH_SCHEME "Volley-Ed25519"
#define CRYPTO_AUTH_MAX 256    /* longest Authorization value we accept */
#define CRYPTO_TS_WINDOW_S 300 /* allowed clock difference, seconds */

/* Initialises libsodium; call once at start-up. Returns 0 or VL_ERR. */
int crypto_init(void) VL_MUST_CHECK;

/* ---- identity ---------------------------------------------------------- */

typedef struct crypto_identity {
    uint8_t pk[CRYPTO_PK_BYTES];
    uint8_t sk[CRYPTO_SK_BYTES];
} crypto_identity;

/* Fresh random key pair. */
void crypto_identity_generate(crypto_identity *id);
/* Writes the secret key to path with mode 0600 (atomically). Refuses to
 * replace an existing file unless overwrite is set. */
int crypto_identity_save(const crypto_identity *id, const char *path, int overwrite,
                         vl_error *err) VL_MUST_CHECK;
/* Loads a key written by crypto_identity_save; refuses a file that other
 * users can read, a malformed file, or a key whose public half does not
 * match its secret half. */
int crypto_identity_load(crypto_identity *id, const char *path, vl_error *err) VL_MUST_CHECK;
/* Wipes the secret key from memory. */
void crypto_identity_wipe(crypto_identity *id);

/* Public key as base64 (out holds CRYPTO_PK_B64_LEN + 1 bytes) and back. */
void crypto_pk_encode(const uint8_t pk[CRYPTO_PK_BYTES], char *out);
int crypto_pk_decode(const char *b64, uint8_t pk[CRYPTO_PK_BYTES]) VL_MUST_CHECK;

/* ---- request signatures ------------------------------------------------ */

/* Writes the Authorization header value for one request into out (cap
 * bytes). ts is the caller's clock, nonce fresh random. peer_id 0 is used
 * for the join request, which proves possession of the key it registers. */
int crypto_sign_request(const crypto_identity *id, int64_t peer_id, const char *method,
                        const char *path_query, const uint8_t *body, size_t body_len,
                        int64_t ts, char *out, size_t cap) VL_MUST_CHECK;

/* A parsed Authorization header. */
typedef struct crypto_auth_header {
    int64_t peer_id;
    int64_t ts;
    char nonce[CRYPTO_NONCE_HEX + 1];
    uint8_t sig[CRYPTO_SIG_BYTES];
} crypto_auth_header;

/* Parses a header value strictly: scheme, then exactly the four fields in
 * order, each well formed. Returns 0 or VL_EINVAL with a message. */
int crypto_auth_parse(const char *value, crypto_auth_header *out, vl_error *err) VL_MUST_CHECK;

/* Checks a parsed header against the public key, the request, and the
 * clock: VL_EAUTH for a bad signature or a timestamp more than
 * CRYPTO_TS_WINDOW_S from now. Does not check nonce reuse (see below). */
int crypto_verify_request(const uint8_t pk[CRYPTO_PK_BYTES], const crypto_auth_header *auth,
                          const char *method, const char *path_query, const uint8_t *body,
                          size_t body_len, int64_t now, vl_error *err) VL_MUST_CHECK;

/* ---- key rotation ------------------------------------------------------ */

/* Base64 of a 64-byte signature, without NUL. */
#define CRYPTO_SIG_B64_LEN 88

/* A registered peer moves to a new key with a request signed by its old
 * key whose body carries the new public key and this proof: the new key's
 * signature over "VOLLEY1-ROTATE\n" peer_id "\n" base64(old_pk) "\n"
 * base64(new_pk). It shows the caller holds the new key, and binding the
 * peer and the old key keeps a proof from serving any other rotation.
 * Writes base64 of the signature to out (CRYPTO_SIG_B64_LEN + 1 bytes). */
void crypto_rotation_sign(const crypto_identity *new_id, int64_t peer_id,
                          const uint8_t old_pk[CRYPTO_PK_BYTES], char *out);
/* Checks a proof made by crypto_rotation_sign: 0, VL_EINVAL for a proof
 * that is not base64 of 64 bytes, VL_EAUTH for one that does not verify. */
int crypto_rotation_verify(const uint8_t new_pk[CRYPTO_PK_BYTES], int64_t peer_id,
                           const uint8_t old_pk[CRYPTO_PK_BYTES], const char *proof,
                           vl_error *err) VL_MUST_CHECK;

/* ---- nonce replay cache ------------------------------------------------ */

/* Remembers (peer, nonce) pairs for the timestamp window in a fixed-size
 * open-addressing table, so memory stays bounded whatever clients send.
 * Entries older than the window are reused; when every slot is live the
 * cache refuses new nonces (VL_ETOOBIG) rather than forgetting live ones,
 * which would reopen the replay hole. */
typedef struct crypto_nonce_cache crypto_nonce_cache;

/* capacity: number of slots (rounded up to a power of two). Owned by the
 * caller; free with crypto_nonce_cache_free. NULL on allocation failure. */
crypto_nonce_cache *crypto_nonce_cache_new(size_t capacity, int64_t window_s);
void crypto_nonce_cache_free(crypto_nonce_cache *c);
/* 0 when the nonce is new (and now remembered), VL_ECONFLICT when seen
 * inside the window, VL_ETOOBIG when the cache is full of live entries. */
int crypto_nonce_check(crypto_nonce_cache *c, int64_t peer_id, const char *nonce, int64_t ts,
                       int64_t now) VL_MUST_CHECK;

/* ---- tokens and hashes --------------------------------------------------- */

/* A new join token "vlt_<64 hex>" in out (CRYPTO_TOKEN_LEN + 1 bytes). */
void crypto_token_generate(char *out);
/* hex(BLAKE2b-256(s)) in out (CRYPTO_HASH_HEX + 1 bytes): what is stored
 * instead of a token. */
void crypto_hash_hex(const void *data, size_t len, char *out);
/* Constant-time comparison of two equal-length strings/byte arrays. */
int crypto_equal(const void *a, const void *b, size_t n);
/* n random bytes as 2n hex characters plus NUL in out. */
void crypto_random_hex(size_t n, char *out);

#endif
