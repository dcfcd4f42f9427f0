/* Fuzz target: split learning's messages as their receivers decode them:
 * a peer's batch of activations (split_wire_decode_forward, as the
 * coordinator does before it looks at the lease: with labels, without
 * them in a U-shaped run, and a backward request with dy) and the
 * coordinator's reply (split_wire_decode_reply, as the peer does). Input:
 * one selector byte (low two bits: 0 a forward request, 1 a reply, 2 a
 * U-shaped forward request, 3 a backward request), then the file.
 * Requests are checked for width 8, at most 16 rows, 10 classes and (dy)
 * width 6; replies for 4 rows of width 8. */
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
#define H 6

/* An accepted request holds finite activations of the asked width, a
 * batch in range and labels below the class count; a refused one holds
 * no arrays, and says which error it is. */
static void check_forward(const uint8_t *data, size_t size, int h, int classes) {
    split_wire_forward f;
    const char *code = NULL;
    vl_error e = {0};
    int rc = split_wire_decode_forward(data, size, Q, h, MAX_B, classes, &f, &code, &e);
    if (rc != VL_OK) {
        FUZZ_CHECK(rc == VL_EINVAL || rc == VL_ERANGE || rc == VL_ENOMEM, "forward: rc %d", rc);
        FUZZ_CHECK(f.z == NULL && f.labels == NULL && f.dy == NULL, "a refusal kept arrays");
        FUZZ_CHECK(code != NULL && e.msg[0], "a refusal without its code or message");
        return;
    }
    FUZZ_CHECK(code == NULL, "an accepted request with an error code");
    FUZZ_CHECK(f.B >= 1 && f.B <= MAX_B && f.q == Q, "batch %d x %d", f.B, f.q);
    FUZZ_CHECK(f.peer >= 1 && f.task >= 1 && f.run[0], "metadata");
    for (int i = 0; i < f.B * f.q; i++) FUZZ_CHECK(isfinite(f.z[i]), "z[%d] not finite", i);
    FUZZ_CHECK((f.labels != NULL) == (h == 0 && classes > 0), "labels where none belong");
    FUZZ_CHECK((f.dy != NULL) == (h > 0) && f.h == h, "dy where none belongs");
    for (int i = 0; f.labels && i < f.B; i++)
        FUZZ_CHECK(f.labels[i] >= 0 && f.labels[i] < classes, "label %d", f.labels[i]);
    for (int i = 0; f.dy && i < f.B * h; i++) FUZZ_CHECK(isfinite(f.dy[i]), "dy[%d]", i);
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
    int rc = split_wire_decode_reply(data, size, "dz", REPLY_B, Q, dz, &loss, &step, &e);
    if (rc != VL_OK) {
        for (int i = 0; i < REPLY_B * Q; i++) FUZZ_CHECK(dz[i] == -7.0f, "a refusal wrote dz");
        return;
    }
    FUZZ_CHECK((isnan(loss) || loss >= 0) && step >= 0, "loss %g step %lld", loss, (long long)step);
    for (int i = 0; i < REPLY_B * Q; i++) FUZZ_CHECK(isfinite(dz[i]), "dz[%d] not finite", i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    switch (data[0] & 3) {
    case 0: check_forward(data + 1, size - 1, 0, CLASSES); break;
    case 1: check_reply(data + 1, size - 1); break;
    case 2: check_forward(data + 1, size - 1, 0, 0); break;
    default: check_forward(data + 1, size - 1, H, 0); break;
    }
    return 0;
}
