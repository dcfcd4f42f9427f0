/*
 * bench_nopeek: how much a split-learning cut leaks, measured on a
 * finished run's database, beside the baseline of an attacker who learns
 * nothing from the cut (the mean image of what it has seen), measured in
 * the same run. bench/nopeek.sh runs it over one real run per NoPeek
 * alpha and compares each with alpha = 0.
 *
 *   bench_nopeek eval --db RUN.db --train-images P --test-images P
 *       [--train-labels P] [--test-labels P] [--leak N] [--cut C]
 *       [--show K] [--out PREFIX] [--seed S] [--threads N]
 *       [--epochs E] [--hidden H]
 *   bench_nopeek grid --out FILE.png [--side S] [--scale K] ORIG.f32 RECON.f32 ...
 *
 * eval takes the run's current version (the final one of a finished run)
 * and, on the test set: the whole model's top-1 accuracy; dCor(X, Z) of
 * the inputs and the cut's activations Z (layers [0, cut)), the mean over
 * batches of DCOR_BATCH rows, because the statistic needs n^2 memory and
 * is itself a batch statistic; and a reconstruction attack. The attacker
 * holds the first N training images and the activations they produce
 * (leaked pairs), trains a decoder Z -> X on them (model/recon.h) and
 * decodes every test image's activations: its MSE and mean SSIM against
 * the originals are set beside those of guessing the leaked images' mean
 * image for every test image. One line `nopeek alpha=...` carries the
 * figures for scripts; the first K test images and their reconstructions
 * go to PREFIX.orig.f32 and PREFIX.recon.f32 (raw float32, row-major).
 *
 * grid draws the originals as the first row and each reconstruction file
 * as one more row, in the order given, into one grey PNG, each pixel
 * drawn as a K x K block (default 3: 28-pixel tiles are too small to judge
 * at 1:1 on a screen).
 *
 * Errors are one line on stderr and exit status 1; bad usage is 2.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/opts.h"
#include "kernels/dcor.h"
#include "model/images.h"
#include "model/mlp_io.h"
#include "model/mlp_part.h"
#include "model/model.h"
#include "model/png.h"
#include "model/recon.h"
#include "storage/storage.h"

/* Rows per dCor batch: 1000 rows cost 16 MB of scratch, 10000 would cost
 * 1.6 GB, and batches of a fixed size keep runs comparable. */
#define DCOR_BATCH 1000
/* Rows the lower layers run forward at once (bounds their activations). */
#define FORWARD_CHUNK 1000
/* The decoder's minibatch and Adam rate: small batches take many steps
 * from a thousand pairs, and 1e-3 is Adam's usual rate. */
#define RECON_BATCH 32
#define RECON_LR 1e-3f

typedef struct eval_args {
    const char *db, *train_images, *test_images, *train_labels, *test_labels, *out;
    int leak, cut, show, threads, epochs, hidden;
    uint64_t seed;
} eval_args;

/* Everything eval allocates, released together by eval_free. */
typedef struct eval_state {
    storage *st;
    storage_run run;
    storage_version ver;
    model_images *train, *test;
    model_mlp *mlp;
    model_mlp_part *lower;
    model_recon *dec;
    float *xt, *zt, *xl, *zl, *xhat, *mean;
    int *yt;
    double *scratch;
    char *labels_path[2];
} eval_state;

