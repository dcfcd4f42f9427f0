/* The attack client's requests, answers, database digests and table. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/ssl.h>
#include <sodium.h>
#include <sqlite3.h>

#include "compress/compress.h"
#include "tests/integration/attack.h"

static int passed, failed, cases;

/* ---- the database digest ------------------------------------------------ */

static void hash_row(crypto_generichash_state *st, sqlite3_stmt *s) {
    int n = sqlite3_column_count(s);
    for (int i = 0; i < n; i++) {
        /* Activity stamps move with honest requests; nothing else may. */
        if (strcmp(sqlite3_column_name(s, i), "last_seen") == 0) continue;
        uint8_t type = (uint8_t)sqlite3_column_type(s, i);
        crypto_generichash_update(st, &type, 1);
        if (type == SQLITE_INTEGER) {
            int64_t v = sqlite3_column_int64(s, i);
            crypto_generichash_update(st, (const uint8_t *)&v, sizeof v);
        } else if (type == SQLITE_FLOAT) {
            double v = sqlite3_column_double(s, i);
            crypto_generichash_update(st, (const uint8_t *)&v, sizeof v);
        } else if (type != SQLITE_NULL) {
            const void *p = sqlite3_column_blob(s, i);
            uint64_t len = (uint64_t)sqlite3_column_bytes(s, i);
            crypto_generichash_update(st, (const uint8_t *)&len, sizeof len);
            if (p) crypto_generichash_update(st, p, (size_t)len);
        }
    }
}

/* hex BLAKE2b-256 of every table's rows in rowid order; 0, or -1 when the
 * database cannot be read. */
static int db_digest(const char *path, char out[VCRYPTO_HASH_HEX + 1]) {
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return -1;
    }
    sqlite3_busy_timeout(db, 5000);
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    int rc = sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
    sqlite3_stmt *tables = NULL;
    if (!rc && sqlite3_prepare_v2(db,
                                  "SELECT name FROM sqlite_master WHERE type = 'table' AND "
                                  "name NOT LIKE 'sqlite_%' ORDER BY name",
                                  -1, &tables, NULL) != SQLITE_OK)
        rc = -1;
    while (!rc && sqlite3_step(tables) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(tables, 0);
        char sql[256];
        snprintf(sql, sizeof sql, "SELECT * FROM \"%s\" ORDER BY rowid", name);
        crypto_generichash_update(&st, (const uint8_t *)sql, strlen(sql));
        sqlite3_stmt *rows = NULL;
        if (sqlite3_prepare_v2(db, sql, -1, &rows, NULL) != SQLITE_OK) rc = -1;
        int step;
        while (!rc && (step = sqlite3_step(rows)) == SQLITE_ROW) hash_row(&st, rows);
        if (!rc && step != SQLITE_DONE) rc = -1;
        sqlite3_finalize(rows);
    }
    sqlite3_finalize(tables);
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(db);
    uint8_t h[32];
    crypto_generichash_final(&st, h, sizeof h);
    vl_hex_encode(h, sizeof h, out);
    return rc;
}

static void snapshot(reply *r) {
    const char *db = getenv("ATTACK_DB");
    r->have_digest = db && *db && db_digest(db, r->digest) == 0;
}

/* ---- requests ------------------------------------------------------------- */

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
    return vl_buf_append((vl_buf *)ud, p, sz * n) == VL_OK ? sz * n : 0;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud) {
    reply *r = ud;
    size_t len = sz * n;
    static const char name[] = "retry-after:";
    if (len > sizeof name - 1 && strncasecmp(p, name, sizeof name - 1) == 0) {
        size_t i = sizeof name - 1, j = 0;
        while (i < len && p[i] == ' ') i++;
        while (i < len && p[i] != '\r' && p[i] != '\n' && j + 1 < sizeof r->retry_after)
            r->retry_after[j++] = p[i++];
        r->retry_after[j] = '\0';
    }
    return len;
}

