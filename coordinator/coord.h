/*
 * coordinator: the volley-coordinator program. It serves the HTTP API of
 * docs/protocol.md over TLS on one libevent loop, hands out task leases,
 * takes in updates, and merges them into new model versions, keeping every
 * durable fact in storage/. This header joins the program's files; the pure
 * parts (config.h, guard.h, scheduler.h, aggregator.h) have their own, and
 * schedule.h (timers, the waiting requests) and limits.h (what clients
 * may hold, the connection rules) are included here.
 *
 * Everything but database writes runs on the loop's thread. Reads use the
 * loop's own connection; every write is a job for the writer thread
 * (writer.h), and a request that writes is answered when its job has
 * committed. Task requests that long-poll wait in a list and are answered
 * when a lease frees, a version is made, their wait ends, or the
 * coordinator drains.
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
#include "coordinator/config.h"
#include "coordinator/net.h"
#include "coordinator/guard.h"
#include "coordinator/limiter.h"
#include "coordinator/limits.h"
#include "coordinator/schedule.h"
#include "coordinator/writer.h"
#include "coordinator/metrics.h"
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

/* Opens the corpus at path, hashing it and loading its validation slice
 * (split per cfg). With expect_hash set, a size or hash that differs is
 * VL_ECONFLICT ("the corpus changed since init"). c is owned by the caller
 * (coord_corpus_close). */
int coord_corpus_open(coord_corpus *c, const char *path, const coord_config *cfg,
                      int64_t expect_size, const char *expect_hash, vl_error *err) VL_MUST_CHECK;
/* Checks the open file still has the size and modification time it had
 * when opened (it is served straight from disk). */
int coord_corpus_check(const coord_corpus *c, vl_error *err) VL_MUST_CHECK;
void coord_corpus_close(coord_corpus *c);

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

/* Opens and validates every shard cfg names (model_shard_open: header,
 * size, every token below model.vocab_size), each at least block_size + 1
 * tokens long, hashes them (training shards in order, then validation)
 * and loads the validation tokens. The first bad shard fails it with the
 * shard's own one-line message ("token shard PATH: ..."). With
 * expect_hash set, a total size or hash that differs from the recorded
 * one is VL_ECONFLICT ("changed since init"). s is owned by the caller
 * (coord_shards_close), and is empty after a failure. */
int coord_shards_open(coord_shards *s, const coord_config *cfg, int64_t expect_size,
                      const char *expect_hash, vl_error *err) VL_MUST_CHECK;
/* Checks training shard i still has the size and modification time it
 * had when opened (it is served straight from disk). */
int coord_shards_check(const coord_shards *s, int i, vl_error *err) VL_MUST_CHECK;
void coord_shards_close(coord_shards *s);

/* The validation loss of m on the run's held-out data: the text corpus's
 * validation slice or the validation shard's tokens, the first batches
 * batches of COORD_VAL_BATCH windows of block_size tokens (0: every
 * window; val_batches for the full score, val_check_batches for the
 * check). Reads only what is fixed once the run is open, so the compute
 * and background threads may call it, each with its own m. */
int coord_val_loss(const coord_config *cfg, const coord_corpus *corpus, const coord_shards *shards,
                   model_gpt *m, int64_t batches, float *loss, vl_error *err) VL_MUST_CHECK;

/* The held-out tokens (bytes of a text run) coord_val_loss scores for
 * batches (0: every window): batches of COORD_VAL_BATCH windows, or the
 * whole held-out data when that is shorter. What the logs report. */
int64_t coord_val_scored_tokens(const coord_config *cfg, const coord_corpus *corpus,
                                const coord_shards *shards, int64_t batches);

/* ---- shared model bytes -------------------------------------------------- */

/* An immutable byte string shared by responses still being sent; freed
 * when the last reference goes. */
typedef struct coord_blob {
    int refs;
    size_t len;
    uint8_t *data;
    int64_t version;
} coord_blob;

/* A blob of len bytes that owns data (malloc'd; freed with the blob), one
 * reference; NULL (data freed) on allocation failure. Every live blob's
 * bytes are counted (coord_blob_live_bytes), so what downloads in flight
 * hold can be bounded. */
coord_blob *coord_blob_wrap(uint8_t *data, size_t len, int64_t version);
void coord_blob_unref(coord_blob *b);
/* Bytes held by all live blobs (any thread). */
int64_t coord_blob_live_bytes(void);

/* ---- the server ---------------------------------------------------------- */

typedef struct coord_waiter coord_waiter;

