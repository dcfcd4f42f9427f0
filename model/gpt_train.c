/* GPT forward and backward passes, activation planning, and evaluation. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/carve.h"
#include "model/gpt_internal.h"
#include "model/model.h"

/* ---- activation planning ------------------------------------------------ */

void gpt_layout_acts(const model_gpt_config *cfg, gpt_acts *a, carver *cv, size_t bt, size_t btt) {
    size_t C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab_size, NH = (size_t)cfg->n_head;
    a->encoded = carve(cv, bt, C);
    for (int l = 0; l < cfg->n_layer; l++) {
        gpt_layer_acts *la = &a->layers[l];
        la->ln1 = carve(cv, bt, C);
        la->ln1_mean = carve(cv, bt, 1);
        la->ln1_rstd = carve(cv, bt, 1);
        la->qkv = carve(cv, bt, 3 * C);
        la->att = carve(cv, btt, NH);
        la->atty = carve(cv, bt, C);
        la->res2 = carve(cv, bt, C);
        la->ln2 = carve(cv, bt, C);
        la->ln2_mean = carve(cv, bt, 1);
        la->ln2_rstd = carve(cv, bt, 1);
        la->fch = carve(cv, bt, 4 * C);
        la->fch_gelu = carve(cv, bt, 4 * C);
        la->res3 = carve(cv, bt, C);
    }
    a->lnf = carve(cv, bt, C);
    a->lnf_mean = carve(cv, bt, 1);
    a->lnf_rstd = carve(cv, bt, 1);
    a->logits = carve(cv, bt, V);
    a->losses = carve(cv, bt, 1);
    a->proj = carve(cv, bt, C);
}

void gpt_layout_grad_acts(const model_gpt_config *cfg, gpt_grad_acts *g, carver *cv, size_t bt,
                          size_t scratch) {
    size_t C = (size_t)cfg->n_embd;
    g->dres = carve(cv, bt, C);
    g->dln = carve(cv, bt, C);
    g->dqkv = carve(cv, bt, 3 * C);
    g->datty = carve(cv, bt, C);
    g->dfch = carve(cv, bt, 4 * C);
    g->dfch_gelu = carve(cv, bt, 4 * C);
    g->scratch = carve(cv, scratch, 1);
}

/* Makes sure the forward buffers hold B*T rows; grows (and forgets the
 * previous forward) only when a larger shape arrives. */
static int plan_acts(model_gpt *m, size_t bt, size_t btt, vl_error *err) {
    gpt_acts *a = &m->acts;
    if (a->mem && bt <= a->cap_bt && btt <= a->cap_btt) return 0;
    size_t cap_bt = bt > a->cap_bt ? bt : a->cap_bt;
    size_t cap_btt = btt > a->cap_btt ? btt : a->cap_btt;
    gpt_free_acts(m);
    a->layers = calloc((size_t)m->cfg.n_layer, sizeof(gpt_layer_acts));
    carver cv = {NULL, 0, 0};
    if (a->layers == NULL) return vl_fail(err, VL_ENOMEM, "gpt: out of memory for activations");
    gpt_layout_acts(&m->cfg, a, &cv, cap_bt, cap_btt);
    if (cv.overflow || cap_bt > SIZE_MAX / (2 * sizeof(int))) goto toobig;
    a->mem = malloc(cv.used * sizeof(float));
    a->inputs = malloc(2 * cap_bt * sizeof(int));
    if (a->mem == NULL || a->inputs == NULL) goto toobig;
    a->targets = a->inputs + cap_bt;
    cv = (carver){a->mem, 0, 0};
    gpt_layout_acts(&m->cfg, a, &cv, cap_bt, cap_btt);
    a->cap_bt = cap_bt;
    a->cap_btt = cap_btt;
    return 0;
toobig:
    gpt_free_acts(m);
    return vl_fail(err, VL_ENOMEM, "gpt: cannot allocate activations for %zu positions", cap_bt);
}

/* Backward buffers for the forward plan's B*T capacity and the attention
 * scratch of the current shape; grown like the forward buffers. */
static int plan_grad_acts(model_gpt *m, int B, int T, vl_error *err) {
    gpt_grad_acts *g = &m->gacts;
    size_t bt = m->acts.cap_bt;
    size_t scratch = kernels_attention_scratch_floats(B, T, m->cfg.n_head);
    if (g->mem && g->cap_bt >= bt && g->cap_scratch >= scratch) return 0;
    if (g->cap_scratch > scratch) scratch = g->cap_scratch;
    free(g->mem);
    memset(g, 0, sizeof *g);
    carver cv = {NULL, 0, 0};
    gpt_layout_grad_acts(&m->cfg, g, &cv, bt, scratch);
    if (cv.overflow || (g->mem = malloc(cv.used * sizeof(float))) == NULL)
        return vl_fail(err, VL_ENOMEM, "gpt: cannot allocate backward buffers for %zu positions",
                       bt);
    cv = (carver){g->mem, 0, 0};
    gpt_layout_grad_acts(&m->cfg, g, &cv, bt, scratch);
    g->cap_bt = bt;
    g->cap_scratch = scratch;
    return 0;
}

