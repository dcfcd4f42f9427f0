/* Split learning on the peer (peer/local.h, peer_trainer_run_split): the
 * layers below the cut train here on the peer's own images; the rest of
 * the model answers over the network with the gradient at the cut. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/split_wire.h"
#include "kernels/dcor.h"
#include "model/mlp_io.h"
#include "model/mlp_part.h"
#include "peer/local.h"
#include "peer/train_internal.h"

/* Reply bodies are a batch's gradient: B * q floats and a header. */
#define SPLIT_REPLY_CAP (SPLIT_WIRE_MAX_VALUES * sizeof(float) + 65536)
#define SPLIT_IDLE_S 60

/* Buffers of one split task, freed together. */
typedef struct split_bufs {
    model_mlp_part *lower;
    float *dz;       /* [B, q] */
    double *scratch; /* dCor's */
    buf req;
} split_bufs;

static void bufs_free(split_bufs *b) {
    model_mlp_part_destroy(b->lower);
    free(b->dz);
    free(b->scratch);
    buf_free(&b->req);
}

/* The optimizer's step on the lower layers: their parameters are the
 * first count of the model's, so the optimizer's state for them is the
 * first count entries of its vectors, and the tensor table's first
 * entries describe them. */
static int lower_step(peer_trainer *t, const peer_task *k, split_bufs *b, size_t count,
                      vl_error *err) {
    float *p = model_mlp_part_params(b->lower), *g = model_mlp_part_grads(b->lower);
    if (k->sgd) {
        model_sgd view = t->sgd;
        view.n = count;
        int rc = model_sgd_step(&view, p, g, count, k->weight_decay > 0, err);
        t->sgd.step = view.step;
        return rc;
    }
    const model_tensor *tensors;
    model_mlp_tensors(t->mlp, &tensors);
    model_adamw view = t->opt;
    view.n = count;
    int rc = model_adamw_step_tensors(&view, tensors, 2 * k->split_cut, count, p, g, err);
    t->opt.step = view.step;
    return rc;
}

/* Sends the batch's activations and labels; on success dz holds dL/dZ and
 * *loss the batch's loss. A refusal (the lease gone, the run over, a
 * batch the coordinator will not take) is VL_ERANGE: the task is dropped,
 * not the run. */
static int exchange(peer_http *http, peer_response *rs, const peer_task *k, int64_t peer_id,
                    split_bufs *b, const float *z, const int *y, int q, float *loss,
                    vl_error *err) {
    b->req.len = 0;
    int rc = split_wire_encode_forward(k->run, peer_id, k->task_id, z, k->batch, q,
                                       k->split_dtype, y, &b->req, err);
    if (rc) return rc;
    char target[] = "/v1/split/forward";
    peer_request rq = {.method = "POST", .target = target,
                       .content_type = "application/octet-stream", .body = b->req.data,
                       .body_len = b->req.len, .cap = SPLIT_REPLY_CAP, .idle_s = SPLIT_IDLE_S};
    if ((rc = peer_http_do(http, &rq, rs, err))) return rc;
    if (rs->status != 200) {
        vl_error e = {0};
        peer_refusal(&e, "split forward refused", rs->status, rs->body.data, rs->body.len);
        return vl_fail(err, VL_ERANGE, "%s", e.msg);
    }
    double l = 0;
    rc = split_wire_decode_reply(rs->body.data, rs->body.len, k->batch, q, b->dz, &l, NULL, err);
    if (rc) return vl_fail(err, VL_ERANGE, "%s", err->msg);
    *loss = (float)l;
    return VL_OK;
}

