/* The HTTPS server: TLS context, one guarded TLS bufferevent per
 * connection, request dispatch, signals and draining. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/util.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "coordinator/coord.h"
#include "coordinator/conn/listen.h"
#include "coordinator/run/score.h"
#include "coordinator/conn/nonce_log.h"
#include "coordinator/api/api.h"
#include "coordinator/base/limiter.h"
#include "coordinator/base/routes.h"
#include "coordinator/config/config.h"
#include "coordinator/conn/conn.h"
#include "coordinator/conn/guard.h"
#include "coordinator/conn/guard_types.h"
#include "coordinator/conn/limits.h"
#include "coordinator/conn/limits_types.h"
#include "coordinator/http/http.h"
#include "coordinator/ops/metrics.h"
#include "coordinator/run/run.h"
#include "coordinator/run/writer.h"
#include "coordinator/sched/schedule.h"
#include "coordinator/server.h"

/* ---- TLS ------------------------------------------------------------------ */

/* A guard lives exactly as long as its connection's SSL object: libevent
 * frees the SSL when it frees the connection, and OpenSSL then calls
 * guard_ex_free for the ex_data slot holding the guard. */
static int guard_ex_index = -1;
static void guard_ex_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                          void *argp);

/* Registers the ex_data slot that ties a guard to its connection's SSL
 * object; once per process, before the first TLS context is used. */
static int guard_slot(vl_error *err) {
    if (guard_ex_index < 0)
        guard_ex_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, guard_ex_free);
    if (guard_ex_index < 0) return vl_fail(err, VL_ERR, "cannot register TLS connection data");
    return VL_OK;
}

/* ---- lingering close --------------------------------------------------------- */

/* After a refusal the client may still be sending the body it announced.
 * libevent closes the socket right after the answer; closing with unread
 * input makes the kernel send a reset, which can destroy the answer before
 * the client reads it. The guard kept a duplicate of the socket: read and
 * drop what arrives on it until the client closes, or for a few seconds. */
#define LINGER_S 5.0

typedef struct coord_linger {
    struct event *ev;
    int fd;
    double deadline;
    coord_server *srv;
    struct coord_linger *prev, *next;
} coord_linger;

static void linger_end(coord_linger *l) {
    coord_server *srv = l->srv;
    if (l->prev)
        l->prev->next = l->next;
    else
        srv->conns.lingers = l->next;
    if (l->next) l->next->prev = l->prev;
    event_free(l->ev);
    close(l->fd);
    free(l);
}

static void linger_cb(evutil_socket_t fd, short what, void *arg) {
    coord_linger *l = arg;
    if ((what & EV_READ) && vl_clock_mono_s() < l->deadline) {
        char sink[16384];
        /* A bounded number of reads per wake-up keeps the loop fair. */
        for (int i = 0; i < 64; i++) {
            ssize_t n = recv(fd, sink, sizeof sink, 0);
            if (n > 0) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
            linger_end(l); /* the client closed, or the socket failed */
            return;
        }
        return;
    }
    linger_end(l); /* time is up */
}

static void linger_start(coord_server *srv, int fd) {
    coord_linger *l = calloc(1, sizeof *l);
    if (l) l->ev = event_new(srv->base, fd, EV_READ | EV_PERSIST, linger_cb, l);
    struct timeval tv = {(time_t)LINGER_S, 0};
    if (!l || !l->ev || event_add(l->ev, &tv) != 0) {
        if (l && l->ev) event_free(l->ev);
        free(l);
        close(fd);
        return;
    }
    /* The write side is already shut by libevent; make sure of it. */
    shutdown(fd, SHUT_WR);
    l->fd = fd;
    l->srv = srv;
    l->deadline = vl_clock_mono_s() + LINGER_S;
    l->next = srv->conns.lingers;
    if (srv->conns.lingers) srv->conns.lingers->prev = l;
    srv->conns.lingers = l;
}

/* ---- connections ---------------------------------------------------------- */

