/* Token + position embedding, GELU and the residual connection on the GPU:
 * grid-stride loops over the elements. */
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"
#include "kernels/cuda_bf16.h"

#define GRID_STRIDE(i, n)                                                   \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

__global__ static void encoder_forward_kernel(float *out, const int *tokens, const float *wte,
                                              const float *wpe, size_t n, int T, int C) {
    GRID_STRIDE(i, n) {
        size_t r = i / (size_t)C;
        int c = (int)(i % (size_t)C), t = (int)(r % (size_t)T);
        out[i] = wte[(size_t)tokens[r] * C + c] + wpe[(size_t)t * C + c];
    }
}

/* dwpe[t, c] += sum over b of dout[b, t, c], summed in batch order by one
 * thread per element. */
__global__ static void encoder_backward_pos_kernel(float *dwpe, const float *dout, int B, int T,
                                                   int C) {
    size_t n = (size_t)T * C, bstride = (size_t)T * C;
    GRID_STRIDE(i, n) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += dout[(size_t)b * bstride + i];
        dwpe[i] += s;
    }
}

/* dwte[tokens[r], c] += dout[r, c]: a token can occur at many positions, so
 * the adds are atomic. */
__global__ static void encoder_backward_tok_kernel(float *dwte, const float *dout,
                                                   const int *tokens, size_t n, int C) {
    GRID_STRIDE(i, n) {
        size_t r = i / (size_t)C;
        int c = (int)(i % (size_t)C);
        atomicAdd(&dwte[(size_t)tokens[r] * C + c], dout[i]);
    }
}

template <typename Out>
__global__ static void gelu_forward_kernel(Out *out, const float *inp, size_t n) {
    GRID_STRIDE(i, n) {
        kc_put(&out[i], kc_gelu(inp[i]));
    }
}

__global__ static void gelu_backward_kernel(float *dinp, const float *inp, const float *dout,
                                            size_t n) {
    GRID_STRIDE(i, n) {
        dinp[i] += kc_gelu_grad(inp[i]) * dout[i];
    }
}

