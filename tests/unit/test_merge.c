/* coordinator: a version made from stored updates, end to end on a real
 * run database (the writer and compute threads, the event loop), against
 * the formula: with FedAvg (outer lr 1, momentum 0) version 1 is
 * theta_0 - sum_i n_i delta_i / sum_i n_i. Two updates of 10 and 30
 * samples, so dividing by their count, or not dividing, or weighting
 * wrong, lands elsewhere: dense; top-k with every coordinate applied
 * (apply_k = n), where the sparse step must equal the dense one; and
 * Count Sketch (no second round, apply_k = n), whose updates are sparse
 * on coordinates that each sit alone in their bucket of every row, so
 * that the merged sketch gives back the weighted mean exactly and the
 * FetchSGD step (no collision noise, so no threshold) applies just it. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>
#include <sqlite3.h>

#include "test_util.h"
#include "coordinator/run/aggregator.h"
#include "coordinator/run/factors.h"
#include "coordinator/run/round.h"
#include "coordinator/coord.h"
#include "coordinator/cli/cli.h"
#include "coordinator/config/config.h"
#include "coordinator/run/model.h"
#include "coordinator/run/run.h"
#include "coordinator/sched/schedule.h"
#include "coordinator/server.h"

/* Coordinates of the sketch case's updates, and how many. Few against the
 * sketch's columns, so that a coordinate outside them almost never meets
 * them in a majority of rows (checked, see check_recovery). */
#define SKETCH_SUPPORT 48
#define SKETCH_COLS 8192

/* A run of kind ("none", "topk" or "sketch") in dir, served (no
 * listener); robust (NULL: none) is its robust section. */
static coord_server *open_run(const char *dir, const char *kind, const char *robust) {
    char corpus[600], cfg[600], db[600], text[1600];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(cfg, sizeof cfg, "%s/run.json", dir);
    snprintf(db, sizeof db, "%s/run.db", dir);
    test_write_corpus(corpus, "a quick merge of two updates. ");
    /* The sketch run's updates are F32, as sent here, so that the exact
     * mean is what comes back; no second round, which would apply only
     * the values its peers report. */
    char comp[300] = "";
    if (strcmp(kind, "topk") == 0)
        snprintf(comp, sizeof comp,
                 ", \"compression\": {\"kind\": \"topk\", \"k\": 8, \"apply_k\": 1000000}");
    else if (strcmp(kind, "sketch") == 0)
        snprintf(comp, sizeof comp,
                 ", \"compression\": {\"kind\": \"sketch\", \"dtype\": \"F32\", \"rows\": 5, "
                 "\"cols\": %d, \"seed\": 7, \"apply_k\": 1000000, \"second_round\": 0}",
                 SKETCH_COLS);
    snprintf(text, sizeof text,
             "{\"name\": \"merge\", \"corpus\": \"%s\", \"model\": {\"vocab_size\": 256, "
             "\"block_size\": 16, \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16}, "
             "\"updates_per_version\": 2, \"max_versions\": 3, \"task_bytes\": 4096, "
             "\"max_loss_rise\": 0, \"outer\": {\"lr\": 1.0, \"momentum\": 0.0}, "
             "\"train\": {\"steps\": 4, \"batch\": 4}%s%s%s}",
             corpus, comp, robust ? ", \"robust\": " : "", robust ? robust : "");
    test_write_text(cfg, text);
    OK(coord_cmd_init(db, cfg, &e_));
    coord_server *srv = NULL;
    OK(coord_server_open(db, NULL, &srv, &e_));
    return srv;
}

/* Stores a done task of peer for m's base version and its update (body)
 * with *norm as its stored norm (NULL: none, as stored before migration
 * 14). */
static void store_update_as(coord_server *srv, int64_t peer, const compress_update_meta *m,
                            const vl_buf *body, const double *norm) {
    storage_task t = {.peer_id = peer,
                      .base_version = m->base_version,
                      .data_offset = 0,
                      .data_length = 4096,
                      .seed = 1,
                      .issued_at = 1000,
                      .deadline = vl_clock_unix_s() + 600,
                      .state = STORAGE_TASK_DONE};
    int64_t tid = 0;
    OK(storage_task_insert(srv->run.db, &t, &tid, &e_));
    assert_int_equal(tid, m->task);
    storage_update u = {.task_id = tid,
                        .peer_id = peer,
                        .base_version = m->base_version,
                        .num_samples = m->num_samples,
                        .local_steps = m->local_steps,
                        .loss = m->loss,
                        .nbytes = (int64_t)body->len,
                        .blob = body->data,
                        .received_at = vl_clock_unix_s(),
                        .has_norm = norm != NULL,
                        .norm = norm ? *norm : 0};
    snprintf(u.kind, sizeof u.kind, "%s", compress_kind_name(m->kind));
    OK(storage_update_insert(srv->run.db, &u, NULL, &e_));
}

