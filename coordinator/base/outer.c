/* The outer optimiser's arithmetic: the Nesterov step on the server, its
 * sparse and delayed forms, and the sparse change a step made. Pure
 * functions over float vectors, declared in outer.h, so the tests
 * can check them against hand-worked values. */
#include <stdint.h>
#include <stdlib.h>

#include "compress/compress.h"
#include "coordinator/base/outer.h"

void coord_outer_step(float *theta, float *momentum, const float *dbar, size_t n, double lr,
                      double mu) {
    for (size_t i = 0; i < n; i++) {
        double m = mu * (double)momentum[i] + (double)dbar[i];
        momentum[i] = (float)m;
        theta[i] = (float)((double)theta[i] - lr * ((double)dbar[i] + mu * m));
    }
}

void coord_scale(float *x, size_t n, double s) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)x[i] * s);
}

int coord_apply_largest(float *theta, float *e, size_t n, size_t apply_k, uint32_t *idx,
                        size_t *nnz, vl_error *err) {
    int rc = compress_topk(e, n, apply_k, idx, nnz, err);
    if (rc != VL_OK) return rc;
    for (size_t j = 0; j < *nnz; j++) {
        uint32_t i = idx[j];
        theta[i] -= e[i];
        e[i] = 0;
    }
    return VL_OK;
}

int coord_outer_step_sparse(float *theta, float *m, float *e, const float *dbar, size_t n,
                            double lr, double mu, size_t apply_k, uint32_t *idx, size_t *nnz,
                            vl_error *err) {
    for (size_t i = 0; i < n; i++) {
        double mi = mu * (double)m[i] + (double)dbar[i];
        m[i] = (float)mi;
        e[i] = (float)((double)e[i] + lr * ((double)dbar[i] + mu * mi));
    }
    return coord_apply_largest(theta, e, n, apply_k, idx, nnz, err);
}

void coord_outer_plain(float *theta, const float *dbar, size_t n, double lr) {
    for (size_t i = 0; i < n; i++) theta[i] = (float)((double)theta[i] - lr * (double)dbar[i]);
}

int coord_outer_plain_sparse(float *theta, float *e, const float *dbar, size_t n, double lr,
                             size_t apply_k, uint32_t *idx, size_t *nnz, vl_error *err) {
    for (size_t i = 0; i < n; i++) e[i] = (float)((double)e[i] + lr * (double)dbar[i]);
    return coord_apply_largest(theta, e, n, apply_k, idx, nnz, err);
}

int coord_outer_momentum_due(size_t stale, size_t n_updates) {
    return 2 * stale < n_updates;
}

int coord_outer_delay_due(int64_t next_version, int64_t delay) {
    return delay <= 1 || next_version % delay == 0;
}

void coord_outer_delayed(float *d, float *m, float *acc, size_t n, double lr, double mu,
                         int64_t delay, int momentum_now) {
    double inv = 1.0 / (double)(delay > 1 ? delay : 1);
    for (size_t i = 0; i < n; i++) {
        double di = (double)d[i];
        double bi = (double)acc[i] + di;
        double step = lr * di * inv;
        if (momentum_now) {
            double mi = mu * (double)m[i] + bi * inv;
            m[i] = (float)mi;
            step += lr * mu * mi;
            bi = 0;
        }
        acc[i] = (float)bi;
        d[i] = (float)step;
    }
}

size_t coord_change(const float *before, const float *after, size_t n, const uint32_t *cand,
                    size_t n_cand, uint32_t *idx, float *val) {
    size_t k = 0;
    size_t m = cand ? n_cand : n;
    for (size_t j = 0; j < m; j++) {
        size_t i = cand ? cand[j] : j;
        if (i >= n || after[i] == before[i]) continue;
        idx[k] = (uint32_t)i;
        val[k++] = after[i] - before[i];
    }
    return k;
}
