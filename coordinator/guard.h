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
 */
#ifndef VOLLEY_COORD_GUARD_H
#define VOLLEY_COORD_GUARD_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "crypto/crypto.h"

struct bufferevent;
struct evbuffer;
struct evbuffer_cb_entry;

/* Name of the internal marker header; its value is a verdict name. Every
 * client-sent header whose name starts with it is stripped. */
#define COORD_GUARD_HEADER "X-Volley-Guard"
/* The internal header that numbers an accepted head (see the tickets). */
#define COORD_GUARD_TICKET_HEADER "X-Volley-Guard-Ticket"
/* Accepted requests whose tickets a connection may hold at once: one in
 * its handler, the rest pipelined behind it. */
#define COORD_GUARD_TICKETS 4

typedef enum {
    COORD_GUARD_OK = 0,
    COORD_GUARD_TOO_LARGE,        /* Content-Length over the body cap: 413 */
    COORD_GUARD_HEAD_TOO_LARGE,   /* head longer than the head cap: 413 */
    COORD_GUARD_LENGTH_REQUIRED,  /* Transfer-Encoding, or a POST/PUT/PATCH without
                                    Content-Length: 411 */
    COORD_GUARD_BAD_LENGTH,       /* duplicated or malformed Content-Length: 400 */
    COORD_GUARD_BAD_HEAD,         /* malformed request line or header: 400 */
    COORD_GUARD_BAD_METHOD,       /* a method the HTTP parser does not know: 405 */
    COORD_GUARD_HEAD_TIMEOUT,     /* a head arrived too slowly: 408 */
    COORD_GUARD_BODY_TIMEOUT,     /* a body arrived too slowly: the connection ends */
    COORD_GUARD_REFUSED,          /* the owner's authorize refused it: its refusal */
    COORD_GUARD_PIPELINED,        /* more pipelined requests than tickets: 429 */
    COORD_GUARD_BODY_NOT_ALLOWED, /* a body on HEAD or TRACE, which the HTTP parser
                                     would read as the next request: 400 */
} coord_guard_verdict;

/* Whether an accepted request's body matched the digest its head named. */
typedef enum {
    COORD_GUARD_DIGEST_NONE = 0, /* the head named none */
    COORD_GUARD_DIGEST_PENDING,  /* the body is still arriving */
    COORD_GUARD_DIGEST_OK,
    COORD_GUARD_DIGEST_MISMATCH,
} coord_guard_digest_state;

/* What the owner decided about one accepted head, and what the guard then
 * found in its body. */
typedef struct coord_guard_ticket {
    uint64_t seq;    /* the head's number on the connection */
    int live;        /* held by the guard until coord_guard_ticket_take */
    int64_t peer_id; /* the signing peer; 0 when none */
    int join;        /* signed by join_pk (a join request) */
    uint8_t join_pk[CRYPTO_PK_BYTES];
    crypto_digest_want want; /* want.alg 0: no digest to check */
    coord_guard_digest_state digest;
    int64_t reserved; /* body bytes the owner counted against its budget */
} coord_guard_ticket;

/* The owner's answer to a head it refuses. */
typedef struct coord_guard_refusal {
    int status;    /* HTTP status */
    char code[32]; /* error code of protocol.md */
    char msg[200];
    double retry_after; /* seconds for Retry-After; 0: none */
} coord_guard_refusal;

struct coord_guard;
/* Decides about a complete head (len bytes, the request line and fields,
 * ending with the empty line) before any of its body is read. Returns 0
 * and fills t (seq and live are the guard's) to accept, or -1 and fills r
 * to refuse. g is the connection's guard (its bev gives the socket). */
typedef int (*coord_guard_authorize_fn)(void *arg, struct coord_guard *g, const uint8_t *head,
                                        size_t len, coord_guard_ticket *t, coord_guard_refusal *r);

/* Wire name of a verdict ("too_large", ...), used as the marker's value. */
const char *coord_guard_verdict_name(coord_guard_verdict v);
/* Verdict from a marker value; COORD_GUARD_BAD_HEAD for anything unknown. */
coord_guard_verdict coord_guard_verdict_parse(const char *name);

/* Body size limits. Bodies are small everywhere but on a few endpoints
 * (uploads of updates and of second-round values), so an unauthenticated client cannot make the server read a
 * large body anywhere else. */
