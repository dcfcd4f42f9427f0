/* What a peer takes from the coordinator besides its leases' JSON: model
 * files and deltas (accepted, or refused with the held model and version
 * exactly as they were), the join reply, and a task for another run. */
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

/* A model file as the coordinator serves it, with the configuration JSON
 * it claims. */
static void model_file_cfg(peer_trainer *src, const char *run, const char *version, const char *cfg,
                           vl_buf *out) {
    st_writer w;
    st_writer_init(&w);
    assert_int_equal(st_writer_meta(&w, "run", run), VL_OK);
    assert_int_equal(st_writer_meta(&w, "version", version), VL_OK);
    assert_int_equal(st_writer_meta(&w, "model", cfg), VL_OK);
    assert_int_equal(model_gpt_write_safetensors(src->gpt, &w), VL_OK);
    vl_error e = {0};
    assert_int_equal(st_writer_finish(&w, out, &e), VL_OK);
    st_writer_free(&w);
}

/* The same with src's own configuration. */
static void model_file(peer_trainer *src, const char *run, const char *version, vl_buf *out) {
    char cfg[200];
    snprintf(cfg, sizeof cfg,
             "{\"vocab_size\":%d,\"block_size\":%d,\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d}",
             src->cfg.vocab_size, src->cfg.block_size, src->cfg.n_layer, src->cfg.n_head,
             src->cfg.n_embd);
    model_file_cfg(src, run, version, cfg, out);
}

/* The hex SHA-256 of base (np floats) with val written at idx: the
 * digest of the version a delta leads to. */
static void digest_after(const float *base, size_t np, const uint32_t *idx, const float *val,
                         size_t n, char hex[65]) {
    float *v = malloc(np * sizeof *v);
    assert_non_null(v);
    memcpy(v, base, np * sizeof *v);
    for (size_t j = 0; j < n; j++) v[idx[j]] = val[j];
    vcrypto_digest *d = vcrypto_digest_new(VCRYPTO_DIGEST_SHA256);
    assert_non_null(d);
    vcrypto_digest_update(d, v, np * sizeof *v);
    uint8_t md[VCRYPTO_DIGEST_MAX];
    assert_int_equal(vcrypto_digest_final(d, md), 32);
    vcrypto_digest_free(d);
    vl_hex_encode(md, 32, hex);
    free(v);
}

/* Writes a delta file by hand; sha NULL leaves the digest out. */
static void delta_file(vl_buf *out, const char *run, const char *since, const char *version,
                       const uint32_t *idx, const float *val, size_t n, const char *sha) {
    st_writer w;
    st_writer_init(&w);
    uint64_t shape[1] = {n};
    assert_int_equal(st_writer_meta(&w, "run", run), VL_OK);
    assert_int_equal(st_writer_meta(&w, "since", since), VL_OK);
    assert_int_equal(st_writer_meta(&w, "version", version), VL_OK);
    if (sha) assert_int_equal(st_writer_meta(&w, "sha256", sha), VL_OK);
    assert_int_equal(st_writer_add(&w, "indices", ST_U32, 1, shape, idx, n * 4), VL_OK);
    assert_int_equal(st_writer_add(&w, "values", ST_F32, 1, shape, val, n * 4), VL_OK);
    vl_error e = {0};
    vl_buf_reset(out);
    assert_int_equal(st_writer_finish(&w, out, &e), VL_OK);
    st_writer_free(&w);
}

