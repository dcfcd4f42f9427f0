/* Fuzz target: the safetensors decoder (st_parse), which every tensor
 * from the network passes through: updates, models, deltas, second-round
 * files. An accepted file must describe only bytes inside the input, its
 * F32/F16 tensors must convert, and writing it again with st_writer must
 * give a file that parses to the same tensors and metadata. */
#include <string.h>

#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

static void check_same(const st_file *a, const st_file *b) {
    FUZZ_CHECK(a->ntensors == b->ntensors, "%d tensors became %d", a->ntensors, b->ntensors);
    FUZZ_CHECK(a->nmeta == b->nmeta, "%d metadata entries became %d", a->nmeta, b->nmeta);
    for (int i = 0; i < a->nmeta; i++) {
        const char *v = st_meta_get(b, a->meta[i].key);
        FUZZ_CHECK(v && strcmp(v, a->meta[i].value) == 0, "metadata '%s' changed", a->meta[i].key);
    }
    for (int i = 0; i < a->ntensors; i++) {
        const st_tensor *x = &a->tensors[i], *y = st_find(b, x->name);
        FUZZ_CHECK(y != NULL, "tensor '%s' lost", x->name);
        FUZZ_CHECK(x->dtype == y->dtype && x->ndim == y->ndim && x->numel == y->numel &&
                       x->nbytes == y->nbytes,
                   "tensor '%s' changed its description", x->name);
        FUZZ_CHECK(memcmp(x->shape, y->shape, sizeof x->shape[0] * (size_t)x->ndim) == 0,
                   "tensor '%s' changed its shape", x->name);
        FUZZ_CHECK(x->nbytes == 0 || memcmp(x->data, y->data, x->nbytes) == 0,
                   "tensor '%s' changed its data", x->name);
    }
}

static void round_trip(const st_file *f, size_t header_len) {
    /* A header near the cap may grow past it when written in the
     * writer's layout; such files are left out of this check. */
    if (header_len > ST_MAX_HEADER / 2) return;
    st_writer w;
    st_writer_init(&w);
    for (int i = 0; i < f->nmeta; i++)
        FUZZ_CHECK(st_writer_meta(&w, f->meta[i].key, f->meta[i].value) == VL_OK,
                   "the writer refuses metadata '%s' the parser took", f->meta[i].key);
    for (int i = 0; i < f->ntensors; i++) {
        const st_tensor *t = &f->tensors[i];
        FUZZ_CHECK(st_writer_add(&w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes) ==
                       VL_OK,
                   "the writer refuses tensor '%s' the parser took", t->name);
    }
    vl_buf out;
    vl_buf_init(&out, VL_BUF_DEFAULT_CAP);
    vl_error e = {0};
    FUZZ_CHECK(st_writer_finish(&w, &out, &e) == VL_OK, "writing a parsed file failed: %s", e.msg);
    st_file g;
    FUZZ_CHECK(st_parse(out.data, out.len, &g, &e) == VL_OK, "a written file does not parse: %s",
               e.msg);
    check_same(f, &g);
    st_free(&g);
    vl_buf_free(&out);
    st_writer_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file f;
    vl_error e = {0};
    if (st_parse(data, size, &f, &e) != VL_OK) {
        FUZZ_CHECK(f.ntensors == 0 && f.tensors == NULL, "a refused file left tensors behind");
        FUZZ_CHECK(e.msg[0] != '\0', "a refusal without a message");
        return 0;
    }
    size_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = header_len << 8 | data[i];
    for (int i = 0; i < f.ntensors; i++) {
        const st_tensor *t = &f.tensors[i];
        FUZZ_CHECK(t->nbytes == t->numel * st_dtype_size(t->dtype), "'%s' size", t->name);
        FUZZ_CHECK(t->nbytes == 0 ||
                       (t->data >= data + 8 + header_len && t->data + t->nbytes <= data + size),
                   "'%s' points outside the data block", t->name);
        FUZZ_CHECK(st_find(&f, t->name) == t, "'%s' is not unique", t->name);
        if (t->dtype == ST_F32 || t->dtype == ST_F16) {
            float *x = malloc(t->numel ? t->numel * sizeof *x : 1);
            FUZZ_CHECK(x != NULL, "out of memory");
            FUZZ_CHECK(st_tensor_to_f32(t, x, (size_t)t->numel, &e) == VL_OK,
                       "'%s' does not convert: %s", t->name, e.msg);
            free(x);
        }
    }
    round_trip(&f, header_len);
    st_free(&f);
    return 0;
}
