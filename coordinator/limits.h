/*
 * limits: what a client may send and hold (the serve options' limits and
 * their defaults), and the connection rules of conns.c that apply them
 * to the listeners: idle connections per address and in time, bodies
 * over the budget, the admin listener's share of the descriptors, and
 * the pause when accept() runs out of them.
 */
#ifndef VOLLEY_COORD_LIMITS_H
#define VOLLEY_COORD_LIMITS_H

#include <stdint.h>

#include "common/common.h"
#include "coordinator/config.h"
#include "coordinator/limiter.h"

struct coord_server;
struct evhttp_bound_socket;

/* Limits against clients that send too much or too slowly (serve
 * options). A rate with rate <= 0, or slow_timeout_s <= 0, is off. */
typedef struct coord_limits {
    coord_rate peer; /* requests per authenticated peer */
    /* A split run's batch requests (/v1/split/...) per peer, counted here
     * instead of against peer; rate < 0: from the run's split settings
     * (coord_limits_split_rate). */
    coord_rate split;
    coord_rate addr;       /* requests per client address (IPv6: per /64) */
    double slow_timeout_s; /* a head within this; a body within this + len / min_body_rate */
    double min_body_rate;  /* bytes per second */
    int64_t body_budget;   /* bytes of signed request bodies being received at once */
    /* Connections (conns.c): at most max_conns in all (0: from the
     * descriptor limit), at most conn_per_addr that have sent no request
     * per address (IPv6 /64), and idle_first_s for a connection to send
     * its first request head (a tenth of it under pressure). */
    int64_t max_conns;
    int64_t conn_per_addr;
    double idle_first_s;
    double idle_keepalive_s; /* a kept-alive connection with no request in progress */
    /* Bytes that built downloads (model files of old versions, deltas,
     * rounds, factors) may hold at once, shared copies counted once (0:
     * COORD_DOWNLOAD_BUDGET_MODELS model files, at least 256 MiB). */
    int64_t download_budget;
} coord_limits;

/* The defaults, far above what a peer does (a task is a handful of
 * requests): 50 requests/s per peer with bursts of 500, 500/s per address
 * with bursts of 5000, 30 s for a head, bodies at 16 KiB/s at least, and
 * 256 MiB of bodies being received at once (COORD_BODY_BUDGET_DEFAULT). */
#define COORD_BODY_BUDGET_DEFAULT ((int64_t)256 << 20)
/* What a signed body reserves of the budget when its head is accepted;
 * from there on it holds what has arrived of it. */
#define COORD_BODY_ADVANCE ((int64_t)1 << 20)
/* A body must deliver min_body_rate over each window this long. */
#define COORD_BODY_WINDOW_S 10.0
/* A kept-alive connection with no request in progress is closed after
 * this long (a tenth under descriptor pressure). */
#define COORD_IDLE_KEEPALIVE_S_DEFAULT 30.0
/* Connections the admin listener holds at once. */
#define COORD_ADMIN_CONNS_MAX 16
#define COORD_CONN_PER_ADDR_DEFAULT 64
#define COORD_DOWNLOAD_BUDGET_MODELS 8
#define COORD_IDLE_FIRST_S_DEFAULT 10.0
void coord_limits_default(coord_limits *l);
/* The shortest round trip of a split batch the default split rate admits
 * at full speed: split.in_flight x (1, or 2 U-shaped) / this requests a
 * second per peer. */
#define COORD_SPLIT_RTT_MIN_S 0.004
/* The split batch routes' rate for a run of cfg: asked when its rate is
 * >= 0 (serve --split-rate), else derived from split.in_flight and
 * split.u_shape, never below peer (rates.c). Not a split run: peer. */
coord_rate coord_limits_split_rate(const coord_config *cfg, coord_rate peer, coord_rate asked);

/* ---- connections (conns.c) ------------------------------------------------- */

/* Raises the soft descriptor limit to the hard one; returns the limit. */
int64_t coord_conns_raise_limit(void);
/* The total connection cap for a descriptor limit (some kept in reserve). */
int64_t coord_conns_default_max(int64_t fd_limit);
/* Pauses accepting, with one log line per interval, when accept() fails
 * for want of descriptors. Call once srv->bound exists. 0 or VL_E*. */
int coord_conns_listen(struct coord_server *srv, vl_error *err) VL_MUST_CHECK;
/* Closes idle connections that waited too long or beyond their address's
 * share, cuts off the slowest bodies while bodies hold more than the
 * budget, counts the admin listener's connections, and holds new
 * connections back at the caps. Called from the server's periodic tick. */
void coord_conns_tick(struct coord_server *srv, double now);
/* Puts the admin listener (bound: its socket on srv->admin_http) under
 * the same rules: its own cap of COORD_ADMIN_CONNS_MAX connections,
 * counted against max_conns, and the pause when accept() runs out of
 * descriptors. Returns 0 or VL_EIO/VL_ENOMEM. */
int coord_conns_admin(struct coord_server *srv, struct evhttp_bound_socket *bound,
                      vl_error *err) VL_MUST_CHECK;
/* Releases what coord_conns_listen and coord_conns_admin set up; call
 * after the listeners' evhttp objects are freed. */
void coord_conns_close(struct coord_server *srv);

#endif
