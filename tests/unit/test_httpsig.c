/* RFC 9421 HTTP message signatures: a signed request verifies, its base
 * is the RFC's layout (and the RFC's own ed25519 example, B.2.6, checks),
 * every way a request can be altered is refused, the header grammar,
 * which of several members is checked, the signer's lookup and what
 * vcrypto_sign_http refuses to sign. Digests, the replay cache, key files,
 * tokens and rotation proofs are test_crypto.c's. */
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

static const uint8_t BODY[] = "{\"hello\":\"world\"}";
#define NOW 1790000000

static int setup(void **state) {
    (void)state;
    return vcrypto_init();
}

/* ---- RFC 9421 signatures ----------------------------------------------------- */

/* The request lookup for a signed request, as a verifier sees it. */
typedef struct signed_req {
    vcrypto_signed_headers h;
    vcrypto_http_request rq;
    char clen[24];
} signed_req;

static void sign_post(const vcrypto_identity *id, const char *keyid, const char *target,
                      const void *body, size_t len, int64_t created, signed_req *out) {
    memset(out, 0, sizeof *out);
    assert_int_equal(vcrypto_sign_http(id, keyid, "POST", target, 1, body, len, created, &out->h),
                     VL_OK);
    snprintf(out->clen, sizeof out->clen, "%zu", len);
    out->rq = (vcrypto_http_request){.method = "POST",
                                     .path_query = target,
                                     .content_digest = out->h.content_digest,
                                     .content_length = out->clen};
}

/* Parses the headers, builds the base from rq and verifies with pk. */
static int verify_with(const uint8_t pk[VCRYPTO_PK_BYTES], const char *input, const char *sig,
                       vcrypto_http_request *rq) {
    vcrypto_sig s;
    vl_error e = {0};
    int rc = vcrypto_sig_parse(input, sig, &s, &e);
    if (rc != VL_OK) return rc;
    vl_buf base;
    vl_buf_init(&base, 1 << 16);
    rc = vcrypto_sig_base(&s, vcrypto_http_request_lookup, rq, &base, &e);
    if (rc == VL_OK) rc = vcrypto_sig_verify(pk, &s, &base, &e);
    vl_buf_free(&base);
    return rc;
}

static void test_honest_request_verifies(void **state) {
    (void)state;
    vcrypto_identity id;
    vcrypto_identity_generate(&id);
    signed_req r;
    sign_post(&id, "7", "/v1/updates?x=1", BODY, sizeof BODY - 1, NOW, &r);
    vcrypto_sig s;
    vl_error e = {0};
    assert_int_equal(vcrypto_sig_parse(r.h.signature_input, r.h.signature, &s, &e), VL_OK);
    assert_string_equal(s.label, "sig1");
    assert_string_equal(s.keyid, "7");
    assert_int_equal(s.created, NOW);
    assert_int_equal(strlen(s.nonce), 32);
    assert_string_equal(s.alg, "ed25519");
    assert_int_equal(s.n_components, 5);
    assert_int_equal(verify_with(id.pk, r.h.signature_input, r.h.signature, &r.rq), VL_OK);
    /* The body's digest is RFC 9530's: sha-256 of the exact bytes. */
    char want[VCRYPTO_DIGEST_HEADER_MAX];
    assert_int_equal(vcrypto_content_digest(BODY, sizeof BODY - 1, want, sizeof want), VL_OK);
    assert_string_equal(r.h.content_digest, want);
    /* A GET covers method, path and query only, and has no digest. */
    vcrypto_signed_headers g;
    assert_int_equal(vcrypto_sign_http(&id, "7", "GET", "/v1/task", 0, NULL, 0, NOW, &g), VL_OK);
    assert_string_equal(g.content_digest, "");
    assert_non_null(strstr(g.signature_input, "sig1=(\"@method\" \"@path\" \"@query\");created="));
    vcrypto_http_request rq = {.method = "GET", .path_query = "/v1/task"};
    assert_int_equal(verify_with(id.pk, g.signature_input, g.signature, &rq), VL_OK);
}

