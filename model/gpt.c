/* GPT object: configuration, tensor table, parameter and activation
 * memory, initialisation. The passes of gpt_train.c build on this file and
 * nothing here calls them, so the object can be read (and freed) without
 * the passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt_internal.h"
#include "model/model.h"

model_gpt_config model_gpt_config_default(void) {
    model_gpt_config c = {
        .vocab_size = 256, .block_size = 64, .n_layer = 2, .n_head = 4, .n_embd = 128};
    return c;
}

/* Parameter count in double first, so absurd configurations are caught
 * before any size_t arithmetic can wrap. */
static double params_estimate(const model_gpt_config *c) {
    double C = c->n_embd;
    return (double)c->vocab_size * C + (double)c->block_size * C +
           (double)c->n_layer * (12.0 * C * C + 13.0 * C) + 2.0 * C;
}

int model_gpt_config_validate(const model_gpt_config *c, vl_error *err) {
    if (c == NULL) return vl_fail(err, VL_EINVAL, "gpt config: missing");
    if (c->vocab_size < 1 || c->vocab_size > MODEL_MAX_VOCAB)
        return vl_fail(err, VL_EINVAL, "gpt config: vocab_size %d outside [1, %d]", c->vocab_size,
                       MODEL_MAX_VOCAB);
    if (c->block_size < 1 || c->block_size > MODEL_MAX_BLOCK)
        return vl_fail(err, VL_EINVAL, "gpt config: block_size %d outside [1, %d]", c->block_size,
                       MODEL_MAX_BLOCK);
    if (c->n_layer < 1 || c->n_layer > MODEL_MAX_LAYER)
        return vl_fail(err, VL_EINVAL, "gpt config: n_layer %d outside [1, %d]", c->n_layer,
                       MODEL_MAX_LAYER);
    if (c->n_embd < 1 || c->n_embd > MODEL_MAX_EMBD)
        return vl_fail(err, VL_EINVAL, "gpt config: n_embd %d outside [1, %d]", c->n_embd,
                       MODEL_MAX_EMBD);
    if (c->n_head < 1 || c->n_head > c->n_embd)
        return vl_fail(err, VL_EINVAL, "gpt config: n_head %d outside [1, n_embd=%d]", c->n_head,
                       c->n_embd);
    if (c->n_embd % c->n_head != 0)
        return vl_fail(err, VL_EINVAL, "gpt config: n_embd %d is not a multiple of n_head %d",
                       c->n_embd, c->n_head);
    double np = params_estimate(c);
    if (np > (double)MODEL_MAX_PARAMS)
        return vl_fail(err, VL_EINVAL, "gpt config: %.0f parameters exceed the limit of %zu", np,
                       (size_t)MODEL_MAX_PARAMS);
    return 0;
}

size_t model_gpt_config_num_params(const model_gpt_config *c) {
    if (model_gpt_config_validate(c, NULL) != 0) return 0;
    size_t C = (size_t)c->n_embd;
    return (size_t)c->vocab_size * C + (size_t)c->block_size * C +
           (size_t)c->n_layer * (12 * C * C + 13 * C) + 2 * C;
}

/* Appends a tensor named "h.<layer>.<suffix>", or just suffix for layer < 0. */
static int add_tensor(model_gpt *m, size_t *offset, int ndim, size_t d0, size_t d1, vl_error *err,
                      const char *suffix, int layer) {
    model_tensor *t = &m->tensors[m->ntensors];
    int n = layer < 0 ? snprintf(t->name, sizeof t->name, "%s", suffix)
                      : snprintf(t->name, sizeof t->name, "h.%d.%s", layer, suffix);
    if (n < 0 || (size_t)n >= sizeof t->name)
        return vl_fail(err, VL_EINVAL, "gpt: tensor name too long");
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 0;
    t->numel = ndim == 2 ? d0 * d1 : d0;
    t->offset = *offset;
    *offset += t->numel;
    m->ntensors++;
    return 0;
}

