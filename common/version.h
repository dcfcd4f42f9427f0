/* version.h: which build a program is, for --version, the logs and bug
 * reports. The version is the project's (CMakeLists.txt); the commit is
 * the source tree's at build time (cmake/version.cmake), with "+changes"
 * when tracked files differed from it. */
#ifndef VL_VERSION_H
#define VL_VERSION_H

#include <stdio.h>

/* "MAJOR.MINOR.PATCH". */
extern const char vl_version[];
/* Twelve hex digits of the commit, perhaps "+changes" after them, or
 * "unknown" when built outside a git checkout without VOLLEY_COMMIT. */
extern const char vl_commit[];

/* Prints one line to f: "PROG VERSION (commit C, CUDA compiled in for
 * architectures A)" or "(commit C, no CUDA)". cuda_archs is NULL when the
 * program has no CUDA code. */
void vl_version_print(FILE *f, const char *prog, const char *cuda_archs);

#endif