static void parse_error_code(reply *r, const char *json, size_t len) {
    json_t *j = len ? json_loadb(json, len, 0, NULL) : NULL;
    const char *code =
        j ? json_string_value(json_object_get(json_object_get(j, "error"), "code")) : NULL;
    snprintf(r->code, sizeof r->code, "%s", code ? code : "");
    json_decref(j);
}

/* The Content-Type each route takes. */
static const char *route_type(const char *target) {
    return strncmp(target, "/v1/peers", 9) == 0 ? "application/json" : "application/octet-stream";
}

int sign_lines(const vcrypto_identity *key, int64_t peer, const char *method, const char *target,
               const void *body, size_t len, int64_t ts, char *out, size_t cap) {
    char keyid[VCRYPTO_PK_B64_LEN + 24];
    if (peer > 0)
        snprintf(keyid, sizeof keyid, "%lld", (long long)peer);
    else
        vcrypto_pk_encode(key->pk, keyid);
    int has_body = body != NULL || strcmp(method, "POST") == 0;
    vcrypto_signed_headers sh;
    if (vcrypto_sign_http(key, keyid, method, target, has_body, body, len, ts, &sh) != VL_OK)
        return -1;
    int n = snprintf(out, cap, "Signature-Input: %s\nSignature: %s%s%s", sh.signature_input,
                     sh.signature, has_body ? "\nContent-Digest: " : "",
                     has_body ? sh.content_digest : "");
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

void crlf_lines(const char *lines, char *out, size_t cap) {
    size_t k = 0;
    for (const char *p = lines; *p && k + 3 < cap; p++) {
        if (*p == '\n') out[k++] = '\r';
        out[k++] = *p;
    }
    out[k] = '\0';
}

int signed_head(const ctx *c, const char *method, const char *target, const char *ctype,
                const void *body, size_t len, size_t sent, char *out, size_t cap) {
    char lines[ATTACK_SIG_LINES], crlf[ATTACK_SIG_LINES + 16];
    if (sign_lines(&c->id, 0, method, target, body, len, vl_clock_unix_s(), lines, sizeof lines) !=
        0)
        return -1;
    crlf_lines(lines, crlf, sizeof crlf);
    int n = snprintf(out, cap,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\n%s\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, target, ctype, crlf, len);
    if (n < 0 || sent > len || (size_t)n + sent >= cap) return -1;
    memcpy(out + n, body, sent);
    out[(size_t)n + sent] = '\0';
    return 0;
}

/* Appends each line of lines ("Name: value" separated by LF) as a header. */
static struct curl_slist *add_lines(struct curl_slist *hs, const char *lines) {
    char line[VCRYPTO_SIG_HEADER_MAX + 64];
    while (*lines) {
        size_t n = strcspn(lines, "\n");
        if (n < sizeof line) {
            memcpy(line, lines, n);
            line[n] = '\0';
            hs = curl_slist_append(hs, line);
        }
        lines += n;
        if (*lines == '\n') lines++;
    }
    return hs;
}

void send_req(const ctx *c, const req_opts *o, reply *r) {
    memset(r, 0, sizeof *r);
    vl_buf_init(&r->body, 64u << 20);
    snapshot(r);
    char url[1024], lines[ATTACK_SIG_LINES], ct[128];
    snprintf(url, sizeof url, "%s%s", c->url, o->target);
    CURL *h = curl_easy_init();
    struct curl_slist *hs = NULL;
    if (!o->auth) {
        const void *sb = o->sign_body ? o->sign_body : o->body;
        size_t sl = o->sign_body ? o->sign_len : o->len;
        if (sign_lines(o->key ? o->key : &c->id, o->peer,
                       o->sign_method ? o->sign_method : o->method,
                       o->sign_target ? o->sign_target : o->target, sb, sl,
                       o->ts ? o->ts : vl_clock_unix_s(), lines, sizeof lines) != 0)
            abort();
        hs = add_lines(hs, lines);
    } else if (*o->auth) {
        hs = add_lines(hs, o->auth);
    }
    const char *type = o->ctype ? o->ctype : route_type(o->target);
    snprintf(ct, sizeof ct, *type ? "Content-Type: %s" : "Content-Type:", type);
    hs = curl_slist_append(hs, ct);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CAINFO, c->ca);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, o->method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    /* Targets go out exactly as written ("/v1/../v1/task" included). */
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
    if (o->body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, o->body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)o->len);
    }
    CURLcode rc = curl_easy_perform(h);
    if (rc != CURLE_OK) {
        fprintf(stderr, "attack: %s %s: %s\n", o->method, o->target, curl_easy_strerror(rc));
        r->status = -1;
        snprintf(r->code, sizeof r->code, "closed");
    } else {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
        parse_error_code(r, (const char *)r->body.data, r->body.len);
    }
    curl_slist_free_all(hs);
    curl_easy_cleanup(h);
}

