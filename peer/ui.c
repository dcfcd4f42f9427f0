/* The status line and the log's format for a running peer (peer/ui.h).
 * Lock order: the log's lock, then ui_lock. The log calls the writer
 * below under its lock; redraws go through vl_log_locked, so they hold the
 * same two locks in the same order, and what the training thread, the
 * upload thread and the log write to stderr never interleaves. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "peer/ui.h"

/* At most this many redraws a second; a terminal needs no more. */
#define REDRAW_EVERY_S 0.25
#define CLEAR "\r\033[K"

static pthread_mutex_t ui_lock = PTHREAD_MUTEX_INITIALIZER;
/* The status line is drawn; read without the lock on the way in from
 * every step and transfer callback. */
static atomic_int line_on;
static struct {
    peer_log_format fmt;
    int shown;       /* the status line is on the screen now */
    double drawn_at; /* when it was last drawn (monotonic seconds) */
    peer_ui_status st;
    char phase[64], device[32];
    double train_t0;
    int64_t tokens_per_step;
    /* The reason the coordinator was last said to be out of reach; down:
     * said and not yet taken back. */
    char reach[320];
    int down;
    double down_since; /* monotonic time it went out of reach */
} U = {.st = {.loss = NAN}};

/* What an event hands the writer on its way through vl_log_msg, which runs
 * the writer on the caller's thread. */
static _Thread_local const char *tl_event;
static _Thread_local const peer_ui_field *tl_fields;
static _Thread_local size_t tl_nf;

peer_log_format peer_ui_format(void) {
    return U.fmt;
}

static size_t term_width(void) {
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    return 80;
}

/* Appends CLEAR and the status line to out (room for term width + 8);
 * under ui_lock. */
static size_t status_into(char *out, size_t cap) {
    memcpy(out, CLEAR, sizeof CLEAR - 1);
    size_t n = sizeof CLEAR - 1;
    n += peer_ui_status_format(&U.st, term_width(), out + n, cap - n);
    U.shown = 1;
    U.drawn_at = vl_clock_mono_s();
    return n;
}

static void writer(void *arg, const struct timespec *ts, vl_log_level level, const char *program,
                   const char *msg) {
    (void)arg;
    char line[8192];
    size_t n = U.fmt == PEER_LOG_JSON
                   ? peer_ui_json_line(line, sizeof line, ts, level, program,
                                       tl_event ? tl_event : "log", tl_fields, tl_nf, msg)
                   : vl_log_format(line, sizeof line, ts, level, program, msg);
    pthread_mutex_lock(&ui_lock);
    if (!atomic_load(&line_on)) {
        pthread_mutex_unlock(&ui_lock);
        vl_log_write(line, n);
        return;
    }
    /* The line above the status line, then the status line again: one
     * write, so the terminal never shows one without the other. */
    char out[sizeof line + 1024];
    size_t o = 0;
    memcpy(out, CLEAR, sizeof CLEAR - 1);
    o += sizeof CLEAR - 1;
    memcpy(out + o, line, n);
    o += n;
    if (U.shown) o += status_into(out + o, sizeof out - o);
    pthread_mutex_unlock(&ui_lock);
    vl_log_write(out, o);
}

static void draw(void *arg) {
    (void)arg;
    char out[1024];
    pthread_mutex_lock(&ui_lock);
    size_t n = atomic_load(&line_on) ? status_into(out, sizeof out) : 0;
    pthread_mutex_unlock(&ui_lock);
    vl_log_write(out, n);
}

/* Redraws when the last draw is old enough; otherwise the change waits
 * for the next one. Called with ui_lock held; releases it. */
static void changed_unlock(void) {
    int due = atomic_load(&line_on) && vl_clock_mono_s() - U.drawn_at >= REDRAW_EVERY_S;
    if (due) U.drawn_at = vl_clock_mono_s(); /* one thread draws */
    pthread_mutex_unlock(&ui_lock);
    if (due) vl_log_locked(draw, NULL);
}

void peer_ui_start(peer_log_format fmt, int status_line) {
    pthread_mutex_lock(&ui_lock);
    U.fmt = fmt;
    int line = status_line && fmt == PEER_LOG_TEXT;
    atomic_store(&line_on, line);
    pthread_mutex_unlock(&ui_lock);
    if (line || fmt == PEER_LOG_JSON) vl_log_set_writer(writer, NULL);
}

static void clear(void *arg) {
    (void)arg;
    pthread_mutex_lock(&ui_lock);
    int shown = U.shown;
    atomic_store(&line_on, 0);
    U.shown = 0;
    pthread_mutex_unlock(&ui_lock);
    if (shown) vl_log_write(CLEAR, sizeof CLEAR - 1);
}

void peer_ui_stop(void) {
    vl_log_locked(clear, NULL);
}

void peer_ui_event(vl_log_level level, const char *event, const peer_ui_field *f, size_t nf,
                   const char *fmt, ...) {
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tl_event = event;
    tl_fields = f;
    tl_nf = nf > 32 ? 32 : nf;
    vl_log_msg(level, "%s", msg);
    tl_event = NULL;
    tl_fields = NULL;
    tl_nf = 0;
}

/* ---- what the line shows ------------------------------------------------ */

