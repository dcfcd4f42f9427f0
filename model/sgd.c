/* SGD with momentum, the other inner optimiser beside AdamW: plain enough
 * to be a reference, and with one float of state per parameter instead of
 * AdamW's two, which matters on small volunteer machines. Works on any flat
 * parameter vector (the MLP's) and on the GPT, whose biases and LayerNorm
 * parameters are not decayed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt_internal.h"
#include "model/model.h"

int model_sgd_init(model_sgd *opt, size_t n, float lr, float momentum, float weight_decay,
                   int nesterov, vl_error *err) {
    if (opt == NULL) return vl_fail(err, VL_EINVAL, "sgd: no optimiser");
    memset(opt, 0, sizeof *opt);
    if (n == 0 || n > SIZE_MAX / sizeof(float))
        return vl_fail(err, VL_EINVAL, "sgd: bad parameter count %zu", n);
    if (!(isfinite(lr) && lr >= 0.0f))
        return vl_fail(err, VL_EINVAL, "sgd: learning rate %g must be finite and >= 0", (double)lr);
    if (!(momentum >= 0.0f && momentum < 1.0f))
        return vl_fail(err, VL_EINVAL, "sgd: momentum %g must lie in [0, 1)", (double)momentum);
    if (!(isfinite(weight_decay) && weight_decay >= 0.0f))
        return vl_fail(err, VL_EINVAL, "sgd: weight decay %g must be finite and >= 0",
                       (double)weight_decay);
    if (nesterov && momentum == 0.0f)
        return vl_fail(err, VL_EINVAL, "sgd: Nesterov momentum needs momentum > 0");
    opt->buf = calloc(n, sizeof(float));
    if (opt->buf == NULL)
        return vl_fail(err, VL_ENOMEM, "sgd: out of memory for %zu parameters", n);
    opt->n = n;
    opt->lr = lr;
    opt->momentum = momentum;
    opt->weight_decay = weight_decay;
    opt->nesterov = nesterov ? 1 : 0;
    return 0;
}

/* The update of elements [off, off + n); decay says whether they decay.
 * Decoupled weight decay, as AdamW's, so the two optimisers read the same
 * weight_decay setting the same way. */
static void sgd_run(model_sgd *opt, float *p, const float *g, size_t off, size_t n, int decay) {
    const float lr = opt->lr, mu = opt->momentum, wd = decay ? opt->weight_decay : 0.0f;
    float *b = opt->buf + off;
    p += off;
    g += off;
    for (size_t i = 0; i < n; i++) {
        float bi = mu * b[i] + g[i];
        b[i] = bi;
        float d = opt->nesterov ? g[i] + mu * bi : bi;
        p[i] -= lr * d + lr * wd * p[i];
    }
}

static int check(const model_sgd *opt, size_t n, vl_error *err) {
    if (opt == NULL || opt->buf == NULL)
        return vl_fail(err, VL_EINVAL, "sgd: optimiser not initialised");
    if (opt->n != n)
        return vl_fail(err, VL_EINVAL, "sgd: state for %zu parameters, given %zu", opt->n, n);
    return 0;
}

int model_sgd_step(model_sgd *opt, float *params, const float *grads, size_t n, int decay,
                   vl_error *err) {
    int rc = check(opt, n, err);
    if (rc) return rc;
    if (params == NULL || grads == NULL)
        return vl_fail(err, VL_EINVAL, "sgd: missing parameters or gradients");
    opt->step++;
    sgd_run(opt, params, grads, 0, n, decay);
    return 0;
}

typedef struct sgd_gpt_ctx {
    model_sgd *opt;
    model_gpt *m;
} sgd_gpt_ctx;

static void sgd_gpt_run(void *ctx, size_t off, size_t n, int decay) {
    sgd_gpt_ctx *c = ctx;
    sgd_run(c->opt, c->m->params, c->m->grads, off, n, decay);
}

int model_sgd_step_gpt(model_sgd *opt, model_gpt *m, vl_error *err) {
    int rc = check(opt, m->num_params, err);
    if (rc) return rc;
    if (m->grads == NULL) return vl_fail(err, VL_EINVAL, "sgd: the model has no gradients yet");
    opt->step++;
    sgd_gpt_ctx c = {opt, m};
    gpt_each_decay_run(m, sgd_gpt_run, &c);
    return 0;
}

void model_sgd_reset(model_sgd *opt) {
    if (opt->buf) memset(opt->buf, 0, opt->n * sizeof(float));
    opt->step = 0;
}

void model_sgd_free(model_sgd *opt) {
    if (opt == NULL) return;
    free(opt->buf);
    memset(opt, 0, sizeof *opt);
}