void request(const ctx *c, const char *method, const char *target, const char *auth,
             const void *body, size_t len, const void *sign_body, size_t sign_len,
             const vcrypto_identity *key, int64_t peer, int64_t ts, reply *r) {
    req_opts o = {.method = method,
                  .target = target,
                  .auth = auth,
                  .body = body,
                  .len = len,
                  .sign_body = sign_body,
                  .sign_len = sign_len,
                  .key = key,
                  .peer = peer,
                  .ts = ts};
    send_req(c, &o, r);
}

/* ---- raw connections -------------------------------------------------------- */

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Reads the whole answer; fills status, code and Retry-After. */
static void parse_raw(reply *r) {
    const char *t = (const char *)r->body.data;
    if (!t || r->body.len < 12 || strncmp(t, "HTTP/1.", 7) != 0) {
        r->status = -1;
        snprintf(r->code, sizeof r->code, "closed");
        return;
    }
    r->status = atol(t + 9);
    const char *end = strstr(t, "\r\n\r\n");
    if (!end) return;
    const char *ra = NULL;
    for (const char *p = t; p && p < end; p = strstr(p + 2, "\r\n"))
        if (strncasecmp(p, "\r\nRetry-After: ", 15) == 0) ra = p;
    if (ra) {
        ra += 15;
        size_t n = strcspn(ra, "\r");
        if (n >= sizeof r->retry_after) n = sizeof r->retry_after - 1;
        memcpy(r->retry_after, ra, n);
        r->retry_after[n] = '\0';
    }
    parse_error_code(r, end + 4, r->body.len - (size_t)(end + 4 - t));
}

