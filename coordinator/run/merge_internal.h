/*
 * merge_internal: what making a version (aggregator.c) and opening its
 * second round (round_open.c) share: the accumulation of a version's
 * stored updates and the buffers of one merge.
 *
 * Contents: merge_ctx, merge_bufs, coord_merge_one, coord_merge_bufs_free.
 */
#ifndef VOLLEY_COORD_MERGE_INTERNAL_H
#define VOLLEY_COORD_MERGE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "compress/compress.h"
#include "coordinator/base/robust.h"
#include "coordinator/coord.h"
#include "coordinator/run/aggregator.h"
#include "coordinator/run/factors.h"
#include "coordinator/run/round.h"

/* The updates of a version being read: their sums, or (a rule other than
 * mean) the updates themselves, and what is reported of them. */
typedef struct merge_ctx {
    const coord_config *cfg;
    size_t n_params;
    float *sum;          /* Σ nᵢ Δᵢ (dense and topk runs) */
    compress_sketch *sk; /* Σ nᵢ Sᵢ (sketch runs) */
    int64_t *ids;
    int64_t *peers; /* the peer of each */
    double *norms;  /* each update's L2 norm as sent */
    double *units;  /* ... over the square root of its local steps */
    size_t n_ids, cap;
    coord_robust_acc *rb;       /* a rule other than mean: the updates are held here */
    coord_robust_config robust; /* the run's, max_norm the bound in force */
    size_t bounded;             /* mean: updates scaled down to robust.max_norm */
    double samples;             /* Σ wᵢ, wᵢ = nᵢ·s(τᵢ) */
    double loss_sum;
    double acc_sum, acc_w;         /* reported accuracies, weighted as the updates are */
    int64_t bytes;                 /* the merged updates' bodies, as uploaded */
    int64_t version;               /* the version being merged from */
    size_t stale;                  /* updates based on an older version */
    int plain;                     /* the step left out its momentum (async, mostly stale) */
    size_t set_aside;              /* updates that could not be read (set_aside) */
    coord_round_acc *round;        /* sketch runs with a second round, else NULL */
    compress_factors_sum *factors; /* K-FAC runs that share factors, else NULL */
    vl_error *err;
} merge_ctx;

/* Buffers of one merge, freed together. */
typedef struct merge_bufs {
    float *next;    /* theta after the step */
    float *state;   /* the new optimiser state (n_state) */
    uint32_t *cand; /* coordinates the step may have changed */
    uint32_t *idx;  /* the change */
    float *val;
    float *scratch;
    compress_sketch sk, mom, err;
} merge_bufs;

/* storage_update_each_pending's callback: decodes the stored update u
 * (arg: a merge_ctx), checks it against the bound in force and adds it;
 * an update whose body cannot be read is set aside. */
int coord_merge_one(void *arg, const storage_update *u);
/* Frees the buffers of b (not b). */
void coord_merge_bufs_free(merge_bufs *b);

#endif
