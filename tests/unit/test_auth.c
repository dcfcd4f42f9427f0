/* coordinator: authentication on the request head (coord_auth_head), on a
 * real run database: an honest signed head is accepted with the signer's
 * ticket, and each refusal carries its status and code: a replayed nonce,
 * a creation time outside the window, another key, an unknown or revoked
 * peer, a signature that does not cover the target or the body, a body
 * without its digest. Then the whole head-and-body path through the
 * guard: a body that differs from its signed digest is marked on the
 * ticket. And the budgets of what requests may hold: bodies being
 * received, and files built for downloads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include "test_util.h"
#include "coordinator/coord.h"
#include "coordinator/cli/cli.h"
#include "coordinator/conn/guard.h"
#include "coordinator/conn/guard_types.h"
#include "coordinator/http/http.h"
#include "coordinator/run/run.h"
#include "coordinator/server.h"

typedef struct fixture {
    char *dir;
    char db[600];
    coord_server *srv;
    vcrypto_identity key, other;
    int64_t peer, revoked_peer;
    vcrypto_identity revoked_key;
} fixture;

static int setup(void **state) {
    if (vcrypto_init() != VL_OK) return -1;
    fixture *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    fx->dir = test_temp_dir("/tmp/volley-auth.XXXXXX");
    char corpus[600], cfg[600], text[1024];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", fx->dir);
    snprintf(cfg, sizeof cfg, "%s/run.json", fx->dir);
    snprintf(fx->db, sizeof fx->db, "%s/run.db", fx->dir);
    test_write_corpus(corpus, "the quick brown fox jumps. ");
    snprintf(text, sizeof text,
             "{\"name\": \"auth\", \"corpus\": \"%s\", \"model\": {\"vocab_size\": 256, "
             "\"block_size\": 16, \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16}, "
             "\"updates_per_version\": 1, \"max_versions\": 2, \"task_bytes\": 4096}",
             corpus);
    test_write_text(cfg, text);
    OK(coord_cmd_init(fx->db, cfg, &e_));
    OK(coord_server_open(fx->db, NULL, &fx->srv, &e_));
    vcrypto_identity_generate(&fx->key);
    vcrypto_identity_generate(&fx->other);
    vcrypto_identity_generate(&fx->revoked_key);
    OK(storage_peer_insert(fx->srv->run.db, fx->key.pk, "p", "{}", 0, vl_clock_unix_s(), &fx->peer,
                           &e_));
    OK(storage_peer_insert(fx->srv->run.db, fx->revoked_key.pk, "r", "{}", 0, vl_clock_unix_s(),
                           &fx->revoked_peer, &e_));
    OK(storage_peer_revoke(fx->srv->run.db, fx->revoked_peer, &e_));
    *state = fx;
    return 0;
}

static int teardown(void **state) {
    fixture *fx = *state;
    coord_server_close(fx->srv);
    test_remove_tree(fx->dir);
    free(fx->dir);
    free(fx);
    return 0;
}

/* A head as volley-peer sends it, signed by key as keyid at created;
 * body non-NULL makes it a POST with Content-Length and Content-Digest.
 * drop, when set, is a header line prefix left out after signing. */
