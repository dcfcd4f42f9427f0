/* Identity and request authentication besides the signatures (which are
 * test_httpsig.c's): RFC 9530 digests, the replay cache, key files,
 * tokens and rotation proofs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "crypto/crypto.h"

#define NOW 1790000000

static int setup(void **state) {
    (void)state;
    return vcrypto_init();
}

static void test_digests(void **state) {
    (void)state;
    vcrypto_digest_want w;
    vl_error e = {0};
    char d[VCRYPTO_DIGEST_HEADER_MAX];
    assert_int_equal(vcrypto_content_digest("abc", 3, d, sizeof d), VL_OK);
    assert_int_equal(vcrypto_digest_parse(d, &w, &e), VL_OK);
    assert_int_equal(w.alg, VCRYPTO_DIGEST_SHA256);
    assert_int_equal(w.len, 32);
    /* Streaming in pieces gives the one-shot digest. */
    vcrypto_digest *c = vcrypto_digest_new(VCRYPTO_DIGEST_SHA256);
    assert_non_null(c);
    vcrypto_digest_update(c, "a", 1);
    vcrypto_digest_update(c, "bc", 2);
    uint8_t got[VCRYPTO_DIGEST_MAX];
    assert_int_equal(vcrypto_digest_final(c, got), 32);
    assert_memory_equal(got, w.bytes, 32);
    assert_int_equal(vcrypto_digest_reset(c, VCRYPTO_DIGEST_SHA512), VL_OK);
    vcrypto_digest_update(c, "abc", 3);
    assert_int_equal(vcrypto_digest_final(c, got), 64);
    vcrypto_digest_free(c);
    /* sha-512 alone, and sha-256 preferred when both are given. */
    char b64[100], both[400];
    vl_base64_encode(got, 64, b64);
    snprintf(both, sizeof both, "sha-512=:%s:", b64);
    assert_int_equal(vcrypto_digest_parse(both, &w, &e), VL_OK);
    assert_int_equal(w.alg, VCRYPTO_DIGEST_SHA512);
    int nb = snprintf(both, sizeof both, "md5=:AAAA:, sha-512=:%.90s:, %.60s", b64, d);
    assert_true(nb > 0 && (size_t)nb < sizeof both);
    assert_int_equal(vcrypto_digest_parse(both, &w, &e), VL_OK);
    assert_int_equal(w.alg, VCRYPTO_DIGEST_SHA256);
    /* Members of other algorithms are skipped whatever they hold. */
    nb = snprintf(both, sizeof both, "unixsum, md5=\"x\";a=1, crc=(1 2), %s", d);
    assert_true(nb > 0 && (size_t)nb < sizeof both);
    assert_int_equal(vcrypto_digest_parse(both, &w, &e), VL_OK);
    assert_int_equal(w.alg, VCRYPTO_DIGEST_SHA256);
    char longd[VCRYPTO_DIGEST_HEADER_MAX + 8];
    nb = snprintf(longd, sizeof longd, "x=%0*d, %s", VCRYPTO_DIGEST_HEADER_MAX - 4 - (int)strlen(d),
                  0, d);
    assert_int_equal(nb, VCRYPTO_DIGEST_HEADER_MAX); /* one byte over the cap */
    /* A bare sha-256 (a boolean) is malformed, not merely ignored. */
    nb = snprintf(both, sizeof both, "sha-256, sha-512=:%.90s:", b64);
    assert_true(nb > 0 && (size_t)nb < sizeof both);
    assert_int_equal(vcrypto_digest_parse(both, &w, &e), VL_EINVAL);
    const char *bad[] = {"",
                         "sha-256",
                         "sha-256=:AAAA:",
                         "md5=:AAAA:",
                         "sha-256=abc",
                         "SHA-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:",
                         "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE:", /* unpadded */
                         "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:,",
                         "sha-512=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:", /* 32 bytes */
                         "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=: x",
                         longd,
                         NULL};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e.msg[0] = '\0';
        if (vcrypto_digest_parse(bad[i], &w, &e) != VL_EINVAL)
            fail_msg("accepted Content-Digest %s", bad[i] ? bad[i] : "(null)");
        assert_true(e.msg[0] != '\0');
    }
    /* Streaming a large body in uneven pieces gives the one-shot digest,
     * checked against libsodium's independent SHA-256 and SHA-512. */
    size_t big_len = 1 << 20;
    uint8_t *big = malloc(big_len);
    assert_non_null(big);
    for (size_t i = 0; i < big_len; i++) big[i] = (uint8_t)(i * 31 + (i >> 9));
    uint8_t ref256[32], ref512[64];
    crypto_hash_sha256(ref256, big, big_len);
    crypto_hash_sha512(ref512, big, big_len);
    const vcrypto_digest_alg algs[] = {VCRYPTO_DIGEST_SHA256, VCRYPTO_DIGEST_SHA512};
    c = vcrypto_digest_new(VCRYPTO_DIGEST_SHA256);
    assert_non_null(c);
    for (size_t a = 0; a < 2; a++) {
        assert_int_equal(vcrypto_digest_reset(c, algs[a]), VL_OK);
        for (size_t at = 0, step = 1; at < big_len; at += step, step = step * 3 + 1) {
            size_t n = step < big_len - at ? step : big_len - at;
            vcrypto_digest_update(c, big + at, n);
            vcrypto_digest_update(c, NULL, 0);
        }
        assert_int_equal(vcrypto_digest_final(c, got), a == 0 ? 32 : 64);
        assert_memory_equal(got, a == 0 ? ref256 : ref512, a == 0 ? 32 : 64);
    }
    vcrypto_digest_free(c);
    vcrypto_digest_free(NULL);
    char one[VCRYPTO_DIGEST_HEADER_MAX];
    assert_int_equal(vcrypto_content_digest(big, big_len, one, sizeof one), VL_OK);
    assert_int_equal(vcrypto_digest_parse(one, &w, &e), VL_OK);
    assert_memory_equal(w.bytes, ref256, 32);
    assert_int_equal(vcrypto_content_digest(big, big_len, one, 20), VL_ETOOBIG);
    free(big);
    /* The empty body's digest is SHA-256 of nothing. */
    assert_int_equal(vcrypto_content_digest(NULL, 0, one, sizeof one), VL_OK);
    assert_string_equal(one, "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:");
    /* Nonce keys: fixed-size lowercase hex, stable, distinct. */
    char k1[VCRYPTO_NONCE_HEX + 1], k2[VCRYPTO_NONCE_HEX + 1], k3[VCRYPTO_NONCE_HEX + 1];
    vcrypto_nonce_key("0123456789abcdef", k1);
    vcrypto_nonce_key("0123456789abcdef", k2);
    vcrypto_nonce_key("0123456789abcdeF", k3);
    assert_string_equal(k1, k2);
    assert_string_not_equal(k1, k3);
    assert_int_equal(strspn(k1, "0123456789abcdef"), VCRYPTO_NONCE_HEX);
    assert_int_equal(strlen(k1), VCRYPTO_NONCE_HEX);
    /* hex of the first 16 bytes of SHA-256("0123456789abcdef"). */
    assert_string_equal(k1, "9f9f5111f7b27a781f1f1ddde5ebc2dd");
}

