/* peer: the guest on a shared machine (peer/guest.h). The option names and
 * the cgroup files parse strictly and refuse what is malformed; the
 * thread count is the affinity mask capped by the tightest cgroup limit
 * of a fake /sys tree; the priority is really in effect afterwards for
 * every thread, read back from the kernel in a child process (nice cannot
 * be undone unprivileged); and this program re-executes itself as
 * volley-peer does, after which an OpenMP thread waiting at a barrier
 * burns (almost) no CPU. */
#define _GNU_SOURCE /* SCHED_IDLE, gettid */
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "peer/guest.h"

/* ---- names -------------------------------------------------------------- */

static void test_priority_parse(void **state) {
    (void)state;
    peer_guest_priority p = PEER_GUEST_NORMAL;
    assert_int_equal(peer_guest_priority_parse("low", &p), VL_OK);
    assert_int_equal(p, PEER_GUEST_LOW);
    assert_int_equal(peer_guest_priority_parse("idle", &p), VL_OK);
    assert_int_equal(p, PEER_GUEST_IDLE);
    assert_int_equal(peer_guest_priority_parse("normal", &p), VL_OK);
    assert_int_equal(p, PEER_GUEST_NORMAL);
    const char *bad[] = {"", "LOW", "low ", " idle", "nice", "19", "idle\n", "normally", NULL};
    for (int i = 0; bad[i]; i++) {
        assert_int_equal(peer_guest_priority_parse(bad[i], &p), VL_EINVAL);
        assert_int_equal(p, PEER_GUEST_NORMAL); /* untouched */
    }
    assert_int_equal(peer_guest_priority_parse(NULL, &p), VL_EINVAL);
    /* The zero value is the default, low; names go back and forth. */
    peer_guest_priority zero;
    memset(&zero, 0, sizeof zero);
    assert_int_equal(zero, PEER_GUEST_LOW);
    peer_guest_priority all[] = {PEER_GUEST_LOW, PEER_GUEST_NORMAL, PEER_GUEST_IDLE};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(peer_guest_priority_parse(peer_guest_priority_name(all[i]), &p), VL_OK);
        assert_int_equal(p, all[i]);
    }
    assert_string_equal(peer_guest_priority_name((peer_guest_priority)42), "?");
}

/* ---- cgroup files -------------------------------------------------------- */

static void test_cpu_max_parse(void **state) {
    (void)state;
    int64_t q = 7, p = 7;
    assert_int_equal(peer_guest_cpu_max_parse("max 100000\n", &q, &p), VL_OK);
    assert_true(q == -1 && p == 100000);
    assert_int_equal(peer_guest_cpu_max_parse("150000 100000\n", &q, &p), VL_OK);
    assert_true(q == 150000 && p == 100000);
    assert_int_equal(peer_guest_cpu_max_parse("50000 100000", &q, &p), VL_OK);
    assert_true(q == 50000 && p == 100000);
    assert_int_equal(peer_guest_cpu_max_parse("max", &q, &p), VL_OK);
    assert_true(q == -1 && p == 100000);
    assert_int_equal(peer_guest_cpu_max_parse("1000 1000\n", &q, &p), VL_OK);
    assert_true(q == 1000 && p == 1000);
    q = p = 7;
    const char *bad[] = {"",
                         "\n",
                         "\n\n",
                         "max 100000\n\n",
                         " max 100000",
                         "max  100000",
                         "max 100000 ",
                         "150000",
                         "150000\n",
                         "-1 100000",
                         "+5 100000",
                         "5 +100000",
                         "0 100000",
                         "5 0",
                         "5 -100000",
                         "abc 100000",
                         "max abc",
                         "MAX 100000",
                         "5 100000 7",
                         "5 1e5",
                         "5.5 100000",
                         "5\t100000",
                         "99999999999999999999 100000",
                         "9007199254740992 100000",
                         "5 100000\r\n",
                         NULL};
    for (int i = 0; bad[i]; i++) {
        if (peer_guest_cpu_max_parse(bad[i], &q, &p) != VL_EINVAL)
            fail_msg("accepted '%s'", bad[i]);
        assert_true(q == 7 && p == 7);
    }
    assert_int_equal(peer_guest_cpu_max_parse(NULL, &q, &p), VL_EINVAL);
    /* The longest accepted number, just below 2^53. */
    assert_int_equal(peer_guest_cpu_max_parse("9007199254740991 100000", &q, &p), VL_OK);
    assert_true(q == 9007199254740991LL);
}

