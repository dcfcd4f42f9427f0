/* Sends the coordinator one kind of bad request after another and checks
 * each answer's status and JSON error code and, with ATTACK_DB set to the
 * run's database, that the request changed nothing stored. Phases, so
 * the test scripts can set things up and snapshot the database between:
 *
 *   attack prepare URL CA DIR TOKEN BADTOKEN   joins, takes a task lease,
 *                                              saves DIR/attack.state
 *   attack setup URL CA DIR VICTIM_TOKEN       joins a second peer (the one
 *                                              the script then revokes)
 *   attack run URL CA DIR BADTOKEN SPARE REVOKED EXPIRED
 *                                              the bad requests of every
 *                                              kind (attack.c, attack_access.c)
 *   attack limits URL CA DIR                   slow clients and rate limits,
 *                                              against a coordinator started
 *                                              with tight limits
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
 *   attack tokens URL CA DIR                   a token-shard run's data: the
 *                                              lease's range as a shard, bad
 *                                              token requests (attack_tokens.c)
 *   attack burst URL CA DIR TOKEN N            joins a new peer with TOKEN and
 *                                              sends N task requests at once:
 *                                              all must get the same one task
 *   attack capture URL CA DIR FILE             a signed GET /v1/model of the
 *                                              lease's peer (must answer 200),
 *                                              its signature kept in FILE
 *   attack replay URL CA DIR FILE STATUS [CODE] that GET again, as captured
 *   attack split URL CA DIR Q BATCH CLASSES STAGE  a split-learning run
 *                                              (attack_split.c): STAGE bad
 *                                              or expired
 *   attack kfac URL CA DIR STAGE               a K-FAC run that shares factors
 *                                              (attack_kfac.c): STAGE bad
 *                                              (refused factors and factor
 *                                              requests), finish (the lease's
 *                                              update with valid factors)
 *
 * Prints one table row per case and "attack: N passed, N failed". */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>

#include "compress/compress.h"
#include "tests/integration/attack.h"

/* A join body for key pk with token, as JSON text in out. */
static void join_body(char *out, size_t cap, const uint8_t pk[VCRYPTO_PK_BYTES], const char *token,
                      const char *name) {
    char b64[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(pk, b64);
    snprintf(out, cap, "{\"public_key\":\"%s\",\"token\":\"%s\",\"name\":\"%s\"}", b64, token,
             name);
}

/* Joins with c->id and token; c->peer gets the new id. The answer is
 * recorded as a case named name that expects 201. */
static void join_new(ctx *c, const char *token, const char *name, const char *what) {
    char body[512];
    reply r;
    join_body(body, sizeof body, c->id.pk, token, name);
    request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, NULL, 0, 0, &r);
    json_t *j = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    c->peer = json_integer_value(json_object_get(j, "peer_id"));
    json_decref(j);
    expect(what, &r, 201, NULL);
}

int prepare(ctx *c, const char *token, const char *badtoken) {
    reply r;
    char path[1024];
    snprintf(path, sizeof path, "%s/attack.key", c->dir);
    vcrypto_identity_generate(&c->id);
    vl_error e;
    if (vcrypto_identity_save(&c->id, path, 1, &e) != VL_OK) return -1;
    char body[512];
    /* A bad token first: refused, and it must not register the key. */
    join_body(body, sizeof body, c->id.pk, badtoken, "attacker");
    request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, NULL, 0, 0, &r);
    expect("join with an unknown token", &r, 403, "invalid_token");
    /* Names a terminal or a table would misrender (a CSI, a right-to-left
     * override, a zero-width space, a bell) are refused, and the token
     * stays unused for the valid join below. */
    static const char *const bad_names[][2] = {
        {"att\\u009b2Jacker", "a C1 control (CSI) in the name"},
        {"\\u202ekcatta", "a right-to-left override in the name"},
        {"att\\u200backer", "a zero-width space in the name"},
        {"att\\u0007acker", "a C0 control (BEL) in the name"},
    };
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        join_body(body, sizeof body, c->id.pk, token, bad_names[i][0]);
        request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, NULL, 0, 0, &r);
        expect(bad_names[i][1], &r, 400, "bad_request");
    }
    join_new(c, token, "attacker", "join with a valid token");
    /* The reply was lost: the same key joins again with its one-use token. */
    join_body(body, sizeof body, c->id.pk, token, "attacker");
    request(c, "POST", "/v1/peers", NULL, body, strlen(body), NULL, 0, NULL, 0, 0, &r);
    json_t *j = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    int same = json_integer_value(json_object_get(j, "peer_id")) == c->peer;
    json_decref(j);
    expect("join again with the used-up token", &r, 200, NULL);
    record("join again returns the same peer id", "same id", same ? "same id" : "another id", same);
    snprintf(c->token, sizeof c->token, "%s", token);
    request(c, "GET", "/v1/task?wait=30", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    j = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    json_t *cmp = json_incref(json_object_get(j, "compression"));
    c->task = json_integer_value(json_object_get(j, "task_id"));
    c->base_version = json_integer_value(json_object_get(j, "base_version"));
    const char *run = json_string_value(json_object_get(j, "run"));
    snprintf(c->run, sizeof c->run, "%s", run ? run : "");
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
    return save_state(c, cmp);
}

