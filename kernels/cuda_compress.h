/*
 * cuda_compress: the compressors of compress/ and the NoPeek distance
 * correlation of kernels/dcor.h on a CUDA device, for peers that train on
 * a GPU and would otherwise copy every pseudo-gradient back to the host to
 * compress it. Each kernel gives what its CPU counterpart gives:
 *  - Count Sketch encode and estimate use the hash and median of
 *    compress/sketch_hash.h, the same code the CPU compiles, so buckets,
 *    signs and estimates are bit-identical. Encode adds with atomics, so
 *    its float sums come in no fixed order: a cell equals the CPU's up to
 *    rounding (exactly, when the sums are exact, as for small integers).
 *  - Exact top-k returns the CPU's index set (ties to the lower index),
 *    in ascending order.
 *  - Gaussian-k keeps the CPU's contract (count within +-5 % of k, every
 *    |x| >= the threshold, ascending) from the same model threshold, but
 *    refines it by an exact select rather than the CPU's probing, so the
 *    two can differ where the model misses the band.
 *  - Sparse gather/scatter and error feedback are element-wise and
 *    bit-identical to the CPU (no fused multiply-add).
 *  - dCor follows kernels_dcor's order of summation in double.
 *
 * Conventions: pointers named d_* are device memory, owned by the caller;
 * everything else is host memory. Every function runs on the legacy
 * default stream and returns after the device has finished (a failure is
 * reported by the call that caused it, and outputs are ready to read).
 * Scratch device memory comes from a workspace cached per device, which
 * grows to what calls need (up to a cap; a call past it gets memory of its
 * own, freed before it returns), is reused by later calls, and is freed by
 * kernels_cuda_compress_release or, when kernels_cuda_alloc would
 * otherwise fail for lack of memory, by that allocation. It counts towards
 * kernels_cuda_set_mem_cap. Calls from several threads take turns. Return
 * values: 0, VL_EINVAL for bad arguments (nothing written), VL_ENOMEM when
 * device memory runs out, VL_ERR for any other CUDA failure, with the
 * reason in err. The *_host functions copy host arrays in, run the device
 * function and copy the results back, for tests and one-off use.
 *
 * Only in builds with VOLLEY_HAVE_CUDA (library volley_kernels_cuda).
 */
#ifndef VOLLEY_KERNELS_CUDA_COMPRESS_H
#define VOLLEY_KERNELS_CUDA_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/common.h"
#include "compress/compress.h"

#if defined(VOLLEY_HAVE_CUDA)

/* Frees the compressors' cached device workspace on every device (after
 * waiting for each); the next call allocates it again. For a caller that
 * wants the memory back, e.g. before loading a model. */
void kernels_cuda_compress_release(void);

/* Bytes of device memory the cached workspace holds now. */
size_t kernels_cuda_compress_cached(void);

/* ---- Count Sketch ----------------------------------------------------------
 * A device sketch is its table alone: rows * cols floats, row-major, laid
 * out as compress_sketch.table; rows 1..COMPRESS_SKETCH_MAX_ROWS, cols >= 1
 * and rows * cols <= COMPRESS_SKETCH_MAX_CELLS, else VL_EINVAL. */

/* d_table += S(d_x) for the d values of d_x (coordinates 0..d-1). */
int kernels_cuda_sketch_encode(float *d_table, uint32_t rows, uint32_t cols, uint64_t seed,
                               const float *d_x, size_t d, vl_error *err) VL_MUST_CHECK;
/* s->table += S(x), s and x on the host. */
int kernels_cuda_sketch_encode_host(compress_sketch *s, const float *x, size_t d,
                                    vl_error *err) VL_MUST_CHECK;

/* d_out[i] = median over rows of sign * cell, i < d, as
 * compress_sketch_estimate (bit for bit). */
int kernels_cuda_sketch_estimate(const float *d_table, uint32_t rows, uint32_t cols, uint64_t seed,
                                 size_t d, float *d_out, vl_error *err) VL_MUST_CHECK;
int kernels_cuda_sketch_estimate_host(const compress_sketch *s, size_t d, float *out,
                                      vl_error *err) VL_MUST_CHECK;

/* Heavy hitters as compress_sketch_heavy: the min(k, d) coordinates of
 * largest |estimate| (ties to the lower index), ascending in d_idx, their
 * estimates in d_val (room for min(k, d) each). d_scratch: d floats, left
 * holding the estimates. d <= UINT32_MAX. *nnz (host) gets the count. */
int kernels_cuda_sketch_heavy(const float *d_table, uint32_t rows, uint32_t cols, uint64_t seed,
                              size_t d, size_t k, float *d_scratch, uint32_t *d_idx, float *d_val,
                              size_t *nnz, vl_error *err) VL_MUST_CHECK;
int kernels_cuda_sketch_heavy_host(const compress_sketch *s, size_t d, size_t k, uint32_t *idx,
                                   float *val, size_t *nnz, vl_error *err) VL_MUST_CHECK;

/* The hash as the device computes it, for checking it against the CPU:
 * for row j and coordinate coords[t], bucket[j*n + t] and sign[j*n + t]
 * (+1/-1). Host arrays: coords n, bucket and sign rows * n. */
int kernels_cuda_sketch_hash_host(uint64_t seed, uint32_t rows, uint32_t cols,
                                  const uint64_t *coords, size_t n, uint32_t *bucket, int8_t *sign,
                                  vl_error *err) VL_MUST_CHECK;

