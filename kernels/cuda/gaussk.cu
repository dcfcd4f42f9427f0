/* Gaussian-k on the GPU (kernels/cuda_compress.h has the contract). One
 * pass sums the moments in double, one counts the values at or above the
 * model's threshold, and when that count is in the band one more compacts
 * them; otherwise the exact select of select.cu places the threshold, as
 * compress/gaussk.c's last steps do on its candidates. Partial sums are
 * per block in a fixed grid and added on the host in block order, so the
 * threshold does not change from run to run. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/compress_util.cuh"

#define GK_BLOCKS 1024
#define GK_THREADS 256

/* Per block: the sum and sum of squares of x - pivot, in double, reduced
 * through shared memory in a fixed tree. */
__global__ static void moments_kernel(const float *x, size_t d, double pivot, double *part)
{
    __shared__ double ss[GK_THREADS], sq[GK_THREADS];
    double s = 0.0, q = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < d; i += stride) {
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
    }
}

/* *count += number of keys >= kmin. */
__global__ static void count_ge_kernel(const float *x, size_t d, uint32_t kmin,
                                       unsigned long long *count)
{
    unsigned long long c = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < d; i += stride)
        c += cc_key(x[i]) >= kmin;
    for (int off = 16; off > 0; off /= 2)
        c += __shfl_down_sync(0xffffffffu, c, off);
    if ((threadIdx.x & 31) == 0 && c)
        atomicAdd(count, c);
}

/* *m = min(*m, smallest key above t). */
__global__ static void min_above_kernel(const float *x, size_t n, uint32_t t, unsigned *m)
{
    unsigned best = 0xffffffffu;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t u = cc_key(x[i]);
        if (u > t && u < best)
            best = u;
    }
    if (best != 0xffffffffu)
        atomicMin(m, best);
}

static float val_of(uint32_t key)
{
    float v;
    memcpy(&v, &key, sizeof v);
    return v;
}

static uint32_t key_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7fffffffu;
}

/* The model's threshold |mean| + std * z(k/d) from the exact moments. */
static int model_threshold(const float *d_x, size_t d, size_t k, float *thr0, vl_error *err)
{
    float p0 = 0.0f;
    int rc = cc_copy(&p0, d_x, sizeof p0, cudaMemcpyDeviceToHost, err);
    if (rc)
        return rc;
    /* A value of the vector as pivot keeps the sum of squares from
     * cancelling when the mean is large next to the spread. */
    double pivot = (double)p0;
    cc_dev dpart;
    if ((rc = dpart.alloc(2 * GK_BLOCKS * sizeof(double), err)) != 0)
        return rc;
    moments_kernel<<<GK_BLOCKS, GK_THREADS>>>(d_x, d, pivot, dpart.as<double>());
    if ((rc = cc_launched(err, "gaussk moments launch")) != 0)
        return rc;
    double part[2 * GK_BLOCKS];
    if ((rc = cc_copy(part, dpart.p, sizeof part, cudaMemcpyDeviceToHost, err)) != 0)
        return rc;
    double s = 0.0, q = 0.0;
    for (int b = 0; b < GK_BLOCKS; b++) {
        s += part[2 * b];
        q += part[2 * b + 1];
    }
    double ms = s / (double)d, var = q / (double)d - ms * ms;
    double mean = pivot + ms, sd = var > 0 ? sqrt(var) : 0.0;
    double t0 = fabs(mean) + sd * compress_gaussk_z((double)k / (double)d);
    *thr0 = (float)(t0 < FLT_MAX ? t0 : FLT_MAX);
    return 0;
}

static int count_ge(const float *d_x, size_t d, uint32_t kmin, size_t *count, vl_error *err)
{
    cc_dev dc;
    int rc = dc.alloc(sizeof(unsigned long long), err);
    if (rc)
        return rc;
    cudaError_t e = cudaMemset(dc.p, 0, sizeof(unsigned long long));
    if (e != cudaSuccess)
        return cuda_fail(err, e, "cudaMemset");
    count_ge_kernel<<<cc_blocks(d), CC_THREADS>>>(d_x, d, kmin, dc.as<unsigned long long>());
    if ((rc = cc_launched(err, "gaussk count launch")) != 0)
        return rc;
    unsigned long long c = 0;
    if ((rc = cc_copy(&c, dc.p, sizeof c, cudaMemcpyDeviceToHost, err)) != 0)
        return rc;
    *count = (size_t)c;
    return 0;
}

