/*
 * Deterministic partitions of a labelled data set among peers (contract in
 * model/images.h). Every peer runs the whole computation for all parts and
 * keeps its own, so agreement needs nothing but the shared seed: no
 * coordinator round trip, no index lists on the wire.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/images.h"

double model_partition_gamma(vl_rng *r, double shape) {
    if (r == NULL || !(shape > 0) || !isfinite(shape)) return NAN;
    return exp(vl_rng_log_gamma(r, shape));
}

/* Fisher-Yates over a[0..m), m <= UINT32_MAX. */
static void shuffle(uint32_t *a, size_t m, vl_rng *r) {
    for (size_t i = m; i > 1; i--) {
        size_t j = vl_rng_below(r, (uint32_t)i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The bounds [lo, hi) of part's share of a class of m items, from a fresh
 * Dirichlet(beta) draw over all parts. lg is scratch for parts doubles. */
static void dirichlet_cut(vl_rng *r, double beta, int parts, int part, size_t m, double *lg,
                          size_t *lo, size_t *hi) {
    /* Every part's draw is taken, so the stream (and the other parts'
     * cuts) do not depend on which part is asked for. */
    double top = -INFINITY;
    for (int p = 0; p < parts; p++) {
        lg[p] = vl_rng_log_gamma(r, beta);
        if (lg[p] > top) top = lg[p];
    }
    /* Normalising after subtracting the largest logarithm keeps at least
     * one weight at exactly 1, so the total is never 0 or infinite. */
    double total = 0;
    for (int p = 0; p < parts; p++) {
        lg[p] = exp(lg[p] - top);
        total += lg[p];
    }
    /* Cut k is the rounded cumulative share before part k; the cumulative
     * sum only grows, so cuts never cross, and the last is pinned to m so
     * that rounding loses no item. */
    double cum = 0;
    size_t prev = 0;
    for (int p = 0; p <= part; p++) {
        size_t cut = (size_t)floor(cum / total * (double)m + 0.5);
        if (cut < prev) cut = prev;
        if (cut > m) cut = m;
        prev = cut;
        cum += lg[p];
    }
    *lo = prev;
    if (part == parts - 1) {
        *hi = m;
    } else {
        size_t cut = (size_t)floor(cum / total * (double)m + 0.5);
        *hi = cut < prev ? prev : cut > m ? m : cut;
    }
}

int model_partition(const uint8_t *labels, size_t n, int classes, int parts, int part, double beta,
                    uint64_t seed, uint32_t **idx_out, size_t *count_out, vl_error *err) {
    if (idx_out != NULL) *idx_out = NULL;
    if (count_out != NULL) *count_out = 0;
    if (labels == NULL || idx_out == NULL || count_out == NULL)
        return vl_fail(err, VL_EINVAL, "partition: missing argument");
    if (n == 0 || n > UINT32_MAX)
        return vl_fail(err, VL_EINVAL, "partition: %zu items, need 1 to %u", n,
                       (unsigned)UINT32_MAX);
    if (classes < 1 || classes > 256)
        return vl_fail(err, VL_EINVAL, "partition: %d classes, need 1 to 256", classes);
    if (parts < 1 || parts > MODEL_PARTITION_MAX_PARTS)
        return vl_fail(err, VL_EINVAL, "partition: %d parts, need 1 to %d", parts,
                       MODEL_PARTITION_MAX_PARTS);
    if (part < 0 || part >= parts)
        return vl_fail(err, VL_EINVAL, "partition: part %d is outside 0..%d", part, parts - 1);
    if (!isfinite(beta))
        return vl_fail(err, VL_EINVAL, "partition: beta %g is not a finite number", beta);
    size_t per_class[256] = {0};
    for (size_t i = 0; i < n; i++) {
        if (labels[i] >= classes)
            return vl_fail(err, VL_EINVAL, "partition: label %zu is %d, not below %d classes", i,
                           labels[i], classes);
        per_class[labels[i]]++;
    }

    uint32_t *order = malloc(n * sizeof *order);
    if (order == NULL)
        return vl_fail(err, VL_ENOMEM, "partition: out of memory for %zu indices", n);
    vl_rng r;
    vl_rng_seed(&r, seed);
    size_t kept = 0;
    if (beta <= 0) {
        for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
        shuffle(order, n, &r);
        /* n < 2^32 and parts <= 2^20: the products fit in 64 bits. */
        size_t lo = (size_t)((uint64_t)part * n / (uint64_t)parts);
        size_t hi = (size_t)(((uint64_t)part + 1) * n / (uint64_t)parts);
        kept = hi - lo;
        memmove(order, order + lo, kept * sizeof *order);
    } else {
        /* Below this, log(U)/beta in the gamma boost can overflow to
         * -inf for every part, and ranks nothing; at it, each class
         * already goes wholly to the part with the largest U, which is
         * the limit of smaller betas too. */
        if (beta < MODEL_PARTITION_MIN_BETA) beta = MODEL_PARTITION_MIN_BETA;
        double *lg = malloc((size_t)parts * sizeof *lg);
        if (lg == NULL) {
            free(order);
            return vl_fail(err, VL_ENOMEM, "partition: out of memory for %d parts", parts);
        }
        /* Group the indices by class, ascending within each, so a class's
         * items are a contiguous run that its shuffle and cuts work on. */
        size_t start[257];
        start[0] = 0;
        for (int c = 0; c < classes; c++) start[c + 1] = start[c] + per_class[c];
        size_t fill[256];
        memcpy(fill, start, sizeof fill);
        for (size_t i = 0; i < n; i++) order[fill[labels[i]]++] = (uint32_t)i;
        for (int c = 0; c < classes; c++) {
            /* Each class has its own stream, derived from the seed alone,
             * so its split does not shift with the sizes of other classes. */
            vl_rng cr;
            vl_rng_seed(&cr, vl_rng_u64(&r));
            size_t m = per_class[c], lo, hi;
            uint32_t *run = order + start[c];
            shuffle(run, m, &cr);
            dirichlet_cut(&cr, beta, parts, part, m, lg, &lo, &hi);
            /* kept <= start[c] + lo: the move only ever goes left. */
            memmove(order + kept, run + lo, (hi - lo) * sizeof *order);
            kept += hi - lo;
        }
        free(lg);
    }
    if (kept == 0) {
        free(order);
        return 0;
    }
    qsort(order, kept, sizeof *order, cmp_u32);
    uint32_t *shrunk = realloc(order, kept * sizeof *order);
    *idx_out = shrunk ? shrunk : order;
    *count_out = kept;
    return 0;
}
