/* Fuzz target: the coordinator's JSON request bodies, parsed without a
 * connection: the join (coord_join_parse) and a key rotation
 * (coord_rotate_parse, then the proof checked against fixed keys, which
 * it cannot have been made with). Every input goes to both. An accepted
 * join must give a printable name, a token and a hardware object within
 * their bounds; a refused body a message and nothing to free. */
#include <string.h>

#include <jansson.h>

#include <sodium.h>

#include "coordinator/coord.h"
#include "tests/fuzz/fuzz.h"
#include "coordinator/api/api.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t old_pk[VCRYPTO_PK_BYTES];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    if (vcrypto_init() != VL_OK) abort();
    vcrypto_identity id;
    vcrypto_identity_generate(&id);
    memcpy(old_pk, id.pk, sizeof old_pk);
    return 0;
}

static void rotate(const uint8_t *data, size_t size) {
    uint8_t pk[VCRYPTO_PK_BYTES];
    char proof[VCRYPTO_SIG_B64_LEN + 8];
    vl_error e = {0};
    if (coord_rotate_parse(size ? data : NULL, size, pk, proof, &e) != VL_OK) {
        FUZZ_CHECK(e.msg[0] != '\0', "a refused rotation without a message");
        return;
    }
    FUZZ_CHECK(memchr(proof, '\0', sizeof proof) != NULL, "an unterminated proof");
    /* old_pk is fresh and random: no input holds a proof made for it. */
    FUZZ_CHECK(vcrypto_rotation_verify(pk, 7, old_pk, proof, &e) != VL_OK,
               "a rotation proof verifies without the key");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rotate(data, size);
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
