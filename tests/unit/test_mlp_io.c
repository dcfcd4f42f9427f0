/*
 * Unit tests for the MLP classifier as a run's model (model/mlp_io.h): the
 * configuration JSON both ways and what its parser refuses, the parameter
 * count without a model, checkpoint files through safetensors bit for bit
 * and the files a load must refuse without touching the model, and the
 * AdamW step over a tensor table against a plain double-precision
 * reference that decays the weights and not the biases. The same for a
 * model with a convolution front end: its JSON (exact bytes, round trip),
 * parameter count, tensor table (names, shapes, layer order) and
 * checkpoint files; test_mlp_conv.c has what its configuration refuses.
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

#include "mlp_fixtures.h"

/* Short for mlp_config_refused: the cases below are many. */
static void refused(const char *text, const char *needle) {
    mlp_config_refused(text, needle);
}

#include "common/common.h"
#include "model/mlp_io.h"
#include "model/model.h"
#include "test_util.h"

static int config_equal(const model_mlp_config *a, const model_mlp_config *b) {
    return model_mlp_config_equal(a, b);
}

/* A small odd one: image 2x5x3, conv 3 channels k3 s1 then 2 channels k2 s2. */
static const model_mlp_config SMALL_CNN = {.in_dim = 30,
                                           .n_hidden = 2,
                                           .hidden = {7, 3},
                                           .n_classes = 4,
                                           .n_conv = 2,
                                           .image = {2, 5, 3},
                                           .conv = {{3, 3, 1}, {2, 2, 2}}};

/* ---- configuration JSON -------------------------------------------------- */

static void test_config_json_round_trip(void **state) {
    (void)state;
    const model_mlp_config fashion = {
        .in_dim = 784, .n_hidden = 2, .hidden = {128, 64}, .n_classes = 10};
    char js[MODEL_MLP_JSON_MAX];
    OK(model_mlp_config_json(&fashion, js, sizeof js));
    /* The exact bytes matter: the coordinator stores this string with the
     * run and every model file carries it, so it must not drift. */
    assert_string_equal(js, "{\"kind\":\"mlp\",\"in_dim\":784,\"hidden\":[128,64],\"classes\":10}");
    assert_true(model_mlp_config_is_mlp(js, strlen(js)));

    const model_mlp_config cases[] = {
        fashion,
        {.in_dim = 1, .n_hidden = 1, .hidden = {1}, .n_classes = 2},
        {.in_dim = 5, .n_hidden = 3, .hidden = {7, 3, 9}, .n_classes = 4},
        {.in_dim = 3, .n_hidden = 4, .hidden = {2, 1, 5, 8}, .n_classes = 65536},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        OK(model_mlp_config_json(&cases[i], js, sizeof js));
        model_mlp_config back;
        memset(&back, 0x5a, sizeof back);
        OK(model_mlp_config_parse(js, strlen(js), &back, &e_));
        if (!config_equal(&back, &cases[i]))
            fail_msg("case %zu: %s did not parse back to the same configuration", i, js);
        /* Writing what was parsed gives the same string again. */
        char again[MODEL_MLP_JSON_MAX];
        OK(model_mlp_config_json(&back, again, sizeof again));
        assert_string_equal(again, js);
    }

    /* The widest object there is (every field at its bound) fits the room
     * the header promises, and a buffer too small is refused, not cut. */
    const model_mlp_config widest = {.in_dim = MODEL_MLP_MAX_WIDTH,
                                     .n_hidden = MODEL_MLP_MAX_HIDDEN,
                                     .hidden = {MODEL_MLP_MAX_WIDTH, MODEL_MLP_MAX_WIDTH,
                                                MODEL_MLP_MAX_WIDTH, MODEL_MLP_MAX_WIDTH},
                                     .n_classes = MODEL_MLP_MAX_WIDTH};
    OK(model_mlp_config_json(&widest, js, MODEL_MLP_JSON_MAX));
    char small[32];
    assert_int_equal(model_mlp_config_json(&fashion, small, sizeof small), VL_EINVAL);

    /* Whitespace and key order do not matter to the parser. */
    const char *loose = " { \"classes\" : 10 , \"hidden\" : [ 128 , 64 ] , \"in_dim\" : 784 ,"
                        " \"kind\" : \"mlp\" } ";
    model_mlp_config c;
    OK(model_mlp_config_parse(loose, strlen(loose), &c, &e_));
    assert_true(config_equal(&c, &fashion));
}


