/* The Sketched-SGD second round on top of the FetchSGD server state: once
 * the round's peers have reported their exact updates at the candidate
 * coordinates, the values applied no longer carry this round's collision
 * noise. Candidates number P*k, a few thousand to a few hundred thousand,
 * so per-coordinate hashing here is cheap next to a pass over d. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"

/* Median over rows, the same arithmetic as the block median of
 * compress_sketch_estimate (a full sort of R values, then the middle one
 * or the mean of the two middle ones), so both give the same bits. */
static float median_of(float *t, uint32_t R) {
    for (uint32_t a = 1; a < R; a++) {
        float x = t[a];
        uint32_t b = a;
        for (; b > 0 && t[b - 1] > x; b--) t[b] = t[b - 1];
        t[b] = x;
    }
    return (R & 1) ? t[R / 2] : 0.5f * (t[R / 2 - 1] + t[R / 2]);
}

void compress_sketch_estimate_at(const compress_sketch *s, const uint32_t *idx, size_t n,
                                 float *out) {
    for (size_t t = 0; t < n; t++) {
        float v[COMPRESS_SKETCH_MAX_ROWS] = {0};
        for (uint32_t j = 0; j < s->rows; j++) {
            uint32_t b;
            int sg;
            compress_sketch_hash(s->seed, j, s->cols, idx[t], &b, &sg);
            v[j] = (float)sg * s->table[(size_t)j * s->cols + b];
        }
        out[t] = median_of(v, s->rows);
    }
}

int compress_fetchsgd_exact(compress_sketch *V, compress_sketch *E, const compress_sketch *S,
                            double lr, double mu, const uint32_t *cand, const float *exact,
                            size_t n_cand, size_t k, uint32_t *idx, float *val, size_t *nnz,
                            vl_error *err) {
    *nnz = 0;
    if (!compress_sketch_same_shape(V, E) || !compress_sketch_same_shape(V, S) || V == E ||
        S == V || S == E)
        return vl_fail(err, VL_EINVAL, "second round: momentum, error and round sketches must "
                                       "be distinct and share seed and shape");
    if (!isfinite(lr) || !isfinite(mu))
        return vl_fail(err, VL_EINVAL, "second round: learning rate and momentum must be finite");
    if (n_cand == 0) return VL_OK;
    size_t cells = (size_t)E->rows * E->cols;
    compress_sketch old = *E;
    old.table = malloc(cells * sizeof(float));
    if (!old.table)
        return vl_fail(err, VL_ENOMEM, "second round: out of memory for a %u x %u sketch",
                       E->rows, E->cols);
    /* What E held before this round (plus its share of the old momentum):
     * E - c*S, cell by cell. */
    float c = (float)(lr * (1.0 + mu));
    for (size_t i = 0; i < cells; i++) old.table[i] = E->table[i] - c * S->table[i];
    compress_sketch_estimate_at(&old, cand, n_cand, val);
    free(old.table);
    memcpy(idx, cand, n_cand * sizeof *idx);
    for (size_t t = 0; t < n_cand; t++) val[t] += c * exact[t];
    int rc = compress_select_exact(idx, val, n_cand, k, nnz, err);
    if (rc) return rc;
    compress_sketch_zero_coords(E, idx, *nnz);
    compress_sketch_zero_coords(V, idx, *nnz);
    return VL_OK;
}
