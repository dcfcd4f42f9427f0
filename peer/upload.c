/* Uploading a task's update and hearing its answer: the write-ahead
 * record before it is sent, the upload itself (in the background while
 * the next task trains, with --overlap), what each answer means (accepted,
 * already stored, dropped as late, refused for what it held, refused for
 * this peer), the record of an earlier process sent again at start, and
 * the task's summary line. The loop (loop.c) calls it as one step of a
 * task. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kernels/kernels.h"
#include "peer/loop_internal.h"
#include "peer/peer.h"
#include "peer/ui.h"

/* 1 when an upload refusal only means the coordinator no longer wants this
 * task: normal for volunteers whose work arrives late. */
static int droppable_upload(const peer_response *rs) {
    switch (rs->status) {
    case 409: return error_code_is(rs, "stale_update") || error_code_is(rs, "duplicate_update");
    case 404: return error_code_is(rs, "unknown_task");
    case 403: return error_code_is(rs, "not_your_task");
    default: return 0;
    }
}

/* 1 when the coordinator turned the update down for what it holds (too
 * large for the run's bound, not finite, an impossible loss): this
 * update is lost, but the next task, trained from the run's model, may
 * well be taken. */
static int judged_upload(const peer_response *rs) {
    return rs->status == 422 && (error_code_is(rs, "norm_exceeded") ||
                                 error_code_is(rs, "non_finite") || error_code_is(rs, "bad_loss"));
}

/* After an upload refused for its content (L->judged, err saying why):
 * VL_OK, so the peer goes on with its next task, until PEER_MAX_REFUSALS
 * such refusals in a row, which end the run with PEER_EREFUSED: a peer
 * whose every update is turned down is misconfigured or broken, and its
 * volunteer should hear of it rather than lend a machine for nothing. */
int peer_loop_judged_go_on(loop *L, vl_error *err) {
    L->judged = 0;
    if (++L->judged_in_row >= PEER_MAX_REFUSALS) {
        char last[sizeof err->msg];
        memcpy(last, err->msg, sizeof last);
        return vl_fail(err, PEER_EREFUSED,
                       "giving up after %d updates in a row refused for what they held; the "
                       "last: %.150s",
                       L->judged_in_row, last);
    }
    vl_log_warn("%s; going on with the next task (%d of %d such refusals in a row end the run)",
                err->msg, L->judged_in_row, PEER_MAX_REFUSALS);
    memset(err, 0, sizeof *err);
    return VL_OK;
}


/* Sends the upload an earlier process recorded but may not have sent, or
 * whose answer it never saw, byte for byte, and settles it in the saved
 * state. Returns like upload(). */
int peer_loop_retry_recorded(loop *L, peer_pending *p, vl_error *err) {
    peer_request rq = {.method = "POST",
                       .target = "/v1/updates",
                       .content_type = "application/octet-stream",
                       .body = p->bytes,
                       .body_len = p->len,
                       .cap = JSON_CAP,
                       .idle_s = IDLE_S,
                       .show_progress = 1};
    int rc = peer_http_do(L->http, &rq, &L->rs, err);
    if (rc) return rc;
    peer_response *rs = &L->rs;
    L->up_bytes += p->len;
    /* The lease may be offered again after a refusal; its work is done. */
    peer_task k = {.task_id = p->task_id, .deadline = p->deadline};
    peer_loop_remember(L, &k);
    char code[64], msg[8];
    peer_error_parse(rs->body.data, rs->body.len, code, sizeof code, msg, sizeof msg);
    peer_upload_outcome out;
    vl_error e = {0};
    if ((rc = peer_pending_settle(&L->saved, p, rs->status, code, &out, &e)))
        return vl_fail(err, rc, "cannot settle the recorded upload: %s", e.msg);
    peer_refusal(&e, "refused", rs->status, rs->body.data, rs->body.len);
    if (out == PEER_UPLOAD_UNKNOWN)
        return vl_fail(err, PEER_EREFUSED,
                       "recorded upload of task %lld answered ambiguously: "
                       "%s",
                       (long long)p->task_id, e.msg);
    if (out == PEER_UPLOAD_NOT_TAKEN) {
        vl_error se = {0};
        if ((rc = peer_resume_save(L->o->dir, &L->saved, &se)))
            return vl_fail(err, rc, "cannot save the trainer state: %s", se.msg);
    }
    vl_error ce = {0};
    if (peer_pending_clear(L->o->dir, &ce) != VL_OK)
        vl_log_warn("upload record not cleared (the next start will send it again): %s", ce.msg);
    if (out == PEER_UPLOAD_STORED)
        vl_log_info("task %lld: recorded upload of %zu bytes sent again after the restart: %s",
                    (long long)p->task_id, p->len,
                    rs->status == 409 ? "it was already stored" : "accepted");
    else
        vl_log_warn("task %lld: recorded upload of %zu bytes sent again after the restart: not "
                    "taken (%s); %s",
                    (long long)p->task_id, p->len, e.msg,
                    p->kind == COMPRESS_TOPK ? "its entries are back in the residual"
                                             : "it leaves nothing to put back");
    if (run_finished(rs)) return VL_DONE;
    /* One recorded update turned down for what it held is no reason to
     * stop: the warning above said so. */
    if (out == PEER_UPLOAD_NOT_TAKEN && !droppable_upload(rs) && !judged_upload(rs))
        return peer_refusal(err, "upload refused", rs->status, rs->body.data, rs->body.len);
    return VL_OK;
}