static void guard_ex_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                          void *argp) {
    (void)parent;
    (void)ad;
    (void)idx;
    (void)argl;
    (void)argp;
    coord_guard *g = ptr;
    if (!g) return;
    coord_server *srv = g->owner;
    if (g->prev)
        g->prev->next = g->next;
    else
        srv->conns.guards = g->next;
    if (g->next) g->next->prev = g->prev;
    srv->conns.n_conns--;
    if (g->linger_fd >= 0) {
        linger_start(srv, g->linger_fd);
        g->linger_fd = -1;
    }
    coord_guard_detach(g);
    coord_guard_free(g);
    free(g);
}

static void discard_input(struct evbuffer *input, const struct evbuffer_cb_info *info, void *arg) {
    (void)arg;
    if (info->n_added) evbuffer_drain(input, evbuffer_get_length(input));
}

static struct bufferevent *guarded_tls(struct event_base *base, coord_server *srv) {
    SSL *ssl = SSL_new(srv->conns.ssl);
    coord_guard *g = malloc(sizeof *g);
    if (!ssl || !g) goto fail;
    /* The routes whose bodies may be as large as the run allows (updates,
     * second-round values, split batches) come from the route table. */
    coord_guard_caps caps = {.body_cap = COORD_MAX_JSON_BODY,
                             .large_paths = coord_route_large_paths(),
                             .large_cap = (uint64_t)srv->run.cfg.max_body_bytes,
                             .slow_timeout_s = srv->conns.limits.slow_timeout_s,
                             .min_body_rate = srv->conns.limits.min_body_rate,
                             .body_window_s =
                                 srv->conns.limits.slow_timeout_s > 0 ? COORD_BODY_WINDOW_S : 0,
                             .authorize = coord_auth_head,
                             .authorize_arg = srv,
                             .release = coord_auth_release,
                             .progress = coord_auth_progress};
    coord_guard_init(g, COORD_HEAD_CAP, &caps);
    g->owner = srv;
    struct bufferevent *bev = bufferevent_openssl_socket_new(
        base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        coord_guard_free(g);
        goto fail;
    }
    /* From here the bufferevent owns ssl, and ssl owns g. */
    if (coord_guard_attach(g, bev) != VL_OK || SSL_set_ex_data(ssl, guard_ex_index, g) != 1) {
        coord_guard_detach(g);
        coord_guard_free(g);
        free(g);
        bufferevent_free(bev);
        return NULL;
    }
    g->next = srv->conns.guards;
    if (srv->conns.guards) srv->conns.guards->prev = g;
    srv->conns.guards = g;
    srv->conns.n_conns++;
    /* Clients that drop the TCP connection without close_notify are
     * normal (a killed peer), not errors worth a log line. */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
fail:
    free(g);
    if (ssl) SSL_free(ssl);
    return NULL;
}

/* Every connection is TLS, then the guard, then libevent's parser.
 * Returning NULL would make libevent fall back to a plain-text socket, so
 * a failure returns a socket that discards all input instead: the
 * connection then just times out. */
static struct bufferevent *make_bev(struct event_base *base, void *arg) {
    struct bufferevent *bev = guarded_tls(base, arg);
    if (bev) return bev;
    vl_log_error("cannot set up TLS for a connection; refusing it");
    bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (bev && !evbuffer_add_cb(bufferevent_get_input(bev), discard_input, NULL)) {
        bufferevent_free(bev);
        bev = NULL;
    }
    return bev;
}

/* ---- housekeeping ------------------------------------------------------------ */

/* One tick for everything the server does by the clock rather than by an
 * event, as redis's serverCron: each job runs every period_ms of it. */
#define CRON_MS 500
#define RUN_WITH_PERIOD(srv, period_ms) \
    ((period_ms) <= CRON_MS || (srv)->cron_loops % ((period_ms) / CRON_MS) == 0)

/* Every connection against the slow-client limits, then the connection
 * counts and the descriptor pressure (conns.c). */
