/*
 * limits_types: what a client may send and hold (the serve options'
 * limits, limits.h has their defaults and the connection rules), and the
 * constants those defaults are made of.
 *
 * Contents: coord_limits.
 */
#ifndef VOLLEY_COORD_LIMITS_TYPES_H
#define VOLLEY_COORD_LIMITS_TYPES_H

#include <stdint.h>

#include "coordinator/base/limiter.h"

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

#endif