static int upload_answer(loop *L, const peer_task *k, const peer_train_result *res,
                         const task_times *tm, peer_response *rs, vl_error *err);

/* The line that ends a task: what it trained, what it sent and what that
 * saved against a dense update, where its time went, and the outcome
 * (what: "accepted", "already_stored" or "dropped"; said: its words). */
static void task_summary(loop *L, vl_log_level level, const peer_task *k,
                         const peer_train_result *res, const task_times *tm, const char *what,
                         int64_t update, int64_t version, const char *said) {
    double tps = res->seconds > 0 ? (double)res->tokens / res->seconds : 0;
    int64_t sent = (int64_t)L->upload.len;
    /* Against the F32 values alone: a dense update's header makes it a
     * little larger, which is no saving. */
    int64_t dense = (int64_t)L->tr.n_params * (int64_t)sizeof(float);
    int64_t saved = dense > sent ? dense - sent : 0;
    peer_ui_saved(saved);
    char how[128] = "dense";
    if (saved > 0) {
        char d[32];
        peer_ui_bytes(dense, d, sizeof d);
        snprintf(how, sizeof how, "%.1f %% less than the %s of a dense one",
                 100.0 * (double)saved / (double)dense, d);
    }
    peer_ui_field f[] = {PEER_UI_INT("task", k->task_id),
                         PEER_UI_INT("base_version", k->base_version),
                         PEER_UI_INT("steps", res->steps),
                         PEER_UI_NUM("loss", res->mean_loss),
                         PEER_UI_NUM("last_loss", res->last_loss),
                         PEER_UI_NUM("tokens_per_s", tps),
                         PEER_UI_INT("bytes_up", sent),
                         PEER_UI_INT("dense_bytes", dense),
                         PEER_UI_INT("saved_bytes", saved),
                         PEER_UI_NUM("download_s", tm->download),
                         PEER_UI_NUM("train_s", tm->train),
                         PEER_UI_NUM("compress_s", tm->compress),
                         PEER_UI_NUM("upload_s", tm->upload),
                         PEER_UI_STR("outcome", what),
                         PEER_UI_INT("update", update),
                         PEER_UI_INT("version", version)};
    peer_ui_event(level, "task_end", f, PEER_UI_NFIELDS(f),
                  "task %lld: base v%lld, %d steps, loss %.4f (last %.4f), upload %lld bytes "
                  "(%s), %.0f tok/s, %s; time: download %.2f s, train %.2f s, compress %.2f s, "
                  "upload %.2f s",
                  (long long)k->task_id, (long long)k->base_version, res->steps, res->mean_loss,
                  res->last_loss, (long long)sent, how, tps, said, tm->download, tm->train,
                  tm->compress, tm->upload);
}

/* Counts a judged upload in DIR/progress.json. Only `status` reads it, so
 * failing to write it costs a warning, not the task. */
static void note_progress(loop *L, const peer_task *k, const peer_train_result *res, int accepted) {
    peer_progress *p = &L->prog;
    if (accepted)
        p->accepted++;
    else
        p->dropped++;
    p->last_task = k->task_id;
    p->last_version = k->base_version;
    p->last_loss = res->mean_loss;
    p->last_at = vl_clock_unix_s();
    p->bytes_up += (int64_t)L->upload.len;
    vl_error e = {0};
    if (peer_progress_save(L->o->dir, p, &e) != VL_OK)
        vl_log_warn("progress not recorded (volley-peer status will be behind): %s", e.msg);
}

