/*
 * The peer's HTTPS client: one libcurl easy handle per connection, every
 * request signed with the peer's key, transient failures retried with
 * capped, jittered exponential backoff (a fresh signature each attempt),
 * every response body read under a hard cap. Part of the peer library;
 * peer/peer.h includes it.
 */
#ifndef VOLLEY_PEER_HTTP_H
#define VOLLEY_PEER_HTTP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/common.h"
#include "crypto/crypto.h"

/* ---- retries (retry.c) --------------------------------------------------- */

/* Exponential backoff with full jitter: the n-th retry (n >= 1) waits a
 * uniformly random time in [0, min(cap_s, base_s * factor^(n-1))), but
 * never less than a Retry-After the server sent (itself clamped to
 * retry_after_max_s, so a server cannot park a peer forever). A volunteer's
 * machine outlives a coordinator's restart, so by default a request is
 * tried until it is answered; max_attempts and give_up_s bound it. */
typedef struct peer_retry_policy {
    int max_attempts;         /* tries in all, first included; 0: no limit */
    double give_up_s;         /* stop this long after the first failure; 0: never */
    double base_s;            /* first window, seconds */
    double factor;            /* growth per retry, >= 1 */
    double cap_s;             /* largest window, seconds */
    double retry_after_max_s; /* longest Retry-After honoured, seconds */
} peer_retry_policy;

/* The largest wait between tries by default, seconds. */
#define PEER_BACKOFF_CAP_S 300.0
/* The largest wait under --retries N, the schedule such counts were
 * written against. */
#define PEER_RETRIES_CAP_S 30.0

/* Fills p with the defaults: no limit on attempts or time, 0.5 s base,
 * factor 2, a PEER_BACKOFF_CAP_S cap (VOLLEY_PEER_BACKOFF_CAP_S, seconds
 * in [0.1, 300], lowers it: tests wait seconds, not minutes, for a
 * coordinator that starts late), Retry-After honoured up to 300 s. */
void peer_retry_default(peer_retry_policy *p);

/* The defaults, then retries > 0: that many attempts at most, with the
 * PEER_RETRIES_CAP_S cap; give_up_s > 0: a deadline after the first
 * failure. What the commands' --retries and --give-up-after set. */
void peer_retry_for(peer_retry_policy *p, int retries, double give_up_s);

/* Parses a --give-up-after value: a number of seconds with an optional
 * unit s, m or h ("30s", "10m", "1.5h", "90"), 0 meaning never; at most
 * 30 days. Returns 0 with *out in seconds, or -1. */
int peer_duration_parse(const char *s, double *out);

/* Upper bound of the jitter window before retry n (n >= 1). */
double peer_backoff_window(const peer_retry_policy *p, int n);

/* Delay in seconds before retry n: u * window(n) for u in [0, 1) drawn by
 * the caller, raised to retry_after_s when that is >= 0 (negative: the
 * server sent none), which is first clamped to retry_after_max_s. */
double peer_backoff_delay(const peer_retry_policy *p, int n, double retry_after_s, double u);

/* 1 when an HTTP status is worth retrying (429 and 5xx), else 0. */
int peer_status_retryable(long status);

/* Parses a Retry-After value: delta-seconds or an HTTP-date (relative to
 * now, unix seconds). Returns seconds >= 0, or -1 when value is unusable. */
double peer_retry_after_parse(const char *value, int64_t now);

/* A TLS failure in a volunteer's words: for libcurl's curl_code (a
 * certificate that fails verification, an unreadable CA file), OpenSSL's
 * verify_result (CURLINFO_SSL_VERIFYRESULT) and curl's own text, says what
 * is wrong with the coordinator's certificate and what to do, naming the
 * --cacert file (NULL or "": none given) and base's host. Writes out and
 * returns 1, or returns 0 for failures it has no words for. */
int peer_tls_advice(int curl_code, long verify_result, const char *curl_text, const char *cacert,
                    const char *base, char *out, size_t cap);

/* ---- HTTP client --------------------------------------------------------- */

/* One libcurl easy handle, kept alive across requests, that signs every
 * request with the peer's key and retries transient failures. HTTPS only,
 * certificate and host verified, TLS 1.2 or newer. */
typedef struct peer_http peer_http;

/* Opens a client for base_url (checked by peer_url_check). cacert: a PEM
 * file to trust instead of the system store, or NULL/"". id is borrowed
 * and must outlive the client. The caller owns *out; peer_http_close. */
int peer_http_open(const char *base_url, const char *cacert, const vcrypto_identity *id,
                   int64_t peer_id, const peer_retry_policy *retry, peer_http **out,
                   vl_error *err) VL_MUST_CHECK;
/* Closes the connection and frees h (NULL is fine). */
void peer_http_close(peer_http *h);
/* Changes the peer id used in the Authorization header (after join). */
void peer_http_set_peer(peer_http *h, int64_t peer_id);
/* Caps what h sends and receives at max_up and max_down bytes per second
 * (0: no cap), for a volunteer who shares the line: each request's body is
 * paced so that it never gets ahead of the cap for the time since the
 * request began. Returns 0, or VL_EINVAL for a negative cap. */
