/*
 * K-FAC for linear layers (see model.h): the running Kronecker factors of a
 * layer's Fisher block, their damped inverses and the preconditioned
 * gradient, plus the KL-clipping factor and the weighted averaging of
 * peers' factors. The outer products go to OpenBLAS (ssyrk, sgemm); the
 * inverses to its LAPACK in double, because real factors are badly
 * conditioned (input second moments span many decades) and the inversion
 * runs only every few steps, so the cost of double is amortised while
 * float Cholesky would lose most digits of the small eigenvalues.
 */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* LAPACK from OpenBLAS, which ships no lapacke.h here. The trailing size_t
 * is gfortran's hidden length of the CHARACTER argument: required by the
 * Fortran-compiled routines, ignored by OpenBLAS's C ones (extra
 * arguments are harmless in the C calling convention). blasint is
 * OpenBLAS's integer, so an ILP64 build still matches. */
extern void dpotrf_(const char *uplo, const blasint *n, double *a, const blasint *lda,
                    blasint *info, size_t uplo_len);
extern void dpotri_(const char *uplo, const blasint *n, double *a, const blasint *lda,
                    blasint *info, size_t uplo_len);

/* n*n for n <= MODEL_KFAC_MAX_DIM + 1 cannot overflow size_t; the sums of
 * the allocation are checked anyway. */
static size_t sq(int n) {
    return (size_t)n * (size_t)n;
}

int model_kfac_layer_create(int in, int out, model_kfac_layer **layer, vl_error *err) {
    if (layer == NULL) return vl_fail(err, VL_EINVAL, "kfac create: no output pointer");
    *layer = NULL;
    if (in < 1 || in > MODEL_KFAC_MAX_DIM || out < 1 || out > MODEL_KFAC_MAX_DIM)
        return vl_fail(err, VL_EINVAL, "kfac create: layer %d x %d outside [1, %d]", in, out,
                       MODEL_KFAC_MAX_DIM);
    size_t na = sq(in + 1), ng = sq(out), nw = (size_t)(in + 1) * (size_t)out, total;
    if (__builtin_add_overflow(2 * na, 2 * ng, &total) ||
        __builtin_add_overflow(total, nw, &total) || total > SIZE_MAX / sizeof(float))
        return vl_fail(err, VL_EINVAL, "kfac create: layer %d x %d does not fit in memory", in,
                       out);
    model_kfac_layer *l = calloc(1, sizeof *l);
    float *mem = calloc(total, sizeof(float));
    if (l == NULL || mem == NULL) {
        free(l);
        free(mem);
        return vl_fail(err, VL_ENOMEM, "kfac create: out of memory for a %d x %d layer", in, out);
    }
    l->in = in;
    l->out = out;
    l->A = mem;
    l->A_inv = l->A + na;
    l->G = l->A_inv + na;
    l->G_inv = l->G + ng;
    l->work = l->G_inv + ng;
    *layer = l;
    return 0;
}

void model_kfac_layer_free(model_kfac_layer *layer) {
    if (layer == NULL) return;
    free(layer->A); /* the one allocation */
    free(layer);
}

/* ssyrk fills the upper triangle only; the other code (sgemm, averaging,
 * callers) wants the full matrix. */
