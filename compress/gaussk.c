/*
 * Gaussian-k: a cheaper stand-in for exact top-k that picks the coordinates
 * with |x| at or above a threshold guessed from the mean and standard
 * deviation, as if the values were normal, and then corrects the guess.
 *
 * The fast path is two streaming passes: one for the moments (and the
 * largest |x|), one that copies out every coordinate above a slightly lower
 * "window" threshold, where the model predicts about three times k values.
 * Every candidate count for thresholds at or above the window is then exact
 * and cheap, so the guessed threshold is kept when its count lies within
 * +-5 % of k and is otherwise moved to the nearest count inside that band.
 * When the data is far from normal (heavy tails, a few huge outliers, many
 * equal values), further passes count several probe thresholds at once and
 * narrow a bracket on the float bit pattern until the window fits; values
 * tied across the whole band end in an exact top-k, so the count is then k.
 */
#include <float.h>
#include <stdio.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"

#define GK_HOT __attribute__((target_clones("avx512f", "avx2", "default")))

#define GK_PAR_MIN ((size_t)1 << 20)
#define GK_MAX_CHUNKS 64
/* Moments are summed per fixed block and the blocks in order, so the
 * threshold does not depend on the thread count. */
#define GK_STAT_BLOCK ((size_t)1 << 16)
#define GK_LANES 16
#define GK_PROBES 8
#define GK_MAX_PASSES 16
#define BLOCK 32

static inline uint32_t key_at(const float *x, size_t i)
{
    uint32_t u;
    memcpy(&u, x + i, sizeof u);
    return u & 0x7fffffffu;
}

static inline uint32_t key_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7fffffffu;
}

static inline float val_of(uint32_t key)
{
    float v;
    memcpy(&v, &key, sizeof v);
    return v;
}

/* ---- inverse normal CDF ------------------------------------------------ */

/* Phi^-1(p) for 0 < p <= 0.5 by Acklam's rational approximation (relative
 * error 1.15e-9), polished by one Halley step on erfc so the far tail that
 * tiny k/d asks for is accurate too. */
static double probit_lower(double p)
{
    static const double c[6] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                -2.400758277161838e+00, -2.549732539343734e+00,
                                4.374664141464968e+00,  2.938163982698783e+00};
    static const double dd[4] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
    static const double a[6] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                -2.759285104469687e+02, 1.383577518672690e+02,
                                -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[5] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                -1.556989798598866e+02, 6.680131188771972e+01,
                                -1.328068155288572e+01};
    double z;
    if (p < 0.02425) {
        double q = sqrt(-2.0 * log(p));
        z = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((dd[0] * q + dd[1]) * q + dd[2]) * q + dd[3]) * q + 1.0);
    } else {
        double q = p - 0.5, r = q * q;
        z = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
    }
    double e = 0.5 * erfc(-z / sqrt(2.0)) - p;
    double u = e * sqrt(2.0 * M_PI) * exp(0.5 * z * z);
    return z - u / (1.0 + 0.5 * z * u);
}

/* z with P(|N(0,1)| >= z) = rho, for 0 < rho; 0 once rho >= 1. */
static double two_sided_z(double rho)
{
    if (rho >= 1.0)
        return 0.0;
    double z = -probit_lower(0.5 * rho);
    return z > 0 ? z : 0.0;
}

/* ---- streaming kernels --------------------------------------------------- */

typedef struct moments {
    double sum, sumsq;
    uint32_t kmax;
} moments;

/* Sums of v and v^2 for v = x - pivot: shifting by a typical value keeps
 * the variance from cancelling when the mean is large next to the spread. */
GK_HOT static moments block_moments(const float *x, size_t lo, size_t hi, double pivot)
{
    double s[GK_LANES] = {0}, q[GK_LANES] = {0};
    uint32_t m[GK_LANES] = {0};
    size_t i = lo;
    for (; i + GK_LANES <= hi; i += GK_LANES)
        for (size_t j = 0; j < GK_LANES; j++) {
            double v = (double)x[i + j] - pivot;
            uint32_t u = key_at(x, i + j);
            s[j] += v;
            q[j] += v * v;
            m[j] = u > m[j] ? u : m[j];
        }
    for (size_t j = 0; i < hi; i++, j++) {
        double v = (double)x[i] - pivot;
        uint32_t u = key_at(x, i);
        s[j] += v;
        q[j] += v * v;
        m[j] = u > m[j] ? u : m[j];
    }
    moments r = {0, 0, 0};
    for (size_t j = 0; j < GK_LANES; j++) {
        r.sum += s[j];
        r.sumsq += q[j];
        r.kmax = m[j] > r.kmax ? m[j] : r.kmax;
    }
    return r;
}

