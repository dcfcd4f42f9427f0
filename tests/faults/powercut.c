/* Simulated power cuts and disk faults inside a running coordinator.
 *
 * Loaded into volley-coordinator with LD_PRELOAD by powercut.sh. A process
 * killed with SIGKILL keeps everything it wrote in the page cache, so a
 * crash test never sees a missing fsync. This layer keeps, for every file
 * that must survive a power cut, the writes not yet made durable; at the
 * cut it puts each such file back the way the disk would hold it (every
 * unsynced write dropped, or a random part of them kept) and ends the
 * process at once, from inside the write or sync that was about to
 * happen, so nothing after the cut reaches the files.
 *
 * Two layers feed one model:
 *  - SQLite: a VFS wrapping the default one (in the spirit of SQLite's own
 *    crash tests), made the coordinator's by interposing sqlite3_open_v2.
 *    It sees the database, its WAL and any rollback journal.
 *  - Update segments (the .seg files in <db>-bodies): the libc calls the segment
 *    writer makes (open, pwrite, fdatasync, fsync of the directory, mkdir)
 *    are interposed. A segment created since its directory was last
 *    synced is gone after a cut, and so is a bodies directory created
 *    since the database's directory was last synced. A failed fdatasync
 *    loses what it was to sync for good, as on Linux: a later sync that
 *    succeeds does not bring it back.
 *
 * Environment (all optional; without them the layer only passes through):
 *   VOLLEY_POWERCUT_MS    cut at a write or sync this many ms after start
 *   VOLLEY_POWERCUT_SKIP  ... the SKIP-th one after that moment (default 0)
 *   VOLLEY_POWERCUT_KEEP  chance that an unsynced write survives (0)
 *   VOLLEY_FAULT_RATE     chance that a database write or sync fails (0)
 *   VOLLEY_FAULT_SEGMENT_RATE  the same for a segment write or sync (as above)
 *   VOLLEY_FAULT_AFTER_MS no faults before the process accepts its first
 *                         connection and this many ms have passed since
 *                         (start-up is not what is tested: the coordinator
 *                         binds its listeners before it opens the database,
 *                         so listen() comes too early to tell)
 *   VOLLEY_DISK_FULL_MS   START:LENGTH: the disk is full for LENGTH ms,
 *                         from START ms after the first accepted
 *                         connection: every database and segment write
 *                         fails with ENOSPC (a line says when it fills
 *                         and when it has room again, with the count)
 *   VOLLEY_POWERCUT_AFTER_FAULT  set: the cut comes 0-29 writes and syncs
 *                         after the first fault on a segment instead, before
 *                         a merge can read what the fault put at risk
 *   VOLLEY_POWERCUT_SEED  seed for every random choice
 * A cut prints one line starting "powercut:" to stderr and exits with 86;
 * each injected fault prints one starting "diskfault:".
 *
 * A test loaded with the layer may also steer it at chosen moments (found
 * with dlsym): volley_powercut_fail_next(what, errno) fails the next
 * write or sync whose description contains what ("segment write",
 * "segment sync", "database sync", ...), and volley_powercut_now() cuts. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PC_EXIT 86
#define PC_FILES 256
#define PC_FDS 65536
#define PC_PATH 1024

/* One write not yet durable: where, how long, and what the file held
 * there before (old_len bytes; past them the file was shorter). */
typedef struct {
    int64_t off, len, old_len;
    unsigned char *old;
    int doomed; /* its sync failed: lost at the cut whatever follows */
} pc_write;

typedef struct {
    char path[PC_PATH];
    int used, segment;
    int is_new;     /* created since its directory was last synced */
    int64_t synced; /* size at the last sync */
    int64_t size;   /* size now */
    pc_write *w;
    size_t n, cap;
} pc_file;

/* Recursive: the VFS layer holds it while the unix VFS below calls the
 * interposed pwrite and fsync. */
static pthread_mutex_t pc_mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static pc_file pc_files[PC_FILES];
static pc_file *pc_fd[PC_FDS]; /* segment files, by descriptor */
static char *pc_dirfd[PC_FDS]; /* directories, by descriptor */
static char pc_new_dirs[8][PC_PATH];
static int pc_n_new_dirs;

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_close)(int);
static int (*real_unlink)(const char *);
static int (*real_mkdir)(const char *, mode_t);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_sqlite3_open_v2)(const char *, sqlite3 **, int, const char *);

