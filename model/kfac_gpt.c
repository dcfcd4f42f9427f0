/*
 * K-FAC as the GPT's inner optimiser (see model.h): one model_kfac_layer
 * per plain linear layer, fed by the backward pass's linear-layer hook,
 * and a step that preconditions those layers' gradients, clips the step
 * by its KL estimate and hands the result to SGD with momentum, which also
 * moves the parameters K-FAC does not cover.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt_internal.h"
#include "model/model.h"

/* The linear layers of a block in tensor-table order, and their names. */
static const int LAYER_KIND[4] = {GPT_QKV_W, GPT_ATTPROJ_W, GPT_FC_W, GPT_FCPROJ_W};
static const char *const LAYER_NAME[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};

model_kfac_gpt_config model_kfac_gpt_config_default(void) {
    return (model_kfac_gpt_config){.lr = 0.1f,
                                   .momentum = 0.0f,
                                   .damping = 1e-3f,
                                   .decay = 0.95f,
                                   .inverse_every = 1,
                                   .kl_clip = 1e-2f,
                                   .weight_decay = 0.0f};
}

int model_kfac_gpt_config_validate(const model_kfac_gpt_config *c, vl_error *err) {
    if (c == NULL) return vl_fail(err, VL_EINVAL, "kfac: no configuration");
    if (!(isfinite(c->lr) && c->lr > 0.0f))
        return vl_fail(err, VL_EINVAL, "kfac: lr %g must be finite and > 0", (double)c->lr);
    if (!(c->momentum >= 0.0f && c->momentum < 1.0f))
        return vl_fail(err, VL_EINVAL, "kfac: momentum %g must lie in [0, 1)", (double)c->momentum);
    if (!(isfinite(c->damping) && c->damping > 0.0f))
        return vl_fail(err, VL_EINVAL, "kfac: damping %g must be finite and > 0",
                       (double)c->damping);
    if (!(c->decay >= 0.0f && c->decay < 1.0f))
        return vl_fail(err, VL_EINVAL, "kfac: decay %g must lie in [0, 1)", (double)c->decay);
    if (c->inverse_every < 1 || c->inverse_every > 1000000)
        return vl_fail(err, VL_EINVAL, "kfac: inverse_every %d must lie in [1, 1000000]",
                       c->inverse_every);
    if (!(isfinite(c->kl_clip) && c->kl_clip >= 0.0f))
        return vl_fail(err, VL_EINVAL, "kfac: kl_clip %g must be finite and >= 0 (0: off)",
                       (double)c->kl_clip);
    if (!(isfinite(c->weight_decay) && c->weight_decay >= 0.0f))
        return vl_fail(err, VL_EINVAL, "kfac: weight decay %g must be finite and >= 0",
                       (double)c->weight_decay);
    return 0;
}

int model_gpt_kfac_layer_count(const model_gpt_config *cfg) {
    return cfg && cfg->n_layer > 0 && cfg->n_layer <= MODEL_MAX_LAYER ? 4 * cfg->n_layer : 0;
}

int model_gpt_kfac_layer(const model_gpt_config *cfg, int i, char *name, size_t cap, int *in,
                         int *out, vl_error *err) {
    int rc = model_gpt_config_validate(cfg, err);
    if (rc != 0) return rc;
    if (i < 0 || i >= 4 * cfg->n_layer)
        return vl_fail(err, VL_EINVAL, "kfac: layer %d of %d", i, 4 * cfg->n_layer);
    int C = cfg->n_embd, k = i % 4;
    static const int width_in[4] = {1, 1, 1, 4}, width_out[4] = {3, 1, 4, 1};
    if (in) *in = width_in[k] * C;
    if (out) *out = width_out[k] * C;
    if (name) {
        int n = snprintf(name, cap, "h.%d.%s", i / 4, LAYER_NAME[k]);
        if (n < 0 || (size_t)n >= cap)
            return vl_fail(err, VL_EINVAL, "kfac: no room for the name of layer %d", i);
    }
    return 0;
}

void model_kfac_gpt_free(model_kfac_gpt *opt) {
    if (opt == NULL) return;
    for (int i = 0; opt->layers && i < opt->n_layers; i++) model_kfac_layer_free(opt->layers[i]);
    free(opt->layers);
    free(opt->tensor);
    free(opt->nat);
    model_sgd_free(&opt->sgd);
    memset(opt, 0, sizeof *opt);
}

