/*
 * mlp_part: a contiguous range of an MLP classifier's layers, so that the
 * model can be trained split between two parties (DESIGN.md, "Split
 * learning and NoPeek"). In split learning a peer owns the layers below a
 * cut and sends their output Z to the server, which owns the layers above
 * it, computes the loss and returns dL/dZ; in the U-shaped variant the peer
 * also owns the final classifier layer and the loss, so its labels never
 * leave it. Each party holds one model_mlp_part per range it owns; chaining
 * the parts' forward passes and then their backward passes (each part's dx
 * is the dy of the part below) gives the same loss and gradients as
 * model_mlp_forward and model_mlp_backward on the whole model, because the
 * parts run the same kernels in the same order.
 *
 * The model is a model_mlp_config: x[D] -> (Conv2d -> GELU) x n_conv ->
 * (Linear -> GELU) x n_hidden -> Linear -> logits[C]. Its layers are
 * numbered through the whole stack (model.h): conv layers 0 .. n_conv-1,
 * then the dense ones, and the last, L-1 with L =
 * model_mlp_config_num_layers(cfg), is the classifier and has no GELU;
 * every other layer's output is taken after its GELU. A part holds layers
 * [first, last), 0 <= first < last <= L, so a cut may fall after a conv
 * layer: the activation crossing it is then that layer's [channels, H', W']
 * output flattened, one row of channels*H'*W' floats per sample. Its
 * parameters are the slice model_mlp_part_offset gives of the whole
 * model's flat parameter vector (layer first's weight and bias, ..., layer
 * last-1's bias: entries 2*first .. 2*last-1 of model_mlp_tensors), in the
 * same layout, so a party copies that slice in and out to exchange weights
 * with a model_mlp or an update.
 *
 * A part is not thread safe: one thread at a time. Functions that can fail
 * return 0 or a negative VL_E* code and describe the failure in err (which
 * may be NULL); a refused call leaves the part as it was.
 */
#ifndef VOLLEY_MODEL_MLP_PART_H
#define VOLLEY_MODEL_MLP_PART_H

#include <stddef.h>

#include "common/common.h"
#include "model/model.h"

/* Largest batch a part takes: its activations are planned for the largest
 * batch seen, and this bounds that memory whatever a peer sends. */
#define MODEL_MLP_PART_MAX_BATCH 65536

typedef struct model_mlp_part model_mlp_part;

/* ---- the slice of the whole model ------------------------------------------- */

/* The part [first, last) of cfg as a slice of the whole model's flat
 * parameter vector: *offset floats in, *count floats long (either pointer
 * may be NULL). Returns 0, or VL_EINVAL for an invalid cfg or a range
 * outside 0 <= first < last <= model_mlp_config_num_layers(cfg). */
int model_mlp_part_offset(const model_mlp_config *cfg, int first, int last, size_t *offset,
                          size_t *count, vl_error *err) VL_MUST_CHECK;

/* The width of the part's input (D for first 0, else layer first-1's
 * output width: a hidden width, or channels*H'*W' after a conv layer) and
 * of its output (C when last is the layer count, else layer last-1's
 * output width), so a party can size the activations it exchanges before
 * creating the part. Either pointer may be NULL. Returns 0 or VL_EINVAL
 * as above. */
int model_mlp_part_dims(const model_mlp_config *cfg, int first, int last, int *in_dim, int *out_dim,
                        vl_error *err) VL_MUST_CHECK;

/* ---- the part ----------------------------------------------------------------- */

/* Validates cfg and the range and creates the part with its own zeroed
 * parameter and gradient vectors (model_mlp_part_num_params floats each;
 * copy the slice of a model's parameters in through model_mlp_part_params).
 * Activations are planned on the first forward. On success *out is owned
 * by the caller (model_mlp_part_free); on failure it is NULL. Returns 0,
 * VL_EINVAL, VL_ENOMEM. */
int model_mlp_part_create(const model_mlp_config *cfg, int first, int last, model_mlp_part **out,
                          vl_error *err) VL_MUST_CHECK;

/* Frees everything the part owns. NULL is a no-op. */
void model_mlp_part_free(model_mlp_part *p);

/* The flat parameter and gradient vectors (model_mlp_part_num_params floats
 * each, laid out as the whole model's slice), owned by the part; read and
 * write in place. Never NULL for a created part. */
