/* coordinator: the limits against abusive clients. The token buckets
 * (burst, refill, the time to the next token, independent keys, a bounded
 * table under a flood of keys, address keys), the guard's clock (a head
 * or a body that arrives too slowly, and the refusal that replaces a slow
 * head) on a clock the test drives, and the guard's refusal of request
 * targets that libevent would read as naming a host. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "test_util.h"
#include "coordinator/guard.h"
#include "coordinator/limiter.h"
#include "crypto/crypto.h"

static int setup(void **state) {
    (void)state;
    return crypto_init();
}

/* ---- token buckets ------------------------------------------------------- */

static double take(coord_limiter *l, int key, double now) {
    return coord_limiter_take(l, &key, sizeof key, now);
}

static void test_bucket_burst_and_refill(void **state) {
    (void)state;
    coord_limiter *l = coord_limiter_new(1024, (coord_rate){.rate = 2, .burst = 5});
    assert_non_null(l);
    for (int i = 0; i < 5; i++) assert_true(take(l, 1, 100.0) == 0);
    /* Empty: the next token is half a second away at 2 per second. */
    double wait = take(l, 1, 100.0);
    assert_true(wait > 0.49 && wait < 0.51);
    /* Another key has its own bucket. */
    assert_true(take(l, 2, 100.0) == 0);
    /* A quarter second later a quarter token is still missing. */
    wait = take(l, 1, 100.25);
    assert_true(wait > 0.24 && wait < 0.26);
    assert_true(take(l, 1, 100.5) == 0);
    assert_true(take(l, 1, 100.5) > 0);
    /* Refill is capped at the burst, however long the pause. */
    int allowed = 0;
    for (int i = 0; i < 20; i++) allowed += take(l, 1, 1000.0) == 0;
    assert_int_equal(allowed, 5);
    coord_limiter_free(l);
}

static void test_bucket_unlimited(void **state) {
    (void)state;
    coord_limiter *l = coord_limiter_new(1024, (coord_rate){.rate = 0, .burst = 0});
    assert_non_null(l);
    for (int i = 0; i < 100000; i++) assert_true(take(l, 7, 1.0) == 0);
    coord_limiter_free(l);
    assert_true(coord_limiter_take(NULL, "x", 1, 1.0) == 0);
}

/* A flood of distinct keys cannot grow the table, and it cannot lift a
 * drained key's limit by more than one burst: at most `burst` requests of
 * it go through afterwards, at the same instant. */
static void test_bucket_table_bounded(void **state) {
    (void)state;
    coord_limiter *l = coord_limiter_new(16, (coord_rate){.rate = 1, .burst = 3});
    assert_non_null(l);
    for (int i = 0; i < 3; i++) assert_true(take(l, -1, 50.0) == 0);
    assert_true(take(l, -1, 50.0) > 0);
    for (int k = 0; k < 200000; k++) assert_true(take(l, k, 50.0) == 0);
    int allowed = 0;
    for (int i = 0; i < 10; i++) allowed += take(l, -1, 50.0) == 0;
    assert_true(allowed <= 3);
    /* Keys that keep sending stay limited next to the flood. */
    int again = 0;
    for (int k = 0; k < 1000; k++) again += take(l, k % 4, 50.0) == 0;
    assert_true(again <= 4 * 3 * 2);
    coord_limiter_free(l);
}

