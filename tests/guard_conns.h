/* Connections for tests that serve the real coordinator's evhttp server
 * over a plain socket in place of TLS. Each one gets the input guard the
 * server hooks on its TLS connections, with the same caps, and sits in the
 * server's guard list, where dispatch finds a request's guard and its
 * ticket; so the guard, the parser and every route run as in production.
 *
 * A test keeps its connections on a list of its own (a guard_conn * that
 * starts NULL): its bufferevent callback takes them from guard_conn_new,
 * its request callback calls guard_conn_watch before dispatching, and
 * guard_conn_release_all lets go of those evhttp never reported closed. */
#ifndef VOLLEY_TESTS_GUARD_CONNS_H
#define VOLLEY_TESTS_GUARD_CONNS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/bufferevent.h>
#include <event2/http.h>

#include "coordinator/coord.h"
#include "coordinator/conn/guard.h"
#include "coordinator/conn/guard_types.h"
#include "coordinator/conn/limits.h"
#include "coordinator/conn/limits_types.h"
#include "coordinator/http/http.h"
#include "coordinator/server.h"

/* One connection's guard, kept until the connection is gone. */
typedef struct guard_conn {
    coord_guard g;
    struct bufferevent *bev;
    int closed; /* evhttp told us it is freeing the connection */
    coord_server *srv;
    struct guard_conn **list;
    struct guard_conn *next;
} guard_conn;

/* srv is NULL once the server is closed: its guard list went with it. */
static inline void guard_conn_release(guard_conn *c, coord_server *srv) {
    guard_conn **p = c->list;
    while (*p && *p != c) p = &(*p)->next;
    if (*p) *p = c->next;
    if (!c->closed) {
        /* The bufferevent, and with it the input buffer that held the
         * hook, is already freed: nothing of it may be touched. */
        c->g.hook = NULL;
        c->g.input = NULL;
    }
    if (srv) {
        if (c->g.prev)
            c->g.prev->next = c->g.next;
        else if (srv->conns.guards == &c->g)
            srv->conns.guards = c->g.next;
        if (c->g.next) c->g.next->prev = c->g.prev;
    }
    coord_guard_detach(&c->g);
    coord_guard_free(&c->g);
    free(c);
}

static inline void guard_conn_release_all(guard_conn **list, coord_server *srv) {
    while (*list) guard_conn_release(*list, srv);
}

/* evhttp frees a connection that had a request this way, before it frees
 * the bufferevent: the guard is unhooked while the buffer still exists. */
static inline void guard_conn_closed(struct evhttp_connection *evcon, void *arg) {
    (void)evcon;
    guard_conn *c = arg;
    c->closed = 1;
    guard_conn_release(c, c->srv);
}

/* A plain socket's bufferevent with the guard attached as the server
 * attaches it to a TLS one; NULL when that fails. */
static inline guard_conn *guard_conn_new(struct event_base *base, coord_server *srv,
                                         guard_conn **list) {
    static const char *const large_paths[] = {"/v1/updates", "/v1/round/values", NULL};
    guard_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    coord_guard_caps caps = {.body_cap = COORD_MAX_JSON_BODY,
                             .large_paths = large_paths,
                             .large_cap = (uint64_t)srv->run.cfg.max_body_bytes,
                             .authorize = coord_auth_head,
                             .authorize_arg = srv,
                             .release = coord_auth_release};
    coord_guard_init(&c->g, COORD_HEAD_CAP, &caps);
    c->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!c->bev || coord_guard_attach(&c->g, c->bev) != VL_OK) {
        coord_guard_free(&c->g);
        if (c->bev) bufferevent_free(c->bev);
        free(c);
        return NULL;
    }
    c->srv = srv;
    c->g.next = srv->conns.guards;
    if (srv->conns.guards) srv->conns.guards->prev = &c->g;
    srv->conns.guards = &c->g;
    c->list = list;
    c->next = *list;
    *list = c;
    return c;
}

/* evhttp hands the harness a connection only through a request on it, so
 * each request sets the close callback of its own. */
static inline void guard_conn_watch(struct evhttp_request *req, guard_conn *list) {
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    for (guard_conn *c = list; c; c = c->next)
        if (c->bev == bev) evhttp_connection_set_closecb(evcon, guard_conn_closed, c);
}

/* Opens the coordinator of db with the default limits but no slow-client
 * timeouts, and serves its evhttp on the Unix socket dir/http.sock (its
 * path copied into sock) through bevcb and gencb, as the in-process tests
 * drive it. Returns the server, or NULL with err set. */
static inline coord_server *
guard_conns_serve_unix(const char *db, const char *dir, char *sock, size_t cap, int backlog,
                       struct bufferevent *(*bevcb)(struct event_base *, void *),
                       void (*gencb)(struct evhttp_request *, void *), vl_error *err) {
    coord_limits limits;
    coord_limits_default(&limits);
    limits.slow_timeout_s = 0;
    coord_server *srv = NULL;
    if (coord_server_open(db, &limits, &srv, err) != VL_OK) return NULL;
    evhttp_set_bevcb(srv->conns.http, bevcb, NULL);
    evhttp_set_gencb(srv->conns.http, gencb, srv);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int n = snprintf(sock, cap, "%s/http.sock", dir);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (n < 0 || (size_t)n >= cap || (size_t)n >= sizeof sa.sun_path || fd < 0) goto fail;
    memcpy(sa.sun_path, sock, (size_t)n + 1);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, backlog) != 0 ||
        evhttp_accept_socket(srv->conns.http, fd) != 0)
        goto fail;
    return srv;
fail:
    if (fd >= 0) close(fd);
    coord_server_close(srv);
    vl_fail(err, VL_EIO, "cannot serve on a Unix socket in %s", dir);
    return NULL;
}

#endif