static double pc_cut_ms = -1, pc_keep, pc_fault_rate, pc_fault_seg_rate, pc_fault_after_ms;
static long pc_skip;
static int pc_cut_after_fault;
static char pc_fail_what[64];
static int pc_fail_errno;
static uint64_t pc_rng = 88172645463325252ull;
static struct timespec pc_t0;
static long pc_ops, pc_faults;
static double pc_listen_ms = -1; /* when the process accepted its first connection */
/* VOLLEY_DISK_FULL_MS: the window, after pc_listen_ms (start < 0: none),
 * whether it has begun and ended, and the writes it failed. */
static double pc_full_start = -1, pc_full_len;
static int pc_full_state; /* 0 before, 1 full, 2 after */
static long pc_full_failed;

static uint64_t rng_next(void) {
    pc_rng ^= pc_rng << 13;
    pc_rng ^= pc_rng >> 7;
    pc_rng ^= pc_rng << 17;
    return pc_rng;
}
static double rng_unit(void) {
    return (double)(rng_next() >> 11) / 9007199254740992.0;
}

static double env_num(const char *name, double dflt) {
    const char *v = getenv(name);
    return v && *v ? strtod(v, NULL) : dflt;
}

static double elapsed_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - pc_t0.tv_sec) * 1e3 + (double)(t.tv_nsec - pc_t0.tv_nsec) / 1e6;
}

__attribute__((constructor)) static void pc_init(void) {
    real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    real_openat = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat");
    real_pwrite = (ssize_t(*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    real_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
    real_unlink = (int (*)(const char *))dlsym(RTLD_NEXT, "unlink");
    real_mkdir = (int (*)(const char *, mode_t))dlsym(RTLD_NEXT, "mkdir");
    real_accept = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    real_accept4 = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    real_sqlite3_open_v2 =
        (int (*)(const char *, sqlite3 **, int, const char *))dlsym(RTLD_NEXT, "sqlite3_open_v2");
    if (!real_open || !real_openat || !real_pwrite || !real_fsync || !real_fdatasync ||
        !real_close || !real_unlink || !real_mkdir || !real_accept || !real_accept4 ||
        !real_sqlite3_open_v2) {
        fprintf(stderr, "powercut: cannot find the functions it wraps\n");
        _exit(2);
    }
    clock_gettime(CLOCK_MONOTONIC, &pc_t0);
    pc_cut_ms = env_num("VOLLEY_POWERCUT_MS", -1);
    pc_skip = (long)env_num("VOLLEY_POWERCUT_SKIP", 0);
    pc_keep = env_num("VOLLEY_POWERCUT_KEEP", 0);
    pc_fault_rate = env_num("VOLLEY_FAULT_RATE", 0);
    pc_fault_seg_rate = env_num("VOLLEY_FAULT_SEGMENT_RATE", pc_fault_rate);
    pc_fault_after_ms = env_num("VOLLEY_FAULT_AFTER_MS", 0);
    pc_cut_after_fault = env_num("VOLLEY_POWERCUT_AFTER_FAULT", 0) != 0;
    const char *full = getenv("VOLLEY_DISK_FULL_MS");
    if (full && *full) {
        char *end = NULL;
        pc_full_start = strtod(full, &end);
        pc_full_len = end && *end == ':' ? strtod(end + 1, NULL) : 0;
    }
    uint64_t seed = (uint64_t)env_num("VOLLEY_POWERCUT_SEED", 1);
    pc_rng ^= seed * 0x9E3779B97F4A7C15ull;
    if (!pc_rng) pc_rng = 1;
}

/* ---- the model ---------------------------------------------------------- */

static pc_file *file_find(const char *path) {
    for (size_t i = 0; i < PC_FILES; i++)
        if (pc_files[i].used && strcmp(pc_files[i].path, path) == 0) return &pc_files[i];
    return NULL;
}

/* The file's entry, made on first sight with what is on disk now: a file
 * seen for the first time was either just created (empty) or left by an
 * earlier process, whose cut already made it what the disk holds. */
static pc_file *file_get(const char *path, int segment) {
    pc_file *f = file_find(path);
    if (f) return f;
    for (size_t i = 0; i < PC_FILES; i++)
        if (!pc_files[i].used) {
            f = &pc_files[i];
            memset(f, 0, sizeof *f);
            if (strlen(path) >= sizeof f->path) return NULL;
            strcpy(f->path, path);
            struct stat sb;
            f->synced = f->size = stat(path, &sb) == 0 ? (int64_t)sb.st_size : 0;
            f->used = 1;
            f->segment = segment;
            return f;
        }
    fprintf(stderr, "powercut: more than %d files to follow\n", PC_FILES);
    _exit(2);
}

static void file_forget(pc_file *f) {
    for (size_t i = 0; i < f->n; i++) free(f->w[i].old);
    free(f->w);
    for (size_t i = 0; i < PC_FDS; i++)
        if (pc_fd[i] == f) pc_fd[i] = NULL;
    memset(f, 0, sizeof *f);
}

/* Records a write of len bytes at off that is about to happen: the bytes
 * it will replace are read from the file first. */
static void file_record(pc_file *f, int64_t off, int64_t len) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 64;
        pc_write *w = realloc(f->w, cap * sizeof *w);
        if (!w) _exit(3);
        f->w = w;
        f->cap = cap;
    }
    pc_write *w = &f->w[f->n++];
    memset(w, 0, sizeof *w);
    w->off = off;
    w->len = len;
    /* What the file holds there now; past its end, nothing to put back.
     * Read from the file, not the model: another process (a test's
     * parent after its child was cut) may have changed it. */
    int fd = real_open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        w->old = malloc((size_t)len);
        ssize_t r = w->old ? pread(fd, w->old, (size_t)len, off) : -1;
        if (r < 0) {
            fprintf(stderr, "powercut: cannot read %s before a write\n", f->path);
            _exit(3);
        }
        w->old_len = r;
        real_close(fd);
    }
    if (off + len > f->size) f->size = off + len;
}