int model_kfac_gpt_init(model_kfac_gpt *opt, const model_gpt *m, const model_kfac_gpt_config *cfg,
                        vl_error *err) {
    if (opt == NULL || m == NULL) return vl_fail(err, VL_EINVAL, "kfac: no optimiser or model");
    memset(opt, 0, sizeof *opt);
    int rc = model_kfac_gpt_config_validate(cfg, err);
    if (rc != 0) return rc;
    int L = m->cfg.n_layer, n = 4 * L;
    opt->cfg = *cfg;
    opt->n_params = m->num_params;
    opt->since_invert = -1;
    opt->last_scale = 1.0f;
    opt->layers = calloc((size_t)n, sizeof *opt->layers);
    opt->tensor = calloc((size_t)n, sizeof *opt->tensor);
    opt->nat = calloc(m->num_params, sizeof *opt->nat);
    if (!opt->layers || !opt->tensor || !opt->nat) {
        model_kfac_gpt_free(opt);
        return vl_fail(err, VL_ENOMEM, "kfac: out of memory for %d layers", n);
    }
    opt->n_layers = n;
    for (int i = 0; i < n; i++) {
        int in = 0, out = 0;
        rc = model_gpt_kfac_layer(&m->cfg, i, NULL, 0, &in, &out, err);
        if (rc == 0) rc = model_kfac_layer_create(in, out, &opt->layers[i], err);
        if (rc != 0) {
            model_kfac_gpt_free(opt);
            return rc;
        }
        opt->tensor[i] = GPT_LAYER(i / 4, LAYER_KIND[i % 4]);
    }
    rc =
        model_sgd_init(&opt->sgd, m->num_params, cfg->lr, cfg->momentum, cfg->weight_decay, 0, err);
    if (rc != 0) model_kfac_gpt_free(opt);
    return rc;
}

void model_kfac_gpt_reset(model_kfac_gpt *opt) {
    for (int i = 0; i < opt->n_layers; i++) {
        model_kfac_layer *l = opt->layers[i];
        size_t na = (size_t)(l->in + 1) * (l->in + 1), ng = (size_t)l->out * l->out;
        /* A, A_inv, G, G_inv and the scratch are one allocation. */
        memset(l->A, 0, (2 * na + 2 * ng + (size_t)(l->in + 1) * l->out) * sizeof(float));
        l->updates = l->inversions = 0;
        l->damping_a = l->damping_g = 0.0f;
    }
    model_sgd_reset(&opt->sgd);
    opt->step = 0;
    opt->since_invert = -1;
    opt->kept_inverses = 0;
    opt->rows = 0;
    opt->last_scale = 1.0f;
}

void model_kfac_gpt_refresh(model_kfac_gpt *opt) {
    opt->since_invert = -1;
}

/* Backward reports the layers from the last block down, each block's in
 * reverse table order, so call j is normally layer n - 1 - j; the name is
 * checked all the same, and searched for if the order ever changes. */
static void kfac_hook(void *ctx, const char *weight_name, const float *x, const float *dy, int n,
                      int in, int out) {
    model_kfac_gpt *o = ctx;
    int guess = o->n_layers - 1 - o->hook_calls++;
    if (o->hook_rc != 0) return;
    const model_tensor *t = o->hook_model->tensors;
    int l = -1;
    if (guess >= 0 && strcmp(t[o->tensor[guess]].name, weight_name) == 0) l = guess;
    for (int i = 0; l < 0 && i < o->n_layers; i++)
        if (strcmp(t[o->tensor[i]].name, weight_name) == 0) l = i;
    if (l < 0 || o->layers[l]->in != in || o->layers[l]->out != out) {
        o->hook_rc = vl_fail(&o->hook_err, VL_EINVAL,
                             "kfac: backward reported an unknown "
                             "layer %.64s (%d x %d)",
                             weight_name, in, out);
        return;
    }
    o->hook_rows = n;
    o->hook_rc = model_kfac_update_factors(o->layers[l], x, dy, n, o->cfg.decay, &o->hook_err);
}

static int same_model(const model_kfac_gpt *o, const model_gpt *m, vl_error *err) {
    if (o->layers == NULL) return vl_fail(err, VL_EINVAL, "kfac: optimiser not initialised");
    if (m->num_params != o->n_params || 4 * m->cfg.n_layer != o->n_layers)
        return vl_fail(err, VL_EINVAL,
                       "kfac: state for %zu parameters and %d layers, the "
                       "model has %zu and %d",
                       o->n_params, o->n_layers, m->num_params, 4 * m->cfg.n_layer);
    return 0;
}