void raw_conn(const ctx *c, SSL_CTX *sc, const char *head, double pause_s, const char *tail,
              int tail_close, reply *r) {
    memset(r, 0, sizeof *r);
    vl_buf_init(&r->body, 1 << 20);
    snapshot(r);
    r->status = -1;
    const char *hp = strstr(c->url, "://");
    int port = atoi(strrchr(hp, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    SSL *s = NULL;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        snprintf(r->code, sizeof r->code, "closed");
        close(fd);
        return;
    }
    if (sc) {
        s = SSL_new(sc);
        if (SSL_set_fd(s, fd) != 1 || SSL_connect(s) != 1) {
            snprintf(r->code, sizeof r->code, "tls_refused");
            SSL_free(s);
            close(fd);
            return;
        }
    }
    const char *parts[2] = {head, tail};
    for (int i = 0; i < 2; i++) {
        if (i == 1 && pause_s > 0) sleep_s(pause_s);
        if (i == 1 && tail_close) {
            if (s) SSL_shutdown(s);
            shutdown(fd, SHUT_WR);
            break;
        }
        if (!parts[i]) continue;
        if (s)
            SSL_write(s, parts[i], (int)strlen(parts[i]));
        else if (write(fd, parts[i], strlen(parts[i])) < 0)
            break;
    }
    char tmp[4096];
    for (;;) {
        int n = s ? SSL_read(s, tmp, sizeof tmp) : (int)read(fd, tmp, sizeof tmp);
        if (n <= 0 || vl_buf_append(&r->body, tmp, (size_t)n) != VL_OK) break;
    }
    parse_raw(r);
    SSL_free(s);
    close(fd);
}

static SSL_CTX *verified_ctx(const ctx *c) {
    SSL_CTX *sc = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(sc, c->ca, NULL);
    SSL_CTX_set_verify(sc, SSL_VERIFY_PEER, NULL);
    return sc;
}

void raw_slow(const ctx *c, const char *head, double pause_s, const char *tail, int tail_close,
              reply *r) {
    SSL_CTX *sc = verified_ctx(c);
    raw_conn(c, sc, head, pause_s, tail, tail_close, r);
    SSL_CTX_free(sc);
}

void raw(const ctx *c, const char *head, const char *tail, reply *r) {
    raw_slow(c, head, 0, tail, 0, r);
}

/* ---- the table ---------------------------------------------------------------- */

static void outcome(long status, const char *code, char *out, size_t cap) {
    if (status == -1)
        snprintf(out, cap, "no answer: %s", code && *code ? code : "closed");
    else
        snprintf(out, cap, "%ld %s", status, code && *code ? code : "-");
}

void table_begin(const char *title) {
    printf("\n%s\n\n| # | case | wanted | got | database | result |\n"
           "|---|---|---|---|---|---|\n",
           title);
}

int table_end(void) {
    printf("\nattack: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

static void row(const char *name, const char *want, const char *got, const char *db, int ok) {
    printf("| %d | %s | %s | %s | %s | %s |\n", ++cases, name, want, got, db, ok ? "PASS" : "FAIL");
    ok ? passed++ : failed++;
}

void record(const char *name, const char *want, const char *got, int ok) {
    row(name, want, got, "-", ok);
}

/* The state of task id in the database at path into out ("" when it
 * cannot be read). */
static void task_state(const char *path, int64_t id, char *out, size_t cap) {
    out[0] = '\0';
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, "SELECT state FROM tasks WHERE id = ?", -1, &s, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(db, 5000);
        sqlite3_bind_int64(s, 1, id);
        if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0))
            snprintf(out, cap, "%s", (const char *)sqlite3_column_text(s, 0));
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
}

void expect_lease_ended(const ctx *c, const char *name, reply *r, long status, const char *code) {
    int ok = r->status == status && (!code || strcmp(r->code, code) == 0);
    const char *path = getenv("ATTACK_DB");
    char state[32] = "-", db[64] = "-";
    if (path && *path) {
        task_state(path, c->task, state, sizeof state);
        snprintf(db, sizeof db, "task %s", state[0] ? state : "unreadable");
        ok = ok && strcmp(state, "expired") == 0;
    }
    char want[96], got[96];
    outcome(status, code, want, sizeof want);
    outcome(r->status, r->code, got, sizeof got);
    row(name, want, got, db, ok);
    vl_buf_free(&r->body);
}

void expect(const char *name, reply *r, long status, const char *code) {
    int ok = r->status == status && (!code || strcmp(r->code, code) == 0);
    /* 429 and 503 must say when to come back. */
    if (r->status == 429 || r->status == 503) ok = ok && atol(r->retry_after) >= 1;
    const char *db = "-";
    if (status >= 400 || status == -1) {
        char now[VCRYPTO_HASH_HEX + 1];
        if (r->have_digest && db_digest(getenv("ATTACK_DB"), now) == 0) {
            int same = strcmp(now, r->digest) == 0;
            db = same ? "unchanged" : "CHANGED";
            ok = ok && same;
        } else if (getenv("ATTACK_DB")) {
            db = "unreadable";
            ok = 0;
        }
    }
    char want[96], got[96];
    outcome(status, code, want, sizeof want);
    outcome(r->status, r->code, got, sizeof got);
    if (r->retry_after[0]) {
        size_t n = strlen(got);
        snprintf(got + n, sizeof got - n, ", Retry-After %s", r->retry_after);
    }
    row(name, want, got, db, ok);
    vl_buf_free(&r->body);
}

void get(const ctx *c, const char *name, const char *target, long status, const char *code) {
    reply r;
    request(c, "GET", target, NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect(name, &r, status, code);
}

void post(const ctx *c, const char *name, vl_buf *b, long status, const char *code) {
    reply r;
    request(c, "POST", "/v1/updates", NULL, b->data, b->len, NULL, 0, NULL, c->peer, 0, &r);
    expect(name, &r, status, code);
    vl_buf_free(b);
}

void update_body(const ctx *c, vl_buf *out, const char *run, int64_t base, size_t n, float poison) {
    update_body_claiming(c, out, run, base, n, poison, 10);
}

void update_body_claiming(const ctx *c, vl_buf *out, const char *run, int64_t base, size_t n,
                          float poison, int64_t samples) {
    update_body_meta(c, out, run, base, n, poison, samples, 1, 5.0);
}

void update_body_meta(const ctx *c, vl_buf *out, const char *run, int64_t base, size_t n,
                      float poison, int64_t samples, int64_t steps, double loss) {
    float *d = calloc(n ? n : 1, sizeof *d);
    if (!d) abort();
    for (size_t i = 0; i < n; i++) d[i] = 1e-4f * (float)(i % 7);
    if (n) d[n / 2] = poison;
    compress_update_meta m = {0};
    snprintf(m.run, sizeof m.run, "%s", run);
    m.task = c->task;
    m.peer = c->peer;
    m.base_version = base;
    m.kind = COMPRESS_DENSE;
    m.num_samples = samples;
    m.local_steps = steps;
    m.loss = loss;
    vl_buf_init(out, VL_BUF_DEFAULT_CAP);
    vl_error e;
    if (compress_update_encode_dense(&m, d, n, ST_F32, out, &e) != VL_OK) abort();
    free(d);
}

/* ---- state ------------------------------------------------------------------ */

void load_key(const char *dir, const char *file, vcrypto_identity *id) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    vl_error e;
    if (vcrypto_identity_load(id, path, &e) != VL_OK) {
        fprintf(stderr, "attack: %s\n", e.msg);
        exit(2);
    }
}

int load_state(ctx *c, const char *dir) {
    load_key(dir, "attack.key", &c->id);
    char path[1024];
    snprintf(path, sizeof path, "%s/attack.state", dir);
    json_t *j = json_load_file(path, 0, NULL);
    if (!j) return -1;
    c->peer = json_integer_value(json_object_get(j, "peer"));
    c->task = json_integer_value(json_object_get(j, "task"));
    c->base_version = json_integer_value(json_object_get(j, "base_version"));
    c->n_params = (size_t)json_integer_value(json_object_get(j, "n_params"));
    const char *tok = json_string_value(json_object_get(j, "token"));
    snprintf(c->token, sizeof c->token, "%s", tok ? tok : "");
    const char *run = json_string_value(json_object_get(j, "run"));
    snprintf(c->run, sizeof c->run, "%s", run ? run : "");
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

int save_state(const ctx *c, json_t *compression) {
    json_t *j = json_pack("{sI sI sI sI ss ss so}", "peer", (json_int_t)c->peer, "task",
                          (json_int_t)c->task, "base_version", (json_int_t)c->base_version,
                          "n_params", (json_int_t)c->n_params, "run", c->run, "token", c->token,
                          "compression", compression ? compression : json_object());
    char path[1024];
    snprintf(path, sizeof path, "%s/attack.state", c->dir);
    int rc = j ? json_dump_file(j, path, 0) : -1;
    json_decref(j);
    return rc == 0 ? 0 : -1;
}
