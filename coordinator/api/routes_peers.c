/* POST /v1/peers (join), POST /v1/peers/rotate (a peer's new key) and
 * GET /v1/status: the run, its versions, each peer's state, and the
 * distributions of local steps and staleness. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "coordinator/coord.h"
#include "coordinator/api/api.h"
#include "coordinator/http/http.h"
#include "coordinator/run/writer.h"

/* A name a join accepts is stored, listed and shown whole. */
_Static_assert(COORD_JOIN_NAME_MAX == STORAGE_PEER_NAME_MAX,
               "the accepted and the stored peer name lengths differ");

/* Format characters (Unicode category Cf) a name could use to disguise
 * itself in a terminal or a table: bidirectional overrides and isolates,
 * zero-width characters, invisible operators, tags. */
static int format_char(uint32_t c) {
    static const uint32_t ranges[][2] = {
        {0x00AD, 0x00AD},   {0x0600, 0x0605},   {0x061C, 0x061C},   {0x06DD, 0x06DD},
        {0x070F, 0x070F},   {0x08E2, 0x08E2},   {0x180E, 0x180E},   {0x200B, 0x200F},
        {0x2028, 0x202E},   {0x2060, 0x206F},   {0xFEFF, 0xFEFF},   {0xFFF9, 0xFFFB},
        {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3},
        {0x1D173, 0x1D17A}, {0xE0001, 0xE0001}, {0xE0020, 0xE007F},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (c >= ranges[i][0] && c <= ranges[i][1]) return 1;
    return 0;
}

/* Whether s (UTF-8, as jansson has already checked) holds no control
 * character (C0, DEL, C1) and no format character: a peer's name is
 * printed raw in logs, `peer list` and /v1/status. */
static int printable(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        uint32_t c;
        int len = *p < 0x80 ? 1 : *p < 0xE0 ? 2 : *p < 0xF0 ? 3 : 4;
        if (*p < 0x80)
            c = *p;
        else if (len == 2)
            c = *p & 0x1F;
        else if (len == 3)
            c = *p & 0x0F;
        else
            c = *p & 0x07;
        for (int i = 1; i < len; i++) {
            if ((p[i] & 0xC0) != 0x80) return 0; /* not UTF-8 after all */
            c = (c << 6) | (p[i] & 0x3F);
        }
        if (c < 0x20 || (c >= 0x7F && c <= 0x9F) || format_char(c)) return 0;
        p += len;
    }
    return 1;
}

int coord_join_parse(const uint8_t *body, size_t len, coord_join_body *out, vl_error *err) {
    memset(out, 0, sizeof *out);
    if (len > COORD_MAX_JSON_BODY)
        return vl_fail(err, VL_ETOOBIG, "a join body is at most %d bytes", COORD_MAX_JSON_BODY);
    json_error_t jerr;
    json_t *root =
        body && len > 0 ? json_loadb((const char *)body, len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    if (!root) return vl_fail(err, VL_EINVAL, "the body is not valid JSON");
    int rc = VL_OK;
    const char *key;
    json_t *val;
    if (!json_is_object(root)) {
        rc = vl_fail(err, VL_EINVAL, "the body must be a JSON object");
        goto out;
    }
    json_object_foreach(root, key, val) {
        if (strcmp(key, "public_key") && strcmp(key, "token") && strcmp(key, "name") &&
            strcmp(key, "hardware")) {
            rc = vl_fail(err, VL_EINVAL, "unknown field '%.40s'", key);
            goto out;
        }
    }
    json_t *pk = json_object_get(root, "public_key");
    if (!json_is_string(pk) || vcrypto_pk_decode(json_string_value(pk), out->pk) != VL_OK) {
        rc = vl_fail(err, VL_EINVAL, "public_key must be base64 of 32 bytes");
        goto out;
    }
    json_t *tok = json_object_get(root, "token");
    size_t tlen = json_is_string(tok) ? json_string_length(tok) : 0;
    if (tlen == 0 || tlen > COORD_JOIN_TOKEN_MAX) {
        rc = vl_fail(err, VL_EINVAL, "token must be a string of 1 to %d bytes",
                     COORD_JOIN_TOKEN_MAX);
        goto out;
    }
    memcpy(out->token, json_string_value(tok), tlen);
    out->token_len = tlen;
    json_t *name = json_object_get(root, "name");
    if (!json_is_string(name) || json_string_length(name) == 0 ||
        json_string_length(name) > COORD_JOIN_NAME_MAX ||
        strlen(json_string_value(name)) != json_string_length(name) ||
        !printable(json_string_value(name))) {
        rc = vl_fail(err, VL_EINVAL,
                     "name must be 1 to %d bytes of printable characters (no "
                     "control or format characters)",
                     COORD_JOIN_NAME_MAX);
        goto out;
    }
    memcpy(out->name, json_string_value(name), json_string_length(name) + 1);
    json_t *hw = json_object_get(root, "hardware");
    if (hw && !json_is_object(hw)) {
        rc = vl_fail(err, VL_EINVAL, "hardware must be an object");
        goto out;
    }
    /* Escaped to ASCII: what a peer says about its hardware is shown as
     * JSON, and no character of it reaches a terminal raw. */
    out->hardware = hw ? json_dumps(hw, JSON_COMPACT | JSON_ENSURE_ASCII) : strdup("{}");
    if (!out->hardware) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory reading the join body");
        goto out;
    }
    if (strlen(out->hardware) > COORD_JOIN_HARDWARE_MAX)
        rc = vl_fail(err, VL_EINVAL, "hardware must serialise to at most %d bytes",
                     COORD_JOIN_HARDWARE_MAX);
out:
    json_decref(root);
    if (rc != VL_OK) coord_join_body_free(out);
    return rc;
}

