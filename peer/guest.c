/* The peer as a guest on a shared machine: priority, passive waits and the
 * default thread count (peer/guest.h says why each matters). */
#define _GNU_SOURCE /* SCHED_IDLE, CPU_ALLOC */
#include "peer/guest.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "peer/peer.h"

extern char **environ;

/* Appends a formatted piece to the NUL-terminated text in out (cap >= 1),
 * truncating quietly: these lines are for people, and a cut line still
 * says what matters first. */
static void appendf(char *out, size_t cap, const char *fmt, ...) VL_PRINTF(3, 4);
static void appendf(char *out, size_t cap, const char *fmt, ...) {
    size_t len = strnlen(out, cap);
    if (len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + len, cap - len, fmt, ap);
    va_end(ap);
}

/* ---- priority -------------------------------------------------------------- */

int peer_guest_priority_parse(const char *s, peer_guest_priority *out) {
    if (!s) return VL_EINVAL;
    if (strcmp(s, "low") == 0)
        *out = PEER_GUEST_LOW;
    else if (strcmp(s, "normal") == 0)
        *out = PEER_GUEST_NORMAL;
    else if (strcmp(s, "idle") == 0)
        *out = PEER_GUEST_IDLE;
    else
        return VL_EINVAL;
    return VL_OK;
}

const char *peer_guest_priority_name(peer_guest_priority p) {
    switch (p) {
    case PEER_GUEST_LOW: return "low";
    case PEER_GUEST_NORMAL: return "normal";
    case PEER_GUEST_IDLE: return "idle";
    }
    return "?";
}

static const char *policy_name(int policy) {
    switch (policy) {
    case SCHED_OTHER: return "SCHED_OTHER";
    case SCHED_BATCH: return "SCHED_BATCH";
    case SCHED_IDLE: return "SCHED_IDLE";
    case SCHED_FIFO: return "SCHED_FIFO";
    case SCHED_RR: return "SCHED_RR";
    }
    return "an unknown policy";
}

/* Sets thread tid to priority p; 0 or an errno value. A thread that ended
 * meanwhile (ESRCH) needs nothing. */
static int set_thread(pid_t tid, peer_guest_priority p) {
    int rc = 0;
    if (p == PEER_GUEST_LOW) {
        rc = setpriority(PRIO_PROCESS, (id_t)tid, PEER_GUEST_LOW_NICE);
    } else if (p == PEER_GUEST_IDLE) {
        struct sched_param sp = {.sched_priority = 0};
        rc = sched_setscheduler(tid, SCHED_IDLE, &sp);
    }
    if (rc == 0 || errno == ESRCH) return 0;
    return errno;
}

/* Applies p to every thread listed in /proc/self/task. Without /proc only
 * the calling thread can be found, which at start-up is usually all there
 * is. *threads counts the threads changed. */
static int set_all_threads(peer_guest_priority p, int *threads, vl_error *err) {
    *threads = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) {
        int e = set_thread((pid_t)gettid(), p);
        if (e) return vl_fail(err, VL_EIO, "%s", strerror(e));
        *threads = 1;
        return VL_OK;
    }
    int rc = VL_OK;
    struct dirent *de;
    while (rc == VL_OK && (de = readdir(d)) != NULL) {
        int64_t tid;
        if (de->d_name[0] < '0' || de->d_name[0] > '9' ||
            vl_parse_i64(de->d_name, 1, INT32_MAX, &tid) != VL_OK)
            continue;
        int e = set_thread((pid_t)tid, p);
        if (e)
            rc = vl_fail(err, VL_EIO, "thread %lld: %s", (long long)tid, strerror(e));
        else
            (*threads)++;
    }
    closedir(d);
    return rc;
}

/* Under autogroup scheduling the kernel first shares the CPU between
 * sessions and only then between the threads of a session by nice, so a
 * niced peer started from a terminal still takes an equal share against
 * a browser in another session. The session's autogroup can be niced
 * too, but that slows every program of the session: it is only done when
 * the peer leads its session and so is alone in it (run as a service or
 * under setsid). */
