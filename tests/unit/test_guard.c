/* coordinator: the input guard's head parsing and stream rewriting, which
 * every request passes before libevent sees it. None of it needs a socket. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"
#include "coordinator/conn/guard.h"
#include "crypto/crypto.h"
#include "coordinator/conn/guard_types.h"

#define CAP 100
#define HEAD_CAP 256

/* ---- guard ---------------------------------------------------------------- */

/* Feeds s to a fresh guard in chunks of step bytes (0: all at once) and
 * returns what the HTTP parser would see, as a heap string. */
static char *guard_run(const char *s, size_t len, size_t step, coord_guard *g) {
    vl_buf out;
    vl_buf_init(&out, 1 << 20);
    static const char *const large[] = {"/up", NULL};
    coord_guard_caps caps = {.body_cap = CAP, .large_paths = large, .large_cap = 10 * CAP};
    coord_guard_init(g, HEAD_CAP, &caps);
    if (step == 0) step = len ? len : 1;
    for (size_t i = 0; i < len; i += step) {
        size_t n = len - i < step ? len - i : step;
        assert_int_equal(coord_guard_feed(g, (const uint8_t *)s + i, n, &out), VL_OK);
    }
    size_t n;
    char *text = (char *)vl_buf_steal(&out, &n);
    if (!text) text = calloc(1, 1);
    return text;
}

static char *guard_once(const char *s, coord_guard *g) {
    return guard_run(s, strlen(s), 0, g);
}

static void expect_refusal(const char *input, const char *reqline, const char *verdict) {
    coord_guard g;
    char *out = guard_once(input, &g);
    char want[512];
    snprintf(want, sizeof want, "%s\r\nContent-Length: 0\r\nConnection: close\r\n%s: %s\r\n\r\n",
             reqline, COORD_GUARD_HEADER, verdict);
    assert_string_equal(out, want);
    assert_int_equal(g.state, COORD_GUARD_DISCARD);
    assert_true(coord_guard_idle(&g));
    free(out);
    coord_guard_free(&g);
}

static void test_guard_over_cap_content_length(void **state) {
    (void)state;
    /* The body and a following request are both dropped, unread. */
    expect_refusal("POST /v1/updates HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n"
                   "0123456789GET /v1/status HTTP/1.1\r\n\r\n",
                   "POST /v1/updates HTTP/1.1", "too_large");
    /* Exactly the cap is fine. */
    coord_guard g;
    const char *ok = "POST /v1/updates HTTP/1.1\r\nContent-Length: 100\r\n\r\n";
    char *out = guard_once(ok, &g);
    assert_string_equal(out, ok);
    assert_int_equal(g.state, COORD_GUARD_IN_BODY);
    assert_int_equal(g.body_left, 100);
    assert_false(coord_guard_idle(&g));
    free(out);
    coord_guard_free(&g);
    /* The upload path alone takes the large cap, whatever its query. */
    const char *up = "POST /up?x=1 HTTP/1.1\r\nContent-Length: 1000\r\n\r\n";
    out = guard_once(up, &g);
    assert_string_equal(out, up);
    assert_int_equal(g.body_left, 1000);
    free(out);
    coord_guard_free(&g);
    expect_refusal("POST /up HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", "POST /up HTTP/1.1",
                   "too_large");
    expect_refusal("POST /upx HTTP/1.1\r\nContent-Length: 101\r\n\r\n", "POST /upx HTTP/1.1",
                   "too_large");
    /* Huge values are refused, not wrapped. */
    expect_refusal("POST / HTTP/1.1\r\nContent-Length: 9999999999999999999\r\n\r\n",
                   "POST / HTTP/1.1", "too_large");
}

