/* Request signing and verification: every way a request can be altered or
 * replayed must fail, and an honest one must pass. */
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

#include "crypto/crypto.h"

static const uint8_t BODY[] = "{\"hello\":\"world\"}";
#define NOW 1790000000

static int setup(void **state) {
    (void)state;
    return crypto_init();
}

static void sign_ok(const crypto_identity *id, char *hdr, size_t cap) {
    assert_int_equal(crypto_sign_request(id, 7, "POST", "/v1/updates?x=1", BODY, sizeof BODY - 1,
                                         NOW, hdr, cap),
                     VL_OK);
}

static int verify(const crypto_identity *id, const char *hdr, const char *method,
                  const char *path, const uint8_t *body, size_t len, int64_t now) {
    crypto_auth_header a;
    vl_error e = {0};
    if (crypto_auth_parse(hdr, &a, &e) != VL_OK) return VL_EINVAL;
    return crypto_verify_request(id->pk, &a, method, path, body, len, now, &e);
}

static void test_honest_request_verifies(void **state) {
    (void)state;
    crypto_identity id;
    crypto_identity_generate(&id);
    char hdr[CRYPTO_AUTH_MAX];
    sign_ok(&id, hdr, sizeof hdr);
    crypto_auth_header a;
    vl_error e = {0};
    assert_int_equal(crypto_auth_parse(hdr, &a, &e), VL_OK);
    assert_int_equal(a.peer_id, 7);
    assert_int_equal(a.ts, NOW);
    assert_int_equal(verify(&id, hdr, "POST", "/v1/updates?x=1", BODY, sizeof BODY - 1, NOW),
                     VL_OK);
    /* Inside the window on either side. */
    assert_int_equal(verify(&id, hdr, "POST", "/v1/updates?x=1", BODY, sizeof BODY - 1,
                            NOW + CRYPTO_TS_WINDOW_S), VL_OK);
    assert_int_equal(verify(&id, hdr, "POST", "/v1/updates?x=1", BODY, sizeof BODY - 1,
                            NOW - CRYPTO_TS_WINDOW_S), VL_OK);
}

static void test_tampering_rejected(void **state) {
    (void)state;
    crypto_identity id, other;
    crypto_identity_generate(&id);
    crypto_identity_generate(&other);
    char hdr[CRYPTO_AUTH_MAX];
    sign_ok(&id, hdr, sizeof hdr);
    uint8_t body[sizeof BODY];
    memcpy(body, BODY, sizeof BODY);
    body[3] ^= 1;
    const char *P = "/v1/updates?x=1";
    size_t n = sizeof BODY - 1;
    assert_int_equal(verify(&id, hdr, "POST", P, body, n, NOW), VL_EAUTH);      /* body */
    assert_int_equal(verify(&id, hdr, "POST", P, BODY, n - 1, NOW), VL_EAUTH);  /* truncated */
    assert_int_equal(verify(&id, hdr, "GET", P, BODY, n, NOW), VL_EAUTH);       /* method */
    assert_int_equal(verify(&id, hdr, "POST", "/v1/updates?x=2", BODY, n, NOW), VL_EAUTH);
    assert_int_equal(verify(&other, hdr, "POST", P, BODY, n, NOW), VL_EAUTH);   /* wrong key */
    /* Old and future timestamps. */
    assert_int_equal(verify(&id, hdr, "POST", P, BODY, n, NOW + CRYPTO_TS_WINDOW_S + 1),
                     VL_EAUTH);
    assert_int_equal(verify(&id, hdr, "POST", P, BODY, n, NOW - CRYPTO_TS_WINDOW_S - 1),
                     VL_EAUTH);
    /* Changing the claimed peer or ts in the header breaks the signature or
     * the binding: ts is signed. */
    char forged[CRYPTO_AUTH_MAX];
    const char *ts = strstr(hdr, "ts=");
    assert_non_null(ts);
    snprintf(forged, sizeof forged, "%.*sts=%d%s", (int)(ts - hdr), hdr, NOW + 1,
             strchr(ts, ','));
    assert_int_equal(verify(&id, forged, "POST", P, BODY, n, NOW), VL_EAUTH);
    /* A flipped signature bit. */
    char *sig = strstr(hdr, "sig=") + 4;
    sig[0] = sig[0] == 'A' ? 'B' : 'A';
    assert_int_equal(verify(&id, hdr, "POST", P, BODY, n, NOW), VL_EAUTH);
}