static void test_config_parse_refusals(void **state) {
    (void)state;
    refused("[1, 2]", "not a JSON object");
    refused("not json", "not a JSON object");
    refused("", "not a JSON object");
    refused("\"mlp\"", "not a JSON object");
    refused("{\"in_dim\":4,\"hidden\":[3],\"classes\":2}", "kind");
    refused("{\"kind\":\"gpt\",\"in_dim\":4,\"hidden\":[3],\"classes\":2}", "kind");
    refused("{\"kind\":\"MLP\",\"in_dim\":4,\"hidden\":[3],\"classes\":2}", "kind");
    refused("{\"kind\":1,\"in_dim\":4,\"hidden\":[3],\"classes\":2}", "kind");
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":[3],\"classes\":2,\"depth\":2}",
            "unknown key \"depth\"");
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":[],\"classes\":2}", "hidden");
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":[1,2,3,4,5],\"classes\":2}", "hidden");
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":3,\"classes\":2}", "hidden");
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"classes\":2}", "hidden");
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":[3,0],\"classes\":2}", "hidden");
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":[65537],\"classes\":2}", "hidden");
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":[\"3\"],\"classes\":2}", "hidden");
    refused("{\"kind\":\"mlp\",\"in_dim\":0,\"hidden\":[3],\"classes\":2}", "in_dim");
    refused("{\"kind\":\"mlp\",\"in_dim\":65537,\"hidden\":[3],\"classes\":2}", "in_dim");
    refused("{\"kind\":\"mlp\",\"in_dim\":4.0,\"hidden\":[3],\"classes\":2}", "in_dim");
    refused("{\"kind\":\"mlp\",\"hidden\":[3],\"classes\":2}", "in_dim");
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":[3],\"classes\":1}", "class");
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":[3],\"classes\":65537}", "classes");
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":[3]}", "classes");
    /* Every width in range but too many parameters in all. */
    refused("{\"kind\":\"mlp\",\"in_dim\":65536,\"hidden\":[65536],\"classes\":2}", "param");
    /* A repeated key could mean either value: refused, whichever comes
     * first. */
    refused("{\"kind\":\"mlp\",\"in_dim\":4,\"in_dim\":5,\"hidden\":[3],\"classes\":2}",
            "not a JSON object");
    refused("{\"kind\":\"mlp\",\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":[3],\"classes\":2}",
            "not a JSON object");

    /* The length counts, not a terminator: a cut-off object is refused. */
    const char *good = "{\"kind\":\"mlp\",\"in_dim\":4,\"hidden\":[3],\"classes\":2}";
    model_mlp_config c;
    vl_error e = {0};
    assert_int_equal(model_mlp_config_parse(good, strlen(good) - 1, &c, &e), VL_EINVAL);
    OK(model_mlp_config_parse(good, strlen(good), &c, &e_));
    assert_int_equal(model_mlp_config_parse(NULL, 0, &c, &e), VL_EINVAL);
}

static void test_config_is_mlp(void **state) {
    (void)state;
    static const char *const yes[] = {
        "{\"kind\":\"mlp\",\"in_dim\":784,\"hidden\":[128],\"classes\":10}",
        /* Only the kind decides; the parser checks the rest. */
        "{\"kind\":\"mlp\"}",
        "{\"classes\":0,\"kind\":\"mlp\"}",
    };
    static const char *const no[] = {
        "{\"vocab_size\":256,\"block_size\":64,\"n_layer\":2,\"n_head\":2,\"n_embd\":32}",
        "{\"kind\":\"gpt\",\"vocab_size\":256}",
        "{\"kind\":\"MLP\"}",
        "{\"kind\":[\"mlp\"]}",
        "[\"kind\",\"mlp\"]",
        "\"mlp\"",
        "{\"kind\":\"mlp\"",
        "mlp",
        "",
        "\x89PNG garbage \x01\x02",
    };
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        if (!model_mlp_config_is_mlp(yes[i], strlen(yes[i])))
            fail_msg("%s was not taken for an mlp configuration", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (model_mlp_config_is_mlp(no[i], strlen(no[i])))
            fail_msg("%s was taken for an mlp configuration", no[i]);
    assert_false(model_mlp_config_is_mlp(NULL, 0));
    /* The length bounds what is read. */
    assert_false(model_mlp_config_is_mlp(yes[1], strlen(yes[1]) - 1));
}

static void test_config_num_params(void **state) {
    (void)state;
    const model_mlp_config cases[] = {
        {.in_dim = 1, .n_hidden = 1, .hidden = {1}, .n_classes = 2},
        {.in_dim = 5, .n_hidden = 2, .hidden = {7, 3}, .n_classes = 4},
        {.in_dim = 784, .n_hidden = 1, .hidden = {128}, .n_classes = 10},
        {.in_dim = 784, .n_hidden = 2, .hidden = {256, 128}, .n_classes = 10},
        {.in_dim = 3, .n_hidden = 4, .hidden = {2, 9, 1, 6}, .n_classes = 11},
    };
    /* By hand: (784*128 + 128) + (128*10 + 10). */
    assert_int_equal(model_mlp_config_num_params(&cases[2]), 101770);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        model_mlp *m = mlp_make(cases[i], 1);
        assert_int_equal(model_mlp_config_num_params(&cases[i]), model_mlp_num_params(m));
        /* And the tensor table covers exactly that many floats. */
        const model_tensor *t;
        int nt = model_mlp_tensors(m, &t);
        size_t sum = 0;
        for (int k = 0; k < nt; k++) sum += t[k].numel;
        assert_int_equal(sum, model_mlp_num_params(m));
        model_mlp_free(m);
    }
}

