/* The compressors' cached scratch memory (compress_util.cuh has the
 * rules). One lock covers every device's workspace: a process drives one
 * GPU as a rule, and a lease must hold it while its kernels may still run,
 * which is until the call that opened it has waited for the device. The
 * buffers go through kernels_cuda_alloc, so the process's device-memory
 * cap counts them, and when an allocation elsewhere would fail for lack
 * of memory, memory.cu first drops these (cc_ws_release_idle). */
#include <pthread.h>
#include <string.h>

#include "kernels/cuda/compress_util.cuh"

#define WS_MAX_DEVICES 64

struct cc_ws {
    int dev = 0;
    int sms = 0;
    void *buf[CC_WS_SLOTS] = {};
    size_t bytes[CC_WS_SLOTS] = {};
    void *pinned = nullptr;
    unsigned long long epoch = 0;
};

static pthread_mutex_t ws_lock = PTHREAD_MUTEX_INITIALIZER;
static cc_ws ws_of[WS_MAX_DEVICES];

static size_t ws_cached(const cc_ws *w) {
    size_t n = 0;
    for (int i = 0; i < CC_WS_SLOTS; i++) n += w->bytes[i];
    return n;
}

/* Frees w's buffers (ws_lock held, no lease on w open). */
static int ws_drop(cc_ws *w) {
    int any = 0, cur = -1;
    for (int i = 0; i < CC_WS_SLOTS; i++) any |= w->buf[i] != nullptr;
    if (!any && !w->pinned) return 0;
    /* kernels_cuda_free waits for the current device: make that the
     * buffers' own. */
    if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
    if (cur != w->dev) (void)cudaSetDevice(w->dev);
    for (int i = 0; i < CC_WS_SLOTS; i++) {
        kernels_cuda_free(w->buf[i]);
        w->buf[i] = nullptr;
        w->bytes[i] = 0;
    }
    if (w->pinned) (void)cudaFreeHost(w->pinned);
    w->pinned = nullptr;
    if (cur >= 0 && cur != w->dev) (void)cudaSetDevice(cur);
    return 1;
}

extern "C" void kernels_cuda_compress_release(void) {
    pthread_mutex_lock(&ws_lock);
    for (int d = 0; d < WS_MAX_DEVICES; d++) (void)ws_drop(&ws_of[d]);
    pthread_mutex_unlock(&ws_lock);
}

extern "C" int cc_ws_release_idle(void) {
    /* A lease in progress (perhaps this very thread, growing a slot) keeps
     * its buffers; trylock also refuses the thread that holds the lock. */
    if (pthread_mutex_trylock(&ws_lock) != 0) return 0;
    int any = 0;
    for (int d = 0; d < WS_MAX_DEVICES; d++) any |= ws_drop(&ws_of[d]);
    pthread_mutex_unlock(&ws_lock);
    return any;
}

extern "C" size_t kernels_cuda_compress_cached(void) {
    pthread_mutex_lock(&ws_lock);
    size_t n = 0;
    for (int d = 0; d < WS_MAX_DEVICES; d++) n += ws_cached(&ws_of[d]);
    pthread_mutex_unlock(&ws_lock);
    return n;
}

int cc_lease::open(vl_error *err) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return cuda_fail(err, e, "cudaGetDevice");
    if (dev < 0 || dev >= WS_MAX_DEVICES)
        return vl_fail(err, VL_ERR, "compress workspace: device %d past %d", dev, WS_MAX_DEVICES);
    pthread_mutex_lock(&ws_lock);
    cc_ws *w = &ws_of[dev];
    w->dev = dev;
    if (w->sms <= 0) {
        int sms = 0;
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) {
            pthread_mutex_unlock(&ws_lock);
            return cuda_fail(err, e, "device attributes");
        }
        w->sms = sms > 0 ? sms : 1;
    }
    if (!w->pinned) {
        e = cudaMallocHost(&w->pinned, CC_WS_PINNED);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            w->pinned = nullptr;
            pthread_mutex_unlock(&ws_lock);
            return cuda_fail(err, e, "cudaMallocHost");
        }
    }
    ws = w;
    return 0;
}

cc_lease::~cc_lease() {
    /* The own buffers go first (their free waits for the device), then the
     * lock, so the next lease finds nothing of this call still running. */
    for (int i = 0; i < CC_WS_SLOTS; i++) {
        kernels_cuda_free(own[i].p);
        own[i].p = nullptr;
    }
    if (ws) pthread_mutex_unlock(&ws_lock);
}

int cc_lease::get(int slot, size_t bytes, void **p, vl_error *err) {
    *p = nullptr;
    if (!ws || slot < 0 || slot >= CC_WS_SLOTS)
        return vl_fail(err, VL_ERR, "compress workspace: no lease or bad slot");
    bytes = cc_align(bytes ? bytes : 1);
    if (own[slot].p) {
        /* An earlier ask of this call went past the cap; never reused. */
        kernels_cuda_free(own[slot].p);
        own[slot].p = nullptr;
    }
    if (ws->bytes[slot] >= bytes) {
        *p = ws->buf[slot];
        return 0;
    }
    /* Too small: the old buffer goes (its free waits for the kernels of
     * this call that may still use it, queued before this point). */
    kernels_cuda_free(ws->buf[slot]);
    ws->buf[slot] = nullptr;
    ws->bytes[slot] = 0;
    int rc;
    void *q = nullptr;
    if (ws_cached(ws) + bytes > CC_WS_CAP) {
        if ((rc = own[slot].alloc(bytes, err)) != 0) return rc;
        q = own[slot].p;
    } else {
        /* A little headroom, so sizes that creep up do not reallocate on
         * every call. */
        size_t want = cc_align(bytes + bytes / 8);
        if (ws_cached(ws) + want > CC_WS_CAP) want = bytes;
        if ((rc = kernels_cuda_alloc(&q, want, err)) != 0) return rc;
        ws->buf[slot] = q;
        ws->bytes[slot] = want;
        bytes = want;
    }
    /* Zeroed, so flags written with an epoch never read as a current one. */
    cudaError_t e = cudaMemset(q, 0, bytes);
    if (e != cudaSuccess) return cuda_fail(err, e, "cudaMemset");
    *p = q;
    return 0;
}

void *cc_lease::pinned() const {
    return ws ? ws->pinned : nullptr;
}

int cc_lease::sms() const {
    return ws ? ws->sms : 1;
}

unsigned long long cc_lease::next_epoch() {
    return ++ws->epoch;
}

int cc_readback(const cc_lease &ws, void *dst, const void *d_src, size_t bytes, vl_error *err) {
    if (bytes > CC_WS_PINNED || !ws.pinned())
        return vl_fail(err, VL_ERR, "readback of %zu bytes past the pinned buffer", bytes);
    int rc = cc_copy(ws.pinned(), d_src, bytes, cudaMemcpyDeviceToHost, err);
    if (rc == 0) memcpy(dst, ws.pinned(), bytes);
    return rc;
}
