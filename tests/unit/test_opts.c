/* Unit tests for the command-line layer (common/opts.h): every kind of
 * value and its range, both spellings of a value, letters, unknown and
 * abbreviated options, missing and empty values, repeats, required
 * options, operands, --help, and the exact line each refusal prints. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"

/* The variables one table writes into, with their defaults. */
typedef struct vars {
    int force, verbose;
    const char *db;
    int64_t threads, seed, size;
    double temp, beta;
    int device;
} vars;

static const char *const DEVICES[] = {"auto", "cpu", "cuda"};

static int parse_device(const char *s, void *dst) {
    for (int i = 0; i < 3; i++)
        if (strcmp(s, DEVICES[i]) == 0) {
            *(int *)dst = i;
            return 0;
        }
    return VL_EINVAL;
}

/* A table of every kind, its messages captured in err and out. */
typedef struct fixture {
    vars v;
    vl_opt t[9];
    vl_opts o;
    char *errtext, *outtext;
    size_t errlen, outlen;
    FILE *err, *out;
} fixture;

static fixture *fx_new(void) {
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->v = (vars){.threads = 4, .seed = 1, .size = 1000, .temp = 0.8, .device = 0};
    f->t[0] = vl_opt_flag("force", &f->v.force);
    f->t[1] = vl_opt_letter(vl_opt_flag("verbose", &f->v.verbose), 'v');
    f->t[2] = vl_opt_str("db", &f->v.db);
    f->t[3] = vl_opt_letter(vl_opt_int("threads", &f->v.threads, 1, 1024), 'j');
    f->t[4] = vl_opt_int("seed", &f->v.seed, 0, INT64_MAX);
    f->t[5] = vl_opt_size("size", &f->v.size, 1, 4000000000LL);
    f->t[6] = vl_opt_f64("temperature", &f->v.temp, 0, 10);
    f->t[7] = vl_opt_f64_above("beta", &f->v.beta, 0, 1e6);
    f->t[8] = vl_opt_custom("device", parse_device, &f->v.device, "auto, cpu or cuda");
    f->err = open_memstream(&f->errtext, &f->errlen);
    f->out = open_memstream(&f->outtext, &f->outlen);
    assert_non_null(f->err);
    assert_non_null(f->out);
    f->o = (vl_opts){.prog = "prog run",
                     .hint = "see 'prog --help'",
                     .usage = "usage: prog\n",
                     .opt = f->t,
                     .n = VL_OPTS_COUNT(f->t),
                     .err = f->err,
                     .out = f->out};
    return f;
}

/* Starts err afresh, so errtext holds only what comes next. */
static void fx_reset_err(fixture *f) {
    fclose(f->err);
    free(f->errtext);
    f->errtext = NULL;
    f->err = open_memstream(&f->errtext, &f->errlen);
    assert_non_null(f->err);
    f->o.err = f->err;
}

static void fx_free(fixture *f) {
    fclose(f->err);
    fclose(f->out);
    free(f->errtext);
    free(f->outtext);
    free(f);
}

/* Parses the NULL-terminated words after "run" with f's table. */
static int parse(fixture *f, int *rest, ...) {
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"run";
    va_list ap;
    va_start(ap, rest);
    for (const char *w; (w = va_arg(ap, const char *)) != NULL;) {
        assert_true(argc < 31);
        argv[argc++] = (char *)w;
    }
    va_end(ap);
    argv[argc] = NULL;
    fx_reset_err(f);
    int rc = vl_opts_parse(&f->o, argc, argv, rest);
    fflush(f->err);
    fflush(f->out);
    return rc;
}

/* Asserts a refusal that printed exactly one line, "prog run: msg (hint)". */
static void refused(fixture *f, int rc, const char *msg) {
    assert_int_equal(rc, VL_EINVAL);
    assert_int_equal(vl_opts_status(rc), VL_OPTS_EXIT_USAGE);
    char want[512];
    snprintf(want, sizeof want, "prog run: %s (see 'prog --help')\n", msg);
    assert_string_equal(f->errtext, want);
}

