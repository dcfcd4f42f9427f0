/*
 * counters: counting on the event loop, as requests are answered and
 * versions are made. Plain arithmetic on coord_metrics, no I/O: the
 * replies count their answers, the merge its versions, and the admin
 * listener (ops/) reads the figures.
 *
 * Contents: coord_metrics_peer, coord_metrics_minute,
 * coord_metrics_refusal, coord_metrics, coord_metrics_request,
 * coord_metrics_upload, coord_metrics_answer, coord_metrics_peer_find,
 * coord_metrics_version.
 */
#ifndef VOLLEY_COORD_COUNTERS_H
#define VOLLEY_COORD_COUNTERS_H

#include <stddef.h>
#include <stdint.h>

/* Requests are counted per route (the route table's paths, then one for
 * anything else) and per status class (1xx to 5xx). */
#define COORD_METRICS_ROUTES 16 /* > COORD_ROUTE_COUNT (base/routes.h) */
/* Distinct refusal codes counted for uploads; later ones share "other". */
#define COORD_METRICS_CODES 32
/* Upper bounds (seconds) of the version-making time histogram's buckets. */
#define COORD_METRICS_MERGE_BUCKETS 10
/* What the dashboard follows besides (dashboard.h): per peer, the address
 * of its last request and its refused uploads, for this many peers (when
 * full, the one heard from longest ago makes room); the last
 * COORD_METRICS_MINUTES minutes of uploads; the last COORD_METRICS_RECENT
 * refused requests. All of it starts empty when the coordinator does. */
#define COORD_METRICS_PEERS 1024
#define COORD_METRICS_MINUTES 60
#define COORD_METRICS_RECENT 32
/* Room for an IPv6 address as text (INET6_ADDRSTRLEN is 46). */
#define COORD_METRICS_ADDR 48

typedef struct coord_metrics_peer {
    int64_t id;
    int64_t seen;     /* unix s of its last answered request */
    uint64_t refused; /* its uploads refused */
    char addr[COORD_METRICS_ADDR];
} coord_metrics_peer;

/* Uploads answered in one minute; bytes are their request bodies. */
typedef struct coord_metrics_minute {
    int64_t minute; /* unix s / 60 */
    uint64_t accepted, refused, bytes;
} coord_metrics_minute;

/* A request answered with status 400 or above. */
typedef struct coord_metrics_refusal {
    int64_t at;      /* unix s */
    int64_t peer_id; /* 0: not authenticated */
    int route, status;
    char code[32]; /* "" for a status without a code */
    char addr[COORD_METRICS_ADDR];
} coord_metrics_refusal;

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
    coord_metrics_peer peers[COORD_METRICS_PEERS]; /* n_peers of them, by id */
    size_t n_peers;
    coord_metrics_minute minutes[COORD_METRICS_MINUTES]; /* at minute % COORD_METRICS_MINUTES */
    /* Refusals noted so far; the newest is at (n_recent - 1) %
     * COORD_METRICS_RECENT. */
    coord_metrics_refusal recent[COORD_METRICS_RECENT];
    uint64_t n_recent;
} coord_metrics;

/* Upper bounds (seconds) of the version-making time histogram's buckets. */
extern const double coord_metrics_merge_le[COORD_METRICS_MERGE_BUCKETS];

/* Counts one answered request: route is the index from the route table
 * (COORD_METRICS_ROUTES - 1 for any other path), status its HTTP status,
 * in and out the body bytes received and sent. */
void coord_metrics_request(coord_metrics *m, int route, int status, size_t in, size_t out);
/* Counts an upload's answer: 2xx accepted, else refused under code
 * (NULL or "" for a status without a code). */
void coord_metrics_upload(coord_metrics *m, int status, const char *code);
/* Notes what the dashboard shows of an answer at unix time now: route and
 * status as for coord_metrics_request, code the refusal's error code
 * (NULL or "" for none), peer_id the authenticated peer (0: none), addr
 * the client's address (NULL: unknown), in the request body's bytes. */
void coord_metrics_answer(coord_metrics *m, int route, int status, const char *code,
                          int64_t peer_id, const char *addr, size_t in, int64_t now);
/* The peer's entry, NULL when it made no request since start (or was
 * pushed out of the table). */
const coord_metrics_peer *coord_metrics_peer_find(const coord_metrics *m, int64_t peer_id);
/* Counts a version made in seconds, with its mean training loss. */
void coord_metrics_version(coord_metrics *m, double seconds, double train_loss);

#endif
