/* Identity and request authentication: RFC 9421 signatures (against the
 * RFC's own example and every way a request can be altered), RFC 9530
 * digests, the replay cache, key files, tokens and rotation proofs. */
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

/* ---- RFC 9421 signatures ----------------------------------------------------- */

/* The request lookup for a signed request, as a verifier sees it. */
typedef struct signed_req {
    crypto_signed_headers h;
    crypto_http_request rq;
    char clen[24];
} signed_req;

static void sign_post(const crypto_identity *id, const char *keyid, const char *target,
                      const void *body, size_t len, int64_t created, signed_req *out) {
    memset(out, 0, sizeof *out);
    assert_int_equal(crypto_sign_http(id, keyid, "POST", target, 1, body, len, created, &out->h),
                     VL_OK);
    snprintf(out->clen, sizeof out->clen, "%zu", len);
    out->rq = (crypto_http_request){.method = "POST", .path_query = target,
                                    .content_digest = out->h.content_digest,
                                    .content_length = out->clen};
}

/* Parses the headers, builds the base from rq and verifies with pk. */
static int verify_with(const uint8_t pk[CRYPTO_PK_BYTES], const char *input, const char *sig,
                       crypto_http_request *rq) {
    crypto_sig s;
    vl_error e = {0};
    int rc = crypto_sig_parse(input, sig, &s, &e);
    if (rc != VL_OK) return rc;
    buf base;
    buf_init(&base, 1 << 16);
    rc = crypto_sig_base(&s, crypto_http_request_lookup, rq, &base, &e);
    if (rc == VL_OK) rc = crypto_sig_verify(pk, &s, &base, &e);
    buf_free(&base);
    return rc;
}

static void test_honest_request_verifies(void **state) {
    (void)state;
    crypto_identity id;
    crypto_identity_generate(&id);
    signed_req r;
    sign_post(&id, "7", "/v1/updates?x=1", BODY, sizeof BODY - 1, NOW, &r);
    crypto_sig s;
    vl_error e = {0};
    assert_int_equal(crypto_sig_parse(r.h.signature_input, r.h.signature, &s, &e), VL_OK);
    assert_string_equal(s.label, "sig1");
    assert_string_equal(s.keyid, "7");
    assert_int_equal(s.created, NOW);
    assert_int_equal(strlen(s.nonce), 32);
    assert_string_equal(s.alg, "ed25519");
    assert_int_equal(s.n_components, 5);
    assert_int_equal(verify_with(id.pk, r.h.signature_input, r.h.signature, &r.rq), VL_OK);
    /* The body's digest is RFC 9530's: sha-256 of the exact bytes. */
    char want[CRYPTO_DIGEST_HEADER_MAX];
    assert_int_equal(crypto_content_digest(BODY, sizeof BODY - 1, want, sizeof want), VL_OK);
    assert_string_equal(r.h.content_digest, want);
    /* A GET covers method, path and query only, and has no digest. */
    crypto_signed_headers g;
    assert_int_equal(crypto_sign_http(&id, "7", "GET", "/v1/task", 0, NULL, 0, NOW, &g), VL_OK);
    assert_string_equal(g.content_digest, "");
    assert_non_null(strstr(g.signature_input, "sig1=(\"@method\" \"@path\" \"@query\");created="));
    crypto_http_request rq = {.method = "GET", .path_query = "/v1/task"};
    assert_int_equal(verify_with(id.pk, g.signature_input, g.signature, &rq), VL_OK);
}

/* The base for a fixed signature: RFC 9421's layout, byte for byte. */
static void test_signature_base_layout(void **state) {
    (void)state;
    const char *input = "sig1=(\"@method\" \"@path\" \"@query\" \"content-length\");"
                        "created=1700000000;keyid=\"12\";nonce=\"0123456789abcdef\";alg=\"ed25519\"";
    char sig[200];
    uint8_t zero[64] = {0};
    char b64[CRYPTO_SIG_B64_LEN + 1];
    base64_encode(zero, sizeof zero, b64);
    snprintf(sig, sizeof sig, "sig1=:%s:", b64);
    crypto_sig s;
    vl_error e = {0};
    assert_int_equal(crypto_sig_parse(input, sig, &s, &e), VL_OK);
    crypto_http_request rq = {.method = "GET", .path_query = "/v1/model/delta?since=3",
                              .content_length = "0"};
    buf base;
    buf_init(&base, 4096);
    assert_int_equal(crypto_sig_base(&s, crypto_http_request_lookup, &rq, &base, &e), VL_OK);
    assert_int_equal(buf_append(&base, "", 1), VL_OK);
    assert_string_equal((const char *)base.data,
                        "\"@method\": GET\n\"@path\": /v1/model/delta\n\"@query\": ?since=3\n"
                        "\"content-length\": 0\n\"@signature-params\": (\"@method\" \"@path\" "
                        "\"@query\" \"content-length\");created=1700000000;keyid=\"12\";"
                        "nonce=\"0123456789abcdef\";alg=\"ed25519\"");
    /* No query at all is "?"; a missing field is an error, not an empty line. */
    rq.path_query = "/v1/model";
    rq.content_length = NULL;
    assert_int_equal(crypto_sig_base(&s, crypto_http_request_lookup, &rq, &base, &e), VL_EINVAL);
    buf_free(&base);
}

