/*
 * The peer's K-FAC: task leases naming "kfac" (settings, factors version,
 * every bad field refused), a trainer that trains with it and keeps its
 * state across tasks, a restart through trainer.st that gives bit for bit
 * the next task the original trainer would have trained, merged factors
 * adopted (and refused when they are for another run, version or model,
 * leaving the trainer unchanged), and the factors attached to an update as
 * the coordinator decodes them.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "peer/peer.h"
#include "peer_fixtures.h"
#include "test_util.h"

static const peer_state OWNER = {
    .coordinator = "https://127.0.0.1:8443", .peer_id = 3, .run = "unit"};

static const char KFAC_TASK[] =
    "{\"task_id\": 17, \"run\": \"unit\", \"base_version\": 5,"
    " \"data\": {\"shard\": \"train\", \"offset\": 0, \"length\": 17},"
    " \"train\": {\"steps\": 2, \"batch\": 4, \"context\": 16, \"optimizer\": \"kfac\","
    "   \"lr\": 0.1, \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-8,"
    "   \"weight_decay\": 0.0, \"grad_clip\": 1.0, \"seed\": 7, \"momentum\": 0.5,"
    "   \"kfac\": {\"damping\": 0.01, \"decay\": 0.9, \"inverse_every\": 3,"
    "              \"kl_clip\": 0.001, \"share\": true, \"dtype\": \"F16\","
    "              \"factors_version\": 4}},"
    " \"compression\": {\"kind\": \"none\", \"dtype\": \"F32\"},"
    " \"deadline\": 1795000000}";

static char *task_with(const char *from, const char *to) {
    const char *p = strstr(KFAC_TASK, from);
    if (!p) fail_msg("'%s' is not in the task", from);
    size_t a = (size_t)(p - KFAC_TASK), fl = strlen(from), tl = strlen(to);
    char *s = malloc(sizeof KFAC_TASK + tl);
    assert_non_null(s);
    memcpy(s, KFAC_TASK, a);
    memcpy(s + a, to, tl);
    memcpy(s + a + tl, p + fl, sizeof KFAC_TASK - a - fl);
    return s;
}

static void test_task_parse(void **state) {
    (void)state;
    peer_task t;
    OK(peer_task_parse(KFAC_TASK, strlen(KFAC_TASK), &t, &e_));
    assert_true(t.kfac && !t.sgd);
    assert_true(t.momentum == 0.5 && t.kfac_damping == 0.01 && t.kfac_decay == 0.9);
    assert_int_equal(t.kfac_inverse_every, 3);
    assert_true(t.kfac_kl_clip == 0.001 && t.kfac_share);
    assert_int_equal(t.kfac_dtype, ST_F16);
    assert_int_equal(t.kfac_factors, 4);
    /* without factors_version (nothing merged yet), and without sharing */
    char *s = task_with("\"factors_version\": 4", "\"unknown_field\": 4");
    OK(peer_task_parse(s, strlen(s), &t, &e_));
    assert_int_equal(t.kfac_factors, -1);
    free(s);
    s = task_with("\"share\": true", "\"share\": false");
    OK(peer_task_parse(s, strlen(s), &t, &e_));
    assert_false(t.kfac_share);
    free(s);
    static const char *const bad[][3] = {
        {"\"damping\": 0.01", "\"damping\": 0", "train.kfac.damping"},
        {"\"decay\": 0.9", "\"decay\": 1", "train.kfac.decay"},
        {"\"inverse_every\": 3", "\"inverse_every\": 0", "train.kfac.inverse_every"},
        {"\"kl_clip\": 0.001", "\"kl_clip\": -1", "train.kfac.kl_clip"},
        {"\"share\": true", "\"share\": 1", "train.kfac.share"},
        {"\"dtype\": \"F16\"", "\"dtype\": \"BF16\"", "train.kfac.dtype"},
        {"\"factors_version\": 4", "\"factors_version\": -2", "factors_version"},
        {"\"momentum\": 0.5", "\"momentum\": 1.0", "train.momentum"},
        {"\"kfac\": {", "\"kfacx\": {", "train.kfac"},
        {"\"optimizer\": \"kfac\"", "\"optimizer\": \"shampoo\"", "kfac"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s = task_with(bad[i][0], bad[i][1]);
        vl_error e = {0};
        assert_int_equal(peer_task_parse(s, strlen(s), &t, &e), VL_EINVAL);
        if (!strstr(e.msg, bad[i][2])) fail_msg("message '%s' lacks '%s'", e.msg, bad[i][2]);
        free(s);
    }
}

static peer_task kfac_task(int steps) {
    peer_task k;
    OK(peer_task_parse(KFAC_TASK, strlen(KFAC_TASK), &k, &e_));
    k.steps = k.h_min = steps;
    return k;
}

