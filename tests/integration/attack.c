/* Sends the coordinator one kind of bad request after another and checks
 * each answer's status and JSON error code. Two phases, so the test script
 * can snapshot the database in between:
 *
 *   attack prepare URL CA DIR TOKEN BADTOKEN   joins, takes a task lease,
 *                                              saves DIR/attack.state
 *   attack run URL CA DIR                      the bad requests; none may
 *                                              change anything stored
 *
 * Prints one line per case and "N passed, N failed" at the end. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "compress/compress.h"
#include "crypto/crypto.h"

typedef struct {
    const char *url, *ca;
    char token[CRYPTO_TOKEN_LEN + 1];
    crypto_identity id;
    int64_t peer, task, base_version;
    size_t n_params;
    char run[64];
} ctx;

typedef struct {
    long status;
    char code[64];
    buf body;
} reply;

static int passed, failed;

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
    return buf_append((buf *)ud, p, sz * n) == VL_OK ? sz * n : 0;
}

/* One request. auth: NULL = sign honestly as c->peer, "" = none, else the
 * literal header value. sign_body, when given, is what the signature
 * covers instead of the body actually sent. */
static void request(const ctx *c, const char *method, const char *target, const char *auth,
                    const void *body, size_t len, const void *sign_body, size_t sign_len,
                    const crypto_identity *key, int64_t peer, int64_t ts, reply *r) {
    memset(r, 0, sizeof *r);
    buf_init(&r->body, 64u << 20);
    char url[512], hdr[CRYPTO_AUTH_MAX + 32], val[CRYPTO_AUTH_MAX];
    snprintf(url, sizeof url, "%s%s", c->url, target);
    CURL *h = curl_easy_init();
    struct curl_slist *hs = NULL;
    if (!auth) {
        if (crypto_sign_request(key ? key : &c->id, peer, method, target,
                                sign_body ? sign_body : body, sign_body ? sign_len : len,
                                ts ? ts : clock_unix_s(), val, sizeof val) != VL_OK)
            abort();
        snprintf(hdr, sizeof hdr, "Authorization: %s", val);
        hs = curl_slist_append(hs, hdr);
    } else if (*auth) {
        snprintf(hdr, sizeof hdr, "Authorization: %s", auth);
        hs = curl_slist_append(hs, hdr);
    }
    hs = curl_slist_append(hs, "Content-Type: application/octet-stream");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CAINFO, c->ca);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    CURLcode rc = curl_easy_perform(h);
    if (rc != CURLE_OK) {
        fprintf(stderr, "attack: %s %s: %s\n", method, target, curl_easy_strerror(rc));
        r->status = -1;
    } else {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    }
    json_t *j = r->body.len ? json_loadb((const char *)r->body.data, r->body.len, 0, NULL) : NULL;
    const char *code = j ? json_string_value(json_object_get(json_object_get(j, "error"), "code"))
                         : NULL;
    snprintf(r->code, sizeof r->code, "%s", code ? code : "");
    json_decref(j);
    curl_slist_free_all(hs);
    curl_easy_cleanup(h);
}

static void expect(const char *name, reply *r, long status, const char *code) {
    int ok = r->status == status && (!code || strcmp(r->code, code) == 0);
    printf("%s %-34s want %ld %-18s got %ld %s\n", ok ? "PASS" : "FAIL", name, status,
           code ? code : "-", r->status, r->code[0] ? r->code : "-");
    ok ? passed++ : failed++;
    buf_free(&r->body);
}

static void update_body(const ctx *c, buf *out, const char *run, int64_t base, size_t n,
                        float poison) {
    float *d = calloc(n, sizeof *d);
    if (!d) abort();
    for (size_t i = 0; i < n; i++) d[i] = 1e-4f * (float)(i % 7);
    d[n / 2] = poison;
    compress_update_meta m = {0};
    snprintf(m.run, sizeof m.run, "%s", run);
    m.task = c->task;
    m.peer = c->peer;
    m.base_version = base;
    m.kind = COMPRESS_DENSE;
    m.num_samples = 10;
    m.local_steps = 1;
    m.loss = 5.0;
    buf_init(out, BUF_DEFAULT_CAP);
    vl_error e;
    if (compress_update_encode_dense(&m, d, n, ST_F32, out, &e) != VL_OK) abort();
    free(d);
}