static void test_address_keys(void **state) {
    (void)state;
    uint8_t a[COORD_ADDR_KEY_MAX], b[COORD_ADDR_KEY_MAX];
    struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_port = htons(1)};
    inet_pton(AF_INET, "192.0.2.7", &v4.sin_addr);
    struct sockaddr_in6 mapped = {.sin6_family = AF_INET6, .sin6_port = htons(2)};
    inet_pton(AF_INET6, "::ffff:192.0.2.7", &mapped.sin6_addr);
    size_t na = coord_limiter_addr_key((struct sockaddr *)&v4, a);
    size_t nb = coord_limiter_addr_key((struct sockaddr *)&mapped, b);
    /* The same client whichever socket family it came in on; ports do
     * not matter. */
    assert_int_equal(na, 5);
    assert_int_equal(nb, na);
    assert_memory_equal(a, b, na);
    /* IPv6: one /64 is one client, another /64 another. */
    struct sockaddr_in6 x = {.sin6_family = AF_INET6}, y = x, z = x;
    inet_pton(AF_INET6, "2001:db8:1:2::1", &x.sin6_addr);
    inet_pton(AF_INET6, "2001:db8:1:2:ffff:ffff:ffff:ffff", &y.sin6_addr);
    inet_pton(AF_INET6, "2001:db8:1:3::1", &z.sin6_addr);
    na = coord_limiter_addr_key((struct sockaddr *)&x, a);
    nb = coord_limiter_addr_key((struct sockaddr *)&y, b);
    assert_int_equal(na, 9);
    assert_int_equal(nb, na);
    assert_memory_equal(a, b, na);
    nb = coord_limiter_addr_key((struct sockaddr *)&z, b);
    assert_memory_not_equal(a, b, na);
    struct sockaddr other = {.sa_family = AF_UNIX};
    assert_int_equal(coord_limiter_addr_key(&other, a), 0);
    assert_int_equal(coord_limiter_addr_key(NULL, a), 0);
}

/* ---- the guard's clock --------------------------------------------------- */

static double fake_now;
static double fake_clock(void) {
    return fake_now;
}

static void guard_with_clock(coord_guard *g, double timeout, double rate) {
    coord_guard_caps caps = {
        .body_cap = 1 << 20, .slow_timeout_s = timeout, .min_body_rate = rate, .clock = fake_clock};
    coord_guard_init(g, 4096, &caps);
}

static void feed(coord_guard *g, const char *s, vl_buf *out) {
    assert_int_equal(coord_guard_feed(g, (const uint8_t *)s, strlen(s), out), VL_OK);
}

/* A head trickling in is refused once it has taken longer than the limit
 * from its first byte, with its request line kept for the log; a head
 * that completes in time, and an idle connection, are never. */
static void test_guard_slow_head(void **state) {
    (void)state;
    coord_guard g;
    vl_buf out;
    vl_buf_init(&out, 1 << 16);
    guard_with_clock(&g, 30, 1000);
    fake_now = 100;
    assert_int_equal(coord_guard_check_time(&g, 1000), COORD_GUARD_OK); /* idle */
    feed(&g, "GET /v1/task HTTP/1.1\r\nHost: x\r\n", &out);
    fake_now = 120;
    feed(&g, "X-Slow: 1\r\n", &out);
    assert_int_equal(coord_guard_check_time(&g, 129.9), COORD_GUARD_OK);
    assert_int_equal(coord_guard_check_time(&g, 130.1), COORD_GUARD_HEAD_TIMEOUT);
    assert_int_equal(out.len, 0); /* nothing of it was passed on */
    assert_int_equal(coord_guard_expire_head(&g, &out), VL_OK);
    char want[256];
    snprintf(want, sizeof want,
             "GET /v1/task HTTP/1.1\r\nContent-Length: 0\r\nConnection: "
             "close\r\n%s: head_timeout\r\n\r\n",
             COORD_GUARD_HEADER);
    assert_int_equal(out.len, strlen(want));
    assert_memory_equal(out.data, want, out.len);
    assert_int_equal(g.state, COORD_GUARD_DISCARD);
    assert_int_equal(coord_guard_verdict_parse("head_timeout"), COORD_GUARD_HEAD_TIMEOUT);
    /* Whatever the client sends later is dropped. */
    vl_buf_reset(&out);
    feed(&g, "\r\nGET / HTTP/1.1\r\n\r\n", &out);
    assert_int_equal(out.len, 0);
    coord_guard_free(&g);

    /* In time: the next head's clock starts at its own first byte. */
    guard_with_clock(&g, 30, 1000);
    fake_now = 0;
    feed(&g, "GET /a HTTP/1.1\r\n", &out);
    fake_now = 29;
    feed(&g, "\r\n", &out);
    assert_int_equal(coord_guard_check_time(&g, 500), COORD_GUARD_OK);
    fake_now = 600;
    feed(&g, "GET /b HT", &out);
    assert_int_equal(coord_guard_check_time(&g, 629), COORD_GUARD_OK);
    assert_int_equal(coord_guard_check_time(&g, 631), COORD_GUARD_HEAD_TIMEOUT);
    coord_guard_free(&g);

    /* A head whose request line never ended: refused without one. */
    guard_with_clock(&g, 30, 1000);
    vl_buf_reset(&out);
    fake_now = 0;
    feed(&g, "POST /v1/upd", &out);
    assert_int_equal(coord_guard_check_time(&g, 31), COORD_GUARD_HEAD_TIMEOUT);
    assert_int_equal(coord_guard_expire_head(&g, &out), VL_OK);
    assert_true(out.len > 15 && memcmp(out.data, "GET / HTTP/1.1\r\n", 16) == 0);
    coord_guard_free(&g);
    vl_buf_free(&out);
}