static void test_every_kind_both_spellings(void **state) {
    (void)state;
    fixture *f = fx_new();
    int rc = parse(f, NULL, "--force", "-v", "--db", "run.db", "--threads=8", "--seed", "-0",
                   "--size", "1e8", "--temperature=0", "--beta", "0.1", "--device=cuda", NULL);
    assert_int_equal(rc, VL_OK);
    assert_int_equal(vl_opts_status(rc), 0);
    assert_string_equal(f->errtext, "");
    assert_int_equal(f->v.force, 1);
    assert_int_equal(f->v.verbose, 1);
    assert_string_equal(f->v.db, "run.db");
    assert_int_equal(f->v.threads, 8);
    assert_int_equal(f->v.seed, 0);
    assert_int_equal(f->v.size, 100000000);
    assert_true(f->v.temp == 0.0);
    assert_true(f->v.beta == 0.1);
    assert_int_equal(f->v.device, 2);
    for (size_t i = 0; i < VL_OPTS_COUNT(f->t); i++) assert_int_equal(f->t[i].given, 1);
    assert_true(vl_opts_given(&f->o, "beta"));
    assert_false(vl_opts_given(&f->o, "no-such-option"));

    /* The other spelling of each value, and a letter with its value
     * attached or apart. */
    rc = parse(f, NULL, "--db=other.db", "--size=100000000", "--temperature", "10", "-j", "1024",
               NULL);
    assert_int_equal(rc, VL_OK);
    assert_string_equal(f->v.db, "other.db");
    assert_int_equal(f->v.size, 100000000);
    assert_true(f->v.temp == 10.0);
    assert_int_equal(f->v.threads, 1024);
    assert_int_equal(parse(f, NULL, "-j7", "-v", NULL), VL_OK);
    assert_int_equal(f->v.threads, 7);
    fx_free(f);
}

static void test_defaults_stay(void **state) {
    (void)state;
    fixture *f = fx_new();
    assert_int_equal(parse(f, NULL, "--db", "x", NULL), VL_OK);
    assert_int_equal(f->v.threads, 4);
    assert_int_equal(f->v.size, 1000);
    assert_true(f->v.temp == 0.8);
    assert_int_equal(f->v.force, 0);
    assert_int_equal(f->t[3].given, 0);
    assert_false(vl_opts_given(&f->o, "threads"));
    /* Nothing at all is fine too: no option here is required. */
    assert_int_equal(parse(f, NULL, NULL), VL_OK);
    assert_false(vl_opts_given(&f->o, "db"));
    fx_free(f);
}

static void test_ranges(void **state) {
    (void)state;
    fixture *f = fx_new();
    refused(f, parse(f, NULL, "--threads", "0", NULL), "--threads: '0' is not 1..1024");
    refused(f, parse(f, NULL, "--threads=1025", NULL), "--threads: '1025' is not 1..1024");
    refused(f, parse(f, NULL, "--threads", "8x", NULL), "--threads: '8x' is not 1..1024");
    refused(f, parse(f, NULL, "--threads", " 8", NULL), "--threads: ' 8' is not 1..1024");
    refused(f, parse(f, NULL, "-j", "0", NULL), "--threads: '0' is not 1..1024");
    refused(f, parse(f, NULL, "--seed", "-1", NULL), "--seed: '-1' is not 0 or more");
    refused(f, parse(f, NULL, "--seed", "99999999999999999999", NULL),
            "--seed: '99999999999999999999' is not 0 or more");
    assert_int_equal(parse(f, NULL, "--seed", "9223372036854775807", NULL), VL_OK);
    assert_int_equal(f->v.seed, INT64_MAX);

    refused(f, parse(f, NULL, "--temperature", "10.5", NULL),
            "--temperature: '10.5' is not a number in 0..10");
    refused(f, parse(f, NULL, "--temperature", "-0.1", NULL),
            "--temperature: '-0.1' is not a number in 0..10");
    refused(f, parse(f, NULL, "--temperature", "nan", NULL),
            "--temperature: 'nan' is not a number in 0..10");
    /* The open end: 0 itself is out, anything above it in. */
    refused(f, parse(f, NULL, "--beta", "0", NULL), "--beta: '0' is not a number in (0, 1e+06]");
    assert_int_equal(parse(f, NULL, "--beta", "1e-9", NULL), VL_OK);
    assert_true(f->v.beta == 1e-9);
    assert_int_equal(parse(f, NULL, "--beta", "1e6", NULL), VL_OK);

    const char *size_msg = "is not a whole number in 1..4000000000 (such as 1e6)";
    char want[256];
    snprintf(want, sizeof want, "--size: '1.5' %s", size_msg);
    refused(f, parse(f, NULL, "--size", "1.5", NULL), want);
    snprintf(want, sizeof want, "--size: '5e9' %s", size_msg);
    refused(f, parse(f, NULL, "--size", "5e9", NULL), want);
    snprintf(want, sizeof want, "--size: '0' %s", size_msg);
    refused(f, parse(f, NULL, "--size", "0", NULL), want);
    assert_int_equal(parse(f, NULL, "--size", "4e9", NULL), VL_OK);
    assert_int_equal(f->v.size, 4000000000LL);
    assert_int_equal(parse(f, NULL, "--size", "1", NULL), VL_OK);
    assert_int_equal(f->v.size, 1);

    refused(f, parse(f, NULL, "--device", "gpu", NULL), "--device: 'gpu' is not auto, cpu or cuda");
    /* A refused value leaves the variable as it was. */
    assert_int_equal(f->v.device, 0);
    fx_free(f);
}

