/* Connections under pressure: what one address or a crowd of idle
 * sockets may hold, what a body that arrives too slowly may keep, and
 * what happens when descriptors run out.
 *
 * A connection is idle while it has no request in progress: it has not
 * sent a complete request head (a half-done TLS handshake, a socket that
 * says nothing, a head that stops after a byte), or it is kept alive
 * between requests. Idle connections are the cheap way to hold a
 * descriptor, and the only kind these rules close: a connection with a
 * request in a handler, such as a peer's long-poll, an upload or a
 * download, is never counted or touched, so hundreds of peers behind one
 * NAT can each hold a long-poll. Each address (IPv6: each /64) may hold
 * at most conn_per_addr idle connections; beyond that the kept-alive ones
 * go first (longest idle first), then the newest of those still waiting
 * for a first head. A first head must be complete within idle_first_s of
 * the connection, a kept-alive connection is closed after
 * idle_keepalive_s with nothing in progress, and both are a tenth once
 * the server holds more than half of max_conns or accept() has just run
 * out of descriptors. When accept() fails for want of descriptors, a
 * listener (the public one or the admin one) pauses for a moment instead
 * of spinning on the error, and the log says so once per interval with a
 * count. The admin listener holds at most COORD_ADMIN_CONNS_MAX
 * connections, counted with the public ones against max_conns.
 *
 * Signed bodies hold the body budget by what has arrived of them
 * (auth.c); while what has arrived exceeds the budget, the slowest body
 * is cut off. */
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
#include "coordinator/base/limiter.h"
#include "coordinator/conn/guard.h"
#include "coordinator/conn/guard_types.h"
#include "coordinator/conn/limits.h"
#include "coordinator/conn/limits_types.h"

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

static struct evconnlistener *public_listener(coord_server *srv) {
    return srv->conns.bound ? evhttp_bound_socket_get_listener(srv->conns.bound) : NULL;
}

static struct evconnlistener *admin_listener(coord_server *srv) {
    return srv->ops.admin_bound ? evhttp_bound_socket_get_listener(srv->ops.admin_bound) : NULL;
}

/* Connections that count against max_conns: the public ones and the
 * admin listener's. */
static int64_t open_conns(const coord_server *srv) {
    return (int64_t)srv->conns.n_conns + (int64_t)srv->ops.n_admin;
}

static int at_max(const coord_server *srv) {
    return srv->conns.limits.max_conns > 0 && open_conns(srv) >= srv->conns.limits.max_conns;
}

/* Both listeners as the counts allow; the tick calls it too, so a pause
 * that ended while a cap held is taken up again later. */
static void listeners_resume(coord_server *srv) {
    if (srv->conns.accept_timer && evtimer_pending(srv->conns.accept_timer, NULL)) return;
    struct evconnlistener *l = public_listener(srv);
    if (l) {
        if (at_max(srv))
            evconnlistener_disable(l);
        else
            evconnlistener_enable(l);
    }
    struct evconnlistener *a = admin_listener(srv);
    if (a) {
        if (at_max(srv) || srv->ops.n_admin >= COORD_ADMIN_CONNS_MAX)
            evconnlistener_disable(a);
        else
            evconnlistener_enable(a);
    }
}

static void accept_resume(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    listeners_resume(arg);
}

/* evhttp owns each listener and its callback argument; the error callback
 * gets that same argument, so the server comes from here (one per
 * process). */
static coord_server *accept_srv;

static void accept_error(struct evconnlistener *l, void *arg) {
    (void)arg;
    coord_server *srv = accept_srv;
    if (!srv) return;
    int err = EVUTIL_SOCKET_ERROR();
    double now = vl_clock_mono_s();
    srv->conns.accept_errors++;
    if (now - srv->conns.accept_logged >= ACCEPT_LOG_EVERY_S) {
        vl_log_warn("accept() failed %lld time(s) since the last report (%s) with %zu "
                    "connections open (%zu on the admin listener); new connections pause "
                    "%.2f s after each failure",
                    (long long)srv->conns.accept_errors, evutil_socket_error_to_string(err),
                    srv->conns.n_conns, srv->ops.n_admin, ACCEPT_PAUSE_S);
        srv->conns.accept_logged = now;
        srv->conns.accept_errors = 0;
    }
    /* Out of descriptors or memory, accept() fails at once for as long as
     * the connection waits: stop asking for a moment, on both listeners
     * (they share the descriptors), and let the tick free idle
     * connections meanwhile. */
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        struct evconnlistener *p = public_listener(srv), *a = admin_listener(srv);
        if (p) evconnlistener_disable(p);
        if (a) evconnlistener_disable(a);
        if (l != p && l != a) evconnlistener_disable(l);
        struct timeval tv = {0, (suseconds_t)(ACCEPT_PAUSE_S * 1e6)};
        if (srv->conns.accept_timer)
            event_add(srv->conns.accept_timer, &tv);
        else
            evconnlistener_enable(l);
        srv->conns.pressure_until = now + PRESSURE_HOLD_S;
    }
}