/* A truncation about to happen, recorded as a write that put back the
 * cut tail would undo. */
static void file_record_truncate(pc_file *f, int64_t size) {
    if (size < f->size) {
        int64_t old = f->size;
        file_record(f, size, old - size);
        f->size = size;
    } else {
        f->size = size;
    }
}

static void file_synced(pc_file *f) {
    size_t k = 0;
    for (size_t i = 0; i < f->n; i++) {
        if (f->w[i].doomed)
            f->w[k++] = f->w[i];
        else
            free(f->w[i].old);
    }
    f->n = k;
    f->synced = f->size;
}

static void file_sync_failed(pc_file *f) {
    for (size_t i = 0; i < f->n; i++) f->w[i].doomed = 1;
}

/* Puts f back as the disk would hold it; returns the writes dropped. */
static long file_cut(pc_file *f, long *kept, int64_t *bytes) {
    if (f->n == 0 && f->size == f->synced) return 0;
    int fd = real_open(f->path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return 0; /* deleted: nothing of it to put back */
    int64_t final = f->synced;
    long dropped = 0;
    char *keep = calloc(f->n ? f->n : 1, 1);
    if (!keep) _exit(3);
    for (size_t i = 0; i < f->n; i++)
        keep[i] = !f->w[i].doomed && pc_keep > 0 && rng_unit() < pc_keep;
    for (size_t i = 0; i < f->n; i++)
        if (keep[i] && f->w[i].off + f->w[i].len > final) final = f->w[i].off + f->w[i].len;
    static const unsigned char zeros[4096];
    for (size_t j = f->n; j-- > 0;) {
        pc_write *w = &f->w[j];
        if (keep[j]) {
            (*kept)++;
            continue;
        }
        dropped++;
        *bytes += w->len;
        if (w->old_len > 0 && real_pwrite(fd, w->old, (size_t)w->old_len, w->off) != w->old_len)
            _exit(3);
        for (int64_t p = w->off + w->old_len; p < w->off + w->len && p < final;) {
            int64_t n = w->off + w->len - p;
            if (n > (int64_t)sizeof zeros) n = sizeof zeros;
            if (real_pwrite(fd, zeros, (size_t)n, p) != n) _exit(3);
            p += n;
        }
    }
    free(keep);
    if (ftruncate(fd, final) != 0 || real_fsync(fd) != 0) _exit(3);
    real_close(fd);
    return dropped;
}

/* A bodies directory whose own entry was never made durable: gone with
 * everything in it. It holds only segment files. */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char path[PC_PATH * 2];
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (real_unlink(path) != 0) _exit(3);
    }
    closedir(d);
    if (rmdir(dir) != 0) _exit(3);
}

