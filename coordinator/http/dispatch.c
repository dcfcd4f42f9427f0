/* Dispatch: a request's life on the public listener from its head to
 * its handler. A head the input guard refused is answered here; a head
 * it let through brings its ticket (what the guard found on the head and
 * body); then the route table (base/routes.h) picks the route, the body's
 * media type is checked, and the handler the server bound to the route
 * (srv->handlers) runs. Unknown paths get 404 and wrong methods 405, as
 * JSON. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <event2/bufferevent.h>
#include <event2/http.h>

#include "coordinator/base/routes.h"
#include "coordinator/coord.h"
#include "coordinator/http/http.h"
#include "coordinator/conn/guard.h"
#include "coordinator/conn/guard_types.h"

/* The media type of a Content-Type value matches want: compared without
 * case, parameters (";charset=utf-8") ignored. */
static int media_matches(const char *value, const char *want) {
    if (!value) return 0;
    while (*value == ' ' || *value == '\t') value++;
    size_t n = strcspn(value, ";");
    while (n > 0 && (value[n - 1] == ' ' || value[n - 1] == '\t')) n--;
    return n == strlen(want) && strncasecmp(value, want, n) == 0;
}

/* The guard of the connection a request came on (NULL for none): the
 * server's list holds one per connection, whatever its transport. */
static coord_guard *guard_of(coord_server *srv, struct evhttp_request *req) {
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    if (!bev) return NULL;
    for (coord_guard *g = srv->conns.guards; g; g = g->next)
        if (g->bev == bev) return g;
    return NULL;
}

/* Takes the ticket the guard issued for this request's head. Answers and
 * returns COORD_ANSWERED when there is none (it cannot be: the guard numbers every
 * head it lets through) or when the body did not match its digest. */
static int take_ticket(coord_req *cr) {
    const char *v = coord_get_header(cr, COORD_GUARD_TICKET_HEADER);
    coord_guard *g = guard_of(cr->srv, cr->req);
    int64_t seq = 0;
    if (!v || !g || vl_parse_i64(v, 1, INT64_MAX, &seq) != 0 ||
        coord_guard_ticket_take(g, (uint64_t)seq, &cr->ticket) != VL_OK) {
        vl_log_error("%s %s: the request has no ticket from the input guard", cr->method, cr->path);
        coord_reply_error(cr, 500, "internal", "internal error");
        return COORD_ANSWERED;
    }
    /* The body has arrived: it no longer counts as being received. */
    coord_auth_release(cr->srv, &cr->ticket);
    if (cr->ticket.digest != COORD_GUARD_DIGEST_NONE &&
        cr->ticket.digest != COORD_GUARD_DIGEST_OK) {
        coord_reply_error(cr, 400, "digest_mismatch",
                          "the body does not match its Content-Digest; nothing was stored");
        return COORD_ANSWERED;
    }
    return 0;
}

/* The body cap of route r (NULL: no route), as the guard applies it on the
 * head: the run's max_body_bytes for a large body, COORD_MAX_JSON_BODY for
 * any other. */
static int64_t body_cap(const coord_server *srv, const coord_route *r) {
    return r && r->large ? srv->run.cfg.max_body_bytes : COORD_MAX_JSON_BODY;
}

/* 413 for a body over route r's cap, naming what the body is. */
static void reply_too_large(coord_req *cr, const coord_route *r) {
    long long cap = (long long)body_cap(cr->srv, r);
    coord_reply_error(cr, 413, "too_large", "%s at most %lld bytes",
                      r && r->body_what ? r->body_what : "a request body here is", cap);
}

/* A head the guard refused: answer without reading anything more, and
 * close (the guard already discards the rest of the connection). */
