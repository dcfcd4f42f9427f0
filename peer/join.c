/* join: register this peer's key with the coordinator for a token, and
 * keep what the answer says (peer id, run, coordinator) in the peer's
 * directory for every later run. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "peer/peer.h"

#define JSON_CAP ((size_t)1 << 20)
#define IDLE_S 120L

/* ---- join -------------------------------------------------------------- */

int peer_load_key(const char *dir, vcrypto_identity *id, vl_error *err) {
    char path[PEER_PATH_MAX];
    int rc = peer_path_join(path, sizeof path, dir, PEER_KEY_FILE, err);
    if (rc) return rc;
    if (access(path, F_OK) != 0)
        return vl_fail(err, VL_ENOTFOUND, "no key at %s; run 'volley-peer keygen --dir %s' first",
                       path, dir);
    return vcrypto_identity_load(id, path, err);
}

int peer_join(const peer_join_opts *o, peer_state *out, vl_error *err) {
    peer_state st;
    memset(&st, 0, sizeof st);
    int rc = peer_url_check(o->coordinator, st.coordinator, sizeof st.coordinator, err);
    if (rc) return rc;
    size_t tl = o->token ? strnlen(o->token, 1024) : 0;
    if (tl == 0 || tl > 512)
        return vl_fail(err, VL_EINVAL, "a join token of 1 to 512 characters is required");
    for (size_t i = 0; i < tl; i++)
        if ((unsigned char)o->token[i] < 0x21 || o->token[i] == 0x7f)
            return vl_fail(err, VL_EINVAL,
                           "the join token contains whitespace or a control "
                           "character");
    if (o->cacert && *o->cacert) {
        char abs[PATH_MAX];
        if (!realpath(o->cacert, abs))
            return vl_fail(err, VL_ENOTFOUND, "cannot find CA certificate %s", o->cacert);
        if (strlen(abs) >= sizeof st.cacert)
            return vl_fail(err, VL_ETOOBIG, "CA certificate path is too long");
        memcpy(st.cacert, abs, strlen(abs) + 1);
    }
    if (o->name && *o->name) {
        peer_clean_copy(o->name, st.name, sizeof st.name);
    } else {
        char host[256];
        if (gethostname(host, sizeof host) == 0) {
            host[sizeof host - 1] = '\0';
            peer_clean_copy(host, st.name, sizeof st.name);
        }
    }
    if (vcrypto_init() != VL_OK) return vl_fail(err, VL_ERR, "libsodium failed to initialise");
    vcrypto_identity id;
    if ((rc = peer_load_key(o->dir, &id, err))) return rc;

    char pk[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_pk_encode(id.pk, pk);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    json_t *body =
        json_pack("{s:s, s:s, s:s, s:{s:I, s:s}}", "public_key", pk, "token", o->token, "name",
                  st.name, "hardware", "cpus", (json_int_t)(cpus > 0 ? cpus : 1), "gpu", "none");
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) {
        vcrypto_identity_wipe(&id);
        return vl_fail(err, VL_ENOMEM, "cannot build the join request");
    }
    peer_retry_policy pol;
    peer_retry_for(&pol, o->retries, o->give_up_s);
    peer_http *h = NULL;
    peer_response rs;
    peer_response_init(&rs);
    rc = peer_http_open(st.coordinator, st.cacert, &id, 0, &pol, &h, err);
    if (!rc) {
        peer_request rq = {.method = "POST",
                           .target = "/v1/peers",
                           .content_type = "application/json",
                           .body = (const uint8_t *)text,
                           .body_len = strlen(text),
                           .cap = JSON_CAP,
                           .idle_s = IDLE_S};
        rc = peer_http_do(h, &rq, &rs, err);
    }
    free(text);
    if (!rc && rs.status != 200 && rs.status != 201)
        rc = peer_refusal(err, "join refused", rs.status, rs.body.data, rs.body.len);
    if (!rc) rc = peer_join_reply_parse(rs.body.data, rs.body.len, &st, err);
    if (!rc) rc = peer_state_save(o->dir, &st, err);
    if (!rc) *out = st;
    peer_response_free(&rs);
    peer_http_close(h);
    vcrypto_identity_wipe(&id);
    return rc;
}
