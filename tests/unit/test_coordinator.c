/* coordinator: the outer Nesterov step (dense and sparse), the weighted
 * mean of updates, the scheduler's slot rules and task ranges, join names
 * and query parsing (the run configuration is test_coord_config.c's, the
 * input guard test_guard.c's). None of it needs a socket. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compress/compress.h"
#include "test_util.h"
#include "coordinator/run/aggregator.h"
#include "coordinator/run/factors.h"
#include "coordinator/run/round.h"
#include "coordinator/config/config.h"
#include "coordinator/coord.h"
#include "coordinator/base/sched_rules.h"
#include "coordinator/api/api.h"
#include "coordinator/base/outer.h"
#include "coordinator/http/http.h"

/* ---- outer step --------------------------------------------------------- */

static void test_outer_step_by_hand(void **state) {
    (void)state;
    float theta[2] = {1.0f, 2.0f};
    float m[2] = {0.5f, -1.0f};
    const float dbar[2] = {0.2f, 0.4f};
    coord_outer_step(theta, m, dbar, 2, 0.7, 0.9);
    /* m = 0.9*0.5 + 0.2 = 0.65;  theta = 1 - 0.7*(0.2 + 0.9*0.65) = 0.4505
     * m = 0.9*-1 + 0.4 = -0.5;   theta = 2 - 0.7*(0.4 + 0.9*-0.5) = 2.035 */
    assert_float_equal(m[0], 0.65f, 1e-6);
    assert_float_equal(m[1], -0.5f, 1e-6);
    assert_float_equal(theta[0], 0.4505f, 1e-6);
    assert_float_equal(theta[1], 2.035f, 1e-6);
    /* A second step uses the momentum left by the first. */
    coord_outer_step(theta, m, dbar, 2, 0.7, 0.9);
    /* m = 0.9*0.65 + 0.2 = 0.785; theta = 0.4505 - 0.7*(0.2 + 0.9*0.785) = -0.1840 */
    assert_float_equal(m[0], 0.785f, 1e-6);
    assert_float_equal(theta[0], -0.18405f, 1e-5);
    /* eta = 1, mu = 0 is FedAvg: theta - dbar. */
    float t2[2] = {1.0f, 2.0f}, m2[2] = {9.0f, 9.0f};
    coord_outer_step(t2, m2, dbar, 2, 1.0, 0.0);
    assert_float_equal(t2[0], 0.8f, 1e-6);
    assert_float_equal(t2[1], 1.6f, 1e-6);
    assert_float_equal(m2[0], 0.2f, 1e-6);
}

/* The weighted mean the merge computes: updates decoded and accumulated
 * with weight n_i, then scaled by 1 / sum n_i. */
static void test_weighted_mean_of_updates(void **state) {
    (void)state;
    enum { N = 5 };
    float d1[N] = {1, 2, 3, 4, 5}, d2[N] = {-1, 0, 1, 0, -2};
    compress_update_meta meta = {.run = "demo",
                                 .task = 1,
                                 .peer = 1,
                                 .base_version = 0,
                                 .kind = COMPRESS_DENSE,
                                 .num_samples = 30,
                                 .local_steps = 1,
                                 .loss = 1.0};
    vl_buf b1, b2;
    vl_buf_init(&b1, 0);
    vl_buf_init(&b2, 0);
    vl_error e = {0};
    assert_int_equal(compress_update_encode_dense(&meta, d1, N, ST_F32, &b1, &e), VL_OK);
    meta.num_samples = 10;
    assert_int_equal(compress_update_encode_dense(&meta, d2, N, ST_F16, &b2, &e), VL_OK);
    compress_update u1, u2;
    assert_int_equal(compress_update_decode(b1.data, b1.len, N, &u1, NULL, &e), VL_OK);
    assert_int_equal(compress_update_decode(b2.data, b2.len, N, &u2, NULL, &e), VL_OK);
    float sum[N] = {0};
    assert_int_equal(compress_update_accumulate(&u1, 30.0f, sum, N, &e), VL_OK);
    assert_int_equal(compress_update_accumulate(&u2, 10.0f, sum, N, &e), VL_OK);
    coord_scale(sum, N, 1.0 / 40.0);
    for (int i = 0; i < N; i++) assert_float_equal(sum[i], (30 * d1[i] + 10 * d2[i]) / 40, 1e-5);
    compress_update_free(&u1);
    compress_update_free(&u2);
    vl_buf_free(&b1);
    vl_buf_free(&b2);
}

/* The sparse outer step applies apply_k coordinates and keeps the rest in
 * the error vector; with apply_k = n it is the dense Nesterov step. */
