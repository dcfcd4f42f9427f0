/* The MLP classifier's configuration JSON, checkpoint files and optimiser
 * step (model/mlp_io.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "kernels/kernels.h"
#include "model/mlp_internal.h"
#include "model/mlp_io.h"

size_t model_mlp_config_num_params(const model_mlp_config *cfg) {
    mlp_net net;
    mlp_net_build(cfg, &net);
    size_t n = 0;
    for (int l = 0; l < net.n_layers; l++) n += net.layer[l].wsize + net.layer[l].bsize;
    return n;
}

/* Appends printf output at *pos of dst (cap bytes). Returns 0, or
 * VL_EINVAL when it does not fit. */
static int append(char *dst, size_t cap, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int append(char *dst, size_t cap, size_t *pos, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(dst + *pos, cap - *pos, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *pos) return VL_EINVAL;
    *pos += (size_t)n;
    return 0;
}

int model_mlp_config_json(const model_mlp_config *cfg, char *out, size_t cap) {
    /* Room for any int in every field, valid or not. */
    char hidden[96], conv[384];
    size_t hp = 0, cp = 0;
    int rc = 0;
    hidden[0] = conv[0] = '\0';
    for (int i = 0; i < cfg->n_hidden && i < MODEL_MLP_MAX_HIDDEN && !rc; i++)
        rc = append(hidden, sizeof hidden, &hp, i ? ",%d" : "%d", cfg->hidden[i]);
    /* Without conv layers neither key is written: the bytes of a plain
     * MLP's object stay what they always were. */
    if (cfg->n_conv > 0 && !rc)
        rc = append(conv, sizeof conv, &cp, "\"image\":[%d,%d,%d],\"conv\":[", cfg->image[0],
                    cfg->image[1], cfg->image[2]);
    for (int i = 0; i < cfg->n_conv && i < MODEL_MLP_MAX_CONV && !rc; i++)
        rc = append(conv, sizeof conv, &cp, "%s{\"channels\":%d,\"kernel\":%d,\"stride\":%d}",
                    i ? "," : "", cfg->conv[i].channels, cfg->conv[i].kernel, cfg->conv[i].stride);
    if (cfg->n_conv > 0 && !rc) rc = append(conv, sizeof conv, &cp, "],");
    if (rc) return VL_EINVAL;
    size_t pos = 0;
    return append(out, cap, &pos,
                  "{\"kind\":\"mlp\",\"in_dim\":%d,%s\"hidden\":[%s],\"classes\":%d}", cfg->in_dim,
                  conv, hidden, cfg->n_classes);
}

int model_mlp_config_is_mlp(const char *js, size_t len) {
    json_t *o = js ? json_loadb(js, len, 0, NULL) : NULL;
    json_t *k = json_is_object(o) ? json_object_get(o, "kind") : NULL;
    int is = json_is_string(k) && strcmp(json_string_value(k), "mlp") == 0;
    json_decref(o);
    return is;
}

static int get_int(json_t *v, const char *what, int lo, int hi, int *out, vl_error *err) {
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return vl_fail(err, VL_EINVAL, "mlp configuration: %s must be an integer in [%d, %d]", what,
                       lo, hi);
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_width(json_t *v, const char *what, int *out, vl_error *err) {
    return get_int(v, what, 1, MODEL_MLP_MAX_WIDTH, out, err);
}

/* Refuses any key of object o not in keys (NULL-terminated); where names
 * the object in the message ("" for the top level). */
static int known_keys(json_t *o, const char *const *keys, const char *where, vl_error *err) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        int known = 0;
        for (const char *const *k = keys; *k; k++) known |= strcmp(*k, key) == 0;
        if (!known)
            return vl_fail(err, VL_EINVAL, "mlp configuration: %sunknown key \"%.40s\"", where,
                           key);
    }
    return 0;
}

/* One element of "conv": {"channels": c, "kernel": k, "stride": s}, the
 * stride 1 when left out. */
static int parse_conv_layer(json_t *o, int i, model_mlp_conv *out, vl_error *err) {
    static const char *const KEYS[] = {"channels", "kernel", "stride", NULL};
    char what[48];
    snprintf(what, sizeof what, "conv[%d]: ", i);
    if (!json_is_object(o))
        return vl_fail(err, VL_EINVAL,
                       "mlp configuration: conv[%d] must be an object "
                       "{\"channels\":c,\"kernel\":k,\"stride\":s}",
                       i);
    int rc = known_keys(o, KEYS, what, err);
    snprintf(what, sizeof what, "conv[%d].channels", i);
    if (!rc) rc = get_width(json_object_get(o, "channels"), what, &out->channels, err);
    snprintf(what, sizeof what, "conv[%d].kernel", i);
    if (!rc)
        rc =
            get_int(json_object_get(o, "kernel"), what, 1, MODEL_MLP_MAX_KERNEL, &out->kernel, err);
    snprintf(what, sizeof what, "conv[%d].stride", i);
    json_t *s = json_object_get(o, "stride");
    out->stride = 1;
    if (!rc && s) rc = get_int(s, what, 1, MODEL_MLP_MAX_STRIDE, &out->stride, err);
    return rc;
}

