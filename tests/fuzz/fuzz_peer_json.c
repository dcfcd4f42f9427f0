/* Fuzz target: the JSON a peer reads from the coordinator: a task lease
 * (peer_task_parse), the join reply (peer_join_reply_parse), an error body
 * (peer_error_parse), the model configuration a model file carries
 * (peer_model_config_parse), and a Retry-After value. Input: one selector
 * byte, then the text. Accepted leases must stay within every bound the
 * peer promises before it allocates or fetches anything. */
#include <string.h>

#include "peer/peer.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

static int printable(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7F) return 0;
    return 1;
}

static void check_task(const peer_task *t) {
    FUZZ_CHECK(t->steps >= 1 && t->steps <= PEER_MAX_STEPS && t->batch >= 1 &&
                   t->batch <= PEER_MAX_BATCH && t->context >= 1 &&
                   t->context <= PEER_MAX_CONTEXT &&
                   (int64_t)t->batch * t->context <= PEER_MAX_BATCH_TOKENS,
               "training sizes out of bounds");
    FUZZ_CHECK(t->length >= (int64_t)t->context + 1 && t->length <= PEER_MAX_DATA_BYTES &&
                   t->offset >= 0 && t->offset <= INT64_MAX - t->length,
               "a data range out of bounds");
    FUZZ_CHECK(t->h_min >= 1 && t->h_min <= t->steps, "h_min %d of %d steps", t->h_min, t->steps);
    FUZZ_CHECK(t->shard[0] && strspn(t->shard, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"
                                               "VWXYZ0123456789_-") == strlen(t->shard),
               "shard name '%s'", t->shard);
    FUZZ_CHECK(t->run[0] && printable(t->run), "run name");
    FUZZ_CHECK(t->dtype == ST_F32 || t->dtype == ST_F16, "dtype");
    FUZZ_CHECK(t->lr > 0 && t->eps > 0 && t->beta1 >= 0 && t->beta1 < 1 && t->beta2 >= 0 &&
                   t->beta2 < 1,
               "optimizer hyper-parameters");
    FUZZ_CHECK(t->comp_decay > 0 && t->comp_decay <= 1, "residual decay %g", (double)t->comp_decay);
    if (t->method == PEER_METHOD_SKETCH)
        FUZZ_CHECK(t->comp_rows >= 1 && t->comp_rows <= COMPRESS_SKETCH_MAX_ROWS &&
                       t->comp_cols >= 1 &&
                       (uint64_t)t->comp_rows * t->comp_cols <= COMPRESS_SKETCH_MAX_CELLS,
                   "a sketch of %u x %u", t->comp_rows, t->comp_cols);
    if (t->method == PEER_METHOD_TOPK || t->method == PEER_METHOD_GAUSSK)
        FUZZ_CHECK(t->comp_k >= 1 && t->comp_k <= UINT32_MAX, "k %lld", (long long)t->comp_k);
    char desc[160];
    peer_task_describe_compression(t, desc, sizeof desc);
    FUZZ_CHECK(printable(desc), "compression description");
    vl_error e = {0};
    FUZZ_CHECK(peer_task_check_run(t, t->run, &e) == VL_OK, "its own run refused");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0] % 5;
    data++;
    size--;
    vl_error e = {0};
    switch (mode) {
    case 0: {
        peer_task t;
        if (peer_task_parse((const char *)data, size, &t, &e) == VL_OK)
            check_task(&t);
        else
            FUZZ_CHECK(e.msg[0] != '\0', "a refused task without a message");
        break;
    }
    case 1: {
        peer_state st;
        memset(&st, 0, sizeof st);
        if (peer_join_reply_parse(data, size, &st, &e) == VL_OK)
            FUZZ_CHECK(st.peer_id > 0 && st.run[0] && printable(st.run), "join reply accepted");
        break;
    }
    case 2: {
        char code[16], msg[40];
        peer_error_parse(data, size, code, sizeof code, msg, sizeof msg);
        FUZZ_CHECK(memchr(code, '\0', sizeof code) && memchr(msg, '\0', sizeof msg),
                   "unterminated output");
        FUZZ_CHECK(printable(code) && printable(msg), "a control character in the output");
        vl_error r = {0};
        FUZZ_CHECK(peer_refusal(&r, "fuzz", 400, data, size) == PEER_EREFUSED && printable(r.msg),
                   "a refusal line that is not one printable line");
        break;
    }
    case 3: {
        char *s = fuzz_cstr(data, size);
        model_gpt_config c;
        if (peer_model_config_parse(s, &c, &e) == VL_OK)
            FUZZ_CHECK(c.n_head >= 1 && c.n_embd % c.n_head == 0 && c.vocab_size >= 1 &&
                           c.block_size >= 1 && c.n_layer >= 1,
                       "a model configuration out of bounds");
        free(s);
        break;
    }
    default: {
        char *s = fuzz_cstr(data, size);
        double d = peer_retry_after_parse(s, 1700000000);
        FUZZ_CHECK(d == -1 || d >= 0, "Retry-After %g", d);
        free(s);
        break;
    }
    }
    return 0;
}
