/*
 * Unit tests for the leakage benchmark's tools (model/recon.h, model/png.h):
 * the decoder's gradient against central finite differences of its own
 * loss, learning a squashed linear map far below the error of predicting
 * the mean, reproducibility and split training; SSIM against a plain 2-D
 * window sum written here in double, its symmetry and batch mean; a PNG
 * grid read back through libpng; and the refusal of bad arguments.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <png.h>

#include "common/common.h"
#include "model/png.h"
#include "model/recon.h"
#include "tests/unit/test_util.h"

#define FAILS(code, call)                                                                          \
    do {                                                                                           \
        vl_error e_ = {0};                                                                         \
        int rc_ = (call);                                                                          \
        if (rc_ != (code)) fail_msg("%s returned %d, wanted %d (%s)", #call, rc_, (code), e_.msg); \
        if (e_.msg[0] == '\0' || strchr(e_.msg, '\n'))                                             \
            fail_msg("%s: message not one line: '%s'", #call, e_.msg);                             \
    } while (0)

static float *uniform_vec(size_t n, uint64_t seed) {
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    vl_rng r;
    vl_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = vl_rng_uniform(&r);
    return x;
}

/* ---- decoder ------------------------------------------------------------------------ */

static void test_gradient_finite_differences(void **state) {
    (void)state;
    enum { Q = 5, H = 7, P = 6, B = 4 };
    model_recon *d = NULL;
    OK(model_recon_create(Q, H, P, 11, &d, &e_));
    size_t np = model_recon_num_params(d);
    assert_int_equal(np, (size_t)(Q * H + H + H * P + P));
    float *Z = random_vec((size_t)B * Q, 1), *X = uniform_vec((size_t)B * P, 2);
    /* Biases start at 0; move them so their gradients are exercised away
     * from the symmetric point. */
    float *w = model_recon_params(d);
    for (size_t i = 0; i < np; i++) w[i] += 0.1f * (float)sin((double)i);
    double loss = 0;
    OK(model_recon_loss_grad(d, Z, X, B, &loss, &e_));
    assert_true(loss > 0.0 && loss < 1.0);
    float *g = malloc(np * sizeof *g);
    assert_non_null(g);
    memcpy(g, model_recon_grads(d), np * sizeof *g);
    double gmax = 0;
    for (size_t i = 0; i < np; i++) gmax = fmax(gmax, fabs(g[i]));
    assert_true(gmax > 1e-4);
    const float eps = 1e-2f;
    double worst = 0;
    for (size_t i = 0; i < np; i++) {
        float keep = w[i];
        double lp, lm;
        w[i] = keep + eps;
        OK(model_recon_loss_grad(d, Z, X, B, &lp, &e_));
        w[i] = keep - eps;
        OK(model_recon_loss_grad(d, Z, X, B, &lm, &e_));
        w[i] = keep;
        /* The step actually taken, as float rounding made it. */
        double fd = (lp - lm) / ((double)(keep + eps) - (double)(keep - eps));
        double dev = fabs(fd - g[i]) / (gmax + fabs(fd));
        worst = fmax(worst, dev);
        if (dev > 1e-3)
            fail_msg("param %zu: analytic %g, finite difference %g", i, (double)g[i], fd);
    }
    print_message("decoder gradient: worst relative deviation %.2e over %zu params\n", worst, np);
    free(g);
    free(Z);
    free(X);
    model_recon_free(d);
}

/* X = sigmoid(Z A) for a fixed random A [q, p]: learnable by the decoder. */
static void toy_data(int n, int q, int p, uint64_t seed, float **Zo, float **Xo) {
    float *A = random_vec((size_t)q * p, 1234); /* the same map for every set */
    float *Z = random_vec((size_t)n * q, seed);
    float *X = malloc((size_t)n * p * sizeof *X);
    assert_non_null(X);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < p; j++) {
            double s = 0;
            for (int k = 0; k < q; k++) s += (double)Z[(size_t)i * q + k] * A[(size_t)k * p + j];
            X[(size_t)i * p + j] = (float)(1.0 / (1.0 + exp(-s / sqrt((double)q))));
        }
    free(A);
    *Zo = Z;
    *Xo = X;
}

