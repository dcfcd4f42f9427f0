/*
 * Private to model/: one-line refusals that name the file a reader
 * refused (token shards, IDX images), shared so both cut long paths the
 * same way.
 */
#ifndef VOLLEY_MODEL_PATH_FAIL_H
#define VOLLEY_MODEL_PATH_FAIL_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"

/* Records "PREFIXPATH: DETAIL" in err (which may be NULL) and returns
 * code. A path too long for the message is cut from the front, keeping
 * the file name, so the detail (sizes, index, value) always fits; callers
 * keep detail short enough (under 180 bytes) that some of the path is
 * always left. */
static inline int model_path_fail(vl_error *err, int code, const char *prefix, const char *path,
                                  const char *detail) {
    if (err == NULL) return code;
    size_t fixed = strlen(prefix) + 2 + strlen(detail), cap = sizeof err->msg - 1;
    size_t room = fixed < cap ? cap - fixed : 0, plen = strlen(path);
    if (plen <= room) return vl_fail(err, code, "%s%s: %s", prefix, path, detail);
    if (room <= 3) return vl_fail(err, code, "%s%s", prefix, detail);
    return vl_fail(err, code, "%s...%s: %s", prefix, path + plen - (room - 3), detail);
}

/* model_path_fail with the detail formatted from fmt and ap (cut to 175
 * bytes, which always leaves room for some of the path). */
static inline int model_path_failv(vl_error *err, int code, const char *prefix, const char *path,
                                   const char *fmt, va_list ap) VL_PRINTF(5, 0);

static inline int model_path_failv(vl_error *err, int code, const char *prefix, const char *path,
                                   const char *fmt, va_list ap) {
    if (err == NULL) return code;
    char detail[176];
    if (vsnprintf(detail, sizeof detail, fmt, ap) < 0) detail[0] = '\0';
    return model_path_fail(err, code, prefix, path, detail);
}

#endif
