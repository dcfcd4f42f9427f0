/*
 * The record of an upload (DIR/pending.st) and the trainer state naming
 * it, written before the upload is sent and settled once its outcome is
 * known: the write-ahead half of peer/resume.c, for the loop (loop.c).
 */
#include <stdlib.h>
#include <string.h>

#include "peer/loop_internal.h"
#include "peer/peer.h"

/* Records the upload and the state after encoding it before it is sent:
 * pending.st first, then trainer.st naming it, so a record the state does
 * not name was never sent. Failing to save ends the run before the POST,
 * leaving the files as they were, consistent with nothing sent. */
int peer_loop_write_ahead(loop *L, const peer_task *k, vl_error *err) {
    peer_pending p;
    peer_pending_init(&p);
    p.task_id = k->task_id;
    p.deadline = k->deadline;
    p.kind = k->kind;
    p.bytes = L->upload.data;
    p.len = L->upload.len;
    snprintf(p.run, sizeof p.run, "%s", k->run);
    vl_error e = {0};
    int64_t mark = k->task_id;
    /* VOLLEY_PEER_FAULT=pending-full plays a full disk here, for the
     * test of what follows (tests/integration/full_dir.sh). */
    const char *fault = getenv("VOLLEY_PEER_FAULT");
    int rc = fault && strcmp(fault, "pending-full") == 0
                 ? vl_fail(&e, VL_EFULL, "No space left on device (VOLLEY_PEER_FAULT)")
                 : peer_pending_save(L->o->dir, &p, L->tr.n_params, &e);
    if (rc == VL_ETOOBIG && k->kind != COMPRESS_TOPK) {
        /* A sketch larger than the model: no residual depends on it, so
         * losing it to a crash costs only the one update. */
        vl_log_warn("task %lld: upload not recorded before sending: %s", (long long)k->task_id,
                    e.msg);
        mark = 0;
        rc = VL_OK;
    }
    if (rc)
        return vl_fail(err, rc, "cannot record the upload of task %lld: %s", (long long)k->task_id,
                       e.msg);
    if ((rc = peer_resume_save_trainer(L->o->dir, &L->tr, &L->st, mark, &e)))
        return vl_fail(err, rc, "cannot save the trainer state: %s", e.msg);
    return VL_OK;
}

/* Settles the record of an upload whose outcome is known. Failures only
 * cost a retry at the next start, which settles it the same way, so they
 * are logged, not fatal. A refused upload's state is saved before the
 * record goes: the other order could leave a state that still lacks the
 * entries put back, with nothing left to say so. */
void peer_loop_settle(loop *L, peer_upload_outcome out) {
    vl_error e = {0};
    if (out == PEER_UPLOAD_NOT_TAKEN &&
        peer_resume_save_trainer(L->o->dir, &L->tr, &L->st, 0, &e) != VL_OK) {
        vl_log_warn("upload record kept, the trainer state cannot be saved: %s", e.msg);
        return;
    }
    if (peer_pending_clear(L->o->dir, &e) != VL_OK)
        vl_log_warn("upload record not cleared (a restart will send it again): %s", e.msg);
}
