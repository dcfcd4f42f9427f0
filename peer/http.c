/* The peer's HTTPS client: one libcurl easy handle reused across requests
 * (keep-alive matters on 50-300 ms links), every request signed afresh,
 * transient failures retried with capped, jittered backoff, and every
 * response body read under a hard cap. TLS verification is always on; a
 * self-signed coordinator is trusted by naming its certificate (--cacert),
 * never by switching verification off. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <strings.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "peer/peer.h"
#include "peer/ui.h"

/* ---- error bodies ------------------------------------------------------ */

/* Copies at most cap-1 bytes of s, turning control characters into spaces
 * and stopping at the first newline, so the result prints as one line. */
static void copy_line(const char *s, size_t n, char *out, size_t cap) {
    size_t j = 0;
    for (size_t i = 0; i < n && j + 1 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n' || c == '\r') break;
        out[j++] = (c < 0x20 || c == 0x7f) ? ' ' : (char)c;
    }
    while (j > 0 && out[j - 1] == ' ') j--;
    out[j] = '\0';
}

int peer_error_code_is(const uint8_t *body, size_t len, const char *code) {
    char c[64], m[8];
    peer_error_parse(body, len, c, sizeof c, m, sizeof m);
    return strcmp(c, code) == 0;
}

void peer_error_parse(const uint8_t *body, size_t len, char *code, size_t code_cap, char *msg,
                      size_t msg_cap) {
    code[0] = '\0';
    msg[0] = '\0';
    if (!body || len == 0) return;
    json_error_t je;
    json_t *root = json_loadb((const char *)body, len, 0, &je);
    json_t *e = root ? json_object_get(root, "error") : NULL;
    json_t *c = json_is_object(e) ? json_object_get(e, "code") : NULL;
    json_t *m = json_is_object(e) ? json_object_get(e, "message") : NULL;
    if (json_is_string(c) || json_is_string(m)) {
        if (json_is_string(c))
            copy_line(json_string_value(c), json_string_length(c), code, code_cap);
        if (json_is_string(m)) copy_line(json_string_value(m), json_string_length(m), msg, msg_cap);
    } else {
        /* A proxy's HTML page or plain text: the first line still helps. */
        size_t i = 0;
        while (i < len && isspace(body[i])) i++;
        copy_line((const char *)body + i, len - i, msg, msg_cap);
    }
    json_decref(root);
}

/* What a refusal that ends the peer's work means to a volunteer, and
 * what to do about it; NULL for the rest. */
static const char *refusal_hint(long status, const char *code) {
    static const struct {
        long status;
        const char *code, *hint;
    } HINTS[] = {
        {401, "unknown_peer",
         "the coordinator does not know this peer (removed, or another "
         "run); join again with a new token"},
        {401, "bad_signature",
         "the coordinator does not accept this peer's key (replaced or "
         "rotated elsewhere?); join again with a new token"},
        {401, "stale_timestamp",
         "this machine's clock is more than 5 minutes off; set it "
         "right (NTP) and start again"},
        {403, "revoked", "the operator has revoked this peer; it cannot take part any more"},
        {403, "invalid_token",
         "the join token is unknown, expired or used up; ask the "
         "operator for a new one"},
    };
    for (size_t i = 0; i < sizeof HINTS / sizeof HINTS[0]; i++)
        if (HINTS[i].status == status && !strcmp(HINTS[i].code, code)) return HINTS[i].hint;
    return NULL;
}

int peer_refusal(vl_error *err, const char *what, long status, const uint8_t *body, size_t len) {
    char code[64], msg[200];
    peer_error_parse(body, len, code, sizeof code, msg, sizeof msg);
    const char *hint = refusal_hint(status, code);
    if (hint)
        return vl_fail(err, PEER_EREFUSED, "%s: %ld %s: %s%s%s", what, status, code, hint,
                       msg[0] ? "; it said: " : "", msg);
    if (code[0] && msg[0])
        return vl_fail(err, PEER_EREFUSED, "%s: %ld %s: %s", what, status, code, msg);
    if (code[0] || msg[0])
        return vl_fail(err, PEER_EREFUSED, "%s: %ld %s", what, status, code[0] ? code : msg);
    return vl_fail(err, PEER_EREFUSED, "%s: HTTP %ld", what, status);
}

