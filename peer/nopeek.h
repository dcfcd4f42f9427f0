/*
 * NoPeek on a split-learning peer: the distance-correlation term
 * (kernels/dcor.h) that the peer adds, scaled by alpha, to the gradient it
 * got back for its cut activations, so that what it sends reveals less of
 * its images. It runs on the GPU when the peer trains on one, with
 * buffers kept for the whole task (a batch then costs two uploads, the
 * kernel and one download), and on the CPU otherwise; both follow the
 * same order of summation, so they agree to rounding.
 */
#ifndef VOLLEY_PEER_NOPEEK_H
#define VOLLEY_PEER_NOPEEK_H

#include "common/common.h"

typedef struct peer_nopeek {
    int B, p, q;     /* batch rows, input and cut widths */
    double *scratch; /* owned, host: kernels_dcor_scratch_doubles(B) */
    float *add;      /* owned, host [B, q]: the device's term before it is added */
    int on_gpu;
    void *d_x, *d_z, *d_dz, *d_scratch; /* owned, device, when on_gpu */
} peer_nopeek;

/* Sets n up for batches of B rows of p inputs and q activations, on the
 * GPU when gpu is non-zero (VL_EINVAL in a build without CUDA). On
 * failure n holds nothing and needs no peer_nopeek_free. */
int peer_nopeek_init(peer_nopeek *n, int gpu, int B, int p, int q, vl_error *err) VL_MUST_CHECK;

/* *dcor = dCor(X, Z) for X [B,p] and Z [B,q], and ADDS alpha * d dCor/dZ
 * into dZ [B,q]. A failure on the device leaves dZ as it was, so the
 * caller may move n to the CPU (peer_nopeek_to_cpu) and call again. */
int peer_nopeek_add(peer_nopeek *n, const float *X, const float *Z, float alpha, float *dZ,
                    double *dcor, vl_error *err) VL_MUST_CHECK;

/* Gives the device buffers back; later batches run on the CPU. */
void peer_nopeek_to_cpu(peer_nopeek *n);

/* Frees what n holds (a zeroed n is fine) and zeroes it. */
void peer_nopeek_free(peer_nopeek *n);

#endif