static size_t make_head(char *out, size_t cap, const vcrypto_identity *key, const char *keyid,
                        const char *method, const char *target, const char *body, int64_t created,
                        const char *drop) {
    vcrypto_signed_headers sh;
    size_t blen = body ? strlen(body) : 0;
    assert_int_equal(
        vcrypto_sign_http(key, keyid, method, target, body != NULL, body, blen, created, &sh),
        VL_OK);
    char lines[4][VCRYPTO_SIG_HEADER_MAX + 64];
    int n = 0;
    snprintf(lines[n++], sizeof lines[0], "Signature-Input: %s\r\n", sh.signature_input);
    snprintf(lines[n++], sizeof lines[0], "Signature: %s\r\n", sh.signature);
    if (body) {
        snprintf(lines[n++], sizeof lines[0], "Content-Digest: %s\r\n", sh.content_digest);
        snprintf(lines[n++], sizeof lines[0], "Content-Length: %zu\r\n", blen);
    }
    int len = snprintf(out, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n", method, target);
    for (int i = 0; i < n; i++)
        if (!drop || strncmp(lines[i], drop, strlen(drop)) != 0)
            len += snprintf(out + len, cap - (size_t)len, "%s", lines[i]);
    len += snprintf(out + len, cap - (size_t)len, "\r\n");
    assert_true(len > 0 && (size_t)len < cap);
    return (size_t)len;
}

/* Runs coord_auth_head on head; returns its result and fills t and r. */
static int auth(fixture *fx, const char *head, size_t len, coord_guard_ticket *t,
                coord_guard_refusal *r) {
    coord_guard g;
    coord_guard_caps caps = {.body_cap = 1 << 20};
    coord_guard_init(&g, COORD_HEAD_CAP, &caps);
    memset(t, 0, sizeof *t);
    memset(r, 0, sizeof *r);
    int rc = coord_auth_head(fx->srv, &g, (const uint8_t *)head, len, t, r);
    coord_guard_free(&g);
    return rc;
}

static void expect_refused(fixture *fx, const char *head, size_t len, int status,
                           const char *code) {
    coord_guard_ticket t;
    coord_guard_refusal r;
    assert_int_equal(auth(fx, head, len, &t, &r), -1);
    if (r.status != status || strcmp(r.code, code) != 0)
        fail_msg("expected %d %s, got %d %s (%s)", status, code, r.status, r.code, r.msg);
}

static void test_honest_then_replayed(void **state) {
    fixture *fx = *state;
    char id[24], head[4096];
    snprintf(id, sizeof id, "%lld", (long long)fx->peer);
    size_t n = make_head(head, sizeof head, &fx->key, id, "GET", "/v1/task?wait=5", NULL,
                         vl_clock_unix_s(), NULL);
    coord_guard_ticket t;
    coord_guard_refusal r;
    assert_int_equal(auth(fx, head, n, &t, &r), 0);
    assert_int_equal(t.peer_id, fx->peer);
    assert_int_equal(t.want.alg, 0);
    /* The same head again: its nonce is spent. */
    expect_refused(fx, head, n, 401, "replayed_nonce");
}

static void test_clock_window(void **state) {
    fixture *fx = *state;
    char id[24], head[4096];
    snprintf(id, sizeof id, "%lld", (long long)fx->peer);
    int64_t now = vl_clock_unix_s();
    size_t n = make_head(head, sizeof head, &fx->key, id, "GET", "/v1/model", NULL,
                         now - VCRYPTO_TS_WINDOW_S - 5, NULL);
    expect_refused(fx, head, n, 401, "stale_timestamp");
    n = make_head(head, sizeof head, &fx->key, id, "GET", "/v1/model", NULL,
                  now + VCRYPTO_TS_WINDOW_S + 5, NULL);
    expect_refused(fx, head, n, 401, "stale_timestamp");
    /* Inside the window, a little behind: accepted. */
    n = make_head(head, sizeof head, &fx->key, id, "GET", "/v1/model", NULL, now - 200, NULL);
    coord_guard_ticket t;
    coord_guard_refusal r;
    assert_int_equal(auth(fx, head, n, &t, &r), 0);
}

static void test_wrong_signers(void **state) {
    fixture *fx = *state;
    char id[24], head[4096];
    int64_t now = vl_clock_unix_s();
    snprintf(id, sizeof id, "%lld", (long long)fx->peer);
    size_t n = make_head(head, sizeof head, &fx->other, id, "GET", "/v1/model", NULL, now, NULL);
    expect_refused(fx, head, n, 401, "bad_signature");
    n = make_head(head, sizeof head, &fx->key, "987654", "GET", "/v1/model", NULL, now, NULL);
    expect_refused(fx, head, n, 401, "unknown_peer");
    snprintf(id, sizeof id, "%lld", (long long)fx->revoked_peer);
    n = make_head(head, sizeof head, &fx->revoked_key, id, "GET", "/v1/model", NULL, now, NULL);
    expect_refused(fx, head, n, 403, "revoked");
    /* A join's key id (the key itself) names no peer elsewhere. */
    char pk[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(fx->key.pk, pk);
    n = make_head(head, sizeof head, &fx->key, pk, "GET", "/v1/model", NULL, now, NULL);
    expect_refused(fx, head, n, 401, "unknown_peer");
    /* No signature at all. */
    n = make_head(head, sizeof head, &fx->key, id, "GET", "/v1/model", NULL, now, "Signature");
    expect_refused(fx, head, n, 401, "unauthorized");
}

static void test_coverage_and_digest(void **state) {
    fixture *fx = *state;
    char id[24], head[4096];
    int64_t now = vl_clock_unix_s();
    snprintf(id, sizeof id, "%lld", (long long)fx->peer);
    /* The head is changed after signing: another target. */
    size_t n =
        make_head(head, sizeof head, &fx->key, id, "GET", "/v1/task?wait=1", NULL, now, NULL);
    char *q = strstr(head, "wait=1");
    q[5] = '9';
    expect_refused(fx, head, n, 401, "bad_signature");
    /* A POST whose Content-Digest line is left out. */
    n = make_head(head, sizeof head, &fx->key, id, "POST", "/v1/updates", "xyz", now,
                  "Content-Digest");
    expect_refused(fx, head, n, 400, "bad_digest");
    /* An honest POST: accepted, and the ticket carries the digest to check. */
    n = make_head(head, sizeof head, &fx->key, id, "POST", "/v1/updates", "xyz", now, NULL);
    coord_guard_ticket t;
    coord_guard_refusal r;
    assert_int_equal(auth(fx, head, n, &t, &r), 0);
    assert_int_equal(t.want.alg, VCRYPTO_DIGEST_SHA256);
    coord_auth_release(fx->srv, &t);
    /* A signature over fewer components than the policy asks for. */
    n = make_head(head, sizeof head, &fx->key, id, "GET", "/v1/model", NULL, now, NULL);
    char *p = strstr(head, "\"@path\" \"@query\"");
    assert_non_null(p);
    memmove(p, p + 16, strlen(p + 16) + 1);
    expect_refused(fx, head, strlen(head), 401, "unauthorized");
}

/* A head signed over exactly the components given (the inner list's
 * content) with the parameters given after it, as any RFC 9421 signer
 * could send; a fresh nonce is added. body non-NULL makes it carry
 * Content-Digest and Content-Length. foreign_in/foreign_sig, when set, are
 * another signer's members put before volley's in the two fields. */
static size_t custom_head(char *out, size_t cap, const vcrypto_identity *key, const char *method,
                          const char *target, const char *body, const char *components,
                          const char *params, const char *foreign_in, const char *foreign_sig) {
    char nonce[VCRYPTO_NONCE_HEX + 1], input[VCRYPTO_SIG_HEADER_MAX],
        digest[VCRYPTO_DIGEST_HEADER_MAX];
    char clen[24], zero_sig[VCRYPTO_SIG_B64_LEN + 16], b64[VCRYPTO_SIG_B64_LEN + 1];
    vcrypto_random_hex(VCRYPTO_NONCE_HEX / 2, nonce);
    int ni = snprintf(input, sizeof input, "sig1=(%s)%s;nonce=\"%s\"", components, params, nonce);
    assert_true(ni > 0 && (size_t)ni < sizeof input);
    uint8_t zero[VCRYPTO_SIG_BYTES] = {0};
    vl_base64_encode(zero, sizeof zero, b64);
    snprintf(zero_sig, sizeof zero_sig, "sig1=:%s:", b64);
    vcrypto_sig sig;
    OK(vcrypto_sig_parse(input, zero_sig, &sig, &e_));
    size_t blen = body ? strlen(body) : 0;
    if (body) OK(vcrypto_content_digest(body, blen, digest, sizeof digest));
    snprintf(clen, sizeof clen, "%zu", blen);
    vcrypto_http_request rq = {.method = method,
                               .path_query = target,
                               .authority = "127.0.0.1",
                               .content_digest = body ? digest : NULL,
                               .content_length = body ? clen : NULL};
    vl_buf base;
    vl_buf_init(&base, 1 << 16);
    OK(vcrypto_sig_base(&sig, vcrypto_http_request_lookup, &rq, &base, &e_));
    uint8_t raw[VCRYPTO_SIG_BYTES];
    crypto_sign_detached(raw, NULL, base.data, base.len, key->sk);
    vl_buf_free(&base);
    vl_base64_encode(raw, sizeof raw, b64);
    int len = snprintf(out, cap,
                       "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nSignature-Input: %s%s%s\r\n"
                       "Signature: %s%ssig1=:%s:\r\n",
                       method, target, foreign_in ? foreign_in : "", foreign_in ? ", " : "", input,
                       foreign_sig ? foreign_sig : "", foreign_sig ? ", " : "", b64);
    assert_true(len > 0 && (size_t)len < cap);
    if (body)
        len += snprintf(out + len, cap - (size_t)len,
                        "Content-Digest: %s\r\nContent-Length: %zu\r\n", digest, blen);
    len += snprintf(out + len, cap - (size_t)len, "\r\n");
    assert_true(len > 0 && (size_t)len < cap);
    return (size_t)len;
}

/* Accepted, with the body reservation handed back. */
static void expect_accepted(fixture *fx, const char *head, size_t len) {
    coord_guard_ticket t;
    coord_guard_refusal r;
    if (auth(fx, head, len, &t, &r) != 0)
        fail_msg("refused %d %s (%s):\n%s", r.status, r.code, r.msg, head);
    assert_int_equal(t.peer_id, fx->peer);
    coord_auth_release(fx->srv, &t);
}

/* Refused 401 unauthorized with a message that names what is missing. */
static void expect_uncovered(fixture *fx, const char *head, size_t len, const char *names) {
    coord_guard_ticket t;
    coord_guard_refusal r;
    if (auth(fx, head, len, &t, &r) != -1) {
        coord_auth_release(fx->srv, &t);
        fail_msg("accepted a signature that does not cover %s:\n%s", names, head);
    }
    if (r.status != 401 || strcmp(r.code, "unauthorized") != 0 || !strstr(r.msg, names))
        fail_msg("expected 401 unauthorized naming %s, got %d %s (%s)", names, r.status, r.code,
                 r.msg);
}

/* Each component protocol.md requires is required: a signature that
 * verifies but leaves one out is refused, and each accepted form of the
 * target passes. */
static void test_required_components(void **state) {
    fixture *fx = *state;
    char params[200], head[4096];
    snprintf(params, sizeof params, ";created=%lld;keyid=\"%lld\";alg=\"ed25519\"",
             (long long)vl_clock_unix_s(), (long long)fx->peer);
    const char *all = "\"@method\" \"@path\" \"@query\" \"content-digest\" \"content-length\"";
#define POST_WITH(c) \
    custom_head(head, sizeof head, &fx->key, "POST", "/v1/updates", "xyz", c, params, NULL, NULL)
#define GET_WITH(c) \
    custom_head(head, sizeof head, &fx->key, "GET", "/v1/task?wait=1", NULL, c, params, NULL, NULL)
    size_t n = POST_WITH(all);
    expect_accepted(fx, head, n);
    /* A body's digest and length. */
    n = POST_WITH("\"@method\" \"@path\" \"@query\" \"content-length\"");
    expect_uncovered(fx, head, n, "content-digest");
    n = POST_WITH("\"@method\" \"@path\" \"@query\" \"content-digest\"");
    expect_uncovered(fx, head, n, "content-length");
    /* The method, with and without a body. */
    n = POST_WITH("\"@path\" \"@query\" \"content-digest\" \"content-length\"");
    expect_uncovered(fx, head, n, "@method");
    n = GET_WITH("\"@path\" \"@query\"");
    expect_uncovered(fx, head, n, "@method");
    /* The whole target: @path alone, @query alone or neither is not it. */
    n = GET_WITH("\"@method\" \"@path\"");
    expect_uncovered(fx, head, n, "@target-uri");
    n = GET_WITH("\"@method\" \"@query\"");
    expect_uncovered(fx, head, n, "@target-uri");
    n = GET_WITH("\"@method\" \"@authority\"");
    expect_uncovered(fx, head, n, "@target-uri");
    n = POST_WITH("\"@method\" \"@path\" \"content-digest\" \"content-length\"");
    expect_uncovered(fx, head, n, "@target-uri");
    /* Each form of the whole target passes. */
    n = GET_WITH("\"@method\" \"@target-uri\"");
    expect_accepted(fx, head, n);
    n = GET_WITH("\"@request-target\" \"@method\"");
    expect_accepted(fx, head, n);
    n = GET_WITH("\"@method\" \"@path\" \"@query\"");
    expect_accepted(fx, head, n);
    n = POST_WITH("\"content-length\" \"@target-uri\" \"content-digest\" \"@method\"");
    expect_accepted(fx, head, n);
#undef POST_WITH
#undef GET_WITH
}

/* An expires parameter that is given is a time: in the past, 0 included,
 * it is refused as stale; in the future it passes; absent, none. */
static void test_expires(void **state) {
    fixture *fx = *state;
    char params[240], head[4096];
    int64_t now = vl_clock_unix_s();
    const char *cov = "\"@method\" \"@path\" \"@query\"";
    const long long past[] = {0, 1, (long long)now - 5};
    for (size_t i = 0; i < sizeof past / sizeof past[0]; i++) {
        snprintf(params, sizeof params, ";created=%lld;expires=%lld;keyid=\"%lld\"", (long long)now,
                 past[i], (long long)fx->peer);
        size_t n = custom_head(head, sizeof head, &fx->key, "GET", "/v1/model", NULL, cov, params,
                               NULL, NULL);
        coord_guard_ticket t;
        coord_guard_refusal r;
        if (auth(fx, head, n, &t, &r) != -1) fail_msg("expires=%lld was accepted", past[i]);
        if (r.status != 401 || strcmp(r.code, "stale_timestamp") != 0)
            fail_msg("expires=%lld: expected 401 stale_timestamp, got %d %s (%s)", past[i],
                     r.status, r.code, r.msg);
    }
    snprintf(params, sizeof params, ";created=%lld;expires=%lld;keyid=\"%lld\"", (long long)now,
             (long long)now + 60, (long long)fx->peer);
    size_t n =
        custom_head(head, sizeof head, &fx->key, "GET", "/v1/model", NULL, cov, params, NULL, NULL);
    expect_accepted(fx, head, n);
    snprintf(params, sizeof params, ";created=%lld;keyid=\"%lld\"", (long long)now,
             (long long)fx->peer);
    n = custom_head(head, sizeof head, &fx->key, "GET", "/v1/model", NULL, cov, params, NULL, NULL);
    expect_accepted(fx, head, n);
}

/* An intermediary's signature before the peer's does not make an honest
 * request fail: the member with volley's key id and algorithm is the one
 * checked. A request with only the foreign member is refused. */
static void test_foreign_member_first(void **state) {
    fixture *fx = *state;
    char params[200], head[4096], fin[300], fsig[200], b64[VCRYPTO_SIG_B64_LEN + 1];
    int64_t now = vl_clock_unix_s();
    snprintf(params, sizeof params, ";created=%lld;keyid=\"%lld\";alg=\"ed25519\"", (long long)now,
             (long long)fx->peer);
    uint8_t junk[VCRYPTO_SIG_BYTES];
    randombytes_buf(junk, sizeof junk);
    vl_base64_encode(junk, sizeof junk, b64);
    snprintf(fin, sizeof fin,
             "edge=(\"@method\" \"@path\" \"@query\");created=%lld;keyid=\"edge-proxy-1\";"
             "nonce=\"edge0123456789abcdef\";alg=\"ed25519\"",
             (long long)now);
    snprintf(fsig, sizeof fsig, "edge=:%s:", b64);
    const char *cov = "\"@method\" \"@path\" \"@query\" \"content-digest\" \"content-length\"";
    size_t n = custom_head(head, sizeof head, &fx->key, "POST", "/v1/updates", "xyz", cov, params,
                           fin, fsig);
    expect_accepted(fx, head, n);
    /* The foreign member alone: its key id is no peer's. */
    n = (size_t)snprintf(head, sizeof head,
                         "GET /v1/model HTTP/1.1\r\nHost: 127.0.0.1\r\nSignature-Input: %s\r\n"
                         "Signature: %s\r\n\r\n",
                         fin, fsig);
    expect_refused(fx, head, n, 401, "unknown_peer");
}

static void test_join_and_public(void **state) {
    fixture *fx = *state;
    char head[4096], pk[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(fx->other.pk, pk);
    size_t n = make_head(head, sizeof head, &fx->other, pk, "POST", "/v1/peers", "{}",
                         vl_clock_unix_s(), NULL);
    coord_guard_ticket t;
    coord_guard_refusal r;
    assert_int_equal(auth(fx, head, n, &t, &r), 0);
    assert_int_equal(t.join, 1);
    assert_int_equal(t.peer_id, 0);
    assert_memory_equal(t.join_pk, fx->other.pk, VCRYPTO_PK_BYTES);
    /* The status needs no signature. */
    const char *status = "GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(auth(fx, status, strlen(status), &t, &r), 0);
    assert_int_equal(t.peer_id, 0);
}

/* Head and body through the guard, as on a connection: the body that was
 * signed passes, a body of the same length with one byte changed is
 * marked on its ticket. */
static void test_body_digest_through_guard(void **state) {
    fixture *fx = *state;
    char id[24], head[4096];
    snprintf(id, sizeof id, "%lld", (long long)fx->peer);
    for (int tamper = 0; tamper < 2; tamper++) {
        size_t n = make_head(head, sizeof head, &fx->key, id, "POST", "/v1/updates", "0123456789",
                             vl_clock_unix_s(), NULL);
        snprintf(head + n, sizeof head - n, "%s", tamper ? "0123456780" : "0123456789");
        coord_guard g;
        coord_guard_caps caps = {.body_cap = 1 << 20,
                                 .authorize = coord_auth_head,
                                 .authorize_arg = fx->srv,
                                 .release = coord_auth_release};
        coord_guard_init(&g, COORD_HEAD_CAP, &caps);
        vl_buf out;
        vl_buf_init(&out, 1 << 20);
        OK(coord_guard_feed(&g, (const uint8_t *)head, strlen(head), &out));
        coord_guard_ticket t;
        OK(coord_guard_ticket_take(&g, 1, &t));
        assert_int_equal(t.peer_id, fx->peer);
        assert_int_equal(t.digest, tamper ? COORD_GUARD_DIGEST_MISMATCH : COORD_GUARD_DIGEST_OK);
        coord_auth_release(fx->srv, &t);
        vl_buf_free(&out);
        coord_guard_free(&g);
    }
}

/* One body at a time per peer, and a budget for all bodies being
 * received: a second upload head from the same peer is refused until the
 * first's ticket is released, and a head that would pass the budget gets
 * 503 overloaded; neither spends the request's nonce. */
static void test_body_budget(void **state) {
    fixture *fx = *state;
    char id[24], head[4096], again[4096];
    snprintf(id, sizeof id, "%lld", (long long)fx->peer);
    int64_t now = vl_clock_unix_s();
    size_t n =
        make_head(head, sizeof head, &fx->key, id, "POST", "/v1/updates", "0123456789", now, NULL);
    coord_guard_ticket t1, t;
    coord_guard_refusal r;
    assert_int_equal(auth(fx, head, n, &t1, &r), 0);
    assert_int_equal(t1.reserved, 10);
    assert_int_equal(fx->srv->conns.body_inflight, 10);
    size_t m = make_head(again, sizeof again, &fx->key, id, "POST", "/v1/updates", "abcdefghij",
                         now, NULL);
    expect_refused(fx, again, m, 429, "rate_limited");
    coord_auth_release(fx->srv, &t1);
    assert_int_equal(fx->srv->conns.body_inflight, 0);
    /* Refused for the peer's other body, not spent: the same head passes now. */
    assert_int_equal(auth(fx, again, m, &t, &r), 0);
    coord_auth_release(fx->srv, &t);
    int64_t budget = fx->srv->conns.limits.body_budget;
    fx->srv->conns.limits.body_budget = 5;
    n = make_head(head, sizeof head, &fx->key, id, "POST", "/v1/updates", "0123456789", now, NULL);
    expect_refused(fx, head, n, 503, "overloaded");
    fx->srv->conns.limits.body_budget = budget;
    assert_int_equal(auth(fx, head, n, &t, &r), 0);
    coord_auth_release(fx->srv, &t);
    assert_int_equal(fx->srv->conns.body_inflight, 0);
    assert_int_equal(fx->srv->conns.n_receiving, 0);
}

/* Readers of one old version share one built file, and building another
 * past the download budget is refused rather than allocated. */
static void test_download_sharing_and_budget(void **state) {
    fixture *fx = *state;
    coord_server *srv = fx->srv;
    int64_t current = srv->run.version;
    srv->run.version = current + 1; /* version 0 becomes an old one */
    coord_blob *a = NULL, *b = NULL;
    int64_t before = coord_blob_live_bytes();
    OK(coord_model_blob_version(srv, current, &a, &e_));
    OK(coord_model_blob_version(srv, current, &b, &e_));
    assert_ptr_equal(a, b);
    assert_true(coord_blob_live_bytes() - before == (int64_t)a->len); /* counted once */
    coord_blob_unref(a);
    coord_blob_unref(b);
    coord_blob_unref(srv->caches.old_blob);
    srv->caches.old_blob = NULL;
    assert_int_equal(coord_blob_live_bytes(), before);
    int64_t budget = srv->conns.limits.download_budget;
    srv->conns.limits.download_budget = before + 1;
    assert_false(coord_download_room(srv, 2));
    vl_error e = {0};
    assert_int_equal(coord_model_blob_version(srv, current, &a, &e), VL_ETOOBIG);
    srv->conns.limits.download_budget = budget;
    assert_true(coord_download_room(srv, 2));
    srv->run.version = current;
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_honest_then_replayed),
        cmocka_unit_test(test_clock_window),
        cmocka_unit_test(test_wrong_signers),
        cmocka_unit_test(test_coverage_and_digest),
        cmocka_unit_test(test_required_components),
        cmocka_unit_test(test_expires),
        cmocka_unit_test(test_foreign_member_first),
        cmocka_unit_test(test_join_and_public),
        cmocka_unit_test(test_body_digest_through_guard),
        cmocka_unit_test(test_body_budget),
        cmocka_unit_test(test_download_sharing_and_budget),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
