/* Fuzz target: RFC 9421 signatures (vcrypto_sig_parse, vcrypto_sig_base,
 * vcrypto_sig_verify) and Content-Digest parsing. Input: one selector byte,
 * then text. Selector 0 (low bit clear) splits the text at its first LF
 * into a Signature-Input and a Signature value and parses them; what
 * parses must stay inside its bounds, must re-parse from its own
 * canonical params to the same signature, and must not verify under a
 * fixed key, which cannot have signed it. The text is also parsed as a
 * Content-Digest. Selector 1 takes the text as "METHOD\nTARGET\nBODY",
 * signs that request with vcrypto_sign_http (with a body unless the
 * selector's second bit is set), and checks that it parses and verifies,
 * and stops verifying when the body's digest, the target or the method
 * changes. */
#include <string.h>

#include "crypto/crypto.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static vcrypto_identity key;
static const int64_t NOW = 1700000000;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    if (vcrypto_init() != VL_OK) abort();
    vcrypto_identity_generate(&key);
    return 0;
}

/* Every component has a value, so verification gets as far as it can. */
static const char *any_value(void *arg, const char *component) {
    (void)arg;
    return component[0] == '@' ? "/v1/task" : "value";
}

static int verify(const char *input, const char *sig, vcrypto_http_request *rq) {
    vcrypto_sig s;
    vl_error e = {0};
    int rc = vcrypto_sig_parse(input, sig, &s, &e);
    if (rc != VL_OK) return rc;
    vl_buf base;
    vl_buf_init(&base, 1 << 16);
    rc = vcrypto_sig_base(&s, vcrypto_http_request_lookup, rq, &base, &e);
    if (rc == VL_OK) rc = vcrypto_sig_verify(key.pk, &s, &base, &e);
    vl_buf_free(&base);
    return rc;
}

/* What vcrypto_sig_parse promises about anything it accepts. */
static void check_bounds(const vcrypto_sig *s) {
    FUZZ_CHECK(s->n_components <= VCRYPTO_SIG_MAX_COMPONENTS && s->keyid[0] != '\0' &&
                   s->created >= 0 && s->expires >= 0 &&
                   strnlen(s->params, sizeof s->params) < sizeof s->params &&
                   strnlen(s->label, sizeof s->label) < sizeof s->label &&
                   strnlen(s->keyid, sizeof s->keyid) < sizeof s->keyid &&
                   strnlen(s->tag, sizeof s->tag) < sizeof s->tag &&
                   (s->alg[0] == '\0' || strcmp(s->alg, "ed25519") == 0),
               "a parsed signature out of bounds");
    size_t nl = strnlen(s->nonce, sizeof s->nonce);
    FUZZ_CHECK(nl == 0 || (nl >= 16 && nl <= VCRYPTO_SIG_NONCE_MAX &&
                           strspn(s->nonce, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                            "0123456789+/=_.-") == nl),
               "a nonce outside its alphabet or length");
    for (size_t i = 0; i < s->n_components; i++) {
        const char *c = s->components[i];
        size_t cl = strnlen(c, VCRYPTO_SIG_NAME_MAX + 1);
        FUZZ_CHECK(cl > 0 && cl <= VCRYPTO_SIG_NAME_MAX, "a component name out of bounds");
        for (size_t k = 0; k < cl; k++)
            FUZZ_CHECK(c[k] > 0x20 && c[k] < 0x7f && !(c[k] >= 'A' && c[k] <= 'Z') && c[k] != '"' &&
                           c[k] != '\\',
                       "a component name with a byte a name cannot hold");
        for (size_t j = 0; j < i; j++)
            FUZZ_CHECK(strcmp(s->components[j], c) != 0, "a duplicate component");
    }
}

/* The canonical params are a Signature-Input member of their own: parsed
 * again they give the same signature, and serialise to themselves. */
static void check_round_trip(const vcrypto_sig *s, const char *sig_field) {
    char again[VCRYPTO_SIG_HEADER_MAX + VCRYPTO_SIG_NAME_MAX + 2];
    int n = snprintf(again, sizeof again, "%s=%s", s->label, s->params);
    if (n < 0 || (size_t)n >= VCRYPTO_SIG_HEADER_MAX) return; /* over the field cap */
    vcrypto_sig t;
    vl_error e = {0};
    FUZZ_CHECK(vcrypto_sig_parse(again, sig_field, &t, &e) == VL_OK, "canonical params refused: %s",
               e.msg);
    FUZZ_CHECK(strcmp(t.params, s->params) == 0 && strcmp(t.label, s->label) == 0 &&
                   t.n_components == s->n_components && t.created == s->created &&
                   t.expires == s->expires && strcmp(t.keyid, s->keyid) == 0 &&
                   strcmp(t.nonce, s->nonce) == 0 && strcmp(t.tag, s->tag) == 0 &&
                   strcmp(t.alg, s->alg) == 0 && t.has_tag == s->has_tag &&
                   memcmp(t.sig, s->sig, sizeof t.sig) == 0,
               "the canonical params parse to another signature");
    for (size_t i = 0; i < s->n_components; i++)
        FUZZ_CHECK(strcmp(t.components[i], s->components[i]) == 0, "components reordered");
}

