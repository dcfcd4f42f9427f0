/* AdamW on the GPU: the element update of kernels/adamw_elem.h, which the
 * CPU kernel uses too. */
#include <math.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "kernels/adamw_elem.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/kernels.h"

__global__ static void adamw_kernel(float *param, const float *grad, float *m, float *v,
                                    const uint8_t *decay_mask, size_t n, float lr, float b1,
                                    float b2, float eps, float wd, float bc1, float bc2) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float decay = (decay_mask == NULL || decay_mask[i]) ? wd : 0.0f;
        param[i] =
            kernels_adamw_elem(param[i], grad[i], &m[i], &v[i], lr, b1, b2, eps, decay, bc1, bc2);
    }
}

#define ADAMW_THREADS 256
#define ADAMW_MAX_BLOCKS 65535

extern "C" int kernels_cuda_adamw_step(float *d_param, const float *d_grad, float *d_m, float *d_v,
                                       const uint8_t *d_decay_mask, size_t n,
                                       const kernels_adamw_hparams *hp, vl_error *err) {
    if (hp == NULL) return vl_fail(err, VL_EINVAL, "adamw: no hyper-parameters");
    if (n == 0) return 0;
    if (d_param == NULL || d_grad == NULL || d_m == NULL || d_v == NULL)
        return vl_fail(err, VL_EINVAL, "adamw: NULL device pointer");
    long step = hp->step > 0 ? hp->step : 1;
    float bc1 = (float)(1.0 - pow((double)hp->beta1, (double)step));
    float bc2 = (float)(1.0 - pow((double)hp->beta2, (double)step));
    size_t want = (n + ADAMW_THREADS - 1) / ADAMW_THREADS;
    unsigned blocks = want > ADAMW_MAX_BLOCKS ? ADAMW_MAX_BLOCKS : (unsigned)want;
    adamw_kernel<<<blocks, ADAMW_THREADS>>>(d_param, d_grad, d_m, d_v, d_decay_mask, n, hp->lr,
                                            hp->beta1, hp->beta2, hp->eps, hp->weight_decay, bc1,
                                            bc2);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return cuda_fail(err, e, "adamw kernel launch");
    e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return cuda_fail(err, e, "adamw kernel");
    return 0;
}

extern "C" int kernels_cuda_adamw_step_host(float *param, const float *grad, float *m, float *v,
                                            const uint8_t *decay_mask, size_t n,
                                            const kernels_adamw_hparams *hp, vl_error *err) {
    if (hp == NULL) return vl_fail(err, VL_EINVAL, "adamw: no hyper-parameters");
    if (n == 0) return 0;
    if (param == NULL || grad == NULL || m == NULL || v == NULL)
        return vl_fail(err, VL_EINVAL, "adamw: NULL host pointer");
    if (n > ((size_t)-1) / (4 * sizeof(float) + 1))
        return vl_fail(err, VL_ETOOBIG, "adamw: %zu elements is too many", n);
    size_t fbytes = n * sizeof(float);
    size_t total = 4 * fbytes + (decay_mask ? n : 0);
    /* One device allocation holds param, grad, m, v (and the mask). */
    uint8_t *dev = NULL;
    cudaError_t e = cudaMalloc((void **)&dev, total);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(err, e, "cudaMalloc");
    }
    float *d_param = (float *)dev;
    float *d_grad = d_param + n;
    float *d_m = d_grad + n;
    float *d_v = d_m + n;
    uint8_t *d_mask = decay_mask ? (uint8_t *)(d_v + n) : NULL;
    int rc = 0;
    const char *what = NULL;
    if ((e = cudaMemcpy(d_param, param, fbytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMemcpy(d_grad, grad, fbytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMemcpy(d_m, m, fbytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMemcpy(d_v, v, fbytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (d_mask &&
         (e = cudaMemcpy(d_mask, decay_mask, n, cudaMemcpyHostToDevice)) != cudaSuccess)) {
        what = "cudaMemcpy to device";
        goto out;
    }
    rc = kernels_cuda_adamw_step(d_param, d_grad, d_m, d_v, d_mask, n, hp, err);
    if (rc != 0) goto out;
    if ((e = cudaMemcpy(param, d_param, fbytes, cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (e = cudaMemcpy(m, d_m, fbytes, cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (e = cudaMemcpy(v, d_v, fbytes, cudaMemcpyDeviceToHost)) != cudaSuccess)
        what = "cudaMemcpy to host";
out:
    if (what) {
        (void)cudaGetLastError();
        rc = cuda_fail(err, e, what);
    }
    cudaFree(dev);
    return rc;
}