/* ---- checkpoint files --------------------------------------------------- */

static const model_mlp_config SMALL = {
    .in_dim = 5, .n_hidden = 2, .hidden = {7, 3}, .n_classes = 4};

/* Random values everywhere, biases too, so a tensor loaded into the
 * wrong place or not at all shows. */
static void randomise(model_mlp *m, uint64_t seed) {
    vl_rng r;
    vl_rng_seed(&r, seed);
    float *p = model_mlp_params(m);
    for (size_t i = 0; i < model_mlp_num_params(m); i++) p[i] = vl_rng_normal(&r);
}

static void test_safetensors_round_trip(void **state) {
    (void)state;
    const model_mlp_config cfgs[] = {
        SMALL, {.in_dim = 784, .n_hidden = 1, .hidden = {64}, .n_classes = 10}};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        model_mlp *a = mlp_make(cfgs[c], 3);
        randomise(a, 11 + c);
        /* A value float16 could not hold exactly: the file must be F32. */
        model_mlp_params(a)[0] = 1.0f + 0x1p-20f;
        st_writer w;
        st_writer_init(&w);
        OK(model_mlp_write_safetensors(a, &w));
        vl_buf b;
        vl_buf_init(&b, 0);
        OK(st_writer_finish(&w, &b, &e_));
        st_writer_free(&w);

        st_file f;
        OK(st_parse(b.data, b.len, &f, &e_));
        assert_int_equal(f.ntensors, 2 * (cfgs[c].n_hidden + 1));
        for (int i = 0; i < f.ntensors; i++) assert_int_equal(f.tensors[i].dtype, ST_F32);
        const st_tensor *w0 = st_find(&f, "fc.0.weight");
        assert_non_null(w0);
        assert_int_equal(w0->ndim, 2);
        assert_int_equal(w0->shape[0], (uint64_t)cfgs[c].in_dim);
        assert_int_equal(w0->shape[1], (uint64_t)cfgs[c].hidden[0]);
        char last[32];
        snprintf(last, sizeof last, "fc.%d.bias", cfgs[c].n_hidden);
        const st_tensor *bl = st_find(&f, last);
        assert_non_null(bl);
        assert_int_equal(bl->ndim, 1);
        assert_int_equal(bl->shape[0], (uint64_t)cfgs[c].n_classes);

        /* The metadata describes the model well enough to make another. */
        const char *js = st_meta_get(&f, "model");
        assert_non_null(js);
        assert_true(model_mlp_config_is_mlp(js, strlen(js)));
        model_mlp_config back;
        OK(model_mlp_config_parse(js, strlen(js), &back, &e_));
        assert_true(config_equal(&back, &cfgs[c]));

        model_mlp *fresh = mlp_make(back, 99);
        OK(model_mlp_load_safetensors(fresh, &f, &e_));
        assert_memory_equal(model_mlp_params(fresh), model_mlp_params(a),
                            model_mlp_num_params(a) * sizeof(float));
        st_free(&f);
        vl_buf_free(&b);
        model_mlp_free(fresh);
        model_mlp_free(a);
    }
}

