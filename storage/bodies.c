/* Update bodies in append-only segment files beside the database.
 *
 * Why not in SQLite: in WAL mode every byte committed is written twice,
 * once to the WAL and again, after a read back, by the checkpoint. For
 * update bodies (hundreds of KB each, at hundreds per second) that copy
 * was most of the coordinator's file traffic. Here a body is written once,
 * to the end of a segment file, and SQLite keeps only where it is.
 *
 * Durability: storage_commit fdatasyncs every segment this connection
 * appended to in the transaction (and the directory and its parent, when a
 * segment was created) before it commits, so a committed row never points at bytes
 * the disk might not have. Bytes of a transaction that rolled back, or
 * that a crash cut short before its commit, stay in the file with
 * nothing pointing at them until the segment is deleted.
 *
 * Appends happen only inside a write transaction and each connection
 * appends to segments it created itself (O_EXCL), so two connections never
 * write one file. Segments are deleted while the write lock is held, so
 * no other connection can be part-way through appending to one; a
 * connection whose segment was deleted notices (its link count is 0) and
 * starts a new one. The highest-numbered segment is never deleted, so a
 * number is never reused for different bytes.
 *
 * Segments are written with O_DIRECT where the file system allows it, each
 * body padded with zeros to whole BODY_ALIGN blocks at an aligned offset.
 * Through the page cache, a 200 KB append and its fdatasync cost about
 * 300 us of CPU (the copy in, then writeback at the sync); direct, the
 * device reads the staging buffer itself and the sync only flushes the
 * device, about a third of that. Where O_DIRECT is refused (tmpfs, some
 * network file systems) appends go through the page cache as before. */
#define _GNU_SOURCE /* O_DIRECT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/internal.h"

/* A segment is closed for appends past this size; a body larger than it
 * gets a segment of its own. */
#define BODY_SEGMENT_BYTES (64ull << 20)
/* Direct writes are whole blocks of this size at offsets that are
 * multiples of it: the largest logical block size of common devices. */
#define BODY_ALIGN 4096u
/* A body read back is at most this large (the database could be damaged). */
#define BODY_READ_MAX (1ull << 31)

void body_init(body_files *b, const char *db_path) {
    memset(b, 0, sizeof *b);
    b->wfd = -1;
    for (size_t i = 0; i < BODY_READ_FDS; i++) b->rfd[i] = -1;
    int n = snprintf(b->dir, sizeof b->dir, "%s-bodies", db_path);
    if (n < 0 || (size_t)n >= sizeof b->dir) b->dir[0] = '\0';
}

void body_close(body_files *b) {
    if (b->wfd >= 0) close(b->wfd);
    for (size_t i = 0; i < BODY_READ_FDS; i++)
        if (b->rfd[i] >= 0) close(b->rfd[i]);
    free(b->rbuf);
    free(b->abuf);
    memset(b, 0, sizeof *b);
    b->wfd = -1;
}

