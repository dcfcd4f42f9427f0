/*
 * The reconstruction decoder of model/recon.h: a GELU MLP regressor with a
 * sigmoid output, trained with Adam on the mean squared error. It keeps
 * the MLP classifier's memory discipline (one allocation for parameters,
 * gradients and optimiser moments, one for the activations of the largest
 * batch planned) and its arithmetic is the CPU kernels', so the sgemm
 * layers, GELU and the Adam update are the tested ones the GPT uses.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/carve.h"
#include "model/recon.h"

/* Prediction and the final error pass run this many rows at a time when
 * training has not planned a larger batch: enough for sgemm to be
 * efficient, small enough that the widest decoder needs 256 MiB at most. */
#define RECON_EVAL_ROWS 256

struct model_recon {
    int q, h, p;
    size_t np;
    float *mem; /* params | grads | Adam m | Adam v */
    float *params, *grads, *am, *av;
    size_t off_b1, off_w2, off_b2; /* W1 is at offset 0 */
    long step;                     /* Adam steps taken */
    vl_rng shuffle;                /* minibatch order, from the seed */
    /* Activations for cap rows, all views into act_mem. z and x are
     * copies of the batch's rows, gathered from wherever the shuffle put
     * them; out is the sigmoid output, which is all its backward needs. */
    float *act_mem;
    int cap;
    float *z, *x, *pre1, *a1, *out, *dout, *da1, *dpre1;
};

/* ---- creation --------------------------------------------------------------------- */

static int check_width(const char *what, int v, vl_error *err) {
    if (v < 1 || v > MODEL_RECON_MAX_WIDTH)
        return vl_fail(err, VL_EINVAL, "recon: %s %d outside [1, %d]", what, v,
                       MODEL_RECON_MAX_WIDTH);
    return 0;
}

static void fill_normal(float *w, size_t n, float std, vl_rng *r) {
    for (size_t i = 0; i < n; i++) w[i] = std * vl_rng_normal(r);
}

int model_recon_create(int q, int hidden, int p, uint64_t seed, model_recon **out, vl_error *err) {
    if (out == NULL) return vl_fail(err, VL_EINVAL, "recon: no output pointer");
    *out = NULL;
    int rc = check_width("q", q, err);
    if (rc == 0) rc = check_width("hidden", hidden, err);
    if (rc == 0) rc = check_width("p", p, err);
    if (rc != 0) return rc;
    /* Each width is at most 2^16, so every product fits in 2^32 and the
     * sum cannot wrap a 64-bit size_t. */
    size_t Q = (size_t)q, H = (size_t)hidden, P = (size_t)p;
    size_t np = Q * H + H + H * P + P;
    if (np > MODEL_RECON_MAX_PARAMS)
        return vl_fail(err, VL_EINVAL, "recon: %zu parameters exceed the limit of %zu", np,
                       (size_t)MODEL_RECON_MAX_PARAMS);
    model_recon *d = calloc(1, sizeof *d);
    if (d == NULL) return vl_fail(err, VL_ENOMEM, "recon: out of memory");
    d->q = q;
    d->h = hidden;
    d->p = p;
    d->np = np;
    d->off_b1 = Q * H;
    d->off_w2 = d->off_b1 + H;
    d->off_b2 = d->off_w2 + H * P;
    carver cv = {NULL, 0, 0};
    for (int i = 0; i < 4; i++) (void)carve(&cv, np, 1);
    /* calloc: the gradients and Adam's moments must start at zero. */
    d->mem = calloc(cv.used, sizeof(float));
    if (d->mem == NULL) {
        free(d);
        return vl_fail(err, VL_ENOMEM, "recon: out of memory for %zu parameters", np);
    }
    cv = (carver){d->mem, 0, 0};
    d->params = carve(&cv, np, 1);
    d->grads = carve(&cv, np, 1);
    d->am = carve(&cv, np, 1);
    d->av = carve(&cv, np, 1);
    /* Variance 1/fan_in keeps the pre-activations of both layers on the
     * scale of their inputs whatever the widths, so training starts in
     * GELU's and the sigmoid's responsive range. */
    vl_rng r;
    vl_rng_seed(&r, seed);
    fill_normal(d->params, Q * H, (float)(1.0 / sqrt((double)q)), &r);
    fill_normal(d->params + d->off_w2, H * P, (float)(1.0 / sqrt((double)hidden)), &r);
    vl_rng_seed(&d->shuffle, vl_rng_u64(&r));
    *out = d;
    return 0;
}

