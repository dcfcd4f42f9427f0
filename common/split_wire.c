/* The split-learning request and reply (common/split_wire.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/split_wire.h"

/* z as the wire dtype: F32 as is, F16 converted into scratch (owned by
 * the caller, freed after st_writer_finish). */
static int add_matrix(st_writer *w, const char *name, const float *x, int B, int q, st_dtype dt,
                      uint16_t **scratch, vl_error *err) {
    size_t n = (size_t)B * (size_t)q;
    uint64_t shape[2] = {(uint64_t)B, (uint64_t)q};
    if (dt == ST_F32) return st_writer_add(w, name, ST_F32, 2, shape, x, n * sizeof(float));
    if (dt != ST_F16) return vl_fail(err, VL_EINVAL, "split: dtype must be F32 or F16");
    uint16_t *h = malloc(n * sizeof *h);
    if (!h) return vl_fail(err, VL_ENOMEM, "split: out of memory");
    for (size_t i = 0; i < n; i++) h[i] = vl_f32_to_f16(x[i]);
    *scratch = h;
    return st_writer_add(w, name, ST_F16, 2, shape, h, n * sizeof *h);
}

static int check_dims(int B, int q, vl_error *err) {
    if (B < 1 || q < 1 || (size_t)B * (size_t)q > SPLIT_WIRE_MAX_VALUES)
        return vl_fail(err, VL_EINVAL, "split: a batch of %d x %d activations is out of range", B,
                       q);
    return VL_OK;
}

int split_wire_encode_forward(const char *run, int64_t peer, int64_t task, const float *z, int B,
                              int q, st_dtype dtype, const int *labels, vl_buf *out,
                              vl_error *err) {
    int rc = check_dims(B, q, err);
    if (rc) return rc;
    if (!run || !z || !out) return vl_fail(err, VL_EINVAL, "split: missing argument");
    char ps[24], ts[24];
    snprintf(ps, sizeof ps, "%lld", (long long)peer);
    snprintf(ts, sizeof ts, "%lld", (long long)task);
    st_writer w;
    st_writer_init(&w);
    uint16_t *scratch = NULL;
    int32_t *lab = labels ? malloc((size_t)B * sizeof *lab) : NULL;
    if (labels && !lab) rc = vl_fail(err, VL_ENOMEM, "split: out of memory");
    for (int i = 0; !rc && labels && i < B; i++) lab[i] = labels[i];
    uint64_t lshape[1] = {(uint64_t)B};
    if (!rc) rc = st_writer_meta(&w, "run", run);
    if (!rc) rc = st_writer_meta(&w, "peer", ps);
    if (!rc) rc = st_writer_meta(&w, "task", ts);
    if (!rc) rc = add_matrix(&w, "z", z, B, q, dtype, &scratch, err);
    if (!rc && lab)
        rc = st_writer_add(&w, "labels", ST_I32, 1, lshape, lab, (size_t)B * sizeof *lab);
    if (!rc)
        rc = st_writer_finish(&w, out, err);
    else if (!err->msg[0])
        vl_fail(err, rc, "split: cannot encode the request");
    st_writer_free(&w);
    free(scratch);
    free(lab);
    return rc;
}

int split_wire_encode_backward(const char *run, int64_t peer, int64_t task, const float *z,
                               const float *dy, int B, int q, int h, st_dtype dtype, vl_buf *out,
                               vl_error *err) {
    int rc = check_dims(B, q, err);
    if (!rc) rc = check_dims(B, h, err);
    if (rc) return rc;
    if (!run || !z || !dy || !out) return vl_fail(err, VL_EINVAL, "split: missing argument");
    char ps[24], ts[24];
    snprintf(ps, sizeof ps, "%lld", (long long)peer);
    snprintf(ts, sizeof ts, "%lld", (long long)task);
    st_writer w;
    st_writer_init(&w);
    uint16_t *zs = NULL, *ds = NULL;
    rc = st_writer_meta(&w, "run", run);
    if (!rc) rc = st_writer_meta(&w, "peer", ps);
    if (!rc) rc = st_writer_meta(&w, "task", ts);
    if (!rc) rc = add_matrix(&w, "z", z, B, q, dtype, &zs, err);
    if (!rc) rc = add_matrix(&w, "dy", dy, B, h, dtype, &ds, err);
    if (!rc)
        rc = st_writer_finish(&w, out, err);
    else if (!err->msg[0])
        vl_fail(err, rc, "split: cannot encode the request");
    st_writer_free(&w);
    free(zs);
    free(ds);
    return rc;
}

void split_wire_forward_free(split_wire_forward *f) {
    free(f->z);
    free(f->dy);
    free(f->labels);
    memset(f, 0, sizeof *f);
}

