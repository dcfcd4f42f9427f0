/*
 * Unit tests for what the MLP classifier's convolution front end refuses
 * (model/model.h, model/mlp_io.h): configuration JSON with a bad, missing,
 * extra or out-of-range "image" or "conv" field, each refused with the
 * field named and the output untouched; configurations whose fields are
 * each in range but whose shapes are not (an image that does not hold D
 * values, a conv output past the width limit, too much scratch per image,
 * too many parameters); the same checks on the struct, with values that
 * would wrap 32-bit products; and configuration equality, which looks at
 * the fields in use only. test_mlp_io.c has what round-trips.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

static const model_mlp_config SMALL = {
    .in_dim = 5, .n_hidden = 2, .hidden = {7, 3}, .n_classes = 4};


static void test_conv_config_parse_refusals(void **state) {
    (void)state;
#define HEAD "{\"kind\":\"mlp\",\"in_dim\":784,"
#define TAIL "\"hidden\":[8],\"classes\":10}"
#define CONV1 "\"conv\":[{\"channels\":4,\"kernel\":3,\"stride\":1}],"
#define IMG "\"image\":[1,28,28],"
    refused(HEAD IMG TAIL, "conv is missing");
    refused(HEAD CONV1 TAIL, "needs image");
    refused(HEAD "\"image\":[1,28]," CONV1 TAIL, "image must be an array");
    refused(HEAD "\"image\":[1,28,28,1]," CONV1 TAIL, "image must be an array");
    refused(HEAD "\"image\":784," CONV1 TAIL, "image must be an array");
    refused(HEAD "\"image\":[0,28,28]," CONV1 TAIL, "image[0]");
    refused(HEAD "\"image\":[1,\"28\",28]," CONV1 TAIL, "image[1]");
    refused(HEAD "\"image\":[1,28,65537]," CONV1 TAIL, "image[2]");
    refused(HEAD "\"image\":[1,28,27]," CONV1 TAIL, "in_dim");
    refused(HEAD "\"image\":[65536,65536,65536]," CONV1 TAIL, "in_dim");
    refused(HEAD IMG "\"conv\":[]," TAIL, "conv must be an array");
    refused(HEAD IMG "\"conv\":{\"channels\":4,\"kernel\":3}," TAIL, "conv must be an array");
    refused(HEAD IMG "\"conv\":[{\"channels\":1,\"kernel\":1},{\"channels\":1,\"kernel\":1},"
                     "{\"channels\":1,\"kernel\":1},{\"channels\":1,\"kernel\":1},"
                     "{\"channels\":1,\"kernel\":1}]," TAIL,
            "conv must be an array of 1 to 4");
    refused(HEAD IMG "\"conv\":[4]," TAIL, "conv[0] must be an object");
    refused(HEAD IMG "\"conv\":[{\"channels\":4,\"kernel\":3,\"pad\":1}]," TAIL,
            "conv[0]: unknown key \"pad\"");
    refused(HEAD IMG "\"conv\":[{\"kernel\":3}]," TAIL, "conv[0].channels");
    refused(HEAD IMG "\"conv\":[{\"channels\":0,\"kernel\":3}]," TAIL, "conv[0].channels");
    refused(HEAD IMG "\"conv\":[{\"channels\":4}]," TAIL, "conv[0].kernel");
    refused(HEAD IMG
            "\"conv\":[{\"channels\":4,\"kernel\":3},{\"channels\":4,\"kernel\":16}]," TAIL,
            "conv[1].kernel");
    refused(HEAD IMG "\"conv\":[{\"channels\":4,\"kernel\":0}]," TAIL, "conv[0].kernel");
    refused(HEAD IMG "\"conv\":[{\"channels\":4,\"kernel\":3,\"stride\":0}]," TAIL,
            "conv[0].stride");
    refused(HEAD IMG "\"conv\":[{\"channels\":4,\"kernel\":3,\"stride\":9}]," TAIL,
            "conv[0].stride");
    refused(HEAD IMG "\"conv\":[{\"channels\":4,\"kernel\":3,\"stride\":2.0}]," TAIL,
            "conv[0].stride");
    refused(HEAD IMG "\"conv\":[{\"channels\":4,\"kernel\":3,\"stride\":null}]," TAIL,
            "conv[0].stride");
    /* Each field in range, but the output too wide: 128 x 28 x 28. */
    refused(HEAD IMG "\"conv\":[{\"channels\":128,\"kernel\":3}]," TAIL, "conv[0] output");
    /* A second layer that widens past the limit. */
    refused(HEAD IMG "\"conv\":[{\"channels\":16,\"kernel\":3,\"stride\":2},"
                     "{\"channels\":512,\"kernel\":3}]," TAIL,
            "conv[1] output");
    /* A 256 x 256 image under a 15 x 15 kernel: 226 * 2^16 floats of
     * scratch per image. */
    refused("{\"kind\":\"mlp\",\"in_dim\":65536,\"image\":[1,256,256],\"conv\":[{\"channels\":1,"
            "\"kernel\":15}],\"hidden\":[8],\"classes\":10}",
            "scratch");
    /* Every width in range but too many parameters. */
    refused("{\"kind\":\"mlp\",\"in_dim\":65536,\"image\":[1,256,256],\"conv\":[{\"channels\":1,"
            "\"kernel\":3}],\"hidden\":[65536],\"classes\":10}",
            "param");
    /* A repeated key inside a layer. */
    refused(HEAD IMG "\"conv\":[{\"channels\":4,\"kernel\":3,\"kernel\":5}]," TAIL,
            "not a JSON object");