/* The norm the upload route stores with body: compress_update_norm of the
 * body as decoded. */
static double upload_norm(const coord_server *srv, const vl_buf *body) {
    compress_update cu;
    OK(compress_update_decode(body->data, body->len, srv->run.n_params, &cu, NULL, &e_));
    double norm = compress_update_norm(&cu);
    compress_update_free(&cu);
    return norm;
}

/* How many of the updates a walk saw had a stored norm. */
typedef struct norm_count {
    int updates, with_norm;
} norm_count;

static int count_norms(void *ctx, const storage_update *u) {
    norm_count *c = ctx;
    c->updates++;
    c->with_norm += u->has_norm;
    return 0;
}

/* Stores the update as an accepted upload is stored: with its norm. */
static void store_update(coord_server *srv, int64_t peer, const compress_update_meta *m,
                         const vl_buf *body) {
    double norm = upload_norm(srv, body);
    store_update_as(srv, peer, m, body, &norm);
}

/* Runs the loop until the next version is committed (or gives up). */
static void merge_next(coord_server *srv) {
    vl_error e = {0};
    int64_t next = srv->run.version + 1;
    /* 1: a merge was started. */
    assert_int_equal(coord_merge_if_ready(srv, &e), VL_OK);
    for (int i = 0; i < 2000 && srv->run.version < next; i++) {
        struct timeval tv = {0, 5000};
        event_base_loopexit(srv->base, &tv);
        event_base_dispatch(srv->base);
    }
    assert_int_equal(srv->run.version, next);
}

/* The run's sketch shape, zeroed. */
static void run_sketch(const coord_server *srv, compress_sketch *s) {
    OK(compress_sketch_init(s, (uint32_t)srv->run.cfg.comp_rows, (uint32_t)srv->run.cfg.comp_cols,
                            (uint64_t)srv->run.cfg.comp_seed, &e_));
}

/* SKETCH_SUPPORT coordinates, spread over the model, no two of which
 * share a bucket in any row: each is alone in its buckets, so its
 * estimate is its value, whatever the weights. */
static void pick_support(const coord_server *srv, size_t n, uint32_t *idx) {
    uint32_t rows = (uint32_t)srv->run.cfg.comp_rows, cols = (uint32_t)srv->run.cfg.comp_cols;
    uint8_t *used = calloc((size_t)rows * cols, 1);
    assert_non_null(used);
    size_t got = 0;
    for (size_t i = 3; i < n && got < SKETCH_SUPPORT; i += n / (2 * SKETCH_SUPPORT)) {
        uint32_t bucket[COMPRESS_SKETCH_MAX_ROWS];
        int sign, alone = 1;
        for (uint32_t j = 0; j < rows; j++) {
            compress_sketch_hash((uint64_t)srv->run.cfg.comp_seed, j, cols, i, &bucket[j], &sign);
            alone = alone && !used[(size_t)j * cols + bucket[j]];
        }
        if (!alone) continue;
        for (uint32_t j = 0; j < rows; j++) used[(size_t)j * cols + bucket[j]] = 1;
        idx[got++] = (uint32_t)i;
    }
    assert_int_equal(got, SKETCH_SUPPORT);
    free(used);
}

/* The precondition of the sketch case, with the project's own query as
 * the reference: the sketch of the expected mean estimates it exactly at
 * every coordinate (a coordinate outside the support meeting it in a
 * majority of rows would not). Then more than half of the estimates are
 * 0, the FetchSGD noise threshold is 0, and the step applies the
 * estimates as they are. */
static void check_recovery(const coord_server *srv, const float *mean, size_t n) {
    compress_sketch s;
    run_sketch(srv, &s);
    compress_sketch_encode(&s, mean, n);
    float *est = malloc(n * sizeof *est);
    assert_non_null(est);
    compress_sketch_estimate(&s, n, est);
    for (size_t i = 0; i < n; i++)
        if (est[i] != mean[i])
            fail_msg("the sketch estimates coordinate %zu as %g, not %g: choose another "
                     "compression.seed",
                     i, (double)est[i], (double)mean[i]);
    free(est);
    compress_sketch_free(&s);
}

/* An update's body of the run's kind for the values d (n of them; for a
 * sketch run, zero off the support). */
