/* attack kfac: a K-FAC run that shares factors. "bad" sends the lease's
 * update with its factors missing or wrong in each way the coordinator
 * must refuse (422, nothing stored) and asks for factors that do not
 * exist; "finish" sends it with valid factors (identity-like A, small
 * diagonal G), which must be taken. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compress/compress.h"
#include "model/model.h"
#include "tests/integration/attack.h"

#define MAXL 64

typedef struct factors {
    int n;
    compress_factor_layer layers[MAXL];
    float *A[MAXL], *G[MAXL];
} factors;

/* The run's model, from the model file's `model` metadata. */
static int model_config(const ctx *c, model_gpt_config *cfg) {
    reply r;
    request(c, "GET", "/v1/model", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    st_file f;
    int rc = -1;
    if (r.status == 200 && st_parse(r.body.data, r.body.len, &f, NULL) == VL_OK) {
        json_t *j = json_loads(st_meta_get(&f, "model") ? st_meta_get(&f, "model") : "", 0, NULL);
        *cfg = (model_gpt_config){(int)json_integer_value(json_object_get(j, "vocab_size")),
                                  (int)json_integer_value(json_object_get(j, "block_size")),
                                  (int)json_integer_value(json_object_get(j, "n_layer")),
                                  (int)json_integer_value(json_object_get(j, "n_head")),
                                  (int)json_integer_value(json_object_get(j, "n_embd"))};
        rc = model_gpt_config_validate(cfg, NULL);
        json_decref(j);
        st_free(&f);
    }
    vl_buf_free(&r.body);
    return rc;
}

/* Valid factors for the run's model: A the identity (its last entry is
 * the bias input's 1), G 1e-6 times the identity. */
static int valid_factors(const ctx *c, factors *f) {
    model_gpt_config cfg;
    if (model_config(c, &cfg) != 0) return -1;
    f->n = model_gpt_kfac_factor_layers(&cfg, f->layers, MAXL, NULL);
    if (f->n < 1) return -1;
    for (int i = 0; i < f->n; i++) {
        uint32_t a = f->layers[i].a_dim, g = f->layers[i].g_dim;
        f->A[i] = calloc((size_t)a * a, sizeof(float));
        f->G[i] = calloc((size_t)g * g, sizeof(float));
        if (!f->A[i] || !f->G[i]) abort();
        for (uint32_t k = 0; k < a; k++) f->A[i][(size_t)k * a + k] = 1.0f;
        for (uint32_t k = 0; k < g; k++) f->G[i][(size_t)k * g + k] = 1e-6f;
    }
    return 0;
}

static void factors_free(factors *f) {
    for (int i = 0; i < f->n; i++) free(f->A[i]), free(f->G[i]);
    memset(f, 0, sizeof *f);
}

/* The lease's dense update, with f's factors (as F16) unless f is NULL. */
static void post_update(const ctx *c, const char *name, const factors *f,
                        const compress_factor_layer *layers, long status, const char *code) {
    float *d = calloc(c->n_params, sizeof *d);
    if (!d) abort();
    for (size_t i = 0; i < c->n_params; i++) d[i] = 1e-4f * (float)(i % 5);
    compress_factors cf;
    compress_update_meta m;
    memset(&m, 0, sizeof m);
    snprintf(m.run, sizeof m.run, "%s", c->run);
    m.task = c->task, m.peer = c->peer, m.base_version = c->base_version;
    m.kind = COMPRESS_DENSE, m.num_samples = 64, m.local_steps = 1, m.loss = 5.0;
    if (f) {
        cf = (compress_factors){.layers = layers ? layers : f->layers,
                                .n = f->n,
                                .A = (const float *const *)f->A,
                                .G = (const float *const *)f->G,
                                .samples = 64,
                                .dtype = ST_F16};
        m.factors = &cf;
    }
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    vl_error e;
    if (compress_update_encode_dense(&m, d, c->n_params, ST_F32, &b, &e) != VL_OK) {
        fprintf(stderr, "attack: cannot build '%s': %s\n", name, e.msg);
        abort();
    }
    reply r;
    request(c, "POST", "/v1/updates", NULL, b.data, b.len, NULL, 0, NULL, c->peer, 0, &r);
    /* The first refusal for what an update holds ends the lease; the
     * later ones find it ended and change nothing. */
    static int leased = 1;
    if (status == 422 && leased) {
        expect_lease_ended(c, name, &r, status, code);
        leased = 0;
    } else {
        expect(name, &r, status, code);
    }
    vl_buf_free(&b);
    free(d);
}

void attack_kfac(ctx *c, const char *stage) {
    factors f;
    memset(&f, 0, sizeof f);
    if (valid_factors(c, &f) != 0) {
        record("learn the run's model from its model file", "a GPT configuration", "none", 0);
        return;
    }
    if (strcmp(stage, "finish") == 0) {
        post_update(c, "update with valid factors", &f, NULL, 202, NULL);
        factors_free(&f);
        return;
    }
    get(c, "factors before any merge", "/v1/factors", 404, "unknown_factors");
    get(c, "factors of version 99", "/v1/factors?version=99", 404, "unknown_factors");
    get(c, "factors with an unknown key", "/v1/factors?since=1", 400, "bad_request");
    post_update(c, "update without its factors", NULL, NULL, 422, "missing_factors");
    uint32_t a0 = f.layers[0].a_dim, g1 = f.layers[f.n - 1].g_dim;
    f.G[f.n - 1][g1 + 1] = NAN;
    post_update(c, "factors with a NaN", &f, NULL, 422, "bad_factors");
    f.G[f.n - 1][g1 + 1] = 0.0f;
    f.A[0][1] = 0.5f; /* (0, 1) but not (1, 0) */
    post_update(c, "factors that are not symmetric", &f, NULL, 422, "bad_factors");
    f.A[0][a0] = 2.0f; /* now both, beyond sqrt(1 * 1) */
    f.A[0][1] = 2.0f;
    post_update(c, "factors that are not PSD", &f, NULL, 422, "bad_factors");
    f.A[0][1] = f.A[0][a0] = 0.0f;
    f.A[0][(size_t)a0 * a0 - 1] = 3.0f;
    post_update(c, "A without its bias 1", &f, NULL, 422, "bad_factors");
    f.A[0][(size_t)a0 * a0 - 1] = 1.0f;
    /* Layers named for another model: a wider last layer, and one fewer. */
    compress_factor_layer wide[MAXL];
    memcpy(wide, f.layers, sizeof wide);
    wide[f.n - 1].g_dim = 1;
    post_update(c, "factors of another shape", &f, wide, 422, "bad_factors");
    f.n--;
    post_update(c, "factors of one layer too few", &f, NULL, 422, "bad_factors");
    f.n++;
    factors_free(&f);
}
