/* Gaussian-k on the GPU (kernels/cuda_compress.h has the contract). One
 * pass sums the moments in double, one counts the values at or above the
 * model's threshold, and when that count is in the band one more compacts
 * them; otherwise the exact select of select.cu places the threshold, as
 * compress/gaussk.c's last steps do on its candidates. Partial sums are
 * per block in a fixed grid and added on the host in block order, so the
 * threshold does not change from run to run. The host waits for the
 * device three times on the usual path: for the moments, for the count,
 * and at the end; scratch comes from the cached workspace. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/compress_util.cuh"

#define GK_BLOCKS 1024
#define GK_THREADS 256
/* Counting blocks per multiprocessor: each block adds its count to the
 * total once, so few blocks keep that one address cold. */
#define GK_COUNT_BLOCKS_PER_SM 8

/* Per block: the sum and sum of squares of x - pivot, in double, reduced
 * through shared memory in a fixed tree; the pivot is x[0], the value the
 * host adds back (block 0 stores it after the sums). */
__global__ static void moments_kernel(const float *x, size_t d, double *part) {
    __shared__ double ss[GK_THREADS], sq[GK_THREADS];
    /* A value of the vector as pivot keeps the sum of squares from
     * cancelling when the mean is large next to the spread. */
    double pivot = (double)x[0];
    double s = 0.0, q = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    /* Four loads in flight before the four adds, which keep the order of
     * a plain loop over i, i + stride, ... (and so its rounding). */
    for (; i + 3 * stride < d; i += 4 * stride) {
        float a = x[i], b = x[i + stride], c = x[i + 2 * stride], e = x[i + 3 * stride];
        double v = (double)a - pivot;
        s += v;
        q += v * v;
        v = (double)b - pivot;
        s += v;
        q += v * v;
        v = (double)c - pivot;
        s += v;
        q += v * v;
        v = (double)e - pivot;
        s += v;
        q += v * v;
    }
    for (; i < d; i += stride) {
        double v = (double)x[i] - pivot;
        s += v;
        q += v * v;
    }
    ss[threadIdx.x] = s;
    sq[threadIdx.x] = q;
    __syncthreads();
    for (unsigned w = GK_THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) {
            ss[threadIdx.x] += ss[threadIdx.x + w];
            sq[threadIdx.x] += sq[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        part[2 * blockIdx.x] = ss[0];
        part[2 * blockIdx.x + 1] = sq[0];
        if (blockIdx.x == 0) part[2 * gridDim.x] = pivot;
    }
}

/* st->ge += number of keys >= kmin: per thread, then per warp, then per
 * block, and one atomic per block. */
__global__ static void count_ge_kernel(const float *x, size_t d, uint32_t kmin, cc_sel_state *st) {
    __shared__ unsigned long long part[32];
    unsigned long long c = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    /* Four loads in flight per trip. */
    for (; i + 3 * stride < d; i += 4 * stride) {
        uint32_t a = cc_key(x[i]), b = cc_key(x[i + stride]);
        uint32_t e = cc_key(x[i + 2 * stride]), f = cc_key(x[i + 3 * stride]);
        c += (a >= kmin) + (b >= kmin) + (e >= kmin) + (f >= kmin);
    }
    for (; i < d; i += stride) c += cc_key(x[i]) >= kmin;
    unsigned long long sum = cc_block_sum(c, part);
    if (threadIdx.x == 0 && sum) atomicAdd(&st->ge, sum);
}

/* st->min_above = min(itself, smallest key above t), one atomic per warp. */
__global__ static void min_above_kernel(const float *x, size_t n, uint32_t t, cc_sel_state *st) {
    unsigned best = 0xffffffffu;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t u = cc_key(x[i]);
        if (u > t && u < best) best = u;
    }
    for (int off = 16; off > 0; off /= 2) {
        unsigned o = __shfl_down_sync(0xffffffffu, best, off);
        best = o < best ? o : best;
    }
    if ((threadIdx.x & 31u) == 0 && best != 0xffffffffu) atomicMin(&st->min_above, best);
}