/* How a hand-made file departs from a good one. */
typedef struct file_fault {
    const char *drop;   /* tensor left out */
    const char *extra;  /* tensor added, of 3 floats */
    const char *swap;   /* 2-D tensor written with its shape transposed */
    const char *as_i32; /* tensor written with dtype I32 (same byte count) */
    const char *as_f16; /* tensor written as float16 */
    int nan_at;         /* parameter index made NaN, -1 for none */
    int inf_at;         /* parameter index made +Inf, -1 for none */
} file_fault;

/* Writes m's tensors into b the way model_mlp_write_safetensors would, with
 * the fault f. */
static void write_faulty(model_mlp *m, const file_fault *f, vl_buf *b) {
    const model_tensor *t;
    int nt = model_mlp_tensors(m, &t);
    size_t n = model_mlp_num_params(m);
    float *p = malloc(n * sizeof *p);
    uint16_t *half = malloc(n * sizeof *half);
    assert_non_null(p);
    assert_non_null(half);
    memcpy(p, model_mlp_params(m), n * sizeof *p);
    if (f->nan_at >= 0) p[f->nan_at] = NAN;
    if (f->inf_at >= 0) p[f->inf_at] = INFINITY;
    for (size_t i = 0; i < n; i++) half[i] = vl_f32_to_f16(p[i]);
    static const float three[3] = {1, 2, 3};
    st_writer w;
    st_writer_init(&w);
    for (int i = 0; i < nt; i++) {
        if (f->drop && strcmp(t[i].name, f->drop) == 0) continue;
        uint64_t shape[MODEL_TENSOR_MAX_DIMS];
        for (int d = 0; d < t[i].ndim; d++) shape[d] = t[i].shape[d];
        if (f->swap && strcmp(t[i].name, f->swap) == 0) {
            uint64_t s = shape[0];
            shape[0] = shape[1];
            shape[1] = s;
        }
        st_dtype dt = ST_F32;
        const void *data = p + t[i].offset;
        size_t nbytes = t[i].numel * sizeof(float);
        if (f->as_i32 && strcmp(t[i].name, f->as_i32) == 0) dt = ST_I32;
        if (f->as_f16 && strcmp(t[i].name, f->as_f16) == 0) {
            dt = ST_F16;
            data = half + t[i].offset;
            nbytes = t[i].numel * sizeof(uint16_t);
        }
        if (st_writer_add(&w, t[i].name, dt, t[i].ndim, shape, data, nbytes) != 0)
            fail_msg("st_writer_add %s", t[i].name);
    }
    if (f->extra) {
        const uint64_t shape[1] = {3};
        if (st_writer_add(&w, f->extra, ST_F32, 1, shape, three, sizeof three) != 0)
            fail_msg("st_writer_add %s", f->extra);
    }
    OK(st_writer_finish(&w, b, &e_));
    st_writer_free(&w);
    free(half);
    free(p);
}

/* Loads a faulty file into a model holding other values: the load must
 * fail with want, name needle, and change nothing. */
static void load_refused(const file_fault *f, int want, const char *needle) {
    model_mlp *src = mlp_make(SMALL, 1), *dst = mlp_make(SMALL, 2);
    randomise(src, 5);
    randomise(dst, 6);
    size_t n = model_mlp_num_params(dst);
    float *before = malloc(n * sizeof *before);
    assert_non_null(before);
    memcpy(before, model_mlp_params(dst), n * sizeof *before);
    vl_buf b;
    vl_buf_init(&b, 0);
    write_faulty(src, f, &b);
    st_file sf;
    OK(st_parse(b.data, b.len, &sf, &e_));
    vl_error e = {0};
    int rc = model_mlp_load_safetensors(dst, &sf, &e);
    if (rc != want) fail_msg("load gave %d (%s), wanted %d", rc, e.msg, want);
    if (!strstr(e.msg, needle)) fail_msg("message '%s' lacks '%s'", e.msg, needle);
    assert_memory_equal(model_mlp_params(dst), before, n * sizeof *before);
    st_free(&sf);
    vl_buf_free(&b);
    free(before);
    model_mlp_free(src);
    model_mlp_free(dst);
}

