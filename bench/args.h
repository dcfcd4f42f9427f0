/* The command line every training bench takes: [--threads N] [--quick].
 * Shared by the bench programs so they parse and refuse alike. */
#ifndef VOLLEY_BENCH_ARGS_H
#define VOLLEY_BENCH_ARGS_H

#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"

/* Sets *threads (default: the processors OpenMP sees) and *quick (default
 * 0) from argv. Returns 0, or 2 after printing the usage line for anything
 * else, which main returns as its exit status. */
static inline int bench_parse_args(int argc, char **argv, int *threads, int *quick)
{
    *threads = omp_get_num_procs();
    *quick = 0;
    for (int i = 1; i < argc; i++) {
        int64_t v;
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc &&
            parse_i64(argv[i + 1], 1, 1024, &v) == 0) {
            *threads = (int)v;
            i++;
        } else if (strcmp(argv[i], "--quick") == 0) {
            *quick = 1;
        } else {
            fprintf(stderr, "usage: %s [--threads N] [--quick]\n", argv[0]);
            return 2;
        }
    }
    return 0;
}

#endif
