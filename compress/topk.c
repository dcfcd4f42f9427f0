/*
 * Exact top-k by magnitude without sorting.
 *
 * For finite floats, clearing the sign bit leaves a 31-bit pattern whose
 * unsigned order is the order of |x| (-0.0 and +0.0 both become 0), so the
 * k-th largest |x| is found by a radix select on those bits: a histogram of
 * the top 11 bits, then of the next 10 and the last 10 within the one bucket
 * that holds the k-th value. Once the bucket holding the k-th value is small
 * the matching coordinates are copied out and the select finishes on that
 * short list instead of re-reading the whole vector. The result is every
 * coordinate above the threshold value T plus, among those equal to T, the
 * ones of lowest index, written in index order so no sort is ever needed.
 *
 * For a large vector and small k even the first histogram pass is avoided:
 * the radix select on a small sample gives a bound that a little more than
 * k values should reach, one streaming pass copies those out, and the exact
 * select runs on them. When the sample misleads (too few values reach the
 * bound, or far too many), the full histogram select runs instead, so the
 * answer is exact either way.
 *
 * Large vectors are split into a few contiguous chunks per OpenMP thread;
 * each chunk keeps its own histogram, counts or candidate list, so the
 * chunks' outputs can be placed at precomputed offsets or joined in order
 * and still come out in index order. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "compress/scan.h"

/* Hot loops are built for AVX-512, AVX2 and the baseline, picked when the
 * library loads; elsewhere they are plain functions. */

/* Bits 20..30 (11), then 10..19 and 0..9. */
#define NB0 2048u
#define NB1 1024u
/* Below this many values threads cost more than they save. */
#define TOPK_PAR_MIN ((size_t)1 << 20)
#define TOPK_MAX_CHUNKS 64
/* The sample that guides the one-pass select: runs of TOPK_RUN values, and
 * the smallest vector worth sampling. */
#define TOPK_SAMPLE 16384
#define TOPK_RUN 256
#define TOPK_SAMPLED_MIN ((size_t)1 << 17)
/* Blocks let the common "nothing here" case run as one vector max. */


/* Histogram of key >> 20 over x[lo, hi). Four interleaved copies keep
 * runs of equal buckets (frequent: most Gaussian values share a handful of
 * exponents) from serialising on one counter. */
COMPRESS_HOT static void hist_top(const float *x, size_t lo, size_t hi, uint32_t *h) {
    uint32_t part[4][NB0];
    memset(part, 0, sizeof part);
    size_t i = lo;
    for (; i + 4 <= hi; i += 4) {
        part[0][key_at(x, i) >> 20]++;
        part[1][key_at(x, i + 1) >> 20]++;
        part[2][key_at(x, i + 2) >> 20]++;
        part[3][key_at(x, i + 3) >> 20]++;
    }
    for (; i < hi; i++) part[0][key_at(x, i) >> 20]++;
    for (uint32_t b = 0; b < NB0; b++) h[b] = part[0][b] + part[1][b] + part[2][b] + part[3][b];
}

/* Histogram of (key >> shift) & 1023 over the keys of x[lo, hi) whose bits
 * above shift + 10 equal prefix. */
COMPRESS_HOT static void hist_sub(const float *x, size_t lo, size_t hi, int shift, uint32_t prefix,
                                  uint32_t *h) {
    memset(h, 0, NB1 * sizeof *h);
    for (size_t i = lo; i < hi; i++) {
        uint32_t u = key_at(x, i);
        if ((u >> (shift + 10)) == prefix) h[(u >> shift) & (NB1 - 1)]++;
    }
}

/* Copies (index, |x|) of every key >= kmin in x[lo, hi), in order. */
COMPRESS_HOT static size_t collect(const float *x, size_t lo, size_t hi, uint32_t kmin,
                                   uint32_t *cidx, float *cval) {
    size_t n = 0, i = lo;
    for (; i + SCAN_BLOCK <= hi; i += SCAN_BLOCK) {
        if (block_max(x, i) < kmin) continue;
        for (size_t j = i; j < i + SCAN_BLOCK; j++)
            if (key_at(x, j) >= kmin) {
                cidx[n] = (uint32_t)j;
                cval[n] = fabsf(x[j]);
                n++;
            }
    }
    for (; i < hi; i++)
        if (key_at(x, i) >= kmin) {
            cidx[n] = (uint32_t)i;
            cval[n] = fabsf(x[i]);
            n++;
        }
    return n;
}