static void test_load_refusals(void **state) {
    (void)state;
    const file_fault none = {.nan_at = -1, .inf_at = -1};
    file_fault f;

    f = none;
    f.swap = "fc.1.weight";
    load_refused(&f, VL_EINVAL, "fc.1.weight has shape [3,7], expected [7,3]");
    f = none;
    f.drop = "fc.2.bias";
    load_refused(&f, VL_ENOTFOUND, "fc.2.bias is missing");
    f = none;
    f.drop = "fc.0.weight";
    load_refused(&f, VL_ENOTFOUND, "fc.0.weight is missing");
    f = none;
    f.extra = "fc.3.bias";
    load_refused(&f, VL_EINVAL, "unexpected tensor fc.3.bias");
    f = none;
    f.as_i32 = "fc.1.bias";
    load_refused(&f, VL_EINVAL, "dtype I32");
    /* The bad value sits in the last tensor, after every other has been
     * converted: still nothing may change. */
    f = none;
    f.nan_at = (int)model_mlp_config_num_params(&SMALL) - 1;
    load_refused(&f, VL_ERANGE, "NaN");
    f = none;
    f.inf_at = 0;
    load_refused(&f, VL_ERANGE, "infinite");

    /* A file for a different configuration: its first tensor's shape
     * already differs. */
    model_mlp_config other = SMALL;
    other.hidden[0] = 8;
    model_mlp *src = mlp_make(other, 1), *dst = mlp_make(SMALL, 2);
    vl_buf b;
    vl_buf_init(&b, 0);
    write_faulty(src, &none, &b);
    st_file sf;
    OK(st_parse(b.data, b.len, &sf, &e_));
    vl_error e = {0};
    assert_int_equal(model_mlp_load_safetensors(dst, &sf, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "mlp checkpoint"));
    assert_int_equal(model_mlp_load_safetensors(dst, NULL, &e), VL_EINVAL);
    st_free(&sf);
    vl_buf_free(&b);
    model_mlp_free(src);
    model_mlp_free(dst);
}

/* float16 tensors are accepted, widened exactly. */
static void test_load_f16(void **state) {
    (void)state;
    model_mlp *src = mlp_make(SMALL, 1), *dst = mlp_make(SMALL, 2);
    randomise(src, 8);
    file_fault f = {.as_f16 = "fc.0.weight", .nan_at = -1, .inf_at = -1};
    vl_buf b;
    vl_buf_init(&b, 0);
    write_faulty(src, &f, &b);
    st_file sf;
    OK(st_parse(b.data, b.len, &sf, &e_));
    OK(model_mlp_load_safetensors(dst, &sf, &e_));
    const model_tensor *t;
    int nt = model_mlp_tensors(src, &t);
    const float *a = model_mlp_params(src), *d = model_mlp_params(dst);
    for (int i = 0; i < nt; i++)
        for (size_t k = t[i].offset; k < t[i].offset + t[i].numel; k++) {
            float want = i == 0 ? vl_f16_to_f32(vl_f32_to_f16(a[k])) : a[k];
            if (memcmp(&d[k], &want, sizeof want) != 0)
                fail_msg("%s element %zu: %.9g, wanted %.9g", t[i].name, k - t[i].offset, d[k],
                         want);
        }
    st_free(&sf);
    vl_buf_free(&b);
    model_mlp_free(src);
    model_mlp_free(dst);
}

/* ---- AdamW over a tensor table ------------------------------------------- */