void coord_join_body_free(coord_join_body *b) {
    free(b->hardware);
    b->hardware = NULL;
    /* The token is a secret: it does not outlive the request. */
    explicit_bzero(b->token, sizeof b->token);
    b->token_len = 0;
}

static void reply_joined(coord_req *cr, int status, int64_t peer_id) {
    json_t *run = json_loads(cr->srv->run.peer_config, 0, NULL);
    if (!run) {
        vl_error e = {.code = VL_ENOMEM};
        snprintf(e.msg, sizeof e.msg, "cannot rebuild the run configuration");
        coord_reply_internal(cr, &e);
        return;
    }
    cr->peer_id = peer_id;
    coord_reply_json(cr, status,
                     json_pack("{s:I, s:o}", "peer_id", (json_int_t)peer_id, "run", run));
}

/* A registration on its way to the database. */
typedef struct join_job {
    coord_job job;
    coord_req cr;
    uint8_t pk[VCRYPTO_PK_BYTES];
    char name[COORD_JOIN_NAME_MAX + 1];
    char *hardware; /* owned */
    int64_t token_id, now, id;
} join_job;

/* The use is taken in the transaction that registers the peer, so a
 * token can never admit more peers than it has uses. */
static int join_run(storage *db, coord_job *job, vl_error *err) {
    join_job *j = (join_job *)job;
    int rc = storage_token_use(db, j->token_id, j->now, err);
    if (rc == VL_OK)
        rc = storage_peer_insert(db, j->pk, j->name, j->hardware, j->token_id, j->now, &j->id, err);
    return rc;
}

static void join_done(coord_job *job, int rc, const vl_error *err) {
    join_job *j = (join_job *)job;
    if (rc == VL_ENOTFOUND) {
        /* Another join took the token's last use meanwhile, or it was
         * revoked or expired since the request checked it. */
        coord_reply_error(&j->cr, 403, "invalid_token", "the token is unknown, expired or used up");
    } else if (rc == VL_ECONFLICT) {
        /* The same key joined twice at once; the other request registered it. */
        coord_reply_error(&j->cr, 409, "already_joined",
                          "this key is being registered by "
                          "another request; join again to get its peer id");
    } else if (rc != VL_OK) {
        coord_reply_internal(&j->cr, err);
    } else {
        vl_log_info("peer %lld joined as \"%s\"", (long long)j->id, j->name);
        reply_joined(&j->cr, 201, j->id);
    }
    free(j->hardware);
    free(j);
}

