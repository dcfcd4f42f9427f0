/*
 * Private to the model module: the GPT object, its tensor indices and the
 * activation layout shared by gpt.c, gpt_train.c and gpt_io.c.
 */
#ifndef VOLLEY_MODEL_GPT_INTERNAL_H
#define VOLLEY_MODEL_GPT_INTERNAL_H

#include <stddef.h>

#include "model/carve.h"
#include "model/model.h"

/* Per-layer tensors, in table order after wte and wpe. */
enum {
    GPT_LN1_W,
    GPT_LN1_B,
    GPT_QKV_W,
    GPT_QKV_B,
    GPT_ATTPROJ_W,
    GPT_ATTPROJ_B,
    GPT_LN2_W,
    GPT_LN2_B,
    GPT_FC_W,
    GPT_FC_B,
    GPT_FCPROJ_W,
    GPT_FCPROJ_B,
    GPT_PER_LAYER
};
#define GPT_WTE 0
#define GPT_WPE 1
#define GPT_LAYER(l, k) (2 + (l)*GPT_PER_LAYER + (k))
#define GPT_LNF_W(L) (2 + (L)*GPT_PER_LAYER)
#define GPT_LNF_B(L) (3 + (L)*GPT_PER_LAYER)

/* Forward activations of one layer, each sized for the planned capacity. */
typedef struct gpt_layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* [BT,C], [BT], [BT] */
    float *qkv;                       /* [BT,3C] */
    float *att;                       /* [B,NH,T,T] */
    float *atty;                      /* [BT,C] attention output before c_proj */
    float *res2;                      /* [BT,C] residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu; /* [BT,4C] */
    float *res3;           /* [BT,C] residual after the MLP: the layer output */
} gpt_layer_acts;

typedef struct gpt_acts {
    float *mem;             /* the one allocation everything below points into */
    size_t cap_bt, cap_btt; /* planned for B*T <= cap_bt and B*T*T <= cap_btt */
    int *inputs, *targets;  /* [BT], copies of the last forward's ids */
    float *encoded;         /* [BT,C] */
    gpt_layer_acts *layers; /* [L] */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits; /* [BT,V]: logits, then probabilities, then their gradient */
    float *losses; /* [BT] */
    float *proj;   /* [BT,C] scratch for c_proj outputs before the residual add */
} gpt_acts;

/* Gradients of activations for the backward pass (allocated on first
 * backward, sized like the forward plan). */
typedef struct gpt_grad_acts {
    float *mem;
    size_t cap_bt, cap_scratch;
    float *dres;      /* [BT,C] gradient of the residual stream */
    float *dln;       /* [BT,C] gradient of a LayerNorm output */
    float *dqkv;      /* [BT,3C] */
    float *datty;     /* [BT,C] */
    float *dfch;      /* [BT,4C] */
    float *dfch_gelu; /* [BT,4C] */
    float *scratch;   /* attention backward scratch */
} gpt_grad_acts;

struct model_gpt {
    model_gpt_config cfg;
    model_tensor *tensors;
    int ntensors;
    size_t num_params;
    float *params;
    float *grads; /* NULL until first needed */
    gpt_acts acts;
    gpt_grad_acts gacts;
    int B, T;                      /* shape of the last forward */
    int have_output;               /* model_gpt_output is meaningful */
    int can_backward;              /* the last forward had targets and was not consumed */
    double loss_sum;               /* sum of per-token losses of the last forward */
    model_gpt_linear_fn linear_fn; /* NULL: backward skips the hook entirely */
    void *linear_ctx;
};

/* Pointer to tensor idx inside a flat vector laid out like the params. */
static inline float *gpt_tensor_ptr(const model_gpt *m, float *base, int idx) {
    return base + m->tensors[idx].offset;
}

/* Allocates the gradient vector (zeroed) if it is not there yet. */
int gpt_ensure_grads(model_gpt *m, vl_error *err);

/* Lays out the forward activations of a model of configuration cfg for
 * bt = B*T positions and btt = B*T*T attention entries per head into cv
 * (the carve protocol of carve.h): every pointer of a except mem, the
 * token ids and the layers array, which must hold n_layer entries. The
 * CPU and the CUDA model share it, so both keep the same buffers. */
void gpt_layout_acts(const model_gpt_config *cfg, gpt_acts *a, carver *cv, size_t bt, size_t btt);

/* The backward buffers of g for bt positions and scratch floats of
 * attention scratch, likewise. */
void gpt_layout_grad_acts(const model_gpt_config *cfg, gpt_grad_acts *g, carver *cv, size_t bt,
                          size_t scratch);

/* The checks of model_gpt_forward on its arguments: inputs present,
 * 1 <= T <= block_size, B >= 1, B*T not too large, every id in inputs and
 * targets (may be NULL) inside the vocabulary. Returns 0 or VL_EINVAL. */
int gpt_check_batch(const model_gpt_config *cfg, const int *inputs, const int *targets, int B,
                    int T, vl_error *err);

/* VL_EINVAL unless the AdamW hyper-parameters are usable: lr finite and
 * >= 0, betas in [0, 1), eps finite and > 0, weight decay finite and
 * >= 0. Shared by model_adamw_init and the CUDA model's step. */
int gpt_adamw_check(float lr, float beta1, float beta2, float eps, float weight_decay,
                    vl_error *err);

/* Frees activation memory (both passes). */
void gpt_free_acts(model_gpt *m);

/* Calls fn for each run of neighbouring tensors that share a weight-decay
 * rule (2-D tensors decay, biases and LayerNorm parameters do not), as
 * (offset, count, decay) in parameter order, so an optimiser updates a run
 * in one call. Then marks the forward state stale, since the parameters
 * have changed. */
typedef void (*gpt_decay_run_fn)(void *ctx, size_t off, size_t n, int decay);
void gpt_each_decay_run(model_gpt *m, gpt_decay_run_fn fn, void *ctx);

/* Returns early with the callee's code (the device GPT's functions, which
 * return 0 or a negative VL_E* code). */
#define TRY(call)                 \
    do {                          \
        int rc_ = (call);         \
        if (rc_ != 0) return rc_; \
    } while (0)

#endif
