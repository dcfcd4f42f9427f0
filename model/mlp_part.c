/*
 * A range of an MLP's layers for split learning (see mlp_part.h). The part
 * keeps the whole model's memory discipline (mlp.c): parameters and
 * gradients are two flat vectors laid out as the whole model's slice, and
 * every activation of a batch lives in one allocation planned for the
 * largest batch seen. The passes run each layer through mlp_layers.c
 * exactly as model_mlp_forward and model_mlp_backward do, so a chain of
 * parts reproduces the whole model's loss and gradients.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dcor.h"
#include "kernels/kernels.h"
#include "model/carve.h"
#include "model/mlp_internal.h"
#include "model/mlp_part.h"

/* Activations of one planned capacity, all views into mem. Local layer k
 * (global layer first + k, conv or dense) maps its input (x, or act[k-1])
 * to pre[k]; for a hidden layer act[k] = gelu(pre[k]), for the classifier
 * pre[k] is the logits. */
typedef struct part_acts {
    float *mem;
    int cap;  /* rows planned for */
    float *x; /* [cap, in], copy of the last forward's input: the first
               * layer's weight gradient needs it after the caller may have
               * reused its buffer */
    float *pre[MLP_MAX_LAYERS];
    float *act[MLP_MAX_LAYERS]; /* NULL for the classifier */
    /* backward: each layer's output gradient (before the activation), and
     * a [cap, widest interior width] buffer for the gradient of an
     * activation between two of the part's layers */
    float *dout[MLP_MAX_LAYERS];
    float *da;
    float *probs;   /* [cap, C], head only */
    float *losses;  /* [cap], head only */
    float *scratch; /* the conv layers' (mlp_scratch_floats), NULL without */
} part_acts;

struct model_mlp_part {
    model_mlp_config cfg;
    int first, last;
    int n;                         /* last - first layers */
    int head;                      /* last == the model's layer count */
    const mlp_layer *layer;        /* local layer k is net.layer[first + k] */
    mlp_net net;                   /* the whole model's layers */
    int width[MLP_MAX_LAYERS + 1]; /* width[k]: input of local layer k; width[n]: output */
    size_t woff[MLP_MAX_LAYERS];   /* local layer k's weight, in the part's vectors */
    size_t boff[MLP_MAX_LAYERS];   /* and its bias */
    size_t num_params;
    float *params, *grads;
    part_acts acts;
    int B;
    int have_output;
    int have_dloss; /* dout[n-1] holds the loss gradient of the last forward */
};

/* ---- the slice ---------------------------------------------------------------- */

/* Validates cfg and the range, and fills net (the whole model's) so the
 * callers can measure. */
static int check_range(const model_mlp_config *cfg, int first, int last, mlp_net *net,
                       vl_error *err) {
    int rc = model_mlp_config_validate(cfg, err);
    if (rc != 0) return rc;
    mlp_net_build(cfg, net);
    int layers = net->n_layers;
    if (first < 0 || last > layers || first >= last)
        return vl_fail(err, VL_EINVAL,
                       "mlp part: layers [%d, %d) are not a non-empty range within [0, %d)", first,
                       last, layers);
    return 0;
}

/* Floats of layer l's weight and bias (fits: the config check bounds the
 * whole model's count). */
static size_t layer_floats(const mlp_net *net, int l) {
    return net->layer[l].wsize + net->layer[l].bsize;
}

int model_mlp_part_offset(const model_mlp_config *cfg, int first, int last, size_t *offset,
                          size_t *count, vl_error *err) {
    mlp_net net;
    int rc = check_range(cfg, first, last, &net, err);
    if (rc != 0) return rc;
    size_t off = 0, n = 0;
    for (int l = 0; l < last; l++) {
        if (l < first)
            off += layer_floats(&net, l);
        else
            n += layer_floats(&net, l);
    }
    if (offset) *offset = off;
    if (count) *count = n;
    return 0;
}

