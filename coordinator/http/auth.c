/* Request authentication on the request head, before any body is read:
 * the address's rate, the RFC 9421 signature (its parameters, covered
 * components, key, clock and nonce), the peer's state and rate, and the
 * Content-Digest the guard then checks the body against. Refusals carry
 * the codes of protocol.md. Runs as the guard's authorize callback, on the
 * event loop. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <event2/bufferevent.h>

#include "coordinator/coord.h"
#include "coordinator/conn/nonce_log.h"
#include "coordinator/run/split.h"
#include "coordinator/base/limiter.h"
#include "coordinator/base/routes.h"
#include "coordinator/conn/conn.h"
#include "coordinator/conn/guard.h"
#include "coordinator/conn/guard_types.h"
#include "coordinator/conn/limits_types.h"
#include "coordinator/http/http.h"

#define FIELD_CAP VCRYPTO_SIG_HEADER_MAX

static int refuse(coord_guard_refusal *r, int status, const char *code, const char *fmt, ...)
    VL_PRINTF(4, 5);
static int refuse(coord_guard_refusal *r, int status, const char *code, const char *fmt, ...) {
    r->status = status;
    snprintf(r->code, sizeof r->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static int refuse_rate(coord_guard_refusal *r, double wait, const char *who) {
    long long s = (long long)wait;
    if ((double)s < wait) s++;
    if (s < 1) s = 1;
    r->retry_after = (double)s;
    return refuse(r, 429, "rate_limited", "too many requests from this %s; retry in %lld s", who,
                  s);
}

/* ---- the head as the signature sees it ---------------------------------- */

/* The request line and fields of one head, for vcrypto_sig_base. */
typedef struct head_view {
    const uint8_t *head;
    size_t len;
    char method[12];
    char target[COORD_HEAD_CAP];
    char input[FIELD_CAP];                 /* Signature-Input */
    char sig[FIELD_CAP];                   /* Signature */
    char nonce[VCRYPTO_SIG_NONCE_MAX + 1]; /* of a verified signature */
    int64_t created;
    char scratch[COORD_HEAD_CAP + 64];
} head_view;

static int view_init(head_view *v, const uint8_t *head, size_t len) {
    memset(v, 0, offsetof(head_view, input));
    v->scratch[0] = '\0';
    v->head = head;
    v->len = len;
    const uint8_t *sp1 = memchr(head, ' ', len);
    if (!sp1 || (size_t)(sp1 - head) >= sizeof v->method) return -1;
    memcpy(v->method, head, (size_t)(sp1 - head));
    const uint8_t *t = sp1 + 1;
    const uint8_t *sp2 = memchr(t, ' ', len - (size_t)(t - head));
    if (!sp2 || (size_t)(sp2 - t) >= sizeof v->target) return -1;
    memcpy(v->target, t, (size_t)(sp2 - t));
    return 0;
}

static const char *view_lookup(void *arg, const char *c) {
    head_view *v = arg;
    size_t cap = sizeof v->scratch;
    const char *q = strchr(v->target, '?');
    size_t plen = q ? (size_t)(q - v->target) : strlen(v->target);
    if (strcmp(c, "@method") == 0) return v->method;
    if (strcmp(c, "@request-target") == 0) return v->target;
    if (strcmp(c, "@scheme") == 0) return "https";
    /* A value that does not fit is no value, never a shorter one. */
    if (strcmp(c, "@path") == 0) {
        int n = snprintf(v->scratch, cap, "%.*s", (int)plen, v->target);
        return n < 0 || (size_t)n >= cap ? NULL : v->scratch;
    }
    if (strcmp(c, "@query") == 0) {
        int n = snprintf(v->scratch, cap, "?%s", q ? q + 1 : "");
        return n < 0 || (size_t)n >= cap ? NULL : v->scratch;
    }
    if (strcmp(c, "@authority") == 0 || strcmp(c, "@target-uri") == 0) {
        char host[256];
        if (coord_guard_head_field(v->head, v->len, "Host", host, sizeof host) != 1) return NULL;
        for (char *h = host; *h; h++)
            if (*h >= 'A' && *h <= 'Z') *h = (char)(*h - 'A' + 'a');
        int n = c[1] == 'a' ? snprintf(v->scratch, cap, "%s", host)
                            : snprintf(v->scratch, cap, "https://%s%s", host, v->target);
        return n < 0 || (size_t)n >= cap ? NULL : v->scratch;
    }
    if (c[0] == '@') return NULL;
    int n = coord_guard_head_field(v->head, v->len, c, v->scratch, cap);
    return n > 0 ? v->scratch : NULL;
}