static int upload(loop *L, const peer_task *k, const peer_train_result *res, int attempt,
                  vl_error *err) {
    const peer_run_opts *ro = L->o;
    if (L->tamper && L->tamper(L->tamper_arg, attempt, L->tr.delta, L->tr.n_params) != 0)
        return PEER_LOOP_GAVE_UP;
    peer_ui_phase(k->task_id, "compressing");
    double t0 = vl_clock_mono_s();
    compress_update_meta m;
    memset(&m, 0, sizeof m);
    snprintf(m.run, sizeof m.run, "%s", k->run);
    m.task = k->task_id;
    m.peer = L->st.peer_id;
    m.base_version = k->base_version;
    m.kind = k->kind;
    m.num_samples = res->tokens;
    m.local_steps = res->steps;
    m.loss = res->mean_loss;
    m.has_accuracy = res->has_accuracy;
    m.accuracy = res->accuracy;
    m.train_seconds = res->seconds > 0 && res->seconds <= 1e7 ? res->seconds : 0;
    m.seed = k->comp_seed;
    vl_buf_reset(&L->upload);
    /* K-FAC runs that share factors: this peer's go with the update. */
    compress_factors cf;
    compress_factor_layer *layers = NULL;
    const float **ag = NULL;
    int rc = VL_OK;
    if (k->kfac && k->kfac_share) {
        int n = L->tr.kfac.n_layers;
        layers = calloc((size_t)n + 1, sizeof *layers);
        ag = calloc(2 * (size_t)n + 1, sizeof *ag);
        if (!layers || !ag) rc = vl_fail(err, VL_ENOMEM, "out of memory attaching factors");
        if (!rc) rc = peer_kfac_factors(&L->tr, k, res->tokens, layers, ag, ag + n, &cf, err);
        if (!rc) m.factors = &cf;
    }
    if (!rc) rc = peer_encode_update(&L->tr, k, &m, &L->upload, err);
    free(layers);
    free(ag);
    L->times.compress += vl_clock_mono_s() - t0;
    if (rc) return rc;
    if ((rc = peer_loop_write_ahead(L, k, err))) {
        /* Unsent and unrecorded, the update is lost either way: the
         * lease goes back now, not at its deadline, so that another peer
         * trains its data while this one stops. */
        peer_loop_leave(L, k->task_id);
        char why[sizeof err->msg];
        memcpy(why, err->msg, sizeof why);
        return vl_fail(err, rc,
                       "%.200s; task %lld handed back for another peer to train; free space in "
                       "%.100s or make it writable, then start again",
                       why, (long long)k->task_id, L->o->dir);
    }
    int more = L->o->max_tasks <= 0 || L->done + 1 < L->o->max_tasks;
    /* The next task starts while this update uploads, when the run allows
     * it, the volunteer asked for it (--overlap) and nothing has to follow
     * the upload on this task: a second round answers from this task's
     * delta, and a tamper hook retries it. */
    int overlap = more && k->overlap && ro->overlap && !L->tamper && !k->second_round;
    /* Otherwise the next task comes with the answer unless this is the
     * last one. */
    peer_request rq = {.method = "POST",
                       .target = more && !overlap ? "/v1/updates?next=1" : "/v1/updates",
                       .content_type = "application/octet-stream",
                       .body = L->upload.data,
                       .body_len = L->upload.len,
                       .cap = JSON_CAP,
                       .idle_s = IDLE_S,
                       .show_progress = 1};
    if (overlap) {
        if ((rc = peer_http_bg_start(&L->bg, L->http, &rq, err))) return rc;
        L->flying = 1;
        L->fly_k = *k;
        L->fly_res = *res;
        L->fly_times = L->times;
        vl_log_debug("task %lld: upload of %zu bytes under way; the next task starts meanwhile",
                     (long long)k->task_id, L->upload.len);
        return VL_OK;
    }
    /* A transport failure leaves the outcome unknown: the record stays,
     * for the next start to send again. */
    peer_ui_phase(k->task_id, "uploading");
    t0 = vl_clock_mono_s();
    rc = peer_http_do(L->http, &rq, &L->rs, err);
    L->times.upload += vl_clock_mono_s() - t0;
    if (rc) return rc;
    rc = upload_answer(L, k, res, &L->times, &L->rs, err);
    if (rc == VL_OK && L->awaited == 0) peer_ui_phase(k->task_id, "update sent");
    return rc;
}

/* Judges the coordinator's answer rs to the upload of task k, now in
 * L->upload: settles the record, puts back what was not taken, takes the
 * next task when it came along. */
