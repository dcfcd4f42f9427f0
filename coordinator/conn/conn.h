/*
 * conn: what a connection meets before a request reaches a handler, the
 * parts without a header of their own: the per-peer request budgets
 * (rates.c) and the TLS context, made at start and again on SIGHUP
 * (tls.c). The input guard is guard.h, the listeners listen.h, the
 * connection rules limits.h, the nonce journal nonce_log.h.
 *
 * Contents: coord_peer_rate_take, coord_rate_is_split, coord_tls_ctx_new,
 * coord_tls_on_sighup.
 */
#ifndef VOLLEY_COORD_CONN_CONN_H
#define VOLLEY_COORD_CONN_CONN_H

#include <event2/util.h>

#include "coordinator/coord.h"

/* Takes a token of peer's budget for a signed request to target at now
 * (monotonic seconds): a split run's batch routes from split_limiter,
 * every other route from peer_limiter. 0, or the seconds until a token
 * is there (rates.c). */
double coord_peer_rate_take(coord_server *srv, int64_t peer, const char *target, double now);
/* Whether target spends the split batch budget rather than the peer's. */
int coord_rate_is_split(const coord_server *srv, const char *target);

/* A server TLS context from the PEM certificate chain at cert and the key
 * at key: TLS 1.2 or newer, forward-secret AEAD suites only. NULL with err
 * set (naming the file, or a key that does not match) on failure. The
 * caller owns the context (SSL_CTX_free). */
struct ssl_ctx_st *coord_tls_ctx_new(const char *cert, const char *key, vl_error *err);
/* The SIGHUP handler (an event callback, arg the server): reads the
 * certificate and key again from srv->conns.cert_path and srv->conns.key_path and
 * serves them to new connections; a pair that does not load keeps the
 * old context, and the log says why. */
void coord_tls_on_sighup(evutil_socket_t sig, short what, void *arg);

#endif