static void check_connections(coord_server *srv, double now) {
    /* Enforcing may free that guard's connection (and unlink the guard),
     * never another one, so the next pointer is taken first. */
    for (coord_guard *g = srv->conns.guards, *next; g; g = next) {
        next = g->next;
        coord_guard_verdict v = coord_guard_enforce_time(g, now);
        if (v == COORD_GUARD_HEAD_TIMEOUT)
            vl_log_info("a request head took longer than %.0f s; refused",
                        srv->conns.limits.slow_timeout_s);
        else if (v == COORD_GUARD_BODY_TIMEOUT)
            vl_log_info("a request body arrived slower than %.0f bytes/s; connection closed",
                        srv->conns.limits.min_body_rate);
    }
    coord_conns_tick(srv, now);
}

static void serve_cron(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    coord_server *srv = arg;
    /* 1. connections: every tick, so a slow client is cut within CRON_MS
     *    of its limit (the tick runs with every limit off too: it also
     *    counts the admin listener's connections) */
    check_connections(srv, vl_clock_mono_s());
    /* 2. the nonce journal: the nonces seen since the last flush, once a
     *    second, so a restart within the window still refuses a replay */
    if (RUN_WITH_PERIOD(srv, 1000) && srv->conns.nonce_log) {
        vl_error e = {0};
        if (coord_nonce_log_flush(srv->conns.nonce_log, &e) != VL_OK)
            vl_log_warn("nonce journal: %s", e.msg);
    }
    srv->cron_loops++;
}

static int start_cron(coord_server *srv, vl_error *err) {
    srv->cron = event_new(srv->base, -1, EV_PERSIST, serve_cron, srv);
    struct timeval tv = {0, (suseconds_t)CRON_MS * 1000};
    if (!srv->cron || event_add(srv->cron, &tv) != 0)
        return vl_fail(err, VL_ENOMEM, "cannot start the housekeeping timer");
    return VL_OK;
}

/* Slots of the rate tables: enough for every address of a large swarm;
 * an overflow only costs an extra burst (limiter.h). */
#define LIMITER_SLOTS ((size_t)1 << 16)

static int setup_limits(coord_server *srv, const coord_limits *l, vl_error *err) {
    srv->conns.limits = *l;
    if (srv->conns.limits.slow_timeout_s > 0 && !(srv->conns.limits.min_body_rate > 0))
        return vl_fail(err, VL_EINVAL, "the minimum body rate must be > 0");
    srv->conns.addr_limiter = coord_limiter_new(LIMITER_SLOTS, l->addr);
    srv->conns.peer_limiter = coord_limiter_new(LIMITER_SLOTS, l->peer);
    if (!srv->conns.addr_limiter || !srv->conns.peer_limiter)
        return vl_fail(err, VL_ENOMEM, "out of memory");
    /* The run's configuration is loaded by now: a split run's batches get
     * a budget sized from its split settings (rates.c). */
    if (coord_config_is_split(&srv->run.cfg)) {
        srv->conns.limits.split = coord_limits_split_rate(&srv->run.cfg, l->peer, l->split);
        srv->conns.split_limiter = coord_limiter_new(LIMITER_SLOTS, srv->conns.limits.split);
        if (!srv->conns.split_limiter) return vl_fail(err, VL_ENOMEM, "out of memory");
        if (srv->conns.limits.split.rate > 0)
            vl_log_info("split batches: up to %.0f requests/s per peer, bursts of %.0f",
                        srv->conns.limits.split.rate, srv->conns.limits.split.burst);
    }
    return start_cron(srv, err);
}

/* ---- draining --------------------------------------------------------------- */

static int all_idle(coord_server *srv) {
    if (srv->sched.n_waiters > 0 || srv->conns.inflight > 0 ||
        coord_writer_pending(srv->run.writer) > 0)
        return 0;
    for (coord_guard *g = srv->conns.guards; g; g = g->next)
        if (!coord_guard_idle(g)) return 0;
    return 1;
}

