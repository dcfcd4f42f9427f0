/*
 * Unit tests for labelled IDX images and their partitions: small IDX pairs
 * written here, plain and gzip, load with the right sizes, pixels and
 * labels; every malformed pair is refused with the right code and a
 * message naming the file; Fashion-MNIST loads when its package is
 * installed; partitions are disjoint, covering, reproducible from the seed
 * alone and as skewed as their beta says; and the gamma sampler behind
 * the Dirichlet draws has the right mean and variance.
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
#include <zlib.h>

#include "common/common.h"
#include "model/images.h"

#include "tests/unit/test_util.h"

typedef test_dir_fixture fixture;

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

/* ---- writing IDX files ------------------------------------------------------ */

/* An IDX file in memory, to be written plain or gzip. */
typedef struct blob {
    uint8_t *p;
    size_t len;
} blob;

static void put_be32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (24 - 8 * i));
}

/* Header words (magic first), then len body bytes, then extra zero bytes. */
static blob make_idx(const uint32_t *words, int nwords, const uint8_t *body, size_t len,
                     size_t extra) {
    blob b;
    b.len = 4 * (size_t)nwords + len + extra;
    b.p = calloc(1, b.len ? b.len : 1);
    assert_non_null(b.p);
    for (int w = 0; w < nwords; w++) put_be32(b.p + 4 * w, words[w]);
    if (len) memcpy(b.p + 4 * (size_t)nwords, body, len);
    return b;
}

static blob idx3(uint32_t magic, uint32_t n, uint32_t rows, uint32_t cols, const uint8_t *px,
                 size_t len, size_t extra) {
    const uint32_t w[4] = {magic, n, rows, cols};
    return make_idx(w, 4, px, len, extra);
}

static blob idx1(uint32_t magic, uint32_t n, const uint8_t *lab, size_t len, size_t extra) {
    const uint32_t w[2] = {magic, n};
    return make_idx(w, 2, lab, len, extra);
}

/* Writes b to dir/name, plain or through gzopen "wb", and frees it; the
 * path goes into out (512 bytes). */
static const char *write_blob(const fixture *f, const char *name, blob b, int gz, char *out) {
    assert_true(snprintf(out, 512, "%s/%s", f->dir, name) < 512);
    if (gz) {
        gzFile g = gzopen(out, "wb");
        assert_non_null(g);
        if (b.len) assert_int_equal(gzwrite(g, b.p, (unsigned)b.len), (int)b.len);
        assert_int_equal(gzclose(g), Z_OK);
    } else {
        FILE *fp = fopen(out, "wb");
        assert_non_null(fp);
        if (b.len) assert_int_equal(fwrite(b.p, 1, b.len, fp), b.len);
        assert_int_equal(fclose(fp), 0);
    }
    free(b.p);
    return out;
}

static size_t file_size(const char *path) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (size_t)st.st_size;
}

/* The synthetic set: 5 images of 3 x 4 with pixels covering 0 and 255,
 * labels 0..3 (so 4 classes). */
enum { SN = 5, SR = 3, SC = 4, SPIX = SN * SR * SC };
static const uint8_t SLAB[SN] = {0, 3, 1, 3, 2};

static void synth_pixels(uint8_t px[SPIX]) {
    for (int i = 0; i < SPIX; i++) px[i] = (uint8_t)(i * 37 + 11);
    px[0] = 0;
    px[SPIX - 1] = 255;
}

static blob synth_images(size_t drop, size_t extra) {
    uint8_t px[SPIX];
    synth_pixels(px);
    return idx3(MODEL_IMAGES_IDX3_MAGIC, SN, SR, SC, px, SPIX - drop, extra);
}

static blob synth_labels(size_t drop, size_t extra) {
    return idx1(MODEL_IMAGES_IDX1_MAGIC, SN, SLAB, SN - drop, extra);
}

static model_images *load_ok(const char *img, const char *lab) {
    vl_error err = {0};
    model_images *s = NULL;
    if (model_images_load(img, lab, &s, &err) != 0) fail_msg("load %s + %s: %s", img, lab, err.msg);
    assert_non_null(s);
    return s;
}

/* Loading must fail with code, the message must contain want and name
 * `names`, and *out must be left NULL. */