static int build_table(model_gpt *m, vl_error *err) {
    const model_gpt_config *c = &m->cfg;
    size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size, T = (size_t)c->block_size;
    int count = 4 + GPT_PER_LAYER * c->n_layer;
    m->tensors = calloc((size_t)count, sizeof(model_tensor));
    if (m->tensors == NULL)
        return vl_fail(err, VL_ENOMEM, "gpt: out of memory for the tensor table");
    size_t off = 0;
    int rc = 0;
    rc |= add_tensor(m, &off, 2, V, C, err, "wte.weight", -1);
    rc |= add_tensor(m, &off, 2, T, C, err, "wpe.weight", -1);
    for (int l = 0; l < c->n_layer && rc == 0; l++) {
        rc |= add_tensor(m, &off, 1, C, 0, err, "ln_1.weight", l);
        rc |= add_tensor(m, &off, 1, C, 0, err, "ln_1.bias", l);
        rc |= add_tensor(m, &off, 2, C, 3 * C, err, "attn.c_attn.weight", l);
        rc |= add_tensor(m, &off, 1, 3 * C, 0, err, "attn.c_attn.bias", l);
        rc |= add_tensor(m, &off, 2, C, C, err, "attn.c_proj.weight", l);
        rc |= add_tensor(m, &off, 1, C, 0, err, "attn.c_proj.bias", l);
        rc |= add_tensor(m, &off, 1, C, 0, err, "ln_2.weight", l);
        rc |= add_tensor(m, &off, 1, C, 0, err, "ln_2.bias", l);
        rc |= add_tensor(m, &off, 2, C, 4 * C, err, "mlp.c_fc.weight", l);
        rc |= add_tensor(m, &off, 1, 4 * C, 0, err, "mlp.c_fc.bias", l);
        rc |= add_tensor(m, &off, 2, 4 * C, C, err, "mlp.c_proj.weight", l);
        rc |= add_tensor(m, &off, 1, C, 0, err, "mlp.c_proj.bias", l);
    }
    rc |= add_tensor(m, &off, 1, C, 0, err, "ln_f.weight", -1);
    rc |= add_tensor(m, &off, 1, C, 0, err, "ln_f.bias", -1);
    if (rc != 0) return VL_EINVAL;
    m->num_params = off;
    return 0;
}