#undef HEAD
#undef TAIL
#undef CONV1
#undef IMG
}

/* A configuration model_mlp_config_validate must refuse, naming needle. */
static void invalid(model_mlp_config c, const char *needle) {
    vl_error e = {0};
    assert_int_equal(model_mlp_config_validate(&c, &e), VL_EINVAL);
    if (!strstr(e.msg, needle)) fail_msg("message '%s' lacks '%s'", e.msg, needle);
    model_mlp *m = (model_mlp *)&e;
    assert_int_equal(model_mlp_create(&c, &m, &e), VL_EINVAL);
    assert_null(m);
}

static void test_conv_config_validate(void **state) {
    (void)state;
    OK(model_mlp_config_validate(&FASHION_CNN, &e_));
    model_mlp_config c = SMALL;
    c.image[1] = 5; /* an image without conv layers means nothing */
    invalid(c, "image");
    c = FASHION_CNN;
    c.n_conv = MODEL_MLP_MAX_CONV + 1;
    invalid(c, "n_conv");
    c.n_conv = -1;
    invalid(c, "n_conv");
    c = FASHION_CNN;
    c.image[0] = 2;
    invalid(c, "in_dim");
    c.image[0] = -1;
    invalid(c, "image[0]");
    c = FASHION_CNN;
    c.image[1] = INT32_MAX; /* products in 64 bits: no wrap to a "match" */
    c.image[2] = INT32_MAX;
    invalid(c, "image[1]");
    c = FASHION_CNN;
    c.conv[1].channels = -3;
    invalid(c, "conv[1].channels");
    c = FASHION_CNN;
    c.conv[0].kernel = INT32_MIN;
    invalid(c, "conv[0].kernel");
    c = FASHION_CNN;
    c.conv[1].stride = MODEL_MLP_MAX_STRIDE + 1;
    invalid(c, "conv[1].stride");
    /* Unused entries are not looked at. */
    c = FASHION_CNN;
    c.conv[3].kernel = -7;
    OK(model_mlp_config_validate(&c, &e_));

    /* Equality looks at what is used. */
    model_mlp_config a = FASHION_CNN, b = FASHION_CNN;
    b.conv[2].channels = 99;
    assert_true(model_mlp_config_equal(&a, &b));
    b.conv[1].stride = 1;
    assert_false(model_mlp_config_equal(&a, &b));
    b = FASHION_CNN;
    b.image[0] = 4;
    assert_false(model_mlp_config_equal(&a, &b));
    b = FASHION_CNN;
    b.n_conv = 1;
    assert_false(model_mlp_config_equal(&a, &b));
    assert_int_equal(model_mlp_config_num_layers(&FASHION_CNN), 4);
    assert_int_equal(model_mlp_config_num_layers(&SMALL), 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_config_parse_refusals),
        cmocka_unit_test(test_conv_config_validate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
