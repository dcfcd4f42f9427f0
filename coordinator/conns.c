/* Connections under pressure: what one address or a crowd of silent
 * sockets may hold, and what happens when descriptors run out.
 *
 * A connection that has not sent a complete request head is the cheap
 * way to hold a descriptor (a half-done TLS handshake, a socket that says
 * nothing), and the only kind these rules close: a connection with a
 * request in a handler, such as a peer's long-poll, is never touched.
 * Each address (IPv6: each /64) may hold at most conn_per_addr such
 * connections; a silent connection is closed after idle_first_s, and
 * after a tenth of that once the server holds more than half of
 * max_conns. When accept() fails for want of descriptors the listener
 * pauses for a moment instead of spinning on the error, and the log says
 * so once per interval with a count. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>

#include "coordinator/coord.h"

#define ACCEPT_PAUSE_S 0.25
#define ACCEPT_LOG_EVERY_S 10.0
#define PRESSURE_HOLD_S 5.0   /* pressure lasts this long after the last failed accept() */
#define DESCRIPTOR_RESERVE 64 /* for the database, logs, the writer and slack */

/* ---- descriptors --------------------------------------------------------- */

int64_t coord_conns_raise_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = rl;
        want.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
    }
    return rl.rlim_cur == RLIM_INFINITY ? (int64_t)1 << 20 : (int64_t)rl.rlim_cur;
}

int64_t coord_conns_default_max(int64_t fd_limit) {
    int64_t m = fd_limit - DESCRIPTOR_RESERVE;
    return m < 16 ? 16 : m;
}

/* ---- accept backoff ------------------------------------------------------ */

static void accept_resume(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    coord_server *srv = arg;
    struct evconnlistener *l = evhttp_bound_socket_get_listener(srv->bound);
    if (l) evconnlistener_enable(l);
}

/* evhttp owns the listener and its callback argument; the error callback
 * gets that same argument, so the server comes from here (one per
 * process). */
static coord_server *accept_srv;

static void accept_error(struct evconnlistener *l, void *arg) {
    (void)arg;
    coord_server *srv = accept_srv;
    if (!srv) return;
    int err = EVUTIL_SOCKET_ERROR();
    double now = vl_clock_mono_s();
    srv->accept_errors++;
    if (now - srv->accept_logged >= ACCEPT_LOG_EVERY_S) {
        vl_log_warn("accept() failed %lld time(s) since the last report (%s) with %zu "
                    "connections open; new connections pause %.2f s after each failure",
                    (long long)srv->accept_errors, evutil_socket_error_to_string(err), srv->n_conns,
                    ACCEPT_PAUSE_S);
        srv->accept_logged = now;
        srv->accept_errors = 0;
    }
    /* Out of descriptors or memory, accept() fails at once for as long as
     * the connection waits: stop asking for a moment, and let the tick
     * free silent connections meanwhile. */
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        evconnlistener_disable(l);
        struct timeval tv = {0, (suseconds_t)(ACCEPT_PAUSE_S * 1e6)};
        if (srv->accept_timer)
            event_add(srv->accept_timer, &tv);
        else
            evconnlistener_enable(l);
        srv->pressure_until = now + PRESSURE_HOLD_S;
    }
}

int coord_conns_listen(coord_server *srv, vl_error *err) {
    struct evconnlistener *l = evhttp_bound_socket_get_listener(srv->bound);
    if (!l) return vl_fail(err, VL_EIO, "the listener is missing");
    srv->accept_timer = evtimer_new(srv->base, accept_resume, srv);
    if (!srv->accept_timer) return vl_fail(err, VL_ENOMEM, "out of memory");
    accept_srv = srv;
    evconnlistener_set_error_cb(l, accept_error);
    return VL_OK;
}

void coord_conns_close(coord_server *srv) {
    if (accept_srv == srv) accept_srv = NULL;
    if (srv->accept_timer) event_free(srv->accept_timer);
    srv->accept_timer = NULL;
}

