/* Split learning on the coordinator (coordinator/split.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/split_wire.h"
#include "coordinator/coord.h"
#include "coordinator/run/split.h"
#include "model/mlp_io.h"
#include "model/mlp_part.h"
#include "coordinator/config/config.h"
#include "coordinator/run/model.h"

/* Outstanding batches by peer, in a fixed table made on first use: a
 * peer's entry is found within BUSY_PROBE slots of its home. Entries that
 * drop to 0 keep their key and are taken over by the next peer that needs
 * a slot there. */
#define BUSY_SLOTS 4096
#define BUSY_PROBE 64

typedef struct split_busy {
    int64_t peer;
    int n;
} split_busy;

static split_busy *busy_slot(coord_split *s, int64_t peer, int take) {
    uint64_t h = (uint64_t)peer * 0x9E3779B97F4A7C15ull;
    split_busy *free_slot = NULL;
    for (size_t i = 0; i < BUSY_PROBE; i++) {
        split_busy *b = &s->busy[(h + i) & (BUSY_SLOTS - 1)];
        if (b->peer == peer) return b;
        if (b->n == 0 && !free_slot) free_slot = b;
    }
    if (!take || !free_slot) return NULL;
    free_slot->peer = peer;
    return free_slot;
}

int coord_split_batch_take(coord_split *s, int64_t peer) {
    if (!s->busy && !(s->busy = calloc(BUSY_SLOTS, sizeof *s->busy))) return -2;
    split_busy *b = busy_slot(s, peer, 1);
    if (!b) return -2;
    if (b->n >= s->in_flight) return -1;
    b->n++;
    return 0;
}

void coord_split_batch_give(coord_split *s, int64_t peer) {
    if (!s->busy) return;
    split_busy *b = busy_slot(s, peer, 0);
    if (b && b->n > 0) b->n--;
}

int coord_split_open(coord_server *srv, vl_error *err) {
    srv->run.split = NULL;
    const coord_config *cfg = &srv->run.cfg;
    if (!coord_config_is_split(cfg)) return VL_OK;
    coord_split *s = calloc(1, sizeof *s);
    if (!s) return vl_fail(err, VL_ENOMEM, "out of memory");
    const int layers = model_mlp_config_num_layers(&cfg->mlp);
    int last = cfg->split_u ? layers - 1 : layers, rc;
    rc = model_mlp_part_offset(&cfg->mlp, cfg->split_cut, last, &s->offset, &s->count, err);
    if (!rc) rc = model_mlp_part_create(&cfg->mlp, cfg->split_cut, last, &s->upper, err);
    if (!rc)
        rc = model_adamw_init(&s->opt, s->count, (float)cfg->split_lr, (float)cfg->train.beta1,
                              (float)cfg->train.beta2, (float)cfg->train.eps, 0.0f, err);
    if (rc) {
        model_mlp_part_free(s->upper);
        model_adamw_free(&s->opt);
        free(s);
        return rc;
    }
    memcpy(model_mlp_part_params(s->upper), coord_model_params(&srv->run.net) + s->offset,
           s->count * sizeof(float));
    s->q = model_mlp_part_in_dim(s->upper);
    s->h = model_mlp_part_out_dim(s->upper);
    s->u_shape = cfg->split_u;
    s->in_flight = cfg->split_in_flight > 0 ? cfg->split_in_flight : 1;
    srv->run.split = s;
    vl_log_info("split learning: the peers keep layers below %d and send %d activations a row; "
                "the coordinator's %zu parameters start from version %lld",
                cfg->split_cut, s->q, s->count, (long long)srv->run.version);
    return VL_OK;
}

void coord_split_close(coord_server *srv) {
    coord_split *s = srv->run.split;
    if (!s) return;
    model_mlp_part_free(s->upper);
    model_adamw_free(&s->opt);
    free(s->busy);
    free(s);
    srv->run.split = NULL;
}

double coord_split_into(coord_split *s, float *theta) {
    memcpy(theta + s->offset, model_mlp_part_params(s->upper), s->count * sizeof(float));
    double mean = s->batches ? s->loss_sum / (double)s->batches : NAN;
    s->loss_sum = 0;
    s->batches = 0;
    return mean;
}
