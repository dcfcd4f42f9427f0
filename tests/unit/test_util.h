/* Helpers shared by the cmocka unit tests. Include after <cmocka.h>. */
#ifndef VOLLEY_TEST_UTIL_H
#define VOLLEY_TEST_UTIL_H

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"

/* Runs a call that returns 0 or a VL_E* code; on failure the test fails
 * with the call's text and the message the call left in e_, which the call
 * names as its vl_error (write `OK(f(x, &e_))`). */
#define OK(call)                                                          \
    do {                                                                  \
        vl_error e_ = {0};                                                \
        int rc_ = (call);                                                 \
        if (rc_ != 0) fail_msg("%s failed (%d): %s", #call, rc_, e_.msg); \
    } while (0)

/* Fails the test, naming the expression and the line, unless a is within
 * tol of b (NaN never is). */
#define assert_near(a, b, tol) \
    test_assert_near_at((double)(a), (double)(b), (double)(tol), #a, __LINE__)

static inline void test_assert_near_at(double a, double b, double tol, const char *what, int line) {
    if (!(fabs(a - b) <= tol))
        fail_msg("line %d: %s = %.9g, expected %.9g (tolerance %.3g)", line, what, a, b, tol);
}

/* d standard-normal floats from seed, on the heap (caller frees). */
/* max |g - c| / max |c| (absolute when c is all zeros), NaN-proof: how far
 * a device result is from its CPU reference, on the scale of the
 * reference. */
static inline double test_max_rel_err(const float *g, const float *c, size_t n) {
    double dmax = 0, cmax = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)g[i] - c[i]);
        if (!(d <= dmax)) dmax = isnan(d) ? INFINITY : d;
        if (fabs(c[i]) > cmax) cmax = fabs(c[i]);
    }
    return cmax > 0 ? dmax / cmax : dmax;
}

static inline float *random_vec(size_t d, uint64_t seed) {
    float *x = malloc((d ? d : 1) * sizeof *x);
    assert_non_null(x);
    vl_rng r;
    vl_rng_seed(&r, seed);
    for (size_t i = 0; i < d; i++) x[i] = vl_rng_normal(&r);
    return x;
}

/* A new directory made from a mkdtemp template ("/tmp/name.XXXXXX"); the
 * caller frees the returned path. */
static inline char *test_temp_dir(const char *template_) {
    char *d = strdup(template_);
    assert_non_null(d);
    assert_non_null(mkdtemp(d));
    return d;
}

/* Writes text to path (created or replaced); fails the test otherwise. */
static inline void test_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

/* Writes a small text corpus to path: phrase 2000 times over, enough
 * bytes for a run's training and held-out slices. */
static inline void test_write_corpus(const char *path, const char *phrase) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 2000; i++) assert_true(fputs(phrase, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

/* Removes a directory a test made, with everything in it. */
static inline void test_remove_tree(const char *d) {
    char cmd[4200];
    assert_true(snprintf(cmd, sizeof cmd, "rm -rf '%s'", d) < (int)sizeof cmd);
    assert_int_equal(system(cmd), 0);
}

/* A cmocka fixture: a fresh temporary directory for each test, removed
 * with everything in it afterwards, and room for one path inside it. */
typedef struct test_dir_fixture {
    char *dir;
    char path[512];
} test_dir_fixture;

/* Setup and teardown for test_dir_fixture; the directory's name starts
 * with "/tmp/volley_test." (mkdtemp fills in the rest). */
static inline int test_dir_setup(void **state) {
    test_dir_fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = test_temp_dir("/tmp/volley_test.XXXXXX");
    *state = f;
    return 0;
}

static inline int test_dir_teardown(void **state) {
    test_dir_fixture *f = *state;
    test_remove_tree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

/* Removes an SQLite database file and the -wal, -shm and -lock files
 * beside it. */
static inline void test_remove_db(const char *path) {
    const char *suffix[] = {"", "-wal", "-shm", "-lock"};
    for (int i = 0; i < 4; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s%s", path, suffix[i]);
        unlink(p);
    }
    /* The update bodies' segment files beside it. */
    char dir[4200];
    snprintf(dir, sizeof dir, "%s-bodies", path);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4500];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

#endif
