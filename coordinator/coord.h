/*
 * coord.h: the coordinator's types, apart from its functions (which each
 * folder's header declares). It serves the HTTP API of docs/protocol.md
 * over TLS on one libevent loop, hands out task leases, takes in updates,
 * and merges them into new model versions, keeping every durable fact in
 * storage/. Any layer may include this header; it includes only the
 * configuration, base/ and other types headers (*_types.h).
 *
 * Everything but database writes runs on the loop's thread. Reads use the
 * loop's own connection; every write is a job for the writer thread
 * (run/writer.h), and a request that writes is answered when its job has
 * committed. Task requests that long-poll wait in a list and are answered
 * when a lease frees, a version is made, their wait ends, or the
 * coordinator drains.
 *
 * Contents: limits of the protocol; the corpus and the token shards; shared
 * model bytes (coord_blob); the server (coord_server) and its parts; a
 * request as a handler sees it (coord_req, coord_handler); a lease on its
 * way to the database (coord_lease); a full disk (coord_disk).
 */
#ifndef VOLLEY_COORD_H
#define VOLLEY_COORD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <event2/util.h>
#include <jansson.h>

#include "common/common.h"
#include "compress/compress.h"
#include "coordinator/base/counters.h"
#include "coordinator/base/limiter.h"
#include "coordinator/config/config.h"
#include "coordinator/conn/guard_types.h"
#include "coordinator/conn/limits_types.h"
#include "coordinator/run/model_types.h"
#include "crypto/crypto.h"
#include "model/model.h"
#include "storage/storage.h"

struct event_base;
struct event;
struct evhttp;
struct evhttp_request;
struct evhttp_bound_socket;
struct evhttp_connection;
struct evbuffer;
struct ssl_ctx_st;

/* Longest a task request may wait, seconds (protocol.md). */
#define COORD_MAX_WAIT_S 60
/* Largest JSON request body (join). */
#define COORD_MAX_JSON_BODY 65536
/* Refusals in a row past which the outer step stops shrinking. */
#define COORD_MAX_BACKOFF 6
/* Largest request head the guard accepts. */
#define COORD_HEAD_CAP 16384
/* Every method libevent parses (event2/http.h), let through to a
 * listener's handler so that a wrong one gets a JSON 405 from volley
 * rather than libevent's own HTML 501. */
#define COORD_HTTP_ALL_METHODS                                                                 \
    (EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | \
     EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH)
/* Read/write inactivity timeout of a connection; above the longest wait. */
#define COORD_IO_TIMEOUT_S 120
/* How long a drain may take before the coordinator exits anyway. */
#define COORD_DRAIN_GRACE_S 30
/* Retry-After for 503 draining and for 429 when the replay cache is full. */
#define COORD_RETRY_AFTER_S "5"

/* What a request helper returns when it has answered the request itself
 * (an error sent, or a wait begun): its caller returns at once without
 * answering again. Negative, beside vl_error's codes and apart from them,
 * as nginx's NGX_DONE is beside NGX_ERROR. */
#define COORD_ANSWERED (-100)

/* ---- the corpus (corpus.c) ---------------------------------------------- */

typedef struct coord_corpus {
    int is_open;
    int fd;
    int64_t size;
    int64_t train_len; /* bytes [0, train_len) are served */
    int64_t val_len;   /* bytes [train_len, size) are the validation slice */
    uint8_t *val;      /* the validation slice, in memory */
    char hash[65];     /* hex BLAKE2b-256 of the whole file */
    int64_t mtime_ns;
    uint64_t ino;
} coord_corpus;

/* ---- token shards (shards.c) -------------------------------------------- */

/* One training shard, served from disk. */
typedef struct coord_shard {
    int fd;
    int64_t size; /* bytes: 1024 + 2 ntok */
    int64_t mtime_ns;
} coord_shard;

/* The llm.c token shards of a shard run: the training shards, open for
 * serving ranges of them, and the start of the validation shard in memory
 * (as many tokens as val_batches batches of block_size windows use). */
