/*
 * compress: the update formats peers upload and the coordinator merges.
 *
 * An update is a safetensors file whose __metadata__ names the run, task,
 * peer, base version, kind, sample count, local steps and final local loss,
 * and whose tensors carry the pseudo-gradient delta = theta_base -
 * theta_local in one of the kinds of DESIGN.md. This module encodes and
 * strictly validates updates, and holds the compressors (Count Sketch,
 * exact top-k, Gaussian-k, error feedback) and the vector arithmetic that
 * merging needs. Pure C: no I/O. Hot loops are built for several x86-64
 * levels and picked at run time, and use OpenMP where it pays.
 */
#ifndef VOLLEY_COMPRESS_H
#define VOLLEY_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

typedef enum {
    COMPRESS_DENSE = 0,  /* F32/F16 `delta` of every parameter */
    COMPRESS_TOPK = 1,   /* U32 `indices` ascending + F32/F16 `values` (topk and gaussk) */
    COMPRESS_SKETCH = 2, /* F32/F16 `table` [rows, cols]; seed in metadata */
} compress_kind;

/* Kind from its wire name ("dense", "topk", "sketch"); VL_EINVAL if unknown. */
int compress_kind_parse(const char *name, compress_kind *out) VL_MUST_CHECK;
const char *compress_kind_name(compress_kind k);

/* ---- Count Sketch (sketch.c) --------------------------------------------
 *
 * r rows of c columns; coordinate i of row j lands in one bucket with one
 * sign, both from the hash of DESIGN.md, computed on the fly and identical
 * on every machine. Sketches of the same (seed, rows, cols) add:
 * S(a) + S(b) = S(a + b). */

#define COMPRESS_SKETCH_MAX_ROWS 15
#define COMPRESS_SKETCH_MAX_CELLS ((uint64_t)1 << 28)

typedef struct compress_sketch {
    uint32_t rows, cols;
    uint64_t seed;
    float *table; /* rows * cols, row-major; owned (compress_sketch_free) */
} compress_sketch;

/* The name of the hash (sketch_hash.h) that sketch updates carry in their
 * metadata, the run's configuration and its tasks: a sketch made with
 * any other hash is refused rather than summed into this one's. */
#define COMPRESS_SKETCH_HASH "window"

/* key_j = vl_splitmix64(seed ^ (j + 1)). */
uint64_t compress_sketch_row_key(uint64_t seed, uint32_t row);
/* Bucket and sign (+1/-1) of coordinate i in row j, by the windowed hash. */
void compress_sketch_hash(uint64_t seed, uint32_t row, uint32_t cols, uint64_t i, uint32_t *bucket,
                          int *sign);

/* A zeroed sketch. VL_EINVAL for rows outside 1..COMPRESS_SKETCH_MAX_ROWS,
 * cols < 1 or more than COMPRESS_SKETCH_MAX_CELLS cells; VL_ENOMEM. */
int compress_sketch_init(compress_sketch *s, uint32_t rows, uint32_t cols, uint64_t seed,
                         vl_error *err) VL_MUST_CHECK;
void compress_sketch_free(compress_sketch *s);
void compress_sketch_zero(compress_sketch *s);
/* 1 when a and b have the same seed, rows and cols. */
int compress_sketch_same_shape(const compress_sketch *a, const compress_sketch *b);

/* table += S(x) for the d values of x (coordinates 0..d-1). */
void compress_sketch_encode(compress_sketch *s, const float *x, size_t d);
/* dst += w * src; VL_EINVAL when their seed or shape differ. */
int compress_sketch_add(compress_sketch *dst, const compress_sketch *src, float w,
                        vl_error *err) VL_MUST_CHECK;
/* out[i] = median over rows of sign * table[row][bucket], i < d (for an
 * even row count, the mean of the two middle values). */
void compress_sketch_estimate(const compress_sketch *s, size_t d, float *out);
/* Heavy hitters: the k coordinates (k <= d) with the largest |estimate|,
 * ties to the lower index, indices ascending in idx and their estimates
 * in val. scratch holds d floats (the estimates). *nnz = min(k, d). */