static void parse_and_verify(const uint8_t *data, size_t size) {
    char *v = fuzz_cstr(data, size);
    char *nl = strchr(v, '\n');
    const char *sig = nl ? nl + 1 : "";
    if (nl) *nl = '\0';
    vcrypto_sig s;
    vl_error e = {0};
    if (vcrypto_sig_parse(v, sig, &s, &e) == VL_OK) {
        check_bounds(&s);
        check_round_trip(&s, sig);
        vl_buf base;
        vl_buf_init(&base, 1 << 16);
        if (vcrypto_sig_base(&s, any_value, NULL, &base, &e) == VL_OK)
            FUZZ_CHECK(vcrypto_sig_verify(key.pk, &s, &base, &e) == VL_EAUTH,
                       "a signature the key never made verifies");
        /* And with the signer's own lookup, derived components included. */
        vcrypto_http_request rq = {.method = "POST",
                                   .path_query = "/v1/updates?x=1",
                                   .authority = "Coord.Example",
                                   .content_length = "0",
                                   .content_digest = "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMp"
                                                     "JWZG3hSuFU=:"};
        if (vcrypto_sig_base(&s, vcrypto_http_request_lookup, &rq, &base, &e) == VL_OK)
            FUZZ_CHECK(vcrypto_sig_verify(key.pk, &s, &base, &e) == VL_EAUTH,
                       "a signature the key never made verifies");
        vl_buf_free(&base);
    } else {
        FUZZ_CHECK(e.msg[0] != '\0', "a refusal without a message");
    }
    vcrypto_digest_want w;
    if (vcrypto_digest_parse(v, &w, &e) == VL_OK)
        FUZZ_CHECK((w.alg == VCRYPTO_DIGEST_SHA256 && w.len == 32) ||
                       (w.alg == VCRYPTO_DIGEST_SHA512 && w.len == 64),
                   "a digest of the wrong size");
    free(v);
}

/* The body's Content-Digest is its digest streamed in pieces, and another
 * body's digest in its place does not verify. */
static void check_body(const vcrypto_signed_headers *h, const vcrypto_http_request *rq,
                       const uint8_t *body, size_t blen) {
    vcrypto_digest_want w;
    vl_error e = {0};
    FUZZ_CHECK(vcrypto_digest_parse(h->content_digest, &w, &e) == VL_OK &&
                   w.alg == VCRYPTO_DIGEST_SHA256,
               "own Content-Digest refused");
    vcrypto_digest *d = vcrypto_digest_new(VCRYPTO_DIGEST_SHA256);
    FUZZ_CHECK(d != NULL, "out of memory");
    for (size_t at = 0; at < blen; at += 7)
        vcrypto_digest_update(d, body + at, blen - at < 7 ? blen - at : 7);
    uint8_t md[VCRYPTO_DIGEST_MAX];
    FUZZ_CHECK(vcrypto_digest_final(d, md) == 32 && memcmp(md, w.bytes, 32) == 0,
               "the streaming digest differs from Content-Digest");
    vcrypto_digest_free(d);
    uint8_t *b2 = malloc(blen + 1);
    FUZZ_CHECK(b2 != NULL, "out of memory");
    if (blen) memcpy(b2, body, blen);
    b2[blen] = 'x';
    char other[VCRYPTO_DIGEST_HEADER_MAX];
    FUZZ_CHECK(vcrypto_content_digest(b2, blen + 1, other, sizeof other) == VL_OK, "digest");
    free(b2);
    vcrypto_http_request q = *rq;
    q.content_digest = other;
    FUZZ_CHECK(verify(h->signature_input, h->signature, &q) == VL_EAUTH,
               "another body's digest verifies");
}

/* s with one byte appended, on the heap. */
static char *plus(const char *s, char c) {
    size_t n = strlen(s);
    char *t = malloc(n + 2);
    FUZZ_CHECK(t != NULL, "out of memory");
    memcpy(t, s, n);
    t[n] = c;
    t[n + 1] = '\0';
    return t;
}

static void sign_and_verify(const uint8_t *data, size_t size, int has_body) {
    const uint8_t *nl1 = memchr(data, '\n', size);
    if (!nl1) return;
    const uint8_t *nl2 = memchr(nl1 + 1, '\n', size - (size_t)(nl1 + 1 - data));
    if (!nl2) return;
    char *method = fuzz_cstr(data, (size_t)(nl1 - data));
    char *target = fuzz_cstr(nl1 + 1, (size_t)(nl2 - nl1 - 1));
    const uint8_t *body = nl2 + 1;
    size_t blen = size - (size_t)(body - data);
    vcrypto_signed_headers h;
    /* Targets a request line cannot carry are refused, not signed. */
    if (strlen(method) == (size_t)(nl1 - data) && strlen(target) == (size_t)(nl2 - nl1 - 1) &&
        vcrypto_sign_http(&key, "7", method, target, has_body, body, blen, NOW, &h) == VL_OK) {
        char clen[24];
        snprintf(clen, sizeof clen, "%zu", blen);
        vcrypto_http_request rq = {.method = method,
                                   .path_query = target,
                                   .content_digest = has_body ? h.content_digest : NULL,
                                   .content_length = has_body ? clen : NULL};
        FUZZ_CHECK(verify(h.signature_input, h.signature, &rq) == VL_OK, "own signature refused");
        if (has_body)
            check_body(&h, &rq, body, blen);
        else
            FUZZ_CHECK(h.content_digest[0] == '\0', "a digest without a body");
        vcrypto_http_request q = rq;
        char *t2 = plus(target, '/');
        q.path_query = t2;
        FUZZ_CHECK(verify(h.signature_input, h.signature, &q) == VL_EAUTH,
                   "another target verifies");
        free(t2);
        q = rq;
        char *m2 = plus(method, 'X');
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
    if (data[0] & 1)
        sign_and_verify(data + 1, size - 1, !(data[0] & 2));
    else
        parse_and_verify(data + 1, size - 1);
    return 0;
}
