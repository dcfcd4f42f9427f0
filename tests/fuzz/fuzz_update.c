/* Fuzz target: decoding and validating what peers upload, as the
 * coordinator does it: updates (compress_update_decode, the run check,
 * adding them into a sum, and the K-FAC factors they may carry, checked
 * against a fixed two-layer model and added into a weighted sum) and
 * second-round messages (candidates and values). Input: one selector
 * byte (which decoder), a little-endian u32 that sets the model size (1
 * to 65536 parameters), then the file. */
#include <math.h>
#include <string.h>

#include "compress/compress.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

/* Every value finite and within COMPRESS_MAX_ABS. */
static int all_finite_tensor(const st_tensor *t) {
    float *x = malloc(t->numel ? t->numel * sizeof *x : 1);
    FUZZ_CHECK(x != NULL, "out of memory");
    FUZZ_CHECK(st_tensor_to_f32(t, x, (size_t)t->numel, NULL) == VL_OK, "'%s' converts", t->name);
    int ok = compress_all_finite(x, (size_t)t->numel);
    for (size_t i = 0; ok && i < t->numel; i++) ok = fabsf(x[i]) <= COMPRESS_MAX_ABS;
    free(x);
    return ok;
}

/* The layers the factors of a fuzzed update are checked against (the
 * seeds carry factors of these). */
static const compress_factor_layer FACTOR_LAYERS[2] = {{"h.0.attn.c_attn", 3, 4},
                                                       {"h.0.mlp.c_proj", 5, 2}};

/* Factors either decode into finite matrices of the layers' shapes that
 * add into a sum, or are refused leaving nothing behind. */
static void check_factors(const compress_update *u) {
    compress_factors_view v;
    const char *code = NULL;
    vl_error e = {0};
    int rc = compress_factors_decode(&u->file, FACTOR_LAYERS, 2, &v, &code, &e);
    if (rc != VL_OK) {
        FUZZ_CHECK(rc == VL_EINVAL || rc == VL_ERANGE, "factors: decode returned %d", rc);
        FUZZ_CHECK(v.n == 0 && v.A == NULL, "a refusal left factors behind");
        FUZZ_CHECK((rc == VL_ERANGE) == (code != NULL), "factors: code for rc %d", rc);
        return;
    }
    FUZZ_CHECK(v.samples >= 1 && v.samples <= COMPRESS_FACTORS_MAX_SAMPLES, "samples %lld",
               (long long)v.samples);
    float x[25];
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) {
            uint32_t d = k ? FACTOR_LAYERS[i].g_dim : FACTOR_LAYERS[i].a_dim;
            FUZZ_CHECK(compress_factors_values(&v, i, k, x, (size_t)d * d, NULL) == VL_OK &&
                           compress_all_finite(x, (size_t)d * d),
                       "accepted factors %d.%d do not convert to finite values", i, k);
        }
    compress_factors_sum s;
    FUZZ_CHECK(compress_factors_sum_init(&s, FACTOR_LAYERS, 2, NULL) == VL_OK, "sum init");
    FUZZ_CHECK(compress_factors_sum_add(&s, &v, (double)v.samples, NULL) == VL_OK,
               "accepted factors do not add into a sum");
    compress_factors_sum_free(&s);
    compress_factors_view_free(&v);
}

