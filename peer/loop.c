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

void peer_loop_remember(loop *L, const peer_task *k) {
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

/* The status line between tasks: the version the last accepted update goes
 * into, while one is awaited, else any task. */
void peer_loop_say_waiting(loop *L, int64_t task) {
    char phase[48] = "waiting for a task";
    if (L->awaited > 0)
        snprintf(phase, sizeof phase, "waiting for version %lld", (long long)L->awaited);
    peer_ui_phase(task, phase);
}

static int fetch_task(loop *L, peer_task *k, vl_error *err) {
    char target[96];
    peer_loop_say_waiting(L, 0);
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
        return VL_AGAIN;
    }
    if (L->rs.status == 200 || L->rs.status == 204) L->release = 0;
    if (L->rs.status == 204) return VL_AGAIN;
    if (run_finished(&L->rs)) return VL_DONE;
    if (L->rs.status != 200)
        return peer_refusal(err, "task request refused", L->rs.status, L->rs.body.data,
                            L->rs.body.len);
    int prc = peer_task_parse((const char *)L->rs.body.data, L->rs.body.len, k, err);
    if (prc) return refused(prc);
    if ((prc = peer_task_check_run(k, L->st.run, err))) return refused(prc);
    if (k->base_version >= L->awaited) L->awaited = 0;
    return VL_OK;
}

/* ---- a task's six steps ------------------------------------------------- */

/* 1. The lease: the one the last upload brought, or a new one; a task done
 * already is waited out rather than redone; the task is announced. */
static int acquire(loop *L, peer_task *k, vl_error *err) {
    int rc = VL_OK;
    memset(&L->times, 0, sizeof L->times);
    if (L->have_next) {
        *k = L->next;
        L->have_next = 0;
    } else if ((rc = fetch_task(L, k, err))) {
        /* A refused lease has no usable task id: it cannot be remembered,
         * only waited out by the pause after a refusal. */
        if (rc == PEER_LOOP_REFUSED)
            vl_log_warn("task refused: %s; keeping model version %lld", err->msg,
                        (long long)L->tr.base_version);
        return rc;
    }
    if (seen(L, k)) {
        /* Wait the lease out, a slice at a time, rather than redo it. */
        double left = (double)(k->deadline - vl_clock_unix_s()) + 1;
        vl_log_debug("task %lld offered again; waiting for its lease to end",
                     (long long)k->task_id);
        if (peer_sleep(left < 1 ? 1 : left > 30 ? 30 : left)) return PEER_ESTOPPED;
        return VL_AGAIN;
    }
    L->holding = k->task_id;
    peer_ui_phase(k->task_id, "fetching the model");
    peer_ui_field tf[] = {
        PEER_UI_INT("task", k->task_id),    PEER_UI_INT("base_version", k->base_version),
        PEER_UI_INT("steps", k->steps),     PEER_UI_INT("batch", k->batch),
        PEER_UI_INT("context", k->context), PEER_UI_INT("deadline", k->deadline)};
    peer_ui_event(LOG_INFO, "task_start", tf, PEER_UI_NFIELDS(tf),
                  "task %lld: model version %lld, up to %d local steps, lease ends in %lld s",
                  (long long)k->task_id, (long long)k->base_version, k->steps,
                  (long long)(k->deadline - vl_clock_unix_s()));
    char desc[sizeof L->comp_desc];
    peer_task_describe_compression(k, desc, sizeof desc);
    if (strcmp(desc, L->comp_desc) != 0) {
        vl_log_info("compression: %s", desc);
        memcpy(L->comp_desc, desc, sizeof desc);
    }
    return VL_OK;
}

/* The trainer state saved before a restart, once a model of its shape is
 * installed: a state for another shape is said and dropped. */
static int apply_saved(loop *L, vl_error *err) {
    if (!L->saved.n_params) return VL_OK;
    vl_error e = {0};
    int rc = peer_resume_apply(&L->tr, &L->saved, &e);
    if (rc == VL_ECONFLICT) {
        vl_log_warn("trainer state not applied: %s", e.msg);
        return VL_OK;
    }
    if (rc) return vl_fail(err, rc, "%s", e.msg);
    vl_log_info("trainer state applied to model version %lld: %s at step %ld",
                (long long)L->tr.base_version,
                L->tr.have_kfac  ? "K-FAC"
                : L->tr.have_sgd ? "SGD"
                                 : "AdamW",
                L->tr.have_kfac  ? L->tr.kfac.step
                : L->tr.have_sgd ? L->tr.sgd.step
                : L->tr.have_opt ? L->tr.opt.step
                                 : 0L);
    return VL_OK;
}

/* 2. What the task trains from: its base model, checked against the
 * task, the saved trainer state, K-FAC's merged factors, and its data (a
 * token range into *data, which train closes; a text range into
 * L->rs.body). A task whose model or data fail validation is refused and
 * remembered. */
