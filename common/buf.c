/* Growable byte buffers with hard caps, and whole-file I/O. */
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* cap counts content bytes; one more byte is always allocated for the NUL,
 * so cap is clamped to keep cap + 1 and the doubling below from wrapping. */
#define BUF_MAX_CAP (SIZE_MAX / 4)

void vl_buf_init(vl_buf *b, size_t cap) {
    b->data = NULL;
    b->len = 0;
    b->alloc = 0;
    /* A zero cap would make the buffer useless; treat it as "default". */
    if (cap == 0) cap = VL_BUF_DEFAULT_CAP;
    b->cap = cap > BUF_MAX_CAP ? BUF_MAX_CAP : cap;
}

void vl_buf_free(vl_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->alloc = 0;
}

void vl_buf_reset(vl_buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

int vl_buf_reserve(vl_buf *b, size_t extra) {
    if (extra > b->cap || b->len > b->cap - extra) return VL_ETOOBIG;
    size_t need = b->len + extra + 1;
    if (b->data && need <= b->alloc) return VL_OK;
    size_t na = b->alloc ? b->alloc : 64;
    while (na < need) na *= 2;
    if (na > b->cap + 1) na = b->cap + 1;
    uint8_t *p = realloc(b->data, na);
    if (!p) return VL_ENOMEM;
    if (!b->data) p[0] = '\0';
    b->data = p;
    b->alloc = na;
    return VL_OK;
}

int vl_buf_append(vl_buf *b, const void *p, size_t n) {
    int rc = vl_buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return VL_OK;
}

int vl_buf_append_str(vl_buf *b, const char *s) {
    return vl_buf_append(b, s, strlen(s));
}

int vl_buf_printf(vl_buf *b, const char *fmt, ...) {
    va_list ap, ap2;
    int rc = vl_buf_reserve(b, 0);
    if (rc) return rc;
    size_t room = b->alloc - b->len; /* includes the NUL slot */
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf((char *)b->data + b->len, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
        va_end(ap2);
        b->data[b->len] = '\0';
        return VL_EINVAL;
    }
    if ((size_t)n < room) {
        va_end(ap2);
        b->len += (size_t)n;
        return VL_OK;
    }
    rc = vl_buf_reserve(b, (size_t)n);
    if (rc) {
        va_end(ap2);
        /* The first attempt wrote a truncated prefix past len; undo it. */
        b->data[b->len] = '\0';
        return rc;
    }
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    b->len += (size_t)n;
    return VL_OK;
}

uint8_t *vl_buf_steal(vl_buf *b, size_t *len) {
    uint8_t *p = b->data;
    if (len) *len = b->len;
    if (!p) {
        /* Callers may treat the result as a C string even when empty. */
        p = calloc(1, 1);
        if (len) *len = 0;
    }
    b->data = NULL;
    b->len = 0;
    b->alloc = 0;
    return p;
}

/* Appends the file to whatever b already holds; on failure b is as before. */
int vl_buf_read_file(vl_buf *b, const char *path, vl_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return vl_fail(err, e == ENOENT ? VL_ENOTFOUND : VL_EIO, "open %s: %s", path, strerror(e));
    }
    size_t start = b->len;
    int rc = VL_OK;
    const char *what = NULL;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        /* Refuse early instead of reading up to the cap first, and allocate
         * once for the common case of a file that does not change. */
        if ((uint64_t)st.st_size > (uint64_t)(b->cap - b->len)) {
            close(fd);
            return vl_fail(err, VL_ETOOBIG, "%s: %lld bytes exceeds the %zu-byte limit", path,
                           (long long)st.st_size, b->cap - b->len);
        }
        if ((rc = vl_buf_reserve(b, (size_t)st.st_size)) != VL_OK) {
            what = "allocate";
            goto fail;
        }
    }
    for (;;) {
        /* Read straight into spare room; when there is none, a small probe
         * read finds EOF without growing the buffer for nothing, and
         * otherwise grows it geometrically through vl_buf_append (which also
         * enforces the cap for files of unknown size such as /proc). */
        uint8_t probe[4096];
        size_t room = b->data ? b->alloc - b->len - 1 : 0;
        ssize_t r = room ? read(fd, b->data + b->len, room) : read(fd, probe, sizeof probe);
        if (r < 0) {
            if (errno == EINTR) continue;
            rc = VL_EIO;
            what = strerror(errno);
            goto fail;
        }
        if (r == 0) break;
        if (room) {
            b->len += (size_t)r;
            b->data[b->len] = '\0';
        } else if ((rc = vl_buf_append(b, probe, (size_t)r)) != VL_OK) {
            what = rc == VL_ETOOBIG ? "over the size limit" : "out of memory";
            goto fail;
        }
    }
    close(fd);
    /* An empty file still yields a valid (empty) C string. */
    if (!b->data && (rc = vl_buf_reserve(b, 0)) != VL_OK)
        return vl_fail(err, rc, "%s: out of memory", path);
    return VL_OK;

fail:
    close(fd);
    b->len = start;
    if (b->data) b->data[b->len] = '\0';
    return vl_fail(err, rc, "read %s: %s", path, what);
}

static int write_all_fd(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int vl_file_write_atomic(const char *path, const void *data, size_t len, unsigned mode,
                         vl_error *err) {
    size_t plen = strlen(path);
    if (plen == 0 || plen > 4000) return vl_fail(err, VL_EINVAL, "bad path length %zu", plen);

    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    if (n < 0 || (size_t)n >= sizeof tmp) return vl_fail(err, VL_EINVAL, "path too long: %s", path);

    /* The directory entry must be synced too, or a crash right after the
     * rename can leave the old file (or none) in place. */
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) {
        memcpy(dir, ".", 2);
    } else if (slash == path) {
        memcpy(dir, "/", 2);
    } else {
        size_t dl = (size_t)(slash - path);
        memcpy(dir, path, dl);
        dir[dl] = '\0';
    }

    int fd = mkstemp(tmp);
    if (fd < 0) return vl_fail(err, VL_EIO, "create temp file for %s: %s", path, strerror(errno));
    /* fchmod, not open()'s mode argument, so the umask cannot loosen or
     * tighten what the caller asked for (keys need exactly 0600). */
    const char *what = NULL;
    if (fchmod(fd, (mode_t)(mode & 07777)) != 0)
        what = "chmod";
    else if (write_all_fd(fd, data, len) != 0)
        what = "write";
    else if (fsync(fd) != 0)
        what = "fsync";
    if (what) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return vl_fail(err, VL_EIO, "%s %s: %s", what, tmp, strerror(e));
    }
    if (close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return vl_fail(err, VL_EIO, "close %s: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return vl_fail(err, VL_EIO, "rename %s -> %s: %s", tmp, path, strerror(e));
    }
    return vl_file_sync_dir(dir, err);
}

int vl_file_sync_dir(const char *dir, vl_error *err) {
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return vl_fail(err, VL_EIO, "open directory %s: %s", dir, strerror(errno));
    if (fsync(dfd) != 0) {
        int e = errno;
        close(dfd);
        return vl_fail(err, VL_EIO, "fsync directory %s: %s", dir, strerror(e));
    }
    close(dfd);
    return VL_OK;
}
