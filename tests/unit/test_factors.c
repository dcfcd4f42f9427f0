/*
 * Unit tests for K-FAC factors on the wire (compress/factors.c): F32 and
 * F16 round trips inside dense and top-k updates and in a merged-factors
 * file (F16 scaled so that tiny G entries survive), each kind of bad
 * factor refused with its code and nothing half-decoded, and the weighted
 * mean against a plain double reference.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/common.h"
#include "compress/compress.h"
#include "tests/unit/test_util.h"

#define NLAYER 2
static const compress_factor_layer LAYERS[NLAYER] = {{"h.0.attn.c_attn", 5, 6},
                                                     {"h.0.mlp.c_proj", 7, 3}};

/* Factors as K-FAC makes them: A = (1/N) Σ x̄x̄ᵀ with x̄ = [x, 1], G =
 * (1/N) Σ ggᵀ, times g_scale (real G entries are tiny). */
typedef struct fset {
    float *A[NLAYER], *G[NLAYER];
} fset;

static void outer_mean(float *F, int d, int with_one, int N, double scale, uint64_t seed) {
    float *x = random_vec((size_t)N * d, seed);
    for (int r = 0; r < d; r++)
        for (int c = 0; c < d; c++) {
            double s = 0.0;
            for (int i = 0; i < N; i++) {
                double a = with_one && r == d - 1 ? 1.0 : x[i * d + r];
                double b = with_one && c == d - 1 ? 1.0 : x[i * d + c];
                s += a * b;
            }
            F[r * d + c] = (float)(s / N * (with_one && r == d - 1 && c == d - 1 ? 1.0 : scale));
        }
    free(x);
}

static void fset_make(fset *f, uint64_t seed) {
    for (int i = 0; i < NLAYER; i++) {
        uint32_t a = LAYERS[i].a_dim, g = LAYERS[i].g_dim;
        f->A[i] = malloc((size_t)a * a * sizeof(float));
        f->G[i] = malloc((size_t)g * g * sizeof(float));
        assert_non_null(f->A[i]);
        assert_non_null(f->G[i]);
        outer_mean(f->A[i], (int)a, 1, 9, 1.0, seed + 10 * (uint64_t)i);
        outer_mean(f->G[i], (int)g, 0, 9, 1e-7, seed + 10 * (uint64_t)i + 1);
    }
}

static void fset_free(fset *f) {
    for (int i = 0; i < NLAYER; i++) free(f->A[i]), free(f->G[i]);
}

static compress_factors as_factors(const fset *f, st_dtype dt, int64_t samples) {
    return (compress_factors){.layers = LAYERS,
                              .n = NLAYER,
                              .A = (const float *const *)f->A,
                              .G = (const float *const *)f->G,
                              .samples = samples,
                              .dtype = dt};
}

static compress_update_meta meta(compress_kind kind, const compress_factors *f) {
    compress_update_meta m;
    memset(&m, 0, sizeof m);
    snprintf(m.run, sizeof m.run, "r");
    m.task = 3, m.peer = 2, m.base_version = 1, m.kind = kind, m.num_samples = 64;
    m.local_steps = 2, m.loss = 2.5, m.factors = f;
    return m;
}

/* Largest |got - want| over the matrix's largest |want|. */
static double rel_err(const float *got, const float *want, size_t n) {
    double d = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)got[i] - want[i]));
        m = fmax(m, fabs((double)want[i]));
    }
    return d / m;
}

static void check_values(const compress_factors_view *v, const fset *f, double tol) {
    for (int i = 0; i < NLAYER; i++)
        for (int k = 0; k < 2; k++) {
            uint32_t d = k == 0 ? LAYERS[i].a_dim : LAYERS[i].g_dim;
            size_t n = (size_t)d * d;
            float *got = malloc(n * sizeof *got);
            assert_non_null(got);
            OK(compress_factors_values(v, i, k, got, n, &e_));
            const float *want = k == 0 ? f->A[i] : f->G[i];
            if (tol == 0.0)
                assert_memory_equal(got, want, n * sizeof *got);
            else
                assert_true(rel_err(got, want, n) <= tol);
            free(got);
        }
}

