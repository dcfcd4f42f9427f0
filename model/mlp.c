/*
 * The MLP classifier and the synthetic federated classification data that
 * the federated-learning experiments train it on (see model.h). The MLP
 * mirrors the GPT's memory discipline: parameters and gradients are two
 * flat vectors described by one tensor table, and every activation of a
 * batch lives in one allocation planned for the largest batch seen. The
 * arithmetic is the CPU kernels' (sgemm linear layers, im2col
 * convolutions, GELU, softmax cross-entropy), so the two models share one
 * tested implementation; the layers themselves run through mlp_layers.c,
 * which the split-learning parts share.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "kernels/kernels.h"
#include "model/carve.h"
#include "model/mlp_internal.h"
#include "model/model.h"

/* Evaluation chunks never force a plan larger than this many rows. */
#define MLP_EVAL_ROWS 256

/* Activations of one planned batch capacity, all views into mem. Layer k
 * (conv or dense, 0 .. n_layers-1) maps its input (x, or act[k-1]) to
 * pre[k]; for every layer but the last act[k] = gelu(pre[k]), for the last
 * pre[k] is the logits. */
typedef struct mlp_acts {
    float *mem;
    int *labels; /* [cap], copy of the last forward's labels */
    int cap;     /* rows planned for */
    float *x;    /* [cap,D], copy of the last forward's inputs (the first
                  * layer's weight gradient needs them after the caller
                  * may have reused its buffer) */
    float *pre[MLP_MAX_LAYERS];
    float *act[MLP_MAX_LAYERS];
    float *probs;  /* [cap,C] */
    float *losses; /* [cap] */
    /* backward: each layer's output gradient (kept, for K-FAC and other
     * callers of model_mlp_layer_io), and a [cap, widest hidden] buffer for
     * the gradient of a hidden layer's activation */
    float *dout[MLP_MAX_LAYERS];
    float *da;
    float *scratch; /* the conv layers' (mlp_scratch_floats), NULL without */
} mlp_acts;

struct model_mlp {
    model_mlp_config cfg;
    mlp_net net;  /* the layers; net.width[0] = D, net.width[n_layers] = C */
    int n_layers; /* net.n_layers */
    model_tensor tensors[2 * MLP_MAX_LAYERS];
    size_t num_params;
    float *params, *grads;
    mlp_acts acts;
    int B;
    int have_output, can_backward;
    int have_dout; /* acts.dout holds the output gradients of the last forward */
    double loss_sum;
};

/* ---- the model ------------------------------------------------------------ */

static void add_tensor(model_mlp *m, int idx, int ndim, size_t d0, size_t d1, size_t *off,
                       const char *kind, int layer) {
    model_tensor *t = &m->tensors[idx];
    /* Conv layers and dense layers are counted apart, so the dense names
     * of a model without conv layers are what they always were.
     * "conv.3.weight" is the longest name, far inside the 64-byte field. */
    int conv = layer < m->net.n_conv;
    snprintf(t->name, sizeof t->name, "%s.%d.%s", conv ? "conv" : "fc",
             conv ? layer : layer - m->net.n_conv, kind);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 0;
    t->numel = ndim == 2 ? d0 * d1 : d0;
    t->offset = *off;
    *off += t->numel;
}

static void free_acts(model_mlp *m) {
    free(m->acts.mem);
    free(m->acts.labels);
    memset(&m->acts, 0, sizeof m->acts);
    m->have_output = 0;
    m->can_backward = 0;
    m->have_dout = 0;
}