static void encode_update(const coord_server *srv, const char *kind, compress_update_meta *m,
                          const uint32_t *idx, const float *d, size_t n, vl_buf *b) {
    if (strcmp(kind, "topk") == 0) {
        m->kind = COMPRESS_TOPK;
        OK(compress_update_encode_topk(m, idx, d, n, ST_F32, b, &e_));
    } else if (strcmp(kind, "sketch") == 0) {
        compress_sketch s;
        run_sketch(srv, &s);
        compress_sketch_encode(&s, d, n);
        m->kind = COMPRESS_SKETCH;
        OK(compress_update_encode_sketch(m, &s, ST_F32, b, &e_));
        compress_sketch_free(&s);
    } else {
        m->kind = COMPRESS_DENSE;
        OK(compress_update_encode_dense(m, d, n, ST_F32, b, &e_));
    }
}

static void check_kind(const char *kind) {
    char *dir = test_temp_dir("/tmp/volley-merge.XXXXXX");
    coord_server *srv = open_run(dir, kind, NULL);
    size_t n = srv->run.n_params;
    int sketch = strcmp(kind, "sketch") == 0;
    float *theta0 = malloc(n * sizeof *theta0);
    assert_non_null(theta0);
    memcpy(theta0, coord_model_params(&srv->run.net), n * sizeof *theta0);
    uint8_t pk[2][VCRYPTO_PK_BYTES];
    int64_t peer[2];
    for (int k = 0; k < 2; k++) {
        memset(pk[k], k + 1, sizeof pk[k]);
        OK(storage_peer_insert(srv->run.db, pk[k], "p", "{}", 0, vl_clock_unix_s(), &peer[k], &e_));
    }
    int64_t samples[2] = {10, 30};
    float *d[2];
    uint32_t *idx = malloc(n * sizeof *idx);
    assert_non_null(idx);
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
    /* A sketch run's updates share their support, where they differ, so
     * that the weights decide every coordinate that moves. */
    if (sketch) pick_support(srv, n, idx);
    for (int k = 0; k < 2; k++) {
        d[k] = random_vec(n, 100 + (uint64_t)k);
        if (sketch) {
            float *v = calloc(n, sizeof *v);
            assert_non_null(v);
            for (size_t t = 0; t < SKETCH_SUPPORT; t++) v[idx[t]] = d[k][idx[t]];
            free(d[k]);
            d[k] = v;
        }
        for (size_t i = 0; i < n; i++) d[k][i] *= 0.01f;
    }
    float *mean = malloc(n * sizeof *mean);
    assert_non_null(mean);
    size_t n_moving = 0;
    for (size_t i = 0; i < n; i++) {
        mean[i] = (float)((samples[0] * (double)d[0][i] + samples[1] * (double)d[1][i]) /
                          (double)(samples[0] + samples[1]));
        n_moving += mean[i] != 0;
    }
    if (sketch) check_recovery(srv, mean, n);
    for (int k = 0; k < 2; k++) {
        compress_update_meta m = {.task = k + 1,
                                  .peer = peer[k],
                                  .base_version = 0,
                                  .num_samples = samples[k],
                                  .local_steps = 2,
                                  .loss = 3.0};
        snprintf(m.run, sizeof m.run, "merge");
        vl_buf b;
        vl_buf_init(&b, 1 << 24);
        encode_update(srv, kind, &m, idx, d[k], n, &b);
        store_update(srv, peer[k], &m, &b);
        vl_buf_free(&b);
    }
    merge_next(srv);
    const float *theta1 = coord_model_params(&srv->run.net);
    /* The version's model file came with it, built on the compute thread:
     * the same bytes the first download would have built on the loop. */
    assert_non_null(srv->caches.model_blob);
    assert_int_equal(srv->caches.model_blob->version, srv->run.version);
    {
        vl_buf want;
        vl_buf_init(&want, 1 << 26);
        double vl = srv->run.val_loss_version == srv->run.version ? srv->run.val_loss : NAN;
        OK(coord_model_file(&srv->run.cfg, &srv->run.net, srv->run.version, vl, &want, &e_));
        assert_int_equal(srv->caches.model_blob->len, want.len);
        assert_memory_equal(srv->caches.model_blob->data, want.data, want.len);
        vl_buf_free(&want);
    }
    double worst = 0, moved = 0;
    size_t worst_at = 0;
    for (size_t i = 0; i < n; i++) {
        double want = theta0[i] - (double)mean[i];
        double err = fabs(theta1[i] - want);
        if (err > worst) {
            worst = err;
            worst_at = i;
        }
        moved += fabs(theta1[i] - theta0[i]);
    }
    /* The step is about 0.01 per coordinate that moves; a wrong division
     * is off by a quarter of it or more (1/2 against 1/4 weights). Off
     * the sketch's support nothing may move at all. */
    if (worst > 1e-6)
        fail_msg("%s: version 1 is %.3g from the weighted mean's step (coordinate %zu)", kind,
                 worst, worst_at);
    assert_true(n_moving > 0 && moved / (double)n_moving > 1e-3);
    free(mean);
    free(idx);
    for (int k = 0; k < 2; k++) free(d[k]);
    free(theta0);
    coord_server_close(srv);
    test_remove_tree(dir);
    free(dir);
}

