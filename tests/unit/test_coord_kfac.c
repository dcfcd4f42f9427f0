/*
 * The coordinator's side of K-FAC: "optimizer": "kfac" in the run
 * configuration (its defaults, every bad setting refused with the field
 * named, the normalised form parsing back to the same configuration, the
 * body cap checked against an update with its factors), and the merge of
 * the factors that updates carry: added per update weighted by their
 * samples, written as the version's factors file, and equal to
 * model_kfac_average of the same layers with the same weights.
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

#include "coordinator/run/aggregator.h"
#include "coordinator/run/factors.h"
#include "coordinator/run/round.h"
#include "coordinator/coord.h"
#include "test_util.h"
#include "coordinator/config/config.h"

static int parse(const char *json, coord_config *cfg, vl_error *e) {
    memset(e, 0, sizeof *e);
    return coord_config_parse(json, strlen(json), cfg, e);
}

#define RUN(train) "{\"name\": \"k\", \"corpus\": \"c\", \"train\": " train "}"

static void test_config(void **state) {
    (void)state;
    coord_config cfg, again;
    vl_error e;
    /* K-FAC's own defaults for lr and momentum, and for its settings */
    assert_int_equal(parse(RUN("{\"optimizer\": \"kfac\"}"), &cfg, &e), VL_OK);
    model_kfac_gpt_config d = model_kfac_gpt_config_default();
    assert_true(cfg.train.lr == (double)d.lr && cfg.train.momentum == (double)d.momentum);
    assert_true(cfg.train.kfac.damping == (double)d.damping);
    assert_true(cfg.train.kfac.decay == (double)d.decay);
    assert_true(cfg.train.kfac.kl_clip == (double)d.kl_clip);
    assert_int_equal(cfg.train.kfac.inverse_every, d.inverse_every);
    assert_false(coord_config_shares_factors(&cfg));
    /* given ones win, and the normalised form parses back the same */
    assert_int_equal(parse(RUN("{\"optimizer\": \"kfac\", \"lr\": 0.05, \"momentum\": 0.5, "
                               "\"weight_decay\": 0.01, \"kfac\": {\"damping\": 0.01, "
                               "\"decay\": 0.9, \"inverse_every\": 5, \"kl_clip\": 0.02, "
                               "\"share\": true, \"dtype\": \"F16\"}}"),
                           &cfg, &e),
                     VL_OK);
    assert_true(cfg.train.lr == 0.05 && cfg.train.momentum == 0.5);
    assert_true(cfg.train.kfac.damping == 0.01 && cfg.train.kfac.kl_clip == 0.02);
    assert_true(coord_config_shares_factors(&cfg));
    assert_string_equal(cfg.train.kfac.dtype, "F16");
    char *json = coord_config_to_json(&cfg, 1);
    assert_non_null(json);
    assert_non_null(strstr(json, "\"inverse_every\":5"));
    assert_int_equal(parse(json, &again, &e), VL_OK);
    assert_memory_equal(&cfg, &again, sizeof cfg);
    free(json);
    /* other optimizers carry no kfac object */
    assert_int_equal(parse(RUN("{\"optimizer\": \"sgd\"}"), &cfg, &e), VL_OK);
    json = coord_config_to_json(&cfg, 0);
    assert_null(strstr(json, "kfac"));
    free(json);

    static const char *const bad[][2] = {
        {RUN("{\"kfac\": {\"damping\": 0.1}}"), "train.kfac is for optimizer \"kfac\""},
        {RUN("{\"optimizer\": \"kfac\", \"kfac\": 3}"), "train.kfac must be an object"},
        {RUN("{\"optimizer\": \"kfac\", \"kfac\": {\"damping\": 0}}"), "train.kfac.damping"},
        {RUN("{\"optimizer\": \"kfac\", \"kfac\": {\"decay\": 1}}"), "train.kfac.decay"},
        {RUN("{\"optimizer\": \"kfac\", \"kfac\": {\"inverse_every\": 0}}"),
         "train.kfac.inverse_every"},
        {RUN("{\"optimizer\": \"kfac\", \"kfac\": {\"kl_clip\": -1}}"), "train.kfac.kl_clip"},
        {RUN("{\"optimizer\": \"kfac\", \"kfac\": {\"share\": \"yes\"}}"), "train.kfac.share"},
        {RUN("{\"optimizer\": \"kfac\", \"kfac\": {\"dtype\": \"BF16\"}}"), "train.kfac.dtype"},
        {RUN("{\"optimizer\": \"kfac\", \"kfac\": {\"rho\": 0.9}}"), "train.kfac.rho"},
        {RUN("{\"optimizer\": \"kfac\", \"momentum\": 1}"), "train.momentum"},
        {RUN("{\"optimizer\": \"kfac\", \"nesterov\": true}"), "train.nesterov"},
        {RUN("{\"optimizer\": \"lbfgs\"}"), "\"kfac\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(parse(bad[i][0], &cfg, &e), VL_EINVAL);
        if (!strstr(e.msg, bad[i][1])) fail_msg("'%s' lacks '%s'", e.msg, bad[i][1]);
    }
    /* the body cap must hold an update and its factors */
    assert_int_equal(parse(RUN("{\"optimizer\": \"kfac\", \"kfac\": {\"share\": true}}"), &cfg, &e),
                     VL_OK);
    int64_t with = coord_config_update_bytes(&cfg), factors = coord_config_factor_bytes(&cfg);
    assert_true(factors > 4 * 1500000); /* the default model's factors: 1.5 M floats */
    char js[256];
    snprintf(js, sizeof js,
             "{\"name\": \"k\", \"corpus\": \"c\", \"max_body_bytes\": %lld, \"train\": "
             "{\"optimizer\": \"kfac\", \"kfac\": {\"share\": true}}}",
             (long long)with - 1);
    assert_int_equal(parse(js, &cfg, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "K-FAC factors"));
    snprintf(js, sizeof js,
             "{\"name\": \"k\", \"corpus\": \"c\", \"max_body_bytes\": %lld, \"train\": "
             "{\"optimizer\": \"kfac\", \"kfac\": {\"share\": true}}}",
             (long long)with);
    assert_int_equal(parse(js, &cfg, &e), VL_OK);
}