static void trained(peer_trainer *t, int steps) {
    peer_trainer_init(t);
    OK(peer_trainer_init_model(t, &TINY, 0, &e_));
    peer_task k = kfac_task(steps);
    peer_train_result res;
    OK(peer_trainer_run(t, &k, TEXT, 17, &res, &e_));
    assert_true(t->have_kfac && !t->have_opt && !t->have_sgd);
    assert_int_equal(t->kfac.step, steps);
}

/* A restart: trainer.st holds the K-FAC momentum, factors and settings,
 * and the restored trainer's next task equals the original's bit for bit
 * (every task inverts afresh, so the inverses need not be saved). */
static void test_state_round_trip(void **state) {
    (void)state;
    char *dir = test_temp_dir("/tmp/test_peer_kfac.XXXXXX");
    peer_trainer t;
    trained(&t, 4);
    t.kfac_factors = 4;
    OK(peer_resume_save_trainer(dir, &t, &OWNER, 0, &e_));
    peer_resume s;
    OK(peer_resume_load(dir, &OWNER, &s, &e_));
    assert_non_null(s.kfac_momentum);
    assert_null(s.opt.m);
    assert_int_equal(s.kfac_step, 4);
    assert_int_equal(s.kfac_updates, 4);
    assert_int_equal(s.kfac_factors, 4);
    assert_memory_equal(s.kfac_momentum, t.kfac.sgd.buf, t.n_params * sizeof(float));
    peer_trainer u;
    peer_trainer_init(&u);
    OK(peer_trainer_init_model(&u, &TINY, 0, &e_));
    OK(peer_resume_apply(&u, &s, &e_));
    assert_true(u.have_kfac);
    assert_int_equal(u.kfac_factors, 4);
    for (int i = 0; i < t.kfac.n_layers; i++) {
        const model_kfac_layer *a = t.kfac.layers[i], *b = u.kfac.layers[i];
        assert_memory_equal(a->A, b->A, (size_t)(a->in + 1) * (a->in + 1) * sizeof(float));
        assert_memory_equal(a->G, b->G, (size_t)a->out * a->out * sizeof(float));
    }
    peer_task k = kfac_task(3);
    peer_train_result r1, r2;
    OK(peer_trainer_run(&t, &k, TEXT, 17, &r1, &e_));
    OK(peer_trainer_run(&u, &k, TEXT, 17, &r2, &e_));
    assert_memory_equal(u.delta, t.delta, t.n_params * sizeof(float));
    assert_memory_equal(u.kfac.sgd.buf, t.kfac.sgd.buf, t.n_params * sizeof(float));
    assert_true(r1.mean_loss == r2.mean_loss);

    /* Switching to AdamW drops the K-FAC state, and the file follows. */
    peer_task a = tiny_task(1);
    OK(peer_trainer_run(&t, &a, TEXT, 17, &r1, &e_));
    assert_true(t.have_opt && !t.have_kfac);
    OK(peer_resume_save_trainer(dir, &t, &OWNER, 0, &e_));
    OK(peer_resume_load(dir, &OWNER, &s, &e_));
    assert_null(s.kfac_momentum);
    assert_non_null(s.opt.m);
    peer_resume_free(&s);
    peer_trainer_free(&t);
    peer_trainer_free(&u);
    test_remove_tree(dir);
    free(dir);
}

/* The merged file the coordinator would serve for run/version, built from
 * trainer t's factors scaled by `scale`. */
static void merged_file(const peer_trainer *t, const char *run, int64_t version, float scale,
                        vl_buf *out) {
    int n = t->kfac.n_layers;
    compress_factor_layer *layers = calloc((size_t)n, sizeof *layers);
    const float **A = calloc((size_t)n, sizeof *A), **G = calloc((size_t)n, sizeof *G);
    float **copies = calloc(2 * (size_t)n, sizeof *copies);
    assert_true(layers && A && G && copies);
    assert_int_equal(model_gpt_kfac_factor_layers(&t->cfg, layers, n, NULL), n);
    for (int i = 0; i < n; i++) {
        const model_kfac_layer *l = t->kfac.layers[i];
        size_t na = (size_t)(l->in + 1) * (l->in + 1), ng = (size_t)l->out * l->out;
        copies[2 * i] = malloc(na * sizeof(float));
        copies[2 * i + 1] = malloc(ng * sizeof(float));
        assert_true(copies[2 * i] && copies[2 * i + 1]);
        for (size_t j = 0; j < na; j++) copies[2 * i][j] = l->A[j];
        for (size_t j = 0; j < ng; j++) copies[2 * i + 1][j] = scale * l->G[j];
        A[i] = copies[2 * i];
        G[i] = copies[2 * i + 1];
    }
    compress_factors f = {
        .layers = layers, .n = n, .A = A, .G = G, .samples = 2048, .dtype = ST_F32};
    vl_buf_init(out, 1 << 24);
    OK(compress_factors_encode_file(&f, run, version, out, &e_));
    for (int i = 0; i < 2 * n; i++) free(copies[i]);
    free(copies), free(layers), free(A), free(G);
}