static void test_round_trip(void **state) {
    (void)state;
    fset f;
    fset_make(&f, 1);
    float delta[10];
    for (int i = 0; i < 10; i++) delta[i] = 0.25f * (float)i;
    for (int dt = 0; dt < 2; dt++) {
        compress_factors cf = as_factors(&f, dt ? ST_F16 : ST_F32, 640);
        compress_update_meta m = meta(COMPRESS_DENSE, &cf);
        vl_buf b;
        vl_buf_init(&b, 1 << 20);
        OK(compress_update_encode_dense(&m, delta, 10, ST_F32, &b, &e_));
        compress_update u;
        OK(compress_update_decode(b.data, b.len, 10, &u, NULL, &e_));
        assert_true(u.has_factors);
        assert_null(u.meta.factors);
        assert_int_equal(u.nnz, 10);
        compress_factors_view v;
        OK(compress_factors_decode(&u.file, LAYERS, NLAYER, &v, NULL, &e_));
        assert_int_equal(v.samples, 640);
        assert_true(dt ? v.scale != NULL : v.scale == NULL);
        /* F16 keeps 11 bits of each matrix scaled to its largest entry,
         * even for G's entries near 1e-7, far below F16's normal range */
        check_values(&v, &f, dt ? 1e-3 : 0.0);
        compress_factors_view_free(&v);
        compress_update_free(&u);
        vl_buf_free(&b);
    }
    /* a top-k update with factors, and one without */
    uint32_t idx[2] = {1, 7};
    float val[2] = {0.5f, -1.0f};
    compress_factors cf = as_factors(&f, ST_F32, 5);
    compress_update_meta m = meta(COMPRESS_TOPK, &cf);
    vl_buf b;
    vl_buf_init(&b, 1 << 20);
    OK(compress_update_encode_topk(&m, idx, val, 2, ST_F16, &b, &e_));
    compress_update u;
    OK(compress_update_decode(b.data, b.len, 10, &u, NULL, &e_));
    assert_true(u.has_factors);
    assert_int_equal(u.nnz, 2);
    compress_update_free(&u);
    vl_buf_reset(&b);
    m.factors = NULL;
    OK(compress_update_encode_topk(&m, idx, val, 2, ST_F16, &b, &e_));
    OK(compress_update_decode(b.data, b.len, 10, &u, NULL, &e_));
    assert_false(u.has_factors);
    compress_factors_view v;
    vl_error err = {0};
    assert_int_equal(compress_factors_decode(&u.file, LAYERS, NLAYER, &v, NULL, &err), VL_EINVAL);
    assert_non_null(strstr(err.msg, "kfac_samples"));
    compress_update_free(&u);

    /* the merged file */
    vl_buf_reset(&b);
    cf.samples = 1280;
    OK(compress_factors_encode_file(&cf, "run-1", 12, &b, &e_));
    st_file sf;
    OK(st_parse(b.data, b.len, &sf, &e_));
    assert_string_equal(st_meta_get(&sf, "format"), COMPRESS_FACTORS_FORMAT);
    assert_string_equal(st_meta_get(&sf, "run"), "run-1");
    assert_string_equal(st_meta_get(&sf, "version"), "12");
    OK(compress_factors_decode(&sf, LAYERS, NLAYER, &v, NULL, &e_));
    assert_int_equal(v.samples, 1280);
    check_values(&v, &f, 0.0);
    compress_factors_view_free(&v);
    st_free(&sf);
    vl_buf_free(&b);
    fset_free(&f);
}

/* ---- refusals ---------------------------------------------------------------------- */

/* Builds a merged file by hand from f with one thing changed by `bad`,
 * parses it and returns what decoding says; *code gets the code. */
typedef void (*spoil_fn)(st_writer *w, fset *f, int *skip, float *scale);