static void test_nonce_replay(void **state) {
    (void)state;
    vcrypto_nonce_cache *c = vcrypto_nonce_cache_new(1024, VCRYPTO_TS_WINDOW_S);
    assert_non_null(c);
    const char *n1 = "00112233445566778899aabbccddeeff";
    const char *n2 = "ffeeddccbbaa99887766554433221100";
    assert_int_equal(vcrypto_nonce_check(c, 1, n1, NOW, NOW), VL_OK);
    assert_int_equal(vcrypto_nonce_check(c, 1, n1, NOW, NOW + 10), VL_ECONFLICT);
    assert_int_equal(vcrypto_nonce_check(c, 2, n1, NOW, NOW), VL_OK); /* other peer */
    assert_int_equal(vcrypto_nonce_check(c, 1, n2, NOW, NOW), VL_OK);
    /* Still remembered at the edge of the window, forgettable after. */
    assert_int_equal(vcrypto_nonce_check(c, 1, n1, NOW, NOW + VCRYPTO_TS_WINDOW_S), VL_ECONFLICT);
    vcrypto_nonce_cache_free(c);
}

/* A nonce is live until its own created + window, and a created may be a
 * window ahead: a table full of such nonces is still full a window after
 * the clock passed them, and reusable only after their expiry. */
