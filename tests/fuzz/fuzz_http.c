/* Fuzz target: the coordinator's HTTP side in one process, through the
 * code the real server runs: a real run in a real database, the writer
 * and compute threads, libevent's evhttp, the input guard hooked on each
 * connection's input buffer, coord_dispatch and every route
 * handler. Only TLS is left out: connections come over a Unix socket,
 * one per input.
 *
 * An input is either raw bytes, sent as they are (the guard, the parser,
 * routing and every refusal before authentication), or a request the
 * harness signs with a key it registered, so the handlers behind the
 * signature check are reached too (leases, uploads, deltas, rounds, the
 * join). The run is a small sketch run with a second round, two updates a
 * version, so uploads make versions and rounds open; state carries over
 * from input to input as it would on a server.
 *
 *   raw:     byte 0 even, then the bytes to send
 *   signed:  byte 0 odd, byte 1 picks the signer (peer 1, peer 2, the
 *            joining key as peer 0, or peer 1's key claiming peer 3), then
 *            "METHOD TARGET\n", header lines "Name: value\n" up to an empty
 *            line, and the body
 *
 * Every answer must be HTTP the server meant: never a 5xx but 503, and an
 * error status (but on a HEAD request) carries the JSON error body
 * {"error": {"code", "message"}}. An exchange that does not end within
 * 10 seconds counts as a hang. */
#define _GNU_SOURCE /* memmem, strcasestr */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <sodium.h>

#include "coordinator/coord.h"
#include "tests/fuzz/fuzz.h"
#include "tests/guard_conns.h"
#include "coordinator/base/limiter.h"
#include "coordinator/cli/cli.h"
#include "coordinator/conn/limits.h"
#include "coordinator/conn/limits_types.h"
#include "coordinator/http/http.h"
#include "coordinator/run/writer.h"
#include "coordinator/sched/schedule.h"
#include "coordinator/server.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define EXCHANGE_LIMIT_S 10.0
#define RESPONSE_CAP ((size_t)1 << 20)

static struct {
    char dir[512];
    char sock[600];
    coord_server *srv;
    vcrypto_identity keys[3]; /* peer 1, peer 2, the joining key */
    guard_conn *conns;
    struct event *tick;
    vl_buf resp;
} H;

/* ---- connections ------------------------------------------------------- */

static struct bufferevent *make_bev(struct event_base *base, void *arg) {
    (void)arg;
    guard_conn *c = guard_conn_new(base, H.srv, &H.conns);
    FUZZ_CHECK(c != NULL, "cannot hook a connection");
    return c->bev;
}

static void on_request(struct evhttp_request *req, void *arg) {
    guard_conn_watch(req, H.conns);
    coord_dispatch(req, arg);
}

/* ---- the run ---------------------------------------------------------- */

