/* A task's model and data: the base version kept, caught up with a delta
 * or downloaded (a broken download resumes), and the task's byte or
 * token range, validated before the trainer sees it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "peer/loop_internal.h"

/* Brings an older cached base up to the task's version with the sum of
 * the changes in between. Returns VL_OK when that worked, VL_AGAIN when
 * the whole model has to be fetched instead (the changes were pruned, or
 * the delta did not apply), or an error that ends the loop. */
static int fetch_delta(peer_fetch *f, const peer_task *k, vl_error *err) {
    char target[96];
    snprintf(target, sizeof target, "/v1/model/delta?since=%lld&version=%lld",
             (long long)f->tr->base_version, (long long)k->base_version);
    peer_request rq = {
        .method = "GET", .target = target, .cap = MODEL_CAP, .idle_s = IDLE_S, .show_progress = 1};
    int rc = peer_http_do(f->http, &rq, f->rs, err);
    if (rc) return rc;
    peer_response *rs = f->rs;
    if (run_finished(rs)) return VL_DONE;
    if (rs->status != 200) {
        vl_log_debug("no delta from version %lld (status %ld); fetching the model",
                     (long long)f->tr->base_version, rs->status);
        return VL_AGAIN;
    }
    int64_t from = f->tr->base_version;
    vl_error e = {0};
    if (peer_trainer_apply_delta(f->tr, rs->body.data, rs->body.len, k->run, k->base_version, &e) !=
        VL_OK) {
        vl_log_warn("delta from version %lld refused (%s); fetching the model", (long long)from,
                    e.msg);
        return VL_AGAIN;
    }
    vl_log_info("model version %lld from version %lld by delta: %zu bytes",
                (long long)k->base_version, (long long)from, rs->body.len);
    *f->delta_bytes += rs->body.len;
    return VL_OK;
}

/* Makes the trainer hold the task's base version, downloading it only when
 * the cached one differs (If-None-Match), and only the changes when the
 * run's updates are sparse. */
int peer_fetch_model(peer_fetch *f, const peer_task *k, vl_error *err) {
    if (k->method != PEER_METHOD_NONE && f->tr->base_version >= 0 &&
        f->tr->base_version < k->base_version) {
        int rc = fetch_delta(f, k, err);
        if (rc != VL_AGAIN) return rc; /* caught up, or an error */
    }
    char target[64], inm[32], want[32];
    snprintf(target, sizeof target, "/v1/model?version=%lld", (long long)k->base_version);
    snprintf(want, sizeof want, "\"%lld\"", (long long)k->base_version);
    /* A model file is the largest download: a broken connection resumes
     * it rather than starting over. */
    peer_request rq = {.method = "GET",
                       .target = target,
                       .cap = MODEL_CAP,
                       .idle_s = IDLE_S,
                       .resume = 1,
                       .show_progress = 1};
    if (f->tr->base_version >= 0) {
        snprintf(inm, sizeof inm, "\"%lld\"", (long long)f->tr->base_version);
        rq.if_none_match = inm;
    }
    int rc = peer_http_do(f->http, &rq, f->rs, err);
    if (rc) return rc;
    peer_response *rs = f->rs;
    if (rs->status == 304) {
        if (f->tr->base_version != k->base_version)
            return refused(vl_fail(err, VL_EINVAL,
                                   "model: 304 Not Modified for version %lld, "
                                   "but the cached model is version %lld",
                                   (long long)k->base_version, (long long)f->tr->base_version));
        return VL_OK;
    }
    if (run_finished(rs)) return VL_DONE;
    if (rs->status == 404 && error_code_is(rs, "unknown_version")) {
        /* The base was pruned while the lease was in flight. */
        vl_error e = {0};
        peer_refusal(&e, "model request refused", rs->status, rs->body.data, rs->body.len);
        vl_log_warn("task %lld dropped: %s", (long long)k->task_id, e.msg);
        return VL_AGAIN;
    }
    if (rs->status != 200)
        return peer_refusal(err, "model request refused", rs->status, rs->body.data, rs->body.len);
    if (rs->etag[0] && strcmp(rs->etag, want) != 0)
        return refused(vl_fail(err, VL_EINVAL, "model: asked for version %lld, got ETag %s",
                               (long long)k->base_version, rs->etag));
    double t0 = vl_clock_mono_s();
    rc = peer_trainer_load(f->tr, rs->body.data, rs->body.len, k->run, k->base_version, err);
    size_t bytes = rs->body.len;
    /* The trainer holds its own copy; keeping a model-sized response
     * buffer through training would double the peer's footprint. */
    vl_buf_free(&rs->body);
    if (rc) return refused(rc);
    *f->model_bytes += bytes;
    vl_log_info("model version %lld: %zu parameters, %zu bytes, loaded in %.2f s",
                (long long)k->base_version, f->tr->n_params, bytes, vl_clock_mono_s() - t0);
    return VL_OK;
}

