/* The attack client's shared parts: its state, one request at a time over
 * libcurl or raw TLS, and the check of each answer. Every case prints one
 * row of a table: what was sent, the status and JSON error code wanted and
 * got, and, when ATTACK_DB names the run's database, whether the tables
 * were left exactly as they were (a refused request must change nothing
 * stored; peers' last_seen aside). */
#ifndef VOLLEY_ATTACK_H
#define VOLLEY_ATTACK_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/common.h"
#include "crypto/crypto.h"

typedef struct ctx {
    const char *url, *ca, *dir;
    char token[VCRYPTO_TOKEN_LEN + 1];
    vcrypto_identity id;
    int64_t peer, task, base_version;
    size_t n_params;
    char run[64];
    /* The task's compression. */
    char kind[16];
    int64_t k, rows, cols, seed;
} ctx;

/* An answer. status -1 means no HTTP answer came; code then says what
 * happened instead: "closed" (the server ended the connection) or
 * "tls_refused" (the handshake failed). */
typedef struct reply {
    long status;
    char code[64];
    char retry_after[32]; /* the Retry-After header, "" when absent */
    vl_buf body;
    int have_digest;
    char digest[VCRYPTO_HASH_HEX + 1]; /* the database before the request */
} reply;

/* Everything about one request; zero fields take the honest default. */
typedef struct req_opts {
    const char *method, *target;
    const char *auth; /* NULL: signed by key as peer; "": no signature; else literal
                            header lines, separated by LF (see sign_lines) */
    const void *body;
    size_t len;
    const void *sign_body; /* what the signature covers instead of body (NULL: body) */
    size_t sign_len;
    const char *sign_method, *sign_target; /* likewise (NULL: the real ones) */
    const vcrypto_identity *key;           /* NULL: the attacker's own */
    int64_t peer;                          /* the peer id signed as */
    int64_t ts;                            /* 0: now */
    const char *ctype;                     /* NULL: the route's type; "": no Content-Type */
} req_opts;

/* Room for the signature lines of one request. */
#define ATTACK_SIG_LINES (2 * VCRYPTO_SIG_HEADER_MAX + VCRYPTO_DIGEST_HEADER_MAX + 64)

/* The header lines that sign one request as peer (0: a join, signed with
 * keyid = key's public key), as volley-peer sends them: Signature-Input,
 * Signature and, for a body (body non-NULL or a POST), Content-Digest of
 * body, separated by LF, into out. 0, or -1 when they do not fit. */
int sign_lines(const vcrypto_identity *key, int64_t peer, const char *method, const char *target,
               const void *body, size_t len, int64_t ts, char *out, size_t cap);

/* lines as sign_lines writes them, each LF made CRLF, into out (cap
 * bytes, NUL-terminated; cut short when it does not fit). */
void crlf_lines(const char *lines, char *out, size_t cap);

/* A request for raw(), signed as a join by the attacker's key over body
 * (len bytes): request line, Host, Content-Type ctype, the signature
 * lines, Content-Length, empty line, then only the first sent bytes of
 * the body (a text body: out is NUL-terminated). 0, or -1 when it does
 * not fit in cap. */
int signed_head(const ctx *c, const char *method, const char *target, const char *ctype,
                const void *body, size_t len, size_t sent, char *out, size_t cap);

/* Sends one request over libcurl and reads the answer into r (r->body
 * must be released; expect() does it). */
void send_req(const ctx *c, const req_opts *o, reply *r);
/* Shorthand of send_req for the common cases: auth NULL/""/literal, body
 * and what the signature covers, the key and peer to sign as, ts. */
void request(const ctx *c, const char *method, const char *target, const char *auth,
             const void *body, size_t len, const void *sign_body, size_t sign_len,
             const vcrypto_identity *key, int64_t peer, int64_t ts, reply *r);
/* Writes head and then tail (may be NULL) on a fresh TLS connection,
 * exactly as given, and reads until the server closes. With pause_s > 0
 * it waits that long between head and tail, and with tail_close set it
 * then shuts its sending side instead of sending tail. */
void raw(const ctx *c, const char *head, const char *tail, reply *r);
void raw_slow(const ctx *c, const char *head, double pause_s, const char *tail, int tail_close,
              reply *r);
