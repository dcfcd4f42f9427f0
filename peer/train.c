/* Local training of one task: restore the base parameters, run up to H
 * AdamW steps on batches drawn from the task's data range with the task's
 * seed (so a task is reproducible on any machine), clip the global gradient
 * norm, stop early when SelSync says the gradient has shifted, and leave
 * the pseudo-gradient delta = theta_base - theta_local for the upload. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/mlp_io.h"
#include "peer/local.h"
#include "peer/train_internal.h"
#include "peer/peer.h"
#include "peer/ui.h"

/* Seed of the weights peer_trainer_init_model draws; tests rely on it being
 * fixed, the coordinator's models always come from a file. */
#define LOCAL_INIT_SEED 1337

void peer_trainer_init(peer_trainer *t) {
    memset(t, 0, sizeof *t);
    t->base_version = -1;
    t->kfac_factors = -1;
}

void peer_trainer_free(peer_trainer *t) {
    peer_gpu_free(t);
    model_gpt_free(t->gpt);
    model_mlp_free(t->mlp);
    free(t->base);
    free(t->delta);
    model_adamw_free(&t->opt);
    model_sgd_free(&t->sgd);
    model_kfac_gpt_free(&t->kfac);
    free(t->inputs);
    free(t->targets);
    free(t->residual);
    free(t->sel_idx);
    free(t->sel_val);
    peer_trainer_init(t);
}

static int cfg_equal(const model_gpt_config *a, const model_gpt_config *b) {
    return a->vocab_size == b->vocab_size && a->block_size == b->block_size &&
           a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd;
}

void peer_trainer_drop_model(peer_trainer *t) {
    peer_gpu_free(t); /* a copy of the model being replaced */
    model_gpt_free(t->gpt);
    t->gpt = NULL;
    memset(&t->cfg, 0, sizeof t->cfg);
    model_mlp_free(t->mlp);
    t->mlp = NULL;
    free(t->base);
    free(t->delta);
    t->base = t->delta = NULL;
    model_adamw_free(&t->opt);
    t->have_opt = 0;
    model_sgd_free(&t->sgd);
    t->have_sgd = 0;
    model_kfac_gpt_free(&t->kfac);
    t->have_kfac = 0;
    t->kfac_factors = -1;
    /* The residual belongs to the old parameter layout. */
    free(t->residual);
    t->residual = NULL;
    t->sel_nnz = 0;
}

/* Makes g (already holding the new base weights) the trainer's model.
 * When g is a new model it replaces the old one, and the optimizer state,
 * which belongs to the old shape, is dropped. Fails only before changing
 * anything (allocation), in which case the caller still owns g. */
static int adopt(peer_trainer *t, model_gpt *g, int64_t version, vl_error *err) {
    size_t n = model_gpt_num_params(g);
    if (g != t->gpt) {
        float *base = malloc(n * sizeof *base);
        float *delta = malloc(n * sizeof *delta);
        if (!base || !delta) {
            free(base);
            free(delta);
            return vl_fail(err, VL_ENOMEM, "out of memory for a model of %zu parameters", n);
        }
        peer_trainer_drop_model(t);
        t->gpt = g;
        t->cfg = model_gpt_config_get(g);
        t->n_params = n;
        t->base = base;
        t->delta = delta;
    }
    memcpy(t->base, model_gpt_params(g), n * sizeof *t->base);
    t->base_version = version;
    return VL_OK;
}

/* Frees the trainer's model and everything shaped after it; the trainer
 * then holds the new model. */
static void replace_model(peer_trainer *t, model_mlp *m, float *base, float *delta) {
    peer_trainer_drop_model(t);
    t->mlp = m;
    t->n_params = model_mlp_num_params(m);
    t->base = base;
    t->delta = delta;
}

/* Installs a classifier's model file f (its `model` metadata js already
 * seen to be an MLP's) as the base of version, replacing a model of
 * another shape or kind and the optimizer state that went with it. On
 * failure the trainer is unchanged. */