static inline uint32_t block_max(const float *x, size_t i)
{
    uint32_t m = 0;
    for (size_t j = 0; j < BLOCK; j++) {
        uint32_t u = key_at(x, i + j);
        m = u > m ? u : m;
    }
    return m;
}

/* Copies (index, |x|) of keys >= kmin from x[*pos, hi) until fewer than
 * BLOCK slots of room are left; advances *pos and returns the count. */
GK_HOT static size_t collect_some(const float *x, size_t *pos, size_t hi, uint32_t kmin,
                                  uint32_t *cidx, float *cval, size_t room)
{
    size_t n = 0, i = *pos;
    while (i < hi && room - n >= BLOCK) {
        size_t end = i + BLOCK <= hi ? i + BLOCK : hi;
        if (end - i == BLOCK && block_max(x, i) < kmin) {
            i = end;
            continue;
        }
        for (; i < end; i++)
            if (key_at(x, i) >= kmin) {
                cidx[n] = (uint32_t)i;
                cval[n] = fabsf(x[i]);
                n++;
            }
    }
    *pos = i;
    return n;
}

/* cnt[j] = number of keys >= pk[j] in x[lo, hi). */
GK_HOT static void count_probes(const float *x, size_t lo, size_t hi, const uint32_t *pk,
                                size_t *cnt)
{
    uint32_t c[GK_PROBES] = {0};
    uint32_t p[GK_PROBES];
    memcpy(p, pk, sizeof p);
    for (size_t i = lo; i < hi; i++) {
        uint32_t u = key_at(x, i);
        for (size_t j = 0; j < GK_PROBES; j++)
            c[j] += u >= p[j];
    }
    for (size_t j = 0; j < GK_PROBES; j++)
        cnt[j] = c[j];
}

GK_HOT static size_t emit_ge(const float *x, size_t lo, size_t hi, uint32_t kmin, uint32_t *out)
{
    size_t n = 0, i = lo;
    for (; i + BLOCK <= hi; i += BLOCK) {
        if (block_max(x, i) < kmin)
            continue;
        for (size_t j = i; j < i + BLOCK; j++)
            if (key_at(x, j) >= kmin)
                out[n++] = (uint32_t)j;
    }
    for (; i < hi; i++)
        if (key_at(x, i) >= kmin)
            out[n++] = (uint32_t)i;
    return n;
}

/* ---- passes over the data ----------------------------------------------- */

typedef struct gk {
    const float *x;
    size_t d, k;
    size_t band_lo, band_hi; /* counts accepted: k -+ 5 % */
    size_t nchunks;
    size_t cap; /* most candidates a window may hold */
    uint32_t *cidx;
    float *cval;
    size_t ncand;
} gk;

static inline size_t gk_chunk(const gk *g, size_t c)
{
    return (size_t)((uint64_t)g->d * c / g->nchunks);
}

static int gk_moments(const gk *g, double *mean, double *sd, uint32_t *kmax, vl_error *err)
{
    size_t nb = (g->d + GK_STAT_BLOCK - 1) / GK_STAT_BLOCK;
    moments *part = malloc(nb * sizeof *part);
    if (!part)
        return vl_fail(err, VL_ENOMEM, "gaussk: no memory for %zu partial sums", nb);
    long nbl = (long)nb;
    double pivot = g->x[0];
#pragma omp parallel for schedule(static) num_threads((int)g->nchunks) if (g->nchunks > 1)
    for (long b = 0; b < nbl; b++) {
        size_t lo = (size_t)b * GK_STAT_BLOCK;
        size_t hi = lo + GK_STAT_BLOCK < g->d ? lo + GK_STAT_BLOCK : g->d;
        part[b] = block_moments(g->x, lo, hi, pivot);
    }
    double s = 0, q = 0;
    uint32_t m = 0;
    for (size_t b = 0; b < nb; b++) {
        s += part[b].sum;
        q += part[b].sumsq;
        m = part[b].kmax > m ? part[b].kmax : m;
    }
    free(part);
    double ms = s / (double)g->d;
    *mean = pivot + ms;
    double var = q / (double)g->d - ms * ms;
    *sd = var > 0 ? sqrt(var) : 0.0;
    *kmax = m;
    return VL_OK;
}

/* Copies out every coordinate with key >= kmin into g->cidx/cval, in index
 * order, unless there are more than g->cap: then *total is only known to
 * exceed the cap and nothing is kept. */