void model_recon_free(model_recon *d) {
    if (d == NULL) return;
    free(d->act_mem);
    free(d->mem);
    free(d);
}

size_t model_recon_num_params(const model_recon *d) {
    return d->np;
}

float *model_recon_params(model_recon *d) {
    return d->params;
}

float *model_recon_grads(model_recon *d) {
    return d->grads;
}

/* ---- activation planning ---------------------------------------------------------- */

/* Assigns the buffers for cap rows from base (NULL: only measures) and
 * returns the floats used, 0 when a size would wrap. */
static size_t layout_acts(model_recon *d, float *base, size_t cap) {
    carver cv = {base, 0, 0};
    size_t Q = (size_t)d->q, H = (size_t)d->h, P = (size_t)d->p;
    d->z = carve(&cv, cap, Q);
    d->x = carve(&cv, cap, P);
    d->pre1 = carve(&cv, cap, H);
    d->a1 = carve(&cv, cap, H);
    d->out = carve(&cv, cap, P);
    d->dout = carve(&cv, cap, P);
    d->da1 = carve(&cv, cap, H);
    d->dpre1 = carve(&cv, cap, H);
    return cv.overflow ? 0 : cv.used;
}

/* The kernels index with int: every [B, width] buffer must stay
 * addressable as one, with room to spare as the MLP allows. */
static int check_rows(const model_recon *d, const char *what, int B, vl_error *err) {
    int widest = d->q > d->h ? d->q : d->h;
    widest = d->p > widest ? d->p : widest;
    if ((long long)B * widest > INT_MAX / 4)
        return vl_fail(err, VL_EINVAL, "recon %s: %d rows are too many for width %d", what, B,
                       widest);
    return 0;
}

/* Makes the buffers hold B rows, reallocating only when B exceeds the
 * plan. */
static int plan_acts(model_recon *d, int B, vl_error *err) {
    if (d->act_mem && B <= d->cap) return 0;
    free(d->act_mem);
    d->act_mem = NULL;
    d->cap = 0;
    size_t n = layout_acts(d, NULL, (size_t)B);
    if (n == 0 || n > SIZE_MAX / sizeof(float))
        return vl_fail(err, VL_EINVAL, "recon: activations for %d rows do not fit in memory", B);
    d->act_mem = malloc(n * sizeof(float));
    if (d->act_mem == NULL)
        return vl_fail(err, VL_ENOMEM, "recon: cannot allocate activations for %d rows", B);
    layout_acts(d, d->act_mem, (size_t)B);
    d->cap = B;
    return 0;
}

/* ---- input checks ----------------------------------------------------------------- */

/* NaN fails both comparisons, so it is refused with the infinities. */
static int check_finite(const char *what, const char *name, const float *v, size_t n,
                        vl_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!(v[i] >= -FLT_MAX && v[i] <= FLT_MAX))
            return vl_fail(err, VL_ERANGE, "recon %s: %s[%zu] = %g is not finite", what, name, i,
                           (double)v[i]);
    return 0;
}

/* The sigmoid output cannot leave [0, 1], so a target outside it is most
 * likely bytes passed without scaling by 1/255: refused, not fitted badly. */
static int check_pixels(const char *what, const float *X, size_t n, vl_error *err) {
    int rc = check_finite(what, "X", X, n, err);
    for (size_t i = 0; i < n && rc == 0; i++)
        if (X[i] < 0.0f || X[i] > 1.0f)
            rc = vl_fail(err, VL_EINVAL, "recon %s: X[%zu] = %g outside [0, 1]", what, i,
                         (double)X[i]);
    return rc;
}

/* What every pass over n rows checks before reading them; X may be NULL
 * (prediction). */
static int check_args(const model_recon *d, const char *what, const float *Z, const float *X,
                      int need_x, int n, vl_error *err) {
    if (d == NULL) return vl_fail(err, VL_EINVAL, "recon %s: no decoder", what);
    if (Z == NULL || (need_x && X == NULL))
        return vl_fail(err, VL_EINVAL, "recon %s: missing %s", what, Z == NULL ? "Z" : "X");
    if (n < 1 || n > MODEL_RECON_MAX_ROWS)
        return vl_fail(err, VL_EINVAL, "recon %s: %d rows outside [1, %d]", what, n,
                       MODEL_RECON_MAX_ROWS);
    return 0;
}