static void test_guard_chunked_and_missing_length(void **state) {
    (void)state;
    expect_refusal("POST /v1/updates HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "5\r\nhello\r\n0\r\n\r\n",
                   "POST /v1/updates HTTP/1.1", "length_required");
    /* Transfer-Encoding wins over a Content-Length beside it (smuggling). */
    expect_refusal("POST /x HTTP/1.1\r\nContent-Length: 5\r\ntransfer-encoding: gzip\r\n\r\n",
                   "POST /x HTTP/1.1", "length_required");
    expect_refusal("POST /v1/peers HTTP/1.1\r\nHost: x\r\n\r\n", "POST /v1/peers HTTP/1.1",
                   "length_required");
    /* A GET without a length has no body and passes. */
    coord_guard g;
    const char *get = "GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n";
    char *out = guard_once(get, &g);
    assert_string_equal(out, get);
    assert_true(coord_guard_idle(&g));
    free(out);
    coord_guard_free(&g);
}

static void test_guard_bad_content_length(void **state) {
    (void)state;
    expect_refusal("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
                   "POST / HTTP/1.1", "bad_length");
    expect_refusal("POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 6\r\n\r\nhello",
                   "POST / HTTP/1.1", "bad_length");
    const char *bad[] = {"12a", "+5", "-1", "5, 5", "", "0x10", "1 2", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char in[128];
        snprintf(in, sizeof in, "POST / HTTP/1.1\r\nContent-Length: %s\r\n\r\n", bad[i]);
        expect_refusal(in, "POST / HTTP/1.1", "bad_length");
    }
    /* HEAD and TRACE have no body as the HTTP parser reads them, so one
     * would be parsed as the next request; an empty one is harmless. */
    expect_refusal("HEAD / HTTP/1.1\r\nContent-Length: 4\r\n\r\nXYZ / HTTP/1.1\r\n\r\n",
                   "HEAD / HTTP/1.1", "body_not_allowed");
    expect_refusal("TRACE / HTTP/1.1\r\nContent-Length: 1\r\n\r\nx", "TRACE / HTTP/1.1",
                   "body_not_allowed");
    assert_int_equal(coord_guard_verdict_parse("body_not_allowed"), COORD_GUARD_BODY_NOT_ALLOWED);
    /* Optional whitespace around the value is allowed. */
    coord_guard g;
    const char *empty = "HEAD / HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
    char *eout = guard_once(empty, &g);
    assert_string_equal(eout, empty);
    free(eout);
    coord_guard_free(&g);
    const char *ws = "POST / HTTP/1.1\r\nContent-Length: \t3 \r\n\r\nabc";
    char *out = guard_once(ws, &g);
    assert_string_equal(out, ws);
    assert_true(coord_guard_idle(&g));
    free(out);
    coord_guard_free(&g);
}

static void test_guard_malformed_heads(void **state) {
    (void)state;
    /* Folded line, space before the colon, bare CR, control byte, no colon. */
    expect_refusal("POST / HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n", "POST / HTTP/1.1", "bad_head");
    expect_refusal("POST / HTTP/1.1\r\nContent-Length : 5\r\n\r\nhello", "POST / HTTP/1.1",
                   "bad_head");
    expect_refusal("GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n", "GET / HTTP/1.1", "bad_head");
    expect_refusal("GET / HTTP/1.1\r\nX-A: a\x01"
                   "b\r\n\r\n",
                   "GET / HTTP/1.1", "bad_head");
    expect_refusal("GET / HTTP/1.1\r\nnocolon\r\n\r\n", "GET / HTTP/1.1", "bad_head");
    /* Request lines the parser might read differently get a synthetic one. */
    expect_refusal("\r\nGET / HTTP/1.1\r\n\r\n", "GET / HTTP/1.1", "bad_head");
    expect_refusal("GET /  HTTP/1.1\r\n\r\n", "GET / HTTP/1.1", "bad_head");
    expect_refusal("GET / HTTP/2.0\r\n\r\n", "GET / HTTP/1.1", "bad_head");
    expect_refusal("GET /a\rb HTTP/1.1\r\n\r\n", "GET / HTTP/1.1", "bad_head");
    expect_refusal("BREW /pot HTTP/1.1\r\n\r\n", "GET / HTTP/1.1", "bad_method");
    /* Only origin-form targets; only the 100-continue expectation. */
    expect_refusal("GET http://x/v1/status HTTP/1.1\r\n\r\n", "GET / HTTP/1.1", "bad_head");
    expect_refusal("OPTIONS * HTTP/1.1\r\n\r\n", "GET / HTTP/1.1", "bad_head");
    /* Found by fuzz_http: libevent reads "//..." as an authority, and a
     * CONNECT target as nothing but one, and answers both in HTML. */
    expect_refusal("GET //\"\"s1vt HTTP/1.1\r\n\r\n", "GET / HTTP/1.1", "bad_head");
    expect_refusal("CONNECT /v1/task HTTP/1.1\r\n\r\n", "GET / HTTP/1.1", "bad_method");
    expect_refusal("POST /up HTTP/1.1\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\nx",
                   "POST /up HTTP/1.1", "bad_head");
    coord_guard g;
    const char *cont = "POST /up HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\nx";
    char *out = guard_once(cont, &g);
    assert_string_equal(out, cont);
    free(out);
    coord_guard_free(&g);
}

