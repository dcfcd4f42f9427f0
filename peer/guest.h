/*
 * guest: how a peer behaves on a machine it shares with its owner. A
 * volunteer's computer is always doing something else too, and a peer
 * that competes for it as an equal, or burns cores while its threads wait
 * for one another, makes both the owner's programs and its own training
 * slow. Three things keep it a good guest, each small and testable here:
 *
 *  - priority: by default the peer's threads run at nice 19 (or, on
 *    request, under SCHED_IDLE), so any other program gets the CPU first;
 *  - passive waits: libgomp spins for a while in every barrier unless
 *    OMP_WAIT_POLICY says otherwise, and it reads that variable when it is
 *    loaded, before main; volley-peer therefore executes itself once more
 *    with the variable set (and OpenBLAS held to one thread, since the
 *    kernels run single-threaded BLAS inside their own OpenMP team);
 *  - threads: without --threads the peer uses as many threads as the CPUs
 *    it may actually run on: its affinity mask, capped by a cgroup CPU
 *    limit (v2 cpu.max, or v1 cpu.cfs_quota_us) on its cgroup or any
 *    parent, rounded up to whole CPUs.
 *
 * Linux only (/proc, /sys/fs/cgroup, per-thread nice). Conventions are the
 * peer's: fallible functions return 0 or a negative VL_E* code and leave a
 * one-line message in the vl_error they are given.
 */
#ifndef VOLLEY_PEER_GUEST_H
#define VOLLEY_PEER_GUEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- priority -------------------------------------------------------------- */

/* What --priority asks for. The zero value is the default. */
typedef enum peer_guest_priority {
    PEER_GUEST_LOW = 0, /* nice 19: a normal program beside it gets ~98 % of a shared core */
    PEER_GUEST_NORMAL,  /* leave the priority the peer was started with */
    PEER_GUEST_IDLE,    /* SCHED_IDLE: run only on CPU time no other thread wants */
} peer_guest_priority;

/* The nice value PEER_GUEST_LOW applies: the lowest priority nice has. */
#define PEER_GUEST_LOW_NICE 19

/* "normal", "low" or "idle" into *out; VL_EINVAL for anything else,
 * including NULL and names in another case. */
int peer_guest_priority_parse(const char *s, peer_guest_priority *out) VL_MUST_CHECK;

/* The name peer_guest_priority_parse accepts for p ("?" for no level). */
const char *peer_guest_priority_name(peer_guest_priority p);

/* Applies p to every thread the process has (Linux keeps nice and the
 * scheduling policy per thread; threads created later inherit the
 * creator's). LOW sets nice 19, IDLE the SCHED_IDLE policy, NORMAL
 * changes nothing. Under autogroup scheduling nice only ranks a process
 * against its own session, so LOW and IDLE also renice the session's
 * autogroup when the peer leads that session (started by a service
 * manager or setsid); otherwise desc says so. desc (cap >= 1) gets one
 * line for the log: what is in effect afterwards. On failure (the kernel
 * refused, e.g. seccomp forbidding SCHED_IDLE) err says why with errno's
 * text, and threads already changed stay changed, which is never above
 * the priority they had. */
int peer_guest_priority_apply(peer_guest_priority p, char *desc, size_t cap,
                              vl_error *err) VL_MUST_CHECK;

/* ---- passive waits ------------------------------------------------------- */

/* The variable volley-peer sets on the process it executes, naming the
 * variables it added (comma-separated, possibly empty); its presence also
 * stops a second re-execution. */
#define PEER_GUEST_ENV_MARK "VOLLEY_PEER_GUEST"

/* The most assignments peer_guest_env_plan returns. */
#define PEER_GUEST_ENV_MAX 2

/* Decides which variables a peer started with environment envp (a
 * NULL-terminated array of NAME=VALUE strings, as environ) must add
 * before it runs any thread: OMP_WAIT_POLICY=passive unless
 * OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, and OPENBLAS_NUM_THREADS=1
 * unless OPENBLAS_NUM_THREADS or GOTO_NUM_THREADS is set (a setting the
 * user made wins). None when envp has PEER_GUEST_ENV_MARK: the process was
 * re-executed already. Up to PEER_GUEST_ENV_MAX static "NAME=VALUE"
 * strings go to add; returns how many. envp is only read. */
int peer_guest_env_plan(char *const *envp, const char *add[PEER_GUEST_ENV_MAX]);

/* Makes the waits passive: when peer_guest_env_plan asks for variables,
 * sets them and PEER_GUEST_ENV_MARK and executes /proc/self/exe with argv
 * (NULL-terminated, argv[0] kept), so libgomp and OpenBLAS read them at
 * load. Returns 0 without executing anything when no variable is needed;
 * does not return when the execution succeeds; VL_EIO with errno's text in
 * err when it fails, in which case the process goes on as it is (the
 * variables are set but the libraries read them before, so OpenMP threads
 * spin for a while in each wait). Call it before any thread is started. */
int peer_guest_reexec(char **argv, vl_error *err) VL_MUST_CHECK;

/* One line for the log (cap >= 1) on the waits and BLAS threads in
 * effect, from the environment: "OpenMP waits passive, OpenBLAS 1 thread
 * (set by volley-peer)", or which setting came from the user. */
void peer_guest_waits_describe(char *out, size_t cap);