int compress_sketch_heavy(const compress_sketch *s, size_t d, size_t k, float *scratch,
                          uint32_t *idx, float *val, size_t *nnz, vl_error *err) VL_MUST_CHECK;
/* table += w * S(x) for the sparse x with values val at the n coordinates
 * idx (any order; a repeated index adds twice). */
void compress_sketch_encode_sparse(compress_sketch *s, const uint32_t *idx, const float *val,
                                   size_t n, float w);
/* The standard deviation of the noise in d estimates (from
 * compress_sketch_estimate), measured robustly as the median |estimate|
 * of up to 4096 evenly spaced ones over 0.6745: for a flat vector the
 * estimates are mostly collision noise, and heavy hitters are too few to
 * move a median. 0 for d = 0. */
double compress_sketch_noise(const float *est, size_t d);

/* FetchSGD server step with momentum and error kept in sketch space:
 * V <- mu*V + S;  E <- E + lr*(S + mu*V)  (Nesterov);
 * the k heavy hitters of E are estimated, and those whose |estimate|
 * exceeds the universal threshold t = sigma * sqrt(2 ln d), sigma from
 * compress_sketch_noise over the estimates, are the change, each shrunk
 * by t towards 0 (soft threshold): *nnz <= k of them, indices ascending.
 * The change's own sketch is subtracted from E, so E remains the sketch of
 * what has not been applied. The caller applies theta[idx] -= val. V, E
 * and S share a shape. scratch: d floats (the estimates). idx/val: k. */
int compress_fetchsgd_step(compress_sketch *V, compress_sketch *E, const compress_sketch *S,
                           double lr, double mu, size_t d, size_t k, float *scratch, uint32_t *idx,
                           float *val, size_t *nnz, vl_error *err) VL_MUST_CHECK;

/* The first half of compress_fetchsgd_step, in place: V <- mu*V + S and
 * E <- E + lr*(S + mu*V). VL_EINVAL for sketches of different shape, the
 * same sketch twice, or a non-finite lr or mu. */
int compress_fetchsgd_accumulate(compress_sketch *V, compress_sketch *E, const compress_sketch *S,
                                 double lr, double mu, vl_error *err) VL_MUST_CHECK;

/* The candidates of a second round: the k coordinates (ascending in idx,
 * *nnz = min(k, d)) of largest score max(|x̂ᵢ|, σ) · (ageᵢ + 1), where x̂
 * is E's estimate, σ its collision noise (compress_sketch_noise) and
 * ageᵢ the versions since coordinate i was last applied (d entries, >= 0).
 * On pseudo-gradients after many local steps most estimates are noise, and
 * ranking by them alone kept choosing the same coordinates, and much of
 * the model was never applied at all (docs/benchmarks.md). Flooring at
 * the noise lets age rotate every coordinate through while an estimate
 * that stands out still goes first. scratch: d floats. VL_EINVAL for d > 2^32 - 1. */
int compress_round_candidates(const compress_sketch *E, const float *age, size_t d, size_t k,
                              float *scratch, uint32_t *idx, size_t *nnz,
                              vl_error *err) VL_MUST_CHECK;

/* The Sketched-SGD second round's step, in which every value applied is
 * exact. E is the sketch of the mean updates not yet applied (the caller
 * has added this round's); cand (n_cand ascending coordinates below d,
 * normally the compress_sketch_heavy of E) were sent to the round's
 * peers, and exact[t] is the round's mean update at cand[t] as they
 * reported it. age[i] (d entries) counts the versions since coordinate i
 * was last applied; a candidate's value is exact[t] * min(age + 1,
 * max_gap), the updates it missed taken to equal this one. The k of
 * largest |value| (ties to the lower index) go, ascending, to idx and val
 * (room for n_cand each), *nnz their count; their sketch is subtracted
 * from E, their ages become 0 and every other age grows by 1. The caller
 * applies the change through its outer step. VL_EINVAL for candidates out
 * of order or range, or max_gap < 1. */
