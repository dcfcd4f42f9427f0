/* Fuzz target: RFC 9421 signatures (crypto_sig_parse, crypto_sig_base,
 * crypto_sig_verify) and Content-Digest parsing. Input: one selector byte,
 * then text. Selector 0 splits the text at its first LF into a
 * Signature-Input and a Signature value and parses them; what parses must
 * stay inside its bounds and must not verify under a fixed key, which
 * cannot have signed it. The text is also parsed as a Content-Digest.
 * Selector 1 takes the text as "METHOD\nTARGET\nBODY", signs that request
 * with crypto_sign_http, and checks that it parses and verifies, and stops
 * verifying when the body's digest, the target or the method changes. */
#include <string.h>

#include "crypto/crypto.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static crypto_identity key;
static const int64_t NOW = 1700000000;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    if (crypto_init() != VL_OK) abort();
    crypto_identity_generate(&key);
    return 0;
}

/* Every component has a value, so verification gets as far as it can. */
static const char *any_value(void *arg, const char *component) {
    (void)arg;
    return component[0] == '@' ? "/v1/task" : "value";
}

static int verify(const char *input, const char *sig, crypto_http_request *rq) {
    crypto_sig s;
    vl_error e = {0};
    int rc = crypto_sig_parse(input, sig, &s, &e);
    if (rc != VL_OK) return rc;
    buf base;
    buf_init(&base, 1 << 16);
    rc = crypto_sig_base(&s, crypto_http_request_lookup, rq, &base, &e);
    if (rc == VL_OK) rc = crypto_sig_verify(key.pk, &s, &base, &e);
    buf_free(&base);
    return rc;
}

static void parse_and_verify(const uint8_t *data, size_t size) {
    char *v = fuzz_cstr(data, size);
    char *nl = strchr(v, '\n');
    const char *sig = nl ? nl + 1 : "";
    if (nl) *nl = '\0';
    crypto_sig s;
    vl_error e = {0};
    if (crypto_sig_parse(v, sig, &s, &e) == VL_OK) {
        FUZZ_CHECK(s.n_components <= CRYPTO_SIG_MAX_COMPONENTS && s.keyid[0] != '\0' &&
                       s.created >= 0 && strlen(s.params) < sizeof s.params &&
                       (s.nonce[0] == '\0' || strlen(s.nonce) >= 16),
                   "a parsed signature out of bounds");
        buf base;
        buf_init(&base, 1 << 16);
        if (crypto_sig_base(&s, any_value, NULL, &base, &e) == VL_OK)
            FUZZ_CHECK(crypto_sig_verify(key.pk, &s, &base, &e) == VL_EAUTH,
                       "a signature the key never made verifies");
        buf_free(&base);
    } else {
        FUZZ_CHECK(e.msg[0] != '\0', "a refusal without a message");
    }
    crypto_digest_want w;
    if (crypto_digest_parse(v, &w, &e) == VL_OK)
        FUZZ_CHECK((w.alg == CRYPTO_DIGEST_SHA256 && w.len == 32) ||
                       (w.alg == CRYPTO_DIGEST_SHA512 && w.len == 64),
                   "a digest of the wrong size");
    free(v);
}

static void sign_and_verify(const uint8_t *data, size_t size) {
    const uint8_t *nl1 = memchr(data, '\n', size);
    if (!nl1) return;
    const uint8_t *nl2 = memchr(nl1 + 1, '\n', size - (size_t)(nl1 + 1 - data));
    if (!nl2) return;
    char *method = fuzz_cstr(data, (size_t)(nl1 - data));
    char *target = fuzz_cstr(nl1 + 1, (size_t)(nl2 - nl1 - 1));
    const uint8_t *body = nl2 + 1;
    size_t blen = size - (size_t)(body - data);
    crypto_signed_headers h;
    /* Targets a request line cannot carry are refused, not signed. */
    if (strlen(method) == (size_t)(nl1 - data) && strlen(target) == (size_t)(nl2 - nl1 - 1) &&
        crypto_sign_http(&key, "7", method, target, 1, body, blen, NOW, &h) == VL_OK) {
        char clen[24];
        snprintf(clen, sizeof clen, "%zu", blen);
        crypto_http_request rq = {.method = method, .path_query = target,
                                  .content_digest = h.content_digest, .content_length = clen};
        FUZZ_CHECK(verify(h.signature_input, h.signature, &rq) == VL_OK,
                   "own signature refused");
        char other[CRYPTO_DIGEST_HEADER_MAX];
        FUZZ_CHECK(crypto_content_digest(body, blen + 0, other, sizeof other) == VL_OK &&
                       strcmp(other, h.content_digest) == 0,
                   "the digest is not the body's");
        uint8_t *b2 = malloc(blen + 1);
        FUZZ_CHECK(b2 != NULL, "out of memory");
        memcpy(b2, body, blen);
        b2[blen] = 'x';
        FUZZ_CHECK(crypto_content_digest(b2, blen + 1, other, sizeof other) == VL_OK,
                   "digest");
        crypto_http_request q = rq;
        q.content_digest = other;
        FUZZ_CHECK(verify(h.signature_input, h.signature, &q) == VL_EAUTH,
                   "another body's digest verifies");
        free(b2);
        size_t tl = strlen(target);
        char *t2 = malloc(tl + 2);
        FUZZ_CHECK(t2 != NULL, "out of memory");
        memcpy(t2, target, tl);
        t2[tl] = '/';
        t2[tl + 1] = '\0';
        q = rq;
        q.path_query = t2;
        FUZZ_CHECK(verify(h.signature_input, h.signature, &q) == VL_EAUTH,
                   "another target verifies");
        free(t2);
        size_t ml = strlen(method);
        char *m2 = malloc(ml + 2);
        FUZZ_CHECK(m2 != NULL, "out of memory");
        memcpy(m2, method, ml);
        m2[ml] = 'X';
        m2[ml + 1] = '\0';
        q = rq;
        q.method = m2;
        FUZZ_CHECK(verify(h.signature_input, h.signature, &q) == VL_EAUTH,
                   "another method verifies");
        free(m2);
    }
    free(method);
    free(target);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1) sign_and_verify(data + 1, size - 1);
    else parse_and_verify(data + 1, size - 1);
    return 0;
}