/* Mean squared error of predicting each pixel's mean over the set. */
static double mean_baseline(const float *X, int n, int p) {
    double total = 0;
    for (int j = 0; j < p; j++) {
        double m = 0, v = 0;
        for (int i = 0; i < n; i++) m += X[(size_t)i * p + j];
        m /= n;
        for (int i = 0; i < n; i++) {
            double e = X[(size_t)i * p + j] - m;
            v += e * e;
        }
        total += v / n;
    }
    return total / p;
}

static void test_learns_toy_problem(void **state) {
    (void)state;
    enum { Q = 8, H = 32, P = 16, N = 512, NT = 256 };
    float *Z, *X, *Zt, *Xt;
    toy_data(N, Q, P, 5, &Z, &X);
    toy_data(NT, Q, P, 6, &Zt, &Xt);
    model_recon *d = NULL;
    OK(model_recon_create(Q, H, P, 7, &d, &e_));
    double mse = -1;
    OK(model_recon_train(d, Z, X, N, 60, 32, 1e-2f, &mse, &e_));
    double base = mean_baseline(X, N, P);
    float *pred = malloc((size_t)NT * P * sizeof *pred);
    assert_non_null(pred);
    OK(model_recon_predict(d, Zt, NT, pred, &e_));
    for (size_t i = 0; i < (size_t)NT * P; i++) assert_true(pred[i] >= 0.0f && pred[i] <= 1.0f);
    double test_mse = model_recon_mse(pred, Xt, (size_t)NT * P);
    print_message("toy: mean baseline %.5f, train mse %.6f, test mse %.6f\n", base, mse, test_mse);
    assert_true(mse < 0.05 * base);
    assert_true(test_mse < 0.1 * base);
    /* The reported error is the whole training set's after the last step. */
    float *ptrain = malloc((size_t)N * P * sizeof *ptrain);
    assert_non_null(ptrain);
    OK(model_recon_predict(d, Z, N, ptrain, &e_));
    assert_true(fabs(model_recon_mse(ptrain, X, (size_t)N * P) - mse) <= 1e-12);
    free(ptrain);
    free(pred);
    free(Z);
    free(X);
    free(Zt);
    free(Xt);
    model_recon_free(d);
}

static void test_reproducible_and_split(void **state) {
    (void)state;
    enum { Q = 6, H = 16, P = 10, N = 100 };
    float *Z, *X;
    toy_data(N, Q, P, 9, &Z, &X);
    model_recon *a = NULL, *b = NULL, *c = NULL;
    OK(model_recon_create(Q, H, P, 3, &a, &e_));
    OK(model_recon_create(Q, H, P, 3, &b, &e_));
    OK(model_recon_create(Q, H, P, 4, &c, &e_));
    size_t np = model_recon_num_params(a);
    assert_memory_equal(model_recon_params(a), model_recon_params(b), np * sizeof(float));
    assert_memory_not_equal(model_recon_params(a), model_recon_params(c), np * sizeof(float));
    /* Six epochs in one call or three and three: the same steps on the
     * same minibatches, bit for bit. */
    OK(model_recon_train(a, Z, X, N, 6, 16, 5e-3f, NULL, &e_));
    OK(model_recon_train(b, Z, X, N, 3, 16, 5e-3f, NULL, &e_));
    OK(model_recon_train(b, Z, X, N, 3, 16, 5e-3f, NULL, &e_));
    assert_memory_equal(model_recon_params(a), model_recon_params(b), np * sizeof(float));
    /* A batch over n trains on the whole set at once. */
    double mse;
    OK(model_recon_train(c, Z, X, N, 2, 1000, 5e-3f, &mse, &e_));
    assert_true(mse > 0 && mse < 1);
    free(Z);
    free(X);
    model_recon_free(a);
    model_recon_free(b);
    model_recon_free(c);
}