static int meta_i64(const st_file *f, const char *key, int64_t *out, vl_error *err) {
    const char *s = st_meta_get(f, key);
    if (!s || vl_parse_i64(s, 1, INT64_MAX, out) != VL_OK)
        return vl_fail(err, VL_EINVAL, "split: metadata %s must be a positive integer", key);
    return VL_OK;
}

/* A [B, width] float tensor (F32 or F16) into a new array, every value
 * finite. *code is set on failure. */
static int read_matrix(const st_tensor *t, const char *name, int B, int width, float **out,
                       const char **code, vl_error *err) {
    *code = "bad_shape";
    if (t->ndim != 2 || t->shape[0] != (uint64_t)B || t->shape[1] != (uint64_t)width)
        return vl_fail(err, VL_ERANGE, "split: %s must be [%d, %d]", name, B, width);
    *code = "malformed";
    *out = malloc((size_t)B * (size_t)width * sizeof **out);
    if (!*out) return vl_fail(err, VL_ENOMEM, "split: out of memory");
    int rc = st_tensor_to_f32(t, *out, (size_t)B * (size_t)width, err);
    if (rc) return rc;
    *code = "non_finite";
    for (size_t i = 0; i < (size_t)B * (size_t)width; i++)
        if (!isfinite((*out)[i]))
            return vl_fail(err, VL_ERANGE, "split: %s value %zu is not finite", name, i);
    return VL_OK;
}

/* The labels of a forward request, each in [0, classes). */
static int read_labels(const st_tensor *lab, int B, int classes, split_wire_forward *out,
                       const char **code, vl_error *err) {
    *code = "bad_shape";
    if (lab->ndim != 1 || lab->shape[0] != (uint64_t)B)
        return vl_fail(err, VL_ERANGE, "split: labels must be [%d], one per row of z", B);
    out->labels = malloc((size_t)B * sizeof *out->labels);
    if (!out->labels) return vl_fail(err, VL_ENOMEM, "split: out of memory");
    *code = "bad_label";
    for (int i = 0; i < B; i++) {
        int32_t y;
        memcpy(&y, lab->data + 4 * (size_t)i, 4);
        if (y < 0 || y >= classes)
            return vl_fail(err, VL_ERANGE, "split: label %d of row %d is outside [0, %d)", y, i,
                           classes);
        out->labels[i] = y;
    }
    return VL_OK;
}

/* The parts of decode_forward after the file parsed; *code is set on
 * every failure. */
static int decode_parsed(const st_file *f, int q, int h, int max_batch, int classes,
                         split_wire_forward *out, const char **code, vl_error *err) {
    *code = "malformed";
    const char *run = st_meta_get(f, "run");
    if (!run || strlen(run) >= sizeof out->run)
        return vl_fail(err, VL_EINVAL, "split: metadata run is missing or too long");
    snprintf(out->run, sizeof out->run, "%s", run);
    int rc = meta_i64(f, "peer", &out->peer, err);
    if (!rc) rc = meta_i64(f, "task", &out->task, err);
    if (rc) return rc;
    /* The second tensor: the labels of a forward request, none in a
     * U-shaped one, the output gradient of a backward one. */
    const char *second = h > 0 ? "dy" : classes > 0 ? "labels" : NULL;
    const st_tensor *z = st_find(f, "z"), *t2 = second ? st_find(f, second) : NULL;
    if (!z || (second && !t2) || f->ntensors != (second ? 2 : 1))
        return vl_fail(err, VL_EINVAL, "split: this request holds exactly the tensor%s z%s%s",
                       second ? "s" : "", second ? " and " : "", second ? second : "");
    *code = "bad_dtype";
    int dy_ok = !t2 || (h > 0 ? t2->dtype == z->dtype : t2->dtype == ST_I32);
    if ((z->dtype != ST_F32 && z->dtype != ST_F16) || !dy_ok)
        return vl_fail(err, VL_ERANGE, "split: z must be F32 or F16, %s",
                       h > 0 ? "and dy the same" : "and labels I32");
    *code = "bad_shape";
    if (z->ndim != 2 || z->shape[1] != (uint64_t)q)
        return vl_fail(err, VL_ERANGE, "split: z must be [B, %d]", q);
    *code = "bad_batch";
    if (z->shape[0] < 1 || z->shape[0] > (uint64_t)max_batch)
        return vl_fail(err, VL_ERANGE, "split: a batch of %llu rows; this run takes 1 to %d",
                       (unsigned long long)z->shape[0], max_batch);
    int B = (int)z->shape[0];
    if (check_dims(B, q, err) || (h > 0 && check_dims(B, h, err))) return VL_ERANGE;
    if ((rc = read_matrix(z, "z", B, q, &out->z, code, err))) return rc;
    if (h > 0 && (rc = read_matrix(t2, "dy", B, h, &out->dy, code, err))) return rc;
    if (h == 0 && t2 && (rc = read_labels(t2, B, classes, out, code, err))) return rc;
    out->B = B;
    out->q = q;
    out->h = h;
    out->dtype = z->dtype;
    *code = NULL;
    return VL_OK;
}

