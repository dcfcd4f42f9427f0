/* K-FAC factors on the wire: written into an update or a merged-factors
 * file, strictly validated when read back, and summed with weights for the
 * coordinator's average. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"

/* How far a factor may stray from symmetry, and from the Cauchy-Schwarz
 * bound |f_ij| <= sqrt(f_ii f_jj) that every positive semi-definite matrix
 * meets, relative to sqrt(f_ii f_jj): far above F16 rounding (5e-4), far
 * below anything a real factor would need. */
#define SYM_TOL 1e-2

static int layer_ok(const compress_factor_layer *l) {
    return l->a_dim >= 2 && l->a_dim <= COMPRESS_FACTORS_MAX_DIM && l->g_dim >= 1 &&
           l->g_dim <= COMPRESS_FACTORS_MAX_DIM && memchr(l->name, '\0', sizeof l->name) &&
           l->name[0];
}

static int check_layers(const compress_factor_layer *layers, int n, vl_error *err) {
    if (!layers || n < 1 || n > COMPRESS_FACTORS_MAX_LAYERS)
        return vl_fail(err, VL_EINVAL, "factors: %d layers (1 to %d)", n,
                       COMPRESS_FACTORS_MAX_LAYERS);
    for (int i = 0; i < n; i++)
        if (!layer_ok(&layers[i]))
            return vl_fail(err, VL_EINVAL, "factors: layer %d has no name or a bad size", i);
    return VL_OK;
}

static int tensor_name(char *out, size_t cap, const char *layer, char which) {
    int k = snprintf(out, cap, "%s%s.%c", COMPRESS_FACTORS_PREFIX, layer, which);
    return k > 0 && (size_t)k < cap ? VL_OK : VL_EINVAL;
}

static size_t sq(uint32_t d) {
    return (size_t)d * d;
}

/* The largest |x|, for the F16 scale; 1 for an all-zero matrix. */
static float max_abs(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m > 0.0f ? m : 1.0f;
}

int compress_factors_write(st_writer *w, const compress_factors *f, void **scratch, vl_error *err) {
    *scratch = NULL;
    int rc = check_layers(f->layers, f->n, err);
    if (rc) return rc;
    if (!f->A || !f->G) return vl_fail(err, VL_EINVAL, "factors: missing matrices");
    if (f->dtype != ST_F32 && f->dtype != ST_F16)
        return vl_fail(err, VL_EINVAL, "factors are F32 or F16");
    if (f->samples < 1 || f->samples > COMPRESS_FACTORS_MAX_SAMPLES)
        return vl_fail(err, VL_EINVAL, "factors: %lld samples", (long long)f->samples);
    size_t total = 0;
    for (int i = 0; i < f->n; i++) total += sq(f->layers[i].a_dim) + sq(f->layers[i].g_dim);
    uint16_t *half = NULL;
    float *scales = NULL;
    if (f->dtype == ST_F16) {
        /* One block: the halves, then the 2n scales. */
        size_t bytes = total * sizeof *half + 2 * (size_t)f->n * sizeof *scales + sizeof(float);
        half = malloc(bytes);
        if (!half) return vl_fail(err, VL_ENOMEM, "out of memory encoding factors");
        scales = (float *)(void *)((uint8_t *)half + ((total * sizeof *half + 3) & ~(size_t)3));
        *scratch = half;
    }
    char samples[32];
    snprintf(samples, sizeof samples, "%lld", (long long)f->samples);
    rc = st_writer_meta(w, COMPRESS_FACTORS_SAMPLES_KEY, samples);
    size_t at = 0;
    for (int i = 0; i < f->n && !rc; i++) {
        const compress_factor_layer *l = &f->layers[i];
        for (int k = 0; k < 2 && !rc; k++) {
            const float *m = k == 0 ? f->A[i] : f->G[i];
            uint32_t d = k == 0 ? l->a_dim : l->g_dim;
            size_t len = sq(d);
            char name[128];
            uint64_t shape[2] = {d, d};
            if (!m || tensor_name(name, sizeof name, l->name, k == 0 ? 'A' : 'G')) {
                rc = VL_EINVAL;
                break;
            }
            if (f->dtype == ST_F32) {
                rc = st_writer_add(w, name, ST_F32, 2, shape, m, len * sizeof(float));
                continue;
            }
            float s = max_abs(m, len);
            scales[2 * i + k] = s;
            for (size_t j = 0; j < len; j++) half[at + j] = vl_f32_to_f16(m[j] / s);
            rc = st_writer_add(w, name, ST_F16, 2, shape, half + at, len * sizeof *half);
            at += len;
        }
    }
    if (!rc && f->dtype == ST_F16) {
        uint64_t shape[1] = {2 * (uint64_t)f->n};
        rc = st_writer_add(w, COMPRESS_FACTORS_SCALE, ST_F32, 1, shape, scales,
                           2 * (size_t)f->n * sizeof *scales);
    }
    if (rc) {
        free(*scratch);
        *scratch = NULL;
        return vl_fail(err, VL_EINVAL, "factors: cannot describe them (names too long?)");
    }
    return VL_OK;
}

