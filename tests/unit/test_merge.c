/* coordinator: a version made from stored updates, end to end on a real
 * run database (the writer and compute threads, the event loop), against
 * the formula: with FedAvg (outer lr 1, momentum 0) version 1 is
 * theta_0 - sum_i n_i delta_i / sum_i n_i. Two updates of 10 and 30
 * samples, so dividing by their count, or not dividing, or weighting
 * wrong, lands elsewhere: dense, and top-k with every coordinate applied
 * (apply_k = n), where the sparse step must equal the dense one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>

#include "test_util.h"
#include "coordinator/coord.h"

/* A run of kind ("none" or "topk") in dir, served (no listener). */
static coord_server *open_run(const char *dir, const char *kind) {
    char corpus[600], cfg[600], db[600], text[1200];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    snprintf(cfg, sizeof cfg, "%s/run.json", dir);
    snprintf(db, sizeof db, "%s/run.db", dir);
    buf c;
    buf_init(&c, 1 << 20);
    for (int i = 0; i < 2000; i++) OK(buf_append_str(&c, "a quick merge of two updates. "));
    OK(buf_append(&c, "", 1));
    test_write_text(corpus, (const char *)c.data);
    buf_free(&c);
    int topk = strcmp(kind, "topk") == 0;
    snprintf(text, sizeof text,
             "{\"name\": \"merge\", \"corpus\": \"%s\", \"model\": {\"vocab_size\": 256, "
             "\"block_size\": 16, \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16}, "
             "\"updates_per_version\": 2, \"max_versions\": 3, \"task_bytes\": 4096, "
             "\"max_loss_rise\": 0, \"outer\": {\"lr\": 1.0, \"momentum\": 0.0}, "
             "\"train\": {\"steps\": 4, \"batch\": 4}%s}",
             corpus, topk ? ", \"compression\": {\"kind\": \"topk\", \"k\": 8, \"apply_k\": "
                            "1000000}" : "");
    test_write_text(cfg, text);
    OK(coord_cmd_init(db, cfg, &e_));
    coord_server *srv = NULL;
    OK(coord_server_open(db, NULL, &srv, &e_));
    return srv;
}

/* Stores a done task of peer for version 0 and its update (body). */
static void store_update(coord_server *srv, int64_t peer, const compress_update_meta *m,
                         const buf *body) {
    storage_task t = {.peer_id = peer, .base_version = 0, .data_offset = 0,
                      .data_length = 4096, .seed = 1, .issued_at = 1000,
                      .deadline = clock_unix_s() + 600, .state = STORAGE_TASK_DONE};
    int64_t tid = 0;
    OK(storage_task_insert(srv->db, &t, &tid, &e_));
    assert_int_equal(tid, m->task);
    storage_update u = {.task_id = tid, .peer_id = peer, .base_version = 0,
                        .num_samples = m->num_samples, .local_steps = m->local_steps,
                        .loss = m->loss, .nbytes = (int64_t)body->len, .blob = body->data,
                        .received_at = clock_unix_s()};
    snprintf(u.kind, sizeof u.kind, "%s", compress_kind_name(m->kind));
    OK(storage_update_insert(srv->db, &u, NULL, &e_));
}

/* Runs the loop until version 1 is committed (or gives up). */
static void merge_version_one(coord_server *srv) {
    vl_error e = {0};
    /* 1: a merge was started. */
    assert_int_equal(coord_merge_if_ready(srv, &e), 1);
    for (int i = 0; i < 2000 && srv->version < 1; i++) {
        struct timeval tv = {0, 5000};
        event_base_loopexit(srv->base, &tv);
        event_base_dispatch(srv->base);
    }
    assert_int_equal(srv->version, 1);
}

static void check_kind(const char *kind) {
    char *dir = test_temp_dir("/tmp/volley-merge.XXXXXX");
    coord_server *srv = open_run(dir, kind);
    size_t n = srv->n_params;
    float *theta0 = malloc(n * sizeof *theta0);
    assert_non_null(theta0);
    memcpy(theta0, model_gpt_params(srv->gpt), n * sizeof *theta0);
    uint8_t pk[2][CRYPTO_PK_BYTES];
    int64_t peer[2];
    for (int k = 0; k < 2; k++) {
        memset(pk[k], k + 1, sizeof pk[k]);
        OK(storage_peer_insert(srv->db, pk[k], "p", "{}", 0, clock_unix_s(), &peer[k], &e_));
    }
    int64_t samples[2] = {10, 30};
    float *d[2];
    uint32_t *idx = malloc(n * sizeof *idx);
    assert_non_null(idx);
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
    for (int k = 0; k < 2; k++) {
        d[k] = random_vec(n, 100 + (uint64_t)k);
        for (size_t i = 0; i < n; i++) d[k][i] *= 0.01f;
        compress_update_meta m = {.task = k + 1, .peer = peer[k], .base_version = 0,
                                  .num_samples = samples[k], .local_steps = 2, .loss = 3.0};
        snprintf(m.run, sizeof m.run, "merge");
        buf b;
        buf_init(&b, 1 << 24);
        if (strcmp(kind, "topk") == 0) {
            m.kind = COMPRESS_TOPK;
            OK(compress_update_encode_topk(&m, idx, d[k], n, ST_F32, &b, &e_));
        } else {
            m.kind = COMPRESS_DENSE;
            OK(compress_update_encode_dense(&m, d[k], n, ST_F32, &b, &e_));
        }
        store_update(srv, peer[k], &m, &b);
        buf_free(&b);
    }
    merge_version_one(srv);
    const float *theta1 = model_gpt_params(srv->gpt);
    double worst = 0, moved = 0;
    for (size_t i = 0; i < n; i++) {
        double mean = (samples[0] * (double)d[0][i] + samples[1] * (double)d[1][i]) /
                      (double)(samples[0] + samples[1]);
        double want = theta0[i] - mean;
        double err = fabs(theta1[i] - want);
        if (err > worst) worst = err;
        moved += fabs(theta1[i] - theta0[i]);
    }
    /* The step is about 0.01 per coordinate; a wrong division is off by
     * a quarter of it or more (1/2 against 1/4 weights). */
    if (worst > 1e-6) fail_msg("%s: version 1 is %.3g from the weighted mean's step", kind, worst);
    assert_true(moved / (double)n > 1e-3);
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

int main(void) {
    log_set_level(LOG_WARN);
    if (crypto_init() != VL_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_divides_by_samples),
        cmocka_unit_test(test_topk_divides_by_samples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
