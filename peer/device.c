/* Which device a peer trains on (--device auto|cpu|cuda).
 *
 * A volunteer should not have to know whether its machine has a usable
 * GPU: auto takes one when the build has CUDA and the driver reports a
 * device, and otherwise trains on the CPU and says why in one line. Asking
 * for cuda where there is none is an error, not a silent fallback, so an
 * operator who wanted the GPU finds out at start-up. */
#include <stdio.h>
#include <string.h>

#include "peer/peer.h"

#if defined(VOLLEY_HAVE_CUDA)
#include "kernels/kernels.h"
#endif

int peer_device_parse(const char *s, peer_device_want *out) {
    if (!s) return VL_EINVAL;
    if (strcmp(s, "auto") == 0) *out = PEER_DEVICE_WANT_AUTO;
    else if (strcmp(s, "cpu") == 0) *out = PEER_DEVICE_WANT_CPU;
    else if (strcmp(s, "cuda") == 0) *out = PEER_DEVICE_WANT_CUDA;
    else return VL_EINVAL;
    return VL_OK;
}

/* Whether a GPU is usable; desc gets its description or why not. */
static int probe_gpu(char *desc, size_t cap) {
#if defined(VOLLEY_HAVE_CUDA)
    int n = kernels_cuda_device_count();
    kernels_cuda_describe(desc, cap);
    return n > 0;
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
