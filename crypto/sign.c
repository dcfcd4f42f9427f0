/* Key rotation proofs: the new key's signature binding a peer, its old
 * key and its new one. */
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "crypto/crypto.h"

/* ---- key rotation ------------------------------------------------------ */

/* The rotation message; its fields are fixed-length or digits, so the
 * newline framing cannot be shifted. */
static size_t rotation_message(int64_t peer_id, const uint8_t old_pk[VCRYPTO_PK_BYTES],
                               const uint8_t new_pk[VCRYPTO_PK_BYTES], char *out, size_t cap) {
    char a[VCRYPTO_PK_B64_LEN + 1], b[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(old_pk, a);
    vcrypto_pk_encode(new_pk, b);
    int n = snprintf(out, cap, "VOLLEY1-ROTATE\n%lld\n%s\n%s", (long long)peer_id, a, b);
    return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

void vcrypto_rotation_sign(const vcrypto_identity *new_id, int64_t peer_id,
                           const uint8_t old_pk[VCRYPTO_PK_BYTES], char *out) {
    char msg[160];
    size_t n = rotation_message(peer_id, old_pk, new_id->pk, msg, sizeof msg);
    uint8_t sig[VCRYPTO_SIG_BYTES];
    crypto_sign_detached(sig, NULL, (const uint8_t *)msg, n, new_id->sk);
    vl_base64_encode(sig, sizeof sig, out);
}

int vcrypto_rotation_verify(const uint8_t new_pk[VCRYPTO_PK_BYTES], int64_t peer_id,
                            const uint8_t old_pk[VCRYPTO_PK_BYTES], const char *proof,
                            vl_error *err) {
    uint8_t sig[VCRYPTO_SIG_BYTES + 4];
    size_t plen = strnlen(proof, VCRYPTO_SIG_B64_LEN + 1);
    if (plen != VCRYPTO_SIG_B64_LEN ||
        vl_base64_decode(proof, plen, sig, sizeof sig) != VCRYPTO_SIG_BYTES)
        return vl_fail(err, VL_EINVAL, "proof must be base64 of 64 bytes");
    char msg[160];
    size_t n = rotation_message(peer_id, old_pk, new_pk, msg, sizeof msg);
    if (n == 0 || crypto_sign_verify_detached(sig, (const uint8_t *)msg, n, new_pk) != 0)
        return vl_fail(err, VL_EAUTH,
                       "the proof is not the new key's signature of this "
                       "rotation");
    return VL_OK;
}