int model_mlp_part_dims(const model_mlp_config *cfg, int first, int last, int *in_dim, int *out_dim,
                        vl_error *err) {
    mlp_net net;
    int rc = check_range(cfg, first, last, &net, err);
    if (rc != 0) return rc;
    if (in_dim) *in_dim = net.width[first];
    if (out_dim) *out_dim = net.width[last];
    return 0;
}

/* ---- the part ----------------------------------------------------------------- */

static void free_acts(model_mlp_part *p) {
    free(p->acts.mem);
    memset(&p->acts, 0, sizeof p->acts);
    p->have_output = 0;
    p->have_dloss = 0;
    p->B = 0;
}

int model_mlp_part_create(const model_mlp_config *cfg, int first, int last, model_mlp_part **out,
                          vl_error *err) {
    if (out == NULL) return vl_fail(err, VL_EINVAL, "mlp part: no output pointer");
    *out = NULL;
    mlp_net net;
    int rc = check_range(cfg, first, last, &net, err);
    if (rc != 0) return rc;
    model_mlp_part *p = calloc(1, sizeof *p);
    if (p == NULL) return vl_fail(err, VL_ENOMEM, "mlp part: out of memory");
    p->cfg = *cfg;
    p->first = first;
    p->last = last;
    p->n = last - first;
    p->head = last == net.n_layers;
    p->net = net;
    p->layer = p->net.layer + first;
    size_t off = 0;
    for (int k = 0; k <= p->n; k++) p->width[k] = net.width[first + k];
    for (int k = 0; k < p->n; k++) {
        p->woff[k] = off;
        p->boff[k] = off + p->layer[k].wsize;
        off += layer_floats(&net, first + k);
    }
    p->num_params = off;
    p->params = calloc(off, sizeof(float));
    p->grads = calloc(off, sizeof(float));
    if (p->params == NULL || p->grads == NULL) {
        model_mlp_part_free(p);
        return vl_fail(err, VL_ENOMEM, "mlp part: out of memory for %zu parameters", off);
    }
    *out = p;
    return 0;
}

void model_mlp_part_free(model_mlp_part *p) {
    if (p == NULL) return;
    free_acts(p);
    free(p->params);
    free(p->grads);
    free(p);
}

float *model_mlp_part_params(model_mlp_part *p) {
    return p->params;
}

float *model_mlp_part_grads(model_mlp_part *p) {
    return p->grads;
}

size_t model_mlp_part_num_params(const model_mlp_part *p) {
    return p->num_params;
}

void model_mlp_part_zero_grad(model_mlp_part *p) {
    memset(p->grads, 0, p->num_params * sizeof(float));
}

void model_mlp_part_range(const model_mlp_part *p, int *first, int *last) {
    if (first) *first = p->first;
    if (last) *last = p->last;
}

int model_mlp_part_in_dim(const model_mlp_part *p) {
    return p->width[0];
}

int model_mlp_part_out_dim(const model_mlp_part *p) {
    return p->width[p->n];
}

int model_mlp_part_has_head(const model_mlp_part *p) {
    return p->head;
}

/* Whether local layer k is a hidden layer (GELU after it). */
static int is_hidden(const model_mlp_part *p, int k) {
    return !p->head || k < p->n - 1;
}

/* ---- activation planning -------------------------------------------------------- */

/* Assigns the buffers for cap rows starting at base (NULL: only measures)
 * and returns the number of floats used, or 0 when a size would wrap. */
static size_t layout_acts(const model_mlp_part *p, part_acts *a, float *base, size_t cap) {
    carver cv = {base, 0, 0};
    size_t widest = 0;
    a->x = carve(&cv, cap, (size_t)p->width[0]);
    for (int k = 0; k < p->n; k++) {
        size_t w = (size_t)p->width[k + 1];
        a->pre[k] = carve(&cv, cap, w);
        a->act[k] = is_hidden(p, k) ? carve(&cv, cap, w) : NULL;
        a->dout[k] = carve(&cv, cap, w);
        if (k < p->n - 1) widest = w > widest ? w : widest;
    }
    a->da = widest > 0 ? carve(&cv, cap, widest) : NULL;
    if (p->head) {
        a->probs = carve(&cv, cap, (size_t)p->width[p->n]);
        a->losses = carve(&cv, cap, 1);
    }
    /* cap came from an int batch size. */
    size_t scratch = mlp_scratch_floats(&p->net, p->first, p->last, (int)cap);
    a->scratch = scratch > 0 ? carve(&cv, scratch, 1) : NULL;
    return cv.overflow ? 0 : cv.used;
}

