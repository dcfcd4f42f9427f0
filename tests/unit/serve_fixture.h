/* A real coordinator served in-process for one test: coord_cmd_init on a
 * run configuration, coord_server_open, and its evhttp server on a Unix
 * socket, each connection behind the input guard as tests/guard_conns.h
 * sets it up (only TLS is left out), so a request passes the guard, its
 * ticket, the signature check and the route as in production. Requests
 * are signed by peers the fixture inserts; answers are read whole, binary
 * bodies included. One server at a time (the state is file-wide). Include
 * after <cmocka.h> and test_util.h. */
#ifndef VOLLEY_SERVE_FIXTURE_H
#define VOLLEY_SERVE_FIXTURE_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "compress/compress.h"
#include "coordinator/coord.h"
#include "crypto/crypto.h"
#include "tests/guard_conns.h"
#include "coordinator/cli/cli.h"
#include "coordinator/http/http.h"
#include "coordinator/server.h"

#define SERVE_MAX_PEERS 8
/* How long one request may take before the test gives up on it. */
#define SERVE_STEP_S 10.0

/* One connection and the one answer it gets. */
typedef struct serve_client {
    int fd;
    vl_buf in;     /* everything read so far */
    int status;    /* 0 until the whole answer is in */
    size_t head;   /* where its body starts */
    size_t blen;   /* and its length (Content-Length) */
    char code[64]; /* a JSON error body's "code", "" otherwise */
} serve_client;

static struct {
    char *dir;
    char sock[600];
    coord_server *srv;
    guard_conn *conns;
    struct event *tick;
    vcrypto_identity keys[SERVE_MAX_PEERS];
    int64_t ids[SERVE_MAX_PEERS];
    int n_peers;
} SV;

static inline struct bufferevent *serve_make_bev(struct event_base *base, void *arg) {
    (void)arg;
    guard_conn *c = guard_conn_new(base, SV.srv, &SV.conns);
    assert_non_null(c);
    return c->bev;
}

static inline void serve_on_request(struct evhttp_request *req, void *arg) {
    guard_conn_watch(req, SV.conns);
    coord_dispatch(req, arg);
}

static inline void serve_tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    (void)arg;
}

/* Initialises a run from config (JSON text; CORPUS in it, if there,
 * becomes the path of a small text corpus in the run's directory) and
 * serves it. */
static inline void serve_open(const char *config) {
    memset(&SV, 0, sizeof SV);
    SV.dir = test_temp_dir("/tmp/volley-serve.XXXXXX");
    char corpus[600], cfg[600], db[600];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", SV.dir);
    snprintf(cfg, sizeof cfg, "%s/run.json", SV.dir);
    snprintf(db, sizeof db, "%s/run.db", SV.dir);
    test_write_corpus(corpus, "what arrives is what was sent. ");
    vl_buf text;
    vl_buf_init(&text, 1 << 20);
    const char *at = strstr(config, "CORPUS");
    size_t pre = at ? (size_t)(at - config) : strlen(config);
    OK(vl_buf_append(&text, config, pre));
    if (at) OK(vl_buf_printf(&text, "%s%s", corpus, at + 6));
    test_write_text(cfg, (const char *)text.data);
    vl_buf_free(&text);
    OK(coord_cmd_init(db, cfg, &e_));
    vl_error serve_err = {0};
    SV.srv = guard_conns_serve_unix(db, SV.dir, SV.sock, sizeof SV.sock, 16, serve_make_bev,
                                    serve_on_request, &serve_err);
    if (!SV.srv) fail_msg("%s", serve_err.msg);
    SV.tick = evtimer_new(SV.srv->base, serve_tick, NULL);
    assert_non_null(SV.tick);
}

static inline void serve_close(void) {
    coord_server_close(SV.srv);
    guard_conn_release_all(&SV.conns, NULL);
    event_free(SV.tick);
    test_remove_tree(SV.dir);
    free(SV.dir);
}

/* One turn of the loop, at most a millisecond idle. */
static inline void serve_pump(void) {
    struct timeval tv = {0, 1000};
    evtimer_add(SV.tick, &tv);
    event_base_loop(SV.srv->base, EVLOOP_ONCE);
}

/* Reads what has come for c; 1 once its answer is complete. */
static inline int serve_read(serve_client *c) {
    if (c->status) return 1;
    uint8_t chunk[16384];
    ssize_t r;
    while ((r = recv(c->fd, chunk, sizeof chunk, 0)) > 0)
        OK(vl_buf_append(&c->in, chunk, (size_t)r));
    const char *text = (const char *)c->in.data;
    const char *end = text ? strstr(text, "\r\n\r\n") : NULL;
    if (!end) return 0;
    const char *cl = strstr(text, "Content-Length: ");
    c->head = (size_t)(end - text) + 4;
    c->blen = cl && cl < end ? strtoul(cl + 16, NULL, 10) : 0;
    if (c->in.len < c->head + c->blen) return 0;
    c->status = atoi(text + 9);
    const char *code = strstr(text + c->head, "\"code\"");
    if (c->status >= 400 && code) sscanf(code, "\"code\": \"%63[^\"]\"", c->code);
    if (c->status >= 400 && code && !c->code[0]) sscanf(code, "\"code\":\"%63[^\"]\"", c->code);
    return 1;
}