int model_mlp_create(const model_mlp_config *cfg, model_mlp **out, vl_error *err) {
    if (out == NULL) return vl_fail(err, VL_EINVAL, "mlp: no output pointer");
    *out = NULL;
    int rc = model_mlp_config_validate(cfg, err);
    if (rc != 0) return rc;
    model_mlp *m = calloc(1, sizeof *m);
    if (m == NULL) return vl_fail(err, VL_ENOMEM, "mlp: out of memory");
    m->cfg = *cfg;
    mlp_net_build(cfg, &m->net);
    m->n_layers = m->net.n_layers;
    size_t off = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const mlp_layer *L = &m->net.layer[l];
        /* Dense weights are [in, out]; conv weights [channels, C_in*k*k]. */
        size_t rows = L->conv ? L->bsize : (size_t)L->in;
        add_tensor(m, 2 * l, 2, rows, L->wsize / rows, &off, "weight", l);
        add_tensor(m, 2 * l + 1, 1, L->bsize, 0, &off, "bias", l);
    }
    m->num_params = off;
    m->params = calloc(off, sizeof(float));
    m->grads = calloc(off, sizeof(float));
    if (m->params == NULL || m->grads == NULL) {
        model_mlp_free(m);
        return vl_fail(err, VL_ENOMEM, "mlp: out of memory for %zu parameters", off);
    }
    *out = m;
    return 0;
}

void model_mlp_free(model_mlp *m) {
    if (m == NULL) return;
    free_acts(m);
    free(m->params);
    free(m->grads);
    free(m);
}

void model_mlp_init_weights(model_mlp *m, uint64_t seed) {
    vl_rng r;
    vl_rng_seed(&r, seed);
    for (int l = 0; l < m->n_layers; l++) {
        const model_tensor *w = &m->tensors[2 * l], *b = &m->tensors[2 * l + 1];
        /* Weights per output unit: the input width of a dense layer,
         * C_in*k*k of a conv layer. */
        double fan_in = (double)(w->numel / b->numel);
        int last = l == m->n_layers - 1;
        float std = (float)sqrt((last ? 0.01 : 2.0) / fan_in);
        float *p = m->params + w->offset;
        for (size_t k = 0; k < w->numel; k++) p[k] = std * vl_rng_normal(&r);
        memset(m->params + b->offset, 0, b->numel * sizeof(float));
    }
    m->have_output = 0;
    m->can_backward = 0;
    m->have_dout = 0;
}

model_mlp_config model_mlp_config_get(const model_mlp *m) {
    return m->cfg;
}

size_t model_mlp_num_params(const model_mlp *m) {
    return m->num_params;
}

float *model_mlp_params(model_mlp *m) {
    return m->params;
}

float *model_mlp_grads(model_mlp *m) {
    return m->grads;
}

int model_mlp_tensors(const model_mlp *m, const model_tensor **out) {
    if (out) *out = m->tensors;
    return 2 * m->n_layers;
}

void model_mlp_zero_grad(model_mlp *m) {
    memset(m->grads, 0, m->num_params * sizeof(float));
}

/* ---- activation planning -------------------------------------------------- */

/* Assigns the buffers for cap rows starting at base (NULL: only measures)
 * and returns the number of floats used, or 0 when a size would wrap. */
static size_t layout_acts(const model_mlp *m, mlp_acts *a, float *base, int cap_rows) {
    carver cv = {base, 0, 0};
    size_t widest = 0, cap = (size_t)cap_rows;
    a->x = carve(&cv, cap, (size_t)m->cfg.in_dim);
    for (int l = 0; l < m->n_layers; l++) {
        size_t w = (size_t)m->net.width[l + 1];
        a->pre[l] = carve(&cv, cap, w);
        if (l < m->n_layers - 1) {
            a->act[l] = carve(&cv, cap, w);
            widest = w > widest ? w : widest;
        }
    }
    size_t C = (size_t)m->cfg.n_classes;
    a->probs = carve(&cv, cap, C);
    a->losses = carve(&cv, cap, 1);
    for (int l = 0; l < m->n_layers; l++) a->dout[l] = carve(&cv, cap, (size_t)m->net.width[l + 1]);
    a->da = carve(&cv, cap, widest);
    size_t scratch = mlp_scratch_floats(&m->net, 0, m->n_layers, cap_rows);
    a->scratch = scratch > 0 ? carve(&cv, scratch, 1) : NULL;
    return cv.overflow ? 0 : cv.used;
}