/* Makes the buffers hold B rows, growing (and forgetting the last forward)
 * only when B exceeds the plan. */
static int plan_acts(model_mlp_part *p, int B, vl_error *err) {
    part_acts *a = &p->acts;
    if (a->mem && B <= a->cap) return 0;
    free_acts(p);
    size_t n = layout_acts(p, a, NULL, (size_t)B);
    if (n == 0 || n > SIZE_MAX / sizeof(float))
        return vl_fail(err, VL_EINVAL, "mlp part: activations for %d rows do not fit in memory", B);
    a->mem = malloc(n * sizeof(float));
    if (a->mem == NULL) {
        free_acts(p);
        return vl_fail(err, VL_ENOMEM, "mlp part: cannot allocate activations for %d rows", B);
    }
    layout_acts(p, a, a->mem, (size_t)B);
    a->cap = B;
    return 0;
}

/* ---- passes ------------------------------------------------------------------- */

int model_mlp_part_forward(model_mlp_part *p, const float *x, int B, vl_error *err) {
    if (x == NULL) return vl_fail(err, VL_EINVAL, "mlp part forward: no inputs");
    if (B > MODEL_MLP_PART_MAX_BATCH)
        return vl_fail(err, VL_EINVAL, "mlp part forward: batch size %d exceeds the limit of %d", B,
                       MODEL_MLP_PART_MAX_BATCH);
    int rc = mlp_check_rows(B, p->width, p->n + 1, "mlp part forward", err);
    if (rc != 0) return rc;
    p->have_output = 0;
    p->have_dloss = 0;
    rc = plan_acts(p, B, err);
    if (rc != 0) return rc;
    part_acts *a = &p->acts;
    const float *P = p->params;
    memcpy(a->x, x, (size_t)B * (size_t)p->width[0] * sizeof(float));
    const float *in = a->x;
    for (int k = 0; k < p->n; k++) {
        int OUT = p->width[k + 1];
        mlp_layer_forward(&p->layer[k], a->pre[k], in, P + p->woff[k], P + p->boff[k], B,
                          a->scratch);
        if (is_hidden(p, k)) {
            kernels_gelu_forward(a->act[k], a->pre[k], (size_t)B * OUT);
            in = a->act[k];
        }
    }
    p->B = B;
    p->have_output = 1;
    return 0;
}

const float *model_mlp_part_output(const model_mlp_part *p) {
    if (!p->have_output) return NULL;
    int top = p->n - 1;
    return is_hidden(p, top) ? p->acts.act[top] : p->acts.pre[top];
}

int model_mlp_part_batch(const model_mlp_part *p) {
    return p->have_output ? p->B : 0;
}

int model_mlp_part_loss(model_mlp_part *p, const int *labels, float *loss, vl_error *err) {
    if (!p->head)
        return vl_fail(err, VL_EINVAL,
                       "mlp part loss: layers [%d, %d) do not include the classifier (layer %d)",
                       p->first, p->last, p->net.n_layers - 1);
    if (!p->have_output)
        return vl_fail(err, VL_EINVAL, "mlp part loss: needs a forward pass first");
    if (labels == NULL) return vl_fail(err, VL_EINVAL, "mlp part loss: no labels");
    int B = p->B, C = p->cfg.n_classes, top = p->n - 1;
    int rc = mlp_check_labels(labels, B, C, err);
    if (rc != 0) return rc;
    part_acts *a = &p->acts;
    kernels_softmax_xent_forward(a->probs, a->losses, a->pre[top], labels, B, C);
    double s = 0.0;
    for (int i = 0; i < B; i++) s += a->losses[i];
    kernels_softmax_xent_backward(a->dout[top], a->probs, labels, 1.0f / (float)B, B, C);
    p->have_dloss = 1;
    if (loss) *loss = (float)(s / B);
    return 0;
}

