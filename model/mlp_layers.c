/*
 * The MLP classifier's layer stack (see model.h and mlp_internal.h): the
 * configuration's checks, the shape of every layer, conv and dense, and
 * the one place their forward and backward passes are written, which the
 * whole model (mlp.c) and its split-learning parts (mlp_part.c) both call
 * so that a chain of parts reproduces the whole model bit for bit.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/mlp_internal.h"
#include "model/model.h"

#define CFG "mlp config"

/* A conv layer runs its batch in chunks of rows whose scratch (the im2col
 * matrix, k*k times the input) stays under this many floats, so the
 * memory a model plans does not grow k*k-fold with the batch. The chunks
 * depend on the layer and B alone: the whole model and its parts split a
 * batch the same way and sum the weight gradient in the same order. */
#define MLP_CONV_CHUNK_FLOATS ((size_t)1 << 20)

/* ---- configuration ------------------------------------------------------------ */

static int check_width(int v, int lo, const char *what, vl_error *err) {
    return mlp_check_field(CFG, what, v, lo, MODEL_MLP_MAX_WIDTH, err);
}

/* The convolution front end: the layer count, the image against D, and
 * each layer's fields, output width and scratch, walking the shapes down
 * the stack. Image sides and widths are at most 2^16 and strides at least
 * 1, so every product below fits in 64 bits and every side in an int. */
static int check_conv(const model_mlp_config *c, vl_error *err) {
    int rc = mlp_check_field(CFG, "n_conv", c->n_conv, 0, MODEL_MLP_MAX_CONV, err);
    if (rc != 0) return rc;
    if (c->n_conv == 0) {
        if (c->image[0] != 0 || c->image[1] != 0 || c->image[2] != 0)
            return vl_fail(err, VL_EINVAL, CFG ": image is set but there are no conv layers");
        return 0;
    }
    static const char *const side[3] = {"image[0] (channels)", "image[1] (height)",
                                        "image[2] (width)"};
    for (int i = 0; i < 3 && rc == 0; i++) rc = check_width(c->image[i], 1, side[i], err);
    if (rc != 0) return rc;
    unsigned long long vol = (unsigned long long)c->image[0] * (unsigned long long)c->image[1];
    vol *= (unsigned long long)c->image[2];
    if (vol != (unsigned long long)c->in_dim)
        return vl_fail(err, VL_EINVAL, CFG ": image %dx%dx%d holds %llu values, but in_dim is %d",
                       c->image[0], c->image[1], c->image[2], vol, c->in_dim);
    int ci = c->image[0], h = c->image[1], w = c->image[2];
    for (int i = 0; i < c->n_conv; i++) {
        const model_mlp_conv *v = &c->conv[i];
        char what[48];
        snprintf(what, sizeof what, "conv[%d].channels", i);
        rc = check_width(v->channels, 1, what, err);
        snprintf(what, sizeof what, "conv[%d].kernel", i);
        if (rc == 0) rc = mlp_check_field(CFG, what, v->kernel, 1, MODEL_MLP_MAX_KERNEL, err);
        snprintf(what, sizeof what, "conv[%d].stride", i);
        if (rc == 0) rc = mlp_check_field(CFG, what, v->stride, 1, MODEL_MLP_MAX_STRIDE, err);
        if (rc != 0) return rc;
        int ho = kernels_conv2d_out_size(h, v->kernel, v->stride);
        int wo = kernels_conv2d_out_size(w, v->kernel, v->stride);
        unsigned long long out =
            (unsigned long long)v->channels * (unsigned long long)ho * (unsigned long long)wo;
        if (out > MODEL_MLP_MAX_WIDTH)
            return vl_fail(err, VL_EINVAL,
                           CFG ": conv[%d] output %dx%dx%d = %llu values exceeds the width limit "
                               "of %d",
                           i, v->channels, ho, wo, out, MODEL_MLP_MAX_WIDTH);
        kernels_conv2d_shape g = {ci, h, w, v->channels, v->kernel, v->stride};
        size_t per = kernels_conv2d_scratch_floats(&g, 1);
        if (per == 0 || per > MODEL_MLP_MAX_CONV_SCRATCH)
            return vl_fail(err, VL_EINVAL,
                           CFG ": conv[%d] needs %zu floats of scratch per image, over the "
                               "limit of %zu (a smaller kernel or a larger stride)",
                           i, per, (size_t)MODEL_MLP_MAX_CONV_SCRATCH);
        ci = v->channels;
        h = ho;
        w = wo;
    }
    return 0;
}

int model_mlp_config_validate(const model_mlp_config *c, vl_error *err) {
    if (c == NULL) return vl_fail(err, VL_EINVAL, CFG ": missing");
    int rc = mlp_check_field(CFG, "n_hidden", c->n_hidden, 1, MODEL_MLP_MAX_HIDDEN, err);
    if (rc == 0) rc = check_width(c->in_dim, 1, "in_dim", err);
    if (rc == 0) rc = check_width(c->n_classes, 2, "n_classes", err);
    for (int l = 0; l < c->n_hidden && rc == 0; l++) {
        char what[32];
        snprintf(what, sizeof what, "hidden[%d]", l);
        rc = check_width(c->hidden[l], 1, what, err);
    }
    if (rc == 0) rc = check_conv(c, err);
    if (rc != 0) return rc;
    /* A dense layer has under 2^33 floats and a conv layer under 2^16 *
     * 2^16 * 15^2 + 2^16 (channels times the previous width times the
     * kernel): nine of them cannot wrap a 64-bit size_t. */
    mlp_net net;
    mlp_net_build(c, &net);
    size_t n = 0;
    for (int l = 0; l < net.n_layers; l++) n += net.layer[l].wsize + net.layer[l].bsize;
    if (n > MODEL_MLP_MAX_PARAMS)
        return vl_fail(err, VL_EINVAL, CFG ": %zu parameters exceed the limit of %zu", n,
                       (size_t)MODEL_MLP_MAX_PARAMS);
    return 0;
}

