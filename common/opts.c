/* Command-line options over getopt_long (common/opts.h). */
#include "common/opts.h"

#include <getopt.h>
#include <math.h>
#include <stdarg.h>

/* getopt_long's answer for entry i is VAL_BASE + i: above every letter
 * and above the '?' and ':' it uses for errors. */
#define VAL_BASE 256
#define VAL_HELP (VAL_BASE + VL_OPTS_MAX)

__attribute__((format(printf, 2, 0))) static void vfail(const vl_opts *o, const char *fmt,
                                                        va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    FILE *f = o->err ? o->err : stderr;
    if (o->hint)
        fprintf(f, "%s: %s (%s)\n", o->prog, msg, o->hint);
    else
        fprintf(f, "%s: %s\n", o->prog, msg);
    fflush(f);
}

int vl_opts_fail(const vl_opts *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(o, fmt, ap);
    va_end(ap);
    return VL_EINVAL;
}

int vl_opts_given(const vl_opts *o, const char *name) {
    for (size_t i = 0; i < o->n; i++)
        if (strcmp(o->opt[i].name, name) == 0) return o->opt[i].given;
    return 0;
}

int vl_opts_parse_size(const char *s, int64_t min, int64_t max, int64_t *out) {
    double v;
    if (vl_parse_f64(s, &v) != VL_OK || v != floor(v) || v < (double)min || v > (double)max)
        return VL_EINVAL;
    /* (double)max may round up to 2^63, which no int64_t holds; below
     * it a whole double converts exactly, and the integer check is then
     * exact too where the bounds themselves are not doubles. */
    if (v >= 9223372036854775808.0) return VL_EINVAL;
    int64_t n = (int64_t)v;
    if (n < min || n > max) return VL_EINVAL;
    *out = n;
    return VL_OK;
}

/* "1..1024", "0 or more", "(0, 1e+06]": what the option's range is. */
static void describe(const vl_opt *d, char *out, size_t cap) {
    switch (d->kind) {
    case VL_OPT_INT:
        if (d->imax == INT64_MAX)
            snprintf(out, cap, "%lld or more", (long long)d->imin);
        else
            snprintf(out, cap, "%lld..%lld", (long long)d->imin, (long long)d->imax);
        break;
    case VL_OPT_SIZE:
        snprintf(out, cap, "a whole number in %.10g..%.10g (such as 1e6)", (double)d->imin,
                 (double)d->imax);
        break;
    case VL_OPT_F64:
        snprintf(out, cap, d->open_min ? "a number in (%g, %g]" : "a number in %g..%g", d->fmin,
                 d->fmax);
        break;
    case VL_OPT_CUSTOM: snprintf(out, cap, "%s", d->expect ? d->expect : "a valid value"); break;
    default: snprintf(out, cap, "valid"); break;
    }
}

/* Stores value into d's variable; VL_OK or VL_EINVAL (message printed). */
static int convert(const vl_opts *o, const vl_opt *d, const char *value) {
    int ok = 1;
    switch (d->kind) {
    case VL_OPT_FLAG: *(int *)d->dst = 1; return VL_OK;
    case VL_OPT_STR: *(const char **)d->dst = value; return VL_OK;
    case VL_OPT_INT: ok = vl_parse_i64(value, d->imin, d->imax, (int64_t *)d->dst) == VL_OK; break;
    case VL_OPT_SIZE:
        ok = vl_opts_parse_size(value, d->imin, d->imax, (int64_t *)d->dst) == VL_OK;
        break;
    case VL_OPT_F64: {
        double v;
        ok = vl_parse_f64(value, &v) == VL_OK && v <= d->fmax &&
             (d->open_min ? v > d->fmin : v >= d->fmin);
        if (ok) *(double *)d->dst = v;
        break;
    }
    case VL_OPT_CUSTOM: ok = d->fn(value, d->dst) == 0; break;
    }
    if (ok) return VL_OK;
    char want[160];
    describe(d, want, sizeof want);
    return vl_opts_fail(o, "--%s: '%s' is not %s", d->name, value, want);
}

/* The entry for letter c, or NULL. */
static vl_opt *by_letter(const vl_opts *o, int c) {
    for (size_t i = 0; i < o->n; i++)
        if (o->opt[i].letter && o->opt[i].letter == c) return &o->opt[i];
    return NULL;
}

/* The option getopt_long reported through optopt, by its long name
 * whether it was spelled long or by its letter. */
