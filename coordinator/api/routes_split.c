/* POST /v1/split/forward and POST /v1/split/backward: a split run's
 * batches. The checks of protocol.md's order on the loop, then the
 * coordinator's layers on the compute thread (one job per batch), then
 * the answer: the gradient at the cut, or a U-shaped run's layer output.
 * The layers themselves and the batches in flight per peer are
 * run/split.c's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/split_wire.h"
#include "coordinator/coord.h"
#include "coordinator/run/split.h"
#include "model/mlp_io.h"
#include "model/mlp_part.h"
#include "coordinator/api/api.h"
#include "coordinator/http/http.h"
#include "coordinator/run/run.h"
#include "coordinator/run/writer.h"

/* One batch on its way through the compute thread. */
typedef struct split_job {
    coord_job job;
    coord_req cr;
    split_wire_forward in; /* owned */
    int backward;          /* a U-shaped run's backward request (in.dy set) */
    float *out;            /* owned: the answer, dz [B, q] or (U-shaped forward) y [B, h] */
    float loss;            /* NaN when the loss is the peer's */
    int64_t step;
} split_job;

/* One step of the coordinator's layers with their gradients in place;
 * refused when a gradient is not finite, so a hostile batch cannot poison
 * them. */
static int step_layers(coord_split *s, vl_error *err) {
    model_mlp_part *p = s->upper;
    const float *g = model_mlp_part_grads(p);
    for (size_t i = 0; i < s->count; i++)
        if (!isfinite(g[i])) return vl_fail(err, VL_ERANGE, "the batch's gradient is not finite");
    model_tensor all = {
        .name = "upper", .ndim = 1, .shape = {s->count, 0}, .offset = 0, .numel = s->count};
    int rc = model_adamw_step_tensors(&s->opt, &all, 1, s->count, model_mlp_part_params(p), g, err);
    if (!rc) s->steps++;
    return rc;
}

/* The coordinator's layers on one batch. A plain split: forward, the
 * loss, backward to the cut, one step. A U-shaped forward: the layers'
 * output only, for the peer's head (no step). A U-shaped backward: the
 * forward again on the same z (cheaper than keeping every batch in flight
 * until its gradient comes), backward from the peer's dy, one step. */
static int split_run(storage *db, coord_job *job, vl_error *err) {
    (void)db;
    split_job *j = (split_job *)job;
    coord_split *s = j->cr.srv->run.split;
    const int B = j->in.B;
    model_mlp_part *p = s->upper;
    int only_forward = s->u_shape && !j->backward;
    size_t width = only_forward ? (size_t)s->h : (size_t)s->q;
    j->out = malloc((size_t)B * width * sizeof *j->out);
    if (!j->out) return vl_fail(err, VL_ENOMEM, "out of memory for a batch's answer");
    j->loss = NAN;
    int rc = model_mlp_part_forward(p, j->in.z, B, err);
    if (rc) return rc;
    if (only_forward) {
        const float *y = model_mlp_part_output(p);
        for (size_t i = 0; i < (size_t)B * width; i++)
            if (!isfinite(y[i])) return vl_fail(err, VL_ERANGE, "the layers' output is not finite");
        memcpy(j->out, y, (size_t)B * width * sizeof *j->out);
        j->step = s->steps;
        return VL_OK;
    }
    model_mlp_part_zero_grad(p);
    if (!j->backward) {
        if ((rc = model_mlp_part_loss(p, j->in.labels, &j->loss, err))) return rc;
        if (!isfinite(j->loss)) return vl_fail(err, VL_ERANGE, "the batch's loss is not finite");
    }
    rc = model_mlp_part_backward(p, j->backward ? j->in.dy : NULL, j->out, err);
    if (!rc) rc = step_layers(s, err);
    if (rc) return rc;
    /* A U-shaped run's loss is the peer's: there is none to average. */
    if (!j->backward) {
        s->loss_sum += j->loss;
        s->batches++;
    }
    j->step = s->steps;
    return VL_OK;
}