static int covers(const vcrypto_sig *s, const char *name) {
    for (size_t i = 0; i < s->n_components; i++)
        if (strcmp(s->components[i], name) == 0) return 1;
    return 0;
}

/* What the signature must cover: the method and the whole target, and for
 * a request with a body its digest and length, so no part that changes
 * what the request does can be swapped. */
static int check_coverage(const vcrypto_sig *s, int has_body, coord_guard_refusal *r) {
    if (!covers(s, "@method"))
        return refuse(r, 401, "unauthorized", "the signature must cover @method");
    if (!covers(s, "@target-uri") && !covers(s, "@request-target") &&
        !(covers(s, "@path") && covers(s, "@query")))
        return refuse(r, 401, "unauthorized",
                      "the signature must cover @target-uri, or @path and @query");
    if (has_body && (!covers(s, "content-digest") || !covers(s, "content-length")))
        return refuse(r, 401, "unauthorized",
                      "a request with a body must sign content-digest and content-length");
    return 0;
}

/* ---- the checks --------------------------------------------------------- */

static int address_ok(coord_server *srv, coord_guard *g, coord_guard_refusal *r) {
    evutil_socket_t fd = g->bev ? bufferevent_getfd(g->bev) : -1;
    if (fd < 0) return 0;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) return 0;
    uint8_t key[COORD_ADDR_KEY_MAX];
    size_t n = coord_limiter_addr_key((const struct sockaddr *)&ss, key);
    if (n == 0) return 0;
    double wait = coord_limiter_take(srv->conns.addr_limiter, key, n, vl_clock_mono_s());
    return wait > 0 ? refuse_rate(r, wait, "address") : 0;
}

/* The key that must have signed: a registered peer's (keyid is its id),
 * or for a join the key being registered (keyid is that key). */
static int signer_key(coord_server *srv, const vcrypto_sig *s, coord_auth_kind kind,
                      uint8_t pk[VCRYPTO_PK_BYTES], coord_guard_ticket *t, int *revoked,
                      coord_guard_refusal *r) {
    if (kind == COORD_AUTH_JOIN) {
        if (strlen(s->keyid) != VCRYPTO_PK_B64_LEN || vcrypto_pk_decode(s->keyid, pk) != VL_OK)
            return refuse(r, 401, "unauthorized",
                          "a join is signed with keyid = base64 of the key it registers");
        t->join = 1;
        memcpy(t->join_pk, pk, VCRYPTO_PK_BYTES);
        return 0;
    }
    int64_t id = 0;
    if (vl_parse_i64(s->keyid, 1, INT64_MAX, &id) != 0)
        return refuse(r, 401, "unknown_peer", "keyid must be a peer id");
    storage_peer p;
    vl_error e = {0};
    int rc = storage_peer_get(srv->run.db, id, &p, &e);
    if (rc == VL_ENOTFOUND) return refuse(r, 401, "unknown_peer", "no peer %lld", (long long)id);
    if (rc != VL_OK) {
        vl_log_error("authenticating peer %lld: %s", (long long)id, e.msg);
        return refuse(r, 500, "internal", "internal error");
    }
    *revoked = p.revoked;
    memcpy(pk, p.public_key, VCRYPTO_PK_BYTES);
    storage_peer_free(&p);
    t->peer_id = id;
    return 0;
}

/* The nonce, once the request has proved who sent it, so forged requests
 * cannot fill the cache. */
static int nonce_ok(coord_server *srv, int64_t peer, const head_view *v, coord_guard_refusal *r) {
    char key[VCRYPTO_NONCE_HEX + 1];
    vcrypto_nonce_key(v->nonce, key);
    int rc = vcrypto_nonce_check(srv->conns.nonces, peer, key, v->created, vl_clock_unix_s());
    if (rc == VL_ECONFLICT) return refuse(r, 401, "replayed_nonce", "this nonce was already used");
    if (rc != VL_OK) return refuse_rate(r, 1, "coordinator");
    coord_nonce_log_add(srv->conns.nonce_log, peer, key, v->created);
    return 0;
}

