/* Data parallelism over the GPUs of one machine: one model_gpt_cuda per
 * device, driven from this thread, and NCCL's all-reduce to sum their
 * gradients. Kept apart from gpt_cuda.c so the single-device model knows
 * nothing of devices other than the current one. */
#include <stdlib.h>

#if defined(VOLLEY_HAVE_NCCL)
#include <nccl.h>
#endif

#include "kernels/cuda_model.h"
#include "kernels/kernels.h"
#include "model/gpt_cuda.h"
#include "model/gpt_cuda_dp.h"
#include "model/gpt_internal.h"
#include "model/model.h"

struct model_gpt_cuda_dp {
    model_gpt_config cfg; /* to check a batch once, before any replica runs */
    int ndev;
    size_t num_params;
    model_gpt_cuda **rep; /* replica r on device r */
#if defined(VOLLEY_HAVE_NCCL)
    ncclComm_t *comms; /* one per device; NULL when ndev == 1 */
    /* Set once a collective failed: the communicators may be stuck, and
     * only ncclCommAbort is sure to come back from them. */
    int comms_broken;
#endif
};

/* Every public function ends here: device 0 becomes current again, and
 * the first error, if any, is the one reported. */
static int leave(int rc, vl_error *err) {
    vl_error spare;
    int rc0 = kernels_cuda_set_device(0, rc != 0 ? &spare : err);
    return rc != 0 ? rc : rc0;
}

/* Rows of a B-row batch that replica r takes, and the first of them. */
static int rows_of(int B, int ndev, int r, int *first) {
    int base = B / ndev, extra = B % ndev;
    *first = r * base + (r < extra ? r : extra);
    return base + (r < extra);
}

#if defined(VOLLEY_HAVE_NCCL)

static int nccl_fail(vl_error *err, ncclResult_t res, const char *what) {
    /* The last error's text names the cause (a transport, a CUDA call)
     * where the result code only gives its class. */
    const char *last = NULL;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
    last = ncclGetLastError(NULL);
#endif
    if (last != NULL && last[0] != '\0')
        return vl_fail(err, VL_ERR, "gpt cuda dp: %s failed: %s (%s)", what,
                       ncclGetErrorString(res), last);
    return vl_fail(err, VL_ERR, "gpt cuda dp: %s failed: %s", what, ncclGetErrorString(res));
}

static void destroy_comms(model_gpt_cuda_dp *dp) {
    if (dp->comms == NULL) return;
    for (int r = 0; r < dp->ndev; r++) {
        if (dp->comms[r] == NULL) continue;
        vl_error ignored;
        if (kernels_cuda_set_device(r, &ignored) == 0) {
            if (dp->comms_broken)
                (void)ncclCommAbort(dp->comms[r]);
            else
                (void)ncclCommDestroy(dp->comms[r]);
        }
    }
    free(dp->comms);
    dp->comms = NULL;
}

static int init_comms(model_gpt_cuda_dp *dp, vl_error *err) {
    dp->comms = calloc((size_t)dp->ndev, sizeof *dp->comms);
    if (dp->comms == NULL) return vl_fail(err, VL_ENOMEM, "gpt cuda dp: out of memory");
    /* A NULL device list means devices 0 .. ndev-1, the replicas'. */
    ncclResult_t res = ncclCommInitAll(dp->comms, dp->ndev, NULL);
    if (res != ncclSuccess) {
        /* Whatever handles it did hand out are in an error state, which
         * only ncclCommAbort releases. */
        dp->comms_broken = 1;
        return nccl_fail(err, res, "ncclCommInitAll");
    }
    return 0;
}

/* Sums the replicas' gradient vectors in place, queued on each device's
 * legacy default stream: the stream the kernels of kernels/cuda_model.h
 * run on, so the sum starts after each replica's backward pass and
 * scaling, and whatever comes next on the device waits for it. */