static void mirror_upper(float *m, int n, int ld) {
    for (int r = 1; r < n; r++)
        for (int c = 0; c < r; c++) m[(size_t)r * ld + c] = m[(size_t)c * ld + r];
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

int model_kfac_update_factors(model_kfac_layer *layer, const float *X, const float *dY, int N,
                              float rho, vl_error *err) {
    if (layer == NULL || X == NULL || dY == NULL)
        return vl_fail(err, VL_EINVAL, "kfac update: missing layer, inputs or gradients");
    if (N < 1) return vl_fail(err, VL_EINVAL, "kfac update: batch size %d < 1", N);
    if (!(rho >= 0.0f && rho <= 1.0f))
        return vl_fail(err, VL_EINVAL, "kfac update: decay %g outside [0, 1]", (double)rho);
    int in = layer->in, out = layer->out, da = in + 1;
    size_t nx, ny;
    if (__builtin_mul_overflow((size_t)N, (size_t)in, &nx) ||
        __builtin_mul_overflow((size_t)N, (size_t)out, &ny))
        return vl_fail(err, VL_EINVAL, "kfac update: batch of %d rows does not fit in memory", N);
    /* Checked first so a bad batch leaves the averages untouched: a NaN
     * folded into a moving average would never leave it. */
    if (!all_finite(X, nx))
        return vl_fail(err, VL_ERANGE, "kfac update: NaN or infinity in the layer inputs");
    if (!all_finite(dY, ny))
        return vl_fail(err, VL_ERANGE, "kfac update: NaN or infinity in the output gradients");
    int first = layer->updates == 0;
    float keep = first ? 0.0f : rho, take = first ? 1.0f : 1.0f - rho;

    /* A's [in,in] block is (1/N) XᵀX; its last row and column are the mean
     * input (x̄ ends in 1), its corner 1. Folding the 1 in here instead of
     * copying X into an [N, in+1] buffer saves N (in+1) floats. */
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, in, N, take / (float)N, X, in, keep,
                layer->A, da);
    for (int j = 0; j < in; j++) {
        double s = 0.0;
        for (int i = 0; i < N; i++) s += X[(size_t)i * in + j];
        float *a = &layer->A[(size_t)j * da + in];
        *a = keep * *a + take * (float)(s / N);
    }
    float *corner = &layer->A[(size_t)in * da + in];
    *corner = keep * *corner + take;
    mirror_upper(layer->A, da, da);

    /* G = (1/N) Σ (N dy_i)(N dy_i)ᵀ = N dYᵀdY. */
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, out, N, take * (float)N, dY, out, keep,
                layer->G, out);
    mirror_upper(layer->G, out, out);
    layer->updates++;
    return 0;
}

/* Damped inverse of the symmetric n x n float matrix f into inv, through
 * the double buffer d (n*n). name is "A" or "G" for messages. On failure
 * inv is untouched. */
static int damped_inverse(const float *f, int n, double damping, double *d, float *inv,
                          const char *name, vl_error *err) {
    for (size_t i = 0; i < sq(n); i++) d[i] = f[i];
    for (int i = 0; i < n; i++) d[(size_t)i * n + i] += damping;
    blasint bn = n, info = 0;
    /* The matrix is symmetric, so LAPACK's column-major "U" is our
     * row-major lower triangle; either way one triangle is computed. */
    dpotrf_("U", &bn, d, &bn, &info, 1);
    if (info < 0)
        return vl_fail(err, VL_ERR, "kfac invert: dpotrf rejected argument %d", (int)-info);
    /* A pivot² is what is left of its diagonal entry once the earlier
     * rows are projected out; below n float roundings of that entry it is
     * noise (the factors are float sums), and so would its inverse be.
     * Each row is judged on its own scale because input features differ by
     * orders of magnitude; damping λ keeps every pivot² at least λ. */
    int bad = info > 0 ? (int)info : 0;
    for (int i = 0; bad == 0 && i < n; i++) {
        double p = d[(size_t)i * n + i];
        double entry = (double)f[(size_t)i * n + i] + damping;
        if (!(p * p > (double)n * FLT_EPSILON * entry)) bad = i + 1;
    }
    if (bad)
        return vl_fail(err, VL_EINVAL,
                       "kfac invert: factor %s (%d x %d) + damping %.3g is not positive definite "
                       "(pivot %d of %d at float precision); raise the damping",
                       name, n, n, damping, bad, n);
    dpotri_("U", &bn, d, &bn, &info, 1);
    if (info != 0)
        return vl_fail(err, VL_EINVAL,
                       "kfac invert: factor %s (%d x %d) + damping %.3g is singular (dpotri %d); "
                       "raise the damping",
                       name, n, n, damping, (int)info);
    for (int r = 0; r < n; r++)
        for (int c = 0; c < n; c++) {
            /* The computed triangle holds row-major (r, c) with c <= r. */
            double v = c <= r ? d[(size_t)r * n + c] : d[(size_t)c * n + r];
            if (!(fabs(v) <= FLT_MAX))
                return vl_fail(err, VL_ERANGE,
                               "kfac invert: the inverse of factor %s + damping %.3g overflows "
                               "float; raise the damping",
                               name, damping);
        }
    for (int r = 0; r < n; r++)
        for (int c = 0; c < n; c++)
            inv[(size_t)r * n + c] = (float)(c <= r ? d[(size_t)r * n + c] : d[(size_t)c * n + r]);
    return 0;
}