static int decode_spoiled(spoil_fn bad, st_dtype dt, const char **code, vl_error *err) {
    fset f;
    fset_make(&f, 7);
    st_writer w;
    st_writer_init(&w);
    int skip = -1;
    float scale[2 * NLAYER] = {1, 1, 1, 1};
    OK(st_writer_meta(&w, COMPRESS_FACTORS_SAMPLES_KEY, "64") ? VL_EINVAL : 0);
    bad(&w, &f, &skip, scale);
    uint16_t *half[2 * NLAYER] = {0};
    for (int i = 0; i < NLAYER; i++)
        for (int k = 0; k < 2; k++) {
            if (skip == 2 * i + k) continue;
            char name[96];
            snprintf(name, sizeof name, "kfac.%.60s.%c", LAYERS[i].name, k ? 'G' : 'A');
            uint32_t d = k ? LAYERS[i].g_dim : LAYERS[i].a_dim;
            uint64_t shape[2] = {d, d};
            const float *x = k ? f.G[i] : f.A[i];
            if (dt == ST_F32) {
                assert_int_equal(st_writer_add(&w, name, ST_F32, 2, shape, x, (size_t)d * d * 4),
                                 0);
                continue;
            }
            uint16_t *h = malloc((size_t)d * d * 2);
            assert_non_null(h);
            for (size_t j = 0; j < (size_t)d * d; j++)
                h[j] = vl_f32_to_f16(x[j] / scale[2 * i + k]);
            half[2 * i + k] = h;
            assert_int_equal(st_writer_add(&w, name, ST_F16, 2, shape, h, (size_t)d * d * 2), 0);
        }
    if (skip == -2) scale[3] = 0.0f; /* the values were written with scale 1 */
    if (dt == ST_F16) {
        uint64_t shape[1] = {2 * NLAYER};
        assert_int_equal(
            st_writer_add(&w, COMPRESS_FACTORS_SCALE, ST_F32, 1, shape, scale, sizeof scale), 0);
    }
    vl_buf b;
    vl_buf_init(&b, 1 << 20);
    OK(st_writer_finish(&w, &b, &e_));
    st_writer_free(&w);
    st_file sf;
    OK(st_parse(b.data, b.len, &sf, &e_));
    compress_factors_view v;
    v.n = 99;
    *code = "unset";
    int rc = compress_factors_decode(&sf, LAYERS, NLAYER, &v, code, err);
    if (rc == 0)
        compress_factors_view_free(&v);
    else
        assert_int_equal(v.n, 0); /* nothing half-decoded */
    st_free(&sf);
    vl_buf_free(&b);
    for (int i = 0; i < 2 * NLAYER; i++) free(half[i]);
    fset_free(&f);
    return rc;
}

static void spoil_none(st_writer *w, fset *f, int *skip, float *scale) {
    (void)w, (void)f, (void)skip, (void)scale;
}
static void spoil_missing(st_writer *w, fset *f, int *skip, float *scale) {
    (void)w, (void)f, (void)scale;
    *skip = 3; /* the second layer's G */
}
static void spoil_nan(st_writer *w, fset *f, int *skip, float *scale) {
    (void)w, (void)skip, (void)scale;
    f->G[0][7] = NAN;
}
static void spoil_negative_diag(st_writer *w, fset *f, int *skip, float *scale) {
    (void)w, (void)skip, (void)scale;
    f->A[1][2 * 7 + 2] = -0.5f;
}
static void spoil_asymmetric(st_writer *w, fset *f, int *skip, float *scale) {
    (void)w, (void)skip, (void)scale;
    f->A[0][1 * 5 + 3] *= 1.5f;
    f->A[0][1 * 5 + 3] += 0.1f;
}
static void spoil_not_psd(st_writer *w, fset *f, int *skip, float *scale) {
    (void)w, (void)skip, (void)scale;
    float b = 2.0f * sqrtf(f->G[1][0] * f->G[1][4]); /* (0,1) against (0,0), (1,1) */
    f->G[1][1] = b;
    f->G[1][3] = b;
}
static void spoil_corner(st_writer *w, fset *f, int *skip, float *scale) {
    (void)w, (void)skip, (void)scale;
    f->A[1][7 * 7 - 1] = 2.0f;
}
static void spoil_extra(st_writer *w, fset *f, int *skip, float *scale) {
    (void)f, (void)skip, (void)scale;
    static const float one = 1.0f;
    uint64_t shape[1] = {1};
    assert_int_equal(st_writer_add(w, "kfac.h.9.mlp.c_fc.A", ST_F32, 1, shape, &one, 4), 0);
}
static void spoil_shape(st_writer *w, fset *f, int *skip, float *scale) {
    (void)f, (void)scale;
    *skip = 0;
    /* static: the writer keeps the pointer until st_writer_finish. */
    static float z[36];
    z[35] = 1.0f;
    uint64_t shape[2] = {6, 6};
    assert_int_equal(st_writer_add(w, "kfac.h.0.attn.c_attn.A", ST_F32, 2, shape, z, sizeof z), 0);
}
static void spoil_dtype(st_writer *w, fset *f, int *skip, float *scale) {
    (void)f, (void)scale;
    *skip = 1;
    static uint32_t z[36];
    uint64_t shape[2] = {6, 6};
    assert_int_equal(st_writer_add(w, "kfac.h.0.attn.c_attn.G", ST_U32, 2, shape, z, sizeof z), 0);
}
static void spoil_scale(st_writer *w, fset *f, int *skip, float *scale) {
    (void)w, (void)f, (void)scale;
    *skip = -2;
}