/* ---- the client ---------------------------------------------------------- */

struct peer_http {
    CURL *curl;
    char base[256];
    char cacert[PEER_PATH_MAX];
    const vcrypto_identity *id;
    int64_t peer_id;
    peer_retry_policy retry;
    vl_rng jitter;
    char curl_err[CURL_ERROR_SIZE];
    /* Per-transfer state the callbacks write. */
    peer_response *rs;
    size_t cap;
    int over_cap;
    FILE *sink;     /* the request's sink, or NULL */
    long status;    /* of the last status line seen */
    int sink_errno; /* why a write to the sink failed; 0 while none did */
    /* A download that broke off after resume_at bytes of the body with
     * ETag resume_etag: the next attempt asks for the rest (0: none). */
    size_t resume_at;
    char resume_etag[64];
    /* Bandwidth caps in bytes per second (0: none), and the progress line
     * of a long transfer: its request and when it was last logged. */
    int64_t max_up, max_down;
    const peer_request *rq;
    double started, logged;
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_OK;

static void global_init(void) {
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

void peer_response_init(peer_response *r) {
    r->status = 0;
    vl_buf_init(&r->body, 1);
    r->etag[0] = '\0';
    r->content_range[0] = '\0';
    r->retry_after_s = -1;
    r->sunk = 0;
}

void peer_response_free(peer_response *r) {
    vl_buf_free(&r->body);
}

/* keep_body: a resumed download's first bytes stay in front. */
static void response_clear(peer_response *r, size_t cap, int keep_body) {
    r->status = 0;
    if (!keep_body) vl_buf_reset(&r->body);
    r->body.cap = cap;
    r->etag[0] = '\0';
    r->content_range[0] = '\0';
    r->retry_after_s = -1;
    r->sunk = 0;
}

/* A 2xx body with a sink goes to the file; the cap counts its bytes. */
static size_t sink_body(peer_http *h, const char *p, size_t n) {
    if (n > h->cap || h->rs->sunk > h->cap - n) {
        h->over_cap = 1;
        return 0;
    }
    if (fwrite(p, 1, n, h->sink) != n) {
        h->sink_errno = errno ? errno : EIO;
        return 0;
    }
    h->rs->sunk += n;
    return n;
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud) {
    peer_http *h = ud;
    size_t n = size * nmemb;
    if (h->sink && h->status >= 200 && h->status <= 299) return sink_body(h, p, n);
    if (n > h->cap || h->rs->body.len > h->cap - n || vl_buf_append(&h->rs->body, p, n) != VL_OK) {
        h->over_cap = 1;
        return 0; /* makes curl fail the transfer with CURLE_WRITE_ERROR */
    }
    return n;
}

/* Copies a header's value (trimmed) into out if line is "name: value". */
static int header_value(const char *line, size_t n, const char *name, char *out, size_t cap) {
    size_t nl = strlen(name);
    if (n <= nl || strncasecmp(line, name, nl) != 0 || line[nl] != ':') return 0;
    const char *v = line + nl + 1;
    size_t vl = n - nl - 1;
    while (vl > 0 && (*v == ' ' || *v == '\t')) v++, vl--;
    while (vl > 0 && isspace((unsigned char)v[vl - 1])) vl--;
    if (vl >= cap) vl = cap - 1;
    memcpy(out, v, vl);
    out[vl] = '\0';
    return 1;
}

static size_t on_header(char *line, size_t size, size_t nmemb, void *ud) {
    peer_http *h = ud;
    size_t n = size * nmemb;
    peer_response *r = h->rs;
    /* A new status line (after "100 Continue") starts a new header set. */
    if (n >= 5 && strncmp(line, "HTTP/", 5) == 0) {
        const char *sp = memchr(line, ' ', n);
        h->status = sp && (size_t)(sp - line) + 4 <= n ? strtol(sp + 1, NULL, 10) : 0;
        /* Anything but the rest of a resumed body replaces what came
         * before: the file changed, or this is an error. */
        if (h->resume_at > 0 && h->status != 206) vl_buf_reset(&r->body);
        r->etag[0] = '\0';
        r->content_range[0] = '\0';
        r->retry_after_s = -1;
        return n;
    }
    char v[128];
    int64_t clen;
    if (header_value(line, n, "Content-Length", v, sizeof v)) {
        /* Sizing the buffer once spares a multi-GiB model the copies of
         * geometric growth; the cap still rules (over it: fail later). A
         * body bound for the sink needs no memory at all. */
        int to_sink = h->sink && h->status >= 200 && h->status <= 299;
        if (!to_sink && vl_parse_i64(v, 0, INT64_MAX, &clen) == VL_OK && (uint64_t)clen <= h->cap &&
            vl_buf_reserve(&r->body, (size_t)clen) != VL_OK)
            vl_log_debug("cannot pre-allocate %lld bytes; growing as data arrives",
                         (long long)clen);
        return n;
    }
    if (header_value(line, n, "ETag", r->etag, sizeof r->etag)) return n;
    if (header_value(line, n, "Content-Range", r->content_range, sizeof r->content_range)) return n;
    if (header_value(line, n, "Retry-After", v, sizeof v))
        r->retry_after_s = peer_retry_after_parse(v, vl_clock_unix_s());
    return n;
}

/* Transfers shorter than this, in bytes or seconds, log no progress. */
#define PROGRESS_BYTES ((curl_off_t)1 << 20)
#define PROGRESS_EVERY_S 10.0

/* Holds a transfer to the caps: when more has moved than the cap allows
 * for the time since the transfer began, waits out the difference (in
 * slices, so a stop request is still seen). libcurl's own limits average
 * over several seconds and let a transfer of a few seconds through at
 * line speed; this holds from the first byte. Only what the kernel's
 * socket buffers already hold escapes it. */
static void pace(const peer_http *h, curl_off_t sent, curl_off_t received) {
    double now = vl_clock_mono_s(), wait = 0;
    if (h->max_up > 0) wait = (double)sent / (double)h->max_up - (now - h->started);
    if (h->max_down > 0) {
        double w = (double)received / (double)h->max_down - (now - h->started);
        if (w > wait) wait = w;
    }
    while (wait > 0 && !peer_stop_requested()) {
        double slice = wait < 0.2 ? wait : 0.2;
        struct timespec ts = {(time_t)slice, (long)((slice - (double)(time_t)slice) * 1e9)};
        nanosleep(&ts, NULL);
        wait -= slice;
    }
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    peer_http *h = ud;
    if (peer_stop_requested() && !(h->rq && h->rq->once)) return 1;
    if (h->rq && (h->max_up > 0 || h->max_down > 0)) pace(h, un, dn);
    /* On a slow line a model or an update takes minutes: say how far it
     * got, so a volunteer can tell a slow transfer from a stuck one. */
    double now = vl_clock_mono_s();
    int up = ut > dt;
    curl_off_t total = up ? ut : dt, done = up ? un : dn;
    if (h->rq && h->rq->show_progress) {
        int post = !strcmp(h->rq->method, "POST");
        peer_ui_transfer(post, post ? un : dn, post ? ut : dt, now - h->started);
    }
    if (h->rq && total >= PROGRESS_BYTES && now - h->logged >= PROGRESS_EVERY_S &&
        now - h->started >= PROGRESS_EVERY_S) {
        h->logged = now;
        double rate = (double)done / (now - h->started);
        vl_log_info("%s %s: %s %.1f of %.1f MB, %.0f kB/s%s", h->rq->method, h->rq->target,
                    up ? "sent" : "received", (double)done / 1e6, (double)total / 1e6, rate / 1e3,
                    (up ? h->max_up : h->max_down) > 0 ? " (capped)" : "");
    }
    return 0;
}

static int setopt_ok(CURL *c) {
    /* Options that hold for every request on this handle. */
    int bad = 0;
    bad |= curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "https") != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "https") != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 20L) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header) != CURLE_OK;
    bad |= curl_easy_setopt(c, CURLOPT_USERAGENT, "volley-peer/0.1") != CURLE_OK;
    return !bad;
}