typedef struct coord_shards {
    int n;              /* training shards */
    coord_shard *train; /* n of them */
    /* Tokens of each training shard. Never changes once open, so the
     * writer thread reads it (issuing tasks) while the loop serves. */
    int64_t *ntok;
    int64_t train_tokens;
    int64_t val_tokens; /* tokens in the validation shard */
    uint16_t *val;      /* its first val_len tokens */
    size_t val_len;
    int64_t size;  /* bytes of every shard file, validation included */
    char hash[65]; /* hex BLAKE2b-256 of those files, in order */
} coord_shards;

/* ---- shared model bytes -------------------------------------------------- */

/* An immutable byte string shared by responses still being sent; freed
 * when the last reference goes. */
typedef struct coord_blob {
    int refs;
    size_t len;
    uint8_t *data;
    int64_t version;
} coord_blob;

/* ---- a full disk ---------------------------------------------------------- */

/* What the coordinator knows of its disk filling up. While the writer
 * finds the disk full, merges back off (first_s, doubling up to max_s;
 * 5 and 60 s unless a test shortens them), uploads get 503 unavailable,
 * and the log has one line when it fills and one when it has room again;
 * updates acknowledged before stay stored and are merged once it has. */
typedef struct coord_disk {
    int full;              /* reported full, not yet found room again */
    double since;          /* when it was found full (monotonic seconds) */
    int64_t reports;       /* full disks reported since start */
    int64_t retries;       /* merges tried while full, since start */
    double retry_s;        /* the delay of the next merge retry while full */
    double first_s, max_s; /* the backoff's first and largest delays */
} coord_disk;

struct coord_req;
/* The handler of a route (bound by the server, called by the dispatcher). */
typedef void (*coord_handler)(struct coord_req *cr);

/* ---- the server ---------------------------------------------------------- */

typedef struct coord_waiter coord_waiter;

/* A lease on its way to the database (sched/lease.c). */
typedef struct coord_issuing {
    int64_t peer_id;
    int64_t version; /* its base version */
    uint64_t seq;    /* its job's submission number (coord_writer_submit); UINT64_MAX
                       * while the job is not submitted yet */
} coord_issuing;

/* One peer's pace, for dynamic local steps (speed.c). */
typedef struct coord_speed {
    int64_t peer_id;
    int64_t task_id;  /* its newest lease, and */
    int64_t steps;    /* the local steps that lease got */
    double leased_at; /* monotonic s; 0 once that lease's update is timed */
    /* The lease before it: a peer that overlaps its uploads
     * (GET /v1/task?uploading=) takes its next lease while the last
     * one's update is still on its way, and that update is timed too. */
    int64_t prev_task_id, prev_steps;
    double prev_leased_at;
    double sec_per_step; /* running average; 0 until the first update */
    /* Running average of a task's seconds besides training (the peer
     * reports its training time with the update; 0 when it does not). */
    double overhead_s;
    double seen; /* monotonic s of the last lease or timing */
    /* lease_wait: the task whose update the peer's next lease waits to
     * see merged, and since when (monotonic s). */
    int64_t wait_task;
    double wait_since;
} coord_speed;

/* coord_server's parts, one per job, so that a reader sees which layer
 * owns a field: the connections (conn/), the run (run/), the scheduling
 * (sched/), the caches of what is served (run/blob.c, ops/status.c) and
 * the operator's side (ops/). */

/* What the connections hold: listeners, TLS, the guards, the caps and
 * budgets, the nonces (conn/). */
