/*
 * Private to model/: the device GPT's object, shared by gpt_cuda.c (memory
 * planning, the float32 passes, AdamW, the public functions) and
 * gpt_cuda_bf16.c (the passes on bfloat16 operands).
 */
#ifndef VOLLEY_MODEL_GPT_CUDA_INTERNAL_H
#define VOLLEY_MODEL_GPT_CUDA_INTERNAL_H

#include <stdint.h>

#include "kernels/cuda_bf16.h"
#include "kernels/cuda_model.h"
#include "model/gpt_cuda.h"
#include "model/gpt_internal.h"
#include "model/model.h"

/* bfloat16 copies of what the products read, in KERNELS_CUDA_BF16 mode:
 * each is written where its float32 value is produced (or instead of it,
 * where nothing else reads that value) and read by the products of both
 * passes. */
typedef struct gpt_half_layer {
    kernels_bf16 *ln1, *qkv, *atty, *ln2, *fchg; /* [BT,C], [BT,3C], .., [BT,4C] */
    kernels_bf16 *att;                           /* [B,NH,T,T] probabilities */
} gpt_half_layer;

typedef struct gpt_half {
    kernels_bf16 *mem;      /* one device allocation for everything below */
    gpt_half_layer *layers; /* host array [L] */
    kernels_bf16 *lnf;      /* [BT,C] */
    kernels_bf16 *dlogits;  /* [BT,V] */
    kernels_bf16 *dout;     /* [BT,4C]: the output gradient of the product at hand */
    kernels_bf16 *ds;       /* [B,NH,T,T]: the attention scores' gradient */
} gpt_half;

struct model_gpt_cuda {
    model_gpt_config cfg;
    model_tensor *tensors; /* host copy of the host model's table */
    int ntensors;
    size_t num_params;
    kernels_cuda_ctx *ctx;
    /* One device allocation for the parameter-sized vectors. */
    float *state;
    float *params, *grads, *adam_m, *adam_v;
    uint8_t *decay_mask;  /* 1 where AdamW decays (2-D tensors) */
    double *norm_scratch; /* KERNELS_CUDA_SUMSQ_SCRATCH_DOUBLES */
    long adam_step;
    int bf16;               /* KERNELS_CUDA_BF16: the products take half */
    int vld;                /* row stride of the logits: the vocabulary,
                              * padded to 64 in bf16 mode (aligned rows
                              * for the output head's products) */
    kernels_bf16 *params_h; /* params rounded, refreshed by every forward */
    kernels_bf16 *wte_h;    /* [vld, C]: the token embedding rounded, with
                              * zero rows past V, so the output head's
                              * products run over an aligned width */
    gpt_half half;
    /* One device allocation for both passes' activations and the ids;
     * acts.mem points at it, acts.layers is host memory. */
    gpt_acts acts;
    gpt_grad_acts gacts;
    float *h_losses; /* host copy of the per-position losses [cap_bt] */
    int B, T;
    int have_output, can_backward;
};

/* Tensor idx of a vector laid out like the parameters. */
static inline float *tensor(const model_gpt_cuda *g, float *base, int idx) {
    return base + g->tensors[idx].offset;
}

/* The same tensor of the rounded parameters. */
static inline const kernels_bf16 *tensor_h(const model_gpt_cuda *g, int idx) {
    return g->params_h + g->tensors[idx].offset;
}

/* The two passes in KERNELS_CUDA_BF16 mode (gpt_cuda_bf16.c), on the
 * buffers model_gpt_cuda_forward planned and the ids it uploaded; the
 * forward leaves the logits in acts.logits for the loss. */
int gpt_cuda_forward_bf16(model_gpt_cuda *g, int B, int T, vl_error *err) VL_MUST_CHECK;
int gpt_cuda_backward_bf16(model_gpt_cuda *g, vl_error *err) VL_MUST_CHECK;


#endif
