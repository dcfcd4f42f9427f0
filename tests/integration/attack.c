/* Sends the coordinator one kind of bad request after another and checks
 * each answer's status and JSON error code. Two phases, so the test script
 * can snapshot the database in between:
 *
 *   attack prepare URL CA DIR TOKEN BADTOKEN   joins, takes a task lease,
 *                                              saves DIR/attack.state
 *   attack run URL CA DIR                      the bad requests; none may
 *                                              change anything stored
 *   attack sparse URL CA DIR                   bad compressed updates and delta
 *                                              requests for the run's kind
 *   attack finish URL CA DIR                   uploads a valid update of the
 *                                              run's kind for the lease
 *   attack late URL CA DIR STATUS [CODE]       the same upload, which must
 *                                              answer STATUS (and CODE): a
 *                                              lease that expired long ago
 *   attack delta URL CA DIR SINCE STATUS       GET /v1/model/delta?since=SINCE
 *                                              must answer STATUS (a 200 is
 *                                              checked for ascending indices)
 *   attack lease URL CA DIR                    takes a new task lease
 *   attack values URL CA DIR STAGE             second-round requests for the
 *                                              lease's version: STAGE early
 *                                              (round not open), open (bad
 *                                              values), answer (valid values
 *                                              and a duplicate), closed
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
    /* The task's compression. */
    char kind[16];
    int64_t k, rows, cols, seed;
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
    json_t *cmp = json_object_get(j, "compression");
    const char *kind = json_string_value(json_object_get(cmp, "kind"));
    snprintf(c->kind, sizeof c->kind, "%s", kind ? kind : "none");
    c->k = json_integer_value(json_object_get(cmp, "k"));
    c->rows = json_integer_value(json_object_get(cmp, "rows"));
    c->cols = json_integer_value(json_object_get(cmp, "cols"));
    c->seed = json_integer_value(json_object_get(cmp, "seed"));
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
    json_t *cmp = json_incref(json_object_get(j, "compression"));
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
    j = json_pack("{sI sI sI sI ss ss so}", "peer", (json_int_t)c->peer, "task",
                  (json_int_t)c->task, "base_version", (json_int_t)c->base_version, "n_params",
                  (json_int_t)n, "run", c->run, "token", token, "compression",
                  cmp ? cmp : json_object());
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

    buf good, nan_b, huge_b, shape_b, run_b, ver_b;
    update_body(c, &good, c->run, c->base_version, c->n_params, 0.0f);
    update_body(c, &nan_b, c->run, c->base_version, c->n_params, NAN);
    update_body(c, &huge_b, c->run, c->base_version, c->n_params, 1e30f);
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
    request(c, "POST", "/v1/updates", NULL, huge_b.data, huge_b.len, NULL, 0, NULL, c->peer, 0,
            &r);
    expect("a finite delta value of 1e30", &r, 422, "out_of_bounds");
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
    buf_free(&huge_b);
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
    /* Targets libevent reads as an authority, which it refuses in HTML. */
    raw(c, "GET //\"x\"/v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", NULL, &r);
    expect("a target starting with //", &r, 400, "bad_request");
    raw(c, "CONNECT /v1/task HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", NULL, &r);
    expect("CONNECT", &r, 405, "method_not_allowed");
}

/* ---- compressed runs ---------------------------------------------------- */

static compress_update_meta sparse_meta(const ctx *c, compress_kind kind) {
    compress_update_meta m = {0};
    snprintf(m.run, sizeof m.run, "%s", c->run);
    m.task = c->task;
    m.peer = c->peer;
    m.base_version = c->base_version;
    m.kind = kind;
    m.num_samples = 10;
    m.local_steps = 1;
    m.loss = 5.0;
    return m;
}

/* A topk body written by hand, so the indices can break the rules the
 * encoder enforces. */
