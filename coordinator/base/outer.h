/*
 * outer: the outer optimiser that turns a version's updates into the next
 * version. Each update carries a pseudo-gradient Δᵢ = θ_base − θ_local and
 * its sample count nᵢ; their weighted mean Δ̄ = Σ nᵢΔᵢ / Σ nᵢ is applied with
 * Nesterov momentum: m ← μ·m + Δ̄, θ ← θ − η·(Δ̄ + μ·m). η = 1, μ = 0 is
 * FedAvg (θ ← θ − Δ̄, the plain average of the local models); DiLoCo uses
 * η = 0.7, μ = 0.9.
 *
 * Runs with compressed updates change only a few coordinates per version,
 * so that peers which are behind can fetch a small delta. topk and gaussk
 * runs keep the momentum m and an error vector e on the coordinator:
 * e ← e + η·(Δ̄ + μ·m) accumulates exactly what the dense step would have
 * applied, and each version applies only the apply_k largest entries of e
 * and clears them. With apply_k = n this is the dense step. sketch runs
 * without a second round do the same in sketch space (FetchSGD,
 * compress_fetchsgd_step, which applies only estimates that stand out of
 * the collision noise); with one, the sketch only chooses the candidates
 * and the step is the dense one over their exact values
 * (compress_round_take).
 *
 * Contents: coord_outer_step, coord_scale, coord_apply_largest,
 * coord_outer_step_sparse, coord_outer_delayed, coord_outer_plain,
 * coord_outer_plain_sparse, coord_outer_momentum_due,
 * coord_outer_delay_due, coord_change.
 */
#ifndef VOLLEY_COORD_OUTER_H
#define VOLLEY_COORD_OUTER_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* One outer step over n parameters, in place: momentum becomes
 * μ·momentum + dbar and theta becomes theta − lr·(dbar + μ·momentum_new).
 * Computed in double per element, so the result does not depend on n. */
void coord_outer_step(float *theta, float *momentum, const float *dbar, size_t n, double lr,
                      double mu);

/* x[i] *= s for n values (turns a weighted sum into a weighted mean). */
void coord_scale(float *x, size_t n, double s);

/* The apply_k entries of largest |e| (ties to the lower index) move from
 * e into theta (theta -= e there, e = 0); their indices, ascending, go to
 * idx (room for apply_k; *nnz gets the count). */
int coord_apply_largest(float *theta, float *e, size_t n, size_t apply_k, uint32_t *idx,
                        size_t *nnz, vl_error *err) VL_MUST_CHECK;

/* The outer step of topk/gaussk runs, in place: m ← μ·m + dbar,
 * e ← e + lr·(dbar + μ·m), then the apply_k entries of largest |e| (ties
 * to the lower index) are added to theta, taken out of e, and their
 * indices, ascending, go to idx (room for apply_k; *nnz gets the count). */
int coord_outer_step_sparse(float *theta, float *m, float *e, const float *dbar, size_t n,
                            double lr, double mu, size_t apply_k, uint32_t *idx, size_t *nnz,
                            vl_error *err) VL_MUST_CHECK;

/* Delayed Nesterov (asynchronous Local-SGD, Liu et al. 2024): with stale
 * pseudo-gradients, Nesterov momentum applied every version overshoots,
 * so momentum moves once per `delay` versions and plain steps fill the
 * versions between. In place over n values, d being the version's mean
 * pseudo-gradient on entry and the step s (theta <- theta - s, or e <- e +
 * s in the sparse kinds) on return:
 *   acc <- acc + d;  s = lr * d / delay;
 *   and when momentum_now: m <- mu*m + acc/delay;  s += lr*mu*m;  acc <- 0.
 * Over a whole cycle of constant d this moves theta by lr*d/(1 - mu) in
 * the steady state, as one synchronous Nesterov step does; delay 1 is
 * coord_outer_step's rule. Computed in double per element. */
void coord_outer_delayed(float *d, float *m, float *acc, size_t n, double lr, double mu,
                         int64_t delay, int momentum_now);
/* An async version's step without its momentum: theta −= lr·dbar
 * (coord_outer_plain) or, in topk/gaussk runs, e += lr·dbar with the
 * apply_k largest of e applied as in coord_outer_step_sparse; the
 * momentum buffer is left as it was. */
void coord_outer_plain(float *theta, const float *dbar, size_t n, double lr);
int coord_outer_plain_sparse(float *theta, float *e, const float *dbar, size_t n, double lr,
                             size_t apply_k, uint32_t *idx, size_t *nnz,
                             vl_error *err) VL_MUST_CHECK;
/* Whether an async version of n_updates updates, stale of them based on
 * an older version, takes its momentum step (outer.delay 1): only when
 * fewer than half are stale. Momentum on stale pseudo-gradients every
 * version is what diverges; a run whose peers wait for their own updates'
 * version (lease_wait) has fresh ones, unless it has more peers than
 * updates_per_version, and then it takes plain steps. */
int coord_outer_momentum_due(size_t stale, size_t n_updates);
/* Whether version next_version (the one being made) takes the momentum
 * step of a delay-versions cycle: every version when delay <= 1, else
 * when next_version is a multiple of delay. A rule of the version number
 * alone, so a restarted coordinator keeps the cycle. */
int coord_outer_delay_due(int64_t next_version, int64_t delay);

/* The change a version made, as the coordinates among the cand ascending
 * candidates (all n when cand is NULL) where after differs from before:
 * idx[j] and val[j] = after - before. Returns the count. */
size_t coord_change(const float *before, const float *after, size_t n, const uint32_t *cand,
                    size_t n_cand, uint32_t *idx, float *val);

#endif
