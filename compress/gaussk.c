/*
 * Gaussian-k: a cheaper stand-in for exact top-k that picks the coordinates
 * with |x| at or above a threshold guessed from the mean and standard
 * deviation, as if the values were normal, and then corrects the guess.
 *
 * The fast path reads the vector once. A small sample's moments place a
 * "window" threshold where the model predicts about three times k values;
 * one streaming pass then sums the exact moments (and finds the largest
 * |x|) and copies out every coordinate above the window. Every count for a
 * threshold at or above the window is then exact and cheap, so the
 * model's threshold thr = |mean| + std * Phi^-1(1 - rho/2) is kept when its
 * count lies within +-5 % of k and is otherwise moved to where it counts k
 * (or as near as the candidates allow). When the data is far from normal (heavy tails, a few
 * huge outliers, many equal values), further passes count several probe
 * thresholds at once and narrow a bracket on the float bit pattern until a
 * window fits; values tied across the whole band end in an exact top-k, so
 * the count is then exactly k. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "compress/scan.h"

/* Hot loops are built for AVX-512, AVX2 and the baseline, picked when the
 * library loads; elsewhere they are plain functions. */

/* From a quarter million values on, two threads already pay: the pass
 * is short, but so is waking a thread. */
#define GK_PAR_MIN ((size_t)1 << 18)
#define GK_MAX_CHUNKS 64
/* Moments are summed per fixed block and the blocks in order, so the
 * threshold does not depend on the thread count. */
#define GK_STAT_BLOCK ((size_t)1 << 16)
#define GK_SUB 4096
/* Values in the sample that seeds the first window: runs of GK_RUN. */
#define GK_SAMPLE 16384
#define GK_RUN 256
#define GK_PROBES 8
#define GK_MAX_PASSES 16


static inline uint32_t key_of(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7fffffffu;
}

static inline float val_of(uint32_t key) {
    float v;
    memcpy(&v, &key, sizeof v);
    return v;
}

/* ---- inverse normal CDF ------------------------------------------------ */

/* Phi^-1(p) for 0 < p <= 0.5 by Acklam's rational approximation (relative
 * error 1.15e-9), polished by one Halley step on erfc so the far tail that
 * tiny k/d asks for is accurate too. */
static double probit_lower(double p) {
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
    double u = e * 2.5066282746310002 * exp(0.5 * z * z); /* sqrt(2 pi) */
    return z - u / (1.0 + 0.5 * z * u);
}

double compress_gaussk_z(double rho) {
    if (rho >= 1.0) return 0.0;
    double z = -probit_lower(0.5 * rho);
    return z > 0 ? z : 0.0;
}

/* ---- streaming kernels --------------------------------------------------- */

typedef struct moments {
    double sum, sumsq;
    uint32_t kmax;
} moments;

/* Sums of v and v^2 for v = x - pivot, and the largest key, over at most
 * GK_SUB values. Shifting by a typical value keeps the variance from
 * cancelling when the mean is large next to the spread. Float sums of a
 * few hundred terms per lane are ample for a threshold and twice as wide
 * per vector as doubles; a square that overflows float (|v| > 1.8e19)
 * sends the piece to the double loop. The simd reduction lets the sums be
 * reassociated, so they vectorise. */
COMPRESS_HOT static moments block_moments(const float *x, size_t lo, size_t hi, double pivot) {
    float s = 0, q = 0, pf = (float)pivot;
    uint32_t m = 0;
#pragma omp simd reduction(+ : s, q) reduction(max : m)
    for (size_t i = lo; i < hi; i++) {
        float v = x[i] - pf;
        uint32_t u = key_at(x, i);
        s += v;
        q += v * v;
        m = u > m ? u : m;
    }
    if (isfinite(q)) {
        moments r = {s, q, m};
        return r;
    }
    double sd = 0, qd = 0;
#pragma omp simd reduction(+ : sd, qd)
    for (size_t i = lo; i < hi; i++) {
        double v = (double)x[i] - pivot;
        sd += v;
        qd += v * v;
    }
    moments r = {sd, qd, m};
    return r;
}