/* The order keeps what a stranger can learn small: an unknown id is all
 * that is told before the signature; that a peer is revoked or over its
 * rate is told only to its key's holder. The rate is taken before the
 * nonce, so a refused request can be sent again as it was. */
static int signed_ok(coord_server *srv, head_view *v, coord_auth_kind kind, int has_body,
                     coord_guard_ticket *t, coord_guard_refusal *r) {
    vl_error e = {0};
    int ni = coord_guard_head_field(v->head, v->len, "Signature-Input", v->input, sizeof v->input);
    int ns = coord_guard_head_field(v->head, v->len, "Signature", v->sig, sizeof v->sig);
    if (ni < 0 || ns < 0) return refuse(r, 401, "unauthorized", "signature fields too long");
    if (ni == 0 || ns == 0)
        return refuse(r, 401, "unauthorized",
                      "missing Signature-Input and Signature (RFC 9421, alg ed25519)");
    vcrypto_sig s;
    if (vcrypto_sig_parse(v->input, v->sig, &s, &e) != VL_OK)
        return refuse(r, 401, "unauthorized", "%s", e.msg);
    if (s.nonce[0] == '\0')
        return refuse(r, 401, "unauthorized", "the signature needs a nonce parameter");
    if (check_coverage(&s, has_body, r) != 0) return -1;
    uint8_t pk[VCRYPTO_PK_BYTES];
    int revoked = 0;
    if (signer_key(srv, &s, kind, pk, t, &revoked, r) != 0) return -1;
    int64_t now = vl_clock_unix_s();
    int64_t skew = s.created - now;
    if (skew > VCRYPTO_TS_WINDOW_S || skew < -VCRYPTO_TS_WINDOW_S)
        return refuse(r, 401, "stale_timestamp",
                      "the signature was created %lld s from the coordinator's clock (limit %d "
                      "s)",
                      (long long)skew, VCRYPTO_TS_WINDOW_S);
    /* An expires given is a time, 0 included (long past): only an absent
     * one means none. */
    if (s.has_expires && s.expires < now)
        return refuse(r, 401, "stale_timestamp", "the signature expired at %lld",
                      (long long)s.expires);
    vl_buf base;
    vl_buf_init(&base, 2 * COORD_HEAD_CAP);
    int rc = vcrypto_sig_base(&s, view_lookup, v, &base, &e);
    if (rc == VL_OK) rc = vcrypto_sig_verify(pk, &s, &base, &e);
    vl_buf_free(&base);
    if (rc == VL_EINVAL) return refuse(r, 401, "bad_signature", "%s", e.msg);
    if (rc != VL_OK)
        return refuse(r, 401, "bad_signature", "the request signature does not verify");
    if (revoked)
        return refuse(r, 403, "revoked", "peer %lld has been revoked", (long long)t->peer_id);
    if (kind == COORD_AUTH_PEER) {
        /* A split run's batches have a budget of their own (rates.c). */
        double wait = coord_peer_rate_take(srv, t->peer_id, v->target, vl_clock_mono_s());
        if (wait > 0)
            return refuse_rate(
                r, wait, coord_rate_is_split(srv, v->target) ? "peer (split batches)" : "peer");
    }
    snprintf(v->nonce, sizeof v->nonce, "%s", s.nonce);
    v->created = s.created;
    return 0;
}

/* ---- bodies being received ---------------------------------------------- */

static ssize_t receiving_index(const coord_server *srv, int64_t peer) {
    for (size_t i = 0; i < srv->conns.n_receiving; i++)
        if (srv->conns.receiving_peers[i] == peer) return (ssize_t)i;
    return -1;
}

static int receiving_count(const coord_server *srv, int64_t peer) {
    int n = 0;
    for (size_t i = 0; i < srv->conns.n_receiving; i++) n += srv->conns.receiving_peers[i] == peer;
    return n;
}

/* Bodies a peer may send at once to path: a split run's batches as many
 * as split.in_flight, anything else one. */
