/* The run loop's state and steps, shared by loop.c (leases, uploads,
 * the loop itself) and fetch.c (a task's model and data). Private to
 * the peer library. */
#ifndef VOLLEY_PEER_LOOP_INTERNAL_H
#define VOLLEY_PEER_LOOP_INTERNAL_H

#include <string.h>

#include "peer/local.h"
#include "peer/peer.h"
#include "peer/progress.h"
#include "peer/tamper.h"

#define JSON_CAP ((size_t)1 << 20)
#define MODEL_CAP ((size_t)2 << 30)
#define IDLE_S 120L
#define FINISHED_RING 64
#define TOKENS_FILE "task.tokens" /* a token task's data while it trains */

/* Where one task's wall time went, for its summary line. */
typedef struct task_times {
    double download, train, compress, upload; /* seconds */
} task_times;

typedef struct loop {
    const peer_run_opts *o;
    peer_tamper_fn tamper; /* tests only (peer/tamper.h); NULL in volley-peer */
    void *tamper_arg;
    peer_state st;
    peer_http *http;
    peer_trainer tr;
    peer_response rs;
    vl_buf upload;
    int64_t done;
    int answer_round; /* the last upload was accepted: its round may follow */
    /* The version the last accepted update goes into, until a task of it
     * (or later) comes: what the status line says the peer waits for. 0:
     * none. */
    int64_t awaited;
    /* The trainer state read at start, until a model of its shape is
     * installed and takes it over. */
    peer_resume saved;
    /* Traffic, for the summary at exit. */
    uint64_t up_bytes, model_bytes, delta_bytes, data_bytes, factor_bytes;
    /* Leases this peer has finished with (uploaded or dropped). A refused
     * request changes nothing on the coordinator, so it may offer the same
     * lease again until its deadline; retraining it would be wasted work. */
    struct {
        int64_t task_id, deadline;
    } finished[FINISHED_RING];
    int nfinished;
    char comp_desc[160]; /* the compression last logged */
    /* The next task, leased with the last upload's 202 (async runs), so
     * the next round trip is the model or data, not the task. */
    int have_next;
    peer_task next;
    peer_local local; /* --data: the peer's own images (images NULL: none) */
    /* The update still uploading while the next task trains (a task that
     * allows overlap), with what its answer is judged by. */
    peer_http_bg bg;
    int flying;
    peer_task fly_k;
    peer_train_result fly_res;
    task_times times, fly_times; /* the task in hand's, the one uploading's */
    /* Compute utilisation, for the summary at exit: seconds spent
     * training against the loop's wall time. */
    double train_s, t_start;
    peer_progress prog; /* DIR/progress.json, for `volley-peer status` */
    /* The last upload was refused for what it held (422 norm_exceeded,
     * non_finite, bad_loss), and how many in a row were. */
    int judged;
    int judged_in_row;
    /* The lease of a task whose update was refused that way: the next
     * task request ends it (?release=), so the coordinator does not hold
     * the peer until its deadline. 0: none. */
    int64_t release;
    /* The task in hand from its lease until its upload begins: a peer
     * stopped meanwhile ends that lease (?release=T&next=0) rather than
     * leave its data and, in a sync run, its version waiting for the
     * deadline. 0: none. */
    int64_t holding;
} loop;

/* Outcomes of a step of the loop besides errors, negative codes beside
 * vl_error's as nginx's NGX_AGAIN and NGX_DONE are: VL_AGAIN, nothing to
 * do now (ask for a task again); VL_DONE, the run has finished;
 * PEER_LOOP_REFUSED, what the coordinator sent for the task (the lease,
 * its model, its data) failed validation (err says why, the trainer is as
 * it was); PEER_LOOP_GAVE_UP, a tamper hook (tests only) had nothing more
 * to send; PEER_LOOP_DROPPED, the task was dropped (its training
 * diverged), and the loop goes on with the next. */
#define PEER_LOOP_REFUSED (-70)
#define PEER_LOOP_GAVE_UP (-71)
#define PEER_LOOP_DROPPED (-72)

