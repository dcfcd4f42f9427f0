/* Exact top-k by |x| on the GPU: a radix select on the sign-cleared float
 * bits, as compress/topk.c does on the CPU. A histogram of the top 11 bits
 * finds the bucket that holds the k-th largest key; when that bucket and
 * the ones above it hold few values (the usual case for k << d) they are
 * copied out in index order and the next two levels (10 bits each) run on
 * that short list, else on the whole vector. The last level gives the key
 * t itself; the output is every key above t plus, of those equal to t, the
 * ones of lowest index, compacted in index order by CUB's stable
 * DeviceSelect, so the index set is the CPU's and comes out ascending.
 * Histograms are read back to the host, which picks the bucket: three
 * 8 KiB copies per select, simpler to get right than a device-side scan. */
#include <stdint.h>

#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "kernels/cuda/compress_util.cuh"

#define SEL_LEVELS 3
static const int sel_shift[SEL_LEVELS] = {20, 10, 0};
static const int sel_bits[SEL_LEVELS] = {11, 10, 10};
#define SEL_MAX_BINS 2048u

/* hist[b] += count of keys of v[0, n) whose bits from pshift up equal
 * prefix, binned by (key >> shift) & mask. A block counts in shared
 * memory first, then adds its bins to hist. Values cluster in a few bins
 * (most of a Gaussian vector shares a handful of exponents), so the lanes
 * of a warp that hit the same bin add once, through their leader: the loop
 * runs warp by warp (every lane of a warp takes the same trips, the ones
 * past n with no bin) so that all 32 lanes can meet in __match_any_sync. */
#define SEL_NO_BIN 0xffffffffu
__global__ static void sel_hist_kernel(const float *v, size_t n, int shift, uint32_t mask,
                                       int pshift, uint32_t prefix, uint32_t *hist)
{
    __shared__ uint32_t h[SEL_MAX_BINS];
    for (uint32_t b = threadIdx.x; b <= mask; b += blockDim.x)
        h[b] = 0;
    __syncthreads();
    unsigned lane = threadIdx.x & 31u;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t first = (size_t)blockIdx.x * blockDim.x + (threadIdx.x - lane);
    for (size_t w0 = first; w0 < n; w0 += stride) {
        size_t i = w0 + lane;
        uint32_t bin = SEL_NO_BIN;
        if (i < n) {
            uint32_t u = cc_key(v[i]);
            if ((u >> pshift) == prefix)
                bin = (u >> shift) & mask;
        }
        unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (bin != SEL_NO_BIN && lane == (unsigned)(__ffs(peers) - 1))
            atomicAdd(&h[bin], (uint32_t)__popc(peers));
    }
    __syncthreads();
    for (uint32_t b = threadIdx.x; b <= mask; b += blockDim.x)
        if (h[b])
            atomicAdd(&hist[b], h[b]);
}

/* Selects position p when key(v[p]) > t, or == t with p <= cut. */
struct sel_pred {
    const float *v;
    uint32_t t;
    int64_t cut;
    __device__ bool operator()(uint32_t p) const
    {
        uint32_t u = cc_key(v[p]);
        return u > t || (u == t && (int64_t)p <= cut);
    }
};

/* Selects position p when key(v[p]) == t. */
struct eq_pred {
    const float *v;
    uint32_t t;
    __device__ bool operator()(uint32_t p) const { return cc_key(v[p]) == t; }
};

/* The positions p < n that pred selects, in order, to d_out (room for
 * want of them, the count the caller knows from the histograms, which
 * count with the same key test); the count found must equal it. */
template <class Pred>
static int select_positions(size_t n, Pred pred, uint32_t *d_out, size_t want, vl_error *err)
{
    thrust::counting_iterator<uint32_t> in(0);
    size_t tmp_bytes = 0;
    cudaError_t e = cub::DeviceSelect::If(nullptr, tmp_bytes, in, d_out, (int64_t *)nullptr,
                                          (int64_t)n, pred);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "DeviceSelect size");
    /* The count goes first, so it stays aligned; the temp storage after it. */
    size_t head = 256;
    cc_dev tmp;
    int rc = tmp.alloc(head + tmp_bytes, err);
    if (rc)
        return rc;
    int64_t *d_count = tmp.as<int64_t>();
    e = cub::DeviceSelect::If(tmp.as<char>() + head, tmp_bytes, in, d_out, d_count, (int64_t)n,
                              pred);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "DeviceSelect");
    int64_t got = 0;
    rc = cc_copy(&got, d_count, sizeof got, cudaMemcpyDeviceToHost, err);
    if (rc)
        return rc;
    if ((uint64_t)got != (uint64_t)want)
        return vl_fail(err, VL_ERR, "select: %lld selected where the histograms counted %zu",
                       (long long)got, want);
    return 0;
}

