/* NoPeek's term on the peer's CPU or GPU (peer/nopeek.h). */
#include <stdlib.h>
#include <string.h>

#include "kernels/dcor.h"
#include "model/mlp_part.h"
#include "peer/nopeek.h"

#if defined(VOLLEY_HAVE_CUDA)
#include "kernels/cuda_compress.h"
#include "kernels/cuda_model.h"
#endif

void peer_nopeek_to_cpu(peer_nopeek *n) {
#if defined(VOLLEY_HAVE_CUDA)
    kernels_cuda_free(n->d_x);
    kernels_cuda_free(n->d_z);
    kernels_cuda_free(n->d_dz);
    kernels_cuda_free(n->d_scratch);
#endif
    n->d_x = n->d_z = n->d_dz = n->d_scratch = NULL;
    n->on_gpu = 0;
}

void peer_nopeek_free(peer_nopeek *n) {
    peer_nopeek_to_cpu(n);
    free(n->scratch);
    free(n->add);
    memset(n, 0, sizeof *n);
}

int peer_nopeek_init(peer_nopeek *n, int gpu, int B, int p, int q, vl_error *err) {
    memset(n, 0, sizeof *n);
    if (B < 2 || B > KERNELS_DCOR_MAX_N || p < 1 || q < 1)
        return vl_fail(err, VL_EINVAL, "NoPeek: %d rows of widths %d and %d are outside its range",
                       B, p, q);
    n->B = B;
    n->p = p;
    n->q = q;
    n->scratch = malloc(kernels_dcor_scratch_doubles(B) * sizeof *n->scratch);
    n->add = malloc((size_t)B * (size_t)q * sizeof *n->add);
    if (!n->scratch || !n->add) {
        peer_nopeek_free(n);
        return vl_fail(err, VL_ENOMEM, "NoPeek: out of memory for %d rows", B);
    }
    if (!gpu) return VL_OK;
#if defined(VOLLEY_HAVE_CUDA)
    int rc = kernels_cuda_alloc(&n->d_x, (size_t)B * (size_t)p * sizeof(float), err);
    if (!rc) rc = kernels_cuda_alloc(&n->d_z, (size_t)B * (size_t)q * sizeof(float), err);
    if (!rc) rc = kernels_cuda_alloc(&n->d_dz, (size_t)B * (size_t)q * sizeof(float), err);
    if (!rc)
        rc = kernels_cuda_alloc(&n->d_scratch, kernels_dcor_scratch_doubles(B) * sizeof(double),
                                err);
    if (rc) {
        peer_nopeek_free(n);
        return rc;
    }
    n->on_gpu = 1;
    return VL_OK;
#else
    peer_nopeek_free(n);
    return vl_fail(err, VL_EINVAL, "NoPeek: this build has no CUDA");
#endif
}

int peer_nopeek_add(peer_nopeek *n, const float *X, const float *Z, float alpha, float *dZ,
                    double *dcor, vl_error *err) {
    if (!n->on_gpu)
        return model_mlp_part_nopeek(X, n->p, Z, n->q, n->B, alpha, dZ, dcor, n->scratch, err);
#if defined(VOLLEY_HAVE_CUDA)
    /* The device's term lands in a buffer of its own and is added here, so
     * a failure halfway leaves dZ whole for the CPU to try again. */
    const size_t nz = (size_t)n->B * (size_t)n->q;
    memset(n->add, 0, nz * sizeof *n->add);
    int rc = kernels_cuda_upload(n->d_x, X, (size_t)n->B * (size_t)n->p * sizeof(float), err);
    if (!rc) rc = kernels_cuda_upload(n->d_z, Z, nz * sizeof(float), err);
    if (!rc) rc = kernels_cuda_upload(n->d_dz, n->add, nz * sizeof(float), err);
    double v = 0;
    if (!rc)
        rc = kernels_cuda_dcor(n->d_dz, n->d_x, n->d_z, n->B, n->p, n->q, alpha, n->d_scratch, &v,
                               err);
    if (!rc) rc = kernels_cuda_download(n->add, n->d_dz, nz * sizeof(float), err);
    if (rc) return rc;
    for (size_t i = 0; i < nz; i++) dZ[i] += n->add[i];
    if (dcor) *dcor = v;
    return VL_OK;
#else
    return vl_fail(err, VL_EINVAL, "NoPeek: this build has no CUDA");
#endif
}