static __attribute__((noreturn)) void pc_cut(void) {
    long dropped = 0, kept = 0, gone = 0, files = 0;
    int64_t bytes = 0;
    for (size_t i = 0; i < PC_FILES; i++) {
        pc_file *f = &pc_files[i];
        if (!f->used) continue;
        if (f->is_new) {
            if (real_unlink(f->path) == 0) gone++;
            continue;
        }
        long d = file_cut(f, &kept, &bytes);
        if (d) files++;
        dropped += d;
    }
    for (int i = 0; i < pc_n_new_dirs; i++) {
        remove_tree(pc_new_dirs[i]);
        gone++;
    }
    fprintf(stderr,
            "powercut: cut at %.0f ms after %ld writes and syncs: %ld unsynced writes dropped "
            "(%lld bytes, %ld files), %ld kept, %ld unsynced directory entries gone, "
            "%ld faults injected before\n",
            elapsed_ms(), pc_ops, dropped, (long long)bytes, files, kept, gone, pc_faults);
    _exit(PC_EXIT);
}

/* Called, with pc_mu held, before every write, truncate or sync of a
 * followed file: the cut, or a fault (returned as an errno), or 0. */
/* Whether a write that can fail for want of room finds the disk full
 * (VOLLEY_DISK_FULL_MS); says when the window opens and closes. Called
 * with pc_mu held. */
static int disk_full_now(void) {
    if (pc_full_start < 0 || pc_listen_ms < 0 || pc_full_state == 2) return 0;
    double t = elapsed_ms() - pc_listen_ms;
    if (t < pc_full_start) return 0;
    if (t >= pc_full_start + pc_full_len) {
        if (pc_full_state == 1)
            fprintf(stderr, "diskfault: the disk has room again; %ld writes failed with ENOSPC\n",
                    pc_full_failed);
        pc_full_state = 2;
        return 0;
    }
    if (pc_full_state == 0)
        fprintf(stderr, "diskfault: the disk is full for %.0f ms from now\n", pc_full_len);
    pc_full_state = 1;
    return 1;
}

static int pc_tick(const char *what, int can_fail_nospace, double rate) {
    pc_ops++;
    if (can_fail_nospace && disk_full_now()) {
        pc_faults++;
        pc_full_failed++;
        return ENOSPC;
    }
    if (pc_fail_what[0] && strstr(what, pc_fail_what)) {
        pc_fail_what[0] = '\0';
        pc_faults++;
        fprintf(stderr, "diskfault: %s fails with %s, as asked\n", what, strerror(pc_fail_errno));
        return pc_fail_errno;
    }
    if (pc_cut_ms >= 0 && elapsed_ms() >= pc_cut_ms && pc_skip-- <= 0) pc_cut();
    if (rate > 0 && pc_listen_ms >= 0 && elapsed_ms() >= pc_listen_ms + pc_fault_after_ms &&
        rng_unit() < rate) {
        int e = can_fail_nospace && (rng_next() & 1) ? ENOSPC : EIO;
        pc_faults++;
        fprintf(stderr, "diskfault: %s fails with %s\n", what, e == ENOSPC ? "ENOSPC" : "EIO");
        if (pc_cut_after_fault && rate == pc_fault_seg_rate && strstr(what, "segment")) {
            pc_cut_after_fault = 0;
            pc_cut_ms = elapsed_ms();
            pc_skip = (long)(rng_next() % 30);
        }
        return e;
    }
    return 0;
}

/* ---- SQLite: a VFS over the default one ---------------------------------- */

typedef struct {
    sqlite3_file base;
    pc_file *f;         /* NULL for files a cut does not touch */
    sqlite3_file *real; /* follows this struct in the same allocation */
} pc_sqlfile;

static sqlite3_vfs pc_vfs;
static sqlite3_vfs *pc_under;
static sqlite3_io_methods pc_io;

#define REAL(p) (((pc_sqlfile *)(p))->real)

