/*
 * Grey PNG output for model/png.h through libpng's classic write API,
 * whose errors arrive by longjmp: the encoder is kept to one function that
 * owns the libpng structures and modifies no local after setjmp, and the
 * file handling around it (temporary name, fsync, rename) stays in plain C.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <png.h>

#include "model/path_fail.h"
#include "model/png.h"

#define PNG_MAX_PATH 4000

/* ---- grid ------------------------------------------------------------------------- */

static int check_size(const char *what, int v, vl_error *err) {
    if (v < 1 || v > MODEL_PNG_MAX_SIDE)
        return vl_fail(err, VL_EINVAL, "png grid: %s %d outside [1, %d]", what, v,
                       MODEL_PNG_MAX_SIDE);
    return 0;
}

int model_png_grid(const float *tiles, int n, int tw, int th, int rows, int cols, float background,
                   float **out, int *out_w, int *out_h, vl_error *err) {
    if (out == NULL || out_w == NULL || out_h == NULL)
        return vl_fail(err, VL_EINVAL, "png grid: missing output");
    *out = NULL;
    if (tiles == NULL) return vl_fail(err, VL_EINVAL, "png grid: no tiles");
    int rc = check_size("tile width", tw, err);
    if (rc == 0) rc = check_size("tile height", th, err);
    if (rc == 0) rc = check_size("rows", rows, err);
    if (rc == 0) rc = check_size("cols", cols, err);
    if (rc != 0) return rc;
    /* Every factor is at most 2^14, so these products fit in long long. */
    long long W = (long long)cols * tw + (long long)(cols - 1) * MODEL_PNG_GAP;
    long long H = (long long)rows * th + (long long)(rows - 1) * MODEL_PNG_GAP;
    if (W > MODEL_PNG_MAX_SIDE || H > MODEL_PNG_MAX_SIDE)
        return vl_fail(err, VL_EINVAL, "png grid: a %lldx%lld picture exceeds %d a side", W, H,
                       MODEL_PNG_MAX_SIDE);
    if (n < 1 || (long long)n > (long long)rows * cols)
        return vl_fail(err, VL_EINVAL, "png grid: %d tiles for %d cells", n, rows * cols);
    size_t pw = (size_t)W, total = (size_t)W * (size_t)H;
    float *img = malloc(total * sizeof(float));
    if (img == NULL)
        return vl_fail(err, VL_ENOMEM, "png grid: out of memory for %lldx%lld pixels", W, H);
    for (size_t i = 0; i < total; i++) img[i] = background;
    size_t tile = (size_t)tw * (size_t)th;
    for (int k = 0; k < n; k++) {
        size_t x0 = (size_t)(k % cols) * (size_t)(tw + MODEL_PNG_GAP);
        size_t y0 = (size_t)(k / cols) * (size_t)(th + MODEL_PNG_GAP);
        const float *t = tiles + (size_t)k * tile;
        for (size_t y = 0; y < (size_t)th; y++)
            memcpy(img + (y0 + y) * pw + x0, t + y * (size_t)tw, (size_t)tw * sizeof(float));
    }
    *out = img;
    *out_w = (int)W;
    *out_h = (int)H;
    return 0;
}

/* ---- encoding --------------------------------------------------------------------- */

/* Where libpng's error handler leaves its reason before jumping back. */
typedef struct png_ctx {
    char msg[160];
} png_ctx;

static void on_error(png_structp png, png_const_charp msg) {
    png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "libpng: %s", msg ? msg : "error");
    png_longjmp(png, 1);
}

/* Warnings are about ancillary details (none of which are written) and
 * must not reach stderr, which belongs to the program's log. */
static void on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

/* Encodes the rows to f. Returns 0, or -1 with the reason in c->msg. */
static int encode(FILE *f, png_bytep *rowp, int w, int h, png_ctx *c) {
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, c, on_error, on_warning);
    if (png == NULL) {
        snprintf(c->msg, sizeof c->msg, "libpng: out of memory");
        return -1;
    }
    png_infop info = png_create_info_struct(png);
    if (info == NULL) {
        png_destroy_write_struct(&png, NULL);
        snprintf(c->msg, sizeof c->msg, "libpng: out of memory");
        return -1;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return -1;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_GRAY,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    png_write_image(png, rowp);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return 0;
}