int model_mlp_config_num_layers(const model_mlp_config *cfg) {
    return cfg->n_conv + cfg->n_hidden + 1;
}

int model_mlp_config_equal(const model_mlp_config *a, const model_mlp_config *b) {
    if (a->in_dim != b->in_dim || a->n_hidden != b->n_hidden || a->n_classes != b->n_classes ||
        a->n_conv != b->n_conv)
        return 0;
    for (int i = 0; i < a->n_hidden && i < MODEL_MLP_MAX_HIDDEN; i++)
        if (a->hidden[i] != b->hidden[i]) return 0;
    for (int i = 0; i < 3; i++)
        if (a->image[i] != b->image[i]) return 0;
    for (int i = 0; i < a->n_conv && i < MODEL_MLP_MAX_CONV; i++)
        if (a->conv[i].channels != b->conv[i].channels || a->conv[i].kernel != b->conv[i].kernel ||
            a->conv[i].stride != b->conv[i].stride)
            return 0;
    return 1;
}

/* ---- the layer table ------------------------------------------------------------ */

void mlp_net_build(const model_mlp_config *c, mlp_net *net) {
    memset(net, 0, sizeof *net);
    net->n_conv = c->n_conv;
    net->n_layers = model_mlp_config_num_layers(c);
    int l = 0, in = c->in_dim;
    int ci = c->image[0], h = c->image[1], w = c->image[2];
    for (int i = 0; i < c->n_conv; i++, l++) {
        const model_mlp_conv *v = &c->conv[i];
        mlp_layer *L = &net->layer[l];
        int ho = kernels_conv2d_out_size(h, v->kernel, v->stride);
        int wo = kernels_conv2d_out_size(w, v->kernel, v->stride);
        L->conv = 1;
        L->g = (kernels_conv2d_shape){ci, h, w, v->channels, v->kernel, v->stride};
        L->in = in;
        L->out = v->channels * ho * wo;
        L->wsize = (size_t)v->channels * (size_t)ci * (size_t)v->kernel * (size_t)v->kernel;
        L->bsize = (size_t)v->channels;
        ci = v->channels;
        h = ho;
        w = wo;
        in = L->out;
    }
    for (int i = 0; i <= c->n_hidden; i++, l++) {
        mlp_layer *L = &net->layer[l];
        L->in = in;
        L->out = i < c->n_hidden ? c->hidden[i] : c->n_classes;
        L->wsize = (size_t)L->in * (size_t)L->out;
        L->bsize = (size_t)L->out;
        in = L->out;
    }
    for (l = 0; l < net->n_layers; l++) net->width[l] = net->layer[l].in;
    net->width[net->n_layers] = in;
}

/* Rows of a batch of B that one conv kernel call takes. */
static int conv_rows(const mlp_layer *L, int B) {
    size_t per = kernels_conv2d_scratch_floats(&L->g, 1);
    size_t n = per >= MLP_CONV_CHUNK_FLOATS ? 1 : MLP_CONV_CHUNK_FLOATS / per;
    return n < (size_t)B ? (int)n : B;
}

size_t mlp_scratch_floats(const mlp_net *net, int first, int last, int cap) {
    if (cap < 1) return SIZE_MAX;
    size_t most = 0;
    for (int l = first; l < last; l++) {
        const mlp_layer *L = &net->layer[l];
        if (!L->conv) continue;
        /* At most 2^20 floats, or one image's bounded scratch. */
        size_t n = kernels_conv2d_scratch_floats(&L->g, conv_rows(L, cap));
        most = n > most ? n : most;
    }
    return most;
}

/* ---- passes --------------------------------------------------------------------- */

void mlp_layer_forward(const mlp_layer *L, float *out, const float *in, const float *w,
                       const float *b, int B, float *scratch) {
    if (!L->conv) {
        kernels_matmul_forward(out, in, w, b, B, L->in, L->out);
        return;
    }
    int rows = conv_rows(L, B);
    for (int r = 0; r < B; r += rows) {
        int n = B - r < rows ? B - r : rows;
        kernels_conv2d_forward(out + (size_t)r * (size_t)L->out, in + (size_t)r * (size_t)L->in, w,
                               b, scratch, &L->g, n);
    }
}

void mlp_layer_backward(const mlp_layer *L, float *din, float *dw, float *db, const float *dout,
                        const float *in, const float *w, int B, float *scratch) {
    if (!L->conv) {
        kernels_matmul_backward(din, dw, db, dout, in, w, B, L->in, L->out);
        return;
    }
    int rows = conv_rows(L, B);
    for (int r = 0; r < B; r += rows) {
        int n = B - r < rows ? B - r : rows;
        size_t io = (size_t)r * (size_t)L->in;
        kernels_conv2d_backward(din ? din + io : NULL, dw, db, scratch,
                                dout + (size_t)r * (size_t)L->out, in + io, w, &L->g, n);
    }
}
