/* Replays and signatures over the wire, signed as any RFC 9421 signer
 * could: an expires given and past (0 included) is stale; an
 * intermediary's member before the peer's does not make an honest request
 * fail, while the foreign member alone is refused; each component the
 * docs require is required even when the signature verifies; and a
 * request created near the far edge of the window is a replay when sent
 * again. That it stays one across rotations and a restart is
 * test_nonce_log's (it needs the clock to move by minutes). */
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "attack.h"

/* The header lines of a request signed by c's key as c's peer over
 * exactly components (the inner list's content) with params after it (a
 * fresh nonce is added), for the target as sent. body non-NULL adds its
 * Content-Digest (curl sends the Content-Length). foreign_in/foreign_sig,
 * when set, are another signer's members put first. 0, or -1 when they do
 * not fit. */
static int custom_lines(const ctx *c, const char *method, const char *target, const void *body,
                        size_t len, const char *components, const char *params,
                        const char *foreign_in, const char *foreign_sig, char *out, size_t cap) {
    char nonce[VCRYPTO_NONCE_HEX + 1], input[VCRYPTO_SIG_HEADER_MAX], b64[VCRYPTO_SIG_B64_LEN + 1];
    char digest[VCRYPTO_DIGEST_HEADER_MAX] = "", clen[24], zero_sig[VCRYPTO_SIG_B64_LEN + 16];
    vcrypto_random_hex(VCRYPTO_NONCE_HEX / 2, nonce);
    int n = snprintf(input, sizeof input, "sig1=(%s)%s;nonce=\"%s\"", components, params, nonce);
    if (n < 0 || (size_t)n >= sizeof input) return -1;
    uint8_t raw[VCRYPTO_SIG_BYTES] = {0};
    vl_base64_encode(raw, sizeof raw, b64);
    snprintf(zero_sig, sizeof zero_sig, "sig1=:%s:", b64);
    vcrypto_sig s;
    vl_error e = {0};
    if (vcrypto_sig_parse(input, zero_sig, &s, &e) != VL_OK) return -1;
    if (body && vcrypto_content_digest(body, len, digest, sizeof digest) != VL_OK) return -1;
    snprintf(clen, sizeof clen, "%zu", len);
    vcrypto_http_request rq = {.method = method,
                               .path_query = target,
                               .content_digest = body ? digest : NULL,
                               .content_length = body ? clen : NULL};
    vl_buf base;
    vl_buf_init(&base, 1 << 16);
    int rc = vcrypto_sig_base(&s, vcrypto_http_request_lookup, &rq, &base, &e);
    if (rc == VL_OK) crypto_sign_detached(raw, NULL, base.data, base.len, c->id.sk);
    vl_buf_free(&base);
    if (rc != VL_OK) return -1;
    vl_base64_encode(raw, sizeof raw, b64);
    n = snprintf(out, cap, "Signature-Input: %s%s%s\nSignature: %s%ssig1=:%s:%s%s",
                 foreign_in ? foreign_in : "", foreign_in ? ", " : "", input,
                 foreign_sig ? foreign_sig : "", foreign_sig ? ", " : "", b64,
                 body ? "\nContent-Digest: " : "", digest);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* GET target with the lines of custom_lines, expected to answer status/code. */
static void custom_get(const ctx *c, const char *name, const char *target, const char *components,
                       const char *params, const char *foreign_in, const char *foreign_sig,
                       long status, const char *code) {
    char lines[ATTACK_SIG_LINES];
    if (custom_lines(c, "GET", target, NULL, 0, components, params, foreign_in, foreign_sig, lines,
                     sizeof lines) != 0)
        abort();
    reply r;
    request(c, "GET", target, lines, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect(name, &r, status, code);
}

void attack_replay(ctx *c) {
    char params[256], lines[ATTACK_SIG_LINES];
    int64_t now = vl_clock_unix_s();
    const char *get_cov = "\"@method\" \"@path\" \"@query\"";
    reply r;

    /* expires: given is a time, 0 included. */
    snprintf(params, sizeof params, ";created=%lld;expires=0;keyid=\"%lld\";alg=\"ed25519\"",
             (long long)now, (long long)c->peer);
    custom_get(c, "expires=0 (given, long past)", "/v1/model", get_cov, params, NULL, NULL, 401,
               "stale_timestamp");
    snprintf(params, sizeof params, ";created=%lld;expires=%lld;keyid=\"%lld\";alg=\"ed25519\"",
             (long long)now, (long long)now - 10, (long long)c->peer);
    custom_get(c, "expires 10 s ago", "/v1/model", get_cov, params, NULL, NULL, 401,
               "stale_timestamp");
    snprintf(params, sizeof params, ";created=%lld;expires=%lld;keyid=\"%lld\";alg=\"ed25519\"",
             (long long)now, (long long)now + 120, (long long)c->peer);
    custom_get(c, "expires in 120 s (control)", "/v1/model", get_cov, params, NULL, NULL, 200,
               NULL);

    /* An intermediary's signature first, of ed25519 under its own key id,
     * and one of another algorithm; then the proxy's alone. */
    uint8_t junk[256];
    randombytes_buf(junk, sizeof junk);
    char b64_64[VCRYPTO_SIG_B64_LEN + 1], b64_256[400], fin[512], fsig[512];
    vl_base64_encode(junk, 64, b64_64);
    vl_base64_encode(junk, sizeof junk, b64_256);
    snprintf(params, sizeof params, ";created=%lld;keyid=\"%lld\";alg=\"ed25519\"", (long long)now,
             (long long)c->peer);
    snprintf(fin, sizeof fin,
             "edge=(\"@method\" \"@path\" \"@query\");created=%lld;keyid=\"edge-proxy-1\";"
             "nonce=\"edge0123456789abcdef\";alg=\"ed25519\"",
             (long long)now);
    snprintf(fsig, sizeof fsig, "edge=:%s:", b64_64);
    custom_get(c, "a proxy's ed25519 member before the peer's", "/v1/model", get_cov, params, fin,
               fsig, 200, NULL);
    char alone[1200];
    snprintf(alone, sizeof alone, "Signature-Input: %s\nSignature: %s", fin, fsig);
    request(c, "GET", "/v1/model", alone, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("only the proxy's member", &r, 401, "unknown_peer");
    char fin2[512], fsig2[512];
    snprintf(fin2, sizeof fin2,
             "rsa=(\"@method\" \"@authority\";req);created=%lld;keyid=\"edge\";"
             "alg=\"rsa-pss-sha512\"",
             (long long)now);
    snprintf(fsig2, sizeof fsig2, "rsa=:%s:", b64_256);
    custom_get(c, "an rsa-pss member (with ;req) before the peer's", "/v1/model", get_cov, params,
               fin2, fsig2, 200, NULL);

    /* Components the docs require, left out of a signature that verifies. */
    const char *body = "{}";
    const struct {
        const char *name, *components;
    } post_cases[] = {
        {"POST not covering content-digest", "\"@method\" \"@path\" \"@query\" \"content-length\""},
        {"POST not covering content-length", "\"@method\" \"@path\" \"@query\" \"content-digest\""},
        {"POST not covering @method", "\"@path\" \"@query\" \"content-digest\" \"content-length\""},
        {"POST not covering @query", "\"@method\" \"@path\" \"content-digest\" \"content-length\""},
    };
    for (size_t i = 0; i < sizeof post_cases / sizeof post_cases[0]; i++) {
        if (custom_lines(c, "POST", "/v1/updates", body, strlen(body), post_cases[i].components,
                         params, NULL, NULL, lines, sizeof lines) != 0)
            abort();
        request(c, "POST", "/v1/updates", lines, body, strlen(body), NULL, 0, NULL, c->peer, 0, &r);
        expect(post_cases[i].name, &r, 401, "unauthorized");
    }
    custom_get(c, "GET not covering @method", "/v1/model", "\"@path\" \"@query\"", params, NULL,
               NULL, 401, "unauthorized");
    custom_get(c, "GET covering @path but not @query", "/v1/task?wait=1", "\"@method\" \"@path\"",
               params, NULL, NULL, 401, "unauthorized");
    custom_get(c, "GET covering @request-target (control)", "/v1/model",
               "\"@method\" \"@request-target\"", params, NULL, NULL, 200, NULL);

    /* Created near the far edge of the window: accepted once, then a
     * replay (its nonce is kept until created + window, not arrival +
     * window). */
    if (sign_lines(&c->id, c->peer, "GET", "/v1/model", NULL, 0, now + VCRYPTO_TS_WINDOW_S - 10,
                   lines, sizeof lines) != 0)
        abort();
    request(c, "GET", "/v1/model", lines, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("created 290 s ahead (control)", &r, 200, NULL);
    request(c, "GET", "/v1/model", lines, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("created 290 s ahead, sent again", &r, 401, "replayed_nonce");
}
