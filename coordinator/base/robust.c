/* Robust aggregation rules and the set of a merge's updates they read. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/base/robust.h"
#include "coordinator/config/config.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void coord_robust_sort(double *x, size_t n) {
    qsort(x, n, sizeof *x, cmp_double);
}

double coord_robust_median(double *x, size_t n) {
    coord_robust_sort(x, n);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

double coord_robust_median_known(const double *v, size_t n, double *max) {
    double *x = malloc(n * sizeof *x + 1);
    *max = NAN;
    if (!x) return NAN;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(v[i])) x[k++] = v[i];
    double med = k ? coord_robust_median(x, k) : NAN;
    if (k) *max = x[k - 1];
    free(x);
    return med;
}

void coord_robust_clip_scales(const double *norms, size_t k, double mult, double *scale) {
    /* scale is the median's scratch, then the answer. */
    memcpy(scale, norms, k * sizeof *scale);
    double bound = k ? mult * coord_robust_median(scale, k) : 0;
    for (size_t i = 0; i < k; i++) scale[i] = norms[i] > bound ? bound / norms[i] : 1.0;
}

double coord_robust_bound_scale(const coord_robust_config *r, double norm) {
    return r->max_norm > 0 && norm > r->max_norm ? r->max_norm / norm : 1.0;
}

/* One coordinate's value from update i. */
typedef struct item {
    float v;
    uint32_t i;
} item;