/* ---- silent connections -------------------------------------------------- */

/* The address key of a guard's connection, looked up once. */
static size_t guard_addr(coord_guard *g, uint8_t key[COORD_ADDR_KEY_MAX]) {
    evutil_socket_t fd = g->bev ? bufferevent_getfd(g->bev) : -1;
    if (fd < 0) return 0;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) return 0;
    return coord_limiter_addr_key((const struct sockaddr *)&ss, key);
}

/* A connection that holds a descriptor without having sent a head. */
static int silent(const coord_guard *g) {
    return g->requests == 0 && g->state == COORD_GUARD_IN_HEAD && g->head.len == 0;
}

static void close_conn(coord_guard *g) {
    g->state = COORD_GUARD_DISCARD;
    evutil_socket_t fd = g->bev ? bufferevent_getfd(g->bev) : -1;
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
}

void coord_conns_tick(coord_server *srv, double now) {
    const coord_limits *lim = &srv->limits;
    int pressed = now < srv->pressure_until ||
                  (lim->max_conns > 0 && (int64_t)srv->n_conns * 2 > lim->max_conns);
    double idle = lim->idle_first_s;
    if (pressed) idle /= 10;
    /* Per address: the newest guards come first in the list, so the
     * oldest connections of an address are the ones kept. Counting needs
     * a table of addresses; a small open-addressing one per tick. */
    size_t slots = 1;
    while (slots < 2 * srv->n_conns + 2) slots <<= 1;
    typedef struct {
        uint8_t key[COORD_ADDR_KEY_MAX];
        size_t len;
        int64_t n;
    } slot;
    slot *tab = lim->conn_per_addr > 0 ? calloc(slots, sizeof *tab) : NULL;
    size_t closed = 0;
    /* Walk oldest first: the list is newest first, so go to its end. */
    coord_guard *last = srv->guards;
    while (last && last->next) last = last->next;
    for (coord_guard *g = last, *prev; g; g = prev) {
        prev = g->prev;
        if (g->state == COORD_GUARD_DISCARD) continue;
        int quiet = silent(g);
        if (quiet && idle > 0 && now - g->created > idle) {
            close_conn(g);
            closed++;
            continue;
        }
        if (!tab) continue;
        uint8_t key[COORD_ADDR_KEY_MAX];
        size_t kl = guard_addr(g, key);
        if (kl == 0) continue;
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < kl; i++) h = (h ^ key[i]) * 1099511628211ull;
        size_t i = (size_t)h & (slots - 1);
        while (tab[i].len && !(tab[i].len == kl && memcmp(tab[i].key, key, kl) == 0))
            i = (i + 1) & (slots - 1);
        if (!tab[i].len) {
            memcpy(tab[i].key, key, kl);
            tab[i].len = kl;
        }
        if (++tab[i].n > lim->conn_per_addr && quiet) {
            close_conn(g);
            closed++;
        }
    }
    free(tab);
    if (closed > 0) {
        srv->conns_closed += (int64_t)closed;
        if (now - srv->conns_logged >= ACCEPT_LOG_EVERY_S) {
            vl_log_info("closed %lld connection(s) that sent no request (%zu open%s)",
                        (long long)srv->conns_closed, srv->n_conns,
                        pressed ? ", under descriptor pressure" : "");
            srv->conns_logged = now;
            srv->conns_closed = 0;
        }
    }
    /* At the total cap new connections wait in the kernel's backlog. */
    struct evconnlistener *l = srv->bound ? evhttp_bound_socket_get_listener(srv->bound) : NULL;
    if (l && lim->max_conns > 0) {
        if ((int64_t)srv->n_conns >= lim->max_conns) {
            evconnlistener_disable(l);
            srv->pressure_until = now + PRESSURE_HOLD_S;
        } else if (!srv->accept_timer || !evtimer_pending(srv->accept_timer, NULL)) {
            evconnlistener_enable(l);
        }
    }
}