static void expect_refused(const char *img, const char *lab, int code, const char *names,
                           const char *want) {
    vl_error err = {0};
    model_images *s = (model_images *)&err; /* must be overwritten */
    int rc = model_images_load(img, lab, &s, &err);
    if (rc != code || strstr(err.msg, want) == NULL || strstr(err.msg, names) == NULL)
        fail_msg("load %s + %s: got %d \"%s\", expected %d with \"%s\"", img, lab, rc, err.msg,
                 code, want);
    assert_int_equal(err.code, code);
    assert_null(s);
}

/* ---- good files ------------------------------------------------------------- */

static void check_synthetic(model_images *s) {
    uint8_t px[SPIX];
    synth_pixels(px);
    assert_int_equal(model_images_count(s), SN);
    assert_int_equal(model_images_rows(s), SR);
    assert_int_equal(model_images_cols(s), SC);
    assert_int_equal(model_images_classes(s), 4);
    assert_memory_equal(model_images_pixels(s), px, SPIX);
    assert_memory_equal(model_images_labels(s), SLAB, SN);

    const uint32_t idx[4] = {4, 0, 4, 2};
    float x[4 * SR * SC];
    int lab[4];
    OK(model_images_batch(s, idx, 4, x, lab, &e_));
    for (int b = 0; b < 4; b++) {
        assert_int_equal(lab[b], SLAB[idx[b]]);
        for (int i = 0; i < SR * SC; i++) {
            float want = (float)px[idx[b] * SR * SC + i] / 255.0f;
            if (x[b * SR * SC + i] != want)
                fail_msg("batch %d pixel %d: %.9g, expected %.9g", b, i, (double)x[b * SR * SC + i],
                         (double)want);
        }
    }
    assert_true(x[SR * SC] == 0.0f);     /* image 0, pixel 0 */
    assert_true(x[SR * SC - 1] == 1.0f); /* image 4, last pixel */
}

static void test_load_plain_and_gzip(void **state) {
    fixture *f = *state;
    char img[512], lab[512];
    for (int mode = 0; mode < 4; mode++) {
        /* Plain, both gzip, and each of the two mixed pairs. */
        int gi = mode & 1, gl = (mode >> 1) & 1;
        write_blob(f, "img", synth_images(0, 0), gi, img);
        write_blob(f, "lab", synth_labels(0, 0), gl, lab);
        uint8_t head[2];
        FILE *fp = fopen(img, "rb");
        assert_non_null(fp);
        assert_int_equal(fread(head, 1, 2, fp), 2);
        fclose(fp);
        assert_int_equal(head[0] == 0x1f && head[1] == 0x8b, gi);
        model_images *s = load_ok(img, lab);
        check_synthetic(s);
        model_images_free(s);
    }
    model_images_free(NULL);
    assert_int_equal(model_images_count(NULL), 0);
    assert_null(model_images_labels(NULL));
}

static void test_batch_refused(void **state) {
    fixture *f = *state;
    char img[512], lab[512];
    model_images *s = load_ok(write_blob(f, "img.gz", synth_images(0, 0), 1, img),
                              write_blob(f, "lab", synth_labels(0, 0), 0, lab));
    float x[2 * SR * SC];
    int labels[2] = {-7, -7};
    for (int i = 0; i < 2 * SR * SC; i++) x[i] = -1;
    vl_error err = {0};
    const uint32_t bad[2] = {1, SN};
    assert_int_equal(model_images_batch(s, bad, 2, x, labels, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "index 5"));
    /* Nothing was written, not even the good first entry. */
    for (int i = 0; i < 2 * SR * SC; i++) assert_true(x[i] == -1.0f);
    assert_int_equal(labels[0], -7);
    const uint32_t good[2] = {0, 1};
    assert_int_equal(model_images_batch(s, good, 0, x, labels, &err), VL_EINVAL);
    assert_int_equal(model_images_batch(s, good, -1, x, labels, &err), VL_EINVAL);
    assert_int_equal(model_images_batch(NULL, good, 1, x, labels, &err), VL_EINVAL);
    assert_int_equal(model_images_batch(s, NULL, 1, x, labels, &err), VL_EINVAL);
    assert_int_equal(model_images_batch(s, good, 1, NULL, labels, &err), VL_EINVAL);
    assert_int_equal(model_images_batch(s, good, 1, x, NULL, &err), VL_EINVAL);
    model_images_free(s);
}

