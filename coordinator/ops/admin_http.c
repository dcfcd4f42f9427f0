/* The admin listener: plain HTTP for the operator, on its own socket
 * (serve --admin-listen), serving /metrics (metrics.c), the dashboard page
 * and its figures (dashboard.c). Every path needs the admin token when one
 * is set, as a bearer token or as HTTP Basic's password, which is what a
 * browser can be asked for. It only reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "coordinator/coord.h"
#include "coordinator/conn/limits.h"
#include "coordinator/conn/listen.h"
#include "coordinator/ops/dashboard.h"
#include "coordinator/ops/metrics.h"
#include "crypto/crypto.h"

static void admin_error(struct evhttp_request *req, int status, const char *code, const char *msg) {
    struct evbuffer *b = evbuffer_new();
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    if (b) evbuffer_add_printf(b, "{\"error\":{\"code\":\"%s\",\"message\":\"%s\"}}", code, msg);
    evhttp_send_reply(req, status, code, b);
    if (b) evbuffer_free(b);
}

/* Whether secret is the token, in time that does not depend on where they
 * differ. */
static int token_matches(const coord_server *srv, const char *secret, size_t len) {
    size_t tl = strlen(srv->ops.admin_token);
    return len == tl && vcrypto_equal(secret, srv->ops.admin_token, tl);
}

/* The token as a bearer token (scrapers, curl), or as the password of
 * Basic credentials (any user name): a browser asks its user for those
 * when a 401 offers Basic, then sends them with every request to the
 * listener, the page's polls included. */
static int authorised(const coord_server *srv, const char *auth) {
    if (!auth) return 0;
    if (strncmp(auth, "Bearer ", 7) == 0) return token_matches(srv, auth + 7, strlen(auth + 7));
    if (strncmp(auth, "Basic ", 6) != 0) return 0;
    const char *b64 = auth + 6;
    size_t n = strlen(b64);
    /* A user name and a token of at most sizeof admin_token fit in far
     * less; anything longer is refused before decoding. */
    char plain[512];
    if (n > 4 * (sizeof plain / 3)) return 0;
    long len = vl_base64_decode(b64, n, (uint8_t *)plain, sizeof plain - 1);
    if (len < 0) return 0;
    const char *colon = memchr(plain, ':', (size_t)len);
    if (!colon) return 0;
    size_t off = (size_t)(colon + 1 - plain);
    return token_matches(srv, colon + 1, (size_t)len - off);
}