int coord_conns_listen(coord_server *srv, vl_error *err) {
    struct evconnlistener *l = public_listener(srv);
    if (!l) return vl_fail(err, VL_EIO, "the listener is missing");
    if (!srv->conns.accept_timer)
        srv->conns.accept_timer = evtimer_new(srv->base, accept_resume, srv);
    if (!srv->conns.accept_timer) return vl_fail(err, VL_ENOMEM, "out of memory");
    accept_srv = srv;
    evconnlistener_set_error_cb(l, accept_error);
    return VL_OK;
}

/* ---- the admin listener's connections ------------------------------------ */

/* libevent 2.1 tells nobody when evhttp frees a connection, so each
 * admin connection's bufferevent is held by one reference of ours: when
 * evhttp frees it, its callbacks are cleared (bufferevent_free) while the
 * object lives on, and the tick then drops our reference, which closes
 * the socket. The count is thus exact to within a tick. */
static struct bufferevent *admin_bev(struct event_base *base, void *arg) {
    coord_server *srv = arg;
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) return NULL;
    if (srv->ops.n_admin < COORD_ADMIN_CONNS_MAX * 2) {
        bufferevent_incref(bev);
        srv->ops.admin_bevs[srv->ops.n_admin++] = bev;
    }
    /* At the cap, further connections wait in the kernel's backlog; the
     * listener stops accepting within the burst that reached it. */
    struct evconnlistener *a = admin_listener(srv);
    if (a && (srv->ops.n_admin >= COORD_ADMIN_CONNS_MAX || at_max(srv))) evconnlistener_disable(a);
    return bev;
}

int coord_conns_admin(coord_server *srv, struct evhttp_bound_socket *bound, vl_error *err) {
    srv->ops.admin_bound = bound;
    struct evconnlistener *a = admin_listener(srv);
    if (!a) return vl_fail(err, VL_EIO, "the admin listener is missing");
    if (!srv->conns.accept_timer)
        srv->conns.accept_timer = evtimer_new(srv->base, accept_resume, srv);
    if (!srv->conns.accept_timer) return vl_fail(err, VL_ENOMEM, "out of memory");
    accept_srv = srv;
    evconnlistener_set_error_cb(a, accept_error);
    evhttp_set_bevcb(srv->ops.admin_http, admin_bev, srv);
    return VL_OK;
}

/* Drops our reference to each admin connection evhttp has freed. */
static void admin_reap(coord_server *srv) {
    for (size_t i = 0; i < srv->ops.n_admin;) {
        struct bufferevent *bev = srv->ops.admin_bevs[i];
        bufferevent_event_cb eventcb = NULL;
        bufferevent_getcb(bev, NULL, NULL, &eventcb, NULL);
        if (eventcb) {
            i++;
            continue;
        }
        bufferevent_decref(bev);
        srv->ops.admin_bevs[i] = srv->ops.admin_bevs[--srv->ops.n_admin];
    }
}

void coord_conns_close(coord_server *srv) {
    if (accept_srv == srv) accept_srv = NULL;
    if (srv->conns.accept_timer) event_free(srv->conns.accept_timer);
    srv->conns.accept_timer = NULL;
    /* evhttp_free has freed every connection by now; what is left is our
     * reference. */
    for (size_t i = 0; i < srv->ops.n_admin; i++) bufferevent_decref(srv->ops.admin_bevs[i]);
    srv->ops.n_admin = 0;
}

/* ---- idle connections ---------------------------------------------------- */

_Static_assert(COORD_ADDR_KEY_MAX <= sizeof(((coord_guard *)0)->addr),
               "a guard holds an address key");