static void renice_autogroup(char *desc, size_t cap) {
    vl_buf b;
    vl_buf_init(&b, 64);
    int on = vl_buf_read_file(&b, "/proc/sys/kernel/sched_autogroup_enabled", NULL) == VL_OK &&
             b.len > 0 && b.data[0] == '1';
    vl_buf_free(&b);
    if (!on) return;
    if (getsid(0) != getpid()) {
        appendf(desc, cap,
                "; with autogroup scheduling that may rank it only against "
                "this session's programs (setsid ranks it below all)");
        return;
    }
    FILE *f = fopen("/proc/self/autogroup", "w");
    int ok = f && fprintf(f, "%d\n", PEER_GUEST_LOW_NICE) > 0;
    if (f && fclose(f) != 0) ok = 0;
    if (ok)
        appendf(desc, cap, "; its session's autogroup at nice %d", PEER_GUEST_LOW_NICE);
    else
        appendf(desc, cap, "; its session's autogroup could not be reniced");
}

int peer_guest_priority_apply(peer_guest_priority p, char *desc, size_t cap, vl_error *err) {
    desc[0] = '\0';
    if (p != PEER_GUEST_LOW && p != PEER_GUEST_NORMAL && p != PEER_GUEST_IDLE)
        return vl_fail(err, VL_EINVAL, "priority: unknown level %d", (int)p);
    int threads = 0;
    if (p != PEER_GUEST_NORMAL) {
        vl_error why = {0};
        int rc = set_all_threads(p, &threads, &why);
        if (rc)
            return vl_fail(
                err, rc, "--priority %s: the kernel refused %s (%s)", peer_guest_priority_name(p),
                p == PEER_GUEST_IDLE ? "SCHED_IDLE" : "nice " VL_STR(PEER_GUEST_LOW_NICE), why.msg);
    }
    /* Read back rather than assumed: a peer started under `nice` or
     * `chrt --idle` keeps what it was given when that is lower. */
    int policy = sched_getscheduler(0);
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, 0);
    if (errno) nice = 0;
    snprintf(desc, cap, "priority %s: ", peer_guest_priority_name(p));
    if (policy == SCHED_IDLE)
        appendf(desc, cap, "SCHED_IDLE, only CPU time nothing else wants");
    else
        appendf(desc, cap, "nice %d (%s)", nice, policy_name(policy));
    if (p == PEER_GUEST_NORMAL) {
        appendf(desc, cap, ", as started");
        return VL_OK;
    }
    appendf(desc, cap, " for %d thread%s and those it starts", threads, threads == 1 ? "" : "s");
    renice_autogroup(desc, cap);
    return VL_OK;
}

/* ---- passive waits ------------------------------------------------------- */

static const char *env_get(char *const *envp, const char *name) {
    size_t n = strlen(name);
    for (; envp && *envp; envp++)
        if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=') return *envp + n + 1;
    return NULL;
}

int peer_guest_env_plan(char *const *envp, const char *add[PEER_GUEST_ENV_MAX]) {
    if (env_get(envp, PEER_GUEST_ENV_MARK)) return 0;
    int n = 0;
    /* GOMP_SPINCOUNT is libgomp's finer knob: whoever set it chose. */
    if (!env_get(envp, "OMP_WAIT_POLICY") && !env_get(envp, "GOMP_SPINCOUNT"))
        add[n++] = "OMP_WAIT_POLICY=passive";
    /* Without it OpenBLAS starts one pooled thread per CPU at load, which
     * the kernels never use (they call BLAS single-threaded inside their
     * own OpenMP team) and which yield-spin before they first sleep. */
    if (!env_get(envp, "OPENBLAS_NUM_THREADS") && !env_get(envp, "GOTO_NUM_THREADS"))
        add[n++] = "OPENBLAS_NUM_THREADS=1";
    return n;
}

