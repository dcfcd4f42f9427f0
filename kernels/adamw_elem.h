/* The AdamW update of one element, shared by the CPU loop and the CUDA
 * kernel so the two cannot drift apart (the GPU test compares them within
 * rounding: nvcc may contract multiply-adds). Private to kernels/. */
#ifndef VOLLEY_KERNELS_ADAMW_ELEM_H
#define VOLLEY_KERNELS_ADAMW_ELEM_H

#ifdef __CUDACC__
#define KERNELS_HD __host__ __device__ __forceinline__
#else
#define KERNELS_HD static inline
#endif

/* Updates m and v in place and returns the new parameter. bc1 and bc2 are
 * the bias corrections 1 - beta^step; decay is the weight decay that
 * applies to this element (0 for biases and LayerNorm parameters). */
KERNELS_HD float kernels_adamw_elem(float p, float g, float *m, float *v, float lr, float b1,
                                    float b2, float eps, float decay, float bc1, float bc2) {
    float mi = b1 * *m + (1.0f - b1) * g;
    float vi = b2 * *v + (1.0f - b2) * g * g;
    *m = mi;
    *v = vi;
    float mhat = mi / bc1;
    float vhat = vi / bc2;
    return p - lr * (mhat / (sqrtf(vhat) + eps)) - lr * decay * p;
}

#endif
