/*
 * GPT checkpoints: safetensors round trip (F32 and F16), configuration
 * metadata, and rejection of missing, extra, misshapen, mistyped and
 * non-finite tensors without touching the model.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/common.h"
#include "model/model.h"

#include "tests/unit/test_util.h"

static const model_gpt_config CFG = {
    .vocab_size = 256, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};

static model_gpt *make(uint64_t seed) {
    model_gpt *m = NULL;
    OK(model_gpt_create(&CFG, &m, &e_));
    model_gpt_init_weights(m, seed);
    return m;
}

/* Serialises m (optionally with config metadata) into out. */
static void save(const model_gpt *m, int with_meta, vl_buf *out) {
    st_writer w;
    st_writer_init(&w);
    vl_buf_init(out, VL_BUF_DEFAULT_CAP);
    assert_int_equal(model_gpt_write_safetensors(m, &w), 0);
    if (with_meta) assert_int_equal(model_gpt_write_config_meta(m, &w), 0);
    OK(st_writer_finish(&w, out, &e_));
    st_writer_free(&w);
}

static void test_round_trip(void **state) {
    (void)state;
    model_gpt *a = make(1), *b = make(2);
    size_t n = model_gpt_num_params(a);
    vl_buf file;
    save(a, 1, &file);
    st_file f;
    OK(st_parse(file.data, file.len, &f, &e_));
    assert_int_equal(f.ntensors, 4 + 12 * CFG.n_layer);
    const st_tensor *t = st_find(&f, "h.1.mlp.c_fc.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 16);
    assert_int_equal(t->shape[1], 64);
    assert_string_equal(st_meta_get(&f, "format"), "pt");
    model_gpt_config c;
    OK(model_gpt_config_from_safetensors(&f, &c, &e_));
    assert_memory_equal(&c, &CFG, sizeof c);
    assert_memory_not_equal(model_gpt_params(a), model_gpt_params(b), n * sizeof(float));
    OK(model_gpt_load_safetensors(b, &f, &e_));
    assert_memory_equal(model_gpt_params(a), model_gpt_params(b), n * sizeof(float));
    /* A loaded model computes exactly what the original does. */
    int in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tg[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    float la, lb;
    OK(model_gpt_forward(a, in, tg, 1, 8, &la, &e_));
    OK(model_gpt_forward(b, in, tg, 1, 8, &lb, &e_));
    assert_memory_equal(&la, &lb, sizeof la);
    st_free(&f);
    vl_buf_free(&file);
    /* Without metadata the configuration cannot be recovered. */
    save(a, 0, &file);
    OK(st_parse(file.data, file.len, &f, &e_));
    vl_error err = {0};
    assert_int_equal(model_gpt_config_from_safetensors(&f, &c, &err), VL_ENOTFOUND);
    st_free(&f);
    vl_buf_free(&file);
    model_gpt_free(a);
    model_gpt_free(b);
}

/* Builds a file from the model's tensors with one tensor altered:
 * mode 0 drop it, 1 change its shape, 2 put a NaN in it, 3 add an extra
 * tensor, 4 store it as I32, 5 store everything as F16. */
static void save_altered(model_gpt *m, const char *victim, int mode, vl_buf *out, float *scratch) {
    const model_tensor *t;
    int nt = model_gpt_tensors(m, &t);
    const float *p = model_gpt_params(m);
    st_writer w;
    st_writer_init(&w);
    uint16_t *half = NULL;
    if (mode == 5) {
        half = malloc(model_gpt_num_params(m) * sizeof(uint16_t));
        assert_non_null(half);
        for (size_t i = 0; i < model_gpt_num_params(m); i++) half[i] = vl_f32_to_f16(p[i]);
    }
    for (int i = 0; i < nt; i++) {
        uint64_t shape[2] = {t[i].shape[0], t[i].shape[1]};
        int hit = strcmp(t[i].name, victim) == 0;
        const void *data = p + t[i].offset;
        size_t nbytes = t[i].numel * sizeof(float);
        st_dtype dt = ST_F32;
        if (hit && mode == 0) continue;
        if (hit && mode == 1) {
            shape[0] = t[i].shape[1]; /* transposed: same size, wrong shape */
            shape[1] = t[i].shape[0];
        }
        if (hit && mode == 2) {
            memcpy(scratch, data, nbytes);
            scratch[t[i].numel / 2] = NAN;
            data = scratch;
        }
        if (hit && mode == 4) dt = ST_I32;
        if (mode == 5) {
            dt = ST_F16;
            data = half + t[i].offset;
            nbytes = t[i].numel * sizeof(uint16_t);
        }
        assert_int_equal(st_writer_add(&w, t[i].name, dt, t[i].ndim, shape, data, nbytes), 0);
    }
    static const float one = 1.0f; /* must outlive st_writer_finish */
    if (mode == 3) {
        uint64_t shape[1] = {1};
        assert_int_equal(st_writer_add(&w, "h.0.attn.bias", ST_F32, 1, shape, &one, 4), 0);
    }
    vl_buf_init(out, VL_BUF_DEFAULT_CAP);
    OK(st_writer_finish(&w, out, &e_));
    st_writer_free(&w);
    free(half);
}

static void test_rejects_bad_checkpoints(void **state) {
    (void)state;
    model_gpt *src = make(5), *dst = make(6);
    size_t n = model_gpt_num_params(dst);
    float *before = malloc(n * sizeof(float)), *scratch = malloc(n * sizeof(float));
    assert_non_null(before);
    assert_non_null(scratch);
    memcpy(before, model_gpt_params(dst), n * sizeof(float));
    const struct {
        const char *victim;
        int mode, code;
        const char *needle;
    } cases[] = {
        {"h.1.attn.c_proj.bias", 0, VL_ENOTFOUND, "h.1.attn.c_proj.bias is missing"},
        {"h.0.attn.c_attn.weight", 1, VL_EINVAL, "shape [48,16], expected [16,48]"},
        {"ln_f.weight", 2, VL_ERANGE, "NaN"},
        {"h.1.mlp.c_fc.weight", 2, VL_ERANGE, "h.1.mlp.c_fc.weight"},
        {"", 3, VL_EINVAL, "unexpected tensor h.0.attn.bias"},
        {"wpe.weight", 4, VL_EINVAL, "dtype I32"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        vl_buf file;
        save_altered(src, cases[k].victim, cases[k].mode, &file, scratch);
        st_file f;
        OK(st_parse(file.data, file.len, &f, &e_));
        vl_error err = {0};
        int rc = model_gpt_load_safetensors(dst, &f, &err);
        if (rc != cases[k].code || strstr(err.msg, cases[k].needle) == NULL)
            fail_msg("case %zu: rc %d (want %d), message \"%s\" (want \"%s\")", k, rc,
                     cases[k].code, err.msg, cases[k].needle);
        /* Unchanged on failure. */
        assert_memory_equal(model_gpt_params(dst), before, n * sizeof(float));
        st_free(&f);
        vl_buf_free(&file);
    }
    vl_error err = {0};
    assert_int_equal(model_gpt_load_safetensors(dst, NULL, &err), VL_EINVAL);
    free(before);
    free(scratch);
    model_gpt_free(src);
    model_gpt_free(dst);
}

static void test_load_f16(void **state) {
    (void)state;
    model_gpt *src = make(7), *dst = make(8);
    vl_buf file;
    save_altered(src, "", 5, &file, NULL);
    st_file f;
    OK(st_parse(file.data, file.len, &f, &e_));
    OK(model_gpt_load_safetensors(dst, &f, &e_));
    const float *a = model_gpt_params(src), *b = model_gpt_params(dst);
    for (size_t i = 0; i < model_gpt_num_params(src); i++)
        assert_true(b[i] == vl_f16_to_f32(vl_f32_to_f16(a[i])));
    st_free(&f);
    vl_buf_free(&file);
    model_gpt_free(src);
    model_gpt_free(dst);
}

static void test_shape_mismatch_between_configs(void **state) {
    (void)state;
    /* A checkpoint of a wider model does not load into a narrower one. */
    model_gpt_config wide = CFG;
    wide.n_embd = 32;
    model_gpt *w = NULL;
    OK(model_gpt_create(&wide, &w, &e_));
    model_gpt_init_weights(w, 1);
    model_gpt *m = make(1);
    vl_buf file;
    save(w, 0, &file);
    st_file f;
    OK(st_parse(file.data, file.len, &f, &e_));
    vl_error err = {0};
    assert_int_equal(model_gpt_load_safetensors(m, &f, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "wte.weight"));
    st_free(&f);
    vl_buf_free(&file);
    model_gpt_free(w);
    model_gpt_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_rejects_bad_checkpoints),
        cmocka_unit_test(test_load_f16),
        cmocka_unit_test(test_shape_mismatch_between_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