static inline size_t emit_one(const float *x, const uint32_t *map, size_t i, uint32_t t,
                              size_t *eq_left, uint32_t *out, size_t n) {
    uint32_t u = key_at(x, i);
    if (u > t || (u == t && *eq_left > 0)) {
        if (u == t) (*eq_left)--;
        out[n++] = map ? map[i] : (uint32_t)i;
    }
    return n;
}

/* Writes, in order, the index (through map when given) of every key > t
 * in x[lo, hi) and of the first eq_quota keys equal to t. */
COMPRESS_HOT static size_t emit(const float *x, const uint32_t *map, size_t lo, size_t hi,
                                uint32_t t, size_t eq_quota, uint32_t *out) {
    size_t n = 0, i = lo, eq_left = eq_quota;
    /* With no ties left to take, only keys above t matter. */
    for (; i + SCAN_BLOCK <= hi; i += SCAN_BLOCK) {
        uint32_t m = block_max(x, i);
        if (m < t || (m == t && eq_left == 0)) continue;
        for (size_t j = i; j < i + SCAN_BLOCK; j++) n = emit_one(x, map, j, t, &eq_left, out, n);
    }
    for (; i < hi; i++) n = emit_one(x, map, i, t, &eq_left, out, n);
    return n;
}

/* Per-chunk bookkeeping of one select. gt[c]: keys of chunk c above the
 * current bucket; in[c]: keys of chunk c inside it. */
typedef struct sel {
    const float *x;
    size_t n;
    size_t nchunks;
    int nthreads;
    uint32_t *hist; /* nchunks * NB0 */
    size_t gt[TOPK_MAX_CHUNKS], in[TOPK_MAX_CHUNKS];
    size_t gt_total, in_total;
} sel;

/* Threads and chunks for n values. More chunks than threads, handed out
 * as threads free up: a core shared with other work then slows one chunk,
 * not half the pass. */
static void split(size_t n, int *nthreads, size_t *nchunks) {
    *nthreads = 1;
    *nchunks = 1;
    if (n >= TOPK_PAR_MIN) {
        int mt = omp_get_max_threads();
        *nthreads = mt < 1 ? 1 : mt > TOPK_MAX_CHUNKS / 4 ? TOPK_MAX_CHUNKS / 4 : mt;
        *nchunks = *nthreads > 1 ? 4 * (size_t)*nthreads : 1;
    }
}

static inline size_t chunk_lo(const sel *s, size_t c) {
    return (size_t)((uint64_t)s->n * c / s->nchunks);
}

/* Histogram of one level in every chunk. level 0 needs no prefix. */
static void sel_hist(sel *s, int level, uint32_t prefix) {
    size_t nc = s->nchunks;
    long ncl = (long)nc;
#pragma omp parallel for schedule(dynamic, 1) num_threads(s->nthreads) if (s->nthreads > 1)
    for (long cl = 0; cl < ncl; cl++) {
        size_t c = (size_t)cl;
        uint32_t *h = s->hist + c * NB0;
        if (level == 0)
            hist_top(s->x, chunk_lo(s, c), chunk_lo(s, c + 1), h);
        else
            hist_sub(s->x, chunk_lo(s, c), chunk_lo(s, c + 1), level == 1 ? 10 : 0, prefix, h);
    }
}

/* Finds the bucket holding the need-th largest key of the current bucket
 * (need >= 1) and narrows every count to it. Returns the bucket. */
static uint32_t sel_pick(sel *s, uint32_t nb, size_t *need) {
    size_t above = 0;
    uint32_t b = nb;
    while (b > 0) {
        b--;
        size_t cnt = 0;
        for (size_t c = 0; c < s->nchunks; c++) cnt += s->hist[c * NB0 + b];
        if (above + cnt >= *need) {
            *need -= above;
            s->in_total = cnt;
            s->gt_total += above;
            break;
        }
        above += cnt;
    }
    for (size_t c = 0; c < s->nchunks; c++) {
        const uint32_t *h = s->hist + c * NB0;
        size_t g = 0;
        for (uint32_t j = b + 1; j < nb; j++) g += h[j];
        s->gt[c] += g;
        s->in[c] = h[b];
    }
    return b;
}