static void drain_tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    coord_server *srv = arg;
    if (all_idle(srv)) {
        vl_log_info("drained; shutting down");
        event_base_loopexit(srv->base, NULL);
        return;
    }
    if (vl_clock_mono_s() >= srv->drain_deadline) {
        vl_log_warn("drain grace of %d s over with %lld request(s) unfinished; shutting down",
                    COORD_DRAIN_GRACE_S, (long long)srv->conns.inflight);
        event_base_loopexit(srv->base, NULL);
        return;
    }
    struct timeval tv = {0, 50000};
    evtimer_add(srv->drain_timer, &tv);
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
    (void)what;
    coord_server *srv = arg;
    if (srv->draining) {
        vl_log_warn("second signal: shutting down now");
        event_base_loopexit(srv->base, NULL);
        return;
    }
    vl_log_info("signal %d: draining (no new connections; finishing requests in flight)", (int)sig);
    srv->draining = 1;
    srv->drain_deadline = vl_clock_mono_s() + COORD_DRAIN_GRACE_S;
    if (srv->conns.bound) {
        evhttp_del_accept_socket(srv->conns.http, srv->conns.bound);
        srv->conns.bound = NULL;
    }
    coord_drain_waiters(srv);
    srv->drain_timer = evtimer_new(srv->base, drain_tick, srv);
    if (!srv->drain_timer) {
        event_base_loopexit(srv->base, NULL);
        return;
    }
    drain_tick(-1, 0, srv);
}

/* ---- listening -------------------------------------------------------------- */

/* HOST:PORT or [V6]:PORT; port 0 picks a free one. */
static int split_listen(const char *s, char *host, size_t cap, int *port, vl_error *err) {
    const char *colon;
    const char *h = s;
    size_t hlen;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':') goto bad;
        h = s + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon) goto bad;
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0 || hlen >= cap) goto bad;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    int64_t p;
    if (vl_parse_i64(colon + 1, 0, 65535, &p) != VL_OK) goto bad;
    *port = (int)p;
    return VL_OK;
bad:
    return vl_fail(err, VL_EINVAL, "--listen must be HOST:PORT (got \"%s\")", s);
}

/* The size of coord_server.admin_token, its terminator included. */
#define ADMIN_TOKEN_CAP ((int)sizeof(((coord_server *)NULL)->ops.admin_token))

/* The admin listener as opts ask, bound into *fd (-1: none): the default
 * address is given up when taken (two coordinators on one host), with the
 * warning to log left in warning, an explicit one is not; anything but a
 * loopback address needs a token. Touches neither srv nor the database. */
static int bind_admin(const coord_serve_opts *opts, char *host, size_t cap, int *fd, char *warning,
                      size_t wcap, vl_error *err) {
    *fd = -1;
    warning[0] = '\0';
    const char *listen = opts->admin_listen ? opts->admin_listen : "127.0.0.1:9464";
    if (!strcmp(listen, "off")) return VL_OK;
    int port = 0;
    if (split_listen(listen, host, cap, &port, err) != VL_OK)
        return vl_fail(err, VL_EINVAL, "--admin-listen must be HOST:PORT or off (got \"%s\")",
                       listen);
    int loopback = !strncmp(host, "127.", 4) || !strcmp(host, "::1") || !strcmp(host, "localhost");
    if (opts->admin_token) {
        size_t tl = strlen(opts->admin_token);
        if (tl < 16 || tl >= ADMIN_TOKEN_CAP)
            return vl_fail(err, VL_EINVAL, "the admin token must be 16 to %d characters",
                           ADMIN_TOKEN_CAP - 1);
    } else if (!loopback) {
        return vl_fail(err, VL_EINVAL,
                       "the admin listener on %s is not on a loopback address: "
                       "give it --admin-token-file",
                       listen);
    }
    vl_error e = {0};
    int rc = coord_listen_bind("the admin listener", host, port, fd, &e);
    if (rc == VL_OK) return VL_OK;
    if (opts->admin_listen) return vl_fail(err, rc, "%s", e.msg);
    /* Said once the server is up, where the admin listener would have
     * started: a database refused at start is then the one line. */
    snprintf(warning, wcap, "%s; no /metrics (serve --admin-listen picks another address)", e.msg);
    return VL_OK;
}