static void test_apply_delta(void **state) {
    (void)state;
    peer_trainer tr;
    peer_trainer_init(&tr);
    vl_error e = {0};
    vl_buf f;
    vl_buf_init(&f, 0);
    uint32_t idx[3] = {0, 5, 9};
    float val[3] = {0.5f, -1.0f, 2.0f};
    char zero[65];
    memset(zero, '0', 64);
    zero[64] = '\0';
    delta_file(&f, "unit", "3", "6", idx, val, 3, zero);
    assert_int_equal(peer_trainer_apply_delta(&tr, f.data, f.len, "unit", 6, &e), VL_EINVAL);
    assert_int_equal(peer_trainer_init_model(&tr, &TINY, 3, &e), VL_OK);
    size_t n = tr.n_params;
    float *before = malloc(n * sizeof *before);
    memcpy(before, tr.base, n * sizeof *before);
    char sha[65];
    digest_after(tr.base, n, idx, val, 3, sha);
    /* Wrong run, wrong range, bad indices, non-finite values, no digest or
     * a digest the result does not have: refused, the base unchanged. */
    delta_file(&f, "unit", "3", "6", idx, val, 3, sha);
    assert_int_equal(peer_trainer_apply_delta(&tr, f.data, f.len, "other", 6, &e), VL_EINVAL);
    assert_int_equal(peer_trainer_apply_delta(&tr, f.data, f.len, "unit", 7, &e), VL_EINVAL);
    uint32_t desc[3] = {5, 0, 9}, far[3] = {0, 5, (uint32_t)n};
    delta_file(&f, "unit", "3", "6", desc, val, 3, sha);
    assert_int_equal(peer_trainer_apply_delta(&tr, f.data, f.len, "unit", 6, &e), VL_EINVAL);
    delta_file(&f, "unit", "3", "6", far, val, 3, sha);
    assert_int_equal(peer_trainer_apply_delta(&tr, f.data, f.len, "unit", 6, &e), VL_EINVAL);
    float nan_val[3] = {0.5f, NAN, 2.0f};
    delta_file(&f, "unit", "3", "6", idx, nan_val, 3, sha);
    assert_int_equal(peer_trainer_apply_delta(&tr, f.data, f.len, "unit", 6, &e), VL_EINVAL);
    delta_file(&f, "unit", "2", "6", idx, val, 3, sha);
    assert_int_equal(peer_trainer_apply_delta(&tr, f.data, f.len, "unit", 6, &e), VL_EINVAL);
    delta_file(&f, "unit", "3", "6", idx, val, 3, NULL);
    assert_int_equal(peer_trainer_apply_delta(&tr, f.data, f.len, "unit", 6, &e), VL_EINVAL);
    /* A delta that left out a change (here the one at index 9) leads
     * elsewhere than the version: its digest says so. */
    delta_file(&f, "unit", "3", "6", idx, val, 2, sha);
    assert_int_equal(peer_trainer_apply_delta(&tr, f.data, f.len, "unit", 6, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "digest"));
    assert_memory_equal(tr.base, before, n * sizeof *before);
    assert_int_equal(tr.base_version, 3);
    /* A good one sets exactly the listed coordinates to their values. */
    delta_file(&f, "unit", "3", "6", idx, val, 3, sha);
    assert_int_equal(peer_trainer_apply_delta(&tr, f.data, f.len, "unit", 6, &e), VL_OK);
    assert_int_equal(tr.base_version, 6);
    for (size_t i = 0; i < n; i++) {
        float want = before[i];
        for (int j = 0; j < 3; j++)
            if (idx[j] == i) want = val[j];
        assert_true(tr.base[i] == want);
    }
    free(before);
    vl_buf_free(&f);
    peer_trainer_free(&tr);
}