static void test_adamw_matches_reference(void **state) {
    (void)state;
    model_mlp *m = mlp_make(SMALL, 4);
    randomise(m, 21);
    const model_tensor *t;
    int nt = model_mlp_tensors(m, &t);
    size_t n = model_mlp_num_params(m);
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    model_adamw opt;
    OK(model_adamw_init(&opt, n, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, &e_));

    /* Which parameters are decayed: the 2-D weights, never the biases. */
    uint8_t *decay = calloc(n, 1);
    double *p = malloc(n * sizeof *p), *mm = calloc(n, sizeof *mm), *vv = calloc(n, sizeof *vv);
    float *g = malloc(n * sizeof *g);
    assert_non_null(decay);
    assert_non_null(p);
    assert_non_null(mm);
    assert_non_null(vv);
    assert_non_null(g);
    size_t n_decayed = 0;
    for (int i = 0; i < nt; i++) {
        assert_true(t[i].ndim == 1 || t[i].ndim == 2);
        for (size_t k = 0; k < t[i].numel; k++) decay[t[i].offset + k] = t[i].ndim == 2;
        n_decayed += t[i].ndim == 2 ? t[i].numel : 0;
    }
    assert_true(n_decayed > 0 && n_decayed < n);
    /* Parameters under 2 in size keep float's rounding of each step well
     * below the tolerance. */
    float *params = model_mlp_params(m);
    for (size_t i = 0; i < n; i++) {
        params[i] *= 0.5f;
        p[i] = params[i];
    }

    vl_rng r;
    vl_rng_seed(&r, 77);
    for (int step = 1; step <= 3; step++) {
        for (size_t i = 0; i < n; i++) g[i] = 0.5f * vl_rng_normal(&r);
        OK(model_adamw_step_tensors(&opt, t, nt, n, params, g, &e_));
        assert_int_equal(opt.step, step);
        double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
        for (size_t i = 0; i < n; i++) {
            mm[i] = b1 * mm[i] + (1 - b1) * g[i];
            vv[i] = b2 * vv[i] + (1 - b2) * (double)g[i] * g[i];
            double upd = (mm[i] / bc1) / (sqrt(vv[i] / bc2) + eps);
            p[i] = p[i] - lr * upd - (decay[i] ? lr * wd * p[i] : 0);
        }
        for (size_t i = 0; i < n; i++)
            if (!(fabs(params[i] - p[i]) <= 1e-6))
                fail_msg("step %d, parameter %zu: %.9g, reference %.9g", step, i, params[i], p[i]);
    }

    /* With zero gradients the moments decay towards zero but stay, so the
     * step still moves; the pure decay shows with fresh moments: weights
     * shrink by exactly lr*wd of themselves and biases stay put. */
    model_adamw_reset(&opt);
    assert_int_equal(opt.step, 0);
    memset(g, 0, n * sizeof *g);
    float *keep = malloc(n * sizeof *keep);
    assert_non_null(keep);
    memcpy(keep, params, n * sizeof *keep);
    OK(model_adamw_step_tensors(&opt, t, nt, n, params, g, &e_));
    for (size_t i = 0; i < n; i++) {
        if (decay[i]) {
            float want = keep[i] - (float)lr * (float)wd * keep[i];
            assert_float_equal(params[i], want, 1e-6);
            assert_true(keep[i] == 0 || params[i] != keep[i]);
        } else {
            assert_memory_equal(&params[i], &keep[i], sizeof(float));
        }
    }
    free(keep);
    free(decay);
    free(p);
    free(mm);
    free(vv);
    free(g);
    model_adamw_free(&opt);
    model_mlp_free(m);
}

static void test_adamw_refusals(void **state) {
    (void)state;
    model_mlp *m = mlp_make(SMALL, 4);
    const model_tensor *t;
    int nt = model_mlp_tensors(m, &t);
    size_t n = model_mlp_num_params(m);
    float *g = calloc(n, sizeof *g), *keep = malloc(n * sizeof *keep);
    assert_non_null(g);
    assert_non_null(keep);
    memcpy(keep, model_mlp_params(m), n * sizeof *keep);
    vl_error e = {0};

    model_adamw empty;
    memset(&empty, 0, sizeof empty);
    assert_int_equal(model_adamw_step_tensors(&empty, t, nt, n, model_mlp_params(m), g, &e),
                     VL_EINVAL);
    assert_non_null(strstr(e.msg, "not initialised"));
    assert_int_equal(model_adamw_step_tensors(NULL, t, nt, n, model_mlp_params(m), g, &e),
                     VL_EINVAL);

    /* State sized for another model. */
    model_adamw opt;
    OK(model_adamw_init(&opt, n + 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, &e_));
    assert_int_equal(model_adamw_step_tensors(&opt, t, nt, n, model_mlp_params(m), g, &e),
                     VL_EINVAL);
    assert_non_null(strstr(e.msg, "parameters"));
    assert_int_equal(opt.step, 0);
    model_adamw_free(&opt);

    /* A table that reaches past the vector it claims to describe. */
    OK(model_adamw_init(&opt, n - 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, &e_));
    assert_int_equal(model_adamw_step_tensors(&opt, t, nt, n - 1, model_mlp_params(m), g, &e),
                     VL_EINVAL);
    assert_non_null(strstr(e.msg, "outside"));
    assert_int_equal(opt.step, 0);
    model_adamw_free(&opt);
    assert_memory_equal(model_mlp_params(m), keep, n * sizeof *keep);
    free(g);
    free(keep);
    model_mlp_free(m);
}

/* ---- the convolution front end --------------------------------------------- */