static void spell(const vl_opts *o, int optopt_value, char *out, size_t cap) {
    const vl_opt *d = by_letter(o, optopt_value);
    if (optopt_value >= VAL_BASE && optopt_value < VAL_BASE + (int)o->n)
        snprintf(out, cap, "--%s", o->opt[optopt_value - VAL_BASE].name);
    else if (d)
        snprintf(out, cap, "--%s", d->name);
    else if (optopt_value == VAL_HELP)
        snprintf(out, cap, "--help");
    else if (optopt_value > 0 && optopt_value < 256)
        snprintf(out, cap, "-%c", optopt_value);
    else
        snprintf(out, cap, "an option");
}

/* getopt_long takes any unambiguous prefix of a long name; text (an argv
 * element starting "--") must spell the name in full. */
static int spelled_in_full(const char *text, const char *name) {
    const char *t = text + 2;
    size_t len = strcspn(t, "=");
    return len == strlen(name) && strncmp(t, name, len) == 0;
}

int vl_opts_parse(vl_opts *o, int argc, char **argv, int *rest) {
    if (o->n > VL_OPTS_MAX)
        return vl_opts_fail(o, "%zu options in one table, at most %d", o->n, VL_OPTS_MAX);
    struct option lo[VL_OPTS_MAX + 2];
    /* "+": stop at the first operand instead of permuting argv; ":":
     * report a missing value apart from an unknown option. */
    char letters[3 * VL_OPTS_MAX + 8] = "+:";
    size_t nl = 2, k = 0;
    for (size_t i = 0; i < o->n; i++) {
        vl_opt *d = &o->opt[i];
        int has_arg = d->kind == VL_OPT_FLAG ? no_argument : required_argument;
        d->given = 0;
        lo[k++] = (struct option){d->name, has_arg, NULL, VAL_BASE + (int)i};
        if (d->letter) {
            letters[nl++] = (char)d->letter;
            if (has_arg == required_argument) letters[nl++] = ':';
        }
    }
    if (o->usage) {
        lo[k++] = (struct option){"help", no_argument, NULL, VAL_HELP};
        letters[nl++] = 'h';
    }
    lo[k] = (struct option){NULL, 0, NULL, 0};
    letters[nl] = '\0';

    opterr = 0;
    optind = 0; /* glibc: start afresh, whatever an earlier parse left */
    for (;;) {
        int at = optind > 0 ? optind : 1, li = -1;
        int c = getopt_long(argc, argv, letters, lo, &li);
        if (c == -1) break;
        char name[80];
        if (c == ':') {
            spell(o, optopt, name, sizeof name);
            return vl_opts_fail(o, "%s needs a value", name);
        }
        if (c == '?') {
            /* optopt names a known option given a value it does not
             * take ("--force=1"); 0 means an unknown long option. */
            if (optopt >= VAL_BASE) {
                spell(o, optopt, name, sizeof name);
                return vl_opts_fail(o, "%s takes no value", name);
            }
            if (optopt > 0) return vl_opts_fail(o, "unknown option '-%c'", optopt);
            return vl_opts_fail(o, "unknown option '%.*s'", (int)strcspn(argv[at], "="), argv[at]);
        }
        if (li >= 0 && !spelled_in_full(argv[at], lo[li].name))
            return vl_opts_fail(o, "unknown option '%.*s'", (int)strcspn(argv[at], "="), argv[at]);
        if (c == VAL_HELP || (c == 'h' && o->usage)) {
            FILE *f = o->out ? o->out : stdout;
            fputs(o->usage, f);
            fflush(f);
            return VL_OPTS_HELP;
        }
        vl_opt *d = c >= VAL_BASE ? &o->opt[c - VAL_BASE] : by_letter(o, c);
        if (!d) return vl_opts_fail(o, "unknown option '-%c'", c);
        if (d->given++) return vl_opts_fail(o, "--%s given twice", d->name);
        if (d->kind != VL_OPT_FLAG && (!optarg || !optarg[0]))
            return vl_opts_fail(o, "--%s needs a value", d->name);
        if (convert(o, d, optarg) != VL_OK) return VL_EINVAL;
    }
    if (optind < argc && !rest) return vl_opts_fail(o, "unexpected argument '%s'", argv[optind]);
    for (size_t i = 0; i < o->n; i++)
        if (o->opt[i].required && !o->opt[i].given)
            return vl_opts_fail(o, "missing required option --%s", o->opt[i].name);
    if (rest) *rest = optind < argc ? optind : argc;
    return VL_OK;
}