/* ---- refused files ---------------------------------------------------------- */

static void test_refused_headers(void **state) {
    fixture *f = *state;
    char img[512], lab[512], other[512];
    uint8_t px[SPIX];
    synth_pixels(px);
    write_blob(f, "lab", synth_labels(0, 0), 0, lab);

    write_blob(f, "img", idx3(0x00000804u, SN, SR, SC, px, SPIX, 0), 0, img);
    expect_refused(img, lab, VL_EINVAL, img, "magic 0x00000804");
    write_blob(f, "img", idx3(0x03080000u, SN, SR, SC, px, SPIX, 0), 0, img);
    expect_refused(img, lab, VL_EINVAL, img,
                   "0x03080000, expected 0x00000803 (IDX3 "
                   "unsigned-byte images) (byte-swapped");
    write_blob(f, "img", idx3(0x00000903u, SN, SR, SC, px, SPIX, 0), 0, img);
    expect_refused(img, lab, VL_EINVAL, img, "not of unsigned bytes");
    /* The pair passed in the wrong order. */
    write_blob(f, "img", synth_images(0, 0), 0, img);
    expect_refused(lab, img, VL_EINVAL, lab, "swapped");
    write_blob(f, "lab2", idx1(0x00000802u, SN, SLAB, SN, 0), 0, other);
    expect_refused(img, other, VL_EINVAL, other, "magic 0x00000802");

    /* Zero images, with a label file that agrees. */
    write_blob(f, "img0", idx3(MODEL_IMAGES_IDX3_MAGIC, 0, SR, SC, NULL, 0, 0), 0, other);
    write_blob(f, "lab0", idx1(MODEL_IMAGES_IDX1_MAGIC, 0, NULL, 0, 0), 0, lab);
    expect_refused(other, lab, VL_EINVAL, other, "0 images");
    write_blob(f, "lab", synth_labels(0, 0), 0, lab);

    write_blob(f, "img", idx3(MODEL_IMAGES_IDX3_MAGIC, SN, 0, SC, NULL, 0, 0), 0, img);
    expect_refused(img, lab, VL_EINVAL, img, "0 x 4 pixels");
    write_blob(f, "img", idx3(MODEL_IMAGES_IDX3_MAGIC, SN, SR, 0, NULL, 0, 0), 0, img);
    expect_refused(img, lab, VL_EINVAL, img, "3 x 0 pixels");
    write_blob(f, "img", idx3(MODEL_IMAGES_IDX3_MAGIC, SN, 4097, 1, NULL, 0, 0), 0, img);
    expect_refused(img, lab, VL_EINVAL, img, "must be in [1, 4096]");
    /* Over the pixel cap (and over 2^32 pixels, checked without overflow),
     * refused from the header alone: no allocation, no pixel data. */
    write_blob(f, "img", idx3(MODEL_IMAGES_IDX3_MAGIC, (1u << 26) + 1, 4, 4, NULL, 0, 0), 0, img);
    expect_refused(img, lab, VL_EINVAL, img, "over the cap");
    write_blob(f, "img", idx3(MODEL_IMAGES_IDX3_MAGIC, 0xffffffffu, 4096, 4096, NULL, 0, 0), 0,
               img);
    expect_refused(img, lab, VL_EINVAL, img, "over the cap");

    /* Image and label counts differ, either way round. */
    write_blob(f, "img", synth_images(0, 0), 0, img);
    write_blob(f, "lab", idx1(MODEL_IMAGES_IDX1_MAGIC, SN - 1, SLAB, SN - 1, 0), 0, lab);
    expect_refused(img, lab, VL_EINVAL, lab, "4 labels for 5 images");
    write_blob(f, "lab", idx1(MODEL_IMAGES_IDX1_MAGIC, SN + 1, SLAB, SN, 1), 0, lab);
    expect_refused(img, lab, VL_EINVAL, lab, "6 labels for 5 images");
    write_blob(f, "lab", idx1(MODEL_IMAGES_IDX1_MAGIC, 0, NULL, 0, 0), 0, lab);
    expect_refused(img, lab, VL_EINVAL, lab, "0 labels");

    /* Files that end before or inside the header. */
    write_blob(f, "lab", synth_labels(0, 0), 0, lab);
    blob empty = {calloc(1, 1), 0};
    write_blob(f, "empty", empty, 0, other);
    expect_refused(other, lab, VL_EINVAL, other, "empty file");
    /* A short file of the right kind is short; of the wrong kind, wrong. */
    blob shorth = idx1(MODEL_IMAGES_IDX3_MAGIC, SN, NULL, 0, 2);
    write_blob(f, "short", shorth, 0, other);
    expect_refused(other, lab, VL_EINVAL, other, "10 bytes, shorter than the 16-byte");
    write_blob(f, "short", idx1(0x12345678u, SN, NULL, 0, 0), 0, other);
    expect_refused(other, lab, VL_EINVAL, other, "magic 0x12345678, expected 0x00000803");
    blob three = {calloc(1, 3), 3};
    write_blob(f, "short", three, 0, other);
    expect_refused(other, lab, VL_EINVAL, other, "3 bytes, shorter than the 16-byte");
    write_blob(f, "short", idx1(MODEL_IMAGES_IDX1_MAGIC, SN, NULL, 0, 0), 1, other);
    expect_refused(img, other, VL_EINVAL, other, "file ends after 0 of the 5 bytes of labels");
    blob lab4 = {calloc(1, 4), 4};
    put_be32(lab4.p, MODEL_IMAGES_IDX1_MAGIC);
    write_blob(f, "short", lab4, 1, other);
    expect_refused(img, other, VL_EINVAL, other, "4 bytes, shorter than the 8-byte");
}