static void test_unknown_options(void **state) {
    (void)state;
    fixture *f = fx_new();
    refused(f, parse(f, NULL, "--nope", NULL), "unknown option '--nope'");
    refused(f, parse(f, NULL, "--nope=3", NULL), "unknown option '--nope'");
    refused(f, parse(f, NULL, "-x", NULL), "unknown option '-x'");
    refused(f, parse(f, NULL, "-vx", NULL), "unknown option '-x'");
    /* getopt_long would take these prefixes; the layer wants names in full. */
    refused(f, parse(f, NULL, "--thread", "2", NULL), "unknown option '--thread'");
    refused(f, parse(f, NULL, "--d=x", NULL), "unknown option '--d'");
    refused(f, parse(f, NULL, "--he", NULL), "unknown option '--he'");
    refused(f, parse(f, NULL, "--db", "x", "-threads", "2", NULL), "unknown option '-t'");
    fx_free(f);
}

static void test_missing_and_empty_values(void **state) {
    (void)state;
    fixture *f = fx_new();
    refused(f, parse(f, NULL, "--db", NULL), "--db needs a value");
    refused(f, parse(f, NULL, "--force", "--threads", NULL), "--threads needs a value");
    refused(f, parse(f, NULL, "-j", NULL), "--threads needs a value");
    refused(f, parse(f, NULL, "--db=", NULL), "--db needs a value");
    refused(f, parse(f, NULL, "--db", "", NULL), "--db needs a value");
    refused(f, parse(f, NULL, "--force=1", NULL), "--force takes no value");
    refused(f, parse(f, NULL, "--help=1", NULL), "--help takes no value");
    /* A value is the next word whatever it looks like. */
    f->v.force = 0;
    assert_int_equal(parse(f, NULL, "--db", "--force", NULL), VL_OK);
    assert_string_equal(f->v.db, "--force");
    assert_int_equal(f->v.force, 0);
    fx_free(f);
}

static void test_repeats(void **state) {
    (void)state;
    fixture *f = fx_new();
    refused(f, parse(f, NULL, "--db", "a", "--db", "b", NULL), "--db given twice");
    refused(f, parse(f, NULL, "--threads=2", "-j", "3", NULL), "--threads given twice");
    refused(f, parse(f, NULL, "--force", "--force", NULL), "--force given twice");
    refused(f, parse(f, NULL, "-vv", NULL), "--verbose given twice");
    /* Each parse counts afresh. */
    assert_int_equal(parse(f, NULL, "--db", "a", NULL), VL_OK);
    assert_int_equal(parse(f, NULL, "--db", "b", NULL), VL_OK);
    assert_string_equal(f->v.db, "b");
    fx_free(f);
}

static void test_required(void **state) {
    (void)state;
    fixture *f = fx_new();
    f->t[2] = vl_opt_required(f->t[2]);
    refused(f, parse(f, NULL, "--force", NULL), "missing required option --db");
    assert_int_equal(parse(f, NULL, "--db", "x", NULL), VL_OK);
    fx_free(f);
}

static void test_operands(void **state) {
    (void)state;
    fixture *f = fx_new();
    refused(f, parse(f, NULL, "--db", "x", "extra", NULL), "unexpected argument 'extra'");
    int rest = -1;
    assert_int_equal(parse(f, &rest, "--db", "x", "a.f32", "b.f32", NULL), VL_OK);
    assert_int_equal(rest, 3);
    /* The first operand ends the options: what follows is operands. */
    assert_int_equal(parse(f, &rest, "a.f32", "--force", NULL), VL_OK);
    assert_int_equal(rest, 1);
    assert_int_equal(f->v.force, 0);
    assert_int_equal(parse(f, &rest, "--force", "--", "--db", NULL), VL_OK);
    assert_int_equal(rest, 3);
    assert_int_equal(parse(f, &rest, "--force", NULL), VL_OK);
    assert_int_equal(rest, 2);
    fx_free(f);
}