int model_gpt_create(const model_gpt_config *cfg, model_gpt **out, vl_error *err) {
    if (out == NULL) return vl_fail(err, VL_EINVAL, "gpt: no output pointer");
    *out = NULL;
    int rc = model_gpt_config_validate(cfg, err);
    if (rc != 0) return rc;
    model_gpt *m = calloc(1, sizeof *m);
    if (m == NULL) return vl_fail(err, VL_ENOMEM, "gpt: out of memory");
    m->cfg = *cfg;
    rc = build_table(m, err);
    if (rc == 0) {
        m->params = calloc(m->num_params, sizeof(float));
        if (m->params == NULL)
            rc = vl_fail(err, VL_ENOMEM, "gpt: out of memory for %zu parameters", m->num_params);
    }
    if (rc != 0) {
        model_gpt_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void gpt_free_acts(model_gpt *m) {
    free(m->acts.mem);
    free(m->acts.inputs);
    free(m->acts.layers);
    free(m->gacts.mem);
    memset(&m->acts, 0, sizeof m->acts);
    memset(&m->gacts, 0, sizeof m->gacts);
    m->have_output = 0;
    m->can_backward = 0;
}

void model_gpt_free(model_gpt *m) {
    if (m == NULL) return;
    gpt_free_acts(m);
    free(m->tensors);
    free(m->params);
    free(m->grads);
    free(m);
}

/* Draws per chunk of fill_normal. */
#define INIT_CHUNK ((size_t)1 << 16)

/* p[k] = std * vl_rng_normal(r) for k < n, in order, as one sequential loop
 * would, but with the log and cos (nearly all of the cost) computed in
 * chunks on the OpenMP threads: a cheap pass steps r to each chunk's start
 * (vl_rng_normal_skip), so every chunk draws exactly its own numbers. GPT-2
 * small's 124 M draws take seconds on one core. */
static void fill_normal(float *p, size_t n, float std, vl_rng *r) {
    size_t chunks = (n + INIT_CHUNK - 1) / INIT_CHUNK;
    vl_rng *starts = chunks > 1 ? malloc(chunks * sizeof *starts) : NULL;
    if (starts == NULL) { /* one chunk, or no memory for the states */
        for (size_t k = 0; k < n; k++) p[k] = std * vl_rng_normal(r);
        return;
    }
    for (size_t c = 0; c < chunks; c++) {
        starts[c] = *r;
        vl_rng_normal_skip(r, c + 1 < chunks ? INIT_CHUNK : n - c * INIT_CHUNK);
    }
#pragma omp parallel for schedule(static)
    for (long c = 0; c < (long)chunks; c++) {
        vl_rng local = starts[c];
        size_t lo = (size_t)c * INIT_CHUNK, hi = lo + INIT_CHUNK < n ? lo + INIT_CHUNK : n;
        for (size_t k = lo; k < hi; k++) p[k] = std * vl_rng_normal(&local);
    }
    free(starts);
}

void model_gpt_init_weights(model_gpt *m, uint64_t seed) {
    vl_rng r;
    vl_rng_seed(&r, seed);
    float proj_std = 0.02f / sqrtf(2.0f * (float)m->cfg.n_layer);
    for (int i = 0; i < m->ntensors; i++) {
        const model_tensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        const char *name = t->name;
        size_t len = strlen(name);
        if (t->ndim == 2) {
            int residual = strstr(name, ".c_proj.weight") != NULL;
            fill_normal(p, t->numel, residual ? proj_std : 0.02f, &r);
        } else {
            int ln_weight = len > 7 && strcmp(name + len - 7, ".weight") == 0;
            float v = ln_weight ? 1.0f : 0.0f; /* 1-D weights are LayerNorm gains */
            for (size_t k = 0; k < t->numel; k++) p[k] = v;
        }
    }
    m->have_output = 0;
    m->can_backward = 0;
}

model_gpt_config model_gpt_config_get(const model_gpt *m) {
    return m->cfg;
}

size_t model_gpt_num_params(const model_gpt *m) {
    return m->num_params;
}

float *model_gpt_params(model_gpt *m) {
    return m->params;
}

float *model_gpt_grads(model_gpt *m) {
    return m->grads;
}

int model_gpt_tensors(const model_gpt *m, const model_tensor **out) {
    if (out) *out = m->tensors;
    return m->ntensors;
}

const model_tensor *model_gpt_find_tensor(const model_gpt *m, const char *name) {
    if (name == NULL) return NULL;
    for (int i = 0; i < m->ntensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

int gpt_ensure_grads(model_gpt *m, vl_error *err) {
    if (m->grads) return 0;
    m->grads = calloc(m->num_params, sizeof(float));
    if (m->grads == NULL)
        return vl_fail(err, VL_ENOMEM, "gpt: out of memory for %zu gradients", m->num_params);
    return 0;
}

int model_gpt_zero_grad(model_gpt *m, vl_error *err) {
    if (m->grads == NULL) return gpt_ensure_grads(m, err);
    memset(m->grads, 0, m->num_params * sizeof(float));
    return 0;
}

void gpt_each_decay_run(model_gpt *m, gpt_decay_run_fn fn, void *ctx) {
    int i = 0;
    while (i < m->ntensors) {
        int decay = m->tensors[i].ndim == 2;
        int j = i + 1;
        while (j < m->ntensors && (m->tensors[j].ndim == 2) == decay) j++;
        size_t off = m->tensors[i].offset;
        fn(ctx, off, m->tensors[j - 1].offset + m->tensors[j - 1].numel - off, decay);
        i = j;
    }
    m->have_output = 0;
    m->can_backward = 0;
}