static void test_dense_divides_by_samples(void **state) {
    (void)state;
    check_kind("none");
}

static void test_topk_divides_by_samples(void **state) {
    (void)state;
    check_kind("topk");
}

static void test_sketch_divides_by_samples(void **state) {
    (void)state;
    check_kind("sketch");
}

/* Stores a dense update of peer, based on the current version, with its
 * norm when with_norm is set and without (as before migration 14)
 * otherwise. */
static void store_dense_how(coord_server *srv, int64_t task, int64_t peer, int64_t samples,
                            const float *d, int with_norm) {
    compress_update_meta m = {.task = task,
                              .peer = peer,
                              .base_version = srv->run.version,
                              .num_samples = samples,
                              .local_steps = 2,
                              .loss = 3.0};
    snprintf(m.run, sizeof m.run, "merge");
    vl_buf b;
    vl_buf_init(&b, 1 << 24);
    encode_update(srv, "none", &m, NULL, d, srv->run.n_params, &b);
    if (with_norm)
        store_update(srv, peer, &m, &b);
    else
        store_update_as(srv, peer, &m, &b, NULL);
    vl_buf_free(&b);
}

/* Stores a dense update of peer as an upload is stored. */
static void store_dense(coord_server *srv, int64_t task, int64_t peer, int64_t samples,
                        const float *d) {
    store_dense_how(srv, task, peer, samples, d, 1);
}

static double l2(const float *d, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)d[i] * d[i];
    return sqrt(s);
}

/* robust.max_norm "auto" (auto_versions 1, auto_mult 2, clip): no bound
 * until version 1 exists, then twice the median norm of version 1's
 * updates per square root of their local steps, kept across a restart;
 * version 2's update ten times longer is scaled down to it, and the
 * other one is not. */
static void test_auto_norm_bound(void **state) {
    (void)state;
    char *dir = test_temp_dir("/tmp/volley-merge.XXXXXX");
    const char *robust = "{\"max_norm\": \"auto\", \"auto_mult\": 2, \"auto_versions\": 1, "
                         "\"on_excess\": \"clip\"}";
    coord_server *srv = open_run(dir, "none", robust);
    size_t n = srv->run.n_params;
    assert_true(srv->run.cfg.robust.auto_norm && srv->run.cfg.robust.rule == COORD_RULE_MEAN);
    assert_true(coord_norm_bound(srv) == 0);
    int64_t peer[2];
    for (int k = 0; k < 2; k++) {
        uint8_t pk[VCRYPTO_PK_BYTES];
        memset(pk, k + 1, sizeof pk);
        OK(storage_peer_insert(srv->run.db, pk, "p", "{}", 0, vl_clock_unix_s(), &peer[k], &e_));
    }
    float *d[2];
    for (int k = 0; k < 2; k++) {
        d[k] = random_vec(n, 200 + (uint64_t)k);
        for (size_t i = 0; i < n; i++) d[k][i] *= 0.01f * (float)(k + 1);
    }
    double n0 = l2(d[0], n), n1 = l2(d[1], n);
    store_dense(srv, 1, peer[0], 10, d[0]);
    store_dense(srv, 2, peer[1], 30, d[1]);
    merge_next(srv);
    /* Learnt per square root of the local steps (2 here); every update is
     * held to it at the run's train.steps (4), whatever its own. */
    double bound = 2 * (n0 + n1) / 2;
    assert_true(fabs(coord_norm_bound(srv) - bound / sqrt(2)) < 1e-4 * bound);
    bound *= sqrt(2);
    assert_true(fabs(coord_norm_bound_held(srv) - bound) < 1e-4 * bound);
    /* Derived once and stored with the versions: the same after a restart. */
    char db[600];
    snprintf(db, sizeof db, "%s/run.db", dir);
    coord_server_close(srv);
    OK(coord_server_open(db, NULL, &srv, &e_));
    assert_true(fabs(coord_norm_bound_held(srv) - bound) < 1e-4 * bound);
    float *theta1 = malloc(n * sizeof *theta1);
    assert_non_null(theta1);
    memcpy(theta1, coord_model_params(&srv->run.net), n * sizeof *theta1);
    /* Version 2: peer 0's update ten times longer than the bound allows. */
    for (size_t i = 0; i < n; i++) d[0][i] *= 10.0f;
    double s = bound / l2(d[0], n);
    assert_true(s < 0.5);
    store_dense(srv, 3, peer[0], 10, d[0]);
    store_dense(srv, 4, peer[1], 30, d[1]);
    merge_next(srv);
    const float *theta2 = coord_model_params(&srv->run.net);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double want = theta1[i] - (10 * s * d[0][i] + 30.0 * d[1][i]) / 40.0;
        worst = fmax(worst, fabs(theta2[i] - want));
    }
    if (worst > 1e-6) fail_msg("version 2 is %.3g from the bounded mean's step", worst);
    free(theta1);
    for (int k = 0; k < 2; k++) free(d[k]);
    coord_server_close(srv);
    test_remove_tree(dir);
    free(dir);
}

