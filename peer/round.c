/* The peer's part in the Sketched-SGD second round: once its sketch is in,
 * it stays for the round of that version and reports the exact values of
 * its delta at the coordinator's candidates. The coordinator can always do
 * without them (it falls back to the sketch's estimate), so nothing here
 * fails the task; only transport failures and stop requests end the
 * peer's loop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer/peer.h"

/* The candidates file: 4 bytes per candidate, which the run bounds by the
 * sketch (at most COMPRESS_SKETCH_MAX_CELLS), plus its header. */
#define CAND_CAP (((size_t)COMPRESS_SKETCH_MAX_CELLS + 1) * 4)
#define REPLY_CAP ((size_t)1 << 20)
/* Longest single wait asked of the coordinator (its limit is 60 s). */
#define ROUND_POLL_S 30

void peer_round_values(const peer_trainer *t, const uint32_t *idx, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = t->delta[idx[i]];
}

/* Reports the values for the candidates now in rs. */
static int report(peer_http *h, peer_response *rs, const peer_trainer *t, const peer_task *k,
                  int64_t peer_id, vl_buf *scratch, uint64_t *up_bytes, vl_error *err) {
    compress_round_meta cm;
    uint32_t *idx = NULL;
    size_t n = 0;
    vl_error e = {0};
    if (compress_round_decode_candidates(rs->body.data, rs->body.len, t->n_params, &cm, &idx, &n,
                                         &e) != VL_OK ||
        cm.version != k->base_version || strcmp(cm.run, k->run) != 0) {
        free(idx);
        vl_log_warn("task %lld: second round of version %lld: unusable candidates (%s); not "
                    "answering",
                    (long long)k->task_id, (long long)k->base_version,
                    e.msg[0] ? e.msg : "wrong run or version");
        return VL_OK;
    }
    float *vals = malloc(n * sizeof *vals);
    if (!vals) {
        free(idx);
        return vl_fail(err, VL_ENOMEM, "out of memory for %zu round values", n);
    }
    peer_round_values(t, idx, n, vals);
    free(idx);
    compress_round_meta vm = {.version = k->base_version, .task = k->task_id, .peer = peer_id};
    snprintf(vm.run, sizeof vm.run, "%s", k->run);
    vl_buf_reset(scratch);
    /* In the run's dtype: half the bytes for F16 runs, which the ratio's
     * budget counts. */
    int rc = compress_round_encode_values_as(&vm, vals, n, k->dtype, scratch, err);
    free(vals);
    if (rc) return rc;
    peer_request rq = {.method = "POST",
                       .target = "/v1/round/values",
                       .content_type = "application/octet-stream",
                       .body = scratch->data,
                       .body_len = scratch->len,
                       .cap = REPLY_CAP,
                       .idle_s = 120};
    if ((rc = peer_http_do(h, &rq, rs, err))) return rc;
    *up_bytes += scratch->len;
    if (rs->status == 202) {
        vl_log_info("task %lld: reported %zu exact values for the second round of version %lld "
                    "(%zu bytes)",
                    (long long)k->task_id, n, (long long)k->base_version, scratch->len);
    } else if (peer_error_code_is(rs->body.data, rs->body.len, "duplicate_values")) {
        vl_log_info("task %lld: second round values were already stored", (long long)k->task_id);
    } else {
        peer_refusal(&e, "second-round values refused", rs->status, rs->body.data, rs->body.len);
        vl_log_warn("task %lld: %s", (long long)k->task_id, e.msg);
    }
    return VL_OK;
}

int peer_round_answer(peer_http *h, peer_response *rs, const peer_trainer *t, const peer_task *k,
                      int64_t peer_id, vl_buf *scratch, uint64_t *up_bytes, vl_error *err) {
    if (k->method != PEER_METHOD_SKETCH || k->second_round <= 0 || !t->delta) return VL_OK;
    /* The round opens once the version has all its updates, which may take
     * up to the slowest lease; after that it waits round_s for answers. */
    int64_t give_up = k->deadline + k->round_s;
    for (;;) {
        if (peer_stop_requested()) return PEER_ESTOPPED;
        int64_t left = give_up - vl_clock_unix_s();
        if (left <= 0) {
            vl_log_info("task %lld: the second round of version %lld did not open in time; moving "
                        "on",
                        (long long)k->task_id, (long long)k->base_version);
            return VL_OK;
        }
        int wait = left < ROUND_POLL_S ? (int)left : ROUND_POLL_S;
        char target[96];
        snprintf(target, sizeof target, "/v1/round?version=%lld&wait=%d",
                 (long long)k->base_version, wait);
        peer_request rq = {
            .method = "GET", .target = target, .cap = CAND_CAP, .idle_s = wait + 30L};
        int rc = peer_http_do(h, &rq, rs, err);
        if (rc) return rc;
        if (rs->status == 204) continue;
        if (rs->status == 200) return report(h, rs, t, k, peer_id, scratch, up_bytes, err);
        /* round_closed: the version was made without these values (the
         * deadline passed); anything else: nothing to answer. */
        vl_error e = {0};
        peer_refusal(&e, "second round", rs->status, rs->body.data, rs->body.len);
        vl_log_msg(rs->status == 410 ? LOG_INFO : LOG_WARN, "task %lld: %s", (long long)k->task_id,
                   e.msg);
        return VL_OK;
    }
}