/* Raw TLS: for requests whose framing libcurl would not send as written. */
static void raw(const ctx *c, const char *head, const char *tail, reply *r) {
    memset(r, 0, sizeof *r);
    buf_init(&r->body, 1 << 20);
    r->status = -1;
    const char *hp = strstr(c->url, "://");
    int port = atoi(strrchr(hp, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    SSL_CTX *sc = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(sc, c->ca, NULL);
    SSL_CTX_set_verify(sc, SSL_VERIFY_PEER, NULL);
    SSL *s = SSL_new(sc);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && SSL_set_fd(s, fd) == 1 &&
        SSL_connect(s) == 1) {
        SSL_write(s, head, (int)strlen(head));
        if (tail) SSL_write(s, tail, (int)strlen(tail));
        char tmp[4096];
        int n;
        while ((n = SSL_read(s, tmp, sizeof tmp)) > 0)
            if (buf_append(&r->body, tmp, (size_t)n) != VL_OK) break;
        const char *t = (const char *)r->body.data;
        if (t && strncmp(t, "HTTP/1.1 ", 9) == 0) r->status = atol(t + 9);
        const char *js = t ? strstr(t, "\r\n\r\n") : NULL;
        json_t *j = js ? json_loads(js + 4, 0, NULL) : NULL;
        const char *code =
            j ? json_string_value(json_object_get(json_object_get(j, "error"), "code")) : NULL;
        snprintf(r->code, sizeof r->code, "%s", code ? code : "");
        json_decref(j);
    }
    SSL_free(s);
    SSL_CTX_free(sc);
    close(fd);
}

static int load_state(ctx *c, const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/attack.key", dir);
    vl_error e;
    if (crypto_identity_load(&c->id, path, &e) != VL_OK) {
        fprintf(stderr, "attack: %s\n", e.msg);
        return -1;
    }
    snprintf(path, sizeof path, "%s/attack.state", dir);
    json_t *j = json_load_file(path, 0, NULL);
    if (!j) return -1;
    c->peer = json_integer_value(json_object_get(j, "peer"));
    c->task = json_integer_value(json_object_get(j, "task"));
    c->base_version = json_integer_value(json_object_get(j, "base_version"));
    c->n_params = (size_t)json_integer_value(json_object_get(j, "n_params"));
    const char *tok = json_string_value(json_object_get(j, "token"));
    snprintf(c->token, sizeof c->token, "%s", tok ? tok : "");
    snprintf(c->run, sizeof c->run, "%s", json_string_value(json_object_get(j, "run")));
    json_decref(j);
    return 0;
}

static int prepare(ctx *c, const char *dir, const char *token, const char *badtoken) {
    reply r;
    char path[512];
    snprintf(path, sizeof path, "%s/attack.key", dir);
    crypto_identity_generate(&c->id);
    vl_error e;
    if (crypto_identity_save(&c->id, path, 1, &e) != VL_OK) return -1;
    char pk[CRYPTO_PK_B64_LEN + 1], body[512];
    crypto_pk_encode(c->id.pk, pk);
    /* A bad token first: refused, and it must not register the key. */
    snprintf(body, sizeof body, "{\"public_key\":\"%s\",\"token\":\"%s\",\"name\":\"attacker\"}",
             pk, badtoken);
    request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, NULL, 0, 0, &r);
    expect("join with an unknown token", &r, 403, "invalid_token");
    snprintf(body, sizeof body, "{\"public_key\":\"%s\",\"token\":\"%s\",\"name\":\"attacker\"}",
             pk, token);
    request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, NULL, 0, 0, &r);
    json_t *j = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    c->peer = json_integer_value(json_object_get(j, "peer_id"));
    json_decref(j);
    expect("join with a valid token", &r, 201, NULL);
    /* The reply was lost: the same key joins again with its one-use token. */
    request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, NULL, 0, 0, &r);
    j = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    int same = json_integer_value(json_object_get(j, "peer_id")) == c->peer;
    json_decref(j);
    expect("join again with the used-up token", &r, 200, NULL);
    if (!same) {
        printf("FAIL join again returned another peer id\n");
        failed++;
    }
    request(c, "GET", "/v1/task?wait=30", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    j = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    c->task = json_integer_value(json_object_get(j, "task_id"));
    c->base_version = json_integer_value(json_object_get(j, "base_version"));
    snprintf(c->run, sizeof c->run, "%s", json_string_value(json_object_get(j, "run")));
    json_decref(j);
    expect("take a task lease", &r, 200, NULL);
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    st_file f;
    size_t n = 0;
    if (st_parse(r.body.data, r.body.len, &f, &e) == VL_OK) {
        for (int i = 0; i < f.ntensors; i++) n += f.tensors[i].numel;
        st_free(&f);
    }
    c->n_params = n;
    expect("download the model", &r, 200, NULL);
    j = json_pack("{sI sI sI sI ss ss}", "peer", (json_int_t)c->peer, "task",
                  (json_int_t)c->task, "base_version", (json_int_t)c->base_version, "n_params",
                  (json_int_t)n, "run", c->run, "token", token);
    snprintf(path, sizeof path, "%s/attack.state", dir);
    json_dump_file(j, path, 0);
    json_decref(j);
    return 0;
}