static int die(const char *fmt, ...) VL_PRINTF(1, 2);
static int die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("bench_nopeek: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static const char USAGE[] =
    "usage: bench_nopeek eval --db RUN.db --train-images P --test-images P "
    "[--train-labels P] [--test-labels P] [--leak N] [--cut C] [--show K] "
    "[--out PREFIX] [--seed S] [--threads N] [--epochs E] [--hidden H]\n"
    "       bench_nopeek grid --out FILE.png [--side S] [--scale K] ORIG.f32 RECON.f32 ...\n";

static int usage(void) {
    fputs(USAGE, stderr);
    return VL_OPTS_EXIT_USAGE;
}

static void eval_free(eval_state *s) {
    storage_version_free(&s->ver);
    storage_run_free(&s->run);
    storage_close(s->st);
    model_images_free(s->train);
    model_images_free(s->test);
    model_mlp_free(s->mlp);
    model_mlp_part_free(s->lower);
    model_recon_free(s->dec);
    free(s->xt), free(s->zt), free(s->xl), free(s->zl), free(s->xhat), free(s->mean);
    free(s->yt), free(s->scratch);
    free(s->labels_path[0]), free(s->labels_path[1]);
}

/* The labels next to an IDX image file, named as volley-peer names them:
 * "-images-idx3-" read as "-labels-idx1-". NULL when the name has no such
 * part (the caller then asks for the path) or memory runs out. */
static char *labels_for(const char *images) {
    const char *k = strstr(images, "-images-idx3-");
    if (!k) return NULL;
    size_t n = strlen(images);
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, images, n + 1);
    memcpy(p + (k - images), "-labels-idx1-", 13);
    return p;
}

/* Reads the run's model configuration, cut and alpha from its stored
 * configuration JSON. An explicit --cut (args->cut > 0) wins over the
 * run's, so a run of another mode can be measured at any layer. */
static int read_config(const char *config, eval_args *a, model_mlp_config *cfg, double *alpha) {
    json_error_t je;
    json_t *root = json_loads(config, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return die("the run's configuration is not a JSON object: %s", je.text);
    }
    int rc = 0;
    json_t *model = json_object_get(root, "model");
    char *mjs = json_is_object(model) ? json_dumps(model, JSON_COMPACT) : NULL;
    vl_error e = {0};
    if (!mjs)
        rc = die("the run's configuration has no model object");
    else if (model_mlp_config_parse(mjs, strlen(mjs), cfg, &e))
        rc = die("the run's model is not an MLP classifier: %s", e.msg);
    free(mjs);
    json_t *sp = json_object_get(root, "split");
    *alpha = 0;
    if (!rc && json_is_object(sp)) {
        json_t *al = json_object_get(sp, "alpha"), *cut = json_object_get(sp, "cut");
        if (json_is_number(al)) *alpha = json_number_value(al);
        if (a->cut <= 0 && json_is_integer(cut)) a->cut = (int)json_integer_value(cut);
    }
    if (!rc && a->cut <= 0)
        rc = die("the run is not a split run: give the layer to measure with --cut");
    else if (!rc && a->cut > model_mlp_config_num_layers(cfg) - 1)
        rc = die("cut %d is outside 1..%d, the model's conv and hidden layers", a->cut,
                 model_mlp_config_num_layers(cfg) - 1);
    json_decref(root);
    return rc;
}

/* Images idx[0..n) of set s as floats in [0, 1] into x (n * pixels). */
static int gather(const model_images *s, size_t first, int n, float *x, int *y) {
    int d = model_images_rows(s) * model_images_cols(s);
    uint32_t idx[FORWARD_CHUNK];
    int lab[FORWARD_CHUNK];
    vl_error e = {0};
    for (int i = 0; i < n; i += FORWARD_CHUNK) {
        int b = n - i < FORWARD_CHUNK ? n - i : FORWARD_CHUNK;
        for (int k = 0; k < b; k++) idx[k] = (uint32_t)(first + (size_t)i + (size_t)k);
        if (model_images_batch(s, idx, b, x + (size_t)i * d, lab, &e)) return die("%s", e.msg);
        if (y) memcpy(y + i, lab, (size_t)b * sizeof *lab);
    }
    return 0;
}

