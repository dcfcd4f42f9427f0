/*
 * crypto: peer identity and request authentication, on libsodium and
 * OpenSSL's digests.
 *
 * A peer owns an Ed25519 key pair kept in a 0600 file. Every request after
 * join is signed with RFC 9421 HTTP Message Signatures over its method,
 * path and query and, for a body, its RFC 9530 Content-Digest and length,
 * with a creation time and a random nonce, so a captured request can be
 * neither altered nor replayed (the coordinator keeps seen nonces for the
 * time window). Join tokens are random strings of which only a BLAKE2b
 * hash is ever stored. A peer that changes its key proves it holds the new
 * one with a rotation proof.
 *
 * The module's names take the prefix vcrypto_ (VCRYPTO_ for macros), not
 * crypto_: libsodium owns crypto_ (crypto_sign_detached, crypto_generichash,
 * ...) and the files here call it beside their own functions, so the prefix
 * tells a reader which are ours.
 */
#ifndef VOLLEY_CRYPTO_H
#define VOLLEY_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#define VCRYPTO_PK_BYTES 32
#define VCRYPTO_SK_BYTES 64
#define VCRYPTO_SIG_BYTES 64
#define VCRYPTO_PK_B64_LEN 44   /* base64 of 32 bytes, without NUL */
#define VCRYPTO_NONCE_HEX 32    /* 16 random bytes as hex */
#define VCRYPTO_HASH_HEX 64     /* BLAKE2b-256 as hex */
#define VCRYPTO_TOKEN_LEN 68    /* "vlt_" + 64 hex */
#define VCRYPTO_SIG_B64_LEN 88  /* base64 of a 64-byte signature, without NUL */
#define VCRYPTO_TS_WINDOW_S 300 /* allowed clock difference, seconds */

/* Initialises libsodium; call once at start-up. Returns 0 or VL_ERR. */
int vcrypto_init(void) VL_MUST_CHECK;

/* ---- identity ---------------------------------------------------------- */

typedef struct vcrypto_identity {
    uint8_t pk[VCRYPTO_PK_BYTES];
    uint8_t sk[VCRYPTO_SK_BYTES];
} vcrypto_identity;

/* Fresh random key pair. */
void vcrypto_identity_generate(vcrypto_identity *id);
/* Writes the secret key to path with mode 0600 (atomically). Refuses to
 * replace an existing file unless overwrite is set. */
int vcrypto_identity_save(const vcrypto_identity *id, const char *path, int overwrite,
                          vl_error *err) VL_MUST_CHECK;
/* Loads a key written by vcrypto_identity_save; refuses a file that other
 * users can read, a malformed file, or a key whose public half does not
 * match its secret half. */
int vcrypto_identity_load(vcrypto_identity *id, const char *path, vl_error *err) VL_MUST_CHECK;
/* Wipes the secret key from memory. */
void vcrypto_identity_wipe(vcrypto_identity *id);

/* Public key as base64 (out holds VCRYPTO_PK_B64_LEN + 1 bytes) and back. */
void vcrypto_pk_encode(const uint8_t pk[VCRYPTO_PK_BYTES], char *out);
int vcrypto_pk_decode(const char *b64, uint8_t pk[VCRYPTO_PK_BYTES]) VL_MUST_CHECK;

/* ---- request signatures (RFC 9421 with RFC 9530 Content-Digest) ----------
 *
 * Every request after join is signed with HTTP Message Signatures, so any
 * HTTP library with an RFC 9421 signer can talk to volley, and the
 * coordinator can decide from the request head alone, before reading a
 * body, who sent it:
 *
 *   Content-Digest: sha-256=:<base64 of SHA-256(body)>:
 *   Signature-Input: sig1=("@method" "@path" "@query" "content-digest"
 *                    "content-length");created=<unix s>;keyid="<peer id>";
 *                    nonce="<random>";alg="ed25519"
 *   Signature: sig1=:<base64 of the 64-byte Ed25519 signature>:
 *
 * The signed bytes are RFC 9421's signature base: one line per covered
 * component, '"name": value', then '"@signature-params": ' and the
 * serialised inner list with its parameters, joined with LF. A join
 * request (which has no peer id yet) uses keyid = base64 of the public key
 * it registers. SHA-256 comes from OpenSSL (the CPU's SHA extensions where
 * present); sha-512 is accepted too. */

