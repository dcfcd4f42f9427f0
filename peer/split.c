/* Split learning on the peer (peer/local.h, peer_trainer_run_split): the
 * layers below the cut (and, U-shaped, the classifier layer and the loss)
 * train here on the peer's own images; the rest of the model answers over
 * the network. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/split_wire.h"
#include "model/mlp_io.h"
#include "model/mlp_part.h"
#include "peer/local.h"
#include "peer/nopeek.h"
#include "peer/train_internal.h"
#include "peer/ui.h"

/* Reply bodies are a batch's gradient or output and a header. */
#define SPLIT_REPLY_CAP (SPLIT_WIRE_MAX_VALUES * sizeof(float) + 65536)
#define SPLIT_IDLE_S 60
/* Most tensors a slice of the model has (its layers' weights and biases). */
#define SLICE_TENSORS (2 * MODEL_MLP_MAX_LAYERS)

/* The peer's layers of one kind: a part of the model and where its
 * parameters lie in the flat vector. */
typedef struct slice {
    model_mlp_part *part;
    size_t offset, count;
    int first, last; /* layers [first, last) */
} slice;

/* Buffers of one split task, freed together. */
typedef struct split_bufs {
    slice lower, head;  /* head.part NULL unless U-shaped */
    int q, h;           /* widths at the cut and of the coordinator's output */
    float *dz;          /* [B, q] */
    float *y, *dy;      /* [B, h], U-shaped only */
    peer_nopeek nopeek; /* set up when alpha > 0 */
    double dcor;        /* the last batch's dCor(X, Z) */
    vl_buf req;
} split_bufs;