float *model_mlp_part_params(model_mlp_part *p);
float *model_mlp_part_grads(model_mlp_part *p);
size_t model_mlp_part_num_params(const model_mlp_part *p);

/* Zeroes the gradient vector (backward adds into it). */
void model_mlp_part_zero_grad(model_mlp_part *p);

/* The part's range [*first, *last) (either pointer may be NULL). */
void model_mlp_part_range(const model_mlp_part *p, int *first, int *last);

/* The widths of the part's input rows and output rows. */
int model_mlp_part_in_dim(const model_mlp_part *p);
int model_mlp_part_out_dim(const model_mlp_part *p);

/* 1 when the part includes the classifier layer (last ==
 * model_mlp_config_num_layers), so its output is logits and
 * model_mlp_part_loss applies; 0 otherwise. */
int model_mlp_part_has_head(const model_mlp_part *p);

/* ---- passes ------------------------------------------------------------------- */

/* Forward pass over x[B, in_dim] (row-major), 1 <= B <=
 * MODEL_MLP_PART_MAX_BATCH. Computes the output [B, out_dim]: the last
 * layer's activation after its GELU, or the logits when the part has the
 * head. x is copied, so the caller may reuse its buffer (or pass the
 * output of another part) right away; everything backward needs is kept.
 * Forgets any loss gradient of the previous batch. Returns 0, VL_EINVAL
 * (x NULL, B out of range), VL_ENOMEM. */
int model_mlp_part_forward(model_mlp_part *p, const float *x, int B, vl_error *err) VL_MUST_CHECK;

/* The [B, out_dim] output of the last forward pass, owned by the part and
 * valid until the next forward (backward and loss leave it intact). NULL
 * before any forward. */
const float *model_mlp_part_output(const model_mlp_part *p);

/* The batch size of the last forward pass, 0 before any. */
int model_mlp_part_batch(const model_mlp_part *p);

/* Only for a part with the head: the mean softmax cross-entropy of the
 * last forward's logits against labels[B] (each in [0, C)) into *loss
 * (may be NULL), computed as model_mlp_forward computes it, and the
 * gradient of that mean with respect to the logits, kept for the next
 * model_mlp_part_backward with dy NULL. labels is not kept. Returns 0 or
 * VL_EINVAL (no head, no forward yet, labels NULL or out of range). */
int model_mlp_part_loss(model_mlp_part *p, const int *labels, float *loss,
                        vl_error *err) VL_MUST_CHECK;

/* Backward pass for the last forward: ADDS the parameter gradients into
 * the gradient vector (as model_mlp_backward does, so passes accumulate
 * until model_mlp_part_zero_grad). dy[B, out_dim] is the gradient of the
 * objective with respect to the part's output (the server's dL/dZ, or the
 * dx of the part above); dy NULL uses the gradient model_mlp_part_loss
 * left, which each backward consumes (a second needs a new loss). When dx
 * is non-NULL it is OVERWRITTEN with the gradient with respect to the
 * part's input, [B, in_dim]: what the part below, or the peer that sent
 * the input, backpropagates next. dy and dx are the caller's and must not
 * overlap. Returns 0 or VL_EINVAL (no forward yet, or dy NULL without a
 * loss gradient). */
int model_mlp_part_backward(model_mlp_part *p, const float *dy, float *dx,
                            vl_error *err) VL_MUST_CHECK;

/* ---- NoPeek --------------------------------------------------------------------- */

/* The peer's NoPeek term at its cut: the distance correlation between its
 * private inputs X[B, p] and the activations Z[B, q] it sends (kernels/
 * dcor.h), into *dcor (may be NULL), and, when dZ is non-NULL, ADDS
 * alpha * d dCor(X, Z) / dZ into dZ[B, q], which should already hold the
 * server's dL/dZ; backpropagating the sum through the lower part then
 * minimises L + alpha * dCor(X, Z). scratch is
 * kernels_dcor_scratch_doubles(B) caller-owned doubles (2 B^2 + 5 B,
 * clobbered), or NULL to have it allocated and freed here. Requires
 * 2 <= B <= KERNELS_DCOR_MAX_N, 1 <= p, q <= MODEL_MLP_MAX_WIDTH and alpha
 * finite. Returns 0, VL_EINVAL, VL_ENOMEM. */
int model_mlp_part_nopeek(const float *X, int p, const float *Z, int q, int B, float alpha,
                          float *dZ, double *dcor, double *scratch, vl_error *err) VL_MUST_CHECK;

#endif