int compress_round_take(compress_sketch *E, const uint32_t *cand, const float *exact, size_t n_cand,
                        float *age, size_t d, float max_gap, size_t k, uint32_t *idx, float *val,
                        size_t *nnz, vl_error *err) VL_MUST_CHECK;

/* Sketched-SGD second round: the P*k candidates are compress_sketch_heavy
 * of E with k = P*k; once their exact values are known, this keeps, from
 * n candidates (ascending) with exact values, the
 * k of largest |value| (ties to lower index), ascending, in place; returns
 * the count kept in *nnz. */
int compress_select_exact(uint32_t *idx, float *val, size_t n, size_t k, size_t *nnz,
                          vl_error *err) VL_MUST_CHECK;

/* ---- selection (topk.c, gaussk.c) -------------------------------------- */

/* Exact top-k by |x| in O(d) (radix select on the float bits, no sort):
 * the min(k, d) coordinates of largest |x|, ties to the lower index, in
 * ascending index order in idx (room for min(k, d)). d <= UINT32_MAX.
 * VL_ENOMEM when its scratch cannot be allocated. */
int compress_topk(const float *x, size_t d, size_t k, uint32_t *idx, size_t *nnz,
                  vl_error *err) VL_MUST_CHECK;

/* Block top-k (blocks.c): d is cut into nb = compress_blocks_count(d, k,
 * block) slices of equal length (slice b is [d*b/nb, d*(b+1)/nb)), slice b
 * gets k*(b+1)/nb - k*b/nb of the k entries, and each takes the exact top
 * of its share by |x|, ties to the lower index. Indices ascending in idx
 * (room for min(k, d)); *nnz = min(k, d). With one block (block 0, block
 * >= d, or k so close to d that slices could not hold their shares) this
 * is compress_topk. VL_EINVAL for d > UINT32_MAX; VL_ENOMEM. */
int compress_topk_blocks(const float *x, size_t d, size_t k, size_t block, uint32_t *idx,
                         size_t *nnz, vl_error *err) VL_MUST_CHECK;
/* How many slices compress_topk_blocks uses: 0 when d or k is 0, 1 for a
 * plain top-k, else min(ceil(d / block), k), provided d >= k + that. */
size_t compress_blocks_count(size_t d, size_t k, size_t block);
/* Slice b of nb: its first coordinate, length, share of k and where its
 * entries start in the output. */
void compress_blocks_span(size_t d, size_t k, size_t nb, size_t b, size_t *lo, size_t *len,
                          size_t *share, size_t *out_at);

/* Room compress_gaussk needs in idx for a given k: it may return up to 5 %
 * more than k. */
#define COMPRESS_GAUSSK_CAP(k) ((k) + (k) / 20 + 2)
/* Gaussian-k: thr = |mean| + std * Phi^-1(1 - rho/2), rho = k/d, then the
 * threshold is refined until the count of |x| >= thr is within +-5 % of
 * k (exactly k or fewer when d is tiny or values tie). Indices ascending
 * in idx (room for COMPRESS_GAUSSK_CAP(k)); the final threshold goes to
 * *thr (may be NULL). */
int compress_gaussk(const float *x, size_t d, size_t k, uint32_t *idx, size_t *nnz, double *thr,
                    vl_error *err) VL_MUST_CHECK;
/* The z of Gaussian-k's threshold: P(|N(0,1)| >= z) = rho for 0 < rho < 1
 * (Phi^-1(1 - rho/2), accurate far into the tail), 0 once rho >= 1. The
 * GPU Gaussian-k uses it too, so both start from the same threshold. */
double compress_gaussk_z(double rho);

/* ---- peer-side error feedback (feedback.c) ------------------------------ */

