/* For the MLP tests: the Fashion-MNIST CNN's configuration, and a parse
 * that must be refused. */
#ifndef VOLLEY_TESTS_MLP_FIXTURES_H
#define VOLLEY_TESTS_MLP_FIXTURES_H

#include <string.h>

#include "model/mlp_io.h"
#include "model/model.h"

/* The small CNN of the Fashion-MNIST runs. */
static const model_mlp_config FASHION_CNN = {.in_dim = 784,
                                             .n_hidden = 1,
                                             .hidden = {128},
                                             .n_classes = 10,
                                             .n_conv = 2,
                                             .image = {1, 28, 28},
                                             .conv = {{16, 5, 2}, {32, 5, 2}}};

/* A model of configuration c with its initial weights from seed; the
 * caller destroys it. Fails the test when c is refused. */
static inline model_mlp *mlp_make(model_mlp_config c, uint64_t seed) {
    model_mlp *m = NULL;
    vl_error err = {0};
    if (model_mlp_create(&c, &m, &err) != 0) fail_msg("create: %s", err.msg);
    model_mlp_init_weights(m, seed);
    return m;
}

/* One step of plain SGD on the gradients held. */
static inline void mlp_sgd_step(model_mlp *m, float lr) {
    float *p = model_mlp_params(m);
    const float *g = model_mlp_grads(m);
    for (size_t i = 0; i < model_mlp_num_params(m); i++) p[i] -= lr * g[i];
}

/* Parses text that must be refused: VL_EINVAL, a message holding needle,
 * and the output untouched. */
static inline void mlp_config_refused(const char *text, const char *needle) {
    model_mlp_config c, before;
    memset(&c, 0x5a, sizeof c);
    before = c;
    vl_error e = {0};
    int rc = model_mlp_config_parse(text, strlen(text), &c, &e);
    if (rc != VL_EINVAL) fail_msg("%s: got %d (%s), wanted VL_EINVAL", text, rc, e.msg);
    if (!strstr(e.msg, needle)) fail_msg("%s: message '%s' lacks '%s'", text, e.msg, needle);
    assert_memory_equal(&c, &before, sizeof c);
}

#endif
