/* Encoding and strict validation of uploaded updates. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "compress/compress.h"

static const char *const KIND_NAMES[] = {"dense", "topk", "sketch"};

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

/* Starts a writer with the update's metadata. */
static int write_meta(st_writer *w, const compress_update_meta *meta) {
    char v[7][32];
    snprintf(v[0], sizeof v[0], "%lld", (long long)meta->task);
    snprintf(v[1], sizeof v[1], "%lld", (long long)meta->peer);
    snprintf(v[2], sizeof v[2], "%lld", (long long)meta->base_version);
    snprintf(v[3], sizeof v[3], "%lld", (long long)meta->num_samples);
    snprintf(v[4], sizeof v[4], "%lld", (long long)meta->local_steps);
    snprintf(v[5], sizeof v[5], "%.9g", meta->loss);
    snprintf(v[6], sizeof v[6], "%llu", (unsigned long long)meta->seed);
    int rc = st_writer_meta(w, "run", meta->run);
    if (!rc) rc = st_writer_meta(w, "task", v[0]);
    if (!rc) rc = st_writer_meta(w, "peer", v[1]);
    if (!rc) rc = st_writer_meta(w, "base_version", v[2]);
    if (!rc) rc = st_writer_meta(w, "kind", compress_kind_name(meta->kind));
    if (!rc) rc = st_writer_meta(w, "num_samples", v[3]);
    if (!rc) rc = st_writer_meta(w, "local_steps", v[4]);
    if (!rc) rc = st_writer_meta(w, "loss", v[5]);
    if (!rc && meta->kind == COMPRESS_SKETCH) rc = st_writer_meta(w, "seed", v[6]);
    if (!rc && meta->kind == COMPRESS_SKETCH) rc = st_writer_meta(w, "hash", COMPRESS_SKETCH_HASH);
    if (!rc && meta->has_accuracy) {
        char acc[32];
        snprintf(acc, sizeof acc, "%.6f", meta->accuracy);
        rc = st_writer_meta(w, "accuracy", acc);
    }
    if (!rc && meta->train_seconds > 0) {
        char secs[32];
        snprintf(secs, sizeof secs, "%.6g", meta->train_seconds);
        rc = st_writer_meta(w, "train_seconds", secs);
    }
    return rc;
}

int compress_as_dtype(const float *x, size_t n, st_dtype dtype, uint16_t **half, const void **data,
                      size_t *nbytes, vl_error *err) {
    *half = NULL;
    *data = x;
    *nbytes = n * sizeof(float);
    if (dtype == ST_F32) return VL_OK;
    if (dtype != ST_F16) return vl_fail(err, VL_EINVAL, "update values are F32 or F16");
    *half = malloc(n * sizeof **half + 1);
    if (!*half) return vl_fail(err, VL_ENOMEM, "out of memory encoding update");
    for (size_t i = 0; i < n; i++) (*half)[i] = vl_f32_to_f16(x[i]);
    *data = *half;
    *nbytes = n * sizeof **half;
    return VL_OK;
}

/* Writes meta plus up to two tensors and finishes into out. */
static int encode(const compress_update_meta *meta, const char *name1, st_dtype dt1, int ndim1,
                  const uint64_t *shape1, const void *data1, size_t bytes1, const char *name2,
                  st_dtype dt2, const void *data2, size_t bytes2, vl_buf *out, vl_error *err) {
    st_writer w;
    st_writer_init(&w);
    void *scratch = NULL;
    int rc = write_meta(&w, meta);
    if (!rc) rc = st_writer_add(&w, name1, dt1, ndim1, shape1, data1, bytes1);
    if (!rc && name2) rc = st_writer_add(&w, name2, dt2, 1, shape1, data2, bytes2);
    if (rc) rc = vl_fail(err, rc, "cannot build update");
    if (!rc && meta->factors) rc = compress_factors_write(&w, meta->factors, &scratch, err);
    if (!rc) rc = st_writer_finish(&w, out, err);
    st_writer_free(&w);
    free(scratch);
    return rc;
}

