/* coordinator: an accepted upload's L2 norm is computed once, by the
 * upload route, and stored with the update (migration 14), whatever the
 * run's bound: the merge reads it back instead of computing it again, so
 * it must be compress_update_norm of the body as the merge decodes it,
 * to the bit. Through a real server (serve_fixture.h): the guard, signed
 * requests and the route. A refusing bound still refuses on that same
 * norm before anything is stored. */
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
#include "serve_fixture.h"

/* A sync run without a robust section clips at merge time: before the
 * norm was stored, its uploads computed none. Three updates a version,
 * so the two sent here wait unmerged. */
#define RUN_CLIP                                                                    \
    "{\"name\": \"norms\", \"corpus\": \"CORPUS\", \"mode\": \"sync\", \"model\": " \
    "{\"vocab_size\": 256, \"block_size\": 16, \"n_layer\": 1, \"n_head\": 2, "     \
    "\"n_embd\": 16}, \"updates_per_version\": 3, \"max_versions\": 5, "            \
    "\"task_bytes\": 4096, \"lease_s\": 600, \"max_loss_rise\": 0, "                \
    "\"outer\": {\"lr\": 1.0, \"momentum\": 0.0}, \"train\": {\"steps\": 4, \"batch\": 4}}"

/* The same with a fixed bound of 1 that refuses what exceeds it. */
#define RUN_REFUSE                                                                  \
    "{\"name\": \"norms\", \"corpus\": \"CORPUS\", \"mode\": \"sync\", \"model\": " \
    "{\"vocab_size\": 256, \"block_size\": 16, \"n_layer\": 1, \"n_head\": 2, "     \
    "\"n_embd\": 16}, \"updates_per_version\": 3, \"max_versions\": 5, "            \
    "\"task_bytes\": 4096, \"lease_s\": 600, \"max_loss_rise\": 0, "                \
    "\"robust\": {\"max_norm\": 1, \"on_excess\": \"refuse\"}, "                    \
    "\"outer\": {\"lr\": 1.0, \"momentum\": 0.0}, \"train\": {\"steps\": 4, \"batch\": 4}}"

/* A dense update of task by peer i of L2 norm about norm, as dtype. */
static void encode_update(int i, int64_t task, double norm, st_dtype dtype, vl_buf *out) {
    size_t n = SV.srv->run.n_params;
    float *d = random_vec(n, 90 + (uint64_t)task);
    double s = 0;
    for (size_t k = 0; k < n; k++) s += (double)d[k] * d[k];
    for (size_t k = 0; k < n; k++) d[k] = (float)(d[k] * (norm / sqrt(s)));
    serve_dense_update(i, task, "norms", d, dtype, out);
    free(d);
}

/* compress_update_norm of body as decoded, as the merge would. */
static double norm_of(const vl_buf *body) {
    compress_update cu;
    OK(compress_update_decode(body->data, body->len, SV.srv->run.n_params, &cu, NULL, &e_));
    double norm = compress_update_norm(&cu);
    compress_update_free(&cu);
    return norm;
}

typedef struct stored_norm {
    int64_t task;
    int found, has_norm;
    double norm;
} stored_norm;

static int find_task(void *ctx, const storage_update *u) {
    stored_norm *s = ctx;
    if (u->task_id != s->task) return 0;
    s->found = 1;
    s->has_norm = u->has_norm;
    s->norm = u->norm;
    return 0;
}

/* Uploads an update of norm about norm as dtype for a new lease of a new
 * peer; returns the status, and checks what is stored for it: with a 202
 * the update and its norm, bit for bit the one computed from the body,
 * with anything else nothing. */
static int upload(double norm, st_dtype dtype) {
    int p = serve_add_peer();
    int64_t task = serve_add_lease(p);
    vl_buf body;
    encode_update(p, task, norm, dtype, &body);
    serve_client *c =
        serve_post(p, "/v1/updates", "application/octet-stream", body.data, body.len, NULL);
    int status = c->status;
    serve_done(c);
    stored_norm s = {.task = task};
    OK(storage_update_each_unmerged(SV.srv->run.db, find_task, &s, &e_));
    assert_int_equal(s.found, status == 202);
    if (status == 202) {
        double want = norm_of(&body);
        assert_true(fabs(want - norm) < 1e-3 * norm);
        assert_int_equal(s.has_norm, 1);
        assert_memory_equal(&s.norm, &want, sizeof want);
    }
    vl_buf_free(&body);
    return status;
}

/* No refusing bound: the norm is stored all the same, F32 and F16. */
static void test_upload_stores_norm(void **state) {
    (void)state;
    serve_open(RUN_CLIP);
    assert_int_equal(upload(0.5, ST_F32), 202);
    assert_int_equal(upload(7.0, ST_F16), 202);
    serve_close();
}

/* A refusing bound refuses on the norm it stores for what it takes. */
static void test_refusing_bound_same_norm(void **state) {
    (void)state;
    serve_open(RUN_REFUSE);
    assert_int_equal(upload(0.5, ST_F32), 202);
    assert_int_equal(upload(2.0, ST_F32), 422);
    serve_close();
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    if (vcrypto_init() != VL_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upload_stores_norm),
        cmocka_unit_test(test_refusing_bound_same_norm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