int peer_guest_reexec(char **argv, vl_error *err) {
    const char *add[PEER_GUEST_ENV_MAX];
    int n = peer_guest_env_plan(environ, add);
    if (n == 0) return VL_OK;
    char names[128] = "";
    for (int i = 0; i < n; i++) {
        char name[64];
        size_t len = strcspn(add[i], "=");
        if (len >= sizeof name) return vl_fail(err, VL_EINVAL, "guest: variable name too long");
        memcpy(name, add[i], len);
        name[len] = '\0';
        if (setenv(name, add[i] + len + 1, 1) != 0)
            return vl_fail(err, VL_EIO, "setenv %s: %s", name, strerror(errno));
        appendf(names, sizeof names, "%s%s", i ? "," : "", name);
    }
    int e = 0;
    if (setenv(PEER_GUEST_ENV_MARK, names, 1) != 0)
        e = errno;
    else {
        execv("/proc/self/exe", argv);
        e = errno;
    }
    /* Not re-executed: the libraries read their variables already, so
     * take them back, for peer_guest_waits_describe to tell the truth. */
    for (int i = 0; i < n; i++) {
        char name[64];
        size_t len = strcspn(add[i], "=");
        memcpy(name, add[i], len);
        name[len] = '\0';
        unsetenv(name);
    }
    unsetenv(PEER_GUEST_ENV_MARK);
    return vl_fail(err, VL_EIO, "cannot execute /proc/self/exe with passive waits: %s",
                   strerror(e));
}

/* Whether name appears in the comma-separated list. */
static int listed(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && strncmp(p, name, n) == 0) return 1;
        p += len;
        if (*p == ',') p++;
    }
    return 0;
}

/* "NAME=VALUE (from the environment)", or "(set by volley-peer)". */
static void describe_var(char *out, size_t cap, const char *mark, const char *name) {
    char value[40];
    peer_clean_copy(getenv(name), value, sizeof value);
    appendf(out, cap, "%s=%s (%s)", name, value,
            listed(mark, name) ? "set by volley-peer" : "from the environment");
}

void peer_guest_waits_describe(char *out, size_t cap) {
    const char *mark = getenv(PEER_GUEST_ENV_MARK);
    out[0] = '\0';
    appendf(out, cap, "OpenMP waits: ");
    if (getenv("GOMP_SPINCOUNT"))
        describe_var(out, cap, mark, "GOMP_SPINCOUNT");
    else if (getenv("OMP_WAIT_POLICY"))
        describe_var(out, cap, mark, "OMP_WAIT_POLICY");
    else
        appendf(out, cap, "libgomp's default (a spin before each sleep)");
    appendf(out, cap, "; OpenBLAS threads: ");
    if (getenv("OPENBLAS_NUM_THREADS"))
        describe_var(out, cap, mark, "OPENBLAS_NUM_THREADS");
    else if (getenv("GOTO_NUM_THREADS"))
        describe_var(out, cap, mark, "GOTO_NUM_THREADS");
    else
        appendf(out, cap, "OpenBLAS's default (a pool sized to the CPUs)");
}

/* ---- threads --------------------------------------------------------------- */

/* Largest quota or period accepted: far above any real one (the kernel
 * caps periods at one second), and exact in a double. */
#define QUOTA_MAX ((INT64_C(1) << 53) - 1)
#define KERNEL_PERIOD_DEFAULT 100000

/* s without one trailing newline into out; VL_EINVAL when empty or too long. */
static int strip_newline(const char *s, char *out, size_t cap) {
    if (!s) return VL_EINVAL;
    size_t n = strlen(s);
    if (n > 0 && s[n - 1] == '\n') n--;
    if (n == 0 || n >= cap) return VL_EINVAL;
    memcpy(out, s, n);
    out[n] = '\0';
    return VL_OK;
}