void peer_ui_device(const char *name) {
    pthread_mutex_lock(&ui_lock);
    snprintf(U.device, sizeof U.device, "%s", name ? name : "");
    U.st.device = U.device;
    changed_unlock();
}

void peer_ui_phase(int64_t task, const char *phase) {
    pthread_mutex_lock(&ui_lock);
    U.st.task = task;
    snprintf(U.phase, sizeof U.phase, "%s", phase ? phase : "");
    U.st.phase = U.phase;
    U.st.down_total = U.st.down_done = 0;
    changed_unlock();
}

void peer_ui_train_begin(int64_t task, int steps, int64_t tokens_per_step) {
    pthread_mutex_lock(&ui_lock);
    U.st.task = task;
    U.st.phase = NULL;
    U.st.step = 0;
    U.st.steps = steps;
    U.st.down_total = U.st.down_done = 0;
    U.tokens_per_step = tokens_per_step;
    U.train_t0 = vl_clock_mono_s();
    changed_unlock();
}

void peer_ui_step(int step, double loss) {
    if (!atomic_load(&line_on)) return;
    pthread_mutex_lock(&ui_lock);
    U.st.step = step;
    U.st.loss = loss;
    double t = vl_clock_mono_s() - U.train_t0;
    if (t > 0 && U.tokens_per_step > 0) U.st.tokens_per_s = step * (double)U.tokens_per_step / t;
    changed_unlock();
}

void peer_ui_transfer(int upload, int64_t done, int64_t total, double seconds) {
    if (!atomic_load(&line_on)) return;
    pthread_mutex_lock(&ui_lock);
    if (upload) {
        U.st.up_done = done;
        U.st.up_total = total;
        U.st.up_rate = seconds > 0 ? (double)done / seconds : 0;
    } else if (U.st.phase) {
        U.st.down_done = done;
        U.st.down_total = total;
    }
    changed_unlock();
}

void peer_ui_saved(int64_t bytes) {
    pthread_mutex_lock(&ui_lock);
    U.st.saved += bytes;
    changed_unlock();
}

/* ---- reachability ---------------------------------------------------------- */

void peer_ui_unreachable(const char *url, const char *reason, int answered, double retry_in_s,
                         int tries_left, double cap_s, double give_up_s) {
    char key[sizeof U.reach];
    snprintf(key, sizeof key, "%s %s", url, reason);
    pthread_mutex_lock(&ui_lock);
    int again = U.down && strcmp(U.reach, key) == 0;
    memcpy(U.reach, key, sizeof key);
    if (!U.down) U.down_since = vl_clock_mono_s();
    U.down = 1;
    pthread_mutex_unlock(&ui_lock);
    if (again) {
        vl_log_debug("still the same (%s); retrying in %.1f s", reason, retry_in_s);
        return;
    }
    peer_ui_field f[] = {PEER_UI_STR("url", url),
                         PEER_UI_STR("reason", reason),
                         PEER_UI_INT("answered", answered),
                         PEER_UI_NUM("retry_in_s", retry_in_s),
                         PEER_UI_INT("tries_left", tries_left),
                         PEER_UI_NUM("backoff_cap_s", cap_s),
                         PEER_UI_NUM("give_up_after_s", give_up_s)};
    if (tries_left >= 0) {
        /* --retries N: the count is what the volunteer asked about. */
        peer_ui_event(LOG_WARN, "coordinator_unreachable", f, PEER_UI_NFIELDS(f),
                      answered ? "the coordinator at %s is not serving requests now (%s); retrying "
                                 "in %.1f s, up to %d more time%s before giving up"
                               : "cannot reach the coordinator at %s (%s); retrying in %.1f s, up "
                                 "to %d more time%s before giving up",
                      url, reason, retry_in_s, tries_left, tries_left == 1 ? "" : "s");
        return;
    }
    char cap[32], deadline[64] = "--give-up-after to stop";
    peer_ui_duration(cap_s, cap, sizeof cap);
    if (give_up_s > 0) {
        char d[32];
        peer_ui_duration(give_up_s, d, sizeof d);
        snprintf(deadline, sizeof deadline, "giving up after %s", d);
    }
    peer_ui_event(LOG_WARN, "coordinator_unreachable", f, PEER_UI_NFIELDS(f),
                  answered ? "coordinator %s not serving requests now (%s); trying again with "
                             "backoff up to %s; %s"
                           : "coordinator %s unreachable (%s); trying again with backoff up to "
                             "%s; %s",
                  url, reason, cap, deadline);
}

void peer_ui_reached(const char *url) {
    pthread_mutex_lock(&ui_lock);
    int was_down = U.down;
    double since = U.down_since;
    U.down = 0;
    pthread_mutex_unlock(&ui_lock);
    if (!was_down) return;
    double out_s = vl_clock_mono_s() - since;
    char d[32];
    peer_ui_duration(out_s, d, sizeof d);
    peer_ui_field f[] = {PEER_UI_STR("url", url), PEER_UI_NUM("down_s", out_s)};
    peer_ui_event(LOG_INFO, "coordinator_reached", f, PEER_UI_NFIELDS(f),
                  "reached the coordinator at %s again; reconnected after %s", url, d);
}