/* The base for a fixed signature: RFC 9421's layout, byte for byte. */
static void test_signature_base_layout(void **state) {
    (void)state;
    const char *input =
        "sig1=(\"@method\" \"@path\" \"@query\" \"content-length\");"
        "created=1700000000;keyid=\"12\";nonce=\"0123456789abcdef\";alg=\"ed25519\"";
    char sig[200];
    uint8_t zero[64] = {0};
    char b64[VCRYPTO_SIG_B64_LEN + 1];
    vl_base64_encode(zero, sizeof zero, b64);
    snprintf(sig, sizeof sig, "sig1=:%s:", b64);
    vcrypto_sig s;
    vl_error e = {0};
    assert_int_equal(vcrypto_sig_parse(input, sig, &s, &e), VL_OK);
    vcrypto_http_request rq = {
        .method = "GET", .path_query = "/v1/model/delta?since=3", .content_length = "0"};
    vl_buf base;
    vl_buf_init(&base, 4096);
    assert_int_equal(vcrypto_sig_base(&s, vcrypto_http_request_lookup, &rq, &base, &e), VL_OK);
    assert_int_equal(vl_buf_append(&base, "", 1), VL_OK);
    assert_string_equal((const char *)base.data,
                        "\"@method\": GET\n\"@path\": /v1/model/delta\n\"@query\": ?since=3\n"
                        "\"content-length\": 0\n\"@signature-params\": (\"@method\" \"@path\" "
                        "\"@query\" \"content-length\");created=1700000000;keyid=\"12\";"
                        "nonce=\"0123456789abcdef\";alg=\"ed25519\"");
    /* No query at all is "?"; a missing field is an error, not an empty line. */
    rq.path_query = "/v1/model";
    rq.content_length = NULL;
    assert_int_equal(vcrypto_sig_base(&s, vcrypto_http_request_lookup, &rq, &base, &e), VL_EINVAL);
    vl_buf_free(&base);
}

/* RFC 9421 Appendix B.2.6: the RFC's own ed25519 signature over its example
 * request, with its test key (B.1.4), verifies here, and signing the same
 * base with the RFC's private key gives the RFC's signature byte for byte
 * (Ed25519 is deterministic), so the base is the RFC's too. */