static int x_close(sqlite3_file *p) {
    int rc = REAL(p)->pMethods ? REAL(p)->pMethods->xClose(REAL(p)) : SQLITE_OK;
    return rc;
}
static int x_read(sqlite3_file *p, void *b, int n, sqlite3_int64 off) {
    return REAL(p)->pMethods->xRead(REAL(p), b, n, off);
}
static int x_write(sqlite3_file *p, const void *b, int n, sqlite3_int64 off) {
    pc_sqlfile *s = (pc_sqlfile *)p;
    if (!s->f) return REAL(p)->pMethods->xWrite(REAL(p), b, n, off);
    pthread_mutex_lock(&pc_mu);
    int e = pc_tick("a database write", 1, pc_fault_rate);
    int rc;
    if (e) {
        rc = e == ENOSPC ? SQLITE_FULL : SQLITE_IOERR_WRITE;
    } else {
        file_record(s->f, off, n);
        rc = REAL(p)->pMethods->xWrite(REAL(p), b, n, off);
    }
    pthread_mutex_unlock(&pc_mu);
    return rc;
}
static int x_truncate(sqlite3_file *p, sqlite3_int64 size) {
    pc_sqlfile *s = (pc_sqlfile *)p;
    if (!s->f) return REAL(p)->pMethods->xTruncate(REAL(p), size);
    pthread_mutex_lock(&pc_mu);
    int e = pc_tick("a database truncate", 0, pc_fault_rate);
    int rc = SQLITE_IOERR_TRUNCATE;
    if (!e) {
        file_record_truncate(s->f, size);
        rc = REAL(p)->pMethods->xTruncate(REAL(p), size);
    }
    pthread_mutex_unlock(&pc_mu);
    return rc;
}
static int x_sync(sqlite3_file *p, int flags) {
    pc_sqlfile *s = (pc_sqlfile *)p;
    if (!s->f) return REAL(p)->pMethods->xSync(REAL(p), flags);
    pthread_mutex_lock(&pc_mu);
    /* A failed sync here leaves the writes pending (POSIX's view); the
     * harsher Linux view is modelled on the segments. */
    int rc = pc_tick("a database sync", 0, pc_fault_rate)
                 ? SQLITE_IOERR_FSYNC
                 : REAL(p)->pMethods->xSync(REAL(p), flags);
    if (rc == SQLITE_OK) file_synced(s->f);
    pthread_mutex_unlock(&pc_mu);
    return rc;
}
static int x_size(sqlite3_file *p, sqlite3_int64 *out) {
    return REAL(p)->pMethods->xFileSize(REAL(p), out);
}
static int x_lock(sqlite3_file *p, int l) {
    return REAL(p)->pMethods->xLock(REAL(p), l);
}
static int x_unlock(sqlite3_file *p, int l) {
    return REAL(p)->pMethods->xUnlock(REAL(p), l);
}
static int x_reserved(sqlite3_file *p, int *out) {
    return REAL(p)->pMethods->xCheckReservedLock(REAL(p), out);
}
static int x_control(sqlite3_file *p, int op, void *arg) {
    return REAL(p)->pMethods->xFileControl(REAL(p), op, arg);
}
static int x_sector(sqlite3_file *p) {
    return REAL(p)->pMethods->xSectorSize(REAL(p));
}
static int x_device(sqlite3_file *p) {
    return REAL(p)->pMethods->xDeviceCharacteristics(REAL(p));
}
static int x_shm_map(sqlite3_file *p, int pg, int sz, int ext, void volatile **out) {
    return REAL(p)->pMethods->xShmMap(REAL(p), pg, sz, ext, out);
}
static int x_shm_lock(sqlite3_file *p, int off, int n, int flags) {
    return REAL(p)->pMethods->xShmLock(REAL(p), off, n, flags);
}
static void x_shm_barrier(sqlite3_file *p) {
    REAL(p)->pMethods->xShmBarrier(REAL(p));
}
static int x_shm_unmap(sqlite3_file *p, int del) {
    return REAL(p)->pMethods->xShmUnmap(REAL(p), del);
}
static int x_fetch(sqlite3_file *p, sqlite3_int64 off, int n, void **out) {
    return REAL(p)->pMethods->xFetch(REAL(p), off, n, out);
}
static int x_unfetch(sqlite3_file *p, sqlite3_int64 off, void *ptr) {
    return REAL(p)->pMethods->xUnfetch(REAL(p), off, ptr);
}

