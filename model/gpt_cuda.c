/* The GPT on a CUDA device: device memory planning, and the forward,
 * backward and AdamW passes of gpt_train.c and adamw.c on the kernels of
 * kernels/cuda_model.h. The code follows gpt_train.c line for line so the
 * two stay easy to compare. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_bf16.h"
#include "kernels/cuda_model.h"
#include "model/carve.h"
#include "model/gpt_cuda.h"
#include "model/gpt_cuda_internal.h"
#include "model/gpt_internal.h"
#include "model/model.h"

static void free_acts(model_gpt_cuda *g) {
    kernels_cuda_free(g->acts.mem);
    free(g->acts.layers);
    kernels_cuda_free(g->half.mem);
    free(g->half.layers);
    memset(&g->half, 0, sizeof g->half);
    free(g->h_losses);
    memset(&g->acts, 0, sizeof g->acts);
    memset(&g->gacts, 0, sizeof g->gacts);
    g->h_losses = NULL;
    g->have_output = 0;
    g->can_backward = 0;
}

void model_gpt_cuda_free(model_gpt_cuda *g) {
    if (g == NULL) return;
    free_acts(g);
    kernels_cuda_free(g->params_h);
    kernels_cuda_free(g->wte_h);
    kernels_cuda_free(g->state);
    kernels_cuda_ctx_destroy(g->ctx);
    free(g->tensors);
    free(g);
}

/* The parameter-sized vectors, laid out by the carve protocol. */
static void layout_state(model_gpt_cuda *g, carver *cv) {
    size_t n = g->num_params;
    g->params = carve(cv, n, 1);
    g->grads = carve(cv, n, 1);
    g->adam_m = carve(cv, n, 1);
    g->adam_v = carve(cv, n, 1);
    g->decay_mask = (uint8_t *)carve(cv, (n + sizeof(float) - 1) / sizeof(float), 1);
    /* Two floats per double, and carve's alignment keeps it 8-aligned. */
    g->norm_scratch = (double *)carve(cv, 2 * KERNELS_CUDA_SUMSQ_SCRATCH_DOUBLES, 1);
}

static int upload_decay_mask(model_gpt_cuda *g, vl_error *err) {
    uint8_t *mask = malloc(g->num_params);
    if (mask == NULL) return vl_fail(err, VL_ENOMEM, "gpt cuda: out of memory for the decay mask");
    /* The rule of gpt_each_decay_run: 2-D tensors decay. */
    for (int i = 0; i < g->ntensors; i++)
        memset(mask + g->tensors[i].offset, g->tensors[i].ndim == 2, g->tensors[i].numel);
    int rc = kernels_cuda_upload(g->decay_mask, mask, g->num_params, err);
    free(mask);
    return rc;
}

