/*
 * IDX image and label files (format in images.h), plain or gzip, read
 * through zlib, which passes plain files through unchanged. Both headers
 * are validated before the pixel block is allocated, and each file is read
 * one byte past its announced end so that trailing data, and for gzip a
 * missing or wrong CRC trailer, is caught instead of silently ignored.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "model/images.h"
#include "model/path_fail.h"

/* gzread takes an unsigned int length; reads go in pieces this large. */
#define IMAGES_READ_PIECE ((size_t)1 << 26)
/* zlib's default 8 KiB input buffer makes a 26 MB file thousands of
 * read calls. */
#define IMAGES_GZ_BUFFER (1u << 17)

_Static_assert(MODEL_IMAGES_MAX_PIXELS <= SIZE_MAX, "the pixel cap must fit in size_t");

struct model_images {
    size_t n;
    int rows, cols, classes;
    uint8_t *pixels; /* n * rows * cols */
    uint8_t *labels; /* n */
};

/* One IDX file being read. */
typedef struct idx_file {
    const char *path;
    gzFile gz;
    int gzip;   /* starts with 1f 8b: messages then speak of the stream */
    size_t pos; /* decompressed bytes read so far */
} idx_file;

/* Records "PATH: DETAIL" (model_path_fail). */
static int idx_fail(vl_error *err, int code, const char *path, const char *fmt, ...)
    VL_PRINTF(4, 5);

static int idx_fail(vl_error *err, int code, const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = model_path_failv(err, code, "", path, fmt, ap);
    va_end(ap);
    return rc;
}

static void idx_close(idx_file *f) {
    if (f->gz != NULL) gzclose(f->gz);
    f->gz = NULL;
}

static int idx_open(idx_file *f, const char *path, vl_error *err) {
    memset(f, 0, sizeof *f);
    f->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return idx_fail(err, e == ENOENT ? VL_ENOTFOUND : VL_EIO, path, "cannot open: %s",
                        strerror(e));
    }
    /* A directory or a FIFO would fail later with a less helpful message,
     * or block. */
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return idx_fail(err, VL_EIO, path, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return idx_fail(err, VL_EINVAL, path, "not a regular file");
    }
    uint8_t m[2] = {0, 0};
    ssize_t got;
    do got = pread(fd, m, sizeof m, 0);
    while (got < 0 && errno == EINTR);
    if (got < 0) {
        int e = errno;
        close(fd);
        return idx_fail(err, VL_EIO, path, "cannot read: %s", strerror(e));
    }
    f->gzip = got == 2 && m[0] == 0x1f && m[1] == 0x8b;
    /* gzdopen owns fd from here on, and gzclose closes it. */
    f->gz = gzdopen(fd, "rb");
    if (f->gz == NULL) {
        close(fd);
        return idx_fail(err, VL_ENOMEM, path, "out of memory for the zlib reader");
    }
    if (gzbuffer(f->gz, IMAGES_GZ_BUFFER) != 0) {
        idx_close(f);
        return idx_fail(err, VL_ENOMEM, path, "cannot size the zlib buffer");
    }
    return 0;
}

/* The reason a read stopped short: an I/O error, a damaged gzip stream, or
 * (0) a clean end of file. */
static int idx_stream_error(idx_file *f, const char *what, vl_error *err) {
    int zerr = Z_OK;
    const char *zmsg = gzerror(f->gz, &zerr);
    if (zerr == Z_OK) return 0;
    if (zerr == Z_ERRNO)
        return idx_fail(err, VL_EIO, f->path, "read failed while reading %s: %s", what,
                        strerror(errno));
    if (zerr == Z_MEM_ERROR)
        return idx_fail(err, VL_ENOMEM, f->path, "out of memory decompressing %s", what);
    if (zerr == Z_BUF_ERROR)
        return idx_fail(err, VL_EINVAL, f->path,
                        "gzip stream truncated after %zu bytes, while reading %s", f->pos, what);
    return idx_fail(err, VL_EINVAL, f->path,
                    "gzip stream damaged after %zu bytes, while reading %s: %s", f->pos, what,
                    zmsg ? zmsg : "unknown zlib error");
}

/* Reads up to n bytes of `what` (named in messages) into p; *done is what
 * arrived, less than n only when the file ended cleanly. Returns 0 or the
 * error that stopped the read. */
static int idx_read_some(idx_file *f, void *p, size_t n, size_t *done, const char *what,
                         vl_error *err) {
    uint8_t *out = p;
    *done = 0;
    while (*done < n) {
        size_t want = n - *done < IMAGES_READ_PIECE ? n - *done : IMAGES_READ_PIECE;
        int got = gzread(f->gz, out + *done, (unsigned)want);
        if (got > 0) {
            *done += (size_t)got;
            f->pos += (size_t)got;
        }
        if (got == (int)want) continue;
        int rc = idx_stream_error(f, what, err);
        if (rc != 0 || got <= 0) return rc;
    }
    return 0;
}