static void bufs_free(split_bufs *b) {
    model_mlp_part_free(b->lower.part);
    model_mlp_part_free(b->head.part);
    free(b->dz);
    free(b->y);
    free(b->dy);
    peer_nopeek_free(&b->nopeek);
    vl_buf_free(&b->req);
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
static int post(peer_http *http, peer_response *rs, const char *target, const vl_buf *body,
                const char *name, int B, int width, float *out, double *loss, vl_error *err) {
    peer_request rq = {.method = "POST",
                       .target = target,
                       .content_type = "application/octet-stream",
                       .body = body->data,
                       .body_len = body->len,
                       .cap = SPLIT_REPLY_CAP,
                       .idle_s = SPLIT_IDLE_S};
    int rc = peer_http_do(http, &rq, rs, err);
    if (rc) return rc;
    if (rs->status != 200) {
        vl_error e = {0};
        peer_refusal(&e, "split learning refused", rs->status, rs->body.data, rs->body.len);
        return vl_fail(err, VL_ERANGE, "%s", e.msg);
    }
    rc = split_wire_decode_reply(rs->body.data, rs->body.len, name, B, width, out, loss, NULL, err);
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
    return rc ? rc : post(http, rs, "/v1/split/backward", &b->req, "dz", B, b->q, b->dz, NULL, err);
}

/* A GPU failure under --device auto moves the trainer to the CPU for
 * good, as for other tasks; with --device cuda it fails the task. */
static int gpu_lost(peer_trainer *t, split_bufs *b, const vl_error *e, vl_error *err) {
    if (!t->gpu_fallback) return vl_fail(err, e->code ? e->code : VL_ERR, "GPU: %s", e->msg);
    vl_log_warn("GPU: %s; training on the CPU from now on", e->msg);
    t->device = PEER_DEVICE_CPU;
    peer_nopeek_to_cpu(&b->nopeek);
    return VL_OK;
}

/* NoPeek's term for the batch, added into dz. */
static int nopeek(peer_trainer *t, split_bufs *b, const float *x, const float *z, float alpha,
                  float *dz, double *dcor, vl_error *err) {
    vl_error e = {0};
    int rc = peer_nopeek_add(&b->nopeek, x, z, alpha, dz, dcor, &e);
    if (!rc) return VL_OK;
    if (!b->nopeek.on_gpu) return vl_fail(err, rc, "%s", e.msg);
    if ((rc = gpu_lost(t, b, &e, err))) return rc;
    return peer_nopeek_add(&b->nopeek, x, z, alpha, dz, dcor, err);
}

/* What a task's steps add up to. */
typedef struct tally {
    peer_selsync ss;
    double sum, dcor_sum;
    int steps;
    int stop; /* SelSync says the task has done enough */
} tally;

/* The rest of a step once the gradient at the cut is in dz (for the batch
 * x whose activations, by the peer's layers as they are now, are z):
 * NoPeek's term, the backward pass, clipping, the optimizer's step on the
 * peer's layers, and the step's figures. */
static int learn_grads(peer_trainer *t, const peer_task *k, split_bufs *b, const float *x,
                       const float *z, float *dz, vl_error *err) {
    int rc;
    b->dcor = 0;
    if (k->split_alpha > 0 && (rc = nopeek(t, b, x, z, (float)k->split_alpha, dz, &b->dcor, err)))
        return rc;
    return model_mlp_part_backward(b->lower.part, dz, NULL, err);
}

static int learn_step(peer_trainer *t, const peer_task *k, split_bufs *b, float loss,
                      double step_t0, tally *ty, peer_train_result *res, vl_error *err) {
    int step = ty->steps + 1, rc;
    double dcor = b->dcor;
    double g2 = clip_slices(b, k->grad_clip);
    if (!isfinite(g2)) return peer_trainer_diverged(t, err, "the gradient norm", g2, step);
    long before = k->sgd ? t->sgd.step : t->opt.step;
    rc = slice_step(t, k, &b->lower, before, err);
    if (!rc && b->head.part) rc = slice_step(t, k, &b->head, before, err);
    if (rc) return rc;
    if (k->sgd)
        t->sgd.step = before + 1;
    else
        t->opt.step = before + 1;
    ty->steps = step;
    ty->sum += loss;
    ty->dcor_sum += dcor;
    if (step == 1) res->first_loss = loss;
    res->last_loss = loss;
    if ((rc = peer_trainer_pace(t, step_t0, err))) return rc;
    peer_ui_step(step, loss);
    double change = peer_selsync_feed(&ty->ss, g2);
    ty->stop = step >= k->h_min && change >= k->selsync_delta;
    return VL_OK;
}

static int learn(peer_trainer *t, const peer_task *k, split_bufs *b, const float *x, const float *z,
                 float *dz, float loss, double step_t0, tally *ty, peer_train_result *res,
                 vl_error *err) {
    int rc = learn_grads(t, k, b, x, z, dz, err);
    return rc ? rc : learn_step(t, k, b, loss, step_t0, ty, res, err);
}

/* One batch at a time: each step waits for its answer. */
static int steps_in_turn(peer_trainer *t, const peer_task *k, peer_local *l, peer_http *http,
                         peer_response *rs, int64_t peer_id, split_bufs *b, tally *ty,
                         peer_train_result *res, vl_error *err) {
    const int B = k->batch;
    vl_rng r;
    vl_rng_seed(&r, k->seed);
    int rc;
    while (ty->steps < k->steps && !ty->stop) {
        if (peer_stop_requested()) return vl_fail(err, PEER_ESTOPPED, "stopped during training");
        double step_t0 = vl_clock_mono_s();
        if ((rc = peer_local_batch(l, B, &r, err))) return rc;
        model_mlp_part_zero_grad(b->lower.part);
        if (b->head.part) model_mlp_part_zero_grad(b->head.part);
        if ((rc = model_mlp_part_forward(b->lower.part, l->x, B, err))) return rc;
        const float *z = model_mlp_part_output(b->lower.part);
        float loss = 0;
        if ((rc = exchange(http, rs, k, peer_id, b, z, l->y, &loss, err))) return rc;
        if ((rc = learn(t, k, b, l->x, z, b->dz, loss, step_t0, ty, res, err))) return rc;
    }
    return VL_OK;
}

/* ---- batches in flight -------------------------------------------------------- */

/* One batch on its way, on a connection of its own. Its images, labels
 * and the peer's layers as they were when it went out stay here until its
 * gradient is back; the forward pass is then redone with those layers
 * (cheaper than keeping every batch's activations), so the backward pass
 * gives the true gradient at the point the coordinator answered for, and
 * that gradient steps the layers as they are now, as a delayed SGD step
 * does. Redoing it with the current layers instead pairs dz with
 * activations it was not computed for, and cost more accuracy in
 * bench/split_flight.sh. */
typedef struct flight {
    peer_http *http; /* owned, except the first flight's: the task's */
    peer_response rs;
    vl_buf req;
    float *x, *dz; /* [B, p], [B, q] */
    float *w;      /* the peer's layers when the batch was sent */
    int *y;        /* [B] */
    int B, q;
    double loss;
    int rc;
    vl_error err;
    pthread_t th;
    int running;
} flight;

static void *fly(void *arg) {
    flight *f = arg;
    f->rc = post(f->http, &f->rs, "/v1/split/forward", &f->req, "dz", f->B, f->q, f->dz, &f->loss,
                 &f->err);
    return NULL;
}

static void land(flight *f) {
    if (f->running) pthread_join(f->th, NULL);
    f->running = 0;
}

static void flights_free(flight *f, int n, const peer_http *task_http) {
    for (int i = 0; i < n; i++) {
        land(&f[i]);
        if (f[i].http != task_http) peer_http_close(f[i].http);
        peer_response_free(&f[i].rs);
        vl_buf_free(&f[i].req);
        free(f[i].x);
        free(f[i].dz);
        free(f[i].w);
        free(f[i].y);
    }
}

static int flights_make(flight *f, int n, peer_http *http, int B, int p, int q, size_t nw,
                        vl_error *err) {
    for (int i = 0; i < n; i++) {
        f[i].B = B;
        f[i].q = q;
        peer_response_init(&f[i].rs);
        vl_buf_init(&f[i].req, SPLIT_WIRE_MAX_VALUES * sizeof(float) * 2 + 65536);
        f[i].x = malloc((size_t)B * (size_t)p * sizeof *f[i].x);
        f[i].dz = malloc((size_t)B * (size_t)q * sizeof *f[i].dz);
        f[i].y = malloc((size_t)B * sizeof *f[i].y);
        f[i].w = malloc(nw * sizeof *f[i].w);
        if (!f[i].x || !f[i].dz || !f[i].y || !f[i].w)
            return vl_fail(err, VL_ENOMEM, "out of memory for batches in flight");
        if (i == 0)
            f[i].http = http;
        else {
            int rc = peer_http_clone(http, &f[i].http, err);
            if (rc) return rc;
        }
    }
    return VL_OK;
}

/* Up to k->split_in_flight batches at the coordinator at once (a plain
 * split): the next batches go out while the oldest one's answer is on
 * its way back, and answers are used in the order their batches went.
 * A batch's gradient is taken at the peer's layers as they were when it
 * was sent, at most in_flight - 1 steps behind the ones it steps. When
 * SelSync ends the task, answers still on their way are waited for and
 * left unused. */
static int steps_in_flight(peer_trainer *t, const peer_task *k, peer_local *l, peer_http *http,
                           int64_t peer_id, split_bufs *b, tally *ty, peer_train_result *res,
                           vl_error *err) {
    const int B = k->batch, D = k->split_in_flight, p = model_mlp_part_in_dim(b->lower.part);
    flight f[SPLIT_WIRE_MAX_IN_FLIGHT];
    memset(f, 0, sizeof f);
    float *w = model_mlp_part_params(b->lower.part);
    const size_t nw = model_mlp_part_num_params(b->lower.part);
    float *now = malloc(nw * sizeof *now);
    int rc = now ? flights_make(f, D, http, B, p, b->q, nw, err)
                 : vl_fail(err, VL_ENOMEM, "out of memory for batches in flight");
    vl_rng r;
    vl_rng_seed(&r, k->seed);
    int sent = 0;
    while (!rc && ty->steps < k->steps && !ty->stop) {
        while (!rc && sent < k->steps && sent - ty->steps < D) {
            if (peer_stop_requested()) {
                rc = vl_fail(err, PEER_ESTOPPED, "stopped during training");
                break;
            }
            flight *g = &f[sent % D];
            if ((rc = peer_local_batch(l, B, &r, err))) break;
            memcpy(g->x, l->x, (size_t)B * (size_t)p * sizeof *g->x);
            memcpy(g->y, l->y, (size_t)B * sizeof *g->y);
            memcpy(g->w, w, nw * sizeof *w);
            if ((rc = model_mlp_part_forward(b->lower.part, g->x, B, err))) break;
            g->req.len = 0;
            rc = split_wire_encode_forward(k->run, peer_id, k->task_id,
                                           model_mlp_part_output(b->lower.part), B, b->q,
                                           k->split_dtype, g->y, &g->req, err);
            if (rc) break;
            g->running = pthread_create(&g->th, NULL, fly, g) == 0;
            if (!g->running) fly(g); /* no thread to spare: wait for this one */
            sent++;
        }
        if (rc) break;
        flight *g = &f[ty->steps % D];
        land(g);
        double step_t0 = vl_clock_mono_s();
        if (g->rc) {
            rc = vl_fail(err, g->rc, "%s", g->err.msg);
            break;
        }
        if (!isfinite(g->loss)) {
            rc = vl_fail(err, VL_ERANGE, "split reply without its loss");
            break;
        }
        /* The gradient at the layers the batch was sent with, applied to
         * the layers as they are now. */
        memcpy(now, w, nw * sizeof *w);
        memcpy(w, g->w, nw * sizeof *w);
        model_mlp_part_zero_grad(b->lower.part);
        rc = model_mlp_part_forward(b->lower.part, g->x, B, err);
        if (!rc) rc = learn_grads(t, k, b, g->x, model_mlp_part_output(b->lower.part), g->dz, err);
        memcpy(w, now, nw * sizeof *w);
        if (!rc) rc = learn_step(t, k, b, (float)g->loss, step_t0, ty, res, err);
    }
    flights_free(f, D, http);
    free(now);
    return rc;
}

static int split_steps(peer_trainer *t, const peer_task *k, peer_local *l, peer_http *http,
                       peer_response *rs, int64_t peer_id, split_bufs *b, peer_train_result *res,
                       vl_error *err) {
    tally ty;
    memset(&ty, 0, sizeof ty);
    int rc = k->split_in_flight > 1 && !k->split_u
                 ? steps_in_flight(t, k, l, http, peer_id, b, &ty, res, err)
                 : steps_in_turn(t, k, l, http, rs, peer_id, b, &ty, res, err);
    if (rc) return rc;
    res->steps = ty.steps;
    res->mean_loss = ty.sum / ty.steps;
    if (k->split_alpha > 0)
        vl_log_debug("task %lld: mean dCor(X, Z) %.4f over %d batches", (long long)k->task_id,
                     ty.dcor_sum / ty.steps, ty.steps);
    return VL_OK;
}

/* The task's slices and buffers. */
static int prepare(peer_trainer *t, const model_mlp_config *c, const peer_task *k, split_bufs *b,
                   vl_error *err) {
    int rc = slice_make(c, 0, k->split_cut, &b->lower, err);
    const int layers = model_mlp_config_num_layers(c);
    if (!rc && k->split_u) rc = slice_make(c, layers - 1, layers, &b->head, err);
    if (rc) return rc;
    b->q = model_mlp_part_out_dim(b->lower.part);
    b->h = k->split_u ? model_mlp_part_in_dim(b->head.part) : 0;
    b->dz = malloc((size_t)k->batch * (size_t)b->q * sizeof *b->dz);
    if (k->split_u) {
        b->y = malloc((size_t)k->batch * (size_t)b->h * sizeof *b->y);
        b->dy = malloc((size_t)k->batch * (size_t)b->h * sizeof *b->dy);
    }
    if (!b->dz || (k->split_u && (!b->y || !b->dy)))
        return vl_fail(err, VL_ENOMEM, "out of memory for a split task");
    if (k->split_alpha <= 0) return VL_OK;
    int gpu = t->device == PEER_DEVICE_CUDA;
    vl_error e = {0};
    rc = peer_nopeek_init(&b->nopeek, gpu, k->batch, c->in_dim, b->q, &e);
    if (rc && gpu) {
        if ((rc = gpu_lost(t, b, &e, err))) return rc;
        rc = peer_nopeek_init(&b->nopeek, 0, k->batch, c->in_dim, b->q, &e);
    }
    return rc ? vl_fail(err, rc, "%s", e.msg) : VL_OK;
}

int peer_trainer_run_split(peer_trainer *t, const peer_task *k, peer_local *l, peer_http *http,
                           peer_response *rs, int64_t peer_id, peer_train_result *res,
                           vl_error *err) {
    memset(res, 0, sizeof *res);
    int rc = peer_local_check(t, k, l, err);
    if (rc) return rc;
    model_mlp_config c = model_mlp_config_get(t->mlp);
    const int layers = model_mlp_config_num_layers(&c);
    int top = k->split_u ? layers - 2 : layers - 1;
    if (k->split_cut < 1 || k->split_cut > top)
        return vl_fail(err, VL_EINVAL, "task: split cut %d outside 1..%d", k->split_cut, top);
    if (k->split_alpha > 0 && k->batch < 2)
        return vl_fail(err, VL_EINVAL, "task: NoPeek needs batches of at least 2 images");
    if ((rc = peer_local_reserve(l, k->batch, c.in_dim, err))) return rc;
    if ((rc = peer_trainer_prepare(t, k, err))) return rc;
    if ((rc = peer_local_accuracy(t, k, l, res, err))) return rc;
    split_bufs b;
    memset(&b, 0, sizeof b);
    vl_buf_init(&b.req, SPLIT_WIRE_MAX_VALUES * sizeof(float) * 2 + 65536);
    rc = prepare(t, &c, k, &b, err);
    double t0 = vl_clock_mono_s();
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
    res->seconds = vl_clock_mono_s() - t0;
    return VL_OK;
}
