/* coordinator: the cut-layer gradient split learning answers with. A peer
 * sends a batch of its cut layer's activations Z and their labels to POST
 * /v1/split/forward of a real server (serve_fixture.h), which runs its
 * layers forward and backward on the compute thread and answers dL/dZ,
 * then steps its layers. That answer is held here to a central finite
 * difference of the MEAN batch loss in Z, taken with the coordinator's
 * layers as they were before the batch: a gradient off by a constant
 * factor (the batch size, say) trains nearly as well under AdamW, which
 * divides most of it out, so only a check of its value finds it. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/split_wire.h"
#include "coordinator/run/split.h"
#include "model/mlp_part.h"
#include "test_util.h"
#include "serve_fixture.h"
#include "coordinator/config/config.h"

/* A plain split at layer 1 of a 6 -> 5 -> 4 -> 3 classifier: the
 * coordinator holds 5 -> 4 (GELU) -> 3 and the loss. */
#define RUN_CONFIG                                                                          \
    "{\"name\": \"splitgrad\", \"seed\": 7, \"model\": {\"kind\": \"mlp\", \"in_dim\": 6, " \
    "\"hidden\": [5, 4], \"classes\": 3}, \"data\": {\"kind\": \"local\"}, \"mode\": "      \
    "\"split\", \"split\": {\"cut\": 1}, \"updates_per_version\": 3, \"max_versions\": 5, " \
    "\"train\": {\"steps\": 20, \"batch\": 8, \"lr\": 0.003}, \"outer\": {\"lr\": 1.0, "    \
    "\"momentum\": 0.0}, \"lease_s\": 600}"

enum { B = 8 };

/* The mean loss of the layers p over the batch z with labels y. */
static double mean_loss(model_mlp_part *p, const float *z, const int *y) {
    float loss = NAN;
    OK(model_mlp_part_forward(p, z, B, &e_));
    OK(model_mlp_part_loss(p, y, &loss, &e_));
    return loss;
}

static void test_split_dz_is_the_mean_loss_gradient(void **state) {
    (void)state;
    serve_open(RUN_CONFIG);
    coord_split *s = SV.srv->run.split;
    assert_non_null(s);
    const int q = s->q;
    assert_int_equal(q, 5);
    /* The layers as the batch will find them; the answer is computed
     * before the step that batch then takes. */
    model_mlp_part *ref = NULL;
    const coord_config *cfg = &SV.srv->run.cfg;
    OK(model_mlp_part_create(&cfg->mlp, cfg->split_cut, model_mlp_config_num_layers(&cfg->mlp),
                             &ref, &e_));
    assert_int_equal(model_mlp_part_num_params(ref), s->count);
    memcpy(model_mlp_part_params(ref), model_mlp_part_params(s->upper), s->count * sizeof(float));

    int p = serve_add_peer();
    int64_t task = serve_add_lease(p);
    float *z = random_vec((size_t)B * q, 11);
    int y[B];
    for (int b = 0; b < B; b++) y[b] = (b * 7 + 1) % 3;
    vl_buf body;
    vl_buf_init(&body, 1 << 20);
    OK(split_wire_encode_forward("splitgrad", SV.ids[p], task, z, B, q, ST_F32, y, &body, &e_));
    serve_client *c =
        serve_post(p, "/v1/split/forward", "application/octet-stream", body.data, body.len, NULL);
    if (c->status != 200) fail_msg("the batch got %d %s", c->status, c->code);
    float dz[B * 5];
    double loss = NAN;
    int64_t step = 0;
    OK(split_wire_decode_reply(serve_body(c), c->blen, "dz", B, q, dz, &loss, &step, &e_));
    serve_done(c);
    assert_int_equal(step, 1);

    /* Its loss is the batch's mean loss, under the same layers. */
    double l0 = mean_loss(ref, z, y);
    assert_near(loss, l0, 1e-6);

    /* Central differences in float: with h = 1e-2 on activations of unit
     * scale, rounding in the loss (about 1e-7) costs some 1e-5 at worst
     * and the O(h^2) truncation (GELU is smooth) less: the largest error
     * seen is 5e-6 on entries up to 1.6e-2. A wrong scale moves each entry
     * by its own size, far past 5e-5 + 1 %. */
    const float h = 1e-2f;
    double fd[B * 5], fmax = 0;
    for (int k = 0; k < B * q; k++) {
        float keep = z[k];
        z[k] = keep + h;
        double up = mean_loss(ref, z, y);
        z[k] = keep - h;
        double down = mean_loss(ref, z, y);
        z[k] = keep;
        fd[k] = (up - down) / (2.0 * (double)h);
        if (fabs(fd[k]) > fmax) fmax = fabs(fd[k]);
    }
    assert_true(fmax > 1e-3); /* a gradient worth checking */
    double worst = 0;
    for (int k = 0; k < B * q; k++) {
        double err = fabs((double)dz[k] - fd[k]);
        if (err > worst) worst = err;
        if (err > 5e-5 + 1e-2 * fabs(fd[k]))
            fail_msg("dL/dZ[%d][%d] = %.6g, the mean loss's finite difference %.6g", k / q, k % q,
                     (double)dz[k], fd[k]);
    }
    /* The whole gradient too, on its own scale. */
    assert_true(worst <= 5e-3 * fmax);

    model_mlp_part_free(ref);
    vl_buf_free(&body);
    free(z);
    serve_close();
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    if (vcrypto_init() != VL_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_dz_is_the_mean_loss_gradient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