/* Serves the public listener on fd, bound by coord_listen_bind (libevent
 * owns it from here, also on failure). */
static int start_listening(coord_server *srv, const char *listen, int fd, vl_error *err) {
    srv->conns.bound = evhttp_accept_socket_with_handle(srv->conns.http, fd);
    if (!srv->conns.bound) {
        close(fd);
        return vl_fail(err, VL_ENOMEM, "cannot serve on %s: out of memory", listen);
    }
    /* A response leaves in several TLS records; with Nagle's algorithm the
     * last one waits for the client's delayed ACK, long enough to cap what
     * one client can upload (docs/benchmarks.md). Accepted sockets inherit
     * the option from the listener on Linux. */
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        vl_log_warn("cannot set TCP_NODELAY on %s: %s", listen, strerror(errno));
    char addr[INET6_ADDRSTRLEN] = "?";
    int v6 = 0, real_port = coord_listen_bound_addr(fd, addr, sizeof addr, &v6);
    /* Scripts wait for this exact line. */
    fprintf(stderr, v6 ? "listening on [%s]:%d\n" : "listening on %s:%d\n", addr, real_port);
    fflush(stderr);
    return VL_OK;
}

/* ---- serve -------------------------------------------------------------------- */

/* The handler of every route of the table (base/routes.h): what binds
 * the routes, which the layers below read, to the API above them. */
static const coord_handler HANDLERS[COORD_ROUTE_COUNT] = {
    [COORD_ROUTE_JOIN] = coord_route_join,
    [COORD_ROUTE_ROTATE] = coord_route_rotate,
    [COORD_ROUTE_TASK] = coord_route_task,
    [COORD_ROUTE_MODEL] = coord_route_model,
    [COORD_ROUTE_DELTA] = coord_route_delta,
    [COORD_ROUTE_DATA] = coord_route_data,
    [COORD_ROUTE_UPDATES] = coord_route_updates,
    [COORD_ROUTE_STATUS] = coord_route_status,
    [COORD_ROUTE_ROUND] = coord_route_round,
    [COORD_ROUTE_ROUND_VALUES] = coord_route_round_values,
    [COORD_ROUTE_SPLIT_FORWARD] = coord_route_split_forward,
    [COORD_ROUTE_SPLIT_BACKWARD] = coord_route_split_backward,
    [COORD_ROUTE_FACTORS] = coord_route_factors,
};

static int setup_http(coord_server *srv, vl_error *err) {
    srv->conns.http = evhttp_new(srv->base);
    if (!srv->conns.http) return vl_fail(err, VL_ENOMEM, "cannot create the HTTP server");
    srv->handlers = HANDLERS;
    evhttp_set_gencb(srv->conns.http, coord_dispatch, srv);
    /* Every method reaches the handler, so even a wrong one gets JSON. */
    evhttp_set_allowed_methods(srv->conns.http, COORD_HTTP_ALL_METHODS);
    /* Backstops behind the guard, which refuses first and in JSON. */
    evhttp_set_max_headers_size(srv->conns.http, COORD_HEAD_CAP + 1024);
    evhttp_set_max_body_size(srv->conns.http, srv->run.cfg.max_body_bytes);
    evhttp_set_timeout(srv->conns.http, COORD_IO_TIMEOUT_S);
    return VL_OK;
}

