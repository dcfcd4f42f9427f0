/* Fuzz target: the Authorization header (crypto_auth_parse) and request
 * verification. Input: one selector byte, then text. Selector 0 parses
 * the text as a header value and verifies what parses against a fixed
 * key, which must refuse it (it cannot have signed it). Selector 1 takes
 * the text as "METHOD\nTARGET\nBODY", signs that request, and checks that
 * the header parses, verifies, and stops verifying when the body, target
 * or method changes. */
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

static void parse_and_verify(const uint8_t *data, size_t size) {
    char *v = fuzz_cstr(data, size);
    crypto_auth_header a;
    vl_error e = {0};
    if (crypto_auth_parse(v, &a, &e) == VL_OK) {
        FUZZ_CHECK(a.peer_id >= 0 && a.ts >= 0 && strlen(a.nonce) == CRYPTO_NONCE_HEX &&
                       strspn(a.nonce, "0123456789abcdef") == CRYPTO_NONCE_HEX,
                   "a parsed header out of bounds");
        FUZZ_CHECK(crypto_verify_request(key.pk, &a, "GET", "/v1/task", NULL, 0, a.ts, &e) ==
                       VL_EAUTH,
                   "a header the key never signed verifies");
    } else {
        FUZZ_CHECK(e.msg[0] != '\0', "a refusal without a message");
    }
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
    char hdr[CRYPTO_AUTH_MAX + 1];
    /* Fields with a NUL cannot travel in HTTP; they are not signed. */
    if (strlen(method) == (size_t)(nl1 - data) && strlen(target) == (size_t)(nl2 - nl1 - 1) &&
        crypto_sign_request(&key, 7, method, target, body, blen, NOW, hdr, sizeof hdr) ==
            VL_OK) {
        crypto_auth_header a;
        vl_error e = {0};
        FUZZ_CHECK(crypto_auth_parse(hdr, &a, &e) == VL_OK, "own header refused: %s", e.msg);
        FUZZ_CHECK(a.peer_id == 7 && a.ts == NOW, "fields changed");
        FUZZ_CHECK(crypto_verify_request(key.pk, &a, method, target, body, blen, NOW, &e) ==
                       VL_OK,
                   "own signature refused: %s", e.msg);
        FUZZ_CHECK(crypto_verify_request(key.pk, &a, method, target, body, blen,
                                         NOW + CRYPTO_TS_WINDOW_S + 1, &e) == VL_EAUTH,
                   "an old signature verifies");
        uint8_t *other = malloc(blen + 1);
        FUZZ_CHECK(other != NULL, "out of memory");
        memcpy(other, body, blen);
        other[blen] = 'x';
        FUZZ_CHECK(crypto_verify_request(key.pk, &a, method, target, other, blen + 1, NOW, &e) ==
                       VL_EAUTH,
                   "a longer body verifies");
        if (blen > 0) {
            other[0] ^= 1;
            FUZZ_CHECK(crypto_verify_request(key.pk, &a, method, target, other, blen, NOW, &e) ==
                           VL_EAUTH,
                       "a changed body verifies");
        }
        free(other);
        size_t tl = strlen(target);
        char *t2 = malloc(tl + 2);
        FUZZ_CHECK(t2 != NULL, "out of memory");
        memcpy(t2, target, tl);
        t2[tl] = '/';
        t2[tl + 1] = '\0';
        FUZZ_CHECK(crypto_verify_request(key.pk, &a, method, t2, body, blen, NOW, &e) == VL_EAUTH,
                   "another target verifies");
        free(t2);
        size_t ml = strlen(method);
        char *m2 = malloc(ml + 2);
        FUZZ_CHECK(m2 != NULL, "out of memory");
        memcpy(m2, method, ml);
        m2[ml] = 'X';
        m2[ml + 1] = '\0';
        FUZZ_CHECK(crypto_verify_request(key.pk, &a, m2, target, body, blen, NOW, &e) == VL_EAUTH,
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