static void test_refused_lengths(void **state) {
    fixture *f = *state;
    char img[512], lab[512];
    for (int gz = 0; gz < 2; gz++) {
        /* One pixel short, one byte too many, in both files. */
        write_blob(f, "lab", synth_labels(0, 0), gz, lab);
        write_blob(f, "img", synth_images(1, 0), gz, img);
        expect_refused(img, lab, VL_EINVAL, img,
                       "file ends after 59 of the 60 bytes of pixel data");
        write_blob(f, "img", synth_images(0, 1), gz, img);
        expect_refused(img, lab, VL_EINVAL, img, "trailing bytes after the 76 bytes");
        write_blob(f, "img", synth_images(0, 0), gz, img);
        write_blob(f, "lab", synth_labels(1, 0), gz, lab);
        expect_refused(img, lab, VL_EINVAL, lab, "file ends after 4 of the 5 bytes of labels");
        write_blob(f, "lab", synth_labels(0, 1), gz, lab);
        expect_refused(img, lab, VL_EINVAL, lab, "trailing bytes after the 13 bytes");
    }
}

/* Writes the first keep bytes of src to dst; with flip, also inverts
 * the byte at flip - 1. */
static void copy_cut(const char *src, const char *dst, size_t keep, size_t flip) {
    FILE *in = fopen(src, "rb");
    assert_non_null(in);
    uint8_t *b = malloc(keep ? keep : 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, keep, in), keep);
    fclose(in);
    if (flip) b[flip - 1] ^= 0xff;
    FILE *out = fopen(dst, "wb");
    assert_non_null(out);
    assert_int_equal(fwrite(b, 1, keep, out), keep);
    assert_int_equal(fclose(out), 0);
    free(b);
}