int peer_http_open(const char *base_url, const char *cacert, const vcrypto_identity *id,
                   int64_t peer_id, const peer_retry_policy *retry, peer_http **out,
                   vl_error *err) {
    *out = NULL;
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK)
        return vl_fail(err, VL_ERR, "libcurl initialisation failed: %s",
                       curl_easy_strerror(global_rc));
    peer_http *h = calloc(1, sizeof *h);
    if (!h) return vl_fail(err, VL_ENOMEM, "out of memory");
    int rc = peer_url_check(base_url, h->base, sizeof h->base, err);
    if (rc) {
        free(h);
        return rc;
    }
    if (cacert && *cacert) {
        if (strlen(cacert) >= sizeof h->cacert) {
            free(h);
            return vl_fail(err, VL_ETOOBIG, "--cacert path is too long");
        }
        if (access(cacert, R_OK) != 0) {
            free(h);
            return vl_fail(err, VL_ENOTFOUND, "cannot read CA certificate %s", cacert);
        }
        memcpy(h->cacert, cacert, strlen(cacert) + 1);
    }
    h->id = id;
    h->peer_id = peer_id;
    if (retry)
        h->retry = *retry;
    else
        peer_retry_default(&h->retry);
    if (h->retry.max_attempts < 0) h->retry.max_attempts = 0;
    vl_rng_seed(&h->jitter, (uint64_t)getpid() ^ (uint64_t)(vl_clock_mono_s() * 1e9) ^
                                ((uint64_t)vl_clock_unix_s() << 20));
    h->curl = curl_easy_init();
    if (!h->curl) {
        free(h);
        return vl_fail(err, VL_ENOMEM, "cannot create a libcurl handle");
    }
    int ok = setopt_ok(h->curl);
    ok = ok && curl_easy_setopt(h->curl, CURLOPT_ERRORBUFFER, h->curl_err) == CURLE_OK;
    ok = ok && curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, h) == CURLE_OK;
    ok = ok && curl_easy_setopt(h->curl, CURLOPT_HEADERDATA, h) == CURLE_OK;
    ok = ok && curl_easy_setopt(h->curl, CURLOPT_XFERINFODATA, h) == CURLE_OK;
    if (ok && h->cacert[0]) ok = curl_easy_setopt(h->curl, CURLOPT_CAINFO, h->cacert) == CURLE_OK;
    if (!ok) {
        peer_http_close(h);
        return vl_fail(err, VL_ERR, "libcurl lacks a required option (HTTPS, TLS 1.2)");
    }
    *out = h;
    return VL_OK;
}

