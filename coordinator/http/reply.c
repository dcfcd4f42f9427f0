/* Answering requests: JSON and error bodies, headers, the per-request log
 * line, strict query-string parsing and the version a query names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "coordinator/coord.h"
#include "coordinator/base/counters.h"
#include "coordinator/base/routes.h"
#include "coordinator/http/http.h"
#include "coordinator/run/run.h"

static const char *reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return status >= 500 ? "Internal Server Error" : "Error";
    }
}

void coord_set_header(coord_req *cr, const char *name, const char *value) {
    struct evkeyvalq *h = evhttp_request_get_output_headers(cr->req);
    evhttp_remove_header(h, name);
    evhttp_add_header(h, name, value);
}

const char *coord_get_header(coord_req *cr, const char *name) {
    return evhttp_find_header(evhttp_request_get_input_headers(cr->req), name);
}

const uint8_t *coord_body(coord_req *cr, size_t *len) {
    struct evbuffer *in = evhttp_request_get_input_buffer(cr->req);
    *len = evbuffer_get_length(in);
    if (*len == 0) return NULL;
    return evbuffer_pullup(in, -1);
}

static void on_complete(struct evhttp_request *req, void *arg) {
    (void)req;
    coord_server *srv = arg;
    if (srv->conns.inflight > 0) srv->conns.inflight--;
}

void coord_req_begin(coord_req *cr) {
    cr->srv->conns.inflight++;
    evhttp_request_set_on_complete_cb(cr->req, on_complete, cr->srv);
}

void coord_reply(coord_req *cr, int status, const char *content_type, struct evbuffer *body) {
    size_t nbytes = body ? evbuffer_get_length(body) : 0;
    if (content_type && status != 204 && status != 304)
        coord_set_header(cr, "Content-Type", content_type);
    /* While draining every connection ends after its answer. */
    if (cr->srv->draining) coord_set_header(cr, "Connection", "close");
    double ms = (vl_clock_mono_s() - cr->t0) * 1000.0;
    /* What came in as well as what goes out: an operator (and the split
     * test) can see that a peer sent nothing but what its mode allows. */
    struct evbuffer *in = cr->req ? evhttp_request_get_input_buffer(cr->req) : NULL;
    size_t in_bytes = in ? evbuffer_get_length(in) : 0;
    if (cr->peer_id > 0)
        vl_log_info("%s %s %d %zuB in=%zuB %.1fms peer=%lld", cr->method, cr->path, status, nbytes,
                    in_bytes, ms, (long long)cr->peer_id);
    else
        vl_log_info("%s %s %d %zuB in=%zuB %.1fms", cr->method, cr->path, status, nbytes, in_bytes,
                    ms);
    int route = coord_route_index(cr->full_path);
    coord_metrics_request(&cr->srv->ops.metrics, route, status, in_bytes, nbytes);
    if (cr->full_path && !strcmp(cr->full_path, "/v1/updates"))
        coord_metrics_upload(&cr->srv->ops.metrics, status, cr->err_code);
    coord_metrics_answer(&cr->srv->ops.metrics, route, status, cr->err_code, cr->peer_id,
                         coord_request_addr(cr->req), in_bytes, vl_clock_unix_s());
    /* A request whose client went away has no connection; sending frees
     * it without running the completion callback, so account for it here. */
    if (!evhttp_request_get_connection(cr->req) && cr->srv->conns.inflight > 0)
        cr->srv->conns.inflight--;
    evhttp_send_reply(cr->req, status, reason(status), body);
}

void coord_reply_json(coord_req *cr, int status, json_t *obj) {
    struct evbuffer *b = evbuffer_new();
    char *text = obj ? json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(obj);
    if (!b || !text) {
        free(text);
        if (b) evbuffer_free(b);
        vl_log_error("out of memory building a JSON reply");
        coord_reply(cr, 500, NULL, NULL);
        return;
    }
    evbuffer_add(b, text, strlen(text));
    evbuffer_add(b, "\n", 1);
    free(text);
    coord_reply(cr, status, "application/json", b);
    evbuffer_free(b);
}

void coord_reply_error(coord_req *cr, int status, const char *code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct evkeyvalq *out = evhttp_request_get_output_headers(cr->req);
    if ((status == 503 || status == 429) && !evhttp_find_header(out, "Retry-After"))
        coord_set_header(cr, "Retry-After", COORD_RETRY_AFTER_S);
    vl_log_debug("%s %s: %s: %s", cr->method, cr->path, code, msg);
    cr->err_code = code;
    coord_reply_json(cr, status,
                     json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", msg));
}

void coord_reply_rate_limited(coord_req *cr, double wait_s, const char *who) {
    long long s = (long long)wait_s;
    if ((double)s < wait_s) s++;
    if (s < 1) s = 1;
    char v[24];
    snprintf(v, sizeof v, "%lld", s);
    coord_set_header(cr, "Retry-After", v);
    coord_reply_error(cr, 429, "rate_limited", "too many requests from this %s; retry in %lld s",
                      who, s);
}

void coord_reply_internal(coord_req *cr, const vl_error *err) {
    /* Nothing of the request is stored, and it may work once there is
     * room: the client is told to come back (the log has the disk's one
     * report, coord_disk_note). */
    if (err && err->code == VL_EFULL) {
        coord_reply_error(cr, 503, "unavailable",
                          "the coordinator's disk is full: nothing of this request was stored; "
                          "retry later");
        return;
    }
    vl_log_error("%s %s: %s", cr->method, cr->path,
                 err && err->msg[0] ? err->msg : "internal error");
    coord_reply_error(cr, 500, "internal", "internal error");
}

void coord_reply_oom(coord_req *cr, const char *what) {
    vl_error oom = {.code = VL_ENOMEM};
    snprintf(oom.msg, sizeof oom.msg, "out of memory %s", what);
    coord_reply_internal(cr, &oom);
}

int coord_req_query(coord_req *cr, const char *const *allowed, int64_t max, int64_t *values,
                    unsigned *present, const char *hint) {
    vl_error e = {0};
    const char *query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(cr->req));
    if (coord_query_ints(query, allowed, max, values, present, &e) == VL_OK) return 0;
    if (hint)
        coord_reply_error(cr, 400, "bad_request", "%s (%s)", e.msg, hint);
    else
        coord_reply_error(cr, 400, "bad_request", "%s", e.msg);
    return COORD_ANSWERED;
}

