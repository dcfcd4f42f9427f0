/* Exact top-k by |x| on the GPU: a radix select on the sign-cleared float
 * bits, as compress/topk.c does on the CPU. A histogram of the top 11 bits
 * finds the bucket that holds the k-th largest key; when that bucket and
 * the ones above it hold few values (the usual case for k << d) they are
 * copied out in index order and the next two levels (10 bits each) run on
 * that short list, else on the whole vector. The last level gives the key
 * t itself; the output is every key above t plus, of those equal to t, the
 * ones of lowest index, compacted in index order by CUB's stable
 * DeviceSelect, so the index set is the CPU's and comes out ascending.
 * The bucket of each level is picked on the device by one warp, which
 * leaves it in the select's state (cc_sel_state) for the next kernel to
 * read, so a select goes to the host only to size the copy of candidates
 * and, at the end, to check its counts. All scratch comes from the cached
 * workspace (workspace.cu). */
#include <stdint.h>

#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "kernels/cuda/compress_util.cuh"

#define SEL_LEVELS 3
static const int sel_shift[SEL_LEVELS] = {20, 10, 0};
static const int sel_bits[SEL_LEVELS] = {11, 10, 10};
#define SEL_MAX_BINS 2048u
/* Positions per tile when the ties' cut is located: one count per tile,
 * then one warp walks the counts and the tile that holds the cut. */
#define SEL_TILE 8192u
/* Histogram blocks per multiprocessor: enough to hide latency, few enough
 * that flushing the blocks' bins into the global histogram stays cheap
 * (most keys share a handful of bins, and every block adds to them). */
#define SEL_HIST_BLOCKS_PER_SM 8

/* hist[b] += count of keys of v[0, n) whose bits from pshift up equal the
 * state's prefix (0 at level 0, where pshift is 31 and all keys match),
 * binned by (key >> shift) & mask. A block counts in shared memory first,
 * then adds its bins to hist. Values cluster in a few bins (most of a
 * Gaussian vector shares a handful of exponents), so the lanes of a warp
 * that hit the same bin add once, through their leader: the loop runs warp
 * by warp (every lane of a warp takes the same trips, the ones past n with
 * no bin) so that all 32 lanes can meet in __match_any_sync. Each warp
 * takes SEL_HIST_RUNS runs of 32 keys per trip and loads them all before
 * binning any, so that many loads are in flight at once. */
#define SEL_NO_BIN 0xffffffffu
#define SEL_HIST_RUNS 4
__global__ static void sel_hist_kernel(const float *v, size_t n, int shift, uint32_t mask,
                                       int pshift, const cc_sel_state *st, uint32_t *hist) {
    __shared__ uint32_t h[SEL_MAX_BINS];
    if (st->fail) return;
    uint32_t prefix = pshift >= 31 ? 0u : st->prefix;
    for (uint32_t b = threadIdx.x; b <= mask; b += blockDim.x) h[b] = 0;
    __syncthreads();
    unsigned lane = threadIdx.x & 31u;
    size_t stride = (size_t)gridDim.x * blockDim.x * SEL_HIST_RUNS;
    size_t first = ((size_t)blockIdx.x * blockDim.x + (threadIdx.x - lane)) * SEL_HIST_RUNS;
    for (size_t w0 = first; w0 < n; w0 += stride) {
        uint32_t bin[SEL_HIST_RUNS];
#pragma unroll
        for (int r = 0; r < SEL_HIST_RUNS; r++) {
            size_t i = w0 + (size_t)r * 32 + lane;
            bin[r] = SEL_NO_BIN;
            if (i < n) {
                uint32_t u = cc_key(v[i]);
                if ((u >> pshift) == prefix) bin[r] = (u >> shift) & mask;
            }
        }
#pragma unroll
        for (int r = 0; r < SEL_HIST_RUNS; r++) {
            unsigned peers = __match_any_sync(0xffffffffu, bin[r]);
            if (bin[r] != SEL_NO_BIN && lane == (unsigned)(__ffs(peers) - 1))
                atomicAdd(&h[bin[r]], (uint32_t)__popc(peers));
        }
    }
    __syncthreads();
    for (uint32_t b = threadIdx.x; b <= mask; b += blockDim.x)
        if (h[b]) atomicAdd(&hist[b], h[b]);
}

