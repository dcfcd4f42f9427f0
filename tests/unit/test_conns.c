/* The connection rules of conns.c on real loopback sockets: which idle
 * connections an address may keep, how long a first head and a kept-alive
 * connection may wait, that a connection with a request in progress is
 * never counted, and which body is cut off when bodies hold more than the
 * budget. Each connection is a guard in a server's list, as the HTTPS
 * server keeps them, with a bufferevent whose read state says what evhttp
 * would be doing: reading enabled with a read callback while it waits for
 * a request, disabled while a handler has one. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "coordinator/coord.h"
#include "coordinator/conn/guard.h"
#include "coordinator/conn/guard_types.h"
#include "coordinator/conn/limits.h"
#include "coordinator/conn/limits_types.h"
#include "coordinator/http/http.h"

#define MAX_CONNS 160

typedef struct fixture {
    struct event_base *base;
    coord_server srv;
    int listen_fd;
    struct sockaddr_in addr;
    coord_guard *g[MAX_CONNS];
    struct bufferevent *bev[MAX_CONNS];
    int client[MAX_CONNS];
    int n;
} fixture;

static double fake_now;
static double fake_clock(void) {
    return fake_now;
}

static void on_read(struct bufferevent *bev, void *arg) {
    (void)bev;
    (void)arg;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->base = event_base_new();
    assert_non_null(f->base);
    coord_limits_default(&f->srv.conns.limits);
    f->srv.conns.limits.max_conns = 100000;
    f->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    f->addr.sin_family = AF_INET;
    f->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof f->addr;
    assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&f->addr, sizeof f->addr), 0);
    assert_int_equal(listen(f->listen_fd, MAX_CONNS), 0);
    assert_int_equal(getsockname(f->listen_fd, (struct sockaddr *)&f->addr, &sl), 0);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    for (int i = 0; i < f->n; i++) {
        coord_guard_free(f->g[i]);
        free(f->g[i]);
        bufferevent_free(f->bev[i]);
        close(f->client[i]);
    }
    close(f->listen_fd);
    event_base_free(f->base);
    free(f);
    return 0;
}

typedef enum { WAITING, IN_HANDLER } conn_state;

/* A new connection created at fake_now: a guard with `requests` heads
 * behind it, its parser waiting for a request or busy with one. Like the
 * server's list, the newest comes first. */
static coord_guard *conn(fixture *f, uint64_t requests, conn_state st) {
    assert_true(f->n < MAX_CONNS);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(c, (struct sockaddr *)&f->addr, sizeof f->addr), 0);
    int s = accept(f->listen_fd, NULL, NULL);
    assert_true(s >= 0);
    struct bufferevent *bev = bufferevent_socket_new(f->base, s, BEV_OPT_CLOSE_ON_FREE);
    assert_non_null(bev);
    bufferevent_setcb(bev, on_read, NULL, NULL, NULL);
    if (st == WAITING)
        bufferevent_enable(bev, EV_READ);
    else
        bufferevent_disable(bev, EV_READ);
    coord_guard *g = malloc(sizeof *g);
    assert_non_null(g);
    coord_guard_caps caps = {.body_cap = 1 << 20, .clock = fake_clock};
    coord_guard_init(g, 4096, &caps);
    g->bev = bev;
    g->requests = requests;
    g->owner = &f->srv;
    g->next = f->srv.conns.guards;
    if (f->srv.conns.guards) f->srv.conns.guards->prev = g;
    f->srv.conns.guards = g;
    f->srv.conns.n_conns++;
    f->g[f->n] = g;
    f->bev[f->n] = bev;
    f->client[f->n] = c;
    f->n++;
    return g;
}

static int closed(const coord_guard *g) {
    return g->state == COORD_GUARD_DISCARD;
}

static int count_closed(fixture *f, int from, int to) {
    int n = 0;
    for (int i = from; i < to; i++) n += closed(f->g[i]);
    return n;
}

/* Over the cap, the newest connections still waiting for a first head
 * are closed and the oldest kept. */
static void test_cap_keeps_the_oldest(void **state) {
    fixture *f = *state;
    f->srv.conns.limits.conn_per_addr = 4;
    for (int i = 0; i < 10; i++) {
        fake_now = 100 + i * 0.01;
        conn(f, 0, WAITING);
    }
    coord_conns_tick(&f->srv, 100.5);
    assert_int_equal(count_closed(f, 0, 4), 0);
    assert_int_equal(count_closed(f, 4, 10), 6);
}

/* Peers behind one NAT: a hundred connections with a request in a
 * handler (long-polls) are not counted, so the newcomers of the same
 * address, still waiting for their heads, are all kept. */