int compress_update_encode_dense(const compress_update_meta *meta, const float *delta, size_t n,
                                 st_dtype dtype, vl_buf *out, vl_error *err) {
    if (meta->kind != COMPRESS_DENSE) return vl_fail(err, VL_EINVAL, "meta kind is not dense");
    uint16_t *half;
    const void *data;
    size_t nbytes;
    int rc = compress_as_dtype(delta, n, dtype, &half, &data, &nbytes, err);
    if (rc) return rc;
    uint64_t shape[1] = {n};
    rc = encode(meta, "delta", dtype, 1, shape, data, nbytes, NULL, ST_F32, NULL, 0, out, err);
    free(half);
    return rc;
}

int compress_update_encode_topk(const compress_update_meta *meta, const uint32_t *idx,
                                const float *val, size_t nnz, st_dtype dtype, vl_buf *out,
                                vl_error *err) {
    if (meta->kind != COMPRESS_TOPK) return vl_fail(err, VL_EINVAL, "meta kind is not topk");
    if (!compress_indices_valid(idx, nnz, (size_t)UINT32_MAX + 1))
        return vl_fail(err, VL_EINVAL, "topk indices must be strictly ascending");
    uint16_t *half;
    const void *data;
    size_t nbytes;
    int rc = compress_as_dtype(val, nnz, dtype, &half, &data, &nbytes, err);
    if (rc) return rc;
    uint64_t shape[1] = {nnz};
    rc = encode(meta, "indices", ST_U32, 1, shape, idx, nnz * sizeof *idx, "values", dtype, data,
                nbytes, out, err);
    free(half);
    return rc;
}

int compress_update_encode_sketch(const compress_update_meta *meta, const compress_sketch *s,
                                  st_dtype dtype, vl_buf *out, vl_error *err) {
    if (meta->kind != COMPRESS_SKETCH) return vl_fail(err, VL_EINVAL, "meta kind is not sketch");
    compress_update_meta m = *meta;
    m.seed = s->seed;
    size_t cells = (size_t)s->rows * s->cols;
    uint16_t *half;
    const void *data;
    size_t nbytes;
    int rc = compress_as_dtype(s->table, cells, dtype, &half, &data, &nbytes, err);
    if (rc) return rc;
    uint64_t shape[2] = {s->rows, s->cols};
    rc = encode(&m, "table", dtype, 2, shape, data, nbytes, NULL, ST_F32, NULL, 0, out, err);
    free(half);
    return rc;
}

static int meta_i64(const st_file *f, const char *key, int64_t min, int64_t *out, vl_error *err) {
    const char *s = st_meta_get(f, key);
    if (!s) return vl_fail(err, VL_EINVAL, "update metadata lacks '%s'", key);
    if (vl_parse_i64(s, min, INT64_MAX, out) != VL_OK)
        return vl_fail(err, VL_EINVAL, "update metadata '%s' is not an integer >= %lld", key,
                       (long long)min);
    return VL_OK;
}

/* Index of the first value that is not finite, or n. Works on the raw
 * encoding (an all-ones exponent is Inf or NaN), which may be unaligned. */
static size_t first_non_finite(const uint8_t *data, st_dtype dtype, size_t n) {
    if (dtype == ST_F32) {
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, data + 4 * i, 4);
            if ((u & 0x7F800000u) == 0x7F800000u) return i;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uint16_t u;
            memcpy(&u, data + 2 * i, 2);
            if ((u & 0x7C00u) == 0x7C00u) return i;
        }
    }
    return n;
}

/* Index of the first finite value above COMPRESS_MAX_ABS in magnitude, or
 * n (F16 cannot hold one). On the raw bits: |x| > 2^40 exactly when the
 * magnitude's bits exceed those of 2^40. */
static size_t first_too_large(const uint8_t *data, st_dtype dtype, size_t n) {
    if (dtype != ST_F32) return n;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, data + 4 * i, 4);
        if ((u & 0x7FFFFFFFu) > 0x53800000u) return i;
    }
    return n;
}

/* A float from possibly unaligned bytes; a function, not a local copy in
 * the loop, so the loops that use it still vectorise. */
static inline float load_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
}

/* The largest magnitude's bits among n values (sign cleared). Inf and NaN
 * have the largest bits of all, so one branch-free pass that the compiler
 * vectorises shows whether any value needs the slower scans above, which
 * exist to name the first bad one. */