static int load_mlp(peer_trainer *t, const st_file *f, const char *js, int64_t version,
                    vl_error *err) {
    model_mlp_config cfg;
    int rc = model_mlp_config_parse(js, strlen(js), &cfg, err);
    if (rc) return rc;
    if (t->mlp) {
        model_mlp_config have = model_mlp_config_get(t->mlp);
        if (model_mlp_config_equal(&have, &cfg)) {
            if ((rc = model_mlp_load_safetensors(t->mlp, f, err))) return rc;
            memcpy(t->base, model_mlp_params(t->mlp), t->n_params * sizeof *t->base);
            t->base_version = version;
            return VL_OK;
        }
    }
    /* The configuration only claims a size; the file's tensors must hold
     * it before a model that large is allocated. */
    uint64_t have = 0;
    for (int i = 0; i < f->ntensors; i++) have += f->tensors[i].numel;
    if (have != (uint64_t)model_mlp_config_num_params(&cfg))
        return vl_fail(err, VL_EINVAL, "the file holds %llu values; its configuration needs %zu",
                       (unsigned long long)have, model_mlp_config_num_params(&cfg));
    model_mlp *m = NULL;
    if ((rc = model_mlp_create(&cfg, &m, err))) return rc;
    if ((rc = model_mlp_load_safetensors(m, f, err))) {
        model_mlp_free(m);
        return rc;
    }
    size_t n = model_mlp_num_params(m);
    float *base = malloc(n * sizeof *base), *delta = malloc(n * sizeof *delta);
    if (!base || !delta) {
        free(base);
        free(delta);
        model_mlp_free(m);
        return vl_fail(err, VL_ENOMEM, "out of memory for a model of %zu parameters", n);
    }
    replace_model(t, m, base, delta);
    memcpy(t->base, model_mlp_params(m), n * sizeof *t->base);
    t->base_version = version;
    return VL_OK;
}

/* The configuration a model file describes: the protocol's `model`
 * metadata (JSON), or else the per-field keys checkpoints carry. */
static int file_config(const st_file *f, model_gpt_config *cfg, vl_error *err) {
    const char *js = st_meta_get(f, "model");
    int rc =
        js ? peer_model_config_parse(js, cfg, err) : model_gpt_config_from_safetensors(f, cfg, err);
    if (rc) return rc;
    return model_gpt_config_validate(cfg, err);
}

static int load_file(peer_trainer *t, const st_file *f, const char *run, int64_t version,
                     vl_error *err) {
    const char *mrun = st_meta_get(f, "run");
    if (run && (!mrun || strcmp(mrun, run) != 0))
        return vl_fail(err, VL_EINVAL, "metadata run '%s' is not the task's run '%s'",
                       mrun ? mrun : "(none)", run);
    const char *mver = st_meta_get(f, "version");
    int64_t v;
    if (!mver || vl_parse_i64(mver, 0, INT64_MAX, &v) != VL_OK)
        return vl_fail(err, VL_EINVAL, "metadata lacks a valid 'version'");
    if (v != version) return vl_fail(err, VL_EINVAL, "file holds version %lld", (long long)v);
    const char *js = st_meta_get(f, "model");
    if (js && model_mlp_config_is_mlp(js, strlen(js))) return load_mlp(t, f, js, version, err);
    model_gpt_config cfg;
    int rc = file_config(f, &cfg, err);
    if (rc) return rc;
    /* The configuration only claims a size; the file's tensors must hold
     * it before a model that large is allocated. */
    uint64_t have = 0;
    for (int i = 0; i < f->ntensors; i++) have += f->tensors[i].numel;
    size_t want = model_gpt_config_num_params(&cfg);
    if (have != (uint64_t)want)
        return vl_fail(err, VL_EINVAL, "the file holds %llu values; its configuration needs %zu",
                       (unsigned long long)have, want);
    if (t->gpt && cfg_equal(&cfg, &t->cfg)) {
        rc = model_gpt_load_safetensors(t->gpt, f, err);
        return rc ? rc : adopt(t, t->gpt, version, err);
    }
    model_gpt *g = NULL;
    rc = model_gpt_create(&cfg, &g, err);
    if (!rc) rc = model_gpt_load_safetensors(g, f, err);
    if (!rc) rc = adopt(t, g, version, err);
    if (rc) model_gpt_free(g);
    return rc;
}