static void test_trainer_load(void **state) {
    (void)state;
    peer_trainer src, tr;
    peer_trainer_init(&src);
    peer_trainer_init(&tr);
    vl_error e = {0};
    assert_int_equal(peer_trainer_init_model(&src, &TINY, 0, &e), VL_OK);
    vl_buf f;
    vl_buf_init(&f, 0);
    model_file(&src, "demo", "4", &f);

    assert_int_equal(peer_trainer_load(&tr, f.data, f.len, "demo", 5, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "version 4"));
    assert_int_equal(tr.base_version, -1);
    assert_null(tr.gpt);
    assert_int_equal(peer_trainer_load(&tr, f.data, f.len, "other", 4, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "run"));
    assert_int_equal(peer_trainer_load(&tr, f.data, f.len, "demo", 4, &e), VL_OK);
    assert_int_equal(tr.base_version, 4);
    assert_int_equal(tr.n_params, src.n_params);
    assert_memory_equal(tr.base, src.base, src.n_params * sizeof(float));
    assert_memory_equal(model_gpt_params(tr.gpt), src.base, src.n_params * sizeof(float));

    /* Damaged bytes leave the held model as it was. */
    model_gpt *held = tr.gpt;
    f.data[f.len / 2] ^= 0x5a;
    f.data[9] = '#';
    assert_int_not_equal(peer_trainer_load(&tr, f.data, f.len, "demo", 6, &e), VL_OK);
    assert_int_equal(tr.base_version, 4);
    assert_ptr_equal(tr.gpt, held);
    assert_int_not_equal(peer_trainer_load(&tr, f.data, 100, "demo", 6, &e), VL_OK);
    assert_int_equal(tr.base_version, 4);

    /* A NaN, a tensor of the wrong shape, a configuration that claims
     * more than the file holds: refused, the held base bit for bit as it
     * was. */
    float *before = malloc(tr.n_params * sizeof *before);
    assert_non_null(before);
    memcpy(before, tr.base, tr.n_params * sizeof *before);
    model_gpt_params(src.gpt)[7] = NAN;
    vl_buf_reset(&f);
    model_file(&src, "demo", "6", &f);
    assert_int_equal(peer_trainer_load(&tr, f.data, f.len, "demo", 6, &e), VL_ERANGE);
    assert_non_null(strstr(e.msg, "NaN"));
    model_gpt_params(src.gpt)[7] = 0.0f;
    vl_buf_reset(&f);
    model_file_cfg(&src, "demo", "6",
                   "{\"vocab_size\":1048576,\"block_size\":8192,\"n_layer\":4,\"n_head\":8,"
                   "\"n_embd\":8192}",
                   &f);
    assert_int_equal(peer_trainer_load(&tr, f.data, f.len, "demo", 6, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "needs"));
    /* Vocabulary and context swapped: as many parameters, other shapes. */
    char cfg[200];
    snprintf(cfg, sizeof cfg,
             "{\"vocab_size\":%d,\"block_size\":%d,\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d}",
             TINY.block_size, TINY.vocab_size, TINY.n_layer, TINY.n_head, TINY.n_embd);
    vl_buf_reset(&f);
    model_file_cfg(&src, "demo", "6", cfg, &f);
    assert_int_equal(peer_trainer_load(&tr, f.data, f.len, "demo", 6, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "shape"));
    assert_int_equal(tr.base_version, 4);
    assert_ptr_equal(tr.gpt, held);
    assert_memory_equal(tr.base, before, tr.n_params * sizeof *before);
    free(before);

    /* A new shape replaces the model and resets the optimizer. */
    peer_task task = tiny_task(2);
    peer_train_result res;
    assert_int_equal(peer_trainer_run(&tr, &task, TEXT, 17, &res, &e), VL_OK);
    assert_true(tr.have_opt);
    peer_trainer big;
    peer_trainer_init(&big);
    model_gpt_config cfg2 = TINY;
    cfg2.n_layer = 2;
    assert_int_equal(peer_trainer_init_model(&big, &cfg2, 0, &e), VL_OK);
    vl_buf_reset(&f);
    model_file(&big, "demo", "7", &f);
    assert_int_equal(peer_trainer_load(&tr, f.data, f.len, "demo", 7, &e), VL_OK);
    assert_int_equal(tr.cfg.n_layer, 2);
    assert_int_equal(tr.n_params, big.n_params);
    assert_false(tr.have_opt);
    assert_int_equal(peer_trainer_run(&tr, &task, TEXT, 17, &res, &e), VL_OK);

    vl_buf_free(&f);
    peer_trainer_free(&big);
    peer_trainer_free(&src);
    peer_trainer_free(&tr);
}

/* A task for another run than the one joined is refused, naming both. */
static void test_task_run(void **state) {
    (void)state;
    peer_task t = tiny_task(1);
    vl_error e = {0};
    assert_int_equal(peer_task_check_run(&t, "unit", &e), VL_OK);
    assert_int_equal(peer_task_check_run(&t, "other", &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "'unit'"));
    assert_non_null(strstr(e.msg, "'other'"));
}

static void test_join_reply(void **state) {
    (void)state;
    peer_state st;
    memset(&st, 0, sizeof st);
    snprintf(st.name, sizeof st.name, "kept");
    vl_error e = {0};
    const char *good = "{\"peer_id\": 12, \"run\": {\"name\": \"demo\", \"mode\": \"sync\"}}";
    assert_int_equal(peer_join_reply_parse((const uint8_t *)good, strlen(good), &st, &e), VL_OK);
    assert_int_equal(st.peer_id, 12);
    assert_string_equal(st.run, "demo");
    assert_string_equal(st.name, "kept");
    /* A run name with a control character would match no lease; one of
     * nothing but DEL bytes used to be accepted as "" (fuzz_peer_json). */
    const char *bad[] = {"{\"peer_id\": 3, \"run\": {\"name\": \"de\\u0007mo\"}}",
                         "{\"peer_id\": 3, \"run\": {\"name\": \"\x7f\x7f\"}}",
                         "",
                         "[]",
                         "{\"peer_id\": 0, \"run\": {\"name\": \"x\"}}",
                         "{\"peer_id\": \"3\", \"run\": {\"name\": \"x\"}}",
                         "{\"peer_id\": 3, \"run\": {\"name\": \"\"}}",
                         "{\"peer_id\": 3, \"run\": \"x\"}",
                         "{\"peer_id\": 3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&st, 0, sizeof st);
        assert_int_equal(peer_join_reply_parse((const uint8_t *)bad[i], strlen(bad[i]), &st, &e),
                         VL_EINVAL);
        assert_int_equal(st.peer_id, 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_apply_delta),
        cmocka_unit_test(test_trainer_load),
        cmocka_unit_test(test_task_run),
        cmocka_unit_test(test_join_reply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