void coord_route_join(coord_req *cr) {
    coord_server *srv = cr->srv;
    /* 1. The body, and the head signed by the key it registers. */
    size_t len;
    const uint8_t *body = coord_body(cr, &len);
    vl_error e = {0};
    coord_join_body jb;
    int prc = coord_join_parse(body, len, &jb, &e);
    if (prc == VL_ENOMEM) {
        coord_reply_oom(cr, "reading a join");
        return;
    }
    if (prc != VL_OK) {
        coord_reply_error(cr, 400, "bad_request", "%s", e.msg);
        return;
    }
    if (coord_authenticate_join(cr, jb.pk) != 0) goto out;

    /* 2. The key: one of a revoked peer, or retired by a rotation, is refused. */
    storage_peer existing;
    int rc = storage_peer_find_key(srv->run.db, jb.pk, &existing, &e);
    if (rc != VL_OK && rc != VL_ENOTFOUND) {
        coord_reply_internal(cr, &e);
        goto out;
    }
    int known = rc == VL_OK;
    int64_t known_id = known ? existing.id : 0;
    int64_t known_token = known ? existing.token_id : 0;
    int revoked = known && existing.revoked;
    if (known) storage_peer_free(&existing);
    if (revoked) {
        coord_reply_error(cr, 403, "revoked", "this key belongs to a revoked peer");
        goto out;
    }
    int retired = 0;
    if (!known && (rc = storage_key_retired(srv->run.db, jb.pk, &retired, &e)) != VL_OK) {
        coord_reply_internal(cr, &e);
        goto out;
    }
    if (retired) {
        coord_reply_error(cr, 409, "key_retired",
                          "this key was a peer's before it rotated to "
                          "another; make a new key");
        goto out;
    }
    /* 3. The token: a lost reply's retry, else one with uses left. */
    char hash[VCRYPTO_HASH_HEX + 1];
    vcrypto_hash_hex(jb.token, jb.token_len, hash);
    int64_t token_id = 0;
    int64_t now = vl_clock_unix_s();
    if (known) {
        /* A peer whose join reply was lost retries with the token that
         * registered it, which may have no uses left by now: the same token
         * and the same key prove it is the same join. */
        rc = storage_token_find(srv->run.db, hash, &token_id, &e);
        if (rc != VL_OK && rc != VL_ENOTFOUND) {
            coord_reply_internal(cr, &e);
            goto out;
        }
        if (rc == VL_OK && token_id == known_token) {
            reply_joined(cr, 200, known_id);
            goto out;
        }
    }
    rc = storage_token_check(srv->run.db, hash, now, &token_id, &e);
    if (rc == VL_ENOTFOUND) {
        coord_reply_error(cr, 403, "invalid_token", "the token is unknown, expired or used up");
        goto out;
    }
    if (rc != VL_OK) {
        coord_reply_internal(cr, &e);
        goto out;
    }
    if (known) {
        reply_joined(cr, 200, known_id);
        goto out;
    }
    /* 4. A new peer: the writer registers it, and the reply waits for the commit. */
    join_job *j = calloc(1, sizeof *j);
    if (!j) {
        coord_reply_oom(cr, "queueing a join");
        goto out;
    }
    j->job.run = join_run;
    j->job.done = join_done;
    j->cr = *cr;
    memcpy(j->pk, jb.pk, sizeof j->pk);
    snprintf(j->name, sizeof j->name, "%s", jb.name);
    j->hardware = jb.hardware;
    jb.hardware = NULL;
    j->token_id = token_id;
    j->now = now;
    coord_writer_submit(srv->run.writer, &j->job);
out:
    coord_join_body_free(&jb);
}

/* ---- key rotation ----------------------------------------------------------- */

typedef struct rotate_job {
    coord_job job;
    coord_req cr;
    uint8_t old_pk[VCRYPTO_PK_BYTES], new_pk[VCRYPTO_PK_BYTES];
} rotate_job;

static int rotate_run(storage *db, coord_job *job, vl_error *err) {
    rotate_job *j = (rotate_job *)job;
    return storage_peer_set_key(db, j->cr.peer_id, j->old_pk, j->new_pk, err);
}

