/*
 * compress: the update formats peers upload and the coordinator merges.
 *
 * An update is a safetensors file whose __metadata__ names the run, task,
 * peer, base version, kind, sample count, local steps and final local loss,
 * and whose tensors carry the pseudo-gradient delta = theta_base -
 * theta_local in one of the kinds of DESIGN.md. This module encodes and
 * strictly validates updates and holds the vector arithmetic that merging
 * needs. Pure C: no I/O, no allocation beyond the decoded file's tables.
 */
#ifndef VOLLEY_COMPRESS_H
#define VOLLEY_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

typedef enum {
    COMPRESS_DENSE = 0, /* F32/F16 `delta` of every parameter */
} compress_kind;

/* Kind from its wire name ("dense"); VL_EINVAL if unknown. */
int compress_kind_parse(const char *name, compress_kind *out) VL_MUST_CHECK;
const char *compress_kind_name(compress_kind k);

typedef struct compress_update_meta {
    char run[64];
    int64_t task;
    int64_t peer;
    int64_t base_version;
    compress_kind kind;
    int64_t num_samples; /* > 0 */
    int64_t local_steps; /* > 0 */
    double loss;         /* mean local training loss, finite */
} compress_update_meta;

/* Appends a dense update (delta as F32 or F16) to out. */
int compress_update_encode_dense(const compress_update_meta *meta, const float *delta, size_t n,
                                 st_dtype dtype, buf *out, vl_error *err) VL_MUST_CHECK;

/* A decoded update. delta points into the caller's bytes (through file),
 * which must outlive it; compress_update_free releases the tables. */
typedef struct compress_update {
    compress_update_meta meta;
    st_file file;
    const st_tensor *delta;
} compress_update;

/* Parses and validates len bytes against a model of n_params parameters.
 * Returns VL_EINVAL for a malformed file or metadata (HTTP 400) and
 * VL_ERANGE for a well-formed update that does not fit the run: wrong
 * shape or dtype, or a non-finite value (HTTP 422). err names the field. */
int compress_update_decode(const uint8_t *bytes, size_t len, size_t n_params,
                           compress_update *out, vl_error *err) VL_MUST_CHECK;
void compress_update_free(compress_update *u);

/* dst[i] += w * delta[i] for the update's values (converting F16), so the
 * coordinator accumulates a weighted sum without a float copy per update. */
int compress_update_accumulate(const compress_update *u, float w, float *dst, size_t n,
                               vl_error *err) VL_MUST_CHECK;

/* delta[i] = base[i] - local[i]. */
void compress_dense_delta(const float *base, const float *local, float *delta, size_t n);

/* 1 when all n values are finite. */
int compress_all_finite(const float *x, size_t n);

#endif
