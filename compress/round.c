/* The Sketched-SGD second round: the sketch of what has not been applied
 * names the candidates, the round's peers report their exact updates
 * there, and only those exact values are applied, so collision noise
 * never reaches the model. Candidates number P*k, a few thousand to a few
 * hundred thousand, so per-coordinate hashing here is cheap next to a
 * pass over d. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"

int compress_round_take(compress_sketch *E, const uint32_t *cand, const float *exact, size_t n_cand,
                        float *age, size_t d, float max_gap, size_t k, uint32_t *idx, float *val,
                        size_t *nnz, vl_error *err) {
    *nnz = 0;
    if (!compress_indices_valid(cand, n_cand, d))
        return vl_fail(err, VL_EINVAL, "second round: candidates must ascend strictly below %zu",
                       d);
    if (!(max_gap >= 1.0f) || !isfinite(max_gap))
        return vl_fail(err, VL_EINVAL, "second round: the longest gap must be at least 1");
    memcpy(idx, cand, n_cand * sizeof *idx);
    /* A coordinate last taken g versions ago has missed g - 1 updates that
     * only the sketch saw: they are taken to have been like this one,
     * which is what carries the movement of coordinates that are rarely
     * candidates without ever applying a collision estimate. */
    for (size_t t = 0; t < n_cand; t++) {
        float g = age[cand[t]] + 1.0f;
        val[t] = exact[t] * (g < max_gap ? g : max_gap);
    }
    int rc = compress_select_exact(idx, val, n_cand, k, nnz, err);
    if (rc) return rc;
    /* What is applied leaves E as its sketch, linearly: the rest of the
     * cells' mass stays for the coordinates that are not taken. */
    compress_sketch_encode_sparse(E, idx, val, *nnz, -1.0f);
    for (size_t i = 0; i < d; i++) age[i] += 1.0f;
    for (size_t t = 0; t < *nnz; t++) age[idx[t]] = 0.0f;
    return VL_OK;
}

int compress_round_candidates(const compress_sketch *E, const float *age, size_t d, size_t k,
                              float *scratch, uint32_t *idx, size_t *nnz, vl_error *err) {
    *nnz = 0;
    if (d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "second round: %zu coordinates; indices are 32-bit", d);
    if (d == 0 || k == 0) return VL_OK;
    compress_sketch_estimate(E, d, scratch);
    float sigma = (float)compress_sketch_noise(scratch, d);
    for (size_t i = 0; i < d; i++) {
        float a = fabsf(scratch[i]);
        scratch[i] = (a > sigma ? a : sigma) * (age[i] + 1.0f);
    }
    return compress_topk(scratch, d, k, idx, nnz, err);
}