/* Makes the buffers hold B rows, growing (and forgetting the last forward)
 * only when B exceeds the plan. */
static int plan_acts(model_mlp *m, int B, vl_error *err) {
    mlp_acts *a = &m->acts;
    if (a->mem && B <= a->cap) return 0;
    free_acts(m);
    size_t n = layout_acts(m, a, NULL, B);
    if (n == 0 || n > SIZE_MAX / sizeof(float))
        return vl_fail(err, VL_EINVAL, "mlp: activations for %d rows do not fit in memory", B);
    a->mem = malloc(n * sizeof(float));
    a->labels = malloc((size_t)B * sizeof(int));
    if (a->mem == NULL || a->labels == NULL) {
        free_acts(m);
        return vl_fail(err, VL_ENOMEM, "mlp: cannot allocate activations for %d rows", B);
    }
    layout_acts(m, a, a->mem, B);
    a->cap = B;
    return 0;
}

/* ---- forward and backward ------------------------------------------------- */

static int check_labels(const model_mlp *m, const int *labels, int n, vl_error *err) {
    return mlp_check_labels(labels, n, m->cfg.n_classes, err);
}

static int check_batch(const model_mlp *m, const float *x, const int *labels, int B,
                       vl_error *err) {
    if (x == NULL) return vl_fail(err, VL_EINVAL, "mlp forward: no inputs");
    /* The kernels index with int: every [B, width] buffer must stay
     * addressable as one. */
    int rc = mlp_check_rows(B, m->net.width, m->n_layers + 1, "mlp forward", err);
    if (rc != 0) return rc;
    return labels ? check_labels(m, labels, B, err) : 0;
}

static int forward_impl(model_mlp *m, const float *x, const int *labels, int B, vl_error *err) {
    int rc = check_batch(m, x, labels, B, err);
    if (rc != 0) return rc;
    m->have_output = 0;
    m->can_backward = 0;
    m->have_dout = 0;
    rc = plan_acts(m, B, err);
    if (rc != 0) return rc;
    mlp_acts *a = &m->acts;
    const float *P = m->params;
    memcpy(a->x, x, (size_t)B * (size_t)m->cfg.in_dim * sizeof(float));
    const float *in = a->x;
    for (int l = 0; l < m->n_layers; l++) {
        int OUT = m->net.width[l + 1];
        mlp_layer_forward(&m->net.layer[l], a->pre[l], in, P + m->tensors[2 * l].offset,
                          P + m->tensors[2 * l + 1].offset, B, a->scratch);
        if (l < m->n_layers - 1) {
            kernels_gelu_forward(a->act[l], a->pre[l], (size_t)B * OUT);
            in = a->act[l];
        }
    }
    int C = m->cfg.n_classes;
    const float *logits = a->pre[m->n_layers - 1];
    m->loss_sum = 0.0;
    if (labels) {
        memcpy(a->labels, labels, (size_t)B * sizeof(int));
        kernels_softmax_xent_forward(a->probs, a->losses, logits, a->labels, B, C);
        double s = 0.0;
        for (int i = 0; i < B; i++) s += a->losses[i];
        m->loss_sum = s;
        m->can_backward = 1;
    } else {
        kernels_softmax_xent_forward(a->probs, NULL, logits, NULL, B, C);
    }
    m->B = B;
    m->have_output = 1;
    m->have_dout = 0;
    return 0;
}

int model_mlp_forward(model_mlp *m, const float *x, const int *labels, int B, float *loss,
                      vl_error *err) {
    int rc = forward_impl(m, x, labels, B, err);
    if (rc == 0 && loss) *loss = labels ? (float)(m->loss_sum / B) : 0.0f;
    return rc;
}