/* The address key of a guard's connection, looked up once. */
static size_t guard_addr(coord_guard *g) {
    if (g->addr_len) return g->addr_len;
    evutil_socket_t fd = g->bev ? bufferevent_getfd(g->bev) : -1;
    if (fd < 0) return 0;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) return 0;
    g->addr_len = (uint8_t)coord_limiter_addr_key((const struct sockaddr *)&ss, g->addr);
    return g->addr_len;
}

typedef enum { CONN_BUSY = 0, CONN_FIRST, CONN_KEPT } conn_kind;

/* What a connection is doing. evhttp reads with EV_READ enabled and its
 * read callback set only while it waits for request bytes; while a
 * handler has a request it disables reading, and while it writes an
 * answer it unsets the callback. So a connection without a complete head
 * whose parser waits has no request in progress. */
static conn_kind kind_of(const coord_guard *g) {
    if (g->state != COORD_GUARD_IN_HEAD || !g->bev) return CONN_BUSY;
    bufferevent_data_cb readcb = NULL;
    bufferevent_getcb(g->bev, &readcb, NULL, NULL, NULL);
    if (!readcb || !(bufferevent_get_enabled(g->bev) & EV_READ)) return CONN_BUSY;
    return g->requests == 0 ? CONN_FIRST : CONN_KEPT;
}

static void close_conn(coord_guard *g) {
    coord_guard_shut_down(g);
}

/* A small open-addressing table of address keys, made anew each tick. */
typedef struct addr_slot {
    uint8_t key[COORD_ADDR_KEY_MAX];
    size_t len;
    int64_t n; /* idle connections of the address; then how many to close */
} addr_slot;

static addr_slot *slot_of(addr_slot *tab, size_t slots, const uint8_t *key, size_t kl) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < kl; i++) h = (h ^ key[i]) * 1099511628211ull;
    size_t i = (size_t)h & (slots - 1);
    while (tab[i].len && !(tab[i].len == kl && memcmp(tab[i].key, key, kl) == 0))
        i = (i + 1) & (slots - 1);
    if (!tab[i].len) {
        memcpy(tab[i].key, key, kl);
        tab[i].len = kl;
    }
    return &tab[i];
}

static int by_idle_since(const void *a, const void *b) {
    const coord_guard *x = *(const coord_guard *const *)a, *y = *(const coord_guard *const *)b;
    return x->idle_since < y->idle_since ? -1 : x->idle_since > y->idle_since;
}

/* Closes what the per-address cap does not allow: per address over the
 * cap, kept-alive connections longest idle first, then the newest first
 * connections. Returns the number closed. */
static size_t cap_addresses(coord_server *srv, int64_t cap) {
    size_t slots = 1;
    while (slots < 2 * srv->conns.n_conns + 2) slots <<= 1;
    addr_slot *tab = calloc(slots, sizeof *tab);
    coord_guard **kept = calloc(srv->conns.n_conns + 1, sizeof *kept);
    size_t n_kept = 0, closed = 0;
    if (!tab || !kept) goto out;
    for (coord_guard *g = srv->conns.guards; g; g = g->next) {
        if (g->state == COORD_GUARD_DISCARD || kind_of(g) == CONN_BUSY) continue;
        size_t kl = guard_addr(g);
        if (kl) slot_of(tab, slots, g->addr, kl)->n++;
    }
    for (size_t i = 0; i < slots; i++) tab[i].n = tab[i].len && tab[i].n > cap ? tab[i].n - cap : 0;
    for (coord_guard *g = srv->conns.guards; g && n_kept < srv->conns.n_conns; g = g->next)
        if (g->state != COORD_GUARD_DISCARD && kind_of(g) == CONN_KEPT && guard_addr(g) &&
            slot_of(tab, slots, g->addr, g->addr_len)->n > 0)
            kept[n_kept++] = g;
    qsort(kept, n_kept, sizeof *kept, by_idle_since);
    for (size_t i = 0; i < n_kept; i++) {
        addr_slot *s = slot_of(tab, slots, kept[i]->addr, kept[i]->addr_len);
        if (s->n <= 0) continue;
        close_conn(kept[i]);
        s->n--;
        closed++;
    }
    /* The list is newest first. */
    for (coord_guard *g = srv->conns.guards; g; g = g->next) {
        if (g->state == COORD_GUARD_DISCARD || kind_of(g) != CONN_FIRST || !guard_addr(g)) continue;
        addr_slot *s = slot_of(tab, slots, g->addr, g->addr_len);
        if (s->n <= 0) continue;
        close_conn(g);
        s->n--;
        closed++;
    }
out:
    free(tab);
    free(kept);
    return closed;
}

