/* Split learning on the peer (peer/local.h, peer_trainer_run_split): the
 * layers below the cut (and, U-shaped, the classifier layer and the loss)
 * train here on the peer's own images; the rest of the model answers over
 * the network. */
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

/* Reply bodies are a batch's gradient or output and a header. */
#define SPLIT_REPLY_CAP (SPLIT_WIRE_MAX_VALUES * sizeof(float) + 65536)
#define SPLIT_IDLE_S 60
/* Most tensors a slice of the model has (its layers' weights and biases). */
#define SLICE_TENSORS (2 * (MODEL_MLP_MAX_HIDDEN + 1))

/* The peer's layers of one kind: a part of the model and where its
 * parameters lie in the flat vector. */
typedef struct slice {
    model_mlp_part *part;
    size_t offset, count;
    int first, last; /* layers [first, last) */
} slice;

/* Buffers of one split task, freed together. */
typedef struct split_bufs {
    slice lower, head; /* head.part NULL unless U-shaped */
    int q, h;          /* widths at the cut and of the coordinator's output */
    float *dz;         /* [B, q] */
    float *y, *dy;     /* [B, h], U-shaped only */
    double *scratch;   /* dCor's */
    buf req;
} split_bufs;

static void bufs_free(split_bufs *b) {
    model_mlp_part_destroy(b->lower.part);
    model_mlp_part_destroy(b->head.part);
    free(b->dz);
    free(b->y);
    free(b->dy);
    free(b->scratch);
    buf_free(&b->req);
}

static int slice_make(const model_mlp_config *c, int first, int last, slice *s, vl_error *err) {
    s->first = first;
    s->last = last;
    int rc = model_mlp_part_offset(c, first, last, &s->offset, &s->count, err);
    return rc ? rc : model_mlp_part_create(c, first, last, &s->part, err);
}

/* The optimizer's step on one slice: its state is the same slice of the
 * optimizer's vectors, and its tensors the table's entries for its
 * layers, moved to the slice's origin. step is the count before this
 * batch, the same for every slice of it. */
static int slice_step(peer_trainer *t, const peer_task *k, const slice *s, long step,
                      vl_error *err) {
    float *p = model_mlp_part_params(s->part), *g = model_mlp_part_grads(s->part);
    if (k->sgd) {
        model_sgd view = t->sgd;
        view.buf = t->sgd.buf + s->offset;
        view.n = s->count;
        view.step = step;
        return model_sgd_step(&view, p, g, s->count, k->weight_decay > 0, err);
    }
    const model_tensor *all;
    model_mlp_tensors(t->mlp, &all);
    model_tensor mine[SLICE_TENSORS];
    int n = 2 * (s->last - s->first);
    for (int i = 0; i < n; i++) {
        mine[i] = all[2 * s->first + i];
        mine[i].offset -= s->offset;
    }
    model_adamw view = t->opt;
    view.m = t->opt.m + s->offset;
    view.v = t->opt.v + s->offset;
    view.n = s->count;
    view.step = step;
    return model_adamw_step_tensors(&view, mine, n, s->count, p, g, err);
}

/* Global L2 clipping over the peer's slices together. */
static double clip_slices(split_bufs *b, double max_norm) {
    double s = 0;
    const slice *sl[2] = {&b->lower, &b->head};
    for (int i = 0; i < 2; i++) {
        if (!sl[i]->part) continue;
        const float *g = model_mlp_part_grads(sl[i]->part);
        for (size_t j = 0; j < sl[i]->count; j++) s += (double)g[j] * g[j];
    }
    if (max_norm > 0 && isfinite(s) && s > max_norm * max_norm) {
        float scale = (float)(max_norm / sqrt(s));
        for (int i = 0; i < 2; i++) {
            if (!sl[i]->part) continue;
            float *g = model_mlp_part_grads(sl[i]->part);
            for (size_t j = 0; j < sl[i]->count; j++) g[j] *= scale;
        }
    }
    return s;
}

