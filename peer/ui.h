/*
 * ui: what a volunteer sees of a running peer. On a terminal, `run` keeps
 * one status line below the log (task, step, loss, tokens a second,
 * device, upload progress, bytes compression saved), redrawn in place a
 * few times a second. Elsewhere (systemd, pipes) every log line and event
 * is one line of text as always, or with --log-format json one JSON
 * object. Every line goes through common's log (vl_log_set_writer), so log
 * lines, events and the status line never interleave. The peer also
 * tells a volunteer once, in plain words, when the coordinator cannot be
 * reached and when it can again. Part of the peer library; the
 * formatters at the end are pure, for tests.
 */
#ifndef VOLLEY_PEER_UI_H
#define VOLLEY_PEER_UI_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common/common.h"

typedef enum { PEER_LOG_TEXT = 0, PEER_LOG_JSON = 1 } peer_log_format;

/* "text" or "json" into *out; VL_EINVAL for anything else. */
int peer_log_format_parse(const char *s, peer_log_format *out) VL_MUST_CHECK;

/* Takes over the log's output: lines in format fmt and, when status_line
 * is set (text on a terminal), the status line below them. Call once,
 * before any thread logs. */
void peer_ui_start(peer_log_format fmt, int status_line);
/* Clears the status line and gives the log its own lines back; after it
 * plain writes to stderr are safe again. */
void peer_ui_stop(void);
/* The format peer_ui_start was given (text before it). */
peer_log_format peer_ui_format(void);

/* ---- events ------------------------------------------------------------ */

/* One field of an event: an integer, a number (non-finite: null) or a
 * string (NULL: null). */
typedef struct peer_ui_field {
    const char *key;
    char type; /* 'i', 'f' or 's' */
    int64_t i;
    double f;
    const char *s;
} peer_ui_field;

#define PEER_UI_INT(k, v) ((peer_ui_field){.key = (k), .type = 'i', .i = (int64_t)(v)})
#define PEER_UI_NUM(k, v) ((peer_ui_field){.key = (k), .type = 'f', .f = (double)(v)})
#define PEER_UI_STR(k, v) ((peer_ui_field){.key = (k), .type = 's', .s = (v)})
#define PEER_UI_NFIELDS(a) (sizeof(a) / sizeof((a)[0]))

/* Logs an event: in text the formatted message as an ordinary log line;
 * in JSON one object with ts, level, program, event, the fields (at most
 * 32) and msg. Ordinary log lines are JSON objects of event "log". */
void peer_ui_event(vl_log_level level, const char *event, const peer_ui_field *f, size_t nf,
                   const char *fmt, ...) VL_PRINTF(5, 6);

/* ---- what the status line shows ----------------------------------------- */

/* The device, short ("cpu", "cuda"). */
void peer_ui_device(const char *name);
/* What the peer does for task (0: none) when it is not training:
 * "waiting for a task", "downloading the model". Clears the step. */
void peer_ui_phase(int64_t task, const char *phase);
/* Training of task begins: up to steps steps of tokens_per_step tokens. */
void peer_ui_train_begin(int64_t task, int steps, int64_t tokens_per_step);
/* Step step (1-based) of the task in training ended with this loss. */
void peer_ui_step(int step, double loss);
/* A transfer shown on the line (peer_request.show_progress): upload or
 * download, done of total bytes after seconds. total 0 ends it. */
void peer_ui_transfer(int upload, int64_t done, int64_t total, double seconds);
/* Adds bytes compression saved (dense size minus bytes sent). */
void peer_ui_saved(int64_t bytes);

/* ---- the coordinator's reachability ------------------------------------- */

/* A request to url failed for reason (a few words: "connection refused";
 * answered: an HTTP status worth a retry, "503 busy") and is tried again
 * in retry_in_s, tries_left more times at most (-1: no limit, then the
 * line names the backoff's cap_s and the deadline give_up_s, 0: none, or
 * --give-up-after). Says so once, as a
 * warning; the same reason again is logged at debug level only, a new one
 * as a warning again. */
void peer_ui_unreachable(const char *url, const char *reason, int answered, double retry_in_s,
                         int tries_left, double cap_s, double give_up_s);
/* A request to url was answered: after peer_ui_unreachable, says that the
 * coordinator was reached again and how long it was out of reach. */
void peer_ui_reached(const char *url);

/* ---- formatters (pure) --------------------------------------------------- */

/* What the status line shows. */
typedef struct peer_ui_status {
    int64_t task;                  /* 0: none yet */
    const char *phase;             /* what the peer does; NULL while it trains */
    int step, steps;               /* training: step of steps */
    double loss;                   /* the last step's loss; not finite: none */
    double tokens_per_s;           /* <= 0: not known */
    const char *device;            /* NULL or "": not known */
    int64_t down_done, down_total; /* a download shown (total 0: none) */
    int64_t up_done, up_total;     /* an upload in flight (total 0: none) */
    double up_rate;                /* its bytes a second */
    int64_t saved;                 /* bytes compression saved so far */
} peer_ui_status;

/* The status line for a terminal width columns wide, into out (cap >= 1),
 * without control characters: at most width - 1 bytes (the last column
 * is left free, where a terminal would wrap). Parts are dropped to fit,
 * the least useful first (saved, device, tokens a second, upload, loss,
 * task); what is left is cut. Returns its length. */
size_t peer_ui_status_format(const peer_ui_status *s, size_t width, char *out, size_t cap);

/* One JSON object and a newline into out (cap >= 64): ts (ISO 8601, UTC,
 * milliseconds), level (lower case), program, event, the fields in order,
 * then msg. Strings are escaped (control characters as \u00XX, invalid
 * UTF-8 as U+FFFD); a message too long for cap is cut and marked "...",
 * so the line is always whole JSON. Returns its length. */
size_t peer_ui_json_line(char *out, size_t cap, const struct timespec *ts, vl_log_level level,
                         const char *program, const char *event, const peer_ui_field *f, size_t nf,
                         const char *msg);

/* A span of seconds as a volunteer reads it: "12 s", "3 min 12 s",
 * "5 min", "2 h 5 min". Writes out (cap >= 1). */
void peer_ui_duration(double s, char *out, size_t cap);

/* Bytes as a volunteer reads them: "512 B", "3.2 kB", "14.0 MB". */
void peer_ui_bytes(int64_t n, char *out, size_t cap);

#endif