/* One warp: the bucket b of hist (nb bins, a multiple of 32) that holds
 * the need-th largest key, scanning from the top; moves the state into it
 * (need -= the keys above b, gt += them, in = hist[b], prefix gains b's
 * bits, kmin = the smallest key of the bucket) and zeroes hist for the
 * next level. Lane L sums the L-th run of nb/32 bins from the top, a
 * shuffle scan finds the run that reaches need, and its lane walks it. */
__global__ static void sel_pick_kernel(uint32_t *hist, uint32_t nb, int level, int bits, int shift,
                                       cc_sel_state *st) {
    unsigned lane = threadIdx.x;
    uint32_t per = nb / 32u, hi = nb - lane * per, lo = hi - per;
    unsigned long long sum = 0;
    for (uint32_t b = lo; b < hi; b++) sum += hist[b];
    unsigned long long incl = sum;
    for (unsigned off = 1; off < 32; off *= 2) {
        unsigned long long o = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += o;
    }
    unsigned long long need = st->need;
    unsigned reach = __ballot_sync(0xffffffffu, incl >= need);
    int failed = st->fail;
    if (!failed && reach && lane == (unsigned)(__ffs(reach) - 1)) {
        unsigned long long above = incl - sum;
        uint32_t b = hi;
        int found = 0;
        while (b > lo) {
            b--;
            if (above + hist[b] >= need) {
                found = 1;
                break;
            }
            above += hist[b];
        }
        if (found) {
            uint32_t prefix = level == 0 ? b : (st->prefix << bits) | b;
            st->need = need - above;
            st->gt += above;
            st->in = hist[b];
            st->prefix = prefix;
            st->kmin = prefix << shift;
        } else {
            st->fail = 1;
        }
    }
    if (!failed && !reach && lane == 0) st->fail = 1;
    __syncwarp();
    for (uint32_t b = lo; b < hi; b++) hist[b] = 0;
}

/* The state a find starts from: the need-th largest of all, nothing above. */
__global__ static void sel_start_kernel(cc_sel_state *st, unsigned long long k) {
    st->need = k;
    st->gt = 0;
    st->in = 0;
    st->prefix = 0;
    st->kmin = 0;
    st->cut = INT64_MAX;
    st->fail = 0;
}

/* The state of a fresh select: no counts, no minimum, no failure. */
__global__ static void sel_open_kernel(cc_sel_state *st, uint32_t *hist) {
    for (uint32_t b = threadIdx.x; b < SEL_MAX_BINS; b += blockDim.x) hist[b] = 0;
    if (threadIdx.x == 0) {
        st->need = st->gt = st->in = st->ge = 0;
        st->cut = INT64_MAX;
        for (int c = 0; c < CC_SEL_CHECKS; c++) st->count[c] = -1;
        st->prefix = st->kmin = 0;
        st->min_above = 0xffffffffu;
        st->fail = 0;
    }
}

/* Selects position p when key(v[p]) > t, or == t with p <= cut (values
 * the host knows). */
struct sel_pred {
    const float *v;
    uint32_t t;
    int64_t cut;
    __device__ bool operator()(uint32_t p) const {
        uint32_t u = cc_key(v[p]);
        return u > t || (u == t && (int64_t)p <= cut);
    }
};

/* The same with t and cut from the select's state (top), or every key of
 * the current bucket and above, key >= kmin (!top). Nothing once a level
 * failed, so a failed select never writes past what its caller sized. */
struct dev_pred {
    const float *v;
    const cc_sel_state *st;
    int top;
    __device__ bool operator()(uint32_t p) const {
        if (st->fail) return false;
        uint32_t u = cc_key(v[p]);
        if (!top) return u >= st->kmin;
        uint32_t t = st->prefix;
        return u > t || (u == t && (long long)p <= st->cut);
    }
};