/* e = decay * e + delta over d values: e becomes the vector to compress.
 * decay 1 is classic error feedback (e + delta, bit for bit); below 1 the
 * part of the residual that stays unsent for many rounds fades, which
 * keeps stale movement from arriving in one late burst. */
void compress_feedback_add(float *e, const float *delta, size_t d, float decay);
/* Takes the selected coordinates out of e: val[j] = e[idx[j]] rounded to
 * dtype (F32 or F16, clamped to its finite range), and e[idx[j]] -= val[j],
 * so sent + residual equals the input exactly. */
void compress_feedback_take(float *e, const uint32_t *idx, size_t nnz, st_dtype dtype, float *val);

/* ---- updates (update.c) -------------------------------------------------- */

/* Bounds on what an update may carry. Values of magnitude up to 2^40 and
 * sample counts up to 2^40 keep every weighted sum and outer step far from
 * F32's range (about 3.4e38) over any number of versions, so one finite
 * but huge update cannot turn the model into Inf or NaN; real deltas are
 * many orders of magnitude smaller, and a peer's tokens per task
 * (steps x batch x context) stay below 2^40 too. */
#define COMPRESS_MAX_ABS 1099511627776.0f /* 2^40 */
#define COMPRESS_MAX_SAMPLES ((int64_t)1 << 40)

struct compress_factors;

typedef struct compress_update_meta {
    char run[64];
    int64_t task;
    int64_t peer;
    int64_t base_version;
    compress_kind kind;
    int64_t num_samples; /* > 0 */
    int64_t local_steps; /* > 0 */
    double loss;         /* mean local training loss, finite */
    /* A classifier's peer in a run whose coordinator has no test set of
     * its own: the top-1 accuracy, in [0, 1], of the base version on the
     * peer's own data (has_accuracy 0: not reported). */
    int has_accuracy;
    double accuracy;
    /* The wall seconds the peer's local training took, in (0, 1e7]; 0:
     * not reported (optional). The coordinator tells a peer's pace per
     * step from its transfers with it (dynamic local steps). */
    double train_seconds;
    uint64_t seed; /* sketch only: the sketch's hash seed */
    /* K-FAC runs that share factors: the peer's factors, written into the
     * update beside its kind's tensors (borrowed; NULL: none). Decoding
     * leaves it NULL; see compress_factors_decode. */
    const struct compress_factors *factors;
} compress_update_meta;

/* Appends a dense update (delta as F32 or F16) to out. */
int compress_update_encode_dense(const compress_update_meta *meta, const float *delta, size_t n,
                                 st_dtype dtype, vl_buf *out, vl_error *err) VL_MUST_CHECK;
/* Appends a sparse (topk) update: nnz ascending unique indices and their
 * values, stored as dtype (F32 or F16). */
int compress_update_encode_topk(const compress_update_meta *meta, const uint32_t *idx,
                                const float *val, size_t nnz, st_dtype dtype, vl_buf *out,
                                vl_error *err) VL_MUST_CHECK;
/* Appends a sketch update of s (meta->seed is taken from s). */
int compress_update_encode_sketch(const compress_update_meta *meta, const compress_sketch *s,
                                  st_dtype dtype, vl_buf *out, vl_error *err) VL_MUST_CHECK;

/* A decoded update. Tensors point into the caller's bytes (through file),
 * which must outlive it; compress_update_free releases the tables. */
typedef struct compress_update {
    compress_update_meta meta;
    st_file file;
    const st_tensor *delta;   /* dense */
    const st_tensor *indices; /* topk */
    const st_tensor *values;  /* topk */
    const st_tensor *table;   /* sketch */
    size_t nnz;               /* topk: entries; dense: n_params */
    uint32_t rows, cols;      /* sketch */
    int has_factors;          /* the file holds K-FAC factor tensors (not checked here) */
} compress_update;

