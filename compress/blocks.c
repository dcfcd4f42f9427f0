/*
 * Block top-k: the exact top-k of each of a number of equal slices of the
 * vector, with k shared out evenly between them.
 *
 * Why: a peer's pseudo-gradient after many AdamW steps has nearly flat
 * magnitudes, so a global top-k spends its budget on whichever regions
 * of the model hold the largest residual and leaves others unsent for
 * dozens of versions. Giving each slice its share of k keeps every part
 * of the model moving; with error feedback nothing is lost, only
 * reordered. On the demo task this (with a decaying residual) is what
 * lets top-k at 100x less upload match the dense run
 * (docs/results/convergence.md).
 *
 * The split depends only on (d, k, block), so a block's share and its
 * place in the output are known before anything is read: blocks are
 * independent, run in parallel, and write straight to their offsets.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "compress/scan.h"

/* Shares at most this large use the insertion list below; larger ones
 * the radix select of compress_topk. */
#define SMALL_SHARE 32
#define BLOCKS_PAR_MIN ((size_t)1 << 18)

size_t compress_blocks_count(size_t d, size_t k, size_t block) {
    if (d == 0 || k == 0) return 0;
    if (block == 0 || block >= d) return 1;
    size_t nb = (d + block - 1) / block;
    if (nb > k) nb = k;
    /* With d >= k + nb every block is longer than its share (each block
     * holds at least floor(d/nb) >= floor(k/nb) + 1 coordinates and gets at
     * most ceil(k/nb)), so shares never need capping and every block gets
     * at least one entry. Otherwise k is close to d and one block it is. */
    return d >= k + nb ? nb : 1;
}

void compress_blocks_span(size_t d, size_t k, size_t nb, size_t b, size_t *lo, size_t *len,
                          size_t *share, size_t *out_at) {
    /* d < 2^32 (compress_topk_blocks checks), so the products fit. */
    size_t a = (size_t)((uint64_t)d * b / nb);
    size_t z = (size_t)((uint64_t)d * (b + 1) / nb);
    size_t ka = (size_t)((uint64_t)k * b / nb);
    size_t kz = (size_t)((uint64_t)k * (b + 1) / nb);
    *lo = a;
    *len = z - a;
    *share = kz - ka;
    *out_at = ka;
}

/* The m (<= SMALL_SHARE) largest keys of x[0, n), ties to the lower
 * index, as indices ascending (plus off) in out. A short list sorted by
 * key, descending, takes a value only when it beats the smallest kept
 * one strictly, so among equal keys the first seen stays. */
static void small_select(const float *x, size_t n, size_t m, uint32_t off, uint32_t *out) {
    uint32_t key[SMALL_SHARE], pos[SMALL_SHARE];
    size_t have = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = key_at(x, i);
        if (have == m && u <= key[m - 1]) continue;
        size_t j = have < m ? have++ : m - 1;
        while (j > 0 && key[j - 1] < u) {
            key[j] = key[j - 1];
            pos[j] = pos[j - 1];
            j--;
        }
        key[j] = u;
        pos[j] = (uint32_t)i;
    }
    /* Back to index order: insertion sort of at most 32 values. */
    for (size_t a = 1; a < have; a++) {
        uint32_t p = pos[a];
        size_t j = a;
        while (j > 0 && pos[j - 1] > p) {
            pos[j] = pos[j - 1];
            j--;
        }
        pos[j] = p;
    }
    for (size_t a = 0; a < have; a++) out[a] = pos[a] + off;
}

static int one_block(const float *x, size_t d, size_t k, size_t nb, size_t b, uint32_t *idx,
                     vl_error *err) {
    size_t lo, len, share, at;
    compress_blocks_span(d, k, nb, b, &lo, &len, &share, &at);
    if (share == 0) return VL_OK;
    uint32_t *out = idx + at;
    if (share <= SMALL_SHARE) {
        small_select(x + lo, len, share, (uint32_t)lo, out);
        return VL_OK;
    }
    size_t got = 0;
    int rc = compress_topk(x + lo, len, share, out, &got, err);
    if (rc != VL_OK) return rc;
    for (size_t j = 0; j < got; j++) out[j] += (uint32_t)lo;
    return VL_OK;
}

int compress_topk_blocks(const float *x, size_t d, size_t k, size_t block, uint32_t *idx,
                         size_t *nnz, vl_error *err) {
    *nnz = 0;
    if (d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "top-k over %zu values: indices are 32-bit", d);
    size_t nb = compress_blocks_count(d, k, block);
    if (nb <= 1) return compress_topk(x, d, k, idx, nnz, err);
    int rc = VL_OK;
    if (d < BLOCKS_PAR_MIN) {
        for (size_t b = 0; b < nb && rc == VL_OK; b++) rc = one_block(x, d, k, nb, b, idx, err);
    } else {
        int failed = 0;
        vl_error first = {0};
#pragma omp parallel for schedule(dynamic, 64)
        for (size_t b = 0; b < nb; b++) {
            int bad;
#pragma omp atomic read
            bad = failed;
            if (bad) continue;
            vl_error e = {0};
            if (one_block(x, d, k, nb, b, idx, &e) != VL_OK) {
#pragma omp critical(blocks_err)
                if (!failed) {
                    failed = 1;
                    first = e;
                }
            }
        }
        if (failed) rc = vl_fail(err, first.code ? first.code : VL_ENOMEM, "%s", first.msg);
    }
    if (rc == VL_OK) *nnz = k;
    return rc;
}
