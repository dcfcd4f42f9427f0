/* Key pairs on disk and in base64. The key file holds only the 64-byte
 * libsodium secret key (whose second half is the public key), base64
 * encoded under a versioned first line so a future format can be told
 * apart. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include <sodium.h>

#include "crypto/crypto.h"

#define KEY_FILE_MAGIC "volley-ed25519-secret-key v1\n"

int vcrypto_init(void) {
    return sodium_init() < 0 ? VL_ERR : VL_OK;
}

void vcrypto_identity_generate(vcrypto_identity *id) {
    crypto_sign_keypair(id->pk, id->sk);
}

void vcrypto_identity_wipe(vcrypto_identity *id) {
    sodium_memzero(id, sizeof *id);
}

int vcrypto_identity_save(const vcrypto_identity *id, const char *path, int overwrite,
                          vl_error *err) {
    struct stat st;
    if (!overwrite && stat(path, &st) == 0)
        return vl_fail(err, VL_ECONFLICT, "%s already exists; refusing to replace a key", path);
    char text[sizeof KEY_FILE_MAGIC + 100];
    size_t m = sizeof KEY_FILE_MAGIC - 1;
    memcpy(text, KEY_FILE_MAGIC, m);
    vl_base64_encode(id->sk, VCRYPTO_SK_BYTES, text + m);
    size_t n = strlen(text);
    text[n++] = '\n';
    int rc = vl_file_write_atomic(path, text, n, 0600, err);
    sodium_memzero(text, sizeof text);
    return rc;
}

int vcrypto_identity_load(vcrypto_identity *id, const char *path, vl_error *err) {
    struct stat st;
    if (stat(path, &st) != 0)
        return vl_fail(err, VL_ENOTFOUND, "cannot open key file %s: %s", path, strerror(errno));
    if (st.st_mode & 077)
        return vl_fail(err, VL_EINVAL,
                       "key file %s is readable by other users (mode %03o); chmod 600 it", path,
                       (unsigned)(st.st_mode & 0777));
    vl_buf b;
    vl_buf_init(&b, 4096);
    int rc = vl_buf_read_file(&b, path, err);
    if (rc != VL_OK) {
        vl_buf_free(&b);
        return rc;
    }
    size_t m = sizeof KEY_FILE_MAGIC - 1;
    rc = vl_fail(err, VL_EINVAL, "key file %s is not a volley key", path);
    if (b.len > m && memcmp(b.data, KEY_FILE_MAGIC, m) == 0) {
        size_t n = b.len - m;
        const char *p = (const char *)b.data + m;
        while (n > 0 && (p[n - 1] == '\n' || p[n - 1] == '\r')) n--;
        uint8_t sk[VCRYPTO_SK_BYTES + 8];
        uint8_t seed[crypto_sign_SEEDBYTES], pk[VCRYPTO_PK_BYTES], sk2[VCRYPTO_SK_BYTES];
        long got = vl_base64_decode(p, n, sk, sizeof sk);
        if (got == VCRYPTO_SK_BYTES) {
            /* The stored public half must be the one the seed derives;
             * libsodium's sk_to_pk only copies it, so derive afresh. */
            if (crypto_sign_ed25519_sk_to_seed(seed, sk) == 0 &&
                crypto_sign_seed_keypair(pk, sk2, seed) == 0 &&
                vcrypto_equal(pk, sk + 32, VCRYPTO_PK_BYTES)) {
                memcpy(id->sk, sk2, VCRYPTO_SK_BYTES);
                memcpy(id->pk, pk, VCRYPTO_PK_BYTES);
                rc = VL_OK;
            } else {
                rc = vl_fail(err, VL_EINVAL, "key file %s is corrupt", path);
            }
        }
        sodium_memzero(sk, sizeof sk);
        sodium_memzero(seed, sizeof seed);
        sodium_memzero(sk2, sizeof sk2);
    }
    sodium_memzero(b.data, b.len);
    vl_buf_free(&b);
    return rc;
}

void vcrypto_pk_encode(const uint8_t pk[VCRYPTO_PK_BYTES], char *out) {
    vl_base64_encode(pk, VCRYPTO_PK_BYTES, out);
}

int vcrypto_pk_decode(const char *b64, uint8_t pk[VCRYPTO_PK_BYTES]) {
    size_t n = strnlen(b64, VCRYPTO_PK_B64_LEN + 1);
    if (n != VCRYPTO_PK_B64_LEN) return VL_EINVAL;
    uint8_t tmp[VCRYPTO_PK_BYTES + 4];
    if (vl_base64_decode(b64, n, tmp, sizeof tmp) != VCRYPTO_PK_BYTES) return VL_EINVAL;
    memcpy(pk, tmp, VCRYPTO_PK_BYTES);
    return VL_OK;
}

void vcrypto_token_generate(char *out) {
    uint8_t r[32];
    randombytes_buf(r, sizeof r);
    memcpy(out, "vlt_", 4);
    vl_hex_encode(r, sizeof r, out + 4);
    sodium_memzero(r, sizeof r);
}

void vcrypto_hash_hex(const void *data, size_t len, char *out) {
    uint8_t h[32];
    crypto_generichash(h, sizeof h, data, len, NULL, 0);
    vl_hex_encode(h, sizeof h, out);
}

int vcrypto_equal(const void *a, const void *b, size_t n) {
    return sodium_memcmp(a, b, n) == 0;
}

void vcrypto_random_hex(size_t n, char *out) {
    uint8_t r[64];
    while (n > 0) {
        size_t k = n < sizeof r ? n : sizeof r;
        randombytes_buf(r, k);
        vl_hex_encode(r, k, out);
        out += 2 * k;
        n -= k;
    }
    *out = '\0';
}
