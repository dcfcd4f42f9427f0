/* Encoding and strict validation of uploaded updates. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "compress/compress.h"

static const char *const KIND_NAMES[] = {"dense"};

int compress_kind_parse(const char *name, compress_kind *out) {
    for (size_t i = 0; i < sizeof KIND_NAMES / sizeof KIND_NAMES[0]; i++) {
        if (strcmp(name, KIND_NAMES[i]) == 0) {
            *out = (compress_kind)i;
            return VL_OK;
        }
    }
    return VL_EINVAL;
}

const char *compress_kind_name(compress_kind k) {
    return (unsigned)k < sizeof KIND_NAMES / sizeof KIND_NAMES[0] ? KIND_NAMES[k] : "unknown";
}

int compress_update_encode_dense(const compress_update_meta *meta, const float *delta, size_t n,
                                 st_dtype dtype, buf *out, vl_error *err) {
    if (dtype != ST_F32 && dtype != ST_F16)
        return vl_fail(err, VL_EINVAL, "dense updates are F32 or F16");
    char v[8][64];
    snprintf(v[0], sizeof v[0], "%lld", (long long)meta->task);
    snprintf(v[1], sizeof v[1], "%lld", (long long)meta->peer);
    snprintf(v[2], sizeof v[2], "%lld", (long long)meta->base_version);
    snprintf(v[3], sizeof v[3], "%lld", (long long)meta->num_samples);
    snprintf(v[4], sizeof v[4], "%lld", (long long)meta->local_steps);
    snprintf(v[5], sizeof v[5], "%.9g", meta->loss);
    uint16_t *half = NULL;
    const void *data = delta;
    size_t nbytes = n * sizeof(float);
    if (dtype == ST_F16) {
        half = malloc(n * sizeof *half + 1);
        if (!half) return vl_fail(err, VL_ENOMEM, "out of memory encoding update");
        for (size_t i = 0; i < n; i++) half[i] = f32_to_f16(delta[i]);
        data = half;
        nbytes = n * sizeof *half;
    }
    st_writer w;
    st_writer_init(&w);
    uint64_t shape[1] = {n};
    int rc = st_writer_meta(&w, "run", meta->run);
    if (!rc) rc = st_writer_meta(&w, "task", v[0]);
    if (!rc) rc = st_writer_meta(&w, "peer", v[1]);
    if (!rc) rc = st_writer_meta(&w, "base_version", v[2]);
    if (!rc) rc = st_writer_meta(&w, "kind", compress_kind_name(meta->kind));
    if (!rc) rc = st_writer_meta(&w, "num_samples", v[3]);
    if (!rc) rc = st_writer_meta(&w, "local_steps", v[4]);
    if (!rc) rc = st_writer_meta(&w, "loss", v[5]);
    if (!rc) rc = st_writer_add(&w, "delta", dtype, 1, shape, data, nbytes);
    if (!rc) rc = st_writer_finish(&w, out, err);
    else rc = vl_fail(err, rc, "cannot build update");
    st_writer_free(&w);
    free(half);
    return rc;
}

static int meta_i64(const st_file *f, const char *key, int64_t min, int64_t *out, vl_error *err) {
    const char *s = st_meta_get(f, key);
    if (!s) return vl_fail(err, VL_EINVAL, "update metadata lacks '%s'", key);
    if (parse_i64(s, min, INT64_MAX, out) != VL_OK)
        return vl_fail(err, VL_EINVAL, "update metadata '%s' is not an integer >= %lld", key,
                       (long long)min);
    return VL_OK;
}

int compress_update_decode(const uint8_t *bytes, size_t len, size_t n_params,
                           compress_update *out, vl_error *err) {
    memset(out, 0, sizeof *out);
    int rc = st_parse(bytes, len, &out->file, err);
    if (rc != VL_OK) return VL_EINVAL;
    const st_file *f = &out->file;
    compress_update_meta *m = &out->meta;
    const char *run = st_meta_get(f, "run");
    const char *kind = st_meta_get(f, "kind");
    const char *loss = st_meta_get(f, "loss");
    if (!run || strlen(run) >= sizeof m->run) {
        rc = vl_fail(err, VL_EINVAL, "update metadata lacks a valid 'run'");
        goto fail;
    }
    snprintf(m->run, sizeof m->run, "%s", run);
    if ((rc = meta_i64(f, "task", 1, &m->task, err)) ||
        (rc = meta_i64(f, "peer", 1, &m->peer, err)) ||
        (rc = meta_i64(f, "base_version", 0, &m->base_version, err)) ||
        (rc = meta_i64(f, "num_samples", 1, &m->num_samples, err)) ||
        (rc = meta_i64(f, "local_steps", 1, &m->local_steps, err)))
        goto fail;
    if (!kind || compress_kind_parse(kind, &m->kind) != VL_OK) {
        rc = vl_fail(err, VL_EINVAL, "update metadata 'kind' is missing or unknown");
        goto fail;
    }
    if (!loss) {
        rc = vl_fail(err, VL_EINVAL, "update metadata lacks 'loss'");
        goto fail;
    }
    if (parse_f64(loss, &m->loss) != VL_OK) {
        /* Tell a number that is not finite (422) from text that is no
         * number at all (400). */
        char *end = NULL;
        double v = strtod(loss, &end);
        int is_number = end != loss && *end == '\0';
        rc = vl_fail(err, is_number && !isfinite(v) ? VL_ERANGE : VL_EINVAL,
                     "update metadata 'loss' is %s", is_number ? "not finite" : "not a number");
        goto fail;
    }
    out->delta = st_find(f, "delta");
    if (!out->delta || f->ntensors != 1) {
        rc = vl_fail(err, VL_EINVAL, "a dense update holds exactly one tensor, 'delta'");
        goto fail;
    }
    const st_tensor *t = out->delta;
    if (t->dtype != ST_F32 && t->dtype != ST_F16) {
        rc = vl_fail(err, VL_ERANGE, "'delta' must be F32 or F16, not %s", st_dtype_name(t->dtype));
        goto fail;
    }
    if (t->ndim != 1 || t->shape[0] != n_params) {
        rc = vl_fail(err, VL_ERANGE, "'delta' must have shape [%zu]", n_params);
        goto fail;
    }
    /* Finite check on the raw encoding: all-ones exponent means Inf/NaN. */
    if (t->dtype == ST_F32) {
        for (size_t i = 0; i < n_params; i++) {
            uint32_t u;
            memcpy(&u, t->data + 4 * i, 4);
            if ((u & 0x7F800000u) == 0x7F800000u) {
                rc = vl_fail(err, VL_ERANGE, "'delta' has a non-finite value at %zu", i);
                goto fail;
            }
        }
    } else {
        for (size_t i = 0; i < n_params; i++) {
            uint16_t u;
            memcpy(&u, t->data + 2 * i, 2);
            if ((u & 0x7C00u) == 0x7C00u) {
                rc = vl_fail(err, VL_ERANGE, "'delta' has a non-finite value at %zu", i);
                goto fail;
            }
        }
    }
    return VL_OK;
fail:
    st_free(&out->file);
    memset(out, 0, sizeof *out);
    return rc;
}

void compress_update_free(compress_update *u) {
    if (!u) return;
    st_free(&u->file);
    memset(u, 0, sizeof *u);
}

int compress_update_accumulate(const compress_update *u, float w, float *dst, size_t n,
                               vl_error *err) {
    const st_tensor *t = u->delta;
    if (!t || t->numel != n) return vl_fail(err, VL_EINVAL, "update does not match model size");
    if (t->dtype == ST_F32) {
        /* data may be unaligned in the request buffer: memcpy each value. */
        for (size_t i = 0; i < n; i++) {
            float x;
            memcpy(&x, t->data + 4 * i, 4);
            dst[i] += w * x;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            dst[i] += w * f16_to_f32(h);
        }
    }
    return VL_OK;
}

void compress_dense_delta(const float *base, const float *local, float *delta, size_t n) {
    for (size_t i = 0; i < n; i++) delta[i] = base[i] - local[i];
}

int compress_all_finite(const float *x, size_t n) {
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= isfinite(x[i]) ? 1 : 0;
    return ok;
}