/* ---- forward -------------------------------------------------------------- */

static int check_ids(const int *ids, size_t n, int V, const char *what, vl_error *err) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return vl_fail(err, VL_EINVAL, "gpt: %s[%zu] = %d is outside the vocabulary [0, %d)",
                           what, i, ids[i], V);
    return 0;
}

int gpt_check_batch(const model_gpt_config *c, const int *inputs, const int *targets, int B, int T,
                    vl_error *err) {
    if (inputs == NULL) return vl_fail(err, VL_EINVAL, "gpt forward: no inputs");
    if (B < 1 || T < 1 || T > c->block_size)
        return vl_fail(err, VL_EINVAL, "gpt forward: B=%d T=%d (need B >= 1, 1 <= T <= %d)", B, T,
                       c->block_size);
    if ((long long)B * T > INT_MAX / 4)
        return vl_fail(err, VL_EINVAL, "gpt forward: B*T = %lld is too large", (long long)B * T);
    size_t bt = (size_t)B * T;
    int rc = check_ids(inputs, bt, c->vocab_size, "inputs", err);
    if (rc == 0 && targets) rc = check_ids(targets, bt, c->vocab_size, "targets", err);
    return rc;
}

static int gpt_forward_impl(model_gpt *m, const int *inputs, const int *targets, int B, int T,
                            vl_error *err) {
    const model_gpt_config *c = &m->cfg;
    int rc = gpt_check_batch(c, inputs, targets, B, T, err);
    if (rc != 0) return rc;
    size_t bt = (size_t)B * T;
    m->have_output = 0;
    m->can_backward = 0;
    rc = plan_acts(m, bt, bt * (size_t)T, err);
    if (rc != 0) return rc;

    gpt_acts *a = &m->acts;
    memcpy(a->inputs, inputs, bt * sizeof(int));
    if (targets) memcpy(a->targets, targets, bt * sizeof(int));
    int N = (int)bt, C = c->n_embd, L = c->n_layer, NH = c->n_head, V = c->vocab_size;
    size_t NC = bt * (size_t)C;
    float *P = m->params;

    kernels_encoder_forward(a->encoded, a->inputs, gpt_tensor_ptr(m, P, GPT_WTE),
                            gpt_tensor_ptr(m, P, GPT_WPE), B, T, C);
    for (int l = 0; l < L; l++) {
        gpt_layer_acts *la = &a->layers[l];
        const float *x = l == 0 ? a->encoded : a->layers[l - 1].res3;
#define W(k) gpt_tensor_ptr(m, P, GPT_LAYER(l, k))
        kernels_layernorm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, x, W(GPT_LN1_W),
                                  W(GPT_LN1_B), N, C);
        kernels_matmul_forward(la->qkv, la->ln1, W(GPT_QKV_W), W(GPT_QKV_B), N, C, 3 * C);
        kernels_attention_forward(la->atty, la->att, la->qkv, B, T, C, NH);
        kernels_matmul_forward(a->proj, la->atty, W(GPT_ATTPROJ_W), W(GPT_ATTPROJ_B), N, C, C);
        kernels_residual_forward(la->res2, x, a->proj, NC);
        kernels_layernorm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, W(GPT_LN2_W),
                                  W(GPT_LN2_B), N, C);
        kernels_matmul_forward(la->fch, la->ln2, W(GPT_FC_W), W(GPT_FC_B), N, C, 4 * C);
        kernels_gelu_forward(la->fch_gelu, la->fch, NC * 4);
        kernels_matmul_forward(a->proj, la->fch_gelu, W(GPT_FCPROJ_W), W(GPT_FCPROJ_B), N, 4 * C,
                               C);
        kernels_residual_forward(la->res3, la->res2, a->proj, NC);
#undef W
    }
    kernels_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, a->layers[L - 1].res3,
                              gpt_tensor_ptr(m, P, GPT_LNF_W(L)),
                              gpt_tensor_ptr(m, P, GPT_LNF_B(L)), N, C);
    kernels_matmul_wt_forward(a->logits, a->lnf, gpt_tensor_ptr(m, P, GPT_WTE), N, C, V);
    m->B = B;
    m->T = T;
    m->have_output = 1;
    m->loss_sum = 0.0;
    if (targets) {
        kernels_softmax_xent_forward(a->logits, a->losses, a->logits, a->targets, N, V);
        double s = 0.0;
        for (int i = 0; i < N; i++) s += a->losses[i];
        m->loss_sum = s;
        m->can_backward = 1;
    }
    return 0;
}