static int gk_window(gk *g, uint32_t kmin, int *overflow, vl_error *err)
{
    size_t nc = g->nchunks;
    uint32_t *bi[GK_MAX_CHUNKS] = {0};
    float *bv[GK_MAX_CHUNKS] = {0};
    size_t bn[GK_MAX_CHUNKS] = {0};
    int fail = 0;
    size_t shared_total = 0;
    free(g->cidx);
    free(g->cval);
    g->cidx = NULL;
    g->cval = NULL;
    g->ncand = 0;
#pragma omp parallel num_threads((int)nc) if (nc > 1)
    {
        size_t nth = (size_t)omp_get_num_threads(), tid = (size_t)omp_get_thread_num();
        for (size_t c = tid; c < nc; c += nth) {
            size_t pos = gk_chunk(g, c), hi = gk_chunk(g, c + 1), alloc = 0;
            while (pos < hi) {
                int stop;
#pragma omp atomic read
                stop = fail;
                if (stop)
                    break;
                if (alloc - bn[c] < BLOCK) {
                    size_t na = alloc ? 2 * alloc : 1024;
                    uint32_t *ni = realloc(bi[c], na * sizeof *ni);
                    if (ni)
                        bi[c] = ni;
                    float *nv = ni ? realloc(bv[c], na * sizeof *nv) : NULL;
                    if (nv)
                        bv[c] = nv;
                    if (!ni || !nv) {
#pragma omp atomic write
                        fail = 2;
                        break;
                    }
                    alloc = na;
                }
                size_t got = collect_some(g->x, &pos, hi, kmin, bi[c] + bn[c], bv[c] + bn[c],
                                          alloc - bn[c]);
                bn[c] += got;
                size_t now;
#pragma omp atomic capture
                now = shared_total += got;
                if (now > g->cap) {
#pragma omp atomic write
                    fail = 1;
                }
            }
        }
    }
    int rc = VL_OK;
    *overflow = fail == 1;
    if (fail == 2)
        rc = vl_fail(err, VL_ENOMEM, "gaussk: no memory for candidates");
    size_t total = 0;
    for (size_t c = 0; c < nc; c++)
        total += bn[c];
    if (!fail) {
        g->cidx = malloc((total ? total : 1) * sizeof *g->cidx);
        g->cval = malloc((total ? total : 1) * sizeof *g->cval);
        if (!g->cidx || !g->cval) {
            rc = vl_fail(err, VL_ENOMEM, "gaussk: no memory for %zu candidates", total);
        } else {
            size_t off = 0;
            for (size_t c = 0; c < nc; c++) {
                if (bn[c]) {
                    memcpy(g->cidx + off, bi[c], bn[c] * sizeof *g->cidx);
                    memcpy(g->cval + off, bv[c], bn[c] * sizeof *g->cval);
                }
                off += bn[c];
            }
            g->ncand = total;
        }
    }
    for (size_t c = 0; c < nc; c++) {
        free(bi[c]);
        free(bv[c]);
    }
    return rc;
}

/* cnt[j] = count of keys >= pk[j] over the whole vector; per[c*P + j] the
 * same within chunk c. */
static void gk_probe(const gk *g, const uint32_t *pk, size_t *cnt, size_t *per)
{
    size_t nc = g->nchunks;
#pragma omp parallel num_threads((int)nc) if (nc > 1)
    {
        size_t nth = (size_t)omp_get_num_threads(), tid = (size_t)omp_get_thread_num();
        for (size_t c = tid; c < nc; c += nth)
            count_probes(g->x, gk_chunk(g, c), gk_chunk(g, c + 1), pk, per + c * GK_PROBES);
    }
    for (size_t j = 0; j < GK_PROBES; j++) {
        cnt[j] = 0;
        for (size_t c = 0; c < nc; c++)
            cnt[j] += per[c * GK_PROBES + j];
    }
}

/* Writes every index with key >= kmin, given the count per chunk. */
static void gk_emit(const gk *g, uint32_t kmin, const size_t *per_chunk, size_t stride,
                    uint32_t *idx)
{
    size_t nc = g->nchunks, off[GK_MAX_CHUNKS], pos = 0;
    for (size_t c = 0; c < nc; c++) {
        off[c] = pos;
        pos += per_chunk[c * stride];
    }
#pragma omp parallel num_threads((int)nc) if (nc > 1)
    {
        size_t nth = (size_t)omp_get_num_threads(), tid = (size_t)omp_get_thread_num();
        for (size_t c = tid; c < nc; c += nth)
            emit_ge(g->x, gk_chunk(g, c), gk_chunk(g, c + 1), kmin, idx + off[c]);
    }
}

/* ---- choosing the threshold among candidates ----------------------------- */