const float *model_mlp_logits(const model_mlp *m) {
    return m->have_output ? m->acts.pre[m->n_layers - 1] : NULL;
}

const float *model_mlp_probs(const model_mlp *m) {
    return m->have_output ? m->acts.probs : NULL;
}

int model_mlp_backward(model_mlp *m, vl_error *err) {
    if (!m->can_backward)
        return vl_fail(err, VL_EINVAL,
                       "mlp backward: needs a forward pass with labels first (once per forward)");
    m->can_backward = 0;
    mlp_acts *a = &m->acts;
    int B = m->B, C = m->cfg.n_classes;
    const float *P = m->params;
    float *G = m->grads;
    kernels_softmax_xent_backward(a->dout[m->n_layers - 1], a->probs, a->labels, 1.0f / (float)B, B,
                                  C);
    /* dout[l] is the gradient of layer l's output (pre-activation); the
     * layer below gets d(act) in da, which GELU's backward turns into
     * dout[l - 1]. The kernels add, so both are zeroed first. */
    for (int l = m->n_layers - 1; l >= 0; l--) {
        const float *in = l > 0 ? a->act[l - 1] : a->x;
        size_t nin = (size_t)B * (size_t)m->net.width[l];
        if (l > 0) memset(a->da, 0, nin * sizeof(float));
        mlp_layer_backward(&m->net.layer[l], l > 0 ? a->da : NULL, G + m->tensors[2 * l].offset,
                           G + m->tensors[2 * l + 1].offset, a->dout[l], in,
                           P + m->tensors[2 * l].offset, B, a->scratch);
        if (l > 0) {
            memset(a->dout[l - 1], 0, nin * sizeof(float));
            kernels_gelu_backward(a->dout[l - 1], a->pre[l - 1], a->da, nin);
        }
    }
    m->have_dout = 1;
    return 0;
}

/* K-FAC's factors (model_mlp_layer_io) describe linear layers only. */
static int check_dense_only(const model_mlp *m, const char *what, vl_error *err) {
    if (m->net.n_conv > 0)
        return vl_fail(err, VL_EINVAL,
                       "%s: K-FAC takes dense-only models; this one has %d conv layers", what,
                       m->net.n_conv);
    return 0;
}

int model_mlp_output_grads(model_mlp *m, const int *labels, vl_error *err) {
    int rc = check_dense_only(m, "mlp output gradients", err);
    if (rc != 0) return rc;
    if (!m->have_output)
        return vl_fail(err, VL_EINVAL, "mlp output gradients: needs a forward pass first");
    if (labels == NULL) return vl_fail(err, VL_EINVAL, "mlp output gradients: no labels");
    rc = check_labels(m, labels, m->B, err);
    if (rc != 0) return rc;
    mlp_acts *a = &m->acts;
    int B = m->B, L = m->n_layers;
    const float *P = m->params;
    kernels_softmax_xent_backward(a->dout[L - 1], a->probs, labels, 1.0f / (float)B, B,
                                  m->cfg.n_classes);
    /* The same chain as model_mlp_backward without the weight gradients:
     * d(act) = dout W^T, then GELU's backward. */
    for (int l = L - 1; l > 0; l--) {
        int IN = m->net.width[l], OUT = m->net.width[l + 1];
        size_t nin = (size_t)B * IN;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, IN, OUT, 1.0f, a->dout[l], OUT,
                    P + m->tensors[2 * l].offset, OUT, 0.0f, a->da, IN);
        memset(a->dout[l - 1], 0, nin * sizeof(float));
        kernels_gelu_backward(a->dout[l - 1], a->pre[l - 1], a->da, nin);
    }
    m->have_dout = 1;
    return 0;
}