/* A lease on its way to the database (routes_task.c). */
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

typedef struct coord_server {
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    struct ssl_ctx_st *ssl;
    storage *db;
    coord_config cfg;
    char *peer_config;   /* run configuration as peers get it (JSON text) */
    coord_corpus corpus; /* text runs */
    coord_shards shards; /* token-shard runs */
    coord_testset test;  /* a classifier run's held-out images (may be empty) */
    coord_net net;       /* its parameters are the current version's */
    size_t n_params;
    float *momentum;      /* outer optimiser state after the current version (n_state) */
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
    size_t n_state;     /* coord_state_size() of the run */
    compress_spec spec; /* what uploads must look like */
    int64_t version;
    /* robust.max_norm "auto": the bound derived from the first versions
     * (coord_norm_bound_refresh), 0 until they exist. Written by the loop,
     * read by the compute thread too. */
    _Atomic double norm_bound;
    /* The updates of the versions it is being learnt from (bound.c):
     * only merges, one at a time, touch it. */
    struct coord_bound_window *bound_window;
    int finished;
    int draining;
    double drain_deadline;
    crypto_nonce_cache *nonces;
    struct coord_nonce_log *nonce_log; /* the nonces, journalled across restarts */
    coord_limits limits;
    coord_limiter *addr_limiter, *peer_limiter;
    coord_limiter *split_limiter; /* a split run's batch routes; NULL elsewhere */
    struct event *slow_timer;     /* checks every connection against the slow-client limits */
    coord_blob *model_blob;       /* current version as safetensors, built on demand */
    coord_blob *delta_blob;       /* the last delta served (its since and version below) */
    coord_blob *old_blob;         /* the last old version served whole, shared by its readers */
    int64_t digest_version;       /* the version digest_hex is the SHA-256 of (-1: none) */
    char digest_hex[65];
    int64_t delta_since, delta_version;
    coord_speed *speeds; /* async runs */
    size_t n_speeds, cap_speeds;
    coord_waiter *waiters, *waiters_tail;
    size_t n_waiters;
    coord_guard *guards; /* one per open connection */
    /* Connections under pressure (conns.c). */
    struct event *accept_timer;          /* resumes accepting after a pause */
    int64_t accept_errors, conns_closed; /* since the last log line about them */
    double accept_logged, conns_logged;
    double pressure_until;                   /* descriptors ran short: idle connections go sooner */
    struct evhttp_bound_socket *admin_bound; /* the admin listener's socket */
    struct bufferevent *admin_bevs[2 * COORD_ADMIN_CONNS_MAX]; /* its connections */
    size_t n_admin;
    /* Signed bodies being received: their bytes, and their peers (one body
     * at a time per peer). */
    int64_t body_inflight;
    int64_t *receiving_peers;
    size_t n_receiving, cap_receiving;
    size_t n_conns;
    int64_t inflight; /* requests handed to a handler and not yet fully answered */
    struct event *lease_timer;
    struct event *wait_timer;  /* wakes the waiters when a lease_wait ends */
    int64_t plain_versions;    /* async versions stepped without momentum */
    struct event *round_timer; /* merges when an open second round's deadline comes */
    struct event *merge_event;
    struct event *drain_timer;
    struct event *sig_term, *sig_int, *sig_hup;
    /* Where the certificate chain and key are read from, again on SIGHUP
     * (tls.c). */
    char cert_path[COORD_PATH_MAX], key_path[COORD_PATH_MAX];
    char db_path[COORD_PATH_MAX];
    coord_metrics metrics;     /* metrics.c */
    struct evhttp *admin_http; /* the admin listener; NULL when off */
    char admin_token[160];     /* its bearer token; "" for none */
    int merge_scheduled;
    struct coord_linger *lingers; /* refused connections being drained */
    coord_writer *writer;         /* runs every write (group commit) */
    /* Leases handed to the writer whose done callback has not run yet
     * (some may be committed already), and each one's peer, version and
     * job (cap_issuing entries). */
    int64_t issuing;
    coord_issuing *issuing_leases;
    size_t cap_issuing;
    json_t *status_cache; /* the last GET /v1/status answer, and when it was made */
    double status_at;
    int expiring;      /* a lease expiry is with the writer */
    int merging;       /* a version is with the writer */
    coord_disk disk;   /* a full disk and the merges' backoff (schedule.h) */
    int opening_round; /* a second round's candidates are with the writer */
    /* When the current version was made, on vl_clock_mono_s()'s clock (its
     * age decides a sync deadline). */
    double version_born;
    coord_net eval;            /* scratch model that validates a version before it is made */
    coord_net scorer;          /* the background thread's, for full scores (score.c) */
    struct coord_split *split; /* split runs: the coordinator's layers (split.h) */
    int compute_threads;       /* coord_serve_opts.compute_threads (0: OpenMP's default) */
    /* VOLLEY_ACK_CHECK=1 (the tests): before each 202, the upload's row
     * must be visible to this thread's own database connection, a second
     * one beside the writer's, or the process aborts. */
    int ack_check;
    /* K-FAC runs that share factors: the layers every factor file must
     * have, the newest version with merged factors (-1: none yet), and
     * that version's file, built on first request. */
    compress_factor_layer *factor_layers;
    int n_factor_layers;
    int64_t factors_version;
    coord_blob *factors_blob;
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

/* Options of the serve command. */
typedef struct coord_serve_opts {
    const char *db_path;
    const char *cert_path;
    const char *key_path;
    const char *listen; /* HOST:PORT, [V6]:PORT */
    /* The admin listener (plain HTTP, /metrics): HOST:PORT, or NULL for
     * the default 127.0.0.1:9464, which is given up with a warning when
     * taken; "off" for none. admin_token: a bearer token it requires, or
     * NULL (only allowed on a loopback address). */
    const char *admin_listen;
    const char *admin_token;
    coord_limits limits;
    /* OpenMP threads that make a version (the validation loss above all);
     * 0 leaves OpenMP's default (every core). Fewer take less from the
     * loop and the writer: idle OpenMP workers spin between parallel
     * regions, which on a small coordinator under an upload storm costs
     * ingest more than a faster validation gains. */
    int compute_threads;
} coord_serve_opts;

/* Runs the server until SIGTERM/SIGINT has drained it. Returns 0 on a clean
 * shutdown, else a VL_E* code with err set. */
int coord_serve(const coord_serve_opts *opts, vl_error *err) VL_MUST_CHECK;

/* The server without its network side: opens the database at db_path,
 * loads the run's state, and sets up the event loop, the writer thread,
 * the rate limits and slow-client timer of limits (NULL: the defaults)
 * and an evhttp (srv->http) that hands every request to
 * coord_server_dispatch. No TLS, no listening socket, no signal
 * handlers: coord_serve adds those, and test harnesses attach
 * connections of their own. *out is the caller's (coord_server_close). */
int coord_server_open(const char *db_path, const coord_limits *limits, coord_server **out,
                      vl_error *err) VL_MUST_CHECK;
/* Answers waiting requests, stops the writer (queued jobs still commit and
 * are answered), and frees everything srv holds, connections included. */
void coord_server_close(coord_server *srv);
/* The evhttp request callback (arg is the coord_server): answers a head
 * the input guard refused, else routes the request to its handler, with
 * 404 or 405 as JSON for unknown paths and methods. */
void coord_server_dispatch(struct evhttp_request *req, void *arg);

/* ---- state (state.c) ----------------------------------------------------- */

/* Loads the run, its corpus (verified), the model and momentum of the
 * latest version from srv->db into srv. */
int coord_state_load(coord_server *srv, vl_error *err) VL_MUST_CHECK;
/* Floats of outer optimiser state the run's compression keeps: momentum
 * (none), momentum and error vectors (topk, gaussk), momentum and error
 * sketches (sketch), or with a second round the error sketch, the dense
 * momentum and each coordinate's versions since it was last applied; with
 * outer.delay > 1 (not sketch) a buffer of n_params for delayed Nesterov
 * follows. */
size_t coord_state_size(const coord_config *cfg, size_t n_params);
/* Frees what coord_state_load set up (not the database). */
void coord_state_free(coord_server *srv);
/* Appends the model as the file of version `version` to out: the run and
 * version it came from, the `model` configuration JSON, and, when
 * val_loss is finite, its validation loss as "val_loss" (nats) and, for a
 * GPT, "val_bits_per_byte" (or "val_bits_per_token" in a token-shard
 * run). A GPT's tensors go under their GPT-2 names with "format": "pt"
 * (transformers refuses a file without it) and the volley.* keys; a
 * classifier's under fc.<layer>.weight/bias. The same bytes serve
 * downloads and `export`. */
int coord_model_file(const coord_config *cfg, const coord_net *net, int64_t version,
                     double val_loss, vl_buf *out, vl_error *err) VL_MUST_CHECK;
/* The current model as safetensors, built and cached on first use; the
 * caller gets a new reference (coord_blob_unref). NULL on failure. */
coord_blob *coord_model_blob(coord_server *srv, vl_error *err);
/* Whether need more bytes of downloads may be built now: live blobs plus
 * need stay within the run's download budget. */
int coord_download_room(const coord_server *srv, int64_t need);
/* The merged K-FAC factors file of version (the newest one is cached);
 * the caller owns the reference. VL_ENOTFOUND when the run shares no
 * factors or that version has none stored. */
int coord_factors_blob(coord_server *srv, int64_t version, coord_blob **out,
                       vl_error *err) VL_MUST_CHECK;
/* Safetensors of an older version from its stored params; the caller owns
 * the reference. VL_ENOTFOUND when never made or pruned. */
int coord_model_blob_version(coord_server *srv, int64_t version, coord_blob **out,
                             vl_error *err) VL_MUST_CHECK;

/* ---- replies (reply.c) --------------------------------------------------- */

/* Sends blob (a reference the call takes over) as a 200 octet stream
 * without copying it. */
void coord_reply_blob(coord_req *cr, coord_blob *blob);
/* Sends status with body (may be NULL) and content type, logs the request
 * line, and ends the request. The body buffer's contents are consumed. */
void coord_reply(coord_req *cr, int status, const char *content_type, struct evbuffer *body);
/* Sends obj (reference stolen) as JSON. */
void coord_reply_json(coord_req *cr, int status, json_t *obj);
/* Sends {"error":{"code","message"}}. */
void coord_reply_error(coord_req *cr, int status, const char *code, const char *fmt, ...)
    VL_PRINTF(4, 5);
/* Sends 429 rate_limited with Retry-After: wait_s rounded up (at least
 * 1 s); who names the bucket in the message ("peer 7", "address"). */
void coord_reply_rate_limited(coord_req *cr, double wait_s, const char *who);
/* Sends a 500 for err and logs its message; for VL_EFULL (a full
 * disk: nothing stored) a 503 unavailable with Retry-After instead. */
void coord_reply_internal(coord_req *cr, const vl_error *err);
/* Sends a 500 for running out of memory while `what` ("queueing an
 * update"), and logs it. */
void coord_reply_oom(coord_req *cr, const char *what);
/* Sets a response header. */
void coord_set_header(coord_req *cr, const char *name, const char *value);
/* Request header value or NULL. */
const char *coord_get_header(coord_req *cr, const char *name);
/* The request body as one contiguous block (NULL when empty). */
const uint8_t *coord_body(coord_req *cr, size_t *len);
/* Marks the request as handed to a handler (drain accounting). */
void coord_req_begin(coord_req *cr);

/* Parses a query string of key=value pairs: each key must be in allowed
 * (NULL-terminated) and appear at most once, each value a decimal integer
 * in [0, max]. values[i] is set for allowed[i] when present (present bit i
 * set). Returns 0 or VL_EINVAL with a message. */
int coord_query_ints(const char *query, const char *const *allowed, int64_t max, int64_t *values,
                     unsigned *present, vl_error *err) VL_MUST_CHECK;
/* coord_query_ints on cr's own query string; on failure answers 400
 * bad_request (the message, then hint in parentheses when not NULL) and
 * returns -1. */
int coord_req_query(coord_req *cr, const char *const *allowed, int64_t max, int64_t *values,
                    unsigned *present, const char *hint);

/* ---- auth (auth.c) ------------------------------------------------------- */

/* Who must sign a request to a path: nobody (status, unknown paths), the
 * key a join registers, or a registered peer. */
typedef enum { COORD_AUTH_NONE = 0, COORD_AUTH_JOIN, COORD_AUTH_PEER } coord_auth_kind;
/* The kind for a request (method, path without its query), from
 * server.c's route table: COORD_AUTH_NONE when no route takes it, so a
 * wrong method or path gets its 404 or 405 whoever signed it. */
coord_auth_kind coord_route_auth_kind(const char *method, const char *path);

/* Takes a token of peer's budget for a signed request to target at now
 * (monotonic seconds): a split run's batch routes from split_limiter,
 * every other route from peer_limiter. 0, or the seconds until a token
 * is there (rates.c). */
double coord_peer_rate_take(coord_server *srv, int64_t peer, const char *target, double now);
/* Whether target spends the split batch budget rather than the peer's. */
int coord_rate_is_split(const coord_server *srv, const char *target);

/* The guard's authorize callback (arg: the coord_server): the address's
 * rate, then for a path that needs one the RFC 9421 signature over the
 * head (components, key, clock, peer state and rate, nonce) and the
 * Content-Digest the body must match. 0 with t filled, or -1 with r. */
int coord_auth_head(void *arg, coord_guard *g, const uint8_t *head, size_t len,
                    coord_guard_ticket *t, coord_guard_refusal *r);

/* Gives back what coord_auth_head reserved for t's body (the guard's
 * release callback; the server calls it when it takes a ticket). */
void coord_auth_release(void *arg, const coord_guard_ticket *t);
/* The guard's progress callback: a body's reservation grows to what has
 * arrived of it once that passes the advance reserved at its head. */
void coord_auth_progress(void *arg, coord_guard_ticket *t, uint64_t arrived);

/* For a handler that needs a registered peer: sets cr->peer_id from the
 * ticket the guard issued for the signed head and returns 0, or answers
 * 401 and returns -1. */
int coord_authenticate(coord_req *cr);
/* For a join: 0 when the head was signed by pk (the key the body
 * registers); otherwise answers 401 and returns -1. */
int coord_authenticate_join(coord_req *cr, const uint8_t pk[CRYPTO_PK_BYTES]);

/* The checks every upload about a task starts with, in protocol order:
 * run is this run's (422 wrong_run), peer is the signer (403
 * not_your_task), the task exists (404 unknown_task) and is the signer's
 * (403 not_your_task). what names the upload in messages ("update").
 * Returns 0 with the task in *t, or answers and returns -1. */
int coord_check_task_owner(coord_req *cr, const char *what, const char *run, int64_t peer,
                           int64_t task, storage_task *t);

/* ---- peers (routes_peers.c) ----------------------------------------------- */

#define COORD_JOIN_NAME_MAX 64
#define COORD_JOIN_HARDWARE_MAX 4096
#define COORD_JOIN_TOKEN_MAX 256

/* A join request body, {public_key, token, name, hardware}. */
typedef struct coord_join_body {
    uint8_t pk[CRYPTO_PK_BYTES];
    char token[COORD_JOIN_TOKEN_MAX + 1];
    size_t token_len;
    char name[COORD_JOIN_NAME_MAX + 1]; /* printable, non-empty */
    char *hardware; /* compact JSON text of the hardware object ("{}" if absent); owned */
} coord_join_body;

/* Parses and checks a join body (len bytes, NULL when empty) without any
 * connection: an object of only the known fields, public_key base64 of 32
 * bytes, a token of 1 to COORD_JOIN_TOKEN_MAX bytes, a name of printable
 * characters, hardware an object of at most COORD_JOIN_HARDWARE_MAX bytes
 * as compact JSON. VL_ETOOBIG over COORD_MAX_JSON_BODY, VL_EINVAL (the
 * message names the field), VL_ENOMEM. On success the caller frees out
 * with coord_join_body_free; on failure nothing is left to free. */
int coord_join_parse(const uint8_t *body, size_t len, coord_join_body *out,
                     vl_error *err) VL_MUST_CHECK;
/* Frees the hardware text and wipes the token. */
void coord_join_body_free(coord_join_body *b);

/* Parses a key rotation body {"public_key", "proof"} (exactly those two,
 * strings) without any connection: the new key into pk, the proof text
 * (not yet checked; crypto_rotation_verify does that) into proof.
 * VL_EINVAL with a message for anything else, a body over
 * COORD_MAX_JSON_BODY included. */
int coord_rotate_parse(const uint8_t *body, size_t len, uint8_t pk[CRYPTO_PK_BYTES],
                       char proof[CRYPTO_SIG_B64_LEN + 8], vl_error *err) VL_MUST_CHECK;

/* A peer silent this many lease lengths (and holding no lease) is gone. */
#define COORD_GONE_LEASES 3
/* GET /v1/status is built at most once per this many seconds; requests in
 * between get the same answer. */
#define COORD_STATUS_CACHE_S 1.0
/* "active", "idle", "gone" or "revoked" for a peer's activity at now. */
const char *coord_peer_state(const storage_peer_activity *a, int64_t now, int64_t lease_s);
/* The run's summary as GET /v1/status answers it, read from db (status.c):
 * cfg, version and finished describe the run; ws (NULL outside a running
 * server) adds the writer's counters and accuracy (NULL: not a
 * classifier) the test accuracy. The caller owns the result (json_decref);
 * NULL with err set on a database error or no memory. */
json_t *coord_status_json(storage *db, const coord_config *cfg, int64_t version, int finished,
                          const coord_writer_stats *ws, const double *accuracy, vl_error *err);
/* `status --db`: the same summary for a stopped coordinator or a copy of
 * its database, printed to out as indented JSON. Reads only. */
int coord_cmd_status(const char *db_path, FILE *out, vl_error *err) VL_MUST_CHECK;

/* ---- routes -------------------------------------------------------------- */

void coord_route_join(coord_req *cr);   /* POST /v1/peers */
void coord_route_rotate(coord_req *cr); /* POST /v1/peers/rotate */
void coord_route_task(coord_req *cr);   /* GET /v1/task */
void coord_route_model(coord_req *cr);  /* GET /v1/model */
void coord_route_delta(coord_req *cr);  /* GET /v1/model/delta */
/* out = hex SHA-256 of n parameters as little-endian F32 (a version's
 * digest in delta files); any thread. VL_ENOMEM, or VL_ERR. */
int coord_params_digest(const float *theta, size_t n, char out[65], vl_error *err);
void coord_route_data(coord_req *cr);           /* GET /v1/data/<shard> */
void coord_route_updates(coord_req *cr);        /* POST /v1/updates */
void coord_route_status(coord_req *cr);         /* GET /v1/status */
void coord_route_round(coord_req *cr);          /* GET /v1/round */
void coord_route_round_values(coord_req *cr);   /* POST /v1/round/values */
void coord_route_split_forward(coord_req *cr);  /* POST /v1/split/forward (split.c) */
void coord_route_split_backward(coord_req *cr); /* POST /v1/split/backward (split.c) */
void coord_route_factors(coord_req *cr);        /* GET /v1/factors */

/* ---- the update-norm bound (bound.c) ------------------------------------- */

/* The L2 norm above which an update is refused or scaled down: the run's
 * robust.max_norm, or with max_norm "auto" the derived bound (0 until it
 * is known), which is per square root of the update's local steps; 0
 * means none. Any thread. */
double coord_norm_bound(const coord_server *srv);
/* The bound every update is held to: the derived one times the square
 * root of the run's train.steps (the most any task trains), max_norm as
 * it is. Not the update's own steps: a short task (dynamic_steps) sends
 * its residual too, whose size does not shrink with its steps, and its
 * honest updates were refused five in a row when held to the square
 * root of one step; a full task's allowance is what any peer may claim
 * anyway, so this loosens nothing a hostile peer could not have. */
double coord_norm_bound_held(const coord_server *srv);
/* With max_norm "auto" and no bound yet: once versions 1 to
 * robust.auto_versions exist, sets the bound to robust.auto_mult times
 * the figure stored with the version it was learnt at (the median of
 * versions 1 to auto_versions' stored norms for an older database), read
 * on the loop's connection, and logs it. Called at start and after each
 * version; a database error leaves the bound unset, to be tried again. */
void coord_norm_bound_refresh(coord_server *srv);
/* Peers whose updates the learning window must hold (min(this, peers
 * registered)), and how many times auto_versions it waits for them. */
#define COORD_BOUND_QUORUM 3
#define COORD_BOUND_WAIT 4
/* Taken on the loop when a merge starts: the quorum the version's
 * figure needs (coord_norm_bound_figure), 0 when no bound is being
 * learnt (not "auto", or learnt already). */
int64_t coord_norm_bound_quorum(coord_server *srv);
/* The median over peers of each peer's median of units (NaN ones left
 * out) of n updates whose peers are peers[i], and in *n_peers how many
 * peers that is; NaN for none or when out of memory. */
double coord_norm_bound_peer_median(const int64_t *peers, const double *units, size_t n,
                                    size_t *n_peers);
/* On the compute thread, for version (being made, not refused) with
 * quorum from coord_norm_bound_quorum: adds its n updates' peers and
 * unit norms to the learning window and returns the bound's figure once
 * the window is complete (version >= auto_versions and quorum peers, or
 * version >= COORD_BOUND_WAIT x auto_versions), to be stored as the
 * version's update_norm; NaN otherwise. One merge at a time calls it. */
double coord_norm_bound_figure(coord_server *srv, int64_t quorum, int64_t version,
                               const int64_t *peers, const double *units, size_t n);
/* Frees the learning window (server close). */
void coord_norm_bound_window_free(coord_server *srv);

/* ---- tasks (routes_task.c); waiting and timers are in schedule.h -------- */

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
/* Whether peer_id, whose lease done_task is being uploaded, gets its next
 * task with the upload's answer: only in async runs (a sync peer waits for
 * the next version), while the run goes on, and when the peer holds no
 * other live lease. Returns 1 with *l prepared (then exactly one of
 * coord_lease_committed or coord_lease_abandoned must follow), 0 when
 * not, or a VL_E* code with err set. Loop thread. */
int coord_lease_offer(coord_server *srv, int64_t peer_id, int64_t done_task, coord_lease *l,
                      vl_error *err) VL_MUST_CHECK;
/* Writer thread, inside the job's savepoint: inserts l's task, taking over
 * the data range and seed of an expired lease when one waits. */
int coord_lease_write(storage *db, coord_lease *l, vl_error *err) VL_MUST_CHECK;
/* Loop thread, after the commit: the task as peers get it (a new JSON
 * reference, NULL when out of memory), and the lease timer re-armed. */
json_t *coord_lease_committed(coord_server *srv, const coord_lease *l);
/* Loop thread, when the job holding the lease l failed. */
void coord_lease_abandoned(coord_server *srv, const coord_lease *l);

/* ---- dynamic local steps (speed.c) --------------------------------------- */

/* Task task_id is being leased to peer_id now: returns the local steps it
 * gets (train.steps unless the run has train.dynamic_steps) and starts
 * timing it. */
int64_t coord_speed_lease(coord_server *srv, int64_t peer_id, int64_t task_id);
/* The update of task_id arrived after local_steps steps that took the
 * peer train_s seconds (0: not reported): its pace becomes train_s per
 * step, and the rest of the time since the lease its overhead (with no
 * train_s: the whole time per step, no overhead), each averaged with
 * earlier ones. */
void coord_speed_note(coord_server *srv, int64_t peer_id, int64_t task_id, int64_t local_steps,
                      double train_s);
/* The local steps task t was leased with (train.steps when not known,
 * such as after a restart). */
int64_t coord_speed_steps(const coord_server *srv, const storage_task *t);
/* lease_wait: the seconds peer_id's next lease may still wait for the
 * version that merges the update of its last task, whose id goes to
 * *task_id (0 when the peer is not known); the wait's clock starts at the
 * first call for that task. 0 when the run does not wait, no peer is timed
 * yet, or the wait is over (coord_sched_wait_left). */
double coord_speed_wait_left(coord_server *srv, int64_t peer_id, int64_t *task_id);
/* How many peers other than peer_id hold a lease whose update their pace
 * says is due within horizon_s seconds from now (overdue by less than
 * one of their own tasks), counting those whose pace is not measured yet:
 * the updates a wait of that long may see arrive. */
int64_t coord_speed_due(const coord_server *srv, int64_t peer_id, double horizon_s);

/* ---- admin commands (admin.c) -------------------------------------------- */

/* `init`: creates the database for the run described by config_path. */
int coord_cmd_init(const char *db_path, const char *config_path, vl_error *err) VL_MUST_CHECK;
/* `token create`: stores a new token's hash and writes the token to out
 * (CRYPTO_TOKEN_LEN + 1 bytes). */
int coord_cmd_token_create(const char *db_path, int64_t uses, int64_t ttl_s, char *out,
                           vl_error *err) VL_MUST_CHECK;
/* `token list`: one line per stored token on out: id, the start of its
 * hash, uses left, expiry, creation, peers it registered, and its state
 * (active, expired, used-up, revoked). The tokens themselves are not
 * stored and cannot be shown. */
int coord_cmd_token_list(const char *db_path, FILE *out, vl_error *err) VL_MUST_CHECK;
/* `token revoke`: token id admits nobody from now on. VL_ENOTFOUND if
 * there is no such token. */
int coord_cmd_token_revoke(const char *db_path, int64_t id, vl_error *err) VL_MUST_CHECK;
/* `peer revoke`: refuses every later request of peer id (403 revoked),
 * checked on each request, so it takes effect on a running coordinator. */
int coord_cmd_peer_revoke(const char *db_path, int64_t id, vl_error *err) VL_MUST_CHECK;
/* `peer list`: one line per registered peer on out: id, public key,
 * joined, last seen, unexpired leases, stored updates, state, name. */
int coord_cmd_peer_list(const char *db_path, FILE *out, vl_error *err) VL_MUST_CHECK;
/* Opens db_path, which must hold an initialised run (VL_ENOTFOUND
 * otherwise); *db is the caller's to storage_close. */
int coord_open_initialised(const char *db_path, storage **db, vl_error *err) VL_MUST_CHECK;
/* `check`: whether the database at db_path is whole after a crash, a
 * power cut or a disk fault: SQLite's integrity_check, and every stored
 * update that still waits for its merge read back from its segment and
 * decoded. Prints what it found to out; *problems receives how many
 * updates cannot be merged (their bodies lost or damaged). Returns VL_OK
 * when it could look, whatever it found, except a database that fails
 * integrity_check (VL_EDB). Changes nothing. */
int coord_cmd_check(const char *db_path, FILE *out, int64_t *problems, vl_error *err) VL_MUST_CHECK;
/* `check --config`: parses the configuration at config_path and reads
 * its data through exactly as `init` does, without touching a database,
 * then prints the resolved configuration (every default filled in, paths
 * absolute) as JSON and a summary: parameters, the compression's k or
 * sketch shape, and the bytes an update may take. Returns VL_OK, or the
 * first problem found (nothing printed then). */
int coord_cmd_check_config(const char *config_path, FILE *out, vl_error *err) VL_MUST_CHECK;

/* ---- TLS (tls.c) ------------------------------------------------------------ */

/* A server TLS context from the PEM certificate chain at cert and the key
 * at key: TLS 1.2 or newer, forward-secret AEAD suites only. NULL with err
 * set (naming the file, or a key that does not match) on failure. The
 * caller owns the context (SSL_CTX_free). */
struct ssl_ctx_st *coord_tls_ctx_new(const char *cert, const char *key, vl_error *err);
/* The SIGHUP handler (an event callback, arg the server): reads the
 * certificate and key again from srv->cert_path and srv->key_path and
 * serves them to new connections; a pair that does not load keeps the
 * old context, and the log says why. */
void coord_tls_on_sighup(evutil_socket_t sig, short what, void *arg);

/* ---- export (export.c) and sample (sample.c) -------------------------------- */

/* The parameters of stored version *version (< 0: the current one) of the
 * run in db_path, opened read-only, in a new model of the run's
 * configuration, which goes to *cfg (its data paths freed: the caller
 * reads no data). On success *gpt is owned by the caller (model_gpt_destroy)
 * and *version holds the version read, *val_loss (may be NULL) its stored
 * validation loss (NaN when unknown). An unknown or pruned version is
 * VL_ENOTFOUND. */
int coord_load_version(const char *db_path, int64_t *version, coord_config *cfg, model_gpt **gpt,
                       double *val_loss, vl_error *err) VL_MUST_CHECK;

/* `export`: writes stored version `version` (< 0: the current one) as
 * out_dir/model.safetensors and out_dir/config.json, a checkpoint that
 * transformers.GPT2LMHeadModel.from_pretrained(out_dir) loads. out_dir is
 * created if missing (not its parents); an existing non-empty one is
 * refused (VL_ECONFLICT) unless force is set, which overwrites those two
 * files and leaves anything else there alone. An unknown or pruned version
 * is VL_ENOTFOUND. On failure nothing this call wrote is left behind
 * (with force, that includes the two files it was replacing). On success
 * *exported (may be NULL) gets the version written. */
int coord_cmd_export(const char *db_path, int64_t version, const char *out_dir, int force,
                     int64_t *exported, vl_error *err) VL_MUST_CHECK;

/* What `sample` generates: tokens new bytes (1..COORD_SAMPLE_MAX_TOKENS)
 * after prompt, each drawn from the model's distribution at temperature
 * (0: always the most likely byte; else in (0, COORD_SAMPLE_MAX_TEMP]),
 * with an RNG seeded by seed, so a sample can be repeated. */
typedef struct coord_sample_opts {
    const char *prompt; /* not empty; its last block_size bytes are the context */
    int64_t tokens;
    double temperature;
    uint64_t seed;
} coord_sample_opts;

#define COORD_SAMPLE_MAX_TOKENS 4096
#define COORD_SAMPLE_MAX_TEMP 10.0

/* `sample`: writes the prompt and the bytes stored version `version` (< 0:
 * the current one) continues it with to out, each byte that is not
 * printable ASCII, a newline or a tab (and the backslash) written as
 * \xNN so a model's output cannot drive the terminal. Only byte-level
 * models (vocabulary 256) can be sampled here: a run over GPT-2 tokens is
 * refused (VL_EINVAL), as it needs GPT-2's tokenizer (export it and use
 * transformers). On success
 * *sampled (may be NULL) gets the version read and *val_loss (may be NULL)
 * its stored validation loss (NaN when none). Reads the database only. */
int coord_cmd_sample(const char *db_path, int64_t version, const coord_sample_opts *o, FILE *out,
                     int64_t *sampled, double *val_loss, vl_error *err) VL_MUST_CHECK;

#endif