#define VCRYPTO_SIG_MAX_COMPONENTS 16
#define VCRYPTO_SIG_NAME_MAX 48  /* longest covered component name */
#define VCRYPTO_SIG_NONCE_MAX 64 /* longest nonce parameter accepted */
#define VCRYPTO_SIG_KEYID_MAX 64
#define VCRYPTO_SIG_HEADER_MAX 1024 /* longest Signature-Input / Signature value */
#define VCRYPTO_DIGEST_HEADER_MAX 200
#define VCRYPTO_SIG_LABEL "sig1"

/* Streaming body digests. */
typedef enum { VCRYPTO_DIGEST_SHA256 = 1, VCRYPTO_DIGEST_SHA512 = 2 } vcrypto_digest_alg;
#define VCRYPTO_DIGEST_MAX 64

/* A Content-Digest value's chosen digest (sha-256 preferred, else
 * sha-512; other algorithms in the field are ignored). */
typedef struct vcrypto_digest_want {
    vcrypto_digest_alg alg;
    size_t len; /* 32 or 64 */
    uint8_t bytes[VCRYPTO_DIGEST_MAX];
} vcrypto_digest_want;

/* Parses a Content-Digest field value (an RFC 8941 dictionary of byte
 * sequences). Members of other algorithms are skipped whatever they hold.
 * VL_EINVAL with a message when it is malformed, longer than
 * VCRYPTO_DIGEST_HEADER_MAX - 1 bytes, or names neither sha-256 nor sha-512
 * with a digest of the right length. */
int vcrypto_digest_parse(const char *value, vcrypto_digest_want *out, vl_error *err) VL_MUST_CHECK;

/* An incremental digest (OpenSSL EVP). Owned by the caller: free with
 * vcrypto_digest_free (NULL is fine). NULL on allocation failure. */
typedef struct vcrypto_digest vcrypto_digest;
vcrypto_digest *vcrypto_digest_new(vcrypto_digest_alg alg);
void vcrypto_digest_update(vcrypto_digest *d, const void *data, size_t len);
/* Writes the digest (32 or 64 bytes) to out and returns its length; the
 * context can then be reused after vcrypto_digest_reset. */
size_t vcrypto_digest_final(vcrypto_digest *d, uint8_t out[VCRYPTO_DIGEST_MAX]);
int vcrypto_digest_reset(vcrypto_digest *d, vcrypto_digest_alg alg) VL_MUST_CHECK;
void vcrypto_digest_free(vcrypto_digest *d);

/* "sha-256=:<base64>:" for body (len bytes; body may be NULL when len is
 * 0) into out (cap bytes). VL_ETOOBIG if it does not fit. */
int vcrypto_content_digest(const void *body, size_t len, char *out, size_t cap) VL_MUST_CHECK;

/* One parsed signature: the Signature-Input member vcrypto_sig_parse
 * chose (see there), with its Signature member. */
typedef struct vcrypto_sig {
    char label[VCRYPTO_SIG_NAME_MAX + 1];
    size_t n_components;
    char components[VCRYPTO_SIG_MAX_COMPONENTS][VCRYPTO_SIG_NAME_MAX + 1]; /* as written:
        "@method", "content-digest", ... (names only: component parameters
        such as ;sf or ;req are refused) */
    int64_t created;                                                       /* required */
    int64_t expires;                                                       /* 0 when absent */
    int has_expires;                       /* expires was given (expires=0 is a time, long past) */
    char keyid[VCRYPTO_SIG_KEYID_MAX + 1]; /* required */
    char nonce[VCRYPTO_SIG_NONCE_MAX + 1]; /* 16..64 chars of [A-Za-z0-9+/=_.-];
                                             empty when absent (RFC 9421 makes it
                                             optional; the coordinator requires it) */
    char alg[24]; /* "ed25519", or empty when absent (any other is refused) */
    char tag[VCRYPTO_SIG_KEYID_MAX + 1]; /* optional, carried into the base */
    int has_tag;
    char params[VCRYPTO_SIG_HEADER_MAX]; /* the serialised @signature-params value */
    uint8_t sig[VCRYPTO_SIG_BYTES];
} vcrypto_sig;