static int split_steps(peer_trainer *t, const peer_task *k, peer_local *l, peer_http *http,
                       peer_response *rs, int64_t peer_id, split_bufs *b, size_t count,
                       peer_train_result *res, vl_error *err) {
    const int B = k->batch;
    const int q = model_mlp_part_out_dim(b->lower), p = model_mlp_part_in_dim(b->lower);
    rng r;
    rng_seed(&r, k->seed);
    peer_selsync ss = {0};
    double sum = 0, dcor_sum = 0;
    int step = 0, rc;
    while (step < k->steps) {
        if (peer_stop_requested()) return vl_fail(err, PEER_ESTOPPED, "stopped during training");
        double step_t0 = clock_mono_s();
        step++;
        if ((rc = peer_local_batch(l, B, &r, err))) return rc;
        model_mlp_part_zero_grad(b->lower);
        if ((rc = model_mlp_part_forward(b->lower, l->x, B, err))) return rc;
        const float *z = model_mlp_part_output(b->lower);
        float loss = 0;
        if ((rc = exchange(http, rs, k, peer_id, b, z, l->y, q, &loss, err))) return rc;
        double dcor = 0;
        if (k->split_alpha > 0 &&
            (rc = model_mlp_part_nopeek(l->x, p, z, q, B, (float)k->split_alpha, b->dz, &dcor,
                                        b->scratch, err)))
            return rc;
        if ((rc = model_mlp_part_backward(b->lower, b->dz, NULL, err))) return rc;
        double g2 = peer_clip_grads(model_mlp_part_grads(b->lower), count, k->grad_clip);
        if (!isfinite(g2)) return peer_trainer_diverged(t, err, "the gradient norm", g2, step);
        if ((rc = lower_step(t, k, b, count, err))) return rc;
        sum += loss;
        dcor_sum += dcor;
        if (step == 1) res->first_loss = loss;
        res->last_loss = loss;
        if ((rc = peer_trainer_pace(t, step_t0, err))) return rc;
        double change = peer_selsync_feed(&ss, g2);
        if (step >= k->h_min && change >= k->selsync_delta) break;
    }
    res->steps = step;
    res->mean_loss = sum / step;
    if (k->split_alpha > 0)
        log_debug("task %lld: mean dCor(X, Z) %.4f over %d batches", (long long)k->task_id,
                  dcor_sum / step, step);
    return VL_OK;
}

int peer_trainer_run_split(peer_trainer *t, const peer_task *k, peer_local *l, peer_http *http,
                           peer_response *rs, int64_t peer_id, peer_train_result *res,
                           vl_error *err) {
    memset(res, 0, sizeof *res);
    int rc = peer_local_check(t, k, l, err);
    if (rc) return rc;
    model_mlp_config c = model_mlp_config_get(t->mlp);
    if (k->split_cut < 1 || k->split_cut > c.n_hidden)
        return vl_fail(err, VL_EINVAL, "task: split cut %d outside 1..%d", k->split_cut,
                       c.n_hidden);
    if (k->split_alpha > 0 && k->batch < 2)
        return vl_fail(err, VL_EINVAL, "task: NoPeek needs batches of at least 2 images");
    if ((rc = peer_local_reserve(l, k->batch, c.in_dim, err))) return rc;
    if ((rc = peer_trainer_prepare(t, k, err))) return rc;
    size_t off = 0, count = 0;
    split_bufs b;
    memset(&b, 0, sizeof b);
    buf_init(&b.req, SPLIT_WIRE_MAX_VALUES * sizeof(float) + 65536);
    rc = model_mlp_part_offset(&c, 0, k->split_cut, &off, &count, err);
    if (!rc) rc = model_mlp_part_create(&c, 0, k->split_cut, &b.lower, err);
    if (!rc) {
        int q = model_mlp_part_out_dim(b.lower);
        b.dz = malloc((size_t)k->batch * (size_t)q * sizeof *b.dz);
        b.scratch = malloc(kernels_dcor_scratch_doubles(k->batch) * sizeof *b.scratch);
        if (!b.dz || !b.scratch) rc = vl_fail(err, VL_ENOMEM, "out of memory for a split task");
    }
    double t0 = clock_mono_s();
    float *params = model_mlp_params(t->mlp);
    if (!rc) {
        memcpy(params, t->base, t->n_params * sizeof *params);
        memcpy(model_mlp_part_params(b.lower), params + off, count * sizeof *params);
        rc = split_steps(t, k, l, http, rs, peer_id, &b, count, res, err);
    }
    if (!rc) {
        /* Only the lower layers moved: the rest of the delta is zero. */
        memcpy(params + off, model_mlp_part_params(b.lower), count * sizeof *params);
        compress_dense_delta(t->base, params, t->delta, t->n_params);
        if (!compress_all_finite(t->delta, t->n_params))
            rc = peer_trainer_diverged(t, err, "a parameter", NAN, res->steps);
    }
    bufs_free(&b);
    if (rc) return rc;
    res->tokens = (int64_t)res->steps * k->batch;
    res->seconds = clock_mono_s() - t0;
    return VL_OK;
}