int model_kfac_invert(model_kfac_layer *layer, float damping, vl_error *err) {
    if (layer == NULL) return vl_fail(err, VL_EINVAL, "kfac invert: missing layer");
    if (!(damping >= 0.0f) || !isfinite(damping))
        return vl_fail(err, VL_EINVAL, "kfac invert: damping %g must be finite and >= 0",
                       (double)damping);
    if (layer->updates == 0) return vl_fail(err, VL_EINVAL, "kfac invert: no factor updates yet");
    int da = layer->in + 1, out = layer->out;
    double ta = 0.0, tg = 0.0;
    for (int i = 0; i < da; i++) ta += layer->A[(size_t)i * da + i];
    for (int i = 0; i < out; i++) tg += layer->G[(size_t)i * out + i];
    double pi = sqrt((ta / da) / (tg / out));
    if (!(ta > 0.0 && tg > 0.0) || !isfinite(pi) || pi <= 0.0) pi = 1.0;
    double root = sqrt((double)damping), dampa = pi * root, dampg = root / pi;

    size_t nd = sq(da) > sq(out) ? sq(da) : sq(out), ns = sq(da) + sq(out);
    if (nd > SIZE_MAX / sizeof(double) || ns > SIZE_MAX / sizeof(float))
        return vl_fail(err, VL_EINVAL, "kfac invert: factors too large");
    double *d = malloc(nd * sizeof *d);
    /* Both inverses land in a staging buffer first so that a failure of
     * the second leaves the layer as it was. */
    float *stage = malloc(ns * sizeof *stage);
    if (d == NULL || stage == NULL) {
        free(d);
        free(stage);
        return vl_fail(err, VL_ENOMEM, "kfac invert: out of memory");
    }
    int rc = damped_inverse(layer->A, da, dampa, d, stage, "A", err);
    if (rc == 0) rc = damped_inverse(layer->G, out, dampg, d, stage + sq(da), "G", err);
    if (rc == 0) {
        memcpy(layer->A_inv, stage, sq(da) * sizeof(float));
        memcpy(layer->G_inv, stage + sq(da), sq(out) * sizeof(float));
        layer->damping_a = (float)dampa;
        layer->damping_g = (float)dampg;
        layer->inversions++;
    }
    free(d);
    free(stage);
    return rc;
}