static int upload_answer(loop *L, const peer_task *k, const peer_train_result *res,
                         const task_times *tm, peer_response *rs, vl_error *err) {
    L->up_bytes += L->upload.len;
    L->answer_round = 0;
    char code[64], msg[8];
    peer_error_parse(rs->body.data, rs->body.len, code, sizeof code, msg, sizeof msg);
    peer_upload_outcome out = peer_upload_classify(rs->status, code);
    if (out == PEER_UPLOAD_UNKNOWN)
        return peer_refusal(err, "upload answered ambiguously", rs->status, rs->body.data,
                            rs->body.len);
    /* What the coordinator did not take goes back into the residual, to
     * be sent with a later task; unless it was turned down for what it
     * holds, which would only be sent again, larger. */
    L->judged = out == PEER_UPLOAD_NOT_TAKEN && judged_upload(rs);
    if (L->judged)
        peer_encode_drop(&L->tr, error_code_is(rs, "non_finite"));
    else if (out == PEER_UPLOAD_NOT_TAKEN)
        peer_encode_unsent(&L->tr);
    peer_loop_settle(L, out);
    if (rs->status == 200 || rs->status == 201 || rs->status == 202) {
        L->answer_round = 1;
        L->judged_in_row = 0;
        note_progress(L, k, res, 1);
        json_error_t je;
        json_t *o = json_loadb((const char *)rs->body.data, rs->body.len, 0, &je);
        json_t *uid = json_object_get(o, "update_id"), *ver = json_object_get(o, "version");
        int64_t update = json_is_integer(uid) ? (int64_t)json_integer_value(uid) : -1;
        int64_t version = json_is_integer(ver) ? (int64_t)json_integer_value(ver) : -1;
        char said[96];
        snprintf(said, sizeof said, "update %lld accepted (version %lld)", (long long)update,
                 (long long)version);
        task_summary(L, LOG_INFO, k, res, tm, "accepted", update, version, said);
        /* Said instead of "update sent" while the next task waits for the
         * version this update goes into. */
        L->awaited = version >= 0 ? version + 1 : 0;
        if (L->awaited) peer_loop_say_waiting(L, k->task_id);
        json_t *next = json_object_get(o, "next_task");
        if (next) {
            /* A bad offer costs only the round trip it would have saved. */
            vl_error e = {0};
            L->have_next = peer_task_from_json(next, &L->next, &e) == VL_OK &&
                           peer_task_check_run(&L->next, L->st.run, &e) == VL_OK;
            if (!L->have_next) vl_log_warn("next task ignored: %s", e.msg);
            if (L->have_next && L->next.base_version >= L->awaited) L->awaited = 0;
        }
        json_decref(o);
        return VL_OK;
    }
    if (run_finished(rs)) return VL_DONE;
    if (droppable_upload(rs)) {
        /* duplicate_update: an earlier attempt was stored but its 202 was
         * lost on the way back, so the retry found it already there. */
        int dup = out == PEER_UPLOAD_STORED;
        note_progress(L, k, res, dup);
        vl_error e = {0};
        peer_refusal(&e, "upload refused", rs->status, rs->body.data, rs->body.len);
        char said[sizeof e.msg + 32];
        snprintf(said, sizeof said, "%s: %s", dup ? "already stored" : "dropped", e.msg);
        task_summary(L, dup ? LOG_INFO : LOG_WARN, k, res, tm, dup ? "already_stored" : "dropped",
                     -1, -1, said);
        return VL_OK;
    }
    int rc = peer_refusal(err, "upload refused", rs->status, rs->body.data, rs->body.len);
    if (L->judged) {
        note_progress(L, k, res, 0);
        task_summary(L, LOG_WARN, k, res, tm, "refused", -1, -1, err->msg);
        L->release = k->task_id;
    }
    return rc;
}

/* Waits for the update still uploading, if any, and judges its answer as
 * a sent-and-waited-for upload would have been. A transport failure
 * leaves its record for the next start, as there. */
int peer_loop_land(loop *L, vl_error *err) {
    if (!L->flying) return VL_OK;
    L->flying = 0;
    peer_response *rs = NULL;
    int rc = peer_http_bg_wait(&L->bg, &rs, err);
    L->fly_times.upload += L->bg.seconds;
    if (!rc) rc = upload_answer(L, &L->fly_k, &L->fly_res, &L->fly_times, rs, err);
    if (rc == PEER_EREFUSED && L->judged) rc = peer_loop_judged_go_on(L, err);
    if (rc == VL_OK) peer_loop_remember(L, &L->fly_k);
    return rc;
}

int peer_loop_upload(loop *L, const peer_task *k, const peer_train_result *res, vl_error *err) {
    /* From here on the update is written ahead and sent: a stop leaves
     * it for the next start to send, under the same lease. */
    L->holding = 0;
    int rc = upload(L, k, res, 0, err);
    if (L->tamper) {
        /* A hostile peer turned away tries its next move on the same task,
         * and finally leaves the task, never the run. */
        for (int a = 1; rc == PEER_EREFUSED && a < PEER_TAMPER_ATTEMPTS; a++) {
            vl_log_warn("%s", err->msg);
            rc = upload(L, k, res, a, err);
        }
        if (rc == PEER_EREFUSED || rc == PEER_LOOP_GAVE_UP) {
            vl_log_warn("task %lld left: %s", (long long)k->task_id,
                        rc == PEER_LOOP_GAVE_UP ? "nothing more to send" : err->msg);
            rc = VL_OK;
        }
    }
    if (rc == PEER_EREFUSED && L->judged) rc = peer_loop_judged_go_on(L, err);
    return rc;
}