static void test_outer_step_sparse(void **state) {
    (void)state;
    enum { D = 64 };
    float th1[D], th2[D], m1[D], m2[D], e2[D], dbar[D];
    uint32_t idx[D];
    for (int i = 0; i < D; i++) {
        th1[i] = th2[i] = (float)i * 0.01f;
        m1[i] = m2[i] = (float)(i % 5) * 0.1f;
        e2[i] = 0;
        dbar[i] = (float)((i * 7) % 11 - 5) * 0.05f;
    }
    size_t nnz = 0;
    OK(coord_outer_step_sparse(th2, m2, e2, dbar, D, 0.7, 0.9, D, idx, &nnz, &e_));
    coord_outer_step(th1, m1, dbar, D, 0.7, 0.9);
    for (int i = 0; i < D; i++) {
        assert_float_equal(th1[i], th2[i], 1e-6);
        assert_float_equal(m1[i], m2[i], 1e-6);
        assert_true(e2[i] == 0.0f);
    }
    /* With apply_k = 4 only four coordinates move, the largest |update|,
     * and the rest waits in e. */
    float th3[D], m3[D], e3[D], before[D];
    for (int i = 0; i < D; i++) {
        th3[i] = before[i] = 1.0f;
        m3[i] = 0;
        e3[i] = 0;
    }
    OK(coord_outer_step_sparse(th3, m3, e3, dbar, D, 1.0, 0.0, 4, idx, &nnz, &e_));
    assert_int_equal(nnz, 4);
    float val[D];
    uint32_t cidx[D];
    size_t changed = coord_change(before, th3, D, idx, nnz, cidx, val);
    assert_int_equal(changed, 4);
    for (size_t j = 0; j < 4; j++) {
        assert_true(fabsf(dbar[cidx[j]]) >= 0.25f - 1e-6f);
        assert_true(e3[cidx[j]] == 0.0f);
        assert_float_equal(val[j], -dbar[cidx[j]], 1e-6);
    }
    double mass = 0;
    for (int i = 0; i < D; i++) mass += (double)e3[i] + (double)(before[i] - th3[i]) - dbar[i];
    assert_true(fabs(mass) < 1e-5);
}

/* ---- scheduler ------------------------------------------------------------ */

static void test_scheduler_slots(void **state) {
    (void)state;
    /* N = 4: a free slot issues, a held lease comes back, full means wait. */
    assert_int_equal(coord_sched_decide(0, 0, 0, 4), COORD_SCHED_NEW_TASK);
    assert_int_equal(coord_sched_decide(0, 0, 3, 4), COORD_SCHED_NEW_TASK);
    assert_int_equal(coord_sched_decide(0, 0, 4, 4), COORD_SCHED_WAIT);
    assert_int_equal(coord_sched_decide(0, 1, 4, 4), COORD_SCHED_SAME_TASK);
    assert_int_equal(coord_sched_decide(0, 1, 0, 4), COORD_SCHED_SAME_TASK);
    assert_int_equal(coord_sched_decide(1, 1, 0, 4), COORD_SCHED_FINISHED);
    assert_int_equal(coord_sched_decide(1, 0, 0, 4), COORD_SCHED_FINISHED);
    /* async: a lease for every peer that holds none */
    assert_int_equal(coord_sched_decide_async(1, 0), COORD_SCHED_FINISHED);
    assert_int_equal(coord_sched_decide_async(0, 1), COORD_SCHED_SAME_TASK);
    assert_int_equal(coord_sched_decide_async(0, 0), COORD_SCHED_NEW_TASK);
    /* async: K unmerged updates, whatever their base */
    assert_false(coord_sched_merge_due(1, 3, 0, 4, 0, 0));
    assert_true(coord_sched_merge_due(1, 4, 0, 4, 0, 0));
    /* sync: N done for the current version, or the deadline with one */
    assert_true(coord_sched_merge_due(0, 4, 4, 4, 0, 0));
    assert_false(coord_sched_merge_due(0, 9, 3, 4, 1000, 0));
    assert_false(coord_sched_merge_due(0, 0, 0, 4, 1000, 60));
    assert_false(coord_sched_merge_due(0, 2, 2, 4, 59, 60));
    assert_true(coord_sched_merge_due(0, 2, 2, 4, 60, 60));
    assert_true(coord_sched_merge_due(0, 1, 0, 4, 61, 60)); /* a stale update alone */
    /* Ages are fractional: a deadline is due at its second, not before. */
    assert_false(coord_sched_merge_due(0, 1, 0, 4, 1.999, 2));
    assert_true(coord_sched_merge_due(0, 1, 0, 4, 2.0, 2));
}