int model_gpt_forward(model_gpt *m, const int *inputs, const int *targets, int B, int T,
                      float *loss, vl_error *err) {
    int rc = gpt_forward_impl(m, inputs, targets, B, T, err);
    if (rc == 0 && loss) *loss = targets ? (float)(m->loss_sum / ((double)B * T)) : 0.0f;
    return rc;
}

const float *model_gpt_output(const model_gpt *m) {
    return m->have_output ? m->acts.logits : NULL;
}

/* ---- backward ------------------------------------------------------------- */

void model_gpt_set_linear_hook(model_gpt *m, model_gpt_linear_fn fn, void *ctx) {
    m->linear_fn = fn;
    m->linear_ctx = fn ? ctx : NULL;
}

/* Shows the hook layer l's linear product k (weight index) while its input
 * and output gradient are still in their buffers. */
static inline void linear_hook(const model_gpt *m, int l, int k, const float *x, const float *dy,
                               int n, int in, int out) {
    if (m->linear_fn)
        m->linear_fn(m->linear_ctx, m->tensors[GPT_LAYER(l, k)].name, x, dy, n, in, out);
}

int model_gpt_backward(model_gpt *m, vl_error *err) {
    if (!m->can_backward)
        return vl_fail(err, VL_EINVAL,
                       "gpt backward: needs a forward pass with targets first (once per forward)");
    int rc = gpt_ensure_grads(m, err);
    if (rc == 0) rc = plan_grad_acts(m, m->B, m->T, err);
    if (rc != 0) return rc;
    const model_gpt_config *c = &m->cfg;
    gpt_acts *a = &m->acts;
    gpt_grad_acts *g = &m->gacts;
    int B = m->B, T = m->T, N = B * T, C = c->n_embd, L = c->n_layer, NH = c->n_head,
        V = c->vocab_size;
    size_t NC = (size_t)N * C;
    float *P = m->params, *G = m->grads;
    m->can_backward = 0;
    m->have_output = 0; /* the probabilities become their gradient in place */

    kernels_softmax_xent_backward(a->logits, a->logits, a->targets, 1.0f / (float)N, N, V);
    memset(g->dres, 0, NC * sizeof(float));
    memset(g->dln, 0, NC * sizeof(float));
    kernels_matmul_wt_backward(g->dln, gpt_tensor_ptr(m, G, GPT_WTE), a->logits, a->lnf,
                               gpt_tensor_ptr(m, P, GPT_WTE), N, C, V);
    kernels_layernorm_backward(g->dres, gpt_tensor_ptr(m, G, GPT_LNF_W(L)),
                               gpt_tensor_ptr(m, G, GPT_LNF_B(L)), g->dln, a->layers[L - 1].res3,
                               gpt_tensor_ptr(m, P, GPT_LNF_W(L)), a->lnf_mean, a->lnf_rstd, N, C);
    /* dres carries the gradient of the residual stream down the layers: a
     * residual add passes it through unchanged, so both of its inputs share
     * the one buffer and the branch contributions are added into it. */
    for (int l = L - 1; l >= 0; l--) {
        gpt_layer_acts *la = &a->layers[l];
        const float *x = l == 0 ? a->encoded : a->layers[l - 1].res3;
#define W(k) gpt_tensor_ptr(m, P, GPT_LAYER(l, k))
#define D(k) gpt_tensor_ptr(m, G, GPT_LAYER(l, k))
        linear_hook(m, l, GPT_FCPROJ_W, la->fch_gelu, g->dres, N, 4 * C, C);
        memset(g->dfch_gelu, 0, NC * 4 * sizeof(float));
        kernels_matmul_backward(g->dfch_gelu, D(GPT_FCPROJ_W), D(GPT_FCPROJ_B), g->dres,
                                la->fch_gelu, W(GPT_FCPROJ_W), N, 4 * C, C);
        memset(g->dfch, 0, NC * 4 * sizeof(float));
        kernels_gelu_backward(g->dfch, la->fch, g->dfch_gelu, NC * 4);
        linear_hook(m, l, GPT_FC_W, la->ln2, g->dfch, N, C, 4 * C);
        memset(g->dln, 0, NC * sizeof(float));
        kernels_matmul_backward(g->dln, D(GPT_FC_W), D(GPT_FC_B), g->dfch, la->ln2, W(GPT_FC_W), N,
                                C, 4 * C);
        kernels_layernorm_backward(g->dres, D(GPT_LN2_W), D(GPT_LN2_B), g->dln, la->res2,
                                   W(GPT_LN2_W), la->ln2_mean, la->ln2_rstd, N, C);
        linear_hook(m, l, GPT_ATTPROJ_W, la->atty, g->dres, N, C, C);
        memset(g->datty, 0, NC * sizeof(float));
        kernels_matmul_backward(g->datty, D(GPT_ATTPROJ_W), D(GPT_ATTPROJ_B), g->dres, la->atty,
                                W(GPT_ATTPROJ_W), N, C, C);
        memset(g->dqkv, 0, NC * 3 * sizeof(float));
        kernels_attention_backward(g->dqkv, g->scratch, g->datty, la->qkv, la->att, B, T, C, NH);
        linear_hook(m, l, GPT_QKV_W, la->ln1, g->dqkv, N, C, 3 * C);
        memset(g->dln, 0, NC * sizeof(float));
        kernels_matmul_backward(g->dln, D(GPT_QKV_W), D(GPT_QKV_B), g->dqkv, la->ln1, W(GPT_QKV_W),
                                N, C, 3 * C);
        kernels_layernorm_backward(g->dres, D(GPT_LN1_W), D(GPT_LN1_B), g->dln, x, W(GPT_LN1_W),
                                   la->ln1_mean, la->ln1_rstd, N, C);
#undef W
#undef D
    }
    kernels_encoder_backward(gpt_tensor_ptr(m, G, GPT_WTE), gpt_tensor_ptr(m, G, GPT_WPE), g->dres,
                             a->inputs, B, T, C);
    return 0;
}