/* Parses and validates len bytes against a model of n_params parameters.
 * Returns VL_EINVAL for a malformed file or metadata (HTTP 400; a
 * num_samples over COMPRESS_MAX_SAMPLES is one) and VL_ERANGE for a
 * well-formed update whose content does not fit: wrong tensor shape or
 * dtype, indices out of range, not ascending or repeated, a non-finite
 * value, a value over COMPRESS_MAX_ABS in magnitude (HTTP 422). *code
 * (may be NULL) gets the error code the coordinator answers with
 * ("bad_shape", "bad_indices", "non_finite", "out_of_bounds"); err names
 * the field. */
int compress_update_decode(const uint8_t *bytes, size_t len, size_t n_params, compress_update *out,
                           const char **code, vl_error *err) VL_MUST_CHECK;
void compress_update_free(compress_update *u);

/* ---- K-FAC factors (factors.c) ---------------------------------------------- */

/* A peer training with K-FAC (model_kfac_gpt) keeps, per linear layer, the
 * Kronecker factors A [(in+1), (in+1)] and G [out, out] of its Fisher
 * block. In runs that share them it attaches them to its update, and the
 * coordinator serves their weighted average as a file of its own. Either
 * way they are the tensors "kfac.<layer>.A" and "kfac.<layer>.G" (layer as
 * model_gpt_kfac_layer names it, e.g. "kfac.h.0.attn.c_attn.A"), all F32
 * or all F16, and the metadata COMPRESS_FACTORS_SAMPLES_KEY, the number of
 * samples (tokens) behind them. F16 loses range, and G's entries are tiny
 * (squared per-token gradients), so F16 factors are stored divided by
 * their largest |entry| and an F32 tensor COMPRESS_FACTORS_SCALE [2n]
 * holds those scales (A of layer i at 2i, G at 2i + 1). */
#define COMPRESS_FACTORS_PREFIX "kfac."
#define COMPRESS_FACTORS_SCALE "kfac.scale"
#define COMPRESS_FACTORS_SAMPLES_KEY "kfac_samples"
#define COMPRESS_FACTORS_FORMAT "volley-kfac-factors" /* "format" of a merged file */
#define COMPRESS_FACTORS_MAX_LAYERS 2040              /* 2n + 1 tensors fit ST_MAX_TENSORS */
#define COMPRESS_FACTORS_MAX_DIM ((1u << 14) + 1)
#define COMPRESS_FACTORS_MAX_SAMPLES ((int64_t)1 << 50)

/* One layer's factor sizes: A is a_dim x a_dim (a_dim = in + 1 >= 2), G
 * g_dim x g_dim. */
typedef struct compress_factor_layer {
    char name[64];
    uint32_t a_dim, g_dim;
} compress_factor_layer;

/* Factors to write: n layers, A[i] and G[i] full row-major matrices. All
 * borrowed. */
typedef struct compress_factors {
    const compress_factor_layer *layers;
    int n;
    const float *const *A, *const *G;
    int64_t samples; /* 1 .. COMPRESS_FACTORS_MAX_SAMPLES */
    st_dtype dtype;  /* F32 or F16 */
} compress_factors;

/* Adds f's tensors and samples metadata to w. F16 copies are made into
 * *scratch, which the caller frees after st_writer_finish (NULL for F32). */
int compress_factors_write(st_writer *w, const compress_factors *f, void **scratch,
                           vl_error *err) VL_MUST_CHECK;

/* Appends a merged-factors file: metadata "format" COMPRESS_FACTORS_FORMAT,
 * "run", "version" (the version they were merged into) and f. */
int compress_factors_encode_file(const compress_factors *f, const char *run, int64_t version,
                                 vl_buf *out, vl_error *err) VL_MUST_CHECK;

/* 1 when the file holds any tensor whose name starts with "kfac.". */
int compress_factors_present(const st_file *f);

/* Factors as a parsed file holds them: A[i], G[i] point at its tensors
 * (valid while the file is), scale at the F16 scales (NULL for F32). */
typedef struct compress_factors_view {
    int n;
    const st_tensor **A, **G; /* one allocation, owned */
    const st_tensor *scale;
    int64_t samples;
} compress_factors_view;