int peer_trainer_load(peer_trainer *t, const uint8_t *bytes, size_t len, const char *run,
                      int64_t version, vl_error *err) {
    vl_error e = {0};
    st_file f;
    int rc = st_parse(bytes, len, &f, &e);
    if (rc) return vl_fail(err, VL_EINVAL, "model version %lld: %s", (long long)version, e.msg);
    rc = load_file(t, &f, run, version, &e);
    st_free(&f);
    if (rc) return vl_fail(err, rc, "model version %lld: %s", (long long)version, e.msg);
    return VL_OK;
}

int peer_trainer_init_model(peer_trainer *t, const model_gpt_config *cfg, int64_t version,
                            vl_error *err) {
    model_gpt *g = NULL;
    int rc = model_gpt_create(cfg, &g, err);
    if (rc) return rc;
    model_gpt_init_weights(g, LOCAL_INIT_SEED);
    rc = adopt(t, g, version, err);
    if (rc) model_gpt_free(g);
    return rc;
}

static int ensure_tokens(peer_trainer *t, size_t n, vl_error *err) {
    if (n <= t->tokens_alloc) return VL_OK;
    int *in = malloc(n * sizeof *in);
    int *tg = malloc(n * sizeof *tg);
    if (!in || !tg) {
        free(in);
        free(tg);
        return vl_fail(err, VL_ENOMEM, "out of memory for a batch of %zu tokens", n);
    }
    free(t->inputs);
    free(t->targets);
    t->inputs = in;
    t->targets = tg;
    t->tokens_alloc = n;
    return VL_OK;
}

/* The optimizer state carries over from task to task (the inner optimizer
 * of DiLoCo-style training); only the hyper-parameters follow the task. A
 * run that switches optimizer drops the others' state, which means
 * nothing to the new one. */
static void drop_others(peer_trainer *t, const peer_task *k) {
    if (t->have_opt && (k->sgd || k->kfac)) {
        model_adamw_free(&t->opt);
        t->have_opt = 0;
    }
    if (t->have_sgd && !k->sgd) {
        model_sgd_free(&t->sgd);
        t->have_sgd = 0;
    }
    if (t->have_kfac && !k->kfac) {
        model_kfac_gpt_free(&t->kfac);
        t->have_kfac = 0;
        t->kfac_factors = -1;
    }
}

static int prepare_kfac(peer_trainer *t, const peer_task *k, vl_error *err) {
    model_kfac_gpt_config c = {.lr = (float)k->lr,
                               .momentum = (float)k->momentum,
                               .damping = (float)k->kfac_damping,
                               .decay = (float)k->kfac_decay,
                               .inverse_every = k->kfac_inverse_every,
                               .kl_clip = (float)k->kfac_kl_clip,
                               .weight_decay = (float)k->weight_decay};
    if (t->have_kfac) {
        int rc = model_kfac_gpt_config_validate(&c, err);
        if (!rc) t->kfac.cfg = c;
        return rc;
    }
    int rc = model_kfac_gpt_init(&t->kfac, t->gpt, &c, err);
    if (rc) return rc;
    t->have_kfac = 1;
    t->kfac_factors = -1;
    return VL_OK;
}