void peer_http_close(peer_http *h) {
    if (!h) return;
    if (h->curl) curl_easy_cleanup(h->curl);
    free(h);
}

void peer_http_set_peer(peer_http *h, int64_t peer_id) {
    h->peer_id = peer_id;
}

int peer_http_clone(const peer_http *h, peer_http **out, vl_error *err) {
    int rc = peer_http_open(h->base, h->cacert, h->id, h->peer_id, &h->retry, out, err);
    if (!rc) rc = peer_http_set_rates(*out, h->max_up, h->max_down, err);
    if (rc) {
        peer_http_close(*out);
        *out = NULL;
    }
    return rc;
}

int peer_http_set_rates(peer_http *h, int64_t max_up, int64_t max_down, vl_error *err) {
    if (max_up < 0 || max_down < 0)
        return vl_fail(err, VL_EINVAL, "bandwidth caps must not be negative");
    h->max_up = max_up;
    h->max_down = max_down;
    return VL_OK;
}

/* Transport failures that another attempt may cure. Certificate problems,
 * bad URLs and our own cap are permanent and fail at once. */
static int curl_retryable(CURLcode c) {
    switch (c) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY: return 1;
    default: return 0;
    }
}

/* A transport failure in a volunteer's words, the same for every attempt
 * that fails the same way (curl's own text carries timings); os_errno is
 * the system's error of the connection. */
