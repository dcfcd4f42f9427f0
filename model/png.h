/*
 * model/png: pictures of the split-learning leakage benchmark's results.
 * The benchmark shows a person what an attacker recovers from leaked
 * cut-layer activations by writing originals and their reconstructions
 * side by side as one grey PNG; this module lays images out as such a grid
 * and writes 8-bit grey PNG files through libpng.
 *
 * Conventions as in model/model.h: functions that can fail return 0 or a
 * negative VL_E* code and leave one line in err (which may be NULL). No
 * state is kept between calls, so any number of threads may call in at
 * once (on different paths).
 */
#ifndef VOLLEY_MODEL_PNG_H
#define VOLLEY_MODEL_PNG_H

#include <stddef.h>

#include "common/common.h"

/* Largest side of a picture written or laid out, in pixels: far beyond
 * any grid of 28x28 images worth looking at, small enough that its byte
 * buffer (at most 256 MiB) is always affordable. */
#define MODEL_PNG_MAX_SIDE 16384
/* Pixels between neighbouring tiles of a grid. */
#define MODEL_PNG_GAP 2

/* Writes the w x h grey image `pixels` (row-major floats, top row first,
 * caller-owned and only read) to path as an 8-bit grey PNG: each value is
 * clamped to [0, 1] (NaN counts as 0) and stored as round(v * 255). The
 * bytes go to "<path>.tmp", which is fsynced and renamed onto path, and
 * the directory is synced, so path is always either its old content or
 * the whole new picture. Returns 0, VL_EINVAL (NULL path or pixels, a side
 * outside [1, MODEL_PNG_MAX_SIDE], a path over 4000 bytes), VL_ENOMEM,
 * VL_EIO (cannot create, write, sync or rename; the message names the path
 * and the system's or libpng's reason, and the temporary file is
 * removed). */
int model_png_write_gray(const char *path, const float *pixels, int w, int h,
                         vl_error *err) VL_MUST_CHECK;

/* Lays out n tiles of tw x th pixels (tile k at float k*tw*th of tiles,
 * row-major, caller-owned and only read) on a grid of rows x cols, filled
 * row by row, MODEL_PNG_GAP pixels between neighbouring tiles and no
 * border: the picture is cols*tw + (cols-1)*gap wide and rows*th +
 * (rows-1)*gap high. Gaps and cells past the last tile are set to
 * `background` (1 gives white separators). For originals over their
 * reconstructions, pass the k originals then the k reconstructions with
 * rows 2 and cols k. On success *out is a new array of *out_w x *out_h
 * floats, the caller's to free(); on failure it is NULL. Returns 0,
 * VL_EINVAL (NULL arguments, a size below 1, n > rows*cols, a picture side
 * over MODEL_PNG_MAX_SIDE), VL_ENOMEM. */
int model_png_grid(const float *tiles, int n, int tw, int th, int rows, int cols, float background,
                   float **out, int *out_w, int *out_h, vl_error *err) VL_MUST_CHECK;

#endif
