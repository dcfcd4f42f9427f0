/*
 * model/images: labelled images for classification, and each peer's share
 * of them. Federated classification keeps the data where it lives: every
 * peer trains on its own labelled images, read from local IDX files (the
 * MNIST family's format), and only model changes travel; the coordinator
 * never sees an image or a label. When a study simulates such a federation
 * from one public data set, every peer computes its share with
 * model_partition from the same seed, so peers agree on a split into
 * disjoint parts, IID or with the label skew of a Dirichlet draw, without
 * exchanging a single index.
 *
 * Conventions as in model/model.h: functions that can fail return 0 or a
 * negative VL_E* code and leave one line in err (which may be NULL). A
 * model_images is immutable once loaded, so any number of threads may read
 * it at once.
 */
#ifndef VOLLEY_MODEL_IMAGES_H
#define VOLLEY_MODEL_IMAGES_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* ---- IDX image sets (images.c) ------------------------------------------------ */

typedef struct model_images model_images;

/* IDX magic numbers: two zero bytes, type 0x08 (unsigned byte), then the
 * number of dimensions. */
#define MODEL_IMAGES_IDX3_MAGIC 0x00000803u
#define MODEL_IMAGES_IDX1_MAGIC 0x00000801u
/* Largest image side accepted, in pixels. */
#define MODEL_IMAGES_MAX_SIDE 4096
/* Most pixels (count * rows * cols) a set may hold: 1 GiB, so a forged
 * header cannot make a peer allocate more than that. */
#define MODEL_IMAGES_MAX_PIXELS ((uint64_t)1 << 30)

/* Reads a set of labelled images from two IDX files: images_path, an IDX3
 * unsigned-byte file (magic MODEL_IMAGES_IDX3_MAGIC, then n, rows and cols
 * as big-endian uint32, then n*rows*cols pixels, image by image, row by
 * row), and labels_path, an IDX1 unsigned-byte file (magic
 * MODEL_IMAGES_IDX1_MAGIC, then n, then n labels). Either file may be plain
 * or gzip-compressed (recognised by its 1f 8b magic), as the Fashion-MNIST
 * and MNIST downloads are.
 *
 * Nothing is trusted: the magic must be exact, n >= 1 and the same in both
 * files, rows and cols in [1, MODEL_IMAGES_MAX_SIDE], n*rows*cols at most
 * MODEL_IMAGES_MAX_PIXELS, and each file exactly as long as its header says
 * (a truncated file and trailing bytes are both refused; for gzip this is
 * the decompressed length, and the stream's CRC and length trailer are
 * checked too). Both headers are checked before the pixels are read, so a
 * mismatched pair fails before any large allocation. The number of classes
 * is the largest label + 1 (at most 256, labels being bytes). Every message
 * names the file and what is wrong with it.
 *
 * On success *out is the caller's, released with model_images_free; on
 * failure *out is NULL. Returns 0, VL_ENOTFOUND (no such file), VL_EIO
 * (cannot open or read), VL_EINVAL (missing argument, not a regular file,
 * bad header, length, or gzip stream), VL_ENOMEM. */
int model_images_load(const char *images_path, const char *labels_path, model_images **out,
                      vl_error *err) VL_MUST_CHECK;

/* Frees the set. NULL is a no-op. */
void model_images_free(model_images *s);

/* The number of images n (0 for NULL). */
size_t model_images_count(const model_images *s);

/* Rows and columns of every image (0 for NULL). */
int model_images_rows(const model_images *s);
int model_images_cols(const model_images *s);

/* The number of classes: the largest label + 1, in [1, 256] (0 for NULL). */
int model_images_classes(const model_images *s);

/* The n labels, owned by the set and valid until model_images_free. */
const uint8_t *model_images_labels(const model_images *s);

/* The n*rows*cols pixels as stored in the file (image i starts at
 * i*rows*cols, rows top to bottom), owned by the set and valid until
 * model_images_free. */
const uint8_t *model_images_pixels(const model_images *s);

/* Gathers a batch of B >= 1 images by index: row b of x (rows*cols floats,
 * caller-owned, B rows in all) is image idx[b] with each pixel p as
 * p / 255.0f, so 0 maps to exactly 0 and 255 to exactly 1 and the inputs
 * keep the scale the pixels had, with no per-set statistics that peers
 * would have to agree on; labels[b] (caller-owned, B ints) is its label.
 * Indices may repeat. Every index is checked before anything is written,
 * so on failure x and labels are untouched. Returns 0 or VL_EINVAL (a
 * missing argument, B < 1, an index >= count). */
int model_images_batch(const model_images *s, const uint32_t *idx, int B, float *x, int *labels,
                       vl_error *err) VL_MUST_CHECK;

/* ---- partitions (partition.c) --------------------------------------------------- */

/* Most parts model_partition splits into; bounds its scratch memory. */
#define MODEL_PARTITION_MAX_PARTS (1 << 20)
/* Smaller positive betas are raised to this one, where each class already
 * goes whole to one part: the limit that smaller betas approach. */
#define MODEL_PARTITION_MIN_BETA 1e-300

/* The indices of part `part` (0 <= part < parts) of a data set of n
 * labelled items (labels[i] < classes), the share a peer trains on.
 *
 * beta <= 0 is IID: one shuffle of 0..n-1, seeded by seed, cut into parts
 * slices, slice p being positions [p*n/parts, (p+1)*n/parts), so every
 * part has floor(n/parts) or ceil(n/parts) items. beta > 0 is label skew:
 * each class's indices, shuffled, are cut among the parts in proportions
 * drawn from a symmetric Dirichlet(beta) (Gamma(beta, 1) draws,
 * normalised), a fresh draw per class, the cut points rounded to the
 * nearest index so that every item goes to exactly one part (beta below
 * MODEL_PARTITION_MIN_BETA counts as that). Small beta
 * gives each part few classes (0.1: mostly one or two), large beta
 * approaches IID class shares (but not IID sizes).
 *
 * The result depends on labels, n, classes, parts, beta and seed only, not
 * on part or on anything else: peers calling with the same arguments but
 * their own part get disjoint parts whose union is 0..n-1. It is
 * reproducible wherever the C library's log and exp round alike (the
 * Dirichlet proportions pass through them; IID uses integers only).
 *
 * On success *idx_out is a new array of *count_out indices in ascending
 * order, the caller's to free(); an empty part (possible when parts > n or
 * beta is small) gives *count_out 0 and *idx_out NULL. On failure *idx_out
 * is NULL and *count_out 0. Returns 0, VL_EINVAL (a missing argument,
 * n == 0 or n > UINT32_MAX, classes outside [1, 256], parts outside
 * [1, MODEL_PARTITION_MAX_PARTS], part outside [0, parts), a label >=
 * classes, beta NaN or infinite), VL_ENOMEM. */
int model_partition(const uint8_t *labels, size_t n, int classes, int parts, int part, double beta,
                    uint64_t seed, uint32_t **idx_out, size_t *count_out,
                    vl_error *err) VL_MUST_CHECK;

/* One draw from Gamma(shape, 1), which has mean and variance both equal to
 * shape: Marsaglia and Tsang's method on r, with shape < 1 boosted as
 * Gamma(shape + 1) * U^(1/shape). This is the sampler model_partition's
 * Dirichlet proportions come from (there it works in logarithms, so tiny
 * draws that would underflow here still count). Returns NaN when shape is
 * not a positive finite number; for shape far below 1 the draw may
 * underflow to 0. */
double model_partition_gamma(vl_rng *r, double shape);

#endif