static void test_cfs_parse(void **state) {
    (void)state;
    int64_t q = 7, p = 7;
    assert_int_equal(peer_guest_cfs_parse("-1\n", "100000\n", &q, &p), VL_OK);
    assert_true(q == -1 && p == 100000);
    assert_int_equal(peer_guest_cfs_parse("50000", "100000", &q, &p), VL_OK);
    assert_true(q == 50000 && p == 100000);
    q = p = 7;
    const char *bad[][2] = {{"-2", "100000"},  {"0", "100000"},  {"", "100000"},  {"50000", ""},
                            {"50000", "0"},    {"50000", "-1"},  {"x", "100000"}, {"-1 ", "100000"},
                            {"50000", "10 0"}, {"--1", "100000"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (peer_guest_cfs_parse(bad[i][0], bad[i][1], &q, &p) != VL_EINVAL)
            fail_msg("accepted '%s' '%s'", bad[i][0], bad[i][1]);
        assert_true(q == 7 && p == 7);
    }
    assert_int_equal(peer_guest_cfs_parse(NULL, "100000", &q, &p), VL_EINVAL);
    assert_int_equal(peer_guest_cfs_parse("-1", NULL, &q, &p), VL_EINVAL);
}

static void test_quota_and_pick(void **state) {
    (void)state;
    assert_int_equal(peer_guest_quota_cpus(-1, 100000), 0);
    assert_int_equal(peer_guest_quota_cpus(50000, 0), 0);
    assert_int_equal(peer_guest_quota_cpus(50000, -5), 0);
    assert_int_equal(peer_guest_quota_cpus(1, 100000), 1);
    assert_int_equal(peer_guest_quota_cpus(50000, 100000), 1);
    assert_int_equal(peer_guest_quota_cpus(100000, 100000), 1);
    assert_int_equal(peer_guest_quota_cpus(100001, 100000), 2);
    assert_int_equal(peer_guest_quota_cpus(150000, 100000), 2);
    assert_int_equal(peer_guest_quota_cpus(200000, 100000), 2);
    assert_int_equal(peer_guest_quota_cpus(0, 100000), 1);
    assert_int_equal(peer_guest_quota_cpus(INT64_MAX, 1), 1 << 20);

    assert_int_equal(peer_guest_threads_pick(2, 0), 2);
    assert_int_equal(peer_guest_threads_pick(8, 3), 3);
    assert_int_equal(peer_guest_threads_pick(2, 4), 2);
    assert_int_equal(peer_guest_threads_pick(4, 4), 4);
    assert_int_equal(peer_guest_threads_pick(0, 0), 1);
    assert_int_equal(peer_guest_threads_pick(-5, 3), 1);
    assert_int_equal(peer_guest_threads_pick(4, -1), 4);
}

static void test_cgroup_path(void **state) {
    (void)state;
    char out[64];
    const char *hybrid = "12:pids:/user.slice\n4:cpu,cpuacct:/a/b\n1:name=systemd:/x\n"
                         "0::/user.slice/session-1.scope\n";
    assert_int_equal(peer_guest_cgroup_path(hybrid, 1, out, sizeof out), VL_OK);
    assert_string_equal(out, "/user.slice/session-1.scope");
    assert_int_equal(peer_guest_cgroup_path(hybrid, 0, out, sizeof out), VL_OK);
    assert_string_equal(out, "/a/b");
    assert_int_equal(peer_guest_cgroup_path("3:cpuacct,cpu:/c", 0, out, sizeof out), VL_OK);
    assert_string_equal(out, "/c");
    assert_int_equal(peer_guest_cgroup_path("0::/", 1, out, sizeof out), VL_OK);
    assert_string_equal(out, "/");
    assert_int_equal(peer_guest_cgroup_path("0::/a:b\n", 1, out, sizeof out), VL_OK);
    assert_string_equal(out, "/a:b");
    /* cpuset and cpuacct are not the cpu controller; v1 lines are not v2's. */
    assert_int_equal(peer_guest_cgroup_path("4:cpuset:/b\n2:cpuacct:/c\n", 0, out, sizeof out),
                     VL_ENOTFOUND);
    assert_int_equal(peer_guest_cgroup_path("4:cpu:/b\n", 1, out, sizeof out), VL_ENOTFOUND);
    assert_int_equal(peer_guest_cgroup_path("10::/b\n", 1, out, sizeof out), VL_ENOTFOUND);
    assert_int_equal(peer_guest_cgroup_path("", 1, out, sizeof out), VL_ENOTFOUND);
    assert_int_equal(peer_guest_cgroup_path("garbage\n", 1, out, sizeof out), VL_ENOTFOUND);
    assert_int_equal(peer_guest_cgroup_path(NULL, 1, out, sizeof out), VL_ENOTFOUND);
    const char *bad[] = {"0::relative", "0::", "0::/a/../b", "0::/a//b", "0::/a/.", "0::/..", NULL};
    for (int i = 0; bad[i]; i++)
        if (peer_guest_cgroup_path(bad[i], 1, out, sizeof out) != VL_EINVAL)
            fail_msg("accepted '%s'", bad[i]);
    assert_int_equal(peer_guest_cgroup_path("0::/abcdefgh", 1, out, 9), VL_ETOOBIG);
    assert_int_equal(peer_guest_cgroup_path("0::/abcdefg", 1, out, 9), VL_OK);
}

static void test_cgroup_mount(void **state) {
    (void)state;
    char root[64], point[64];
    const char *mi =
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "30 22 0:26 / /sys/fs/cgroup/unified rw,nosuid shared:4 - cgroup2 cgroup2 rw\n"
        "34 22 0:30 / /sys/fs/cgroup/cpuset rw shared:9 - cgroup cgroup rw,cpuset\n"
        "35 22 0:31 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw shared:11 master:2 - cgroup "
        "cgroup rw,cpu,cpuacct\n";
    assert_int_equal(peer_guest_cgroup_mount(mi, 1, root, sizeof root, point, sizeof point), VL_OK);
    assert_string_equal(root, "/");
    assert_string_equal(point, "/sys/fs/cgroup/unified");
    assert_int_equal(peer_guest_cgroup_mount(mi, 0, root, sizeof root, point, sizeof point), VL_OK);
    assert_string_equal(root, "/docker/abc");
    assert_string_equal(point, "/sys/fs/cgroup/cpu,cpuacct");
    /* Escaped spaces and backslashes are decoded. */
    const char *esc = "30 22 0:26 / /mnt/my\\040cg\\134x rw - cgroup2 none rw\n";
    assert_int_equal(peer_guest_cgroup_mount(esc, 1, root, sizeof root, point, sizeof point),
                     VL_OK);
    assert_string_equal(point, "/mnt/my cg\\x");
    /* Only cpuset in v1, a cap too small, a line without its "-", nothing. */
    const char *no_cpu = "34 22 0:30 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n";
    assert_int_equal(peer_guest_cgroup_mount(no_cpu, 0, root, sizeof root, point, sizeof point),
                     VL_ENOTFOUND);
    assert_int_equal(peer_guest_cgroup_mount(mi, 1, root, sizeof root, point, 8), VL_ETOOBIG);
    const char *no_dash = "30 22 0:26 / /sys/fs/cgroup rw cgroup2 cgroup2 rw\n";
    assert_int_equal(peer_guest_cgroup_mount(no_dash, 1, root, sizeof root, point, sizeof point),
                     VL_ENOTFOUND);
    assert_int_equal(peer_guest_cgroup_mount("", 1, root, sizeof root, point, sizeof point),
                     VL_ENOTFOUND);
    assert_int_equal(peer_guest_cgroup_mount(NULL, 1, root, sizeof root, point, sizeof point),
                     VL_ENOTFOUND);
    const char *bad[] = {
        "30 22 0:26 / /x\\09 rw - cgroup2 none rw\n",  "30 22 0:26 / /x\\04 rw - cgroup2 none rw\n",
        "30 22 0:26 / /x\\000 rw - cgroup2 none rw\n", "30 22 0:26 rel /x rw - cgroup2 none rw\n",
        "30 22 0:26 / rel rw - cgroup2 none rw\n",     NULL};
    for (int i = 0; bad[i]; i++)
        if (peer_guest_cgroup_mount(bad[i], 1, root, sizeof root, point, sizeof point) != VL_EINVAL)
            fail_msg("accepted '%s'", bad[i]);
}

static void test_cgroup_dir(void **state) {
    (void)state;
    char out[64];
    assert_int_equal(peer_guest_cgroup_dir("/", "/sys/fs/cgroup", "/a/b", out, sizeof out), VL_OK);
    assert_string_equal(out, "/sys/fs/cgroup/a/b");
    assert_int_equal(peer_guest_cgroup_dir("/", "/sys/fs/cgroup/", "/a", out, sizeof out), VL_OK);
    assert_string_equal(out, "/sys/fs/cgroup/a");
    assert_int_equal(peer_guest_cgroup_dir("/", "/sys/fs/cgroup", "/", out, sizeof out), VL_OK);
    assert_string_equal(out, "/sys/fs/cgroup");
    assert_int_equal(peer_guest_cgroup_dir("/docker/abc", "/cg", "/docker/abc", out, sizeof out),
                     VL_OK);
    assert_string_equal(out, "/cg");
    assert_int_equal(peer_guest_cgroup_dir("/docker/abc", "/cg", "/docker/abc/x", out, sizeof out),
                     VL_OK);
    assert_string_equal(out, "/cg/x");
    assert_int_equal(peer_guest_cgroup_dir("/docker/abc", "/cg", "/docker/abcd", out, sizeof out),
                     VL_ENOTFOUND);
    assert_int_equal(peer_guest_cgroup_dir("/docker/abc", "/cg", "/", out, sizeof out),
                     VL_ENOTFOUND);
    assert_int_equal(peer_guest_cgroup_dir("/", "/sys/fs/cgroup", "/a/b", out, 10), VL_ETOOBIG);
}

/* A fake "/" under a temporary directory. */
typedef struct tree {
    char top[64];
} tree;

static void put(const tree *t, const char *rel, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s%s", t->top, rel);
    /* mkdir -p of the parent */
    for (char *s = path + strlen(t->top) + 1; (s = strchr(s, '/')) != NULL; s++) {
        *s = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST) fail_msg("mkdir %s", path);
        *s = '/';
    }
    if (!text) {
        if (mkdir(path, 0700) != 0 && errno != EEXIST) fail_msg("mkdir %s", path);
        return;
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_cpus_from_tree(void **state) {
    (void)state;
    tree t;
    snprintf(t.top, sizeof t.top, "/tmp/volley-guest.XXXXXX");
    assert_non_null(mkdtemp(t.top));
    const char *mi = "30 22 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw\n"
                     "35 22 0:31 / /sys/fs/cgroup/v1cpu rw shared:11 - cgroup cgroup rw,cpu\n";
    const char *cg = "4:cpu:/job\n0::/a/b/c\n";
    put(&t, "/sys/fs/cgroup/a/b/c", NULL);
    put(&t, "/sys/fs/cgroup/a/cpu.max", "150000 100000\n"); /* 1.5 CPUs */
    put(&t, "/sys/fs/cgroup/a/b/cpu.max", "max 100000\n");
    put(&t, "/sys/fs/cgroup/cpu.max", "800000 100000\n"); /* the top counts too */

    peer_guest_cpus c;
    peer_guest_cpus_from(cg, mi, t.top, 4, &c);
    assert_int_equal(c.affinity, 4);
    assert_int_equal(c.quota, 2);
    assert_int_equal(c.threads, 2);
    char want[256];
    snprintf(want, sizeof want, "%s/sys/fs/cgroup/a/cpu.max", t.top);
    assert_string_equal(c.from, want);
    assert_string_equal(c.note, "");

    /* The affinity mask can be tighter than the limit. */
    peer_guest_cpus_from(cg, mi, t.top, 1, &c);
    assert_int_equal(c.quota, 2);
    assert_int_equal(c.threads, 1);

    /* A tighter v1 limit wins; a malformed cpu.max is skipped and named. */
    put(&t, "/sys/fs/cgroup/v1cpu/job/cpu.cfs_quota_us", "50000\n");
    put(&t, "/sys/fs/cgroup/v1cpu/job/cpu.cfs_period_us", "100000\n");
    put(&t, "/sys/fs/cgroup/a/b/c/cpu.max", "lots\n");
    peer_guest_cpus_from(cg, mi, t.top, 4, &c);
    assert_int_equal(c.quota, 1);
    assert_int_equal(c.threads, 1);
    snprintf(want, sizeof want, "%s/sys/fs/cgroup/v1cpu/job/cpu.cfs_quota_us", t.top);
    assert_string_equal(c.from, want);
    assert_non_null(strstr(c.note, "/a/b/c/cpu.max"));

    /* No cgroup information at all: the affinity mask alone. */
    peer_guest_cpus_from(NULL, NULL, "", 3, &c);
    assert_true(c.quota == 0 && c.threads == 3 && c.from[0] == '\0');
    peer_guest_cpus_from("0::/a/b/c\n", "", t.top, 3, &c);
    assert_true(c.quota == 0 && c.threads == 3);
    peer_guest_cpus_from(cg, mi, t.top, 0, &c);
    assert_int_equal(c.affinity, 1);
    /* A cgroup line that cannot be used is noted, not followed. */
    peer_guest_cpus_from("0::/a/../../etc\n", mi, t.top, 2, &c);
    assert_true(c.quota == 0 && c.threads == 2);
    assert_non_null(strstr(c.note, "/proc/self/cgroup"));

    char line[512];
    peer_guest_cpus_from(cg, mi, t.top, 4, &c);
    peer_guest_threads_describe(&c, 0, line, sizeof line);
    assert_non_null(strstr(line, "1 thread (4 CPUs in the affinity mask, a cgroup limit of 1 CPU"));
    peer_guest_threads_describe(&c, 3, line, sizeof line);
    assert_int_equal(strncmp(line, "3 threads (--threads; 4 CPUs", 28), 0);
    assert_non_null(strstr(line, "take turns"));

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t.top);
    assert_int_equal(system(cmd), 0);
}

static void test_cpus_detect(void **state) {
    (void)state;
    cpu_set_t set;
    CPU_ZERO(&set);
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    assert_int_equal(peer_guest_affinity_cpus(), CPU_COUNT(&set));
    peer_guest_cpus c;
    peer_guest_cpus_detect(&c);
    assert_int_equal(c.affinity, CPU_COUNT(&set));
    assert_true(c.threads >= 1 && c.threads <= c.affinity);
    assert_true(c.quota == 0 || c.threads == (c.quota < c.affinity ? c.quota : c.affinity));
    /* A narrower mask is seen at once. */
    if (CPU_COUNT(&set) > 1) {
        cpu_set_t one;
        CPU_ZERO(&one);
        for (int i = 0; i < CPU_SETSIZE; i++)
            if (CPU_ISSET(i, &set)) {
                CPU_SET(i, &one);
                break;
            }
        assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
        assert_int_equal(peer_guest_affinity_cpus(), 1);
        assert_int_equal(sched_setaffinity(0, sizeof set, &set), 0);
    }
}

/* ---- passive waits ------------------------------------------------------- */

static void test_env_plan(void **state) {
    (void)state;
    const char *add[PEER_GUEST_ENV_MAX];
    char *none[] = {"HOME=/root", NULL};
    assert_int_equal(peer_guest_env_plan(none, add), 2);
    assert_string_equal(add[0], "OMP_WAIT_POLICY=passive");
    assert_string_equal(add[1], "OPENBLAS_NUM_THREADS=1");
    assert_int_equal(peer_guest_env_plan(NULL, add), 2);
    char *active[] = {"OMP_WAIT_POLICY=active", NULL};
    assert_int_equal(peer_guest_env_plan(active, add), 1);
    assert_string_equal(add[0], "OPENBLAS_NUM_THREADS=1");
    char *spin[] = {"GOMP_SPINCOUNT=0", NULL};
    assert_int_equal(peer_guest_env_plan(spin, add), 1);
    assert_string_equal(add[0], "OPENBLAS_NUM_THREADS=1");
    char *blas[] = {"OPENBLAS_NUM_THREADS=4", NULL};
    assert_int_equal(peer_guest_env_plan(blas, add), 1);
    assert_string_equal(add[0], "OMP_WAIT_POLICY=passive");
    char *goto_[] = {"GOTO_NUM_THREADS=2", "OMP_WAIT_POLICY=", NULL};
    assert_int_equal(peer_guest_env_plan(goto_, add), 0);
    /* Names must match whole: these are other variables. */
    char *near[] = {"OMP_WAIT_POLICYX=active", "XOPENBLAS_NUM_THREADS=1", "OMP_WAIT_POLICY", NULL};
    assert_int_equal(peer_guest_env_plan(near, add), 2);
    /* Once re-executed, never again, whatever else the environment says. */
    char *again[] = {"HOME=/", PEER_GUEST_ENV_MARK "=", NULL};
    assert_int_equal(peer_guest_env_plan(again, add), 0);
}

static double thread_cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* main re-executed this program the way volley-peer does; libgomp read
 * the passive policy at load. While one thread sleeps, the other waits at
 * a barrier: spinning (libgomp's default spins up to 300,000 times, about
 * 10 to 20 ms here, OMP_WAIT_POLICY=active for the whole wait) shows in
 * the waiting thread's CPU time; a passive wait costs a wake-up. */
static void test_passive_waits(void **state) {
    (void)state;
    const char *mark = getenv(PEER_GUEST_ENV_MARK);
    if (!mark || !strstr(mark, "OMP_WAIT_POLICY")) {
        /* The environment chose the policy: nothing of ours to check. */
        assert_true(getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"));
        skip();
    }
    assert_string_equal(getenv("OMP_WAIT_POLICY"), "passive");
    char line[256];
    peer_guest_waits_describe(line, sizeof line);
    assert_non_null(strstr(line, "OMP_WAIT_POLICY=passive (set by volley-peer)"));
    const int rounds = 10, sleep_ms = 20;
    int team = 2;
    double burnt = 0;
    for (int r = 0; r < rounds; r++) {
#pragma omp parallel num_threads(2)
        {
            double c0 = thread_cpu_s();
            if (omp_get_thread_num() == 0) {
                struct timespec ts = {0, sleep_ms * 1000000L};
                nanosleep(&ts, NULL);
            }
#pragma omp barrier
            if (omp_get_thread_num() == 1) burnt += thread_cpu_s() - c0;
            if (omp_get_thread_num() == 0 && omp_get_num_threads() < team)
                team = omp_get_num_threads();
        }
    }
    if (team < 2) skip(); /* one thread: nobody waited */
    print_message("CPU time of the waiting thread: %.1f ms in %d ms of waits\n", burnt * 1e3,
                  rounds * sleep_ms);
    assert_true(burnt < 0.1 * rounds * sleep_ms / 1000.0);
}

/* ---- priority ------------------------------------------------------------- */

typedef struct helper {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pid_t tid;
    int stop;
} helper;

static void *helper_main(void *arg) {
    helper *h = arg;
    pthread_mutex_lock(&h->mu);
    h->tid = gettid();
    pthread_cond_broadcast(&h->cv);
    while (!h->stop) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void *read_nice(void *arg) {
    errno = 0;
    *(int *)arg = getpriority(PRIO_PROCESS, 0);
    return NULL;
}

static void *read_policy(void *arg) {
    *(int *)arg = sched_getscheduler(0);
    return NULL;
}

/* Runs in a child: applies p with a thread that existed before, then
 * reads nice and policy back for the calling thread, that thread and a
 * thread started after. Exit status 0 when everything matches, else the
 * number of the first check that failed. */
static int child_apply(peer_guest_priority p) {
    helper h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    pthread_t th;
    if (pthread_create(&th, NULL, helper_main, &h) != 0) return 90;
    pthread_mutex_lock(&h.mu);
    while (h.tid == 0) pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);
    errno = 0;
    int nice0 = getpriority(PRIO_PROCESS, 0);
    int policy0 = sched_getscheduler(0);
    char desc[512];
    vl_error e = {0};
    int rc = peer_guest_priority_apply(p, desc, sizeof desc, &e);
    int status = 0;
    errno = 0;
    int nice_main = getpriority(PRIO_PROCESS, 0);
    int nice_helper = getpriority(PRIO_PROCESS, (id_t)h.tid);
    int policy_main = sched_getscheduler(0);
    int policy_helper = sched_getscheduler(h.tid);
    int nice_new = -100, policy_new = -100;
    pthread_t t2;
    if (pthread_create(&t2, NULL, read_nice, &nice_new) == 0) pthread_join(t2, NULL);
    if (pthread_create(&t2, NULL, read_policy, &policy_new) == 0) pthread_join(t2, NULL);
    if (p == PEER_GUEST_LOW) {
        if (rc != VL_OK)
            status = 1;
        else if (nice_main != PEER_GUEST_LOW_NICE)
            status = 2;
        else if (nice_helper != PEER_GUEST_LOW_NICE)
            status = 3;
        else if (nice_new != PEER_GUEST_LOW_NICE)
            status = 4;
        else if (!strstr(desc, "priority low: nice 19"))
            status = 5;
    } else if (p == PEER_GUEST_IDLE) {
        if (rc == VL_OK) {
            if (policy_main != SCHED_IDLE)
                status = 11;
            else if (policy_helper != SCHED_IDLE)
                status = 12;
            else if (policy_new != SCHED_IDLE)
                status = 13;
            else if (!strstr(desc, "priority idle: SCHED_IDLE"))
                status = 14;
        } else {
            /* Refused (seccomp, say): said so, and nothing moved up. */
            if (!strstr(e.msg, "SCHED_IDLE"))
                status = 15;
            else if (policy_main != policy0)
                status = 16;
        }
    } else {
        if (rc != VL_OK)
            status = 21;
        else if (nice_main != nice0 || nice_helper != nice0)
            status = 22;
        else if (policy_main != policy0 || policy_helper != policy0)
            status = 23;
        else if (!strstr(desc, "as started"))
            status = 24;
    }
    pthread_mutex_lock(&h.mu);
    h.stop = 1;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    pthread_join(th, NULL);
    if (status)
        fprintf(stderr, "child_apply(%d): check %d failed: %s | %s\n", (int)p, status, desc, e.msg);
    return status;
}

static void run_child(peer_guest_priority p) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(child_apply(p));
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_priority_low(void **state) {
    (void)state;
    run_child(PEER_GUEST_LOW);
}

static void test_priority_idle(void **state) {
    (void)state;
    run_child(PEER_GUEST_IDLE);
}

static void test_priority_normal(void **state) {
    (void)state;
    run_child(PEER_GUEST_NORMAL);
}

static void test_priority_bad(void **state) {
    (void)state;
    char desc[64];
    vl_error e = {0};
    assert_int_equal(peer_guest_priority_apply((peer_guest_priority)7, desc, sizeof desc, &e),
                     VL_EINVAL);
    assert_string_equal(desc, "");
}

int main(int argc, char **argv) {
    (void)argc;
    /* As volley-peer does first: the second run of this program finds
     * the mark and goes on. */
    vl_error e = {0};
    if (peer_guest_reexec(argv, &e) != VL_OK) {
        fprintf(stderr, "test_peer_guest: %s\n", e.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_priority_parse), cmocka_unit_test(test_cpu_max_parse),
        cmocka_unit_test(test_cfs_parse),      cmocka_unit_test(test_quota_and_pick),
        cmocka_unit_test(test_cgroup_path),    cmocka_unit_test(test_cgroup_mount),
        cmocka_unit_test(test_cgroup_dir),     cmocka_unit_test(test_cpus_from_tree),
        cmocka_unit_test(test_cpus_detect),    cmocka_unit_test(test_env_plan),
        cmocka_unit_test(test_passive_waits),  cmocka_unit_test(test_priority_low),
        cmocka_unit_test(test_priority_idle),  cmocka_unit_test(test_priority_normal),
        cmocka_unit_test(test_priority_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