/* out[j] = map ? map[pos[j]] : pos[j], val[j] = v[pos[j]] (val may be
 * NULL). Positions come from a select over [0, n), so they are in range. */
__global__ static void sel_gather_kernel(const uint32_t *pos, size_t m, const float *v,
                                         const uint32_t *map, uint32_t *out, float *val)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < m; j += stride) {
        uint32_t p = pos[j];
        out[j] = map ? map[p] : p;
        if (val)
            val[j] = v[p];
    }
}

__global__ static void iota_kernel(uint32_t *out, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = (uint32_t)i;
}

int cc_iota(uint32_t *d_out, size_t n, vl_error *err)
{
    if (n == 0)
        return 0;
    iota_kernel<<<cc_blocks(n), CC_THREADS>>>(d_out, n);
    return cc_launched(err, "iota kernel launch");
}

/* Copies the keys >= kmin of s's array (m of them, known from the
 * histograms) with their input indices, and makes that the array. */
static int sel_collect(cc_sel *s, uint32_t kmin, size_t m, vl_error *err)
{
    cc_dev pos;
    int rc = pos.alloc(m * sizeof(uint32_t), err);
    if (rc == 0)
        rc = s->cval.alloc(m * sizeof(float), err);
    if (rc == 0)
        rc = s->cmap.alloc(m * sizeof(uint32_t), err);
    if (rc == 0)
        rc = select_positions(s->n, sel_pred{s->vals, kmin, INT64_MAX}, pos.as<uint32_t>(), m,
                              err);
    if (rc)
        return rc;
    if (m > 0) {
        sel_gather_kernel<<<cc_blocks(m), CC_THREADS>>>(pos.as<uint32_t>(), m, s->vals, s->map,
                                                        s->cmap.as<uint32_t>(),
                                                        s->cval.as<float>());
        rc = cc_launched(err, "select gather launch");
        if (rc)
            return rc;
    }
    s->vals = s->cval.as<float>();
    s->map = s->cmap.as<uint32_t>();
    s->n = m;
    return 0;
}

int cc_select_find(const float *d_x, size_t n, size_t k, cc_sel *s, vl_error *err)
{
    if (k < 1 || k >= n || n > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "select: k = %zu of %zu values", k, n);
    s->vals = d_x;
    s->map = nullptr;
    s->n = n;
    s->gt = 0;
    /* Copying candidates beats more passes over the vector while they are
     * few; the bound keeps the copy under a quarter of the input. */
    size_t cap = n / 8 + 4096;
    cc_dev dhist;
    int rc = dhist.alloc(SEL_MAX_BINS * sizeof(uint32_t), err);
    if (rc)
        return rc;
    uint32_t hist[SEL_MAX_BINS];
    uint32_t prefix = 0;
    size_t need = k, in = 0;
    for (int level = 0; level < SEL_LEVELS; level++) {
        uint32_t nb = 1u << sel_bits[level];
        int shift = sel_shift[level], pshift = shift + sel_bits[level];
        cudaError_t e = cudaMemset(dhist.p, 0, nb * sizeof(uint32_t));
        if (e != cudaSuccess)
            return cuda_fail(err, e, "cudaMemset");
        sel_hist_kernel<<<cc_blocks(s->n), CC_THREADS>>>(s->vals, s->n, shift, nb - 1, pshift,
                                                         prefix, dhist.as<uint32_t>());
        if ((rc = cc_launched(err, "select histogram launch")) != 0 ||
            (rc = cc_copy(hist, dhist.p, nb * sizeof(uint32_t), cudaMemcpyDeviceToHost, err)) !=
                0)
            return rc;
        /* The bucket holding the need-th largest key of the current one. */
        size_t above = 0;
        uint32_t b = nb;
        int found = 0;
        while (b > 0) {
            b--;
            if (above + hist[b] >= need) {
                found = 1;
                break;
            }
            above += hist[b];
        }
        if (!found)
            return vl_fail(err, VL_ERR, "select: histogram of level %d holds %zu of %zu keys",
                           level, above, need);
        need -= above;
        s->gt += above;
        in = hist[b];
        prefix = level == 0 ? b : (prefix << sel_bits[level]) | b;
        if (level + 1 < SEL_LEVELS && s->map == nullptr && s->gt + in <= cap) {
            rc = sel_collect(s, prefix << shift, s->gt + in, err);
            if (rc)
                return rc;
        }
    }
    s->t = prefix;
    s->eq = in;
    s->need = need;
    return 0;
}