static const char *transport_reason(CURLcode cc, long os_errno) {
    switch (cc) {
    case CURLE_COULDNT_RESOLVE_HOST: return "its host name does not resolve";
    case CURLE_COULDNT_CONNECT:
        return os_errno == ECONNREFUSED                              ? "connection refused"
               : os_errno == ENETUNREACH || os_errno == EHOSTUNREACH ? "no route to it"
               : os_errno == ETIMEDOUT                               ? "timed out"
                                                                     : "no connection";
    case CURLE_OPERATION_TIMEDOUT: return "timed out";
    case CURLE_SSL_CONNECT_ERROR: return "the TLS handshake failed";
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE: return "the connection broke off";
    default: return curl_easy_strerror(cc);
    }
}

/* One attempt: fresh signature, headers, transfer. Returns the CURLcode. */
static CURLcode attempt(peer_http *h, const peer_request *rq, peer_response *rs, int *local_rc,
                        vl_error *err) {
    *local_rc = VL_OK;
    char url[512];
    int n = snprintf(url, sizeof url, "%s%s", h->base, rq->target);
    if (n < 0 || (size_t)n >= sizeof url) {
        *local_rc = vl_fail(err, VL_ETOOBIG, "request URL is too long");
        return CURLE_OK;
    }
    /* A join has no peer id yet: it is signed by the key it registers. */
    char keyid[VCRYPTO_PK_B64_LEN + 24];
    if (h->peer_id > 0)
        snprintf(keyid, sizeof keyid, "%lld", (long long)h->peer_id);
    else
        vcrypto_pk_encode(h->id->pk, keyid);
    int post = strcmp(rq->method, "POST") == 0;
    vcrypto_signed_headers sh;
    if (vcrypto_sign_http(h->id, keyid, rq->method, rq->target, post, rq->body, rq->body_len,
                          vl_clock_unix_s(), &sh) != VL_OK) {
        *local_rc = vl_fail(err, VL_EINVAL, "cannot sign %s %s", rq->method, rq->target);
        return CURLE_OK;
    }
    char si[VCRYPTO_SIG_HEADER_MAX + 32], sg[sizeof sh.signature + 32];
    char cd[VCRYPTO_DIGEST_HEADER_MAX + 32];
    snprintf(si, sizeof si, "Signature-Input: %s", sh.signature_input);
    snprintf(sg, sizeof sg, "Signature: %s", sh.signature);
    snprintf(cd, sizeof cd, "Content-Digest: %s", sh.content_digest);
    char ct[128], range[128], inm[96], ifr[96];
    struct curl_slist *hdrs = NULL, *tmp;
    int ok = (tmp = curl_slist_append(hdrs, si)) != NULL;
    if (ok) hdrs = tmp;
    if (ok) ok = (tmp = curl_slist_append(hdrs, sg)) != NULL;
    if (ok) hdrs = tmp;
    if (ok && post) ok = (tmp = curl_slist_append(hdrs, cd)) != NULL;
    if (ok && post) hdrs = tmp;
    if (ok && rq->content_type) {
        snprintf(ct, sizeof ct, "Content-Type: %s", rq->content_type);
        ok = (tmp = curl_slist_append(hdrs, ct)) != NULL;
        if (ok) hdrs = tmp;
    }
    if (ok && rq->range) {
        snprintf(range, sizeof range, "Range: %s", rq->range);
        ok = (tmp = curl_slist_append(hdrs, range)) != NULL;
        if (ok) hdrs = tmp;
    } else if (ok && h->resume_at > 0) {
        snprintf(range, sizeof range, "Range: bytes=%zu-", h->resume_at);
        snprintf(ifr, sizeof ifr, "If-Range: %s", h->resume_etag);
        ok = (tmp = curl_slist_append(hdrs, range)) != NULL;
        if (ok) hdrs = tmp;
        if (ok) ok = (tmp = curl_slist_append(hdrs, ifr)) != NULL;
        if (ok) hdrs = tmp;
    }
    if (ok && rq->if_none_match) {
        snprintf(inm, sizeof inm, "If-None-Match: %s", rq->if_none_match);
        ok = (tmp = curl_slist_append(hdrs, inm)) != NULL;
        if (ok) hdrs = tmp;
    }
    if (!ok) {
        curl_slist_free_all(hdrs);
        *local_rc = vl_fail(err, VL_ENOMEM, "out of memory building request headers");
        return CURLE_OK;
    }
    CURL *c = h->curl;
    CURLcode cc = curl_easy_setopt(c, CURLOPT_URL, url);
    if (!cc) cc = curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    if (!cc && post) {
        cc = curl_easy_setopt(c, CURLOPT_POST, 1L);
        if (!cc) cc = curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rq->body_len);
        if (!cc)
            cc = curl_easy_setopt(c, CURLOPT_POSTFIELDS, rq->body ? (const char *)rq->body : "");
    } else if (!cc) {
        cc = curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    }
    /* Long-polls and slow links are fine; a connection that moves nothing
     * for idle_s is dead. */
    if (!cc) cc = curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    if (!cc) cc = curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, rq->idle_s > 0 ? rq->idle_s : 60L);
    if (!cc) cc = curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)rq->cap);
    if (!cc) cc = curl_easy_setopt(c, CURLOPT_TIMEOUT, rq->once ? 10L : 0L);
    if (cc) {
        curl_slist_free_all(hdrs);
        *local_rc = vl_fail(err, VL_ERR, "libcurl option failed: %s", curl_easy_strerror(cc));
        return CURLE_OK;
    }
    response_clear(rs, rq->cap, h->resume_at > 0);
    h->rs = rs;
    h->cap = rq->cap;
    h->over_cap = 0;
    h->sink = rq->sink;
    h->status = 0;
    h->sink_errno = 0;
    /* An earlier attempt's partial body must not stay in front. */
    if (h->sink && (fflush(h->sink) != 0 || ftruncate(fileno(h->sink), 0) != 0 ||
                    fseeko(h->sink, 0, SEEK_SET) != 0)) {
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, NULL);
        curl_slist_free_all(hdrs);
        h->rs = NULL;
        *local_rc = vl_fail(err, VL_EIO, "cannot empty the download file: %s", strerror(errno));
        return CURLE_OK;
    }
    h->curl_err[0] = '\0';
    h->rq = rq;
    h->started = h->logged = vl_clock_mono_s();
    cc = curl_easy_perform(c);
    h->rq = NULL;
    if (rq->show_progress) peer_ui_transfer(post, 0, 0, 0);
    if (cc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &rs->status);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(hdrs);
    h->rs = NULL;
    return cc;
}

