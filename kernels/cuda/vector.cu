/* Whole-vector operations on the GPU: the squared L2 norm and scaling that
 * clip gradients on the device, so a peer's gradients never leave it, and
 * the difference that makes a task's pseudo-gradient there. The norm is summed in
 * double and in a fixed order (a fixed grid of per-block partials, then one
 * block over those), so it is the same number on every run and on every
 * replica that holds the same vector. */
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

/* Fixed grid of the first pass: its partials are the scratch. */
#define SUMSQ_BLOCKS KERNELS_CUDA_SUMSQ_SCRATCH

/* Sum over the block in double; sh is 32 doubles. Every thread gets it. */
__device__ static double block_sum_d(double v, double *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ static void sumsq_partial_kernel(double *partial, const float *x, size_t n) {
    __shared__ double sh[32];
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = (double)x[i];
        s += v * v;
    }
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* One block sums the partials; the result lands after them. */
__global__ static void sumsq_final_kernel(double *partial, int count) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) partial[count] = s;
}

__global__ static void scale_kernel(float *x, size_t n, float s) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

extern "C" int kernels_cuda_sumsq(const float *d_x, size_t n, double *d_scratch, double *out,
                                  vl_error *err) {
    if (d_x == NULL || d_scratch == NULL || out == NULL)
        return vl_fail(err, VL_EINVAL, "cuda sumsq: NULL pointer");
    if (n == 0) {
        *out = 0.0;
        return 0;
    }
    sumsq_partial_kernel<<<SUMSQ_BLOCKS, KC_THREADS>>>(d_scratch, d_x, n);
    int rc = kc_launched(err, "sumsq");
    if (rc != 0) return rc;
    sumsq_final_kernel<<<1, KC_THREADS>>>(d_scratch, SUMSQ_BLOCKS);
    if ((rc = kc_launched(err, "sumsq (final)")) != 0) return rc;
    return kernels_cuda_download(out, d_scratch + SUMSQ_BLOCKS, sizeof *out, err);
}

extern "C" int kernels_cuda_scale(float *d_x, size_t n, float s, vl_error *err) {
    if (d_x == NULL) return vl_fail(err, VL_EINVAL, "cuda scale: NULL pointer");
    if (n == 0) return 0;
    scale_kernel<<<kc_blocks(n), KC_THREADS>>>(d_x, n, s);
    return kc_launched(err, "scale");
}

__global__ static void sub_kernel(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] - b[i];
}

extern "C" int kernels_cuda_sub(float *d_out, const float *d_a, const float *d_b, size_t n,
                                vl_error *err) {
    if (d_out == NULL || d_a == NULL || d_b == NULL)
        return vl_fail(err, VL_EINVAL, "cuda sub: NULL pointer");
    if (n == 0) return 0;
    sub_kernel<<<kc_blocks(n), KC_THREADS>>>(d_out, d_a, d_b, n);
    return kc_launched(err, "sub");
}
