/*
 * The outer optimiser that turns a version's updates into the next
 * version. Each update carries a pseudo-gradient Δᵢ = θ_base − θ_local and
 * its sample count nᵢ; their weighted mean Δ̄ = Σ nᵢΔᵢ / Σ nᵢ is applied with
 * Nesterov momentum: m ← μ·m + Δ̄, θ ← θ − η·(Δ̄ + μ·m). η = 1, μ = 0 is
 * FedAvg (θ ← θ − Δ̄, the plain average of the local models); DiLoCo uses
 * η = 0.7, μ = 0.9.
 */
#ifndef VOLLEY_COORD_AGGREGATOR_H
#define VOLLEY_COORD_AGGREGATOR_H

#include <stddef.h>

/* One outer step over n parameters, in place: momentum becomes
 * μ·momentum + dbar and theta becomes theta − lr·(dbar + μ·momentum_new).
 * Computed in double per element, so the result does not depend on n. */
void coord_outer_step(float *theta, float *momentum, const float *dbar, size_t n, double lr,
                      double mu);

/* x[i] *= s for n values (turns a weighted sum into a weighted mean). */
void coord_scale(float *x, size_t n, double s);

#endif