static void attack(ctx *c, const char *badtoken) {
    reply r;
    char hdr[CRYPTO_AUTH_MAX];
    crypto_identity other;
    crypto_identity_generate(&other);

    request(c, "GET", "/v1/task", "", NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("no Authorization header", &r, 401, "unauthorized");
    request(c, "GET", "/v1/task", "Bearer hunter2", NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("wrong auth scheme", &r, 401, "unauthorized");
    request(c, "GET", "/v1/task", "Volley-Ed25519 peer=1,ts=2", NULL, 0, NULL, 0, NULL, 0, 0, &r);
    expect("truncated Authorization", &r, 401, "unauthorized");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, &other, c->peer, 0, &r);
    expect("signed with another key", &r, 401, "bad_signature");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, 987654, 0, &r);
    expect("unknown peer id", &r, 401, "unknown_peer");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, c->peer,
            clock_unix_s() - 1000, &r);
    expect("timestamp 1000 s old", &r, 401, "stale_timestamp");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, c->peer,
            clock_unix_s() + 1000, &r);
    expect("timestamp 1000 s ahead", &r, 401, "stale_timestamp");

    /* A replay: the same header twice. The first is honest and harmless. */
    if (crypto_sign_request(&c->id, c->peer, "GET", "/v1/model", NULL, 0, clock_unix_s(), hdr,
                            sizeof hdr) != VL_OK)
        abort();
    request(c, "GET", "/v1/model", hdr, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("first use of a nonce", &r, 200, NULL);
    request(c, "GET", "/v1/model", hdr, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("replayed nonce", &r, 401, "replayed_nonce");

    buf good, nan_b, shape_b, run_b, ver_b;
    update_body(c, &good, c->run, c->base_version, c->n_params, 0.0f);
    update_body(c, &nan_b, c->run, c->base_version, c->n_params, NAN);
    update_body(c, &shape_b, c->run, c->base_version, c->n_params - 1, 0.0f);
    update_body(c, &run_b, "another-run", c->base_version, c->n_params, 0.0f);
    update_body(c, &ver_b, c->run, c->base_version + 7, c->n_params, 0.0f);

    /* The body is altered after signing. */
    buf tampered;
    buf_init(&tampered, BUF_DEFAULT_CAP);
    if (buf_append(&tampered, good.data, good.len) != VL_OK) abort();
    tampered.data[tampered.len - 1] ^= 0x40;
    request(c, "POST", "/v1/updates", NULL, tampered.data, tampered.len, good.data, good.len,
            NULL, c->peer, 0, &r);
    expect("body altered after signing", &r, 401, "bad_signature");
    buf_free(&tampered);

    request(c, "POST", "/v1/updates", NULL, "not safetensors", 15, NULL, 0, NULL, c->peer, 0, &r);
    expect("malformed update body", &r, 400, "malformed_update");
    request(c, "POST", "/v1/updates", NULL, good.data, 40, NULL, 0, NULL, c->peer, 0, &r);
    expect("truncated update body", &r, 400, "malformed_update");
    request(c, "POST", "/v1/updates", NULL, nan_b.data, nan_b.len, NULL, 0, NULL, c->peer, 0, &r);
    expect("NaN in the delta", &r, 422, "non_finite");
    request(c, "POST", "/v1/updates", NULL, shape_b.data, shape_b.len, NULL, 0, NULL, c->peer, 0,
            &r);
    expect("delta of the wrong shape", &r, 422, "bad_shape");
    request(c, "POST", "/v1/updates", NULL, run_b.data, run_b.len, NULL, 0, NULL, c->peer, 0, &r);
    expect("update for another run", &r, 422, "wrong_run");
    request(c, "POST", "/v1/updates", NULL, ver_b.data, ver_b.len, NULL, 0, NULL, c->peer, 0, &r);
    expect("base version not the task's", &r, 422, "wrong_version");
    c->task += 100000;
    buf unk;
    update_body(c, &unk, c->run, c->base_version, c->n_params, 0.0f);
    c->task -= 100000;
    request(c, "POST", "/v1/updates", NULL, unk.data, unk.len, NULL, 0, NULL, c->peer, 0, &r);
    expect("update for an unknown task", &r, 404, "unknown_task");
    buf_free(&unk);
    buf_free(&good);
    buf_free(&nan_b);
    buf_free(&shape_b);
    buf_free(&run_b);
    buf_free(&ver_b);

    request(c, "POST", "/v1/peers", NULL, "{\"public_key\":", 14, NULL, 0, NULL, 0, 0, &r);
    expect("join with malformed JSON", &r, 400, "bad_request");
    char pk[CRYPTO_PK_B64_LEN + 1], body[512];
    crypto_pk_encode(other.pk, pk);
    snprintf(body, sizeof body, "{\"public_key\":\"%s\",\"token\":\"%s\",\"name\":\"x\"}", pk,
             badtoken);
    request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, &other, 0, 0, &r);
    expect("join with an unknown token", &r, 403, "invalid_token");
    /* The used-up token cannot admit a new key. */
    snprintf(body, sizeof body, "{\"public_key\":\"%s\",\"token\":\"%s\",\"name\":\"x\"}", pk,
             c->token);
    request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, &other, 0, 0, &r);
    expect("used-up token for a new key", &r, 403, "invalid_token");
    snprintf(body, sizeof body, "{\"public_key\":\"%s\",\"token\":\"%s\",\"name\":\"x\"}", pk,
             badtoken);
    /* Registering someone else's public key: signed by a different key. */
    request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, &c->id, 0, 0, &r);
    expect("join for a key the caller lacks", &r, 401, "bad_signature");

    request(c, "GET", "/v1/task?wait=banana", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("malformed query", &r, 400, "bad_request");
    request(c, "DELETE", "/v1/task", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("wrong method", &r, 405, "method_not_allowed");
    request(c, "GET", "/v1/nothing-here", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("unknown path", &r, 404, "not_found");
    request(c, "GET", "/v1/model?version=99999", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("model version never made", &r, 404, "unknown_version");
    request(c, "GET", "/v1/data/val", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("held-out data shard", &r, 404, "unknown_shard");

    /* Framing: announced 8 GiB, sent 1 KiB; answered before the body. */
    char head[1024], filler[1025];
    memset(filler, 'x', 1024);
    filler[1024] = '\0';
    snprintf(head, sizeof head,
             "POST /v1/updates HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 8589934592\r\n"
             "Content-Type: application/octet-stream\r\n\r\n");
    raw(c, head, filler, &r);
    expect("body over the cap (8 GiB announced)", &r, 413, "too_large");
    snprintf(head, sizeof head,
             "POST /v1/updates HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
             "Content-Type: application/octet-stream\r\n\r\n");
    raw(c, head, "5\r\nhello\r\n0\r\n\r\n", &r);
    expect("chunked upload", &r, 411, "length_required");
    snprintf(head, sizeof head,
             "POST /v1/updates HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
             "Content-Length: 7\r\n\r\nhello");
    raw(c, head, NULL, &r);
    expect("two Content-Length headers", &r, 400, "bad_request");
}

int main(int argc, char **argv) {
    if (argc < 5 || (strcmp(argv[1], "prepare") == 0 && argc < 7)) {
        fprintf(stderr, "usage: attack prepare URL CA DIR TOKEN BADTOKEN | attack run URL CA DIR "
                        "BADTOKEN\n");
        return 2;
    }
    /* The server closes connections it refuses; a write after that must be
     * an error to look at, not a signal that kills the client. */
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (crypto_init() != VL_OK || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return 2;
    ctx c = {.url = argv[2], .ca = argv[3]};
    if (strcmp(argv[1], "prepare") == 0) {
        if (prepare(&c, argv[4], argv[5], argv[6]) != 0) return 2;
    } else {
        if (load_state(&c, argv[4]) != 0 || c.n_params == 0) {
            fprintf(stderr, "attack: no usable state in %s\n", argv[4]);
            return 2;
        }
        attack(&c, argc > 5 ? argv[5] : "vlt_0");
    }
    printf("attack: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