int peer_trainer_prepare(peer_trainer *t, const peer_task *k, vl_error *err) {
    if (!t->gpt && !t->mlp) return vl_fail(err, VL_EINVAL, "no model to train");
    if (t->mlp && k->kfac)
        return vl_fail(err, VL_EINVAL, "K-FAC tasks are for GPT models; this one is an mlp");
    drop_others(t, k);
    if (k->kfac) return prepare_kfac(t, k, err);
    if (k->sgd) {
        if (!t->have_sgd) {
            int rc = model_sgd_init(&t->sgd, t->n_params, (float)k->lr, (float)k->momentum,
                                    (float)k->weight_decay, k->nesterov, err);
            if (rc) return rc;
            t->have_sgd = 1;
            return VL_OK;
        }
        t->sgd.lr = (float)k->lr;
        t->sgd.momentum = (float)k->momentum;
        t->sgd.weight_decay = (float)k->weight_decay;
        t->sgd.nesterov = k->nesterov;
        return VL_OK;
    }
    if (!t->have_opt) {
        int rc = model_adamw_init(&t->opt, t->n_params, (float)k->lr, (float)k->beta1,
                                  (float)k->beta2, (float)k->eps, (float)k->weight_decay, err);
        if (rc) return rc;
        t->have_opt = 1;
        return VL_OK;
    }
    t->opt.lr = (float)k->lr;
    t->opt.beta1 = (float)k->beta1;
    t->opt.beta2 = (float)k->beta2;
    t->opt.eps = (float)k->eps;
    t->opt.weight_decay = (float)k->weight_decay;
    return VL_OK;
}

/* The weight 0.1 of the newest norm keeps one noisy batch from triggering
 * an early upload. */
double peer_selsync_feed(peer_selsync *s, double g2) {
    double prev = s->smoothed;
    s->steps++;
    s->smoothed = s->steps == 1 ? g2 : (1 - PEER_SELSYNC_EWMA) * prev + PEER_SELSYNC_EWMA * g2;
    return (s->steps > 1 && prev > 0) ? fabs(s->smoothed - prev) / prev : 0;
}

double peer_clip_grads(float *g, size_t n, double max_norm) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    if (max_norm > 0 && isfinite(s) && s > max_norm * max_norm) {
        float scale = (float)(max_norm / sqrt(s));
        for (size_t i = 0; i < n; i++) g[i] *= scale;
    }
    return s;
}

int peer_trainer_diverged(peer_trainer *t, vl_error *err, const char *what, double x, int step) {
    model_adamw_reset(&t->opt);
    model_sgd_reset(&t->sgd);
    model_kfac_gpt_reset(&t->kfac);
    return vl_fail(err, VL_ERANGE, "training diverged: %s is %g at step %d", what, x, step);
}

/* Where a task's batches come from: a byte range in memory, or a token
 * shard on disk. Both draw the same offsets for a seed. */
typedef struct task_data {
    const uint8_t *bytes;
    size_t len;
    model_shard *shard; /* set for token tasks */
} task_data;

static int sample(const task_data *d, int B, int T, vl_rng *r, int *in, int *tg, vl_error *err) {
    return d->shard ? model_shard_sample(d->shard, B, T, r, in, tg, err)
                    : model_data_sample(d->bytes, d->len, B, T, r, in, tg, err);
}

/* A GPU failure under --device auto: the trainer moves to the CPU for
 * good and the caller redoes the work there. With --device cuda the task
 * fails. */
#define GPU_FELL_BACK 1
static int gpu_failed(peer_trainer *t, int rc, const vl_error *e, vl_error *err) {
    if (!t->gpu_fallback) return vl_fail(err, rc, "GPU: %s", e->msg);
    vl_log_warn("GPU: %s; training on the CPU from now on", e->msg);
    t->device = PEER_DEVICE_CPU;
    return GPU_FELL_BACK;
}

/* How a task's steps run: all on the CPU, forward and backward on the GPU
 * with the optimizer on the host, or wholly on the GPU. */
typedef enum step_mode { ON_CPU, GPU_GRADS, ON_GPU } step_mode;

static step_mode mode_for(const peer_trainer *t, const peer_task *task) {
    if (t->device != PEER_DEVICE_CUDA || task->kfac) return ON_CPU;
    return task->sgd ? GPU_GRADS : ON_GPU;
}

