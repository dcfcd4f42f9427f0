/* The coordinator's side of the Sketched-SGD second round (sketch runs with
 * compression.second_round): summing the exact values peers reported (a
 * silent peer's update is left out of them) and the state a round keeps
 * between versions. Opening a round is round_open.c, which reads the
 * updates as the merge does; when a round opens and closes is decided in
 * sched/schedule.c; the HTTP side is api/routes_round.c. */
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "coordinator/run/aggregator.h"
#include "coordinator/run/factors.h"
#include "coordinator/run/round.h"
#include "coordinator/coord.h"
#include "coordinator/base/outer.h"
#include "coordinator/config/config.h"

typedef struct load_ctx {
    coord_round_acc *a;
    size_t cap;
    vl_error *err;
} load_ctx;

static int load_values(void *arg, int64_t update_id, const uint8_t *vals, size_t n) {
    load_ctx *c = arg;
    coord_round_acc *a = c->a;
    /* Values committed by the writer after the count wait for the next
     * look; they cannot be taken in now. */
    if (a->n_ids >= c->cap) return VL_OK;
    if (n != a->n_cand)
        return vl_fail(c->err, VL_EDB, "update %lld reported %zu values for %zu candidates",
                       (long long)update_id, n, a->n_cand);
    float *v = malloc(n * sizeof *v);
    if (!v) return vl_fail(c->err, VL_ENOMEM, "out of memory reading round values");
    memcpy(v, vals, n * sizeof *v);
    a->ids[a->n_ids] = update_id;
    a->vals[a->n_ids++] = v;
    return VL_OK;
}

int coord_round_acc_init(coord_round_acc *a, coord_server *srv, const storage_round *r,
                         vl_error *err) {
    memset(a, 0, sizeof *a);
    a->cand = r->candidates;
    a->n_cand = r->n;
    int64_t have = 0;
    int rc = storage_round_values_count(srv->run.db, r->version, &have, err);
    if (rc != VL_OK) return rc;
    a->sum = calloc(r->n, sizeof *a->sum);
    a->ids = malloc(((size_t)have + 1) * sizeof *a->ids);
    a->vals = calloc((size_t)have + 1, sizeof *a->vals);
    if (!a->sum || !a->ids || !a->vals) {
        coord_round_acc_free(a);
        return vl_fail(err, VL_ENOMEM, "out of memory for a round of %zu candidates", r->n);
    }
    load_ctx c = {a, (size_t)have, err};
    /* Rows come by update id, so a->ids ascends. */
    rc = storage_round_values_each(srv->run.db, r->version, load_values, &c, err);
    if (rc != VL_OK) coord_round_acc_free(a);
    return rc;
}

static const float *values_of(const coord_round_acc *a, int64_t update_id) {
    size_t lo = 0, hi = a->n_ids;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a->ids[mid] == update_id) return a->vals[mid];
        if (a->ids[mid] < update_id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int coord_round_acc_add(coord_round_acc *a, int64_t update_id, const compress_update *u, float w,
                        vl_error *err) {
    (void)u;
    (void)err;
    const float *v = values_of(a, update_id);
    if (!v) {
        /* No answer in time: its sketch could only stand in with collision
         * estimates, so the round's mean is of the peers that answered. */
        a->silent++;
        return VL_OK;
    }
    a->reported++;
    a->weight += (double)w;
    for (size_t t = 0; t < a->n_cand; t++) a->sum[t] += (double)w * (double)v[t];
    return VL_OK;
}

void coord_round_acc_free(coord_round_acc *a) {
    if (!a) return;
    for (size_t i = 0; a->vals && i < a->n_ids; i++) free(a->vals[i]);
    free(a->vals);
    free(a->ids);
    free(a->sum);
    memset(a, 0, sizeof *a);
}

void coord_sketch_view(compress_sketch *s, const coord_config *cfg, float *table) {
    s->rows = (uint32_t)cfg->comp_rows;
    s->cols = (uint32_t)cfg->comp_cols;
    s->seed = (uint64_t)cfg->comp_seed;
    s->table = table;
}

void coord_round_views(const coord_config *cfg, size_t n, float *state, compress_sketch *E,
                       float **mom, float **age) {
    size_t cells = (size_t)cfg->comp_rows * (size_t)cfg->comp_cols;
    coord_sketch_view(E, cfg, state);
    *mom = state + cells;
    *age = state + cells + n;
}

int coord_round_accumulate(compress_sketch *E, const compress_sketch *S, vl_error *err) {
    coord_scale(E->table, (size_t)E->rows * E->cols, COORD_ROUND_DECAY);
    return compress_sketch_add(E, S, 1.0f, err);
}