static void topk_raw(const ctx *c, buf *out, const uint32_t *idx, const float *val, size_t n) {
    compress_update_meta m = sparse_meta(c, COMPRESS_TOPK);
    char v[5][32];
    snprintf(v[0], sizeof v[0], "%lld", (long long)m.task);
    snprintf(v[1], sizeof v[1], "%lld", (long long)m.peer);
    snprintf(v[2], sizeof v[2], "%lld", (long long)m.base_version);
    st_writer w;
    st_writer_init(&w);
    uint64_t shape[1] = {n};
    if (st_writer_meta(&w, "run", m.run) || st_writer_meta(&w, "task", v[0]) ||
        st_writer_meta(&w, "peer", v[1]) || st_writer_meta(&w, "base_version", v[2]) ||
        st_writer_meta(&w, "kind", "topk") || st_writer_meta(&w, "num_samples", "10") ||
        st_writer_meta(&w, "local_steps", "1") || st_writer_meta(&w, "loss", "5") ||
        st_writer_add(&w, "indices", ST_U32, 1, shape, idx, n * 4) ||
        st_writer_add(&w, "values", ST_F32, 1, shape, val, n * 4))
        abort();
    buf_init(out, BUF_DEFAULT_CAP);
    vl_error e;
    if (st_writer_finish(&w, out, &e) != VL_OK) abort();
    st_writer_free(&w);
}

static void sketch_body(const ctx *c, buf *out, uint64_t seed, uint32_t rows, uint32_t cols,
                        float poison) {
    compress_sketch s;
    vl_error e;
    if (compress_sketch_init(&s, rows, cols, seed, &e) != VL_OK) abort();
    float *x = calloc(c->n_params, sizeof *x);
    if (!x) abort();
    for (size_t i = 0; i < c->n_params; i++) x[i] = 1e-4f * (float)(i % 5);
    compress_sketch_encode(&s, x, c->n_params);
    s.table[0] = s.table[0] + poison;
    compress_update_meta m = sparse_meta(c, COMPRESS_SKETCH);
    buf_init(out, BUF_DEFAULT_CAP);
    if (compress_update_encode_sketch(&m, &s, ST_F32, out, &e) != VL_OK) abort();
    compress_sketch_free(&s);
    free(x);
}

static void post(const ctx *c, const char *name, buf *b, long status, const char *code) {
    reply r;
    request(c, "POST", "/v1/updates", NULL, b->data, b->len, NULL, 0, NULL, c->peer, 0, &r);
    expect(name, &r, status, code);
    buf_free(b);
}

