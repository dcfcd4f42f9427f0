/* One request in the background: the peer's overlapped upload. The
 * thread owns nothing the caller touches until peer_http_bg_wait joins
 * it, so no lock is needed: the request's body is the caller's, read-only
 * until then, and the answer is the struct's own. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "peer/http.h"

static void *send_it(void *arg) {
    peer_http_bg *b = arg;
    double t0 = vl_clock_mono_s();
    b->rc = peer_http_do(b->http, &b->rq, &b->rs, &b->err);
    b->seconds = vl_clock_mono_s() - t0;
    return NULL;
}

int peer_http_bg_start(peer_http_bg *b, const peer_http *like, const peer_request *rq,
                       vl_error *err) {
    if (b->started)
        return vl_fail(err, VL_EINVAL, "a background request is still waiting to be read");
    size_t tl = strlen(rq->target);
    if (tl >= sizeof b->target)
        return vl_fail(err, VL_EINVAL, "request target of %zu bytes is too long", tl);
    if (!b->http) {
        int rc = peer_http_clone(like, &b->http, err);
        if (rc) return rc;
        peer_response_init(&b->rs);
    }
    memcpy(b->target, rq->target, tl + 1);
    b->rq = *rq;
    b->rq.target = b->target;
    b->rc = 0;
    memset(&b->err, 0, sizeof b->err);
    b->started = 1;
    b->running = pthread_create(&b->thread, NULL, send_it, b) == 0;
    if (!b->running) send_it(b); /* no thread to spare: the caller waits this once */
    return VL_OK;
}

int peer_http_bg_pending(const peer_http_bg *b) {
    return b->started;
}

int peer_http_bg_wait(peer_http_bg *b, peer_response **rs, vl_error *err) {
    if (!b->started) return vl_fail(err, VL_EINVAL, "no background request to wait for");
    if (b->running) pthread_join(b->thread, NULL);
    b->running = 0;
    b->started = 0;
    *rs = &b->rs;
    if (b->rc) *err = b->err;
    return b->rc;
}

void peer_http_bg_free(peer_http_bg *b) {
    if (b->running) pthread_join(b->thread, NULL);
    if (b->http) {
        peer_http_close(b->http);
        peer_response_free(&b->rs);
    }
    memset(b, 0, sizeof *b);
}