/* What an accepted update promises, then the spec and sum it meets. */
static void check_update(const compress_update *u, size_t n) {
    const compress_update_meta *m = &u->meta;
    FUZZ_CHECK(m->task >= 1 && m->peer >= 1 && m->base_version >= 0 && m->num_samples >= 1 &&
                   m->num_samples <= COMPRESS_MAX_SAMPLES && m->local_steps >= 1 &&
                   isfinite(m->loss) && strlen(m->run) < sizeof m->run,
               "metadata out of range");
    compress_spec spec = {
        .kind = m->kind, .max_nnz = u->nnz, .rows = u->rows, .cols = u->cols, .seed = m->seed};
    const char *code = NULL;
    FUZZ_CHECK(compress_update_check_spec(u, &spec, &code, NULL) == VL_OK,
               "an update fails a spec made from itself");
    spec.kind = (compress_kind)((m->kind + 1) % 3);
    FUZZ_CHECK(compress_update_check_spec(u, &spec, &code, NULL) == VL_ERANGE && code &&
                   strcmp(code, "wrong_kind") == 0,
               "an update passes the spec of another kind");
    if (m->kind == COMPRESS_SKETCH) {
        const st_tensor *t = u->table;
        FUZZ_CHECK(t && u->rows >= 1 && u->rows <= COMPRESS_SKETCH_MAX_ROWS && u->cols >= 1 &&
                       (uint64_t)u->rows * u->cols == t->numel && all_finite_tensor(t),
                   "a sketch of %u x %u", u->rows, u->cols);
        compress_sketch s;
        FUZZ_CHECK(compress_sketch_init(&s, u->rows, u->cols, m->seed, NULL) == VL_OK,
                   "no sketch of the update's shape");
        FUZZ_CHECK(compress_update_accumulate_sketch(u, 0.5f, &s, NULL) == VL_OK,
                   "the sketch does not add into its own shape");
        compress_sketch_free(&s);
        return;
    }
    float *dst = calloc(n, sizeof *dst);
    FUZZ_CHECK(dst != NULL, "out of memory");
    if (m->kind == COMPRESS_DENSE) {
        FUZZ_CHECK(u->delta && u->nnz == n && u->delta->numel == n && all_finite_tensor(u->delta),
                   "a dense update of %zu values for %zu parameters", u->nnz, n);
    } else {
        FUZZ_CHECK(u->indices && u->values && u->nnz <= n && u->indices->numel == u->nnz &&
                       u->values->numel == u->nnz && all_finite_tensor(u->values),
                   "a sparse update of %zu entries", u->nnz);
        uint32_t *idx = malloc(u->nnz * sizeof *idx + 1);
        FUZZ_CHECK(idx != NULL, "out of memory");
        memcpy(idx, u->indices->data, u->nnz * sizeof *idx);
        FUZZ_CHECK(compress_indices_valid(idx, u->nnz, n), "indices out of order or range");
        free(idx);
    }
    FUZZ_CHECK(compress_update_accumulate(u, 1.0f, dst, n, NULL) == VL_OK,
               "an accepted update does not add up");
    /* One step of finite values, each at most F32's largest: finite. */
    FUZZ_CHECK(compress_all_finite(dst, n), "the sum of one update is not finite");
    FUZZ_CHECK(compress_update_accumulate(u, 1.0f, dst, n - 1 + (n == 1), NULL) != VL_OK ||
                   m->kind == COMPRESS_TOPK || n == 1,
               "a dense update adds into a vector of another size");
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 5) return 0;
    int mode = data[0] % 3;
    size_t n = (size_t)(fuzz_u32(data + 1, size - 1) % 65536) + 1;
    data += 5;
    size -= 5;
    vl_error e = {0};
    if (mode == 0) {
        compress_update u;
        const char *code = NULL;
        int rc = compress_update_decode(data, size, n, &u, &code, &e);
        if (rc == VL_OK) {
            check_update(&u, n);
            if (u.has_factors) check_factors(&u);
            compress_update_free(&u);
            return 0;
        }
        FUZZ_CHECK(rc == VL_EINVAL || rc == VL_ERANGE, "decode returned %d", rc);
        FUZZ_CHECK((rc == VL_ERANGE) == (code != NULL), "code %s for rc %d", code ? code : "(none)",
                   rc);
        FUZZ_CHECK(e.msg[0] != '\0', "a refusal without a message");
        return 0;
    }
    compress_round_meta m;
    if (mode == 1) {
        uint32_t *idx = NULL;
        size_t k = 0;
        if (compress_round_decode_candidates(data, size, n, &m, &idx, &k, &e) == VL_OK) {
            FUZZ_CHECK(k > 0 && compress_indices_valid(idx, k, n), "bad candidates accepted");
            free(idx);
        } else {
            FUZZ_CHECK(idx == NULL && k == 0, "a refusal left candidates behind");
        }
        return 0;
    }
    float *vals = NULL;
    size_t k = 0;
    const char *code = NULL;
    int rc = compress_round_decode_values(data, size, n, &m, &vals, &k, &code, &e);
    if (rc == VL_OK) {
        FUZZ_CHECK(k == n && compress_all_finite(vals, k) && m.task >= 1 && m.peer >= 1,
                   "bad values accepted");
        for (size_t i = 0; i < k; i++)
            FUZZ_CHECK(fabsf(vals[i]) <= COMPRESS_MAX_ABS, "value %zu out of bounds", i);
        free(vals);
    } else {
        FUZZ_CHECK(vals == NULL && k == 0, "a refusal left values behind");
        FUZZ_CHECK((rc == VL_ERANGE) == (code != NULL), "code for rc %d", rc);
    }
    return 0;
}