/* One request and its reply: tensor `name` of width `width` into out, the
 * loss (NaN when the reply has none) into *loss. A refusal (the lease
 * gone, the run over, a batch the coordinator will not take) is
 * VL_ERANGE: the task is dropped, not the run. */
static int post(peer_http *http, peer_response *rs, const char *target, const buf *body,
                const char *name, int B, int width, float *out, double *loss, vl_error *err) {
    peer_request rq = {.method = "POST", .target = target,
                       .content_type = "application/octet-stream", .body = body->data,
                       .body_len = body->len, .cap = SPLIT_REPLY_CAP, .idle_s = SPLIT_IDLE_S};
    int rc = peer_http_do(http, &rq, rs, err);
    if (rc) return rc;
    if (rs->status != 200) {
        vl_error e = {0};
        peer_refusal(&e, "split learning refused", rs->status, rs->body.data, rs->body.len);
        return vl_fail(err, VL_ERANGE, "%s", e.msg);
    }
    rc = split_wire_decode_reply(rs->body.data, rs->body.len, name, B, width, out, loss, NULL,
                                 err);
    /* A bad reply drops the task like a refusal; its message stays. */
    if (rc && err) err->code = VL_ERANGE;
    return rc ? VL_ERANGE : VL_OK;
}

/* The gradient at the cut for the batch (z, y): from the coordinator's
 * loss (plain), or, U-shaped, from the loss of the peer's head on the
 * coordinator's output, which the coordinator then backpropagates. The
 * batch's loss goes to *loss. */
static int exchange(peer_http *http, peer_response *rs, const peer_task *k, int64_t peer_id,
                    split_bufs *b, const float *z, const int *y, float *loss, vl_error *err) {
    const int B = k->batch;
    b->req.len = 0;
    int rc = split_wire_encode_forward(k->run, peer_id, k->task_id, z, B, b->q, k->split_dtype,
                                       k->split_u ? NULL : y, &b->req, err);
    if (rc) return rc;
    double l = NAN;
    if (!k->split_u) {
        rc = post(http, rs, "/v1/split/forward", &b->req, "dz", B, b->q, b->dz, &l, err);
        if (!rc && !isfinite(l)) rc = vl_fail(err, VL_ERANGE, "split reply without its loss");
        *loss = (float)l;
        return rc;
    }
    if ((rc = post(http, rs, "/v1/split/forward", &b->req, "y", B, b->h, b->y, NULL, err)))
        return rc;
    /* The head and the loss: labels never leave the peer. */
    if ((rc = model_mlp_part_forward(b->head.part, b->y, B, err)) ||
        (rc = model_mlp_part_loss(b->head.part, y, loss, err)) ||
        (rc = model_mlp_part_backward(b->head.part, NULL, b->dy, err)))
        return rc;
    b->req.len = 0;
    rc = split_wire_encode_backward(k->run, peer_id, k->task_id, z, b->dy, B, b->q, b->h,
                                    k->split_dtype, &b->req, err);
    return rc ? rc : post(http, rs, "/v1/split/backward", &b->req, "dz", B, b->q, b->dz, NULL,
                          err);
}

