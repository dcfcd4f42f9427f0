/*
 * The input guard: sits between each TLS connection and libevent's HTTP
 * parser and decides, from the request head alone, whether a body will be
 * accepted, so an oversized or unframed body is refused before a byte of
 * it is read.
 *
 * libevent 2.1 reads a whole body before any handler runs and answers its
 * own size limit with a fixed HTML page. The guard instead parses every
 * request head on the connection (just enough to find Content-Length and
 * Transfer-Encoding) and passes the bytes through unchanged, counting body
 * bytes so it stays in step with keep-alive and pipelined requests. When a
 * head announces a body over the cap, comes chunked, has a duplicated or
 * malformed Content-Length, or is itself malformed or too long, the guard
 * replaces that head with one that carries "Content-Length: 0" and an
 * internal marker header naming the reason, and discards everything after
 * it on the connection; the request handler then answers with the JSON
 * error and closes. A client-sent header with the marker's name is always
 * stripped. Anything the guard cannot parse with certainty is refused, so
 * it and libevent never disagree about where a request ends.
 *
 * An owner that authenticates (caps.authorize) is also asked about every
 * head that passes those checks, before a byte of its body is let through:
 * it refuses the head (the handler then answers with the owner's status
 * and error, and the connection closes) or accepts it with a ticket that
 * says who signed it and which body digest the head announced. The guard
 * hashes the body as it streams through and records in the ticket whether
 * the digest matched; it numbers each accepted head with an internal
 * ticket header so the handler can take the ticket of exactly its own
 * request, however many requests a client pipelines.
 *
 * It also times each request against slow clients: a head must arrive
 * within a limit of its first byte, and a body within that limit plus its
 * length over a minimum rate. The owner asks the guard (from a timer) what
 * the clock says and has it act: a head that is too slow is replaced by a
 * refusal like the others (408), a body that is too slow ends the
 * connection, since the HTTP parser is then mid-request and cannot answer.
 *
 * Contents: coord_guard_verdict_name, coord_guard_verdict_parse,
 * coord_guard_parse_head, coord_guard_init, coord_guard_free,
 * coord_guard_ticket_take, coord_guard_head_field, coord_guard_feed_head,
 * coord_guard_feed, coord_guard_idle, coord_guard_check_time,
 * coord_guard_body_arrived, coord_guard_expire_head, coord_guard_attach,
 * coord_guard_detach, coord_guard_enforce_time, coord_guard_advance_window,
 * coord_guard_shut_down.
 */
#ifndef VOLLEY_COORD_GUARD_H
#define VOLLEY_COORD_GUARD_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "coordinator/conn/guard_types.h"
#include "crypto/crypto.h"

struct bufferevent;


/* Wire name of a verdict ("too_large", ...), used as the marker's value. */
const char *coord_guard_verdict_name(coord_guard_verdict v);

/* Verdict from a marker value; COORD_GUARD_BAD_HEAD for anything unknown. */
coord_guard_verdict coord_guard_verdict_parse(const char *name);

/* Analyses a complete head: len bytes ending with the empty line that
 * closes it (lines end in LF with an optional CR before it, as libevent
 * reads them). Pure; never reads past len. */
void coord_guard_parse_head(const uint8_t *head, size_t len, const coord_guard_caps *caps,
                            coord_guard_head *out);

/* Initialises g for a new connection. head_cap bounds one request head;
 * caps (copied) bound bodies. */
void coord_guard_init(coord_guard *g, size_t head_cap, const coord_guard_caps *caps);
/* Releases g's buffers (not g itself). */
void coord_guard_free(coord_guard *g);

/* Takes the ticket of accepted head seq (the value of its ticket header)
 * into out and frees its slot. Returns 0, or VL_ENOTFOUND when no live
 * ticket has that number. */
int coord_guard_ticket_take(coord_guard *g, uint64_t seq, coord_guard_ticket *out) VL_MUST_CHECK;