/* A positive count of digits only (no sign, no blank), at most QUOTA_MAX. */
static int positive(const char *s, int64_t *out) {
    if (s[0] < '0' || s[0] > '9') return VL_EINVAL;
    return vl_parse_i64(s, 1, QUOTA_MAX, out);
}

int peer_guest_cpu_max_parse(const char *s, int64_t *quota, int64_t *period) {
    char line[64];
    if (strip_newline(s, line, sizeof line) != VL_OK) return VL_EINVAL;
    int64_t q, p = KERNEL_PERIOD_DEFAULT;
    char *sp = strchr(line, ' ');
    if (sp) {
        *sp = '\0';
        if (positive(sp + 1, &p) != VL_OK) return VL_EINVAL;
    }
    if (strcmp(line, "max") == 0)
        q = -1;
    else if (!sp || positive(line, &q) != VL_OK)
        return VL_EINVAL;
    *quota = q;
    *period = p;
    return VL_OK;
}

int peer_guest_cfs_parse(const char *quota_s, const char *period_s, int64_t *quota,
                         int64_t *period) {
    char qs[32], ps[32];
    int64_t q, p;
    if (strip_newline(quota_s, qs, sizeof qs) != VL_OK ||
        strip_newline(period_s, ps, sizeof ps) != VL_OK || positive(ps, &p) != VL_OK)
        return VL_EINVAL;
    if (strcmp(qs, "-1") == 0)
        q = -1;
    else if (positive(qs, &q) != VL_OK)
        return VL_EINVAL;
    *quota = q;
    *period = p;
    return VL_OK;
}

int peer_guest_quota_cpus(int64_t quota, int64_t period) {
    if (quota < 0 || period < 1) return 0;
    int64_t cpus = quota / period + (quota % period != 0);
    if (cpus < 1) return 1;
    return cpus > (1 << 20) ? 1 << 20 : (int)cpus;
}

int peer_guest_threads_pick(int affinity_cpus, int quota_cpus) {
    int n = affinity_cpus < 1 ? 1 : affinity_cpus;
    return quota_cpus > 0 && quota_cpus < n ? quota_cpus : n;
}

/* Whether p is absolute and has no empty, "." or ".." component ("/"
 * alone is the root). */
static int clean_path(const char *p, size_t n) {
    if (n == 0 || p[0] != '/') return 0;
    if (n == 1) return 1;
    for (size_t i = 1; i <= n;) {
        size_t len = 0;
        while (i + len < n && p[i + len] != '/') len++;
        if (len == 0 || (len == 1 && p[i] == '.') || (len == 2 && p[i] == '.' && p[i + 1] == '.'))
            return 0;
        i += len + 1;
    }
    return 1;
}

/* Whether the comma-separated list s[0..n) has item. */
static int has_item(const char *s, size_t n, const char *item) {
    size_t k = strlen(item);
    for (size_t i = 0; i < n;) {
        size_t len = 0;
        while (i + len < n && s[i + len] != ',') len++;
        if (len == k && strncmp(s + i, item, k) == 0) return 1;
        i += len + 1;
    }
    return 0;
}

static int copy_out(const char *s, size_t n, char *out, size_t cap) {
    if (n >= cap) return VL_ETOOBIG;
    memcpy(out, s, n);
    out[n] = '\0';
    return VL_OK;
}

int peer_guest_cgroup_path(const char *proc_cgroup, int v2, char *out, size_t cap) {
    if (!proc_cgroup) return VL_ENOTFOUND;
    for (const char *line = proc_cgroup; *line;) {
        size_t len = strcspn(line, "\n");
        const char *c1 = memchr(line, ':', len);
        const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - line)) : NULL;
        if (c2) {
            const char *ctl = c1 + 1, *path = c2 + 1;
            size_t ctl_len = (size_t)(c2 - ctl), path_len = len - (size_t)(path - line);
            int match = v2 ? (c1 - line == 1 && line[0] == '0' && ctl_len == 0)
                           : has_item(ctl, ctl_len, "cpu");
            if (match) {
                if (!clean_path(path, path_len)) return VL_EINVAL;
                return copy_out(path, path_len, out, cap);
            }
        }
        line += len;
        if (*line == '\n') line++;
    }
    return VL_ENOTFOUND;
}

