/*
 * SSIM (model/recon.h) as Wang et al. (2004) define it and as their
 * reference code computes it: local means, variances and covariance under
 * an 11x11 Gaussian window (sigma 1.5), kept to the positions where the
 * whole window lies inside the image. The 2-D window is the outer product
 * of a normalised 1-D Gaussian, so each of the five local sums (a, b, a^2,
 * b^2, ab) is a horizontal pass then a vertical one: 22 products a pixel
 * instead of 121. Everything is in double because the variances are
 * differences of nearly equal sums (E[a^2] - E[a]^2) on flat regions.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "model/recon.h"

#define SSIM_RADIUS (MODEL_SSIM_WIN / 2)
#define SSIM_SIGMA 1.5
#define SSIM_C1 (0.01 * 0.01)
#define SSIM_C2 (0.03 * 0.03)

enum { MAP_A, MAP_B, MAP_AA, MAP_BB, MAP_AB, N_MAPS };

static void window(double g[MODEL_SSIM_WIN]) {
    double sum = 0.0;
    for (int i = 0; i < MODEL_SSIM_WIN; i++) {
        double t = (double)(i - SSIM_RADIUS);
        g[i] = exp(-t * t / (2.0 * SSIM_SIGMA * SSIM_SIGMA));
        sum += g[i];
    }
    for (int i = 0; i < MODEL_SSIM_WIN; i++) g[i] /= sum;
}

static int check_sides(const char *what, int w, int h, vl_error *err) {
    if (w < MODEL_SSIM_WIN || w > MODEL_SSIM_MAX_SIDE || h < MODEL_SSIM_WIN ||
        h > MODEL_SSIM_MAX_SIDE)
        return vl_fail(err, VL_EINVAL, "%s: %dx%d image, sides must lie in [%d, %d]", what, w, h,
                       MODEL_SSIM_WIN, MODEL_SSIM_MAX_SIDE);
    return 0;
}

/* NaN fails both comparisons, so it is refused with the infinities. */
static int check_finite(const char *what, int image, const char *name, const float *v, size_t n,
                        vl_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!(v[i] >= -FLT_MAX && v[i] <= FLT_MAX)) {
            if (image < 0)
                return vl_fail(err, VL_ERANGE, "%s: %s[%zu] = %g is not finite", what, name, i,
                               (double)v[i]);
            return vl_fail(err, VL_ERANGE, "%s: image %d: %s[%zu] = %g is not finite", what, image,
                           name, i, (double)v[i]);
        }
    return 0;
}

/* SSIM of one pair with caller-provided scratch of N_MAPS * (w-10) * h
 * doubles; sides already checked. */
static double ssim_one(const float *a, const float *b, int w, int h, double *scratch) {
    double g[MODEL_SSIM_WIN];
    window(g);
    size_t ow = (size_t)(w - 2 * SSIM_RADIUS), oh = (size_t)(h - 2 * SSIM_RADIUS);
    size_t W = (size_t)w, plane = ow * (size_t)h;
    /* Horizontal pass: row y, column x of each map is the window's
     * horizontal sum starting at pixel (x, y). */
    for (size_t y = 0; y < (size_t)h; y++) {
        const float *ra = a + y * W, *rb = b + y * W;
        for (size_t x = 0; x < ow; x++) {
            double s[N_MAPS] = {0};
            for (int i = 0; i < MODEL_SSIM_WIN; i++) {
                double va = ra[x + (size_t)i], vb = rb[x + (size_t)i], gi = g[i];
                s[MAP_A] += gi * va;
                s[MAP_B] += gi * vb;
                s[MAP_AA] += gi * va * va;
                s[MAP_BB] += gi * vb * vb;
                s[MAP_AB] += gi * va * vb;
            }
            for (int k = 0; k < N_MAPS; k++) scratch[(size_t)k * plane + y * ow + x] = s[k];
        }
    }
    double total = 0.0;
    for (size_t y = 0; y < oh; y++) {
        for (size_t x = 0; x < ow; x++) {
            double s[N_MAPS] = {0};
            for (int j = 0; j < MODEL_SSIM_WIN; j++)
                for (int k = 0; k < N_MAPS; k++)
                    s[k] += g[j] * scratch[(size_t)k * plane + (y + (size_t)j) * ow + x];
            double ma = s[MAP_A], mb = s[MAP_B];
            double va = s[MAP_AA] - ma * ma, vb = s[MAP_BB] - mb * mb;
            double cov = s[MAP_AB] - ma * mb;
            total += ((2.0 * ma * mb + SSIM_C1) * (2.0 * cov + SSIM_C2)) /
                     ((ma * ma + mb * mb + SSIM_C1) * (va + vb + SSIM_C2));
        }
    }
    return total / ((double)ow * (double)oh);
}

/* The shared body: n pairs, image i at float i*w*h. Messages name the
 * failing image only for the batch form, whose callers have several. */
static int ssim_run(const char *what, const float *a, const float *b, int n, int batch, int w,
                    int h, double *out, vl_error *err) {
    if (a == NULL || b == NULL || out == NULL)
        return vl_fail(err, VL_EINVAL, "%s: missing %s", what, out == NULL ? "output" : "image");
    int rc = check_sides(what, w, h, err);
    if (rc != 0) return rc;
    if (n < 1 || n > MODEL_RECON_MAX_ROWS)
        return vl_fail(err, VL_EINVAL, "%s: %d images outside [1, %d]", what, n,
                       MODEL_RECON_MAX_ROWS);
    size_t px = (size_t)w * (size_t)h;
    /* Every image is checked before any is measured, so a bad one late in
     * a large batch fails at once. */
    for (int i = 0; i < n && rc == 0; i++) {
        rc = check_finite(what, batch ? i : -1, "a", a + (size_t)i * px, px, err);
        if (rc == 0) rc = check_finite(what, batch ? i : -1, "b", b + (size_t)i * px, px, err);
    }
    if (rc != 0) return rc;
    double *scratch =
        malloc((size_t)N_MAPS * (size_t)(w - 2 * SSIM_RADIUS) * (size_t)h * sizeof(double));
    if (scratch == NULL)
        return vl_fail(err, VL_ENOMEM, "%s: out of memory for a %dx%d image", what, w, h);
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += ssim_one(a + (size_t)i * px, b + (size_t)i * px, w, h, scratch);
    free(scratch);
    *out = sum / (double)n;
    return 0;
}

int model_ssim(const float *a, const float *b, int w, int h, double *out, vl_error *err) {
    return ssim_run("ssim", a, b, 1, 0, w, h, out, err);
}

int model_ssim_mean(const float *a, const float *b, int n, int w, int h, double *out,
                    vl_error *err) {
    return ssim_run("ssim mean", a, b, n, 1, w, h, out, err);
}