int model_mlp_part_backward(model_mlp_part *p, const float *dy, float *dx, vl_error *err) {
    if (!p->have_output)
        return vl_fail(err, VL_EINVAL, "mlp part backward: needs a forward pass first");
    if (dy == NULL && !p->have_dloss)
        return vl_fail(err, VL_EINVAL,
                       "mlp part backward: no output gradient given and no loss gradient to use "
                       "(model_mlp_part_loss, once per backward)");
    part_acts *a = &p->acts;
    int B = p->B, top = p->n - 1;
    size_t nout = (size_t)B * (size_t)p->width[p->n];
    const float *P = p->params;
    float *G = p->grads;
    /* dout[top] becomes the gradient of the top layer's output before its
     * activation; with dy NULL model_mlp_part_loss already put it there. */
    if (dy != NULL && is_hidden(p, top)) {
        memset(a->dout[top], 0, nout * sizeof(float));
        kernels_gelu_backward(a->dout[top], a->pre[top], dy, nout);
    } else if (dy != NULL) {
        memcpy(a->dout[top], dy, nout * sizeof(float));
    }
    p->have_dloss = 0;
    /* The loop of model_mlp_backward over this part's layers: each layer
     * below the top gets d(act) in da, which GELU's backward turns into
     * its dout; the bottom layer's d(input) goes to dx. The kernels add,
     * so every target is zeroed first. */
    for (int k = top; k >= 0; k--) {
        const float *in = k > 0 ? a->act[k - 1] : a->x;
        float *dinp = k > 0 ? a->da : dx;
        size_t nin = (size_t)B * (size_t)p->width[k];
        if (dinp) memset(dinp, 0, nin * sizeof(float));
        mlp_layer_backward(&p->layer[k], dinp, G + p->woff[k], G + p->boff[k], a->dout[k], in,
                           P + p->woff[k], B, a->scratch);
        if (k > 0) {
            memset(a->dout[k - 1], 0, nin * sizeof(float));
            kernels_gelu_backward(a->dout[k - 1], a->pre[k - 1], a->da, nin);
        }
    }
    return 0;
}

/* ---- NoPeek --------------------------------------------------------------------- */

int model_mlp_part_nopeek(const float *X, int p, const float *Z, int q, int B, float alpha,
                          float *dZ, double *dcor, double *scratch, vl_error *err) {
    if (X == NULL || Z == NULL)
        return vl_fail(err, VL_EINVAL, "mlp part nopeek: missing inputs or activations");
    if (B < 2 || B > KERNELS_DCOR_MAX_N)
        return vl_fail(err, VL_EINVAL, "mlp part nopeek: batch size %d outside [2, %d]", B,
                       KERNELS_DCOR_MAX_N);
    if (p < 1 || p > MODEL_MLP_MAX_WIDTH || q < 1 || q > MODEL_MLP_MAX_WIDTH)
        return vl_fail(err, VL_EINVAL, "mlp part nopeek: widths %d and %d outside [1, %d]", p, q,
                       MODEL_MLP_MAX_WIDTH);
    if (!isfinite(alpha))
        return vl_fail(err, VL_EINVAL, "mlp part nopeek: alpha %g is not finite", (double)alpha);
    double *own = NULL;
    if (scratch == NULL) {
        /* At most 2 * 2^28 + 5 * 2^14 doubles for the largest B. */
        own = malloc(kernels_dcor_scratch_doubles(B) * sizeof(double));
        if (own == NULL)
            return vl_fail(err, VL_ENOMEM, "mlp part nopeek: out of memory for %d rows", B);
        scratch = own;
    }
    double v = kernels_dcor(dZ, X, Z, B, p, q, alpha, scratch);
    free(own);
    if (dcor) *dcor = v;
    return 0;
}