static uint32_t max_magnitude_bits(const uint8_t *data, st_dtype dtype, size_t n) {
    uint32_t m = 0;
    if (dtype == ST_F32) {
#pragma omp simd reduction(max : m)
        for (size_t i = 0; i < n; i++) {
            uint32_t u = load_u32(data + 4 * i) & 0x7FFFFFFFu;
            m = u > m ? u : m;
        }
    } else {
#pragma omp simd reduction(max : m)
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, data + 2 * i, 2);
            uint32_t u = h & 0x7FFFu;
            m = u > m ? u : m;
        }
    }
    return m;
}

/* The value checks every kind shares: finite (non_finite), then within
 * COMPRESS_MAX_ABS (out_of_bounds). */
static int check_values(const st_tensor *t, size_t n, const char **code, vl_error *err) {
    uint32_t limit = t->dtype == ST_F32 ? 0x53800000u : 0x7BFFu;
    if (max_magnitude_bits(t->data, t->dtype, n) <= limit) {
        *code = NULL;
        return VL_OK;
    }
    size_t bad = first_non_finite(t->data, t->dtype, n);
    *code = "non_finite";
    if (bad < n) return vl_fail(err, VL_ERANGE, "'%s' has a non-finite value at %zu", t->name, bad);
    bad = first_too_large(t->data, t->dtype, n);
    *code = "out_of_bounds";
    if (bad < n)
        return vl_fail(err, VL_ERANGE, "'%s'[%zu] is larger in magnitude than 2^40", t->name, bad);
    *code = NULL;
    return VL_OK;
}

static int is_value_dtype(st_dtype d) {
    return d == ST_F32 || d == ST_F16;
}

/* Metadata common to every kind. */
static int decode_meta(const st_file *f, compress_update_meta *m, const char **code,
                       vl_error *err) {
    *code = "non_finite";
    const char *run = st_meta_get(f, "run");
    const char *kind = st_meta_get(f, "kind");
    const char *loss = st_meta_get(f, "loss");
    int rc;
    if (!run || strlen(run) >= sizeof m->run)
        return vl_fail(err, VL_EINVAL, "update metadata lacks a valid 'run'");
    snprintf(m->run, sizeof m->run, "%s", run);
    if ((rc = meta_i64(f, "task", 1, &m->task, err)) ||
        (rc = meta_i64(f, "peer", 1, &m->peer, err)) ||
        (rc = meta_i64(f, "base_version", 0, &m->base_version, err)) ||
        (rc = meta_i64(f, "num_samples", 1, &m->num_samples, err)) ||
        (rc = meta_i64(f, "local_steps", 1, &m->local_steps, err)))
        return rc;
    if (m->num_samples > COMPRESS_MAX_SAMPLES)
        return vl_fail(err, VL_EINVAL, "update metadata 'num_samples' is over 2^40");
    if (!kind || compress_kind_parse(kind, &m->kind) != VL_OK)
        return vl_fail(err, VL_EINVAL, "update metadata 'kind' is missing or unknown");
    if (!loss) return vl_fail(err, VL_EINVAL, "update metadata lacks 'loss'");
    if (vl_parse_f64(loss, &m->loss) != VL_OK) {
        /* Tell a number that is not finite (422) from text that is no
         * number at all (400). */
        char *end = NULL;
        double v = strtod(loss, &end);
        int is_number = end != loss && *end == '\0';
        return vl_fail(err, is_number && !isfinite(v) ? VL_ERANGE : VL_EINVAL,
                       "update metadata 'loss' is %s", is_number ? "not finite" : "not a number");
    }
    /* Optional: only a classifier's peers report it. */
    const char *acc = st_meta_get(f, "accuracy");
    if (acc) {
        if (vl_parse_f64(acc, &m->accuracy) != VL_OK)
            return vl_fail(err, VL_EINVAL, "update metadata 'accuracy' is not a number");
        if (!(m->accuracy >= 0 && m->accuracy <= 1)) {
            *code = "bad_accuracy";
            return vl_fail(err, VL_ERANGE, "update metadata 'accuracy' %g is outside [0, 1]",
                           m->accuracy);
        }
        m->has_accuracy = 1;
    }
    /* Optional: peers before it did not report it. */
    const char *secs = st_meta_get(f, "train_seconds");
    if (secs && (vl_parse_f64(secs, &m->train_seconds) != VL_OK ||
                 !(m->train_seconds > 0 && m->train_seconds <= 1e7)))
        return vl_fail(err, VL_EINVAL,
                       "update metadata 'train_seconds' is not a number of seconds in (0, 1e7]");
    if (m->kind == COMPRESS_SKETCH) {
        const char *seed = st_meta_get(f, "seed");
        char *end = NULL;
        if (!seed || !*seed || *seed == '-' || *seed == '+' || strlen(seed) > 20)
            return vl_fail(err, VL_EINVAL, "a sketch update needs metadata 'seed'");
        errno = 0;
        unsigned long long v = strtoull(seed, &end, 10);
        if (errno || *end) return vl_fail(err, VL_EINVAL, "sketch metadata 'seed' is invalid");
        m->seed = (uint64_t)v;
        /* A table made with another hash adds up to noise in this run's
         * sketches: refused, naming what the peer must do. */
        const char *hash = st_meta_get(f, "hash");
        if (!hash || strcmp(hash, COMPRESS_SKETCH_HASH) != 0) {
            *code = "wrong_sketch";
            return vl_fail(err, VL_ERANGE,
                           "the sketch was made with hash \"%.20s\"; this run's sketches use "
                           "the \"%s\" hash (update volley-peer)",
                           hash ? hash : "per coordinate", COMPRESS_SKETCH_HASH);
        }
    }
    return VL_OK;
}

