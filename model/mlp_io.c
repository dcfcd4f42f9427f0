/* The MLP classifier's configuration JSON, checkpoint files and optimiser
 * step (model/mlp_io.h). */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "kernels/kernels.h"
#include "model/mlp_io.h"

size_t model_mlp_config_num_params(const model_mlp_config *cfg)
{
    size_t n = 0;
    int in = cfg->in_dim;
    for (int l = 0; l <= cfg->n_hidden; l++) {
        int out = l < cfg->n_hidden ? cfg->hidden[l] : cfg->n_classes;
        n += (size_t)in * (size_t)out + (size_t)out;
        in = out;
    }
    return n;
}

int model_mlp_config_json(const model_mlp_config *cfg, char *out, size_t cap)
{
    char hidden[96];
    size_t pos = 0;
    hidden[0] = '\0';
    for (int i = 0; i < cfg->n_hidden && i < MODEL_MLP_MAX_HIDDEN; i++) {
        int n = snprintf(hidden + pos, sizeof hidden - pos, i ? ",%d" : "%d", cfg->hidden[i]);
        if (n < 0 || (size_t)n >= sizeof hidden - pos)
            return VL_EINVAL;
        pos += (size_t)n;
    }
    int n = snprintf(out, cap, "{\"kind\":\"mlp\",\"in_dim\":%d,\"hidden\":[%s],\"classes\":%d}",
                     cfg->in_dim, hidden, cfg->n_classes);
    return n < 0 || (size_t)n >= cap ? VL_EINVAL : 0;
}

int model_mlp_config_is_mlp(const char *js, size_t len)
{
    json_t *o = js ? json_loadb(js, len, 0, NULL) : NULL;
    json_t *k = json_is_object(o) ? json_object_get(o, "kind") : NULL;
    int is = json_is_string(k) && strcmp(json_string_value(k), "mlp") == 0;
    json_decref(o);
    return is;
}

static int get_width(json_t *v, const char *what, int *out, vl_error *err)
{
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > MODEL_MLP_MAX_WIDTH)
        return vl_fail(err, VL_EINVAL, "mlp configuration: %s must be an integer in [1, %d]",
                       what, MODEL_MLP_MAX_WIDTH);
    *out = (int)json_integer_value(v);
    return 0;
}

static int parse_obj(json_t *o, model_mlp_config *c, vl_error *err)
{
    static const char *const KEYS[] = {"kind", "in_dim", "hidden", "classes", NULL};
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        int known = 0;
        for (const char *const *k = KEYS; *k; k++)
            known |= strcmp(*k, key) == 0;
        if (!known)
            return vl_fail(err, VL_EINVAL, "mlp configuration: unknown key \"%.40s\"", key);
    }
    json_t *kind = json_object_get(o, "kind");
    if (!json_is_string(kind) || strcmp(json_string_value(kind), "mlp") != 0)
        return vl_fail(err, VL_EINVAL, "mlp configuration: kind must be \"mlp\"");
    int rc = get_width(json_object_get(o, "in_dim"), "in_dim", &c->in_dim, err);
    if (!rc)
        rc = get_width(json_object_get(o, "classes"), "classes", &c->n_classes, err);
    if (rc)
        return rc;
    json_t *h = json_object_get(o, "hidden");
    if (!json_is_array(h) || json_array_size(h) < 1 || json_array_size(h) > MODEL_MLP_MAX_HIDDEN)
        return vl_fail(err, VL_EINVAL, "mlp configuration: hidden must be an array of 1 to %d "
                                       "widths", MODEL_MLP_MAX_HIDDEN);
    c->n_hidden = (int)json_array_size(h);
    for (int i = 0; i < c->n_hidden && !rc; i++)
        rc = get_width(json_array_get(h, (size_t)i), "every hidden width", &c->hidden[i], err);
    return rc ? rc : model_mlp_config_validate(c, err);
}

int model_mlp_config_parse(const char *js, size_t len, model_mlp_config *out, vl_error *err)
{
    json_error_t je;
    json_t *o = js ? json_loadb(js, len, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!json_is_object(o)) {
        json_decref(o);
        return vl_fail(err, VL_EINVAL, "mlp configuration: not a JSON object");
    }
    model_mlp_config c;
    memset(&c, 0, sizeof c);
    int rc = parse_obj(o, &c, err);
    json_decref(o);
    if (!rc)
        *out = c;
    return rc;
}

int model_mlp_write_safetensors(const model_mlp *m, st_writer *w)
{
    model_mlp_config cfg = model_mlp_config_get(m);
    char js[MODEL_MLP_JSON_MAX];
    int rc = model_mlp_config_json(&cfg, js, sizeof js);
    if (!rc)
        rc = st_writer_meta(w, "model", js);
    const model_tensor *t;
    int nt = model_mlp_tensors(m, &t);
    /* The writer only reads the parameters. */
    if (!rc)
        rc = model_tensors_write(t, nt, model_mlp_params((model_mlp *)m), w);
    return rc;
}

int model_mlp_load_safetensors(model_mlp *m, const st_file *f, vl_error *err)
{
    const model_tensor *t;
    int nt = model_mlp_tensors(m, &t);
    return model_tensors_load(t, nt, model_mlp_num_params(m), model_mlp_params(m), f,
                              "mlp checkpoint", err);
}

int model_adamw_step_tensors(model_adamw *opt, const model_tensor *tensors, int n,
                             size_t num_params, float *params, const float *grads, vl_error *err)
{
    if (opt == NULL || opt->m == NULL)
        return vl_fail(err, VL_EINVAL, "adamw: optimiser not initialised");
    if (opt->n != num_params)
        return vl_fail(err, VL_EINVAL, "adamw: state for %zu parameters, model has %zu", opt->n,
                       num_params);
    for (int i = 0; i < n; i++)
        if (tensors[i].offset + tensors[i].numel > num_params)
            return vl_fail(err, VL_EINVAL, "adamw: tensor %s lies outside the parameters",
                           tensors[i].name);
    opt->step++;
    kernels_adamw_hparams hp = {opt->lr, opt->beta1, opt->beta2, opt->eps, 0.0f, opt->step};
    for (int i = 0; i < n; i++) {
        const model_tensor *t = &tensors[i];
        hp.weight_decay = t->ndim == 2 ? opt->weight_decay : 0.0f;
        kernels_adamw_step(params + t->offset, grads + t->offset, opt->m + t->offset,
                           opt->v + t->offset, NULL, t->numel, &hp);
    }
    return 0;
}
