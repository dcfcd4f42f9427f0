/* The advisory lock that keeps a second coordinator off a live database
 * (storage.h, storage_lock_take).
 *
 * Two servers on one database would each believe they own the run: both
 * make version v + 1 from the same updates, and the second commit fails
 * ("version 15 cannot follow version 15") over and over. SQLite's own
 * locks cannot prevent it, since they only order transactions. flock on a
 * file beside the database can: the kernel drops it when the holder exits,
 * however it exits, so a crash never leaves a stale lock behind, and the
 * file's content (written after the lock is taken) names the holder for
 * whoever is refused. Commands that only make one short transaction
 * (token create, peer revoke, status, check) take no lock: SQLite orders
 * them beside a running server. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/storage.h"

struct storage_lock {
    int fd;
};

/* Most of the holder's description kept in the file and read back. */
#define HOLDER_MAX 512

/* This process's command line, arguments separated by spaces, cut at cap.
 * Linux's /proc gives it; elsewhere the description says so. */
static void own_command(char *out, size_t cap) {
    snprintf(out, cap, "command line unknown");
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, out, cap - 1);
    close(fd);
    if (n <= 0) {
        snprintf(out, cap, "command line unknown");
        return;
    }
    /* Arguments end in NUL; the last one's is not a separator. */
    while (n > 0 && out[n - 1] == '\0') n--;
    for (ssize_t i = 0; i < n; i++)
        if (out[i] == '\0' || out[i] == '\n') out[i] = ' ';
    out[n] = '\0';
}

/* "process 1234 (volley-coordinator serve --db run.db ...)" from what the
 * holder wrote, or a plain phrase when it wrote nothing yet. */
static void read_holder(int fd, char *out, size_t cap) {
    char buf[HOLDER_MAX + 1];
    ssize_t n = pread(fd, buf, HOLDER_MAX, 0);
    if (n <= 0) {
        snprintf(out, cap, "another process (it has not written its name yet)");
        return;
    }
    buf[n] = '\0';
    char *command = strchr(buf, '\n');
    if (command) {
        *command++ = '\0';
        command[strcspn(command, "\n")] = '\0';
    } else {
        command = buf + n; /* the empty string */
    }
    /* Only digits count as a pid: the file is ours but may be damaged. */
    long pid = strspn(buf, "0123456789") == strlen(buf) && buf[0] ? strtol(buf, NULL, 10) : 0;
    if (pid > 0)
        snprintf(out, cap, "process %ld (%s)", pid, command[0] ? command : "command unknown");
    else
        snprintf(out, cap, "another process");
}

int storage_lock_path(const char *db_path, char *out, size_t cap, vl_error *err) {
    int n = snprintf(out, cap, "%s-lock", db_path);
    if (n < 0 || (size_t)n >= cap)
        return vl_fail(err, VL_ETOOBIG, "database path too long: %s", db_path);
    return VL_OK;
}

int storage_lock_take(const char *db_path, storage_lock **out, vl_error *err) {
    *out = NULL;
    char path[4096];
    int rc = storage_lock_path(db_path, path, sizeof path, err);
    if (rc != VL_OK) return rc;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return vl_fail(err, VL_EIO, "cannot open the lock file %s: %s", path, strerror(errno));
    /* LOCK_NB: a second server says who is there instead of waiting. */
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EINTR) continue;
        int e = errno;
        if (e == EWOULDBLOCK) {
            char holder[HOLDER_MAX + 64];
            read_holder(fd, holder, sizeof holder);
            close(fd);
            return vl_fail(err, VL_ECONFLICT, "%s is in use by %s; stop it first (its lock is %s)",
                           db_path, holder, path);
        }
        close(fd);
        return vl_fail(err, VL_EIO, "cannot lock %s: %s", path, strerror(e));
    }
    storage_lock *l = malloc(sizeof *l);
    if (!l) {
        close(fd);
        return vl_fail(err, VL_ENOMEM, "out of memory");
    }
    l->fd = fd;
    /* The name is advice for the one refused; failing to write it keeps
     * the lock, which is what protects the database. */
    char command[HOLDER_MAX - 32];
    own_command(command, sizeof command);
    char line[HOLDER_MAX];
    int n = snprintf(line, sizeof line, "%ld\n%s\n", (long)getpid(), command);
    if (n > 0 && ftruncate(fd, 0) == 0) {
        size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
        if (pwrite(fd, line, len, 0) != (ssize_t)len)
            vl_log_warn("cannot write the holder into %s: %s", path, strerror(errno));
    }
    *out = l;
    return VL_OK;
}

void storage_lock_release(storage_lock *l) {
    if (!l) return;
    /* Emptied first, so nobody reads a name after the holder is gone. */
    if (ftruncate(l->fd, 0) != 0) {}
    close(l->fd);
    free(l);
}