/* ---- threads --------------------------------------------------------------- */

/* Parses the contents of a cgroup v2 cpu.max file: "QUOTA PERIOD" (in
 * microseconds, one space, an optional trailing newline) or "max PERIOD",
 * or "max" alone. *quota is -1 for max (no limit). Both numbers must be
 * positive integers below 2^53 without sign or leading blanks; VL_EINVAL
 * for anything else, with *quota and *period unchanged. */
int peer_guest_cpu_max_parse(const char *s, int64_t *quota, int64_t *period) VL_MUST_CHECK;

/* Parses a cgroup v1 pair, cpu.cfs_quota_us ("-1": no limit, or a
 * positive count) and cpu.cfs_period_us (positive), each with an optional
 * trailing newline, into the same form as peer_guest_cpu_max_parse. */
int peer_guest_cfs_parse(const char *quota_s, const char *period_s, int64_t *quota,
                         int64_t *period) VL_MUST_CHECK;

/* Whole CPUs a quota of quota per period grants, rounded up (1.5 CPUs
 * give 2 threads: the group's time is shared by its threads, and with
 * passive waits a thread held back by the limit costs nothing), at least
 * 1; 0 for no limit (quota < 0) or a period < 1. At most 1 << 20. */
int peer_guest_quota_cpus(int64_t quota, int64_t period);

/* The default thread count: the CPUs of the affinity mask (taken as 1
 * when < 1), capped by quota_cpus when that is > 0. */
int peer_guest_threads_pick(int affinity_cpus, int quota_cpus);

/* Finds the process's cgroup path in the contents of /proc/self/cgroup:
 * for v2 (v2 != 0) the "0::PATH" line, for v1 the line whose controller
 * list has "cpu" as an item (such as "4:cpu,cpuacct:PATH"). The path must
 * be absolute without "." or ".." components. VL_ENOTFOUND without such a
 * line, VL_EINVAL for a malformed one, VL_ETOOBIG over cap. */
int peer_guest_cgroup_path(const char *proc_cgroup, int v2, char *out, size_t cap) VL_MUST_CHECK;

/* Finds, in the contents of /proc/self/mountinfo, the mount of the cgroup
 * hierarchy: fstype cgroup2 for v2, fstype cgroup with "cpu" among its
 * super options for v1. Its root (the cgroup seen at the mount point) and
 * mount point go to root and point (octal escapes such as \040 decoded).
 * VL_ENOTFOUND when there is none, VL_EINVAL for a malformed line of that
 * type, VL_ETOOBIG over a cap. */
int peer_guest_cgroup_mount(const char *mountinfo, int v2, char *root, size_t root_cap, char *point,
                            size_t point_cap) VL_MUST_CHECK;

/* The directory of cgroup path under a mount of root at point: point +
 * the part of path below root. VL_ENOTFOUND when path is not root or
 * below it (the cgroup is outside what this mount shows). */
int peer_guest_cgroup_dir(const char *root, const char *point, const char *path, char *out,
                          size_t cap) VL_MUST_CHECK;

/* The smallest CPU limit set on the cgroup at directory dir or on any
 * parent up to the mount point (inclusive), v2's cpu.max or v1's
 * cpu.cfs_quota_us and cpu.cfs_period_us, as whole CPUs
 * (peer_guest_quota_cpus) into *cpus (0: no limit anywhere), and the file
 * that set it into from (cap >= 1; "" when none). A level without the
 * files is skipped; a file that is unreadable or does not parse is
 * skipped too and named in note (cap >= 1; "" when none), so a strange
 * cgroup never stops a peer. dir must be point or below it. */
void peer_guest_cgroup_limit(const char *dir, const char *point, int v2, int *cpus, char *from,
                             size_t from_cap, char *note, size_t note_cap);

/* What the process may run on, and the thread count that gives. */
typedef struct peer_guest_cpus {
    int affinity;   /* CPUs in the affinity mask, >= 1 */
    int quota;      /* the tightest cgroup limit, whole CPUs; 0: none found */
    int threads;    /* peer_guest_threads_pick(affinity, quota) */
    char from[256]; /* the file that set quota, or "" */
    char note[256]; /* files that were skipped and why, or "" */
} peer_guest_cpus;

/* peer_guest_cpus from given sources: the contents of /proc/self/cgroup
 * and /proc/self/mountinfo (either may be NULL: no cgroup limit), prefix
 * put before every mount point (tests pass a directory standing for "/";
 * "" for the real one) and the affinity count. v2 and v1 hierarchies are
 * both read and the tighter limit wins. Never fails. */
void peer_guest_cpus_from(const char *proc_cgroup, const char *mountinfo, const char *prefix,
                          int affinity, peer_guest_cpus *out);

/* CPUs in the calling thread's affinity mask (any size of mask), or 1
 * when the kernel does not say. */
int peer_guest_affinity_cpus(void);

/* peer_guest_cpus of this process, from /proc/self and /sys/fs/cgroup. */
void peer_guest_cpus_detect(peer_guest_cpus *out);

/* One line for the log (cap >= 1): how many threads and why, e.g.
 * "2 threads (2 CPUs in the affinity mask, no cgroup CPU limit)". given
 * > 0 is a --threads value, which is what the line then reports, beside
 * what the machine offers. */
void peer_guest_threads_describe(const peer_guest_cpus *c, int given, char *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
