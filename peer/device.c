/* Which device a peer trains on (--device auto|cpu|cuda).
 *
 * A volunteer should not have to know whether its machine has a usable
 * GPU: auto takes one when the build has CUDA and the driver reports a
 * device, and otherwise trains on the CPU and says why in one line (a GPU
 * that is present but unusable is named as such, with the runtime's
 * error). Asking for cuda where there is none is an error, not a silent
 * fallback, so an operator who wanted the GPU finds out at start-up. */
#include <stdio.h>
#include <string.h>

#include "peer/peer.h"

#if defined(VOLLEY_HAVE_CUDA)
#include "kernels/kernels.h"
#endif

int peer_device_parse(const char *s, peer_device_want *out) {
    if (!s) return VL_EINVAL;
    if (strcmp(s, "auto") == 0)
        *out = PEER_DEVICE_WANT_AUTO;
    else if (strcmp(s, "cpu") == 0)
        *out = PEER_DEVICE_WANT_CPU;
    else if (strcmp(s, "cuda") == 0)
        *out = PEER_DEVICE_WANT_CUDA;
    else
        return VL_EINVAL;
    return VL_OK;
}

/* Whether a GPU is usable; desc gets its description or why not. A GPU
 * that is there but unusable (a driver older than the runtime, say) is
 * told apart from no GPU at all: auto still trains on the CPU, but the
 * operator of a GPU machine should learn that its GPU sits idle. */
static int probe_gpu(char *desc, size_t cap) {
#if defined(VOLLEY_HAVE_CUDA)
    char why[192]; /* leaves room for the words around it in desc */
    int n = 0;
    int st = kernels_cuda_probe(&n, why, sizeof why);
    if (st == KERNELS_CUDA_OK) {
        kernels_cuda_describe(desc, cap);
        return 1;
    }
    if (st == KERNELS_CUDA_BROKEN)
        snprintf(desc, cap, "a GPU is present but unusable: %s", why);
    else
        snprintf(desc, cap, "%s", why);
    return 0;
#else
    snprintf(desc, cap, "this volley-peer was built without CUDA");
    return 0;
#endif
}

int peer_device_choose(peer_device_want want, peer_device *out, vl_error *err) {
    memset(out, 0, sizeof *out);
    if (want == PEER_DEVICE_WANT_CPU) {
        out->kind = PEER_DEVICE_CPU;
        snprintf(out->desc, sizeof out->desc, "the CPU (--device cpu)");
        return VL_OK;
    }
    char why[sizeof out->desc - 64];
    if (probe_gpu(why, sizeof why)) {
        out->kind = PEER_DEVICE_CUDA;
        snprintf(out->desc, sizeof out->desc, "CUDA device 0: %s", why);
        return VL_OK;
    }
    if (want == PEER_DEVICE_WANT_CUDA)
        return vl_fail(err, VL_EINVAL, "--device cuda: no usable GPU (%s)", why);
    out->kind = PEER_DEVICE_CPU;
    snprintf(out->desc, sizeof out->desc, "the CPU (no usable GPU: %s)", why);
    return VL_OK;
}