/* One fast peer filling most of the opening: versions 1 to 3 of four
 * updates, two of each from a hostile peer at a thousand times the honest
 * norms beside one each from two of three honest peers. Counted update
 * by update, each version's median would be half the hostile norm; each
 * peer counted once (the median of its norms), the bound is twice the
 * median of the four peers' figures, which is the middle of the honest
 * ones, and stays within what the honest peers set. The same after a
 * restart. */
static void test_auto_norm_bound_per_peer(void **state) {
    (void)state;
    char *dir = test_temp_dir("/tmp/volley-merge.XXXXXX");
    const char *robust = "{\"max_norm\": \"auto\", \"auto_mult\": 2, \"auto_versions\": 3, "
                         "\"on_excess\": \"clip\"}";
    coord_server *srv = open_run(dir, "none", robust);
    size_t n = srv->run.n_params;
    int64_t peer[4]; /* peer[0] hostile */
    float *d[4];
    double unit[4];
    for (int k = 0; k < 4; k++) {
        uint8_t pk[VCRYPTO_PK_BYTES];
        memset(pk, k + 1, sizeof pk);
        OK(storage_peer_insert(srv->run.db, pk, "p", "{}", 0, vl_clock_unix_s(), &peer[k], &e_));
        d[k] = random_vec(n, 300 + (uint64_t)k);
        float scale = k == 0 ? 10.0f : 0.01f * (float)k;
        for (size_t i = 0; i < n; i++) d[k][i] *= scale;
        unit[k] = l2(d[k], n) / sqrt(2); /* store_dense: 2 local steps */
    }
    assert_true(unit[0] > 300 * unit[3]);
    static const int honest[3][2] = {{1, 2}, {2, 3}, {1, 3}};
    int64_t task = 1;
    for (int v = 0; v < 3; v++) {
        assert_true(coord_norm_bound(srv) == 0);
        store_dense(srv, task++, peer[0], 10, d[0]);
        store_dense(srv, task++, peer[honest[v][0]], 10, d[honest[v][0]]);
        store_dense(srv, task++, peer[0], 10, d[0]);
        store_dense(srv, task++, peer[honest[v][1]], 10, d[honest[v][1]]);
        merge_next(srv);
    }
    double want = 2 * (unit[2] + unit[3]) / 2;
    double got = coord_norm_bound(srv);
    if (fabs(got - want) > 1e-4 * want)
        fail_msg("bound %.6g, want %.6g (honest unit norms %.4g %.4g %.4g, hostile %.4g)", got,
                 want, unit[1], unit[2], unit[3], unit[0]);
    assert_true(got <= 2 * unit[3]);
    char db[600];
    snprintf(db, sizeof db, "%s/run.db", dir);
    coord_server_close(srv);
    OK(coord_server_open(db, NULL, &srv, &e_));
    assert_true(fabs(coord_norm_bound(srv) - want) < 1e-4 * want);
    for (int k = 0; k < 4; k++) free(d[k]);
    coord_server_close(srv);
    test_remove_tree(dir);
    free(dir);
}

/* A fixed clipping bound of 1 for the stored-norm cases. */
#define CLIP_AT_ONE "{\"max_norm\": 1, \"on_excess\": \"clip\"}"

