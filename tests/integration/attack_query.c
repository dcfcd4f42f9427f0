/* Query strings, held to protocol.md's rule on every route: only the
 * listed parameters, each once, as plain decimal digits, and nothing
 * else: no empty pair, no trailing '&', and on a route that takes no
 * parameters no query at all. Each refusal is 400 bad_request and (with
 * ATTACK_DB) changes nothing stored. Also a join's name one byte over
 * the 64 a name may have. Runs in a sync run, on the lease the attacker
 * holds (c->task). */
#include <stdio.h>
#include <string.h>

#include "attack.h"

/* A signed POST of body (text) to target with the route's content type. */
static void post_text(const ctx *c, const char *name, const char *target, const char *body,
                      const vcrypto_identity *key, int64_t peer, long status, const char *code) {
    reply r;
    request(c, "POST", target, NULL, body, strlen(body), NULL, 0, key, peer, 0, &r);
    expect(name, &r, status, code);
}

/* A join body for key's public key with name (NULL: none) and token. */
static void join_body(char *out, size_t cap, const vcrypto_identity *key, const char *token,
                      const char *name) {
    char b64[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(key->pk, b64);
    snprintf(out, cap, "{\"public_key\":\"%s\",\"token\":\"%s\",\"name\":\"%s\"}", b64, token,
             name);
}

void attack_query(ctx *c) {
    char t[160], body[512];
    reply r;

    /* Separators with nothing between or after them. */
    get(c, "model: a trailing '&'", "/v1/model?version=0&", 400, "bad_request");
    get(c, "model: a leading '&'", "/v1/model?&version=0", 400, "bad_request");
    get(c, "model: an empty pair between two", "/v1/model?version=0&&version=0", 400,
        "bad_request");
    get(c, "task: a trailing '&'", "/v1/task?wait=0&", 400, "bad_request");
    get(c, "task: only '&'", "/v1/task?&", 400, "bad_request");
    get(c, "delta: a trailing '&'", "/v1/model/delta?since=0&", 400, "bad_request");
    get(c, "round: a trailing '&'", "/v1/round?version=0&", 400, "bad_request");
    get(c, "factors: a trailing '&'", "/v1/factors?version=0&", 400, "bad_request");
    get(c, "model: a key without '='", "/v1/model?version", 400, "bad_request");
    get(c, "model: '=' without a key", "/v1/model?=0", 400, "bad_request");
    get(c, "model: an upper-case key", "/v1/model?Version=0", 400, "bad_request");
    get(c, "model: a percent-encoded digit", "/v1/model?version=%30", 400, "bad_request");
    get(c, "model: a signed number", "/v1/model?version=+0", 400, "bad_request");

    /* Routes that take no parameters refuse any query. */
    get(c, "data: an unknown parameter", "/v1/data/train?anything=1", 400, "bad_request");
    get(c, "data: a bare '&'", "/v1/data/train?&", 400, "bad_request");
    request(c, "GET", "/v1/status?anything=1", "", NULL, 0, NULL, 0, NULL, 0, 0, &r);
    expect("status: an unknown parameter", &r, 400, "bad_request");
    post_text(c, "rotate: an unknown parameter", "/v1/peers/rotate?anything=1", "{}", NULL, c->peer,
              400, "bad_request");
    post_text(c, "round values: an unknown parameter", "/v1/round/values?anything=1", "x", NULL,
              c->peer, 400, "bad_request");
    post_text(c, "update: an unknown parameter", "/v1/updates?anything=1", "x", NULL, c->peer, 400,
              "bad_request");
    post_text(c, "update: a trailing '&'", "/v1/updates?next=1&", "x", NULL, c->peer, 400,
              "bad_request");

    /* The task parameters: task ids are 1 or more, as release's are. */
    get(c, "task: uploading 0", "/v1/task?uploading=0", 400, "bad_request");
    snprintf(t, sizeof t, "/v1/task?uploading=%lld", (long long)c->task);
    get(c, "task: uploading in a sync run, of the lease held", t, 400, "bad_request");
    snprintf(t, sizeof t, "/v1/task?release=%lld&uploading=%lld", (long long)c->task,
             (long long)c->task);
    get(c, "task: release and uploading of the same task", t, 400, "bad_request");
    get(c, "task: next=0 alone", "/v1/task?next=0", 400, "bad_request");
    get(c, "task: an unknown parameter", "/v1/task?lease=1", 400, "bad_request");

    /* A join with a query, and a name one byte over 64: both refused
     * before the token is looked at, so the attacker's used-up token
     * serves. */
    vcrypto_identity fresh;
    vcrypto_identity_generate(&fresh);
    join_body(body, sizeof body, &fresh, c->token, "ok");
    post_text(c, "join: an unknown parameter", "/v1/peers?anything=1", body, &fresh, 0, 400,
              "bad_request");
    char name[66];
    memset(name, 'n', 65);
    name[65] = '\0';
    join_body(body, sizeof body, &fresh, c->token, name);
    post_text(c, "join: a name of 65 bytes", "/v1/peers", body, &fresh, 0, 400, "bad_request");
    vcrypto_identity_wipe(&fresh);
}
