/* Device memory with an optional cap on what this process holds.
 *
 * A volunteer lends a GPU they also use for other things, so a peer can be
 * told never to hold more than so many bytes of device memory
 * (volley-peer run --gpu-mem). The cap is enforced where volley allocates:
 * every buffer of the device model, the compressors and the peer goes
 * through kernels_cuda_alloc, which refuses an allocation past the cap
 * exactly as cudaMalloc refuses one past the card's memory
 * (cudaErrorMemoryAllocation, so callers take the same path for both).
 * The CUDA context and cuBLAS's own workspace are the driver's and are
 * not counted. Live allocations are kept in a small table under a mutex so
 * a free gives back its size; there are a few dozen at a time. */
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda_model.h"

/* More live buffers than any path of volley holds at once, by far. */
#define MEM_SLOTS 4096

typedef struct {
    void *p;
    size_t bytes;
} mem_slot;

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static mem_slot mem_live[MEM_SLOTS];
static size_t mem_in_use, mem_cap; /* mem_cap 0: no cap */

extern "C" void kernels_cuda_set_mem_cap(size_t bytes) {
    pthread_mutex_lock(&mem_lock);
    mem_cap = bytes;
    pthread_mutex_unlock(&mem_lock);
}

extern "C" size_t kernels_cuda_mem_in_use(void) {
    pthread_mutex_lock(&mem_lock);
    size_t n = mem_in_use;
    pthread_mutex_unlock(&mem_lock);
    return n;
}

/* The compressors' cached scratch (workspace.cu), dropped before an
 * allocation is refused for lack of memory, so a cache never costs a
 * caller memory it would otherwise get. */
extern "C" int cc_ws_release_idle(void);

static int alloc_once(void **d_out, size_t bytes, vl_error *err);

extern "C" int kernels_cuda_alloc(void **d_out, size_t bytes, vl_error *err) {
    int rc = alloc_once(d_out, bytes, err);
    if (rc == VL_ENOMEM && cc_ws_release_idle()) rc = alloc_once(d_out, bytes, err);
    return rc;
}

static int alloc_once(void **d_out, size_t bytes, vl_error *err) {
    if (d_out == NULL || bytes == 0)
        return vl_fail(err, VL_EINVAL, "cuda alloc: no pointer or zero bytes");
    *d_out = NULL;
    pthread_mutex_lock(&mem_lock);
    int slot = -1;
    for (int i = 0; i < MEM_SLOTS && slot < 0; i++)
        if (mem_live[i].p == NULL) slot = i;
    if (slot < 0) {
        pthread_mutex_unlock(&mem_lock);
        return vl_fail(err, VL_ENOMEM, "cuda alloc: more than %d live device buffers", MEM_SLOTS);
    }
    if (mem_cap && (bytes > mem_cap || mem_in_use > mem_cap - bytes)) {
        char what[160];
        snprintf(what, sizeof what, "cudaMalloc of %zu bytes (%zu held, cap %zu)", bytes,
                 mem_in_use, mem_cap);
        pthread_mutex_unlock(&mem_lock);
        return cuda_fail(err, cudaErrorMemoryAllocation, what);
    }
    cudaError_t e = cudaMalloc(d_out, bytes);
    if (e != cudaSuccess) {
        pthread_mutex_unlock(&mem_lock);
        (void)cudaGetLastError();
        *d_out = NULL;
        return cuda_fail(err, e, "cudaMalloc");
    }
    mem_live[slot].p = *d_out;
    mem_live[slot].bytes = bytes;
    mem_in_use += bytes;
    pthread_mutex_unlock(&mem_lock);
    return 0;
}

extern "C" void kernels_cuda_free(void *d) {
    if (d == NULL) return;
    /* cudaFree would wait for the device anyway; waiting here first makes
     * it plain that no queued kernel still reads the buffer. */
    (void)cudaDeviceSynchronize();
    (void)cudaFree(d);
    pthread_mutex_lock(&mem_lock);
    for (int i = 0; i < MEM_SLOTS; i++)
        if (mem_live[i].p == d) {
            mem_in_use -= mem_live[i].bytes;
            mem_live[i].p = NULL;
            mem_live[i].bytes = 0;
            break;
        }
    pthread_mutex_unlock(&mem_lock);
}