/* Parses "bytes FIRST-LAST/TOTAL" (TOTAL may be "*"). */
static int content_range(const char *s, int64_t *first, int64_t *last) {
    char a[24], b[24];
    const char *p = s;
    if (strncmp(p, "bytes ", 6) != 0) return VL_EINVAL;
    p += 6;
    size_t n = strcspn(p, "-");
    if (n == 0 || n >= sizeof a || p[n] != '-') return VL_EINVAL;
    memcpy(a, p, n);
    a[n] = '\0';
    p += n + 1;
    n = strcspn(p, "/");
    if (n == 0 || n >= sizeof b || p[n] != '/') return VL_EINVAL;
    memcpy(b, p, n);
    b[n] = '\0';
    if (vl_parse_i64(a, 0, INT64_MAX, first) || vl_parse_i64(b, 0, INT64_MAX, last))
        return VL_EINVAL;
    return VL_OK;
}

int peer_fetch_data(peer_fetch *f, const peer_task *k, vl_error *err) {
    char target[64], range[64];
    int64_t last = k->offset + k->length - 1;
    snprintf(target, sizeof target, "/v1/data/%s", k->shard);
    snprintf(range, sizeof range, "bytes=%lld-%lld", (long long)k->offset, (long long)last);
    peer_request rq = {.method = "GET",
                       .target = target,
                       .range = range,
                       .cap = (size_t)k->length,
                       .idle_s = IDLE_S,
                       .show_progress = 1};
    int rc = peer_http_do(f->http, &rq, f->rs, err);
    if (rc) return rc;
    peer_response *rs = f->rs;
    if (run_finished(rs)) return VL_DONE;
    if (rs->status != 206) {
        if (rs->status >= 400)
            return peer_refusal(err, "data request refused", rs->status, rs->body.data,
                                rs->body.len);
        return refused(
            vl_fail(err, VL_EINVAL, "data: expected 206 for %s, got %ld", range, rs->status));
    }
    int64_t first, last_got;
    if (content_range(rs->content_range, &first, &last_got) != VL_OK || first != k->offset ||
        last_got != last)
        return refused(vl_fail(err, VL_EINVAL, "data: Content-Range '%s' does not match %s",
                               rs->content_range, range));
    if (rs->body.len != (size_t)k->length)
        return refused(vl_fail(err, VL_EINVAL, "data: got %zu bytes for a %lld-byte range",
                               rs->body.len, (long long)k->length));
    *f->data_bytes += rs->body.len;
    return VL_OK;
}

/* Downloads the task's token range into DIR/task.tokens, as the llm.c
 * shard the coordinator sends, straight to disk (a range may be far
 * larger than the model), and opens it with model_shard, which validates
 * all of it: header, size and every token below the model's vocab_size.
 * It must hold exactly the task's tokens. The file is unlinked once open
 * (the open shard keeps reading it) or on failure, so only a peer killed
 * mid-download leaves one behind, which the next download empties. */
int peer_fetch_tokens(peer_fetch *f, const peer_task *k, model_shard **out, vl_error *err) {
    *out = NULL;
    char target[128], path[PEER_PATH_MAX];
    int rc = peer_path_join(path, sizeof path, f->dir, TOKENS_FILE, err);
    if (rc) return rc;
    snprintf(target, sizeof target, "/v1/data/tokens/%lld?offset=%lld&count=%lld",
             (long long)k->shard_index, (long long)k->offset, (long long)k->length);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FILE *sink = fd >= 0 ? fdopen(fd, "w+b") : NULL;
    if (!sink) {
        rc = vl_fail(err, VL_EIO, "cannot create %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return rc;
    }
    size_t want = MODEL_SHARD_HEADER_BYTES + 2 * (size_t)k->length;
    peer_request rq = {.method = "GET",
                       .target = target,
                       .cap = want,
                       .idle_s = IDLE_S,
                       .sink = sink,
                       .show_progress = 1};
    rc = peer_http_do(f->http, &rq, f->rs, err);
    if (fclose(sink) != 0 && !rc)
        rc = vl_fail(err, VL_EIO, "cannot write %s: %s", path, strerror(errno));
    peer_response *rs = f->rs;
    if (!rc && run_finished(rs))
        rc = VL_DONE;
    else if (!rc && rs->status >= 400)
        rc = peer_refusal(err, "data request refused", rs->status, rs->body.data, rs->body.len);
    else if (!rc && rs->status != 200)
        rc = vl_fail(err, VL_EINVAL, "data: expected 200 for %s, got %ld", target, rs->status);
    else if (!rc && rs->sunk != want)
        rc = vl_fail(err, VL_EINVAL,
                     "data: got %llu bytes for %lld tokens (a shard of them is "
                     "%zu bytes)",
                     (unsigned long long)rs->sunk, (long long)k->length, want);
    vl_error e = {0};
    if (!rc && model_shard_open(path, f->tr->cfg.vocab_size, out, &e) != VL_OK)
        rc = vl_fail(err, VL_EINVAL, "data from the coordinator refused: %s", e.msg);
    if (!rc && model_shard_tokens(*out) != k->length)
        rc = vl_fail(err, VL_EINVAL, "data: the shard holds %lld tokens, the task %lld",
                     (long long)model_shard_tokens(*out), (long long)k->length);
    if (rc) {
        model_shard_close(*out);
        *out = NULL;
    }
    unlink(path);
    if (!rc) *f->data_bytes += want;
    /* Data that fails validation is refused like a bad task: the peer
     * keeps its state and lets the lease go. */
    return rc == VL_EINVAL ? PEER_LOOP_REFUSED : rc;
}
