/* Strict number parsing for configuration and query strings. strtoll and
 * strtod alone accept leading spaces, trailing junk and empty input; these
 * wrappers do not. */
#include "common/common.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

static int starts_like_number(const char *s) {
    const char *p = s;
    if (*p == '-' || *p == '+') p++;
    return (*p >= '0' && *p <= '9') || *p == '.';
}

int vl_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out) {
    if (!s) return VL_EINVAL;
    const char *p = (s[0] == '-' || s[0] == '+') ? s + 1 : s;
    if (*p < '0' || *p > '9') return VL_EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE || *end != '\0') return VL_EINVAL;
    if (v < min || v > max) return VL_EINVAL;
    *out = (int64_t)v;
    return VL_OK;
}

int vl_parse_f64(const char *s, double *out) {
    /* Requiring a digit or '.' up front rules out "nan", "inf" and hex
     * prefixes' surprises at the syntax level; isfinite() catches overflow. */
    if (!s || !starts_like_number(s)) return VL_EINVAL;
    const char *p = (s[0] == '-' || s[0] == '+') ? s + 1 : s;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) return VL_EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(v)) return VL_EINVAL;
    /* ERANGE with a finite result is underflow to (sub)normal or zero, which
     * is an acceptable rounding of the text. */
    *out = v;
    return VL_OK;
}
