/*
 * metrics: what an operator's Prometheus scrapes. Counters kept on the
 * event loop as requests are answered and versions are made
 * (base/counters.h), gauges read
 * when /metrics is asked for (the database's histograms, peers by state,
 * file sizes, the writer thread's counters), all written in the
 * Prometheus text exposition format. They are served on the admin
 * listener (serve --admin-listen), never on the public port: per-peer
 * figures and sizes are the operator's. The same listener serves the
 * dashboard (dashboard.h), which reads these counters too.
 *
 * Contents: coord_metrics_write, coord_admin_start.
 */
#ifndef VOLLEY_COORD_METRICS_H
#define VOLLEY_COORD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "coordinator/base/counters.h"
#include "coordinator/coord.h"

struct coord_server;
struct evbuffer;
struct evhttp_request;


/* Appends every metric to b in the Prometheus text format; reads the
 * database for histograms and peers. 0 or a VL_E* code with err set. */
int coord_metrics_write(struct coord_server *srv, struct evbuffer *b, vl_error *err) VL_MUST_CHECK;
/* Serves /metrics, and the dashboard at / and /dashboard.json
 * (dashboard.h), in plain HTTP on fd, a socket listening on host
 * (coord_listen_bind; the log names its port), requiring srv->ops.admin_token
 * on every path when it is set: as a bearer token, or as the password of
 * HTTP Basic authentication, which is what a browser can be asked for.
 * fd is libevent's from the call on, closed on failure too. */
int coord_admin_start(struct coord_server *srv, const char *host, int fd,
                      vl_error *err) VL_MUST_CHECK;

#endif