int coord_req_version(coord_req *cr, const char *const *allowed, int64_t *values, unsigned *present,
                      int64_t fallback, int64_t *version) {
    if (coord_req_query(cr, allowed, INT64_MAX, values, present, NULL) != 0) return COORD_ANSWERED;
    int at = 0;
    while (allowed[at] && strcmp(allowed[at], "version") != 0) at++;
    if (at < 32 && (*present & (1u << at))) {
        *version = values[at];
        return 0;
    }
    if (fallback == COORD_VERSION_NEEDED) {
        coord_reply_error(cr, 400, "bad_request", "the query needs version=VERSION");
        return COORD_ANSWERED;
    }
    *version = fallback;
    return 0;
}

int coord_req_version_made(coord_req *cr, int64_t version) {
    const coord_server *srv = cr->srv;
    if (version <= srv->run.version) return 0;
    coord_reply_error(cr, 404, "unknown_version",
                      "version %lld has not been made (current is %lld)", (long long)version,
                      (long long)srv->run.version);
    return COORD_ANSWERED;
}

int coord_query_ints(const char *query, const char *const *allowed, int64_t max, int64_t *values,
                     unsigned *present, vl_error *err) {
    *present = 0;
    if (!query || !*query) return VL_OK;
    const char *p = query;
    while (*p) {
        const char *amp = strchr(p, '&');
        size_t len = amp ? (size_t)(amp - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (!eq) return vl_fail(err, VL_EINVAL, "query parameter without a value");
        size_t klen = (size_t)(eq - p);
        int idx = -1;
        for (int i = 0; allowed[i]; i++)
            if (strlen(allowed[i]) == klen && memcmp(p, allowed[i], klen) == 0) idx = i;
        if (idx < 0 || idx >= 32) return vl_fail(err, VL_EINVAL, "unknown query parameter");
        if (*present & (1u << idx))
            return vl_fail(err, VL_EINVAL, "query parameter '%s' given twice", allowed[idx]);
        char num[24];
        size_t vlen = len - klen - 1;
        if (vlen == 0 || vlen >= sizeof num)
            return vl_fail(err, VL_EINVAL, "query parameter '%s' is not a number", allowed[idx]);
        memcpy(num, eq + 1, vlen);
        num[vlen] = '\0';
        for (size_t i = 0; i < vlen; i++)
            if (num[i] < '0' || num[i] > '9')
                return vl_fail(err, VL_EINVAL, "query parameter '%s' is not a number",
                               allowed[idx]);
        if (vl_parse_i64(num, 0, max, &values[idx]) != VL_OK)
            return vl_fail(err, VL_EINVAL, "query parameter '%s' must be at most %lld",
                           allowed[idx], (long long)max);
        *present |= 1u << idx;
        p += len;
        /* A separator must be followed by another pair: "version=0&" is
         * refused like any other query that is not exactly key=value
         * pairs, so one target has one meaning for the signer and us. */
        if (*p == '&' && *++p == '\0') return vl_fail(err, VL_EINVAL, "the query ends with '&'");
    }
    return VL_OK;
}

const char *coord_request_addr(struct evhttp_request *req) {
    struct evhttp_connection *c = req ? evhttp_request_get_connection(req) : NULL;
    if (!c) return NULL;
    char *addr = NULL;
    ev_uint16_t port = 0;
    evhttp_connection_get_peer(c, &addr, &port);
    return addr;
}

/* ---- shared bytes ------------------------------------------------------- */

static void blob_release(const void *data, size_t len, void *arg) {
    (void)data;
    (void)len;
    coord_blob_unref(arg);
}

void coord_reply_blob_part(coord_req *cr, coord_blob *blob, int status, size_t first,
                           size_t count) {
    struct evbuffer *b = evbuffer_new();
    /* The response references the shared bytes instead of copying them;
     * the reference is dropped when libevent has sent them. */
    if (!b || evbuffer_add_reference(b, blob->data + first, count, blob_release, blob) != 0) {
        coord_blob_unref(blob);
        if (b) evbuffer_free(b);
        coord_reply_oom(cr, "sending a model file");
        return;
    }
    coord_reply(cr, status, "application/octet-stream", b);
    evbuffer_free(b);
}

void coord_reply_blob(coord_req *cr, coord_blob *blob) {
    coord_reply_blob_part(cr, blob, 200, 0, blob->len);
}