/* z[n, q] = the lower part's output on x[n, d], in chunks. */
static int lower_forward(model_mlp_part *p, const float *x, int n, float *z) {
    int d = model_mlp_part_in_dim(p), q = model_mlp_part_out_dim(p);
    vl_error e = {0};
    for (int i = 0; i < n; i += FORWARD_CHUNK) {
        int b = n - i < FORWARD_CHUNK ? n - i : FORWARD_CHUNK;
        if (model_mlp_part_forward(p, x + (size_t)i * d, b, &e))
            return die("lower layers: %s", e.msg);
        memcpy(z + (size_t)i * q, model_mlp_part_output(p), (size_t)b * q * sizeof *z);
    }
    return 0;
}

/* Standardises every activation feature to the leaked set's mean and
 * spread, applied alike to the leaked and the test activations: NoPeek
 * may shrink or stretch features, which says nothing about what they
 * carry, and an attacker would undo it before decoding. */
static void standardise(float *zl, int nl, float *zt, int nt, int q) {
    for (int j = 0; j < q; j++) {
        double m = 0, v = 0;
        for (int i = 0; i < nl; i++) m += zl[(size_t)i * q + j];
        m /= nl;
        for (int i = 0; i < nl; i++) {
            double t = zl[(size_t)i * q + j] - m;
            v += t * t;
        }
        double sd = sqrt(v / nl);
        float inv = sd > 1e-12 ? (float)(1.0 / sd) : 0.0f;
        for (int i = 0; i < nl; i++)
            zl[(size_t)i * q + j] = (float)(zl[(size_t)i * q + j] - m) * inv;
        for (int i = 0; i < nt; i++)
            zt[(size_t)i * q + j] = (float)(zt[(size_t)i * q + j] - m) * inv;
    }
}

static int write_f32(const char *prefix, const char *suffix, const float *v, size_t n) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s%s", prefix, suffix) >= (int)sizeof path)
        return die("--out %s: path too long", prefix);
    vl_error e = {0};
    if (vl_file_write_atomic(path, v, n * sizeof *v, 0644, &e)) return die("%s: %s", path, e.msg);
    return 0;
}