static void write_file(const char *path, const void *data, size_t len) {
    vl_error e = {0};
    FUZZ_CHECK(vl_file_write_atomic(path, data, len, 0600, &e) == VL_OK, "%s", e.msg);
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *f) {
    (void)sb;
    (void)f;
    if (type == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

static void remove_dir(void) {
    if (H.srv) coord_server_close(H.srv);
    H.srv = NULL;
    guard_conn_release_all(&H.conns, NULL);
    if (H.tick) event_free(H.tick);
    vl_buf_free(&H.resp);
    /* The database, its -wal, -shm, -bodies/ and -nonces, the corpus, the socket. */
    nftw(H.dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* A corpus of text-like bytes: enough for tasks and a validation slice. */
static void make_corpus(const char *path) {
    static const char words[][12] = {"the ", "model ", "peer ", "learns ", "a ",       "version ",
                                     "of ",  "data ",  "and ",  "sends ",  "updates. "};
    vl_buf b;
    vl_buf_init(&b, 1 << 20);
    vl_rng r;
    vl_rng_seed(&r, 11);
    while (b.len < 32768)
        FUZZ_CHECK(vl_buf_append_str(&b, words[vl_rng_below(&r, sizeof words / sizeof words[0])]) ==
                       0,
                   "corpus");
    write_file(path, b.data, b.len);
    vl_buf_free(&b);
}

/* Only wakes the loop. */
static void tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    (void)arg;
}

static void setup_run(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(H.dir, sizeof H.dir, "%s/volley-fuzz-http.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    FUZZ_CHECK(mkdtemp(H.dir) != NULL, "mkdtemp %s: %s", H.dir, strerror(errno));
    atexit(remove_dir);
    char corpus[700], config[700], db[700];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", H.dir);
    snprintf(config, sizeof config, "%s/run.json", H.dir);
    snprintf(db, sizeof db, "%s/run.db", H.dir);
    make_corpus(corpus);
    char json[2048];
    int n = snprintf(json, sizeof json,
                     "{\"name\": \"fuzz\", \"corpus\": \"%s\", \"seed\": 3,"
                     " \"model\": {\"vocab_size\": 256, \"block_size\": 8, \"n_layer\": 1,"
                     " \"n_head\": 2, \"n_embd\": 8},"
                     " \"mode\": \"sync\", \"updates_per_version\": 2, \"max_versions\": 100000,"
                     " \"train\": {\"steps\": 2, \"batch\": 2, \"lr\": 0.001},"
                     " \"compression\": {\"kind\": \"sketch\", \"rows\": 3, \"cols\": 64,"
                     " \"seed\": 5, \"second_round\": 1, \"round_s\": 1},"
                     " \"task_bytes\": 256, \"lease_s\": 3, \"max_body_bytes\": 65536,"
                     " \"val_batches\": 1}",
                     corpus);
    FUZZ_CHECK(n > 0 && (size_t)n < sizeof json, "config");
    write_file(config, json, (size_t)n);
    vl_error e = {0};
    FUZZ_CHECK(coord_cmd_init(db, config, &e) == VL_OK, "init: %s", e.msg);

    /* The two peers and the join token, as `token create` and two joins
     * would leave them. */
    storage *st = NULL;
    FUZZ_CHECK(storage_open(db, 0, &st, &e) == VL_OK, "%s", e.msg);
    char hash[VCRYPTO_HASH_HEX + 1];
    vcrypto_hash_hex(FUZZ_HTTP_TOKEN, strlen(FUZZ_HTTP_TOKEN), hash);
    int64_t now = vl_clock_unix_s(), token = 0;
    FUZZ_CHECK(storage_token_insert(st, hash, INT32_MAX, now + 86400 * 365, now, &token, &e) ==
                   VL_OK,
               "%s", e.msg);
    for (int i = 0; i < 3; i++) {
        uint8_t seed[32];
        memset(seed, FUZZ_HTTP_KEY_SEED(i), sizeof seed);
        FUZZ_CHECK(crypto_sign_seed_keypair(H.keys[i].pk, H.keys[i].sk, seed) == 0, "keypair");
    }
    for (int i = 0; i < 2; i++) {
        int64_t id = 0;
        FUZZ_CHECK(storage_peer_insert(st, H.keys[i].pk, i ? "fuzz-2" : "fuzz-1", "{}", token, now,
                                       &id, &e) == VL_OK &&
                       id == i + 1,
                   "peer %d: %s", i + 1, e.msg);
    }
    storage_close(st);

    /* Rate limits high enough never to refuse the fuzzer (their code
     * still runs on every request); no slow-client timer, which acts on
     * the clock rather than on the input. */
    coord_limits limits;
    coord_limits_default(&limits);
    limits.peer = (coord_rate){.rate = 1e9, .burst = 1e9};
    limits.addr = (coord_rate){.rate = 1e9, .burst = 1e9};
    limits.slow_timeout_s = 0;
    FUZZ_CHECK(coord_server_open(db, &limits, &H.srv, &e) == VL_OK, "open: %s", e.msg);
    evhttp_set_bevcb(H.srv->conns.http, make_bev, NULL);
    evhttp_set_gencb(H.srv->conns.http, on_request, H.srv);
    snprintf(H.sock, sizeof H.sock, "%s/http.sock", H.dir);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    FUZZ_CHECK(fd >= 0 && strlen(H.sock) < sizeof sa.sun_path, "unix socket");
    memcpy(sa.sun_path, H.sock, strlen(H.sock) + 1);
    FUZZ_CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 64) == 0,
               "listen on %s: %s", H.sock, strerror(errno));
    FUZZ_CHECK(evhttp_accept_socket(H.srv->conns.http, fd) == 0, "evhttp_accept_socket");
    coord_expire_leases(H.srv);
    H.tick = evtimer_new(H.srv->base, tick, NULL);
    FUZZ_CHECK(H.tick != NULL, "timer");
    vl_buf_init(&H.resp, RESPONSE_CAP);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    FUZZ_CHECK(vcrypto_init() == VL_OK, "libsodium");
    setup_run();
    return 0;
}

/* ---- one exchange -------------------------------------------------------- */

static int server_busy(void) {
    coord_server *s = H.srv;
    return s->conns.inflight > 0 || s->sched.n_waiters > 0 ||
           coord_writer_pending(s->run.writer) > 0;
}

/* Bytes the server has not read from the socket yet. */
static int unread(int fd) {
    int q = 0;
    return ioctl(fd, TIOCOUTQ, &q) == 0 ? q : 0;
}

/* Sends the bytes on a new connection and collects everything the server
 * answers until it closes; the client's side is shut for writing once the
 * server has read everything and has nothing left in progress. */
static void exchange(const uint8_t *data, size_t n) {
    vl_buf_reset(&H.resp);
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, H.sock, strlen(H.sock) + 1);
    FUZZ_CHECK(c >= 0, "socket: %s", strerror(errno));
    double end = vl_clock_mono_s() + EXCHANGE_LIMIT_S;
    while (connect(c, (struct sockaddr *)&sa, sizeof sa) != 0) {
        FUZZ_CHECK(errno == EAGAIN || errno == EINTR, "connect: %s", strerror(errno));
        event_base_loop(H.srv->base, EVLOOP_NONBLOCK);
        FUZZ_CHECK(vl_clock_mono_s() < end, "cannot connect");
    }
    size_t off = 0;
    int shut = 0, quiet = 0;
    for (;;) {
        if (off < n) {
            ssize_t w = send(c, data + off, n - off, MSG_NOSIGNAL);
            if (w > 0)
                off += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR)
                off = n; /* it closed */
        }
        /* Waiting on the server's threads: block briefly in the loop. */
        int busy = server_busy();
        if (busy || shut) {
            struct timeval tv = {0, 1000};
            evtimer_add(H.tick, &tv);
            event_base_loop(H.srv->base, EVLOOP_ONCE);
        } else {
            event_base_loop(H.srv->base, EVLOOP_NONBLOCK);
        }
        int eof = 0;
        for (;;) {
            uint8_t tmp[16384];
            ssize_t r = recv(c, tmp, sizeof tmp, 0);
            if (r > 0) {
                size_t keep = H.resp.cap - H.resp.len;
                if (keep > (size_t)r) keep = (size_t)r;
                FUZZ_CHECK(vl_buf_append(&H.resp, tmp, keep) == 0, "response buffer");
                continue;
            }
            if (r == 0 || (errno != EAGAIN && errno != EINTR)) eof = 1;
            break;
        }
        if (eof) break;
        /* Long polls would hold the exchange for their whole wait. */
        if (off == n && H.srv->sched.n_waiters > 0 &&
            (int64_t)H.srv->sched.n_waiters == H.srv->conns.inflight)
            coord_drain_waiters(H.srv);
        if (off == n && !shut && !server_busy() && unread(c) == 0) {
            if (++quiet >= 2) {
                shutdown(c, SHUT_WR);
                shut = 1;
            }
        } else {
            quiet = 0;
        }
        FUZZ_CHECK(vl_clock_mono_s() < end,
                   "the exchange did not end in %.0f s (%zu of %zu bytes "
                   "sent, %zu answered)",
                   EXCHANGE_LIMIT_S, off, n, H.resp.len);
    }
    close(c);
    /* The server side is closed, so its bufferevent is gone; guards whose
     * connection never had a request were not told. */
    guard_conn_release_all(&H.conns, H.srv);
}

