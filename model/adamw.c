/* AdamW over a model's flat parameter vector. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/gpt_internal.h"
#include "model/model.h"

int gpt_adamw_check(float lr, float beta1, float beta2, float eps, float weight_decay,
                    vl_error *err) {
    if (!(isfinite(lr) && lr >= 0.0f))
        return vl_fail(err, VL_EINVAL, "adamw: learning rate %g must be finite and >= 0",
                       (double)lr);
    if (!(beta1 >= 0.0f && beta1 < 1.0f) || !(beta2 >= 0.0f && beta2 < 1.0f))
        return vl_fail(err, VL_EINVAL, "adamw: betas (%g, %g) must lie in [0, 1)", (double)beta1,
                       (double)beta2);
    if (!(isfinite(eps) && eps > 0.0f))
        return vl_fail(err, VL_EINVAL, "adamw: eps %g must be finite and > 0", (double)eps);
    if (!(isfinite(weight_decay) && weight_decay >= 0.0f))
        return vl_fail(err, VL_EINVAL, "adamw: weight decay %g must be finite and >= 0",
                       (double)weight_decay);
    return 0;
}

int model_adamw_init(model_adamw *opt, size_t n, float lr, float beta1, float beta2, float eps,
                     float weight_decay, vl_error *err) {
    if (opt == NULL) return vl_fail(err, VL_EINVAL, "adamw: no optimiser");
    memset(opt, 0, sizeof *opt);
    if (n == 0 || n > SIZE_MAX / (2 * sizeof(float)))
        return vl_fail(err, VL_EINVAL, "adamw: bad parameter count %zu", n);
    int rc = gpt_adamw_check(lr, beta1, beta2, eps, weight_decay, err);
    if (rc != 0) return rc;
    float *state = calloc(2 * n, sizeof(float));
    if (state == NULL) return vl_fail(err, VL_ENOMEM, "adamw: out of memory for %zu parameters", n);
    opt->m = state;
    opt->v = state + n;
    opt->n = n;
    opt->lr = lr;
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    opt->eps = eps;
    opt->weight_decay = weight_decay;
    opt->step = 0;
    return 0;
}

typedef struct adamw_run_ctx {
    model_adamw *opt;
    kernels_adamw_hparams hp;
    model_gpt *m;
} adamw_run_ctx;

static void adamw_run(void *ctx, size_t off, size_t n, int decay) {
    adamw_run_ctx *c = ctx;
    c->hp.weight_decay = decay ? c->opt->weight_decay : 0.0f;
    kernels_adamw_step(c->m->params + off, c->m->grads + off, c->opt->m + off, c->opt->v + off,
                       NULL, n, &c->hp);
}

int model_adamw_step(model_adamw *opt, model_gpt *m, vl_error *err) {
    if (opt == NULL || opt->m == NULL)
        return vl_fail(err, VL_EINVAL, "adamw: optimiser not initialised");
    if (opt->n != m->num_params)
        return vl_fail(err, VL_EINVAL, "adamw: state for %zu parameters, model has %zu", opt->n,
                       m->num_params);
    if (m->grads == NULL) return vl_fail(err, VL_EINVAL, "adamw: the model has no gradients yet");
    opt->step++;
    adamw_run_ctx c = {opt, {opt->lr, opt->beta1, opt->beta2, opt->eps, 0.0f, opt->step}, m};
    gpt_each_decay_run(m, adamw_run, &c);
    return 0;
}

void model_adamw_reset(model_adamw *opt) {
    if (opt->m) memset(opt->m, 0, 2 * opt->n * sizeof(float));
    opt->step = 0;
}

void model_adamw_free(model_adamw *opt) {
    if (opt == NULL) return;
    free(opt->m);
    opt->m = NULL;
    opt->v = NULL;
    opt->n = 0;
    opt->step = 0;
}