static int seg_path(const body_files *b, int64_t seg, char *out, size_t cap) {
    int n = snprintf(out, cap, "%s/%016" PRId64 ".seg", b->dir, seg);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* The segment number of a directory entry, or -1 for anything else. */
static int64_t seg_number(const char *name) {
    int64_t v = 0;
    size_t i = 0;
    for (; name[i] >= '0' && name[i] <= '9'; i++) {
        if (i >= 16) return -1;
        v = v * 10 + (name[i] - '0');
    }
    return i == 16 && strcmp(name + i, ".seg") == 0 ? v : -1;
}

/* Calls fn for every segment number in the directory; *max gets the
 * highest (-1 with none). A missing directory holds none. */
static int each_segment(const body_files *b, int (*fn)(void *, int64_t), void *ctx, int64_t *max,
                        vl_error *err) {
    *max = -1;
    DIR *d = opendir(b->dir);
    if (!d) {
        if (errno == ENOENT) return VL_OK;
        return vl_fail(err, VL_EIO, "cannot list %s: %s", b->dir, strerror(errno));
    }
    int rc = VL_OK;
    struct dirent *e;
    while (rc == VL_OK && (e = readdir(d))) {
        int64_t s = seg_number(e->d_name);
        if (s < 0) continue;
        if (s > *max) *max = s;
        if (fn) rc = fn(ctx, s);
    }
    closedir(d);
    return rc;
}

/* Ends appends to the current segment; bytes it holds of the open
 * transaction are made durable first, as the commit would have. */
static int close_segment(body_files *b, vl_error *err) {
    if (b->wfd < 0) return VL_OK;
    int rc = VL_OK;
    if (b->dirty && fdatasync(b->wfd) != 0) {
        b->lost = 1; /* the transaction's bodies in it may not be on disk */
        rc = vl_fail(err, VL_EIO, "cannot sync %s segment %" PRId64 ": %s", b->dir, b->wseg,
                     strerror(errno));
    }
    close(b->wfd);
    b->wfd = -1;
    b->dirty = 0;
    return rc;
}

static int open_segment(body_files *b, vl_error *err) {
    if (!b->dir[0]) return vl_fail(err, VL_EINVAL, "database path too long for its bodies");
    /* Like the database, whatever the umask: only the owner reads bodies,
     * and a umask that took the owner's write bit would make the
     * directory unusable. */
    if (mkdir(b->dir, 0700) == 0) {
        b->dir_dirty = 1;
        if (chmod(b->dir, 0700) != 0)
            return vl_fail(err, VL_EIO, "cannot set the mode of %s: %s", b->dir, strerror(errno));
    } else if (errno != EEXIST) {
        return vl_fail(err, VL_EIO, "cannot create %s: %s", b->dir, strerror(errno));
    }
    int64_t max;
    int rc = each_segment(b, NULL, NULL, &max, err);
    if (rc != VL_OK) return rc;
    /* Another connection may take the same number first: then the next. */
    for (int64_t s = max + 1; s <= max + 64; s++) {
        char path[sizeof b->dir + 32];
        if (seg_path(b, s, path, sizeof path) != 0)
            return vl_fail(err, VL_EINVAL, "segment path too long");
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0 && errno == EEXIST) continue;
        if (fd < 0) return vl_fail(err, VL_EIO, "cannot create %s: %s", path, strerror(errno));
        if (fchmod(fd, 0600) != 0) {
            int e = errno;
            close(fd);
            unlink(path);
            return vl_fail(err, VL_EIO, "cannot set the mode of %s: %s", path, strerror(e));
        }
        /* Set after the create, not passed to open: a file system that
         * refuses O_DIRECT would fail the open only after creating the
         * file, leaving an empty segment nobody owns. */
        int fl = fcntl(fd, F_GETFL);
        b->direct = fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
        b->wfd = fd;
        b->wseg = s;
        b->wsize = 0;
        b->dir_dirty = 1;
        return VL_OK;
    }
    return vl_fail(err, VL_EIO, "cannot create a new segment in %s", b->dir);
}

/* Copies the body into the aligned staging buffer, zero-padded to padded
 * bytes. The buffer grows to the largest body seen: bodies are capped by
 * the server's max_body_bytes before they reach storage. */
static int stage_direct(body_files *b, const void *data, size_t len, size_t padded, vl_error *err) {
    if (padded > b->acap) {
        void *p = NULL;
        if (posix_memalign(&p, BODY_ALIGN, padded) != 0)
            return vl_fail(err, VL_ENOMEM, "out of memory staging an update body");
        free(b->abuf);
        b->abuf = p;
        b->acap = padded;
    }
    memcpy(b->abuf, data, len);
    memset(b->abuf + len, 0, padded - len);
    return VL_OK;
}

/* Back to the page cache for the rest of this segment. */
static void drop_direct(body_files *b) {
    int fl = fcntl(b->wfd, F_GETFL);
    if (fl >= 0) (void)fcntl(b->wfd, F_SETFL, fl & ~O_DIRECT);
    b->direct = 0;
}