/* ---- checking the answers ------------------------------------------------ */

/* The first answer: its status, and for an error its JSON body. */
static void check_first(const uint8_t *r, size_t len, int head) {
    if (len < 12) return;
    FUZZ_CHECK(memcmp(r, "HTTP/1.1 ", 9) == 0 || memcmp(r, "HTTP/1.0 ", 9) == 0,
               "not an HTTP answer: %.40s", (const char *)r);
    int status = (r[9] - '0') * 100 + (r[10] - '0') * 10 + (r[11] - '0');
    if (status < 400 || head) return;
    const uint8_t *end = memmem(r, len, "\r\n\r\n", 4);
    FUZZ_CHECK(end != NULL, "an answer without the end of its head");
    size_t hlen = (size_t)(end - r) + 4;
    char *head_text = fuzz_cstr(r, hlen);
    const char *ct = strcasestr(head_text, "\r\nContent-Type: application/json");
    const char *cl = strcasestr(head_text, "\r\nContent-Length: ");
    FUZZ_CHECK(ct != NULL, "a %d answer that is not JSON:\n%s", status, head_text);
    /* Without a length (HTTP/1.0) the body runs to the close. */
    size_t blen = cl ? strtoul(cl + 18, NULL, 10) : len - hlen;
    free(head_text);
    if (hlen + blen > len) return; /* cut by the response cap */
    json_t *o = json_loadb((const char *)r + hlen, blen, 0, NULL);
    json_t *err = json_object_get(o, "error");
    FUZZ_CHECK(json_is_string(json_object_get(err, "code")) &&
                   json_is_string(json_object_get(err, "message")),
               "a %d answer without an error code and message: %.*s", status, (int)blen,
               (const char *)r + hlen);
    json_decref(o);
}