/* After a broken transfer: whether the next attempt can ask for the rest
 * of the body instead of all of it. Only for a resumable GET into memory
 * whose answer had begun as a 200 (or a 206 resuming one) with a strong
 * ETag, which If-Range will name. */
static void plan_resume(peer_http *h, const peer_request *rq, const peer_response *rs) {
    int can = rq->resume && !rq->range && !rq->sink && (h->status == 200 || h->status == 206) &&
              rs->etag[0] == '"' && rs->body.len > 0 && strlen(rs->etag) < sizeof h->resume_etag;
    if (!can) {
        h->resume_at = 0;
        return;
    }
    if (h->resume_at == 0 || strcmp(h->resume_etag, rs->etag) != 0)
        snprintf(h->resume_etag, sizeof h->resume_etag, "%s", rs->etag);
    h->resume_at = rs->body.len;
}

/* After a resumed attempt answered 206: the part must start where the
 * body broke off and end the file; then the caller sees one whole 200. */
static int finish_resume(peer_http *h, peer_response *rs) {
    long long first, lastb, total;
    char tail;
    if (sscanf(rs->content_range, "bytes %lld-%lld/%lld%c", &first, &lastb, &total, &tail) != 3 ||
        first != (long long)h->resume_at || lastb + 1 != total || (long long)rs->body.len != total)
        return -1;
    vl_log_info("download resumed at byte %zu of %lld", h->resume_at, total);
    rs->status = 200;
    rs->content_range[0] = '\0';
    return 0;
}