/* One step on the host's model: loss and gradients (the forward and
 * backward on the GPU in GPU_GRADS mode, falling back to the CPU for the
 * rest of the task when allowed), clipping, the optimizer. */
static int host_step(peer_trainer *t, const peer_task *task, step_mode *mode, int B, int T,
                     int step, float *loss, double *g2, vl_error *err) {
    int rc = VL_OK;
    if (*mode == GPU_GRADS) {
        vl_error e = {0};
        rc = peer_gpu_grads(t, t->inputs, t->targets, B, T, loss, &e);
        if (rc && (rc = gpu_failed(t, rc, &e, err)) != GPU_FELL_BACK) return rc;
        /* The host's state is intact (the GPU only computed gradients):
         * this step, and the rest, go on on the CPU. */
        if (rc == GPU_FELL_BACK) *mode = ON_CPU;
        rc = VL_OK;
    }
    if (*mode == ON_CPU) {
        rc = model_gpt_zero_grad(t->gpt, err);
        if (!rc) rc = model_gpt_forward(t->gpt, t->inputs, t->targets, B, T, loss, err);
        if (rc) return rc;
    }
    if (!isfinite(*loss)) return peer_trainer_diverged(t, err, "the loss", *loss, step);
    if (*mode == ON_CPU)
        rc = task->kfac ? model_kfac_gpt_backward(&t->kfac, t->gpt, err)
                        : model_gpt_backward(t->gpt, err);
    if (rc == VL_ERANGE)
        return peer_trainer_diverged(t, err, "a layer's input or gradient", NAN, step);
    if (rc) return rc;
    *g2 = peer_clip_grads(model_gpt_grads(t->gpt), t->n_params, task->grad_clip);
    if (!isfinite(*g2)) return peer_trainer_diverged(t, err, "the gradient norm", *g2, step);
    rc = task->kfac  ? model_kfac_gpt_step(&t->kfac, t->gpt, err)
         : task->sgd ? model_sgd_step_gpt(&t->sgd, t->gpt, err)
                     : model_adamw_step(&t->opt, t->gpt, err);
    if (rc == VL_ERANGE) return peer_trainer_diverged(t, err, "the K-FAC step", NAN, step);
    return rc;
}

/* One step wholly on the GPU; a device failure is GPU_FELL_BACK (after
 * which the task starts over on the CPU) or the task's error. */
static int gpu_step(peer_trainer *t, const peer_task *task, int B, int T, int step, float *loss,
                    double *g2, vl_error *err) {
    vl_error e = {0};
    int rc = peer_gpu_step(t, B, T, task->grad_clip, loss, g2, &e);
    if (rc) return gpu_failed(t, rc, &e, err);
    if (!isfinite(*loss)) return peer_trainer_diverged(t, err, "the loss", *loss, step);
    if (!isfinite(*g2)) return peer_trainer_diverged(t, err, "the gradient norm", *g2, step);
    return VL_OK;
}

int peer_trainer_pace(peer_trainer *t, double step_t0, vl_error *err) {
    if (t->step_delay_s > 0 && peer_sleep(t->step_delay_s))
        return vl_fail(err, PEER_ESTOPPED, "stopped during training");
    /* Proportional to the step's own time, so a slowed peer stays the
     * same factor slower however busy the machine is. */
    if (t->slowdown > 1 && peer_sleep((t->slowdown - 1) * (vl_clock_mono_s() - step_t0)))
        return vl_fail(err, PEER_ESTOPPED, "stopped during training");
    return VL_OK;
}

/* The task's steps from its base, on mode; GPU_FELL_BACK when an ON_GPU
 * task has to start over on the CPU (the host's model and optimizer are
 * still as the task found them). */
