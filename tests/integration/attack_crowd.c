/* Crowds on one coordinator, each with its own joined keys: peers behind
 * one NAT address, most of them holding long-polls, with newcomers whose
 * heads come late (nat); and a few keys that announce the largest body
 * the run allows, send a little of it and go quiet, beside an honest
 * upload (bodies). Both modes join their own peers with one token of
 * enough uses, over plain blocking TLS sockets so that hundreds of
 * connections stay open at once. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/ssl.h>

#include "attack.h"

typedef struct member {
    vcrypto_identity id;
    int64_t peer;
    int fd;
    SSL *ssl;
} member;

static void pause_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Joins m with a fresh key; 0, or -1 when the coordinator did not
 * answer 201. */
static int join(const ctx *c, member *m, const char *token, int i) {
    vcrypto_identity_generate(&m->id);
    char b64[VCRYPTO_PK_B64_LEN + 1], body[512];
    vcrypto_pk_encode(m->id.pk, b64);
    snprintf(body, sizeof body, "{\"public_key\":\"%s\",\"token\":\"%s\",\"name\":\"crowd-%d\"}",
             b64, token, i);
    reply r;
    request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, &m->id, 0, 0, &r);
    json_t *j = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    m->peer = json_integer_value(json_object_get(j, "peer_id"));
    json_decref(j);
    int ok = r.status == 201 && m->peer > 0;
    if (!ok) fprintf(stderr, "crowd: join %d answered %ld %s\n", i, r.status, r.code);
    vl_buf_free(&r.body);
    return ok ? 0 : -1;
}