static int min_key_above(const cc_sel *s, uint32_t t, uint32_t *out, vl_error *err)
{
    cc_dev dm;
    int rc = dm.alloc(sizeof(unsigned), err);
    if (rc)
        return rc;
    cudaError_t e = cudaMemset(dm.p, 0xff, sizeof(unsigned));
    if (e != cudaSuccess)
        return cuda_fail(err, e, "cudaMemset");
    min_above_kernel<<<cc_blocks(s->n), CC_THREADS>>>(s->vals, s->n, t, dm.as<unsigned>());
    if ((rc = cc_launched(err, "gaussk min launch")) != 0)
        return rc;
    unsigned m = 0;
    if ((rc = cc_copy(&m, dm.p, sizeof m, cudaMemcpyDeviceToHost, err)) != 0)
        return rc;
    *out = m;
    return 0;
}

/* The threshold from an exact select, as compress/gaussk.c's gk_finish
 * does when the model's count is out of the band. */
static int finish_exact(const float *d_x, size_t d, size_t k, size_t band_lo, size_t band_hi,
                        uint32_t *d_idx, size_t *nnz, double *thr, vl_error *err)
{
    cc_sel s;
    int rc = cc_select_find(d_x, d, k, &s, err);
    if (rc)
        return rc;
    size_t ge = s.gt + s.eq;
    if (ge <= band_hi) {
        /* The k-th largest value counts within the band. */
        if ((rc = cc_select_emit(s.vals, s.map, s.n, s.t, INT64_MAX, d_idx, ge, err)) != 0)
            return rc;
        *nnz = ge;
        *thr = val_of(s.t);
        return 0;
    }
    if (s.gt >= band_lo) {
        /* Ties at it overshoot; the next value up still reaches the band. */
        uint32_t up = 0;
        if ((rc = min_key_above(&s, s.t, &up, err)) != 0 ||
            (rc = cc_select_emit(s.vals, s.map, s.n, s.t, -1, d_idx, s.gt, err)) != 0)
            return rc;
        *nnz = s.gt;
        *thr = val_of(up);
        return 0;
    }
    /* Ties straddle the whole band: exactly k, the lowest indices first. */
    int64_t cut;
    if ((rc = cc_select_cut(&s, &cut, err)) != 0 ||
        (rc = cc_select_emit(s.vals, s.map, s.n, s.t, cut, d_idx, k, err)) != 0)
        return rc;
    *nnz = k;
    *thr = val_of(s.t);
    return 0;
}

extern "C" int kernels_cuda_gaussk(const float *d_x, size_t d, size_t k, uint32_t *d_idx,
                                   size_t *nnz, double *thr, vl_error *err)
{
    if (nnz)
        *nnz = 0;
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
        n = d;
        t = 0.0;
    } else {
        size_t band_lo = k - k / 20, band_hi = k + k / 20;
        float thr0 = 0.0f;
        size_t c0 = 0;
        rc = model_threshold(d_x, d, k, &thr0, err);
        if (rc == 0)
            rc = count_ge(d_x, d, key_of(thr0), &c0, err);
        if (rc == 0 && c0 >= band_lo && c0 <= band_hi) {
            rc = cc_select_emit(d_x, nullptr, d, key_of(thr0), INT64_MAX, d_idx, c0, err);
            n = c0;
            t = thr0;
        } else if (rc == 0) {
            rc = finish_exact(d_x, d, k, band_lo, band_hi, d_idx, &n, &t, err);
        }
    }
    if (rc == 0)
        rc = cc_sync(err, "gaussk");
    if (rc)
        return rc;
    *nnz = n;
    if (thr)
        *thr = t;
    return 0;
}

extern "C" int kernels_cuda_gaussk_host(const float *x, size_t d, size_t k, uint32_t *idx,
                                        size_t *nnz, double *thr, vl_error *err)
{
    if (nnz)
        *nnz = 0;
    if (!nnz || (d > 0 && k > 0 && (!x || !idx)))
        return vl_fail(err, VL_EINVAL, "gaussk: null argument");
    if ((uint64_t)d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "gaussk: %zu values do not fit 32-bit indices", d);
    if (d == 0 || k == 0) {
        if (thr)
            *thr = HUGE_VAL;
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