int compress_factors_encode_file(const compress_factors *f, const char *run, int64_t version,
                                 vl_buf *out, vl_error *err) {
    st_writer w;
    st_writer_init(&w);
    char v[32];
    snprintf(v, sizeof v, "%lld", (long long)version);
    void *scratch = NULL;
    int rc = st_writer_meta(&w, "format", COMPRESS_FACTORS_FORMAT);
    if (!rc) rc = st_writer_meta(&w, "run", run);
    if (!rc) rc = st_writer_meta(&w, "version", v);
    if (rc) rc = vl_fail(err, VL_EINVAL, "factors: run name too long");
    if (!rc) rc = compress_factors_write(&w, f, &scratch, err);
    if (!rc) rc = st_writer_finish(&w, out, err);
    st_writer_free(&w);
    free(scratch);
    return rc;
}

int compress_factors_present(const st_file *f) {
    size_t np = strlen(COMPRESS_FACTORS_PREFIX);
    for (int i = 0; i < f->ntensors; i++)
        if (strncmp(f->tensors[i].name, COMPRESS_FACTORS_PREFIX, np) == 0) return 1;
    return 0;
}

void compress_factors_view_free(compress_factors_view *v) {
    if (!v) return;
    free(v->A);
    memset(v, 0, sizeof *v);
}