/* Tensors besides K-FAC factors, which compress_factors_decode checks. */
static int kind_tensors(const st_file *f) {
    size_t np = strlen(COMPRESS_FACTORS_PREFIX);
    int n = 0;
    for (int i = 0; i < f->ntensors; i++)
        if (strncmp(f->tensors[i].name, COMPRESS_FACTORS_PREFIX, np) != 0) n++;
    return n;
}

/* Tensors of each kind. code is set for range failures (VL_ERANGE). */
static int decode_dense(compress_update *u, size_t n_params, const char **code, vl_error *err) {
    const st_file *f = &u->file;
    u->delta = st_find(f, "delta");
    if (!u->delta || kind_tensors(f) != 1)
        return vl_fail(err, VL_EINVAL,
                       "a dense update holds one tensor, 'delta', besides any K-FAC factors");
    const st_tensor *t = u->delta;
    *code = "bad_shape";
    if (!is_value_dtype(t->dtype))
        return vl_fail(err, VL_ERANGE, "'delta' must be F32 or F16, not %s",
                       st_dtype_name(t->dtype));
    if (t->ndim != 1 || t->shape[0] != n_params)
        return vl_fail(err, VL_ERANGE, "'delta' must have shape [%zu]", n_params);
    u->nnz = n_params;
    return check_values(t, n_params, code, err);
}

static int decode_topk(compress_update *u, size_t n_params, const char **code, vl_error *err) {
    const st_file *f = &u->file;
    u->indices = st_find(f, "indices");
    u->values = st_find(f, "values");
    if (!u->indices || !u->values || kind_tensors(f) != 2)
        return vl_fail(err, VL_EINVAL,
                       "a topk update holds 'indices' and 'values', besides any K-FAC factors");
    const st_tensor *ix = u->indices, *vx = u->values;
    *code = "bad_shape";
    if (ix->dtype != ST_U32 || ix->ndim != 1)
        return vl_fail(err, VL_ERANGE, "'indices' must be U32 with one dimension");
    if (!is_value_dtype(vx->dtype) || vx->ndim != 1)
        return vl_fail(err, VL_ERANGE, "'values' must be F32 or F16 with one dimension");
    if (ix->shape[0] != vx->shape[0])
        return vl_fail(err, VL_ERANGE, "'indices' has %llu entries but 'values' %llu",
                       (unsigned long long)ix->shape[0], (unsigned long long)vx->shape[0]);
    if (ix->shape[0] > n_params)
        return vl_fail(err, VL_ERANGE, "%llu entries for a model of %zu parameters",
                       (unsigned long long)ix->shape[0], n_params);
    size_t n = (size_t)ix->shape[0];
    u->nnz = n;
    *code = "bad_indices";
    uint32_t prev = 0;
    for (size_t j = 0; j < n; j++) {
        uint32_t i;
        memcpy(&i, ix->data + 4 * j, 4);
        if (i >= n_params)
            return vl_fail(err, VL_ERANGE,
                           "'indices'[%zu] = %u is out of range (the model has "
                           "%zu parameters)",
                           j, i, n_params);
        if (j > 0 && i <= prev)
            return vl_fail(err, VL_ERANGE,
                           "'indices'[%zu] = %u is not above the previous "
                           "index %u (they must be strictly ascending)",
                           j, i, prev);
        prev = i;
    }
    return check_values(vx, n, code, err);
}