static void test_guard_head_too_large(void **state) {
    (void)state;
    char in[1024];
    char filler[600];
    memset(filler, 'a', sizeof filler - 1);
    filler[sizeof filler - 1] = '\0';
    snprintf(in, sizeof in, "GET /v1/status HTTP/1.1\r\nX-Long: %s\r\n\r\n", filler);
    expect_refusal(in, "GET /v1/status HTTP/1.1", "head_too_large");
    /* Byte by byte the result is the same. */
    coord_guard g;
    char *out = guard_run(in, strlen(in), 1, &g);
    assert_non_null(strstr(out, "head_too_large"));
    assert_int_equal(g.state, COORD_GUARD_DISCARD);
    free(out);
    coord_guard_free(&g);
    /* Without even a complete request line. */
    memset(in, 'A', 400);
    in[400] = '\0';
    expect_refusal(in, "GET / HTTP/1.1", "head_too_large");
}

static void test_guard_strips_client_marker(void **state) {
    (void)state;
    coord_guard g;
    char *out = guard_once("GET /v1/status HTTP/1.1\r\nHost: x\r\n"
                           "x-volley-guard: too_large\r\nAccept: */*\r\n\r\n",
                           &g);
    assert_string_equal(out, "GET /v1/status HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n");
    assert_true(coord_guard_idle(&g));
    free(out);
    coord_guard_free(&g);
}

/* Two requests with bodies back to back on one connection pass through
 * unchanged however the bytes are split, and the guard ends between
 * requests. Body bytes that look like a request head are not parsed. */
static void test_guard_keepalive_pipelining(void **state) {
    (void)state;
    const char *in = "POST /v1/updates HTTP/1.1\r\nHost: x\r\nContent-Length: 29\r\n\r\n"
                     "GET /evil HTTP/1.1\r\nX: y\r\n\r\n\n"
                     "POST /v1/peers HTTP/1.1\nContent-Length: 4\n\n{}\r\n"
                     "GET /v1/status HTTP/1.1\r\n\r\n";
    size_t len = strlen(in);
    size_t steps[] = {0, 1, 2, 3, 7, 13, 64};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        coord_guard g;
        char *out = guard_run(in, len, steps[i], &g);
        assert_string_equal(out, in);
        assert_int_equal(g.requests, 3);
        assert_true(coord_guard_idle(&g));
        assert_int_equal(g.state, COORD_GUARD_IN_HEAD);
        free(out);
        coord_guard_free(&g);
    }
    /* A refused second request stops the stream right there. */
    const char *two = "POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nok"
                      "POST /b HTTP/1.1\r\nContent-Length: 500\r\n\r\nxxxx";
    coord_guard g;
    char *out = guard_once(two, &g);
    assert_string_equal(out, "POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nok"
                             "POST /b HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n"
                             "X-Volley-Guard: too_large\r\n\r\n");
    free(out);
    coord_guard_free(&g);
}