static int select_run(const float *x, const uint32_t *map, size_t n, size_t k, int may_collect,
                      uint32_t *out, vl_error *err);

/* Copies out every key >= kmin (the current bucket and all above it) and
 * finishes the select on that list. */
static int sel_collect(sel *s, uint32_t kmin, size_t k, uint32_t *out, vl_error *err) {
    size_t m = s->gt_total + s->in_total;
    uint32_t *cidx = malloc((m ? m : 1) * sizeof *cidx);
    float *cval = malloc((m ? m : 1) * sizeof *cval);
    if (!cidx || !cval) {
        free(cidx);
        free(cval);
        return vl_fail(err, VL_ENOMEM, "topk: no memory for %zu candidates", m);
    }
    size_t off[TOPK_MAX_CHUNKS + 1];
    off[0] = 0;
    for (size_t c = 0; c < s->nchunks; c++) off[c + 1] = off[c] + s->gt[c] + s->in[c];
    size_t nc = s->nchunks;
    long ncl = (long)nc;
#pragma omp parallel for schedule(dynamic, 1) num_threads(s->nthreads) if (s->nthreads > 1)
    for (long c = 0; c < ncl; c++)
        collect(s->x, chunk_lo(s, (size_t)c), chunk_lo(s, (size_t)c + 1), kmin, cidx + off[c],
                cval + off[c]);
    int rc = select_run(cval, cidx, m, k, 0, out, err);
    free(cidx);
    free(cval);
    return rc;
}

/* Writes the k largest keys of x[0, n) (ties to lower position) in
 * position order, as positions or through map. k >= 1. may_collect
 * allows copying out a short candidate list (never done on a list). */
static int select_run(const float *x, const uint32_t *map, size_t n, size_t k, int may_collect,
                      uint32_t *out, vl_error *err) {
    if (k >= n) {
        for (size_t i = 0; i < n; i++) out[i] = map ? map[i] : (uint32_t)i;
        return VL_OK;
    }
    sel s;
    memset(&s, 0, sizeof s);
    s.x = x;
    s.n = n;
    split(n, &s.nthreads, &s.nchunks);
    s.hist = malloc(s.nchunks * NB0 * sizeof *s.hist);
    if (!s.hist) return vl_fail(err, VL_ENOMEM, "topk: no memory for histograms");
    /* Copying candidates beats another pass over the data while they are
     * few; the bound also caps the extra memory at a quarter of the input. */
    size_t cap = n / 8 + 4096;
    size_t need = k;
    sel_hist(&s, 0, 0);
    uint32_t prefix = sel_pick(&s, NB0, &need);
    if (may_collect && s.gt_total + s.in_total <= cap) {
        free(s.hist);
        return sel_collect(&s, prefix << 20, k, out, err);
    }
    sel_hist(&s, 1, prefix);
    prefix = (prefix << 10) | sel_pick(&s, NB1, &need);
    if (may_collect && s.gt_total + s.in_total <= cap) {
        free(s.hist);
        return sel_collect(&s, prefix << 10, k, out, err);
    }
    sel_hist(&s, 2, prefix);
    uint32_t t = (prefix << 10) | sel_pick(&s, NB1, &need);
    free(s.hist);

    /* need keys equal to t remain to be taken, from the lowest positions:
     * each chunk takes what the chunks before it left. */
    size_t off[TOPK_MAX_CHUNKS], quota[TOPK_MAX_CHUNKS], pos = 0, eq_left = need;
    for (size_t c = 0; c < s.nchunks; c++) {
        quota[c] = s.in[c] < eq_left ? s.in[c] : eq_left;
        eq_left -= quota[c];
        off[c] = pos;
        pos += s.gt[c] + quota[c];
    }
    size_t nc = s.nchunks;
    long ncl = (long)nc;
#pragma omp parallel for schedule(dynamic, 1) num_threads(s.nthreads) if (s.nthreads > 1)
    for (long c = 0; c < ncl; c++)
        emit(x, map, chunk_lo(&s, (size_t)c), chunk_lo(&s, (size_t)c + 1), t, quota[c],
             out + off[c]);
    return VL_OK;
}