int model_kfac_precondition(model_kfac_layer *layer, const float *gW, const float *gb, float *outW,
                            float *outb, vl_error *err) {
    if (layer == NULL || gW == NULL || gb == NULL || outW == NULL || outb == NULL)
        return vl_fail(err, VL_EINVAL, "kfac precondition: missing layer or gradient arrays");
    if (layer->inversions == 0)
        return vl_fail(err, VL_EINVAL, "kfac precondition: no inverses yet (model_kfac_invert)");
    int in = layer->in, out = layer->out, da = in + 1;
    float *T = layer->work;
    /* T = [gW; gb] G_inv, then [outW; outb] = A_inv T. Reading the whole
     * gradient into T before writing any output is what makes in-place
     * calls safe, and splitting the products at the bias row avoids
     * copying the gradient into a stacked buffer. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, in, out, out, 1.0f, gW, out,
                layer->G_inv, out, 0.0f, T, out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, out, out, 1.0f, gb, out, layer->G_inv,
                out, 0.0f, T + (size_t)in * out, out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, in, out, da, 1.0f, layer->A_inv, da, T,
                out, 0.0f, outW, out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, out, da, 1.0f,
                layer->A_inv + (size_t)in * da, da, T, out, 0.0f, outb, out);
    return 0;
}

float model_kfac_kl_scale(const float *const *grads, const float *const *nat, const size_t *lens,
                          int n_layers, float lr, float kl_clip) {
    if (!(kl_clip > 0.0f) || !isfinite(kl_clip) || n_layers < 1) return 1.0f;
    if (grads == NULL || nat == NULL || lens == NULL) return 0.0f;
    double dot = 0.0;
    for (int l = 0; l < n_layers; l++) {
        if (lens[l] > 0 && (grads[l] == NULL || nat[l] == NULL)) return 0.0f;
        for (size_t i = 0; i < lens[l]; i++) dot += (double)grads[l][i] * (double)nat[l][i];
    }
    double q = (double)lr * (double)lr * dot;
    if (!isfinite(q)) return 0.0f;
    if (q <= 0.0) return 1.0f;
    double nu = sqrt((double)kl_clip / q);
    return nu < 1.0 ? (float)nu : 1.0f;
}

/* dst[e] = Σ_k w_k src_k[e] / wsum element by element, so dst may be one
 * of the sources: each element is read from every source before it is
 * written. */
static void average_into(float *dst, const model_kfac_layer *const *src, int which, const double *w,
                         int n, double wsum, size_t len) {
    for (size_t e = 0; e < len; e++) {
        double s = 0.0;
        for (int k = 0; k < n; k++) s += w[k] * (which == 0 ? src[k]->A : src[k]->G)[e];
        dst[e] = (float)(s / wsum);
    }
}

int model_kfac_average(model_kfac_layer *dst, const model_kfac_layer *const *src,
                       const double *weights, int n, vl_error *err) {
    if (dst == NULL || src == NULL || weights == NULL)
        return vl_fail(err, VL_EINVAL, "kfac average: missing destination, sources or weights");
    if (n < 1) return vl_fail(err, VL_EINVAL, "kfac average: %d sources (need >= 1)", n);
    double wsum = 0.0;
    long updates = 0;
    for (int k = 0; k < n; k++) {
        const model_kfac_layer *s = src[k];
        if (s == NULL) return vl_fail(err, VL_EINVAL, "kfac average: source %d missing", k);
        if (s->in != dst->in || s->out != dst->out)
            return vl_fail(err, VL_EINVAL,
                           "kfac average: source %d is a %d x %d layer, the destination %d x %d", k,
                           s->in, s->out, dst->in, dst->out);
        if (s->updates == 0)
            return vl_fail(err, VL_EINVAL, "kfac average: source %d has no factor updates", k);
        if (!(weights[k] >= 0.0) || !isfinite(weights[k]))
            return vl_fail(err, VL_EINVAL, "kfac average: weight %d = %g must be finite and >= 0",
                           k, weights[k]);
        wsum += weights[k];
        if (s->updates > updates) updates = s->updates;
    }
    if (!(wsum > 0.0) || !isfinite(wsum))
        return vl_fail(err, VL_EINVAL, "kfac average: weights sum to %g (need > 0)", wsum);
    average_into(dst->A, src, 0, weights, n, wsum, sq(dst->in + 1));
    average_into(dst->G, src, 1, weights, n, wsum, sq(dst->out));
    dst->updates = updates;
    return 0;
}

int model_kfac_set_factors(model_kfac_layer *layer, const float *A, const float *G, long updates,
                           vl_error *err) {
    if (layer == NULL || A == NULL || G == NULL)
        return vl_fail(err, VL_EINVAL, "kfac set factors: missing layer or factors");
    if (updates < 1)
        return vl_fail(err, VL_EINVAL, "kfac set factors: %ld updates (need >= 1)", updates);
    size_t na = sq(layer->in + 1), ng = sq(layer->out);
    /* Checked before copying, so a bad factor leaves the layer as it was. */
    if (!all_finite(A, na) || !all_finite(G, ng))
        return vl_fail(err, VL_ERANGE, "kfac set factors: NaN or infinity in the factors");
    memmove(layer->A, A, na * sizeof(float));
    memmove(layer->G, G, ng * sizeof(float));
    layer->updates = updates;
    return 0;
}
