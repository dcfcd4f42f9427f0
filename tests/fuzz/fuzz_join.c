/* Fuzz target: the coordinator's JSON request body, POST /v1/peers
 * (coord_join_parse), the only request whose body is JSON. An accepted
 * body must give a printable name, a token and a hardware object within
 * their bounds; a refused one a message and nothing to free. */
#include <string.h>

#include <jansson.h>

#include "coordinator/coord.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    coord_join_body b;
    vl_error e = {0};
    int rc = coord_join_parse(size ? data : NULL, size, &b, &e);
    if (rc != VL_OK) {
        FUZZ_CHECK(rc == VL_EINVAL || rc == VL_ETOOBIG, "join parse returned %d", rc);
        FUZZ_CHECK(e.msg[0] != '\0' && b.hardware == NULL, "a refusal without a message");
        return 0;
    }
    size_t nl = strlen(b.name);
    FUZZ_CHECK(nl >= 1 && nl <= COORD_JOIN_NAME_MAX, "a name of %zu bytes", nl);
    for (size_t i = 0; i < nl; i++)
        FUZZ_CHECK((unsigned char)b.name[i] >= 0x20 && b.name[i] != 0x7F,
                   "a control character in the name");
    FUZZ_CHECK(b.token_len >= 1 && b.token_len <= COORD_JOIN_TOKEN_MAX, "a token of %zu bytes",
               b.token_len);
    FUZZ_CHECK(b.hardware && strlen(b.hardware) <= COORD_JOIN_HARDWARE_MAX, "hardware size");
    json_t *hw = json_loads(b.hardware, 0, NULL);
    FUZZ_CHECK(json_is_object(hw), "hardware is not an object: %.80s", b.hardware);
    json_decref(hw);
    coord_join_body_free(&b);
    return 0;
}