int model_mlp_layer_io(const model_mlp *m, int l, const float **x, const float **dy, int *B,
                       vl_error *err) {
    int rc = check_dense_only(m, "mlp layer io", err);
    if (rc != 0) return rc;
    if (l < 0 || l >= m->n_layers)
        return vl_fail(err, VL_EINVAL, "mlp layer %d: the model has layers 0..%d", l,
                       m->n_layers - 1);
    if (!m->have_dout)
        return vl_fail(err, VL_EINVAL,
                       "mlp layer %d: needs a backward pass (or "
                       "model_mlp_output_grads) after the last forward",
                       l);
    *x = l > 0 ? m->acts.act[l - 1] : m->acts.x;
    *dy = m->acts.dout[l];
    *B = m->B;
    return 0;
}

/* ---- evaluation ------------------------------------------------------------ */

int model_mlp_evaluate(model_mlp *m, const float *x, const int *labels, int n, double *mean_loss,
                       double *accuracy, vl_error *err) {
    if (x == NULL || labels == NULL)
        return vl_fail(err, VL_EINVAL, "mlp evaluate: missing inputs or labels");
    if (n < 1) return vl_fail(err, VL_EINVAL, "mlp evaluate: %d samples (need >= 1)", n);
    /* Checked here too so a bad label is named by its index in the whole
     * set, not in its chunk. */
    int rc = check_labels(m, labels, n, err);
    if (rc != 0) return rc;
    int chunk = m->acts.cap > MLP_EVAL_ROWS ? m->acts.cap : MLP_EVAL_ROWS;
    int C = m->cfg.n_classes;
    size_t D = (size_t)m->cfg.in_dim;
    double loss = 0.0;
    long correct = 0;
    for (int s = 0; s < n && rc == 0; s += chunk) {
        int b = n - s < chunk ? n - s : chunk;
        rc = forward_impl(m, x + (size_t)s * D, labels + s, b, err);
        if (rc != 0) break;
        loss += m->loss_sum;
        const float *lg = m->acts.pre[m->n_layers - 1];
        for (int i = 0; i < b; i++) {
            const float *row = lg + (size_t)i * C;
            int best = 0;
            for (int c = 1; c < C; c++)
                if (row[c] > row[best]) best = c;
            correct += best == labels[s + i];
        }
    }
    m->can_backward = 0;
    m->have_dout = 0;
    if (rc != 0) return rc;
    if (mean_loss) *mean_loss = loss / n;
    if (accuracy) *accuracy = (double)correct / n;
    return 0;
}

int model_mlp_accuracy(model_mlp *m, const float *x, const int *labels, int B, double *acc,
                       vl_error *err) {
    return model_mlp_evaluate(m, x, labels, B, NULL, acc, err);
}

/* ---- synthetic federated data --------------------------------------------- */

/* Streams are told apart by a tag mixed into the key. */
enum { FED_CENTRES = 1, FED_DIST = 2, FED_PEER = 3, FED_VALID = 4 };
#define FED_MAX_INDEX ((uint64_t)1 << 62)

model_fed_synth_config model_fed_synth_config_default(void) {
    model_fed_synth_config c = {.dim = 32,
                                .n_classes = 10,
                                .modes = 1,
                                .alpha = 0.5f,
                                .separation = 1.0f,
                                .noise = 1.0f,
                                .seed = 1};
    return c;
}