static size_t cand_count_ge(const gk *g, float t)
{
    size_t n = 0;
    for (size_t i = 0; i < g->ncand; i++)
        n += g->cval[i] >= t;
    return n;
}

/* The r-th largest candidate value (1 <= r <= ncand). */
static int cand_rank(const gk *g, size_t r, uint32_t *pos, float *out, vl_error *err)
{
    size_t got;
    int rc = compress_topk(g->cval, g->ncand, r, pos, &got, err);
    if (rc)
        return rc;
    float m = INFINITY;
    for (size_t j = 0; j < got; j++)
        m = g->cval[pos[j]] < m ? g->cval[pos[j]] : m;
    *out = m;
    return VL_OK;
}

/* Every coordinate >= the window is a candidate and there are at least
 * band_lo of them. (When thr0 lies below the window its count here is
 * only a lower bound, but then it already exceeds band_hi, which is all
 * the choice below uses.) Picks the threshold: thr0 when its count is in the
 * band, else the in-band count nearest to it, else (ties straddle the
 * band) exactly k by index order. */
static int gk_finish(gk *g, float thr0, uint32_t *idx, size_t *nnz, double *thr, vl_error *err)
{
    size_t c0 = cand_count_ge(g, thr0);
    float t = thr0;
    if (c0 < g->band_lo || c0 > g->band_hi) {
        size_t r = c0 > g->band_hi ? g->band_hi : g->band_lo;
        uint32_t *pos = malloc((g->k > r ? g->k : r) * sizeof *pos);
        if (!pos)
            return vl_fail(err, VL_ENOMEM, "gaussk: no memory for %zu positions", r);
        int rc = cand_rank(g, r, pos, &t, err);
        size_t ct = rc ? 0 : cand_count_ge(g, t);
        if (!rc && ct > g->band_hi) {
            /* Ties at t: the next value up counts fewer than r. */
            float up = INFINITY;
            for (size_t i = 0; i < g->ncand; i++)
                if (g->cval[i] > t && g->cval[i] < up)
                    up = g->cval[i];
            ct = up < INFINITY ? cand_count_ge(g, up) : 0;
            fprintf(stderr, "DBG ties c0 %zu ct %zu\n", c0, ct);
            if (ct >= g->band_lo) {
                t = up;
            } else {
                size_t got;
                rc = compress_topk(g->cval, g->ncand, g->k, pos, &got, err);
                if (!rc) {
                    for (size_t j = 0; j < got; j++)
                        idx[j] = g->cidx[pos[j]];
                    *nnz = got;
                    if (thr)
                        *thr = t;
                }
                free(pos);
                return rc;
            }
        }
        free(pos);
        if (rc)
            return rc;
    }
    size_t n = 0;
    for (size_t i = 0; i < g->ncand; i++)
        if (g->cval[i] >= t)
            idx[n++] = g->cidx[i];
    *nnz = n;
    if (thr)
        *thr = t;
    return VL_OK;
}

/* Exact top-k: the last resort when no threshold has an in-band count. */
static int gk_exact(const gk *g, uint32_t *idx, size_t *nnz, double *thr, vl_error *err)
{
    fprintf(stderr, "DBG exact\n");
    int rc = compress_topk(g->x, g->d, g->k, idx, nnz, err);
    if (rc == VL_OK && thr) {
        float m = INFINITY;
        for (size_t j = 0; j < *nnz; j++)
            m = fabsf(g->x[idx[j]]) < m ? fabsf(g->x[idx[j]]) : m;
        *thr = m;
    }
    return rc;
}

/* Narrows a bracket on the key, kl (count > band_hi) below kh (count <
 * band_lo), with passes that count GK_PROBES keys in between, until a
 * probe lands in the band (one more pass emits it) or the count at kl fits
 * a window (one more pass collects it). */