typedef struct coord_srv_conns {
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    struct ssl_ctx_st *ssl;
    /* Where the certificate chain and key are read from, again on SIGHUP
     * (tls.c). */
    char cert_path[COORD_PATH_MAX], key_path[COORD_PATH_MAX];
    vcrypto_nonce_cache *nonces;
    struct coord_nonce_log *nonce_log; /* the nonces, journalled across restarts */
    coord_limits limits;
    coord_limiter *addr_limiter, *peer_limiter;
    coord_limiter *split_limiter; /* a split run's batch routes; NULL elsewhere */
    coord_guard *guards;          /* one per open connection */
    /* Connections under pressure (conns.c). */
    struct event *accept_timer;          /* resumes accepting after a pause */
    int64_t accept_errors, conns_closed; /* since the last log line about them */
    double accept_logged, conns_logged;
    double pressure_until; /* descriptors ran short: idle connections go sooner */
    /* Signed bodies being received: their bytes, and their peers (one body
     * at a time per peer). */
    int64_t body_inflight;
    int64_t *receiving_peers;
    size_t n_receiving, cap_receiving;
    size_t n_conns;
    int64_t inflight;             /* requests handed to a handler and not yet fully answered */
    struct coord_linger *lingers; /* refused connections being drained */
} coord_srv_conns;

/* The run: its configuration, data, model, versions, scores and the
 * threads that change them (run/). */
typedef struct coord_srv_run {
    storage *db;
    char db_path[COORD_PATH_MAX];
    struct coord_writer *writer; /* runs every write (group commit) */
    coord_config cfg;
    char *peer_config;   /* run configuration as peers get it (JSON text) */
    coord_corpus corpus; /* text runs */
    coord_shards shards; /* token-shard runs */
    coord_testset test;  /* a classifier run's held-out images (may be empty) */
    coord_model net;     /* its parameters are the current version's */
    size_t n_params;
    float *momentum;    /* outer optimiser state after the current version (n_state) */
    size_t n_state;     /* coord_state_size() of the run */
    compress_spec spec; /* what uploads must look like */
    int64_t version;
    /* When the current version was made, on vl_clock_mono_s()'s clock (its
     * age decides a sync deadline). */
    double version_born;
    int64_t plain_versions; /* async versions stepped without momentum */
    int finished;
    double val_loss;      /* the current version's (NaN when unknown) */
    double val_accuracy;  /* a classifier's on the test set (NaN when unknown) */
    double best_val_loss; /* the lowest of any version's (NaN when unknown) */
    /* A run with val_check_batches > 0 (score.h): val_loss is the latest
     * scored version's, val_loss_version; the best check loss since the
     * start is what a version's check is held against. */
    int64_t val_loss_version;
    double best_check_loss;
    int score_busy;                        /* a version is with the background thread */
    struct coord_score_job *score_waiting; /* the version to score next (score.c) */
    /* Versions refused in a row just now: each halves the next outer step,
     * down to 1 / 2^COORD_MAX_BACKOFF (counted from 0 after a restart). */
    int refused_streak;
    /* robust.max_norm "auto": the bound derived from the first versions
     * (coord_norm_bound_refresh), 0 until they exist. Written by the loop,
     * read by the compute thread too. */
    _Atomic double norm_bound;
    /* The updates of the versions it is being learnt from (bound.c):
     * only merges, one at a time, touch it. */
    struct coord_bound_window *bound_window;
    coord_model eval;          /* scratch model that validates a version before it is made */
    coord_model scorer;        /* the background thread's, for full scores (score.c) */
    struct coord_split *split; /* split runs: the coordinator's layers (split.h) */
    int compute_threads;       /* coord_serve_opts.compute_threads (0: OpenMP's default) */
    /* K-FAC runs that share factors: the layers every factor file must
     * have, and the newest version with merged factors (-1: none yet). */
    compress_factor_layer *factor_layers;
    int n_factor_layers;
    int64_t factors_version;
    /* VOLLEY_ACK_CHECK=1 (the tests): before each 202, the upload's row
     * must be visible to this thread's own database connection, a second
     * one beside the writer's, or the process aborts. */
    int ack_check;
} coord_srv_run;

/* When things happen: leases on their way, waiting peers, paces, the
 * timers of merges, rounds and expiries, and what is with the writer
 * (sched/). */