/* Two peers of srv, and their dense updates scaled to L2 norms 0.5 and 4
 * (seeded by seed): under and over CLIP_AT_ONE. */
static void two_updates(coord_server *srv, uint64_t seed, int64_t peer[2], float *d[2]) {
    size_t n = srv->run.n_params;
    const double want[2] = {0.5, 4};
    for (int k = 0; k < 2; k++) {
        uint8_t pk[VCRYPTO_PK_BYTES];
        memset(pk, k + 1, sizeof pk);
        OK(storage_peer_insert(srv->run.db, pk, "p", "{}", 0, vl_clock_unix_s(), &peer[k], &e_));
        d[k] = random_vec(n, seed + (uint64_t)k);
        double l = l2(d[k], n);
        for (size_t i = 0; i < n; i++) d[k][i] = (float)(d[k][i] * (want[k] / l));
    }
}

/* How far theta1 is from theta0 minus the mean of the two updates of
 * two_updates (10 and 30 samples) with d[k] scaled by s[k]. */
static double off_step(const float *theta0, const float *theta1, float *const d[2],
                       const double s[2], size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double want = theta0[i] - (10 * s[0] * d[0][i] + 30 * s[1] * d[1][i]) / 40.0;
        worst = fmax(worst, fabs(theta1[i] - want));
    }
    return worst;
}

/* The merge bounds an update by the norm stored with it on arrival and
 * does not compute it again: with max_norm 1 (clip), an update of norm
 * 0.5 stored as 10 is scaled down tenfold, and one of norm 4 stored as
 * 0.25 goes in whole. Had the merge computed the norms, the first would
 * have gone in whole and the second been scaled by a quarter. */
static void test_merge_uses_stored_norm(void **state) {
    (void)state;
    char *dir = test_temp_dir("/tmp/volley-merge.XXXXXX");
    coord_server *srv = open_run(dir, "none", CLIP_AT_ONE);
    size_t n = srv->run.n_params;
    const coord_robust_config *rb = &srv->run.cfg.robust;
    assert_true(!rb->auto_norm && rb->max_norm == 1 && !rb->refuse_excess &&
                rb->rule == COORD_RULE_MEAN);
    int64_t peer[2];
    float *d[2];
    two_updates(srv, 500, peer, d);
    float *theta0 = malloc(n * sizeof *theta0);
    assert_non_null(theta0);
    memcpy(theta0, coord_model_params(&srv->run.net), n * sizeof *theta0);
    const double stored[2] = {10, 0.25};
    for (int k = 0; k < 2; k++) {
        compress_update_meta m = {.task = k + 1,
                                  .peer = peer[k],
                                  .base_version = 0,
                                  .num_samples = k ? 30 : 10,
                                  .local_steps = 2,
                                  .loss = 3.0};
        snprintf(m.run, sizeof m.run, "merge");
        vl_buf b;
        vl_buf_init(&b, 1 << 24);
        encode_update(srv, "none", &m, NULL, d[k], n, &b);
        assert_true(fabs(upload_norm(srv, &b) - (k ? 4 : 0.5)) < 1e-5);
        store_update_as(srv, peer[k], &m, &b, &stored[k]);
        vl_buf_free(&b);
    }
    merge_next(srv);
    const float *theta1 = coord_model_params(&srv->run.net);
    const double by_stored[2] = {0.1, 1}, by_computed[2] = {1, 0.25};
    double worst = off_step(theta0, theta1, d, by_stored, n);
    if (worst > 1e-6) fail_msg("version 1 is %.3g from the step the stored norms bound", worst);
    /* The other reading is far off, so the check above tells them apart. */
    assert_true(off_step(theta0, theta1, d, by_computed, n) > 1e-3);
    free(theta0);
    for (int k = 0; k < 2; k++) free(d[k]);
    coord_server_close(srv);
    test_remove_tree(dir);
    free(dir);
}

/* The updates of a database from before migration 14 have no stored norm,
 * and the merge computes each one itself, as it always did. The same two
 * updates, the longer one clipped to max_norm, make the same version, bit
 * for bit, stored with their norms as uploads are, or in a database taken
 * back to schema 13 (the column dropped, user_version 13) that the
 * coordinator then opens and migrates. */
