/*
 * split_wire: the messages of split learning's POST /v1/split/forward, one
 * encoder and one checking decoder each, shared by the peer that sends
 * activations and the coordinator that answers with their gradient.
 *
 * Request: safetensors with "z" (F32 or F16, [B, q]: the cut layer's
 * activations of a batch) and "labels" (I32, [B]), metadata run, peer and
 * task (the lease the batch is trained under). Reply: safetensors with
 * "dz" (the request's dtype, [B, q]: dL/dZ of the batch's mean loss) and
 * metadata "loss" (that loss, nats) and "step" (the coordinator's step
 * count for its layers after this batch). Nothing else travels: no input,
 * no parameter of the peer's layers.
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

/* A decoded request. z and labels are owned (split_wire_forward_free). */
typedef struct split_wire_forward {
    char run[64];
    int64_t peer, task;
    st_dtype dtype; /* the dtype z came in, which the reply uses */
    int B, q;
    float *z;    /* [B, q] */
    int *labels; /* [B] */
} split_wire_forward;

/* Appends the request for z [B, q] (sent as dtype, F32 or F16) and
 * labels [B] to out. Returns 0, VL_EINVAL (bad arguments or sizes),
 * VL_ENOMEM. */
int split_wire_encode_forward(const char *run, int64_t peer, int64_t task, const float *z,
                              int B, int q, st_dtype dtype, const int *labels, buf *out,
                              vl_error *err) VL_MUST_CHECK;

/* Decodes and checks a request: the file, its metadata, z of width q with
 * 1..max_batch rows, labels with as many entries, each in [0, classes).
 * On success *out holds copies (free with split_wire_forward_free). On
 * failure *code names the HTTP error: "malformed" (VL_EINVAL: not a
 * request at all, 400), or, for a well-formed request whose content is
 * wrong (VL_ERANGE, 422), "bad_shape", "bad_dtype", "bad_batch",
 * "non_finite" or "bad_label". VL_ENOMEM on allocation failure. After a
 * VL_ERANGE failure, run, peer and task still hold what the metadata said
 * (the coordinator checks the lease before it answers about content). */
int split_wire_decode_forward(const uint8_t *body, size_t len, int q, int max_batch,
                              int classes, split_wire_forward *out, const char **code,
                              vl_error *err) VL_MUST_CHECK;
void split_wire_forward_free(split_wire_forward *f);

/* Appends the reply: dz [B, q] as dtype, the batch's loss and the step
 * count. Returns 0, VL_EINVAL, VL_ENOMEM. */
int split_wire_encode_reply(const float *dz, int B, int q, st_dtype dtype, double loss,
                            int64_t step, buf *out, vl_error *err) VL_MUST_CHECK;

/* Decodes a reply for a batch of B rows of width q into dz (caller's,
 * B*q floats), *loss and *step (may be NULL). Everything is checked
 * before dz is written: shape, dtype, finite values and loss. Returns 0
 * or VL_EINVAL. */
int split_wire_decode_reply(const uint8_t *body, size_t len, int B, int q, float *dz,
                            double *loss, int64_t *step, vl_error *err) VL_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