/* cnt[j] = number of keys >= pk[j] in x[lo, hi); returns the largest key
 * below kh (0 if none). One probe at a time over an L1-sized piece keeps
 * every loop a plain vectorisable reduction. */
COMPRESS_HOT static uint32_t count_probes(const float *x, size_t lo, size_t hi, const uint32_t *pk,
                                          uint32_t kh, size_t *cnt) {
    uint32_t below = 0;
    for (size_t j = 0; j < GK_PROBES; j++) cnt[j] = 0;
    for (size_t a = lo; a < hi; a += GK_SUB) {
        size_t b = a + GK_SUB < hi ? a + GK_SUB : hi;
        for (size_t j = 0; j < GK_PROBES; j++) {
            uint32_t p = pk[j], c = 0;
            for (size_t i = a; i < b; i++) c += key_at(x, i) >= p;
            cnt[j] += c;
        }
        uint32_t m = 0;
        for (size_t i = a; i < b; i++) {
            uint32_t u = key_at(x, i);
            u = u < kh ? u : 0;
            m = u > m ? u : m;
        }
        below = m > below ? m : below;
    }
    return below;
}

COMPRESS_HOT static size_t emit_ge(const float *x, size_t lo, size_t hi, uint32_t kmin,
                                   uint32_t *out) {
    size_t n = 0, i = lo;
    for (; i + SCAN_BLOCK <= hi; i += SCAN_BLOCK) {
        if (block_max(x, i) < kmin) continue;
        for (size_t j = i; j < i + SCAN_BLOCK; j++)
            if (key_at(x, j) >= kmin) out[n++] = (uint32_t)j;
    }
    for (; i < hi; i++)
        if (key_at(x, i) >= kmin) out[n++] = (uint32_t)i;
    return n;
}

/* ---- passes over the data ----------------------------------------------- */

typedef struct gk {
    const float *x;
    size_t d, k;
    size_t band_lo, band_hi; /* counts accepted: k -+ 5 % */
    size_t nchunks;
    int nthreads;
    size_t cap;    /* most candidates a window may hold */
    uint32_t kwin; /* the window: every key >= kwin is a candidate */
    uint32_t *cidx;
    float *cval;
    size_t ncand;
} gk;

/* Chunks are whole runs of GK_STAT_BLOCK values, so moment partial sums
 * are the same however many chunks or threads there are. */
static inline size_t gk_chunk(const gk *g, size_t c) {
    size_t nb = (g->d + GK_STAT_BLOCK - 1) / GK_STAT_BLOCK;
    size_t b = (size_t)((uint64_t)nb * c / g->nchunks) * GK_STAT_BLOCK;
    return b < g->d ? b : g->d;
}

/* Mean and standard deviation of a spread-out sample: runs of GK_RUN
 * values (cheap to fetch) at even steps, or all of x when that is short. */
static void gk_sample(const float *x, size_t d, double *mean, double *sd) {
    size_t runs = d <= GK_SAMPLE ? 1 : GK_SAMPLE / GK_RUN;
    size_t len = d <= GK_SAMPLE ? d : GK_RUN;
    double s = 0, q = 0, p = x[0];
    for (size_t r = 0; r < runs; r++) {
        size_t lo = (size_t)((uint64_t)(d - len) * r / (runs > 1 ? runs - 1 : 1));
        for (size_t i = lo; i < lo + len; i++) {
            double v = (double)x[i] - p;
            s += v;
            q += v * v;
        }
    }
    double n = (double)(runs * len), ms = s / n, var = q / n - ms * ms;
    *mean = p + ms;
    *sd = var > 0 ? sqrt(var) : 0.0;
}