static void test_guard_parse_head_direct(void **state) {
    (void)state;
    coord_guard_head h;
    const char *head = "PUT /x HTTP/1.0\r\nContent-Length: 42\r\nX-Volley-Guard: ok\r\n\r\n";
    coord_guard_caps caps = {.body_cap = 1000};
    coord_guard_parse_head((const uint8_t *)head, strlen(head), &caps, &h);
    assert_int_equal(h.verdict, COORD_GUARD_OK);
    assert_int_equal(h.body_len, 42);
    assert_int_equal(h.has_marker, 1);
    assert_int_equal(h.reqline_len, strlen("PUT /x HTTP/1.0"));
    /* Incomplete input is never read past its end. */
    coord_guard_parse_head((const uint8_t *)head, 20, &caps, &h);
    assert_int_equal(h.verdict, COORD_GUARD_BAD_HEAD);
    assert_string_equal(coord_guard_verdict_name(COORD_GUARD_TOO_LARGE), "too_large");
    assert_int_equal(coord_guard_verdict_parse("length_required"), COORD_GUARD_LENGTH_REQUIRED);
    assert_int_equal(coord_guard_verdict_parse("nonsense"), COORD_GUARD_BAD_HEAD);
}

/* ---- authorization on the head, tickets and body digests ------------------ */

/* The test's own authorizer, standing in for the coordinator's: it accepts
 * heads whose target starts with "/ok" as peer 7 (taking the
 * Content-Digest the head names), refuses the rest with 401, and counts
 * calls. The real one is exercised in test_auth. */
static int n_authorized;
static int ok_path_authorize(void *arg, coord_guard *g, const uint8_t *head, size_t len,
                             coord_guard_ticket *t, coord_guard_refusal *r) {
    (void)arg;
    (void)g;
    n_authorized++;
    if (len < 8 || memcmp(strchr((const char *)head, ' ') + 1, "/ok", 3) != 0) {
        r->status = 401;
        snprintf(r->code, sizeof r->code, "bad_signature");
        snprintf(r->msg, sizeof r->msg, "no");
        return -1;
    }
    char v[VCRYPTO_DIGEST_HEADER_MAX];
    int n = coord_guard_head_field(head, len, "Content-Digest", v, sizeof v);
    vl_error e = {0};
    if (n > 0) assert_int_equal(vcrypto_digest_parse(v, &t->want, &e), VL_OK);
    t->peer_id = 7;
    return 0;
}

static char *guard_auth_run(const char *s, size_t step, coord_guard *g) {
    vl_buf out;
    vl_buf_init(&out, 1 << 20);
    coord_guard_caps caps = {.body_cap = 1000, .authorize = ok_path_authorize};
    coord_guard_init(g, HEAD_CAP, &caps);
    size_t len = strlen(s);
    if (step == 0) step = len;
    for (size_t i = 0; i < len; i += step) {
        size_t n = len - i < step ? len - i : step;
        assert_int_equal(coord_guard_feed(g, (const uint8_t *)s + i, n, &out), VL_OK);
    }
    size_t n;
    char *text = (char *)vl_buf_steal(&out, &n);
    return text ? text : calloc(1, 1);
}

/* Accepted heads are numbered with the ticket header (a client's own copy
 * of it is dropped); the body is hashed however it is split, and each
 * ticket says whether its body matched its Content-Digest. */