static void split_done(coord_job *job, int rc, const vl_error *err) {
    split_job *j = (split_job *)job;
    coord_req *cr = &j->cr;
    if (cr->srv->run.split) coord_split_batch_give(cr->srv->run.split, j->in.peer);
    if (rc == VL_ERANGE) {
        coord_reply_error(cr, 422, "non_finite", "%s", err->msg);
    } else if (rc != VL_OK) {
        coord_reply_internal(cr, err);
    } else {
        vl_buf b;
        vl_buf_init(&b, SPLIT_WIRE_MAX_VALUES * sizeof(float) + 4096);
        vl_error e = {0};
        coord_blob *blob = NULL;
        int y = cr->srv->run.split->u_shape && !j->backward;
        if (split_wire_encode_reply(y ? "y" : "dz", j->out, j->in.B, y ? j->in.h : j->in.q,
                                    j->in.dtype, j->loss, j->step, &b, &e) == VL_OK) {
            size_t len;
            uint8_t *data = vl_buf_steal(&b, &len);
            blob = coord_blob_wrap(data, len, cr->srv->run.version);
            if (!blob) vl_fail(&e, VL_ENOMEM, "out of memory sending a gradient");
        }
        vl_buf_free(&b);
        if (blob)
            coord_reply_blob(cr, blob);
        else
            coord_reply_internal(cr, &e);
    }
    split_wire_forward_free(&j->in);
    free(j->out);
    free(j);
}

/* The lease the batch claims: this peer's, of this run, not expired. */
static int check_lease(coord_req *cr, const split_wire_forward *in) {
    storage_task t;
    if (coord_check_task_owner(cr, "the activations", in->run, in->peer, in->task, &t) != 0)
        return COORD_ANSWERED;
    if (t.state != STORAGE_TASK_LEASED || t.deadline <= vl_clock_unix_s()) {
        coord_reply_error(cr, 409, "lease_expired",
                          "task %lld is not leased any more: its "
                          "batches are no longer taken",
                          (long long)t.id);
        return COORD_ANSWERED;
    }
    return 0;
}

/* Both routes: the checks of protocol.md's order, then the batch to the
 * compute thread. */
static void route(coord_req *cr, int backward) {
    coord_server *srv = cr->srv;
    size_t len;
    const uint8_t *body = coord_body(cr, &len);
    if (!srv->run.split || (backward && !srv->run.split->u_shape)) {
        coord_reply_error(cr, 404, "not_split",
                          backward ? "this run is not U-shaped split learning (split.u_shape)"
                                   : "this run is not split learning (mode \"split\")");
        return;
    }
    if (srv->draining) {
        coord_reply_error(cr, 503, "draining", "the coordinator is shutting down");
        return;
    }
    if (srv->run.finished) {
        coord_reply_error(cr, 410, "run_finished", "the run reached its last version (%lld)",
                          (long long)srv->run.version);
        return;
    }
    split_job *j = calloc(1, sizeof *j);
    if (!j) {
        coord_reply_oom(cr, "queueing a batch");
        return;
    }
    const char *code = NULL;
    vl_error e = {0};
    const coord_split *s = srv->run.split;
    /* Labels travel only to a plain split's forward. */
    int classes = s->u_shape ? 0 : srv->run.cfg.mlp.n_classes;
    int rc = split_wire_decode_forward(body, len, s->q, backward ? s->h : 0,
                                       (int)srv->run.cfg.train.batch, classes, &j->in, &code, &e);
    if (rc == VL_ENOMEM)
        coord_reply_internal(cr, &e);
    else if (rc == VL_EINVAL)
        coord_reply_error(cr, 400, code, "%s", e.msg);
    /* The lease before the content: a stranger to the task learns nothing
     * about what a batch should look like. */
    else if (check_lease(cr, &j->in) != 0)
        rc = VL_ERR;
    else if (rc == VL_ERANGE)
        coord_reply_error(cr, 422, code, "%s", e.msg);
    else if ((rc = coord_split_batch_take(srv->run.split, j->in.peer)) != 0) {
        coord_set_header(cr, "Retry-After", "1");
        if (rc == -1)
            coord_reply_error(cr, 429, "too_many_batches",
                              "this peer already has %d batches "
                              "at the coordinator (split.in_flight)",
                              srv->run.split->in_flight);
        else
            coord_reply_error(cr, 503, "busy", "too many peers have batches at the coordinator");
    }
    if (rc != VL_OK) {
        split_wire_forward_free(&j->in);
        free(j);
        return;
    }
    j->in.h = s->h;
    j->backward = backward;
    j->job.run = split_run;
    j->job.done = split_done;
    j->cr = *cr;
    coord_writer_compute(srv->run.writer, &j->job);
}

void coord_route_split_forward(coord_req *cr) {
    route(cr, 0);
}

void coord_route_split_backward(coord_req *cr) {
    route(cr, 1);
}