static int decode_sketch(compress_update *u, const char **code, vl_error *err) {
    const st_file *f = &u->file;
    u->table = st_find(f, "table");
    if (!u->table || kind_tensors(f) != 1)
        return vl_fail(err, VL_EINVAL,
                       "a sketch update holds one tensor, 'table', besides any K-FAC factors");
    const st_tensor *t = u->table;
    *code = "bad_shape";
    if (!is_value_dtype(t->dtype) || t->ndim != 2)
        return vl_fail(err, VL_ERANGE, "'table' must be F32 or F16 of shape [rows, cols]");
    if (t->shape[0] < 1 || t->shape[0] > COMPRESS_SKETCH_MAX_ROWS || t->shape[1] < 1 ||
        t->numel > COMPRESS_SKETCH_MAX_CELLS)
        return vl_fail(err, VL_ERANGE, "'table' of %llu x %llu is not a valid sketch shape",
                       (unsigned long long)t->shape[0], (unsigned long long)t->shape[1]);
    u->rows = (uint32_t)t->shape[0];
    u->cols = (uint32_t)t->shape[1];
    return check_values(t, (size_t)t->numel, code, err);
}

int compress_update_decode(const uint8_t *bytes, size_t len, size_t n_params, compress_update *out,
                           const char **code, vl_error *err) {
    const char *c = NULL;
    memset(out, 0, sizeof *out);
    int rc = st_parse(bytes, len, &out->file, err);
    if (rc != VL_OK) {
        if (code) *code = NULL;
        return VL_EINVAL;
    }
    const char *meta_code = NULL;
    rc = decode_meta(&out->file, &out->meta, &meta_code, err);
    if (rc == VL_ERANGE) c = meta_code;
    if (rc == VL_OK) {
        switch (out->meta.kind) {
        case COMPRESS_DENSE: rc = decode_dense(out, n_params, &c, err); break;
        case COMPRESS_TOPK: rc = decode_topk(out, n_params, &c, err); break;
        case COMPRESS_SKETCH: rc = decode_sketch(out, &c, err); break;
        }
    }
    out->has_factors = compress_factors_present(&out->file);
    if (code) *code = rc == VL_ERANGE ? c : NULL;
    if (rc != VL_OK) {
        st_free(&out->file);
        memset(out, 0, sizeof *out);
    }
    return rc;
}

void compress_update_free(compress_update *u) {
    if (!u) return;
    st_free(&u->file);
    memset(u, 0, sizeof *u);
}

int compress_update_check_spec(const compress_update *u, const compress_spec *spec,
                               const char **code, vl_error *err) {
    const char *c = NULL;
    int rc = VL_OK;
    if (u->meta.kind != spec->kind) {
        c = "wrong_kind";
        rc = vl_fail(err, VL_ERANGE, "this run takes \"%s\" updates, not \"%s\"",
                     compress_kind_name(spec->kind), compress_kind_name(u->meta.kind));
    } else if (spec->kind == COMPRESS_TOPK && u->nnz > spec->max_nnz) {
        c = "too_many_entries";
        rc = vl_fail(err, VL_ERANGE, "the update has %zu entries; this run takes at most %zu",
                     u->nnz, spec->max_nnz);
    } else if (spec->kind == COMPRESS_SKETCH &&
               (u->meta.seed != spec->seed || u->rows != spec->rows || u->cols != spec->cols)) {
        c = "wrong_sketch";
        rc = vl_fail(err, VL_ERANGE,
                     "the sketch has seed %llu and shape [%u, %u]; this run "
                     "uses seed %llu and shape [%u, %u]",
                     (unsigned long long)u->meta.seed, u->rows, u->cols,
                     (unsigned long long)spec->seed, spec->rows, spec->cols);
    }
    if (code) *code = c;
    return rc;
}

