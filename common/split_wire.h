/*
 * split_wire: the messages of split learning, one encoder and one checking
 * decoder each, shared by the peer that sends activations and the
 * coordinator that answers.
 *
 * Forward request (POST /v1/split/forward): safetensors with "z" (F32 or
 * F16, [B, q]: the cut layer's activations of a batch) and, unless the
 * run is U-shaped, "labels" (I32, [B]); metadata run, peer and task (the
 * lease the batch is trained under). Backward request (POST
 * /v1/split/backward, U-shaped runs): "z" again and "dy" ([B, h], z's
 * dtype: the gradient of the peer's loss at the coordinator's output).
 * Replies: one tensor, "dz" (dL/dZ, [B, q]) or, to a U-shaped forward,
 * "y" (the coordinator's output, [B, h]), in the request's dtype, with
 * metadata "step" (the coordinator's step count for its layers) and, when
 * the coordinator computed it, "loss" (nats). Nothing else travels: no
 * input, no parameter of the peer's layers, and in a U-shaped run no
 * label.
 */
#ifndef VOLLEY_COMMON_SPLIT_WIRE_H
#define VOLLEY_COMMON_SPLIT_WIRE_H

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bound on B and q: a request's floats are at most this many (64 MiB of
 * F32), whatever the run allows. */
#define SPLIT_WIRE_MAX_VALUES ((size_t)1 << 24)
/* The most batches a peer may have at the coordinator at once (the run's
 * split.in_flight is 1 to this). */
#define SPLIT_WIRE_MAX_IN_FLIGHT 8

/* A decoded request. z, labels and dy are owned (split_wire_forward_free). */
typedef struct split_wire_forward {
    char run[64];
    int64_t peer, task;
    st_dtype dtype; /* the dtype z came in, which the reply uses */
    int B, q, h;
    float *z;    /* [B, q] */
    int *labels; /* [B]; NULL in a U-shaped run */
    float *dy;   /* [B, h]; backward requests only */
} split_wire_forward;

/* Appends a forward request for z [B, q] (sent as dtype, F32 or F16) and
 * labels [B] (NULL: a U-shaped run's, which carry none) to out. Returns
 * 0, VL_EINVAL (bad arguments or sizes), VL_ENOMEM. */
int split_wire_encode_forward(const char *run, int64_t peer, int64_t task, const float *z, int B,
                              int q, st_dtype dtype, const int *labels, vl_buf *out,
                              vl_error *err) VL_MUST_CHECK;

/* Appends a backward request: z [B, q] and dy [B, h], both as dtype. */
int split_wire_encode_backward(const char *run, int64_t peer, int64_t task, const float *z,
                               const float *dy, int B, int q, int h, st_dtype dtype, vl_buf *out,
                               vl_error *err) VL_MUST_CHECK;

/* Decodes and checks a forward request: the file, its metadata, z of
 * width q with 1..max_batch rows, and labels with as many entries, each
 * in [0, classes) (classes 0: a U-shaped run, where a labels tensor is
 * refused). With h > 0 it is a backward request instead: dy [B, h] in
 * place of labels. On success *out holds copies (free with
 * split_wire_forward_free). On failure *code names the HTTP error:
 * "malformed" (VL_EINVAL: not a request at all, 400), or, for a
 * well-formed request whose content is wrong (VL_ERANGE, 422),
 * "bad_shape", "bad_dtype", "bad_batch", "non_finite" or "bad_label".
 * VL_ENOMEM on allocation failure. After a VL_ERANGE failure, run, peer
 * and task still hold what the metadata said (the coordinator checks the
 * lease before it answers about content). */
int split_wire_decode_forward(const uint8_t *body, size_t len, int q, int h, int max_batch,
                              int classes, split_wire_forward *out, const char **code,
                              vl_error *err) VL_MUST_CHECK;
void split_wire_forward_free(split_wire_forward *f);

/* Appends a reply: tensor `name` ("dz" or "y"), x [B, width] as dtype,
 * the step count and, unless it is NaN, the loss. Returns 0, VL_EINVAL,
 * VL_ENOMEM. */
int split_wire_encode_reply(const char *name, const float *x, int B, int width, st_dtype dtype,
                            double loss, int64_t step, vl_buf *out, vl_error *err) VL_MUST_CHECK;

/* Decodes a reply holding tensor `name` for a batch of B rows of width
 * `width` into x (caller's, B*width floats), *loss (NaN when the reply
 * carries none; may be NULL) and *step (may be NULL). Everything is
 * checked before x is written: the one tensor's shape, dtype, finite
 * values and loss. Returns 0 or VL_EINVAL. */
int split_wire_decode_reply(const uint8_t *body, size_t len, const char *name, int B, int width,
                            float *x, double *loss, int64_t *step, vl_error *err) VL_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
