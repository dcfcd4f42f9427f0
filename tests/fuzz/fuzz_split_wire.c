/* Fuzz target: split learning's messages as their receivers decode them:
 * a peer's batch of activations (split_wire_decode_forward, as the
 * coordinator does before it looks at the lease) and the coordinator's
 * gradient reply (split_wire_decode_reply, as the peer does). Input: one
 * selector byte (0: a request, 1: a reply), then the file. Requests are
 * checked for width 8, at most 16 rows and 10 classes; replies for 4 rows
 * of width 8. */
#include <math.h>
#include <string.h>

#include "common/split_wire.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

#define Q 8
#define MAX_B 16
#define CLASSES 10
#define REPLY_B 4

/* An accepted request holds finite activations of the asked width, a
 * batch in range and labels below the class count; a refused one holds
 * no arrays, and says which error it is. */
static void check_forward(const uint8_t *data, size_t size) {
    split_wire_forward f;
    const char *code = NULL;
    vl_error e = {0};
    int rc = split_wire_decode_forward(data, size, Q, MAX_B, CLASSES, &f, &code, &e);
    if (rc != VL_OK) {
        FUZZ_CHECK(rc == VL_EINVAL || rc == VL_ERANGE || rc == VL_ENOMEM, "forward: rc %d", rc);
        FUZZ_CHECK(f.z == NULL && f.labels == NULL, "a refusal kept arrays");
        FUZZ_CHECK(code != NULL && e.msg[0], "a refusal without its code or message");
        return;
    }
    FUZZ_CHECK(code == NULL, "an accepted request with an error code");
    FUZZ_CHECK(f.B >= 1 && f.B <= MAX_B && f.q == Q, "batch %d x %d", f.B, f.q);
    FUZZ_CHECK(f.peer >= 1 && f.task >= 1 && f.run[0], "metadata");
    for (int i = 0; i < f.B * f.q; i++) FUZZ_CHECK(isfinite(f.z[i]), "z[%d] not finite", i);
    for (int i = 0; i < f.B; i++)
        FUZZ_CHECK(f.labels[i] >= 0 && f.labels[i] < CLASSES, "label %d", f.labels[i]);
    split_wire_forward_free(&f);
}

/* An accepted reply fills dz with finite values and gives a finite loss;
 * a refused one leaves dz as it was. */
static void check_reply(const uint8_t *data, size_t size) {
    float dz[REPLY_B * Q];
    for (int i = 0; i < REPLY_B * Q; i++) dz[i] = -7.0f;
    double loss = -1;
    int64_t step = -1;
    vl_error e = {0};
    int rc = split_wire_decode_reply(data, size, REPLY_B, Q, dz, &loss, &step, &e);
    if (rc != VL_OK) {
        for (int i = 0; i < REPLY_B * Q; i++) FUZZ_CHECK(dz[i] == -7.0f, "a refusal wrote dz");
        return;
    }
    FUZZ_CHECK(isfinite(loss) && loss >= 0 && step >= 0, "loss %g step %lld", loss,
               (long long)step);
    for (int i = 0; i < REPLY_B * Q; i++) FUZZ_CHECK(isfinite(dz[i]), "dz[%d] not finite", i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1) check_reply(data + 1, size - 1);
    else check_forward(data + 1, size - 1);
    return 0;
}