/* ---- one pass guided by a sample ----------------------------------------- */

/* A key that about r*d/m values reach, from m values in runs of TOPK_RUN
 * spread over x: the r-th largest of the sample. */
static int sample_bound(const float *x, size_t d, size_t r, uint32_t *bound, vl_error *err) {
    size_t runs = TOPK_SAMPLE / TOPK_RUN;
    float *smp = malloc(TOPK_SAMPLE * sizeof *smp);
    uint32_t *pos = malloc(r * sizeof *pos);
    if (!smp || !pos) {
        free(smp);
        free(pos);
        return vl_fail(err, VL_ENOMEM, "topk: no memory for a sample");
    }
    for (size_t j = 0; j < runs; j++) {
        size_t lo = (size_t)((uint64_t)(d - TOPK_RUN) * j / (runs - 1));
        for (size_t i = 0; i < TOPK_RUN; i++) smp[j * TOPK_RUN + i] = fabsf(x[lo + i]);
    }
    int rc = select_run(smp, NULL, TOPK_SAMPLE, r, 1, pos, err);
    if (rc == VL_OK) {
        uint32_t b = UINT32_MAX;
        for (size_t j = 0; j < r; j++) {
            uint32_t u = key_at(smp, pos[j]);
            b = u < b ? u : b;
        }
        *bound = b;
    }
    free(smp);
    free(pos);
    return rc;
}

/* Top-k in one pass over x: a sample gives a key that a little more than
 * k values should reach, one pass copies out every value at or above it,
 * and the exact select runs on that short list. Sets *done to 0, having
 * written nothing, when the guess was wrong (fewer than k values reach it,
 * or far more than expected: data ordered or tied in ways the sample did
 * not see); the caller then runs the histogram select on all of x. */
static int topk_sampled(const float *x, size_t d, size_t k, uint32_t *out, int *done,
                        vl_error *err) {
    *done = 0;
    /* Expected sample hits above the true k-th value, plus four standard
     * deviations and a margin, so the bound falls short of k values only
     * for data the sample misrepresents. */
    double mu = (double)k * TOPK_SAMPLE / (double)d;
    size_t r = (size_t)(mu + 4.0 * sqrt(mu) + 8.0);
    if (r >= TOPK_SAMPLE / 4) return VL_OK;
    uint32_t kmin;
    int rc = sample_bound(x, d, r, &kmin, err);
    if (rc) return rc;
    size_t expect = (size_t)((double)r * (double)d / TOPK_SAMPLE);
    size_t cap = 4 * expect + 65536;

    int nthreads;
    size_t nc;
    split(d, &nthreads, &nc);
    uint32_t *bi[TOPK_MAX_CHUNKS] = {0};
    float *bv[TOPK_MAX_CHUNKS] = {0};
    size_t bn[TOPK_MAX_CHUNKS] = {0};
    int fail = 0;
    size_t total = 0;
    long ncl = (long)nc;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1)
    for (long cl = 0; cl < ncl; cl++) {
        size_t c = (size_t)cl, alloc = 0;
        size_t pos = (size_t)((uint64_t)d * c / nc), hi = (size_t)((uint64_t)d * (c + 1) / nc);
        while (pos < hi) {
            int stop;
#pragma omp atomic read
            stop = fail;
            if (stop) break;
            if (scan_grow(&bi[c], &bv[c], &alloc, bn[c]) != 0) {
#pragma omp atomic write
                fail = 2;
                break;
            }
            size_t got =
                scan_collect_some(x, &pos, hi, kmin, bi[c] + bn[c], bv[c] + bn[c], alloc - bn[c]);
            bn[c] += got;
            size_t now;
#pragma omp atomic capture
            now = total += got;
            if (now > cap) {
#pragma omp atomic write
                fail = 1;
            }
        }
    }
    uint32_t *cidx = NULL;
    float *cval = NULL;
    if (fail == 2) rc = vl_fail(err, VL_ENOMEM, "topk: no memory for candidates");
    if (!fail && total >= k) {
        cidx = malloc(total * sizeof *cidx);
        cval = malloc(total * sizeof *cval);
        if (!cidx || !cval)
            rc = vl_fail(err, VL_ENOMEM, "topk: no memory for %zu candidates", total);
    }
    if (cidx && cval) {
        size_t off = 0;
        for (size_t c = 0; c < nc; c++) {
            if (bn[c]) {
                memcpy(cidx + off, bi[c], bn[c] * sizeof *cidx);
                memcpy(cval + off, bv[c], bn[c] * sizeof *cval);
            }
            off += bn[c];
        }
    }
    for (size_t c = 0; c < nc; c++) {
        free(bi[c]);
        free(bv[c]);
    }
    if (rc == VL_OK && cidx && cval) {
        rc = select_run(cval, cidx, total, k, 0, out, err);
        *done = rc == VL_OK;
    }
    free(cidx);
    free(cval);
    return rc;
}

