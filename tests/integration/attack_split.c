/* attack split: POST /v1/split/forward in a split-learning run. "bad"
 * sends every kind of batch the coordinator must refuse (4xx with its
 * code, nothing stored, the coordinator's layers not stepped) and then a
 * valid one, which must be answered with the first step the coordinator
 * took; "expired" sends a valid batch under a lease that has ended. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/split_wire.h"
#include "compress/compress.h"
#include "tests/integration/attack.h"

typedef struct batch {
    int B, q;
    float *z;
    int *y;
} batch;

static void batch_make(batch *b, int B, int q) {
    b->B = B, b->q = q;
    b->z = malloc((size_t)B * (size_t)q * sizeof *b->z);
    b->y = malloc((size_t)B * sizeof *b->y);
    if (!b->z || !b->y) abort();
    for (int i = 0; i < B * q; i++) b->z[i] = 0.01f * (float)(i % 17);
    for (int i = 0; i < B; i++) b->y[i] = i % 10;
}

static void batch_free(batch *b) {
    free(b->z);
    free(b->y);
}

/* Sends b as a request of run/peer/task (dtype F32), expecting status and
 * code; returns the reply's step count on a 200, else -1. */
static int64_t send_batch(const ctx *c, const char *name, const char *run, int64_t peer,
                          int64_t task, const batch *b, long status, const char *code) {
    vl_buf body;
    vl_buf_init(&body, SPLIT_WIRE_MAX_VALUES * sizeof(float) + 65536);
    vl_error e = {0};
    if (split_wire_encode_forward(run, peer, task, b->z, b->B, b->q, ST_F32, b->y, &body, &e) !=
        VL_OK) {
        fprintf(stderr, "attack: cannot build '%s': %s\n", name, e.msg);
        abort();
    }
    reply r;
    request(c, "POST", "/v1/split/forward", NULL, body.data, body.len, NULL, 0, NULL, c->peer, 0,
            &r);
    int64_t step = -1;
    if (r.status == 200) {
        float *dz = malloc((size_t)b->B * (size_t)b->q * sizeof *dz);
        double loss = 0;
        if (!dz) abort();
        if (split_wire_decode_reply(r.body.data, r.body.len, "dz", b->B, b->q, dz, &loss, &step,
                                    &e) != VL_OK)
            step = -1;
        free(dz);
    }
    expect(name, &r, status, code);
    vl_buf_free(&body);
    return step;
}

/* A request whose z is I32: well formed, wrong dtype. */
static void send_int_z(const ctx *c, int B, int q) {
    int32_t *z = calloc((size_t)B * (size_t)q, sizeof *z);
    int32_t *y = calloc((size_t)B, sizeof *y);
    if (!z || !y) abort();
    char ps[24], ts[24];
    snprintf(ps, sizeof ps, "%lld", (long long)c->peer);
    snprintf(ts, sizeof ts, "%lld", (long long)c->task);
    st_writer w;
    st_writer_init(&w);
    uint64_t zs[2] = {(uint64_t)B, (uint64_t)q}, ys[1] = {(uint64_t)B};
    vl_buf body;
    vl_buf_init(&body, SPLIT_WIRE_MAX_VALUES * sizeof(float) + 65536);
    vl_error e = {0};
    if (st_writer_meta(&w, "run", c->run) || st_writer_meta(&w, "peer", ps) ||
        st_writer_meta(&w, "task", ts) ||
        st_writer_add(&w, "z", ST_I32, 2, zs, z, (size_t)B * (size_t)q * 4) ||
        st_writer_add(&w, "labels", ST_I32, 1, ys, y, (size_t)B * 4) ||
        st_writer_finish(&w, &body, &e))
        abort();
    reply r;
    request(c, "POST", "/v1/split/forward", NULL, body.data, body.len, NULL, 0, NULL, c->peer, 0,
            &r);
    expect("activations as I32", &r, 422, "bad_dtype");
    st_writer_free(&w);
    vl_buf_free(&body);
    free(z);
    free(y);
}