int coord_server_open(const char *db_path, const coord_limits *limits, coord_server **out,
                      vl_error *err) {
    *out = NULL;
    coord_server *srv = calloc(1, sizeof *srv);
    if (!srv) return vl_fail(err, VL_ENOMEM, "out of memory");
    /* One thread makes versions unless coord_serve is told otherwise. */
    srv->run.compute_threads = 1;
    const char *ack = getenv("VOLLEY_ACK_CHECK");
    srv->run.ack_check = ack && strcmp(ack, "1") == 0;
    snprintf(srv->run.db_path, sizeof srv->run.db_path, "%s", db_path);
    srv->ops.metrics.train_loss = NAN;
    int rc = storage_open(db_path, 0, &srv->run.db, err);
    if (rc == VL_OK) rc = coord_state_load(srv, err);
    if (rc == VL_OK && !(srv->base = event_base_new()))
        rc = vl_fail(err, VL_ENOMEM, "cannot create the event loop");
    if (rc == VL_OK) rc = coord_writer_start(db_path, srv->base, &srv->run.writer, err);
    if (rc == VL_OK) coord_writer_set_full_hook(srv->run.writer, coord_disk_note, srv);
    if (rc == VL_OK) rc = coord_score_start(srv, err);
    if (rc == VL_OK)
        rc = coord_nonce_log_open(db_path, srv->conns.nonces, NULL, &srv->conns.nonce_log, err);
    if (rc == VL_OK) {
        coord_limits def;
        coord_limits_default(&def);
        rc = setup_limits(srv, limits ? limits : &def, err);
    }
    if (rc == VL_OK) rc = setup_http(srv, err);
    if (rc != VL_OK) {
        coord_server_close(srv);
        return rc;
    }
    *out = srv;
    return VL_OK;
}

void coord_server_close(coord_server *srv) {
    if (!srv) return;
    coord_drain_waiters(srv);
    /* Queued writes still commit, and their requests are answered, before
     * the connections go. */
    coord_writer_stop(srv->run.writer);
    srv->run.writer = NULL;
    if (srv->ops.admin_http) evhttp_free(srv->ops.admin_http);
    if (srv->conns.http) evhttp_free(srv->conns.http);
    while (srv->conns.lingers) linger_end(srv->conns.lingers);
    if (srv->sched.lease_timer) event_free(srv->sched.lease_timer);
    if (srv->sched.wait_timer) event_free(srv->sched.wait_timer);
    if (srv->sched.merge_event) event_free(srv->sched.merge_event);
    if (srv->sched.round_timer) event_free(srv->sched.round_timer);
    if (srv->drain_timer) event_free(srv->drain_timer);
    if (srv->cron) event_free(srv->cron);
    coord_conns_close(srv);
    coord_nonce_log_close(srv->conns.nonce_log);
    srv->conns.nonce_log = NULL;
    coord_limiter_free(srv->conns.addr_limiter);
    coord_limiter_free(srv->conns.peer_limiter);
    coord_limiter_free(srv->conns.split_limiter);
    coord_norm_bound_window_free(srv);
    if (srv->sig_term) event_free(srv->sig_term);
    if (srv->sig_int) event_free(srv->sig_int);
    if (srv->sig_hup) event_free(srv->sig_hup);
    if (srv->base) event_base_free(srv->base);
    if (srv->conns.ssl) SSL_CTX_free(srv->conns.ssl);
    coord_state_free(srv);
    storage_close(srv->run.db);
    free(srv->conns.receiving_peers);
    free(srv);
}

/* What coord_serve holds before the server opens: the database's lock
 * and the bound listeners. */
typedef struct serve_hold {
    storage_lock *lock;
    int fd, admin_fd;
    char admin_host[256];
    char admin_warning[320]; /* the default admin address was taken */
} serve_hold;

/* The lock, then the listeners, so that a second server or a taken port
 * is refused before anything reads or writes the database. */
static int serve_prepare(const coord_serve_opts *opts, const char *host, int port, serve_hold *h,
                         vl_error *err) {
    h->fd = h->admin_fd = -1;
    /* A mistyped path leaves no lock file behind. */
    struct stat sb;
    if (stat(opts->db_path, &sb) != 0 && errno == ENOENT)
        return vl_fail(err, VL_ENOTFOUND, "database %s does not exist", opts->db_path);
    int rc = storage_lock_take(opts->db_path, &h->lock, err);
    if (rc == VL_OK) rc = coord_listen_bind(NULL, host, port, &h->fd, err);
    if (rc == VL_OK)
        rc = bind_admin(opts, h->admin_host, sizeof h->admin_host, &h->admin_fd, h->admin_warning,
                        sizeof h->admin_warning, err);
    return rc;
}