/* One pass: copies out every coordinate with key >= kmin into
 * g->cidx/cval in index order, unless there are more than g->cap (then
 * *overflow is set and nothing is kept), and, when part is given, fills
 * part[b] with the moments of block b about pivot. */
static int gk_window(gk *g, uint32_t kmin, moments *part, double pivot, int *overflow,
                     vl_error *err) {
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
    g->kwin = kmin;
    long ncl = (long)nc;
    /* More chunks than threads, handed out as threads free up: a core
     * shared with other work then slows one chunk, not half the pass. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(g->nthreads) if (g->nthreads > 1)
    for (long cl = 0; cl < ncl; cl++) {
        size_t c = (size_t)cl, hi = gk_chunk(g, c + 1), alloc = 0;
        /* Steps of GK_SUB values, summed and then scanned while in L1:
         * the stream from memory pauses only briefly, which keeps the
         * hardware prefetcher running. */
        for (size_t lo = gk_chunk(g, c); lo < hi; lo += GK_SUB) {
            size_t bhi = lo + GK_SUB < hi ? lo + GK_SUB : hi;
            int stop;
#pragma omp atomic read
            stop = fail;
            if (stop == 2 || (stop && !part)) break;
            if (part) {
                moments m = block_moments(g->x, lo, bhi, pivot);
                moments *pb = &part[lo / GK_STAT_BLOCK];
                if (lo % GK_STAT_BLOCK == 0) {
                    *pb = m;
                } else {
                    pb->sum += m.sum;
                    pb->sumsq += m.sumsq;
                    pb->kmax = m.kmax > pb->kmax ? m.kmax : pb->kmax;
                }
            }
            for (size_t pos = lo; !stop && pos < bhi;) {
                if (scan_grow(&bi[c], &bv[c], &alloc, bn[c]) != 0) {
#pragma omp atomic write
                    fail = 2;
                    break;
                }
                size_t got = scan_collect_some(g->x, &pos, bhi, kmin, bi[c] + bn[c], bv[c] + bn[c],
                                               alloc - bn[c]);
                bn[c] += got;
                size_t now;
#pragma omp atomic capture
                now = shared_total += got;
                if (now > g->cap) {
#pragma omp atomic write
                    fail = 1;
                    stop = 1;
                }
            }
        }
    }
    int rc = VL_OK;
    *overflow = fail == 1;
    if (fail == 2) rc = vl_fail(err, VL_ENOMEM, "gaussk: no memory for candidates");
    size_t total = 0;
    for (size_t c = 0; c < nc; c++) total += bn[c];
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
 * same within chunk c. Returns the largest key below kh. */
static uint32_t gk_probe(const gk *g, const uint32_t *pk, uint32_t kh, size_t *cnt, size_t *per) {
    size_t nc = g->nchunks;
    uint32_t below[GK_MAX_CHUNKS] = {0};
    long ncl = (long)nc;
#pragma omp parallel for schedule(dynamic, 1) num_threads(g->nthreads) if (g->nthreads > 1)
    for (long c = 0; c < ncl; c++)
        below[c] = count_probes(g->x, gk_chunk(g, (size_t)c), gk_chunk(g, (size_t)c + 1), pk, kh,
                                per + (size_t)c * GK_PROBES);
    uint32_t m = 0;
    for (size_t c = 0; c < nc; c++) m = below[c] > m ? below[c] : m;
    for (size_t j = 0; j < GK_PROBES; j++) {
        cnt[j] = 0;
        for (size_t c = 0; c < nc; c++) cnt[j] += per[c * GK_PROBES + j];
    }
    return m;
}