static void test_header_grammar(void **state) {
    (void)state;
    crypto_auth_header a;
    vl_error e = {0};
    const char *bad[] = {
        NULL,
        "",
        "Bearer abc",
        "Volley-Ed25519",
        "Volley-Ed25519 peer=1,ts=2,nonce=00112233445566778899aabbccddeeff",
        "Volley-Ed25519 peer=x,ts=2,nonce=00112233445566778899aabbccddeeff,sig=AAAA",
        "Volley-Ed25519 peer=1,ts=-2,nonce=00112233445566778899aabbccddeeff,sig=AAAA",
        "Volley-Ed25519 peer=1,ts=2,nonce=0011,sig=AAAA",
        "Volley-Ed25519 peer=1,ts=2,nonce=zz112233445566778899aabbccddeeff,sig=AAAA",
        "Volley-Ed25519 ts=2,peer=1,nonce=00112233445566778899aabbccddeeff,sig=AAAA",
        "Volley-Ed25519 peer=1,ts=2,nonce=00112233445566778899aabbccddeeff,sig=AAAA",
        "Volley-Ed25519 peer=1,ts=2,nonce=00112233445566778899aabbccddeeff,sig=",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(crypto_auth_parse(bad[i], &a, &e), VL_EINVAL);
    char longhdr[CRYPTO_AUTH_MAX + 64];
    memset(longhdr, 'A', sizeof longhdr - 1);
    longhdr[sizeof longhdr - 1] = '\0';
    assert_int_equal(crypto_auth_parse(longhdr, &a, &e), VL_EINVAL);
}

static void test_nonce_replay(void **state) {
    (void)state;
    crypto_nonce_cache *c = crypto_nonce_cache_new(1024, CRYPTO_TS_WINDOW_S);
    assert_non_null(c);
    const char *n1 = "00112233445566778899aabbccddeeff";
    const char *n2 = "ffeeddccbbaa99887766554433221100";
    assert_int_equal(crypto_nonce_check(c, 1, n1, NOW, NOW), VL_OK);
    assert_int_equal(crypto_nonce_check(c, 1, n1, NOW, NOW + 10), VL_ECONFLICT);
    assert_int_equal(crypto_nonce_check(c, 2, n1, NOW, NOW), VL_OK); /* other peer */
    assert_int_equal(crypto_nonce_check(c, 1, n2, NOW, NOW), VL_OK);
    /* Still remembered at the edge of the window, forgettable after. */
    assert_int_equal(crypto_nonce_check(c, 1, n1, NOW, NOW + CRYPTO_TS_WINDOW_S), VL_ECONFLICT);
    crypto_nonce_cache_free(c);
}

static void test_nonce_cache_bounded(void **state) {
    (void)state;
    crypto_nonce_cache *c = crypto_nonce_cache_new(1024, CRYPTO_TS_WINDOW_S);
    assert_non_null(c);
    char nonce[CRYPTO_NONCE_HEX + 1];
    int full = 0, ok = 0;
    for (int i = 0; i < 5000; i++) {
        crypto_random_hex(CRYPTO_NONCE_HEX / 2, nonce);
        int rc = crypto_nonce_check(c, 1, nonce, NOW, NOW);
        if (rc == VL_OK) ok++;
        else if (rc == VL_ETOOBIG) full++;
        else fail();
    }
    /* At most the table's slots can be live; the rest are refused, never
     * silently evicted. */
    assert_true(ok <= 1024);
    assert_true(full >= 5000 - 1024);
    /* Once the window has passed, slots are reused. */
    crypto_random_hex(CRYPTO_NONCE_HEX / 2, nonce);
    assert_int_equal(crypto_nonce_check(c, 1, nonce, NOW + 2 * CRYPTO_TS_WINDOW_S,
                                        NOW + 2 * CRYPTO_TS_WINDOW_S), VL_OK);
    crypto_nonce_cache_free(c);
}

static void test_key_file(void **state) {
    (void)state;
    char dir[] = "/tmp/volley-crypto-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/peer.key", dir);
    crypto_identity id, back;
    crypto_identity_generate(&id);
    vl_error e = {0};
    /* 0600 whatever the umask, looser or stricter. */
    const mode_t masks[] = {0, 0277, 022};
    struct stat st;
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        mode_t old = umask(masks[i]);
        int rc = crypto_identity_save(&id, path, 1, &e);
        umask(old);
        assert_int_equal(rc, VL_OK);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
    }
    assert_int_equal(crypto_identity_save(&id, path, 0, &e), VL_ECONFLICT);
    assert_int_equal(crypto_identity_load(&back, path, &e), VL_OK);
    assert_memory_equal(id.pk, back.pk, CRYPTO_PK_BYTES);
    assert_memory_equal(id.sk, back.sk, CRYPTO_SK_BYTES);
    /* A world-readable key is refused. */
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(crypto_identity_load(&back, path, &e), VL_EINVAL);
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
    assert_int_not_equal(crypto_identity_load(&back, path, &e), VL_OK);
    unlink(path);
    rmdir(dir);
}