/* Reads exactly n bytes of `what`, or fails saying how far the file got. */
static int idx_read(idx_file *f, void *p, size_t n, const char *what, vl_error *err) {
    size_t done;
    int rc = idx_read_some(f, p, n, &done, what, err);
    if (rc == 0 && done < n)
        rc = idx_fail(err, VL_EINVAL, f->path,
                      "file ends after %zu of the %zu bytes of %s (at byte %zu%s): truncated", done,
                      n, what, f->pos, f->gzip ? " of the decompressed data" : "");
    return rc;
}

/* Fails unless the file ends here (and, for gzip, its trailer checks). */
static int idx_expect_end(idx_file *f, vl_error *err) {
    uint8_t extra;
    int got = gzread(f->gz, &extra, 1);
    if (got > 0)
        return idx_fail(err, VL_EINVAL, f->path,
                        "trailing bytes after the %zu bytes the header announces", f->pos);
    return idx_stream_error(f, f->gzip ? "the end of the stream" : "the end of the file", err);
}

static uint32_t be_u32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* A hint for the likely mix-ups: the other IDX kind, a little-endian
 * header, or another element type (0x09 signed byte, 0x0B short, 0x0C int,
 * 0x0D float, 0x0E double). */
static const char *magic_hint(uint32_t magic) {
    if (magic == MODEL_IMAGES_IDX1_MAGIC)
        return " (an IDX1 label file: images and labels swapped?)";
    if (magic == MODEL_IMAGES_IDX3_MAGIC)
        return " (an IDX3 image file: images and labels swapped?)";
    if (magic == 0x01080000u || magic == 0x03080000u)
        return " (byte-swapped: written little-endian?)";
    if ((magic >> 16) == 0 && ((magic >> 8) & 0xff) != 0x08)
        return " (IDX, but not of unsigned bytes)";
    return "";
}

static int check_image_header(const idx_file *f, const uint8_t h[16], vl_error *err) {
    uint32_t n = be_u32(h + 4), rows = be_u32(h + 8), cols = be_u32(h + 12);
    if (n < 1) return idx_fail(err, VL_EINVAL, f->path, "header says 0 images (need at least 1)");
    if (rows < 1 || rows > MODEL_IMAGES_MAX_SIDE || cols < 1 || cols > MODEL_IMAGES_MAX_SIDE)
        return idx_fail(err, VL_EINVAL, f->path,
                        "images of %u x %u pixels: each side must be "
                        "in [1, %d]",
                        (unsigned)rows, (unsigned)cols, MODEL_IMAGES_MAX_SIDE);
    /* rows * cols <= 2^24 and n < 2^32, so the product fits in 64 bits. */
    uint64_t pixels = (uint64_t)n * rows * cols;
    if (pixels > MODEL_IMAGES_MAX_PIXELS)
        return idx_fail(err, VL_EINVAL, f->path,
                        "%u images of %u x %u is %llu pixels, over the cap of %llu", (unsigned)n,
                        (unsigned)rows, (unsigned)cols, (unsigned long long)pixels,
                        (unsigned long long)MODEL_IMAGES_MAX_PIXELS);
    return 0;
}

static int check_label_header(const idx_file *f, const uint8_t h[8], uint32_t images,
                              vl_error *err) {
    uint32_t n = be_u32(h + 4);
    if (n < 1) return idx_fail(err, VL_EINVAL, f->path, "header says 0 labels (need at least 1)");
    if (n != images)
        return idx_fail(err, VL_EINVAL, f->path, "%u labels for %u images", (unsigned)n,
                        (unsigned)images);
    return 0;
}

/* Reads a header of len bytes starting with magic (kind names the file's
 * expected content). The magic is checked first, so a file of the wrong
 * kind is named as such even when it is shorter than the header. */
static int read_header(idx_file *f, uint8_t *h, size_t len, uint32_t magic, const char *kind,
                       vl_error *err) {
    size_t done;
    int rc = idx_read_some(f, h, len, &done, "header", err);
    if (rc != 0) return rc;
    if (done == 0)
        return idx_fail(err, VL_EINVAL, f->path, "empty%s file: no IDX header",
                        f->gzip ? " decompressed" : "");
    if (done >= 4 && be_u32(h) != magic)
        return idx_fail(err, VL_EINVAL, f->path, "magic 0x%08x, expected 0x%08x (%s)%s",
                        (unsigned)be_u32(h), (unsigned)magic, kind, magic_hint(be_u32(h)));
    if (done < len)
        return idx_fail(err, VL_EINVAL, f->path, "%zu bytes, shorter than the %zu-byte IDX header",
                        done, len);
    return 0;
}