int body_append(body_files *b, const void *data, size_t len, int64_t *seg, int64_t *off,
                vl_error *err) {
    struct stat sb;
    if (b->wfd >= 0 && (fstat(b->wfd, &sb) != 0 || sb.st_nlink == 0)) {
        /* Deleted as unused by another connection: nothing of ours in it
         * is committed, and nothing uncommitted, since we hold the lock. */
        close(b->wfd);
        b->wfd = -1;
        b->dirty = 0;
    }
    size_t padded = (len + BODY_ALIGN - 1) / BODY_ALIGN * BODY_ALIGN;
    if (b->wfd >= 0 && b->wsize > 0 && b->wsize + padded > BODY_SEGMENT_BYTES) {
        int rc = close_segment(b, err);
        if (rc != VL_OK) return rc;
    }
    if (b->wfd < 0) {
        int rc = open_segment(b, err);
        if (rc != VL_OK) return rc;
    }
    const uint8_t *p = data;
    size_t n = len;
    if (b->direct && b->wsize % BODY_ALIGN == 0) {
        int rc = stage_direct(b, data, len, padded, err);
        if (rc != VL_OK) return rc;
        p = b->abuf;
        n = padded;
    } else if (b->direct) {
        drop_direct(b);
    }
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(b->wfd, p + done, n - done, (off_t)(b->wsize + done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EINVAL && b->direct && done == 0) {
            /* The device wants a larger alignment: the page cache, then. */
            drop_direct(b);
            p = data;
            n = len;
            continue;
        }
        if (w <= 0) {
            /* What a failed write left is not pointed at; start afresh.
             * Bodies appended before it in this transaction belong to
             * jobs that will commit with it: they are made durable now,
             * and if that fails too the whole transaction must fail. */
            int e = errno;
            if (b->dirty && fdatasync(b->wfd) != 0) b->lost = 1;
            close(b->wfd);
            b->wfd = -1;
            b->dirty = 0;
            if (w < 0 && (e == ENOSPC || e == EDQUOT))
                return vl_fail(err, VL_EFULL, "disk full writing an update body to %s: %s", b->dir,
                               strerror(e));
            return vl_fail(err, VL_EIO, "cannot write an update body to %s: %s", b->dir,
                           w < 0 ? strerror(e) : "no progress");
        }
        done += (size_t)w;
    }
    *seg = b->wseg;
    *off = (int64_t)b->wsize;
    b->wsize += n;
    b->dirty = 1;
    return VL_OK;
}

int body_sync(body_files *b, vl_error *err) {
    if (b->lost) {
        b->lost = 0;
        return vl_fail(err, VL_EIO,
                       "update bodies in %s: an append failed and the bodies "
                       "before it could not be made durable",
                       b->dir);
    }
    if (b->dirty && b->wfd >= 0) {
        if (fdatasync(b->wfd) != 0) {
            /* After a failed sync the page cache may no longer hold what
             * was lost; never append to this file again. */
            int e = errno;
            close(b->wfd);
            b->wfd = -1;
            b->dirty = 0;
            return vl_fail(err, e == ENOSPC || e == EDQUOT ? VL_EFULL : VL_EIO,
                           "%scannot sync update bodies in %s: %s",
                           e == ENOSPC || e == EDQUOT ? "disk full: " : "", b->dir, strerror(e));
        }
        b->dirty = 0;
    }
    if (b->dir_dirty) {
        /* The new segment's entry, and the directory's own entry in its
         * parent: the connection that created the directory may not be
         * the one whose commit first points into it, and without that
         * entry a power cut takes the directory and every segment in it.
         * One more fsync per segment (64 MiB) is nothing. */
        char parent[sizeof b->dir];
        const char *slash = strrchr(b->dir, '/');
        if (!slash)
            snprintf(parent, sizeof parent, ".");
        else if (slash == b->dir)
            snprintf(parent, sizeof parent, "/");
        else
            snprintf(parent, sizeof parent, "%.*s", (int)(slash - b->dir), b->dir);
        int rc = vl_file_sync_dir(b->dir, err);
        if (rc == VL_OK) rc = vl_file_sync_dir(parent, err);
        if (rc != VL_OK) return rc;
        b->dir_dirty = 0;
    }
    return VL_OK;
}

static int read_fd(body_files *b, int64_t seg, int *out, vl_error *err) {
    for (size_t i = 0; i < BODY_READ_FDS; i++)
        if (b->rfd[i] >= 0 && b->rseg[i] == seg) {
            *out = b->rfd[i];
            return VL_OK;
        }
    char path[sizeof b->dir + 32];
    if (seg_path(b, seg, path, sizeof path) != 0)
        return vl_fail(err, VL_EINVAL, "segment path too long");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    /* A missing file is a body lost for good (VL_EDB); anything else (no
     * descriptors left, an I/O error) may pass, and is retried (VL_EIO). */
    if (fd < 0)
        return vl_fail(err, errno == ENOENT ? VL_EDB : VL_EIO, "update bodies: cannot open %s: %s",
                       path, strerror(errno));
    size_t slot = b->rnext++ % BODY_READ_FDS;
    if (b->rfd[slot] >= 0) close(b->rfd[slot]);
    b->rfd[slot] = fd;
    b->rseg[slot] = seg;
    *out = fd;
    return VL_OK;
}