static void test_adopt_and_attach(void **state) {
    (void)state;
    peer_trainer t;
    trained(&t, 2);
    peer_task k = kfac_task(2);
    vl_buf good;
    merged_file(&t, "unit", 4, 3.0f, &good);
    const model_kfac_layer *l = t.kfac.layers[2];
    size_t ng = (size_t)l->out * l->out;
    float *G0 = malloc(ng * sizeof *G0);
    assert_non_null(G0);
    memcpy(G0, l->G, ng * sizeof *G0);
    /* refused: another run, another version, another model, garbage */
    vl_buf other;
    merged_file(&t, "other", 4, 3.0f, &other);
    vl_error e = {0};
    assert_int_equal(peer_trainer_adopt_factors(&t, &k, other.data, other.len, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "other"));
    vl_buf_free(&other);
    merged_file(&t, "unit", 3, 3.0f, &other);
    assert_int_equal(peer_trainer_adopt_factors(&t, &k, other.data, other.len, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "version"));
    vl_buf_free(&other);
    assert_int_equal(peer_trainer_adopt_factors(&t, &k, good.data, 100, &e), VL_EINVAL);
    peer_trainer w;
    peer_trainer_init(&w);
    OK(peer_trainer_init_model(&w, &(model_gpt_config){256, 16, 2, 2, 16}, 0, &e_));
    assert_int_equal(peer_trainer_adopt_factors(&w, &k, good.data, good.len, &e), VL_ERANGE);
    assert_int_equal(w.kfac_factors, -1);
    peer_trainer_free(&w);
    assert_memory_equal(l->G, G0, ng * sizeof *G0); /* nothing changed */
    assert_int_equal(t.kfac_factors, -1);
    /* adopted: the layers hold the merged factors, the next step inverts */
    OK(peer_trainer_adopt_factors(&t, &k, good.data, good.len, &e_));
    assert_int_equal(t.kfac_factors, 4);
    for (size_t j = 0; j < ng; j++) assert_true(l->G[j] == 3.0f * G0[j]);
    assert_true(t.kfac.since_invert < 0);

    /* attached to an update, the factors decode as the coordinator reads them */
    compress_factor_layer layers[4];
    const float *A[4], *G[4];
    compress_factors cf;
    OK(peer_kfac_factors(&t, &k, 640, layers, A, G, &cf, &e_));
    assert_int_equal(cf.n, 4);
    assert_int_equal(cf.dtype, ST_F16);
    compress_update_meta m;
    memset(&m, 0, sizeof m);
    snprintf(m.run, sizeof m.run, "unit");
    m.task = 17, m.peer = 3, m.base_version = 5, m.kind = COMPRESS_DENSE, m.num_samples = 640;
    m.local_steps = 2, m.loss = 3.0, m.factors = &cf;
    OK(peer_trainer_run(&t, &k, TEXT, 17, &(peer_train_result){0}, &e_));
    vl_buf up;
    vl_buf_init(&up, 1 << 24);
    OK(peer_encode_update(&t, &k, &m, &up, &e_));
    compress_update u;
    OK(compress_update_decode(up.data, up.len, t.n_params, &u, NULL, &e_));
    assert_true(u.has_factors);
    compress_factors_view v;
    OK(compress_factors_decode(&u.file, layers, 4, &v, NULL, &e_));
    assert_int_equal(v.samples, 640);
    float *got = malloc(ng * sizeof *got);
    assert_non_null(got);
    OK(compress_factors_values(&v, 2, 1, got, ng, &e_));
    double worst = 0.0, top = 0.0;
    for (size_t j = 0; j < ng; j++) {
        worst = fmax(worst, fabs((double)got[j] - l->G[j]));
        top = fmax(top, fabs((double)l->G[j]));
    }
    assert_true(worst <= 1e-3 * top); /* F16, scaled to the largest entry */
    free(got);
    compress_factors_view_free(&v);
    compress_update_free(&u);
    vl_buf_free(&up);
    vl_buf_free(&good);
    free(G0);
    peer_trainer_free(&t);
}

int main(void) {
    vl_log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_task_parse),
        cmocka_unit_test(test_state_round_trip),
        cmocka_unit_test(test_adopt_and_attach),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