static int train_steps(peer_trainer *t, const peer_task *task, const task_data *data,
                       step_mode mode, peer_train_result *res, vl_error *err) {
    const int B = task->batch, T = task->context;
    double sum = 0;
    t->gpu_delta = 0; /* whatever delta the device holds is an older task's */
    float *params = model_gpt_params(t->gpt);
    memcpy(params, t->base, t->n_params * sizeof *params);
    if (mode == ON_GPU) {
        vl_error e = {0};
        int rc = peer_gpu_begin(t, &e);
        if (rc) return gpu_failed(t, rc, &e, err);
    }
    vl_rng r;
    vl_rng_seed(&r, task->seed);
    peer_selsync ss = {0};
    int step = 0;
    while (step < task->steps) {
        if (peer_stop_requested()) return vl_fail(err, PEER_ESTOPPED, "stopped during training");
        float loss = 0;
        double g2 = 0, step_t0 = vl_clock_mono_s();
        int rc = sample(data, B, T, &r, t->inputs, t->targets, err);
        if (rc) return rc;
        step++;
        rc = mode == ON_GPU ? gpu_step(t, task, B, T, step, &loss, &g2, err)
                            : host_step(t, task, &mode, B, T, step, &loss, &g2, err);
        if (rc) return rc;
        sum += loss;
        if (step == 1) res->first_loss = loss;
        res->last_loss = loss;
        if ((rc = peer_trainer_pace(t, step_t0, err))) return rc;
        peer_ui_step(step, loss);

        double change = peer_selsync_feed(&ss, g2);
        if (step >= task->h_min && change >= task->selsync_delta) break;
    }
    if (mode == ON_GPU) {
        vl_error e = {0};
        int rc = peer_gpu_finish(t, &e);
        if (rc) return gpu_failed(t, rc, &e, err);
    }
    res->steps = step;
    res->mean_loss = sum / step;
    return VL_OK;
}

static int run_task(peer_trainer *t, const peer_task *task, const task_data *data,
                    peer_train_result *res, vl_error *err) {
    memset(res, 0, sizeof *res);
    if (!t->gpt) return vl_fail(err, VL_EINVAL, "no model to train");
    int rc = peer_task_check_model(task, &t->cfg, err);
    if (rc) return rc;
    const int B = task->batch, T = task->context;
    int64_t have = data->shard ? model_shard_tokens(data->shard) : (int64_t)data->len;
    if (have < (int64_t)T + 1)
        return vl_fail(err, VL_EINVAL, "task data has %lld %s; a sequence needs %d",
                       (long long)have, data->shard ? "tokens" : "bytes", T + 1);
    if ((rc = ensure_tokens(t, (size_t)B * (size_t)T, err))) return rc;
    if ((rc = peer_trainer_prepare(t, task, err))) return rc;
    /* Every task inverts afresh, so what it does depends only on the state
     * kept between tasks (and restored from trainer.st). */
    if (t->have_kfac) model_kfac_gpt_refresh(&t->kfac);

    double t0 = vl_clock_mono_s();
    rc = train_steps(t, task, data, mode_for(t, task), res, err);
    if (rc == GPU_FELL_BACK) {
        memset(res, 0, sizeof *res);
        rc = train_steps(t, task, data, ON_CPU, res, err);
    }
    if (rc) return rc;
    compress_dense_delta(t->base, model_gpt_params(t->gpt), t->delta, t->n_params);
    if (!compress_all_finite(t->delta, t->n_params))
        return peer_trainer_diverged(t, err, "a parameter", NAN, res->steps);
    res->tokens = (int64_t)res->steps * B * T;
    res->seconds = vl_clock_mono_s() - t0;
    return VL_OK;
}

int peer_trainer_run(peer_trainer *t, const peer_task *task, const uint8_t *data, size_t len,
                     peer_train_result *res, vl_error *err) {
    task_data d = {.bytes = data, .len = len};
    return run_task(t, task, &d, res, err);
}

int peer_trainer_run_shard(peer_trainer *t, const peer_task *task, model_shard *data,
                           peer_train_result *res, vl_error *err) {
    if (!data) return vl_fail(err, VL_EINVAL, "no token shard to train on");
    task_data d = {.shard = data};
    return run_task(t, task, &d, res, err);
}
