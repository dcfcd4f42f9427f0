/*
 * Robust aggregation: making a version from updates some of which come
 * from hostile peers. DESIGN.md's merge is the weighted mean
 * Δ̄ = Σ wᵢΔᵢ / Σ wᵢ (wᵢ = nᵢ·s(τᵢ)), which a single update scaled by 100
 * drags wherever it likes. The run's robust.rule replaces it:
 *
 *  - trimmed_mean: per coordinate, the b = ⌊trim·k⌋ lowest and b highest of
 *    the k values are cut (by count; equal values in update order), and the
 *    rest are averaged with their weights wᵢ, renormalised over those kept.
 *  - median: per coordinate, the median of the k values, unweighted (the
 *    mean of the two middle ones when k is even).
 *  - norm_clip: every update longer than clip_mult × the median of the k
 *    updates' norms is scaled down to that length; then the weighted mean.
 *
 * Cutting goes by count and the median ignores weights because wᵢ comes
 * from the peer's own num_samples: a weighted median or a cut by weight
 * would let one peer that claims many samples pick the result. Weights
 * inside the kept values can only move a coordinate between values that
 * survived the cut, so trimmed_mean keeps staleness and sample weighting
 * without handing them that power.
 *
 * Dense updates are combined coordinate by coordinate and sketches cell by
 * cell (a run's sketches share seed and shape, so a cell means the same in
 * all of them). Sparse (topk, gaussk) updates are combined over the union
 * of their indices, an index an update lacks counting as 0 there, which is
 * what that update says about it: a coordinate sent by fewer than half the
 * peers has median 0, and one sent by at most b of them is cut away.
 *
 * Independently of the rule, robust.max_norm bounds each update's L2 norm
 * (compress_update_norm): refused at upload (on_excess "refuse") or scaled
 * down to the bound when merged ("clip"; the stored body stays as sent).
 *
 * Contents: coord_robust_sort, coord_robust_median,
 * coord_robust_median_known, coord_robust_clip_scales,
 * coord_robust_bound_scale, coord_robust_combine, coord_robust_acc,
 * coord_robust_acc_init, coord_robust_acc_add, coord_robust_acc_finish,
 * coord_robust_acc_free.
 */
#ifndef VOLLEY_COORD_ROBUST_H
#define VOLLEY_COORD_ROBUST_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "compress/compress.h"
#include "coordinator/config/config.h"

/* ---- the rules on plain vectors -------------------------------------------- */


/* Sorts x[0..n) in ascending order, in place. */
void coord_robust_sort(double *x, size_t n);
/* The median of n >= 1 values (mean of the two middle ones for even n);
 * sorts x. */
double coord_robust_median(double *x, size_t n);
/* The median and (*max) the largest of the n values of v that are not
 * NaN (a set-aside update has no norm); NaN for none, or when out of
 * memory. v is not changed. */
double coord_robust_median_known(const double *v, size_t n, double *max);

/* Scale factors of norm_clip: scale[i] = min(1, mult · median(norms) /
 * norms[i]), 1 for a zero norm. */
void coord_robust_clip_scales(const double *norms, size_t k, double mult, double *scale);

/* The factor max_norm scales an update of this norm by: min(1, max_norm /
 * norm), 1 when the run has no bound. */
double coord_robust_bound_scale(const coord_robust_config *r, double norm);

/* Combines k >= 1 vectors rows[i] of d values with weights w[i] > 0 into
 * out (d values) coordinate by coordinate: trimmed_mean (cutting
 * coord_config_trim_count(trim, k) at each end) and median as above, and
 * the weighted mean for mean and norm_clip (whose clipping is the
 * caller's). Sums in double. VL_ENOMEM for the k-entry scratch. */
int coord_robust_combine(coord_rule rule, double trim, const float *const *rows, const double *w,
                         size_t k, size_t d, float *out, vl_error *err) VL_MUST_CHECK;

/* ---- one merge's updates ----------------------------------------------------- */

/* The updates of one merge, copied as they are read, for a rule that needs
 * all of them at once. */
typedef struct coord_robust_acc {
    coord_robust_config cfg;
    compress_kind kind;
    size_t d; /* values per update (dense, sketch) or the index range (topk) */
    size_t k, cap;
    float **vals;   /* per update, compress_update_count values (owned) */
    uint32_t **idx; /* topk: per update, its indices (owned) */
    size_t *count;  /* per update, its number of values */
    double *w;      /* weights */
    double *norm;   /* norms after the max_norm bound */
    size_t bounded; /* updates scaled down to max_norm */
    /* What coord_robust_acc_finish did, for the log. */
    size_t clipped; /* norm_clip: updates scaled down */
    size_t union_n; /* topk: coordinates in the union of the indices */
} coord_robust_acc;

/* An empty set for updates of the given kind: d is the model's parameter
 * count for dense and topk updates, rows * cols for sketches. */
void coord_robust_acc_init(coord_robust_acc *a, const coord_robust_config *cfg, compress_kind kind,
                           size_t d);
/* Copies update u with weight w > 0 and norm (its compress_update_norm)
 * in, scaled down to max_norm if longer. VL_EINVAL for an update of
 * another kind, or a dense or sketch update of other than d values. */
int coord_robust_acc_add(coord_robust_acc *a, const compress_update *u, double w, double norm,
                         vl_error *err) VL_MUST_CHECK;
/* Writes the rule's combination of the updates added, a mean already (no
 * further division by the weights), to out: d values (for topk, 0 outside
 * the union of the indices). VL_EINVAL when nothing was added; VL_ENOMEM. */
int coord_robust_acc_finish(coord_robust_acc *a, float *out, vl_error *err) VL_MUST_CHECK;
void coord_robust_acc_free(coord_robust_acc *a);

#endif