int peer_http_do(peer_http *h, const peer_request *rq, peer_response *rs, vl_error *err) {
    if (!rq->target || rq->target[0] != '/')
        return vl_fail(err, VL_EINVAL, "request target must start with '/'");
    char last[CURL_ERROR_SIZE + 64] = "";
    /* Why the coordinator is out of reach, in words (transport failures
     * and statuses worth a retry), or "" for other retries. */
    char reason[96];
    int answered = 0;
    h->resume_at = 0;
    double first_fail = -1; /* monotonic time of this request's first failure */
    for (int n = 1;; n++) {
        if (peer_stop_requested() && !rq->once) return vl_fail(err, PEER_ESTOPPED, "stopped");
        int local_rc;
        double t0 = vl_clock_mono_s();
        CURLcode cc = attempt(h, rq, rs, &local_rc, err);
        if (local_rc) return local_rc;
        if (cc == CURLE_ABORTED_BY_CALLBACK) return vl_fail(err, PEER_ESTOPPED, "stopped");
        if (cc == CURLE_FILESIZE_EXCEEDED || (cc == CURLE_WRITE_ERROR && h->over_cap))
            return vl_fail(err, VL_ETOOBIG, "%s %s: response body exceeds the %zu-byte limit",
                           rq->method, rq->target, rq->cap);
        if (cc == CURLE_WRITE_ERROR && h->sink_errno)
            return vl_fail(err, VL_EIO, "%s %s: cannot write the response to disk: %s", rq->method,
                           rq->target, strerror(h->sink_errno));
        if (cc == CURLE_OK)
            vl_log_debug("%s %s -> %ld (%zu bytes, %.3f s)", rq->method, rq->target, rs->status,
                         rs->body.len, vl_clock_mono_s() - t0);
        int resumed_badly = 0;
        reason[0] = '\0';
        if (cc == CURLE_OK && h->resume_at > 0) {
            resumed_badly = rs->status == 206 && finish_resume(h, rs) != 0;
            h->resume_at = 0;
        }
        if (cc != CURLE_OK) {
            snprintf(last, sizeof last, "%s",
                     h->curl_err[0] ? h->curl_err : curl_easy_strerror(cc));
            if (!curl_retryable(cc)) {
                h->resume_at = 0;
                long vr = 0;
                char advice[400];
                if (curl_easy_getinfo(h->curl, CURLINFO_SSL_VERIFYRESULT, &vr) != CURLE_OK) vr = 0;
                if (peer_tls_advice((int)cc, vr, last, h->cacert, h->base, advice, sizeof advice)) {
                    vl_log_debug("%s %s: %s (verify result %ld)", rq->method, rq->target, last, vr);
                    return vl_fail(err, VL_EIO, "cannot talk to the coordinator at %s: %s", h->base,
                                   advice);
                }
                return vl_fail(err, VL_EIO, "cannot talk to the coordinator at %s: %s (%s %s)",
                               h->base, last, rq->method, rq->target);
            }
            long os_errno = 0;
            if (curl_easy_getinfo(h->curl, CURLINFO_OS_ERRNO, &os_errno) != CURLE_OK) os_errno = 0;
            snprintf(reason, sizeof reason, "%s", transport_reason(cc, os_errno));
            answered = 0;
            plan_resume(h, rq, rs);
        } else if (resumed_badly) {
            /* The next attempt asks for the whole file again. */
            snprintf(last, sizeof last, "a resumed download came back as %s", rs->content_range);
        } else if (peer_status_retryable(rs->status)) {
            char code[64], msg[120];
            peer_error_parse(rs->body.data, rs->body.len, code, sizeof code, msg, sizeof msg);
            snprintf(last, sizeof last, "%ld%s%s%s%s", rs->status, code[0] ? " " : "", code,
                     msg[0] ? ": " : "", msg);
            snprintf(reason, sizeof reason, "%ld%s%s", rs->status, code[0] ? " " : "", code);
            answered = 1;
        } else {
            peer_ui_reached(h->base);
            return VL_OK;
        }
        double now = vl_clock_mono_s();
        if (first_fail < 0) first_fail = now;
        const peer_retry_policy *pol = &h->retry;
        int timed_out = pol->give_up_s > 0 && now - first_fail >= pol->give_up_s;
        if (timed_out && !rq->once) {
            h->resume_at = 0;
            if (reason[0] && !answered)
                return vl_fail(err, PEER_ENETWORK,
                               "gave up after %.0f s of trying to reach the coordinator at %s "
                               "(--give-up-after; %s; %s %s: %s)",
                               now - first_fail, h->base, reason, rq->method, rq->target, last);
            return vl_fail(err, PEER_ENETWORK,
                           "gave up after %.0f s (--give-up-after): the coordinator at %s kept "
                           "answering %s (%s %s)",
                           now - first_fail, h->base, last, rq->method, rq->target);
        }
        if ((pol->max_attempts > 0 && n >= pol->max_attempts) || rq->once) {
            h->resume_at = 0;
            if (reason[0] && !answered)
                return vl_fail(err, PEER_ENETWORK,
                               "gave up after %d attempts to reach the "
                               "coordinator at %s (%s; %s %s: %s)",
                               n, h->base, reason, rq->method, rq->target, last);
            if (reason[0])
                return vl_fail(err, PEER_ENETWORK,
                               "gave up after %d attempts: the coordinator "
                               "at %s kept answering %s (%s %s)",
                               n, h->base, last, rq->method, rq->target);
            return vl_fail(err, PEER_ENETWORK, "%s %s failed after %d attempts: %s", rq->method,
                           rq->target, n, last);
        }
        if (h->resume_at > 0)
            vl_log_info("%s %s broke off after %zu bytes; the next attempt asks for the rest",
                        rq->method, rq->target, h->resume_at);
        double u = (double)(vl_rng_u64(&h->jitter) >> 11) * 0x1.0p-53;
        double d = peer_backoff_delay(pol, n, cc == CURLE_OK ? rs->retry_after_s : -1, u);
        /* The last try falls on the deadline, not past it. */
        if (pol->give_up_s > 0 && now + d > first_fail + pol->give_up_s)
            d = first_fail + pol->give_up_s - now;
        int left = pol->max_attempts > 0 ? pol->max_attempts - n : -1;
        if (reason[0]) {
            /* Said once in plain words; each retry's detail only in debug. */
            peer_ui_unreachable(h->base, reason, answered, d, left, pol->cap_s, pol->give_up_s);
            vl_log_debug("%s %s: %s; retry %d (%d left) in %.1f s", rq->method, rq->target, last, n,
                         left, d);
        } else {
            vl_log_warn("%s %s: %s; retry %d (%d left) in %.1f s", rq->method, rq->target, last, n,
                        left, d);
        }
        if (peer_sleep(d)) return vl_fail(err, PEER_ESTOPPED, "stopped");
    }
}