int model_fed_synth_config_validate(const model_fed_synth_config *c, vl_error *err) {
    if (c == NULL) return vl_fail(err, VL_EINVAL, "fed synth config: missing");
    const char *cfg = "fed synth config";
    int rc = mlp_check_field(cfg, "dim", c->dim, 1, MODEL_MLP_MAX_WIDTH, err);
    if (rc == 0) rc = mlp_check_field(cfg, "n_classes", c->n_classes, 2, MODEL_MLP_MAX_WIDTH, err);
    if (rc == 0) rc = mlp_check_field(cfg, "modes", c->modes, 1, MODEL_FED_MAX_MODES, err);
    if (rc != 0) return rc;
    /* Written so NaN fails every comparison and is refused. */
    if (!(c->alpha >= MODEL_FED_MIN_ALPHA && c->alpha <= MODEL_FED_MAX_ALPHA))
        return vl_fail(err, VL_EINVAL, "fed synth config: alpha %g outside [%g, %g]",
                       (double)c->alpha, (double)MODEL_FED_MIN_ALPHA, (double)MODEL_FED_MAX_ALPHA);
    if (!(c->separation > 0.0f && c->separation <= FLT_MAX))
        return vl_fail(err, VL_EINVAL, "fed synth config: separation %g must be > 0 and finite",
                       (double)c->separation);
    if (!(c->noise >= 0.0f && c->noise <= FLT_MAX))
        return vl_fail(err, VL_EINVAL, "fed synth config: noise %g must be >= 0 and finite",
                       (double)c->noise);
    size_t centres = (size_t)c->n_classes * (size_t)c->modes * (size_t)c->dim; /* < 2^36 */
    if (centres > MODEL_FED_MAX_CENTRE_FLOATS)
        return vl_fail(err, VL_EINVAL,
                       "fed synth config: n_classes * modes * dim = %zu exceeds the limit of %zu",
                       centres, (size_t)MODEL_FED_MAX_CENTRE_FLOATS);
    return 0;
}

/* An vl_rng for stream (tag, a, b) of the task seed: a chain of seedings, one
 * per component, so that no two (seed, tag) pairs alias (as seed + tag
 * would). Seeding is injective, so under one (seed, tag, a) distinct b never
 * share a state; other combinations meet only by 64-bit chance. */
static void fed_rng(vl_rng *r, uint64_t seed, uint64_t tag, uint64_t a, uint64_t b) {
    vl_rng_seed(r, seed);
    vl_rng_seed(r, vl_rng_u64(r) + tag);
    vl_rng_seed(r, vl_rng_u64(r) + a);
    vl_rng_seed(r, vl_rng_u64(r) + b);
}

int model_fed_synth_label_dist(const model_fed_synth_config *cfg, int peer, double *probs,
                               vl_error *err) {
    int rc = model_fed_synth_config_validate(cfg, err);
    if (rc != 0) return rc;
    if (peer < 0 || peer > MODEL_FED_MAX_PEER)
        return vl_fail(err, VL_EINVAL, "fed synth: peer %d outside [0, %d]", peer,
                       MODEL_FED_MAX_PEER);
    if (probs == NULL)
        return vl_fail(err, VL_EINVAL, "fed synth: no output for the label distribution");
    vl_rng r;
    fed_rng(&r, cfg->seed, FED_DIST, (uint64_t)peer, 0);
    int C = cfg->n_classes;
    double mx = -INFINITY;
    for (int k = 0; k < C; k++) {
        probs[k] = vl_rng_log_gamma(&r, cfg->alpha);
        mx = probs[k] > mx ? probs[k] : mx;
    }
    /* Normalise relative to the largest draw: that one is exp(0) = 1, so the
     * sum is at least 1 whatever the scale of the logs. */
    double sum = 0.0;
    for (int k = 0; k < C; k++) {
        probs[k] = exp(probs[k] - mx);
        sum += probs[k];
    }
    for (int k = 0; k < C; k++) probs[k] /= sum;
    return 0;
}

/* The shared class centres [C*modes, D], from the task seed alone. */
static float *make_centres(const model_fed_synth_config *cfg, vl_error *err) {
    size_t rows = (size_t)cfg->n_classes * (size_t)cfg->modes, D = (size_t)cfg->dim;
    float *c = malloc(rows * D * sizeof(float)); /* bounded by the config check */
    if (c == NULL) {
        vl_fail(err, VL_ENOMEM, "fed synth: out of memory for %zu centres", rows);
        return NULL;
    }
    vl_rng r;
    fed_rng(&r, cfg->seed, FED_CENTRES, 0, 0);
    for (size_t i = 0; i < rows * D; i++) c[i] = cfg->separation * vl_rng_normal(&r);
    return c;
}