/* ---- the file --------------------------------------------------------------------- */

static int fail_path(vl_error *err, int code, const char *path, const char *what, int e) {
    char detail[176];
    snprintf(detail, sizeof detail, "%s: %s", what, strerror(e));
    return model_path_fail(err, code, "png ", path, detail);
}

/* Writes the encoded picture to tmp and syncs it. Returns 0, or VL_EIO with
 * the reason in err; tmp may be left behind for the caller to remove. */
static int write_tmp(const char *path, const char *tmp, png_bytep *rowp, int w, int h,
                     vl_error *err) {
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return fail_path(err, VL_EIO, path, "cannot create the temporary file", errno);
    FILE *f = fdopen(fd, "wb");
    if (f == NULL) {
        int e = errno;
        close(fd);
        return fail_path(err, VL_EIO, path, "fdopen", e);
    }
    png_ctx c = {{0}};
    if (encode(f, rowp, w, h, &c) != 0) {
        fclose(f);
        return model_path_fail(err, VL_EIO, "png ", path, c.msg);
    }
    const char *what = NULL;
    if (fflush(f) != 0)
        what = "write";
    else if (fsync(fileno(f)) != 0)
        what = "fsync";
    int e = errno;
    if (fclose(f) != 0 && what == NULL) {
        what = "close";
        e = errno;
    }
    return what ? fail_path(err, VL_EIO, path, what, e) : 0;
}

int model_png_write_gray(const char *path, const float *pixels, int w, int h, vl_error *err) {
    if (path == NULL || pixels == NULL)
        return vl_fail(err, VL_EINVAL, "png write: missing %s", path == NULL ? "path" : "pixels");
    size_t plen = strlen(path);
    if (plen == 0 || plen > PNG_MAX_PATH)
        return vl_fail(err, VL_EINVAL, "png write: path of %zu bytes (need 1 to %d)", plen,
                       PNG_MAX_PATH);
    if (w < 1 || w > MODEL_PNG_MAX_SIDE || h < 1 || h > MODEL_PNG_MAX_SIDE) {
        char detail[96];
        snprintf(detail, sizeof detail, "%dx%d image, sides must lie in [1, %d]", w, h,
                 MODEL_PNG_MAX_SIDE);
        return model_path_fail(err, VL_EINVAL, "png ", path, detail);
    }
    char tmp[PNG_MAX_PATH + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    /* The directory whose entry the rename changes, synced afterwards or
     * a power cut could undo the rename. */
    char dir[PNG_MAX_PATH + 1];
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        snprintf(dir, sizeof dir, ".");
    } else if (slash == path) {
        snprintf(dir, sizeof dir, "/");
    } else {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = '\0';
    }
    size_t W = (size_t)w, n = W * (size_t)h;
    uint8_t *bytes = malloc(n);
    png_bytep *rowp = malloc((size_t)h * sizeof *rowp);
    if (bytes == NULL || rowp == NULL) {
        free(bytes);
        free(rowp);
        return model_path_fail(err, VL_ENOMEM, "png ", path, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        float v = pixels[i];
        /* Written so NaN fails the first test and becomes 0. */
        v = v > 0.0f ? (v < 1.0f ? v : 1.0f) : 0.0f;
        bytes[i] = (uint8_t)(v * 255.0f + 0.5f);
    }
    for (int y = 0; y < h; y++) rowp[y] = bytes + (size_t)y * W;
    int rc = write_tmp(path, tmp, rowp, w, h, err);
    free(rowp);
    free(bytes);
    if (rc == 0 && rename(tmp, path) != 0)
        rc = fail_path(err, VL_EIO, path, "rename from .tmp", errno);
    if (rc != 0) {
        unlink(tmp);
        return rc;
    }
    return vl_file_sync_dir(dir, err);
}