static int fetch(loop *L, const peer_task *k, model_shard **data, vl_error *err) {
    double t_fetch = vl_clock_mono_s();
    peer_fetch f = {.http = L->http,
                    .rs = &L->rs,
                    .tr = &L->tr,
                    .dir = L->o->dir,
                    .model_bytes = &L->model_bytes,
                    .delta_bytes = &L->delta_bytes,
                    .data_bytes = &L->data_bytes};
    int rc = peer_fetch_model(&f, k, err);
    if (rc == VL_OK)
        rc = k->local    ? peer_local_check(&L->tr, k, &L->local, err)
             : L->tr.mlp ? vl_fail(err, VL_EINVAL,
                                   "task %lld has a data range but the model is "
                                   "a classifier",
                                   (long long)k->task_id)
                         : peer_task_check_model(k, &L->tr.cfg, err);
    if (rc == VL_EINVAL) rc = PEER_LOOP_REFUSED;
    if (rc == VL_AGAIN || rc == PEER_LOOP_REFUSED) peer_loop_remember(L, k);
    if (rc == PEER_LOOP_REFUSED)
        vl_log_warn("task %lld refused: %s; keeping model version %lld", (long long)k->task_id,
                    err->msg, (long long)L->tr.base_version);
    if (rc) return rc;
    if ((rc = apply_saved(L, err))) return rc;
    if ((rc = peer_kfac_sync(L->http, &L->rs, &L->tr, k, &L->factor_bytes, err))) return rc;
    if (!k->local) peer_ui_phase(k->task_id, "fetching data");
    rc = k->local    ? VL_OK
         : k->tokens ? peer_fetch_tokens(&f, k, data, err)
                     : peer_fetch_data(&f, k, err);
    if (rc == PEER_LOOP_REFUSED) {
        peer_loop_remember(L, k);
        vl_log_warn("task %lld refused: %s", (long long)k->task_id, err->msg);
    }
    if (rc) return rc;
    L->times.download = vl_clock_mono_s() - t_fetch;
    return VL_OK;
}

/* 3. The local steps, in the mode the task and the model call for
 * (peer_trainer_run_task). A task whose training diverged is dropped and
 * the loop goes on. */
static int train(loop *L, const peer_task *k, model_shard *data, peer_train_result *res,
                 vl_error *err) {
    peer_ui_device(L->tr.device == PEER_DEVICE_CUDA ? "cuda" : "cpu");
    peer_ui_train_begin(k->task_id, k->steps,
                        k->local && !L->tr.gpt ? (int64_t)k->batch
                                               : (int64_t)k->batch * k->context);
    peer_task_data d = {.local = &L->local,
                        .tokens = data,
                        .bytes = L->rs.body.data,
                        .len = L->rs.body.len,
                        .http = L->http,
                        .rs = &L->rs,
                        .peer_id = L->st.peer_id};
    int rc = peer_trainer_run_task(&L->tr, k, &d, res, err);
    model_shard_close(data);
    if (rc == VL_ERANGE) {
        vl_log_warn("task %lld dropped: %s", (long long)k->task_id, err->msg);
        peer_loop_remember(L, k);
        return PEER_LOOP_DROPPED;
    }
    if (rc == PEER_ESTOPPED) vl_log_info("task %lld abandoned", (long long)k->task_id);
    if (rc) return rc;
    L->train_s += res->seconds;
    L->times.train = res->seconds;
    return VL_OK;
}

/* 6. After the upload: the task is done (unless its upload is still on
 * its way), and a sketch run's second round is answered. */
static int report(loop *L, const peer_task *k, vl_error *err) {
    if (L->flying) return VL_OK;
    peer_loop_remember(L, k);
    if (!L->answer_round) return VL_OK;
    if (k->method == PEER_METHOD_SKETCH && k->second_round > 0)
        peer_ui_phase(k->task_id, "second round");
    return peer_round_answer(L->http, &L->rs, &L->tr, k, L->st.peer_id, &L->upload, &L->up_bytes,
                             err);
}

/* One lease from request to upload. Step 4 hears the last task's upload
 * first: a refusal puts its entries back in the residual, which this
 * task's encoding then carries. */
static int one_task(loop *L, vl_error *err) {
    peer_task k;
    peer_train_result res;
    model_shard *data = NULL;
    int rc = acquire(L, &k, err);
    if (!rc) rc = fetch(L, &k, &data, err);
    if (!rc) rc = train(L, &k, data, &res, err);
    if (!rc) rc = peer_loop_land(L, err);
    if (!rc) rc = peer_loop_upload(L, &k, &res, err);
    if (!rc) rc = report(L, &k, err);
    return rc == PEER_LOOP_DROPPED ? VL_OK : rc;
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
void peer_loop_leave(loop *L, int64_t task_id) {
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
        int lrc = peer_loop_land(L, &e);
        if (lrc == VL_DONE) lrc = VL_OK;
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
        if (L->release) peer_loop_leave(L, L->release);
        if (rc == PEER_ESTOPPED && L->holding && L->holding != L->release)
            peer_loop_leave(L, L->holding);
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
        if (rc == PEER_LOOP_REFUSED) {
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
        if (rc != VL_AGAIN) refusals = 0;
        if (rc == VL_AGAIN) continue;
        if (rc == VL_DONE) {
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
    if (vcrypto_init() != VL_OK) return vl_fail(err, VL_ERR, "libsodium failed to initialise");
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
    vcrypto_identity id;
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
        vcrypto_identity_wipe(&id);
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
    if (!rc && recorded.task_id) rc = peer_loop_retry_recorded(&L, &recorded, err);
    peer_pending_free(&recorded);
    if (rc == VL_DONE) {
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
    vcrypto_identity_wipe(&id);
    return rc == PEER_ESTOPPED ? VL_OK : rc;
}

int peer_run(const peer_run_opts *o, vl_error *err) {
    return run_with(o, NULL, NULL, err);
}

int peer_run_tampered(const peer_run_opts *o, peer_tamper_fn fn, void *arg, vl_error *err) {
    return run_with(o, fn, arg, err);
}