static int eval_run(eval_args *a, eval_state *s) {
    vl_error e = {0};
    if (storage_open(a->db, 0, &s->st, &e)) return die("%s: %s", a->db, e.msg);
    if (storage_run_get(s->st, &s->run, &e)) return die("%s: %s", a->db, e.msg);
    model_mlp_config cfg;
    memset(&cfg, 0, sizeof cfg);
    double alpha = 0;
    if (read_config(s->run.config, a, &cfg, &alpha)) return 1;
    if (storage_version_get(s->st, s->run.current_version, 1, &s->ver, &e))
        return die("%s: version %lld: %s", a->db, (long long)s->run.current_version, e.msg);
    if (model_mlp_create(&cfg, &s->mlp, &e)) return die("%s", e.msg);
    size_t np = model_mlp_num_params(s->mlp);
    if (!s->ver.params || s->ver.n != np)
        return die("%s: version %lld holds %zu parameters, the model has %zu", a->db,
                   (long long)s->ver.version, s->ver.params ? s->ver.n : 0, np);
    memcpy(model_mlp_params(s->mlp), s->ver.params, np * sizeof(float));

    const char *tl = a->train_labels, *vl = a->test_labels;
    if (!tl && !(tl = s->labels_path[0] = labels_for(a->train_images)))
        return die("%s: cannot name its labels; give --train-labels", a->train_images);
    if (!vl && !(vl = s->labels_path[1] = labels_for(a->test_images)))
        return die("%s: cannot name its labels; give --test-labels", a->test_images);
    if (model_images_load(a->train_images, tl, &s->train, &e) ||
        model_images_load(a->test_images, vl, &s->test, &e))
        return die("%s", e.msg);
    int side_w = model_images_cols(s->test), side_h = model_images_rows(s->test);
    int d = side_w * side_h;
    if (d != cfg.in_dim || model_images_rows(s->train) * model_images_cols(s->train) != d)
        return die("the images have %d and %d pixels, the model takes %d",
                   model_images_rows(s->train) * model_images_cols(s->train), d, cfg.in_dim);
    if ((size_t)a->leak > model_images_count(s->train))
        return die("--leak %d: the training set has only %zu images", a->leak,
                   model_images_count(s->train));
    if (model_images_count(s->test) > (size_t)MODEL_RECON_MAX_ROWS)
        return die("the test set is too large (%zu images)", model_images_count(s->test));
    int nt = (int)model_images_count(s->test), nl = a->leak;
    if (a->show > nt) a->show = nt;

    /* The whole model on the test set. */
    s->xt = malloc((size_t)nt * d * sizeof *s->xt);
    s->yt = malloc((size_t)nt * sizeof *s->yt);
    s->xl = malloc((size_t)nl * d * sizeof *s->xl);
    if (!s->xt || !s->yt || !s->xl) return die("out of memory for the images");
    if (gather(s->test, 0, nt, s->xt, s->yt) || gather(s->train, 0, nl, s->xl, NULL)) return 1;
    double acc = 0;
    if (model_mlp_evaluate(s->mlp, s->xt, s->yt, nt, NULL, &acc, &e))
        return die("evaluation: %s", e.msg);

    /* The lower layers, as the peers hold them in that version. */
    size_t off = 0, cnt = 0;
    if (model_mlp_part_offset(&cfg, 0, a->cut, &off, &cnt, &e) ||
        model_mlp_part_create(&cfg, 0, a->cut, &s->lower, &e))
        return die("%s", e.msg);
    memcpy(model_mlp_part_params(s->lower), s->ver.params + off, cnt * sizeof(float));
    int q = model_mlp_part_out_dim(s->lower);
    s->zt = malloc((size_t)nt * q * sizeof *s->zt);
    s->zl = malloc((size_t)nl * q * sizeof *s->zl);
    if (!s->zt || !s->zl) return die("out of memory for the activations");
    if (lower_forward(s->lower, s->xt, nt, s->zt) || lower_forward(s->lower, s->xl, nl, s->zl))
        return 1;

    /* dCor(X, Z) over whole batches of the test set (one short batch when
     * the set is smaller than one). */
    int db = nt < DCOR_BATCH ? nt : DCOR_BATCH, nb = nt / db;
    if (db < 2) return die("dCor needs at least two test images");
    s->scratch = malloc(kernels_dcor_scratch_doubles(db) * sizeof *s->scratch);
    if (!s->scratch) return die("out of memory for dCor");
    double dcor = 0;
    for (int b = 0; b < nb; b++)
        dcor += kernels_dcor(NULL, s->xt + (size_t)b * db * d, s->zt + (size_t)b * db * q, db, d, q,
                             0.0f, s->scratch);
    dcor /= nb;

    /* The attack, from the leaked pairs only. */
    standardise(s->zl, nl, s->zt, nt, q);
    double fit = 0;
    if (model_recon_create(q, a->hidden, d, a->seed, &s->dec, &e) ||
        model_recon_train(s->dec, s->zl, s->xl, nl, a->epochs, RECON_BATCH, RECON_LR, &fit, &e))
        return die("decoder: %s", e.msg);
    s->xhat = malloc((size_t)nt * d * sizeof *s->xhat);
    s->mean = malloc((size_t)nt * d * sizeof *s->mean);
    if (!s->xhat || !s->mean) return die("out of memory for the reconstructions");
    if (model_recon_predict(s->dec, s->zt, nt, s->xhat, &e)) return die("decoder: %s", e.msg);
    double attack_mse = model_recon_mse(s->xhat, s->xt, (size_t)nt * d), attack_ssim = 0;
    if (model_ssim_mean(s->xhat, s->xt, nt, side_w, side_h, &attack_ssim, &e))
        return die("SSIM: %s", e.msg);

    /* The baseline: the leaked images' mean image, guessed for every test
     * image (tiled, so SSIM and MSE are taken exactly as the attack's). */
    for (int j = 0; j < d; j++) {
        double m = 0;
        for (int i = 0; i < nl; i++) m += s->xl[(size_t)i * d + j];
        s->mean[j] = (float)(m / nl);
    }
    for (int i = 1; i < nt; i++)
        memcpy(s->mean + (size_t)i * d, s->mean, (size_t)d * sizeof *s->mean);
    double mean_mse = model_recon_mse(s->mean, s->xt, (size_t)nt * d), mean_ssim = 0;
    if (model_ssim_mean(s->mean, s->xt, nt, side_w, side_h, &mean_ssim, &e))
        return die("SSIM: %s", e.msg);

    if (a->show > 0 && (write_f32(a->out, ".orig.f32", s->xt, (size_t)a->show * d) ||
                        write_f32(a->out, ".recon.f32", s->xhat, (size_t)a->show * d)))
        return 1;
    printf("nopeek alpha=%g accuracy=%.4f dcor=%.4f attack_mse=%.5f attack_ssim=%.4f "
           "mean_mse=%.5f mean_ssim=%.4f version=%lld cut=%d q=%d leak=%d fit_mse=%.5f\n",
           alpha, acc, dcor, attack_mse, attack_ssim, mean_mse, mean_ssim,
           (long long)s->ver.version, a->cut, q, nl, fit);
    printf("alpha %g, version %lld: test accuracy %.2f%%, dCor(X, Z) %.3f at the cut (width %d); "
           "a decoder from %d leaked pairs reconstructs the test images at MSE %.4f "
           "(%.2fx the mean image's %.4f) and SSIM %.3f (mean image %.3f)\n",
           alpha, (long long)s->ver.version, 100 * acc, dcor, q, nl, attack_mse,
           attack_mse / mean_mse, mean_mse, attack_ssim, mean_ssim);
    return 0;
}