static int bodies_allowed(const coord_server *srv, const char *path) {
    if (srv->run.split && strncmp(path, "/v1/split/", 10) == 0) return srv->run.split->in_flight;
    return 1;
}

/* Counts a signed body against the budget before any of it is read: one
 * body at a time per peer (a split peer's batches: split.in_flight), and
 * only its first COORD_BODY_ADVANCE bytes at first. What a body holds is
 * what has arrived of it (coord_auth_progress), so a head that announces
 * a large body and then sends little holds little; the connection tick
 * cuts off the slowest bodies when what has arrived exceeds the budget
 * (conns.c). */
static int reserve_body(coord_server *srv, int64_t peer, int64_t len, int allowed,
                        coord_guard_ticket *t, coord_guard_refusal *r) {
    if (len <= 0) return 0;
    if (receiving_count(srv, peer) >= allowed) {
        r->retry_after = 1;
        if (allowed > 1)
            return refuse(r, 429, "rate_limited",
                          "peer %lld is already sending %d bodies, its "
                          "limit",
                          (long long)peer, allowed);
        return refuse(r, 429, "rate_limited", "peer %lld is already sending a body; one at a time",
                      (long long)peer);
    }
    int64_t advance = len < COORD_BODY_ADVANCE ? len : COORD_BODY_ADVANCE;
    int64_t budget = srv->conns.limits.body_budget;
    if (budget > 0 && srv->conns.body_inflight + advance > budget) {
        r->retry_after = 2;
        return refuse(r, 503, "overloaded",
                      "the coordinator is receiving %lld MiB of bodies, its limit; retry "
                      "shortly",
                      (long long)(srv->conns.body_inflight >> 20));
    }
    if (srv->conns.n_receiving == srv->conns.cap_receiving) {
        size_t cap = srv->conns.cap_receiving ? 2 * srv->conns.cap_receiving : 64;
        int64_t *p = realloc(srv->conns.receiving_peers, cap * sizeof *p);
        if (!p) return refuse(r, 503, "overloaded", "out of memory");
        srv->conns.receiving_peers = p;
        srv->conns.cap_receiving = cap;
    }
    srv->conns.receiving_peers[srv->conns.n_receiving++] = peer;
    srv->conns.body_inflight += advance;
    t->reserved = advance;
    return 0;
}

void coord_auth_progress(void *arg, coord_guard_ticket *t, uint64_t arrived) {
    coord_server *srv = arg;
    if (t->reserved <= 0 || (int64_t)arrived <= t->reserved) return;
    srv->conns.body_inflight += (int64_t)arrived - t->reserved;
    t->reserved = (int64_t)arrived;
}

void coord_auth_release(void *arg, const coord_guard_ticket *t) {
    coord_server *srv = arg;
    if (t->reserved <= 0) return;
    srv->conns.body_inflight -= t->reserved;
    ssize_t i = receiving_index(srv, t->peer_id);
    if (i >= 0)
        srv->conns.receiving_peers[i] = srv->conns.receiving_peers[--srv->conns.n_receiving];
}

int coord_auth_head(void *arg, coord_guard *g, const uint8_t *head, size_t len,
                    coord_guard_ticket *t, coord_guard_refusal *r) {
    coord_server *srv = arg;
    if (address_ok(srv, g, r) != 0) return -1;
    head_view *v = malloc(sizeof *v);
    if (!v) return refuse(r, 503, "unavailable", "out of memory");
    int rc = -1;
    if (view_init(v, head, len) != 0) {
        refuse(r, 400, "bad_request", "malformed request line");
        goto out;
    }
    char path[COORD_HEAD_CAP];
    snprintf(path, sizeof path, "%.*s", (int)strcspn(v->target, "?"), v->target);
    coord_auth_kind kind = coord_route_auth_kind(v->method, path);
    char digest[VCRYPTO_DIGEST_HEADER_MAX];
    int nd = coord_guard_head_field(head, len, "Content-Digest", digest, sizeof digest);
    char clen[32];
    int has_body = coord_guard_head_field(head, len, "Content-Length", clen, sizeof clen) != 0 ||
                   strcmp(v->method, "POST") == 0;
    vl_error e = {0};
    if (nd < 0 || (nd > 0 && vcrypto_digest_parse(digest, &t->want, &e) != VL_OK)) {
        refuse(r, 400, "bad_digest", "Content-Digest: %s", nd < 0 ? "too long" : e.msg);
        goto out;
    }
    if (kind != COORD_AUTH_NONE && has_body && nd == 0) {
        refuse(r, 400, "bad_digest", "a request with a body needs Content-Digest (sha-256)");
        goto out;
    }
    if (kind == COORD_AUTH_NONE) {
        rc = 0;
        goto out;
    }
    /* The nonce is spent last, once nothing else can refuse the request,
     * so a refused request may be sent again as it was. */
    int64_t body_len = 0;
    if (signed_ok(srv, v, kind, has_body, t, r) != 0 ||
        (kind == COORD_AUTH_PEER &&
         vl_parse_i64(clen[0] ? clen : "0", 0, INT64_MAX, &body_len) == 0 &&
         reserve_body(srv, t->peer_id, body_len, bodies_allowed(srv, path), t, r) != 0))
        goto out;
    if (nonce_ok(srv, t->peer_id, v, r) != 0) {
        coord_auth_release(srv, t);
        t->reserved = 0;
        goto out;
    }
    rc = 0;
out:
    free(v);
    return rc;
}