static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *p, int flags, int *out) {
    (void)vfs;
    pc_sqlfile *s = (pc_sqlfile *)p;
    memset(s, 0, sizeof *s);
    s->real = (sqlite3_file *)(s + 1);
    int rc = pc_under->xOpen(pc_under, name, s->real, flags, out);
    if (rc != SQLITE_OK) {
        s->base.pMethods = NULL;
        return rc;
    }
    s->base.pMethods = &pc_io;
    if (name && (flags & (SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_WAL | SQLITE_OPEN_MAIN_JOURNAL))) {
        pthread_mutex_lock(&pc_mu);
        s->f = file_get(name, 0);
        pthread_mutex_unlock(&pc_mu);
    }
    return SQLITE_OK;
}

static int v_delete(sqlite3_vfs *vfs, const char *name, int dirsync) {
    (void)vfs;
    pthread_mutex_lock(&pc_mu);
    pc_file *f = file_find(name);
    if (f) file_forget(f);
    pthread_mutex_unlock(&pc_mu);
    return pc_under->xDelete(pc_under, name, dirsync);
}

static void vfs_register(void) {
    pc_under = sqlite3_vfs_find(NULL);
    if (!pc_under) _exit(2);
    pc_vfs = *pc_under;
    pc_vfs.zName = "volley-powercut";
    pc_vfs.szOsFile = (int)sizeof(pc_sqlfile) + pc_under->szOsFile;
    pc_vfs.xOpen = v_open;
    pc_vfs.xDelete = v_delete;
    pc_vfs.pNext = NULL;
    pc_io = (sqlite3_io_methods){.iVersion = 3,
                                 .xClose = x_close,
                                 .xRead = x_read,
                                 .xWrite = x_write,
                                 .xTruncate = x_truncate,
                                 .xSync = x_sync,
                                 .xFileSize = x_size,
                                 .xLock = x_lock,
                                 .xUnlock = x_unlock,
                                 .xCheckReservedLock = x_reserved,
                                 .xFileControl = x_control,
                                 .xSectorSize = x_sector,
                                 .xDeviceCharacteristics = x_device,
                                 .xShmMap = x_shm_map,
                                 .xShmLock = x_shm_lock,
                                 .xShmBarrier = x_shm_barrier,
                                 .xShmUnmap = x_shm_unmap,
                                 .xFetch = x_fetch,
                                 .xUnfetch = x_unfetch};
    if (sqlite3_vfs_register(&pc_vfs, 0) != SQLITE_OK) _exit(2);
}

int sqlite3_open_v2(const char *path, sqlite3 **db, int flags, const char *vfs) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, vfs_register);
    return real_sqlite3_open_v2(path, db, flags, vfs ? vfs : pc_vfs.zName);
}

/* ---- update segments: the libc calls of the segment writer ---------------- */

static int is_segment(const char *path) {
    size_t n = strlen(path);
    return strstr(path, "-bodies/") && n > 4 && strcmp(path + n - 4, ".seg") == 0;
}
static int is_bodies_dir(const char *path) {
    size_t n = strlen(path);
    return n > 7 && strcmp(path + n - 7, "-bodies") == 0;
}
/* The directory holding path (the part before its last slash; "." without one). */
static void dir_of(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, cap, ".");
    else
        snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

static int follow_open(const char *path, int flags, int fd) {
    if (fd < 0 || fd >= PC_FDS) return fd;
    if (is_segment(path)) {
        pthread_mutex_lock(&pc_mu);
        pc_file *f = file_get(path, 1);
        if ((flags & O_CREAT) && (flags & O_EXCL)) f->is_new = 1;
        pc_fd[fd] = f;
        pthread_mutex_unlock(&pc_mu);
    } else if (flags & O_DIRECTORY) {
        char *copy = strdup(path);
        pthread_mutex_lock(&pc_mu);
        free(pc_dirfd[fd]);
        pc_dirfd[fd] = copy;
        pthread_mutex_unlock(&pc_mu);
    }
    return fd;
}

int open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    return follow_open(path, flags, real_open(path, flags, mode));
}
int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int dirfd, const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    int fd = real_openat(dirfd, path, flags, mode);
    return path[0] == '/' || dirfd == AT_FDCWD ? follow_open(path, flags, fd) : fd;
}

static void note_accept(int rc) {
    pthread_mutex_lock(&pc_mu);
    if (rc >= 0 && pc_listen_ms < 0) pc_listen_ms = elapsed_ms();
    pthread_mutex_unlock(&pc_mu);
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
    int rc = real_accept(fd, addr, len);
    note_accept(rc);
    return rc;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    int rc = real_accept4(fd, addr, len, flags);
    note_accept(rc);
    return rc;
}