typedef struct coord_guard_caps {
    uint64_t body_cap;              /* every request but those to large_paths */
    const char *const *large_paths; /* NULL-terminated paths (without query) allowed
                                       large_cap; the list may be NULL */
    uint64_t large_cap;
    /* Slow clients: a head must be complete within slow_timeout_s of its
     * first byte, a body within slow_timeout_s + length / min_body_rate of
     * the end of its head (0: no time limits). */
    double slow_timeout_s;
    double min_body_rate; /* bytes per second, > 0 when slow_timeout_s is */
    /* A body must also keep up min_body_rate over each window of this
     * many seconds from the end of its head (0: only the deadline above),
     * so a client cannot send a little and then hold its place for the
     * rest of a long deadline. */
    double body_window_s;
    double (*clock)(void);              /* monotonic seconds; NULL for vl_clock_mono_s */
    coord_guard_authorize_fn authorize; /* NULL: every valid head is let through */
    void *authorize_arg;
    /* Called with authorize_arg for every ticket the guard drops untaken
     * (its connection went), so what the owner reserved for it is given
     * back; a taken ticket is the taker's to release. May be NULL. */
    void (*release)(void *arg, const coord_guard_ticket *t);
    /* Called with authorize_arg as an accepted body arrives, with the
     * bytes of it passed so far (its ticket is live until the handler
     * takes it), so the owner can count what a body holds by what has
     * arrived rather than by what its head announced. May be NULL. */
    void (*progress)(void *arg, coord_guard_ticket *t, uint64_t arrived);
} coord_guard_caps;

/* What coord_guard_parse_head found in one complete head. */
typedef struct coord_guard_head {
    coord_guard_verdict verdict;
    uint64_t body_len;  /* announced Content-Length (0 when absent) */
    int has_marker;     /* the client sent a header named like the marker (or a
                            ticket header) */
    size_t reqline_len; /* length of a valid request line (without EOL), else 0 */
} coord_guard_head;

/* Analyses a complete head: len bytes ending with the empty line that
 * closes it (lines end in LF with an optional CR before it, as libevent
 * reads them). Pure; never reads past len. */
void coord_guard_parse_head(const uint8_t *head, size_t len, const coord_guard_caps *caps,
                            coord_guard_head *out);

typedef enum {
    COORD_GUARD_IN_HEAD = 0,
    COORD_GUARD_IN_BODY,
    COORD_GUARD_DISCARD
} coord_guard_state;

/* Per-connection state. Owned by whoever created it; coord_guard_free
 * releases its buffers. */
typedef struct coord_guard {
    size_t head_cap;
    coord_guard_caps caps; /* large_paths is borrowed: it must outlive g */
    coord_guard_state state;
    uint64_t body_left; /* body bytes of the current request still to pass */
    size_t line_start;  /* offset in head of the line being read */
    vl_buf head;        /* the current head so far (at most head_cap bytes) */
    vl_buf out;         /* scratch for rewritten heads */
    uint64_t requests;  /* heads completed on this connection */
    coord_guard_verdict last_verdict;
    double created;                 /* when the connection was set up (caps.clock) */
    double head_started;            /* when the first byte of the current head came */
    double body_deadline;           /* when the current body must have arrived */
    uint64_t body_len;              /* the current body's announced length */
    double body_started;            /* when its head was accepted */
    double window_start;            /* the body-rate window in progress (caps.body_window_s) */
    uint64_t window_bytes;          /* body bytes passed when that window began */
    coord_guard_ticket *body_owner; /* the ticket of the body arriving (caps.progress) */
    /* The owner's own bookkeeping of the connection, never touched by the
     * guard: its client's address key (addr_len 0: not looked up yet) and
     * since when it has had no request in progress. */
    uint8_t addr[24];
    uint8_t addr_len;
    double idle_since;
    /* Called from the bufferevent's free path before the guard is freed,
     * so an owner can drop its reference; may be NULL. */
    void *owner;
    struct coord_guard *prev, *next; /* for the owner's list */
    /* Attachment to a connection (coord_guard_attach). */
    struct bufferevent *bev;
    /* After a refusal: a duplicate of the socket, so that the owner can
     * keep draining what the client still sends once libevent has closed
     * its descriptor (a close with unread data would reset the connection
     * and could destroy the answer before the client reads it). -1 if
     * none; whoever takes it over sets it back to -1. */
    int linger_fd;
    struct evbuffer *input;
    struct evbuffer *scratch;
    struct evbuffer_cb_entry *hook;
    int in_callback;
    /* With caps.authorize: the tickets of accepted requests, indexed by
     * seq % COORD_GUARD_TICKETS, the one whose body is arriving, the body
     * hash in progress, and the refusal of the last refused head. */
    coord_guard_ticket tickets[COORD_GUARD_TICKETS];
    coord_guard_ticket *body_ticket;
    crypto_digest *digest;
    coord_guard_refusal refusal;
} coord_guard;

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
