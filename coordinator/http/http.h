/*
 * http: a request's life from the dispatcher to its answer. Dispatch
 * (dispatch.c) takes a request from libevent, answers what the input
 * guard refused and calls the route's handler; the replies (reply.c)
 * send JSON, errors and shared bytes, log the request line and count it;
 * request authentication (auth.c) checks the signature on the head, for
 * the guard, and gives a handler its peer.
 *
 * Contents: replies; query strings and the version they name; shared
 * bytes; the client's address; authentication; dispatch.
 */
#ifndef VOLLEY_COORD_HTTP_HTTP_H
#define VOLLEY_COORD_HTTP_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator/coord.h"
#include "coordinator/conn/guard_types.h"

/* Sends blob (a reference the call takes over) as a 200 octet stream
 * without copying it. */
void coord_reply_blob(coord_req *cr, coord_blob *blob);
/* Sends count bytes of blob from first with status, consuming the
 * caller's reference. */
void coord_reply_blob_part(coord_req *cr, coord_blob *blob, int status, size_t first, size_t count);
/* Sends status with body (may be NULL) and content type, logs the request
 * line, and ends the request. The body buffer's contents are consumed. */
void coord_reply(coord_req *cr, int status, const char *content_type, struct evbuffer *body);
/* Sends obj (reference stolen) as JSON. */
void coord_reply_json(coord_req *cr, int status, json_t *obj);
/* Sends {"error":{"code","message"}}. */
void coord_reply_error(coord_req *cr, int status, const char *code, const char *fmt, ...)
    VL_PRINTF(4, 5);
/* Sends 429 rate_limited with Retry-After: wait_s rounded up (at least
 * 1 s); who names the bucket in the message ("peer 7", "address"). */
void coord_reply_rate_limited(coord_req *cr, double wait_s, const char *who);
/* Sends a 500 for err and logs its message; for VL_EFULL (a full
 * disk: nothing stored) a 503 unavailable with Retry-After instead. */
void coord_reply_internal(coord_req *cr, const vl_error *err);
/* Sends a 500 for running out of memory while `what` ("queueing an
 * update"), and logs it. */
void coord_reply_oom(coord_req *cr, const char *what);
/* Sets a response header. */
void coord_set_header(coord_req *cr, const char *name, const char *value);
/* Request header value or NULL. */
const char *coord_get_header(coord_req *cr, const char *name);
/* The request body as one contiguous block (NULL when empty). */
const uint8_t *coord_body(coord_req *cr, size_t *len);
/* Marks the request as handed to a handler (drain accounting). */
void coord_req_begin(coord_req *cr);

/* Parses a query string of key=value pairs: each key must be in allowed
 * (NULL-terminated) and appear at most once, each value a decimal integer
 * in [0, max]. values[i] is set for allowed[i] when present (present bit i
 * set). Returns 0 or VL_EINVAL with a message. */
int coord_query_ints(const char *query, const char *const *allowed, int64_t max, int64_t *values,
                     unsigned *present, vl_error *err) VL_MUST_CHECK;
/* coord_query_ints on cr's own query string; on failure answers 400
 * bad_request (the message, then hint in parentheses when not NULL) and
 * returns COORD_ANSWERED. */
int coord_req_query(coord_req *cr, const char *const *allowed, int64_t max, int64_t *values,
                    unsigned *present, const char *hint);

/* coord_req_version's fallback for a route whose query must name the
 * version (no version is ever negative, but factors_version can be -1). */
#define COORD_VERSION_NEEDED INT64_MIN
/* The version cr's query names, for a route whose query keys are allowed
 * (NULL-terminated, "version" among them): parses the query as
 * coord_req_query does (values and present as there, any value up to
 * INT64_MAX, a bad query answered 400 bad_request), then sets *version to
 * the query's version or, when it names none, to fallback. With fallback
 * COORD_VERSION_NEEDED a query without one is answered 400 bad_request
 * ("the query needs version=VERSION"). Whether the run has that version
 * is the route's to check, in its order (coord_req_version_made). Returns
 * 0 or COORD_ANSWERED. */
int coord_req_version(coord_req *cr, const char *const *allowed, int64_t *values, unsigned *present,
                      int64_t fallback, int64_t *version);
/* 0 when the run has made version (it is at most srv->run.version); otherwise
 * answers 404 unknown_version ("version V has not been made (current is
 * C)") and returns COORD_ANSWERED. */
int coord_req_version_made(coord_req *cr, int64_t version);


/* The numeric address of req's client, owned by its connection; NULL when
 * the connection is gone. */
const char *coord_request_addr(struct evhttp_request *req);


/* The guard's authorize callback (arg: the coord_server): the address's
 * rate, then for a path that needs one the RFC 9421 signature over the
 * head (components, key, clock, peer state and rate, nonce) and the
 * Content-Digest the body must match. 0 with t filled, or -1 with r. */
int coord_auth_head(void *arg, coord_guard *g, const uint8_t *head, size_t len,
                    coord_guard_ticket *t, coord_guard_refusal *r);

/* Gives back what coord_auth_head reserved for t's body (the guard's
 * release callback; the server calls it when it takes a ticket). */
void coord_auth_release(void *arg, const coord_guard_ticket *t);
/* The guard's progress callback: a body's reservation grows to what has
 * arrived of it once that passes the advance reserved at its head. */
void coord_auth_progress(void *arg, coord_guard_ticket *t, uint64_t arrived);

/* For a route that needs a registered peer, called by dispatch before its
 * handler (so no handler calls it): sets cr->peer_id from the ticket the
 * guard issued for the signed head and returns 0, or answers 401 (403 for
 * a peer revoked since its head was checked) and returns COORD_ANSWERED. */
int coord_authenticate(coord_req *cr);
/* For a join: 0 when the head was signed by pk (the key the body
 * registers); otherwise answers 401 and returns COORD_ANSWERED. */
int coord_authenticate_join(coord_req *cr, const uint8_t pk[VCRYPTO_PK_BYTES]);

/* The checks every upload about a task starts with, in protocol order:
 * run is this run's (422 wrong_run), peer is the signer (403
 * not_your_task), the task exists (404 unknown_task) and is the signer's
 * (403 not_your_task). what names the upload in messages ("update").
 * Returns 0 with the task in *t, or answers and returns COORD_ANSWERED. */
int coord_check_task_owner(coord_req *cr, const char *what, const char *run, int64_t peer,
                           int64_t task, storage_task *t);


/* The evhttp request callback of the public listener (arg is the
 * coord_server): answers a head the input guard refused, else routes the
 * request to the handler srv->handlers binds to its route, with 404 or
 * 405 as JSON for unknown paths and methods (dispatch.c). */
void coord_dispatch(struct evhttp_request *req, void *arg);

#endif