/* The values themselves, scanned last so that a call refused for its
 * sizes fails before reading arrays that may not be as long as n says. */
static int check_values(const model_recon *d, const char *what, const float *Z, const float *X,
                        int n, vl_error *err) {
    int rc = check_finite(what, "Z", Z, (size_t)n * (size_t)d->q, err);
    if (rc == 0 && X) rc = check_pixels(what, X, (size_t)n * (size_t)d->p, err);
    return rc;
}

/* ---- forward and backward --------------------------------------------------------- */

/* out = sigmoid(gelu(z W1 + b1) W2 + b2) for the B rows in d->z. */
static void forward(model_recon *d, int B) {
    const float *P = d->params;
    size_t nh = (size_t)B * (size_t)d->h, no = (size_t)B * (size_t)d->p;
    kernels_matmul_forward(d->pre1, d->z, P, P + d->off_b1, B, d->q, d->h);
    kernels_gelu_forward(d->a1, d->pre1, nh);
    kernels_matmul_forward(d->out, d->a1, P + d->off_w2, P + d->off_b2, B, d->h, d->p);
    /* expf overflows to infinity for very negative inputs, which gives
     * exactly 0, not NaN. */
    for (size_t i = 0; i < no; i++) d->out[i] = 1.0f / (1.0f + expf(-d->out[i]));
}

/* Sum of squared errors of the last forward against d->x. */
static double sse(const model_recon *d, int B) {
    size_t no = (size_t)B * (size_t)d->p;
    double s = 0.0;
    for (size_t i = 0; i < no; i++) {
        double e = (double)d->out[i] - (double)d->x[i];
        s += e * e;
    }
    return s;
}

/* Overwrites the gradient with that of the mean squared error of the last
 * forward. The kernels add into what they produce, so each target is
 * zeroed first. */
static void backward(model_recon *d, int B) {
    size_t nh = (size_t)B * (size_t)d->h, no = (size_t)B * (size_t)d->p;
    float scale = (float)(2.0 / ((double)B * (double)d->p));
    for (size_t i = 0; i < no; i++) {
        float s = d->out[i];
        d->dout[i] = scale * (s - d->x[i]) * s * (1.0f - s);
    }
    const float *P = d->params;
    float *G = d->grads;
    memset(G, 0, d->np * sizeof(float));
    memset(d->da1, 0, nh * sizeof(float));
    kernels_matmul_backward(d->da1, G + d->off_w2, G + d->off_b2, d->dout, d->a1, P + d->off_w2, B,
                            d->h, d->p);
    memset(d->dpre1, 0, nh * sizeof(float));
    kernels_gelu_backward(d->dpre1, d->pre1, d->da1, nh);
    kernels_matmul_backward(NULL, G, G + d->off_b1, d->dpre1, d->z, P, B, d->q, d->h);
}

/* Copies rows idx[0..B) (or first..first+B when idx is NULL) of Z and X
 * into the batch buffers. */
static void gather(model_recon *d, const float *Z, const float *X, const uint32_t *idx,
                   size_t first, int B) {
    size_t Q = (size_t)d->q, P = (size_t)d->p;
    for (int b = 0; b < B; b++) {
        size_t r = idx ? idx[b] : first + (size_t)b;
        memcpy(d->z + (size_t)b * Q, Z + r * Q, Q * sizeof(float));
        if (X) memcpy(d->x + (size_t)b * P, X + r * P, P * sizeof(float));
    }
}

int model_recon_loss_grad(model_recon *d, const float *Z, const float *X, int B, double *loss,
                          vl_error *err) {
    int rc = check_args(d, "loss", Z, X, 1, B, err);
    if (rc == 0 && B > MODEL_RECON_MAX_BATCH)
        rc = vl_fail(err, VL_EINVAL, "recon loss: %d rows exceed the batch limit of %d", B,
                     MODEL_RECON_MAX_BATCH);
    if (rc == 0) rc = check_rows(d, "loss", B, err);
    if (rc == 0) rc = check_values(d, "loss", Z, X, B, err);
    if (rc == 0) rc = plan_acts(d, B, err);
    if (rc != 0) return rc;
    gather(d, Z, X, NULL, 0, B);
    forward(d, B);
    if (loss) *loss = sse(d, B) / ((double)B * (double)d->p);
    backward(d, B);
    return 0;
}