int body_read(body_files *b, int64_t seg, int64_t off, int64_t len, const uint8_t **out,
              vl_error *err) {
    if (seg < 0 || off < 0 || len < 0 || (uint64_t)len > BODY_READ_MAX)
        return vl_fail(err, VL_EDB,
                       "database: an update body has a bad place (%" PRId64 ", %" PRId64
                       ", %" PRId64 ")",
                       seg, off, len);
    if ((size_t)len > b->rcap) {
        uint8_t *p = realloc(b->rbuf, (size_t)len);
        if (!p) return vl_fail(err, VL_ENOMEM, "out of memory reading an update body");
        b->rbuf = p;
        b->rcap = (size_t)len;
    }
    int fd;
    int rc = read_fd(b, seg, &fd, err);
    if (rc != VL_OK) return rc;
    size_t done = 0;
    while (done < (size_t)len) {
        ssize_t r = pread(fd, b->rbuf + done, (size_t)len - done, (off_t)off + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return vl_fail(err, VL_EIO,
                           "update bodies: cannot read segment %" PRId64 " at %" PRId64 ": %s", seg,
                           off, strerror(errno));
        if (r == 0)
            return vl_fail(err, VL_EDB,
                           "update bodies: segment %" PRId64 " is short at %" PRId64
                           " (end of file)",
                           seg, off);
        done += (size_t)r;
    }
    *out = b->rbuf;
    return VL_OK;
}

typedef struct prune_ctx {
    storage *st;
    int64_t max;
    vl_error *err;
} prune_ctx;

static int note_one(void *arg, int64_t seg) {
    prune_ctx *c = arg;
    body_files *b = &c->st->bodies;
    if (seg >= c->max || (b->wfd >= 0 && seg == b->wseg) || b->n_prune >= BODY_PRUNE_MAX)
        return VL_OK;
    int unused = 0;
    int rc = q_body_seg_unused(c->st, seg, &unused, c->err);
    if (rc == VL_OK && unused) b->prune[b->n_prune++] = seg;
    return rc;
}

int body_prune(storage *st, vl_error *err) {
    if (!storage_in_transaction(st))
        return vl_fail(err, VL_EDB, "update bodies are pruned only inside a transaction");
    body_files *b = &st->bodies;
    /* What the last committed transaction found unused: its row deletions
     * are durable now, and nothing this one does adds rows pointing into
     * an old segment, so a segment still unused here can go. */
    size_t removed = 0;
    if (b->prune_ready) {
        for (size_t i = 0; i < b->n_prune; i++) {
            int64_t seg = b->prune[i];
            int unused = 0;
            int rc = q_body_seg_unused(st, seg, &unused, err);
            if (rc != VL_OK) return rc;
            if (!unused || (b->wfd >= 0 && seg == b->wseg)) continue;
            char path[sizeof b->dir + 32];
            if (seg_path(b, seg, path, sizeof path) == 0 && unlink(path) == 0)
                removed++;
            else if (errno != ENOENT)
                vl_log_warn("update bodies: cannot remove %s: %s", path, strerror(errno));
        }
    }
    b->n_prune = 0;
    b->prune_ready = 0;
    if (removed) vl_log_debug("update bodies: removed %zu unused segment(s)", removed);
    int64_t max;
    /* The first pass finds the highest number, which is never noted. */
    int rc = each_segment(b, NULL, NULL, &max, err);
    if (rc != VL_OK || max < 0) return rc;
    prune_ctx c = {st, max, err};
    int64_t unused_max;
    return each_segment(b, note_one, &c, &unused_max, err);
}

void body_committed(body_files *b) {
    b->prune_ready = b->n_prune > 0;
}

void body_rolled_back(body_files *b) {
    b->lost = 0; /* nothing of the transaction will point at its appends */
    b->n_prune = 0;
    b->prune_ready = 0;
}