int cc_select_cut(const cc_sel *s, int64_t *cut, vl_error *err)
{
    *cut = INT64_MAX;
    if (s->need >= s->eq)
        return 0;
    if (s->need == 0) {
        *cut = -1;
        return 0;
    }
    cc_dev pos;
    int rc = pos.alloc(s->eq * sizeof(uint32_t), err);
    if (rc == 0)
        rc = select_positions(s->n, eq_pred{s->vals, s->t}, pos.as<uint32_t>(), s->eq, err);
    uint32_t p = 0;
    if (rc == 0)
        rc = cc_copy(&p, pos.as<uint32_t>() + (s->need - 1), sizeof p, cudaMemcpyDeviceToHost,
                     err);
    if (rc == 0)
        *cut = p;
    return rc;
}

int cc_select_emit(const float *vals, const uint32_t *map, size_t n, uint32_t t, int64_t cut,
                   uint32_t *d_out, size_t expect, vl_error *err)
{
    /* The counts say nothing qualifies. */
    if (expect == 0)
        return 0;
    if (map == nullptr)
        return select_positions(n, sel_pred{vals, t, cut}, d_out, expect, err);
    cc_dev pos;
    int rc = pos.alloc(expect * sizeof(uint32_t), err);
    if (rc == 0)
        rc = select_positions(n, sel_pred{vals, t, cut}, pos.as<uint32_t>(), expect, err);
    if (rc)
        return rc;
    sel_gather_kernel<<<cc_blocks(expect), CC_THREADS>>>(pos.as<uint32_t>(), expect, vals, map,
                                                         d_out, nullptr);
    return cc_launched(err, "select gather launch");
}

/* ---- public --------------------------------------------------------------------- */

extern "C" int kernels_cuda_topk(const float *d_x, size_t d, size_t k, uint32_t *d_idx,
                                 size_t *nnz, vl_error *err)
{
    if (nnz)
        *nnz = 0;
    if (!nnz || (d > 0 && k > 0 && (!d_x || !d_idx)))
        return vl_fail(err, VL_EINVAL, "topk: null argument");
    if ((uint64_t)d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "topk: %zu values do not fit 32-bit indices", d);
    if (d == 0 || k == 0)
        return 0;
    int rc;
    if (k >= d) {
        rc = cc_iota(d_idx, d, err);
        if (rc == 0)
            rc = cc_sync(err, "topk");
        if (rc == 0)
            *nnz = d;
        return rc;
    }
    cc_sel s;
    int64_t cut = INT64_MAX;
    rc = cc_select_find(d_x, d, k, &s, err);
    if (rc == 0)
        rc = cc_select_cut(&s, &cut, err);
    if (rc == 0)
        rc = cc_select_emit(s.vals, s.map, s.n, s.t, cut, d_idx, k, err);
    if (rc == 0)
        rc = cc_sync(err, "topk");
    if (rc == 0)
        *nnz = k;
    return rc;
}

extern "C" int kernels_cuda_topk_host(const float *x, size_t d, size_t k, uint32_t *idx,
                                      size_t *nnz, vl_error *err)
{
    if (nnz)
        *nnz = 0;
    if (!nnz || (d > 0 && k > 0 && (!x || !idx)))
        return vl_fail(err, VL_EINVAL, "topk: null argument");
    if (d == 0 || k == 0)
        return 0;
    size_t m = k < d ? k : d;
    cc_dev dx, didx;
    int rc = cc_upload(dx, x, d, err);
    if (rc == 0)
        rc = cc_upload<uint32_t>(didx, nullptr, m, err);
    size_t got = 0;
    if (rc == 0)
        rc = kernels_cuda_topk(dx.as<float>(), d, k, didx.as<uint32_t>(), &got, err);
    if (rc == 0)
        rc = cc_copy(idx, didx.p, got * sizeof(uint32_t), cudaMemcpyDeviceToHost, err);
    if (rc == 0)
        *nnz = got;
    return rc;
}