static float val_of(uint32_t key) {
    float v;
    memcpy(&v, &key, sizeof v);
    return v;
}

static uint32_t key_of(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7fffffffu;
}

/* The model's threshold |mean| + std * z(k/d) from the exact moments. */
static int model_threshold(cc_sel *s, const float *d_x, size_t d, size_t k, float *thr0,
                           vl_error *err) {
    moments_kernel<<<GK_BLOCKS, GK_THREADS>>>(d_x, d, s->part);
    int rc = cc_launched(err, "gaussk moments launch");
    if (rc) return rc;
    double part[2 * GK_BLOCKS + 1];
    if ((rc = cc_readback(*s->ws, part, s->part, sizeof part, err)) != 0) return rc;
    double pivot = part[2 * GK_BLOCKS];
    double sum = 0.0, q = 0.0;
    for (int b = 0; b < GK_BLOCKS; b++) {
        sum += part[2 * b];
        q += part[2 * b + 1];
    }
    double ms = sum / (double)d, var = q / (double)d - ms * ms;
    double mean = pivot + ms, sd = var > 0 ? sqrt(var) : 0.0;
    double t0 = fabs(mean) + sd * compress_gaussk_z((double)k / (double)d);
    *thr0 = (float)(t0 < FLT_MAX ? t0 : FLT_MAX);
    return 0;
}

static int count_ge(cc_sel *s, const float *d_x, size_t d, uint32_t kmin, size_t *count,
                    vl_error *err) {
    size_t blocks = (size_t)s->ws->sms() * GK_COUNT_BLOCKS_PER_SM, want = cc_blocks(d);
    blocks = blocks < want ? blocks : want;
    count_ge_kernel<<<(unsigned)blocks, CC_THREADS>>>(d_x, d, kmin, s->st);
    int rc = cc_launched(err, "gaussk count launch");
    if (rc) return rc;
    cc_sel_state h;
    if ((rc = cc_readback(*s->ws, &h, s->st, sizeof h, err)) != 0) return rc;
    *count = (size_t)h.ge;
    return 0;
}

/* The threshold from an exact select, as compress/gaussk.c's gk_finish
 * does when the model's count is out of the band. */
static int finish_exact(cc_sel *s, const float *d_x, size_t d, size_t k, size_t band_lo,
                        size_t band_hi, uint32_t *d_idx, size_t *nnz, double *thr, vl_error *err) {
    int rc = cc_select_find(d_x, d, k, s, err);
    if (rc == 0) rc = cc_select_fetch(s, err);
    if (rc) return rc;
    size_t ge = s->gt + s->eq;
    if (ge <= band_hi) {
        /* The k-th largest value counts within the band. */
        if ((rc = cc_select_emit(s, s->vals, s->map, s->n, s->t, INT64_MAX, d_idx, ge, err)) != 0 ||
            (rc = cc_select_check(s, nullptr, err)) != 0)
            return rc;
        *nnz = ge;
        *thr = val_of(s->t);
        return 0;
    }
    if (s->gt >= band_lo) {
        /* Ties at it overshoot; the next value up still reaches the band. */
        min_above_kernel<<<cc_blocks(s->n), CC_THREADS>>>(s->vals, s->n, s->t, s->st);
        cc_sel_state h;
        if ((rc = cc_launched(err, "gaussk min launch")) != 0 ||
            (rc = cc_select_emit(s, s->vals, s->map, s->n, s->t, -1, d_idx, s->gt, err)) != 0 ||
            (rc = cc_select_check(s, &h, err)) != 0)
            return rc;
        *nnz = s->gt;
        *thr = val_of(h.min_above);
        return 0;
    }
    /* Ties straddle the whole band: exactly k, the lowest indices first. */
    if ((rc = cc_select_emit_top(s, d_idx, k, err)) != 0 ||
        (rc = cc_select_check(s, nullptr, err)) != 0)
        return rc;
    *nnz = k;
    *thr = val_of(s->t);
    return 0;
}

