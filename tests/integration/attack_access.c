/* The attack client's identity and access cases: revoked peers, join
 * tokens that must not admit anyone, key rotation, administration that no
 * peer key may reach, TLS versions and suites the coordinator must refuse,
 * and (against a coordinator with tight limits) slow clients and rate
 * limits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "tests/integration/attack.h"

static void join_json(char *out, size_t cap, const uint8_t pk[VCRYPTO_PK_BYTES], const char *token,
                      const char *extra) {
    char b64[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(pk, b64);
    snprintf(out, cap, "{\"public_key\":\"%s\",\"token\":\"%s\",\"name\":\"x\"%s}", b64, token,
             extra);
}

/* A join signed with peer=0 by key, for pk with token. */
static void join_as(const ctx *c, const vcrypto_identity *key, const uint8_t pk[VCRYPTO_PK_BYTES],
                    const char *token, const char *extra, reply *r) {
    char body[512];
    join_json(body, sizeof body, pk, token, extra);
    request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, key, 0, 0, r);
}

static int64_t read_id(const char *dir, const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r");
    long long id = 0;
    if (!f || fscanf(f, "%lld", &id) != 1 || id <= 0) {
        fprintf(stderr, "attack: no peer id in %s\n", path);
        exit(2);
    }
    fclose(f);
    return (int64_t)id;
}

static void write_id(const char *dir, const char *file, int64_t id) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%lld\n", (long long)id) < 0 || fclose(f) != 0) exit(2);
}

/* A second peer, joined and served once, for the script to revoke. */
int setup_access(ctx *c, const char *victim_token) {
    vcrypto_identity v;
    vcrypto_identity_generate(&v);
    char path[1024];
    snprintf(path, sizeof path, "%s/victim.key", c->dir);
    vl_error e;
    if (vcrypto_identity_save(&v, path, 1, &e) != VL_OK) return -1;
    reply r;
    join_as(c, &v, v.pk, victim_token, "", &r);
    json_t *j = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    int64_t id = json_integer_value(json_object_get(j, "peer_id"));
    json_decref(j);
    expect("second peer joins", &r, 201, NULL);
    if (id <= 0) return -1;
    write_id(c->dir, "victim.id", id);
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, &v, id, 0, &r);
    expect("second peer is served before revocation", &r, 200, NULL);
    return 0;
}

static void rotate_req(const ctx *c, const vcrypto_identity *signer, int64_t peer, const char *body,
                       const char *ctype, reply *r) {
    req_opts o = {.method = "POST",
                  .target = "/v1/peers/rotate",
                  .body = body,
                  .len = strlen(body),
                  .key = signer,
                  .peer = peer,
                  .ctype = ctype};
    send_req(c, &o, r);
}

/* {"public_key": pk, "proof": by's proof for (peer, old)} */
static void rotate_body(char *out, size_t cap, const uint8_t pk[VCRYPTO_PK_BYTES],
                        const vcrypto_identity *by, int64_t peer,
                        const uint8_t old[VCRYPTO_PK_BYTES]) {
    char b64[VCRYPTO_PK_B64_LEN + 1], proof[VCRYPTO_SIG_B64_LEN + 1];
    vcrypto_pk_encode(pk, b64);
    vcrypto_rotation_sign(by, peer, old, proof);
    snprintf(out, cap, "{\"public_key\":\"%s\",\"proof\":\"%s\"}", b64, proof);
}