/* While the bodies arriving hold more than the budget, cuts off the
 * slowest of them (the fewest bytes a second since its head), until
 * what the cut ones held covers the excess. Returns the number cut. */
static size_t cut_slow_bodies(coord_server *srv, double now) {
    int64_t budget = srv->conns.limits.body_budget;
    if (budget <= 0) return 0;
    int64_t excess = srv->conns.body_inflight - budget;
    size_t cut = 0;
    while (excess > 0) {
        coord_guard *slowest = NULL;
        double slowest_rate = 0;
        for (coord_guard *g = srv->conns.guards; g; g = g->next) {
            if (g->state != COORD_GUARD_IN_BODY || !g->body_owner || g->body_owner->reserved <= 0)
                continue;
            double t = now - g->body_started;
            double rate = (double)coord_guard_body_arrived(g) / (t > 0.001 ? t : 0.001);
            if (!slowest || rate < slowest_rate) slowest = g, slowest_rate = rate;
        }
        if (!slowest) break;
        excess -= slowest->body_owner->reserved;
        /* Its reservation goes back when its connection is freed. */
        close_conn(slowest);
        cut++;
    }
    return cut;
}

void coord_conns_tick(coord_server *srv, double now) {
    const coord_limits *lim = &srv->conns.limits;
    admin_reap(srv);
    int pressed = now < srv->conns.pressure_until ||
                  (lim->max_conns > 0 && open_conns(srv) * 2 > lim->max_conns);
    double first = lim->idle_first_s, kept = lim->idle_keepalive_s;
    if (pressed) first /= 10, kept /= 10;
    size_t closed = 0;
    for (coord_guard *g = srv->conns.guards, *next; g; g = next) {
        next = g->next;
        if (g->state == COORD_GUARD_DISCARD) continue;
        conn_kind k = kind_of(g);
        if (k == CONN_BUSY) {
            g->idle_since = 0;
            continue;
        }
        if (g->idle_since <= 0) g->idle_since = k == CONN_FIRST ? g->created : now;
        double limit = k == CONN_FIRST ? first : kept;
        double since = k == CONN_FIRST ? g->created : g->idle_since;
        if (limit > 0 && now - since > limit) {
            close_conn(g);
            closed++;
        }
    }
    if (lim->conn_per_addr > 0) closed += cap_addresses(srv, lim->conn_per_addr);
    size_t cut = cut_slow_bodies(srv, now);
    if (cut > 0)
        vl_log_info("cut off %zu request bod%s arriving slowest while bodies held %lld MiB, over "
                    "the %lld MiB budget",
                    cut, cut == 1 ? "y" : "ies", (long long)(srv->conns.body_inflight >> 20),
                    (long long)(lim->body_budget >> 20));
    if (closed > 0) {
        srv->conns.conns_closed += (int64_t)closed;
        if (now - srv->conns.conns_logged >= ACCEPT_LOG_EVERY_S) {
            vl_log_info("closed %lld idle connection(s) (%zu open%s)",
                        (long long)srv->conns.conns_closed, srv->conns.n_conns,
                        pressed ? ", under descriptor pressure" : "");
            srv->conns.conns_logged = now;
            srv->conns.conns_closed = 0;
        }
    }
    /* At the total cap new connections wait in the kernel's backlog. */
    if (at_max(srv)) srv->conns.pressure_until = now + PRESSURE_HOLD_S;
    listeners_resume(srv);
}

void coord_limits_default(coord_limits *l) {
    memset(l, 0, sizeof *l); /* a limit added later starts off, never as garbage */
    l->peer = (coord_rate){.rate = 50, .burst = 500};
    l->split = (coord_rate){.rate = -1, .burst = -1}; /* from the run's split settings */
    l->addr = (coord_rate){.rate = 500, .burst = 5000};
    l->slow_timeout_s = 30;
    l->min_body_rate = 16384;
    l->body_budget = COORD_BODY_BUDGET_DEFAULT;
    l->conn_per_addr = COORD_CONN_PER_ADDR_DEFAULT;
    l->idle_first_s = COORD_IDLE_FIRST_S_DEFAULT;
    l->idle_keepalive_s = COORD_IDLE_KEEPALIVE_S_DEFAULT;
    /* max_conns and download_budget 0: from the descriptor limit and the
     * model's size. */
}