static void check_answers(int head) {
    const uint8_t *r = H.resp.data;
    size_t len = H.resp.len;
    check_first(r, len, head);
    /* Every answer's status line, wherever in the stream it starts. */
    for (size_t i = 0; i + 12 <= len; i++) {
        if (i > 0 && r[i - 1] != '\n') continue;
        if (memcmp(r + i, "HTTP/1.", 7) != 0 || r[i + 8] != ' ' || r[i + 9] != '5') continue;
        FUZZ_CHECK(memcmp(r + i + 9, "503", 3) == 0, "a server error:\n%.*s",
                   (int)(len - i < 600 ? len - i : 600), (const char *)r + i);
    }
}

/* ---- signed requests ----------------------------------------------------- */

/* Builds the request a peer would send from a signed input; 0 when the
 * input does not make one. */
static int build_signed(const uint8_t *data, size_t n, vl_buf *out, int *head) {
    if (n < 2) return 0;
    int who = data[1] % 4;
    data += 2;
    n -= 2;
    const uint8_t *nl = memchr(data, '\n', n);
    if (!nl) return 0;
    char *line = fuzz_cstr(data, (size_t)(nl - data));
    char *sp = strchr(line, ' ');
    size_t hdr_at = (size_t)(nl - data) + 1;
    /* Extra header lines run to the first empty line. */
    size_t hdr_end = hdr_at;
    while (hdr_end < n && data[hdr_end] != '\n') {
        const uint8_t *e = memchr(data + hdr_end, '\n', n - hdr_end);
        hdr_end = e ? (size_t)(e - data) + 1 : n;
    }
    const uint8_t *body = data + (hdr_end < n ? hdr_end + 1 : n);
    size_t blen = n - (size_t)(body - data);
    int ok = sp != NULL && strlen(line) == (size_t)(nl - data);
    if (ok) {
        *sp = '\0';
        const char *method = line, *target = sp + 1;
        *head = strcmp(method, "HEAD") == 0;
        const vcrypto_identity *id = &H.keys[who == 1 ? 1 : who == 2 ? 2 : 0];
        int64_t peer = who == 0 ? 1 : who == 1 ? 2 : who == 2 ? 0 : 3;
        char keyid[VCRYPTO_PK_B64_LEN + 24];
        if (peer > 0)
            snprintf(keyid, sizeof keyid, "%lld", (long long)peer);
        else
            vcrypto_pk_encode(id->pk, keyid);
        int has_body = blen > 0 || strcmp(method, "POST") == 0;
        vcrypto_signed_headers sh;
        ok = vcrypto_sign_http(id, keyid, method, target, has_body, body, blen, vl_clock_unix_s(),
                               &sh) == VL_OK;
        if (ok)
            ok = vl_buf_printf(out,
                               "%s %s HTTP/1.1\r\nHost: fuzz\r\nSignature-Input: %s\r\n"
                               "Signature: %s\r\n",
                               method, target, sh.signature_input, sh.signature) == 0;
        if (ok && has_body)
            ok = vl_buf_printf(out, "Content-Digest: %s\r\n", sh.content_digest) == 0;
        for (size_t i = hdr_at; ok && i < hdr_end;) {
            const uint8_t *e = memchr(data + i, '\n', hdr_end - i);
            size_t l = (size_t)(e - (data + i));
            ok = vl_buf_append(out, data + i, l) == 0 && vl_buf_append_str(out, "\r\n") == 0;
            i += l + 1;
        }
        if (ok && (blen > 0 || strcmp(method, "POST") == 0))
            ok = vl_buf_printf(out, "Content-Length: %zu\r\n", blen) == 0;
        if (ok) ok = vl_buf_append_str(out, "\r\n") == 0 && vl_buf_append(out, body, blen) == 0;
    }
    free(line);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int head = 0;
    if (data[0] & 1) {
        vl_buf req;
        vl_buf_init(&req, (size_t)1 << 24);
        if (build_signed(data, size, &req, &head)) {
            exchange(req.data, req.len);
            check_answers(head);
        }
        vl_buf_free(&req);
        return 0;
    }
    head = size >= 5 && memcmp(data + 1, "HEAD", 4) == 0;
    exchange(data + 1, size - 1);
    check_answers(head);
    return 0;
}