/* RFC 9421 Appendix B.2.6: the RFC's own ed25519 signature over its example
 * request, with its test key (B.1.4), verifies here. */
static const char *b26_lookup(void *arg, const char *c) {
    (void)arg;
    static const char *const kv[][2] = {
        {"date", "Tue, 20 Apr 2021 02:07:55 GMT"}, {"@method", "POST"}, {"@path", "/foo"},
        {"@authority", "example.com"}, {"content-type", "application/json"},
        {"content-length", "18"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (strcmp(kv[i][0], c) == 0) return kv[i][1];
    return NULL;
}

static void test_rfc9421_b26(void **state) {
    (void)state;
    const char *input = "sig-b26=(\"date\" \"@method\" \"@path\" \"@authority\" "
                        "\"content-type\" \"content-length\");created=1618884473;"
                        "keyid=\"test-key-ed25519\"";
    const char *sig = "sig-b26=:wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwU"
                      "Piu4A0w6vuQv5lIp5WPpBKRCw==:";
    uint8_t pk[CRYPTO_PK_BYTES];
    assert_int_equal(crypto_pk_decode("JrQLj5P/89iXES9+vFgrIy29clF9CC/oPPsw3c5D0bs=", pk), VL_OK);
    crypto_sig s;
    vl_error e = {0};
    assert_int_equal(crypto_sig_parse(input, sig, &s, &e), VL_OK);
    assert_string_equal(s.nonce, ""); /* the RFC's example has none */
    buf base;
    buf_init(&base, 4096);
    assert_int_equal(crypto_sig_base(&s, b26_lookup, NULL, &base, &e), VL_OK);
    assert_int_equal(crypto_sig_verify(pk, &s, &base, &e), VL_OK);
    /* One byte of the request changed: it no longer verifies. */
    base.data[10] ^= 1;
    assert_int_equal(crypto_sig_verify(pk, &s, &base, &e), VL_EAUTH);
    buf_free(&base);
    /* RFC 9530's example digest of {"hello": "world"}. */
    char d[CRYPTO_DIGEST_HEADER_MAX];
    assert_int_equal(crypto_content_digest("{\"hello\": \"world\"}", 18, d, sizeof d), VL_OK);
    assert_string_equal(d, "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:");
}

static void test_tampering_rejected(void **state) {
    (void)state;
    crypto_identity id, other;
    crypto_identity_generate(&id);
    crypto_identity_generate(&other);
    const char *P = "/v1/updates?x=1";
    signed_req r;
    sign_post(&id, "7", P, BODY, sizeof BODY - 1, NOW, &r);
    const char *in = r.h.signature_input, *sg = r.h.signature;
    crypto_http_request q = r.rq;
    q.method = "GET";
    assert_int_equal(verify_with(id.pk, in, sg, &q), VL_EAUTH);
    q = r.rq;
    q.path_query = "/v1/updates?x=2";
    assert_int_equal(verify_with(id.pk, in, sg, &q), VL_EAUTH);
    q.path_query = "/v1/updatez?x=1";
    assert_int_equal(verify_with(id.pk, in, sg, &q), VL_EAUTH);
    q = r.rq;
    q.content_length = "16";
    assert_int_equal(verify_with(id.pk, in, sg, &q), VL_EAUTH);
    /* Another body's digest. */
    char other_digest[CRYPTO_DIGEST_HEADER_MAX];
    assert_int_equal(crypto_content_digest("{}", 2, other_digest, sizeof other_digest), VL_OK);
    q = r.rq;
    q.content_digest = other_digest;
    assert_int_equal(verify_with(id.pk, in, sg, &q), VL_EAUTH);
    assert_int_equal(verify_with(other.pk, in, sg, &r.rq), VL_EAUTH); /* wrong key */
    /* Each parameter is signed: created, keyid and nonce changed in the input. */
    const char *swaps[][2] = {{"keyid=\"7\"", "keyid=\"8\""}, {"created=", "created=1"},
                              {"nonce=\"", "nonce=\"a"}};
    for (size_t i = 0; i < sizeof swaps / sizeof swaps[0]; i++) {
        char forged[CRYPTO_SIG_HEADER_MAX + 8];
        const char *at = strstr(in, swaps[i][0]);
        assert_non_null(at);
        snprintf(forged, sizeof forged, "%.*s%s%s", (int)(at - in), in, swaps[i][1],
                 at + strlen(swaps[i][0]));
        int rc = verify_with(id.pk, forged, sg, &r.rq);
        assert_true(rc == VL_EAUTH || rc == VL_EINVAL);
        assert_int_not_equal(rc, VL_OK);
    }
    /* A flipped signature bit. */
    char bad[sizeof r.h.signature];
    snprintf(bad, sizeof bad, "%s", sg);
    bad[7] = bad[7] == 'A' ? 'B' : 'A';
    assert_int_equal(verify_with(id.pk, in, bad, &r.rq), VL_EAUTH);
}

static void test_header_grammar(void **state) {
    (void)state;
    uint8_t zero[64] = {0};
    char b64[CRYPTO_SIG_B64_LEN + 1], sig[200], sig63[200];
    base64_encode(zero, sizeof zero, b64);
    snprintf(sig, sizeof sig, "sig1=:%s:", b64);
    base64_encode(zero, 63, b64);
    snprintf(sig63, sizeof sig63, "sig1=:%s:", b64);
    const char *ok = "sig1=(\"@method\");created=1;keyid=\"1\";nonce=\"0123456789abcdef\"";
    crypto_sig s;
    vl_error e = {0};
    assert_int_equal(crypto_sig_parse(ok, sig, &s, &e), VL_OK);
    const char *bad_inputs[] = {
        "",
        "sig1",
        "sig1=\"@method\";created=1;keyid=\"1\"",                   /* not an inner list */
        "sig1=(\"@method\");keyid=\"1\"",                           /* no created */
        "sig1=(\"@method\");created=1",                             /* no keyid */
        "sig1=(\"@method\");created=1;keyid=\"1\";foo=1",           /* unknown parameter */
        "sig1=(\"@method\";req);created=1;keyid=\"1\"",             /* component parameter */
        "sig1=(\"content-digest\";sf);created=1;keyid=\"1\"",
        "sig1=(\"@method\" \"@method\");created=1;keyid=\"1\"",     /* duplicate component */
        "sig1=(\"@method\");created=1;created=2;keyid=\"1\"",       /* duplicate parameter */
        "sig1=(\"@method\");created=1;keyid=\"1\";alg=\"rsa-pss-sha512\"",
        "sig1=(\"@method\");created=-1;keyid=\"1\"",
        "sig1=(\"@method\");created=1.5;keyid=\"1\"",
        "sig1=(\"@method\");created=1;keyid=\"1",                   /* unterminated string */
        "sig1=(\"@method\");created=1;keyid=\"1\";nonce=\"short\"",
        "sig1=(\"@Method\");created=1;keyid=\"1\"",                 /* not lowercase */
        "sig1=(\"@method\"\"@path\");created=1;keyid=\"1\"",        /* no space between */
        "sig2=(\"@method\");created=1;keyid=\"1\"",                 /* no matching Signature */
        "sig1=(\"@method\");created=1;keyid=\"1\",",                /* trailing comma */
    };
    for (size_t i = 0; i < sizeof bad_inputs / sizeof bad_inputs[0]; i++) {
        e.msg[0] = '\0';
        if (crypto_sig_parse(bad_inputs[i], sig, &s, &e) != VL_EINVAL)
            fail_msg("accepted Signature-Input %s", bad_inputs[i]);
        assert_true(e.msg[0] != '\0');
    }
    const char *bad_sigs[] = {"", "sig1=AAAA", "sig1=:not base64!:", sig63, "sig1=:AAAA"};
    for (size_t i = 0; i < sizeof bad_sigs / sizeof bad_sigs[0]; i++)
        if (crypto_sig_parse(ok, bad_sigs[i], &s, &e) != VL_EINVAL)
            fail_msg("accepted Signature %s", bad_sigs[i]);
    assert_int_equal(crypto_sig_parse(NULL, sig, &s, &e), VL_EINVAL);
    char longhdr[CRYPTO_SIG_HEADER_MAX + 64];
    memset(longhdr, 'a', sizeof longhdr - 1);
    longhdr[sizeof longhdr - 1] = '\0';
    assert_int_equal(crypto_sig_parse(longhdr, sig, &s, &e), VL_EINVAL);
    /* Another label first, then ours: the first with a signature is used. */
    char two[300];
    snprintf(two, sizeof two, "other=(\"@path\");created=5;keyid=\"x\", %s", ok);
    assert_int_equal(crypto_sig_parse(two, sig, &s, &e), VL_OK);
    assert_int_equal(s.created, 1);
}

static void test_digests(void **state) {
    (void)state;
    crypto_digest_want w;
    vl_error e = {0};
    char d[CRYPTO_DIGEST_HEADER_MAX];
    assert_int_equal(crypto_content_digest("abc", 3, d, sizeof d), VL_OK);
    assert_int_equal(crypto_digest_parse(d, &w, &e), VL_OK);
    assert_int_equal(w.alg, CRYPTO_DIGEST_SHA256);
    assert_int_equal(w.len, 32);
    /* Streaming in pieces gives the one-shot digest. */
    crypto_digest *c = crypto_digest_new(CRYPTO_DIGEST_SHA256);
    assert_non_null(c);
    crypto_digest_update(c, "a", 1);
    crypto_digest_update(c, "bc", 2);
    uint8_t got[CRYPTO_DIGEST_MAX];
    assert_int_equal(crypto_digest_final(c, got), 32);
    assert_memory_equal(got, w.bytes, 32);
    assert_int_equal(crypto_digest_reset(c, CRYPTO_DIGEST_SHA512), VL_OK);
    crypto_digest_update(c, "abc", 3);
    assert_int_equal(crypto_digest_final(c, got), 64);
    crypto_digest_free(c);
    /* sha-512 alone, and sha-256 preferred when both are given. */
    char b64[100], both[400];
    base64_encode(got, 64, b64);
    snprintf(both, sizeof both, "sha-512=:%s:", b64);
    assert_int_equal(crypto_digest_parse(both, &w, &e), VL_OK);
    assert_int_equal(w.alg, CRYPTO_DIGEST_SHA512);
    int nb = snprintf(both, sizeof both, "md5=:AAAA:, sha-512=:%.90s:, %.60s", b64, d);
    assert_true(nb > 0 && (size_t)nb < sizeof both);
    assert_int_equal(crypto_digest_parse(both, &w, &e), VL_OK);
    assert_int_equal(w.alg, CRYPTO_DIGEST_SHA256);
    const char *bad[] = {"", "sha-256", "sha-256=:AAAA:", "md5=:AAAA:", "sha-256=abc",
                         "SHA-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (crypto_digest_parse(bad[i], &w, &e) != VL_EINVAL)
            fail_msg("accepted Content-Digest %s", bad[i]);
    /* Nonce keys: fixed-size lowercase hex, stable, distinct. */
    char k1[CRYPTO_NONCE_HEX + 1], k2[CRYPTO_NONCE_HEX + 1], k3[CRYPTO_NONCE_HEX + 1];
    crypto_nonce_key("0123456789abcdef", k1);
    crypto_nonce_key("0123456789abcdef", k2);
    crypto_nonce_key("0123456789abcdeF", k3);
    assert_string_equal(k1, k2);
    assert_string_not_equal(k1, k3);
    assert_int_equal(strspn(k1, "0123456789abcdef"), CRYPTO_NONCE_HEX);
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
    crypto_signed_headers h;
    assert_int_equal(crypto_sign_http(&new_id, "7", "GET", "/v1/task", 0, NULL, 0, NOW, &h),
                     VL_OK);
    char reqsig[CRYPTO_SIG_B64_LEN + 1];
    memcpy(reqsig, h.signature + strlen("sig1=:"), CRYPTO_SIG_B64_LEN);
    reqsig[CRYPTO_SIG_B64_LEN] = '\0';
    assert_int_equal(crypto_rotation_verify(new_id.pk, 7, old_id.pk, reqsig, &e), VL_EAUTH);
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
        cmocka_unit_test(test_signature_base_layout),
        cmocka_unit_test(test_rfc9421_b26),
        cmocka_unit_test(test_tampering_rejected),
        cmocka_unit_test(test_header_grammar),
        cmocka_unit_test(test_digests),
        cmocka_unit_test(test_nonce_replay),
        cmocka_unit_test(test_nonce_cache_bounded),
        cmocka_unit_test(test_key_file),
        cmocka_unit_test(test_tokens_and_keys),
        cmocka_unit_test(test_rotation_proof),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