int model_gpt_cuda_create(const model_gpt *host, kernels_cuda_math math, model_gpt_cuda **out,
                          vl_error *err) {
    if (out == NULL || host == NULL)
        return vl_fail(err, VL_EINVAL, "gpt cuda: no model or output pointer");
    *out = NULL;
    model_gpt_cuda *g = calloc(1, sizeof *g);
    if (g == NULL) return vl_fail(err, VL_ENOMEM, "gpt cuda: out of memory");
    g->cfg = host->cfg;
    g->ntensors = host->ntensors;
    g->num_params = host->num_params;
    g->tensors = malloc((size_t)host->ntensors * sizeof(model_tensor));
    int rc = g->tensors ? 0 : vl_fail(err, VL_ENOMEM, "gpt cuda: out of memory");
    if (rc == 0) {
        memcpy(g->tensors, host->tensors, (size_t)host->ntensors * sizeof(model_tensor));
        rc = kernels_cuda_ctx_create(math, &g->ctx, err);
    }
    if (rc == 0) {
        carver cv = {NULL, 0, 0};
        layout_state(g, &cv);
        if (cv.overflow || cv.used > SIZE_MAX / sizeof(float))
            rc = vl_fail(err, VL_ENOMEM, "gpt cuda: %zu parameters is too many", g->num_params);
        else
            rc = kernels_cuda_alloc((void **)&g->state, cv.used * sizeof(float), err);
        if (rc == 0) {
            cv = (carver){g->state, 0, 0};
            layout_state(g, &cv);
            /* grads, m and v zeroed together: they are contiguous. */
            rc = kernels_cuda_zero(g->grads, (size_t)((char *)g->decay_mask - (char *)g->grads),
                                   err);
        }
    }
    g->bf16 = math == KERNELS_CUDA_BF16;
    g->vld = g->bf16 ? (g->cfg.vocab_size + 63) / 64 * 64 : g->cfg.vocab_size;
    if (rc == 0 && g->bf16)
        rc = kernels_cuda_alloc((void **)&g->params_h, g->num_params * sizeof(kernels_bf16), err);
    size_t wte_h = (size_t)g->vld * g->cfg.n_embd * sizeof(kernels_bf16);
    if (rc == 0 && g->bf16) rc = kernels_cuda_alloc((void **)&g->wte_h, wte_h, err);
    if (rc == 0 && g->bf16) rc = kernels_cuda_zero(g->wte_h, wte_h, err);
    if (rc == 0) rc = upload_decay_mask(g, err);
    if (rc == 0) rc = model_gpt_cuda_upload_params(g, host, err);
    if (rc == 0) rc = kernels_cuda_sync(err);
    if (rc != 0) {
        model_gpt_cuda_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

size_t model_gpt_cuda_num_params(const model_gpt_cuda *g) {
    return g->num_params;
}

static int same_config(const model_gpt_cuda *g, const model_gpt *host, vl_error *err) {
    const model_gpt_config *a = &g->cfg, *b = &host->cfg;
    if (a->vocab_size != b->vocab_size || a->block_size != b->block_size ||
        a->n_layer != b->n_layer || a->n_head != b->n_head || a->n_embd != b->n_embd)
        return vl_fail(err, VL_EINVAL, "gpt cuda: the host model has another configuration");
    return 0;
}

int model_gpt_cuda_upload_params(model_gpt_cuda *g, const model_gpt *host, vl_error *err) {
    if (g == NULL || host == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda: no model");
    TRY(same_config(g, host, err));
    g->have_output = 0;
    g->can_backward = 0;
    return kernels_cuda_upload(g->params, host->params, g->num_params * sizeof(float), err);
}

int model_gpt_cuda_download_params(model_gpt_cuda *g, model_gpt *host, vl_error *err) {
    if (g == NULL || host == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda: no model");
    TRY(same_config(g, host, err));
    /* The host model's forward state described the old parameters. */
    host->have_output = 0;
    host->can_backward = 0;
    return kernels_cuda_download(host->params, g->params, g->num_params * sizeof(float), err);
}

int model_gpt_cuda_download_grads(model_gpt_cuda *g, float *out, size_t n, vl_error *err) {
    if (g == NULL || out == NULL || n != g->num_params)
        return vl_fail(err, VL_EINVAL, "gpt cuda: gradients need a buffer of %zu floats",
                       g ? g->num_params : 0);
    return kernels_cuda_download(out, g->grads, n * sizeof(float), err);
}

int model_gpt_cuda_zero_grad(model_gpt_cuda *g, vl_error *err) {
    if (g == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda: no model");
    return kernels_cuda_zero(g->grads, g->num_params * sizeof(float), err);
}

/* ---- activations ---------------------------------------------------------------- */

/* Both passes' buffers and the ids, for bt positions and btt = B*T*T. */
static void layout_acts(model_gpt_cuda *g, carver *cv, size_t bt, size_t btt) {
    /* The logits' rows are vld long; nothing else depends on V. */
    model_gpt_config padded = g->cfg;
    padded.vocab_size = g->vld;
    gpt_layout_acts(&padded, &g->acts, cv, bt, btt);
    /* The attention backward scratch is B*NH*T*T floats, att's size. */
    gpt_layout_grad_acts(&g->cfg, &g->gacts, cv, bt, btt * (size_t)g->cfg.n_head);
    g->acts.inputs = (int *)carve(cv, bt, 1);
    g->acts.targets = (int *)carve(cv, bt, 1);
}

/* n = a * b bfloat16 values, carved as floats (64-byte aligned). */
static kernels_bf16 *carve_h(carver *cv, size_t a, size_t b) {
    size_t n;
    if (__builtin_mul_overflow(a, b, &n)) {
        cv->overflow = 1;
        return NULL;
    }
    return (kernels_bf16 *)carve(cv, n / 2 + 1, 1);
}

static void layout_half(model_gpt_cuda *g, carver *cv, size_t bt, size_t btt) {
    size_t C = (size_t)g->cfg.n_embd, NH = (size_t)g->cfg.n_head;
    gpt_half *h = &g->half;
    for (int l = 0; l < g->cfg.n_layer; l++) {
        gpt_half_layer *hl = &h->layers[l];
        hl->ln1 = carve_h(cv, bt, C);
        hl->qkv = carve_h(cv, bt, 3 * C);
        hl->atty = carve_h(cv, bt, C);
        hl->ln2 = carve_h(cv, bt, C);
        hl->fchg = carve_h(cv, bt, 4 * C);
        hl->att = carve_h(cv, btt, NH);
    }
    h->lnf = carve_h(cv, bt, C);
    h->dlogits = carve_h(cv, bt, (size_t)g->vld);
    h->dout = carve_h(cv, bt, 4 * C);
    h->ds = carve_h(cv, btt, NH);
}

static int plan_half(model_gpt_cuda *g, size_t bt, size_t btt, vl_error *err) {
    gpt_half *h = &g->half;
    h->layers = calloc((size_t)g->cfg.n_layer, sizeof(gpt_half_layer));
    if (h->layers == NULL)
        return vl_fail(err, VL_ENOMEM, "gpt cuda: out of host memory for activations");
    carver cv = {NULL, 0, 0};
    layout_half(g, &cv, bt, btt);
    if (cv.overflow || cv.used > SIZE_MAX / sizeof(float))
        return vl_fail(err, VL_ENOMEM, "gpt cuda: activations for %zu positions are too large", bt);
    TRY(kernels_cuda_alloc((void **)&h->mem, cv.used * sizeof(float), err));
    cv = (carver){(float *)h->mem, 0, 0};
    layout_half(g, &cv, bt, btt);
    return 0;
}

static int plan_acts(model_gpt_cuda *g, size_t bt, size_t btt, vl_error *err) {
    gpt_acts *a = &g->acts;
    if (a->mem && bt <= a->cap_bt && btt <= a->cap_btt) return 0;
    size_t cap_bt = bt > a->cap_bt ? bt : a->cap_bt;
    size_t cap_btt = btt > a->cap_btt ? btt : a->cap_btt;
    free_acts(g);
    a->layers = calloc((size_t)g->cfg.n_layer, sizeof(gpt_layer_acts));
    g->h_losses = malloc(cap_bt * sizeof(float));
    if (a->layers == NULL || g->h_losses == NULL) {
        free_acts(g);
        return vl_fail(err, VL_ENOMEM, "gpt cuda: out of host memory for activations");
    }
    carver cv = {NULL, 0, 0};
    layout_acts(g, &cv, cap_bt, cap_btt);
    int rc = 0;
    if (cv.overflow || cv.used > SIZE_MAX / sizeof(float))
        rc = vl_fail(err, VL_ENOMEM, "gpt cuda: activations for %zu positions are too large",
                     cap_bt);
    else
        rc = kernels_cuda_alloc((void **)&a->mem, cv.used * sizeof(float), err);
    if (rc == 0 && g->bf16) rc = plan_half(g, cap_bt, cap_btt, err);
    if (rc != 0) {
        free_acts(g);
        return rc;
    }
    cv = (carver){a->mem, 0, 0};
    layout_acts(g, &cv, cap_bt, cap_btt);
    a->cap_bt = cap_bt;
    a->cap_btt = cap_btt;
    g->gacts.mem = NULL; /* part of acts.mem */
    g->gacts.cap_bt = cap_bt;
    g->gacts.cap_scratch = cap_btt * (size_t)g->cfg.n_head;
    return 0;
}

/* ---- forward ------------------------------------------------------------------ */

static int forward_layers(model_gpt_cuda *g, int B, int T, vl_error *err) {
    const model_gpt_config *c = &g->cfg;
    gpt_acts *a = &g->acts;
    kernels_cuda_ctx *ctx = g->ctx;
    int N = B * T, C = c->n_embd, L = c->n_layer, NH = c->n_head, V = c->vocab_size;
    size_t NC = (size_t)N * C;
    float *P = g->params;

    TRY(kernels_cuda_encoder_forward(a->encoded, a->inputs, tensor(g, P, GPT_WTE),
                                     tensor(g, P, GPT_WPE), B, T, C, err));
    for (int l = 0; l < L; l++) {
        gpt_layer_acts *la = &a->layers[l];
        const float *x = l == 0 ? a->encoded : a->layers[l - 1].res3;
#define W(k) tensor(g, P, GPT_LAYER(l, k))
        TRY(kernels_cuda_layernorm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, x, W(GPT_LN1_W),
                                           W(GPT_LN1_B), N, C, err));
        TRY(kernels_cuda_matmul_forward(ctx, la->qkv, la->ln1, W(GPT_QKV_W), W(GPT_QKV_B), N, C,
                                        3 * C, err));
        TRY(kernels_cuda_attention_forward(ctx, la->atty, la->att, la->qkv, B, T, C, NH, err));
        TRY(kernels_cuda_matmul_forward(ctx, a->proj, la->atty, W(GPT_ATTPROJ_W), W(GPT_ATTPROJ_B),
                                        N, C, C, err));
        TRY(kernels_cuda_residual_forward(la->res2, x, a->proj, NC, err));
        TRY(kernels_cuda_layernorm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2,
                                           W(GPT_LN2_W), W(GPT_LN2_B), N, C, err));
        TRY(kernels_cuda_matmul_forward(ctx, la->fch, la->ln2, W(GPT_FC_W), W(GPT_FC_B), N, C,
                                        4 * C, err));
        TRY(kernels_cuda_gelu_forward(la->fch_gelu, la->fch, NC * 4, err));
        TRY(kernels_cuda_matmul_forward(ctx, a->proj, la->fch_gelu, W(GPT_FCPROJ_W),
                                        W(GPT_FCPROJ_B), N, 4 * C, C, err));
        TRY(kernels_cuda_residual_forward(la->res3, la->res2, a->proj, NC, err));
#undef W
    }
    TRY(kernels_cuda_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, a->layers[L - 1].res3,
                                       tensor(g, P, GPT_LNF_W(L)), tensor(g, P, GPT_LNF_B(L)), N, C,
                                       err));
    return kernels_cuda_matmul_wt_forward(ctx, a->logits, a->lnf, tensor(g, P, GPT_WTE), N, C, V,
                                          err);
}

int model_gpt_cuda_forward(model_gpt_cuda *g, const int *inputs, const int *targets, int B, int T,
                           float *loss, vl_error *err) {
    if (g == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda: no model");
    TRY(gpt_check_batch(&g->cfg, inputs, targets, B, T, err));
    g->have_output = 0;
    g->can_backward = 0;
    size_t bt = (size_t)B * T;
    TRY(plan_acts(g, bt, bt * (size_t)T, err));
    gpt_acts *a = &g->acts;
    TRY(kernels_cuda_upload(a->inputs, inputs, bt * sizeof(int), err));
    if (targets) TRY(kernels_cuda_upload(a->targets, targets, bt * sizeof(int), err));
    TRY(g->bf16 ? gpt_cuda_forward_bf16(g, B, T, err) : forward_layers(g, B, T, err));
    int N = (int)bt, V = g->cfg.vocab_size;
    g->B = B;
    g->T = T;
    if (targets) {
        TRY(kernels_cuda_softmax_xent_forward_ld(a->logits, a->losses, a->logits, a->targets, N, V,
                                                 g->vld, err));
        /* Summed in double on the host, in order, as the CPU model does. */
        TRY(kernels_cuda_download(g->h_losses, a->losses, bt * sizeof(float), err));
        double s = 0.0;
        for (int i = 0; i < N; i++) s += g->h_losses[i];
        if (loss) *loss = (float)(s / (double)bt);
        g->can_backward = 1;
    } else {
        TRY(kernels_cuda_sync(err));
        if (loss) *loss = 0.0f;
    }
    g->have_output = 1;
    return 0;
}

int model_gpt_cuda_download_output(model_gpt_cuda *g, float *out, size_t n, vl_error *err) {
    if (g == NULL || out == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda: no model or buffer");
    if (!g->have_output) return vl_fail(err, VL_EINVAL, "gpt cuda: no forward output to read");
    size_t want = (size_t)g->B * g->T * (size_t)g->cfg.vocab_size;
    if (n != want)
        return vl_fail(err, VL_EINVAL, "gpt cuda: output has %zu floats, buffer %zu", want, n);
    size_t row = (size_t)g->cfg.vocab_size * sizeof(float);
    return kernels_cuda_download_rows(out, row, g->acts.logits, (size_t)g->vld * sizeof(float), row,
                                      (size_t)g->B * g->T, err);
}

/* ---- backward ------------------------------------------------------------------ */

static int backward_layers(model_gpt_cuda *g, vl_error *err) {
    const model_gpt_config *c = &g->cfg;
    gpt_acts *a = &g->acts;
    gpt_grad_acts *gr = &g->gacts;
    kernels_cuda_ctx *ctx = g->ctx;
    int B = g->B, T = g->T, N = B * T, C = c->n_embd, L = c->n_layer, NH = c->n_head,
        V = c->vocab_size;
    size_t NC = (size_t)N * C, F = sizeof(float);
    float *P = g->params, *G = g->grads;

    TRY(kernels_cuda_softmax_xent_backward(a->logits, a->logits, a->targets, 1.0f / (float)N, N, V,
                                           err));
    TRY(kernels_cuda_zero(gr->dres, NC * F, err));
    TRY(kernels_cuda_zero(gr->dln, NC * F, err));
    TRY(kernels_cuda_matmul_wt_backward(ctx, gr->dln, tensor(g, G, GPT_WTE), a->logits, a->lnf,
                                        tensor(g, P, GPT_WTE), N, C, V, err));
    TRY(kernels_cuda_layernorm_backward(
        gr->dres, tensor(g, G, GPT_LNF_W(L)), tensor(g, G, GPT_LNF_B(L)), gr->dln,
        a->layers[L - 1].res3, tensor(g, P, GPT_LNF_W(L)), a->lnf_mean, a->lnf_rstd, N, C, err));
    /* dres carries the residual stream's gradient down, as on the CPU. */
    for (int l = L - 1; l >= 0; l--) {
        gpt_layer_acts *la = &a->layers[l];
        const float *x = l == 0 ? a->encoded : a->layers[l - 1].res3;
#define W(k) tensor(g, P, GPT_LAYER(l, k))
#define D(k) tensor(g, G, GPT_LAYER(l, k))
        TRY(kernels_cuda_zero(gr->dfch_gelu, NC * 4 * F, err));
        TRY(kernels_cuda_matmul_backward(ctx, gr->dfch_gelu, D(GPT_FCPROJ_W), D(GPT_FCPROJ_B),
                                         gr->dres, la->fch_gelu, W(GPT_FCPROJ_W), N, 4 * C, C,
                                         err));
        TRY(kernels_cuda_zero(gr->dfch, NC * 4 * F, err));
        TRY(kernels_cuda_gelu_backward(gr->dfch, la->fch, gr->dfch_gelu, NC * 4, err));
        TRY(kernels_cuda_zero(gr->dln, NC * F, err));
        TRY(kernels_cuda_matmul_backward(ctx, gr->dln, D(GPT_FC_W), D(GPT_FC_B), gr->dfch, la->ln2,
                                         W(GPT_FC_W), N, C, 4 * C, err));
        TRY(kernels_cuda_layernorm_backward(gr->dres, D(GPT_LN2_W), D(GPT_LN2_B), gr->dln, la->res2,
                                            W(GPT_LN2_W), la->ln2_mean, la->ln2_rstd, N, C, err));
        TRY(kernels_cuda_zero(gr->datty, NC * F, err));
        TRY(kernels_cuda_matmul_backward(ctx, gr->datty, D(GPT_ATTPROJ_W), D(GPT_ATTPROJ_B),
                                         gr->dres, la->atty, W(GPT_ATTPROJ_W), N, C, C, err));
        TRY(kernels_cuda_zero(gr->dqkv, NC * 3 * F, err));
        TRY(kernels_cuda_attention_backward(ctx, gr->dqkv, gr->scratch, gr->datty, la->qkv, la->att,
                                            B, T, C, NH, err));
        TRY(kernels_cuda_zero(gr->dln, NC * F, err));
        TRY(kernels_cuda_matmul_backward(ctx, gr->dln, D(GPT_QKV_W), D(GPT_QKV_B), gr->dqkv,
                                         la->ln1, W(GPT_QKV_W), N, C, 3 * C, err));
        TRY(kernels_cuda_layernorm_backward(gr->dres, D(GPT_LN1_W), D(GPT_LN1_B), gr->dln, x,
                                            W(GPT_LN1_W), la->ln1_mean, la->ln1_rstd, N, C, err));
#undef W
#undef D
    }
    return kernels_cuda_encoder_backward(tensor(g, G, GPT_WTE), tensor(g, G, GPT_WPE), gr->dres,
                                         a->inputs, B, T, C, err);
}

int model_gpt_cuda_backward(model_gpt_cuda *g, vl_error *err) {
    if (g == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda: no model");
    if (!g->can_backward)
        return vl_fail(err, VL_EINVAL,
                       "gpt cuda backward: needs a forward pass with targets first (once per "
                       "forward)");
    g->can_backward = 0;
    g->have_output = 0; /* the probabilities become their gradient in place */
    return g->bf16 ? gpt_cuda_backward_bf16(g, err) : backward_layers(g, err);
}

/* ---- AdamW ------------------------------------------------------------------------ */

int model_gpt_cuda_adamw_step(model_gpt_cuda *g, float lr, float beta1, float beta2, float eps,
                              float weight_decay, vl_error *err) {
    if (g == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda: no model");
    TRY(gpt_adamw_check(lr, beta1, beta2, eps, weight_decay, err));
    kernels_adamw_hparams hp = {lr, beta1, beta2, eps, weight_decay, g->adam_step + 1};
    g->have_output = 0;
    g->can_backward = 0;
    TRY(kernels_cuda_adamw_step(g->params, g->grads, g->adam_m, g->adam_v, g->decay_mask,
                                g->num_params, &hp, err));
    g->adam_step++;
    return 0;
}

/* ---- clipping and optimizer state ----------------------------------------------- */

int model_gpt_cuda_clip_grads(model_gpt_cuda *g, double max_norm, double *g2, vl_error *err) {
    if (g == NULL || g2 == NULL)
        return vl_fail(err, VL_EINVAL, "gpt cuda: no model or output pointer");
    double s = 0.0;
    TRY(kernels_cuda_sumsq(g->grads, g->num_params, g->norm_scratch, &s, err));
    *g2 = s;
    /* The peer's host rule (peer/train.c): scale only a finite norm. */
    if (max_norm > 0 && isfinite(s) && s > max_norm * max_norm)
        TRY(kernels_cuda_scale(g->grads, g->num_params, (float)(max_norm / sqrt(s)), err));
    return 0;
}

static int check_n(const model_gpt_cuda *g, size_t n, vl_error *err) {
    if (g == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda: no model");
    if (n != g->num_params)
        return vl_fail(err, VL_EINVAL, "gpt cuda: %zu values for %zu parameters", n, g->num_params);
    return 0;
}

int model_gpt_cuda_set_adamw(model_gpt_cuda *g, const float *m, const float *v, size_t n, long step,
                             vl_error *err) {
    TRY(check_n(g, n, err));
    if (step < 0 || (step > 0 && (m == NULL || v == NULL)))
        return vl_fail(err, VL_EINVAL, "gpt cuda: AdamW state of step %ld without moments", step);
    size_t bytes = n * sizeof(float);
    if (m == NULL) {
        TRY(kernels_cuda_zero(g->adam_m, bytes, err));
        TRY(kernels_cuda_zero(g->adam_v, bytes, err));
    } else {
        TRY(kernels_cuda_upload(g->adam_m, m, bytes, err));
        TRY(kernels_cuda_upload(g->adam_v, v, bytes, err));
    }
    g->adam_step = step;
    return 0;
}

int model_gpt_cuda_get_adamw(model_gpt_cuda *g, float *m, float *v, size_t n, long *step,
                             vl_error *err) {
    TRY(check_n(g, n, err));
    if (m == NULL || v == NULL || step == NULL)
        return vl_fail(err, VL_EINVAL, "gpt cuda: no output for the AdamW state");
    TRY(kernels_cuda_download(m, g->adam_m, n * sizeof(float), err));
    TRY(kernels_cuda_download(v, g->adam_v, n * sizeof(float), err));
    *step = g->adam_step;
    return 0;
}

float *model_gpt_cuda_grads_device(model_gpt_cuda *g) {
    return g ? g->grads : NULL;
}

float *model_gpt_cuda_params_device(model_gpt_cuda *g) {
    return g ? g->params : NULL;
}
