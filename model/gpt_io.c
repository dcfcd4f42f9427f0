/* GPT checkpoints as safetensors with Hugging Face GPT-2 tensor names. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt_internal.h"
#include "model/model.h"

int model_gpt_write_safetensors(const model_gpt *m, st_writer *w)
{
    for (int i = 0; i < m->ntensors; i++) {
        const model_tensor *t = &m->tensors[i];
        uint64_t shape[MODEL_TENSOR_MAX_DIMS];
        for (int d = 0; d < t->ndim; d++)
            shape[d] = t->shape[d];
        int rc = st_writer_add(w, t->name, ST_F32, t->ndim, shape, m->params + t->offset,
                               t->numel * sizeof(float));
        if (rc != 0)
            return rc;
    }
    return 0;
}

static const char *const CONFIG_KEYS[5] = {"volley.vocab_size", "volley.block_size",
                                           "volley.n_layer", "volley.n_head", "volley.n_embd"};

int model_gpt_write_config_meta(const model_gpt *m, st_writer *w)
{
    const int vals[5] = {m->cfg.vocab_size, m->cfg.block_size, m->cfg.n_layer, m->cfg.n_head,
                         m->cfg.n_embd};
    int rc = st_writer_meta(w, "format", "pt");
    for (int i = 0; i < 5 && rc == 0; i++) {
        char v[16];
        snprintf(v, sizeof v, "%d", vals[i]);
        rc = st_writer_meta(w, CONFIG_KEYS[i], v);
    }
    return rc;
}

int model_gpt_config_from_safetensors(const st_file *f, model_gpt_config *cfg, vl_error *err)
{
    int64_t v[5];
    for (int i = 0; i < 5; i++) {
        const char *s = st_meta_get(f, CONFIG_KEYS[i]);
        if (s == NULL)
            return vl_fail(err, VL_ENOTFOUND, "gpt checkpoint: metadata %s is missing",
                           CONFIG_KEYS[i]);
        if (parse_i64(s, 1, INT32_MAX, &v[i]) != 0)
            return vl_fail(err, VL_EINVAL, "gpt checkpoint: metadata %s = \"%s\" is not a count",
                           CONFIG_KEYS[i], s);
    }
    model_gpt_config c = {(int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4]};
    int rc = model_gpt_config_validate(&c, err);
    if (rc == 0)
        *cfg = c;
    return rc;
}

static void shape_str(char *out, size_t len, int ndim, const uint64_t *shape)
{
    size_t pos = 0;
    int n = snprintf(out, len, "[");
    for (int d = 0; d < ndim && n >= 0 && (pos += (size_t)n) < len; d++)
        n = snprintf(out + pos, len - pos, d ? ",%llu" : "%llu", (unsigned long long)shape[d]);
    if (n >= 0 && (pos += (size_t)n) < len)
        snprintf(out + pos, len - pos, "]");
}

static int check_tensor(const model_tensor *t, const st_tensor *s, vl_error *err)
{
    if (s == NULL)
        return vl_fail(err, VL_ENOTFOUND, "gpt checkpoint: tensor %s is missing", t->name);
    if (s->dtype != ST_F32 && s->dtype != ST_F16)
        return vl_fail(err, VL_EINVAL, "gpt checkpoint: tensor %s has dtype %s (need F32 or F16)",
                       t->name, st_dtype_name(s->dtype));
    int same = s->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++)
        same = s->shape[d] == (uint64_t)t->shape[d];
    if (!same) {
        uint64_t want[MODEL_TENSOR_MAX_DIMS];
        for (int d = 0; d < t->ndim; d++)
            want[d] = t->shape[d];
        char got_s[96], want_s[96];
        shape_str(got_s, sizeof got_s, s->ndim, s->shape);
        shape_str(want_s, sizeof want_s, t->ndim, want);
        return vl_fail(err, VL_EINVAL, "gpt checkpoint: tensor %s has shape %s, expected %s",
                       t->name, got_s, want_s);
    }
    return 0;
}

int model_gpt_load_safetensors(model_gpt *m, const st_file *f, vl_error *err)
{
    if (f == NULL)
        return vl_fail(err, VL_EINVAL, "gpt checkpoint: no file");
    /* Check every name and shape before touching any data. */
    for (int i = 0; i < m->ntensors; i++) {
        int rc = check_tensor(&m->tensors[i], st_find(f, m->tensors[i].name), err);
        if (rc != 0)
            return rc;
    }
    if (f->ntensors != m->ntensors) {
        for (int i = 0; i < f->ntensors; i++)
            if (model_gpt_find_tensor(m, f->tensors[i].name) == NULL)
                return vl_fail(err, VL_EINVAL, "gpt checkpoint: unexpected tensor %s",
                               f->tensors[i].name);
        return vl_fail(err, VL_EINVAL, "gpt checkpoint: %d tensors, expected %d", f->ntensors,
                       m->ntensors);
    }
    /* Convert into a staging copy so a bad value leaves the model as it was. */
    float *stage = malloc(m->num_params * sizeof(float));
    if (stage == NULL)
        return vl_fail(err, VL_ENOMEM, "gpt checkpoint: out of memory for %zu parameters",
                       m->num_params);
    int rc = 0;
    for (int i = 0; i < m->ntensors && rc == 0; i++) {
        const model_tensor *t = &m->tensors[i];
        float *dst = stage + t->offset;
        rc = st_tensor_to_f32(st_find(f, t->name), dst, t->numel, err);
        for (size_t k = 0; rc == 0 && k < t->numel; k++)
            if (!isfinite(dst[k]))
                rc = vl_fail(err, VL_ERANGE, "gpt checkpoint: tensor %s element %zu is %s",
                             t->name, k, isnan(dst[k]) ? "NaN" : "infinite");
    }
    if (rc == 0) {
        memcpy(m->params, stage, m->num_params * sizeof(float));
        m->have_output = 0;
        m->can_backward = 0;
    }
    free(stage);
    return rc;
}
