/*
 * limits: what a client may send and hold (the serve options' limits and
 * their defaults), and the connection rules of conns.c that apply them
 * to the listeners: idle connections per address and in time, bodies
 * over the budget, the admin listener's share of the descriptors, and
 * the pause when accept() runs out of them.
 *
 * Contents: coord_limits_default, coord_limits_split_rate,
 * coord_conns_raise_limit, coord_conns_default_max, coord_conns_listen,
 * coord_conns_tick, coord_conns_admin, coord_conns_close,
 * COORD_SPLIT_RTT_MIN_S.
 */
#ifndef VOLLEY_COORD_LIMITS_H
#define VOLLEY_COORD_LIMITS_H

#include <stdint.h>

#include "common/common.h"
#include "coordinator/config/config.h"
#include "coordinator/conn/limits_types.h"
#include "coordinator/base/limiter.h"
#include "coordinator/coord.h"

struct coord_server;
struct evhttp_bound_socket;

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
 * for want of descriptors. Call once srv->conns.bound exists. 0 or VL_E*. */
int coord_conns_listen(struct coord_server *srv, vl_error *err) VL_MUST_CHECK;
/* Closes idle connections that waited too long or beyond their address's
 * share, cuts off the slowest bodies while bodies hold more than the
 * budget, counts the admin listener's connections, and holds new
 * connections back at the caps. Called from the server's periodic tick. */
void coord_conns_tick(struct coord_server *srv, double now);
/* Puts the admin listener (bound: its socket on srv->ops.admin_http) under
 * the same rules: its own cap of COORD_ADMIN_CONNS_MAX connections,
 * counted against max_conns, and the pause when accept() runs out of
 * descriptors. Returns 0 or VL_EIO/VL_ENOMEM. */
int coord_conns_admin(struct coord_server *srv, struct evhttp_bound_socket *bound,
                      vl_error *err) VL_MUST_CHECK;
/* Releases what coord_conns_listen and coord_conns_admin set up; call
 * after the listeners' evhttp objects are freed. */
void coord_conns_close(struct coord_server *srv);

#endif
