/* Error recording shared by every module. */
#include "common/common.h"

#include <stdio.h>

int vl_fail(vl_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        err->code = code;
        va_start(ap, fmt);
        /* Truncation is acceptable: the message is for humans and the code
         * carries the machine-readable part. */
        if (vsnprintf(err->msg, sizeof err->msg, fmt, ap) < 0) err->msg[0] = '\0';
        va_end(ap);
    }
    return code;
}

const char *vl_strerror(int code) {
    switch (code) {
    case VL_OK: return "ok";
    case VL_ERR: return "failure";
    case VL_ENOMEM: return "out of memory";
    case VL_EINVAL: return "invalid input";
    case VL_EIO: return "i/o error";
    case VL_ETOOBIG: return "too big";
    case VL_ENOTFOUND: return "not found";
    case VL_ECONFLICT: return "conflict";
    case VL_EAUTH: return "authentication failed";
    case VL_EDB: return "database error";
    case VL_ERANGE: return "out of range";
    case VL_EFULL: return "disk full";
    case VL_AGAIN: return "not now";
    case VL_DONE: return "done";
    default: return "unknown error";
    }
}