static void test_requests_in_progress_do_not_count(void **state) {
    fixture *f = *state;
    f->srv.conns.limits.conn_per_addr = 8;
    fake_now = 100;
    for (int i = 0; i < 100; i++) conn(f, 1, IN_HANDLER);
    fake_now = 101;
    for (int i = 0; i < 8; i++) conn(f, 0, WAITING);
    coord_conns_tick(&f->srv, 101.6);
    assert_int_equal(count_closed(f, 0, 108), 0);
    /* One more newcomer than the cap: only that one goes. */
    fake_now = 101.7;
    coord_guard *extra = conn(f, 0, WAITING);
    coord_conns_tick(&f->srv, 101.8);
    assert_true(closed(extra));
    assert_int_equal(count_closed(f, 0, 108), 0);
}

/* Over the cap, kept-alive connections go before those waiting for a
 * first head, the longest idle first. */
static void test_kept_alive_go_first(void **state) {
    fixture *f = *state;
    f->srv.conns.limits.conn_per_addr = 0; /* first record when each became idle */
    fake_now = 100;
    coord_guard *k0 = conn(f, 3, WAITING);
    coord_conns_tick(&f->srv, 100);
    coord_guard *k1 = conn(f, 1, WAITING);
    coord_conns_tick(&f->srv, 101);
    coord_guard *k2 = conn(f, 2, WAITING);
    coord_conns_tick(&f->srv, 102);
    fake_now = 102;
    for (int i = 0; i < 3; i++) conn(f, 0, WAITING);
    f->srv.conns.limits.conn_per_addr = 4;
    coord_conns_tick(&f->srv, 102.5);
    assert_true(closed(k0));
    assert_true(closed(k1));
    assert_false(closed(k2));
    assert_int_equal(count_closed(f, 3, 6), 0);
}

/* A first head must be complete within idle_first_s, however many bytes
 * of it came (one byte of a head does not make a connection busy); a
 * kept-alive connection goes after idle_keepalive_s with nothing in
 * progress; a request in a handler is never timed here. */
static void test_idle_limits(void **state) {
    fixture *f = *state;
    f->srv.conns.limits.conn_per_addr = 0;
    f->srv.conns.limits.idle_first_s = 10;
    f->srv.conns.limits.idle_keepalive_s = 30;
    fake_now = 100;
    coord_guard *silent = conn(f, 0, WAITING);
    coord_guard *one_byte = conn(f, 0, WAITING);
    vl_buf out;
    vl_buf_init(&out, 4096);
    assert_int_equal(coord_guard_feed(one_byte, (const uint8_t *)"G", 1, &out), VL_OK);
    assert_int_equal(out.len, 0);
    vl_buf_free(&out);
    coord_guard *kept = conn(f, 1, WAITING);
    coord_guard *busy = conn(f, 1, IN_HANDLER);
    coord_conns_tick(&f->srv, 100.5);
    coord_conns_tick(&f->srv, 109.9);
    assert_int_equal(count_closed(f, 0, 4), 0);
    coord_conns_tick(&f->srv, 110.2);
    assert_true(closed(silent));
    assert_true(closed(one_byte));
    assert_false(closed(kept));
    coord_conns_tick(&f->srv, 130.4);
    assert_false(closed(kept));
    coord_conns_tick(&f->srv, 130.6);
    assert_true(closed(kept));
    coord_conns_tick(&f->srv, 1e4);
    assert_false(closed(busy));
}

/* Over half of max_conns open, both idle limits are a tenth. */
static void test_pressure_shortens_the_limits(void **state) {
    fixture *f = *state;
    f->srv.conns.limits.conn_per_addr = 0;
    f->srv.conns.limits.idle_first_s = 10;
    f->srv.conns.limits.idle_keepalive_s = 30;
    f->srv.conns.limits.max_conns = 5;
    fake_now = 100;
    coord_guard *first = conn(f, 0, WAITING);
    coord_guard *kept = conn(f, 1, WAITING);
    conn(f, 1, IN_HANDLER);
    coord_conns_tick(&f->srv, 100.1);
    coord_conns_tick(&f->srv, 101.2);
    assert_true(closed(first));
    assert_false(closed(kept));
    coord_conns_tick(&f->srv, 103.2);
    assert_true(closed(kept));
}

/* Bodies hold the budget by what has arrived of them; over it, the
 * slowest is cut off and the others go on. */