static void test_nonce_cache_future_created(void **state) {
    (void)state;
    vcrypto_nonce_cache *c = vcrypto_nonce_cache_new(1024, VCRYPTO_TS_WINDOW_S);
    assert_non_null(c);
    char nonce[VCRYPTO_NONCE_HEX + 1];
    const int64_t created = NOW + VCRYPTO_TS_WINDOW_S;
    int full = 0;
    for (int i = 0; i < 5000; i++) {
        vcrypto_random_hex(VCRYPTO_NONCE_HEX / 2, nonce);
        full += vcrypto_nonce_check(c, 1, nonce, created, NOW) == VL_ETOOBIG;
    }
    assert_true(full > 0);
    vcrypto_random_hex(VCRYPTO_NONCE_HEX / 2, nonce);
    int64_t expiry = created + VCRYPTO_TS_WINDOW_S;
    assert_int_equal(vcrypto_nonce_check(c, 1, nonce, expiry, expiry), VL_ETOOBIG);
    assert_int_equal(vcrypto_nonce_check(c, 1, nonce, expiry + 1, expiry + 1), VL_OK);
    vcrypto_nonce_cache_free(c);
}

static void test_nonce_cache_bounded(void **state) {
    (void)state;
    vcrypto_nonce_cache *c = vcrypto_nonce_cache_new(1024, VCRYPTO_TS_WINDOW_S);
    assert_non_null(c);
    char nonce[VCRYPTO_NONCE_HEX + 1];
    int full = 0, ok = 0;
    for (int i = 0; i < 5000; i++) {
        vcrypto_random_hex(VCRYPTO_NONCE_HEX / 2, nonce);
        int rc = vcrypto_nonce_check(c, 1, nonce, NOW, NOW);
        if (rc == VL_OK)
            ok++;
        else if (rc == VL_ETOOBIG)
            full++;
        else
            fail();
    }
    /* At most the table's slots can be live; the rest are refused, never
     * silently evicted. */
    assert_true(ok <= 1024);
    assert_true(full >= 5000 - 1024);
    /* Once the window has passed, slots are reused. */
    vcrypto_random_hex(VCRYPTO_NONCE_HEX / 2, nonce);
    assert_int_equal(vcrypto_nonce_check(c, 1, nonce, NOW + 2 * VCRYPTO_TS_WINDOW_S,
                                         NOW + 2 * VCRYPTO_TS_WINDOW_S),
                     VL_OK);
    vcrypto_nonce_cache_free(c);
}

static void test_key_file(void **state) {
    (void)state;
    char dir[] = "/tmp/volley-crypto-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/peer.key", dir);
    vcrypto_identity id, back;
    vcrypto_identity_generate(&id);
    vl_error e = {0};
    /* 0600 whatever the umask, looser or stricter. */
    const mode_t masks[] = {0, 0277, 022};
    struct stat st;
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        mode_t old = umask(masks[i]);
        int rc = vcrypto_identity_save(&id, path, 1, &e);
        umask(old);
        assert_int_equal(rc, VL_OK);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
    }
    assert_int_equal(vcrypto_identity_save(&id, path, 0, &e), VL_ECONFLICT);
    assert_int_equal(vcrypto_identity_load(&back, path, &e), VL_OK);
    assert_memory_equal(id.pk, back.pk, VCRYPTO_PK_BYTES);
    assert_memory_equal(id.sk, back.sk, VCRYPTO_SK_BYTES);
    /* A world-readable key is refused. */
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(vcrypto_identity_load(&back, path, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "chmod 600"));
    /* A corrupted key is refused. */
    assert_int_equal(chmod(path, 0600), 0);
    /* Replace one base64 character of the seed by a different one (a
     * fixed replacement would sometimes equal what was there). */
    FILE *f = fopen(path, "r+");
    assert_non_null(f);
    assert_int_equal(fseek(f, 40, SEEK_SET), 0);
    int was = fgetc(f);
    assert_int_equal(fseek(f, 40, SEEK_SET), 0);
    fputc(was == 'A' ? 'B' : 'A', f);
    fclose(f);
    assert_int_not_equal(vcrypto_identity_load(&back, path, &e), VL_OK);
    unlink(path);
    rmdir(dir);
}

