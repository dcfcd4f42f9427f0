/* What the peer's unit tests train on: a one-layer byte GPT, one window of
 * text, and a task that runs it for a given number of steps. Include after
 * <cmocka.h> and peer/peer.h. */
#ifndef VOLLEY_TEST_PEER_FIXTURES_H
#define VOLLEY_TEST_PEER_FIXTURES_H

#include <stdio.h>
#include <string.h>

static const model_gpt_config TINY = {256, 16, 1, 2, 16};
static const uint8_t TEXT[] = "the quick brown f"; /* 17 bytes: one window */

/* A dense task on TEXT: `steps` AdamW steps of 4 windows, fixed H. */
static inline peer_task tiny_task(int steps) {
    peer_task t;
    memset(&t, 0, sizeof t);
    t.task_id = 1;
    snprintf(t.run, sizeof t.run, "unit");
    snprintf(t.shard, sizeof t.shard, "train");
    t.length = 17;
    t.steps = steps;
    t.batch = 4;
    t.context = 16;
    t.lr = 1e-2;
    t.beta1 = 0.9;
    t.beta2 = 0.95;
    t.eps = 1e-8;
    t.grad_clip = 1.0;
    t.seed = 7;
    t.kind = COMPRESS_DENSE;
    t.dtype = ST_F32;
    t.comp_decay = 1.0f;
    t.h_min = steps;
    return t;
}

#endif