static void test_slowest_body_is_cut(void **state) {
    fixture *f = *state;
    f->srv.conns.limits.conn_per_addr = 0;
    f->srv.conns.limits.idle_first_s = 0;
    f->srv.conns.limits.body_budget = 10 << 20;
    fake_now = 100;
    coord_guard *fast = conn(f, 0, IN_HANDLER);
    coord_guard *slow = conn(f, 0, IN_HANDLER);
    coord_guard_ticket tf = {.reserved = 6 << 20}, ts = {.reserved = 5 << 20};
    fast->state = slow->state = COORD_GUARD_IN_BODY;
    fast->body_len = slow->body_len = 64 << 20;
    fast->body_left = fast->body_len - (6 << 20); /* 6 MiB in 1 s */
    slow->body_left = slow->body_len - (5 << 20); /* 5 MiB in 10 s */
    fast->body_started = 109;
    slow->body_started = 100;
    fast->body_owner = &tf;
    slow->body_owner = &ts;
    f->srv.conns.body_inflight = 9 << 20;
    coord_conns_tick(&f->srv, 110);
    assert_false(closed(fast));
    assert_false(closed(slow));
    f->srv.conns.body_inflight = 11 << 20;
    coord_conns_tick(&f->srv, 110);
    assert_false(closed(fast));
    assert_true(closed(slow));
}

/* What a body reserves follows what has arrived of it, and goes back in
 * full when it is released. */
static void test_reservation_follows_arrival(void **state) {
    fixture *f = *state;
    coord_guard_ticket t = {.peer_id = 7, .reserved = COORD_BODY_ADVANCE};
    int64_t peers[1] = {7};
    f->srv.conns.receiving_peers = peers;
    f->srv.conns.n_receiving = 1;
    f->srv.conns.body_inflight = COORD_BODY_ADVANCE;
    coord_auth_progress(&f->srv, &t, 1000);
    assert_int_equal(f->srv.conns.body_inflight, COORD_BODY_ADVANCE);
    coord_auth_progress(&f->srv, &t, (uint64_t)COORD_BODY_ADVANCE * 3);
    assert_int_equal(t.reserved, COORD_BODY_ADVANCE * 3);
    assert_int_equal(f->srv.conns.body_inflight, COORD_BODY_ADVANCE * 3);
    coord_auth_release(&f->srv, &t);
    assert_int_equal(f->srv.conns.body_inflight, 0);
    assert_int_equal(f->srv.conns.n_receiving, 0);
    f->srv.conns.receiving_peers = NULL;
}

/* The guard's own view of a body: it reports what has arrived to the
 * owner as it passes, and a body that delivers less than the minimum
 * rate over a whole window is timed out even long before its deadline. */
typedef struct progress_log {
    uint64_t last;
    int calls;
} progress_log;

static void on_progress(void *arg, coord_guard_ticket *t, uint64_t arrived) {
    (void)t;
    progress_log *p = arg;
    p->last = arrived;
    p->calls++;
}

static int accept_all(void *arg, coord_guard *g, const uint8_t *head, size_t len,
                      coord_guard_ticket *t, coord_guard_refusal *r) {
    (void)arg;
    (void)g;
    (void)head;
    (void)len;
    (void)r;
    t->peer_id = 1;
    return 0;
}

static void test_body_window(void **state) {
    (void)state;
    progress_log log = {0};
    coord_guard_caps caps = {.body_cap = 1 << 20,
                             .slow_timeout_s = 30,
                             .min_body_rate = 1000,
                             .body_window_s = 10,
                             .clock = fake_clock,
                             .authorize = accept_all,
                             .authorize_arg = &log,
                             .progress = on_progress};
    coord_guard g;
    coord_guard_init(&g, 4096, &caps);
    vl_buf out;
    vl_buf_init(&out, 1 << 20);
    fake_now = 0;
    const char *head = "POST /v1/peers HTTP/1.1\r\nContent-Length: 500000\r\n\r\n";
    assert_int_equal(coord_guard_feed(&g, (const uint8_t *)head, strlen(head), &out), VL_OK);
    assert_int_equal(g.state, COORD_GUARD_IN_BODY);
    static uint8_t chunk[20000];
    memset(chunk, 'x', sizeof chunk);
    /* 20 000 bytes in the first window: twice the minimum. */
    assert_int_equal(coord_guard_feed(&g, chunk, sizeof chunk, &out), VL_OK);
    assert_int_equal(log.last, 20000);
    assert_int_equal(coord_guard_body_arrived(&g), 20000);
    assert_int_equal(coord_guard_enforce_time(&g, 10.5), COORD_GUARD_OK);
    /* Then 5 000 bytes in the next ten seconds: too slow, though the
     * deadline (30 + 500 s) is far. */
    assert_int_equal(coord_guard_feed(&g, chunk, 5000, &out), VL_OK);
    assert_int_equal(log.last, 25000);
    assert_int_equal(coord_guard_check_time(&g, 20), COORD_GUARD_OK);
    assert_int_equal(coord_guard_check_time(&g, 20.6), COORD_GUARD_BODY_TIMEOUT);
    coord_guard_free(&g);
    vl_buf_free(&out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cap_keeps_the_oldest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_requests_in_progress_do_not_count, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kept_alive_go_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pressure_shortens_the_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slowest_body_is_cut, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reservation_follows_arrival, setup, teardown),
        cmocka_unit_test(test_body_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