static void test_scheduler_ranges(void **state) {
    (void)state;
    int64_t off, len, off2, len2;
    int64_t train = 100000, task = 4096;
    int hits_low = 0, hits_high = 0;
    for (int64_t id = 1; id <= 2000; id++) {
        assert_int_equal(coord_sched_task_range(1337, id, train, task, &off, &len), 0);
        assert_int_equal(len, task);
        assert_true(off >= 0 && off + len <= train);
        if (off < (train - task) / 2)
            hits_low++;
        else
            hits_high++;
        /* Deterministic from (seed, task id). */
        assert_int_equal(coord_sched_task_range(1337, id, train, task, &off2, &len2), 0);
        assert_int_equal(off, off2);
        int64_t seed = coord_sched_task_seed(1337, id);
        assert_true(seed >= 0 && seed < ((int64_t)1 << 31));
        assert_int_equal(seed, coord_sched_task_seed(1337, id));
    }
    assert_true(hits_low > 800 && hits_high > 800);
    /* Different run seeds, different layouts. */
    int same = 0;
    for (int64_t id = 1; id <= 100; id++) {
        coord_sched_task_range(1, id, train, task, &off, &len);
        coord_sched_task_range(2, id, train, task, &off2, &len2);
        same += off == off2;
    }
    assert_true(same < 5);
    /* A task as long as the training part starts at 0; longer is clipped. */
    assert_int_equal(coord_sched_task_range(7, 1, 500, 500, &off, &len), 0);
    assert_int_equal(off, 0);
    assert_int_equal(len, 500);
    assert_int_equal(coord_sched_task_range(7, 1, 500, 900, &off, &len), 0);
    assert_int_equal(len, 500);
    assert_int_equal(coord_sched_task_range(7, 1, 0, 10, &off, &len), -1);
}

/* ---- join names ----------------------------------------------------------------- */

/* A name of COORD_JOIN_NAME_MAX bytes is taken whole; one byte more is
 * refused. */
static void test_join_name_length(void **state) {
    (void)state;
    char pk[VCRYPTO_PK_B64_LEN + 1], name[COORD_JOIN_NAME_MAX + 2], body[512];
    uint8_t raw[VCRYPTO_PK_BYTES];
    memset(raw, 7, sizeof raw);
    vcrypto_pk_encode(raw, pk);
    for (int len = COORD_JOIN_NAME_MAX; len <= COORD_JOIN_NAME_MAX + 1; len++) {
        memset(name, 'n', (size_t)len);
        name[len] = '\0';
        snprintf(body, sizeof body, "{\"public_key\":\"%s\",\"token\":\"t\",\"name\":\"%s\"}", pk,
                 name);
        coord_join_body jb;
        vl_error e = {0};
        int rc = coord_join_parse((const uint8_t *)body, strlen(body), &jb, &e);
        if (len == COORD_JOIN_NAME_MAX) {
            assert_int_equal(rc, VL_OK);
            assert_string_equal(jb.name, name);
            coord_join_body_free(&jb);
        } else {
            assert_int_equal(rc, VL_EINVAL);
        }
    }
}

/* ---- query strings ------------------------------------------------------------ */

static void test_query_ints(void **state) {
    (void)state;
    const char *const keys[] = {"wait", "version", NULL};
    int64_t v[2] = {0, 0};
    unsigned present = 0;
    vl_error e = {0};
    assert_int_equal(coord_query_ints(NULL, keys, 60, v, &present, &e), VL_OK);
    assert_int_equal(present, 0);
    assert_int_equal(coord_query_ints("wait=20&version=3", keys, 60, v, &present, &e), VL_OK);
    assert_int_equal(present, 3);
    assert_int_equal(v[0], 20);
    assert_int_equal(v[1], 3);
    const char *bad[] = {"wait=61", "wait=-1",           "wait=",   "wait",     "wait=1&wait=2",
                         "other=1", "wait=1x",           "wait=+1", "wait=%31", "wait=1&",
                         "&wait=1", "wait=1&&version=2", "=1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(coord_query_ints(bad[i], keys, 60, v, &present, &e), VL_EINVAL);
    /* A route that takes no parameters refuses every query. */
    const char *const none[] = {NULL};
    assert_int_equal(coord_query_ints("", none, 0, NULL, &present, &e), VL_OK);
    assert_int_equal(coord_query_ints("anything=1", none, 0, NULL, &present, &e), VL_EINVAL);
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join_name_length),
        cmocka_unit_test(test_outer_step_by_hand),
        cmocka_unit_test(test_weighted_mean_of_updates),
        cmocka_unit_test(test_outer_step_sparse),
        cmocka_unit_test(test_scheduler_slots),
        cmocka_unit_test(test_scheduler_ranges),
        cmocka_unit_test(test_query_ints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