void attack_split(ctx *c, int q, int max_batch, int classes, const char *stage) {
    batch b;
    batch_make(&b, max_batch, q);
    if (strcmp(stage, "expired") == 0) {
        send_batch(c, "a batch under a finished lease", c->run, c->peer, c->task, &b, 409,
                   "lease_expired");
        batch_free(&b);
        return;
    }
    reply r;
    vcrypto_identity other;
    vcrypto_identity_generate(&other);
    request(c, "POST", "/v1/split/forward", NULL, b.z, 64, NULL, 0, &other, c->peer, 0, &r);
    expect("activations signed with another key", &r, 401, "bad_signature");
    request(c, "POST", "/v1/split/forward", NULL, "not safetensors", 15, NULL, 0, NULL, c->peer, 0,
            &r);
    expect("activations that are not safetensors", &r, 400, "malformed");
    /* The split routes take no query, like every route without parameters. */
    request(c, "POST", "/v1/split/forward?step=1", NULL, "not safetensors", 15, NULL, 0, NULL,
            c->peer, 0, &r);
    expect("a query on the forward route", &r, 400, "bad_request");
    send_batch(c, "activations for another run", "another-run", c->peer, c->task, &b, 422,
               "wrong_run");
    send_batch(c, "activations naming another peer", c->run, c->peer + 1, c->task, &b, 403,
               "not_your_task");
    send_batch(c, "activations for an unknown task", c->run, c->peer, c->task + 100000, &b, 404,
               "unknown_task");
    batch wide;
    batch_make(&wide, max_batch, q + 1);
    send_batch(c, "activations one column too wide", c->run, c->peer, c->task, &wide, 422,
               "bad_shape");
    batch_free(&wide);
    batch big;
    batch_make(&big, max_batch + 1, q);
    send_batch(c, "a batch one row larger than the run's", c->run, c->peer, c->task, &big, 422,
               "bad_batch");
    batch_free(&big);
    send_int_z(c, max_batch, q);
    {
        /* The backward half is only for U-shaped runs. */
        vl_buf body;
        vl_buf_init(&body, SPLIT_WIRE_MAX_VALUES * sizeof(float) + 65536);
        vl_error e = {0};
        if (split_wire_encode_backward(c->run, c->peer, c->task, b.z, b.z, max_batch, q, q, ST_F32,
                                       &body, &e) != VL_OK)
            abort();
        request(c, "POST", "/v1/split/backward", NULL, body.data, body.len, NULL, 0, NULL, c->peer,
                0, &r);
        expect("a backward request in a run that is not U-shaped", &r, 404, "not_split");
        vl_buf_free(&body);
    }
    b.z[3] = NAN;
    send_batch(c, "an activation that is NaN", c->run, c->peer, c->task, &b, 422, "non_finite");
    b.z[3] = INFINITY;
    send_batch(c, "an activation that is infinite", c->run, c->peer, c->task, &b, 422,
               "non_finite");
    b.z[3] = 0.0f;
    b.y[1] = classes;
    send_batch(c, "a label past the last class", c->run, c->peer, c->task, &b, 422, "bad_label");
    b.y[1] = -1;
    send_batch(c, "a negative label", c->run, c->peer, c->task, &b, 422, "bad_label");
    b.y[1] = 1;
    /* Nothing refused stepped the coordinator's layers: this is step 1. */
    int64_t step = send_batch(c, "a valid batch", c->run, c->peer, c->task, &b, 200, NULL);
    record("the refused batches left the coordinator's layers unstepped", "step 1",
           step == 1 ? "step 1" : "another step", step == 1);
    {
        /* An update whose reported accuracy is no fraction: refused for
         * what it holds, which ends the task's lease, so it comes last. */
        float *d = calloc(c->n_params, sizeof *d);
        if (!d) abort();
        compress_update_meta m = {0};
        snprintf(m.run, sizeof m.run, "%s", c->run);
        m.task = c->task, m.peer = c->peer, m.base_version = c->base_version;
        m.kind = COMPRESS_DENSE, m.num_samples = 32, m.local_steps = 1, m.loss = 2.0;
        m.has_accuracy = 1, m.accuracy = 1.5;
        vl_buf u;
        vl_buf_init(&u, VL_BUF_DEFAULT_CAP);
        vl_error e = {0};
        if (compress_update_encode_dense(&m, d, c->n_params, ST_F32, &u, &e) != VL_OK) abort();
        reply ur;
        request(c, "POST", "/v1/updates", NULL, u.data, u.len, NULL, 0, NULL, c->peer, 0, &ur);
        expect_lease_ended(c, "an update reporting an accuracy of 1.5", &ur, 422, "bad_accuracy");
        vl_buf_free(&u);
        free(d);
    }
    batch_free(&b);
}