template <class Pred> static size_t select_tmp_bytes(size_t n, Pred pred, cudaError_t *e) {
    thrust::counting_iterator<uint32_t> in(0);
    size_t bytes = 0;
    *e = cub::DeviceSelect::If(nullptr, bytes, in, (uint32_t *)nullptr, (long long *)nullptr,
                               (int64_t)n, pred);
    return bytes;
}

/* The positions p < n that pred selects, in order, to d_out (room for
 * want of them, the count the histograms gave, which count with the same
 * key test). The count found lands in the state and is checked against
 * want by cc_select_check. */
template <class Pred>
static int select_positions(cc_sel *s, size_t n, Pred pred, uint32_t *d_out, size_t want,
                            vl_error *err) {
    if (s->checks >= CC_SEL_CHECKS)
        return vl_fail(err, VL_ERR, "select: more than %d compactions", CC_SEL_CHECKS);
    if (n > s->max_n)
        return vl_fail(err, VL_ERR, "select: %zu values past the %zu set up", n, s->max_n);
    thrust::counting_iterator<uint32_t> in(0);
    size_t bytes = s->tmp_bytes;
    long long *count = &s->st->count[s->checks];
    cudaError_t e = cub::DeviceSelect::If(s->tmp, bytes, in, d_out, count, (int64_t)n, pred);
    if (e != cudaSuccess) return cuda_fail(err, e, "DeviceSelect");
    s->expect[s->checks++] = want;
    return 0;
}

/* out[j] = map ? map[pos[j]] : pos[j], val[j] = v[pos[j]] (val may be
 * NULL). Positions come from a select over [0, n), so they are in range. */
__global__ static void sel_gather_kernel(const uint32_t *pos, size_t m, const float *v,
                                         const uint32_t *map, uint32_t *out, float *val) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < m; j += stride) {
        uint32_t p = pos[j];
        out[j] = map ? map[p] : p;
        if (val) val[j] = v[p];
    }
}

__global__ static void iota_kernel(uint32_t *out, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = (uint32_t)i;
}

int cc_iota(uint32_t *d_out, size_t n, vl_error *err) {
    if (n == 0) return 0;
    iota_kernel<<<cc_blocks(n), CC_THREADS>>>(d_out, n);
    return cc_launched(err, "iota kernel launch");
}

/* ---- locating the cut among ties ---------------------------------------------------- */

/* tiles[b] = count of keys == t in tile b of v[0, n), when the top k takes
 * some but not all of the ties (0 < need < in); else nothing. */
__global__ static void cut_count_kernel(const float *v, size_t n, const cc_sel_state *st,
                                        uint32_t *tiles) {
    __shared__ uint32_t part[32];
    unsigned long long need = st->need, eq = st->in;
    if (st->fail || need == 0 || need >= eq) return;
    uint32_t t = st->prefix;
    size_t lo = (size_t)blockIdx.x * SEL_TILE, hi = lo + SEL_TILE < n ? lo + SEL_TILE : n;
    uint32_t c = 0;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) c += cc_key(v[i]) == t;
    uint32_t sum = cc_block_sum(c, part);
    if (threadIdx.x == 0) tiles[blockIdx.x] = sum;
}

/* One warp: st->cut = the position of the need-th key == t (-1 when the
 * top k takes none of the ties, INT64_MAX when it takes them all). */