int split_wire_decode_forward(const uint8_t *body, size_t len, int q, int h, int max_batch,
                              int classes, split_wire_forward *out, const char **code,
                              vl_error *err) {
    memset(out, 0, sizeof *out);
    *code = "malformed";
    if (!body || q < 1 || h < 0 || max_batch < 1 || classes < 0)
        return vl_fail(err, VL_EINVAL, "split: an empty request");
    st_file f;
    vl_error pe = {0};
    if (st_parse(body, len, &f, &pe) != VL_OK)
        return vl_fail(err, VL_EINVAL, "split: the request is not safetensors: %s", pe.msg);
    int rc = decode_parsed(&f, q, h, max_batch, classes, out, code, err);
    st_free(&f);
    if (rc) {
        /* What the metadata named stays, for the caller's lease check. */
        free(out->z);
        free(out->dy);
        free(out->labels);
        out->z = out->dy = NULL;
        out->labels = NULL;
    }
    return rc;
}

int split_wire_encode_reply(const char *name, const float *x, int B, int width, st_dtype dtype,
                            double loss, int64_t step, vl_buf *out, vl_error *err) {
    int rc = check_dims(B, width, err);
    if (rc) return rc;
    if (!name || !x || !out) return vl_fail(err, VL_EINVAL, "split: missing argument");
    char ls[40], ss[24];
    snprintf(ls, sizeof ls, "%.9g", loss);
    snprintf(ss, sizeof ss, "%lld", (long long)step);
    st_writer w;
    st_writer_init(&w);
    uint16_t *scratch = NULL;
    rc = isfinite(loss) ? st_writer_meta(&w, "loss", ls) : VL_OK;
    if (!rc) rc = st_writer_meta(&w, "step", ss);
    if (!rc) rc = add_matrix(&w, name, x, B, width, dtype, &scratch, err);
    if (!rc)
        rc = st_writer_finish(&w, out, err);
    else if (!err->msg[0])
        vl_fail(err, rc, "split: cannot encode the reply");
    st_writer_free(&w);
    free(scratch);
    return rc;
}

int split_wire_decode_reply(const uint8_t *body, size_t len, const char *name, int B, int width,
                            float *x, double *loss, int64_t *step, vl_error *err) {
    int rc = check_dims(B, width, err);
    if (rc) return rc;
    st_file f;
    vl_error pe = {0};
    if (!body || !name || st_parse(body, len, &f, &pe) != VL_OK)
        return vl_fail(err, VL_EINVAL, "split reply: not safetensors: %s", pe.msg);
    const st_tensor *t = st_find(&f, name);
    const char *ls = st_meta_get(&f, "loss"), *ss = st_meta_get(&f, "step");
    double l = NAN;
    int64_t s = 0;
    if (!t || f.ntensors != 1 || t->ndim != 2 || t->shape[0] != (uint64_t)B ||
        t->shape[1] != (uint64_t)width)
        rc = vl_fail(err, VL_EINVAL, "split reply: %s must be the only tensor, [%d, %d]", name, B,
                     width);
    else if (ls && (vl_parse_f64(ls, &l) != VL_OK || !isfinite(l) || l < 0))
        rc = vl_fail(err, VL_EINVAL, "split reply: the loss is not a finite number");
    else if (!ss || vl_parse_i64(ss, 0, INT64_MAX, &s) != VL_OK)
        rc = vl_fail(err, VL_EINVAL, "split reply: the step count is missing");
    float *tmp = rc ? NULL : malloc((size_t)B * (size_t)width * sizeof *tmp);
    if (!rc && !tmp) rc = vl_fail(err, VL_ENOMEM, "split reply: out of memory");
    if (!rc) rc = st_tensor_to_f32(t, tmp, (size_t)B * (size_t)width, err);
    for (size_t i = 0; !rc && i < (size_t)B * (size_t)width; i++)
        if (!isfinite(tmp[i])) rc = vl_fail(err, VL_EINVAL, "split reply: %s is not finite", name);
    if (!rc) {
        memcpy(x, tmp, (size_t)B * (size_t)width * sizeof *x);
        if (loss) *loss = l;
        if (step) *step = s;
    }
    free(tmp);
    st_free(&f);
    return rc;
}