int model_kfac_gpt_backward(model_kfac_gpt *opt, model_gpt *m, vl_error *err) {
    int rc = same_model(opt, m, err);
    if (rc != 0) return rc;
    opt->hook_model = m;
    opt->hook_calls = 0;
    opt->hook_rc = 0;
    opt->hook_rows = 0;
    model_gpt_set_linear_hook(m, kfac_hook, opt);
    rc = model_gpt_backward(m, err);
    model_gpt_set_linear_hook(m, NULL, NULL);
    opt->hook_model = NULL;
    if (rc != 0) return rc;
    if (opt->hook_rc != 0) return vl_fail(err, opt->hook_rc, "%s", opt->hook_err.msg);
    if (opt->hook_calls != opt->n_layers)
        return vl_fail(err, VL_EINVAL, "kfac: backward reported %d linear layers, expected %d",
                       opt->hook_calls, opt->n_layers);
    opt->rows += opt->hook_rows;
    return 0;
}

/* Refreshes every inverse, the layers spread over the OpenMP threads
 * (each inversion is single-threaded BLAS and touches only its layer, so
 * the result does not depend on the thread count). A layer that cannot be
 * inverted keeps what it had; one that never had inverses stops the step. */
static int refresh(model_kfac_gpt *o, vl_error *err) {
    int n = o->n_layers;
    vl_error *errs = calloc((size_t)n, sizeof *errs);
    int *rcs = calloc((size_t)n, sizeof *rcs);
    if (!errs || !rcs) {
        free(errs), free(rcs);
        return vl_fail(err, VL_ENOMEM, "kfac: out of memory");
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) rcs[i] = model_kfac_invert(o->layers[i], o->cfg.damping, &errs[i]);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (rcs[i] == 0) continue;
        if (o->layers[i]->inversions == 0)
            rc = vl_fail(err, rcs[i] == VL_ENOMEM ? VL_ENOMEM : VL_EINVAL, "kfac: layer %d: %s", i,
                         errs[i].msg);
        else
            o->kept_inverses++;
    }
    free(errs), free(rcs);
    if (rc == 0) o->since_invert = 0;
    return rc;
}

