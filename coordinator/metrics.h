/*
 * metrics: what an operator's Prometheus scrapes. Counters kept on the
 * event loop as requests are answered and versions are made, gauges read
 * when /metrics is asked for (the database's histograms, peers by state,
 * file sizes), all written in the Prometheus text exposition format.
 * They are served on the admin listener (serve --admin-listen), never on
 * the public port: per-peer figures and sizes are the operator's.
 */
#ifndef VOLLEY_COORD_METRICS_H
#define VOLLEY_COORD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

struct coord_server;
struct evbuffer;

/* Requests are counted per route (the route table's paths, then one for
 * anything else) and per status class (1xx to 5xx). */
#define COORD_METRICS_ROUTES 16
/* Distinct refusal codes counted for uploads; later ones share "other". */
#define COORD_METRICS_CODES 32
/* Upper bounds (seconds) of the version-making time histogram's buckets. */
#define COORD_METRICS_MERGE_BUCKETS 10

typedef struct coord_metrics {
    uint64_t requests[COORD_METRICS_ROUTES][5];
    uint64_t bytes_in[COORD_METRICS_ROUTES], bytes_out[COORD_METRICS_ROUTES];
    uint64_t uploads_accepted;
    struct {
        char code[32];
        uint64_t n;
    } refused[COORD_METRICS_CODES];
    size_t n_refused;
    uint64_t merge_buckets[COORD_METRICS_MERGE_BUCKETS]; /* not cumulative */
    uint64_t merge_count;
    double merge_sum;
    double train_loss; /* the last version's mean training loss (NaN: none yet) */
} coord_metrics;

/* Counts one answered request: route is the index from the route table
 * (COORD_METRICS_ROUTES - 1 for any other path), status its HTTP status,
 * in and out the body bytes received and sent. */
void coord_metrics_request(coord_metrics *m, int route, int status, size_t in, size_t out);
/* Counts an upload's answer: 2xx accepted, else refused under code
 * (NULL or "" for a status without a code). */
void coord_metrics_upload(coord_metrics *m, int status, const char *code);
/* Counts a version made in seconds, with its mean training loss. */
void coord_metrics_version(coord_metrics *m, double seconds, double train_loss);

/* The route table's index of path (0 .. COORD_METRICS_ROUTES - 2), or
 * COORD_METRICS_ROUTES - 1 for a path no route serves (server.c). */
int coord_route_index(const char *path);
/* The route path for index i, "other" for the last. */
const char *coord_route_label(int i);
/* The local port a listening socket is bound to; -1 when unknown. */
int coord_bound_port(int fd);
/* Appends every metric to b in the Prometheus text format; reads the
 * database for histograms and peers. 0 or a VL_E* code with err set. */
int coord_metrics_write(struct coord_server *srv, struct evbuffer *b,
                        vl_error *err) VL_MUST_CHECK;
/* Serves /metrics in plain HTTP on host:port (port 0: any; the log names
 * it), requiring srv->admin_token as a bearer token when it is set.
 * VL_EIO when the address cannot be bound. */
int coord_admin_start(struct coord_server *srv, const char *host, int port,
                      vl_error *err) VL_MUST_CHECK;

#endif
