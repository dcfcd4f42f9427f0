/* `volley-peer rotate-key`: moves the peer to a new key with a request
 * signed by the old one. The new key is written to DIR/peer.key.next
 * before anything is sent and takes peer.key's place only once the
 * coordinator has accepted it, so a crash or a lost answer at any point
 * leaves both keys on disk, and running the command again finishes the
 * change: if the old key is refused there, the same request is sent signed
 * with the new key, which the coordinator accepts as already done. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "peer/peer.h"

#define NEXT_KEY_FILE PEER_KEY_FILE ".next"
#define REPLY_CAP ((size_t)1 << 16)
#define IDLE_S 60L

/* The pending new key: the one a previous attempt left, else a fresh one
 * saved before use. */
static int next_key(const char *path, vcrypto_identity *id, vl_error *err) {
    if (access(path, F_OK) == 0) return vcrypto_identity_load(id, path, err);
    vcrypto_identity_generate(id);
    return vcrypto_identity_save(id, path, 0, err);
}

/* POST /v1/peers/rotate with body, signed by `by`. */
static int post(const peer_state *st, const vcrypto_identity *by, int retries, double give_up_s,
                const char *body, peer_response *rs, vl_error *err) {
    peer_retry_policy pol;
    peer_retry_for(&pol, retries, give_up_s);
    peer_http *h = NULL;
    int rc = peer_http_open(st->coordinator, st->cacert, by, st->peer_id, &pol, &h, err);
    if (!rc) {
        peer_request rq = {.method = "POST",
                           .target = "/v1/peers/rotate",
                           .content_type = "application/json",
                           .body = (const uint8_t *)body,
                           .body_len = strlen(body),
                           .cap = REPLY_CAP,
                           .idle_s = IDLE_S};
        rc = peer_http_do(h, &rq, rs, err);
    }
    peer_http_close(h);
    return rc;
}

/* The reply names the key the coordinator now holds for us. */
static int check_reply(const peer_response *rs, const char *want, vl_error *err) {
    json_t *o = json_loadb((const char *)rs->body.data, rs->body.len, 0, NULL);
    const char *pk = json_string_value(json_object_get(o, "public_key"));
    int ok = pk && strcmp(pk, want) == 0;
    json_decref(o);
    return ok ? VL_OK : vl_fail(err, VL_EINVAL, "the rotation reply does not name the new key");
}

int peer_rotate_key(const char *dir, int retries, double give_up_s, char *pk_b64, vl_error *err) {
    if (vcrypto_init() != VL_OK) return vl_fail(err, VL_ERR, "libsodium failed to initialise");
    peer_state st;
    int rc = peer_state_load(dir, &st, err);
    if (rc) return rc;
    char key_path[PEER_PATH_MAX], next_path[PEER_PATH_MAX];
    if ((rc = peer_path_join(key_path, sizeof key_path, dir, PEER_KEY_FILE, err)) ||
        (rc = peer_path_join(next_path, sizeof next_path, dir, NEXT_KEY_FILE, err)))
        return rc;
    vcrypto_identity old_id, new_id;
    if ((rc = vcrypto_identity_load(&old_id, key_path, err))) return rc;
    if ((rc = next_key(next_path, &new_id, err))) {
        vcrypto_identity_wipe(&old_id);
        return rc;
    }
    char pk[VCRYPTO_PK_B64_LEN + 1], proof[VCRYPTO_SIG_B64_LEN + 1];
    vcrypto_pk_encode(new_id.pk, pk);
    vcrypto_rotation_sign(&new_id, st.peer_id, old_id.pk, proof);
    json_t *o = json_pack("{s:s, s:s}", "public_key", pk, "proof", proof);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    peer_response rs;
    peer_response_init(&rs);
    if (!body) rc = vl_fail(err, VL_ENOMEM, "cannot build the rotation request");
    if (!rc) rc = post(&st, &old_id, retries, give_up_s, body, &rs, err);
    if (!rc && rs.status == 401) {
        /* Perhaps an earlier attempt went through and only its answer was
         * lost: then the new key is the one the coordinator knows. */
        peer_response again;
        peer_response_init(&again);
        vl_error e2 = {0};
        if (post(&st, &new_id, retries, give_up_s, body, &again, &e2) == VL_OK &&
            again.status == 200) {
            peer_response_free(&rs);
            rs = again;
        } else {
            peer_response_free(&again);
        }
    }
    if (!rc && rs.status != 200)
        rc = peer_refusal(err, "key rotation refused", rs.status, rs.body.data, rs.body.len);
    if (!rc) rc = check_reply(&rs, pk, err);
    if (!rc && rename(next_path, key_path) != 0)
        rc = vl_fail(err, VL_EIO,
                     "the coordinator holds the new key but %s could not replace "
                     "%s (%s); run rotate-key again",
                     next_path, key_path, strerror(errno));
    if (!rc) memcpy(pk_b64, pk, sizeof pk);
    free(body);
    peer_response_free(&rs);
    vcrypto_identity_wipe(&old_id);
    vcrypto_identity_wipe(&new_id);
    return rc;
}