/* Copies into out (cap bytes, NUL-terminated) the value of every field of
 * a complete head named name (without case), trimmed and joined with ", "
 * as RFC 9110 combines repeated fields. Returns the number of fields
 * found (0: none, out empty), or VL_ETOOBIG when the value does not fit. */
int coord_guard_head_field(const uint8_t *head, size_t len, const char *name, char *out,
                           size_t cap);

/* Consumes head bytes from in (n > 0), appending what the HTTP parser should
 * see to out. Stops right after a head completes (the state then changes)
 * and returns the number of bytes consumed. Call only in the IN_HEAD state. */
size_t coord_guard_feed_head(coord_guard *g, const uint8_t *in, size_t n, vl_buf *out);

/* Processes n bytes of the connection's input in any state, appending the
 * bytes the HTTP parser should see to out. Returns 0, or VL_ENOMEM/VL_ETOOBIG
 * if out cannot take them. The attached hook below does the same work with
 * zero-copy body forwarding; this form exists for tests and tools. */
int coord_guard_feed(coord_guard *g, const uint8_t *in, size_t n, vl_buf *out) VL_MUST_CHECK;

/* 1 when no request is partly received: between requests, or discarding
 * after a refused one. */
int coord_guard_idle(const coord_guard *g);

/* What the clock says about g at now (caps.clock's time):
 * COORD_GUARD_HEAD_TIMEOUT when a head has been arriving for longer than
 * slow_timeout_s, COORD_GUARD_BODY_TIMEOUT when a body is still arriving
 * after its deadline or delivered less than min_body_rate over a whole
 * body window, else COORD_GUARD_OK. */
coord_guard_verdict coord_guard_check_time(const coord_guard *g, double now);
/* Body bytes of the current request that have passed so far (0 outside
 * a body). */
uint64_t coord_guard_body_arrived(const coord_guard *g);
/* Refuses the head in progress as too slow: appends the refusal head that
 * makes the handler answer 408 to out and discards the rest of the
 * connection, like any refused head. Returns 0 or VL_ENOMEM/VL_ETOOBIG. */
int coord_guard_expire_head(coord_guard *g, vl_buf *out) VL_MUST_CHECK;

/* Attaches g to bev: every byte bev reads (after TLS) passes through g,
 * in a callback on bev's input buffer that runs before the HTTP parser
 * sees the bytes, so refused heads are rewritten and what follows them is
 * dropped. The bufferevent's output is untouched, so replies take
 * libevent's ordinary path. (A bufferevent_filter would be the obvious
 * tool, but in libevent 2.1 a filter reports a reply written once it has
 * reached the layer below, so a reply followed by a close is lost.)
 * Returns 0 or VL_ENOMEM. Call coord_guard_detach before bev or g goes. */
int coord_guard_attach(coord_guard *g, struct bufferevent *bev) VL_MUST_CHECK;
/* Removes the hook installed by coord_guard_attach and closes linger_fd if
 * still set; safe if never attached. */
void coord_guard_detach(coord_guard *g);
/* For an attached guard: acts on coord_guard_check_time at now and
 * returns what it found. A slow head is refused in the input stream and,
 * when the HTTP parser is waiting for a request, the parser is run on the
 * refusal at once (otherwise it reads it when it next reads); a slow body,
 * or a slow head while the parser is busy with an earlier request, shuts
 * the socket down, which libevent sees as the client going away. The
 * connection (and g with it) may be freed before this returns. */
coord_guard_verdict coord_guard_enforce_time(coord_guard *g, double now);
/* Moves g's body-rate window on when the one in progress has ended in
 * time (coord_guard_enforce_time does this itself). */
void coord_guard_advance_window(coord_guard *g, double now);
/* Ends an attached guard's connection from below libevent, which then
 * frees it as it does when a client goes away. */
void coord_guard_shut_down(coord_guard *g);

#endif
