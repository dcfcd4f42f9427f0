/*
 * Peer-side error feedback for sparse uploads: e <- (e + delta) - C(e + delta),
 * or with a decay b < 1, e <- (b e + delta) - C(b e + delta).
 *
 * What top-k or Gaussian-k leaves out of an upload stays in e and is sent
 * in a later round, so nothing of the local update is lost for good. The
 * values are taken out of e exactly as they will be decoded (F16 included),
 * so sent + residual reproduces the input bit for bit. For F16 the value
 * sent, h, is e rounded to half precision; e - h is exact in float because
 * h lies on a coarser grid than e and within half a step of it, so the
 * difference fits in e's 24 bits. Past the clamp to +-65504 this holds
 * while |e| < 2^28.
 */
#include <omp.h>

#include "compress/compress.h"
#include "compress/hot.h"

#define FB_PAR_MIN ((size_t)1 << 20)
#define F16_MAX 65504.0f


COMPRESS_HOT static void add_range(float *restrict e, const float *restrict delta, size_t lo,
                                   size_t hi, float decay) {
    /* decay * e is exact for decay 1, so classic feedback stays bit exact. */
    for (size_t i = lo; i < hi; i++) e[i] = decay * e[i] + delta[i];
}

void compress_feedback_add(float *e, const float *delta, size_t d, float decay) {
    if (d < FB_PAR_MIN) {
        add_range(e, delta, 0, d, decay);
        return;
    }
    /* Fixed-size pieces keep each thread on whole cache lines. */
    const size_t piece = (size_t)1 << 16;
    long np = (long)((d + piece - 1) / piece);
#pragma omp parallel for schedule(static)
    for (long p = 0; p < np; p++) {
        size_t lo = (size_t)p * piece;
        add_range(e, delta, lo, lo + piece < d ? lo + piece : d, decay);
    }
}

void compress_feedback_take(float *e, const uint32_t *idx, size_t nnz, st_dtype dtype, float *val) {
    if (dtype == ST_F16) {
        for (size_t j = 0; j < nnz; j++) {
            float v = e[idx[j]];
            /* Beyond the largest half the encoder would send Inf. */
            v = v > F16_MAX ? F16_MAX : v < -F16_MAX ? -F16_MAX : v;
            float h = vl_f16_to_f32(vl_f32_to_f16(v));
            val[j] = h;
            e[idx[j]] -= h;
        }
        return;
    }
    for (size_t j = 0; j < nnz; j++) {
        float v = e[idx[j]];
        val[j] = v;
        e[idx[j]] -= v;
    }
}