static int split_steps(peer_trainer *t, const peer_task *k, peer_local *l, peer_http *http,
                       peer_response *rs, int64_t peer_id, split_bufs *b,
                       peer_train_result *res, vl_error *err) {
    const int B = k->batch, p = model_mlp_part_in_dim(b->lower.part);
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
        model_mlp_part_zero_grad(b->lower.part);
        if (b->head.part) model_mlp_part_zero_grad(b->head.part);
        if ((rc = model_mlp_part_forward(b->lower.part, l->x, B, err))) return rc;
        const float *z = model_mlp_part_output(b->lower.part);
        float loss = 0;
        if ((rc = exchange(http, rs, k, peer_id, b, z, l->y, &loss, err))) return rc;
        double dcor = 0;
        if (k->split_alpha > 0 &&
            (rc = model_mlp_part_nopeek(l->x, p, z, b->q, B, (float)k->split_alpha, b->dz,
                                        &dcor, b->scratch, err)))
            return rc;
        if ((rc = model_mlp_part_backward(b->lower.part, b->dz, NULL, err))) return rc;
        double g2 = clip_slices(b, k->grad_clip);
        if (!isfinite(g2)) return peer_trainer_diverged(t, err, "the gradient norm", g2, step);
        long before = k->sgd ? t->sgd.step : t->opt.step;
        rc = slice_step(t, k, &b->lower, before, err);
        if (!rc && b->head.part) rc = slice_step(t, k, &b->head, before, err);
        if (rc) return rc;
        if (k->sgd) t->sgd.step = before + 1;
        else t->opt.step = before + 1;
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

/* The task's slices and buffers. */
static int prepare(const model_mlp_config *c, const peer_task *k, split_bufs *b,
                   vl_error *err) {
    int rc = slice_make(c, 0, k->split_cut, &b->lower, err);
    if (!rc && k->split_u) rc = slice_make(c, c->n_hidden, c->n_hidden + 1, &b->head, err);
    if (rc) return rc;
    b->q = model_mlp_part_out_dim(b->lower.part);
    b->h = k->split_u ? model_mlp_part_in_dim(b->head.part) : 0;
    b->dz = malloc((size_t)k->batch * (size_t)b->q * sizeof *b->dz);
    b->scratch = malloc(kernels_dcor_scratch_doubles(k->batch) * sizeof *b->scratch);
    if (k->split_u) {
        b->y = malloc((size_t)k->batch * (size_t)b->h * sizeof *b->y);
        b->dy = malloc((size_t)k->batch * (size_t)b->h * sizeof *b->dy);
    }
    if (!b->dz || !b->scratch || (k->split_u && (!b->y || !b->dy)))
        return vl_fail(err, VL_ENOMEM, "out of memory for a split task");
    return VL_OK;
}

int peer_trainer_run_split(peer_trainer *t, const peer_task *k, peer_local *l, peer_http *http,
                           peer_response *rs, int64_t peer_id, peer_train_result *res,
                           vl_error *err) {
    memset(res, 0, sizeof *res);
    int rc = peer_local_check(t, k, l, err);
    if (rc) return rc;
    model_mlp_config c = model_mlp_config_get(t->mlp);
    int top = k->split_u ? c.n_hidden - 1 : c.n_hidden;
    if (k->split_cut < 1 || k->split_cut > top)
        return vl_fail(err, VL_EINVAL, "task: split cut %d outside 1..%d", k->split_cut, top);
    if (k->split_alpha > 0 && k->batch < 2)
        return vl_fail(err, VL_EINVAL, "task: NoPeek needs batches of at least 2 images");
    if ((rc = peer_local_reserve(l, k->batch, c.in_dim, err))) return rc;
    if ((rc = peer_trainer_prepare(t, k, err))) return rc;
    if ((rc = peer_local_accuracy(t, k, l, res, err))) return rc;
    split_bufs b;
    memset(&b, 0, sizeof b);
    buf_init(&b.req, SPLIT_WIRE_MAX_VALUES * sizeof(float) * 2 + 65536);
    rc = prepare(&c, k, &b, err);
    double t0 = clock_mono_s();
    float *params = model_mlp_params(t->mlp);
    slice *mine[2] = {&b.lower, &b.head};
    if (!rc) {
        memcpy(params, t->base, t->n_params * sizeof *params);
        for (int i = 0; i < 2; i++)
            if (mine[i]->part)
                memcpy(model_mlp_part_params(mine[i]->part), params + mine[i]->offset,
                       mine[i]->count * sizeof *params);
        rc = split_steps(t, k, l, http, rs, peer_id, &b, res, err);
    }
    if (!rc) {
        /* Only the peer's layers moved: the rest of the delta is zero. */
        for (int i = 0; i < 2; i++)
            if (mine[i]->part)
                memcpy(params + mine[i]->offset, model_mlp_part_params(mine[i]->part),
                       mine[i]->count * sizeof *params);
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
