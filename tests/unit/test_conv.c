/*
 * Unit tests for the 2-D convolution kernels (kernels/cpu/conv.c): output
 * sizes and the scratch size (with its overflow refusal), the forward pass
 * against a plain direct-loop reference in double over shapes with odd
 * sides, stride 1 to 4, even and odd kernels, kernels larger than the
 * image and several channels; the backward pass against the same
 * reference's exact gradient and against central finite differences of the
 * kernel's own forward; that backward ADDS into its outputs and skips the
 * optional ones; that nothing reads scratch left over from before; and
 * bitwise repeatability.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/common.h"
#include "kernels/kernels.h"
#include "tests/unit/test_util.h"

/* A shape with its batch size. */
typedef struct conv_case {
    int B;
    kernels_conv2d_shape s;
} conv_case;

static const conv_case CASES[] = {
    {1, {1, 5, 5, 1, 3, 1}},     /* the plainest "same" convolution */
    {2, {3, 7, 6, 4, 3, 2}},     /* odd and even sides, stride 2 */
    {3, {2, 9, 11, 5, 5, 2}},    /* odd sides, kernel 5 */
    {2, {1, 28, 28, 16, 5, 2}},  /* a Fashion-MNIST first layer */
    {2, {16, 14, 14, 32, 5, 2}}, /* and its second */
    {1, {2, 1, 1, 3, 5, 1}},     /* kernel larger than the image */
    {2, {3, 6, 5, 2, 1, 1}},     /* 1x1 */
    {2, {2, 8, 7, 3, 4, 3}},     /* even kernel (output one wider), stride 3 */
    {1, {4, 3, 13, 2, 3, 4}},    /* stride larger than a side */
};
#define N_CASES (sizeof CASES / sizeof CASES[0])

static size_t in_floats(const conv_case *c) {
    return (size_t)c->B * c->s.ci * c->s.h * c->s.w;
}

static int out_h(const conv_case *c) {
    return kernels_conv2d_out_size(c->s.h, c->s.k, c->s.stride);
}

static int out_w(const conv_case *c) {
    return kernels_conv2d_out_size(c->s.w, c->s.k, c->s.stride);
}

static size_t out_floats(const conv_case *c) {
    return (size_t)c->B * c->s.co * out_h(c) * out_w(c);
}

static size_t w_floats(const conv_case *c) {
    return (size_t)c->s.co * c->s.ci * c->s.k * c->s.k;
}

/* Scratch filled with NaN, so a kernel that reads what it did not write
 * first shows it in its results. */