int peer_http_set_rates(peer_http *h, int64_t max_up, int64_t max_down,
                        vl_error *err) VL_MUST_CHECK;
/* Opens another client like h (coordinator, trust, key, peer id, retry
 * policy, bandwidth caps) on a connection of its own, for requests sent
 * while h is busy.
 * The caller owns *out; peer_http_close. */
int peer_http_clone(const peer_http *h, peer_http **out, vl_error *err) VL_MUST_CHECK;

/* One request. target is the path and query exactly as sent and signed
 * ("/v1/task?wait=20"). body may be NULL for a GET. */
typedef struct peer_request {
    const char *method; /* "GET" or "POST" */
    const char *target;
    const char *content_type; /* for a body, else NULL */
    const uint8_t *body;      /* borrowed for the call */
    size_t body_len;
    const char *range;         /* Range header value, or NULL */
    const char *if_none_match; /* If-None-Match value, or NULL */
    size_t cap;                /* most response body bytes accepted */
    /* A GET whose transfer, when the connection breaks, resumes where it
     * stopped: the next attempt asks for the rest (Range) of the same
     * file (If-Range on its ETag) and appends it. Bodies into memory
     * only; ignored with range or sink. */
    int resume;
    long idle_s; /* abort after this long without progress */
    /* When set, the body of a 2xx response is written to this file
     * (emptied before each attempt) instead of memory, still under cap;
     * other bodies (errors) go to memory as usual. Borrowed. */
    FILE *sink;
    /* 1: the transfer's progress shows on the terminal's status line
     * (peer_ui_transfer): an update's upload, a model's download. */
    int show_progress;
    /* 1: one attempt of at most 10 s, sent even after a stop was asked
     * for and not cut short by it: a stopping peer's last word to the
     * coordinator (ending its lease). Never retried. */
    int once;
} peer_request;

/* The final response. body is owned by the response (peer_response_free). */
typedef struct peer_response {
    long status;
    vl_buf body;
    char etag[64];
    char content_range[128];
    double retry_after_s; /* -1 when absent */
    uint64_t sunk;        /* body bytes written to the request's sink */
} peer_response;

/* Prepares an empty response for peer_http_do; reusable across requests
 * (the body's memory is kept between them). */
void peer_response_init(peer_response *r);
/* Releases the body; r may be initialised again. */
void peer_response_free(peer_response *r);

/* Sends rq, retrying connection errors, timeouts, 429 and 5xx as the
 * policy says, signing each attempt afresh. Returns 0 with the final
 * response in rs for every other status (the caller judges it);
 * PEER_ENETWORK when the retries ran out; PEER_ESTOPPED on a stop request;
 * VL_ETOOBIG for a body over rq->cap; VL_EIO for a TLS or other permanent
 * transport failure. */
int peer_http_do(peer_http *h, const peer_request *rq, peer_response *rs,
                 vl_error *err) VL_MUST_CHECK;

/* ---- one request in the background (http_bg.c) -------------------------- */

/* A request sent by a thread of its own, on a connection of its own, while
 * the caller goes on: how a peer keeps training while its last update
 * uploads over a slow line. One request at a time; the caller reads the
 * answer after peer_http_bg_wait. Zero-initialise before first use. */
typedef struct peer_http_bg {
    peer_http *http;  /* owned: cloned from the caller's client on first use */
    peer_response rs; /* the answer, valid after peer_http_bg_wait */
    char target[256];
    peer_request rq; /* target points into this struct; body borrowed */
    int rc;
    vl_error err;
    int running;    /* a thread is sending */
    int started;    /* a request was sent and not yet waited for */
    double seconds; /* how long the last request took, retries included */
    pthread_t thread;
} peer_http_bg;

/* Starts sending rq (as peer_http_do on a clone of like) in a thread.
 * rq->body must stay valid and unchanged until peer_http_bg_wait; the
 * target is copied (at most 255 bytes). Without a thread to spare the
 * request is sent before this returns. Returns 0, or VL_EINVAL while an
 * earlier request was not waited for, or the clone's error. */
int peer_http_bg_start(peer_http_bg *b, const peer_http *like, const peer_request *rq,
                       vl_error *err) VL_MUST_CHECK;
/* 1 while a request was started and not yet waited for. */
int peer_http_bg_pending(const peer_http_bg *b);
/* Waits for the request started last and returns what peer_http_do
 * returned for it (its message in err); *rs then points at the answer,
 * owned by b and valid until the next start or peer_http_bg_free.
 * VL_EINVAL when nothing was started. */
int peer_http_bg_wait(peer_http_bg *b, peer_response **rs, vl_error *err) VL_MUST_CHECK;
/* Waits for a request still on its way, then frees the connection and
 * the answer. b may be started again after peer_http_bg_init-like zeroing. */
void peer_http_bg_free(peer_http_bg *b);

#endif