/* Gaussian-k of 1 <= k < d under one lease. */
static int gaussk_select(const float *d_x, size_t d, size_t k, uint32_t *d_idx, size_t *nnz,
                         double *thr, vl_error *err) {
    size_t band_lo = k - k / 20, band_hi = k + k / 20;
    cc_lease ws;
    cc_sel s;
    float thr0 = 0.0f;
    size_t c0 = 0;
    int rc = ws.open(err);
    if (rc == 0) rc = cc_select_open(&ws, d, GK_BLOCKS + 1, &s, err);
    if (rc == 0) rc = model_threshold(&s, d_x, d, k, &thr0, err);
    if (rc == 0) rc = count_ge(&s, d_x, d, key_of(thr0), &c0, err);
    if (rc == 0 && c0 >= band_lo && c0 <= band_hi) {
        rc = cc_select_emit(&s, d_x, nullptr, d, key_of(thr0), INT64_MAX, d_idx, c0, err);
        if (rc == 0) rc = cc_select_check(&s, nullptr, err);
        *nnz = c0;
        *thr = thr0;
    } else if (rc == 0) {
        rc = finish_exact(&s, d_x, d, k, band_lo, band_hi, d_idx, nnz, thr, err);
    }
    if (rc) {
        /* Nothing of this call may still run once the lease is given back. */
        vl_error ignore;
        (void)cc_sync(&ignore, "gaussk");
    }
    return rc;
}

extern "C" int kernels_cuda_gaussk(const float *d_x, size_t d, size_t k, uint32_t *d_idx,
                                   size_t *nnz, double *thr, vl_error *err) {
    if (nnz) *nnz = 0;
    if (!nnz || (d > 0 && k > 0 && (!d_x || !d_idx)))
        return vl_fail(err, VL_EINVAL, "gaussk: null argument");
    if ((uint64_t)d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "gaussk: %zu values do not fit 32-bit indices", d);
    double t = HUGE_VAL;
    int rc = 0;
    size_t n = 0;
    if (d == 0 || k == 0) {
        /* Nothing selected. */
    } else if (k >= d) {
        rc = cc_iota(d_idx, d, err);
        if (rc == 0) rc = cc_sync(err, "gaussk");
        n = d;
        t = 0.0;
    } else {
        rc = gaussk_select(d_x, d, k, d_idx, &n, &t, err);
    }
    if (rc) return rc;
    *nnz = n;
    if (thr) *thr = t;
    return 0;
}

extern "C" int kernels_cuda_gaussk_host(const float *x, size_t d, size_t k, uint32_t *idx,
                                        size_t *nnz, double *thr, vl_error *err) {
    if (nnz) *nnz = 0;
    if (!nnz || (d > 0 && k > 0 && (!x || !idx)))
        return vl_fail(err, VL_EINVAL, "gaussk: null argument");
    if ((uint64_t)d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "gaussk: %zu values do not fit 32-bit indices", d);
    if (d == 0 || k == 0) {
        if (thr) *thr = HUGE_VAL;
        return 0;
    }
    size_t room = k < d ? COMPRESS_GAUSSK_CAP(k) : d;
    cc_dev dx, di;
    int rc;
    size_t got = 0;
    if ((rc = cc_upload(dx, x, d, err)) != 0 ||
        (rc = cc_upload<uint32_t>(di, nullptr, room, err)) != 0 ||
        (rc = kernels_cuda_gaussk(dx.as<float>(), d, k, di.as<uint32_t>(), &got, thr, err)) != 0 ||
        (rc = cc_copy(idx, di.p, got * sizeof(uint32_t), cudaMemcpyDeviceToHost, err)) != 0)
        return rc;
    *nnz = got;
    return 0;
}