static void serve_hold_release(serve_hold *h) {
    if (h->fd >= 0) close(h->fd);
    if (h->admin_fd >= 0) close(h->admin_fd);
    storage_lock_release(h->lock);
}

int coord_serve(const coord_serve_opts *opts, vl_error *err) {
    /* Cheap checks first: a typo should not wait for the corpus hash. */
    char host[256];
    int port = 0;
    int rc = split_listen(opts->listen, host, sizeof host, &port, err);
    if (rc != VL_OK) return rc;
    if ((rc = guard_slot(err)) != VL_OK) return rc;
    SSL_CTX *ssl = coord_tls_ctx_new(opts->cert_path, opts->key_path, err);
    if (!ssl) return VL_EINVAL;
    serve_hold h = {0};
    coord_server *srv = NULL;
    rc = serve_prepare(opts, host, port, &h, err);
    if (rc == VL_OK) rc = coord_server_open(opts->db_path, &opts->limits, &srv, err);
    if (rc != VL_OK) {
        serve_hold_release(&h);
        SSL_CTX_free(ssl);
        return rc;
    }
    srv->conns.ssl = ssl;
    snprintf(srv->conns.cert_path, sizeof srv->conns.cert_path, "%s", opts->cert_path);
    snprintf(srv->conns.key_path, sizeof srv->conns.key_path, "%s", opts->key_path);
    if (opts->admin_token)
        snprintf(srv->ops.admin_token, sizeof srv->ops.admin_token, "%s", opts->admin_token);
    srv->run.compute_threads = opts->compute_threads > 0 ? opts->compute_threads : 0;
    evhttp_set_bevcb(srv->conns.http, make_bev, srv);
    srv->sig_term = evsignal_new(srv->base, SIGTERM, on_signal, srv);
    srv->sig_int = evsignal_new(srv->base, SIGINT, on_signal, srv);
    srv->sig_hup = evsignal_new(srv->base, SIGHUP, coord_tls_on_sighup, srv);
    if (!srv->sig_term || !srv->sig_int || !srv->sig_hup || evsignal_add(srv->sig_term, NULL) ||
        evsignal_add(srv->sig_int, NULL) || evsignal_add(srv->sig_hup, NULL))
        rc = vl_fail(err, VL_ERR, "cannot install signal handlers");
    if (rc == VL_OK) {
        /* Updates committed just before a crash may complete a version. */
        vl_error merr = {0};
        int m = coord_merge_if_ready(srv, &merr);
        if (m != VL_OK && m != VL_AGAIN)
            rc = vl_fail(err, m, "cannot merge pending updates: %s", merr.msg);
    }
    if (rc == VL_OK) {
        vl_log_info("run \"%s\": version %lld of %lld, %zu parameters%s", srv->run.cfg.name,
                    (long long)srv->run.version, (long long)srv->run.cfg.max_versions,
                    srv->run.n_params, srv->run.finished ? " (finished)" : "");
        coord_expire_leases(srv);
        rc = start_listening(srv, opts->listen, h.fd, err);
        h.fd = -1; /* libevent's now */
    }
    if (rc == VL_OK) {
        int64_t fds = coord_conns_raise_limit();
        if (srv->conns.limits.max_conns <= 0)
            srv->conns.limits.max_conns = coord_conns_default_max(fds);
        rc = coord_conns_listen(srv, err);
    }
    if (rc == VL_OK && h.admin_fd >= 0) {
        rc = coord_admin_start(srv, h.admin_host, h.admin_fd, err);
        h.admin_fd = -1;
    }
    if (rc == VL_OK && h.admin_warning[0]) vl_log_warn("%s", h.admin_warning);
    if (rc == VL_OK && event_base_dispatch(srv->base) < 0)
        rc = vl_fail(err, VL_ERR, "the event loop failed");
    coord_server_close(srv);
    /* The lock goes last: the writer has committed all it will. */
    serve_hold_release(&h);
    return rc;
}