/* ---- selection ---------------------------------------------------------------- */

/* Exact top-k by |x| as compress_topk: the min(k, d) coordinates of
 * largest |x| (on the sign-cleared bits, so NaN ranks above Inf), ties to
 * the lower index, ascending in d_idx (room for min(k, d)); *nnz (host)
 * gets the count. A radix select: one histogram pass over d_x, one pass
 * that copies out the candidates when they are few, the rest on them.
 * d <= UINT32_MAX. */
int kernels_cuda_topk(const float *d_x, size_t d, size_t k, uint32_t *d_idx, size_t *nnz,
                      vl_error *err) VL_MUST_CHECK;
int kernels_cuda_topk_host(const float *x, size_t d, size_t k, uint32_t *idx, size_t *nnz,
                           vl_error *err) VL_MUST_CHECK;

/* Gaussian-k with compress_gaussk's contract: thr0 = |mean| + std *
 * compress_gaussk_z(k/d) from the exact moments; when the count of
 * |x| >= thr0 is within k +- k/20 those are the answer, else the threshold
 * moves to the k-th largest |x| (or the next value up when ties there
 * overshoot the band; or, when ties straddle the whole band, exactly the
 * top k). Indices ascending in d_idx (room for COMPRESS_GAUSSK_CAP(k));
 * the threshold to *thr (host, may be NULL); *nnz (host) the count.
 * d <= UINT32_MAX; values finite. */
int kernels_cuda_gaussk(const float *d_x, size_t d, size_t k, uint32_t *d_idx, size_t *nnz,
                        double *thr, vl_error *err) VL_MUST_CHECK;
int kernels_cuda_gaussk_host(const float *x, size_t d, size_t k, uint32_t *idx, size_t *nnz,
                             double *thr, vl_error *err) VL_MUST_CHECK;

/* ---- sparse vectors and error feedback ------------------------------------------
 * Index lists are checked on the device before anything is written:
 * VL_EINVAL for an index >= d (and, where noted, for indices that are not
 * strictly ascending, which the writes need to be free of races), and
 * then nothing is written. The check runs on the device ahead of the
 * write, without a wait in between; the call's one wait, at its end, also
 * fetches the verdict. */

/* d_val[j] = d_x[d_idx[j]], j < nnz; any order of indices below d. */
int kernels_cuda_sparse_gather(const float *d_x, size_t d, const uint32_t *d_idx, size_t nnz,
                               float *d_val, vl_error *err) VL_MUST_CHECK;
int kernels_cuda_sparse_gather_host(const float *x, size_t d, const uint32_t *idx, size_t nnz,
                                    float *val, vl_error *err) VL_MUST_CHECK;

/* d_dst[d_idx[j]] += w * d_val[j], as compress_update_accumulate does for
 * a sparse update; indices strictly ascending. */
int kernels_cuda_sparse_scatter_add(float *d_dst, size_t d, const uint32_t *d_idx,
                                    const float *d_val, size_t nnz, float w,
                                    vl_error *err) VL_MUST_CHECK;
int kernels_cuda_sparse_scatter_add_host(float *dst, size_t d, const uint32_t *idx,
                                         const float *val, size_t nnz, float w,
                                         vl_error *err) VL_MUST_CHECK;

/* compress_feedback_add on the device: d_e = decay * d_e + d_delta. */
int kernels_cuda_feedback_add(float *d_e, const float *d_delta, size_t d, float decay,
                              vl_error *err) VL_MUST_CHECK;
int kernels_cuda_feedback_add_host(float *e, const float *delta, size_t d, float decay,
                                   vl_error *err) VL_MUST_CHECK;

/* compress_feedback_take on the device: d_val[j] = d_e[d_idx[j]] rounded to
 * dtype (ST_F32 or ST_F16, clamped to its finite range) and subtracted
 * from d_e; indices strictly ascending. VL_EINVAL for another dtype. For
 * finite e the results equal the CPU's bit for bit. */
int kernels_cuda_feedback_take(float *d_e, size_t d, const uint32_t *d_idx, size_t nnz,
                               st_dtype dtype, float *d_val, vl_error *err) VL_MUST_CHECK;
int kernels_cuda_feedback_take_host(float *e, size_t d, const uint32_t *idx, size_t nnz,
                                    st_dtype dtype, float *val, vl_error *err) VL_MUST_CHECK;

/* ---- distance correlation (NoPeek) -------------------------------------------- */

/* kernels_dcor on the device: *dcor (host) = dCor(X, Z) for d_X [n,p],
 * d_Z [n,q]; when d_dZ is non-NULL, ADDS alpha * d dCor / dZ into
 * d_dZ[n,q]. d_scratch: kernels_dcor_scratch_doubles(n) doubles. VL_EINVAL
 * for n outside 2..KERNELS_DCOR_MAX_N or p, q < 1. */
int kernels_cuda_dcor(float *d_dZ, const float *d_X, const float *d_Z, int n, int p, int q,
                      float alpha, double *d_scratch, double *dcor, vl_error *err) VL_MUST_CHECK;
int kernels_cuda_dcor_host(float *dZ, const float *X, const float *Z, int n, int p, int q,
                           float alpha, double *dcor, vl_error *err) VL_MUST_CHECK;

#endif /* VOLLEY_HAVE_CUDA */

#ifdef __cplusplus
}
#endif

#endif