static int cmp_item(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* Sorts by value, equal values in update order. The items arrive in update
 * order, so a stable insertion sort gives that order for small k. */
static void sort_items(item *it, size_t k) {
    if (k > 32) {
        qsort(it, k, sizeof *it, cmp_item);
        return;
    }
    for (size_t a = 1; a < k; a++) {
        item x = it[a];
        size_t b = a;
        for (; b > 0 && it[b - 1].v > x.v; b--) it[b] = it[b - 1];
        it[b] = x;
    }
}

/* Weighted mean of it[lo, hi); the plain mean should the weights vanish. */
static float weighted_mean(const item *it, size_t lo, size_t hi, const double *w) {
    double s = 0, sw = 0, plain = 0;
    for (size_t a = lo; a < hi; a++) {
        s += w[it[a].i] * (double)it[a].v;
        sw += w[it[a].i];
        plain += (double)it[a].v;
    }
    return (float)(sw > 0 ? s / sw : plain / (double)(hi - lo));
}

int coord_robust_combine(coord_rule rule, double trim, const float *const *rows, const double *w,
                         size_t k, size_t d, float *out, vl_error *err) {
    if (k == 0) return vl_fail(err, VL_EINVAL, "no updates to combine");
    item *it = malloc(k * sizeof *it);
    if (!it) return vl_fail(err, VL_ENOMEM, "out of memory combining %zu updates", k);
    size_t b = rule == COORD_RULE_TRIMMED_MEAN ? coord_config_trim_count(trim, k) : 0;
    for (size_t j = 0; j < d; j++) {
        for (size_t i = 0; i < k; i++) it[i] = (item){rows[i][j], (uint32_t)i};
        switch (rule) {
        case COORD_RULE_MEDIAN:
            sort_items(it, k);
            out[j] = k % 2 ? it[k / 2].v
                           : (float)(0.5 * ((double)it[k / 2 - 1].v + (double)it[k / 2].v));
            break;
        case COORD_RULE_TRIMMED_MEAN:
            sort_items(it, k);
            out[j] = weighted_mean(it, b, k - b, w);
            break;
        case COORD_RULE_MEAN:
        case COORD_RULE_NORM_CLIP: out[j] = weighted_mean(it, 0, k, w); break;
        }
    }
    free(it);
    return VL_OK;
}

/* ---- one merge's updates ----------------------------------------------------- */

void coord_robust_acc_init(coord_robust_acc *a, const coord_robust_config *cfg, compress_kind kind,
                           size_t d) {
    memset(a, 0, sizeof *a);
    a->cfg = *cfg;
    a->kind = kind;
    a->d = d;
}

void coord_robust_acc_free(coord_robust_acc *a) {
    if (!a) return;
    for (size_t i = 0; i < a->k; i++) {
        free(a->vals[i]);
        if (a->idx) free(a->idx[i]);
    }
    free(a->vals);
    free(a->idx);
    free(a->count);
    free(a->w);
    free(a->norm);
    memset(a, 0, sizeof *a);
}

static int grow(coord_robust_acc *a, vl_error *err) {
    if (a->k < a->cap) return VL_OK;
    size_t cap = a->cap ? a->cap * 2 : 16;
    float **vals = realloc(a->vals, cap * sizeof *vals);
    if (vals) a->vals = vals;
    uint32_t **idx = realloc(a->idx, cap * sizeof *idx);
    if (idx) a->idx = idx;
    size_t *count = realloc(a->count, cap * sizeof *count);
    if (count) a->count = count;
    double *w = realloc(a->w, cap * sizeof *w);
    if (w) a->w = w;
    double *norm = realloc(a->norm, cap * sizeof *norm);
    if (norm) a->norm = norm;
    if (!vals || !idx || !count || !w || !norm)
        return vl_fail(err, VL_ENOMEM, "out of memory holding %zu updates", cap);
    a->cap = cap;
    return VL_OK;
}

int coord_robust_acc_add(coord_robust_acc *a, const compress_update *u, double w, double norm,
                         vl_error *err) {
    if (u->meta.kind != a->kind)
        return vl_fail(err, VL_EINVAL, "a %s update in a merge of %s updates",
                       compress_kind_name(u->meta.kind), compress_kind_name(a->kind));
    size_t n = compress_update_count(u);
    if (u->meta.kind != COMPRESS_TOPK && n != a->d)
        return vl_fail(err, VL_EINVAL, "an update of %zu values in a merge of %zu", n, a->d);
    int rc = grow(a, err);
    if (rc != VL_OK) return rc;
    float *v = malloc(n * sizeof *v + 1);
    uint32_t *ix = a->kind == COMPRESS_TOPK ? malloc(n * sizeof *ix + 1) : NULL;
    if (!v || (a->kind == COMPRESS_TOPK && !ix)) {
        free(v);
        free(ix);
        return vl_fail(err, VL_ENOMEM, "out of memory holding an update of %zu values", n);
    }
    compress_update_values(u, ix, v);
    double s = coord_robust_bound_scale(&a->cfg, norm);
    if (s < 1) {
        for (size_t j = 0; j < n; j++) v[j] = (float)((double)v[j] * s);
        norm *= s;
        a->bounded++;
    }
    a->vals[a->k] = v;
    a->idx[a->k] = ix;
    a->count[a->k] = n;
    a->w[a->k] = w;
    a->norm[a->k] = norm;
    a->k++;
    return VL_OK;
}

/* The sorted union of the topk updates' indices into *out (*n of them). */
static int index_union(const coord_robust_acc *a, uint32_t **out, size_t *n, vl_error *err) {
    size_t total = 0;
    for (size_t i = 0; i < a->k; i++) total += a->count[i];
    uint32_t *u = malloc(total * sizeof *u + 1);
    if (!u) return vl_fail(err, VL_ENOMEM, "out of memory for %zu indices", total);
    /* Merge one update at a time into the union so far (both ascending). */
    uint32_t *tmp = malloc(total * sizeof *tmp + 1);
    if (!tmp) {
        free(u);
        return vl_fail(err, VL_ENOMEM, "out of memory for %zu indices", total);
    }
    size_t m = 0;
    for (size_t i = 0; i < a->k; i++) {
        const uint32_t *x = a->idx[i];
        size_t p = 0, q = 0, r = 0, c = a->count[i];
        while (p < m || q < c) {
            uint32_t next = q == c || (p < m && u[p] <= x[q]) ? u[p] : x[q];
            if (p < m && u[p] == next) p++;
            if (q < c && x[q] == next) q++;
            tmp[r++] = next;
        }
        memcpy(u, tmp, r * sizeof *u);
        m = r;
    }
    free(tmp);
    *out = u;
    *n = m;
    return VL_OK;
}

/* Lays the topk updates out densely over the union and combines them. */
static int finish_sparse(coord_robust_acc *a, float *out, vl_error *err) {
    uint32_t *un = NULL;
    size_t m = 0;
    int rc = index_union(a, &un, &m, err);
    if (rc != VL_OK) return rc;
    a->union_n = m;
    float *grid = calloc(a->k * m + 1, sizeof *grid);
    float **rows = malloc(a->k * sizeof *rows);
    float *res = malloc(m * sizeof *res + 1);
    if (!grid || !rows || !res) {
        rc = vl_fail(err, VL_ENOMEM, "out of memory for %zu updates over %zu coordinates", a->k, m);
    } else {
        for (size_t i = 0; i < a->k; i++) {
            rows[i] = grid + i * m;
            size_t p = 0;
            for (size_t q = 0; q < a->count[i]; q++) {
                while (un[p] < a->idx[i][q]) p++;
                rows[i][p] = a->vals[i][q];
            }
        }
        rc = coord_robust_combine(a->cfg.rule, a->cfg.trim, (const float *const *)rows, a->w, a->k,
                                  m, res, err);
    }
    if (rc == VL_OK) {
        memset(out, 0, a->d * sizeof *out);
        for (size_t t = 0; t < m; t++)
            if (un[t] < a->d) out[un[t]] = res[t];
    }
    free(un);
    free(grid);
    free(rows);
    free(res);
    return rc;
}

int coord_robust_acc_finish(coord_robust_acc *a, float *out, vl_error *err) {
    if (a->k == 0) return vl_fail(err, VL_EINVAL, "no updates to combine");
    a->clipped = 0;
    if (a->cfg.rule == COORD_RULE_NORM_CLIP) {
        double *scale = malloc(a->k * sizeof *scale);
        if (!scale) return vl_fail(err, VL_ENOMEM, "out of memory clipping %zu updates", a->k);
        coord_robust_clip_scales(a->norm, a->k, a->cfg.clip_mult, scale);
        for (size_t i = 0; i < a->k; i++) {
            if (scale[i] >= 1) continue;
            for (size_t j = 0; j < a->count[i]; j++)
                a->vals[i][j] = (float)((double)a->vals[i][j] * scale[i]);
            a->norm[i] *= scale[i];
            a->clipped++;
        }
        free(scale);
    }
    if (a->kind == COMPRESS_TOPK) return finish_sparse(a, out, err);
    return coord_robust_combine(a->cfg.rule, a->cfg.trim, (const float *const *)a->vals, a->w, a->k,
                                a->d, out, err);
}
