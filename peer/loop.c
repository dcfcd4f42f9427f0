/* The network-facing commands: join (register the key with a token) and
 * run (lease a task, fetch its model and data, train, upload, repeat).
 * Volunteers come and go and their updates may arrive late, so a task the
 * coordinator no longer wants is dropped and the loop goes on; only a
 * refusal that says something is wrong with this peer ends it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "peer/loop_internal.h"
#include "peer/peer.h"
#include "peer/ui.h"
#include "kernels/kernels.h"

#if defined(VOLLEY_HAVE_CUDA)
#include "kernels/cuda_model.h"
#endif

#define UPLOAD_CAP ((size_t)3 << 30)

/* ---- run --------------------------------------------------------------- */


static void remember(loop *L, const peer_task *k) {
    int i = L->nfinished++ % FINISHED_RING;
    L->finished[i].task_id = k->task_id;
    L->finished[i].deadline = k->deadline;
}

static int seen(const loop *L, const peer_task *k) {
    int n = L->nfinished < FINISHED_RING ? L->nfinished : FINISHED_RING;
    for (int i = 0; i < n; i++)
        if (L->finished[i].task_id == k->task_id && L->finished[i].deadline == k->deadline)
            return 1;
    return 0;
}

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
static int judged_go_on(loop *L, vl_error *err) {
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

/* The status line between tasks: the version the last accepted update goes
 * into, while one is awaited, else any task. */
static void say_waiting(loop *L, int64_t task) {
    char phase[48] = "waiting for a task";
    if (L->awaited > 0)
        snprintf(phase, sizeof phase, "waiting for version %lld", (long long)L->awaited);
    peer_ui_phase(task, phase);
}

static int fetch_task(loop *L, peer_task *k, vl_error *err) {
    char target[96];
    say_waiting(L, 0);
    /* While the last update uploads, the next lease is the one past it. */
    int at = snprintf(target, sizeof target, "/v1/task?wait=%d", L->o->wait_s);
    if (L->flying)
        at += snprintf(target + at, sizeof target - (size_t)at, "&uploading=%lld",
                       (long long)L->fly_k.task_id);
    if (L->release)
        snprintf(target + at, sizeof target - (size_t)at, "&release=%lld", (long long)L->release);
    peer_request rq = {
        .method = "GET", .target = target, .cap = JSON_CAP, .idle_s = L->o->wait_s + 30L};
    int rc = peer_http_do(L->http, &rq, &L->rs, err);
    if (rc) return rc;
    /* The coordinator ended the released lease (or found it over). One
     * it does not know as this peer's (a database restored from a
     * backup) is not worth stopping for: the lease ends at its deadline. */
    if (L->release && ((L->rs.status == 404 && error_code_is(&L->rs, "unknown_task")) ||
                       (L->rs.status == 403 && error_code_is(&L->rs, "not_your_task")))) {
        vl_log_warn("the coordinator did not release task %lld (%ld); its lease ends at its "
                    "deadline",
                    (long long)L->release, (long)L->rs.status);
        L->release = 0;
        return STEP_AGAIN;
    }
    if (L->rs.status == 200 || L->rs.status == 204) L->release = 0;
    if (L->rs.status == 204) return STEP_AGAIN;
    if (run_finished(&L->rs)) return STEP_FINISHED;
    if (L->rs.status != 200)
        return peer_refusal(err, "task request refused", L->rs.status, L->rs.body.data,
                            L->rs.body.len);
    int prc = peer_task_parse((const char *)L->rs.body.data, L->rs.body.len, k, err);
    if (prc) return refused(prc);
    if ((prc = peer_task_check_run(k, L->st.run, err))) return refused(prc);
    if (k->base_version >= L->awaited) L->awaited = 0;
    return VL_OK;
}

static void leave(loop *L, int64_t task_id);

/* Sends the upload an earlier process recorded but may not have sent, or
 * whose answer it never saw, byte for byte, and settles it in the saved
 * state. Returns like upload(). */
static int retry_recorded(loop *L, peer_pending *p, vl_error *err) {
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
    remember(L, &k);
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
    if (run_finished(rs)) return STEP_FINISHED;
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
        return STEP_GAVE_UP;
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
        leave(L, k->task_id);
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
        if (L->awaited) say_waiting(L, k->task_id);
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
    if (run_finished(rs)) return STEP_FINISHED;
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
static int land(loop *L, vl_error *err) {
    if (!L->flying) return VL_OK;
    L->flying = 0;
    peer_response *rs = NULL;
    int rc = peer_http_bg_wait(&L->bg, &rs, err);
    L->fly_times.upload += L->bg.seconds;
    if (!rc) rc = upload_answer(L, &L->fly_k, &L->fly_res, &L->fly_times, rs, err);
    if (rc == PEER_EREFUSED && L->judged) rc = judged_go_on(L, err);
    if (rc == VL_OK) remember(L, &L->fly_k);
    return rc;
}

/* One lease from request to upload. */
static int one_task(loop *L, vl_error *err) {
    peer_task k;
    int rc = VL_OK;
    memset(&L->times, 0, sizeof L->times);
    if (L->have_next) {
        k = L->next;
        L->have_next = 0;
    } else if ((rc = fetch_task(L, &k, err))) {
        /* A refused lease has no usable task id: it cannot be remembered,
         * only waited out by the pause after a refusal. */
        if (rc == STEP_REFUSED)
            vl_log_warn("task refused: %s; keeping model version %lld", err->msg,
                        (long long)L->tr.base_version);
        return rc;
    }
    if (seen(L, &k)) {
        /* Wait the lease out, a slice at a time, rather than redo it. */
        double left = (double)(k.deadline - vl_clock_unix_s()) + 1;
        vl_log_debug("task %lld offered again; waiting for its lease to end", (long long)k.task_id);
        if (peer_sleep(left < 1 ? 1 : left > 30 ? 30 : left)) return PEER_ESTOPPED;
        return STEP_AGAIN;
    }
    L->holding = k.task_id;
    peer_ui_phase(k.task_id, "fetching the model");
    peer_ui_field tf[] = {
        PEER_UI_INT("task", k.task_id),    PEER_UI_INT("base_version", k.base_version),
        PEER_UI_INT("steps", k.steps),     PEER_UI_INT("batch", k.batch),
        PEER_UI_INT("context", k.context), PEER_UI_INT("deadline", k.deadline)};
    peer_ui_event(LOG_INFO, "task_start", tf, PEER_UI_NFIELDS(tf),
                  "task %lld: model version %lld, up to %d local steps, lease ends in %lld s",
                  (long long)k.task_id, (long long)k.base_version, k.steps,
                  (long long)(k.deadline - vl_clock_unix_s()));
    char desc[sizeof L->comp_desc];
    peer_task_describe_compression(&k, desc, sizeof desc);
    if (strcmp(desc, L->comp_desc) != 0) {
        vl_log_info("compression: %s", desc);
        memcpy(L->comp_desc, desc, sizeof desc);
    }
    double t_fetch = vl_clock_mono_s();
    if ((rc = peer_loop_fetch_model(L, &k, err)) == VL_OK)
        rc = k.local     ? peer_local_check(&L->tr, &k, &L->local, err)
             : L->tr.mlp ? vl_fail(err, VL_EINVAL,
                                   "task %lld has a data range but the model is "
                                   "a classifier",
                                   (long long)k.task_id)
                         : peer_task_check_model(&k, &L->tr.cfg, err);
    if (rc == VL_EINVAL) rc = STEP_REFUSED;
    if (rc == STEP_AGAIN || rc == STEP_REFUSED) remember(L, &k);
    if (rc == STEP_REFUSED)
        vl_log_warn("task %lld refused: %s; keeping model version %lld", (long long)k.task_id,
                    err->msg, (long long)L->tr.base_version);
    if (rc) return rc;
    if (L->saved.n_params) {
        vl_error e = {0};
        rc = peer_resume_apply(&L->tr, &L->saved, &e);
        if (rc == VL_ECONFLICT)
            vl_log_warn("trainer state not applied: %s", e.msg);
        else if (rc)
            return vl_fail(err, rc, "%s", e.msg);
        else
            vl_log_info("trainer state applied to model version %lld: %s at step %ld",
                        (long long)L->tr.base_version,
                        L->tr.have_kfac  ? "K-FAC"
                        : L->tr.have_sgd ? "SGD"
                                         : "AdamW",
                        L->tr.have_kfac  ? L->tr.kfac.step
                        : L->tr.have_sgd ? L->tr.sgd.step
                        : L->tr.have_opt ? L->tr.opt.step
                                         : 0L);
    }
    if ((rc = peer_kfac_sync(L->http, &L->rs, &L->tr, &k, &L->factor_bytes, err))) return rc;
    peer_train_result res;
    model_shard *data = NULL;
    if (!k.local) peer_ui_phase(k.task_id, "fetching data");
    rc = k.local    ? VL_OK
         : k.tokens ? peer_loop_fetch_tokens(L, &k, &data, err)
                    : peer_loop_fetch_data(L, &k, err);
    if (rc == STEP_REFUSED) {
        remember(L, &k);
        vl_log_warn("task %lld refused: %s", (long long)k.task_id, err->msg);
    }
    if (rc) return rc;
    L->times.download = vl_clock_mono_s() - t_fetch;
    peer_ui_device(L->tr.device == PEER_DEVICE_CUDA ? "cuda" : "cpu");
    peer_ui_train_begin(k.task_id, k.steps,
                        k.local && !L->tr.gpt ? (int64_t)k.batch : (int64_t)k.batch * k.context);
    if (k.local && k.split_cut > 0) {
        rc = peer_trainer_run_split(&L->tr, &k, &L->local, L->http, &L->rs, L->st.peer_id, &res,
                                    err);
    } else if (k.local && L->tr.gpt) {
        rc = L->local.shard ? peer_trainer_run_shard(&L->tr, &k, L->local.shard, &res, err)
                            : peer_trainer_run(&L->tr, &k, L->local.bytes, L->local.len, &res, err);
    } else if (k.local) {
        rc = peer_trainer_run_local(&L->tr, &k, &L->local, &res, err);
    } else if (k.tokens) {
        rc = peer_trainer_run_shard(&L->tr, &k, data, &res, err);
        model_shard_close(data);
    } else {
        rc = peer_trainer_run(&L->tr, &k, L->rs.body.data, L->rs.body.len, &res, err);
    }
    if (rc == VL_ERANGE) {
        vl_log_warn("task %lld dropped: %s", (long long)k.task_id, err->msg);
        remember(L, &k);
        return VL_OK;
    }
    if (rc == PEER_ESTOPPED) vl_log_info("task %lld abandoned", (long long)k.task_id);
    if (rc) return rc;
    L->train_s += res.seconds;
    L->times.train = res.seconds;
    /* The last update's answer first: a refusal puts its entries back in
     * the residual, which this encoding then carries. */
    if ((rc = land(L, err))) return rc;
    /* From here on the update is written ahead and sent: a stop leaves
     * it for the next start to send, under the same lease. */
    L->holding = 0;
    rc = upload(L, &k, &res, 0, err);
    if (L->tamper) {
        /* A hostile peer turned away tries its next move on the same task,
         * and finally leaves the task, never the run. */
        for (int a = 1; rc == PEER_EREFUSED && a < PEER_TAMPER_ATTEMPTS; a++) {
            vl_log_warn("%s", err->msg);
            rc = upload(L, &k, &res, a, err);
        }
        if (rc == PEER_EREFUSED || rc == STEP_GAVE_UP) {
            vl_log_warn("task %lld left: %s", (long long)k.task_id,
                        rc == STEP_GAVE_UP ? "nothing more to send" : err->msg);
            rc = VL_OK;
        }
    }
    if (rc == PEER_EREFUSED && L->judged) rc = judged_go_on(L, err);
    if (rc == VL_OK && !L->flying) remember(L, &k);
    if (rc == VL_OK && !L->flying && L->answer_round) {
        if (k.method == PEER_METHOD_SKETCH && k.second_round > 0)
            peer_ui_phase(k.task_id, "second round");
        rc = peer_round_answer(L->http, &L->rs, &L->tr, &k, L->st.peer_id, &L->upload, &L->up_bytes,
                               err);
    }
    return rc;
}

/* The run is over on the coordinator: said once, in words. */
static void say_finished(const loop *L) {
    peer_ui_field f[] = {PEER_UI_STR("run", L->st.run), PEER_UI_INT("tasks", L->done)};
    peer_ui_event(LOG_INFO, "run_finished", f, PEER_UI_NFIELDS(f),
                  "run '%s' has finished (410 run_finished): nothing more to train, stopping "
                  "after %lld tasks here",
                  L->st.run, (long long)L->done);
}

static int run_tasks(loop *L, vl_error *err);

/* Leaving with a lease it will not finish (stopped mid-task, or its last
 * update refused for what it held), the peer ends it, so its data go to
 * another peer now and a sync version does not wait for its deadline.
 * One try of at most 10 s: a coordinator out of reach lets the lease run
 * to its deadline, as it would have anyway. */
static void leave(loop *L, int64_t task_id) {
    char target[96];
    snprintf(target, sizeof target, "/v1/task?release=%lld&next=0", (long long)task_id);
    peer_request rq = {.method = "GET", .target = target, .cap = JSON_CAP, .idle_s = 10, .once = 1};
    vl_error e = {0};
    int rc = peer_http_do(L->http, &rq, &L->rs, &e);
    if (rc == VL_OK && L->rs.status == 204)
        vl_log_info("task %lld released: its data go to another peer", (long long)task_id);
    else if (rc == VL_OK)
        vl_log_warn("task %lld not released (the coordinator answered %ld); its lease ends at "
                    "its deadline",
                    (long long)task_id, L->rs.status);
    else
        vl_log_warn("task %lld not released (%s); its lease ends at its deadline",
                    (long long)task_id, e.msg);
}

/* The tasks, then the update still uploading: its answer may still end
 * the run with an error, or say the run has finished. */
static int run_loop(loop *L, vl_error *err) {
    L->t_start = vl_clock_mono_s();
    int rc = run_tasks(L, err);
    if (L->flying) {
        vl_error e = {0};
        int lrc = land(L, &e);
        if (lrc == STEP_FINISHED) lrc = VL_OK;
        if (!rc && lrc) {
            *err = e;
            rc = lrc;
        } else if (lrc) {
            vl_log_warn("the last update's upload: %s", e.msg);
        }
    }
    /* Not after an error: the coordinator may be out of reach, and the
     * peer's exit would wait on it. */
    if (rc == VL_OK || rc == PEER_ESTOPPED || rc == PEER_EREFUSED) {
        if (L->release) leave(L, L->release);
        if (rc == PEER_ESTOPPED && L->holding && L->holding != L->release) leave(L, L->holding);
    }
    double wall = vl_clock_mono_s() - L->t_start;
    if (wall > 0 && L->train_s > 0)
        vl_log_info("compute: %.1f s of %.1f s training (%.1f %%)", L->train_s, wall,
                    100.0 * L->train_s / wall);
    return rc;
}

static int run_tasks(loop *L, vl_error *err) {
    int refusals = 0;
    while (L->o->max_tasks <= 0 || L->done < L->o->max_tasks) {
        if (peer_stop_requested()) return PEER_ESTOPPED;
        int rc = one_task(L, err);
        if (rc == STEP_REFUSED) {
            /* A coordinator that keeps sending what cannot be used is
             * broken or hostile: pause longer each time, then stop. */
            if (++refusals >= PEER_MAX_REFUSALS) {
                char last[sizeof err->msg];
                memcpy(last, err->msg, sizeof last);
                return vl_fail(err, VL_EINVAL,
                               "giving up after %d refused tasks in a row; "
                               "the last: %.150s",
                               refusals, last);
            }
            if (peer_sleep((double)refusals)) return PEER_ESTOPPED;
            continue;
        }
        if (rc != STEP_AGAIN) refusals = 0;
        if (rc == STEP_AGAIN) continue;
        if (rc == STEP_FINISHED) {
            say_finished(L);
            return VL_OK;
        }
        if (rc) return rc;
        L->done++;
    }
    vl_log_info("done: %lld tasks", (long long)L->done);
    return VL_OK;
}

static int run_with(const peer_run_opts *o, peer_tamper_fn tamper, void *tamper_arg,
                    vl_error *err) {
    if (o->wait_s < 0 || o->wait_s > 60) return vl_fail(err, VL_EINVAL, "--wait must be 0..60");
    if (o->step_delay_ms < 0 || o->step_delay_ms > 60000)
        return vl_fail(err, VL_EINVAL, "--step-delay must be 0..60000");
    if (o->slowdown < 0 || o->slowdown > 100)
        return vl_fail(err, VL_EINVAL, "--slowdown must be 1..100");
    if (o->gpu_mem_mib < 0 || o->gpu_mem_mib > (INT64_C(1) << 30))
        return vl_fail(err, VL_EINVAL, "--gpu-mem must be 1..%lld MiB", 1LL << 30);
    if (crypto_init() != VL_OK) return vl_fail(err, VL_ERR, "libsodium failed to initialise");
    loop L;
    memset(&L, 0, sizeof L);
    L.o = o;
    L.tamper = tamper;
    L.tamper_arg = tamper_arg;
    peer_device dev;
    int rc = peer_device_choose(o->device, &dev, err);
    if (rc) return rc;
    vl_log_info("training on %s", dev.desc);
    peer_ui_device(dev.kind == PEER_DEVICE_CUDA ? "cuda" : "cpu");
#if defined(VOLLEY_HAVE_CUDA)
    if (o->gpu_mem_mib > 0) {
        kernels_cuda_set_mem_cap((size_t)o->gpu_mem_mib << 20);
        if (dev.kind == PEER_DEVICE_CUDA)
            vl_log_info("GPU: holding at most %lld MiB of device memory (--gpu-mem)",
                        (long long)o->gpu_mem_mib);
    }
#endif
    rc = peer_state_load(o->dir, &L.st, err);
    if (rc) return rc;
    vl_error perr = {0};
    if (peer_progress_load(o->dir, &L.prog, &perr) != VL_OK)
        vl_log_warn("%s; counting the peer's work from zero", perr.msg);
    peer_clean_copy(dev.desc, L.prog.device, sizeof L.prog.device);
    /* Read before anything else: bad data fail the start, not a task. */
    if (o->local && (rc = peer_local_open(&L.local, o->local, err))) return rc;
    crypto_identity id;
    if ((rc = peer_load_key(o->dir, &id, err))) {
        peer_local_free(&L.local);
        return rc;
    }
    /* The kernels' own setting: OpenMP gets n threads and OpenBLAS stays at
     * one, so no BLAS thread pool starts (and spins) beside their team. */
    if (o->threads > 0) kernels_set_num_threads(o->threads);
    peer_retry_policy pol;
    peer_retry_for(&pol, o->retries, o->give_up_s);
    rc = peer_http_open(L.st.coordinator, L.st.cacert, &id, L.st.peer_id, &pol, &L.http, err);
    if (!rc && (o->max_upload_bps > 0 || o->max_download_bps > 0)) {
        rc = peer_http_set_rates(L.http, o->max_upload_bps, o->max_download_bps, err);
        if (!rc)
            vl_log_info("bandwidth caps: upload %s, download %s",
                        o->max_upload_bps > 0 ? "capped" : "free",
                        o->max_download_bps > 0 ? "capped" : "free");
        if (rc) peer_http_close(L.http);
    }
    if (rc) {
        crypto_identity_wipe(&id);
        peer_local_free(&L.local);
        return rc;
    }
    peer_trainer_init(&L.tr);
    L.tr.device = dev.kind;
    L.tr.gpu_fallback = o->device == PEER_DEVICE_WANT_AUTO;
    L.tr.step_delay_s = o->step_delay_ms / 1000.0;
    L.tr.slowdown = o->slowdown;
    peer_response_init(&L.rs);
    vl_buf_init(&L.upload, UPLOAD_CAP);
    vl_log_info("peer %lld working for %s (run '%s')", (long long)L.st.peer_id, L.st.coordinator,
                L.st.run);
    peer_pending recorded;
    rc = peer_resume_open(o->dir, &L.st, &L.saved, &recorded, err);
    if (!rc && recorded.task_id) rc = retry_recorded(&L, &recorded, err);
    peer_pending_free(&recorded);
    if (rc == STEP_FINISHED) {
        say_finished(&L);
        rc = VL_OK;
    } else if (!rc) {
        rc = run_loop(&L, err);
    }
    if (rc == PEER_ESTOPPED) vl_log_info("stopped by signal after %lld tasks", (long long)L.done);
    vl_log_info("traffic: uploaded %llu bytes, downloaded %llu bytes of models, %llu bytes of "
                "deltas, %llu bytes of data and %llu bytes of K-FAC factors",
                (unsigned long long)L.up_bytes, (unsigned long long)L.model_bytes,
                (unsigned long long)L.delta_bytes, (unsigned long long)L.data_bytes,
                (unsigned long long)L.factor_bytes);
    peer_http_bg_free(&L.bg);
    vl_buf_free(&L.upload);
    peer_response_free(&L.rs);
    peer_resume_free(&L.saved);
    peer_trainer_free(&L.tr);
    peer_local_free(&L.local);
    peer_http_close(L.http);
    crypto_identity_wipe(&id);
    return rc == PEER_ESTOPPED ? VL_OK : rc;
}

int peer_run(const peer_run_opts *o, vl_error *err) {
    return run_with(o, NULL, NULL, err);
}

int peer_run_tampered(const peer_run_opts *o, peer_tamper_fn fn, void *arg, vl_error *err) {
    return run_with(o, fn, arg, err);
}
