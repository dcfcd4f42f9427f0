/*
 * The run's progress in `volley-peer status` (peer/progress.h): asked of
 * the coordinator (GET /v1/status, one try) when it answers, else what the
 * peer's directory last heard, saying which.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "peer/peer.h"
#include "peer/progress.h"

/* GET /v1/status answers hold one entry a version; a long run's is large
 * but bounded. */
#define STATUS_CAP ((size_t)8 << 20)

int peer_status_fetch(const char *dir, const char *coordinator, const char *cacert, int64_t peer_id,
                      peer_response *rs, char *why, size_t cap) {
    vcrypto_identity id;
    vl_error e = {0};
    peer_http *h = NULL;
    peer_retry_policy pol;
    peer_retry_for(&pol, 1, 0);
    int rc = peer_load_key(dir, &id, &e);
    if (!rc) {
        rc = peer_http_open(coordinator, cacert, &id, peer_id, &pol, &h, &e);
        peer_request rq = {
            .method = "GET", .target = "/v1/status", .cap = STATUS_CAP, .idle_s = 10, .once = 1};
        if (!rc) rc = peer_http_do(h, &rq, rs, &e);
        if (!rc && rs->status != 200) {
            snprintf(e.msg, sizeof e.msg, "it answered %ld", rs->status);
            rc = VL_EIO;
        }
        peer_http_close(h);
        vcrypto_identity_wipe(&id);
    }
    if (rc) snprintf(why, cap, "did not answer (%s)", e.msg);
    return rc;
}

/* The validation loss of entry v of versions, or NAN. */
static double val_loss(json_t *versions, size_t i) {
    json_t *l = json_object_get(json_array_get(versions, i), "val_loss");
    return json_is_number(l) ? json_number_value(l) : NAN;
}

void peer_status_run_line(const char *body, size_t len, const peer_progress *p, const char *why,
                          char *out, size_t cap) {
    json_t *o = body ? json_loadb(body, len, 0, NULL) : NULL;
    json_t *ver = json_object_get(o, "version"), *max = json_object_get(o, "max_versions");
    const char *state = json_string_value(json_object_get(o, "status"));
    if (json_is_integer(ver) && json_is_integer(max) && state) {
        int n = snprintf(out, cap, "version %lld of %lld (%s)", (long long)json_integer_value(ver),
                         (long long)json_integer_value(max), state);
        json_t *vs = json_object_get(o, "versions");
        size_t count = json_array_size(vs), last = count;
        /* The newest version scored: the newest may wait for its score. */
        while (last > 0 && !isfinite(val_loss(vs, last - 1))) last--;
        if (n > 0 && (size_t)n < cap && last > 0) {
            json_t *lv = json_object_get(json_array_get(vs, last - 1), "version");
            n += snprintf(out + n, cap - (size_t)n, "; validation loss %.4f at version %lld",
                          val_loss(vs, last - 1), (long long)json_integer_value(lv));
            if (n > 0 && (size_t)n < cap && last > 1 && isfinite(val_loss(vs, 0)))
                n += snprintf(out + n, cap - (size_t)n, ", %.4f at the start", val_loss(vs, 0));
        }
        if (n > 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, " (from the coordinator)");
    } else if (p->last_task) {
        snprintf(out, cap,
                 "at least version %lld, the base of this peer's last task (what this directory "
                 "knows; the coordinator %s)",
                 (long long)p->last_version, why && *why ? why : "did not say");
    } else {
        snprintf(out, cap,
                 "not known: no task done yet (what this directory knows; the "
                 "coordinator %s)",
                 why && *why ? why : "did not say");
    }
    json_decref(o);
}