/* A TLS connection to the coordinator, handshake done; 0 or -1. */
static int dial(const ctx *c, SSL_CTX *sc, member *m) {
    const char *hp = strstr(c->url, "://");
    int port = atoi(strrchr(hp, ':') + 1);
    m->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {30, 0};
    setsockopt(m->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(m->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(m->fd, (struct sockaddr *)&sa, sizeof sa) != 0) return -1;
    m->ssl = SSL_new(sc);
    if (SSL_set_fd(m->ssl, m->fd) != 1 || SSL_connect(m->ssl) != 1) return -1;
    return 0;
}

static void hang_up(member *m) {
    if (m->ssl) SSL_free(m->ssl);
    if (m->fd >= 0) close(m->fd);
    m->ssl = NULL;
    m->fd = -1;
}

/* The head of a request signed by m (LF lines made CRLF), with
 * Content-Length len when body is given. */
static int head_of(const member *m, const char *method, const char *target, const void *body,
                   size_t len, char *out, size_t cap) {
    char lines[ATTACK_SIG_LINES], crlf[ATTACK_SIG_LINES + 16];
    if (sign_lines(&m->id, m->peer, method, target, body, len, vl_clock_unix_s(), lines,
                   sizeof lines) != 0)
        return -1;
    crlf_lines(lines, crlf, sizeof crlf);
    int n = body ? snprintf(out, cap,
                            "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                            "application/octet-stream\r\n%s\r\nContent-Length: %zu\r\n\r\n",
                            method, target, crlf, len)
                 : snprintf(out, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n\r\n", method,
                            target, crlf);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* The status of the answer read on m, -1 when the connection ended
 * without one. */
static long read_status(member *m) {
    char buf[512];
    int n = SSL_read(m->ssl, buf, sizeof buf - 1);
    if (n <= 0) return -1;
    buf[n] = '\0';
    long st = -1;
    if (sscanf(buf, "HTTP/1.%*d %ld", &st) != 1) return -1;
    return st;
}

static SSL_CTX *client_ctx(const ctx *c) {
    SSL_CTX *sc = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(sc, c->ca, NULL);
    SSL_CTX_set_verify(sc, SSL_VERIFY_PEER, NULL);
    return sc;
}

int attack_nat(ctx *c, const char *token, int holders, int newcomers) {
    int n = holders + newcomers;
    member *m = calloc((size_t)n, sizeof *m);
    SSL_CTX *sc = client_ctx(c);
    if (!m || !sc) return -1;
    for (int i = 0; i < n; i++) {
        m[i].fd = -1;
        if (join(c, &m[i], token, i) != 0) return -1;
    }
    /* The holders: each a long-poll for a task, all from 127.0.0.1. */
    int held = 0;
    char head[ATTACK_SIG_LINES + 512];
    for (int i = 0; i < holders; i++) {
        if (dial(c, sc, &m[i]) != 0 ||
            head_of(&m[i], "GET", "/v1/task?wait=60", NULL, 0, head, sizeof head) != 0 ||
            SSL_write(m[i].ssl, head, (int)strlen(head)) <= 0) {
            fprintf(stderr, "crowd: holder %d could not send its long-poll\n", i);
            continue;
        }
        held++;
    }
    pause_s(1.5); /* several of the server's ticks */
    /* The newcomers: handshake, then their heads 0.6 s later, as a peer
     * two round trips away would send them. */
    int dialed = 0;
    for (int i = holders; i < n; i++) dialed += dial(c, sc, &m[i]) == 0;
    pause_s(0.6);
    int served = 0;
    for (int i = holders; i < n; i++) {
        if (!m[i].ssl || head_of(&m[i], "GET", "/v1/task?wait=0", NULL, 0, head, sizeof head) != 0)
            continue;
        if (SSL_write(m[i].ssl, head, (int)strlen(head)) <= 0) continue;
        long st = read_status(&m[i]);
        served += st >= 200;
    }
    char want[96], got[96];
    snprintf(want, sizeof want, "%d of %d newcomers answered", newcomers, newcomers);
    snprintf(got, sizeof got, "%d of %d newcomers answered (%d handshakes, %d long-polls held)",
             served, newcomers, dialed, held);
    record("newcomers behind one address beside its long-polls", want,
           served == newcomers ? want : got, served == newcomers && held == holders);
    printf("nat: %d long-polls held, %d of %d newcomers served\n", held, served, newcomers);
    for (int i = 0; i < n; i++) hang_up(&m[i]);
    free(m);
    SSL_CTX_free(sc);
    return 0;
}

int attack_bodies(ctx *c, const char *token, int keys, size_t announce, size_t sent) {
    member *m = calloc((size_t)keys + 1, sizeof *m);
    uint8_t *body = malloc(announce);
    SSL_CTX *sc = client_ctx(c);
    if (!m || !body || !sc) return -1;
    memset(body, 0x5a, announce);
    for (int i = 0; i <= keys; i++) {
        m[i].fd = -1;
        if (join(c, &m[i], token, i) != 0) return -1;
    }
    /* Each key: a signed head announcing the whole length, part of the
     * body, then silence. */
    char head[ATTACK_SIG_LINES + 512];
    int started = 0;
    double t0 = vl_clock_mono_s();
    for (int i = 0; i < keys; i++) {
        if (dial(c, sc, &m[i]) != 0 ||
            head_of(&m[i], "POST", "/v1/updates", body, announce, head, sizeof head) != 0 ||
            SSL_write(m[i].ssl, head, (int)strlen(head)) <= 0 ||
            SSL_write(m[i].ssl, body, (int)sent) <= 0) {
            fprintf(stderr, "crowd: key %d could not start its body\n", i);
            continue;
        }
        started++;
    }
    pause_s(1);
    /* An honest upload of 2 MiB by the last key: it must be read and
     * judged (here 4xx: it names no task of its own), not turned away
     * for want of budget. */
    size_t honest = 2u << 20;
    const member *h = &m[keys];
    reply r;
    double u0 = vl_clock_mono_s();
    req_opts o = {.method = "POST",
                  .target = "/v1/updates",
                  .body = body,
                  .len = honest,
                  .key = &h->id,
                  .peer = h->peer};
    send_req(c, &o, &r);
    double upload_s = vl_clock_mono_s() - u0;
    long honest_status = r.status;
    char honest_code[64];
    snprintf(honest_code, sizeof honest_code, "%s", r.code);
    vl_buf_free(&r.body);
    char want[128], got[160];
    snprintf(want, sizeof want, "not 503 overloaded");
    snprintf(got, sizeof got, "%ld %s", honest_status, honest_code);
    record("an honest 2 MiB upload while keys hold announced bodies", want,
           honest_status == 503 ? got : want, honest_status > 0 && honest_status != 503);
    printf("bodies: %d keys announced %zu bytes and sent %zu; an honest upload answered %ld %s "
           "in %.2f s\n",
           started, announce, sent, honest_status, honest_code, upload_s);
    /* The quiet bodies are cut off once a window passes without the
     * minimum rate, long before their length at that rate. */
    int cut = 0;
    double last = 0;
    for (int i = 0; i < keys; i++) {
        if (!m[i].ssl) continue;
        char tmp[256];
        errno = 0;
        int n = SSL_read(m[i].ssl, tmp, sizeof tmp);
        /* A read that timed out (30 s) is no cut. */
        if (n <= 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            cut++;
            double t = vl_clock_mono_s() - t0;
            if (t > last) last = t;
        }
    }
    snprintf(want, sizeof want, "%d quiet bodies cut off within 30 s", keys);
    snprintf(got, sizeof got, "%d cut off, the last after %.1f s", cut, last);
    record("quiet bodies cut off", want, cut == keys && last <= 30 ? want : got,
           cut == keys && last <= 30);
    printf("bodies: %d of %d quiet bodies cut off, the last after %.1f s\n", cut, keys, last);
    for (int i = 0; i <= keys; i++) hang_up(&m[i]);
    free(m);
    free(body);
    SSL_CTX_free(sc);
    return 0;
}

int attack_revoke_mid_body(ctx *c, const char *token, const char *revoke_cmd) {
    member m = {.fd = -1};
    size_t len = 2u << 20;
    uint8_t *body = malloc(len);
    SSL_CTX *sc = client_ctx(c);
    if (!body || !sc || join(c, &m, token, 0) != 0) return -1;
    memset(body, 0x5a, len);
    char head[ATTACK_SIG_LINES + 512], cmd[1024];
    if (dial(c, sc, &m) != 0 ||
        head_of(&m, "POST", "/v1/updates", body, len, head, sizeof head) != 0 ||
        SSL_write(m.ssl, head, (int)strlen(head)) <= 0 ||
        SSL_write(m.ssl, body, (int)(len / 2)) <= 0)
        return -1;
    /* The operator revokes the peer while its body is still arriving. */
    snprintf(cmd, sizeof cmd, "%s %lld", revoke_cmd, (long long)m.peer);
    int rc = system(cmd);
    long st = -1;
    if (SSL_write(m.ssl, body + len / 2, (int)(len - len / 2)) > 0) st = read_status(&m);
    char got[64];
    snprintf(got, sizeof got, "%ld", st);
    record("a body finished after its peer was revoked", "403", st == 403 ? "403" : got,
           rc == 0 && st == 403);
    hang_up(&m);
    free(body);
    SSL_CTX_free(sc);
    return 0;
}