static int allreduce_grads(model_gpt_cuda_dp *dp, vl_error *err) {
    ncclResult_t res = ncclGroupStart();
    if (res != ncclSuccess) return nccl_fail(err, res, "ncclGroupStart");
    /* Inside a group the calls only record the work; one per device,
     * launched together by ncclGroupEnd, is what keeps a single thread
     * from waiting on device 0's share while device 1's is not yet
     * issued. */
    const char *what = "ncclAllReduce";
    int rc = 0;
    for (int r = 0; r < dp->ndev && rc == 0 && res == ncclSuccess; r++) {
        /* The null stream handle resolves per device: the current one. */
        rc = kernels_cuda_set_device(r, err);
        if (rc == 0) {
            float *g = model_gpt_cuda_grads_device(dp->rep[r]);
            res = ncclAllReduce(g, g, dp->num_params, ncclFloat32, ncclSum, dp->comms[r],
                                (cudaStream_t)0);
        }
    }
    /* A group once started must be ended, even after a failed call. */
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess && end != ncclSuccess) {
        res = end;
        what = "ncclGroupEnd";
    }
    if (rc != 0 || res != ncclSuccess) {
        /* Some devices may have joined a collective the others never
         * will. */
        dp->comms_broken = 1;
        return rc != 0 ? rc : nccl_fail(err, res, what);
    }
    return 0;
}

/* After the devices have finished: a collective can fail without any CUDA
 * error (a peer's transport), which only the communicator records. */
static int check_comms(model_gpt_cuda_dp *dp, vl_error *err) {
    for (int r = 0; r < dp->ndev; r++) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t res = ncclCommGetAsyncError(dp->comms[r], &async);
        if (res == ncclSuccess) res = async;
        if (res != ncclSuccess) {
            dp->comms_broken = 1;
            return nccl_fail(err, res, "the gradient all-reduce");
        }
    }
    return 0;
}

#endif /* VOLLEY_HAVE_NCCL */

void model_gpt_cuda_dp_free(model_gpt_cuda_dp *dp) {
    if (dp == NULL) return;
#if defined(VOLLEY_HAVE_NCCL)
    destroy_comms(dp);
#endif
    if (dp->rep != NULL) {
        for (int r = 0; r < dp->ndev; r++) {
            if (dp->rep[r] == NULL) continue;
            /* Its cuBLAS handle and memory belong to device r. */
            vl_error ignored;
            if (kernels_cuda_set_device(r, &ignored) == 0) model_gpt_cuda_free(dp->rep[r]);
        }
        free(dp->rep);
    }
    free(dp);
    vl_error ignored;
    (void)leave(0, &ignored);
}

int model_gpt_cuda_dp_create(const model_gpt *host, kernels_cuda_math math, int ndev,
                             model_gpt_cuda_dp **out, vl_error *err) {
    if (out == NULL || host == NULL)
        return vl_fail(err, VL_EINVAL, "gpt cuda dp: no model or output pointer");
    *out = NULL;
    int visible = kernels_cuda_device_count();
    if (visible < 1) {
        char why[256];
        kernels_cuda_describe(why, sizeof why);
        return vl_fail(err, VL_ERR, "gpt cuda dp: no usable CUDA device (%s)", why);
    }
#if defined(VOLLEY_HAVE_NCCL)
    if (ndev <= 0) ndev = visible;
#else
    if (ndev <= 0) ndev = 1;
    if (ndev > 1)
        return vl_fail(err, VL_EINVAL,
                       "gpt cuda dp: %d devices asked for, but this build has no NCCL and "
                       "trains on one device only",
                       ndev);
#endif
    if (ndev > visible)
        return vl_fail(err, VL_EINVAL, "gpt cuda dp: %d devices asked for, %d visible", ndev,
                       visible);
    model_gpt_cuda_dp *dp = calloc(1, sizeof *dp);
    if (dp == NULL) return vl_fail(err, VL_ENOMEM, "gpt cuda dp: out of memory");
    dp->cfg = host->cfg;
    dp->ndev = ndev;
    dp->num_params = model_gpt_num_params(host);
    dp->rep = calloc((size_t)ndev, sizeof *dp->rep);
    int rc = dp->rep ? 0 : vl_fail(err, VL_ENOMEM, "gpt cuda dp: out of memory");
    for (int r = 0; r < ndev && rc == 0; r++) {
        rc = kernels_cuda_set_device(r, err);
        if (rc == 0) rc = model_gpt_cuda_create(host, math, &dp->rep[r], err);
    }
#if defined(VOLLEY_HAVE_NCCL)
    if (rc == 0 && ndev > 1) rc = init_comms(dp, err);
#endif
    rc = leave(rc, err);
    if (rc != 0) {
        model_gpt_cuda_dp_free(dp);
        return rc;
    }
    *out = dp;
    return 0;
}

int model_gpt_cuda_dp_devices(const model_gpt_cuda_dp *dp) {
    return dp ? dp->ndev : 0;
}

