/*
 * Private to the model module: the checks and shape arithmetic that the
 * whole MLP (mlp.c) and its split-learning parts (mlp_part.c) share, so a
 * part refuses exactly what the whole model refuses and lays its layers
 * out the same way.
 */
#ifndef VOLLEY_MODEL_MLP_INTERNAL_H
#define VOLLEY_MODEL_MLP_INTERNAL_H

#include <limits.h>

#include "common/common.h"
#include "model/model.h"

#define MLP_MAX_LAYERS (MODEL_MLP_MAX_HIDDEN + 1)

/* Fills width[0 .. n_hidden + 1] for a validated cfg (width[0] = D, then
 * the hidden widths, width[n_hidden + 1] = C) and returns the number of
 * linear layers, n_hidden + 1. Linear layer l maps width[l] to width[l+1]. */
static inline int mlp_widths(const model_mlp_config *c, int width[MLP_MAX_LAYERS + 1])
{
    width[0] = c->in_dim;
    for (int l = 0; l < c->n_hidden; l++)
        width[l + 1] = c->hidden[l];
    width[c->n_hidden + 1] = c->n_classes;
    return c->n_hidden + 1;
}

/* Every labels[0 .. n) in [0, C); VL_EINVAL naming the first that is not. */
static inline int mlp_check_labels(const int *labels, int n, int C, vl_error *err)
{
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= C)
            return vl_fail(err, VL_EINVAL, "mlp: labels[%d] = %d outside [0, %d)", i, labels[i],
                           C);
    return 0;
}

/* B >= 1, and B rows of the widest of width[0 .. n) stay addressable with
 * the kernels' int indices (with room to spare). what names the caller in
 * the message. Returns 0 or VL_EINVAL. */
static inline int mlp_check_rows(int B, const int *width, int n, const char *what,
                                 vl_error *err)
{
    if (B < 1)
        return vl_fail(err, VL_EINVAL, "%s: batch size %d < 1", what, B);
    int widest = 0;
    for (int l = 0; l < n; l++)
        widest = width[l] > widest ? width[l] : widest;
    if ((long long)B * widest > INT_MAX / 4)
        return vl_fail(err, VL_EINVAL, "%s: batch size %d is too large for width %d", what, B,
                       widest);
    return 0;
}

#endif