/* ---- in the handlers ---------------------------------------------------- */

int coord_authenticate(coord_req *cr) {
    if (cr->ticket.peer_id <= 0) {
        coord_reply_error(cr, 401, "unauthorized", "this request must be signed by a peer");
        return COORD_ANSWERED;
    }
    /* A body may take minutes to arrive after its head was checked: a
     * peer revoked meanwhile is refused now, before anything of it is
     * used. */
    if (cr->ticket.want.alg != 0) {
        storage_peer p;
        vl_error e = {0};
        int rc = storage_peer_get(cr->srv->run.db, cr->ticket.peer_id, &p, &e);
        if (rc != VL_OK) {
            if (rc == VL_ENOTFOUND)
                coord_reply_error(cr, 401, "unknown_peer", "no peer %lld",
                                  (long long)cr->ticket.peer_id);
            else
                coord_reply_internal(cr, &e);
            return COORD_ANSWERED;
        }
        int revoked = p.revoked;
        storage_peer_free(&p);
        if (revoked) {
            coord_reply_error(cr, 403, "revoked", "peer %lld has been revoked",
                              (long long)cr->ticket.peer_id);
            return COORD_ANSWERED;
        }
    }
    cr->peer_id = cr->ticket.peer_id;
    return 0;
}

int coord_authenticate_join(coord_req *cr, const uint8_t pk[VCRYPTO_PK_BYTES]) {
    if (!cr->ticket.join || !vcrypto_equal(cr->ticket.join_pk, pk, VCRYPTO_PK_BYTES)) {
        coord_reply_error(cr, 401, "bad_signature",
                          "a join must be signed by the key it registers");
        return COORD_ANSWERED;
    }
    return 0;
}

int coord_check_task_owner(coord_req *cr, const char *what, const char *run, int64_t peer,
                           int64_t task, storage_task *t) {
    coord_server *srv = cr->srv;
    vl_error e = {0};
    if (strcmp(run, srv->run.cfg.name) != 0) {
        coord_reply_error(cr, 422, "wrong_run", "%s is for run \"%s\", this is \"%s\"", what, run,
                          srv->run.cfg.name);
        return COORD_ANSWERED;
    }
    if (peer != cr->peer_id) {
        coord_reply_error(cr, 403, "not_your_task",
                          "%s names peer %lld but is signed by peer "
                          "%lld",
                          what, (long long)peer, (long long)cr->peer_id);
        return COORD_ANSWERED;
    }
    int rc = storage_task_get(srv->run.db, task, t, &e);
    if (rc == VL_ENOTFOUND) {
        coord_reply_error(cr, 404, "unknown_task", "no task %lld", (long long)task);
        return COORD_ANSWERED;
    }
    if (rc != VL_OK) {
        coord_reply_internal(cr, &e);
        return COORD_ANSWERED;
    }
    if (t->peer_id != cr->peer_id) {
        coord_reply_error(cr, 403, "not_your_task", "task %lld is leased to another peer",
                          (long long)t->id);
        return COORD_ANSWERED;
    }
    return 0;
}