int model_kfac_gpt_step(model_kfac_gpt *opt, model_gpt *m, vl_error *err) {
    int rc = same_model(opt, m, err);
    if (rc != 0) return rc;
    if (m->grads == NULL) return vl_fail(err, VL_EINVAL, "kfac: the model has no gradients yet");
    for (int i = 0; i < opt->n_layers; i++)
        if (opt->layers[i]->updates == 0)
            return vl_fail(err, VL_EINVAL, "kfac: no factors yet (model_kfac_gpt_backward)");
    if (opt->since_invert < 0 || opt->since_invert >= opt->cfg.inverse_every) {
        if ((rc = refresh(opt, err)) != 0) return rc;
    }
    /* Weight and bias of a layer are neighbours in the table (and so in
     * the vectors), each layer one span of (in+1)·out floats. */
    int n = opt->n_layers;
    const float **g = malloc((size_t)n * sizeof *g);
    const float **d = malloc((size_t)n * sizeof *d);
    size_t *len = malloc((size_t)n * sizeof *len);
    if (!g || !d || !len) {
        free(g), free(d), free(len);
        return vl_fail(err, VL_ENOMEM, "kfac: out of memory");
    }
    /* Layers in parallel, as in refresh; precondition cannot fail once
     * every layer has inverses, which refresh made sure of. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) {
        const model_tensor *tw = &m->tensors[opt->tensor[i]], *tb = tw + 1;
        float *gw = m->grads + tw->offset, *gb = m->grads + tb->offset;
        if (model_kfac_precondition(opt->layers[i], gw, gb, opt->nat + tw->offset,
                                    opt->nat + tb->offset, NULL) != 0)
            len[i] = 0;
        else
            len[i] = tw->numel + tb->numel;
        g[i] = gw;
        d[i] = opt->nat + tw->offset;
    }
    for (int i = 0; i < n && rc == 0; i++)
        if (len[i] == 0) rc = vl_fail(err, VL_EINVAL, "kfac: layer %d has no inverses", i);
    float nu = rc == 0 ? model_kfac_kl_scale(g, d, len, n, opt->cfg.lr, opt->cfg.kl_clip) : 0;
    free(g), free(d);
    if (rc == 0 && nu == 0.0f)
        rc = vl_fail(err, VL_ERANGE, "kfac: the preconditioned gradient is not finite");
    if (rc != 0) {
        free(len);
        return rc;
    }
    for (int i = 0; i < n; i++) {
        size_t off = m->tensors[opt->tensor[i]].offset;
        for (size_t j = 0; j < len[i]; j++) m->grads[off + j] = nu * opt->nat[off + j];
    }
    free(len);
    opt->sgd.lr = opt->cfg.lr;
    opt->sgd.momentum = opt->cfg.momentum;
    opt->sgd.weight_decay = opt->cfg.weight_decay;
    if ((rc = model_sgd_step_gpt(&opt->sgd, m, err)) != 0) return rc;
    opt->last_scale = nu;
    opt->step++;
    opt->since_invert++;
    return 0;
}

int model_gpt_kfac_factor_layers(const model_gpt_config *cfg, compress_factor_layer *out, int cap,
                                 vl_error *err) {
    int n = model_gpt_kfac_layer_count(cfg);
    if (n < 1 || out == NULL || cap < n)
        return vl_fail(err, VL_EINVAL, "kfac: room for %d of %d layers", cap, n);
    for (int i = 0; i < n; i++) {
        int in = 0, o = 0;
        int rc = model_gpt_kfac_layer(cfg, i, out[i].name, sizeof out[i].name, &in, &o, err);
        if (rc != 0) return rc;
        out[i].a_dim = (uint32_t)in + 1;
        out[i].g_dim = (uint32_t)o;
    }
    return n;
}

int model_kfac_gpt_factors(const model_kfac_gpt *opt, const float **A, const float **G,
                           vl_error *err) {
    for (int i = 0; i < opt->n_layers; i++) {
        if (opt->layers[i]->updates == 0) return vl_fail(err, VL_EINVAL, "kfac: no factors yet");
        A[i] = opt->layers[i]->A;
        G[i] = opt->layers[i]->G;
    }
    return opt->n_layers > 0 ? 0 : vl_fail(err, VL_EINVAL, "kfac: optimiser not initialised");
}

int model_kfac_gpt_adopt(model_kfac_gpt *opt, const compress_factors_view *v, long updates,
                         vl_error *err) {
    if (v == NULL || v->n != opt->n_layers || opt->n_layers < 1)
        return vl_fail(err, VL_EINVAL, "kfac: factors of %d layers for a model of %d", v ? v->n : 0,
                       opt->n_layers);
    if (updates < 1) return vl_fail(err, VL_EINVAL, "kfac: %ld updates (need >= 1)", updates);
    /* Everything is converted and checked before the first layer changes. */
    size_t total = 0;
    for (int i = 0; i < opt->n_layers; i++) {
        const model_kfac_layer *l = opt->layers[i];
        total += (size_t)(l->in + 1) * (l->in + 1) + (size_t)l->out * l->out;
    }
    float *stage = malloc(total * sizeof *stage);
    if (stage == NULL)
        return vl_fail(err, VL_ENOMEM, "kfac: out of memory for %zu factor entries", total);
    int rc = 0;
    size_t at = 0;
    for (int i = 0; i < opt->n_layers && rc == 0; i++) {
        const model_kfac_layer *l = opt->layers[i];
        size_t na = (size_t)(l->in + 1) * (l->in + 1), ng = (size_t)l->out * l->out;
        rc = compress_factors_values(v, i, 0, stage + at, na, err);
        if (rc == 0) rc = compress_factors_values(v, i, 1, stage + at + na, ng, err);
        for (size_t j = 0; rc == 0 && j < na + ng; j++)
            if (!isfinite(stage[at + j]))
                rc = vl_fail(err, VL_ERANGE, "kfac: layer %d's factors are not finite", i);
        at += na + ng;
    }
    at = 0;
    for (int i = 0; i < opt->n_layers && rc == 0; i++) {
        model_kfac_layer *l = opt->layers[i];
        size_t na = (size_t)(l->in + 1) * (l->in + 1), ng = (size_t)l->out * l->out;
        rc = model_kfac_set_factors(l, stage + at, stage + at + na, updates, err);
        at += na + ng;
    }
    free(stage);
    if (rc == 0) model_kfac_gpt_refresh(opt);
    return rc;
}