static void reply_key(coord_req *cr, const uint8_t pk[VCRYPTO_PK_BYTES], int rotated) {
    char b64[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(pk, b64);
    coord_reply_json(cr, 200,
                     json_pack("{s:I, s:s, s:b}", "peer_id", (json_int_t)cr->peer_id, "public_key",
                               b64, "rotated", rotated));
}

static void rotate_done(coord_job *job, int rc, const vl_error *err) {
    rotate_job *j = (rotate_job *)job;
    if (rc == VL_ECONFLICT) {
        coord_reply_error(&j->cr, 409, "key_in_use",
                          "the new key is registered already or "
                          "retired");
    } else if (rc == VL_ENOTFOUND) {
        /* Revoked, or another rotation won, between the checks and now. */
        coord_reply_error(&j->cr, 409, "key_changed",
                          "the peer was revoked or its key changed "
                          "meanwhile; nothing was changed");
    } else if (rc != VL_OK) {
        coord_reply_internal(&j->cr, err);
    } else {
        vl_log_info("peer %lld rotated its key", (long long)j->cr.peer_id);
        reply_key(&j->cr, j->new_pk, 1);
    }
    free(j);
}

int coord_rotate_parse(const uint8_t *body, size_t len, uint8_t pk[VCRYPTO_PK_BYTES],
                       char proof[VCRYPTO_SIG_B64_LEN + 8], vl_error *err) {
    json_error_t jerr;
    json_t *root = body && len > 0 && len <= COORD_MAX_JSON_BODY
                       ? json_loadb((const char *)body, len, JSON_REJECT_DUPLICATES, &jerr)
                       : NULL;
    int ok = json_is_object(root) && json_object_size(root) == 2;
    json_t *k = ok ? json_object_get(root, "public_key") : NULL;
    json_t *p = ok ? json_object_get(root, "proof") : NULL;
    ok = json_is_string(k) && json_is_string(p) &&
         vcrypto_pk_decode(json_string_value(k), pk) == VL_OK &&
         json_string_length(p) < VCRYPTO_SIG_B64_LEN + 8;
    if (ok) snprintf(proof, VCRYPTO_SIG_B64_LEN + 8, "%s", json_string_value(p));
    json_decref(root);
    if (!ok)
        return vl_fail(err, VL_EINVAL,
                       "the body must be {\"public_key\": base64 of 32 bytes, "
                       "\"proof\": base64 signature} and nothing else");
    return VL_OK;
}

void coord_route_rotate(coord_req *cr) {
    coord_server *srv = cr->srv;
    size_t len;
    const uint8_t *body = coord_body(cr, &len);
    uint8_t new_pk[VCRYPTO_PK_BYTES];
    char proof[VCRYPTO_SIG_B64_LEN + 8];
    vl_error e = {0};
    if (coord_rotate_parse(body, len, new_pk, proof, &e) != VL_OK) {
        coord_reply_error(cr, 400, "bad_request", "%s", e.msg);
        return;
    }
    storage_peer p;
    int rc = storage_peer_get(srv->run.db, cr->peer_id, &p, &e);
    if (rc != VL_OK) {
        coord_reply_internal(cr, &e);
        return;
    }
    uint8_t old_pk[VCRYPTO_PK_BYTES];
    memcpy(old_pk, p.public_key, sizeof old_pk);
    storage_peer_free(&p);
    /* Signed by the key it names: a retry whose answer was lost, after
     * the change. The signature already proves the key; nothing to do. */
    if (vcrypto_equal(new_pk, old_pk, sizeof old_pk)) {
        reply_key(cr, old_pk, 0);
        return;
    }
    rc = vcrypto_rotation_verify(new_pk, cr->peer_id, old_pk, proof, &e);
    if (rc == VL_EINVAL) {
        coord_reply_error(cr, 400, "bad_request", "%s", e.msg);
        return;
    }
    if (rc != VL_OK) {
        coord_reply_error(cr, 401, "bad_proof",
                          "the proof is not the new key's signature of "
                          "this rotation");
        return;
    }
    rc = storage_peer_find_key(srv->run.db, new_pk, &p, &e);
    if (rc == VL_OK) {
        storage_peer_free(&p);
        coord_reply_error(cr, 409, "key_in_use", "the new key is registered already");
        return;
    }
    if (rc != VL_ENOTFOUND) {
        coord_reply_internal(cr, &e);
        return;
    }
    /* A key the peer (or another) has left stays left: a rotation back to
     * it would let a replay of the rotation away from it flip the key. */
    int retired = 0;
    if ((rc = storage_key_retired(srv->run.db, new_pk, &retired, &e)) != VL_OK) {
        coord_reply_internal(cr, &e);
        return;
    }
    if (retired) {
        coord_reply_error(cr, 409, "key_retired",
                          "the new key was a peer's before; make a new "
                          "one");
        return;
    }
    rotate_job *j = calloc(1, sizeof *j);
    if (!j) {
        coord_reply_oom(cr, "queueing a key rotation");
        return;
    }
    j->job.run = rotate_run;
    j->job.done = rotate_done;
    j->cr = *cr;
    memcpy(j->old_pk, old_pk, sizeof old_pk);
    memcpy(j->new_pk, new_pk, sizeof new_pk);
    coord_writer_submit(srv->run.writer, &j->job);
}