static float *nan_scratch(const conv_case *c) {
    size_t n = kernels_conv2d_scratch_floats(&c->s, c->B);
    assert_true(n > 0);
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* ---- the direct-loop reference ------------------------------------------------ */

/* Calls visit(ctx, out index, in index, weight index) for every product
 * weight * input the convolution sums, padding excluded: the plain
 * definition, with none of the kernel's index arithmetic. */
typedef void (*visit_fn)(void *ctx, size_t o, size_t i, size_t w);

static void each_term(const conv_case *c, visit_fn visit, void *ctx) {
    const kernels_conv2d_shape *s = &c->s;
    int pad = s->k / 2, ho = out_h(c), wo = out_w(c);
    for (int b = 0; b < c->B; b++)
        for (int co = 0; co < s->co; co++)
            for (int oy = 0; oy < ho; oy++)
                for (int ox = 0; ox < wo; ox++) {
                    size_t o = (((size_t)b * s->co + co) * ho + oy) * wo + ox;
                    for (int ci = 0; ci < s->ci; ci++)
                        for (int ky = 0; ky < s->k; ky++)
                            for (int kx = 0; kx < s->k; kx++) {
                                int iy = oy * s->stride - pad + ky;
                                int ix = ox * s->stride - pad + kx;
                                if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                                size_t i = (((size_t)b * s->ci + ci) * s->h + iy) * s->w + ix;
                                size_t w = (((size_t)co * s->ci + ci) * s->k + ky) * s->k + kx;
                                visit(ctx, o, i, w);
                            }
                }
}

typedef struct ref_ctx {
    const float *x, *w, *proj;
    double *out, *mag; /* forward: sums and sums of |terms| */
    double *dx, *dw;   /* backward of sum(out * proj) */
} ref_ctx;

static void visit_forward(void *p, size_t o, size_t i, size_t w) {
    ref_ctx *r = p;
    double t = (double)r->w[w] * r->x[i];
    r->out[o] += t;
    r->mag[o] += fabs(t);
}

static void visit_backward(void *p, size_t o, size_t i, size_t w) {
    ref_ctx *r = p;
    r->dw[w] += (double)r->proj[o] * r->x[i];
    r->dx[i] += (double)r->proj[o] * r->w[w];
}

/* ---- sizes -------------------------------------------------------------------- */

static void test_out_size(void **state) {
    (void)state;
    assert_int_equal(kernels_conv2d_out_size(28, 5, 1), 28);
    assert_int_equal(kernels_conv2d_out_size(28, 5, 2), 14);
    assert_int_equal(kernels_conv2d_out_size(14, 5, 2), 7);
    assert_int_equal(kernels_conv2d_out_size(7, 3, 2), 4);
    assert_int_equal(kernels_conv2d_out_size(1, 5, 1), 1);
    assert_int_equal(kernels_conv2d_out_size(1, 1, 3), 1);
    assert_int_equal(kernels_conv2d_out_size(8, 4, 1), 9); /* even: one wider */
    assert_int_equal(kernels_conv2d_out_size(8, 4, 3), 3);
    assert_int_equal(kernels_conv2d_out_size(13, 3, 4), 4);
}

static void test_scratch_floats(void **state) {
    (void)state;
    kernels_conv2d_shape s = {1, 28, 28, 16, 5, 2};
    /* (1*25 + 16) rows of 3 * 14*14 columns. */
    assert_int_equal(kernels_conv2d_scratch_floats(&s, 3), (size_t)41 * 3 * 196);
    kernels_conv2d_shape bad[] = {
        {0, 28, 28, 16, 5, 2}, {1, 0, 28, 16, 5, 2},  {1, 28, -1, 16, 5, 2},
        {1, 28, 28, 0, 5, 2},  {1, 28, 28, 16, 0, 2}, {1, 28, 28, 16, 5, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(kernels_conv2d_scratch_floats(&bad[i], 1), 0);
    assert_int_equal(kernels_conv2d_scratch_floats(&s, 0), 0);
    assert_int_equal(kernels_conv2d_scratch_floats(NULL, 1), 0);
    /* Sizes whose product wraps 64 bits are refused, not wrapped. */
    kernels_conv2d_shape huge = {INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, 65535, 1};
    assert_int_equal(kernels_conv2d_scratch_floats(&huge, INT32_MAX), 0);
    kernels_conv2d_shape even = {1, INT32_MAX, 1, 1, 2, 1}; /* output side 2^31 */
    assert_int_equal(kernels_conv2d_scratch_floats(&even, 1), (size_t)5 * ((size_t)1 << 32));
}

/* ---- forward -------------------------------------------------------------------- */

static void check_forward(const conv_case *c, uint64_t seed) {
    size_t ni = in_floats(c), no = out_floats(c), nw = w_floats(c);
    float *x = random_vec(ni, seed), *w = random_vec(nw, seed + 1);
    float *b = random_vec((size_t)c->s.co, seed + 2);
    float *out = malloc(no * sizeof *out), *scratch = nan_scratch(c);
    double *ref = calloc(no, sizeof *ref), *mag = calloc(no, sizeof *mag);
    assert_non_null(out);
    assert_non_null(ref);
    assert_non_null(mag);
    for (size_t i = 0; i < no; i++) out[i] = NAN; /* every element must be written */
    kernels_conv2d_forward(out, x, w, b, scratch, &c->s, c->B);
    ref_ctx r = {.x = x, .w = w, .out = ref, .mag = mag};
    each_term(c, visit_forward, &r);
    size_t plane = (size_t)out_h(c) * out_w(c);
    for (size_t o = 0; o < no; o++) {
        double bias = b[(o / plane) % (size_t)c->s.co];
        double want = ref[o] + bias, tol = 1e-5 * (mag[o] + fabs(bias)) + 1e-30;
        if (!(fabs(out[o] - want) <= tol))
            fail_msg("shape %dx%dx%d co %d k %d s %d, B %d: out[%zu] = %.9g, reference %.9g",
                     c->s.ci, c->s.h, c->s.w, c->s.co, c->s.k, c->s.stride, c->B, o, (double)out[o],
                     want);
    }
    /* Without a bias: the same sums. */
    kernels_conv2d_forward(out, x, w, NULL, scratch, &c->s, c->B);
    for (size_t o = 0; o < no; o++)
        if (!(fabs(out[o] - ref[o]) <= 1e-5 * mag[o] + 1e-30))
            fail_msg("no bias: out[%zu] = %.9g, reference %.9g", o, (double)out[o], ref[o]);
    free(x), free(w), free(b), free(out), free(scratch), free(ref), free(mag);
}

static void test_forward_matches_reference(void **state) {
    (void)state;
    for (size_t i = 0; i < N_CASES; i++) check_forward(&CASES[i], 100 + 10 * i);
}

/* ---- backward ------------------------------------------------------------------- */

/* max |got - want| over max |want|, got being what the kernel added to
 * base. */
static double added_err(const float *got, const float *base, const double *want, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(((double)got[i] - base[i]) - want[i]);
        d = e > d || isnan(e) ? e : d;
        m = fabs(want[i]) > m ? fabs(want[i]) : m;
    }
    return m > 0 ? d / m : d;
}

static void check_backward(const conv_case *c, uint64_t seed) {
    size_t ni = in_floats(c), no = out_floats(c), nw = w_floats(c), nb = (size_t)c->s.co;
    float *x = random_vec(ni, seed), *w = random_vec(nw, seed + 1);
    float *proj = random_vec(no, seed + 2);
    /* The kernel adds: start every gradient from values of its own. */
    float *dx0 = random_vec(ni, seed + 3), *dw0 = random_vec(nw, seed + 4);
    float *db0 = random_vec(nb, seed + 5);
    float *dx = malloc(ni * sizeof *dx), *dw = malloc(nw * sizeof *dw);
    float *db = malloc(nb * sizeof *db), *scratch = nan_scratch(c);
    double *rdx = calloc(ni, sizeof *rdx), *rdw = calloc(nw, sizeof *rdw);
    double *rdb = calloc(nb, sizeof *rdb);
    assert_true(dx && dw && db && rdx && rdw && rdb);
    memcpy(dx, dx0, ni * sizeof *dx);
    memcpy(dw, dw0, nw * sizeof *dw);
    memcpy(db, db0, nb * sizeof *db);
    kernels_conv2d_backward(dx, dw, db, scratch, proj, x, w, &c->s, c->B);

    ref_ctx r = {.x = x, .w = w, .proj = proj, .dx = rdx, .dw = rdw};
    each_term(c, visit_backward, &r);
    size_t plane = (size_t)out_h(c) * out_w(c);
    for (size_t o = 0; o < no; o++) rdb[(o / plane) % nb] += proj[o];
    double ex = added_err(dx, dx0, rdx, ni), ew = added_err(dw, dw0, rdw, nw);
    double eb = added_err(db, db0, rdb, nb);
    if (!(ex <= 2e-5 && ew <= 2e-5 && eb <= 2e-5))
        fail_msg("shape %dx%dx%d co %d k %d s %d, B %d: relative errors dinp %.3g, dweight "
                 "%.3g, dbias %.3g",
                 c->s.ci, c->s.h, c->s.w, c->s.co, c->s.k, c->s.stride, c->B, ex, ew, eb);

    /* dinp and dbias are optional; dweight comes out the same without. */
    float *dw2 = malloc(nw * sizeof *dw2);
    assert_non_null(dw2);
    memcpy(dw2, dw0, nw * sizeof *dw2);
    kernels_conv2d_backward(NULL, dw2, NULL, scratch, proj, x, w, &c->s, c->B);
    assert_memory_equal(dw2, dw, nw * sizeof *dw);
    free(dw2);
    free(x), free(w), free(proj), free(dx0), free(dw0), free(db0), free(dx), free(dw), free(db);
    free(scratch), free(rdx), free(rdw), free(rdb);
}

static void test_backward_matches_reference(void **state) {
    (void)state;
    for (size_t i = 0; i < N_CASES; i++) check_backward(&CASES[i], 200 + 10 * i);
}

/* sum(out * proj) of the kernel's own forward, accumulated in double. */
static double objective(const conv_case *c, const float *x, const float *w, const float *b,
                        const float *proj, float *out, float *scratch) {
    kernels_conv2d_forward(out, x, w, b, scratch, &c->s, c->B);
    double s = 0;
    for (size_t o = 0; o < out_floats(c); o++) s += (double)out[o] * proj[o];
    return s;
}

/* Central differences of every input, weight and bias against the
 * backward kernel. The convolution is linear in each of them, so the
 * difference quotient has no truncation error: what is left is the
 * forward's float rounding (~1e-7 of an O(10) objective) over the step,
 * about 1e-4 for the step 5e-2, which the absolute tolerance covers. */
static void check_finite_differences(const conv_case *c, uint64_t seed) {
    size_t ni = in_floats(c), no = out_floats(c), nw = w_floats(c), nb = (size_t)c->s.co;
    float *x = random_vec(ni, seed), *w = random_vec(nw, seed + 1);
    float *b = random_vec(nb, seed + 2), *proj = random_vec(no, seed + 3);
    float *dx = calloc(ni, sizeof *dx), *dw = calloc(nw, sizeof *dw), *db = calloc(nb, sizeof *db);
    float *out = malloc(no * sizeof *out), *scratch = nan_scratch(c);
    assert_true(dx && dw && db && out);
    kernels_conv2d_backward(dx, dw, db, scratch, proj, x, w, &c->s, c->B);
    struct {
        const char *name;
        float *v;
        const float *g;
        size_t n;
    } params[] = {{"inp", x, dx, ni}, {"weight", w, dw, nw}, {"bias", b, db, nb}};
    const float h = 5e-2f;
    for (size_t t = 0; t < 3; t++)
        for (size_t i = 0; i < params[t].n; i++) {
            float *v = params[t].v, v0 = v[i];
            v[i] = v0 + h;
            double step = (double)v[i] - v0, up = objective(c, x, w, b, proj, out, scratch);
            v[i] = v0 - h;
            step += (double)v0 - v[i];
            double dn = objective(c, x, w, b, proj, out, scratch);
            v[i] = v0;
            double fd = (up - dn) / step, g = params[t].g[i];
            if (!(fabs(fd - g) <= 1e-3 + 1e-4 * fabs(fd)))
                fail_msg("k %d s %d: d/d%s[%zu] = %.7g, finite difference %.7g", c->s.k,
                         c->s.stride, params[t].name, i, g, fd);
        }
    free(x), free(w), free(b), free(proj), free(dx), free(dw), free(db), free(out), free(scratch);
}

static void test_finite_differences(void **state) {
    (void)state;
    const conv_case small[] = {
        {2, {2, 5, 4, 3, 3, 2}},
        {2, {2, 4, 5, 2, 2, 1}}, /* even kernel */
        {1, {3, 6, 6, 2, 5, 1}},
    };
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
        check_finite_differences(&small[i], 300 + 10 * i);
}

/* ---- repeatability -------------------------------------------------------------- */

static void test_repeatable(void **state) {
    (void)state;
    /* Large enough for the OpenMP loops and a split sgemm to engage. */
    const conv_case c = {8, {4, 28, 28, 16, 5, 1}};
    size_t ni = in_floats(&c), no = out_floats(&c), nw = w_floats(&c), nb = (size_t)c.s.co;
    float *x = random_vec(ni, 1), *w = random_vec(nw, 2), *b = random_vec(nb, 3);
    float *proj = random_vec(no, 4), *scratch = nan_scratch(&c);
    float *out[2], *dx[2], *dw[2], *db[2];
    for (int r = 0; r < 2; r++) {
        out[r] = malloc(no * sizeof(float));
        dx[r] = calloc(ni, sizeof(float));
        dw[r] = calloc(nw, sizeof(float));
        db[r] = calloc(nb, sizeof(float));
        assert_true(out[r] && dx[r] && dw[r] && db[r]);
        kernels_conv2d_forward(out[r], x, w, b, scratch, &c.s, c.B);
        kernels_conv2d_backward(dx[r], dw[r], db[r], scratch, proj, x, w, &c.s, c.B);
    }
    assert_memory_equal(out[0], out[1], no * sizeof(float));
    assert_memory_equal(dx[0], dx[1], ni * sizeof(float));
    assert_memory_equal(dw[0], dw[1], nw * sizeof(float));
    assert_memory_equal(db[0], db[1], nb * sizeof(float));
    for (int r = 0; r < 2; r++) free(out[r]), free(dx[r]), free(dw[r]), free(db[r]);
    free(x), free(w), free(b), free(proj), free(scratch);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_size),
        cmocka_unit_test(test_scratch_floats),
        cmocka_unit_test(test_forward_matches_reference),
        cmocka_unit_test(test_backward_matches_reference),
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_repeatable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