static void test_refused_gzip(void **state) {
    fixture *f = *state;
    char img[512], lab[512], cut[512];
    write_blob(f, "lab", synth_labels(0, 0), 0, lab);
    /* Enough pixels that the deflate stream spans many bytes. */
    enum { N = 200, R = 8, C = 8 };
    uint8_t *px = malloc(N * R * C);
    assert_non_null(px);
    vl_rng r;
    vl_rng_seed(&r, 7);
    for (int i = 0; i < N * R * C; i++) px[i] = (uint8_t)vl_rng_below(&r, 256);
    uint8_t labs[N];
    for (int i = 0; i < N; i++) labs[i] = (uint8_t)(i % 10);
    write_blob(f, "img.gz", idx3(MODEL_IMAGES_IDX3_MAGIC, N, R, C, px, N * R * C, 0), 1, img);
    write_blob(f, "lab.gz", idx1(MODEL_IMAGES_IDX1_MAGIC, N, labs, N, 0), 1, lab);
    model_images_free(load_ok(img, lab));
    size_t full = file_size(img);
    assert_true(snprintf(cut, sizeof cut, "%s/cut.gz", f->dir) < (int)sizeof cut);

    /* Cut in the middle of the deflate data, and cut only the 8-byte
     * CRC and length trailer: all pixels arrive, the stream still did not
     * end properly. */
    copy_cut(img, cut, full / 2, 0);
    expect_refused(cut, lab, VL_EINVAL, cut, "gzip stream truncated");
    copy_cut(img, cut, full - 4, 0);
    expect_refused(cut, lab, VL_EINVAL, cut, "gzip stream truncated");
    copy_cut(img, cut, 5, 0);
    expect_refused(cut, lab, VL_EINVAL, cut, "gzip stream truncated");
    /* A flipped byte of the CRC. */
    copy_cut(img, cut, full, full - 6);
    expect_refused(cut, lab, VL_EINVAL, cut, "gzip stream damaged");
    /* The label file's stream, truncated. */
    copy_cut(lab, cut, file_size(lab) - 3, 0);
    expect_refused(img, cut, VL_EINVAL, cut, "gzip stream truncated");
    free(px);
}

static void test_refused_other(void **state) {
    fixture *f = *state;
    char img[512], lab[512], missing[512];
    write_blob(f, "img", synth_images(0, 0), 0, img);
    write_blob(f, "lab", synth_labels(0, 0), 0, lab);
    assert_true(snprintf(missing, sizeof missing, "%s/nothing-here", f->dir) < (int)sizeof missing);
    expect_refused(missing, lab, VL_ENOTFOUND, missing, "cannot open");
    expect_refused(img, missing, VL_ENOTFOUND, missing, "cannot open");
    expect_refused(f->dir, lab, VL_EINVAL, f->dir, "not a regular file");

    vl_error err = {0};
    model_images *s = (model_images *)&err;
    assert_int_equal(model_images_load(NULL, lab, &s, &err), VL_EINVAL);
    assert_null(s);
    assert_int_equal(model_images_load(img, NULL, &s, &err), VL_EINVAL);
    assert_int_equal(model_images_load(img, lab, NULL, &err), VL_EINVAL);
    /* Without an error record the codes are the same. */
    assert_int_equal(model_images_load(missing, lab, &s, NULL), VL_ENOTFOUND);

    /* A long path is cut from the front; the file name and the detail stay. */
    char deep[512];
    int len = snprintf(deep, sizeof deep, "%s", f->dir);
    for (int level = 0; level < 2; level++) {
        len += snprintf(deep + len, sizeof deep - (size_t)len, "/");
        for (int i = 0; i < 150; i++) len += snprintf(deep + len, sizeof deep - (size_t)len, "d");
        assert_int_equal(mkdir(deep, 0700), 0);
    }
    char path[512];
    assert_true(snprintf(path, sizeof path, "%s/labels-file", deep) < (int)sizeof path);
    blob b = idx1(MODEL_IMAGES_IDX1_MAGIC, SN - 1, SLAB, SN - 1, 0);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(b.p, 1, b.len, fp), b.len);
    assert_int_equal(fclose(fp), 0);
    free(b.p);
    assert_int_equal(model_images_load(img, path, &s, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "dd/labels-file: 4 labels for 5 images"));
}

/* ---- Fashion-MNIST ---------------------------------------------------------- */

