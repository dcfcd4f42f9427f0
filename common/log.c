/* Line-oriented logging to stderr. Each line is assembled in full and
 * emitted with a single write() under a mutex so that lines from different
 * threads (and, for short lines, different processes sharing stderr) never
 * interleave. A program may install a writer that emits the lines itself
 * (another format, a status line kept below them) under the same mutex. */
#include "common/common.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static vl_log_level cur_level = LOG_INFO;
/* VOLLEY_LOG is an operator override for debugging a deployed program, so
 * when it is set it wins over whatever level the program configures. */
static int env_level = -1;
static char program[64] = "volley";
static vl_log_writer writer;
static void *writer_arg;

static void log_init_env(void) {
    const char *e = getenv("VOLLEY_LOG");
    if (!e) return;
    if (!strcasecmp(e, "debug"))
        env_level = LOG_DEBUG;
    else if (!strcasecmp(e, "info"))
        env_level = LOG_INFO;
    else if (!strcasecmp(e, "warn") || !strcasecmp(e, "warning"))
        env_level = LOG_WARN;
    else if (!strcasecmp(e, "error"))
        env_level = LOG_ERROR;
}

void vl_log_set_program(const char *name) {
    if (!name) return;
    pthread_mutex_lock(&log_lock);
    size_t n = strlen(name);
    if (n >= sizeof program) n = sizeof program - 1;
    memcpy(program, name, n);
    program[n] = '\0';
    pthread_mutex_unlock(&log_lock);
}

void vl_log_set_level(vl_log_level level) {
    if (level < LOG_DEBUG || level > LOG_ERROR) return;
    pthread_mutex_lock(&log_lock);
    cur_level = level;
    pthread_mutex_unlock(&log_lock);
}

const char *vl_log_level_name(vl_log_level l) {
    switch (l) {
    case LOG_DEBUG: return "DEBUG";
    case LOG_INFO: return "INFO";
    case LOG_WARN: return "WARN";
    default: return "ERROR";
    }
}

void vl_log_write(const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return; /* nowhere left to report a logging failure */
        }
        p += w;
        n -= (size_t)w;
    }
}

void vl_log_set_writer(vl_log_writer fn, void *arg) {
    pthread_mutex_lock(&log_lock);
    writer = fn;
    writer_arg = arg;
    pthread_mutex_unlock(&log_lock);
}

void vl_log_locked(void (*fn)(void *arg), void *arg) {
    pthread_mutex_lock(&log_lock);
    fn(arg);
    pthread_mutex_unlock(&log_lock);
}

size_t vl_log_format(char *out, size_t cap, const struct timespec *ts, vl_log_level level,
                     const char *prog, const char *msg) {
    struct tm tm;
    gmtime_r(&ts->tv_sec, &tm);
    int n = snprintf(out, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts->tv_nsec / 1000000L, vl_log_level_name(level), prog);
    if (n < 0) n = 0;
    /* Room for the prefix and the message; the newline and NUL follow. */
    size_t room = cap - 2;
    size_t used = (size_t)n < room ? (size_t)n : room;
    size_t m = strlen(msg);
    /* A message that ends in its own newline should not produce a blank line. */
    while (m > 0 && msg[m - 1] == '\n') m--;
    if (m <= room - used) {
        memcpy(out + used, msg, m);
        used += m;
    } else {
        /* Over-long messages are cut, and marked so the cut is visible. */
        memcpy(out + used, msg, room - used);
        used = room;
        memcpy(out + used - 3, "...", 3);
    }
    out[used++] = '\n';
    out[used] = '\0';
    return used;
}

void vl_log_msg(vl_log_level level, const char *fmt, ...) {
    pthread_once(&log_once, log_init_env);

    pthread_mutex_lock(&log_lock);
    int threshold = env_level >= 0 ? env_level : (int)cur_level;
    if ((int)level < threshold) {
        pthread_mutex_unlock(&log_lock);
        return;
    }

    char msg[4096], line[4096];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m < 0)
        msg[0] = '\0';
    else if ((size_t)m >= sizeof msg)
        memcpy(msg + sizeof msg - 4, "...", 3);

    if (writer) {
        writer(writer_arg, &ts, level, program, msg);
    } else {
        size_t used = vl_log_format(line, sizeof line, &ts, level, program, msg);
        vl_log_write(line, used);
    }
    pthread_mutex_unlock(&log_lock);
}
