/* A task in the mode it calls for (local.h): the one place that chooses
 * between the trainers, so the loop's training step is one call. */
#include "peer/local.h"
#include "peer/peer.h"

int peer_trainer_run_task(peer_trainer *t, const peer_task *k, const peer_task_data *d,
                          peer_train_result *res, vl_error *err) {
    if (k->local && k->split_cut > 0)
        return peer_trainer_run_split(t, k, d->local, d->http, d->rs, d->peer_id, res, err);
    if (k->local && t->gpt)
        return d->local->shard ? peer_trainer_run_shard(t, k, d->local->shard, res, err)
                               : peer_trainer_run(t, k, d->local->bytes, d->local->len, res, err);
    if (k->local) return peer_trainer_run_local(t, k, d->local, res, err);
    if (k->tokens) return peer_trainer_run_shard(t, k, d->tokens, res, err);
    return peer_trainer_run(t, k, d->bytes, d->len, res, err);
}
