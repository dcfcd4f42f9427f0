/*
 * The lock of a peer's directory (peer/dirlock.h) between two processes:
 * a child holds it, the parent is refused with the child's pid and
 * command named and the lock file left as the child wrote it; once the
 * child is gone the parent takes it; a directory that does not exist has
 * nothing to lock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "peer/dirlock.h"

static void read_file(const char *path, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

static void test_two_processes(void **state) {
    (void)state;
    char dir[] = "/tmp/volley-dirlock.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, PEER_LOCK_FILE);
    int ready[2], done[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(done), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        vl_error e = {0};
        int fd;
        int rc = peer_dir_lock(dir, "volley-peer run", &fd, &e);
        char c = rc == 0 && fd >= 0 ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1) _exit(2);
        if (read(done[0], &c, 1) != 1) _exit(2); /* hold it until told */
        _exit(0);
    }
    char c = 0;
    assert_int_equal(read(ready[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    char before[256], after[256], want[64];
    read_file(path, before, sizeof before);
    snprintf(want, sizeof want, "%d volley-peer run\n", (int)child);
    assert_string_equal(before, want);

    vl_error e = {0};
    int fd = 99;
    assert_int_equal(peer_dir_lock(dir, "volley-peer join", &fd, &e), VL_ECONFLICT);
    assert_int_equal(fd, -1);
    char msg[160];
    snprintf(msg, sizeof msg, "%s is in use by process %d (volley-peer run); stop it first", dir,
             (int)child);
    if (!strstr(e.msg, msg)) fail_msg("message '%s' lacks '%s'", e.msg, msg);
    read_file(path, after, sizeof after);
    assert_string_equal(after, before); /* the refused one touched nothing */

    assert_int_equal(write(done[1], "x", 1), 1);
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    memset(&e, 0, sizeof e);
    assert_int_equal(peer_dir_lock(dir, "volley-peer join", &fd, &e), VL_OK);
    assert_true(fd >= 0);
    read_file(path, after, sizeof after);
    snprintf(want, sizeof want, "%d volley-peer join\n", (int)getpid());
    assert_string_equal(after, want);
    peer_dir_unlock(fd);

    /* A lock file that names nobody still refuses, naming the file. */
    pid_t holder = fork();
    assert_true(holder >= 0);
    if (holder == 0) {
        vl_error e2 = {0};
        int fd2;
        char ok = peer_dir_lock(dir, "x", &fd2, &e2) == 0 ? 'y' : 'n';
        FILE *f = fopen(path, "w"); /* emptied while held */
        if (f) fclose(f);
        if (write(ready[1], &ok, 1) != 1) _exit(2);
        if (read(done[0], &ok, 1) != 1) _exit(2);
        _exit(0);
    }
    assert_int_equal(read(ready[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    assert_int_equal(peer_dir_lock(dir, "volley-peer run", &fd, &e), VL_ECONFLICT);
    assert_non_null(strstr(e.msg, "in use by another volley-peer process"));
    assert_int_equal(write(done[1], "x", 1), 1);
    assert_int_equal(waitpid(holder, &status, 0), holder);

    unlink(path);
    rmdir(dir);
    /* Nothing to guard where the directory is absent. */
    memset(&e, 0, sizeof e);
    assert_int_equal(peer_dir_lock(dir, "volley-peer run", &fd, &e), VL_OK);
    assert_int_equal(fd, -1);
    assert_int_equal(access(dir, F_OK), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_two_processes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