int model_images_load(const char *images_path, const char *labels_path, model_images **out,
                      vl_error *err) {
    if (out != NULL) *out = NULL;
    if (images_path == NULL || labels_path == NULL || out == NULL)
        return vl_fail(err, VL_EINVAL, "IDX images: missing argument");
    idx_file fi, fl;
    memset(&fl, 0, sizeof fl);
    model_images *s = NULL;
    uint8_t hi[16], hl[8];
    int rc;
    if ((rc = idx_open(&fi, images_path, err)) != 0) return rc;
    if ((rc = read_header(&fi, hi, sizeof hi, MODEL_IMAGES_IDX3_MAGIC, "IDX3 unsigned-byte images",
                          err)) != 0 ||
        (rc = check_image_header(&fi, hi, err)) != 0 ||
        (rc = idx_open(&fl, labels_path, err)) != 0 ||
        (rc = read_header(&fl, hl, sizeof hl, MODEL_IMAGES_IDX1_MAGIC, "IDX1 unsigned-byte labels",
                          err)) != 0 ||
        (rc = check_label_header(&fl, hl, be_u32(hi + 4), err)) != 0)
        goto done;

    s = calloc(1, sizeof *s);
    if (s == NULL) {
        rc = vl_fail(err, VL_ENOMEM, "IDX images: out of memory");
        goto done;
    }
    s->n = be_u32(hi + 4);
    s->rows = (int)be_u32(hi + 8);
    s->cols = (int)be_u32(hi + 12);
    size_t npix = s->n * (size_t)s->rows * (size_t)s->cols;
    s->pixels = malloc(npix);
    s->labels = malloc(s->n);
    if (s->pixels == NULL || s->labels == NULL) {
        rc = idx_fail(err, VL_ENOMEM, images_path, "out of memory for %zu pixels", npix);
        goto done;
    }
    if ((rc = idx_read(&fi, s->pixels, npix, "pixel data", err)) != 0 ||
        (rc = idx_expect_end(&fi, err)) != 0 ||
        (rc = idx_read(&fl, s->labels, s->n, "labels", err)) != 0 ||
        (rc = idx_expect_end(&fl, err)) != 0)
        goto done;
    /* Labels are bytes, so every one is below 256 and the count fits. */
    int maxl = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->labels[i] > maxl) maxl = s->labels[i];
    s->classes = maxl + 1;
    *out = s;
    s = NULL;

done:
    idx_close(&fi);
    idx_close(&fl);
    model_images_free(s);
    return rc;
}

void model_images_free(model_images *s) {
    if (s == NULL) return;
    free(s->pixels);
    free(s->labels);
    free(s);
}

size_t model_images_count(const model_images *s) {
    return s ? s->n : 0;
}

int model_images_rows(const model_images *s) {
    return s ? s->rows : 0;
}

int model_images_cols(const model_images *s) {
    return s ? s->cols : 0;
}

int model_images_classes(const model_images *s) {
    return s ? s->classes : 0;
}

const uint8_t *model_images_labels(const model_images *s) {
    return s ? s->labels : NULL;
}

const uint8_t *model_images_pixels(const model_images *s) {
    return s ? s->pixels : NULL;
}

int model_images_batch(const model_images *s, const uint32_t *idx, int B, float *x, int *labels,
                       vl_error *err) {
    if (s == NULL || idx == NULL || x == NULL || labels == NULL)
        return vl_fail(err, VL_EINVAL, "image batch: missing argument");
    if (B < 1) return vl_fail(err, VL_EINVAL, "image batch: B=%d must be positive", B);
    for (int b = 0; b < B; b++)
        if (idx[b] >= s->n)
            return vl_fail(err, VL_EINVAL,
                           "image batch: index %u (entry %d) is not below the "
                           "%zu images",
                           (unsigned)idx[b], b, s->n);
    size_t d = (size_t)s->rows * (size_t)s->cols;
    for (int b = 0; b < B; b++) {
        const uint8_t *p = s->pixels + (size_t)idx[b] * d;
        float *row = x + (size_t)b * d;
        /* A true division, not a multiply by 1/255, so each value is the
         * correctly rounded p/255 that the documentation promises. */
        for (size_t i = 0; i < d; i++) row[i] = (float)p[i] / 255.0f;
        labels[b] = s->labels[idx[b]];
    }
    return 0;
}