static float at_f32(const st_tensor *t, size_t j) {
    if (t->dtype == ST_F32) {
        float x;
        memcpy(&x, t->data + 4 * j, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, t->data + 2 * j, 2);
    return vl_f16_to_f32(h);
}

/* The content checks of one factor matrix (values as stored; a positive
 * scale does not change any of them). */
static int check_matrix(const st_tensor *t, uint32_t d, vl_error *err) {
    for (size_t j = 0; j < sq(d); j++)
        if (!isfinite(at_f32(t, j)))
            return vl_fail(err, VL_ERANGE, "factor '%s' has a non-finite value at %zu", t->name, j);
    for (uint32_t r = 0; r < d; r++) {
        double rr = at_f32(t, (size_t)r * d + r);
        if (rr < 0)
            return vl_fail(err, VL_ERANGE, "factor '%s' has a negative diagonal entry at %u",
                           t->name, r);
        for (uint32_t c = 0; c < r; c++) {
            double cc = at_f32(t, (size_t)c * d + c);
            double x = at_f32(t, (size_t)r * d + c), y = at_f32(t, (size_t)c * d + r);
            double bound = sqrt(rr * cc);
            if (fabs(x - y) > SYM_TOL * bound + 1e-30)
                return vl_fail(err, VL_ERANGE, "factor '%s' is not symmetric at (%u, %u)", t->name,
                               r, c);
            if (fabs(x) > (1.0 + SYM_TOL) * bound + 1e-30)
                return vl_fail(err, VL_ERANGE,
                               "factor '%s' is not positive semi-definite: "
                               "|f(%u,%u)| exceeds sqrt(f(%u,%u) f(%u,%u))",
                               t->name, r, c, r, r, c, c);
        }
    }
    return VL_OK;
}

int compress_factors_decode(const st_file *f, const compress_factor_layer *layers, int n,
                            compress_factors_view *out, const char **code, vl_error *err) {
    memset(out, 0, sizeof *out);
    const char *c = NULL;
    int rc = check_layers(layers, n, err);
    if (rc) goto done;
    const char *s = st_meta_get(f, COMPRESS_FACTORS_SAMPLES_KEY);
    if (!s || vl_parse_i64(s, 1, COMPRESS_FACTORS_MAX_SAMPLES, &out->samples) != VL_OK) {
        rc = vl_fail(err, VL_EINVAL, "factors: metadata '%s' must be an integer in [1, %lld]",
                     COMPRESS_FACTORS_SAMPLES_KEY, (long long)COMPRESS_FACTORS_MAX_SAMPLES);
        goto done;
    }
    out->A = calloc(2 * (size_t)n, sizeof *out->A);
    if (!out->A) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory reading factors");
        goto done;
    }
    out->G = out->A + n;
    out->n = n;
    c = "bad_factors";
    const st_tensor *scale = st_find(f, COMPRESS_FACTORS_SCALE);
    st_dtype dtype = ST_F32;
    int expect = 2 * n + (scale ? 1 : 0);
    for (int i = 0; i < n && !rc; i++) {
        for (int k = 0; k < 2 && !rc; k++) {
            char name[128];
            uint32_t d = k == 0 ? layers[i].a_dim : layers[i].g_dim;
            if (tensor_name(name, sizeof name, layers[i].name, k == 0 ? 'A' : 'G')) {
                rc = vl_fail(err, VL_EINVAL, "factors: layer name too long");
                break;
            }
            const st_tensor *t = st_find(f, name);
            if (!t) {
                rc = vl_fail(err, VL_ERANGE, "factors: '%s' is missing", name);
                break;
            }
            if (i == 0 && k == 0) dtype = t->dtype;
            if ((t->dtype != ST_F32 && t->dtype != ST_F16) || t->dtype != dtype) {
                rc = vl_fail(err, VL_ERANGE, "factors: '%s' must be F32 or F16 like the others",
                             name);
                break;
            }
            if (t->ndim != 2 || t->shape[0] != d || t->shape[1] != d) {
                rc = vl_fail(err, VL_ERANGE, "factors: '%s' must have shape [%u, %u]", name, d, d);
                break;
            }
            if ((rc = check_matrix(t, d, err))) break;
            /* A's last entry is the mean of x̄'s constant 1 squared. */
            if (k == 0 && fabsf(at_f32(t, sq(d) - 1) - 1.0f) > 1e-3f && dtype == ST_F32) {
                rc = vl_fail(err, VL_ERANGE, "factors: '%s' must end in 1 (the bias input)", name);
                break;
            }
            (k == 0 ? out->A : out->G)[i] = t;
        }
    }
    if (!rc && dtype == ST_F16) {
        if (!scale || scale->dtype != ST_F32 || scale->ndim != 1 ||
            scale->shape[0] != 2 * (uint64_t)n) {
            rc = vl_fail(err, VL_ERANGE, "factors: F16 factors need an F32 '%s' of shape [%d]",
                         COMPRESS_FACTORS_SCALE, 2 * n);
        }
        for (int j = 0; !rc && j < 2 * n; j++) {
            float sc = at_f32(scale, (size_t)j);
            if (!(isfinite(sc) && sc > 0.0f))
                rc = vl_fail(err, VL_ERANGE, "factors: scale %d is not finite and positive", j);
        }
        /* The last entry of A, divided by its scale, must be 1 / scale. */
        for (int i = 0; !rc && i < n; i++) {
            float last = at_f32(out->A[i], sq(layers[i].a_dim) - 1) * at_f32(scale, 2 * (size_t)i);
            if (fabsf(last - 1.0f) > 1e-2f)
                rc = vl_fail(err, VL_ERANGE, "factors: '%s' must end in 1 (the bias input)",
                             out->A[i]->name);
        }
        out->scale = scale;
    } else if (!rc && scale) {
        rc = vl_fail(err, VL_ERANGE, "factors: '%s' belongs to F16 factors only",
                     COMPRESS_FACTORS_SCALE);
    }
    if (!rc) {
        size_t np = strlen(COMPRESS_FACTORS_PREFIX);
        int have = 0;
        for (int i = 0; i < f->ntensors; i++)
            if (strncmp(f->tensors[i].name, COMPRESS_FACTORS_PREFIX, np) == 0) have++;
        if (have != expect)
            rc = vl_fail(err, VL_ERANGE, "factors: %d factor tensors where this model has %d", have,
                         expect);
    }
done:
    if (code) *code = rc == VL_ERANGE ? c : NULL;
    if (rc) compress_factors_view_free(out);
    return rc;
}