/* Validation failures become PEER_LOOP_REFUSED; running out of memory and
 * everything else stay errors. */
static inline int refused(int rc) {
    return rc == VL_EINVAL || rc == VL_ERANGE || rc == VL_ETOOBIG || rc == VL_ENOTFOUND
               ? PEER_LOOP_REFUSED
               : rc;
}

/* The error code of an error body is code. */
static inline int error_code_is(const peer_response *rs, const char *code) {
    return peer_error_code_is(rs->body.data, rs->body.len, code);
}

static inline int run_finished(const peer_response *rs) {
    return rs->status == 410 && error_code_is(rs, "run_finished");
}

/* record.c. Records the upload in L->upload of task k and the trainer
 * state naming it, before the upload is sent; failing, leaves the files
 * as they were (nothing sent) and says why in err. */
int peer_loop_write_ahead(loop *L, const peer_task *k, vl_error *err) VL_MUST_CHECK;
/* Settles the record of an upload whose outcome is known; failures are
 * logged, not returned (a restart settles it the same way). */
void peer_loop_settle(loop *L, peer_upload_outcome out);

/* fetch.c: a task's model and data, fetched with what that needs of the
 * loop and nothing more. */
typedef struct peer_fetch {
    peer_http *http;
    peer_response *rs; /* every response lands here (the loop's, reused) */
    peer_trainer *tr;  /* the model is installed here */
    const char *dir;   /* the peer's directory: a token task's shard goes there */
    uint64_t *model_bytes, *delta_bytes, *data_bytes; /* what the loop reports */
} peer_fetch;

/* Each returns 0, VL_AGAIN or PEER_LOOP_REFUSED (the task's model or data
 * failed validation; err says why), or an error that ends the loop. */

/* Installs the task's base version in f->tr: kept, brought up to date
 * with a delta, or downloaded (resuming a broken download). */
int peer_fetch_model(peer_fetch *f, const peer_task *k, vl_error *err) VL_MUST_CHECK;
/* Downloads a text task's byte range into f->rs->body. */
int peer_fetch_data(peer_fetch *f, const peer_task *k, vl_error *err) VL_MUST_CHECK;
/* Downloads a token task's range to a small shard in f->dir and opens
 * it; the caller owns *out (model_shard_close). */
int peer_fetch_tokens(peer_fetch *f, const peer_task *k, model_shard **out,
                      vl_error *err) VL_MUST_CHECK;

/* loop.c. Notes task k as done (a ring of the last FINISHED_RING), so an
 * offer of it again is waited out. */
void peer_loop_remember(loop *L, const peer_task *k);
/* The status line between tasks: the version the last accepted update
 * goes into, while one is awaited, else any task. */
void peer_loop_say_waiting(loop *L, int64_t task);
/* Ends a lease the peer leaves unfinished (one try of at most 10 s). */
void peer_loop_leave(loop *L, int64_t task_id);

/* upload.c. Step 5 of a task: records and sends task k's update (in the
 * background with --overlap), then hears its answer; a tamper hook's
 * later moves and an update refused for what it held are dealt with
 * here. 0, or the code that ends or pauses the loop. */
int peer_loop_upload(loop *L, const peer_task *k, const peer_train_result *res,
                     vl_error *err) VL_MUST_CHECK;
/* Step 4: waits for the upload still in the background and hears its
 * answer (VL_OK when there is none). */
int peer_loop_land(loop *L, vl_error *err) VL_MUST_CHECK;
/* After an upload refused for its content (L->judged, err saying why):
 * VL_OK, until PEER_MAX_REFUSALS in a row end the run with PEER_EREFUSED. */
int peer_loop_judged_go_on(loop *L, vl_error *err) VL_MUST_CHECK;
/* At start: sends again the upload an earlier process recorded (p) and
 * settles it. */
int peer_loop_retry_recorded(loop *L, peer_pending *p, vl_error *err) VL_MUST_CHECK;

#endif