static void test_old_schema_norms_fall_back(void **state) {
    (void)state;
    float *theta0[2], *theta1[2];
    float *d[2] = {0};
    size_t n = 0;
    for (int old = 0; old < 2; old++) {
        char *dir = test_temp_dir("/tmp/volley-merge.XXXXXX");
        coord_server *srv = open_run(dir, "none", CLIP_AT_ONE);
        n = srv->run.n_params;
        int64_t peer[2];
        for (int k = 0; k < 2; k++) free(d[k]);
        two_updates(srv, 600, peer, d);
        theta0[old] = malloc(n * sizeof *theta0[old]);
        theta1[old] = malloc(n * sizeof *theta1[old]);
        assert_true(theta0[old] && theta1[old]);
        memcpy(theta0[old], coord_model_params(&srv->run.net), n * sizeof *theta0[old]);
        store_dense_how(srv, 1, peer[0], 10, d[0], !old);
        store_dense_how(srv, 2, peer[1], 30, d[1], !old);
        char db[600];
        snprintf(db, sizeof db, "%s/run.db", dir);
        if (old) {
            coord_server_close(srv);
            sqlite3 *raw = NULL;
            assert_int_equal(sqlite3_open(db, &raw), SQLITE_OK);
            const char *back = "ALTER TABLE updates DROP COLUMN norm; PRAGMA user_version = 13;";
            if (sqlite3_exec(raw, back, NULL, NULL, NULL) != SQLITE_OK)
                fail_msg("back to schema 13: %s", sqlite3_errmsg(raw));
            assert_int_equal(sqlite3_close(raw), SQLITE_OK);
            OK(coord_server_open(db, NULL, &srv, &e_));
            int v = 0;
            OK(storage_user_version(srv->run.db, &v, &e_));
            assert_int_equal(v, storage_schema_version());
        }
        norm_count c = {0};
        OK(storage_update_each_unmerged(srv->run.db, count_norms, &c, &e_));
        assert_int_equal(c.updates, 2);
        assert_int_equal(c.with_norm, old ? 0 : 2);
        merge_next(srv);
        memcpy(theta1[old], coord_model_params(&srv->run.net), n * sizeof *theta1[old]);
        coord_server_close(srv);
        test_remove_tree(dir);
        free(dir);
    }
    assert_memory_equal(theta0[0], theta0[1], n * sizeof *theta0[0]);
    assert_memory_equal(theta1[0], theta1[1], n * sizeof *theta1[0]);
    /* And the version is the clipped mean: the longer update at 1/4. */
    const double s[2] = {1, 1.0 / l2(d[1], n)};
    assert_true(s[1] < 0.3);
    double worst = off_step(theta0[1], theta1[1], d, s, n);
    if (worst > 1e-6) fail_msg("version 1 is %.3g from the clipped mean's step", worst);
    for (int k = 0; k < 2; k++) {
        free(d[k]);
        free(theta0[k]);
        free(theta1[k]);
    }
}

/* The learning window on its own: a peer's norms count as their median;
 * a window of one peer's updates waits for the quorum past auto_versions
 * (here 3) and is complete once two more peers are in it, or at
 * COORD_BOUND_WAIT x auto_versions whatever it holds. */
static void test_bound_window(void **state) {
    (void)state;
    size_t np = 0;
    const int64_t p[] = {5, 9, 5, 5, 7};
    const double u[] = {100, 2, 100, NAN, 3};
    assert_true(coord_norm_bound_peer_median(p, u, 5, &np) == 3);
    assert_int_equal(np, 3);
    assert_true(isnan(coord_norm_bound_peer_median(p, u, 0, &np)) && np == 0);
    coord_server *srv = calloc(1, sizeof *srv);
    assert_non_null(srv);
    srv->run.cfg.robust.auto_norm = 1;
    srv->run.cfg.robust.auto_versions = 3;
    const int64_t h[] = {5, 5, 5, 5};
    const double hu[] = {100, 100, 100, 100};
    for (int64_t v = 1; v <= 4; v++)
        assert_true(isnan(coord_norm_bound_figure(srv, 3, v, h, hu, 4)));
    const int64_t two[] = {9, 7, 5};
    const double twou[] = {2, 3, 100};
    assert_true(coord_norm_bound_figure(srv, 3, 5, two, twou, 3) == 3);
    assert_null(srv->run.bound_window);
    /* Only ever one peer: at version 12. */
    for (int64_t v = 1; v < COORD_BOUND_WAIT * 3; v++)
        assert_true(isnan(coord_norm_bound_figure(srv, 3, v, h, hu, 4)));
    assert_true(coord_norm_bound_figure(srv, 3, COORD_BOUND_WAIT * 3, h, hu, 4) == 100);
    /* Quorum 0 (nothing being learnt): nothing held. */
    assert_true(isnan(coord_norm_bound_figure(srv, 0, 3, two, twou, 3)));
    assert_null(srv->run.bound_window);
    free(srv);
}

