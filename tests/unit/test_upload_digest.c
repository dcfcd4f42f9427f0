/* coordinator: a body that does not match its Content-Digest, through a
 * real server (serve_fixture.h: the input guard, its tickets, signed
 * requests and the upload route). The guard hashes the body as it streams
 * in and records the verdict in the request's ticket; the server must
 * refuse the request on that verdict (400 digest_mismatch) before any
 * route sees the body, so nothing of it is stored. The signature is made
 * over the Content-Digest header, not over the body, so this check is the
 * only thing that ties the bytes that arrived to the peer that signed. */
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

#define RUN_CONFIG                                                                   \
    "{\"name\": \"digest\", \"corpus\": \"CORPUS\", \"mode\": \"sync\", \"model\": " \
    "{\"vocab_size\": 256, \"block_size\": 16, \"n_layer\": 1, \"n_head\": 2, "      \
    "\"n_embd\": 16}, \"updates_per_version\": 2, \"max_versions\": 5, "             \
    "\"task_bytes\": 4096, \"lease_s\": 600, \"max_loss_rise\": 0, "                 \
    "\"outer\": {\"lr\": 1.0, \"momentum\": 0.0}, \"train\": {\"steps\": 4, \"batch\": 4}}"

/* A dense update of task by peer i whose values are scale times a fixed
 * small random vector: any two scales encode to bodies of one length. */
static void encode_update(int i, int64_t task, float scale, vl_buf *out) {
    size_t n = SV.srv->run.n_params;
    float *d = random_vec(n, 77);
    for (size_t k = 0; k < n; k++) d[k] *= 1e-3f * scale;
    serve_dense_update(i, task, "digest", d, ST_F32, out);
    free(d);
}

static int64_t updates_stored(void) {
    int64_t n = -1;
    OK(storage_update_count(SV.srv->run.db, &n, &e_));
    return n;
}

/* An upload signed with the Content-Digest of one body but carrying
 * another of the same length (so Content-Length, which the signature also
 * covers, still holds): the signature verifies, the digest does not. */
static void test_upload_with_wrong_digest_is_refused(void **state) {
    (void)state;
    serve_open(RUN_CONFIG);
    int p = serve_add_peer();
    int64_t task = serve_add_lease(p);
    vl_buf signed_body, sent;
    encode_update(p, task, 1.0f, &signed_body);
    encode_update(p, task, 2.0f, &sent);
    assert_int_equal(sent.len, signed_body.len);
    assert_true(memcmp(sent.data, signed_body.data, sent.len) != 0);

    serve_client *c = serve_post(p, "/v1/updates", "application/octet-stream", sent.data, sent.len,
                                 signed_body.data);
    if (c->status != 400 || strcmp(c->code, "digest_mismatch") != 0)
        fail_msg("a body that does not match its Content-Digest got %d %s, not 400 "
                 "digest_mismatch",
                 c->status, c->code);
    serve_done(c);
    /* Nothing of it reached the database: no update, the lease still open. */
    assert_int_equal(updates_stored(), 0);
    storage_task t;
    OK(storage_task_get(SV.srv->run.db, task, &t, &e_));
    assert_int_equal(t.state, STORAGE_TASK_LEASED);

    /* The same body with its own digest is taken: the refusal above was
     * the digest's, not the lease's or the update's. */
    c = serve_post(p, "/v1/updates", "application/octet-stream", sent.data, sent.len, NULL);
    if (c->status != 202) fail_msg("the honest upload got %d %s", c->status, c->code);
    serve_done(c);
    assert_int_equal(updates_stored(), 1);

    vl_buf_free(&signed_body);
    vl_buf_free(&sent);
    serve_close();
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    if (vcrypto_init() != VL_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upload_with_wrong_digest_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