static int check_range(uint64_t first, int n, const float *x, const int *y, vl_error *err) {
    if (x == NULL || y == NULL) return vl_fail(err, VL_EINVAL, "fed synth: missing output arrays");
    if (n < 1) return vl_fail(err, VL_EINVAL, "fed synth: %d samples (need >= 1)", n);
    if (first > FED_MAX_INDEX - (uint64_t)n)
        return vl_fail(err, VL_EINVAL, "fed synth: sample range past 2^62");
    return 0;
}

/* Writes one sample of class y from stream r: a uniform mode of the class,
 * then per-coordinate noise. */
static void draw_point(const model_fed_synth_config *cfg, const float *centres, int y, vl_rng *r,
                       float *x) {
    size_t D = (size_t)cfg->dim;
    uint32_t k = vl_rng_below(r, (uint32_t)cfg->modes);
    const float *c = centres + ((size_t)y * (size_t)cfg->modes + k) * D;
    for (size_t j = 0; j < D; j++) x[j] = c[j] + cfg->noise * vl_rng_normal(r);
}

/* What both generators check before drawing anything. */
static int check_request(const model_fed_synth_config *cfg, uint64_t first, int n, const float *x,
                         const int *y, vl_error *err) {
    int rc = model_fed_synth_config_validate(cfg, err);
    return rc == 0 ? check_range(first, n, x, y, err) : rc;
}

int model_fed_synth_peer(const model_fed_synth_config *cfg, int peer, uint64_t first, int n,
                         float *x, int *y, vl_error *err) {
    int rc = check_request(cfg, first, n, x, y, err);
    if (rc != 0) return rc;
    int C = cfg->n_classes;
    double *cdf = malloc((size_t)C * sizeof(double));
    if (cdf == NULL) return vl_fail(err, VL_ENOMEM, "fed synth: out of memory");
    rc = model_fed_synth_label_dist(cfg, peer, cdf, err); /* also checks peer */
    float *centres = rc == 0 ? make_centres(cfg, err) : NULL;
    if (centres == NULL) {
        free(cdf);
        return rc != 0 ? rc : VL_ENOMEM;
    }
    for (int k = 1; k < C; k++) cdf[k] += cdf[k - 1];
    for (int i = 0; i < n; i++) {
        vl_rng r;
        fed_rng(&r, cfg->seed, FED_PEER, (uint64_t)peer, first + (uint64_t)i);
        /* Inverse CDF by bisection: the first class with u < cdf[k]; the
         * last class takes whatever rounding leaves above cdf[C-1]. */
        double u = vl_rng_uniform_open(&r);
        int lo = 0, hi = C - 1;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (u < cdf[mid])
                hi = mid;
            else
                lo = mid + 1;
        }
        y[i] = lo;
        draw_point(cfg, centres, lo, &r, x + (size_t)i * (size_t)cfg->dim);
    }
    free(centres);
    free(cdf);
    return 0;
}

int model_fed_synth_validation(const model_fed_synth_config *cfg, uint64_t first, int n, float *x,
                               int *y, vl_error *err) {
    int rc = check_request(cfg, first, n, x, y, err);
    if (rc != 0) return rc;
    float *centres = make_centres(cfg, err);
    if (centres == NULL) return VL_ENOMEM;
    for (int i = 0; i < n; i++) {
        uint64_t idx = first + (uint64_t)i;
        vl_rng r;
        fed_rng(&r, cfg->seed, FED_VALID, 0, idx);
        y[i] = (int)(idx % (uint64_t)cfg->n_classes);
        draw_point(cfg, centres, y[i], &r, x + (size_t)i * (size_t)cfg->dim);
    }
    free(centres);
    return 0;
}
