/* The two messages of the Sketched-SGD second round: the candidate
 * coordinates the coordinator asks about, and the exact values a peer
 * reports for them. Both are safetensors like every other payload, so the
 * same parser and limits guard them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"

static int put_i64(st_writer *w, const char *key, int64_t v) {
    char s[24];
    snprintf(s, sizeof s, "%lld", (long long)v);
    return st_writer_meta(w, key, s);
}

static int finish(st_writer *w, int rc, vl_buf *out, const char *what, vl_error *err) {
    if (rc)
        rc = vl_fail(err, rc, "cannot describe the %s", what);
    else
        rc = st_writer_finish(w, out, err);
    st_writer_free(w);
    return rc;
}

int compress_round_encode_candidates(const compress_round_meta *meta, const uint32_t *idx, size_t n,
                                     vl_buf *out, vl_error *err) {
    st_writer w;
    st_writer_init(&w);
    uint64_t shape[1] = {n};
    int rc = st_writer_meta(&w, "run", meta->run);
    if (!rc) rc = put_i64(&w, "version", meta->version);
    if (!rc) rc = put_i64(&w, "deadline", meta->deadline);
    if (!rc) rc = st_writer_add(&w, "indices", ST_U32, 1, shape, idx, n * sizeof *idx);
    return finish(&w, rc, out, "round's candidates", err);
}

int compress_round_encode_values(const compress_round_meta *meta, const float *vals, size_t n,
                                 vl_buf *out, vl_error *err) {
    return compress_round_encode_values_as(meta, vals, n, ST_F32, out, err);
}

int compress_round_encode_values_as(const compress_round_meta *meta, const float *vals, size_t n,
                                    st_dtype dtype, vl_buf *out, vl_error *err) {
    uint16_t *half = NULL;
    const void *data = NULL;
    size_t nbytes = 0;
    int rc = compress_as_dtype(vals, n, dtype, &half, &data, &nbytes, err);
    if (rc) return rc;
    st_writer w;
    st_writer_init(&w);
    uint64_t shape[1] = {n};
    rc = st_writer_meta(&w, "run", meta->run);
    if (!rc) rc = put_i64(&w, "version", meta->version);
    if (!rc) rc = put_i64(&w, "task", meta->task);
    if (!rc) rc = put_i64(&w, "peer", meta->peer);
    if (!rc) rc = st_writer_add(&w, "values", dtype, 1, shape, data, nbytes);
    rc = finish(&w, rc, out, "round's values", err);
    free(half);
    return rc;
}

/* Reads the metadata key as an integer in [min, max]. */
static int meta_i64(const st_file *f, const char *key, int64_t min, int64_t max, int64_t *out,
                    vl_error *err) {
    const char *v = st_meta_get(f, key);
    if (!v || vl_parse_i64(v, min, max, out) != VL_OK)
        return vl_fail(err, VL_EINVAL, "metadata '%s' is missing or not an integer in range", key);
    return VL_OK;
}

static int meta_run(const st_file *f, compress_round_meta *m, vl_error *err) {
    const char *run = st_meta_get(f, "run");
    if (!run || strlen(run) >= sizeof m->run)
        return vl_fail(err, VL_EINVAL, "metadata 'run' is missing or too long");
    snprintf(m->run, sizeof m->run, "%s", run);
    return VL_OK;
}

int compress_round_decode_candidates(const uint8_t *bytes, size_t len, size_t n_params,
                                     compress_round_meta *meta, uint32_t **idx, size_t *n,
                                     vl_error *err) {
    memset(meta, 0, sizeof *meta);
    *idx = NULL;
    *n = 0;
    st_file f;
    int rc = st_parse(bytes, len, &f, err);
    if (rc) return VL_EINVAL;
    const st_tensor *t = st_find(&f, "indices");
    if ((rc = meta_run(&f, meta, err)) ||
        (rc = meta_i64(&f, "version", 0, INT64_MAX, &meta->version, err)) ||
        (rc = meta_i64(&f, "deadline", 0, INT64_MAX, &meta->deadline, err)))
        goto out;
    if (!t || f.ntensors != 1 || t->dtype != ST_U32 || t->ndim != 1 || t->numel == 0) {
        rc = vl_fail(err, VL_EINVAL, "candidates are one non-empty U32 tensor 'indices'");
        goto out;
    }
    *idx = malloc(t->nbytes);
    if (!*idx) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory for %llu candidates",
                     (unsigned long long)t->numel);
        goto out;
    }
    memcpy(*idx, t->data, t->nbytes);
    if (!compress_indices_valid(*idx, (size_t)t->numel, n_params)) {
        free(*idx);
        *idx = NULL;
        rc =
            vl_fail(err, VL_EINVAL, "candidates must ascend strictly and stay below %zu", n_params);
        goto out;
    }
    *n = (size_t)t->numel;
out:
    st_free(&f);
    return rc;
}

int compress_round_decode_values(const uint8_t *bytes, size_t len, size_t want_n,
                                 compress_round_meta *meta, float **vals, size_t *n,
                                 const char **code, vl_error *err) {
    memset(meta, 0, sizeof *meta);
    *vals = NULL;
    *n = 0;
    if (code) *code = NULL;
    st_file f;
    int rc = st_parse(bytes, len, &f, err);
    if (rc) return VL_EINVAL;
    const st_tensor *t = st_find(&f, "values");
    if ((rc = meta_run(&f, meta, err)) ||
        (rc = meta_i64(&f, "version", 0, INT64_MAX, &meta->version, err)) ||
        (rc = meta_i64(&f, "task", 1, INT64_MAX, &meta->task, err)) ||
        (rc = meta_i64(&f, "peer", 1, INT64_MAX, &meta->peer, err)))
        goto out;
    if (!t || f.ntensors != 1) {
        rc = vl_fail(err, VL_EINVAL, "round values are one tensor named 'values'");
        goto out;
    }
    if ((t->dtype != ST_F32 && t->dtype != ST_F16) || t->ndim != 1 || t->numel != want_n) {
        if (code) *code = "bad_shape";
        rc =
            vl_fail(err, VL_ERANGE, "'values' must be F32 or F16 [%zu], one per candidate", want_n);
        goto out;
    }
    float *v = malloc(want_n * sizeof *v + 1);
    if (!v) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory for %zu values", want_n);
        goto out;
    }
    if (t->dtype == ST_F32) {
        memcpy(v, t->data, t->nbytes);
    } else {
        for (size_t i = 0; i < want_n; i++) {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            v[i] = vl_f16_to_f32(h);
        }
    }
    if (!compress_all_finite(v, want_n)) {
        free(v);
        if (code) *code = "non_finite";
        rc = vl_fail(err, VL_ERANGE, "'values' holds NaN or Inf");
        goto out;
    }
    for (size_t i = 0; i < want_n; i++) {
        if (fabsf(v[i]) > COMPRESS_MAX_ABS) {
            free(v);
            if (code) *code = "out_of_bounds";
            rc = vl_fail(err, VL_ERANGE, "'values'[%zu] is larger in magnitude than 2^40", i);
            goto out;
        }
    }
    *vals = v;
    *n = want_n;
out:
    st_free(&f);
    return rc;
}
