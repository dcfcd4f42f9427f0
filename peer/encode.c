/* Turning a task's delta into the update the run asked for. topk and
 * gaussk keep an error-feedback residual across tasks, so coordinates that
 * were not sent this time are sent later instead of being lost (faded by
 * the run's decay, when it has one); a sketch
 * needs no state on the peer (the coordinator keeps it, FetchSGD). When
 * the task trained on the GPU the compression runs there too
 * (gpu_encode.c), with the host as the fallback. */
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

/* The GPU could not compress: the host has the delta and its residual as
 * they were, so it does. Under --device auto the trainer also leaves the
 * GPU for good, as it does when training fails there; under --device cuda
 * the next task finds out whether the GPU still works. */
static void gpu_encode_failed(peer_trainer *t, const vl_error *e) {
    vl_log_warn("GPU: %s; compressing this update on the CPU", e->msg);
    if (t->gpu_fallback) {
        t->device = PEER_DEVICE_CPU;
        peer_gpu_free(t);
    }
}

static int encode_sketch(peer_trainer *t, const peer_task *k, const compress_update_meta *m,
                         vl_buf *out, vl_error *err) {
    compress_sketch s;
    int rc = compress_sketch_init(&s, k->comp_rows, k->comp_cols, k->comp_seed, err);
    if (rc) return rc;
    vl_error e = {0};
    if (!peer_gpu_has_delta(t) || peer_gpu_sketch(t, &s, &e) != VL_OK) {
        if (peer_gpu_has_delta(t)) gpu_encode_failed(t, &e);
        memset(s.table, 0, (size_t)s.rows * s.cols * sizeof *s.table);
        compress_sketch_encode(&s, t->delta, t->n_params);
    }
    rc = compress_update_encode_sketch(m, &s, k->dtype, out, err);
    compress_sketch_free(&s);
    return rc;
}

/* The selection on the GPU when the task's delta is there and the method
 * fits the GPU path (0 with *nnz set), else -1 for the host to do it. */
static int gpu_select(peer_trainer *t, const peer_task *k, size_t *nnz) {
    if (!peer_gpu_has_delta(t)) return -1;
    if (k->method == PEER_METHOD_TOPK &&
        compress_blocks_count(t->n_params, (size_t)k->comp_k, (size_t)k->comp_block) >
            PEER_GPU_MAX_BLOCKS)
        return -1;
    vl_error e = {0};
    if (peer_gpu_select(t, k, nnz, &e) == VL_OK) return 0;
    gpu_encode_failed(t, &e);
    return -1;
}

int peer_encode_update(peer_trainer *t, const peer_task *k, const compress_update_meta *m,
                       vl_buf *out, vl_error *err) {
    size_t n = t->n_params;
    t->sel_nnz = 0;
    switch (k->method) {
    case PEER_METHOD_NONE: return compress_update_encode_dense(m, t->delta, n, k->dtype, out, err);
    case PEER_METHOD_SKETCH: return encode_sketch(t, k, m, out, err);
    case PEER_METHOD_TOPK:
    case PEER_METHOD_GAUSSK: {
        size_t want = (size_t)k->comp_k;
        if (want > n) return vl_fail(err, VL_EINVAL, "k %zu exceeds the model's %zu", want, n);
        size_t cap = k->method == PEER_METHOD_GAUSSK ? COMPRESS_GAUSSK_CAP(want) : want;
        int rc = ensure_feedback(t, cap, err);
        if (rc) return rc;
        size_t nnz = 0;
        if (gpu_select(t, k, &nnz) != 0) {
            compress_feedback_add(t->residual, t->delta, n, k->comp_decay);
            rc = k->method == PEER_METHOD_TOPK
                     ? compress_topk_blocks(t->residual, n, want, (size_t)k->comp_block, t->sel_idx,
                                            &nnz, err)
                     : compress_gaussk(t->residual, n, want, t->sel_idx, &nnz, NULL, err);
            if (rc) {
                /* The delta stays in the residual: nothing of it is lost. */
                return rc;
            }
            compress_feedback_take(t->residual, t->sel_idx, nnz, k->dtype, t->sel_val);
        }
        t->sel_nnz = nnz;
        return compress_update_encode_topk(m, t->sel_idx, t->sel_val, nnz, k->dtype, out, err);
    }
    }
    return vl_fail(err, VL_EINVAL, "unknown compression method");
}

void peer_encode_drop(peer_trainer *t, int all) {
    if (t->residual && all) memset(t->residual, 0, t->n_params * sizeof *t->residual);
    t->sel_nnz = 0;
}

void peer_encode_unsent(peer_trainer *t) {
    if (!t->residual) return;
    for (size_t j = 0; j < t->sel_nnz; j++) t->residual[t->sel_idx[j]] += t->sel_val[j];
    t->sel_nnz = 0;
}