/* Decodes mountinfo's octal escapes (\040 for a space, \134 for a
 * backslash) of s[0..n) into out. */
static int unescape(const char *s, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\') {
            if (n - i < 4 || s[i + 1] < '0' || s[i + 1] > '3' || s[i + 2] < '0' || s[i + 2] > '7' ||
                s[i + 3] < '0' || s[i + 3] > '7')
                return VL_EINVAL;
            c = (char)((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
            if (c == '\0') return VL_EINVAL;
            i += 3;
        }
        if (o + 1 >= cap) return VL_ETOOBIG;
        out[o++] = c;
    }
    out[o] = '\0';
    return VL_OK;
}

/* The fields of one mountinfo line that matter here. */
typedef struct mount_line {
    const char *root, *point, *fstype, *super;
    size_t root_len, point_len, fstype_len, super_len;
} mount_line;

/* Splits a line (len bytes) into space-separated fields: ID PARENT MAJ:MIN
 * ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER. 0 when it does
 * not have that shape. */
static int mount_split(const char *line, size_t len, mount_line *m) {
    const char *f[64];
    size_t fl[64];
    int nf = 0;
    for (size_t i = 0; i < len;) {
        while (i < len && line[i] == ' ') i++;
        if (i >= len) break;
        size_t j = i;
        while (j < len && line[j] != ' ') j++;
        if (nf == 64) return 0;
        f[nf] = line + i;
        fl[nf++] = j - i;
        i = j;
    }
    int dash = -1;
    for (int i = 6; i < nf && dash < 0; i++)
        if (fl[i] == 1 && f[i][0] == '-') dash = i;
    if (dash < 0 || nf < dash + 4) return 0;
    *m = (mount_line){f[3],  f[4],  f[dash + 1],  f[dash + 3],
                      fl[3], fl[4], fl[dash + 1], fl[dash + 3]};
    return 1;
}

int peer_guest_cgroup_mount(const char *mountinfo, int v2, char *root, size_t root_cap, char *point,
                            size_t point_cap) {
    if (!mountinfo) return VL_ENOTFOUND;
    const char *want = v2 ? "cgroup2" : "cgroup";
    for (const char *line = mountinfo; *line;) {
        size_t len = strcspn(line, "\n");
        mount_line m;
        if (mount_split(line, len, &m) && m.fstype_len == strlen(want) &&
            strncmp(m.fstype, want, m.fstype_len) == 0 &&
            (v2 || has_item(m.super, m.super_len, "cpu"))) {
            int rc = unescape(m.root, m.root_len, root, root_cap);
            if (!rc) rc = unescape(m.point, m.point_len, point, point_cap);
            if (!rc && (!clean_path(root, strlen(root)) || point[0] != '/')) rc = VL_EINVAL;
            return rc;
        }
        line += len;
        if (*line == '\n') line++;
    }
    return VL_ENOTFOUND;
}

int peer_guest_cgroup_dir(const char *root, const char *point, const char *path, char *out,
                          size_t cap) {
    size_t rl = strlen(root);
    const char *rest;
    if (strcmp(root, "/") == 0)
        rest = strcmp(path, "/") == 0 ? "" : path;
    else if (strncmp(path, root, rl) == 0 && (path[rl] == '\0' || path[rl] == '/'))
        rest = path + rl;
    else
        return VL_ENOTFOUND;
    size_t pl = strlen(point);
    if (pl > 1 && point[pl - 1] == '/') pl--; /* no "//" when joining */
    if (pl == 1 && *rest) pl = 0;             /* point "/": the path is rest itself */
    int n = snprintf(out, cap, "%.*s%s", (int)pl, point, rest);
    return n < 0 || (size_t)n >= cap ? VL_ETOOBIG : VL_OK;
}