void attack_access(ctx *c, const char *spare, const char *revoked, const char *expired) {
    reply r;
    vcrypto_identity other, victim, rot_old, rot_new, fresh;
    vcrypto_identity_generate(&other);
    vcrypto_identity_generate(&fresh);
    load_key(c->dir, "victim.key", &victim);
    int64_t victim_id = read_id(c->dir, "victim.id");

    /* Revoked with `volley-coordinator peer revoke` while the server runs. */
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, &victim, victim_id, 0, &r);
    expect("revoked peer's next request", &r, 403, "revoked");
    request(c, "GET", "/v1/task?wait=0", NULL, NULL, 0, NULL, 0, &victim, victim_id, 0, &r);
    expect("revoked peer asks for a task", &r, 403, "revoked");
    join_as(c, &victim, victim.pk, spare, "", &r);
    expect("revoked peer joins again with a valid token", &r, 403, "revoked");
    char body[512];
    rotate_body(body, sizeof body, fresh.pk, &fresh, victim_id, victim.pk);
    rotate_req(c, &victim, victim_id, body, NULL, &r);
    expect("revoked peer rotates its key", &r, 403, "revoked");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, &other, victim_id, 0, &r);
    expect("forged request in a revoked peer's name", &r, 401, "bad_signature");

    /* Join tokens; only hashes are stored, and none of these may admit. */
    join_as(c, &other, other.pk, c->token, "", &r);
    expect("reused single-use token, new key", &r, 403, "invalid_token");
    join_as(c, &other, other.pk, expired, "", &r);
    expect("expired token", &r, 403, "invalid_token");
    join_as(c, &other, other.pk, revoked, "", &r);
    expect("revoked token", &r, 403, "invalid_token");
    join_as(c, &other, other.pk, "vlt_guess", "", &r);
    expect("guessed token", &r, 403, "invalid_token");
    join_as(c, &other, other.pk, spare, ",\"admin\":true", &r);
    expect("join with an extra field", &r, 400, "bad_request");
    /* Registering someone else's public key: signed by a different key. */
    join_as(c, &c->id, other.pk, spare, "", &r);
    expect("join for a key the caller lacks", &r, 401, "bad_signature");
    /* The same signed join twice: refused for its token, then as a replay. */
    char hdr[ATTACK_SIG_LINES];
    join_json(body, sizeof body, other.pk, "vlt_guess", "");
    if (sign_lines(&other, 0, "POST", "/v1/peers", body, strlen(body), vl_clock_unix_s(), hdr,
                   sizeof hdr) != 0)
        abort();
    request(c, "POST", "/v1/peers", hdr, body, strlen(body), NULL, 0, NULL, 0, 0, &r);
    expect("join, first time", &r, 403, "invalid_token");
    request(c, "POST", "/v1/peers", hdr, body, strlen(body), NULL, 0, NULL, 0, 0, &r);
    expect("join replayed", &r, 401, "replayed_nonce");

    /* A peer that rotated its key with `volley-peer rotate-key`. */
    load_key(c->dir, "rot-old.key", &rot_old);
    load_key(c->dir, "rot-new.key", &rot_new);
    int64_t rot = read_id(c->dir, "rot.id");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, &rot_old, rot, 0, &r);
    expect("old key after rotation", &r, 401, "bad_signature");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, &rot_new, rot, 0, &r);
    expect("new key after rotation (control)", &r, 200, NULL);
    rotate_body(body, sizeof body, fresh.pk, &fresh, rot, rot_old.pk);
    rotate_req(c, &rot_old, rot, body, NULL, &r);
    expect("rotation signed with the retired key", &r, 401, "bad_signature");
    rotate_body(body, sizeof body, fresh.pk, &other, rot, rot_new.pk);
    rotate_req(c, &rot_new, rot, body, NULL, &r);
    expect("rotation proof made by another key", &r, 401, "bad_proof");
    rotate_body(body, sizeof body, fresh.pk, &fresh, c->peer, rot_new.pk);
    rotate_req(c, &rot_new, rot, body, NULL, &r);
    expect("rotation proof made for another peer", &r, 401, "bad_proof");
    char b64[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(fresh.pk, b64);
    snprintf(body, sizeof body, "{\"public_key\":\"%s\"}", b64);
    rotate_req(c, &rot_new, rot, body, NULL, &r);
    expect("rotation without a proof", &r, 400, "bad_request");
    rotate_body(body, sizeof body, c->id.pk, &c->id, rot, rot_new.pk);
    rotate_req(c, &rot_new, rot, body, NULL, &r);
    expect("rotation to another peer's key", &r, 409, "key_in_use");
    /* Back to the key it left: were that allowed, a replay of the
     * rotation away from it (signed by it) would flip the peer again. */
    rotate_body(body, sizeof body, rot_old.pk, &rot_old, rot, rot_new.pk);
    rotate_req(c, &rot_new, rot, body, NULL, &r);
    expect("rotation back to the key the peer left", &r, 409, "key_retired");
    rotate_body(body, sizeof body, fresh.pk, &fresh, rot, rot_new.pk);
    rotate_req(c, &rot_new, rot, body, "text/plain", &r);
    expect("rotation sent as text/plain", &r, 415, "unsupported_media_type");

    /* Administration is the CLI on the database; no route exists for it,
     * whatever a peer signs. */
    static const char *const admin[][3] = {
        {"POST", "/v1/tokens", "peer-signed POST /v1/tokens"},
        {"GET", "/v1/tokens", "peer-signed GET /v1/tokens"},
        {"POST", "/v1/admin/peers/2/revoke", "peer-signed POST /v1/admin/peers/2/revoke"},
        {"POST", "/v1/peers/revoke", "peer-signed POST /v1/peers/revoke"},
    };
    for (size_t i = 0; i < sizeof admin / sizeof admin[0]; i++) {
        req_opts o = {.method = admin[i][0],
                      .target = admin[i][1],
                      .peer = c->peer,
                      .body = "{}",
                      .len = 2,
                      .ctype = "application/json"};
        send_req(c, &o, &r);
        expect(admin[i][2], &r, 404, "not_found");
    }
    request(c, "DELETE", "/v1/peers", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("peer-signed DELETE /v1/peers", &r, 405, "method_not_allowed");
    request(c, "GET", "/v1/peers", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("peer-signed GET /v1/peers", &r, 405, "method_not_allowed");
    vcrypto_identity_wipe(&victim);
    vcrypto_identity_wipe(&rot_old);
    vcrypto_identity_wipe(&rot_new);
}

/* ---- TLS ------------------------------------------------------------------ */

static void tls_probe(ctx *c, const char *name, int version, const char *ciphers12,
                      const char *suites13, long status, const char *code) {
    SSL_CTX *sc = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(sc, c->ca, NULL);
    SSL_CTX_set_verify(sc, SSL_VERIFY_PEER, NULL);
    /* The client offers what the case is about; the server must refuse. */
    SSL_CTX_set_security_level(sc, 0);
    SSL_CTX_set_min_proto_version(sc, version);
    SSL_CTX_set_max_proto_version(sc, version);
    if (ciphers12) SSL_CTX_set_cipher_list(sc, ciphers12);
    if (suites13) SSL_CTX_set_ciphersuites(sc, suites13);
    reply r;
    raw_conn(c, sc, "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 0,
             NULL, 0, &r);
    SSL_CTX_free(sc);
    expect(name, &r, status, code);
}

void attack_tls(ctx *c) {
    tls_probe(c, "TLS 1.0", TLS1_VERSION, "DEFAULT:@SECLEVEL=0", NULL, -1, "tls_refused");
    tls_probe(c, "TLS 1.1", TLS1_1_VERSION, "DEFAULT:@SECLEVEL=0", NULL, -1, "tls_refused");
    tls_probe(c, "TLS 1.2, CBC suite (ECDHE-ECDSA-AES128-SHA256)", TLS1_2_VERSION,
              "ECDHE-ECDSA-AES128-SHA256:@SECLEVEL=0", NULL, -1, "tls_refused");
    tls_probe(c, "TLS 1.2, CBC with SHA-1 (ECDHE-ECDSA-AES256-SHA)", TLS1_2_VERSION,
              "ECDHE-ECDSA-AES256-SHA:@SECLEVEL=0", NULL, -1, "tls_refused");
    tls_probe(c, "TLS 1.2, CCM with 8-byte tags", TLS1_2_VERSION,
              "ECDHE-ECDSA-AES128-CCM8:@SECLEVEL=0", NULL, -1, "tls_refused");
    tls_probe(c, "TLS 1.3, AES-128-CCM", TLS1_3_VERSION, NULL, "TLS_AES_128_CCM_SHA256", -1,
              "tls_refused");
    tls_probe(c, "TLS 1.2, ECDHE AES-GCM (control)", TLS1_2_VERSION,
              "ECDHE-ECDSA-AES128-GCM-SHA256", NULL, 200, NULL);
    reply r;
    raw_conn(c, NULL, "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 0, NULL, 0, &r);
    expect("plain HTTP on the TLS port", &r, -1, "closed");
}

/* ---- limits (coordinator run with --peer-rate 2:4 --addr-rate 20:30
 *      --slow-timeout 2 --min-body-rate 1000) -------------------------------- */

#define SLOW_TIMEOUT_S 2.0

static double mono(void) {
    return vl_clock_mono_s();
}

static void timed(const char *name, double t0, double lo, double hi) {
    double dt = mono() - t0;
    char want[64], got[64];
    snprintf(want, sizeof want, "%.0f to %.0f s", lo, hi);
    snprintf(got, sizeof got, "%.1f s", dt);
    record(name, want, got, dt >= lo && dt <= hi);
}

void attack_limits(ctx *c) {
    reply r;
    /* A head that never ends: refused once it is SLOW_TIMEOUT_S old. */
    double t0 = mono();
    raw(c, "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1", NULL, &r);
    expect("slow request head", &r, 408, "request_timeout");
    timed("slow head refused after the limit", t0, SLOW_TIMEOUT_S, SLOW_TIMEOUT_S + 3);
    /* A body of 1000 bytes at 1000 bytes/s has 2 + 1 s; 10 bytes come. */
    static char body[1000];
    memset(body, ' ', sizeof body);
    memcpy(body, "{\"public_", 10);
    char head[ATTACK_SIG_LINES + 256];
    if (signed_head(c, "POST", "/v1/peers", "application/json", body, sizeof body, 10, head,
                    sizeof head) != 0)
        abort();
    t0 = mono();
    raw(c, head, NULL, &r);
    expect("slow request body", &r, -1, "closed");
    timed("slow body cut off after its deadline", t0, SLOW_TIMEOUT_S + 1, SLOW_TIMEOUT_S + 5);

    /* Forged requests in a peer's name are refused before its bucket. */
    vcrypto_identity other;
    vcrypto_identity_generate(&other);
    int forged_401 = 0;
    for (int i = 0; i < 8; i++) {
        request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, &other, c->peer, 0, &r);
        forged_401 += r.status == 401;
        vl_buf_free(&r.body);
    }
    char got[64];
    snprintf(got, sizeof got, "%d of 8 answered 401", forged_401);
    record("8 forged requests in the peer's name", "8 of 8 answered 401", got, forged_401 == 8);
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("the peer itself after the forgeries (control)", &r, 200, NULL);

    /* Burst 4 (one already taken above), 2 per second: the rest of the
     * burst and what refilled meanwhile pass, then 429. Cheap requests
     * (an unknown version, after authentication) keep the refill small. */
    int served = 0;
    double t1 = mono();
    for (int i = 0; i < 40; i++) {
        request(c, "GET", "/v1/model?version=99999", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
        if (r.status != 404) break;
        served++;
        vl_buf_free(&r.body);
    }
    int most = 3 + 1 + (int)(2 * (mono() - t1));
    char want[64];
    snprintf(want, sizeof want, "3 to %d more served", most);
    snprintf(got, sizeof got, "%d more served", served);
    record("the peer's burst", want, got, served >= 3 && served <= most);
    long wait = atol(r.retry_after);
    expect("requests over the peer's rate", &r, 429, "rate_limited");
    sleep((unsigned)(wait > 0 && wait < 10 ? wait : 1));
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("the peer after Retry-After (control)", &r, 200, NULL);

    /* Burst 30 per address, 20 per second, unauthenticated. */
    int n = 0;
    for (; n < 200; n++) {
        req_opts o = {.method = "GET", .target = "/v1/status", .auth = ""};
        send_req(c, &o, &r);
        if (r.status != 200) break;
        vl_buf_free(&r.body);
    }
    expect("requests over the address's rate", &r, 429, "rate_limited");
}
