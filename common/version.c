/* version.c: the --version line (version.h). */
#include "common/version.h"

void vl_version_print(FILE *f, const char *prog, const char *cuda_archs) {
    if (cuda_archs)
        fprintf(f, "%s %s (commit %s, CUDA compiled in for architectures %s)\n", prog, vl_version,
                vl_commit, cuda_archs);
    else
        fprintf(f, "%s %s (commit %s, no CUDA)\n", prog, vl_version, vl_commit);
}