__global__ static void cut_find_kernel(const float *v, size_t n, size_t ntiles,
                                       const uint32_t *tiles, cc_sel_state *st) {
    unsigned lane = threadIdx.x;
    unsigned long long need = st->need, eq = st->in;
    if (st->fail) return;
    if (need >= eq || need == 0) {
        if (lane == 0) st->cut = need == 0 ? -1 : INT64_MAX;
        return;
    }
    uint32_t t = st->prefix;
    unsigned long long before = 0;
    size_t tile = ntiles;
    for (size_t t0 = 0; t0 < ntiles && tile == ntiles; t0 += 32) {
        unsigned long long c = t0 + lane < ntiles ? tiles[t0 + lane] : 0;
        unsigned long long incl = c;
        for (unsigned off = 1; off < 32; off *= 2) {
            unsigned long long o = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += o;
        }
        unsigned reach = __ballot_sync(0xffffffffu, before + incl >= need);
        if (reach) {
            int L = __ffs(reach) - 1;
            tile = t0 + (size_t)L;
            before += __shfl_sync(0xffffffffu, incl - c, L);
        } else {
            before += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    if (tile == ntiles) {
        if (lane == 0) st->fail = 1;
        return;
    }
    /* The rank still wanted inside the tile, 1-based. */
    unsigned long long r = need - before;
    size_t lo = tile * SEL_TILE, hi = lo + SEL_TILE < n ? lo + SEL_TILE : n;
    for (size_t i0 = lo; i0 < hi; i0 += 32) {
        size_t i = i0 + lane;
        bool hit = i < hi && cc_key(v[i]) == t;
        unsigned ties = __ballot_sync(0xffffffffu, hit);
        unsigned long long cnt = (unsigned)__popc(ties);
        if (cnt >= r) {
            unsigned below = (unsigned)__popc(ties & ((1u << lane) - 1u));
            if (hit && below + 1 == r) st->cut = (long long)i;
            return;
        }
        r -= cnt;
    }
    if (lane == 0) st->fail = 1;
}

/* ---- the select ------------------------------------------------------------------------ */

int cc_select_open(cc_lease *ws, size_t n, size_t extra_doubles, cc_sel *s, vl_error *err) {
    if (n > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "select: %zu values do not fit 32-bit indices", n);
    cudaError_t e1 = cudaSuccess, e2 = cudaSuccess;
    size_t tmp = select_tmp_bytes(n, sel_pred{nullptr, 0, 0}, &e1);
    size_t tmp2 = select_tmp_bytes(n, dev_pred{nullptr, nullptr, 0}, &e2);
    if (e1 != cudaSuccess || e2 != cudaSuccess)
        return cuda_fail(err, e1 != cudaSuccess ? e1 : e2, "DeviceSelect size");
    tmp = tmp > tmp2 ? tmp : tmp2;
    size_t ntiles = (n + SEL_TILE - 1) / SEL_TILE;
    size_t o_hist = cc_align(sizeof(cc_sel_state));
    size_t o_part = o_hist + cc_align(SEL_MAX_BINS * sizeof(uint32_t));
    size_t o_tiles = o_part + cc_align(extra_doubles * 2 * sizeof(double));
    size_t o_tmp = o_tiles + cc_align((ntiles ? ntiles : 1) * sizeof(uint32_t));
    void *base = nullptr;
    int rc = ws->get(CC_WS_SMALL, o_tmp + cc_align(tmp), &base, err);
    if (rc) return rc;
    char *b = static_cast<char *>(base);
    s->ws = ws;
    s->st = reinterpret_cast<cc_sel_state *>(b);
    s->hist = reinterpret_cast<uint32_t *>(b + o_hist);
    s->part = extra_doubles ? reinterpret_cast<double *>(b + o_part) : nullptr;
    s->tiles = reinterpret_cast<uint32_t *>(b + o_tiles);
    s->tmp = b + o_tmp;
    s->tmp_bytes = tmp;
    s->max_n = n;
    s->checks = 0;
    sel_open_kernel<<<1, CC_THREADS>>>(s->st, s->hist);
    return cc_launched(err, "select open launch");
}

/* Copies the keys >= the state's kmin of s's array (m of them, as the
 * histograms counted) with their input indices, and makes that the array. */
static int sel_collect(cc_sel *s, size_t m, vl_error *err) {
    void *big = nullptr;
    /* Values, input indices, and positions (reused by the last emit). */
    size_t each = cc_align((m ? m : 1) * sizeof(uint32_t));
    int rc = s->ws->get(CC_WS_BIG, 3 * each, &big, err);
    if (rc) return rc;
    char *b = static_cast<char *>(big);
    s->cval = reinterpret_cast<float *>(b);
    s->cmap = reinterpret_cast<uint32_t *>(b + each);
    s->pos = reinterpret_cast<uint32_t *>(b + 2 * each);
    if ((rc = select_positions(s, s->n, dev_pred{s->vals, s->st, 0}, s->pos, m, err)) != 0)
        return rc;
    if (m > 0) {
        sel_gather_kernel<<<cc_blocks(m), CC_THREADS>>>(s->pos, m, s->vals, s->map, s->cmap,
                                                        s->cval);
        if ((rc = cc_launched(err, "select gather launch")) != 0) return rc;
    }
    s->vals = s->cval;
    s->map = s->cmap;
    s->n = m;
    return 0;
}

int cc_select_find(const float *d_x, size_t n, size_t k, cc_sel *s, vl_error *err) {
    if (k < 1 || k >= n || n > s->max_n)
        return vl_fail(err, VL_EINVAL, "select: k = %zu of %zu values", k, n);
    s->vals = d_x;
    s->map = nullptr;
    s->n = n;
    /* Copying candidates beats more passes over the vector while they are
     * few; the bound keeps the copy under a quarter of the input. */
    size_t cap = n / 8 + 4096;
    sel_start_kernel<<<1, 1>>>(s->st, k);
    int rc = cc_launched(err, "select start launch");
    for (int level = 0; rc == 0 && level < SEL_LEVELS; level++) {
        uint32_t nb = 1u << sel_bits[level];
        int shift = sel_shift[level], pshift = shift + sel_bits[level];
        size_t blocks = (size_t)s->ws->sms() * SEL_HIST_BLOCKS_PER_SM, want = cc_blocks(s->n);
        blocks = blocks < want ? blocks : want;
        sel_hist_kernel<<<(unsigned)blocks, CC_THREADS>>>(s->vals, s->n, shift, nb - 1, pshift,
                                                          s->st, s->hist);
        if ((rc = cc_launched(err, "select histogram launch")) != 0) break;
        sel_pick_kernel<<<1, 32>>>(s->hist, nb, level, sel_bits[level], shift, s->st);
        if ((rc = cc_launched(err, "select pick launch")) != 0) break;
        if (level + 1 < SEL_LEVELS && s->map == nullptr) {
            /* Whether to copy candidates out, and how many: the one
             * question the host must answer, as it sizes the copy. */
            cc_sel_state h;
            if ((rc = cc_readback(*s->ws, &h, s->st, sizeof h, err)) != 0) break;
            if (h.fail)
                return vl_fail(err, VL_ERR, "select: no bucket of level %d holds the %zu-th key",
                               level, k);
            if (h.gt + h.in <= cap) rc = sel_collect(s, (size_t)(h.gt + h.in), err);
        }
    }
    return rc;
}

/* The select's state from the device, refused when a level went wrong. */
static int read_state(cc_sel *s, cc_sel_state *h, vl_error *err) {
    int rc = cc_readback(*s->ws, h, s->st, sizeof *h, err);
    if (rc) return rc;
    if (h->fail) return vl_fail(err, VL_ERR, "select: a level found no bucket holding the key");
    return 0;
}

int cc_select_fetch(cc_sel *s, vl_error *err) {
    cc_sel_state h;
    int rc = read_state(s, &h, err);
    if (rc) return rc;
    s->t = h.prefix;
    s->gt = (size_t)h.gt;
    s->eq = (size_t)h.in;
    s->need = (size_t)h.need;
    return 0;
}

/* The positions of s's array that pred selects (expect of them), written
 * as input indices to d_out. */
template <class Pred>
static int emit_with(cc_sel *s, const float *vals, const uint32_t *map, size_t n, Pred pred,
                     uint32_t *d_out, size_t expect, vl_error *err) {
    if (map == nullptr) return select_positions(s, n, pred, d_out, expect, err);
    /* Through the positions buffer, which the collect made with room for
     * all n candidates (expect <= n). */
    if (vals != s->cval || map != s->cmap || expect > n)
        return vl_fail(err, VL_ERR, "select emit: not the collected candidates");
    int rc = select_positions(s, n, pred, s->pos, expect, err);
    if (rc) return rc;
    sel_gather_kernel<<<cc_blocks(expect), CC_THREADS>>>(s->pos, expect, vals, map, d_out, nullptr);
    return cc_launched(err, "select gather launch");
}

int cc_select_emit_top(cc_sel *s, uint32_t *d_out, size_t expect, vl_error *err) {
    if (expect == 0) return 0;
    size_t ntiles = (s->n + SEL_TILE - 1) / SEL_TILE;
    if (ntiles > 0) {
        /* Both kernels see from the state whether ties are cut at all, and
         * return at once when not (the usual case). */
        cut_count_kernel<<<(unsigned)ntiles, CC_THREADS>>>(s->vals, s->n, s->st, s->tiles);
        int rc = cc_launched(err, "select cut count launch");
        if (rc) return rc;
    }
    cut_find_kernel<<<1, 32>>>(s->vals, s->n, ntiles, s->tiles, s->st);
    int rc = cc_launched(err, "select cut launch");
    if (rc) return rc;
    return emit_with(s, s->vals, s->map, s->n, dev_pred{s->vals, s->st, 1}, d_out, expect, err);
}

int cc_select_emit(cc_sel *s, const float *vals, const uint32_t *map, size_t n, uint32_t t,
                   int64_t cut, uint32_t *d_out, size_t expect, vl_error *err) {
    /* The counts say nothing qualifies. */
    if (expect == 0) return 0;
    return emit_with(s, vals, map, n, sel_pred{vals, t, cut}, d_out, expect, err);
}

int cc_select_check(cc_sel *s, cc_sel_state *out, vl_error *err) {
    cc_sel_state h;
    int rc = read_state(s, &h, err);
    if (rc) return rc;
    for (int c = 0; c < s->checks; c++)
        if (h.count[c] < 0 || (unsigned long long)h.count[c] != (unsigned long long)s->expect[c])
            return vl_fail(err, VL_ERR, "select: %lld selected where the histograms counted %zu",
                           h.count[c], s->expect[c]);
    if (out) *out = h;
    return 0;
}

/* ---- public --------------------------------------------------------------------- */

extern "C" int kernels_cuda_topk(const float *d_x, size_t d, size_t k, uint32_t *d_idx, size_t *nnz,
                                 vl_error *err) {
    if (nnz) *nnz = 0;
    if (!nnz || (d > 0 && k > 0 && (!d_x || !d_idx)))
        return vl_fail(err, VL_EINVAL, "topk: null argument");
    if ((uint64_t)d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "topk: %zu values do not fit 32-bit indices", d);
    if (d == 0 || k == 0) return 0;
    int rc;
    if (k >= d) {
        rc = cc_iota(d_idx, d, err);
        if (rc == 0) rc = cc_sync(err, "topk");
        if (rc == 0) *nnz = d;
        return rc;
    }
    cc_lease ws;
    cc_sel s;
    if ((rc = ws.open(err)) != 0 || (rc = cc_select_open(&ws, d, 0, &s, err)) != 0 ||
        (rc = cc_select_find(d_x, d, k, &s, err)) != 0 ||
        (rc = cc_select_emit_top(&s, d_idx, k, err)) != 0 ||
        (rc = cc_select_check(&s, nullptr, err)) != 0) {
        /* Nothing of this call may still run once the lease is given back. */
        vl_error ignore;
        (void)cc_sync(&ignore, "topk");
        return rc;
    }
    *nnz = k;
    return 0;
}

extern "C" int kernels_cuda_topk_host(const float *x, size_t d, size_t k, uint32_t *idx,
                                      size_t *nnz, vl_error *err) {
    if (nnz) *nnz = 0;
    if (!nnz || (d > 0 && k > 0 && (!x || !idx)))
        return vl_fail(err, VL_EINVAL, "topk: null argument");
    if (d == 0 || k == 0) return 0;
    size_t m = k < d ? k : d;
    cc_dev dx, didx;
    int rc = cc_upload(dx, x, d, err);
    if (rc == 0) rc = cc_upload<uint32_t>(didx, nullptr, m, err);
    size_t got = 0;
    if (rc == 0) rc = kernels_cuda_topk(dx.as<float>(), d, k, didx.as<uint32_t>(), &got, err);
    if (rc == 0) rc = cc_copy(idx, didx.p, got * sizeof(uint32_t), cudaMemcpyDeviceToHost, err);
    if (rc == 0) *nnz = got;
    return rc;
}