/* Authentication, uploads, queries and framing. */
void attack_general(ctx *c, const char *badtoken) {
    reply r;
    char hdr[ATTACK_SIG_LINES];
    vcrypto_identity other;
    vcrypto_identity_generate(&other);

    request(c, "GET", "/v1/task", "", NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("no signature", &r, 401, "unauthorized");
    request(c, "GET", "/v1/task", "Authorization: Bearer hunter2", NULL, 0, NULL, 0, NULL, c->peer,
            0, &r);
    expect("another auth scheme instead of a signature", &r, 401, "unauthorized");
    request(c, "GET", "/v1/task",
            "Signature-Input: sig1=(\"@method\");created=2;keyid=\"1\"\nSignature: sig1=:AA==:",
            NULL, 0, NULL, 0, NULL, 0, 0, &r);
    expect("truncated signature", &r, 401, "unauthorized");
    if (sign_lines(&c->id, c->peer, "GET", "/v1/task", NULL, 0, vl_clock_unix_s(), hdr,
                   sizeof hdr) != 0)
        abort();
    {
        /* The same signature over fewer components: only @method. */
        char *p = strstr(hdr, "\"@path\" \"@query\"");
        if (!p) abort();
        memmove(p, p + 16, strlen(p + 16) + 1);
    }
    request(c, "GET", "/v1/task", hdr, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("signature that does not cover the target", &r, 401, "unauthorized");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, &other, c->peer, 0, &r);
    expect("bad signature (another key)", &r, 401, "bad_signature");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, 987654, 0, &r);
    expect("unknown peer id", &r, 401, "unknown_peer");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, 0, 0, &r);
    expect("peer=0 outside a join", &r, 401, "unknown_peer");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, c->peer, vl_clock_unix_s() - 1000,
            &r);
    expect("timestamp 1000 s old", &r, 401, "stale_timestamp");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, c->peer,
            vl_clock_unix_s() - VCRYPTO_TS_WINDOW_S - 5, &r);
    expect("timestamp just outside the 300 s window", &r, 401, "stale_timestamp");
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, c->peer, vl_clock_unix_s() + 1000,
            &r);
    expect("timestamp 1000 s ahead", &r, 401, "stale_timestamp");
    req_opts o = {
        .method = "GET", .target = "/v1/task", .sign_target = "/v1/model", .peer = c->peer};
    send_req(c, &o, &r);
    expect("signature for another path", &r, 401, "bad_signature");
    o = (req_opts){.method = "GET",
                   .target = "/v1/task?wait=1",
                   .sign_target = "/v1/task?wait=0",
                   .peer = c->peer};
    send_req(c, &o, &r);
    expect("query altered after signing", &r, 401, "bad_signature");
    o = (req_opts){.method = "GET", .target = "/v1/model", .sign_method = "POST", .peer = c->peer};
    send_req(c, &o, &r);
    expect("signature for another method", &r, 401, "bad_signature");

    /* A replay: the same header twice. The first is honest and harmless. */
    if (sign_lines(&c->id, c->peer, "GET", "/v1/model", NULL, 0, vl_clock_unix_s(), hdr,
                   sizeof hdr) != 0)
        abort();
    request(c, "GET", "/v1/model", hdr, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("first use of a nonce (control)", &r, 200, NULL);
    request(c, "GET", "/v1/model", hdr, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("replayed request (same nonce)", &r, 401, "replayed_nonce");

    vl_buf good, nan_b, huge_b, shape_b, run_b, ver_b;
    update_body(c, &good, c->run, c->base_version, c->n_params, 0.0f);
    update_body(c, &nan_b, c->run, c->base_version, c->n_params, NAN);
    update_body(c, &huge_b, c->run, c->base_version, c->n_params, 1e30f);
    update_body(c, &shape_b, c->run, c->base_version, c->n_params - 1, 0.0f);
    update_body(c, &run_b, "another-run", c->base_version, c->n_params, 0.0f);
    update_body(c, &ver_b, c->run, c->base_version + 7, c->n_params, 0.0f);

    /* The body is altered after signing. */
    vl_buf tampered;
    vl_buf_init(&tampered, VL_BUF_DEFAULT_CAP);
    if (vl_buf_append(&tampered, good.data, good.len) != VL_OK) abort();
    tampered.data[tampered.len - 1] ^= 0x40;
    request(c, "POST", "/v1/updates", NULL, tampered.data, tampered.len, good.data, good.len, NULL,
            c->peer, 0, &r);
    expect("body altered after signing", &r, 400, "digest_mismatch");
    request(c, "POST", "/v1/updates", NULL, tampered.data, tampered.len - 1, good.data, good.len,
            NULL, c->peer, 0, &r);
    expect("body cut after signing (content-length signed)", &r, 401, "bad_signature");
    vl_buf_free(&tampered);

    request(c, "POST", "/v1/updates?next=2", NULL, good.data, good.len, NULL, 0, NULL, c->peer, 0,
            &r);
    expect("upload asking for next=2", &r, 400, "bad_request");
    request(c, "POST", "/v1/updates?lease=1", NULL, good.data, good.len, NULL, 0, NULL, c->peer, 0,
            &r);
    expect("upload with an unknown query key", &r, 400, "bad_request");
    request(c, "POST", "/v1/updates", NULL, "not safetensors", 15, NULL, 0, NULL, c->peer, 0, &r);
    expect("malformed update body", &r, 400, "malformed_update");
    request(c, "POST", "/v1/updates", NULL, good.data, 40, NULL, 0, NULL, c->peer, 0, &r);
    expect("truncated update body", &r, 400, "malformed_update");
    request(c, "POST", "/v1/updates", NULL, "", 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("empty update body", &r, 400, "malformed_update");
    request(c, "POST", "/v1/updates", NULL, nan_b.data, nan_b.len, NULL, 0, NULL, c->peer, 0, &r);
    /* The first refusal for what the update holds ends the lease. */
    expect_lease_ended(c, "NaN in the delta", &r, 422, "non_finite");
    request(c, "POST", "/v1/updates", NULL, huge_b.data, huge_b.len, NULL, 0, NULL, c->peer, 0, &r);
    expect("a finite delta value of 1e30", &r, 422, "out_of_bounds");
    /* The run's robust.max_norm is 100 with excess refused (attack.sh). */
    vl_buf over, many;
    update_body(c, &over, c->run, c->base_version, c->n_params, 1e4f);
    post(c, "norm over robust.max_norm", &over, 422, "norm_exceeded");
    update_body_claiming(c, &many, c->run, c->base_version, c->n_params, 0.0f, 1000000000000LL);
    post(c, "more samples than a task has", &many, 422, "too_many_samples");
    vl_buf steps, lossy, negative;
    update_body_meta(c, &steps, c->run, c->base_version, c->n_params, 0.0f, 10, 1000000000000000LL,
                     5.0);
    post(c, "10^15 local steps", &steps, 422, "too_many_steps");
    update_body_meta(c, &lossy, c->run, c->base_version, c->n_params, 0.0f, 10, 1, 1e308);
    post(c, "a training loss of 1e308", &lossy, 422, "bad_loss");
    update_body_meta(c, &negative, c->run, c->base_version, c->n_params, 0.0f, 10, 1, -1.0);
    post(c, "a negative training loss", &negative, 422, "bad_loss");
    request(c, "POST", "/v1/updates", NULL, shape_b.data, shape_b.len, NULL, 0, NULL, c->peer, 0,
            &r);
    expect("delta of the wrong shape", &r, 422, "bad_shape");
    request(c, "POST", "/v1/updates", NULL, run_b.data, run_b.len, NULL, 0, NULL, c->peer, 0, &r);
    expect("update for another run", &r, 422, "wrong_run");
    request(c, "POST", "/v1/updates", NULL, ver_b.data, ver_b.len, NULL, 0, NULL, c->peer, 0, &r);
    expect("base version not the task's", &r, 422, "wrong_version");
    c->task += 100000;
    vl_buf unk;
    update_body(c, &unk, c->run, c->base_version, c->n_params, 0.0f);
    c->task -= 100000;
    request(c, "POST", "/v1/updates", NULL, unk.data, unk.len, NULL, 0, NULL, c->peer, 0, &r);
    expect("update for an unknown task", &r, 404, "unknown_task");
    vl_buf_free(&unk);
    /* Content types: a valid, signed update under the wrong type. */
    o = (req_opts){.method = "POST",
                   .target = "/v1/updates",
                   .body = good.data,
                   .len = good.len,
                   .peer = c->peer,
                   .ctype = "application/json"};
    send_req(c, &o, &r);
    expect("update sent as application/json", &r, 415, "unsupported_media_type");
    o.ctype = "";
    send_req(c, &o, &r);
    expect("update without Content-Type", &r, 415, "unsupported_media_type");
    vl_buf_free(&good);
    vl_buf_free(&nan_b);
    vl_buf_free(&huge_b);
    vl_buf_free(&shape_b);
    vl_buf_free(&run_b);
    vl_buf_free(&ver_b);

    char body[512];
    request(c, "POST", "/v1/peers", NULL, "{\"public_key\":", 14, NULL, 0, NULL, 0, 0, &r);
    expect("join with malformed JSON", &r, 400, "bad_request");
    join_body(body, sizeof body, other.pk, badtoken, "x");
    o = (req_opts){.method = "POST",
                   .target = "/v1/peers",
                   .body = body,
                   .len = strlen(body),
                   .key = &other,
                   .ctype = "text/plain"};
    send_req(c, &o, &r);
    expect("join sent as text/plain", &r, 415, "unsupported_media_type");
    o.ctype = "application/x-www-form-urlencoded";
    send_req(c, &o, &r);
    expect("join sent as a form", &r, 415, "unsupported_media_type");

    request(c, "GET", "/v1/task?wait=banana", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("malformed query", &r, 400, "bad_request");
    request(c, "GET", "/v1/task?wait=1&wait=2", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("query key given twice", &r, 400, "bad_request");
    request(c, "GET", "/v1/task?wait=61", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("task wait over 60 s", &r, 400, "bad_request");
    /* A sync version counts one update per lease: no second lease while
     * an upload is on its way. */
    request(c, "GET", "/v1/task?wait=0&uploading=1", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("uploading in a sync run", &r, 400, "bad_request");
    request(c, "GET", "/v1/task?wait=0&release=0", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("release of task 0", &r, 400, "bad_request");
    request(c, "GET", "/v1/task?wait=0&release=999999", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0,
            &r);
    expect("release of a task never leased", &r, 404, "unknown_task");
    request(c, "GET", "/v1/task?wait=0&next=0", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("no next lease, and nothing released", &r, 400, "bad_request");
    request(c, "GET", "/v1/task?wait=0&release=1&next=2", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0,
            &r);
    expect("next other than 0 or 1", &r, 400, "bad_request");
    request(c, "GET", "/v1/task?release=999999&next=0", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0,
            &r);
    expect("leaving, a task never leased", &r, 404, "unknown_task");
    request(c, "DELETE", "/v1/task", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("wrong method", &r, 405, "method_not_allowed");
    get(c, "unknown path", "/v1/nothing-here", 404, "not_found");
    get(c, "model version never made", "/v1/model?version=99999", 404, "unknown_version");
    get(c, "held-out data shard", "/v1/data/val", 404, "unknown_shard");
    /* Path tricks, each signed honestly for the path as sent. */
    get(c, "path with /../", "/v1/../v1/task", 404, "not_found");
    get(c, "target starting with // (an authority to libevent)", "//v1/v1/task", 400,
        "bad_request");
    get(c, "path with // inside", "/v1//task", 404, "not_found");
    get(c, "path with a trailing /", "/v1/task/", 404, "not_found");
    get(c, "path in upper case", "/V1/TASK", 404, "not_found");
    get(c, "percent-encoded path", "/v1/%74ask", 404, "not_found");
    get(c, "percent-encoded NUL", "/v1/task%00", 404, "not_found");
    get(c, "shard name climbing out", "/v1/data/../../run.db", 404, "unknown_shard");
    get(c, "shard name climbing out, encoded", "/v1/data/%2e%2e%2f%2e%2e%2frun.db", 404,
        "unknown_shard");

    /* Framing: announced 8 GiB, sent 1 KiB; answered before the body. */
    char head[1024], filler[1025];
    memset(filler, 'x', 1024);
    filler[1024] = '\0';
    snprintf(head, sizeof head,
             "POST /v1/updates HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 8589934592\r\n"
             "Content-Type: application/octet-stream\r\n\r\n");
    raw(c, head, filler, &r);
    expect("update over the cap (8 GiB announced)", &r, 413, "too_large");
    snprintf(head, sizeof head,
             "POST /v1/peers HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 70000\r\n"
             "Content-Type: application/json\r\n\r\n");
    raw(c, head, filler, &r);
    expect("join body over 64 KiB", &r, 413, "too_large");
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
    /* libevent reads a CONNECT target as a host and refuses it in HTML. */
    raw(c, "CONNECT /v1/task HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", NULL, &r);
    expect("CONNECT", &r, 405, "method_not_allowed");
    {
        /* A signed join whose sender stops after 14 of its 5000 bytes. */
        static char cut[5000];
        memset(cut, ' ', sizeof cut);
        memcpy(cut, "{\"public_key\":", 14);
        char slow[ATTACK_SIG_LINES + 256];
        if (signed_head(c, "POST", "/v1/peers", "application/json", cut, sizeof cut, 14, slow,
                        sizeof slow) != 0)
            abort();
        raw_slow(c, slow, 0.2, NULL, 1, &r);
        expect("body cut short (sender closes)", &r, -1, "closed");
    }
    raw(c, "GET https://127.0.0.1/v1/task HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", NULL, &r);
    expect("absolute-form target", &r, 400, "bad_request");
    char *big = malloc(20000);
    if (!big) abort();
    int n = snprintf(big, 20000, "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ");
    memset(big + n, 'a', 17000);
    memcpy(big + n + 17000, "\r\n\r\n", 5);
    raw(c, big, NULL, &r);
    free(big);
    expect("request head over 16 KiB", &r, 413, "too_large");
}

/* A new peer sends n task requests at the same moment, each from its own
 * process and connection: one lease must be written, and every request
 * answered with it (a peer holds one lease per version). */
static int burst(ctx *c, const char *token, int n) {
    vcrypto_identity_generate(&c->id);
    join_new(c, token, "burst", "join for the burst");
    int fds[2];
    if (n < 1 || n > 64 || pipe(fds) != 0) return -1;
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) return -1;
        if (pid == 0) {
            close(fds[0]);
            reply cr;
            request(c, "GET", "/v1/task?wait=10", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &cr);
            json_t *o = json_loadb((const char *)cr.body.data, cr.body.len, 0, NULL);
            long long id =
                cr.status == 200 ? json_integer_value(json_object_get(o, "task_id")) : -1;
            char line[64];
            int len = snprintf(line, sizeof line, "%ld %lld\n", cr.status, id);
            if (write(fds[1], line, (size_t)len) != len) _exit(1);
            _exit(0);
        }
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    long status;
    long long id, first = -1;
    int ok = 0, same = 0, lines = 0;
    while (f && fscanf(f, "%ld %lld", &status, &id) == 2) {
        lines++;
        if (status != 200) continue;
        ok++;
        if (first < 0) first = id;
        same += id == first;
    }
    if (f) fclose(f);
    while (wait(NULL) > 0) {}
    char want[64], got[96];
    snprintf(want, sizeof want, "%d answered 200 with one task", n);
    snprintf(got, sizeof got, "%d of %d answered 200, %d with the first one's task", ok, lines,
             same);
    record("simultaneous task requests from one peer", want, ok == n && same == n ? want : got,
           ok == n && same == n);
    return 0;
}

/* A signed request kept as it went over the wire, and sent again later
 * (after a restart, say) by someone who could read but not sign. */
static int capture(ctx *c, const char *file) {
    char hdr[ATTACK_SIG_LINES];
    if (sign_lines(&c->id, c->peer, "GET", "/v1/model", NULL, 0, vl_clock_unix_s(), hdr,
                   sizeof hdr) != 0)
        return -1;
    reply r;
    request(c, "GET", "/v1/model", hdr, NULL, 0, NULL, 0, NULL, 0, 0, &r);
    expect("signed GET /v1/model, captured", &r, 200, NULL);
    FILE *f = fopen(file, "w");
    if (!f || fputs(hdr, f) < 0 || fclose(f) != 0) return -1;
    return 0;
}

static int replay(ctx *c, const char *file, long status, const char *code) {
    char hdr[ATTACK_SIG_LINES] = "";
    FILE *f = fopen(file, "r");
    size_t n = f ? fread(hdr, 1, sizeof hdr - 1, f) : 0;
    if (f) fclose(f);
    if (n == 0) return -1;
    hdr[n] = '\0';
    reply r;
    request(c, "GET", "/v1/model", hdr, NULL, 0, NULL, 0, NULL, 0, 0, &r);
    expect("the captured GET /v1/model sent again", &r, status, code);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5 || (strcmp(argv[1], "prepare") == 0 && argc < 7)) {
        fprintf(stderr, "usage: attack MODE URL CA DIR ... (see attack.c)\n");
        return 2;
    }
    /* The server closes connections it refuses; a write after that must be
     * an error to look at, not a signal that kills the client. */
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (vcrypto_init() != VL_OK || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return 2;
    ctx c = {.url = argv[2], .ca = argv[3], .dir = argv[4]};
    const char *mode = argv[1];
    if (strcmp(mode, "prepare") == 0) {
        table_begin("attack: prepare");
        if (prepare(&c, argv[5], argv[6]) != 0) return 2;
        return table_end();
    }
    if (strcmp(mode, "burst") == 0 && argc > 6) {
        table_begin("attack: burst");
        if (burst(&c, argv[5], atoi(argv[6])) != 0) return 2;
        return table_end();
    }
    if (strcmp(mode, "nat") == 0 && argc > 7) {
        table_begin("attack: nat");
        if (attack_nat(&c, argv[5], atoi(argv[6]), atoi(argv[7])) != 0) return 2;
        return table_end();
    }
    if (strcmp(mode, "bodies") == 0 && argc > 8) {
        table_begin("attack: bodies");
        if (attack_bodies(&c, argv[5], atoi(argv[6]), (size_t)atoll(argv[7]),
                          (size_t)atoll(argv[8])) != 0)
            return 2;
        return table_end();
    }
    if (strcmp(mode, "revoke-mid-body") == 0 && argc > 6) {
        table_begin("attack: revoke-mid-body");
        if (attack_revoke_mid_body(&c, argv[5], argv[6]) != 0) return 2;
        return table_end();
    }
    if (load_state(&c, argv[4]) != 0 || c.n_params == 0) {
        fprintf(stderr, "attack: no usable state in %s\n", argv[4]);
        return 2;
    }
    char title[64];
    snprintf(title, sizeof title, "attack: %s", mode);
    table_begin(title);
    if (strcmp(mode, "setup") == 0 && argc > 5) {
        if (setup_access(&c, argv[5]) != 0) return 2;
    } else if (strcmp(mode, "run") == 0 && argc > 8) {
        attack_general(&c, argv[5]);
        attack_replay(&c);
        attack_access(&c, argv[6], argv[7], argv[8]);
        attack_tls(&c);
        attack_query(&c);
    } else if (strcmp(mode, "limits") == 0) {
        attack_limits(&c);
    } else if (strcmp(mode, "sparse") == 0) {
        attack_sparse(&c);
    } else if (strcmp(mode, "finish") == 0) {
        finish(&c, 202, NULL);
    } else if (strcmp(mode, "late") == 0 && argc > 5) {
        finish(&c, atol(argv[5]), argc > 6 ? argv[6] : NULL);
    } else if (strcmp(mode, "delta") == 0 && argc > 6) {
        delta(&c, argv[5], atol(argv[6]));
    } else if (strcmp(mode, "values") == 0 && argc > 5) {
        attack_values(&c, argv[5]);
    } else if (strcmp(mode, "lease") == 0) {
        if (lease(&c) != 0) return 2;
    } else if (strcmp(mode, "tokens") == 0) {
        attack_tokens(&c);
    } else if (strcmp(mode, "capture") == 0 && argc > 5) {
        if (capture(&c, argv[5]) != 0) return 2;
    } else if (strcmp(mode, "replay") == 0 && argc > 6) {
        if (replay(&c, argv[5], atol(argv[6]), argc > 7 ? argv[7] : NULL) != 0) return 2;
    } else if (strcmp(mode, "kfac") == 0 && argc > 5) {
        attack_kfac(&c, argv[5]);
    } else if (strcmp(mode, "split") == 0 && argc > 8) {
        attack_split(&c, atoi(argv[5]), atoi(argv[6]), atoi(argv[7]), argv[8]);
    } else {
        fprintf(stderr, "attack: unknown mode or missing arguments: %s\n", mode);
        return 2;
    }
    return table_end();
}
