/* Line-oriented logging to stderr. Each line is assembled in full and
 * emitted with a single write() under a mutex so that lines from different
 * threads (and, for short lines, different processes sharing stderr) never
 * interleave. */
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
static log_level cur_level = LOG_INFO;
/* VOLLEY_LOG is an operator override for debugging a deployed program, so
 * when it is set it wins over whatever level the program configures. */
static int env_level = -1;
static char program[64] = "volley";

static void log_init_env(void)
{
    const char *e = getenv("VOLLEY_LOG");
    if (!e)
        return;
    if (!strcasecmp(e, "debug"))
        env_level = LOG_DEBUG;
    else if (!strcasecmp(e, "info"))
        env_level = LOG_INFO;
    else if (!strcasecmp(e, "warn") || !strcasecmp(e, "warning"))
        env_level = LOG_WARN;
    else if (!strcasecmp(e, "error"))
        env_level = LOG_ERROR;
}

void log_set_program(const char *name)
{
    if (!name)
        return;
    pthread_mutex_lock(&log_lock);
    size_t n = strlen(name);
    if (n >= sizeof program)
        n = sizeof program - 1;
    memcpy(program, name, n);
    program[n] = '\0';
    pthread_mutex_unlock(&log_lock);
}

void log_set_level(log_level level)
{
    if (level < LOG_DEBUG || level > LOG_ERROR)
        return;
    pthread_mutex_lock(&log_lock);
    cur_level = level;
    pthread_mutex_unlock(&log_lock);
}

static const char *level_name(log_level l)
{
    switch (l) {
    case LOG_DEBUG: return "DEBUG";
    case LOG_INFO: return "INFO";
    case LOG_WARN: return "WARN";
    default: return "ERROR";
    }
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return; /* nowhere left to report a logging failure */
        }
        p += w;
        n -= (size_t)w;
    }
}

void log_msg(log_level level, const char *fmt, ...)
{
    pthread_once(&log_once, log_init_env);

    pthread_mutex_lock(&log_lock);
    int threshold = env_level >= 0 ? env_level : (int)cur_level;
    if ((int)level < threshold) {
        pthread_mutex_unlock(&log_lock);
        return;
    }

    char line[4096];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000L, level_name(level), program);
    if (n < 0)
        n = 0;
    size_t used = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;

    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + used, sizeof line - used, fmt, ap);
    va_end(ap);
    if (m > 0) {
        if ((size_t)m < sizeof line - used) {
            used += (size_t)m;
        } else {
            /* Over-long messages are cut, and marked so the cut is visible. */
            used = sizeof line - 1;
            memcpy(line + used - 3, "...", 3);
        }
    }
    /* A message that ends in its own newline should not produce a blank line. */
    while (used > 0 && line[used - 1] == '\n')
        used--;
    line[used++] = '\n'; /* used <= sizeof line - 1 here */

    write_all(STDERR_FILENO, line, used);
    pthread_mutex_unlock(&log_lock);
}