model_gpt_cuda *model_gpt_cuda_dp_first(model_gpt_cuda_dp *dp) {
    return dp ? dp->rep[0] : NULL;
}

size_t model_gpt_cuda_dp_num_params(const model_gpt_cuda_dp *dp) {
    return dp ? dp->num_params : 0;
}

int model_gpt_cuda_dp_upload_params(model_gpt_cuda_dp *dp, const model_gpt *host, vl_error *err) {
    if (dp == NULL || host == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda dp: no model");
    int rc = 0;
    for (int r = 0; r < dp->ndev && rc == 0; r++) {
        rc = kernels_cuda_set_device(r, err);
        if (rc == 0) rc = model_gpt_cuda_upload_params(dp->rep[r], host, err);
    }
    return leave(rc, err);
}

int model_gpt_cuda_dp_download_params(model_gpt_cuda_dp *dp, model_gpt *host, vl_error *err) {
    if (dp == NULL || host == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda dp: no model");
    int rc = kernels_cuda_set_device(0, err);
    if (rc == 0) rc = model_gpt_cuda_download_params(dp->rep[0], host, err);
    return leave(rc, err);
}

int model_gpt_cuda_dp_download_grads(model_gpt_cuda_dp *dp, float *out, size_t n, vl_error *err) {
    if (dp == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda dp: no model");
    int rc = kernels_cuda_set_device(0, err);
    if (rc == 0) rc = model_gpt_cuda_download_grads(dp->rep[0], out, n, err);
    return leave(rc, err);
}

int model_gpt_cuda_dp_download_replica(model_gpt_cuda_dp *dp, int replica, float *params,
                                       float *grads, size_t n, vl_error *err) {
    if (dp == NULL || (params == NULL && grads == NULL))
        return vl_fail(err, VL_EINVAL, "gpt cuda dp: no model or buffer");
    if (replica < 0 || replica >= dp->ndev)
        return vl_fail(err, VL_EINVAL, "gpt cuda dp: replica %d of %d", replica, dp->ndev);
    if (n != dp->num_params)
        return vl_fail(err, VL_EINVAL, "gpt cuda dp: %zu values for %zu parameters", n,
                       dp->num_params);
    model_gpt_cuda *g = dp->rep[replica];
    int rc = kernels_cuda_set_device(replica, err);
    if (rc == 0 && params != NULL)
        rc = kernels_cuda_download(params, model_gpt_cuda_params_device(g), n * sizeof(float), err);
    if (rc == 0 && grads != NULL) rc = model_gpt_cuda_download_grads(g, grads, n, err);
    return leave(rc, err);
}

int model_gpt_cuda_dp_zero_grad(model_gpt_cuda_dp *dp, vl_error *err) {
    if (dp == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda dp: no model");
    int rc = 0;
    for (int r = 0; r < dp->ndev && rc == 0; r++) {
        rc = kernels_cuda_set_device(r, err);
        if (rc == 0) rc = model_gpt_cuda_zero_grad(dp->rep[r], err);
    }
    return leave(rc, err);
}

/* Each replica's forward and backward on its rows; *sum gets the sum of
 * their losses weighted by rows. */
static int local_grads(model_gpt_cuda_dp *dp, const int *inputs, const int *targets, int B, int T,
                       double *sum, vl_error *err) {
    *sum = 0.0;
    for (int r = 0; r < dp->ndev; r++) {
        int first, rows = rows_of(B, dp->ndev, r, &first);
        TRY(kernels_cuda_set_device(r, err));
        /* A replica without rows still takes part in the all-reduce, with
         * zeros. */
        TRY(model_gpt_cuda_zero_grad(dp->rep[r], err));
        if (rows == 0) continue;
        size_t off = (size_t)first * (size_t)T;
        float l = 0.0f;
        /* The forward waits for its loss; the backward is only queued, so
         * it runs while the next replica's forward is issued. */
        TRY(model_gpt_cuda_forward(dp->rep[r], inputs + off, targets + off, rows, T, &l, err));
        TRY(model_gpt_cuda_backward(dp->rep[r], err));
        *sum += (double)l * rows;
    }
    return 0;
}

#if defined(VOLLEY_HAVE_NCCL)
/* Turns the replicas' per-row-mean gradients into shares of the batch
 * mean (rows_r / B each) and sums them on every device. */
static int combine_grads(model_gpt_cuda_dp *dp, int B, vl_error *err) {
    for (int r = 0; r < dp->ndev; r++) {
        int first, rows = rows_of(B, dp->ndev, r, &first);
        if (rows == 0 || rows == B) continue; /* zeros, or already the whole batch's mean */
        TRY(kernels_cuda_set_device(r, err));
        TRY(kernels_cuda_scale(model_gpt_cuda_grads_device(dp->rep[r]), dp->num_params,
                               (float)rows / (float)B, err));
    }
    return allreduce_grads(dp, err);
}
#endif

static int sync_all(model_gpt_cuda_dp *dp, vl_error *err) {
    for (int r = 0; r < dp->ndev; r++) {
        TRY(kernels_cuda_set_device(r, err));
        TRY(kernels_cuda_sync(err));
    }
#if defined(VOLLEY_HAVE_NCCL)
    if (dp->comms != NULL) TRY(check_comms(dp, err));
#endif
    return 0;
}

int model_gpt_cuda_dp_grads(model_gpt_cuda_dp *dp, const int *inputs, const int *targets, int B,
                            int T, float *loss, vl_error *err) {
    if (dp == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda dp: no model");
    if (targets == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda dp: a gradient needs targets");
    /* Checked whole, so a bad token in the last replica's rows is refused
     * before the first replica has run. */
    TRY(gpt_check_batch(&dp->cfg, inputs, targets, B, T, err));
    double sum = 0.0;
    int rc = local_grads(dp, inputs, targets, B, T, &sum, err);
#if defined(VOLLEY_HAVE_NCCL)
    if (rc == 0 && dp->ndev > 1) rc = combine_grads(dp, B, err);
#endif
    if (rc == 0) rc = sync_all(dp, err);
    /* With one replica sum is its float loss times B, exactly (a float
     * times an int fits a double), so this gives that loss back bit for
     * bit. */
    if (rc == 0 && loss != NULL) *loss = (float)(sum / (double)B);
    return leave(rc, err);
}

int model_gpt_cuda_dp_clip_grads(model_gpt_cuda_dp *dp, double max_norm, double *g2,
                                 vl_error *err) {
    if (dp == NULL || g2 == NULL)
        return vl_fail(err, VL_EINVAL, "gpt cuda dp: no model or output pointer");
    int rc = 0;
    for (int r = 0; r < dp->ndev && rc == 0; r++) {
        double s = 0.0;
        rc = kernels_cuda_set_device(r, err);
        if (rc == 0) rc = model_gpt_cuda_clip_grads(dp->rep[r], max_norm, &s, err);
        if (rc == 0 && r == 0) *g2 = s;
    }
    return leave(rc, err);
}

int model_gpt_cuda_dp_adamw_step(model_gpt_cuda_dp *dp, float lr, float beta1, float beta2,
                                 float eps, float weight_decay, vl_error *err) {
    if (dp == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda dp: no model");
    /* Refused before any replica steps, so bad hyper-parameters cannot
     * leave the replicas a step apart. */
    TRY(gpt_adamw_check(lr, beta1, beta2, eps, weight_decay, err));
    int rc = 0;
    for (int r = 0; r < dp->ndev && rc == 0; r++) {
        rc = kernels_cuda_set_device(r, err);
        if (rc == 0)
            rc = model_gpt_cuda_adamw_step(dp->rep[r], lr, beta1, beta2, eps, weight_decay, err);
    }
    return leave(rc, err);
}

int model_gpt_cuda_dp_set_adamw(model_gpt_cuda_dp *dp, const float *m, const float *v, size_t n,
                                long step, vl_error *err) {
    if (dp == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda dp: no model");
    int rc = 0;
    for (int r = 0; r < dp->ndev && rc == 0; r++) {
        rc = kernels_cuda_set_device(r, err);
        if (rc == 0) rc = model_gpt_cuda_set_adamw(dp->rep[r], m, v, n, step, err);
    }
    return leave(rc, err);
}

int model_gpt_cuda_dp_get_adamw(model_gpt_cuda_dp *dp, float *m, float *v, size_t n, long *step,
                                vl_error *err) {
    if (dp == NULL) return vl_fail(err, VL_EINVAL, "gpt cuda dp: no model");
    int rc = kernels_cuda_set_device(0, err);
    if (rc == 0) rc = model_gpt_cuda_get_adamw(dp->rep[0], m, v, n, step, err);
    return leave(rc, err);
}