int compress_topk(const float *x, size_t d, size_t k, uint32_t *idx, size_t *nnz, vl_error *err) {
    if (nnz) *nnz = 0;
    if (!nnz || (d > 0 && k > 0 && (!x || !idx)))
        return vl_fail(err, VL_EINVAL, "topk: null argument");
    if ((uint64_t)d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "topk: %zu values do not fit 32-bit indices", d);
    if (d == 0 || k == 0) return VL_OK;
    if (k >= d) {
        for (size_t i = 0; i < d; i++) idx[i] = (uint32_t)i;
        *nnz = d;
        return VL_OK;
    }
    int done = 0, rc = VL_OK;
    if (d >= TOPK_SAMPLED_MIN && k <= d / 64) rc = topk_sampled(x, d, k, idx, &done, err);
    if (rc == VL_OK && !done) rc = select_run(x, NULL, d, k, 1, idx, err);
    if (rc == VL_OK) *nnz = k;
    return rc;
}

static int idx_ascending(const uint32_t *idx, size_t n) {
    for (size_t i = 1; i < n; i++)
        if (idx[i] <= idx[i - 1]) return 0;
    return 1;
}

typedef struct pair {
    uint32_t idx;
    float val;
} pair;

static int pair_by_idx(const void *a, const void *b) {
    uint32_t x = ((const pair *)a)->idx, y = ((const pair *)b)->idx;
    return (x > y) - (x < y);
}

int compress_select_exact(uint32_t *idx, float *val, size_t n, size_t k, size_t *nnz,
                          vl_error *err) {
    if (nnz) *nnz = 0;
    if (!nnz || (n > 0 && (!idx || !val)))
        return vl_fail(err, VL_EINVAL, "select_exact: null argument");
    if ((uint64_t)n > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "select_exact: %zu candidates is too many", n);
    /* Ties go to the lower index, which is the lower position only once
     * the candidates are in index order; callers normally pass them so. */
    if (!idx_ascending(idx, n)) {
        pair *p = malloc(n * sizeof *p);
        if (!p)
            return vl_fail(err, VL_ENOMEM, "select_exact: no memory to order %zu candidates", n);
        for (size_t i = 0; i < n; i++) p[i] = (pair){idx[i], val[i]};
        qsort(p, n, sizeof *p, pair_by_idx);
        for (size_t i = 0; i < n; i++) {
            idx[i] = p[i].idx;
            val[i] = p[i].val;
        }
        free(p);
    }
    if (k >= n) {
        *nnz = n;
        return VL_OK;
    }
    if (k == 0) return VL_OK;
    uint32_t *pos = malloc(k * sizeof *pos);
    if (!pos) return vl_fail(err, VL_ENOMEM, "select_exact: no memory for %zu positions", k);
    int rc = select_run(val, NULL, n, k, 1, pos, err);
    if (rc == VL_OK) {
        /* pos is ascending, so pos[j] >= j and the compaction is safe in place. */
        for (size_t j = 0; j < k; j++) {
            idx[j] = idx[pos[j]];
            val[j] = val[pos[j]];
        }
        *nnz = k;
    }
    free(pos);
    return rc;
}