/* Parses the Signature-Input and Signature field values strictly (RFC 8941
 * dictionaries; an inner list of strings with parameters, and a byte
 * sequence). Of the Signature-Input members whose label Signature has,
 * the one read is the first that is volley's: it parses, its signature is
 * 64 bytes, and its keyid has a form volley signs with (a peer id, 1 to 19
 * decimal digits, or base64 of a 32-byte public key), preferring alg
 * "ed25519" given over alg absent. So an intermediary's signature placed
 * before the peer's, of any algorithm and parameters, is passed over.
 * When no member is volley's, the first member whose label Signature has
 * is read, and refused here or by the caller as it stands (the signature
 * must then be 64 bytes; members not read may hold any byte sequence).
 * In the member read, unknown signature parameters, component parameters,
 * duplicate components or parameters and values over the caps above are
 * refused; in either field, duplicate labels, more than 8 members, a
 * malformed dictionary and a field of VCRYPTO_SIG_HEADER_MAX bytes or more
 * are. created and keyid are required; nonce, alg, expires and tag are
 * optional (has_expires says whether expires was given): an absent nonce
 * leaves nonce[0] == '\0' (the caller decides whether it needs one), while
 * a nonce given outside 16..64 characters of [A-Za-z0-9+/=_.-], or an alg
 * other than "ed25519" (empty included), is refused. Either value may be
 * NULL (missing header). Returns 0 or VL_EINVAL with a one-line message. */
int vcrypto_sig_parse(const char *sig_input, const char *signature, vcrypto_sig *out,
                      vl_error *err) VL_MUST_CHECK;

/* Looks up one covered component's value for the request being verified:
 * a derived component ("@method", "@path", "@query", "@target-uri",
 * "@authority", "@scheme", "@request-target") or a lowercase field name.
 * Returns a NUL-terminated value (valid until the next call), or NULL
 * when the request has no such component. A lookup that cannot hold a
 * value whole must return NULL, never a truncated value. */
typedef const char *(*vcrypto_sig_lookup)(void *arg, const char *component);

/* Builds the signature base for s from the request's component values into
 * out (reset first; out's own cap bounds it). VL_EINVAL with a message
 * when a covered component is missing or holds a byte a field value
 * cannot (control characters), VL_ETOOBIG when the base exceeds the cap. */
int vcrypto_sig_base(const vcrypto_sig *s, vcrypto_sig_lookup lookup, void *arg, vl_buf *out,
                     vl_error *err) VL_MUST_CHECK;

/* Verifies s's signature over base with pk: 0 or VL_EAUTH. Checks nothing
 * about time, nonce or components (the caller's policy). */
int vcrypto_sig_verify(const uint8_t pk[VCRYPTO_PK_BYTES], const vcrypto_sig *s, const vl_buf *base,
                       vl_error *err) VL_MUST_CHECK;

/* The headers a client adds to one request. */
typedef struct vcrypto_signed_headers {
    char content_digest[VCRYPTO_DIGEST_HEADER_MAX]; /* empty when the request has no body */
    char signature_input[VCRYPTO_SIG_HEADER_MAX];
    char signature[VCRYPTO_SIG_B64_LEN + 16];
} vcrypto_signed_headers;

/* Signs one request as volley's clients do. path_query is the request
 * target as sent ("/v1/task?wait=20"). has_body: the request carries a
 * Content-Length (POST, even with len 0); then Content-Digest is made from
 * body and content-digest and content-length are covered, else only
 * @method, @path and @query. keyid: the peer id in decimal, or for a join
 * the base64 public key. created: the caller's clock; the nonce is fresh
 * random. Returns 0; VL_EINVAL for a target that does not start with '/'
 * or holds a byte a request line cannot (control characters, space,
 * non-ASCII), an empty method or one with such a byte, a keyid that is
 * empty, over VCRYPTO_SIG_KEYID_MAX or not printable ASCII, a created
 * outside 0..999999999999999, or body NULL with len > 0; VL_ETOOBIG for a
 * target of more than sizeof(vcrypto_http_request.scratch) - 2 bytes. */
int vcrypto_sign_http(const vcrypto_identity *id, const char *keyid, const char *method,
                      const char *path_query, int has_body, const void *body, size_t len,
                      int64_t created, vcrypto_signed_headers *out) VL_MUST_CHECK;

