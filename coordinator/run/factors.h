/*
 * factors: K-FAC's merged factors (factors.c). A run whose peers share
 * their Kronecker factors gets, with each version, the weighted mean of
 * the factors its updates carried, served as one file.
 *
 * Contents: coord_factors_add, coord_factors_merged.
 */
#ifndef VOLLEY_COORD_FACTORS_H
#define VOLLEY_COORD_FACTORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

struct compress_update;
struct compress_factors_sum;
struct storage_version;
struct coord_server;
struct vl_buf;

/* Adds the factors of update u (stored as update_id, checked on arrival)
 * to s, weighted by the samples they carry. VL_EDB when they no longer
 * decode. */
int coord_factors_add(struct compress_factors_sum *s, const struct compress_update *u,
                      int64_t update_id, vl_error *err) VL_MUST_CHECK;
/* The weighted mean of what s holds as the factors file of `version`
 * (the run's factor dtype) into out (initialised here; the caller frees
 * it), and v's factors fields pointing at it. Nothing when s is empty (a
 * version made only of updates without factors cannot happen in runs that
 * require them, but is not an error). */
int coord_factors_merged(struct coord_server *srv, struct compress_factors_sum *s, int64_t version,
                         struct vl_buf *out, struct storage_version *v,
                         vl_error *err) VL_MUST_CHECK;

#endif