static int gk_bracket(gk *g, uint32_t kl, size_t cl, uint32_t kh, float thr0, uint32_t *idx,
                      size_t *nnz, double *thr, vl_error *err)
{
    size_t *per = malloc(g->nchunks * GK_PROBES * sizeof *per);
    if (!per)
        return vl_fail(err, VL_ENOMEM, "gaussk: no memory for counts");
    int rc = VL_OK;
    for (int pass = 0; pass < GK_MAX_PASSES; pass++) {
        fprintf(stderr, "DBG pass %d kl %g cl %zu kh %g\n", pass, val_of(kl), cl, val_of(kh));
        if (cl <= g->cap) {
            int overflow;
            rc = gk_window(g, kl, &overflow, err);
            if (rc == VL_OK && !overflow) {
                rc = gk_finish(g, thr0, idx, nnz, thr, err);
                free(per);
                return rc;
            }
            if (rc)
                break;
        }
        if (kh - kl < 2)
            break;
        /* Even steps on the bit pattern are near-geometric steps in |x|.
         * A bracket wider than 32 octaves (nothing known below) is probed
         * at 1/8, 1/4, ... 16 octaves under its top instead, where a guess
         * that overshot usually sits. The top probe is always kh - 1, so
         * a tie at the largest candidate value ends the search at once. */
        uint32_t pk[GK_PROBES];
        uint64_t span = (uint64_t)kh - kl;
        for (size_t j = 0; j + 1 < GK_PROBES; j++) {
            uint64_t p = kl + span * (j + 1) / GK_PROBES;
            if (span > ((uint64_t)32 << 23))
                p = kh - ((uint64_t)1 << (20 + GK_PROBES - 1 - j));
            pk[j] = (uint32_t)(p > kl ? p : kl + 1);
        }
        pk[GK_PROBES - 1] = kh - 1;
        size_t cnt[GK_PROBES];
        gk_probe(g, pk, cnt, per);
        size_t best = GK_PROBES;
        for (size_t j = 0; j < GK_PROBES; j++) {
            if (cnt[j] >= g->band_lo && cnt[j] <= g->band_hi) {
                size_t dj = cnt[j] > g->k ? cnt[j] - g->k : g->k - cnt[j];
                size_t db = best < GK_PROBES
                                ? (cnt[best] > g->k ? cnt[best] - g->k : g->k - cnt[best])
                                : SIZE_MAX;
                if (dj < db)
                    best = j;
            } else if (cnt[j] > g->band_hi) {
                kl = pk[j];
                cl = cnt[j];
            } else if (pk[j] < kh) {
                kh = pk[j];
            }
        }
        if (best < GK_PROBES) {
            gk_emit(g, pk[best], per + best, GK_PROBES, idx);
            *nnz = cnt[best];
            if (thr)
                *thr = val_of(pk[best]);
            free(per);
            return VL_OK;
        }
    }
    free(per);
    if (rc)
        return rc;
    return gk_exact(g, idx, nnz, thr, err);
}

int compress_gaussk(const float *x, size_t d, size_t k, uint32_t *idx, size_t *nnz, double *thr,
                    vl_error *err)
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
        return VL_OK;
    }
    if (k >= d) {
        for (size_t i = 0; i < d; i++)
            idx[i] = (uint32_t)i;
        *nnz = d;
        if (thr)
            *thr = 0.0;
        return VL_OK;
    }
    gk g;
    memset(&g, 0, sizeof g);
    g.x = x;
    g.d = d;
    g.k = k;
    g.band_lo = k - k / 20;
    g.band_hi = k + k / 20;
    g.nchunks = 1;
    if (d >= GK_PAR_MIN) {
        int mt = omp_get_max_threads();
        g.nchunks = mt < 1 ? 1 : (size_t)mt > GK_MAX_CHUNKS ? GK_MAX_CHUNKS : (size_t)mt;
    }
    /* The model puts about 3k values above the window; twice that before
     * giving up on it keeps the copy small next to the input. */
    g.cap = 8 * k + 4096 < d ? 8 * k + 4096 : d;

    double mean = 0, sd = 0;
    uint32_t kmax = 0;
    int rc = gk_moments(&g, &mean, &sd, &kmax, err);
    if (rc)
        return rc;
    double rho = (double)k / (double)d;
    double t0 = fabs(mean) + sd * two_sided_z(rho);
    double tw = fabs(mean) + sd * two_sided_z(3.0 * rho);
    float thr0 = (float)(t0 < FLT_MAX ? t0 : FLT_MAX);
    uint32_t kw = g.cap >= d ? 0 : key_of((float)(tw < FLT_MAX ? tw : FLT_MAX));

    int overflow;
    rc = gk_window(&g, kw, &overflow, err);
    if (rc == VL_OK && !overflow && g.ncand >= g.band_lo)
        rc = gk_finish(&g, thr0, idx, nnz, thr, err);
    else if (rc == VL_OK) {
        /* The window was off. Bracket: everything above the largest key
         * counts 0, and the window itself counts too few or too many. */
        uint32_t kl = 0, kh = kmax + 1;
        size_t cl = d;
        if (overflow) {
            kl = kw;
            cl = g.cap + 1;
        } else {
            kh = kw;
        }
        rc = gk_bracket(&g, kl, cl, kh, thr0, idx, nnz, thr, err);
    }
    free(g.cidx);
    free(g.cval);
    return rc;
}