static void check_fashion(const char *set, size_t n, size_t per_class) {
    char img[256], lab[256];
    snprintf(img, sizeof img, FASHION_DIR "/%s-images-idx3-ubyte.gz", set);
    snprintf(lab, sizeof lab, FASHION_DIR "/%s-labels-idx1-ubyte.gz", set);
    double t0 = vl_clock_mono_s();
    model_images *s = load_ok(img, lab);
    double dt = vl_clock_mono_s() - t0;
    assert_int_equal(model_images_count(s), n);
    assert_int_equal(model_images_rows(s), 28);
    assert_int_equal(model_images_cols(s), 28);
    assert_int_equal(model_images_classes(s), 10);
    size_t count[10] = {0};
    const uint8_t *l = model_images_labels(s);
    for (size_t i = 0; i < n; i++) count[l[i]]++;
    for (int c = 0; c < 10; c++) assert_int_equal(count[c], per_class);
    printf("fashion-mnist %s: %zu images of %dx%d, %d classes of %zu..%zu, loaded in %.2f s\n", set,
           model_images_count(s), model_images_rows(s), model_images_cols(s),
           model_images_classes(s), count[0], count[9], dt);

    /* Ten peers' Dirichlet(0.5) shares of the real labels cover it once. */
    uint8_t *seen = calloc(n, 1);
    assert_non_null(seen);
    for (int p = 0; p < 10; p++) {
        uint32_t *idx;
        size_t m;
        OK(model_partition(l, n, 10, 10, p, 0.5, 2024, &idx, &m, &e_));
        for (size_t i = 0; i < m; i++) seen[idx[i]]++;
        free(idx);
    }
    for (size_t i = 0; i < n; i++) assert_int_equal(seen[i], 1);
    free(seen);
    model_images_free(s);
}

static void test_fashion_mnist(void **state) {
    struct stat st;
    if (stat(FASHION_DIR, &st) != 0) {
        printf("fashion-mnist: %s is missing (package dataset-fashion-mnist); this part is "
               "skipped\n",
               FASHION_DIR);
        return;
    }
    check_fashion("train", 60000, 6000);
    check_fashion("t10k", 10000, 1000);
}

/* ---- partitions ------------------------------------------------------------- */

/* All parts of a partition: their union must be 0..n-1 with no index
 * twice, each part ascending. Returns the mean over non-empty parts of
 * the largest class's share of the part; sizes (parts entries) may be
 * NULL. */
static double check_cover(const uint8_t *labels, size_t n, int classes, int parts, double beta,
                          uint64_t seed, size_t *sizes) {
    uint8_t *seen = calloc(n, 1);
    assert_non_null(seen);
    double share = 0;
    int nonempty = 0;
    for (int p = 0; p < parts; p++) {
        uint32_t *idx = NULL;
        size_t m = 99;
        OK(model_partition(labels, n, classes, parts, p, beta, seed, &idx, &m, &e_));
        if (sizes) sizes[p] = m;
        if (m == 0) {
            assert_null(idx);
            continue;
        }
        size_t count[256] = {0}, top = 0;
        for (size_t i = 0; i < m; i++) {
            assert_true(idx[i] < n);
            if (i > 0) assert_true(idx[i] > idx[i - 1]);
            seen[idx[i]]++;
            if (++count[labels[idx[i]]] > top) top = count[labels[idx[i]]];
        }
        share += (double)top / (double)m;
        nonempty++;
        free(idx);
    }
    for (size_t i = 0; i < n; i++)
        if (seen[i] != 1) fail_msg("beta %g: index %zu is in %d parts", beta, i, seen[i]);
    free(seen);
    return share / nonempty;
}

static uint8_t *balanced(size_t n, int classes) {
    uint8_t *l = malloc(n);
    assert_non_null(l);
    for (size_t i = 0; i < n; i++) l[i] = (uint8_t)(i % (size_t)classes);
    return l;
}