/* ---- evaluation ------------------------------------------------------------ */

/* The token at i of a sequence stored as bytes (width 1) or uint16 (2). */
static int eval_token(const void *seq, int width, size_t i) {
    return width == 1 ? ((const uint8_t *)seq)[i] : ((const uint16_t *)seq)[i];
}

/* Mean loss over consecutive windows of len tokens at seq, each token
 * `width` bytes wide: one loop for bytes and token shards, so both count
 * windows and average the same way. what names the data in messages. */
static int eval_seq(model_gpt *m, const void *seq, int width, size_t len, int B, int T,
                    int max_batches, float *mean_loss, const char *what, vl_error *err) {
    if (seq == NULL || mean_loss == NULL)
        return vl_fail(err, VL_EINVAL, "gpt eval: missing data or result pointer");
    if (B < 1 || T < 1 || T > m->cfg.block_size)
        return vl_fail(err, VL_EINVAL, "gpt eval: B=%d T=%d (need B >= 1, 1 <= T <= %d)", B, T,
                       m->cfg.block_size);
    if ((long long)B * T > INT_MAX / 4) return vl_fail(err, VL_EINVAL, "gpt eval: B*T too large");
    if (len < (size_t)T + 1)
        return vl_fail(err, VL_EINVAL, "gpt eval: %zu %s is shorter than one window of %d", len,
                       what, T + 1);
    size_t windows = (len - 1) / (size_t)T;
    size_t bt = (size_t)B * T;
    int *ids = malloc(2 * bt * sizeof(int));
    if (ids == NULL) return vl_fail(err, VL_ENOMEM, "gpt eval: out of memory");
    int *inputs = ids, *targets = ids + bt;
    double total = 0.0;
    size_t tokens = 0, w = 0;
    int rc = 0;
    for (int batch = 0; w < windows && (max_batches <= 0 || batch < max_batches); batch++) {
        int nb = 0;
        for (; nb < B && w < windows; nb++, w++) {
            size_t src = w * (size_t)T;
            for (int t = 0; t < T; t++) {
                inputs[(size_t)nb * T + t] = eval_token(seq, width, src + (size_t)t);
                targets[(size_t)nb * T + t] = eval_token(seq, width, src + (size_t)t + 1);
            }
        }
        rc = gpt_forward_impl(m, inputs, targets, nb, T, err);
        if (rc != 0) break;
        total += m->loss_sum;
        tokens += (size_t)nb * T;
    }
    free(ids);
    m->can_backward = 0;
    if (rc != 0) return rc;
    *mean_loss = (float)(total / (double)tokens);
    return 0;
}

int model_gpt_eval_bytes(model_gpt *m, const uint8_t *bytes, size_t len, int B, int T,
                         int max_batches, float *mean_loss, vl_error *err) {
    if (m->cfg.vocab_size < 256)
        return vl_fail(err, VL_EINVAL, "gpt eval: byte data needs vocab_size >= 256, have %d",
                       m->cfg.vocab_size);
    return eval_seq(m, bytes, 1, len, B, T, max_batches, mean_loss, "bytes", err);
}

int model_gpt_eval_tokens(model_gpt *m, const uint16_t *tokens, size_t n, int B, int T,
                          int max_batches, float *mean_loss, vl_error *err) {
    return eval_seq(m, tokens, 2, n, B, T, max_batches, mean_loss, "tokens", err);
}