/* A body has the limit plus its length over the minimum rate, counted from
 * the end of its head; once it is all there the clock no longer matters. */
static void test_guard_slow_body(void **state) {
    (void)state;
    coord_guard g;
    vl_buf out;
    vl_buf_init(&out, 1 << 16);
    guard_with_clock(&g, 10, 1000);
    fake_now = 50;
    feed(&g, "POST /v1/peers HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", &out);
    assert_int_equal(g.state, COORD_GUARD_IN_BODY);
    char part[4001];
    memset(part, 'x', 4000);
    part[4000] = '\0';
    feed(&g, part, &out);
    /* Deadline: 50 + 10 + 5000 / 1000 = 65. */
    assert_int_equal(coord_guard_check_time(&g, 64.9), COORD_GUARD_OK);
    assert_int_equal(coord_guard_check_time(&g, 65.1), COORD_GUARD_BODY_TIMEOUT);
    part[1000] = '\0';
    feed(&g, part, &out);
    assert_int_equal(g.state, COORD_GUARD_IN_HEAD);
    assert_int_equal(coord_guard_check_time(&g, 1e6), COORD_GUARD_OK);
    /* A head in progress cannot be expired as a body, nor a body as a
     * head. */
    coord_guard_free(&g);
    guard_with_clock(&g, 10, 1000);
    feed(&g, "POST /v1/peers HTTP/1.1\r\nContent-Length: 5\r\n\r\n", &out);
    assert_int_equal(coord_guard_expire_head(&g, &out), VL_EINVAL);
    coord_guard_free(&g);
    /* No limit configured: never. */
    guard_with_clock(&g, 0, 0);
    feed(&g, "POST /v1/peers HTTP/1.1\r\nContent-Length: 5\r\n\r\n", &out);
    assert_int_equal(coord_guard_check_time(&g, 1e9), COORD_GUARD_OK);
    coord_guard_free(&g);
    guard_with_clock(&g, 0, 0);
    feed(&g, "GET /x", &out);
    assert_int_equal(coord_guard_check_time(&g, 1e9), COORD_GUARD_OK);
    coord_guard_free(&g);
    vl_buf_free(&out);
}

/* "//host/path" is an authority to libevent's URI parser: the path it
 * routes would not be the one the guard saw. */
static void test_guard_double_slash_target(void **state) {
    (void)state;
    static const char *const bad[] = {"GET //v1/task HTTP/1.1\r\n\r\n",
                                      "GET //evil.example/v1/task HTTP/1.1\r\n\r\n",
                                      "GET // HTTP/1.1\r\n\r\n"};
    coord_guard_caps caps = {.body_cap = 100};
    coord_guard_head h;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        coord_guard_parse_head((const uint8_t *)bad[i], strlen(bad[i]), &caps, &h);
        assert_int_equal(h.verdict, COORD_GUARD_BAD_HEAD);
    }
    static const char *const good[] = {"GET / HTTP/1.1\r\n\r\n", "GET /v1//task HTTP/1.1\r\n\r\n",
                                       "GET /v1/task?x=//y HTTP/1.1\r\n\r\n"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        coord_guard_parse_head((const uint8_t *)good[i], strlen(good[i]), &caps, &h);
        assert_int_equal(h.verdict, COORD_GUARD_OK);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket_burst_and_refill),   cmocka_unit_test(test_bucket_unlimited),
        cmocka_unit_test(test_bucket_table_bounded),      cmocka_unit_test(test_address_keys),
        cmocka_unit_test(test_guard_slow_head),           cmocka_unit_test(test_guard_slow_body),
        cmocka_unit_test(test_guard_double_slash_target),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
