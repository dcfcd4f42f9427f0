/* Request signatures: building the signed message, the Authorization
 * header's strict grammar, and verification against key and clock. */
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "crypto/crypto.h"

/* Hashes the canonical message with BLAKE2b-512 streaming and signs that
 * digest, so a large body is never copied into one message buffer. The
 * message is framed with newlines; method, path and nonce cannot contain
 * one (the parser and HTTP layer refuse them), so fields cannot be shifted
 * across boundaries. */
static int message_digest(const char *method, const char *path_query, int64_t ts,
                          const char *nonce, const uint8_t *body, size_t body_len,
                          uint8_t out[crypto_generichash_BYTES_MAX]) {
    if (strchr(method, '\n') || strchr(path_query, '\n') || strchr(nonce, '\n'))
        return VL_EINVAL;
    char body_hex[CRYPTO_HASH_HEX + 1];
    crypto_hash_hex(body ? (const void *)body : (const void *)"", body ? body_len : 0, body_hex);
    char head[64];
    int n = snprintf(head, sizeof head, "\n%lld\n", (long long)ts);
    if (n < 0 || (size_t)n >= sizeof head) return VL_EINVAL;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, crypto_generichash_BYTES_MAX);
    crypto_generichash_update(&st, (const uint8_t *)"VOLLEY1\n", 8);
    crypto_generichash_update(&st, (const uint8_t *)method, strlen(method));
    crypto_generichash_update(&st, (const uint8_t *)"\n", 1);
    crypto_generichash_update(&st, (const uint8_t *)path_query, strlen(path_query));
    crypto_generichash_update(&st, (const uint8_t *)head, (size_t)n);
    crypto_generichash_update(&st, (const uint8_t *)nonce, strlen(nonce));
    crypto_generichash_update(&st, (const uint8_t *)"\n", 1);
    crypto_generichash_update(&st, (const uint8_t *)body_hex, CRYPTO_HASH_HEX);
    crypto_generichash_final(&st, out, crypto_generichash_BYTES_MAX);
    return VL_OK;
}

int crypto_sign_request(const crypto_identity *id, int64_t peer_id, const char *method,
                        const char *path_query, const uint8_t *body, size_t body_len,
                        int64_t ts, char *out, size_t cap) {
    char nonce[CRYPTO_NONCE_HEX + 1];
    crypto_random_hex(CRYPTO_NONCE_HEX / 2, nonce);
    uint8_t digest[crypto_generichash_BYTES_MAX];
    if (message_digest(method, path_query, ts, nonce, body, body_len, digest) != VL_OK)
        return VL_EINVAL;
    uint8_t sig[CRYPTO_SIG_BYTES];
    crypto_sign_detached(sig, NULL, digest, sizeof digest, id->sk);
    char sig_b64[96];
    base64_encode(sig, sizeof sig, sig_b64);
    int n = snprintf(out, cap, CRYPTO_AUTH_SCHEME " peer=%lld,ts=%lld,nonce=%s,sig=%s",
                     (long long)peer_id, (long long)ts, nonce, sig_b64);
    return (n < 0 || (size_t)n >= cap) ? VL_ETOOBIG : VL_OK;
}

/* Reads "<name>=<value>" up to the delimiter; value must be non-empty. */
static const char *field(const char *p, const char *name, char delim, char *val, size_t cap) {
    size_t nl = strlen(name);
    if (strncmp(p, name, nl) != 0 || p[nl] != '=') return NULL;
    p += nl + 1;
    size_t i = 0;
    while (p[i] && p[i] != delim) {
        if (i + 1 >= cap) return NULL;
        val[i] = p[i];
        i++;
    }
    if (i == 0) return NULL;
    val[i] = '\0';
    if (delim && p[i] != delim) return NULL;
    return p[i] ? p + i + 1 : p + i;
}