/* Reads a small cgroup file into b (reset first). */
static int read_small(vl_buf *b, const char *path, vl_error *err) {
    vl_buf_reset(b);
    return vl_buf_read_file(b, path, err);
}

/* The limit set at one level, dir, as whole CPUs into *cpus (0: none);
 * the file read goes to file. VL_ENOTFOUND when the level sets none. */
static int level_limit(const char *dir, int v2, int *cpus, char *file, size_t cap, vl_error *err) {
    vl_buf a, b;
    vl_buf_init(&a, 128);
    vl_buf_init(&b, 128);
    int64_t quota = -1, period = 0;
    int n = snprintf(file, cap, "%s/%s", dir, v2 ? "cpu.max" : "cpu.cfs_quota_us");
    int rc = n < 0 || (size_t)n >= cap ? vl_fail(err, VL_ETOOBIG, "path too long")
                                       : read_small(&a, file, err);
    if (!rc && v2) {
        rc = peer_guest_cpu_max_parse((const char *)a.data, &quota, &period);
        if (rc) vl_fail(err, rc, "not QUOTA PERIOD");
    } else if (!rc) {
        char pf[PEER_PATH_MAX];
        n = snprintf(pf, sizeof pf, "%s/cpu.cfs_period_us", dir);
        rc = n < 0 || (size_t)n >= sizeof pf ? vl_fail(err, VL_ETOOBIG, "path too long")
                                             : read_small(&b, pf, err);
        if (!rc) {
            rc = peer_guest_cfs_parse((const char *)a.data, (const char *)b.data, &quota, &period);
            if (rc) vl_fail(err, rc, "not a quota and a period");
        }
    }
    vl_buf_free(&a);
    vl_buf_free(&b);
    *cpus = rc ? 0 : peer_guest_quota_cpus(quota, period);
    return rc;
}

void peer_guest_cgroup_limit(const char *dir, const char *point, int v2, int *cpus, char *from,
                             size_t from_cap, char *note, size_t note_cap) {
    *cpus = 0;
    from[0] = '\0';
    note[0] = '\0';
    char cur[PEER_PATH_MAX], file[PEER_PATH_MAX];
    size_t pl = strlen(point);
    if (pl > 1 && point[pl - 1] == '/') pl--;
    if (copy_out(dir, strlen(dir), cur, sizeof cur) != VL_OK || strncmp(cur, point, pl) != 0)
        return;
    for (;;) {
        int c = 0;
        vl_error e = {0};
        int rc = level_limit(cur, v2, &c, file, sizeof file, &e);
        if (rc == VL_OK && c > 0 && (*cpus == 0 || c < *cpus)) {
            *cpus = c;
            snprintf(from, from_cap, "%s", file);
        } else if (rc != VL_OK && rc != VL_ENOTFOUND) {
            appendf(note, note_cap, "%s%s (%s)", note[0] ? "; " : "", file, e.msg);
        }
        /* Up one level, never above the mount point. */
        if (strlen(cur) <= pl) break;
        char *slash = strrchr(cur, '/');
        if (!slash) break;
        if (slash == cur)
            slash[1] = '\0';
        else
            *slash = '\0';
        if (strlen(cur) < pl) break;
    }
}