static void send_page(struct evhttp_request *req) {
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", "text/html; charset=utf-8");
    /* The page is self-contained: it may talk only to this listener and
     * load nothing from anywhere. */
    evhttp_add_header(h, "Content-Security-Policy",
                      "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                      "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
                      "frame-ancestors 'none'");
    evhttp_add_header(h, "Referrer-Policy", "no-referrer");
    struct evbuffer *b = evbuffer_new();
    if (!b || evbuffer_add_reference(b, coord_dashboard_html, coord_dashboard_html_len, NULL,
                                     NULL) != 0) {
        if (b) evbuffer_free(b);
        admin_error(req, 500, "internal", "out of memory");
        return;
    }
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static void send_summary(coord_server *srv, struct evhttp_request *req) {
    vl_error e = {0};
    json_t *o = coord_dashboard_json(srv, &e);
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    struct evbuffer *b = text ? evbuffer_new() : NULL;
    if (!b) {
        free(text);
        vl_log_error("GET /dashboard.json: %s", e.msg[0] ? e.msg : "out of memory");
        admin_error(req, 500, "internal", "the dashboard's figures could not be read");
        return;
    }
    evbuffer_add(b, text, strlen(text));
    free(text);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static void send_metrics(coord_server *srv, struct evhttp_request *req) {
    struct evbuffer *b = evbuffer_new();
    vl_error e = {0};
    if (!b || coord_metrics_write(srv, b, &e) != VL_OK) {
        if (b) evbuffer_free(b);
        vl_log_error("GET /metrics: %s", e.msg[0] ? e.msg : "out of memory");
        admin_error(req, 500, "internal", "the metrics could not be read");
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4; charset=utf-8");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

/* The type libevent 2.1 gives a request whose method it has no name for
 * (EVHTTP_REQ_UNKNOWN_ in its http-internal.h, not in the public
 * header). Its evhttp_handle_request answers any type outside the
 * allowed methods with an HTML 501 before a callback runs, so an unknown
 * method reaches admin_cb only with this bit allowed. */
#define ADMIN_UNKNOWN_METHOD (1 << 15)
/* The largest request body the admin listener reads: every request to
 * it is refused unless it is a GET, and a small body should not make
 * the refusal libevent's HTML page. */
#define ADMIN_BODY_MAX 65536

static void admin_cb(struct evhttp_request *req, void *arg) {
    coord_server *srv = arg;
    struct evkeyvalq *out = evhttp_request_get_output_headers(req);
    /* Everything here is the operator's: never cached on the way, never
     * read as another type than it says. */
    evhttp_add_header(out, "Cache-Control", "no-store");
    evhttp_add_header(out, "X-Content-Type-Options", "nosniff");
    if (srv->ops.admin_token[0] &&
        !authorised(srv,
                    evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization"))) {
        evhttp_add_header(out, "WWW-Authenticate", "Bearer");
        evhttp_add_header(out, "WWW-Authenticate",
                          "Basic realm=\"volley admin\", charset=\"UTF-8\"");
        admin_error(req, 401, "unauthorized",
                    "this listener needs its token (bearer, or a browser's password)");
        return;
    }
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
        evhttp_add_header(out, "Allow", "GET");
        admin_error(req, 405, "method_not_allowed", "only GET is served here");
        return;
    }
    if (path && strcmp(path, "/metrics") == 0)
        send_metrics(srv, req);
    else if (path && strcmp(path, "/dashboard.json") == 0)
        send_summary(srv, req);
    else if (path && strcmp(path, "/") == 0)
        send_page(req);
    else
        admin_error(req, 404, "not_found", "this listener serves /, /dashboard.json and /metrics");
}

int coord_admin_start(coord_server *srv, const char *host, int fd, vl_error *err) {
    srv->ops.admin_http = evhttp_new(srv->base);
    if (!srv->ops.admin_http) {
        close(fd);
        return vl_fail(err, VL_ENOMEM, "cannot create the admin listener");
    }
    /* Scrapes are small GETs; nothing large is taken here. A body up to
     * ADMIN_BODY_MAX is read (and ignored), so a POST or PATCH that
     * carries one still reaches admin_cb and gets its JSON 405: with a
     * cap of 0, libevent answers any body with its own HTML 413. */
    evhttp_set_max_headers_size(srv->ops.admin_http, 16384);
    evhttp_set_max_body_size(srv->ops.admin_http, ADMIN_BODY_MAX);
    evhttp_set_timeout(srv->ops.admin_http, 10);
    evhttp_set_gencb(srv->ops.admin_http, admin_cb, srv);
    /* Every method reaches admin_cb, so a wrong one gets its JSON 405;
     * ADMIN_UNKNOWN_METHOD lets in the methods libevent has no name for
     * as well, which it would otherwise answer with an HTML 501. */
    evhttp_set_allowed_methods(srv->ops.admin_http, COORD_HTTP_ALL_METHODS | ADMIN_UNKNOWN_METHOD);
    struct evhttp_bound_socket *bs = evhttp_accept_socket_with_handle(srv->ops.admin_http, fd);
    if (!bs) {
        close(fd);
        evhttp_free(srv->ops.admin_http);
        srv->ops.admin_http = NULL;
        return vl_fail(err, VL_ENOMEM, "cannot serve the admin listener: out of memory");
    }
    int rc = coord_conns_admin(srv, bs, err);
    if (rc != VL_OK) {
        evhttp_free(srv->ops.admin_http);
        srv->ops.admin_http = NULL;
        srv->ops.admin_bound = NULL;
        return rc;
    }
    int bound_port = coord_bound_port(evhttp_bound_socket_get_fd(bs));
    vl_log_info("admin listener on http://%s:%d/metrics, dashboard at http://%s:%d/%s", host,
                bound_port, host, bound_port, srv->ops.admin_token[0] ? " (token required)" : "");
    return VL_OK;
}