static void get(const ctx *c, const char *name, const char *target, long status,
                const char *code) {
    reply r;
    request(c, "GET", target, NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect(name, &r, status, code);
}

static void attack_sparse(ctx *c) {
    buf b;
    size_t n = c->n_params;
    int is_sketch = strcmp(c->kind, "sketch") == 0;
    uint32_t rows = (uint32_t)(c->rows > 0 ? c->rows : 3);
    uint32_t cols = (uint32_t)(c->cols > 0 ? c->cols : 64);

    update_body(c, &b, c->run, c->base_version, n, 0.0f);
    post(c, "dense update in a compressed run", &b, 422, "wrong_kind");
    if (is_sketch) {
        uint32_t idx[2] = {1, 2};
        float val[2] = {1, 2};
        topk_raw(c, &b, idx, val, 2);
        post(c, "topk update in a sketch run", &b, 422, "wrong_kind");
        sketch_body(c, &b, (uint64_t)c->seed + 1, rows, cols, 0.0f);
        post(c, "sketch of another seed", &b, 422, "wrong_sketch");
        sketch_body(c, &b, (uint64_t)c->seed, rows, cols + 1, 0.0f);
        post(c, "sketch of another width", &b, 422, "wrong_sketch");
        sketch_body(c, &b, (uint64_t)c->seed, rows == 1 ? 2 : rows - 1, cols, 0.0f);
        post(c, "sketch of another depth", &b, 422, "wrong_sketch");
        sketch_body(c, &b, (uint64_t)c->seed, rows, cols, NAN);
        post(c, "NaN in the sketch", &b, 422, "non_finite");
        sketch_body(c, &b, (uint64_t)c->seed, rows, cols, 1e30f);
        post(c, "a sketch cell of 1e30", &b, 422, "out_of_bounds");
    } else {
        uint32_t out_of_range[3] = {1, 2, (uint32_t)n};
        uint32_t descending[3] = {5, 4, 9};
        uint32_t repeated[3] = {3, 3, 9};
        float val[3] = {0.1f, 0.2f, 0.3f};
        topk_raw(c, &b, out_of_range, val, 3);
        post(c, "index beyond the model", &b, 422, "bad_indices");
        topk_raw(c, &b, descending, val, 3);
        post(c, "indices not ascending", &b, 422, "bad_indices");
        topk_raw(c, &b, repeated, val, 3);
        post(c, "index repeated", &b, 422, "bad_indices");
        uint32_t ok_idx[3] = {1, 2, 3};
        float nan_val[3] = {0.1f, NAN, 0.3f};
        topk_raw(c, &b, ok_idx, nan_val, 3);
        post(c, "NaN among the values", &b, 422, "non_finite");
        float inf_val[3] = {0.1f, 0.2f, INFINITY};
        topk_raw(c, &b, ok_idx, inf_val, 3);
        post(c, "Inf among the values", &b, 422, "non_finite");
        float huge_val[3] = {0.1f, -1e30f, 0.3f};
        topk_raw(c, &b, ok_idx, huge_val, 3);
        post(c, "a value of -1e30", &b, 422, "out_of_bounds");
        size_t many = (size_t)c->k + (size_t)c->k / 10 + 8;
        if (many > n) many = n;
        uint32_t *idx = malloc(many * sizeof *idx);
        float *v = malloc(many * sizeof *v);
        if (!idx || !v) abort();
        for (size_t j = 0; j < many; j++) {
            idx[j] = (uint32_t)j;
            v[j] = 1e-3f;
        }
        topk_raw(c, &b, idx, v, many);
        post(c, "more entries than k", &b, 422, "too_many_entries");
        free(idx);
        free(v);
        sketch_body(c, &b, 1, 3, 64, 0.0f);
        post(c, "sketch update in a topk run", &b, 422, "wrong_kind");
    }
    get(c, "delta without since", "/v1/model/delta", 400, "bad_request");
    get(c, "delta since the current version", "/v1/model/delta?since=0", 400, "bad_request");
    get(c, "delta to a version never made", "/v1/model/delta?since=0&version=99", 404,
        "unknown_version");
    get(c, "delta with a negative since", "/v1/model/delta?since=-1", 400, "bad_request");
}

/* A valid update of the run's kind, so the lease is not left hanging. */
static void finish(ctx *c, long status, const char *code) {
    buf b;
    if (strcmp(c->kind, "sketch") == 0) {
        sketch_body(c, &b, (uint64_t)c->seed, (uint32_t)c->rows, (uint32_t)c->cols, 0.0f);
    } else if (strcmp(c->kind, "none") == 0) {
        update_body(c, &b, c->run, c->base_version, c->n_params, 0.0f);
    } else {
        uint32_t idx[2] = {0, (uint32_t)c->n_params - 1};
        float val[2] = {1e-4f, -1e-4f};
        compress_update_meta m = sparse_meta(c, COMPRESS_TOPK);
        buf_init(&b, BUF_DEFAULT_CAP);
        vl_error e;
        if (compress_update_encode_topk(&m, idx, val, 2, ST_F32, &b, &e) != VL_OK) abort();
    }
    post(c, "valid update of the run's kind", &b, status, code);
}

static void delta(ctx *c, const char *since, long status) {
    reply r;
    char target[96];
    snprintf(target, sizeof target, "/v1/model/delta?since=%s", since);
    request(c, "GET", target, NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    if (r.status == 200 && status == 200) {
        st_file f;
        vl_error e;
        const st_tensor *ix = NULL, *vx = NULL;
        int ok = st_parse(r.body.data, r.body.len, &f, &e) == VL_OK;
        if (ok) {
            ix = st_find(&f, "indices");
            vx = st_find(&f, "values");
            ok = ix && vx && ix->dtype == ST_U32 && vx->dtype == ST_F32 &&
                 ix->numel == vx->numel && ix->numel > 0;
            for (size_t j = 1; ok && j < ix->numel; j++) {
                uint32_t a, b;
                memcpy(&a, ix->data + 4 * (j - 1), 4);
                memcpy(&b, ix->data + 4 * j, 4);
                ok = a < b && b < c->n_params;
            }
            printf("delta since %s: %llu entries in %zu bytes\n", since,
                   ix ? (unsigned long long)ix->numel : 0ULL, r.body.len);
            st_free(&f);
        }
        if (!ok) r.status = 0;
    }
    expect(status == 200 ? "delta is a sound sparse file" : "delta answers", &r, status,
           status == 410 ? "version_pruned" : NULL);
}

/* ---- second rounds ------------------------------------------------------ */

/* The values file, with every field under the caller's control. */
static void values_body(const ctx *c, buf *out, const char *run, int64_t version, int64_t task,
                        int64_t peer, size_t n, float poison) {
    float *v = calloc(n ? n : 1, sizeof *v);
    if (!v) abort();
    for (size_t i = 0; i < n; i++) v[i] = 1e-4f * (float)(i % 7);
    if (n) v[n / 2] += poison;
    compress_round_meta m = {.version = version, .task = task, .peer = peer};
    snprintf(m.run, sizeof m.run, "%s", run);
    buf_init(out, BUF_DEFAULT_CAP);
    vl_error e;
    if (compress_round_encode_values(&m, v, n, out, &e) != VL_OK) abort();
    free(v);
    (void)c;
}

static void post_values(const ctx *c, const char *name, buf *b, long status, const char *code) {
    reply r;
    request(c, "POST", "/v1/round/values", NULL, b->data, b->len, NULL, 0, NULL, c->peer, 0, &r);
    expect(name, &r, status, code);
    buf_free(b);
}

/* The round's candidate count, checked for a sound file; 0 when closed. */
static size_t candidates(const ctx *c) {
    reply r;
    char target[96];
    snprintf(target, sizeof target, "/v1/round?version=%lld&wait=5", (long long)c->base_version);
    request(c, "GET", target, NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    size_t n = 0;
    if (r.status == 200) {
        compress_round_meta m;
        uint32_t *idx = NULL;
        vl_error e;
        if (compress_round_decode_candidates(r.body.data, r.body.len, c->n_params, &m, &idx, &n,
                                             &e) != VL_OK ||
            m.version != c->base_version)
            r.status = 0;
        free(idx);
        printf("round of version %lld: %zu candidates\n", (long long)c->base_version, n);
    }
    expect("candidates of an open round", &r, 200, NULL);
    return n;
}

static void attack_values(ctx *c, const char *stage) {
    buf b;
    char target[96];
    int64_t v = c->base_version;
    if (strcmp(stage, "early") == 0) {
        get(c, "round without version", "/v1/round", 400, "bad_request");
        get(c, "round with an unknown key", "/v1/round?version=0&x=1", 400, "bad_request");
        get(c, "round waiting too long", "/v1/round?version=0&wait=61", 400, "bad_request");
        snprintf(target, sizeof target, "/v1/round?version=%lld", (long long)v + 5);
        get(c, "round of a version never made", target, 404, "unknown_version");
        snprintf(target, sizeof target, "/v1/round?version=%lld", (long long)v);
        get(c, "round not open yet", target, 204, NULL);
        values_body(c, &b, c->run, v, c->task, c->peer, 4, 0);
        post_values(c, "values before the round opens", &b, 409, "round_not_open");
        reply r;
        request(c, "POST", "/v1/round/values", NULL, "", 0, NULL, 0, NULL, c->peer, 0, &r);
        expect("values with an empty body", &r, 400, "malformed_values");
        buf junk;
        buf_init(&junk, 64);
        if (buf_append(&junk, "not safetensors", 15) != VL_OK) abort();
        post_values(c, "values that do not parse", &junk, 400, "malformed_values");
        values_body(c, &b, "another-run", v, c->task, c->peer, 4, 0);
        post_values(c, "values for another run", &b, 422, "wrong_run");
        values_body(c, &b, c->run, v, c->task, c->peer + 1, 4, 0);
        post_values(c, "values naming another peer", &b, 403, "not_your_task");
        return;
    }
    size_t n = strcmp(stage, "closed") == 0 ? 0 : candidates(c);
    if (strcmp(stage, "open") == 0) {
        values_body(c, &b, c->run, v, c->task, c->peer, n + 1, 0);
        post_values(c, "one value too many", &b, 422, "bad_shape");
        values_body(c, &b, c->run, v, c->task, c->peer, n ? n - 1 : 0, 0);
        post_values(c, "one value too few", &b, 422, "bad_shape");
        values_body(c, &b, c->run, v, c->task, c->peer, n, NAN);
        post_values(c, "NaN among the values", &b, 422, "non_finite");
        values_body(c, &b, c->run, v, c->task, c->peer, n, INFINITY);
        post_values(c, "Inf among the values", &b, 422, "non_finite");
        values_body(c, &b, c->run, v, c->task, c->peer, n, 1e30f);
        post_values(c, "a value of 1e30", &b, 422, "out_of_bounds");
        values_body(c, &b, c->run, v, c->task + 100000, c->peer, n, 0);
        post_values(c, "values for an unknown task", &b, 404, "unknown_task");
        values_body(c, &b, c->run, v + 1, c->task, c->peer, n, 0);
        post_values(c, "values for a later version", &b, 404, "unknown_version");
        /* Task 1 went to the first peer that asked, never to this one. */
        values_body(c, &b, c->run, v, c->task == 1 ? 2 : 1, c->peer, n, 0);
        post_values(c, "values for another peer's task", &b, 403, "not_your_task");
    } else if (strcmp(stage, "answer") == 0) {
        values_body(c, &b, c->run, v, c->task, c->peer, n, 0);
        post_values(c, "valid values", &b, 202, NULL);
        values_body(c, &b, c->run, v, c->task, c->peer, n, 0);
        post_values(c, "the same values again", &b, 409, "duplicate_values");
    } else {
        snprintf(target, sizeof target, "/v1/round?version=%lld", (long long)v);
        get(c, "round after its version was made", target, 410, "round_closed");
        values_body(c, &b, c->run, v, c->task, c->peer, 8, 0);
        post_values(c, "values after the round closed", &b, 410, "round_closed");
    }
}

/* A new lease for the attacker, saved over the old one. */
static int lease(ctx *c, const char *dir) {
    reply r;
    request(c, "GET", "/v1/task?wait=30", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    json_t *j = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    c->task = json_integer_value(json_object_get(j, "task_id"));
    c->base_version = json_integer_value(json_object_get(j, "base_version"));
    json_t *cmp = json_incref(json_object_get(j, "compression"));
    json_decref(j);
    expect("take another task lease", &r, 200, NULL);
    char path[512];
    j = json_pack("{sI sI sI sI ss ss so}", "peer", (json_int_t)c->peer, "task",
                  (json_int_t)c->task, "base_version", (json_int_t)c->base_version, "n_params",
                  (json_int_t)c->n_params, "run", c->run, "token", c->token, "compression",
                  cmp ? cmp : json_object());
    snprintf(path, sizeof path, "%s/attack.state", dir);
    int rc = json_dump_file(j, path, 0);
    json_decref(j);
    return rc == 0 ? 0 : -1;
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
        if (strcmp(argv[1], "sparse") == 0) attack_sparse(&c);
        else if (strcmp(argv[1], "finish") == 0) finish(&c, 202, NULL);
        else if (strcmp(argv[1], "late") == 0 && argc > 5)
            finish(&c, atol(argv[5]), argc > 6 ? argv[6] : NULL);
        else if (strcmp(argv[1], "delta") == 0 && argc > 6) delta(&c, argv[5], atol(argv[6]));
        else if (strcmp(argv[1], "values") == 0 && argc > 5) attack_values(&c, argv[5]);
        else if (strcmp(argv[1], "lease") == 0) {
            if (lease(&c, argv[4]) != 0) return 2;
        }
        else attack(&c, argc > 5 ? argv[5] : "vlt_0");
    }
    printf("attack: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