/* Checks the factor tensors of f against the n layers a run's model has:
 * the samples metadata; for every layer both tensors, of its shape; one
 * dtype, F32 or F16 (with its scales, finite and positive); no other
 * "kfac." tensor; every value finite; diagonals >= 0; symmetric and within
 * the Cauchy-Schwarz bound of a positive semi-definite matrix (to 1 % of
 * sqrt(f_ii f_jj)); and A's last entry 1, the bias input's square.
 * Returns VL_EINVAL for bad layers or metadata, VL_ERANGE (*code
 * "bad_factors", may be NULL) for tensors that do not fit, VL_ENOMEM; out
 * is empty on failure (compress_factors_view_free after success). */
int compress_factors_decode(const st_file *f, const compress_factor_layer *layers, int n,
                            compress_factors_view *out, const char **code,
                            vl_error *err) VL_MUST_CHECK;
void compress_factors_view_free(compress_factors_view *v);

/* Layer i's A (which 0) or G (which 1) as floats into dst (n entries, its
 * size), scaled back for F16. */
int compress_factors_values(const compress_factors_view *v, int i, int which, float *dst, size_t n,
                            vl_error *err) VL_MUST_CHECK;

/* The coordinator's running weighted sum of peers' factors, in double, for
 * their weighted mean Σ wₖ Fₖ / Σ wₖ. */
typedef struct compress_factors_sum {
    const compress_factor_layer *layers; /* borrowed */
    int n, count;                        /* layers; factor sets added */
    size_t total;                        /* floats of all the matrices */
    double *sum;                         /* owned */
    float *scratch;                      /* owned: conversions, then the mean */
    double weight;                       /* Σ wₖ */
    int64_t samples;                     /* Σ samples, capped at COMPRESS_FACTORS_MAX_SAMPLES */
} compress_factors_sum;

int compress_factors_sum_init(compress_factors_sum *s, const compress_factor_layer *layers, int n,
                              vl_error *err) VL_MUST_CHECK;
void compress_factors_sum_free(compress_factors_sum *s);
/* Adds w (finite, > 0) times the factors of v, which must have s's layers
 * (as decoded against them). */
int compress_factors_sum_add(compress_factors_sum *s, const compress_factors_view *v, double w,
                             vl_error *err) VL_MUST_CHECK;
/* Points A[i] and G[i] (n each, caller's arrays) at the weighted mean,
 * held in s until the next add or free. VL_EINVAL when nothing was added. */
int compress_factors_sum_mean(compress_factors_sum *s, const float **A, const float **G,
                              vl_error *err) VL_MUST_CHECK;

/* ---- second-round messages (values.c) ------------------------------------- */

/* Who a second-round message is about. */
typedef struct compress_round_meta {
    char run[64];
    int64_t version;  /* the round's version (the updates' base version) */
    int64_t task;     /* values: the task whose update they belong to */
    int64_t peer;     /* values: the reporting peer */
    int64_t deadline; /* candidates: when the round stops waiting, unix s */
} compress_round_meta;

/* Appends the candidates file: metadata run, version, deadline and n
 * ascending U32 `indices`. */
int compress_round_encode_candidates(const compress_round_meta *meta, const uint32_t *idx, size_t n,
                                     vl_buf *out, vl_error *err) VL_MUST_CHECK;
/* Parses a candidates file for a model of n_params parameters: *idx gets
 * a heap copy of the indices (caller frees), strictly ascending and each
 * below n_params, else VL_EINVAL. */
int compress_round_decode_candidates(const uint8_t *bytes, size_t len, size_t n_params,
                                     compress_round_meta *meta, uint32_t **idx, size_t *n,
                                     vl_error *err) VL_MUST_CHECK;
/* Appends the values file: metadata run, version, task, peer and n F32
 * `values`, one per candidate in the candidates' order. */
int compress_round_encode_values(const compress_round_meta *meta, const float *vals, size_t n,
                                 vl_buf *out, vl_error *err) VL_MUST_CHECK;