/* raw_slow over a TLS context of the caller's (NULL: plain TCP). */
struct ssl_ctx_st;
void raw_conn(const ctx *c, struct ssl_ctx_st *sc, const char *head, double pause_s,
              const char *tail, int tail_close, reply *r);

/* Records one case: a row of the table, counted as passed or failed.
 * A wanted status of 400 or more (or -1) also requires the database to
 * be unchanged when ATTACK_DB is set. code NULL: any code. Frees r. */
void expect(const char *name, reply *r, long status, const char *code);
/* The same for an upload refused for what it holds (422 non_finite,
 * norm_exceeded, ...), which ends c->task's lease: the database must hold
 * that task as expired (when ATTACK_DB is set). Frees r. */
void expect_lease_ended(const ctx *c, const char *name, reply *r, long status, const char *code);
/* Records a case whose outcome the caller judged itself. */
void record(const char *name, const char *want, const char *got, int ok);
/* The table's header; the summary line "attack: N passed, N failed". */
void table_begin(const char *title);
int table_end(void);

/* GET target signed as the attacker, expected to answer status/code. */
void get(const ctx *c, const char *name, const char *target, long status, const char *code);
/* POST body to /v1/updates signed as the attacker; frees b. */
void post(const ctx *c, const char *name, vl_buf *b, long status, const char *code);

/* A dense update of n floats with metadata for run and base; element n/2
 * is poison. */
void update_body(const ctx *c, vl_buf *out, const char *run, int64_t base, size_t n, float poison);
/* The same claiming num_samples = samples (update_body claims 10). */
void update_body_claiming(const ctx *c, vl_buf *out, const char *run, int64_t base, size_t n,
                          float poison, int64_t samples);
/* The same with local_steps = steps and loss = loss (the others claim 1
 * and 5.0). */
void update_body_meta(const ctx *c, vl_buf *out, const char *run, int64_t base, size_t n,
                      float poison, int64_t samples, int64_t steps, double loss);

/* dir/attack.state and dir/attack.key. */
int load_state(ctx *c, const char *dir);
int save_state(const ctx *c, json_t *compression);
/* Loads a key file written by vcrypto_identity_save; aborts when missing. */
void load_key(const char *dir, const char *file, vcrypto_identity *id);

/* The phases (attack_*.c). */
int prepare(ctx *c, const char *token, const char *badtoken);
void attack_general(ctx *c, const char *badtoken);
int setup_access(ctx *c, const char *victim_token);
void attack_access(ctx *c, const char *spare, const char *revoked, const char *expired);
void attack_tls(ctx *c);
void attack_limits(ctx *c);
void attack_sparse(ctx *c);
void attack_values(ctx *c, const char *stage);
void finish(ctx *c, long status, const char *code);
void delta(ctx *c, const char *since, long status);
int lease(ctx *c);
/* A token-shard run's data endpoint (attack_tokens.c). */
void attack_tokens(ctx *c);
/* Query strings on every route, and a join's name length (attack_query.c). */
void attack_query(ctx *c);
/* Replays and signature members and coverage (attack_replay.c). */
void attack_replay(ctx *c);
/* K-FAC factor sharing (attack_kfac.c): STAGE "bad" or "finish". */
void attack_kfac(ctx *c, const char *stage);
/* Split learning's forward endpoint (attack_split.c): activations of
 * width q, batches of at most max_batch rows, labels below classes;
 * STAGE "bad" or "expired". */
void attack_split(ctx *c, int q, int max_batch, int classes, const char *stage);

/* Crowds with keys of their own, joined with token (attack_crowd.c):
 * holders long-polls and newcomers with late heads from one address; keys
 * that announce a body of announce bytes, send sent of it and go quiet,
 * beside an honest upload. 0, or -1 when the set-up failed. */
int attack_nat(ctx *c, const char *token, int holders, int newcomers);
int attack_bodies(ctx *c, const char *token, int keys, size_t announce, size_t sent);
/* A peer joined with token starts a 2 MiB upload, revoke_cmd is run with
 * the peer id as its last argument while the body is half sent, and the
 * upload must then be refused 403. */
int attack_revoke_mid_body(ctx *c, const char *token, const char *revoke_cmd);

#endif