void peer_guest_cpus_from(const char *proc_cgroup, const char *mountinfo, const char *prefix,
                          int affinity, peer_guest_cpus *out) {
    memset(out, 0, sizeof *out);
    out->affinity = affinity < 1 ? 1 : affinity;
    for (int v2 = 1; v2 >= 0; v2--) {
        char path[PEER_PATH_MAX], root[PEER_PATH_MAX], point[PEER_PATH_MAX];
        char full[PEER_PATH_MAX], dir[PEER_PATH_MAX];
        const char *what = v2 ? "cgroup v2" : "cgroup v1 cpu";
        int rc = peer_guest_cgroup_path(proc_cgroup, v2, path, sizeof path);
        if (rc == VL_ENOTFOUND) continue;
        if (rc) {
            appendf(out->note, sizeof out->note, "%s%s: unusable line in /proc/self/cgroup",
                    out->note[0] ? "; " : "", what);
            continue;
        }
        rc = peer_guest_cgroup_mount(mountinfo, v2, root, sizeof root, point, sizeof point);
        if (rc == VL_ENOTFOUND) continue;
        int n = snprintf(full, sizeof full, "%s%s", prefix ? prefix : "", point);
        if (!rc && (n < 0 || (size_t)n >= sizeof full)) rc = VL_ETOOBIG;
        if (rc) {
            appendf(out->note, sizeof out->note, "%s%s: unusable line in /proc/self/mountinfo",
                    out->note[0] ? "; " : "", what);
            continue;
        }
        /* A cgroup outside what the mount shows has no files to read. */
        if (peer_guest_cgroup_dir(root, full, path, dir, sizeof dir) != VL_OK) continue;
        int cpus;
        char from[sizeof out->from], note[sizeof out->note];
        peer_guest_cgroup_limit(dir, full, v2, &cpus, from, sizeof from, note, sizeof note);
        if (cpus > 0 && (out->quota == 0 || cpus < out->quota)) {
            out->quota = cpus;
            snprintf(out->from, sizeof out->from, "%s", from);
        }
        if (note[0]) appendf(out->note, sizeof out->note, "%s%s", out->note[0] ? "; " : "", note);
    }
    out->threads = peer_guest_threads_pick(out->affinity, out->quota);
}

int peer_guest_affinity_cpus(void) {
    /* cpu_set_t holds 1024 CPUs; larger machines need a larger mask, and
     * the kernel says so with EINVAL. */
    for (int n = 1024; n <= (1 << 18); n *= 2) {
        cpu_set_t *set = CPU_ALLOC(n);
        if (!set) return 1;
        size_t size = CPU_ALLOC_SIZE(n);
        if (sched_getaffinity(0, size, set) == 0) {
            int count = CPU_COUNT_S(size, set);
            CPU_FREE(set);
            return count > 0 ? count : 1;
        }
        int e = errno;
        CPU_FREE(set);
        if (e != EINVAL) return 1;
    }
    return 1;
}

void peer_guest_cpus_detect(peer_guest_cpus *out) {
    vl_buf cg, mi;
    vl_buf_init(&cg, 1 << 16);
    vl_buf_init(&mi, 1 << 22);
    int have_cg = vl_buf_read_file(&cg, "/proc/self/cgroup", NULL) == VL_OK;
    int have_mi = vl_buf_read_file(&mi, "/proc/self/mountinfo", NULL) == VL_OK;
    peer_guest_cpus_from(have_cg ? (const char *)cg.data : NULL,
                         have_mi ? (const char *)mi.data : NULL, "", peer_guest_affinity_cpus(),
                         out);
    vl_buf_free(&cg);
    vl_buf_free(&mi);
}

void peer_guest_threads_describe(const peer_guest_cpus *c, int given, char *out, size_t cap) {
    int n = given > 0 ? given : c->threads;
    out[0] = '\0';
    appendf(out, cap, "%d thread%s (", n, n == 1 ? "" : "s");
    if (given > 0) appendf(out, cap, "--threads; ");
    appendf(out, cap, "%d CPU%s in the affinity mask, ", c->affinity, c->affinity == 1 ? "" : "s");
    if (c->quota > 0)
        appendf(out, cap, "a cgroup limit of %d CPU%s in %s)", c->quota, c->quota == 1 ? "" : "s",
                c->from);
    else
        appendf(out, cap, "no cgroup CPU limit)");
    if (given > c->threads) appendf(out, cap, "; more threads than CPUs only take turns on them");
    if (c->note[0]) appendf(out, cap, "; skipped: %s", c->note);
}