/* The same with `values` stored as dtype (F32 or F16, VL_EINVAL else). */
int compress_round_encode_values_as(const compress_round_meta *meta, const float *vals, size_t n,
                                    st_dtype dtype, vl_buf *out, vl_error *err) VL_MUST_CHECK;
/* Parses a values file into meta and *vals (a heap copy, caller frees) of
 * *n values. VL_EINVAL (HTTP 400) for a malformed file or metadata;
 * VL_ERANGE (HTTP 422) when it is well formed but `values` is not F32 or
 * F16 with want_n entries ("bad_shape"; F16 is converted), holds NaN/Inf ("non_finite") or a value
 * over COMPRESS_MAX_ABS in magnitude ("out_of_bounds"), with the code in
 * *code (may be NULL); meta is filled in for both. */
int compress_round_decode_values(const uint8_t *bytes, size_t len, size_t want_n,
                                 compress_round_meta *meta, float **vals, size_t *n,
                                 const char **code, vl_error *err) VL_MUST_CHECK;

/* What a run accepts (from its compression configuration). */
typedef struct compress_spec {
    compress_kind kind;
    size_t max_nnz;      /* topk: most entries (gaussk may send 5 % over k) */
    uint32_t rows, cols; /* sketch */
    uint64_t seed;       /* sketch */
} compress_spec;

/* Checks a decoded update against the run: kind, sketch seed and shape,
 * entry count. VL_ERANGE with *code "wrong_kind", "wrong_sketch" or
 * "too_many_entries". */
int compress_update_check_spec(const compress_update *u, const compress_spec *spec,
                               const char **code, vl_error *err) VL_MUST_CHECK;

/* dst[i] += w * delta[i] for the update's values (converting F16): the
 * whole vector for dense, the listed coordinates for topk. n is the model
 * size. VL_EINVAL for a sketch update or a size mismatch. */
int compress_update_accumulate(const compress_update *u, float w, float *dst, size_t n,
                               vl_error *err) VL_MUST_CHECK;
/* s->table += w * the update's table; VL_EINVAL unless the update is a
 * sketch of s's seed and shape. */
int compress_update_accumulate_sketch(const compress_update *u, float w, compress_sketch *s,
                                      vl_error *err) VL_MUST_CHECK;

/* How many values an update carries: its entries (dense: n_params; topk:
 * nnz) or, for a sketch, its rows * cols cells. */
size_t compress_update_count(const compress_update *u);
/* The update's values as F32 (F16 converted) into val, compress_update_count
 * of them in order: the delta, the topk values, or the sketch table row by
 * row; for topk its indices go to idx too (idx may be NULL otherwise). */
void compress_update_values(const compress_update *u, uint32_t *idx, float *val);
/* The Euclidean norm of the update's pseudo-gradient, in double: of the
 * delta or of the topk values; for a sketch the table's Frobenius norm over
 * sqrt(rows), which estimates ||delta|| because each row of a Count Sketch
 * keeps the squared norm in expectation. Finite for every valid update:
 * FLT_MAX squared is about 1e77, far inside double's range even summed over
 * 2^32 values. */
double compress_update_norm(const compress_update *u);

/* n floats as F32 (*data = x, *half NULL) or F16 (*data = *half, a
 * converted copy the caller frees); *nbytes their size. VL_EINVAL for
 * another dtype, VL_ENOMEM. */
int compress_as_dtype(const float *x, size_t n, st_dtype dtype, uint16_t **half, const void **data,
                      size_t *nbytes, vl_error *err) VL_MUST_CHECK;

/* delta[i] = base[i] - local[i]. */
void compress_dense_delta(const float *base, const float *local, float *delta, size_t n);

/* 1 when all n values are finite. */
int compress_all_finite(const float *x, size_t n);

/* 1 when the nnz indices are strictly ascending and below d. */
int compress_indices_valid(const uint32_t *idx, size_t nnz, size_t d);

#endif
