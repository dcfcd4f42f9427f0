/*
 * guard_types: the input guard's types (guard.h has its functions and
 * what it does): its verdicts, the ticket of an accepted head, the
 * owner's hooks and caps, and the per-connection state.
 *
 * Contents: coord_guard_verdict, coord_guard_digest_state,
 * coord_guard_ticket, coord_guard_refusal, coord_guard_authorize_fn,
 * coord_guard_caps, coord_guard_head, coord_guard_state, coord_guard,
 * COORD_GUARD_HEADER, COORD_GUARD_TICKET_HEADER, COORD_GUARD_TICKETS.
 */
#ifndef VOLLEY_COORD_GUARD_TYPES_H
#define VOLLEY_COORD_GUARD_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "crypto/crypto.h"

struct bufferevent;
struct evbuffer;
struct evbuffer_cb_entry;
struct coord_guard;

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
    uint8_t join_pk[VCRYPTO_PK_BYTES];
    vcrypto_digest_want want; /* want.alg 0: no digest to check */
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
    vcrypto_digest *digest;
    coord_guard_refusal refusal;
} coord_guard;

#endif
