/* The command line every training bench takes: [--threads N] [--quick].
 * Read with the option layer of the programs (common/opts.h), so the
 * benches parse, refuse and answer --help alike. */
#ifndef VOLLEY_BENCH_ARGS_H
#define VOLLEY_BENCH_ARGS_H

#include <omp.h>

#include "common/opts.h"

/* Sets *threads (default: the processors OpenMP sees) and *quick (default
 * 0) from argv; prog names the bench in messages and usage is its --help.
 * Returns vl_opts_parse's answer: main goes on at VL_OK and otherwise
 * returns vl_opts_status of it (0 after --help, 2 after one line on a
 * bad command line). */
static inline int bench_parse_args(const char *prog, const char *usage, int argc, char **argv,
                                   int *threads, int *quick) {
    int64_t n = omp_get_num_procs();
    *quick = 0;
    vl_opt t[] = {vl_opt_int("threads", &n, 1, 1024), vl_opt_flag("quick", quick)};
    vl_opts o = {.prog = prog, .usage = usage, .opt = t, .n = VL_OPTS_COUNT(t)};
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    *threads = (int)n;
    return rc;
}

#endif
