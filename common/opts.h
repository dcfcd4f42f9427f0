/*
 * Command-line options for every volley program: volley-coordinator,
 * volley-peer and the benchmarks describe their options as a table and
 * vl_opts_parse reads argv with POSIX getopt_long, converts each value
 * with the strict number parsers of common.h, checks its range, and turns
 * anything wrong into one line on stderr, so that every program takes and
 * refuses its command line alike:
 *
 *   volley-peer run: --threads: '0' is not 1..1024 (see 'volley-peer --help')
 *
 * The rules, the same everywhere: "--name value" and "--name=value" both
 * work; names are matched exactly (no abbreviations, so adding an option
 * never breaks a command line that worked); an option may be given once;
 * an empty value counts as a missing one; options come first, and the
 * first operand (or "--") ends them. Programs with subcommands read the
 * subcommand word themselves and then parse the rest with its own table.
 *
 * getopt_long keeps its state in globals, so parsing is for one thread
 * at a time (main, before any other thread exists).
 */
#ifndef VOLLEY_OPTS_H
#define VOLLEY_OPTS_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The exit status of a command line refused: the same for every program. */
#define VL_OPTS_EXIT_USAGE 2
/* vl_opts_parse's answer when it printed the usage for --help or -h. */
#define VL_OPTS_HELP 1
/* Most options one table may hold. */
#define VL_OPTS_MAX 64

typedef enum vl_opt_kind {
    VL_OPT_FLAG,   /* no value; sets an int to 1 */
    VL_OPT_STR,    /* a non-empty string, pointed to in argv */
    VL_OPT_INT,    /* a base-10 integer in [imin, imax], into an int64_t */
    VL_OPT_F64,    /* a finite number in [fmin, fmax], into a double */
    VL_OPT_SIZE,   /* a whole count written as a number, 1e8 or 100000000,
                    * in [imin, imax], into an int64_t */
    VL_OPT_CUSTOM, /* converted by fn; what it accepts is described by expect */
} vl_opt_kind;

/* Converts value into dst; 0, or a negative code when value is not what
 * the option takes (the parser then prints the message). */
typedef int (*vl_opt_fn)(const char *value, void *dst);

/* One option of a table. Build entries with the vl_opt_* functions below,
 * which type-check where the value goes; a value is written only when the
 * option is given, so the variable's value beforehand is the default. */
typedef struct vl_opt {
    const char *name; /* the long name, without "--" */
    int letter;       /* also "-c" for this ASCII letter (not h), or 0 */
    vl_opt_kind kind;
    int required; /* refused when absent */
    void *dst;
    int64_t imin, imax;
    double fmin, fmax;
    int open_min;       /* VL_OPT_F64: fmin itself is out of range */
    vl_opt_fn fn;       /* VL_OPT_CUSTOM */
    const char *expect; /* VL_OPT_CUSTOM: "auto, cpu or cuda", for messages */
    int given;          /* set by vl_opts_parse: 1 when on the command line */
} vl_opt;

/* A command's table and how it speaks. */
typedef struct vl_opts {
    const char *prog;  /* starts every message: "volley-peer run" */
    const char *hint;  /* ends every message in parentheses, or NULL */
    const char *usage; /* printed for --help and -h; NULL: no --help */
    vl_opt *opt;       /* the table, not owned */
    size_t n;
    FILE *err, *out; /* messages and the usage; NULL: stderr and stdout */
} vl_opts;

#define VL_OPTS_COUNT(table) (sizeof(table) / sizeof((table)[0]))

/* Parses argv[1..argc-1] (argv[0] is the program or subcommand word)
 * against o's table. Returns VL_OK; VL_OPTS_HELP after printing o->usage;
 * or VL_EINVAL after printing one line: an unknown option, a missing,
 * empty or out-of-range value, an option given twice, a required one
 * absent, or (when rest is NULL) an operand. With rest, *rest is the index
 * in argv of the first operand (argc when there is none). After a refusal
 * the options before the bad one may have been stored: the caller exits. */
int vl_opts_parse(vl_opts *o, int argc, char **argv, int *rest) VL_MUST_CHECK;

/* Prints "PROG: message (HINT)" like the parser's own lines, for the
 * checks a program makes after parsing; returns VL_EINVAL. */
int vl_opts_fail(const vl_opts *o, const char *fmt, ...) VL_PRINTF(2, 3);

/* Whether the option called name was given (0 when the table lacks it). */
int vl_opts_given(const vl_opts *o, const char *name);

/* The exit status for vl_opts_parse's answer rc: 0 for VL_OK and
 * VL_OPTS_HELP, VL_OPTS_EXIT_USAGE for a refusal. */
static inline int vl_opts_status(int rc) {
    return rc < 0 ? VL_OPTS_EXIT_USAGE : 0;
}

/* A count written as a number, "1e8" or "100000000", which must be whole
 * and lie in [min, max]; what VL_OPT_SIZE takes, for lists of them. */
int vl_opts_parse_size(const char *s, int64_t min, int64_t max, int64_t *out) VL_MUST_CHECK;

/* ---- table entries ------------------------------------------------------ */

static inline vl_opt vl_opt_make_(const char *name, vl_opt_kind kind, void *dst) {
    vl_opt o;
    memset(&o, 0, sizeof o);
    o.name = name;
    o.kind = kind;
    o.dst = dst;
    return o;
}

static inline vl_opt vl_opt_flag(const char *name, int *dst) {
    return vl_opt_make_(name, VL_OPT_FLAG, dst);
}

static inline vl_opt vl_opt_str(const char *name, const char **dst) {
    return vl_opt_make_(name, VL_OPT_STR, (void *)dst);
}

static inline vl_opt vl_opt_int(const char *name, int64_t *dst, int64_t min, int64_t max) {
    vl_opt o = vl_opt_make_(name, VL_OPT_INT, dst);
    o.imin = min;
    o.imax = max;
    return o;
}

static inline vl_opt vl_opt_size(const char *name, int64_t *dst, int64_t min, int64_t max) {
    vl_opt o = vl_opt_make_(name, VL_OPT_SIZE, dst);
    o.imin = min;
    o.imax = max;
    return o;
}

/* A number in [min, max]. */
static inline vl_opt vl_opt_f64(const char *name, double *dst, double min, double max) {
    vl_opt o = vl_opt_make_(name, VL_OPT_F64, dst);
    o.fmin = min;
    o.fmax = max;
    return o;
}

/* A number in (min, max]: above min, e.g. a positive concentration. */
static inline vl_opt vl_opt_f64_above(const char *name, double *dst, double min, double max) {
    vl_opt o = vl_opt_f64(name, dst, min, max);
    o.open_min = 1;
    return o;
}

/* A value fn converts into dst; expect says what it looks like. */
static inline vl_opt vl_opt_custom(const char *name, vl_opt_fn fn, void *dst, const char *expect) {
    vl_opt o = vl_opt_make_(name, VL_OPT_CUSTOM, dst);
    o.fn = fn;
    o.expect = expect;
    return o;
}

/* The entry o, refused when absent. */
static inline vl_opt vl_opt_required(vl_opt o) {
    o.required = 1;
    return o;
}

/* The entry o, also spelled -letter. */
static inline vl_opt vl_opt_letter(vl_opt o, char letter) {
    o.letter = (unsigned char)letter;
    return o;
}

#ifdef __cplusplus
}
#endif

#endif
