/* Request authentication: Authorization header, peer lookup, signature,
 * clock window and nonce replay, answered with the codes of protocol.md. */
#include <string.h>

#include <event2/http.h>

#include "coordinator/coord.h"
#include "coordinator/nonce_log.h"

/* The signature covers the request target exactly as it was sent. */
static const char *target(coord_req *cr) {
    const char *uri = evhttp_request_get_uri(cr->req);
    return uri ? uri : "";
}

/* Clock and signature: whether the request comes from the holder of pk. */
static int verify_signature(coord_req *cr, const crypto_auth_header *a,
                            const uint8_t pk[CRYPTO_PK_BYTES], const uint8_t *body, size_t len) {
    int64_t now = clock_unix_s();
    int64_t skew = a->ts - now;
    if (skew > CRYPTO_TS_WINDOW_S || skew < -CRYPTO_TS_WINDOW_S) {
        coord_reply_error(cr, 401, "stale_timestamp",
                          "request timestamp is %lld s from the coordinator's clock (limit %d s)",
                          (long long)skew, CRYPTO_TS_WINDOW_S);
        return -1;
    }
    vl_error e = {0};
    if (crypto_verify_request(pk, a, cr->method, target(cr), body, len, now, &e) != VL_OK) {
        coord_reply_error(cr, 401, "bad_signature", "the request signature does not verify");
        return -1;
    }
    return 0;
}

/* The nonce, once the request has proved who sent it, so forged requests
 * cannot fill the cache. */
static int check_nonce(coord_req *cr, const crypto_auth_header *a) {
    int rc = crypto_nonce_check(cr->srv->nonces, a->peer_id, a->nonce, a->ts, clock_unix_s());
    if (rc == VL_ECONFLICT) {
        coord_reply_error(cr, 401, "replayed_nonce", "this nonce was already used");
        return -1;
    }
    if (rc != VL_OK) {
        coord_reply_error(cr, 429, "rate_limited", "too many requests; retry shortly");
        return -1;
    }
    coord_nonce_log_add(cr->srv->nonce_log, a->peer_id, a->nonce, a->ts);
    return 0;
}

/* The order keeps what a stranger can learn small: an unknown id is all
 * that is told before the signature; that a peer is revoked or over its
 * rate is told only to its key's holder. The rate is taken before the
 * nonce, so a refused request can be sent again as it was. */
int coord_authenticate(coord_req *cr, const uint8_t *body, size_t len) {
    crypto_auth_header a;
    vl_error e = {0};
    if (crypto_auth_parse(coord_get_header(cr, "Authorization"), &a, &e) != VL_OK) {
        coord_reply_error(cr, 401, "unauthorized", "%s", e.msg);
        return -1;
    }
    if (a.peer_id <= 0) {
        coord_reply_error(cr, 401, "unknown_peer", "peer 0 may only join");
        return -1;
    }
    storage_peer p;
    int rc = storage_peer_get(cr->srv->db, a.peer_id, &p, &e);
    if (rc == VL_ENOTFOUND) {
        coord_reply_error(cr, 401, "unknown_peer", "no peer %lld", (long long)a.peer_id);
        return -1;
    }
    if (rc != VL_OK) {
        coord_reply_internal(cr, &e);
        return -1;
    }
    int revoked = p.revoked;
    uint8_t pk[CRYPTO_PK_BYTES];
    memcpy(pk, p.public_key, sizeof pk);
    storage_peer_free(&p);
    if (verify_signature(cr, &a, pk, body, len) != 0) return -1;
    if (revoked) {
        coord_reply_error(cr, 403, "revoked", "peer %lld has been revoked", (long long)a.peer_id);
        return -1;
    }
    double wait = coord_limiter_take(cr->srv->peer_limiter, &a.peer_id, sizeof a.peer_id,
                                     clock_mono_s());
    if (wait > 0) {
        coord_reply_rate_limited(cr, wait, "peer");
        return -1;
    }
    if (check_nonce(cr, &a) != 0) return -1;
    cr->peer_id = a.peer_id;
    return 0;
}

int coord_authenticate_key(coord_req *cr, const crypto_auth_header *a,
                           const uint8_t pk[CRYPTO_PK_BYTES], const uint8_t *body, size_t len) {
    if (a->peer_id != 0) {
        coord_reply_error(cr, 401, "unauthorized", "a join request is signed with peer=0");
        return -1;
    }
    if (verify_signature(cr, a, pk, body, len) != 0) return -1;
    return check_nonce(cr, a);
}

int coord_check_task_owner(coord_req *cr, const char *what, const char *run, int64_t peer,
                           int64_t task, storage_task *t) {
    coord_server *srv = cr->srv;
    vl_error e = {0};
    if (strcmp(run, srv->cfg.name) != 0) {
        coord_reply_error(cr, 422, "wrong_run", "%s is for run \"%s\", this is \"%s\"", what,
                          run, srv->cfg.name);
        return -1;
    }
    if (peer != cr->peer_id) {
        coord_reply_error(cr, 403, "not_your_task", "%s names peer %lld but is signed by peer "
                          "%lld", what, (long long)peer, (long long)cr->peer_id);
        return -1;
    }
    int rc = storage_task_get(srv->db, task, t, &e);
    if (rc == VL_ENOTFOUND) {
        coord_reply_error(cr, 404, "unknown_task", "no task %lld", (long long)task);
        return -1;
    }
    if (rc != VL_OK) {
        coord_reply_internal(cr, &e);
        return -1;
    }
    if (t->peer_id != cr->peer_id) {
        coord_reply_error(cr, 403, "not_your_task", "task %lld is leased to another peer",
                          (long long)t->id);
        return -1;
    }
    return 0;
}