static void refuse_guarded(coord_req *cr, const char *marker) {
    coord_set_header(cr, "Connection", "close");
    switch (coord_guard_verdict_parse(marker)) {
    case COORD_GUARD_TOO_LARGE:
        reply_too_large(cr, coord_route_get(coord_route_index(cr->full_path)));
        break;
    case COORD_GUARD_HEAD_TOO_LARGE:
        coord_reply_error(cr, 413, "too_large", "the request head is larger than %d bytes",
                          COORD_HEAD_CAP);
        break;
    case COORD_GUARD_LENGTH_REQUIRED:
        coord_reply_error(cr, 411, "length_required",
                          "a body needs Content-Length; chunked bodies are refused");
        break;
    case COORD_GUARD_BAD_LENGTH:
        coord_reply_error(cr, 400, "bad_request", "Content-Length is duplicated or malformed");
        break;
    case COORD_GUARD_BAD_METHOD:
        coord_reply_error(cr, 405, "method_not_allowed", "unknown method");
        break;
    case COORD_GUARD_BODY_NOT_ALLOWED:
        coord_reply_error(cr, 400, "bad_request", "a %s request carries no body", cr->method);
        break;
    case COORD_GUARD_HEAD_TIMEOUT:
        coord_reply_error(cr, 408, "request_timeout", "the request head took longer than %.0f s",
                          cr->srv->conns.limits.slow_timeout_s);
        break;
    case COORD_GUARD_PIPELINED:
        coord_set_header(cr, "Retry-After", "1");
        coord_reply_error(cr, 429, "rate_limited",
                          "at most %d pipelined requests per "
                          "connection",
                          COORD_GUARD_TICKETS);
        break;
    case COORD_GUARD_REFUSED: {
        coord_guard *g = guard_of(cr->srv, cr->req);
        if (!g || g->refusal.status == 0) {
            coord_reply_error(cr, 401, "unauthorized", "refused");
            break;
        }
        if (g->refusal.retry_after > 0) {
            char ra[24];
            snprintf(ra, sizeof ra, "%.0f", g->refusal.retry_after);
            coord_set_header(cr, "Retry-After", ra);
        }
        coord_reply_error(cr, g->refusal.status, g->refusal.code, "%s", g->refusal.msg);
        break;
    }
    default: coord_reply_error(cr, 400, "bad_request", "malformed request head"); break;
    }
}

void coord_dispatch(struct evhttp_request *req, void *arg) {
    coord_server *srv = arg;
    coord_req cr;
    memset(&cr, 0, sizeof cr);
    cr.srv = srv;
    cr.req = req;
    cr.t0 = vl_clock_mono_s();
    snprintf(cr.method, sizeof cr.method, "%s", coord_method_name(evhttp_request_get_command(req)));
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    cr.full_path = path && *path ? path : "/";
    snprintf(cr.path, sizeof cr.path, "%s", cr.full_path);
    coord_req_begin(&cr);

    const char *marker = coord_get_header(&cr, COORD_GUARD_HEADER);
    if (marker) {
        refuse_guarded(&cr, marker);
        return;
    }
    if (take_ticket(&cr) != 0) return;
    enum evhttp_cmd_type method = evhttp_request_get_command(req);
    int path_known = 0;
    for (int i = 0; i < COORD_ROUTE_COUNT; i++) {
        const coord_route *r = coord_route_get(i);
        if (!coord_route_matches(r, cr.full_path)) continue;
        path_known = 1;
        if (r->method == method) {
            if (r->media && !media_matches(coord_get_header(&cr, "Content-Type"), r->media)) {
                coord_reply_error(&cr, 415, "unsupported_media_type",
                                  "the body of %s %s must be sent as Content-Type: %s", cr.method,
                                  r->path, r->media);
                return;
            }
            /* Who signed was decided on the head (the guard's ticket);
             * here a route that needs a peer gets it, or the request its
             * 401 or 403, before the handler runs. */
            if (r->auth == COORD_AUTH_PEER && coord_authenticate(&cr) != 0) return;
            static const char *const no_keys[] = {NULL};
            unsigned present = 0;
            if (r->no_query && coord_req_query(&cr, no_keys, 0, NULL, &present,
                                               "this endpoint takes no query") != 0)
                return;
            srv->handlers[i](&cr);
            return;
        }
        coord_set_header(&cr, "Allow", coord_method_name(r->method));
    }
    if (path_known)
        coord_reply_error(&cr, 405, "method_not_allowed", "%s is not allowed here", cr.method);
    else
        coord_reply_error(&cr, 404, "not_found", "no such endpoint");
}