/* Sends the whole request (head, then body) on a new connection and turns
 * the loop until its answer is in. The caller frees it (serve_done). */
static inline serve_client *serve_send(const char *head, const void *body, size_t len) {
    serve_client *c = calloc(1, sizeof *c);
    assert_non_null(c);
    vl_buf_init(&c->in, 1 << 26);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    assert_true(c->fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, SV.sock, strlen(SV.sock) + 1);
    double end = vl_clock_mono_s() + SERVE_STEP_S;
    while (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        assert_true(errno == EAGAIN || errno == EINTR);
        assert_true(vl_clock_mono_s() < end);
        serve_pump();
    }
    const uint8_t *parts[2] = {(const uint8_t *)head, body};
    size_t lens[2] = {strlen(head), body ? len : 0};
    for (int p = 0; p < 2; p++) {
        size_t off = 0;
        while (off < lens[p]) {
            ssize_t w = send(c->fd, parts[p] + off, lens[p] - off, MSG_NOSIGNAL);
            if (w > 0) {
                off += (size_t)w;
            } else {
                assert_true(w < 0 && (errno == EAGAIN || errno == EINTR));
                serve_pump(); /* a large body: let the server read */
            }
            assert_true(vl_clock_mono_s() < end);
        }
    }
    while (!serve_read(c)) {
        if (vl_clock_mono_s() > end) fail_msg("no answer within %.0f s", SERVE_STEP_S);
        serve_pump();
    }
    return c;
}

static inline const uint8_t *serve_body(const serve_client *c) {
    return c->in.data + c->head;
}

static inline void serve_done(serve_client *c) {
    close(c->fd);
    vl_buf_free(&c->in);
    free(c);
}

/* A peer the database knows, with a key of its own; returns its index. */
static inline int serve_add_peer(void) {
    assert_true(SV.n_peers < SERVE_MAX_PEERS);
    int i = SV.n_peers++;
    vcrypto_identity_generate(&SV.keys[i]);
    char name[16];
    snprintf(name, sizeof name, "p%d", i);
    OK(storage_peer_insert(SV.srv->run.db, SV.keys[i].pk, name, "{}", 0, vl_clock_unix_s(),
                           &SV.ids[i], &e_));
    return i;
}

/* A lease of peer i on the current version for ten minutes, as the writer
 * would have stored it. */
static inline int64_t serve_add_lease(int i) {
    storage_task t = {.peer_id = SV.ids[i],
                      .base_version = SV.srv->run.version,
                      .data_offset = 0,
                      .data_length = 4096,
                      .seed = 1,
                      .issued_at = vl_clock_unix_s(),
                      .deadline = vl_clock_unix_s() + 600,
                      .state = STORAGE_TASK_LEASED};
    int64_t id = 0;
    OK(storage_task_insert(SV.srv->run.db, &t, &id, &e_));
    return id;
}

/* POSTs body (len bytes, content type media) to path signed by peer i.
 * signed_body, when not NULL, is what the signature and the Content-Digest
 * are made from instead (as many bytes): a body that differs from it on
 * the way. */
static inline serve_client *serve_post(int i, const char *path, const char *media, const void *body,
                                       size_t len, const void *signed_body) {
    char keyid[24];
    snprintf(keyid, sizeof keyid, "%lld", (long long)SV.ids[i]);
    vcrypto_signed_headers sh;
    OK(vcrypto_sign_http(&SV.keys[i], keyid, "POST", path, 1, signed_body ? signed_body : body, len,
                         vl_clock_unix_s(), &sh));
    char head[4096];
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: serve\r\nContent-Type: %s\r\nContent-Length: "
                     "%zu\r\nContent-Digest: %s\r\nSignature-Input: %s\r\nSignature: %s\r\n\r\n",
                     path, media, len, sh.content_digest, sh.signature_input, sh.signature);
    assert_true(n > 0 && n < (int)sizeof head);
    return serve_send(head, body, len);
}

/* A dense update of task by fixture peer i for run (its name), with the
 * values d (the run's n_params of them) as dtype, into out (initialised
 * here; the caller frees it). */
static inline void serve_dense_update(int i, int64_t task, const char *run, const float *d,
                                      st_dtype dtype, vl_buf *out) {
    compress_update_meta m = {.task = task,
                              .peer = SV.ids[i],
                              .base_version = 0,
                              .num_samples = 16,
                              .local_steps = 4,
                              .loss = 3.0,
                              .kind = COMPRESS_DENSE};
    snprintf(m.run, sizeof m.run, "%s", run);
    vl_buf_init(out, 1 << 24);
    OK(compress_update_encode_dense(&m, d, SV.srv->run.n_params, dtype, out, &e_));
}

#endif