static void test_help(void **state) {
    (void)state;
    fixture *f = fx_new();
    int rc = parse(f, NULL, "--db", "x", "--help", "--nope", NULL);
    assert_int_equal(rc, VL_OPTS_HELP);
    assert_int_equal(vl_opts_status(rc), 0);
    assert_string_equal(f->outtext, "usage: prog\n");
    assert_string_equal(f->errtext, "");
    assert_int_equal(parse(f, NULL, "-h", NULL), VL_OPTS_HELP);
    assert_string_equal(f->outtext, "usage: prog\nusage: prog\n");
    /* Without a usage text --help is an option like any other. */
    f->o.usage = NULL;
    refused(f, parse(f, NULL, "--help", NULL), "unknown option '--help'");
    refused(f, parse(f, NULL, "-h", NULL), "unknown option '-h'");
    fx_free(f);
}

static void test_messages(void **state) {
    (void)state;
    fixture *f = fx_new();
    f->o.hint = NULL;
    assert_int_equal(parse(f, NULL, "--threads", "0", NULL), VL_EINVAL);
    assert_string_equal(f->errtext, "prog run: --threads: '0' is not 1..1024\n");
    fx_reset_err(f);
    assert_int_equal(vl_opts_fail(&f->o, "check takes one of --%s and --%s", "db", "config"),
                     VL_EINVAL);
    fflush(f->err);
    assert_string_equal(f->errtext, "prog run: check takes one of --db and --config\n");
    /* A value too long for the line is cut, never overflowed. */
    static char big[2000];
    memset(big, '7', sizeof big - 1);
    assert_int_equal(parse(f, NULL, "--threads", big, NULL), VL_EINVAL);
    assert_true(strlen(f->errtext) < 600);
    assert_int_equal(f->errtext[strlen(f->errtext) - 1], '\n');
    fx_free(f);
}

static void test_table_limits(void **state) {
    (void)state;
    fixture *f = fx_new();
    vl_opt many[VL_OPTS_MAX + 1];
    int flags[VL_OPTS_MAX + 1];
    char names[VL_OPTS_MAX + 1][8];
    for (int i = 0; i <= VL_OPTS_MAX; i++) {
        snprintf(names[i], sizeof names[i], "o%d", i);
        flags[i] = 0;
        many[i] = vl_opt_flag(names[i], &flags[i]);
    }
    f->o.opt = many;
    f->o.n = VL_OPTS_MAX;
    assert_int_equal(parse(f, NULL, "--o63", "--o0", NULL), VL_OK);
    assert_int_equal(flags[63], 1);
    assert_int_equal(flags[0], 1);
    f->o.n = VL_OPTS_MAX + 1;
    assert_int_equal(parse(f, NULL, "--o0", NULL), VL_EINVAL);
    assert_non_null(strstr(f->errtext, "at most 64"));
    fx_free(f);
}

static void test_parse_size(void **state) {
    (void)state;
    int64_t v = -1;
    assert_int_equal(vl_opts_parse_size("1e8", 1, INT64_MAX, &v), VL_OK);
    assert_int_equal(v, 100000000);
    assert_int_equal(vl_opts_parse_size("124439808", 1000, 4000000000LL, &v), VL_OK);
    assert_int_equal(v, 124439808);
    assert_int_equal(vl_opts_parse_size("2.5e3", 1, 10000, &v), VL_OK);
    assert_int_equal(v, 2500);
    v = 7;
    assert_int_equal(vl_opts_parse_size("2.5", 1, 10, &v), VL_EINVAL);
    assert_int_equal(vl_opts_parse_size("1e19", 1, INT64_MAX, &v), VL_EINVAL);
    assert_int_equal(vl_opts_parse_size("9.3e18", 1, INT64_MAX, &v), VL_EINVAL);
    assert_int_equal(vl_opts_parse_size("-1", 0, 10, &v), VL_EINVAL);
    assert_int_equal(vl_opts_parse_size("", 0, 10, &v), VL_EINVAL);
    assert_int_equal(vl_opts_parse_size("1e", 0, 10, &v), VL_EINVAL);
    assert_int_equal(vl_opts_parse_size("inf", 0, INT64_MAX, &v), VL_EINVAL);
    assert_int_equal(v, 7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind_both_spellings),
        cmocka_unit_test(test_defaults_stay),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_unknown_options),
        cmocka_unit_test(test_missing_and_empty_values),
        cmocka_unit_test(test_repeats),
        cmocka_unit_test(test_required),
        cmocka_unit_test(test_operands),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_table_limits),
        cmocka_unit_test(test_parse_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