static const char *b26_lookup(void *arg, const char *c) {
    (void)arg;
    static const char *const kv[][2] = {{"date", "Tue, 20 Apr 2021 02:07:55 GMT"},
                                        {"@method", "POST"},
                                        {"@path", "/foo"},
                                        {"@authority", "example.com"},
                                        {"content-type", "application/json"},
                                        {"content-length", "18"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (strcmp(kv[i][0], c) == 0) return kv[i][1];
    return NULL;
}

/* The key's PEM bodies from B.1.4: PKCS#8 (the last 32 bytes are the seed)
 * and SPKI (the last 32 bytes are the public key). */
#define B14_PKCS8 "MC4CAQAwBQYDK2VwBCIEIJ+DYvh6SEqVTm50DFtMDoQikTmiCqirVv9mWG9qfSnF"
#define B14_SPKI "MCowBQYDK2VwAyEAJrQLj5P/89iXES9+vFgrIy29clF9CC/oPPsw3c5D0bs="
#define B26_SIG \
    "wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQv5lIp5WPpBKRCw=="

static void test_rfc9421_b26(void **state) {
    (void)state;
    uint8_t spki[44], pkcs8[48];
    assert_int_equal(vl_base64_decode(B14_SPKI, strlen(B14_SPKI), spki, sizeof spki), 44);
    assert_int_equal(vl_base64_decode(B14_PKCS8, strlen(B14_PKCS8), pkcs8, sizeof pkcs8), 48);
    /* The DER headers name Ed25519 (OID 1.3.101.112) with a 32-byte key. */
    assert_memory_equal(spki, "\x30\x2a\x30\x05\x06\x03\x2b\x65\x70\x03\x21\x00", 12);
    assert_memory_equal(pkcs8, "\x30\x2e\x02\x01\x00\x30\x05\x06\x03\x2b\x65\x70\x04\x22\x04\x20",
                        16);
    const uint8_t *pk = spki + 12;
    vcrypto_identity rfc;
    assert_int_equal(crypto_sign_seed_keypair(rfc.pk, rfc.sk, pkcs8 + 16), 0);
    assert_memory_equal(rfc.pk, pk, VCRYPTO_PK_BYTES);

    const char *input = "sig-b26=(\"date\" \"@method\" \"@path\" \"@authority\" "
                        "\"content-type\" \"content-length\");created=1618884473;"
                        "keyid=\"test-key-ed25519\"";
    const char *sig = "sig-b26=:" B26_SIG ":";
    vcrypto_sig s;
    vl_error e = {0};
    assert_int_equal(vcrypto_sig_parse(input, sig, &s, &e), VL_OK);
    assert_string_equal(s.label, "sig-b26");
    assert_string_equal(s.nonce, ""); /* the RFC's example has none */
    assert_string_equal(s.alg, "");
    assert_int_equal(s.created, 1618884473);
    vl_buf base;
    vl_buf_init(&base, 4096);
    assert_int_equal(vcrypto_sig_base(&s, b26_lookup, NULL, &base, &e), VL_OK);
    assert_int_equal(vl_buf_append(&base, "", 1), VL_OK);
    assert_string_equal((const char *)base.data,
                        "\"date\": Tue, 20 Apr 2021 02:07:55 GMT\n"
                        "\"@method\": POST\n"
                        "\"@path\": /foo\n"
                        "\"@authority\": example.com\n"
                        "\"content-type\": application/json\n"
                        "\"content-length\": 18\n"
                        "\"@signature-params\": (\"date\" \"@method\" \"@path\" \"@authority\" "
                        "\"content-type\" \"content-length\");created=1618884473;"
                        "keyid=\"test-key-ed25519\"");
    base.len--; /* the NUL added for the comparison is not signed */
    assert_int_equal(vcrypto_sig_verify(pk, &s, &base, &e), VL_OK);
    uint8_t mine[VCRYPTO_SIG_BYTES];
    crypto_sign_detached(mine, NULL, base.data, base.len, rfc.sk);
    assert_memory_equal(mine, s.sig, VCRYPTO_SIG_BYTES);
    /* One byte of the request changed: it no longer verifies. */
    base.data[10] ^= 1;
    assert_int_equal(vcrypto_sig_verify(pk, &s, &base, &e), VL_EAUTH);
    vl_buf_free(&base);
    vcrypto_identity_wipe(&rfc);
    /* RFC 9530's example digests of {"hello": "world"} (section 2). */
    const char *hello = "{\"hello\": \"world\"}";
    char d[VCRYPTO_DIGEST_HEADER_MAX];
    assert_int_equal(vcrypto_content_digest(hello, 18, d, sizeof d), VL_OK);
    assert_string_equal(d, "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:");
    vcrypto_digest_want w;
    assert_int_equal(vcrypto_digest_parse("sha-512=:WZDPaVn/7XgHaAy8pmojAkGWoRx2UFChF41A2svX+TaPm"
                                          "+AbwAgBWnrIiYllu7BNNyealdVLvRwEmTHWXvJwew==:",
                                          &w, &e),
                     VL_OK);
    assert_int_equal(w.alg, VCRYPTO_DIGEST_SHA512);
    vcrypto_digest *c = vcrypto_digest_new(VCRYPTO_DIGEST_SHA512);
    assert_non_null(c);
    vcrypto_digest_update(c, hello, 18);
    uint8_t got[VCRYPTO_DIGEST_MAX];
    assert_int_equal(vcrypto_digest_final(c, got), 64);
    assert_memory_equal(got, w.bytes, 64);
    vcrypto_digest_free(c);
}

static void test_tampering_rejected(void **state) {
    (void)state;
    vcrypto_identity id, other;
    vcrypto_identity_generate(&id);
    vcrypto_identity_generate(&other);
    const char *P = "/v1/updates?x=1";
    signed_req r;
    sign_post(&id, "7", P, BODY, sizeof BODY - 1, NOW, &r);
    const char *in = r.h.signature_input, *sg = r.h.signature;
    vcrypto_http_request q = r.rq;
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
    char other_digest[VCRYPTO_DIGEST_HEADER_MAX];
    assert_int_equal(vcrypto_content_digest("{}", 2, other_digest, sizeof other_digest), VL_OK);
    q = r.rq;
    q.content_digest = other_digest;
    assert_int_equal(verify_with(id.pk, in, sg, &q), VL_EAUTH);
    assert_int_equal(verify_with(other.pk, in, sg, &r.rq), VL_EAUTH); /* wrong key */
    /* Each parameter and the list of components are signed: created, keyid
     * and nonce changed, alg dropped, content-length uncovered. All still
     * parse; none verifies. */
    const char *swaps[][2] = {{"keyid=\"7\"", "keyid=\"8\""},
                              {"created=", "created=1"},
                              {"nonce=\"", "nonce=\"a"},
                              {";alg=\"ed25519\"", ""},
                              {" \"content-length\")", ")"}};
    for (size_t i = 0; i < sizeof swaps / sizeof swaps[0]; i++) {
        char forged[VCRYPTO_SIG_HEADER_MAX + 8];
        const char *at = strstr(in, swaps[i][0]);
        assert_non_null(at);
        snprintf(forged, sizeof forged, "%.*s%s%s", (int)(at - in), in, swaps[i][1],
                 at + strlen(swaps[i][0]));
        vcrypto_sig fs;
        vl_error e = {0};
        if (vcrypto_sig_parse(forged, sg, &fs, &e) != VL_OK) fail_msg("%s: %s", forged, e.msg);
        if (verify_with(id.pk, forged, sg, &r.rq) != VL_EAUTH) fail_msg("accepted %s", forged);
    }
    /* A flipped signature bit. */
    char bad[sizeof r.h.signature];
    snprintf(bad, sizeof bad, "%s", sg);
    bad[7] = bad[7] == 'A' ? 'B' : 'A';
    assert_int_equal(verify_with(id.pk, in, bad, &r.rq), VL_EAUTH);
}

#define KEYID_65 "01234567890123456789012345678901234567890123456789012345678901234"
#define NAME_49 "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvw"

static void test_header_grammar(void **state) {
    (void)state;
    uint8_t zero[64] = {0};
    char b64[VCRYPTO_SIG_B64_LEN + 1], sig[200], sig63[200];
    vl_base64_encode(zero, sizeof zero, b64);
    snprintf(sig, sizeof sig, "sig1=:%s:", b64);
    vl_base64_encode(zero, 63, b64);
    snprintf(sig63, sizeof sig63, "sig1=:%s:", b64);
    const char *ok = "sig1=(\"@method\");created=1;keyid=\"1\";nonce=\"0123456789abcdef\"";
    vcrypto_sig s;
    vl_error e = {0};
    assert_int_equal(vcrypto_sig_parse(ok, sig, &s, &e), VL_OK);
    /* Each refusal names its cause. */
    const struct {
        const char *in, *why;
    } bad_inputs[] = {
        {"", "empty"},
        {"sig1", "not a dictionary"},
        {"sig1 =(\"@method\");created=1;keyid=\"1\"", "not a dictionary"},
        {"sig1=\"@method\";created=1;keyid=\"1\"", "inner list"},
        {"sig1=(\"@method\");keyid=\"1\"", "created is required"},
        {"sig1=(\"@method\") ;created=1;keyid=\"1\"", "created is required"},
        {"sig1=(\"@method\");created=1", "keyid is required"},
        {"sig1=(\"@method\");created=1;keyid=\"\"", "keyid is required"},
        {"sig1=(\"@method\");created=1;keyid=\"1\";foo=1", "unsupported parameter foo"},
        {"sig1=(\"@method\";req);created=1;keyid=\"1\"", "component parameters"},
        {"sig1=(\"content-digest\";sf);created=1;keyid=\"1\"", "component parameters"},
        {"sig1=(\"@query-param\";name=\"a\");created=1;keyid=\"1\"", "component parameters"},
        {"sig1=(\"@method\" \"@method\");created=1;keyid=\"1\"", "@method given twice"},
        {"sig1=(\"@method\");created=1;created=2;keyid=\"1\"", "created given twice"},
        {"sig1=(\"@method\");created=1;keyid=\"1\";tag=\"a\";tag=\"b\"", "tag given twice"},
        {"sig1=(\"@method\");created=1;keyid=\"1\";alg=\"rsa-pss-sha512\"", "alg must be ed25519"},
        {"sig1=(\"@method\");created=1;keyid=\"1\";alg=\"\"", "alg must be ed25519"},
        {"sig1=(\"@method\");created=-1;keyid=\"1\"", "non-negative integer"},
        {"sig1=(\"@method\");created=1.5;keyid=\"1\"", "non-negative integer"},
        {"sig1=(\"@method\");created=1234567890123456;keyid=\"1\"", "non-negative integer"},
        {"sig1=(\"@method\");created;keyid=\"1\"", "created has no value"},
        {"sig1=(\"@method\");created=1;keyid=\"1", "keyid must be a string"}, /* unterminated */
        {"sig1=(\"@method\");created=1;keyid=1", "keyid must be a string"},
        {"sig1=(\"@method\");created=1;keyid=\"a\\b\"", "keyid must be a string"}, /* escape */
        {"sig1=(\"@method\");created=1;keyid=\"" KEYID_65 "\"", "at most 64"},
        {"sig1=(\"@method\");created=1;keyid=\"1\";nonce=\"short\"", "nonce is 16 to"},
        {"sig1=(\"@method\");created=1;keyid=\"1\";nonce=\"\"", "nonce is 16 to"},
        {"sig1=(\"@method\");created=1;keyid=\"1\";nonce=\"0123456789abcdef!\"", "nonce is 16 to"},
        {"sig1=(\"@Method\");created=1;keyid=\"1\"", "lowercase name"},
        {"sig1=(\"Content-Type\");created=1;keyid=\"1\"", "lowercase name"},
        {"sig1=(\"@\");created=1;keyid=\"1\"", "lowercase name"},
        {"sig1=(@method);created=1;keyid=\"1\"", "lowercase name"}, /* a token */
        {"sig1=(\"" NAME_49 "\");created=1;keyid=\"1\"", "at most 48"},
        {"sig1=(\"a\" \"b\" \"c\" \"d\" \"e\" \"f\" \"g\" \"h\" \"i\" \"j\" \"k\" \"l\" "
         "\"m\" \"n\" \"o\" \"p\" \"q\");created=1;keyid=\"1\"",
         "more than 16 components"},
        {"sig1=(\"@method\"\"@path\");created=1;keyid=\"1\"", "malformed inner list"},
        {"sig1=(\"@method\"\t\"@path\");created=1;keyid=\"1\"", "malformed inner list"},
        {"sig2=(\"@method\");created=1;keyid=\"1\"", "no Signature-Input member has a Signature"},
        {"sig1=(\"@method\");created=1;keyid=\"1\",", "malformed dictionary"},
        {"sig1=(\"@method\");created=1;keyid=\"1\" x", "malformed dictionary"},
        {"sig1=(\"@method\");created=1;keyid=\"1\", sig1=(\"@path\");created=1;keyid=\"1\"",
         "label sig1 given twice"},
    };
    for (size_t i = 0; i < sizeof bad_inputs / sizeof bad_inputs[0]; i++) {
        e.msg[0] = '\0';
        if (vcrypto_sig_parse(bad_inputs[i].in, sig, &s, &e) != VL_EINVAL)
            fail_msg("accepted Signature-Input %s", bad_inputs[i].in);
        if (!strstr(e.msg, bad_inputs[i].why))
            fail_msg("Signature-Input %s: \"%s\" does not say \"%s\"", bad_inputs[i].in, e.msg,
                     bad_inputs[i].why);
    }

    char sig65[200], twice[2 * 200 + 4], unpadded[200];
    vl_base64_encode(zero, 63, b64);
    snprintf(sig65, sizeof sig65, "sig1=:%sAAAA:", b64); /* 63 + 3 bytes */
    snprintf(twice, sizeof twice, "%s, %s", sig, sig);
    snprintf(unpadded, sizeof unpadded, "%.*s:", (int)strlen(sig) - 3, sig); /* "==" dropped */
    const char *bad_sigs[] = {"",    "sig1=AAAA", "sig1=:not base64!:", sig63,          sig65,
                              twice, unpadded,    "sig1=:AAAA",         "sig1=\"AAAA\""};
    for (size_t i = 0; i < sizeof bad_sigs / sizeof bad_sigs[0]; i++) {
        e.msg[0] = '\0';
        if (vcrypto_sig_parse(ok, bad_sigs[i], &s, &e) != VL_EINVAL)
            fail_msg("accepted Signature %s", bad_sigs[i]);
        assert_true(e.msg[0] != '\0');
    }
    assert_int_equal(vcrypto_sig_parse(ok, NULL, &s, &e), VL_EINVAL);
    assert_int_equal(vcrypto_sig_parse(ok, sig63, &s, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "64 bytes, not 63"));
    assert_int_equal(vcrypto_sig_parse(ok, twice, &s, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "label sig1 given twice"));
    assert_int_equal(vcrypto_sig_parse(NULL, sig, &s, &e), VL_EINVAL);
    char longhdr[VCRYPTO_SIG_HEADER_MAX + 64];
    memset(longhdr, 'a', sizeof longhdr - 1);
    longhdr[sizeof longhdr - 1] = '\0';
    assert_int_equal(vcrypto_sig_parse(longhdr, sig, &s, &e), VL_EINVAL);
    /* The cap is exact: a valid input of VCRYPTO_SIG_HEADER_MAX - 1 bytes
     * parses, one byte more does not. */
    size_t pad = VCRYPTO_SIG_HEADER_MAX - 1 - strlen(ok) - strlen("x=(\"\"), ");
    int nl = snprintf(longhdr, sizeof longhdr, "x=(\"%0*d\"), %s", (int)pad, 0, ok);
    assert_int_equal(nl, VCRYPTO_SIG_HEADER_MAX - 1);
    assert_int_equal(vcrypto_sig_parse(longhdr, sig, &s, &e), VL_OK);
    snprintf(longhdr, sizeof longhdr, "x=(\"%0*d\"), %s", (int)pad + 1, 0, ok);
    assert_int_equal(vcrypto_sig_parse(longhdr, sig, &s, &e), VL_EINVAL);
    /* Optional parameters: without a nonce the field is empty (the caller
     * decides whether it needs one); tag and expires are kept. */
    assert_int_equal(vcrypto_sig_parse("sig1=(\"@method\");created=1;keyid=\"1\"", sig, &s, &e),
                     VL_OK);
    assert_string_equal(s.nonce, "");
    assert_int_equal(s.expires, 0);
    assert_false(s.has_expires);
    /* expires=0 is given (a time long past), not the same as none. */
    assert_int_equal(
        vcrypto_sig_parse("sig1=(\"@method\");created=1;expires=0;keyid=\"1\"", sig, &s, &e),
        VL_OK);
    assert_true(s.has_expires);
    assert_int_equal(s.expires, 0);
    assert_int_equal(vcrypto_sig_parse("sig1=(\"@method\");created=1;expires=9;keyid=\"1\";"
                                       "tag=\"t\"",
                                       sig, &s, &e),
                     VL_OK);
    assert_int_equal(s.expires, 9);
    assert_true(s.has_expires);
    assert_true(s.has_tag);
    assert_string_equal(s.tag, "t");
    /* RFC 8941 whitespace where it may be, re-serialised canonically into
     * params, escapes kept; an empty list of components is a valid list. */
    assert_int_equal(vcrypto_sig_parse("  sig1=(  \"@method\"   \"@path\" );created=0012; "
                                       "keyid=\"a\\\"b\\\\c\";nonce=\"0123456789abcdef\"  ",
                                       sig, &s, &e),
                     VL_OK);
    assert_string_equal(s.keyid, "a\"b\\c");
    assert_int_equal(s.created, 12);
    assert_string_equal(s.params, "(\"@method\" \"@path\");created=12;keyid=\"a\\\"b\\\\c\";"
                                  "nonce=\"0123456789abcdef\"");
    assert_int_equal(vcrypto_sig_parse("sig1=();created=1;keyid=\"1\"", sig, &s, &e), VL_OK);
    assert_int_equal(s.n_components, 0);
    assert_string_equal(s.params, "();created=1;keyid=\"1\"");
    /* A signature of another length under a label we do not read is fine;
     * under ours it is not. */
    uint8_t big[256] = {0};
    char bigb64[400], many[sizeof bigb64 + 200 + 16];
    vl_base64_encode(big, sizeof big, bigb64);
    snprintf(many, sizeof many, "rsa=:%s:, %s", bigb64, sig);
    assert_int_equal(vcrypto_sig_parse(ok, many, &s, &e), VL_OK);
    snprintf(many, sizeof many, "sig1=:%s:", bigb64);
    assert_int_equal(vcrypto_sig_parse(ok, many, &s, &e), VL_EINVAL);
    /* Another label first, then ours: the first with a signature is used. */
    char two[300];
    snprintf(two, sizeof two, "other=(\"@path\");created=5;keyid=\"x\", %s", ok);
    assert_int_equal(vcrypto_sig_parse(two, sig, &s, &e), VL_OK);
    assert_int_equal(s.created, 1);
    /* Two inputs that both have a signature and are both volley's: the
     * first is the one read. */
    char sigs2[2 * 200 + 8];
    snprintf(sigs2, sizeof sigs2, "%s, sig0=%s", sig, sig + strlen("sig1="));
    snprintf(two, sizeof two, "sig0=(\"@path\" \"@query\");created=5;keyid=\"7\", %s", ok);
    assert_int_equal(vcrypto_sig_parse(two, sigs2, &s, &e), VL_OK);
    assert_string_equal(s.label, "sig0");
    assert_int_equal(s.created, 5);
    assert_int_equal(s.n_components, 2);
}

/* Signature-Input and Signature with a foreign member (an intermediary's,
 * say) put before the members of h. */
static void with_foreign(const vcrypto_signed_headers *h, const char *input, const char *sig,
                         char *in_out, size_t in_cap, char *sig_out, size_t sig_cap) {
    int a = snprintf(in_out, in_cap, "%s, %s", input, h->signature_input);
    int b = snprintf(sig_out, sig_cap, "%s, %s", sig, h->signature);
    assert_true(a > 0 && (size_t)a < in_cap && b > 0 && (size_t)b < sig_cap);
}

/* Of several members the one volley signed is checked, wherever it is:
 * an intermediary's signature before the peer's (of ed25519 under its own
 * key id, or of another algorithm with parameters volley does not take)
 * does not make an honest request fail; alone, a foreign member is still
 * refused (it parses as it stands and fails to verify, or does not parse). */
static void test_member_selection(void **state) {
    (void)state;
    vcrypto_identity id, proxy;
    vcrypto_identity_generate(&id);
    vcrypto_identity_generate(&proxy);
    signed_req r;
    sign_post(&id, "12", "/v1/updates", BODY, sizeof BODY - 1, NOW, &r);
    uint8_t junk[256];
    randombytes_buf(junk, sizeof junk);
    char b64_64[VCRYPTO_SIG_B64_LEN + 1], b64_256[400], fsig[512], in[2048], sig[2048];
    vl_base64_encode(junk, 64, b64_64);
    vl_base64_encode(junk, sizeof junk, b64_256);
    const struct {
        const char *input, *sig_b64;
    } foreign[] = {
        /* ed25519 under a key id volley never uses */
        {"proxy=(\"@method\" \"@path\");created=1790000000;keyid=\"edge-proxy\";"
         "alg=\"ed25519\"",
         b64_64},
        /* another algorithm, a component parameter, an unknown parameter */
        {"proxy=(\"@method\" \"@authority\";req);created=1790000000;keyid=\"edge\";"
         "alg=\"rsa-pss-sha512\";foo=1",
         b64_256},
        /* ed25519 without alg and with a key id that is no peer id */
        {"proxy=(\"@method\");created=1790000000;keyid=\"-1\"", b64_64},
    };
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
        snprintf(fsig, sizeof fsig, "proxy=:%s:", foreign[i].sig_b64);
        with_foreign(&r.h, foreign[i].input, fsig, in, sizeof in, sig, sizeof sig);
        vcrypto_sig s;
        vl_error e = {0};
        assert_int_equal(vcrypto_sig_parse(in, sig, &s, &e), VL_OK);
        assert_string_equal(s.label, VCRYPTO_SIG_LABEL);
        assert_string_equal(s.keyid, "12");
        if (verify_with(id.pk, in, sig, &r.rq) != VL_OK)
            fail_msg("foreign member %zu first: the peer's signature was not the one checked", i);
        /* The foreign member alone: refused, never taken for volley's. */
        e.msg[0] = '\0';
        int rc = vcrypto_sig_parse(foreign[i].input, fsig, &s, &e);
        if (rc == VL_OK) {
            assert_string_not_equal(s.keyid, "12");
            assert_int_equal(verify_with(id.pk, foreign[i].input, fsig, &r.rq), VL_EAUTH);
        } else {
            assert_int_equal(rc, VL_EINVAL);
            assert_true(e.msg[0] != '\0');
        }
    }
    /* A join's key id (base64 of the key) is volley's too. */
    char pk[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(id.pk, pk);
    signed_req j;
    sign_post(&id, pk, "/v1/peers", BODY, sizeof BODY - 1, NOW, &j);
    snprintf(fsig, sizeof fsig, "proxy=:%s:", b64_64);
    with_foreign(&j.h, foreign[0].input, fsig, in, sizeof in, sig, sizeof sig);
    assert_int_equal(verify_with(id.pk, in, sig, &j.rq), VL_OK);
    /* A proxy's ed25519 signature first, over the same request with a key
     * id like a 44-character key that is not base64 of one: passed over. */
    char in2[2048];
    snprintf(in2, sizeof in2,
             "proxy=(\"@method\");created=1790000000;keyid=\"%044d\";alg=\"ed25519\"", 0);
    with_foreign(&r.h, in2, fsig, in, sizeof in, sig, sizeof sig);
    assert_int_equal(verify_with(id.pk, in, sig, &r.rq), VL_OK);
    /* Between two members of volley's form, alg="ed25519" given wins over
     * alg absent; the proxy's key signed the first. */
    vcrypto_signed_headers ph;
    assert_int_equal(
        vcrypto_sign_http(&proxy, "13", "POST", "/v1/updates", 1, BODY, sizeof BODY - 1, NOW, &ph),
        VL_OK);
    char *alg = strstr(ph.signature_input, ";alg=\"ed25519\"");
    assert_non_null(alg);
    *alg = '\0';
    char *eq = strchr(ph.signature_input, '=');
    char *seq = strchr(ph.signature, '=');
    snprintf(in2, sizeof in2, "other%s", eq);
    snprintf(fsig, sizeof fsig, "other%s", seq);
    with_foreign(&r.h, in2, fsig, in, sizeof in, sig, sizeof sig);
    vcrypto_sig s;
    vl_error e = {0};
    assert_int_equal(vcrypto_sig_parse(in, sig, &s, &e), VL_OK);
    assert_string_equal(s.keyid, "12");
    assert_int_equal(verify_with(id.pk, in, sig, &r.rq), VL_OK);
    vcrypto_identity_wipe(&id);
    vcrypto_identity_wipe(&proxy);
}

/* The signer's lookup, and what vcrypto_sign_http refuses to sign. */
static void test_lookup_and_signing_limits(void **state) {
    (void)state;
    vcrypto_http_request rq = {
        .method = "GET", .path_query = "/v1/model?a=1&b=2", .authority = "Coord.Example:8443"};
    const char *want[][2] = {{"@method", "GET"},
                             {"@path", "/v1/model"},
                             {"@query", "?a=1&b=2"},
                             {"@request-target", "/v1/model?a=1&b=2"},
                             {"@scheme", "https"},
                             {"@authority", "coord.example:8443"},
                             {"@target-uri", "https://coord.example:8443/v1/model?a=1&b=2"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *v = vcrypto_http_request_lookup(&rq, want[i][0]);
        assert_non_null(v);
        assert_string_equal(v, want[i][1]);
    }
    assert_null(vcrypto_http_request_lookup(&rq, "content-digest"));
    assert_null(vcrypto_http_request_lookup(&rq, "content-type"));
    assert_null(vcrypto_http_request_lookup(&rq, "@status"));
    rq.authority = NULL;
    assert_null(vcrypto_http_request_lookup(&rq, "@authority"));
    assert_null(vcrypto_http_request_lookup(&rq, "@target-uri"));
    rq.path_query = "/v1/model";
    assert_string_equal(vcrypto_http_request_lookup(&rq, "@query"), "?");
    /* A path that does not fit is no value, never a truncated one. */
    static char longpath[sizeof rq.scratch + 16];
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[0] = '/';
    rq.path_query = longpath;
    assert_null(vcrypto_http_request_lookup(&rq, "@path"));
    assert_string_equal(vcrypto_http_request_lookup(&rq, "@query"), "?");
    longpath[1] = '?';
    assert_string_equal(vcrypto_http_request_lookup(&rq, "@path"), "/");
    assert_null(vcrypto_http_request_lookup(&rq, "@query"));

    vcrypto_identity id;
    vcrypto_identity_generate(&id);
    vcrypto_signed_headers h;
    assert_int_equal(vcrypto_sign_http(&id, "7", "GET", longpath, 0, NULL, 0, NOW, &h), VL_ETOOBIG);
    const struct {
        const char *keyid, *method, *target;
        int64_t created;
    } bad[] = {{"7", "GET", "/v1/a b", NOW},       {"7", "GET", "/v1/\x01", NOW},
               {"7", "GET", "v1/task", NOW},       {"7", "", "/v1/task", NOW},
               {"7", "G T", "/v1/task", NOW},      {"", "GET", "/v1/task", NOW},
               {"a\nb", "GET", "/v1/task", NOW},   {"7", "GET", "/v1/task", -1},
               {"7", "GET", "/v1/t\xc3\xa9", NOW}, {KEYID_65, "GET", "/v1/task", NOW}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (vcrypto_sign_http(&id, bad[i].keyid, bad[i].method, bad[i].target, 0, NULL, 0,
                              bad[i].created, &h) != VL_EINVAL)
            fail_msg("signed %s %s as %s", bad[i].method, bad[i].target, bad[i].keyid);
    assert_int_equal(vcrypto_sign_http(&id, "7", "POST", "/v1/x", 1, NULL, 5, NOW, &h), VL_EINVAL);
    /* A join's keyid is the base64 public key, with + / = in a string. */
    char b64[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(id.pk, b64);
    assert_int_equal(vcrypto_sign_http(&id, b64, "POST", "/v1/join", 1, "", 0, NOW, &h), VL_OK);
    vcrypto_sig s;
    vl_error e = {0};
    assert_int_equal(vcrypto_sig_parse(h.signature_input, h.signature, &s, &e), VL_OK);
    assert_string_equal(s.keyid, b64);
    assert_string_equal(h.content_digest, "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:");
    rq = (vcrypto_http_request){.method = "POST",
                                .path_query = "/v1/join",
                                .content_digest = h.content_digest,
                                .content_length = "0"};
    vl_buf base;
    vl_buf_init(&base, 4096);
    assert_int_equal(vcrypto_sig_base(&s, vcrypto_http_request_lookup, &rq, &base, &e), VL_OK);
    assert_int_equal(vcrypto_sig_verify(id.pk, &s, &base, &e), VL_OK);
    /* A field value with a control character (a tab included) or DEL
     * cannot be in a base; nor can a base grow past its buffer's cap. */
    const char *ctl[] = {"0\t", "0\x7f", "\x1b"};
    for (size_t i = 0; i < sizeof ctl / sizeof ctl[0]; i++) {
        rq.content_length = ctl[i];
        e.msg[0] = '\0';
        assert_int_equal(vcrypto_sig_base(&s, vcrypto_http_request_lookup, &rq, &base, &e),
                         VL_EINVAL);
        assert_non_null(strstr(e.msg, "content-length"));
    }
    rq.content_length = "0";
    vl_buf small;
    vl_buf_init(&small, 64);
    assert_int_equal(vcrypto_sig_base(&s, vcrypto_http_request_lookup, &rq, &small, &e),
                     VL_ETOOBIG);
    vl_buf_free(&small);
    vl_buf_free(&base);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_honest_request_verifies),
        cmocka_unit_test(test_signature_base_layout),
        cmocka_unit_test(test_rfc9421_b26),
        cmocka_unit_test(test_tampering_rejected),
        cmocka_unit_test(test_header_grammar),
        cmocka_unit_test(test_member_selection),
        cmocka_unit_test(test_lookup_and_signing_limits),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