static void test_refusals(void **state) {
    (void)state;
    const char *code = NULL;
    vl_error err = {0};
    assert_int_equal(decode_spoiled(spoil_none, ST_F32, &code, &err), 0);
    assert_null(code);
    assert_int_equal(decode_spoiled(spoil_none, ST_F16, &code, &err), 0);
    static const struct {
        spoil_fn fn;
        st_dtype dt;
        const char *msg;
    } cases[] = {
        {spoil_missing, ST_F32, "missing"},
        {spoil_nan, ST_F32, "non-finite"},
        {spoil_nan, ST_F16, "non-finite"},
        {spoil_negative_diag, ST_F32, "negative diagonal"},
        {spoil_asymmetric, ST_F32, "not symmetric"},
        {spoil_not_psd, ST_F32, "positive semi-definite"},
        {spoil_corner, ST_F32, "end in 1"},
        {spoil_corner, ST_F16, "end in 1"},
        {spoil_extra, ST_F32, "factor tensors"},
        {spoil_shape, ST_F32, "shape"},
        {spoil_dtype, ST_F32, "F32 or F16"},
        {spoil_scale, ST_F16, "scale"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err = (vl_error){0};
        assert_int_equal(decode_spoiled(cases[i].fn, cases[i].dt, &code, &err), VL_ERANGE);
        assert_string_equal(code, "bad_factors");
        if (!strstr(err.msg, cases[i].msg))
            fail_msg("case %zu: '%s' lacks '%s'", i, err.msg, cases[i].msg);
    }
    /* F16 tensors without their scales, and scales beside F32 tensors */
    fset f;
    fset_make(&f, 9);
    for (int dt = 0; dt < 2; dt++) {
        compress_factors cf = as_factors(&f, dt ? ST_F16 : ST_F32, 3);
        vl_buf b;
        vl_buf_init(&b, 1 << 20);
        OK(compress_factors_encode_file(&cf, "r", 1, &b, &e_));
        st_file sf;
        OK(st_parse(b.data, b.len, &sf, &e_));
        for (int i = 0; i < sf.ntensors; i++)
            if (strcmp(sf.tensors[i].name, COMPRESS_FACTORS_SCALE) == 0)
                snprintf(sf.tensors[i].name, sizeof sf.tensors[i].name, "%s", "other");
        compress_factors_view v;
        err = (vl_error){0};
        int rc = compress_factors_decode(&sf, LAYERS, NLAYER, &v, &code, &err);
        assert_int_equal(rc, dt ? VL_ERANGE : VL_OK);
        if (rc == 0) compress_factors_view_free(&v);
        /* another model's layers */
        compress_factor_layer other[NLAYER];
        memcpy(other, LAYERS, sizeof other);
        other[1].g_dim = 4;
        assert_int_equal(compress_factors_decode(&sf, other, NLAYER, &v, &code, &err), VL_ERANGE);
        assert_int_equal(compress_factors_decode(&sf, other, 0, &v, &code, &err), VL_EINVAL);
        st_free(&sf);
        vl_buf_free(&b);
    }
    /* bad inputs to the writer */
    compress_factors cf = as_factors(&f, ST_BF16, 3);
    vl_buf b;
    vl_buf_init(&b, 1 << 20);
    assert_int_equal(compress_factors_encode_file(&cf, "r", 1, &b, &err), VL_EINVAL);
    cf.dtype = ST_F32, cf.samples = 0;
    assert_int_equal(compress_factors_encode_file(&cf, "r", 1, &b, &err), VL_EINVAL);
    cf.samples = 1, cf.n = 0;
    assert_int_equal(compress_factors_encode_file(&cf, "r", 1, &b, &err), VL_EINVAL);
    vl_buf_free(&b);
    fset_free(&f);
}

/* ---- the weighted mean ---------------------------------------------------------------- */

static void test_weighted_mean(void **state) {
    (void)state;
    fset f[3];
    double w[3] = {640, 1280, 320}, wsum = 2240;
    compress_factors_sum s;
    OK(compress_factors_sum_init(&s, LAYERS, NLAYER, &e_));
    const float *A[NLAYER], *G[NLAYER];
    vl_error err = {0};
    assert_int_equal(compress_factors_sum_mean(&s, A, G, &err), VL_EINVAL);
    vl_buf b[3];
    st_file sf[3];
    compress_factors_view v[3];
    for (int k = 0; k < 3; k++) {
        fset_make(&f[k], 100 + 10 * (uint64_t)k);
        compress_factors cf = as_factors(&f[k], k == 1 ? ST_F16 : ST_F32, (int64_t)w[k]);
        vl_buf_init(&b[k], 1 << 20);
        OK(compress_factors_encode_file(&cf, "r", 4, &b[k], &e_));
        OK(st_parse(b[k].data, b[k].len, &sf[k], &e_));
        OK(compress_factors_decode(&sf[k], LAYERS, NLAYER, &v[k], NULL, &e_));
        OK(compress_factors_sum_add(&s, &v[k], (double)v[k].samples, &e_));
    }
    assert_int_equal(s.count, 3);
    assert_int_equal(s.samples, 2240);
    assert_int_equal(compress_factors_sum_add(&s, &v[0], 0.0, &err), VL_EINVAL);
    assert_int_equal(compress_factors_sum_add(&s, &v[0], NAN, &err), VL_EINVAL);
    OK(compress_factors_sum_mean(&s, A, G, &e_));
    for (int i = 0; i < NLAYER; i++)
        for (int k = 0; k < 2; k++) {
            uint32_t d = k ? LAYERS[i].g_dim : LAYERS[i].a_dim;
            size_t n = (size_t)d * d;
            float *want = malloc(n * sizeof *want), *f16 = malloc(n * sizeof *f16);
            assert_non_null(want);
            assert_non_null(f16);
            /* the F16 source counts as it decodes */
            OK(compress_factors_values(&v[1], i, k, f16, n, &e_));
            for (size_t j = 0; j < n; j++) {
                double s0 = k ? f[0].G[i][j] : f[0].A[i][j];
                double s2 = k ? f[2].G[i][j] : f[2].A[i][j];
                want[j] = (float)((w[0] * s0 + w[1] * f16[j] + w[2] * s2) / wsum);
            }
            assert_true(rel_err(k ? G[i] : A[i], want, n) <= 1e-6);
            free(want), free(f16);
        }
    /* the mean is valid factors itself */
    compress_factors mean = {
        .layers = LAYERS, .n = NLAYER, .A = A, .G = G, .samples = s.samples, .dtype = ST_F32};
    vl_buf out;
    vl_buf_init(&out, 1 << 20);
    OK(compress_factors_encode_file(&mean, "r", 5, &out, &e_));
    st_file mf;
    OK(st_parse(out.data, out.len, &mf, &e_));
    compress_factors_view mv;
    OK(compress_factors_decode(&mf, LAYERS, NLAYER, &mv, NULL, &e_));
    compress_factors_view_free(&mv);
    st_free(&mf);
    vl_buf_free(&out);
    for (int k = 0; k < 3; k++) {
        compress_factors_view_free(&v[k]);
        st_free(&sf[k]);
        vl_buf_free(&b[k]);
        fset_free(&f[k]);
    }
    compress_factors_sum_free(&s);
    compress_factors_sum_free(&s); /* twice is safe */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_weighted_mean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