/* Runs the n rows through the decoder in planned-size chunks: writes the
 * outputs to Xhat when it is non-NULL, adds the squared error against X
 * to *total when X is non-NULL. */
static int pass_rows(model_recon *d, const float *Z, const float *X, int n, float *Xhat,
                     double *total, vl_error *err) {
    int chunk = d->cap > RECON_EVAL_ROWS ? d->cap : RECON_EVAL_ROWS;
    chunk = chunk < n ? chunk : n;
    int rc = plan_acts(d, chunk, err);
    if (rc != 0) return rc;
    size_t P = (size_t)d->p;
    double s = 0.0;
    for (int first = 0; first < n; first += chunk) {
        int B = n - first < chunk ? n - first : chunk;
        gather(d, Z, X, NULL, (size_t)first, B);
        forward(d, B);
        if (X) s += sse(d, B);
        if (Xhat) memcpy(Xhat + (size_t)first * P, d->out, (size_t)B * P * sizeof(float));
    }
    if (total) *total = s;
    return 0;
}

int model_recon_predict(model_recon *d, const float *Z, int n, float *Xhat, vl_error *err) {
    if (Xhat == NULL) return vl_fail(err, VL_EINVAL, "recon predict: no output array");
    int rc = check_args(d, "predict", Z, NULL, 0, n, err);
    if (rc == 0) rc = check_values(d, "predict", Z, NULL, n, err);
    return rc == 0 ? pass_rows(d, Z, NULL, n, Xhat, NULL, err) : rc;
}

/* ---- training --------------------------------------------------------------------- */

int model_recon_train(model_recon *d, const float *Z, const float *X, int n, int epochs, int batch,
                      float lr, double *final_mse, vl_error *err) {
    int rc = check_args(d, "train", Z, X, 1, n, err);
    if (rc != 0) return rc;
    if (epochs < 1 || epochs > MODEL_RECON_MAX_EPOCHS)
        return vl_fail(err, VL_EINVAL, "recon train: %d epochs outside [1, %d]", epochs,
                       MODEL_RECON_MAX_EPOCHS);
    if (batch < 1 || batch > MODEL_RECON_MAX_BATCH)
        return vl_fail(err, VL_EINVAL, "recon train: batch %d outside [1, %d]", batch,
                       MODEL_RECON_MAX_BATCH);
    if (!(lr > 0.0f && lr <= 10.0f))
        return vl_fail(err, VL_EINVAL, "recon train: learning rate %g outside (0, 10]", (double)lr);
    int B = batch < n ? batch : n;
    rc = check_rows(d, "train", B, err);
    if (rc == 0) rc = check_values(d, "train", Z, X, n, err);
    if (rc == 0) rc = plan_acts(d, B, err);
    if (rc != 0) return rc;
    uint32_t *perm = malloc((size_t)n * sizeof *perm);
    if (perm == NULL) return vl_fail(err, VL_ENOMEM, "recon train: out of memory for %d rows", n);
    kernels_adamw_hparams hp = {
        .lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f};
    for (int e = 0; e < epochs; e++) {
        /* Each epoch shuffles the identity, so its order depends on the
         * shuffling stream alone and not on how epochs were split between
         * calls. */
        for (int i = 0; i < n; i++) perm[i] = (uint32_t)i;
        for (int i = n - 1; i > 0; i--) {
            uint32_t j = vl_rng_below(&d->shuffle, (uint32_t)i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int first = 0; first < n; first += B) {
            int b = n - first < B ? n - first : B;
            gather(d, Z, X, perm + first, 0, b);
            forward(d, b);
            backward(d, b);
            hp.step = ++d->step;
            kernels_adamw_step(d->params, d->grads, d->am, d->av, NULL, d->np, &hp);
        }
    }
    free(perm);
    if (final_mse == NULL) return 0;
    double total = 0.0;
    rc = pass_rows(d, Z, X, n, NULL, &total, err);
    if (rc == 0) *final_mse = total / ((double)n * (double)d->p);
    return rc;
}

double model_recon_mse(const float *a, const float *b, size_t n) {
    if (a == NULL || b == NULL || n == 0) return NAN;
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        s += e * e;
    }
    return s / (double)n;
}