/* Writes every index with key >= kmin, given the count per chunk. */
static void gk_emit(const gk *g, uint32_t kmin, const size_t *per_chunk, size_t stride,
                    uint32_t *idx) {
    size_t nc = g->nchunks, off[GK_MAX_CHUNKS], pos = 0;
    for (size_t c = 0; c < nc; c++) {
        off[c] = pos;
        pos += per_chunk[c * stride];
    }
    long ncl = (long)nc;
#pragma omp parallel for schedule(dynamic, 1) num_threads(g->nthreads) if (g->nthreads > 1)
    for (long c = 0; c < ncl; c++)
        emit_ge(g->x, gk_chunk(g, (size_t)c), gk_chunk(g, (size_t)c + 1), kmin, idx + off[c]);
}

/* ---- choosing the threshold among candidates ----------------------------- */

static size_t cand_count_ge(const gk *g, float t) {
    size_t n = 0;
    for (size_t i = 0; i < g->ncand; i++) n += g->cval[i] >= t;
    return n;
}

/* The r-th largest candidate value (1 <= r <= ncand). */
static int cand_rank(const gk *g, size_t r, uint32_t *pos, float *out, vl_error *err) {
    size_t got;
    int rc = compress_topk(g->cval, g->ncand, r, pos, &got, err);
    if (rc) return rc;
    float m = INFINITY;
    for (size_t j = 0; j < got; j++) m = g->cval[pos[j]] < m ? g->cval[pos[j]] : m;
    *out = m;
    return VL_OK;
}

/* Every coordinate >= the window is a candidate and there are at least
 * band_lo of them. Picks the threshold: thr0 when its count is in the
 * band; else, the model being off, the k-th largest value (or, when ties
 * there overshoot the band, the next value up); else (ties straddle the
 * whole band) exactly k by index order. Counts are only known at or above
 * the window, so a thr0 below it starts from the window instead. */
static int gk_finish(gk *g, float thr0, uint32_t *idx, size_t *nnz, double *thr, vl_error *err) {
    if (thr0 < val_of(g->kwin)) thr0 = val_of(g->kwin);
    size_t c0 = cand_count_ge(g, thr0);
    float t = thr0;
    if (c0 < g->band_lo || c0 > g->band_hi) {
        size_t r = g->k < g->ncand ? g->k : g->ncand;
        uint32_t *pos = malloc(g->k * sizeof *pos);
        if (!pos) return vl_fail(err, VL_ENOMEM, "gaussk: no memory for %zu positions", r);
        int rc = cand_rank(g, r, pos, &t, err);
        size_t ct = rc ? 0 : cand_count_ge(g, t);
        if (!rc && ct > g->band_hi) {
            /* Ties at t: the next value up counts fewer than r. */
            float up = INFINITY;
            for (size_t i = 0; i < g->ncand; i++)
                if (g->cval[i] > t && g->cval[i] < up) up = g->cval[i];
            ct = up < INFINITY ? cand_count_ge(g, up) : 0;
            if (ct >= g->band_lo) {
                t = up;
            } else {
                size_t got;
                rc = compress_topk(g->cval, g->ncand, g->k, pos, &got, err);
                if (!rc) {
                    for (size_t j = 0; j < got; j++) idx[j] = g->cidx[pos[j]];
                    *nnz = got;
                    if (thr) *thr = t;
                }
                free(pos);
                return rc;
            }
        }
        free(pos);
        if (rc) return rc;
    }
    size_t n = 0;
    for (size_t i = 0; i < g->ncand; i++)
        if (g->cval[i] >= t) idx[n++] = g->cidx[i];
    *nnz = n;
    if (thr) *thr = t;
    return VL_OK;
}

/* Exact top-k: the last resort when no threshold has an in-band count. */
static int gk_exact(const gk *g, uint32_t *idx, size_t *nnz, double *thr, vl_error *err) {
    int rc = compress_topk(g->x, g->d, g->k, idx, nnz, err);
    if (rc == VL_OK && thr) {
        float m = INFINITY;
        for (size_t j = 0; j < *nnz; j++) m = fabsf(g->x[idx[j]]) < m ? fabsf(g->x[idx[j]]) : m;
        *thr = m;
    }
    return rc;
}