/* "image" and "conv", which come together or not at all. */
static int parse_conv(json_t *o, model_mlp_config *c, vl_error *err) {
    json_t *img = json_object_get(o, "image"), *cv = json_object_get(o, "conv");
    if (img == NULL && cv == NULL) return 0;
    if (cv == NULL)
        return vl_fail(err, VL_EINVAL,
                       "mlp configuration: image is only for a model with conv "
                       "layers, and conv is missing");
    if (img == NULL)
        return vl_fail(err, VL_EINVAL,
                       "mlp configuration: conv needs image, the [channels, "
                       "height, width] of an input");
    if (!json_is_array(img) || json_array_size(img) != 3)
        return vl_fail(err, VL_EINVAL,
                       "mlp configuration: image must be an array [channels, height, width]");
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        char what[16];
        snprintf(what, sizeof what, "image[%d]", i);
        rc = get_width(json_array_get(img, (size_t)i), what, &c->image[i], err);
    }
    if (rc) return rc;
    if (!json_is_array(cv) || json_array_size(cv) < 1 || json_array_size(cv) > MODEL_MLP_MAX_CONV)
        return vl_fail(err, VL_EINVAL,
                       "mlp configuration: conv must be an array of 1 to %d "
                       "layers",
                       MODEL_MLP_MAX_CONV);
    c->n_conv = (int)json_array_size(cv);
    for (int i = 0; i < c->n_conv && !rc; i++)
        rc = parse_conv_layer(json_array_get(cv, (size_t)i), i, &c->conv[i], err);
    return rc;
}

static int parse_obj(json_t *o, model_mlp_config *c, vl_error *err) {
    static const char *const KEYS[] = {"kind",   "in_dim",  "image", "conv",
                                       "hidden", "classes", NULL};
    int rc = known_keys(o, KEYS, "", err);
    if (rc) return rc;
    json_t *kind = json_object_get(o, "kind");
    if (!json_is_string(kind) || strcmp(json_string_value(kind), "mlp") != 0)
        return vl_fail(err, VL_EINVAL, "mlp configuration: kind must be \"mlp\"");
    rc = get_width(json_object_get(o, "in_dim"), "in_dim", &c->in_dim, err);
    if (!rc) rc = get_width(json_object_get(o, "classes"), "classes", &c->n_classes, err);
    if (rc) return rc;
    json_t *h = json_object_get(o, "hidden");
    if (!json_is_array(h) || json_array_size(h) < 1 || json_array_size(h) > MODEL_MLP_MAX_HIDDEN)
        return vl_fail(err, VL_EINVAL,
                       "mlp configuration: hidden must be an array of 1 to %d "
                       "widths",
                       MODEL_MLP_MAX_HIDDEN);
    c->n_hidden = (int)json_array_size(h);
    for (int i = 0; i < c->n_hidden && !rc; i++)
        rc = get_width(json_array_get(h, (size_t)i), "every hidden width", &c->hidden[i], err);
    if (!rc) rc = parse_conv(o, c, err);
    return rc ? rc : model_mlp_config_validate(c, err);
}

int model_mlp_config_parse(const char *js, size_t len, model_mlp_config *out, vl_error *err) {
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
    if (!rc) *out = c;
    return rc;
}

int model_mlp_write_safetensors(const model_mlp *m, st_writer *w) {
    model_mlp_config cfg = model_mlp_config_get(m);
    char js[MODEL_MLP_JSON_MAX];
    int rc = model_mlp_config_json(&cfg, js, sizeof js);
    if (!rc) rc = st_writer_meta(w, "model", js);
    const model_tensor *t;
    int nt = model_mlp_tensors(m, &t);
    /* The writer only reads the parameters. */
    if (!rc) rc = model_tensors_write(t, nt, model_mlp_params((model_mlp *)m), w);
    return rc;
}

int model_mlp_load_safetensors(model_mlp *m, const st_file *f, vl_error *err) {
    const model_tensor *t;
    int nt = model_mlp_tensors(m, &t);
    return model_tensors_load(t, nt, model_mlp_num_params(m), model_mlp_params(m), f,
                              "mlp checkpoint", err);
}

int model_adamw_step_tensors(model_adamw *opt, const model_tensor *tensors, int n,
                             size_t num_params, float *params, const float *grads, vl_error *err) {
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