static void test_conv_config_json(void **state) {
    (void)state;
    char js[MODEL_MLP_JSON_MAX];
    OK(model_mlp_config_json(&FASHION_CNN, js, sizeof js));
    assert_string_equal(js, "{\"kind\":\"mlp\",\"in_dim\":784,\"image\":[1,28,28],\"conv\":["
                            "{\"channels\":16,\"kernel\":5,\"stride\":2},"
                            "{\"channels\":32,\"kernel\":5,\"stride\":2}],"
                            "\"hidden\":[128],\"classes\":10}");
    assert_true(model_mlp_config_is_mlp(js, strlen(js)));

    const model_mlp_config cases[] = {
        FASHION_CNN,
        SMALL_CNN,
        {.in_dim = 1,
         .n_hidden = 1,
         .hidden = {1},
         .n_classes = 2,
         .n_conv = 1,
         .image = {1, 1, 1},
         .conv = {{1, 1, 1}}},
        {.in_dim = 3 * 8 * 8,
         .n_hidden = 4,
         .hidden = {5, 4, 3, 2},
         .n_classes = 3,
         .n_conv = 4,
         .image = {3, 8, 8},
         .conv = {{4, 3, 1}, {5, 4, 2}, {6, 15, 8}, {2, 1, 1}}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        OK(model_mlp_config_validate(&cases[i], &e_));
        OK(model_mlp_config_json(&cases[i], js, sizeof js));
        model_mlp_config back;
        memset(&back, 0x5a, sizeof back);
        OK(model_mlp_config_parse(js, strlen(js), &back, &e_));
        if (!config_equal(&back, &cases[i]))
            fail_msg("case %zu: %s did not parse back to the same configuration", i, js);
        char again[MODEL_MLP_JSON_MAX];
        OK(model_mlp_config_json(&back, again, sizeof again));
        assert_string_equal(again, js);
    }

    /* The brief's own text: any spacing, and a left-out stride is 1. */
    const char *loose = "{\"kind\": \"mlp\", \"in_dim\": 784, \"image\": [1, 28, 28], \"conv\": "
                        "[{\"channels\": 16, \"kernel\": 5, \"stride\": 2}, {\"kernel\": 5, "
                        "\"channels\": 32, \"stride\": 2}], \"hidden\": [128], \"classes\": 10}";
    model_mlp_config c;
    OK(model_mlp_config_parse(loose, strlen(loose), &c, &e_));
    assert_true(config_equal(&c, &FASHION_CNN));
    const char *unstrided = "{\"kind\":\"mlp\",\"in_dim\":30,\"image\":[2,5,3],\"conv\":["
                            "{\"channels\":3,\"kernel\":3},{\"channels\":2,\"kernel\":2,"
                            "\"stride\":2}],\"hidden\":[7,3],\"classes\":4}";
    OK(model_mlp_config_parse(unstrided, strlen(unstrided), &c, &e_));
    assert_true(config_equal(&c, &SMALL_CNN));
    assert_int_equal(c.conv[0].stride, 1);

    /* Every field at its bound still fits the promised room. */
    model_mlp_config widest = {
        .in_dim = MODEL_MLP_MAX_WIDTH,
        .n_hidden = MODEL_MLP_MAX_HIDDEN,
        .n_classes = MODEL_MLP_MAX_WIDTH,
        .n_conv = MODEL_MLP_MAX_CONV,
        .image = {MODEL_MLP_MAX_WIDTH, MODEL_MLP_MAX_WIDTH, MODEL_MLP_MAX_WIDTH}};
    for (int i = 0; i < MODEL_MLP_MAX_HIDDEN; i++) widest.hidden[i] = MODEL_MLP_MAX_WIDTH;
    for (int i = 0; i < MODEL_MLP_MAX_CONV; i++)
        widest.conv[i] =
            (model_mlp_conv){MODEL_MLP_MAX_WIDTH, MODEL_MLP_MAX_KERNEL, MODEL_MLP_MAX_STRIDE};
    OK(model_mlp_config_json(&widest, js, MODEL_MLP_JSON_MAX));
    /* And a buffer one byte short of the text is refused, not cut. */
    OK(model_mlp_config_json(&FASHION_CNN, js, sizeof js));
    assert_int_equal(model_mlp_config_json(&FASHION_CNN, js, strlen(js)), VL_EINVAL);
}

static void test_conv_tensors(void **state) {
    (void)state;
    /* By hand: conv 16*1*25 + 16, conv 32*16*25 + 32; 28 -> 14 -> 7, so the
     * dense input is 32*7*7 = 1568: 1568*128 + 128, then 128*10 + 10. */
    assert_int_equal(model_mlp_config_num_params(&FASHION_CNN), 416 + 12832 + 200832 + 1290);
    static const struct {
        const char *name;
        size_t d0, d1; /* d1 0 for a bias */
    } want[] = {{"conv.0.weight", 16, 25}, {"conv.0.bias", 16, 0},     {"conv.1.weight", 32, 400},
                {"conv.1.bias", 32, 0},    {"fc.0.weight", 1568, 128}, {"fc.0.bias", 128, 0},
                {"fc.1.weight", 128, 10},  {"fc.1.bias", 10, 0}};
    model_mlp *m = mlp_make(FASHION_CNN, 1);
    const model_tensor *t;
    int nt = model_mlp_tensors(m, &t);
    assert_int_equal(nt, 8);
    size_t off = 0;
    for (int i = 0; i < nt; i++) {
        assert_string_equal(t[i].name, want[i].name);
        assert_int_equal(t[i].ndim, want[i].d1 ? 2 : 1);
        assert_int_equal(t[i].shape[0], want[i].d0);
        if (want[i].d1) assert_int_equal(t[i].shape[1], want[i].d1);
        assert_int_equal(t[i].offset, off); /* in layer order, back to back */
        off += t[i].numel;
    }
    assert_int_equal(off, model_mlp_num_params(m));
    assert_int_equal(off, model_mlp_config_num_params(&FASHION_CNN));
    model_mlp_free(m);
    m = mlp_make(SMALL_CNN, 1);
    assert_int_equal(model_mlp_num_params(m), model_mlp_config_num_params(&SMALL_CNN));
    model_mlp_free(m);
}

static void test_conv_safetensors_round_trip(void **state) {
    (void)state;
    model_mlp *a = mlp_make(SMALL_CNN, 3);
    randomise(a, 17);
    st_writer w;
    st_writer_init(&w);
    OK(model_mlp_write_safetensors(a, &w));
    vl_buf b;
    vl_buf_init(&b, 0);
    OK(st_writer_finish(&w, &b, &e_));
    st_writer_free(&w);
    st_file f;
    OK(st_parse(b.data, b.len, &f, &e_));
    assert_int_equal(f.ntensors, 2 * model_mlp_config_num_layers(&SMALL_CNN));
    const st_tensor *c1 = st_find(&f, "conv.1.weight");
    assert_non_null(c1);
    assert_int_equal(c1->shape[0], 2);
    assert_int_equal(c1->shape[1], 3 * 2 * 2);
    const st_tensor *f0 = st_find(&f, "fc.0.weight");
    assert_non_null(f0);
    /* 5x3 under kernel 3 stride 1 stays 5x3; under kernel 2 stride 2
     * becomes 3x2: 2 channels of 3x2 = 12 inputs. */
    assert_int_equal(f0->shape[0], 12);
    assert_int_equal(f0->shape[1], 7);
    const char *js = st_meta_get(&f, "model");
    assert_non_null(js);
    model_mlp_config back;
    OK(model_mlp_config_parse(js, strlen(js), &back, &e_));
    assert_true(config_equal(&back, &SMALL_CNN));
    model_mlp *fresh = mlp_make(back, 99);
    OK(model_mlp_load_safetensors(fresh, &f, &e_));
    assert_memory_equal(model_mlp_params(fresh), model_mlp_params(a),
                        model_mlp_num_params(a) * sizeof(float));
    /* A plain MLP's model cannot take the CNN's file. */
    model_mlp *plain = mlp_make(SMALL, 1);
    vl_error e = {0};
    assert_int_not_equal(model_mlp_load_safetensors(plain, &f, &e), 0);
    st_free(&f);
    vl_buf_free(&b);
    model_mlp_free(plain);
    model_mlp_free(fresh);
    model_mlp_free(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_json_round_trip),
        cmocka_unit_test(test_config_parse_refusals),
        cmocka_unit_test(test_config_is_mlp),
        cmocka_unit_test(test_config_num_params),
        cmocka_unit_test(test_safetensors_round_trip),
        cmocka_unit_test(test_load_refusals),
        cmocka_unit_test(test_load_f16),
        cmocka_unit_test(test_adamw_matches_reference),
        cmocka_unit_test(test_adamw_refusals),
        cmocka_unit_test(test_conv_config_json),
        cmocka_unit_test(test_conv_tensors),
        cmocka_unit_test(test_conv_safetensors_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