static void test_partition_cover_and_skew(void **state) {
    const size_t N = 10000;
    uint8_t *l = balanced(N, 10);
    size_t sizes[10];
    double iid = check_cover(l, N, 10, 10, 0, 1, sizes);
    for (int p = 0; p < 10; p++) assert_int_equal(sizes[p], N / 10);
    /* For beta 0.1 the share averages about 0.6 with a spread of 0.055
     * between seeds (a simulation of this scheme), so five seeds keep the
     * bound below far from chance. */
    double b01 = 0;
    for (uint64_t seed = 1; seed <= 5; seed++)
        b01 += check_cover(l, N, 10, 10, 0.1, seed, NULL) / 5;
    double b05 = check_cover(l, N, 10, 10, 0.5, 1, NULL);
    double b100 = check_cover(l, N, 10, 10, 100, 1, NULL);
    printf("mean largest class share over 10 parts: IID %.3f, beta 100 %.3f, beta 0.5 %.3f, "
           "beta 0.1 %.3f\n",
           iid, b100, b05, b01);
    assert_true(iid < 0.2);
    assert_true(b100 < 0.2);
    assert_true(b01 > 0.5);
    assert_true(b05 > iid && b05 < b01);
    /* A negative beta is IID too. */
    assert_true(check_cover(l, N, 10, 10, -1, 1, NULL) < 0.2);

    /* IID sizes are floor or ceil of n/parts when parts does not divide n. */
    uint8_t *l7 = balanced(10003, 10);
    size_t s7[7];
    check_cover(l7, 10003, 10, 7, 0, 9, s7);
    for (int p = 0; p < 7; p++) assert_true(s7[p] == 10003 / 7 || s7[p] == 10003 / 7 + 1);
    free(l7);

    /* Unbalanced classes, classes with no items, many parts. */
    uint8_t *u = malloc(N);
    assert_non_null(u);
    for (size_t i = 0; i < N; i++) u[i] = (uint8_t)(i % 97 == 0 ? 7 : i % 3 == 0 ? 2 : 0);
    check_cover(u, N, 12, 33, 0.3, 5, NULL);
    check_cover(u, N, 12, 33, 0, 5, NULL);
    /* Extreme betas stay well defined: a tiny one gives each class wholly
     * to one part (its proportions would underflow outside logarithms), a
     * huge one nearly equal shares. */
    const double tinies[2] = {MODEL_PARTITION_MIN_BETA, 5e-324};
    for (int t = 0; t < 2; t++) {
        size_t tiny[10];
        check_cover(l, N, 10, 10, tinies[t], 3, tiny);
        for (int p = 0; p < 10; p++) assert_int_equal(tiny[p] % (N / 10), 0);
    }
    size_t huge[10];
    check_cover(l, N, 10, 10, 1e300, 3, huge);
    for (int p = 0; p < 10; p++) assert_true(huge[p] >= N / 10 - 10 && huge[p] <= N / 10 + 10);
    free(u);
    free(l);
}

static void test_partition_seeded(void **state) {
    const size_t N = 5000;
    uint8_t *l = balanced(N, 10);
    const double betas[3] = {0, 0.1, 0.5};
    for (int b = 0; b < 3; b++) {
        uint32_t *a, *c, *d;
        size_t na, nc, nd;
        OK(model_partition(l, N, 10, 8, 3, betas[b], 77, &a, &na, &e_));
        OK(model_partition(l, N, 10, 8, 3, betas[b], 77, &c, &nc, &e_));
        OK(model_partition(l, N, 10, 8, 3, betas[b], 78, &d, &nd, &e_));
        assert_int_equal(na, nc);
        assert_memory_equal(a, c, na * sizeof *a);
        assert_true(na != nd || memcmp(a, d, na * sizeof *a) != 0);
        free(a);
        free(c);
        free(d);
    }
    free(l);
}

static void test_partition_tiny(void **state) {
    /* One part is everything, in order, whatever beta. */
    const uint8_t l[7] = {2, 0, 1, 2, 2, 0, 1};
    for (int b = 0; b < 2; b++) {
        uint32_t *idx;
        size_t m;
        OK(model_partition(l, 7, 3, 1, 0, b ? 0.3 : 0, 11, &idx, &m, &e_));
        assert_int_equal(m, 7);
        for (uint32_t i = 0; i < 7; i++) assert_int_equal(idx[i], i);
        free(idx);
    }
    /* IID slices [p*n/parts, (p+1)*n/parts) of 3 items in 5 parts have
     * sizes 0, 1, 0, 1, 1; the empty ones come back NULL. */
    size_t sizes[5];
    check_cover(l, 3, 3, 5, 0, 4, sizes);
    const size_t want[5] = {0, 1, 0, 1, 1};
    for (int p = 0; p < 5; p++) assert_int_equal(sizes[p], want[p]);
    /* One item of one class: exactly one of the parts gets it. */
    size_t one[4];
    check_cover(l + 1, 1, 1, 4, 0.5, 4, one);
    assert_int_equal(one[0] + one[1] + one[2] + one[3], 1);
}

