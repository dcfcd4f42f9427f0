/* coordinator: the limits against abusive clients. The token buckets
 * (burst, refill, the time to the next token, independent keys, a bounded
 * table under a flood of keys, address keys), the guard's clock (a head
 * or a body that arrives too slowly, and the refusal that replaces a slow
 * head) on a clock the test drives, and the guard's refusal of request
 * targets that libevent would read as naming a host; and the split batch
 * routes' own budget beside the peer's (rates.c). */
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
#include "coordinator/coord.h"
#include "coordinator/conn/guard.h"
#include "coordinator/base/limiter.h"
#include "crypto/crypto.h"
#include "coordinator/config/config.h"
#include "coordinator/conn/conn.h"
#include "coordinator/conn/guard_types.h"
#include "coordinator/conn/limits.h"
#include "coordinator/conn/limits_types.h"

static int setup(void **state) {
    (void)state;
    return vcrypto_init();
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

/* ---- the split batch budget ---------------------------------------------- */

/* A server of a run in mode (split settings in_flight and u_shape) with
 * the default limits' buckets, as setup_limits makes them. */
static coord_server *rate_server(const char *mode, int in_flight, int u_shape) {
    coord_server *srv = calloc(1, sizeof *srv);
    assert_non_null(srv);
    snprintf(srv->run.cfg.mode, sizeof srv->run.cfg.mode, "%s", mode);
    srv->run.cfg.split_in_flight = in_flight;
    srv->run.cfg.split_u = u_shape;
    coord_limits l;
    coord_limits_default(&l);
    srv->conns.peer_limiter = coord_limiter_new(1024, l.peer);
    assert_non_null(srv->conns.peer_limiter);
    if (coord_config_is_split(&srv->run.cfg)) {
        srv->conns.split_limiter =
            coord_limiter_new(1024, coord_limits_split_rate(&srv->run.cfg, l.peer, l.split));
        assert_non_null(srv->conns.split_limiter);
    }
    return srv;
}

static void rate_server_free(coord_server *srv) {
    coord_limiter_free(srv->conns.peer_limiter);
    coord_limiter_free(srv->conns.split_limiter);
    free(srv);
}

/* Requests of one peer to target at hz for s seconds from t0: how many
 * were refused. */
static int refused_at(coord_server *srv, const char *target, double hz, double s, double t0) {
    int refused = 0;
    for (int i = 0; i < (int)(hz * s); i++)
        refused += coord_peer_rate_take(srv, 7, target, t0 + i / hz) > 0;
    return refused;
}

/* A split peer's batches at 150/s for a minute, three times the per-peer
 * rate, go through, while the same peer's other requests at that pace
 * are refused once their burst is spent; the batches do not spend the
 * other routes' tokens, nor those theirs. A U-shaped run (two requests a
 * batch) and batches in flight raise the budget; past it batches are
 * refused too. In a run that is not split, the split routes spend the
 * peer's budget like any other. */
static void test_split_batch_budget(void **state) {
    (void)state;
    coord_server *srv = rate_server("split", 1, 0);
    coord_rate r =
        coord_limits_split_rate(&srv->run.cfg, (coord_rate){50, 500}, (coord_rate){-1, -1});
    assert_true(r.rate == 1 / COORD_SPLIT_RTT_MIN_S && r.burst == 10 * r.rate);
    assert_int_equal(refused_at(srv, "/v1/split/forward", 150, 60, 1000), 0);
    assert_true(refused_at(srv, "/v1/task?wait=10", 150, 60, 1000) > 150 * 60 / 2);
    /* Interleaved on one peer, from a fresh start: batches at 200/s and
     * tasks at 100/s (twice their rate). */
    rate_server_free(srv);
    srv = rate_server("split", 1, 0);
    int batches = 0, tasks = 0;
    for (int i = 0; i < 200 * 60; i++) {
        double t = 5000 + i / 200.0;
        batches += coord_peer_rate_take(srv, 7, "/v1/split/forward", t) > 0;
        if (i % 2 == 0) tasks += coord_peer_rate_take(srv, 7, "/v1/updates", t) > 0;
    }
    assert_int_equal(batches, 0);
    assert_true(tasks > 0);
    /* A hostile peer sending batches at 2000/s is held to the budget. */
    assert_true(refused_at(srv, "/v1/split/forward", 2000, 30, 9000) > 2000 * 30 / 2);
    rate_server_free(srv);
    /* U-shaped (forward and backward) and four batches in flight. */
    srv = rate_server("split", 1, 1);
    assert_int_equal(refused_at(srv, "/v1/split/backward", 400, 60, 1000), 0);
    rate_server_free(srv);
    srv = rate_server("split", 4, 0);
    assert_int_equal(refused_at(srv, "/v1/split/forward", 900, 60, 1000), 0);
    rate_server_free(srv);
    /* Not a split run: the routes are the peer's like any other. */
    srv = rate_server("sync", 1, 0);
    assert_null(srv->conns.split_limiter);
    assert_true(refused_at(srv, "/v1/split/forward", 150, 60, 1000) > 150 * 60 / 2);
    rate_server_free(srv);
    /* serve --split-rate: as given, 0 for none; --peer-rate 0 turns the
     * derived one off too. */
    coord_config cfg = {0};
    snprintf(cfg.mode, sizeof cfg.mode, "split");
    cfg.split_in_flight = 8;
    r = coord_limits_split_rate(&cfg, (coord_rate){50, 500}, (coord_rate){80, 100});
    assert_true(r.rate == 80 && r.burst == 100);
    r = coord_limits_split_rate(&cfg, (coord_rate){50, 500}, (coord_rate){0, 1});
    assert_true(r.rate == 0);
    r = coord_limits_split_rate(&cfg, (coord_rate){0, 0}, (coord_rate){-1, -1});
    assert_true(r.rate == 0);
    r = coord_limits_split_rate(&cfg, (coord_rate){50, 500}, (coord_rate){-1, -1});
    assert_true(r.rate == 8 / COORD_SPLIT_RTT_MIN_S);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket_burst_and_refill),   cmocka_unit_test(test_bucket_unlimited),
        cmocka_unit_test(test_bucket_table_bounded),      cmocka_unit_test(test_address_keys),
        cmocka_unit_test(test_guard_slow_head),           cmocka_unit_test(test_guard_slow_body),
        cmocka_unit_test(test_guard_double_slash_target), cmocka_unit_test(test_split_batch_budget),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
