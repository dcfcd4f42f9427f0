/*
 * Private to the model module: the checks, shape arithmetic and layer
 * passes that the whole MLP (mlp.c) and its split-learning parts
 * (mlp_part.c) share (mlp_layers.c), so a part refuses exactly what the
 * whole model refuses, lays its layers out the same way and runs them with
 * the same arithmetic.
 */
#ifndef VOLLEY_MODEL_MLP_INTERNAL_H
#define VOLLEY_MODEL_MLP_INTERNAL_H

#include <limits.h>

#include "common/common.h"
#include "kernels/kernels.h"
#include "model/model.h"

#define MLP_MAX_LAYERS MODEL_MLP_MAX_LAYERS

/* One layer of the stack, conv or dense, as both the whole model and its
 * parts run it. A batch's input and output are [B, in] and [B, out] row
 * matrices either way (a conv layer's rows are NCHW images). */
typedef struct mlp_layer {
    int conv;               /* 1: convolution with shape g; 0: dense in -> out */
    kernels_conv2d_shape g; /* conv only */
    int in, out;            /* widths of an input row and an output row */
    size_t wsize, bsize;    /* floats of the weight and of the bias */
} mlp_layer;

/* The layers of a configuration, numbered as in model.h: conv layers
 * first, then the dense hidden layers, then the classifier. */
typedef struct mlp_net {
    int n_layers, n_conv;
    int width[MLP_MAX_LAYERS + 1]; /* width[l] = layer l's input, width[n_layers] = C */
    mlp_layer layer[MLP_MAX_LAYERS];
} mlp_net;

/* An integer field in [lo, hi], named in the message as "<cfg>: <what>".
 * Returns 0 or VL_EINVAL. */
static inline int mlp_check_field(const char *cfg, const char *what, int v, int lo, int hi,
                                  vl_error *err) {
    if (v < lo || v > hi)
        return vl_fail(err, VL_EINVAL, "%s: %s %d outside [%d, %d]", cfg, what, v, lo, hi);
    return 0;
}

/* Fills net for a validated cfg (model_mlp_config_validate), whose bounds
 * keep every size here far from overflow. */
void mlp_net_build(const model_mlp_config *cfg, mlp_net *net);

/* Floats of scratch that layers [first, last) of net need for batches of
 * up to cap rows: 0 without conv layers. Conv layers run in chunks of rows
 * sized so this stays bounded whatever cap is. Returns SIZE_MAX when cap
 * is below 1. */
size_t mlp_scratch_floats(const mlp_net *net, int first, int last, int cap);

/* out[B, L->out] = layer L's pre-activation output for in[B, L->in], with
 * weight w and bias b. scratch holds mlp_scratch_floats for at least B
 * rows of a range holding L (clobbered). */
void mlp_layer_forward(const mlp_layer *L, float *out, const float *in, const float *w,
                       const float *b, int B, float *scratch);

/* ADDS the gradients of mlp_layer_forward given dout[B, L->out]: din[B,
 * L->in] (skipped when NULL), dw and db. scratch as for the forward. */
void mlp_layer_backward(const mlp_layer *L, float *din, float *dw, float *db, const float *dout,
                        const float *in, const float *w, int B, float *scratch);

/* Every labels[0 .. n) in [0, C); VL_EINVAL naming the first that is not. */
static inline int mlp_check_labels(const int *labels, int n, int C, vl_error *err) {
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= C)
            return vl_fail(err, VL_EINVAL, "mlp: labels[%d] = %d outside [0, %d)", i, labels[i], C);
    return 0;
}

/* B >= 1, and B rows of the widest of width[0 .. n) stay addressable with
 * the kernels' int indices (with room to spare). what names the caller in
 * the message. Returns 0 or VL_EINVAL. */
static inline int mlp_check_rows(int B, const int *width, int n, const char *what, vl_error *err) {
    if (B < 1) return vl_fail(err, VL_EINVAL, "%s: batch size %d < 1", what, B);
    int widest = 0;
    for (int l = 0; l < n; l++) widest = width[l] > widest ? width[l] : widest;
    if ((long long)B * widest > INT_MAX / 4)
        return vl_fail(err, VL_EINVAL, "%s: batch size %d is too large for width %d", what, B,
                       widest);
    return 0;
}

#endif