/* The lookup vcrypto_sign_http signs with, for a request given as method,
 * target and (for a body) the Content-Digest and Content-Length values;
 * tests and tools use it to verify what they signed. Every component is
 * NULL when path_query is; @path, @query, @authority or @target-uri too
 * long for scratch is NULL, never truncated. */
typedef struct vcrypto_http_request {
    const char *method;
    const char *path_query;
    const char *authority;      /* Host, for @authority and @target-uri; may be NULL */
    const char *content_digest; /* NULL when absent */
    const char *content_length; /* NULL when absent */
    char scratch[2048];
} vcrypto_http_request;
const char *vcrypto_http_request_lookup(void *arg, const char *component);

/* A nonce as the replay cache keys it: hex of the first 16 bytes of
 * SHA-256(nonce), so any nonce format fits the cache's fixed slots. out
 * holds VCRYPTO_NONCE_HEX + 1 bytes. */
void vcrypto_nonce_key(const char *nonce, char out[VCRYPTO_NONCE_HEX + 1]);

/* ---- key rotation ------------------------------------------------------ */


/* A registered peer moves to a new key with a request signed by its old
 * key whose body carries the new public key and this proof: the new key's
 * signature over "VOLLEY1-ROTATE\n" peer_id "\n" base64(old_pk) "\n"
 * base64(new_pk). It shows the caller holds the new key, and binding the
 * peer and the old key keeps a proof from serving any other rotation.
 * Writes base64 of the signature to out (VCRYPTO_SIG_B64_LEN + 1 bytes). */
void vcrypto_rotation_sign(const vcrypto_identity *new_id, int64_t peer_id,
                           const uint8_t old_pk[VCRYPTO_PK_BYTES], char *out);
/* Checks a proof made by vcrypto_rotation_sign: 0, VL_EINVAL for a proof
 * that is not base64 of 64 bytes, VL_EAUTH for one that does not verify. */
int vcrypto_rotation_verify(const uint8_t new_pk[VCRYPTO_PK_BYTES], int64_t peer_id,
                            const uint8_t old_pk[VCRYPTO_PK_BYTES], const char *proof,
                            vl_error *err) VL_MUST_CHECK;

/* ---- nonce replay cache ------------------------------------------------ */

/* Remembers (peer, nonce) pairs in a fixed-size open-addressing table, so
 * memory stays bounded whatever clients send, each until its own
 * timestamp (the request's created, or the clock when that is behind)
 * plus the window: a created up to a window ahead keeps its nonce up to
 * two windows. Entries past that are reused; when every slot is live the
 * cache refuses new nonces (VL_ETOOBIG) rather than forgetting live ones,
 * which would reopen the replay hole. */
typedef struct vcrypto_nonce_cache vcrypto_nonce_cache;

/* capacity: number of slots (rounded up to a power of two). Owned by the
 * caller; free with vcrypto_nonce_cache_free. NULL on allocation failure. */
vcrypto_nonce_cache *vcrypto_nonce_cache_new(size_t capacity, int64_t window_s);
void vcrypto_nonce_cache_free(vcrypto_nonce_cache *c);
/* 0 when the nonce is new (and now remembered), VL_ECONFLICT when seen
 * inside the window, VL_ETOOBIG when the cache is full of live entries. */
int vcrypto_nonce_check(vcrypto_nonce_cache *c, int64_t peer_id, const char *nonce, int64_t ts,
                        int64_t now) VL_MUST_CHECK;

/* ---- tokens and hashes --------------------------------------------------- */

/* A new join token "vlt_<64 hex>" in out (VCRYPTO_TOKEN_LEN + 1 bytes). */
void vcrypto_token_generate(char *out);
/* hex(BLAKE2b-256(s)) in out (VCRYPTO_HASH_HEX + 1 bytes): what is stored
 * instead of a token. */
void vcrypto_hash_hex(const void *data, size_t len, char *out);
/* Constant-time comparison of two equal-length strings/byte arrays. */
int vcrypto_equal(const void *a, const void *b, size_t n);
/* n random bytes as 2n hex characters plus NUL in out. */
void vcrypto_random_hex(size_t n, char *out);

#endif