/* ---- merging ------------------------------------------------------------------- */

static const model_gpt_config SMALL = {256, 8, 1, 2, 8};

/* A dense update whose factors are those of layers built from random
 * batches, `samples` of them. */
static void make_update(model_kfac_layer **layers, int n, const compress_factor_layer *fl,
                        int64_t samples, uint64_t seed, st_dtype dt, vl_buf *out) {
    const float **A = calloc((size_t)n, sizeof *A), **G = calloc((size_t)n, sizeof *G);
    assert_true(A && G);
    for (int i = 0; i < n; i++) {
        model_kfac_layer *l = layers[i];
        float *X = random_vec(16 * (size_t)l->in, seed + 2 * (uint64_t)i);
        float *dY = random_vec(16 * (size_t)l->out, seed + 2 * (uint64_t)i + 1);
        for (int j = 0; j < 16 * l->out; j++) dY[j] *= 1e-3f;
        OK(model_kfac_update_factors(l, X, dY, 16, 0.9f, &e_));
        free(X), free(dY);
        A[i] = l->A;
        G[i] = l->G;
    }
    compress_factors f = {.layers = fl, .n = n, .A = A, .G = G, .samples = samples, .dtype = dt};
    compress_update_meta m;
    memset(&m, 0, sizeof m);
    snprintf(m.run, sizeof m.run, "k");
    m.task = 1, m.peer = 1, m.kind = COMPRESS_DENSE, m.num_samples = 5, m.local_steps = 1;
    m.factors = &f;
    size_t np = model_gpt_config_num_params(&SMALL);
    float *delta = calloc(np, sizeof *delta);
    assert_non_null(delta);
    vl_buf_init(out, 1 << 24);
    OK(compress_update_encode_dense(&m, delta, np, ST_F32, out, &e_));
    free(delta), free(A), free(G);
}

