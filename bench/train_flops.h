/* What a GPT training step costs, shared by bench_train (CPU) and
 * bench_gpu_train (CUDA) so both count the same FLOPs and time the same
 * GEMM shapes as their baseline:
 *   6 * N_mm * B * T          every matmul weight: 2 FLOPs per weight and
 *                             token forward, 4 backward; N_mm = 12 L C^2
 *                             (qkv, attn proj, fc, mlp proj) + V C (tied head)
 * + 6 * L * B * T^2 * C       causal attention: QK^T and PV cost T^2 C
 *                             forward per sequence and layer each half-masked,
 *                             2 T^2 C in all, backward twice that
 * Biases, LayerNorm, GELU, softmax and the optimiser are not counted. */
#ifndef VOLLEY_BENCH_TRAIN_FLOPS_H
#define VOLLEY_BENCH_TRAIN_FLOPS_H

#include "model/model.h"

static inline double model_flops(const model_gpt_config *c, int B, int T) {
    double C = c->n_embd, L = c->n_layer, V = c->vocab_size;
    double nmm = 12.0 * L * C * C + V * C;
    return 6.0 * nmm * B * T + 6.0 * L * B * (double)T * T * C;
}

/* One GEMM shape in a training step: out[M,N] = A[M,K] B[K,N] with the given
 * transposes, performed `count` times per step. */
typedef struct gemm_shape {
    int ta, tb;
    int M, N, K;
    int count;
} gemm_shape;

/* The GEMMs of one training step of c at batch B (context block_size). */
static inline int step_gemms(const model_gpt_config *c, int B, gemm_shape *out) {
    int N = B * c->block_size, C = c->n_embd, L = c->n_layer, V = c->vocab_size;
    const int io[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}; /* [in, out] */
    int n = 0;
    for (int i = 0; i < 4; i++) {
        int in = io[i][0], o = io[i][1];
        out[n++] = (gemm_shape){0, 0, N, o, in, L}; /* forward */
        out[n++] = (gemm_shape){0, 1, N, in, o, L}; /* input gradient */
        out[n++] = (gemm_shape){1, 0, in, o, N, L}; /* weight gradient */
    }
    out[n++] = (gemm_shape){0, 1, N, V, C, 1}; /* head forward */
    out[n++] = (gemm_shape){0, 0, N, C, V, 1}; /* head input gradient */
    out[n++] = (gemm_shape){1, 0, V, C, N, 1}; /* head weight gradient */
    return n;
}

#endif