typedef struct coord_srv_sched {
    coord_speed *speeds; /* async runs */
    size_t n_speeds, cap_speeds;
    coord_waiter *waiters, *waiters_tail;
    size_t n_waiters;
    struct event *lease_timer;
    struct event *wait_timer;  /* wakes the waiters when a lease_wait ends */
    struct event *round_timer; /* merges when an open second round's deadline comes */
    struct event *merge_event;
    int merge_scheduled;
    /* Leases handed to the writer whose done callback has not run yet
     * (some may be committed already), and each one's peer, version and
     * job (cap_issuing entries). */
    int64_t issuing;
    coord_issuing *issuing_leases;
    size_t cap_issuing;
    int expiring;      /* a lease expiry is with the writer */
    int merging;       /* a version is with the writer */
    int opening_round; /* a second round's candidates are with the writer */
    coord_disk disk;   /* a full disk and the merges' backoff (schedule.h) */
} coord_srv_sched;

/* What is served again and again, kept built (run/blob.c, ops/status.c). */
typedef struct coord_srv_caches {
    coord_blob *model_blob;   /* current version as safetensors, built on demand */
    coord_blob *delta_blob;   /* the last delta served (its since and version below) */
    coord_blob *old_blob;     /* the last old version served whole, shared by its readers */
    coord_blob *factors_blob; /* factors_version's factor file, built on first request */
    int64_t digest_version;   /* the version digest_hex is the SHA-256 of (-1: none) */
    char digest_hex[65];
    int64_t delta_since, delta_version;
    json_t *status_cache; /* the last GET /v1/status answer, and when it was made */
    double status_at;
} coord_srv_caches;

/* The operator's side: counters and the admin listener (ops/). */
typedef struct coord_srv_ops {
    coord_metrics metrics;                   /* base/counters.c */
    struct evhttp *admin_http;               /* the admin listener; NULL when off */
    struct evhttp_bound_socket *admin_bound; /* its socket */
    struct bufferevent *admin_bevs[2 * COORD_ADMIN_CONNS_MAX]; /* its connections */
    size_t n_admin;
    char admin_token[160]; /* its bearer token; "" for none */
} coord_srv_ops;

/* The server: the event loop, the handlers and the drain, and its parts. */
typedef struct coord_server {
    struct event_base *base;
    /* Each route's handler, indexed by coord_route_id (base/routes.h). */
    const coord_handler *handlers;
    int draining;
    double drain_deadline;
    struct event *drain_timer;
    struct event *sig_term, *sig_int, *sig_hup;
    /* The housekeeping tick (server.c's serve_cron), and how many times
     * it has run: what runs at a longer period counts its ticks. */
    struct event *cron;
    uint64_t cron_loops;
    coord_srv_conns conns;
    coord_srv_run run;
    coord_srv_sched sched;
    coord_srv_caches caches;
    coord_srv_ops ops;
} coord_server;

/* One request as a handler sees it. */
typedef struct coord_req {
    coord_server *srv;
    struct evhttp_request *req;
    double t0;
    char method[12];
    char path[160];            /* for the log, possibly truncated */
    const char *full_path;     /* the request's path, valid while the request lives */
    int64_t peer_id;           /* the authenticated peer, 0 before auth */
    coord_guard_ticket ticket; /* what the guard found on the head and body */
    /* GET /v1/task?uploading=T: the peer's update of its lease T is on
     * its way, so its next lease is past T (async runs; 0: none). */
    int64_t uploading;
    /* The error code of a refusal being sent (coord_reply_error), for
     * the metrics; NULL otherwise. */
    const char *err_code;
} coord_req;

/* A new lease prepared on the loop and written by the writer, on its own
 * (GET /v1/task) or in the job of the upload that finished the peer's
 * previous task (POST /v1/updates?next=1), which saves the peer a round
 * trip and the coordinator a request and a commit per task. */
typedef struct coord_lease {
    storage_task t; /* id, data range and seed are filled in by the writer */
    uint64_t run_seed;
    int64_t train_len, task_bytes;
    /* Shard runs: the shards' token counts (immutable, owned by the
     * server, which outlives the writer) and the tokens per task. */
    const int64_t *ntok;
    int n_shards;
    int64_t task_tokens;
    int reissued; /* t took over the data of an expired task */
    int local;    /* the peers keep the data: a task has no range */
} coord_lease;

#endif