static void test_merge_factors(void **state) {
    (void)state;
    coord_server srv;
    memset(&srv, 0, sizeof srv);
    vl_error e = {0};
    assert_int_equal(parse("{\"name\": \"k\", \"corpus\": \"c\", \"model\": {\"block_size\": 8, "
                           "\"n_layer\": 1, \"n_head\": 2, \"n_embd\": 8}, \"train\": "
                           "{\"optimizer\": \"kfac\", \"kfac\": {\"share\": true}}}",
                           &srv.run.cfg, &e),
                     VL_OK);
    int n = model_gpt_kfac_layer_count(&SMALL);
    compress_factor_layer fl[4];
    assert_int_equal(model_gpt_kfac_factor_layers(&SMALL, fl, 4, &e), n);
    /* two peers' layers, and the reference average of them */
    model_kfac_layer *p[2][4];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < n; i++) {
            int in, out;
            OK(model_gpt_kfac_layer(&SMALL, i, NULL, 0, &in, &out, &e_));
            OK(model_kfac_layer_create(in, out, &p[k][i], &e_));
        }
    vl_buf up[2];
    make_update(p[0], n, fl, 640, 11, ST_F32, &up[0]);
    make_update(p[1], n, fl, 1920, 21, ST_F32, &up[1]);
    compress_factors_sum s;
    OK(compress_factors_sum_init(&s, fl, n, &e_));
    size_t np = model_gpt_config_num_params(&SMALL);
    for (int k = 0; k < 2; k++) {
        compress_update u;
        OK(compress_update_decode(up[k].data, up[k].len, np, &u, NULL, &e_));
        OK(coord_factors_add(&s, &u, k + 1, &e_));
        compress_update_free(&u);
    }
    vl_buf file;
    storage_version v;
    memset(&v, 0, sizeof v);
    OK(coord_factors_merged(&srv, &s, 7, &file, &v, &e_));
    assert_ptr_equal(v.factors, file.data);
    assert_int_equal(v.factors_samples, 2560);
    assert_int_equal(v.factors_peers, 2);
    st_file f;
    OK(st_parse(file.data, file.len, &f, &e_));
    assert_string_equal(st_meta_get(&f, "version"), "7");
    assert_string_equal(st_meta_get(&f, "run"), "k");
    compress_factors_view view;
    OK(compress_factors_decode(&f, fl, n, &view, NULL, &e_));
    double w[2] = {640, 1920};
    for (int i = 0; i < n; i++) {
        model_kfac_layer *avg;
        OK(model_kfac_layer_create(p[0][i]->in, p[0][i]->out, &avg, &e_));
        const model_kfac_layer *src[2] = {p[0][i], p[1][i]};
        OK(model_kfac_average(avg, src, w, 2, &e_));
        size_t na = (size_t)fl[i].a_dim * fl[i].a_dim, ng = (size_t)fl[i].g_dim * fl[i].g_dim;
        float *got = malloc((na > ng ? na : ng) * sizeof *got);
        assert_non_null(got);
        OK(compress_factors_values(&view, i, 0, got, na, &e_));
        for (size_t j = 0; j < na; j++)
            assert_true(fabsf(got[j] - avg->A[j]) <= 1e-6f * (fabsf(avg->A[j]) + 1e-30f) + 1e-7f);
        OK(compress_factors_values(&view, i, 1, got, ng, &e_));
        for (size_t j = 0; j < ng; j++)
            assert_true(fabsf(got[j] - avg->G[j]) <= 1e-6f * fabsf(avg->G[j]) + 1e-12f);
        free(got);
        model_kfac_layer_free(avg);
    }
    /* a stored update whose factors no longer check out stops the merge */
    compress_update u;
    vl_buf_free(&up[0]);
    make_update(p[0], n, fl, 640, 31, ST_F32, &up[0]);
    OK(compress_update_decode(up[0].data, up[0].len, np, &u, NULL, &e_));
    compress_factor_layer wrong[4];
    memcpy(wrong, fl, sizeof wrong);
    wrong[0].g_dim = 25;
    compress_factors_sum bad;
    OK(compress_factors_sum_init(&bad, wrong, n, &e_));
    assert_int_equal(coord_factors_add(&bad, &u, 9, &e), VL_EDB);
    assert_non_null(strstr(e.msg, "update 9"));
    /* nothing added: no factors for the version, and no error */
    vl_buf none;
    storage_version v2;
    memset(&v2, 0, sizeof v2);
    compress_factors_sum_free(&bad);
    OK(compress_factors_sum_init(&bad, fl, n, &e_));
    OK(coord_factors_merged(&srv, &bad, 8, &none, &v2, &e_));
    assert_null(v2.factors);
    vl_buf_free(&none);
    compress_factors_sum_free(&bad);
    compress_update_free(&u);
    compress_factors_view_free(&view);
    st_free(&f);
    vl_buf_free(&file);
    compress_factors_sum_free(&s);
    for (int k = 0; k < 2; k++) {
        vl_buf_free(&up[k]);
        for (int i = 0; i < n; i++) model_kfac_layer_free(p[k][i]);
    }
}

int main(void) {
    vl_log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_merge_factors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