static void test_tokens_and_keys(void **state) {
    (void)state;
    char t1[CRYPTO_TOKEN_LEN + 1], t2[CRYPTO_TOKEN_LEN + 1];
    crypto_token_generate(t1);
    crypto_token_generate(t2);
    assert_int_equal(strlen(t1), CRYPTO_TOKEN_LEN);
    assert_memory_equal(t1, "vlt_", 4);
    assert_string_not_equal(t1, t2);
    char h1[CRYPTO_HASH_HEX + 1], h2[CRYPTO_HASH_HEX + 1];
    crypto_hash_hex(t1, strlen(t1), h1);
    crypto_hash_hex(t1, strlen(t1), h2);
    assert_string_equal(h1, h2);
    assert_int_equal(strlen(h1), CRYPTO_HASH_HEX);
    /* BLAKE2b-256("") golden value. */
    crypto_hash_hex("", 0, h1);
    assert_string_equal(h1, "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8");
    crypto_identity id;
    crypto_identity_generate(&id);
    char b64[CRYPTO_PK_B64_LEN + 1];
    crypto_pk_encode(id.pk, b64);
    uint8_t pk[CRYPTO_PK_BYTES];
    assert_int_equal(crypto_pk_decode(b64, pk), VL_OK);
    assert_memory_equal(pk, id.pk, CRYPTO_PK_BYTES);
    assert_int_equal(crypto_pk_decode("short", pk), VL_EINVAL);
    b64[5] = '*';
    assert_int_equal(crypto_pk_decode(b64, pk), VL_EINVAL);
}

/* A rotation proof holds for exactly the peer, old key and new key it was
 * made for, and only the new key can make it. */
static void test_rotation_proof(void **state) {
    (void)state;
    crypto_identity old_id, new_id, other;
    crypto_identity_generate(&old_id);
    crypto_identity_generate(&new_id);
    crypto_identity_generate(&other);
    char proof[CRYPTO_SIG_B64_LEN + 1];
    crypto_rotation_sign(&new_id, 7, old_id.pk, proof);
    assert_int_equal(strlen(proof), CRYPTO_SIG_B64_LEN);
    vl_error e = {0};
    assert_int_equal(crypto_rotation_verify(new_id.pk, 7, old_id.pk, proof, &e), VL_OK);
    assert_int_equal(crypto_rotation_verify(new_id.pk, 8, old_id.pk, proof, &e), VL_EAUTH);
    assert_int_equal(crypto_rotation_verify(new_id.pk, 7, other.pk, proof, &e), VL_EAUTH);
    assert_int_equal(crypto_rotation_verify(other.pk, 7, old_id.pk, proof, &e), VL_EAUTH);
    /* Signed by the old key instead of the new one. */
    char wrong[CRYPTO_SIG_B64_LEN + 1];
    crypto_rotation_sign(&old_id, 7, old_id.pk, wrong);
    assert_int_equal(crypto_rotation_verify(new_id.pk, 7, old_id.pk, wrong, &e), VL_EAUTH);
    /* A request signature by the new key is not a rotation proof. */
    char hdr[CRYPTO_AUTH_MAX];
    sign_ok(&new_id, hdr, sizeof hdr);
    const char *sig = strstr(hdr, "sig=");
    assert_non_null(sig);
    assert_int_equal(crypto_rotation_verify(new_id.pk, 7, old_id.pk, sig + 4, &e), VL_EAUTH);
    /* Malformed proofs. */
    assert_int_equal(crypto_rotation_verify(new_id.pk, 7, old_id.pk, "", &e), VL_EINVAL);
    assert_int_equal(crypto_rotation_verify(new_id.pk, 7, old_id.pk, "abc", &e), VL_EINVAL);
    char longer[CRYPTO_SIG_B64_LEN + 8];
    snprintf(longer, sizeof longer, "%sAAAA", proof);
    assert_int_equal(crypto_rotation_verify(new_id.pk, 7, old_id.pk, longer, &e), VL_EINVAL);
    char flipped[CRYPTO_SIG_B64_LEN + 1];
    memcpy(flipped, proof, sizeof flipped);
    flipped[10] = flipped[10] == 'A' ? 'B' : 'A';
    assert_int_equal(crypto_rotation_verify(new_id.pk, 7, old_id.pk, flipped, &e), VL_EAUTH);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_honest_request_verifies),
        cmocka_unit_test(test_tampering_rejected),
        cmocka_unit_test(test_header_grammar),
        cmocka_unit_test(test_nonce_replay),
        cmocka_unit_test(test_nonce_cache_bounded),
        cmocka_unit_test(test_key_file),
        cmocka_unit_test(test_tokens_and_keys),
        cmocka_unit_test(test_rotation_proof),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
