/* Compressing a GPU task's update where its delta already is.
 *
 * The host still gets the trained parameters (and so the delta) at the end
 * of every task, for trainer.st and FetchSGD's second round, but the work
 * of compression, sketching every coordinate or selecting the largest,
 * is the device's: on a volunteer's few CPU cores it would take as long as
 * many training steps. The residual of top-k and Gaussian-k is the host's
 * (trainer.st keeps it), so it travels up and back; a sketch needs none
 * and only its table comes back. */
#include <stdlib.h>
#include <string.h>

#include "peer/peer.h"

#if defined(VOLLEY_HAVE_CUDA)
#include "kernels/cuda_compress.h"
#include "kernels/cuda_model.h"

int peer_gpu_sketch(peer_trainer *t, compress_sketch *s, vl_error *err) {
    if (!peer_gpu_has_delta(t)) return vl_fail(err, VL_EINVAL, "no task's delta on the GPU");
    size_t cells = (size_t)s->rows * s->cols;
    float *d_table = NULL;
    int rc = kernels_cuda_alloc((void **)&d_table, cells * sizeof(float), err);
    if (!rc) rc = kernels_cuda_zero(d_table, cells * sizeof(float), err);
    if (!rc)
        rc = kernels_cuda_sketch_encode(d_table, s->rows, s->cols, s->seed,
                                        t->gpu_vec + t->n_params, t->n_params, err);
    if (!rc) rc = kernels_cuda_download(s->table, d_table, cells * sizeof(float), err);
    kernels_cuda_free(d_table);
    return rc;
}

/* Block top-k as compress_topk_blocks, one exact select per slice; the
 * slices' indices come to idx (host) made absolute. d_idx has room for
 * want. */
static int topk_blocks(const float *d_x, size_t n, size_t want, size_t nb, uint32_t *d_idx,
                       uint32_t *idx, size_t *nnz, vl_error *err) {
    if (nb <= 1) {
        int rc = kernels_cuda_topk(d_x, n, want, d_idx, nnz, err);
        return rc ? rc : kernels_cuda_download(idx, d_idx, *nnz * sizeof *idx, err);
    }
    for (size_t b = 0; b < nb; b++) {
        size_t lo, len, share, at, got = 0;
        compress_blocks_span(n, want, nb, b, &lo, &len, &share, &at);
        int rc = kernels_cuda_topk(d_x + lo, len, share, d_idx + at, &got, err);
        if (!rc && got != share)
            rc = vl_fail(err, VL_ERR, "block %zu gave %zu entries, not %zu", b, got, share);
        if (!rc) rc = kernels_cuda_download(idx + at, d_idx + at, got * sizeof *idx, err);
        if (rc) return rc;
        for (size_t j = 0; j < got; j++) idx[at + j] += (uint32_t)lo;
    }
    *nnz = want;
    /* feedback_take reads the absolute indices on the device. */
    return kernels_cuda_upload(d_idx, idx, want * sizeof *idx, err);
}

int peer_gpu_select(peer_trainer *t, const peer_task *k, size_t *nnz, vl_error *err) {
    if (!peer_gpu_has_delta(t)) return vl_fail(err, VL_EINVAL, "no task's delta on the GPU");
    size_t n = t->n_params, want = (size_t)k->comp_k;
    int gaussk = k->method == PEER_METHOD_GAUSSK;
    if (!gaussk && k->method != PEER_METHOD_TOPK)
        return vl_fail(err, VL_EINVAL, "not a selection method");
    size_t nb = gaussk ? 1 : compress_blocks_count(n, want, (size_t)k->comp_block);
    if (nb > PEER_GPU_MAX_BLOCKS)
        return vl_fail(err, VL_EINVAL, "%zu top-k blocks are more than the GPU path takes", nb);
    size_t cap = gaussk ? COMPRESS_GAUSSK_CAP(want) : want;
    if (!t->residual || t->sel_cap < cap)
        return vl_fail(err, VL_EINVAL, "no residual or selection buffers");
    /* The new residual lands in a buffer of its own, so a failure leaves
     * the host's as it was. */
    float *res = malloc(n * sizeof *res);
    if (!res) return vl_fail(err, VL_ENOMEM, "out of memory for the residual");
    float *d_res = t->gpu_vec, *d_delta = t->gpu_vec + n, *d_val = NULL;
    uint32_t *d_idx = NULL;
    size_t got = 0;
    int rc = kernels_cuda_alloc((void **)&d_idx, cap * sizeof *d_idx, err);
    if (!rc) rc = kernels_cuda_alloc((void **)&d_val, cap * sizeof *d_val, err);
    if (!rc) rc = kernels_cuda_upload(d_res, t->residual, n * sizeof *d_res, err);
    if (!rc) rc = kernels_cuda_feedback_add(d_res, d_delta, n, k->comp_decay, err);
    if (!rc && gaussk) {
        rc = kernels_cuda_gaussk(d_res, n, want, d_idx, &got, NULL, err);
        if (!rc) rc = kernels_cuda_download(t->sel_idx, d_idx, got * sizeof *d_idx, err);
    } else if (!rc) {
        rc = topk_blocks(d_res, n, want, nb, d_idx, t->sel_idx, &got, err);
    }
    if (!rc) rc = kernels_cuda_feedback_take(d_res, n, d_idx, got, k->dtype, d_val, err);
    if (!rc) rc = kernels_cuda_download(t->sel_val, d_val, got * sizeof *d_val, err);
    if (!rc) rc = kernels_cuda_download(res, d_res, n * sizeof *res, err);
    kernels_cuda_free(d_idx);
    kernels_cuda_free(d_val);
    if (rc) {
        free(res);
        return rc;
    }
    free(t->residual);
    t->residual = res;
    *nnz = got;
    return VL_OK;
}

#endif