__global__ static void residual_forward_kernel(float *out, const float *a, const float *b,
                                               size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ static void residual_backward_kernel(float *da, float *db, const float *dout, size_t n) {
    GRID_STRIDE(i, n) {
        float d = dout[i];
        da[i] += d;
        db[i] += d;
    }
}

static int check_btc(const void *a, const void *b, const void *c, int B, int T, int C,
                     const char *what, vl_error *err) {
    if (a == NULL || b == NULL || c == NULL)
        return vl_fail(err, VL_EINVAL, "cuda %s: NULL pointer", what);
    if (B < 1 || T < 1 || C < 1)
        return vl_fail(err, VL_EINVAL, "cuda %s: B=%d T=%d C=%d", what, B, T, C);
    return 0;
}

extern "C" int kernels_cuda_encoder_forward(float *d_out, const int *d_tokens, const float *d_wte,
                                            const float *d_wpe, int B, int T, int C,
                                            vl_error *err) {
    int rc = check_btc(d_out, d_tokens, d_wte, B, T, C, "encoder", err);
    if (rc == 0 && d_wpe == NULL) rc = vl_fail(err, VL_EINVAL, "cuda encoder: NULL pointer");
    if (rc != 0) return rc;
    size_t n = (size_t)B * T * C;
    encoder_forward_kernel<<<kc_blocks(n), KC_THREADS>>>(d_out, d_tokens, d_wte, d_wpe, n, T, C);
    return kc_launched(err, "encoder forward");
}

extern "C" int kernels_cuda_encoder_backward(float *d_dwte, float *d_dwpe, const float *d_dout,
                                             const int *d_tokens, int B, int T, int C,
                                             vl_error *err) {
    int rc = check_btc(d_dwte, d_dwpe, d_dout, B, T, C, "encoder backward", err);
    if (rc == 0 && d_tokens == NULL)
        rc = vl_fail(err, VL_EINVAL, "cuda encoder backward: NULL pointer");
    if (rc != 0) return rc;
    size_t tc = (size_t)T * C, n = (size_t)B * tc;
    encoder_backward_pos_kernel<<<kc_blocks(tc), KC_THREADS>>>(d_dwpe, d_dout, B, T, C);
    if ((rc = kc_launched(err, "encoder backward (positions)")) != 0) return rc;
    encoder_backward_tok_kernel<<<kc_blocks(n), KC_THREADS>>>(d_dwte, d_dout, d_tokens, n, C);
    return kc_launched(err, "encoder backward (tokens)");
}

static int check_n(const void *a, const void *b, const void *c, size_t n, const char *what,
                   vl_error *err) {
    if (a == NULL || b == NULL || c == NULL)
        return vl_fail(err, VL_EINVAL, "cuda %s: NULL pointer", what);
    if (n == 0) return vl_fail(err, VL_EINVAL, "cuda %s: no elements", what);
    return 0;
}

extern "C" int kernels_cuda_gelu_forward(float *d_out, const float *d_inp, size_t n,
                                         vl_error *err) {
    int rc = check_n(d_out, d_inp, d_inp, n, "gelu", err);
    if (rc != 0) return rc;
    gelu_forward_kernel<float><<<kc_blocks(n), KC_THREADS>>>(d_out, d_inp, n);
    return kc_launched(err, "gelu forward");
}

extern "C" int kernels_cuda_gelu_forward_bf16(kernels_bf16 *d_out, const float *d_inp, size_t n,
                                              vl_error *err) {
    int rc = check_n(d_out, d_inp, d_inp, n, "gelu", err);
    if (rc != 0) return rc;
    gelu_forward_kernel<__nv_bfloat16>
        <<<kc_blocks(n), KC_THREADS>>>((__nv_bfloat16 *)d_out, d_inp, n);
    return kc_launched(err, "gelu forward");
}

__global__ static void gelu_backward_bf16_kernel(float *dinp, __nv_bfloat16 *dinp_h,
                                                 const float *inp, const float *dout, size_t n) {
    GRID_STRIDE(i, n) {
        float d = kc_gelu_grad(inp[i]) * dout[i];
        dinp[i] = d;
        dinp_h[i] = __float2bfloat16_rn(d);
    }
}

extern "C" int kernels_cuda_gelu_backward_bf16(float *d_dinp, kernels_bf16 *d_dinp_h,
                                               const float *d_inp, const float *d_dout, size_t n,
                                               vl_error *err) {
    int rc = check_n(d_dinp, d_inp, d_dout, n, "gelu backward", err);
    if (rc == 0 && d_dinp_h == NULL)
        rc = vl_fail(err, VL_EINVAL, "cuda gelu backward: NULL pointer");
    if (rc != 0) return rc;
    gelu_backward_bf16_kernel<<<kc_blocks(n), KC_THREADS>>>(d_dinp, (__nv_bfloat16 *)d_dinp_h,
                                                            d_inp, d_dout, n);
    return kc_launched(err, "gelu backward");
}

extern "C" int kernels_cuda_gelu_backward(float *d_dinp, const float *d_inp, const float *d_dout,
                                          size_t n, vl_error *err) {
    int rc = check_n(d_dinp, d_inp, d_dout, n, "gelu backward", err);
    if (rc != 0) return rc;
    gelu_backward_kernel<<<kc_blocks(n), KC_THREADS>>>(d_dinp, d_inp, d_dout, n);
    return kc_launched(err, "gelu backward");
}

extern "C" int kernels_cuda_residual_forward(float *d_out, const float *d_a, const float *d_b,
                                             size_t n, vl_error *err) {
    int rc = check_n(d_out, d_a, d_b, n, "residual", err);
    if (rc != 0) return rc;
    residual_forward_kernel<<<kc_blocks(n), KC_THREADS>>>(d_out, d_a, d_b, n);
    return kc_launched(err, "residual forward");
}

extern "C" int kernels_cuda_residual_backward(float *d_da, float *d_db, const float *d_dout,
                                              size_t n, vl_error *err) {
    int rc = check_n(d_da, d_db, d_dout, n, "residual backward", err);
    if (rc != 0) return rc;
    residual_backward_kernel<<<kc_blocks(n), KC_THREADS>>>(d_da, d_db, d_dout, n);
    return kc_launched(err, "residual backward");
}