/* Narrows a bracket on the key, kl (count > band_hi) below kh (count <
 * band_lo), with passes that count GK_PROBES keys in between, until a
 * probe lands in the band (one more pass emits it) or the count at kl fits
 * a window (one more pass collects it). */
static int gk_bracket(gk *g, uint32_t kl, size_t cl, uint32_t kh, float thr0, uint32_t *idx,
                      size_t *nnz, double *thr, vl_error *err) {
    size_t *per = malloc(g->nchunks * GK_PROBES * sizeof *per);
    if (!per) return vl_fail(err, VL_ENOMEM, "gaussk: no memory for counts");
    int rc = VL_OK;
    for (int pass = 0; pass < GK_MAX_PASSES; pass++) {
        if (cl <= g->cap) {
            int overflow;
            rc = gk_window(g, kl, NULL, 0.0, &overflow, err);
            if (rc == VL_OK && !overflow) {
                rc = gk_finish(g, thr0, idx, nnz, thr, err);
                free(per);
                return rc;
            }
            if (rc) break;
        }
        if (kh - kl < 2) break;
        /* Even steps on the bit pattern are near-geometric steps in |x|
         * (2^23 steps make an octave). A bracket wider than 16 octaves is
         * probed at 1/8, 1/2, 2, 8, 16, 32 and 64 octaves under its top
         * instead: a guess that overshot usually sits close, an outlier
         * that inflated the spread puts it decades too high. The top
         * probe is always kh - 1, the largest value left in the bracket,
         * so ties there end the search at once. */
        static const int ladder[GK_PROBES - 1] = {29, 28, 27, 26, 24, 22, 20};
        uint32_t pk[GK_PROBES];
        uint64_t span = (uint64_t)kh - kl;
        for (size_t j = 0; j + 1 < GK_PROBES; j++) {
            uint64_t p = kl + span * (j + 1) / GK_PROBES;
            if (span > ((uint64_t)16 << 23)) {
                uint64_t off = (uint64_t)1 << ladder[j];
                p = off < span ? kh - off : kl + 1;
            }
            pk[j] = (uint32_t)(p > kl ? p : kl + 1);
        }
        pk[GK_PROBES - 1] = kh - 1;
        size_t cnt[GK_PROBES];
        /* Nothing lies between the largest key under kh and kh, so the
         * bracket can shrink to just above it. */
        uint32_t below = gk_probe(g, pk, kh, cnt, per);
        size_t best = GK_PROBES;
        for (size_t j = 0; j < GK_PROBES; j++) {
            if (cnt[j] >= g->band_lo && cnt[j] <= g->band_hi) {
                size_t dj = cnt[j] > g->k ? cnt[j] - g->k : g->k - cnt[j];
                size_t db = best < GK_PROBES
                                ? (cnt[best] > g->k ? cnt[best] - g->k : g->k - cnt[best])
                                : SIZE_MAX;
                if (dj < db) best = j;
            } else if (cnt[j] > g->band_hi) {
                kl = pk[j];
                cl = cnt[j];
            } else if (pk[j] < kh) {
                kh = pk[j];
            }
        }
        if (below >= kl && below + 1 < kh) kh = below + 1;
        if (best < GK_PROBES) {
            gk_emit(g, pk[best], per + best, GK_PROBES, idx);
            *nnz = cnt[best];
            if (thr) *thr = val_of(pk[best]);
            free(per);
            return VL_OK;
        }
    }
    free(per);
    if (rc) return rc;
    return gk_exact(g, idx, nnz, thr, err);
}