static int cmd_eval(int argc, char **argv) {
    eval_args a = {.out = "nopeek"};
    int64_t leak = 1000, cut = 0, show = 8, seed = 1, threads = 0, epochs = 60, hidden = 256;
    vl_opt tab[] = {
        vl_opt_required(vl_opt_str("db", &a.db)),
        vl_opt_required(vl_opt_str("train-images", &a.train_images)),
        vl_opt_required(vl_opt_str("test-images", &a.test_images)),
        vl_opt_str("train-labels", &a.train_labels),
        vl_opt_str("test-labels", &a.test_labels),
        vl_opt_str("out", &a.out),
        vl_opt_int("leak", &leak, 2, MODEL_RECON_MAX_ROWS),
        vl_opt_int("cut", &cut, 1, MODEL_MLP_MAX_LAYERS - 1),
        vl_opt_int("show", &show, 0, 1000),
        vl_opt_int("seed", &seed, 0, INT64_MAX),
        vl_opt_int("threads", &threads, 1, 1024),
        vl_opt_int("epochs", &epochs, 1, MODEL_RECON_MAX_EPOCHS),
        vl_opt_int("hidden", &hidden, 1, 4096),
    };
    vl_opts o = {.prog = "bench_nopeek eval", .usage = USAGE, .opt = tab, .n = VL_OPTS_COUNT(tab)};
    int rc = vl_opts_parse(&o, argc - 1, argv + 1, NULL);
    if (rc) return vl_opts_status(rc);
    a.leak = (int)leak, a.cut = (int)cut, a.show = (int)show, a.seed = (uint64_t)seed;
    a.threads = (int)threads, a.epochs = (int)epochs, a.hidden = (int)hidden;
    if (a.threads > 0) omp_set_num_threads(a.threads);
    eval_state s;
    memset(&s, 0, sizeof s);
    rc = eval_run(&a, &s);
    eval_free(&s);
    return rc;
}

/* Reads a raw float32 file of whole images of `pixels` floats into *out
 * (the caller's to free), their count into *n. */
