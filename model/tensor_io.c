/* A model's tensor table to and from safetensors: the one reader and
 * writer behind the GPT's and the MLP's checkpoints, so both check names,
 * shapes and values the same way and a bad file never changes a model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

int model_tensors_write(const model_tensor *tensors, int n, const float *params, st_writer *w) {
    for (int i = 0; i < n; i++) {
        const model_tensor *t = &tensors[i];
        uint64_t shape[MODEL_TENSOR_MAX_DIMS];
        for (int d = 0; d < t->ndim; d++) shape[d] = t->shape[d];
        int rc = st_writer_add(w, t->name, ST_F32, t->ndim, shape, params + t->offset,
                               t->numel * sizeof(float));
        if (rc != 0) return rc;
    }
    return 0;
}

static void shape_str(char *out, size_t len, int ndim, const uint64_t *shape) {
    size_t pos = 0;
    int n = snprintf(out, len, "[");
    for (int d = 0; d < ndim && n >= 0 && (pos += (size_t)n) < len; d++)
        n = snprintf(out + pos, len - pos, d ? ",%llu" : "%llu", (unsigned long long)shape[d]);
    if (n >= 0 && (pos += (size_t)n) < len) snprintf(out + pos, len - pos, "]");
}

static int check_tensor(const model_tensor *t, const st_tensor *s, const char *what,
                        vl_error *err) {
    if (s == NULL) return vl_fail(err, VL_ENOTFOUND, "%s: tensor %s is missing", what, t->name);
    if (s->dtype != ST_F32 && s->dtype != ST_F16)
        return vl_fail(err, VL_EINVAL, "%s: tensor %s has dtype %s (need F32 or F16)", what,
                       t->name, st_dtype_name(s->dtype));
    int same = s->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = s->shape[d] == (uint64_t)t->shape[d];
    if (!same) {
        uint64_t want[MODEL_TENSOR_MAX_DIMS];
        for (int d = 0; d < t->ndim; d++) want[d] = t->shape[d];
        char got_s[96], want_s[96];
        shape_str(got_s, sizeof got_s, s->ndim, s->shape);
        shape_str(want_s, sizeof want_s, t->ndim, want);
        return vl_fail(err, VL_EINVAL, "%s: tensor %s has shape %s, expected %s", what, t->name,
                       got_s, want_s);
    }
    return 0;
}

static int in_table(const model_tensor *tensors, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(tensors[i].name, name) == 0) return 1;
    return 0;
}

int model_tensors_load(const model_tensor *tensors, int n, size_t num_params, float *params,
                       const st_file *f, const char *what, vl_error *err) {
    if (f == NULL) return vl_fail(err, VL_EINVAL, "%s: no file", what);
    /* Check every name and shape before touching any data. */
    for (int i = 0; i < n; i++) {
        int rc = check_tensor(&tensors[i], st_find(f, tensors[i].name), what, err);
        if (rc != 0) return rc;
    }
    if (f->ntensors != n) {
        for (int i = 0; i < f->ntensors; i++)
            if (!in_table(tensors, n, f->tensors[i].name))
                return vl_fail(err, VL_EINVAL, "%s: unexpected tensor %s", what,
                               f->tensors[i].name);
        return vl_fail(err, VL_EINVAL, "%s: %d tensors, expected %d", what, f->ntensors, n);
    }
    /* Convert into a staging copy so a bad value leaves the model as it was. */
    float *stage = malloc(num_params * sizeof(float));
    if (stage == NULL)
        return vl_fail(err, VL_ENOMEM, "%s: out of memory for %zu parameters", what, num_params);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const model_tensor *t = &tensors[i];
        float *dst = stage + t->offset;
        rc = st_tensor_to_f32(st_find(f, t->name), dst, t->numel, err);
        for (size_t k = 0; rc == 0 && k < t->numel; k++)
            if (!isfinite(dst[k]))
                rc = vl_fail(err, VL_ERANGE, "%s: tensor %s element %zu is %s", what, t->name, k,
                             isnan(dst[k]) ? "NaN" : "infinite");
    }
    if (rc == 0) memcpy(params, stage, num_params * sizeof(float));
    free(stage);
    return rc;
}