int compress_gaussk(const float *x, size_t d, size_t k, uint32_t *idx, size_t *nnz, double *thr,
                    vl_error *err) {
    if (nnz) *nnz = 0;
    if (!nnz || (d > 0 && k > 0 && (!x || !idx)))
        return vl_fail(err, VL_EINVAL, "gaussk: null argument");
    if ((uint64_t)d > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "gaussk: %zu values do not fit 32-bit indices", d);
    if (d == 0 || k == 0) {
        if (thr) *thr = HUGE_VAL;
        return VL_OK;
    }
    if (k >= d) {
        for (size_t i = 0; i < d; i++) idx[i] = (uint32_t)i;
        *nnz = d;
        if (thr) *thr = 0.0;
        return VL_OK;
    }
    gk g;
    memset(&g, 0, sizeof g);
    g.x = x;
    g.d = d;
    g.k = k;
    g.band_lo = k - k / 20;
    g.band_hi = k + k / 20;
    g.nthreads = 1;
    if (d >= GK_PAR_MIN) {
        int mt = omp_get_max_threads();
        g.nthreads = mt < 1 ? 1 : mt > GK_MAX_CHUNKS / 4 ? GK_MAX_CHUNKS / 4 : mt;
    }
    size_t nb = (d + GK_STAT_BLOCK - 1) / GK_STAT_BLOCK;
    g.nchunks = g.nthreads > 1 ? 4 * (size_t)g.nthreads : 1;
    g.nchunks = g.nchunks < nb ? g.nchunks : nb;
    /* The model puts about 3k values above the window; over twice that
     * and the window is given up, which keeps the copy small next to the
     * input. */
    g.cap = 8 * k + 4096 < d ? 8 * k + 4096 : d;
    double rho = (double)k / (double)d;
    double z = compress_gaussk_z(rho), zw = compress_gaussk_z(3.0 * rho);

    /* The first window comes from a sample's moments, so the pass that
     * computes the exact ones can collect the candidates as well. */
    double mean, sd;
    gk_sample(x, d, &mean, &sd);
    double pivot = mean;
    double tw = fabs(mean) + sd * zw;
    uint32_t kw = g.cap >= d ? 0 : key_of((float)(tw < FLT_MAX ? tw : FLT_MAX));
    moments *part = malloc(nb * sizeof *part);
    if (!part) return vl_fail(err, VL_ENOMEM, "gaussk: no memory for %zu partial sums", nb);
    int overflow;
    int rc = gk_window(&g, kw, part, pivot, &overflow, err);
    if (rc) {
        free(part);
        free(g.cidx);
        free(g.cval);
        return rc;
    }
    double s = 0, q = 0;
    uint32_t kmax = 0;
    for (size_t b = 0; b < nb; b++) {
        s += part[b].sum;
        q += part[b].sumsq;
        kmax = part[b].kmax > kmax ? part[b].kmax : kmax;
    }
    free(part);
    double ms = s / (double)d, var = q / (double)d - ms * ms;
    mean = pivot + ms;
    sd = var > 0 ? sqrt(var) : 0.0;
    double t0 = fabs(mean) + sd * z;
    float thr0 = (float)(t0 < FLT_MAX ? t0 : FLT_MAX);

    /* What the windows tried so far say about the answer: everything
     * above the largest key counts 0, an overflowing window counts too
     * many, a short one too few. */
    uint32_t kl = 0, kh = kmax + 1;
    size_t cl = d;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!overflow && g.ncand >= g.band_lo) {
            rc = gk_finish(&g, thr0, idx, nnz, thr, err);
            goto done;
        }
        if (overflow && kw >= kl) {
            kl = kw;
            cl = g.cap + 1;
        } else if (!overflow && kw < kh) {
            kh = kw;
        }
        /* Then the window the exact moments give, if it is new. */
        tw = fabs(mean) + sd * zw;
        kw = key_of((float)(tw < FLT_MAX ? tw : FLT_MAX));
        if (attempt > 0 || kw <= kl || kw >= kh) break;
        rc = gk_window(&g, kw, NULL, 0.0, &overflow, err);
        if (rc) goto done;
    }
    rc = gk_bracket(&g, kl, cl, kh, thr0, idx, nnz, thr, err);
done:
    free(g.cidx);
    free(g.cval);
    return rc;
}