int crypto_auth_parse(const char *value, crypto_auth_header *out, vl_error *err) {
    if (!value) return vl_fail(err, VL_EINVAL, "missing Authorization header");
    if (strnlen(value, CRYPTO_AUTH_MAX + 1) > CRYPTO_AUTH_MAX)
        return vl_fail(err, VL_EINVAL, "Authorization header too long");
    size_t sl = strlen(CRYPTO_AUTH_SCHEME);
    if (strncmp(value, CRYPTO_AUTH_SCHEME, sl) != 0 || value[sl] != ' ')
        return vl_fail(err, VL_EINVAL, "Authorization scheme must be " CRYPTO_AUTH_SCHEME);
    const char *p = value + sl + 1;
    char v[128];
    memset(out, 0, sizeof *out);
    if (!(p = field(p, "peer", ',', v, sizeof v)) || parse_i64(v, 0, INT64_MAX, &out->peer_id))
        return vl_fail(err, VL_EINVAL, "Authorization: bad peer field");
    if (!(p = field(p, "ts", ',', v, sizeof v)) || parse_i64(v, 0, INT64_MAX, &out->ts))
        return vl_fail(err, VL_EINVAL, "Authorization: bad ts field");
    if (!(p = field(p, "nonce", ',', v, sizeof v)) || strlen(v) != CRYPTO_NONCE_HEX)
        return vl_fail(err, VL_EINVAL, "Authorization: nonce must be %d hex digits",
                       CRYPTO_NONCE_HEX);
    uint8_t raw[CRYPTO_NONCE_HEX / 2];
    if (hex_decode(v, CRYPTO_NONCE_HEX, raw, sizeof raw) != 0)
        return vl_fail(err, VL_EINVAL, "Authorization: nonce must be hex");
    hex_encode(raw, sizeof raw, out->nonce); /* canonical lowercase for the cache */
    if (!(p = field(p, "sig", '\0', v, sizeof v)) || *p != '\0')
        return vl_fail(err, VL_EINVAL, "Authorization: bad sig field");
    uint8_t sig[CRYPTO_SIG_BYTES + 4];
    if (base64_decode(v, strlen(v), sig, sizeof sig) != CRYPTO_SIG_BYTES)
        return vl_fail(err, VL_EINVAL, "Authorization: sig must be base64 of 64 bytes");
    memcpy(out->sig, sig, CRYPTO_SIG_BYTES);
    return VL_OK;
}

int crypto_verify_request(const uint8_t pk[CRYPTO_PK_BYTES], const crypto_auth_header *auth,
                          const char *method, const char *path_query, const uint8_t *body,
                          size_t body_len, int64_t now, vl_error *err) {
    int64_t d = auth->ts - now;
    if (d > CRYPTO_TS_WINDOW_S || d < -CRYPTO_TS_WINDOW_S)
        return vl_fail(err, VL_EAUTH, "request timestamp is %lld s away from the server clock",
                       (long long)d);
    uint8_t digest[crypto_generichash_BYTES_MAX];
    if (message_digest(method, path_query, auth->ts, auth->nonce, body, body_len, digest))
        return vl_fail(err, VL_EAUTH, "request cannot be signed");
    if (crypto_sign_verify_detached(auth->sig, digest, sizeof digest, pk) != 0)
        return vl_fail(err, VL_EAUTH, "signature does not verify");
    return VL_OK;
}

/* ---- key rotation ------------------------------------------------------ */

/* The rotation message; its fields are fixed-length or digits, so the
 * newline framing cannot be shifted. */
static size_t rotation_message(int64_t peer_id, const uint8_t old_pk[CRYPTO_PK_BYTES],
                               const uint8_t new_pk[CRYPTO_PK_BYTES], char *out, size_t cap) {
    char a[CRYPTO_PK_B64_LEN + 1], b[CRYPTO_PK_B64_LEN + 1];
    crypto_pk_encode(old_pk, a);
    crypto_pk_encode(new_pk, b);
    int n = snprintf(out, cap, "VOLLEY1-ROTATE\n%lld\n%s\n%s", (long long)peer_id, a, b);
    return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

void crypto_rotation_sign(const crypto_identity *new_id, int64_t peer_id,
                          const uint8_t old_pk[CRYPTO_PK_BYTES], char *out) {
    char msg[160];
    size_t n = rotation_message(peer_id, old_pk, new_id->pk, msg, sizeof msg);
    uint8_t sig[CRYPTO_SIG_BYTES];
    crypto_sign_detached(sig, NULL, (const uint8_t *)msg, n, new_id->sk);
    base64_encode(sig, sizeof sig, out);
}

int crypto_rotation_verify(const uint8_t new_pk[CRYPTO_PK_BYTES], int64_t peer_id,
                           const uint8_t old_pk[CRYPTO_PK_BYTES], const char *proof,
                           vl_error *err) {
    uint8_t sig[CRYPTO_SIG_BYTES + 4];
    size_t plen = strnlen(proof, CRYPTO_SIG_B64_LEN + 1);
    if (plen != CRYPTO_SIG_B64_LEN || base64_decode(proof, plen, sig, sizeof sig) !=
                                          CRYPTO_SIG_BYTES)
        return vl_fail(err, VL_EINVAL, "proof must be base64 of 64 bytes");
    char msg[160];
    size_t n = rotation_message(peer_id, old_pk, new_pk, msg, sizeof msg);
    if (n == 0 || crypto_sign_verify_detached(sig, (const uint8_t *)msg, n, new_pk) != 0)
        return vl_fail(err, VL_EAUTH, "the proof is not the new key's signature of this "
                                      "rotation");
    return VL_OK;
}