static void test_mse_helper(void **state) {
    (void)state;
    float a[4] = {0, 1, 0.5f, 0.25f}, b[4] = {1, 1, 0, 0.25f};
    assert_true(fabs(model_recon_mse(a, b, 4) - 1.25 / 4) < 1e-15);
    assert_true(isnan(model_recon_mse(a, b, 0)));
    assert_true(isnan(model_recon_mse(NULL, b, 4)));
}

static void test_decoder_refuses(void **state) {
    (void)state;
    model_recon *d = (model_recon *)&d;
    FAILS(VL_EINVAL, model_recon_create(0, 4, 4, 1, &d, &e_));
    assert_null(d);
    FAILS(VL_EINVAL, model_recon_create(4, MODEL_RECON_MAX_WIDTH + 1, 4, 1, &d, &e_));
    FAILS(VL_EINVAL, model_recon_create(4, 4, -1, 1, &d, &e_));
    FAILS(VL_EINVAL,
          model_recon_create(MODEL_RECON_MAX_WIDTH, MODEL_RECON_MAX_WIDTH, 4, 1, &d, &e_));
    FAILS(VL_EINVAL, model_recon_create(4, 4, 4, 1, NULL, &e_));
    enum { Q = 3, H = 4, P = 2, N = 4 };
    OK(model_recon_create(Q, H, P, 1, &d, &e_));
    float Z[N * Q] = {0}, X[N * P] = {0}, out[N * P];
    size_t np = model_recon_num_params(d);
    float *before = malloc(np * sizeof *before);
    assert_non_null(before);
    memcpy(before, model_recon_params(d), np * sizeof *before);
    FAILS(VL_EINVAL, model_recon_train(d, Z, X, 0, 1, 2, 1e-3f, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_train(d, Z, X, MODEL_RECON_MAX_ROWS + 1, 1, 2, 1e-3f, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_train(d, NULL, X, N, 1, 2, 1e-3f, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_train(d, Z, NULL, N, 1, 2, 1e-3f, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_train(NULL, Z, X, N, 1, 2, 1e-3f, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_train(d, Z, X, N, 0, 2, 1e-3f, NULL, &e_));
    FAILS(VL_EINVAL,
          model_recon_train(d, Z, X, N, MODEL_RECON_MAX_EPOCHS + 1, 2, 1e-3f, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_train(d, Z, X, N, 1, 0, 1e-3f, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_train(d, Z, X, N, 1, MODEL_RECON_MAX_BATCH + 1, 1e-3f, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_train(d, Z, X, N, 1, 2, 0.0f, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_train(d, Z, X, N, 1, 2, NAN, NULL, &e_));
    X[3] = 255.0f; /* bytes not scaled to [0, 1] */
    FAILS(VL_EINVAL, model_recon_train(d, Z, X, N, 1, 2, 1e-3f, NULL, &e_));
    X[3] = 0.0f;
    Z[5] = NAN;
    FAILS(VL_ERANGE, model_recon_train(d, Z, X, N, 1, 2, 1e-3f, NULL, &e_));
    FAILS(VL_ERANGE, model_recon_predict(d, Z, N, out, &e_));
    Z[5] = INFINITY;
    FAILS(VL_ERANGE, model_recon_loss_grad(d, Z, X, N, NULL, &e_));
    Z[5] = 0.0f;
    assert_memory_equal(before, model_recon_params(d), np * sizeof *before);
    FAILS(VL_EINVAL, model_recon_predict(d, Z, N, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_predict(d, NULL, N, out, &e_));
    FAILS(VL_EINVAL, model_recon_predict(d, Z, 0, out, &e_));
    FAILS(VL_EINVAL, model_recon_predict(d, Z, MODEL_RECON_MAX_ROWS + 1, out, &e_));
    FAILS(VL_EINVAL, model_recon_loss_grad(d, Z, X, 0, NULL, &e_));
    /* Too many rows for the int-indexed kernels at the widest decoder:
     * refused on the sizes, before the (here far too short) arrays are
     * read, as the values are checked last. */
    model_recon *wide = NULL;
    OK(model_recon_create(MODEL_RECON_MAX_WIDTH, 1, 1, 1, &wide, &e_));
    FAILS(VL_EINVAL, model_recon_train(wide, Z, X, 16384, 1, 16384, 1e-3f, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_loss_grad(wide, Z, X, 16384, NULL, &e_));
    FAILS(VL_EINVAL, model_recon_loss_grad(d, Z, X, MODEL_RECON_MAX_BATCH + 1, NULL, &e_));
    model_recon_free(wide);
    /* Still usable after the refusals. */
    OK(model_recon_train(d, Z, X, N, 1, 2, 1e-3f, NULL, &e_));
    OK(model_recon_predict(d, Z, N, out, &e_));
    free(before);
    model_recon_free(d);
    model_recon_free(NULL);
}

/* ---- SSIM ----------------------------------------------------------------------------- */

/* SSIM written out directly: for each valid position, the full 11x11
 * weighted sums, in double. */
static double ssim_reference(const float *a, const float *b, int w, int h) {
    double g1[11], s = 0;
    for (int i = 0; i < 11; i++) {
        g1[i] = exp(-(double)((i - 5) * (i - 5)) / (2 * 1.5 * 1.5));
        s += g1[i];
    }
    double g[11][11];
    for (int i = 0; i < 11; i++)
        for (int j = 0; j < 11; j++) g[i][j] = g1[i] * g1[j] / (s * s);
    const double c1 = 1e-4, c2 = 9e-4;
    double total = 0;
    for (int y = 0; y + 11 <= h; y++)
        for (int x = 0; x + 11 <= w; x++) {
            double ma = 0, mb = 0;
            for (int i = 0; i < 11; i++)
                for (int j = 0; j < 11; j++) {
                    ma += g[i][j] * a[(y + i) * w + x + j];
                    mb += g[i][j] * b[(y + i) * w + x + j];
                }
            double va = 0, vb = 0, cov = 0;
            for (int i = 0; i < 11; i++)
                for (int j = 0; j < 11; j++) {
                    double da = a[(y + i) * w + x + j] - ma, db = b[(y + i) * w + x + j] - mb;
                    va += g[i][j] * da * da;
                    vb += g[i][j] * db * db;
                    cov += g[i][j] * da * db;
                }
            total +=
                (2 * ma * mb + c1) * (2 * cov + c2) / ((ma * ma + mb * mb + c1) * (va + vb + c2));
        }
    return total / ((double)(w - 10) * (h - 10));
}

/* A smooth picture with some texture, like a garment more than noise. */
static float *picture(int w, int h, uint64_t seed) {
    float *p = uniform_vec((size_t)w * h, seed);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            float *v = &p[y * w + x];
            *v = 0.5f + 0.3f * (float)sin(0.3 * x + 0.2 * y) + 0.2f * (*v - 0.5f);
        }
    return p;
}

static void test_ssim_reference(void **state) {
    (void)state;
    int sizes[][2] = {{28, 28}, {31, 17}, {11, 11}};
    for (int s = 0; s < 3; s++) {
        int w = sizes[s][0], h = sizes[s][1];
        size_t n = (size_t)w * h;
        float *a = picture(w, h, 20 + s), *off = malloc(n * sizeof *off);
        float *noisy = random_vec(n, 30 + s), *other = uniform_vec(n, 40 + s);
        assert_non_null(off);
        for (size_t i = 0; i < n; i++) {
            off[i] = a[i] + 0.1f;
            noisy[i] = a[i] + 0.1f * noisy[i];
        }
        double v;
        OK(model_ssim(a, a, w, h, &v, &e_));
        assert_true(fabs(v - 1.0) < 1e-12);
        const float *bs[3] = {off, noisy, other};
        for (int k = 0; k < 3; k++) {
            double ref = ssim_reference(a, bs[k], w, h), ba;
            OK(model_ssim(a, bs[k], w, h, &v, &e_));
            OK(model_ssim(bs[k], a, w, h, &ba, &e_));
            print_message("ssim %dx%d pair %d: %.9f (reference %.9f)\n", w, h, k, v, ref);
            assert_true(fabs(v - ref) < 1e-6);
            assert_true(fabs(v - ba) < 1e-12);
            assert_true(v < 1.0);
        }
        free(a);
        free(off);
        free(noisy);
        free(other);
    }
}

static void test_ssim_mean_and_refusals(void **state) {
    (void)state;
    enum { W = 28, NI = 3 };
    size_t px = (size_t)W * W;
    float *a = uniform_vec(NI * px, 1), *b = uniform_vec(NI * px, 2);
    double sum = 0, v, mean;
    for (int i = 0; i < NI; i++) {
        OK(model_ssim(a + i * px, b + i * px, W, W, &v, &e_));
        sum += v;
    }
    OK(model_ssim_mean(a, b, NI, W, W, &mean, &e_));
    assert_true(fabs(mean - sum / NI) < 1e-12);
    FAILS(VL_EINVAL, model_ssim(a, b, 10, W, &v, &e_));
    FAILS(VL_EINVAL, model_ssim(a, b, W, MODEL_SSIM_MAX_SIDE + 1, &v, &e_));
    FAILS(VL_EINVAL, model_ssim(NULL, b, W, W, &v, &e_));
    FAILS(VL_EINVAL, model_ssim(a, b, W, W, NULL, &e_));
    FAILS(VL_EINVAL, model_ssim_mean(a, b, 0, W, W, &v, &e_));
    b[2 * px + 7] = NAN;
    vl_error e = {0};
    assert_int_equal(model_ssim_mean(a, b, NI, W, W, &v, &e), VL_ERANGE);
    assert_non_null(strstr(e.msg, "image 2"));
    free(a);
    free(b);
}

/* ---- PNG ------------------------------------------------------------------------------ */

static void test_png_grid_roundtrip(void **state) {
    test_dir_fixture *f = *state;
    enum { TW = 5, TH = 4, NT = 5, ROWS = 2, COLS = 3 };
    float *tiles = uniform_vec((size_t)NT * TW * TH, 77);
    tiles[0] = -0.5f; /* clamped to 0 */
    tiles[1] = 1.5f;  /* clamped to 1 */
    tiles[2] = NAN;   /* counts as 0 */
    float *img = NULL;
    int W = 0, H = 0;
    OK(model_png_grid(tiles, NT, TW, TH, ROWS, COLS, 1.0f, &img, &W, &H, &e_));
    assert_int_equal(W, COLS * TW + (COLS - 1) * MODEL_PNG_GAP);
    assert_int_equal(H, ROWS * TH + (ROWS - 1) * MODEL_PNG_GAP);
    /* Tile 4 is row 1, column 1; the cell after it and the gaps are 1. */
    int x0 = TW + MODEL_PNG_GAP, y0 = TH + MODEL_PNG_GAP;
    assert_true(img[(y0 + 2) * W + x0 + 3] == tiles[4 * TW * TH + 2 * TW + 3]);
    assert_true(img[(y0 + 1) * W + 2 * x0 + 1] == 1.0f);
    assert_true(img[TH * W] == 1.0f && img[TW] == 1.0f);
    snprintf(f->path, sizeof f->path, "%s/grid.png", f->dir);
    OK(model_png_write_gray(f->path, img, W, H, &e_));
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", f->path);
    struct stat st;
    assert_int_not_equal(stat(tmp, &st), 0);

    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    assert_true(png_image_begin_read_from_file(&im, f->path));
    assert_int_equal(im.width, (png_uint_32)W);
    assert_int_equal(im.height, (png_uint_32)H);
    assert_true((im.format & PNG_FORMAT_FLAG_COLOR) == 0);
    im.format = PNG_FORMAT_GRAY;
    uint8_t *back = malloc(PNG_IMAGE_SIZE(im));
    assert_non_null(back);
    assert_true(png_image_finish_read(&im, NULL, back, 0, NULL));
    for (int i = 0; i < W * H; i++) {
        float v = img[i];
        v = isnan(v) ? 0.0f : fminf(fmaxf(v, 0.0f), 1.0f);
        int want = (int)lrint(v * 255.0);
        if (abs((int)back[i] - want) > 0)
            fail_msg("pixel %d: read %d, wrote %g -> %d", i, back[i], (double)img[i], want);
    }
    assert_int_equal(back[0], 0);
    assert_int_equal(back[1], 255);
    assert_int_equal(back[2], 0);
    free(back);

    /* An unwritable path is refused with one line naming it. */
    snprintf(f->path, sizeof f->path, "%s/missing/grid.png", f->dir);
    vl_error e = {0};
    assert_int_equal(model_png_write_gray(f->path, img, W, H, &e), VL_EIO);
    assert_non_null(strstr(e.msg, "missing/grid.png"));
    assert_null(strchr(e.msg, '\n'));
    free(img);
    free(tiles);
}

static void test_png_refuses(void **state) {
    (void)state;
    float t[4] = {0}, *img = (float *)t;
    int W, H;
    FAILS(VL_EINVAL, model_png_grid(t, 5, 1, 1, 2, 2, 0.0f, &img, &W, &H, &e_));
    assert_null(img);
    FAILS(VL_EINVAL, model_png_grid(t, 0, 1, 1, 2, 2, 0.0f, &img, &W, &H, &e_));
    FAILS(VL_EINVAL, model_png_grid(t, 1, 0, 1, 2, 2, 0.0f, &img, &W, &H, &e_));
    FAILS(VL_EINVAL, model_png_grid(NULL, 1, 1, 1, 2, 2, 0.0f, &img, &W, &H, &e_));
    FAILS(VL_EINVAL, model_png_grid(t, 1, 1, 1, 2, 2, 0.0f, NULL, &W, &H, &e_));
    FAILS(VL_EINVAL, model_png_grid(t, 1, 8192, 1, 1, 2, 0.0f, &img, &W, &H, &e_));
    FAILS(VL_EINVAL, model_png_write_gray("/tmp/x.png", t, 0, 1, &e_));
    FAILS(VL_EINVAL, model_png_write_gray("/tmp/x.png", t, 1, MODEL_PNG_MAX_SIDE + 1, &e_));
    FAILS(VL_EINVAL, model_png_write_gray(NULL, t, 1, 1, &e_));
    FAILS(VL_EINVAL, model_png_write_gray("/tmp/x.png", NULL, 1, 1, &e_));
    FAILS(VL_EINVAL, model_png_write_gray("", t, 1, 1, &e_));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradient_finite_differences),
        cmocka_unit_test(test_learns_toy_problem),
        cmocka_unit_test(test_reproducible_and_split),
        cmocka_unit_test(test_mse_helper),
        cmocka_unit_test(test_decoder_refuses),
        cmocka_unit_test(test_ssim_reference),
        cmocka_unit_test(test_ssim_mean_and_refusals),
        cmocka_unit_test_setup_teardown(test_png_grid_roundtrip, test_dir_setup, test_dir_teardown),
        cmocka_unit_test(test_png_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
