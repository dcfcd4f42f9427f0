/* Fuzz target: the files a peer takes from the coordinator and applies to
 * the model it holds: a model file (peer_trainer_load) and a delta
 * (peer_trainer_apply_delta). Whatever either refuses must leave the
 * held base parameters and version exactly as they were; whatever they
 * accept must leave finite parameters. Input: one selector byte, then the
 * file. The held model is the one-layer byte GPT of the seeds (version
 * 3 of run "fuzz"); model files name version 4, deltas go from 3 to 4. */
#include <math.h>
#include <string.h>

#include "peer/peer.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const model_gpt_config HELD = FUZZ_PEER_CONFIG;
#define HELD_VERSION FUZZ_PEER_HELD
#define NEXT_VERSION FUZZ_PEER_NEXT

static peer_trainer tr;
static float *snapshot;

static void hold(void) {
    vl_error e = {0};
    peer_trainer_free(&tr);
    peer_trainer_init(&tr);
    FUZZ_CHECK(peer_trainer_init_model(&tr, &HELD, HELD_VERSION, &e) == VL_OK, "%s", e.msg);
    free(snapshot);
    snapshot = malloc(tr.n_params * sizeof *snapshot);
    FUZZ_CHECK(snapshot != NULL, "out of memory");
    memcpy(snapshot, tr.base, tr.n_params * sizeof *snapshot);
}

static void release(void) {
    peer_trainer_free(&tr);
    free(snapshot);
    snapshot = NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    peer_trainer_init(&tr);
    hold();
    atexit(release);
    return 0;
}

static void check_unchanged(const char *what, const vl_error *e) {
    FUZZ_CHECK(e->msg[0] != '\0', "a refused %s without a message", what);
    FUZZ_CHECK(tr.base_version == HELD_VERSION && tr.n_params == model_gpt_config_num_params(&HELD),
               "a refused %s changed the held model", what);
    FUZZ_CHECK(memcmp(tr.base, snapshot, tr.n_params * sizeof *snapshot) == 0,
               "a refused %s changed the base parameters", what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int delta = data[0] & 1;
    data++;
    size--;
    vl_error e = {0};
    int rc = delta ? peer_trainer_apply_delta(&tr, data, size, "fuzz", NEXT_VERSION, &e)
                   : peer_trainer_load(&tr, data, size, "fuzz", NEXT_VERSION, &e);
    if (rc != VL_OK) {
        check_unchanged(delta ? "delta" : "model", &e);
        return 0;
    }
    FUZZ_CHECK(tr.base_version == NEXT_VERSION, "an accepted file did not move the version");
    int finite = 1;
    for (size_t i = 0; i < tr.n_params; i++) finite &= isfinite(tr.base[i]) != 0;
    FUZZ_CHECK(finite, "an accepted %s left a non-finite parameter", delta ? "delta" : "model");
    hold();
    return 0;
}