int compress_factors_values(const compress_factors_view *v, int i, int which, float *dst, size_t n,
                            vl_error *err) {
    if (i < 0 || i >= v->n || (which != 0 && which != 1))
        return vl_fail(err, VL_EINVAL, "factors: no matrix %d.%d", i, which);
    const st_tensor *t = which == 0 ? v->A[i] : v->G[i];
    int rc = st_tensor_to_f32(t, dst, n, err);
    if (rc || !v->scale) return rc;
    float s = at_f32(v->scale, 2 * (size_t)i + (size_t)which);
    for (size_t j = 0; j < n; j++) dst[j] *= s;
    return VL_OK;
}

/* ---- the weighted sum ------------------------------------------------------------ */

int compress_factors_sum_init(compress_factors_sum *s, const compress_factor_layer *layers, int n,
                              vl_error *err) {
    memset(s, 0, sizeof *s);
    int rc = check_layers(layers, n, err);
    if (rc) return rc;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += sq(layers[i].a_dim) + sq(layers[i].g_dim);
    s->sum = calloc(total, sizeof *s->sum);
    s->scratch = malloc(total * sizeof *s->scratch);
    if (!s->sum || !s->scratch) {
        compress_factors_sum_free(s);
        return vl_fail(err, VL_ENOMEM, "out of memory for %zu factor entries", total);
    }
    s->layers = layers;
    s->n = n;
    s->total = total;
    return VL_OK;
}

void compress_factors_sum_free(compress_factors_sum *s) {
    if (!s) return;
    free(s->sum);
    free(s->scratch);
    memset(s, 0, sizeof *s);
}

int compress_factors_sum_add(compress_factors_sum *s, const compress_factors_view *v, double w,
                             vl_error *err) {
    if (v->n != s->n)
        return vl_fail(err, VL_EINVAL, "factors: %d layers, the sum has %d", v->n, s->n);
    if (!(isfinite(w) && w > 0.0))
        return vl_fail(err, VL_EINVAL, "factors: weight %g must be finite and > 0", w);
    size_t at = 0;
    for (int i = 0; i < s->n; i++)
        for (int k = 0; k < 2; k++) {
            size_t len = sq(k == 0 ? s->layers[i].a_dim : s->layers[i].g_dim);
            int rc = compress_factors_values(v, i, k, s->scratch + at, len, err);
            if (rc) return rc;
            for (size_t j = 0; j < len; j++) s->sum[at + j] += w * (double)s->scratch[at + j];
            at += len;
        }
    s->weight += w;
    s->samples += v->samples;
    if (s->samples > COMPRESS_FACTORS_MAX_SAMPLES) s->samples = COMPRESS_FACTORS_MAX_SAMPLES;
    s->count++;
    return VL_OK;
}

int compress_factors_sum_mean(compress_factors_sum *s, const float **A, const float **G,
                              vl_error *err) {
    if (s->count == 0 || !(s->weight > 0.0))
        return vl_fail(err, VL_EINVAL, "factors: nothing was added to the sum");
    size_t at = 0;
    for (int i = 0; i < s->n; i++)
        for (int k = 0; k < 2; k++) {
            size_t len = sq(k == 0 ? s->layers[i].a_dim : s->layers[i].g_dim);
            for (size_t j = 0; j < len; j++)
                s->scratch[at + j] = (float)(s->sum[at + j] / s->weight);
            (k == 0 ? A : G)[i] = s->scratch + at;
            at += len;
        }
    return VL_OK;
}