int mkdir(const char *path, mode_t mode) {
    int rc = real_mkdir(path, mode);
    if (rc == 0 && is_bodies_dir(path)) {
        pthread_mutex_lock(&pc_mu);
        if (pc_n_new_dirs < 8) snprintf(pc_new_dirs[pc_n_new_dirs++], PC_PATH, "%s", path);
        pthread_mutex_unlock(&pc_mu);
    }
    return rc;
}

ssize_t pwrite(int fd, const void *b, size_t n, off_t off) {
    if (fd < 0 || fd >= PC_FDS) return real_pwrite(fd, b, n, off);
    pthread_mutex_lock(&pc_mu);
    pc_file *f = pc_fd[fd];
    if (!f) {
        pthread_mutex_unlock(&pc_mu);
        return real_pwrite(fd, b, n, off);
    }
    int e = pc_tick("a segment write", 1, pc_fault_seg_rate);
    ssize_t w = -1;
    if (!e) {
        file_record(f, off, (int64_t)n);
        w = real_pwrite(fd, b, n, off);
        e = errno;
    }
    pthread_mutex_unlock(&pc_mu);
    errno = e;
    return w;
}
ssize_t pwrite64(int fd, const void *b, size_t n, off_t off) __attribute__((alias("pwrite")));

/* A directory's entries made durable: what was created in it stays. */
static void dir_synced(const char *dir) {
    char d[PC_PATH];
    for (size_t i = 0; i < PC_FILES; i++) {
        if (!pc_files[i].used || !pc_files[i].is_new) continue;
        dir_of(pc_files[i].path, d, sizeof d);
        if (strcmp(d, dir) == 0) pc_files[i].is_new = 0;
    }
    for (int i = 0; i < pc_n_new_dirs;) {
        dir_of(pc_new_dirs[i], d, sizeof d);
        if (strcmp(d, dir) == 0)
            memmove(pc_new_dirs[i], pc_new_dirs[--pc_n_new_dirs], PC_PATH);
        else
            i++;
    }
}

static int sync_common(int fd, int (*real)(int)) {
    if (fd < 0 || fd >= PC_FDS) return real(fd);
    pthread_mutex_lock(&pc_mu);
    pc_file *f = pc_fd[fd];
    char *dir = pc_dirfd[fd];
    if (!f && !dir) {
        pthread_mutex_unlock(&pc_mu);
        return real(fd);
    }
    int e = pc_tick(f ? "a segment sync" : "a directory sync", 0, pc_fault_seg_rate);
    int rc = e ? -1 : real(fd);
    if (rc != 0 && !e) e = errno;
    if (f) {
        if (rc == 0)
            file_synced(f);
        else
            file_sync_failed(f);
    } else if (rc == 0) {
        /* SQLite's own directory syncs are not followed by its VFS layer
         * here: any directory synced makes its new entries durable. */
        dir_synced(dir);
    }
    pthread_mutex_unlock(&pc_mu);
    errno = e;
    return rc;
}
int fsync(int fd) {
    return sync_common(fd, real_fsync);
}
int fdatasync(int fd) {
    return sync_common(fd, real_fdatasync);
}

int close(int fd) {
    if (fd >= 0 && fd < PC_FDS) {
        pthread_mutex_lock(&pc_mu);
        pc_fd[fd] = NULL;
        free(pc_dirfd[fd]);
        pc_dirfd[fd] = NULL;
        pthread_mutex_unlock(&pc_mu);
    }
    return real_close(fd);
}

int unlink(const char *path) {
    int rc = real_unlink(path);
    if (rc == 0 && is_segment(path)) {
        pthread_mutex_lock(&pc_mu);
        pc_file *f = file_find(path);
        if (f) file_forget(f);
        pthread_mutex_unlock(&pc_mu);
    }
    return rc;
}

/* ---- steering from a test loaded with the layer -------------------------- */

void volley_powercut_fail_next(const char *what, int err);
void volley_powercut_now(void) __attribute__((noreturn));

void volley_powercut_fail_next(const char *what, int err) {
    pthread_mutex_lock(&pc_mu);
    snprintf(pc_fail_what, sizeof pc_fail_what, "%s", what);
    pc_fail_errno = err;
    pthread_mutex_unlock(&pc_mu);
}

void volley_powercut_now(void) {
    pthread_mutex_lock(&pc_mu);
    pc_cut();
}