static int read_tiles(const char *path, int pixels, float **out, int *n) {
    vl_buf b;
    vl_buf_init(&b, (size_t)1 << 28);
    vl_error e = {0};
    int rc = 0;
    size_t img = (size_t)pixels * sizeof(float);
    if (vl_buf_read_file(&b, path, &e))
        rc = die("%s: %s", path, e.msg);
    else if (b.len == 0 || b.len % img != 0)
        rc = die("%s: %zu bytes is not a whole number of %zu-byte images", path, b.len, img);
    else if (!(*out = malloc(b.len)))
        rc = die("out of memory for %s", path);
    if (!rc) {
        memcpy(*out, b.data, b.len);
        *n = (int)(b.len / img);
    }
    vl_buf_free(&b);
    return rc;
}

static int cmd_grid(int argc, char **argv) {
    const char *out = NULL;
    int64_t side64 = 28, scale64 = 3;
    vl_opt tab[] = {vl_opt_required(vl_opt_str("out", &out)),
                    vl_opt_int("side", &side64, MODEL_SSIM_WIN, 1024),
                    vl_opt_int("scale", &scale64, 1, 16)};
    vl_opts o = {.prog = "bench_nopeek grid", .usage = USAGE, .opt = tab, .n = VL_OPTS_COUNT(tab)};
    int first = 0, rc = vl_opts_parse(&o, argc - 1, argv + 1, &first);
    if (rc) return vl_opts_status(rc);
    first += 1; /* an index into argv, which parsing saw from the subcommand on */
    if (argc - first < 2)
        return vl_opts_status(vl_opts_fail(&o, "give the originals and at least one "
                                               "reconstruction file"));
    int side = (int)side64, scale = (int)scale64;
    int files = argc - first, px = side * side, k = 0;
    float *tiles = NULL, *pic = NULL;
    for (int f = 0; f < files && !rc; f++) {
        float *t = NULL;
        int n = 0;
        if ((rc = read_tiles(argv[first + f], px, &t, &n))) break;
        if (f == 0) {
            k = n;
            if (!(tiles = malloc((size_t)files * k * px * sizeof *tiles)))
                rc = die("out of memory for the grid");
        } else if (n != k) {
            rc = die("%s holds %d images, %s holds %d", argv[first + f], n, argv[first], k);
        }
        if (!rc) memcpy(tiles + (size_t)f * k * px, t, (size_t)k * px * sizeof *t);
        free(t);
    }
    int w = 0, h = 0;
    vl_error e = {0};
    float *big = NULL;
    if (!rc && model_png_grid(tiles, files * k, side, side, files, k, 1.0f, &pic, &w, &h, &e))
        rc = die("%s: %s", out, e.msg);
    if (!rc && ((size_t)w * scale > MODEL_PNG_MAX_SIDE || (size_t)h * scale > MODEL_PNG_MAX_SIDE))
        rc = die("%s: a %dx%d picture at scale %d is too large", out, w, h, scale);
    if (!rc && !(big = malloc((size_t)w * scale * h * scale * sizeof *big)))
        rc = die("out of memory for the picture");
    if (!rc) {
        /* Nearest-neighbour enlargement: every pixel stays a visible
         * square, nothing is smoothed into the reconstructions. */
        size_t W = (size_t)w * scale;
        for (size_t y = 0; y < (size_t)h * scale; y++)
            for (size_t x = 0; x < W; x++) big[y * W + x] = pic[(y / scale) * w + x / scale];
        if (model_png_write_gray(out, big, w * scale, h * scale, &e))
            rc = die("%s: %s", out, e.msg);
    }
    if (!rc)
        printf("wrote %s: %d rows of %d images (%dx%d pixels)\n", out, files, k, w * scale,
               h * scale);
    free(tiles);
    free(pic);
    free(big);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(USAGE, stdout);
        return 0;
    }
    if (strcmp(argv[1], "eval") == 0) return cmd_eval(argc, argv);
    if (strcmp(argv[1], "grid") == 0) return cmd_grid(argc, argv);
    return usage();
}