static void expect_partition_refused(const uint8_t *l, size_t n, int classes, int parts, int part,
                                     double beta, const char *want) {
    vl_error err = {0};
    uint32_t *idx = (uint32_t *)&err;
    size_t m = 99;
    int rc = model_partition(l, n, classes, parts, part, beta, 1, &idx, &m, &err);
    if (rc != VL_EINVAL || strstr(err.msg, want) == NULL)
        fail_msg("partition n=%zu classes=%d parts=%d part=%d beta=%g: got %d \"%s\", "
                 "expected \"%s\"",
                 n, classes, parts, part, beta, rc, err.msg, want);
    assert_null(idx);
    assert_int_equal(m, 0);
}

static void test_partition_refused(void **state) {
    const uint8_t l[6] = {0, 1, 2, 0, 1, 2};
    expect_partition_refused(l, 6, 3, 0, 0, 0, "0 parts");
    expect_partition_refused(l, 6, 3, MODEL_PARTITION_MAX_PARTS + 1, 0, 0, "parts, need");
    expect_partition_refused(l, 6, 3, 4, -1, 0, "part -1 is outside 0..3");
    expect_partition_refused(l, 6, 3, 4, 4, 0, "part 4 is outside 0..3");
    expect_partition_refused(l, 6, 0, 4, 0, 0, "0 classes");
    expect_partition_refused(l, 6, 257, 4, 0, 0, "257 classes");
    expect_partition_refused(l, 6, 2, 4, 0, 0, "label 2 is 2, not below 2 classes");
    expect_partition_refused(l, 0, 3, 4, 0, 0, "0 items");
    expect_partition_refused(l, 6, 3, 4, 0, NAN, "not a finite number");
    expect_partition_refused(l, 6, 3, 4, 0, INFINITY, "not a finite number");
    expect_partition_refused(l, 6, 3, 4, 0, -INFINITY, "not a finite number");
    expect_partition_refused(NULL, 6, 3, 4, 0, 0, "missing argument");
    vl_error err = {0};
    size_t m;
    uint32_t *idx;
    assert_int_equal(model_partition(l, 6, 3, 4, 0, 0, 1, NULL, &m, &err), VL_EINVAL);
    assert_int_equal(model_partition(l, 6, 3, 4, 0, 0, 1, &idx, NULL, &err), VL_EINVAL);
    assert_null(idx);
}

/* ---- the gamma sampler ------------------------------------------------------ */

static void test_gamma_moments(void **state) {
    const double shapes[5] = {0.1, 0.5, 1, 2, 30};
    const int N = 400000;
    vl_rng r;
    vl_rng_seed(&r, 12345);
    for (int k = 0; k < 5; k++) {
        double a = shapes[k], sum = 0, sum2 = 0;
        for (int i = 0; i < N; i++) {
            double g = model_partition_gamma(&r, a);
            assert_true(g >= 0 && isfinite(g));
            sum += g;
            sum2 += g * g;
        }
        double mean = sum / N, var = (sum2 - N * mean * mean) / (N - 1);
        /* Five standard errors: Gamma(a, 1) has variance a and excess
         * kurtosis 6/a, so the sample variance has variance
         * a^2 (2 + 6/a) / N. */
        double tol_mean = 5 * sqrt(a / N), tol_var = 5 * sqrt(a * a * (2 + 6 / a) / N);
        printf("gamma(%g): mean %.5f (want %g +- %.5f), variance %.5f (want %g +- %.5f)\n", a, mean,
               a, tol_mean, var, a, tol_var);
        assert_true(fabs(mean - a) < tol_mean);
        assert_true(fabs(var - a) < tol_var);
    }
    assert_true(isnan(model_partition_gamma(&r, 0)));
    assert_true(isnan(model_partition_gamma(&r, -1)));
    assert_true(isnan(model_partition_gamma(&r, NAN)));
    assert_true(isnan(model_partition_gamma(&r, INFINITY)));
    assert_true(isnan(model_partition_gamma(NULL, 1)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_plain_and_gzip, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_batch_refused, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_refused_headers, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_refused_lengths, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_refused_gzip, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_refused_other, test_dir_setup, test_dir_teardown),
        cmocka_unit_test(test_fashion_mnist),
        cmocka_unit_test(test_partition_cover_and_skew),
        cmocka_unit_test(test_partition_seeded),
        cmocka_unit_test(test_partition_tiny),
        cmocka_unit_test(test_partition_refused),
        cmocka_unit_test(test_gamma_moments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
