/*
 * The lock of a peer's directory (peer/dirlock.h): flock on DIR/peer.lock,
 * which the holder fills with "PID COMMAND".
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "peer/dirlock.h"

/* What a holder writes is short; more is not a lock file of ours. */
#define HOLDER_MAX 200

/* The holder's line from fd, printable characters only, into out. */
static void read_holder(int fd, char *out, size_t cap) {
    char buf[HOLDER_MAX + 1];
    ssize_t n = pread(fd, buf, HOLDER_MAX, 0);
    size_t k = 0;
    for (ssize_t i = 0; i < n && k + 1 < cap; i++) {
        if (buf[i] == '\n') break;
        out[k++] = buf[i] >= 0x20 && buf[i] < 0x7f ? buf[i] : '?';
    }
    out[k] = '\0';
}

int peer_dir_lock(const char *dir, const char *command, int *out, vl_error *err) {
    *out = -1;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/%s", dir, PEER_LOCK_FILE);
    if (n < 0 || (size_t)n >= sizeof path)
        return vl_fail(err, VL_ETOOBIG, "path %s/%s is too long", dir, PEER_LOCK_FILE);
    int writable = 1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && (errno == EROFS || errno == EACCES)) {
        /* A directory that cannot be written is still locked, by its
         * existing file; the command itself then says what it cannot
         * write. */
        writable = 0;
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    }
    if (fd < 0) {
        struct stat st;
        if (errno == ENOENT && stat(dir, &st) != 0) return VL_OK;
        if (!writable) return VL_OK;
        return vl_fail(err, VL_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char holder[HOLDER_MAX + 1] = "";
        if (e == EWOULDBLOCK) read_holder(fd, holder, sizeof holder);
        close(fd);
        if (e != EWOULDBLOCK) return vl_fail(err, VL_EIO, "cannot lock %s: %s", path, strerror(e));
        int pid = 0, off = 0;
        if (sscanf(holder, "%d %n", &pid, &off) == 1 && pid > 0 && holder[off])
            return vl_fail(err, VL_ECONFLICT,
                           "%s is in use by process %d (%s); stop it first, or give this "
                           "command another --dir",
                           dir, pid, holder + off);
        return vl_fail(err, VL_ECONFLICT,
                       "%s is in use by another volley-peer process (%s holds its lock); stop "
                       "it first, or give this command another --dir",
                       dir, path);
    }
    if (writable) {
        char line[HOLDER_MAX];
        int len = snprintf(line, sizeof line, "%d %s\n", (int)getpid(), command);
        if (len < 0 || (size_t)len >= sizeof line)
            len = snprintf(line, sizeof line, "%d\n", (int)getpid());
        /* Best effort: the lock is the flock; the line only names it. */
        if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len)
            vl_log_debug("cannot write %s: %s", path, strerror(errno));
    }
    *out = fd;
    return VL_OK;
}

void peer_dir_unlock(int fd) {
    if (fd >= 0) close(fd);
}