static void test_tokens_and_keys(void **state) {
    (void)state;
    char t1[VCRYPTO_TOKEN_LEN + 1], t2[VCRYPTO_TOKEN_LEN + 1];
    vcrypto_token_generate(t1);
    vcrypto_token_generate(t2);
    assert_int_equal(strlen(t1), VCRYPTO_TOKEN_LEN);
    assert_memory_equal(t1, "vlt_", 4);
    assert_string_not_equal(t1, t2);
    char h1[VCRYPTO_HASH_HEX + 1], h2[VCRYPTO_HASH_HEX + 1];
    vcrypto_hash_hex(t1, strlen(t1), h1);
    vcrypto_hash_hex(t1, strlen(t1), h2);
    assert_string_equal(h1, h2);
    assert_int_equal(strlen(h1), VCRYPTO_HASH_HEX);
    /* BLAKE2b-256("") golden value. */
    vcrypto_hash_hex("", 0, h1);
    assert_string_equal(h1, "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8");
    vcrypto_identity id;
    vcrypto_identity_generate(&id);
    char b64[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(id.pk, b64);
    uint8_t pk[VCRYPTO_PK_BYTES];
    assert_int_equal(vcrypto_pk_decode(b64, pk), VL_OK);
    assert_memory_equal(pk, id.pk, VCRYPTO_PK_BYTES);
    assert_int_equal(vcrypto_pk_decode("short", pk), VL_EINVAL);
    b64[5] = '*';
    assert_int_equal(vcrypto_pk_decode(b64, pk), VL_EINVAL);
}

/* A rotation proof holds for exactly the peer, old key and new key it was
 * made for, and only the new key can make it. */
static void test_rotation_proof(void **state) {
    (void)state;
    vcrypto_identity old_id, new_id, other;
    vcrypto_identity_generate(&old_id);
    vcrypto_identity_generate(&new_id);
    vcrypto_identity_generate(&other);
    char proof[VCRYPTO_SIG_B64_LEN + 1];
    vcrypto_rotation_sign(&new_id, 7, old_id.pk, proof);
    assert_int_equal(strlen(proof), VCRYPTO_SIG_B64_LEN);
    vl_error e = {0};
    assert_int_equal(vcrypto_rotation_verify(new_id.pk, 7, old_id.pk, proof, &e), VL_OK);
    assert_int_equal(vcrypto_rotation_verify(new_id.pk, 8, old_id.pk, proof, &e), VL_EAUTH);
    assert_int_equal(vcrypto_rotation_verify(new_id.pk, 7, other.pk, proof, &e), VL_EAUTH);
    assert_int_equal(vcrypto_rotation_verify(other.pk, 7, old_id.pk, proof, &e), VL_EAUTH);
    /* Signed by the old key instead of the new one. */
    char wrong[VCRYPTO_SIG_B64_LEN + 1];
    vcrypto_rotation_sign(&old_id, 7, old_id.pk, wrong);
    assert_int_equal(vcrypto_rotation_verify(new_id.pk, 7, old_id.pk, wrong, &e), VL_EAUTH);
    /* A request signature by the new key is not a rotation proof. */
    vcrypto_signed_headers h;
    assert_int_equal(vcrypto_sign_http(&new_id, "7", "GET", "/v1/task", 0, NULL, 0, NOW, &h),
                     VL_OK);
    char reqsig[VCRYPTO_SIG_B64_LEN + 1];
    memcpy(reqsig, h.signature + strlen("sig1=:"), VCRYPTO_SIG_B64_LEN);
    reqsig[VCRYPTO_SIG_B64_LEN] = '\0';
    assert_int_equal(vcrypto_rotation_verify(new_id.pk, 7, old_id.pk, reqsig, &e), VL_EAUTH);
    /* Malformed proofs. */
    assert_int_equal(vcrypto_rotation_verify(new_id.pk, 7, old_id.pk, "", &e), VL_EINVAL);
    assert_int_equal(vcrypto_rotation_verify(new_id.pk, 7, old_id.pk, "abc", &e), VL_EINVAL);
    char longer[VCRYPTO_SIG_B64_LEN + 8];
    snprintf(longer, sizeof longer, "%sAAAA", proof);
    assert_int_equal(vcrypto_rotation_verify(new_id.pk, 7, old_id.pk, longer, &e), VL_EINVAL);
    char flipped[VCRYPTO_SIG_B64_LEN + 1];
    memcpy(flipped, proof, sizeof flipped);
    flipped[10] = flipped[10] == 'A' ? 'B' : 'A';
    assert_int_equal(vcrypto_rotation_verify(new_id.pk, 7, old_id.pk, flipped, &e), VL_EAUTH);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digests),
        cmocka_unit_test(test_nonce_replay),
        cmocka_unit_test(test_nonce_cache_bounded),
        cmocka_unit_test(test_nonce_cache_future_created),
        cmocka_unit_test(test_key_file),
        cmocka_unit_test(test_tokens_and_keys),
        cmocka_unit_test(test_rotation_proof),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