static void test_guard_tickets_and_digests(void **state) {
    (void)state;
    char good[VCRYPTO_DIGEST_HEADER_MAX];
    assert_int_equal(vcrypto_content_digest("hello", 5, good, sizeof good), VL_OK);
    char in[1024];
    snprintf(in, sizeof in,
             "POST /ok/a HTTP/1.1\r\nX-Volley-Guard-Ticket: 99\r\nContent-Digest: %s\r\n"
             "Content-Length: 5\r\n\r\nhello"
             "POST /ok/b HTTP/1.1\r\nContent-Digest: %s\r\nContent-Length: 5\r\n\r\nhellO"
             "GET /ok/c HTTP/1.1\r\n\r\n",
             good, good);
    size_t steps[] = {0, 1, 3, 17};
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        coord_guard g;
        n_authorized = 0;
        char *out = guard_auth_run(in, steps[k], &g);
        assert_int_equal(n_authorized, 3);
        assert_null(strstr(out, "Ticket: 99"));
        assert_non_null(strstr(out, "POST /ok/a HTTP/1.1\r\n"));
        assert_non_null(strstr(out, COORD_GUARD_TICKET_HEADER ": 1\r\n\r\nhello"));
        assert_non_null(strstr(out, COORD_GUARD_TICKET_HEADER ": 2\r\n\r\nhellO"));
        assert_non_null(strstr(out, "GET /ok/c HTTP/1.1\r\n" COORD_GUARD_TICKET_HEADER ": 3"));
        coord_guard_ticket t;
        assert_int_equal(coord_guard_ticket_take(&g, 1, &t), VL_OK);
        assert_int_equal(t.peer_id, 7);
        assert_int_equal(t.digest, COORD_GUARD_DIGEST_OK);
        assert_int_equal(coord_guard_ticket_take(&g, 1, &t), VL_ENOTFOUND); /* once only */
        assert_int_equal(coord_guard_ticket_take(&g, 2, &t), VL_OK);
        assert_int_equal(t.digest, COORD_GUARD_DIGEST_MISMATCH);
        assert_int_equal(coord_guard_ticket_take(&g, 3, &t), VL_OK);
        assert_int_equal(t.digest, COORD_GUARD_DIGEST_NONE);
        assert_int_equal(coord_guard_ticket_take(&g, 4, &t), VL_ENOTFOUND);
        free(out);
        coord_guard_free(&g);
    }
}

/* A refused head never lets its body through and stops the connection;
 * more pipelined requests than tickets are refused too. */
static void test_guard_authorize_refusals(void **state) {
    (void)state;
    coord_guard g;
    char *out = guard_auth_run("POST /no HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody"
                               "GET /ok HTTP/1.1\r\n\r\n",
                               0, &g);
    assert_string_equal(out, "POST /no HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n"
                             "X-Volley-Guard: refused\r\n\r\n");
    assert_int_equal(g.refusal.status, 401);
    assert_string_equal(g.refusal.code, "bad_signature");
    free(out);
    coord_guard_free(&g);

    char in[1024] = "";
    size_t at = 0;
    for (int i = 0; i < COORD_GUARD_TICKETS + 1; i++)
        at += (size_t)snprintf(in + at, sizeof in - at, "GET /ok HTTP/1.1\r\n\r\n");
    out = guard_auth_run(in, 0, &g);
    assert_non_null(strstr(out, "X-Volley-Guard: pipelined"));
    assert_int_equal(g.state, COORD_GUARD_DISCARD);
    free(out);
    coord_guard_free(&g);
}

/* Repeated fields are combined as RFC 9110 says; names match without
 * case; a value over the cap is an error, not a cut. */
static void test_guard_head_field(void **state) {
    (void)state;
    const char *h = "GET / HTTP/1.1\r\nA: 1\r\nb:  two \r\na:3\r\n\r\n";
    char v[16];
    assert_int_equal(coord_guard_head_field((const uint8_t *)h, strlen(h), "a", v, sizeof v), 2);
    assert_string_equal(v, "1, 3");
    assert_int_equal(coord_guard_head_field((const uint8_t *)h, strlen(h), "B", v, sizeof v), 1);
    assert_string_equal(v, "two");
    assert_int_equal(coord_guard_head_field((const uint8_t *)h, strlen(h), "c", v, sizeof v), 0);
    assert_string_equal(v, "");
    assert_int_equal(coord_guard_head_field((const uint8_t *)h, strlen(h), "a", v, 4), VL_ETOOBIG);
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    if (vcrypto_init() != VL_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guard_over_cap_content_length),
        cmocka_unit_test(test_guard_chunked_and_missing_length),
        cmocka_unit_test(test_guard_bad_content_length),
        cmocka_unit_test(test_guard_malformed_heads),
        cmocka_unit_test(test_guard_head_too_large),
        cmocka_unit_test(test_guard_strips_client_marker),
        cmocka_unit_test(test_guard_keepalive_pipelining),
        cmocka_unit_test(test_guard_parse_head_direct),
        cmocka_unit_test(test_guard_tickets_and_digests),
        cmocka_unit_test(test_guard_authorize_refusals),
        cmocka_unit_test(test_guard_head_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
