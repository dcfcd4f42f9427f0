/* Turning a task's delta into the update the run asked for. topk and
 * gaussk keep an error-feedback residual across tasks, so coordinates that
 * were not sent this time are sent later instead of being lost (faded by
 * the run's decay, when it has one); a sketch
 * needs no state on the peer (the coordinator keeps it, FetchSGD). */
#include <stdlib.h>
#include <string.h>

#include "peer/peer.h"

/* Makes sure the residual and the selection buffers exist for n
 * parameters and k entries. The residual starts at zero and lives as long
 * as the model's shape does. */
static int ensure_feedback(peer_trainer *t, size_t k, vl_error *err) {
    if (!t->residual) {
        t->residual = calloc(t->n_params ? t->n_params : 1, sizeof *t->residual);
        if (!t->residual) return vl_fail(err, VL_ENOMEM, "out of memory for the residual");
    }
    if (t->sel_cap < k) {
        uint32_t *idx = malloc(k * sizeof *idx);
        float *val = malloc(k * sizeof *val);
        if (!idx || !val) {
            free(idx);
            free(val);
            return vl_fail(err, VL_ENOMEM, "out of memory selecting %zu entries", k);
        }
        free(t->sel_idx);
        free(t->sel_val);
        t->sel_idx = idx;
        t->sel_val = val;
        t->sel_cap = k;
    }
    return VL_OK;
}

int peer_encode_update(peer_trainer *t, const peer_task *k, const compress_update_meta *m,
                       buf *out, vl_error *err) {
    size_t n = t->n_params;
    t->sel_nnz = 0;
    switch (k->method) {
    case PEER_METHOD_NONE:
        return compress_update_encode_dense(m, t->delta, n, k->dtype, out, err);
    case PEER_METHOD_SKETCH: {
        compress_sketch s;
        int rc = compress_sketch_init(&s, k->comp_rows, k->comp_cols, k->comp_seed, err);
        if (rc) return rc;
        compress_sketch_encode(&s, t->delta, n);
        rc = compress_update_encode_sketch(m, &s, k->dtype, out, err);
        compress_sketch_free(&s);
        return rc;
    }
    case PEER_METHOD_TOPK:
    case PEER_METHOD_GAUSSK: {
        size_t want = (size_t)k->comp_k;
        if (want > n) return vl_fail(err, VL_EINVAL, "k %zu exceeds the model's %zu", want, n);
        size_t cap = k->method == PEER_METHOD_GAUSSK ? COMPRESS_GAUSSK_CAP(want) : want;
        int rc = ensure_feedback(t, cap, err);
        if (rc) return rc;
        compress_feedback_add(t->residual, t->delta, n, k->comp_decay);
        size_t nnz = 0;
        rc = k->method == PEER_METHOD_TOPK
                 ? compress_topk_blocks(t->residual, n, want, (size_t)k->comp_block, t->sel_idx,
                                        &nnz, err)
                 : compress_gaussk(t->residual, n, want, t->sel_idx, &nnz, NULL, err);
        if (rc) {
            /* The delta stays in the residual: nothing of it is lost. */
            return rc;
        }
        compress_feedback_take(t->residual, t->sel_idx, nnz, k->dtype, t->sel_val);
        t->sel_nnz = nnz;
        return compress_update_encode_topk(m, t->sel_idx, t->sel_val, nnz, k->dtype, out, err);
    }
    }
    return vl_fail(err, VL_EINVAL, "unknown compression method");
}

void peer_encode_unsent(peer_trainer *t) {
    if (!t->residual) return;
    for (size_t j = 0; j < t->sel_nnz; j++) t->residual[t->sel_idx[j]] += t->sel_val[j];
    t->sel_nnz = 0;
}