/* Without a robust section a run gets the derived bound (async refusing
 * beyond it, sync clipping), and the trimmed mean where a version has the
 * updates for it; the
 * normalised configuration says so and parses back the same. */
static void test_robust_defaults(void **state) {
    (void)state;
    static const struct {
        int upv;
        coord_rule rule;
    } cases[] = {{2, COORD_RULE_MEAN}, {4, COORD_RULE_MEAN}, {5, COORD_RULE_TRIMMED_MEAN}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char text[400];
        snprintf(text, sizeof text,
                 "{\"name\": \"d\", \"corpus\": \"x\", \"model\": {\"vocab_size\": 256, "
                 "\"block_size\": 16, \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16}, "
                 "\"mode\": \"async\", \"updates_per_version\": %d}",
                 cases[c].upv);
        coord_config cfg, again;
        OK(coord_config_parse(text, strlen(text), &cfg, &e_));
        assert_int_equal(cfg.robust.rule, cases[c].rule);
        assert_true(cfg.robust.auto_norm && cfg.robust.refuse_excess);
        /* A sync run clips instead: a refusal would hold its slot. */
        snprintf(text, sizeof text,
                 "{\"name\": \"d\", \"corpus\": \"x\", \"updates_per_version\": %d}", cases[c].upv);
        OK(coord_config_parse(text, strlen(text), &again, &e_));
        assert_true(again.robust.auto_norm && !again.robust.refuse_excess);
        assert_true(cfg.robust.auto_mult == 4 && cfg.robust.auto_versions == 3);
        char *json = coord_config_to_json(&cfg, 1);
        assert_non_null(strstr(json, "\"max_norm\":\"auto\""));
        OK(coord_config_parse(json, strlen(json), &again, &e_));
        assert_memory_equal(&cfg, &again, sizeof cfg);
        free(json);
    }
    const char *bad[] = {"{\"max_norm\": \"large\"}", "{\"auto_mult\": 3}",
                         "{\"max_norm\": \"auto\", \"auto_mult\": 1}",
                         "{\"max_norm\": \"auto\", \"auto_versions\": 0}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[400];
        snprintf(text, sizeof text,
                 "{\"name\": \"d\", \"corpus\": \"x\", \"model\": {\"vocab_size\": 256, "
                 "\"block_size\": 16, \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16}, "
                 "\"robust\": %s}",
                 bad[i]);
        coord_config cfg;
        vl_error e = {0};
        assert_int_equal(coord_config_parse(text, strlen(text), &cfg, &e), VL_EINVAL);
        assert_non_null(strstr(e.msg, "robust."));
    }
}

/* A second round's state: E, the momentum and the ages are views into the
 * version's state vector in that order, and E <- 0.9 E + S. */
static void test_round_state(void **state) {
    (void)state;
    coord_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.comp_rows = 2;
    cfg.comp_cols = 3;
    cfg.comp_seed = 5;
    float state_e[6] = {1, 2, 3, 4, 5, 6}, s_tab[6] = {10, 0, -10, 0, 1, 0};
    float *mom, *age, st[6 + 20 + 20] = {0};
    compress_sketch E, S;
    coord_sketch_view(&S, &cfg, s_tab);
    assert_true(S.rows == 2 && S.cols == 3 && S.seed == 5 && S.table == s_tab);
    memcpy(st, state_e, sizeof state_e);
    coord_round_views(&cfg, 20, st, &E, &mom, &age);
    assert_ptr_equal(E.table, st);
    assert_ptr_equal(mom, st + 6);
    assert_ptr_equal(age, st + 26);
    OK(coord_round_accumulate(&E, &S, &e_));
    for (int i = 0; i < 6; i++)
        assert_true(fabsf(E.table[i] - (COORD_ROUND_DECAY * state_e[i] + s_tab[i])) < 1e-6f);
    for (int i = 6; i < 46; i++) assert_true(st[i] == 0.0f);
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    if (vcrypto_init() != VL_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_divides_by_samples),
        cmocka_unit_test(test_topk_divides_by_samples),
        cmocka_unit_test(test_sketch_divides_by_samples),
        cmocka_unit_test(test_auto_norm_bound),
        cmocka_unit_test(test_auto_norm_bound_per_peer),
        cmocka_unit_test(test_merge_uses_stored_norm),
        cmocka_unit_test(test_old_schema_norms_fall_back),
        cmocka_unit_test(test_bound_window),
        cmocka_unit_test(test_robust_defaults),
        cmocka_unit_test(test_round_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