/* Value j of a tensor, converting F16; data may be unaligned. */
static inline float value_at(const st_tensor *t, size_t j) {
    if (t->dtype == ST_F32) {
        float x;
        memcpy(&x, t->data + 4 * j, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, t->data + 2 * j, 2);
    return vl_f16_to_f32(h);
}

int compress_update_accumulate(const compress_update *u, float w, float *dst, size_t n,
                               vl_error *err) {
    if (u->meta.kind == COMPRESS_DENSE) {
        const st_tensor *t = u->delta;
        if (!t || t->numel != n) return vl_fail(err, VL_EINVAL, "update does not match model size");
        if (t->dtype == ST_F32) {
            for (size_t i = 0; i < n; i++) {
                float x;
                memcpy(&x, t->data + 4 * i, 4);
                dst[i] += w * x;
            }
        } else {
            for (size_t i = 0; i < n; i++) dst[i] += w * value_at(t, i);
        }
        return VL_OK;
    }
    if (u->meta.kind != COMPRESS_TOPK || !u->indices || !u->values)
        return vl_fail(err, VL_EINVAL, "a sketch update cannot be added to a vector");
    for (size_t j = 0; j < u->nnz; j++) {
        uint32_t i;
        memcpy(&i, u->indices->data + 4 * j, 4);
        if (i >= n) return vl_fail(err, VL_EINVAL, "update index %u beyond model size", i);
        dst[i] += w * value_at(u->values, j);
    }
    return VL_OK;
}

int compress_update_accumulate_sketch(const compress_update *u, float w, compress_sketch *s,
                                      vl_error *err) {
    if (u->meta.kind != COMPRESS_SKETCH || !u->table || u->meta.seed != s->seed ||
        u->rows != s->rows || u->cols != s->cols)
        return vl_fail(err, VL_EINVAL, "update is not a sketch of this seed and shape");
    size_t cells = (size_t)s->rows * s->cols;
    const uint8_t *data = u->table->data;
    float *dst = s->table;
    if (u->table->dtype == ST_F32) {
        for (size_t c = 0; c < cells; c++) {
            float x;
            memcpy(&x, data + 4 * c, 4);
            dst[c] += w * x;
        }
    } else {
        for (size_t c = 0; c < cells; c++) dst[c] += w * value_at(u->table, c);
    }
    return VL_OK;
}

size_t compress_update_count(const compress_update *u) {
    if (u->meta.kind == COMPRESS_SKETCH) return (size_t)u->rows * u->cols;
    return u->nnz;
}

static const st_tensor *values_tensor(const compress_update *u) {
    switch (u->meta.kind) {
    case COMPRESS_DENSE: return u->delta;
    case COMPRESS_TOPK: return u->values;
    case COMPRESS_SKETCH: return u->table;
    }
    return NULL;
}

void compress_update_values(const compress_update *u, uint32_t *idx, float *val) {
    const st_tensor *t = values_tensor(u);
    size_t n = compress_update_count(u);
    if (!t) return;
    for (size_t j = 0; j < n; j++) val[j] = value_at(t, j);
    if (idx && u->meta.kind == COMPRESS_TOPK)
        for (size_t j = 0; j < n; j++) memcpy(&idx[j], u->indices->data + 4 * j, 4);
}

double compress_update_norm(const compress_update *u) {
    const st_tensor *t = values_tensor(u);
    size_t n = compress_update_count(u);
    if (!t) return 0;
    /* Summed in the order the vectorised reduction takes, which as built
     * depends on n alone, not on where the values lie: the norm stored
     * with an upload is then the one the merge would compute from the
     * body it reads back into another buffer (test_update checks every
     * offset). */
    double s = 0;
    if (t->dtype == ST_F32) {
        const uint8_t *d = t->data;
#pragma omp simd reduction(+ : s)
        for (size_t j = 0; j < n; j++) {
            double x = (double)load_f32(d + 4 * j);
            s += x * x;
        }
    } else {
        for (size_t j = 0; j < n; j++) {
            double x = (double)value_at(t, j);
            s += x * x;
        }
    }
    if (u->meta.kind == COMPRESS_SKETCH && u->rows > 0) s /= (double)u->rows;
    return sqrt(s);
}

void compress_dense_delta(const float *base, const float *local, float *delta, size_t n) {
    for (size_t i = 0; i < n; i++) delta[i] = base[i] - local[i];
}

int compress_all_finite(const float *x, size_t n) {
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= isfinite(x[i]) ? 1 : 0;
    return ok;
}

int compress_indices_valid(const uint32_t *idx, size_t nnz, size_t d) {
    for (size_t j = 0; j < nnz; j++) {
        if ((size_t)idx[j] >= d || (j > 0 && idx[j] <= idx[j - 1])) return 0;
    }
    return 1;
}
