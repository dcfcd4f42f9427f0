/* The peer's lines as text: the terminal's status line and the JSON form
 * of a log line or event. Pure functions of their arguments, so the
 * tests can hold them to exact strings. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "peer/ui.h"

int peer_log_format_parse(const char *s, peer_log_format *out) {
    if (s && !strcmp(s, "text"))
        *out = PEER_LOG_TEXT;
    else if (s && !strcmp(s, "json"))
        *out = PEER_LOG_JSON;
    else
        return VL_EINVAL;
    return VL_OK;
}

void peer_ui_duration(double s, char *out, size_t cap) {
    long long t = s > 0 && s < 1e12 ? (long long)(s + 0.5) : 0;
    long long h = t / 3600, m = t / 60 % 60, sec = t % 60;
    if (h > 0)
        snprintf(out, cap, m ? "%lld h %lld min" : "%lld h", h, m);
    else if (m > 0 && sec > 0)
        snprintf(out, cap, "%lld min %lld s", m, sec);
    else if (m > 0)
        snprintf(out, cap, "%lld min", m);
    else
        snprintf(out, cap, "%lld s", sec);
}

void peer_ui_bytes(int64_t n, char *out, size_t cap) {
    double v = (double)n;
    if (n < 0) v = -v;
    const char *sign = n < 0 ? "-" : "";
    if (v < 1000)
        snprintf(out, cap, "%s%lld B", sign, (long long)(n < 0 ? -n : n));
    else if (v < 1e6)
        snprintf(out, cap, "%s%.1f kB", sign, v / 1e3);
    else if (v < 1e9)
        snprintf(out, cap, "%s%.1f MB", sign, v / 1e6);
    else
        snprintf(out, cap, "%s%.1f GB", sign, v / 1e9);
}

/* "0.4/1.1 MB": both in the unit the total reads best in. */
static void bytes_of(int64_t done, int64_t total, char *out, size_t cap) {
    double t = (double)total, d = (double)done;
    if (t < 1000)
        snprintf(out, cap, "%lld/%lld B", (long long)done, (long long)total);
    else if (t < 1e6)
        snprintf(out, cap, "%.1f/%.1f kB", d / 1e3, t / 1e3);
    else if (t < 1e9)
        snprintf(out, cap, "%.1f/%.1f MB", d / 1e6, t / 1e6);
    else
        snprintf(out, cap, "%.1f/%.1f GB", d / 1e9, t / 1e9);
}

/* ---- the status line ---------------------------------------------------- */

enum { SEG_TASK, SEG_WHAT, SEG_LOSS, SEG_TPS, SEG_DEV, SEG_UP, SEG_SAVED, NSEG };
#define SEG_SEP " | "

size_t peer_ui_status_format(const peer_ui_status *s, size_t width, char *out, size_t cap) {
    char seg[NSEG][128];
    int on[NSEG] = {0};
    char a[48], b[48];
    if (s->task > 0) {
        snprintf(seg[SEG_TASK], sizeof seg[0], "task %lld", (long long)s->task);
        on[SEG_TASK] = 1;
    }
    if (s->phase && s->down_total > 0) {
        bytes_of(s->down_done, s->down_total, a, sizeof a);
        snprintf(seg[SEG_WHAT], sizeof seg[0], "%s %s", s->phase, a);
    } else if (s->phase) {
        snprintf(seg[SEG_WHAT], sizeof seg[0], "%s", s->phase);
    } else if (s->steps > 0) {
        snprintf(seg[SEG_WHAT], sizeof seg[0], "step %d/%d", s->step, s->steps);
    } else {
        snprintf(seg[SEG_WHAT], sizeof seg[0], "starting");
    }
    on[SEG_WHAT] = 1;
    if (isfinite(s->loss)) {
        snprintf(seg[SEG_LOSS], sizeof seg[0], "loss %.4f", s->loss);
        on[SEG_LOSS] = 1;
    }
    if (s->tokens_per_s > 0 && isfinite(s->tokens_per_s)) {
        double t = s->tokens_per_s;
        if (t < 1e4)
            snprintf(seg[SEG_TPS], sizeof seg[0], "%.0f tok/s", t);
        else if (t < 1e6)
            snprintf(seg[SEG_TPS], sizeof seg[0], "%.1fk tok/s", t / 1e3);
        else
            snprintf(seg[SEG_TPS], sizeof seg[0], "%.1fM tok/s", t / 1e6);
        on[SEG_TPS] = 1;
    }
    if (s->device && s->device[0]) {
        snprintf(seg[SEG_DEV], sizeof seg[0], "%.40s", s->device);
        on[SEG_DEV] = 1;
    }
    if (s->up_total > 0) {
        bytes_of(s->up_done, s->up_total, a, sizeof a);
        if (s->up_rate > 0 && isfinite(s->up_rate)) {
            peer_ui_bytes((int64_t)s->up_rate, b, sizeof b);
            snprintf(seg[SEG_UP], sizeof seg[0], "up %s at %s/s", a, b);
        } else {
            snprintf(seg[SEG_UP], sizeof seg[0], "up %s", a);
        }
        on[SEG_UP] = 1;
    }
    if (s->saved > 0) {
        peer_ui_bytes(s->saved, a, sizeof a);
        snprintf(seg[SEG_SAVED], sizeof seg[0], "saved %s", a);
        on[SEG_SAVED] = 1;
    }
    /* The last column stays free: a terminal that wraps there would push
     * the line down instead of redrawing it. */
    size_t fit = width > 0 ? width - 1 : 0;
    static const int drop[] = {SEG_SAVED, SEG_DEV, SEG_TPS, SEG_UP, SEG_LOSS, SEG_TASK};
    for (size_t d = 0;; d++) {
        size_t len = 0, parts = 0;
        for (int i = 0; i < NSEG; i++)
            if (on[i]) len += strlen(seg[i]), parts++;
        len += (parts - 1) * strlen(SEG_SEP);
        if (len <= fit || d == sizeof drop / sizeof drop[0]) break;
        on[drop[d]] = 0;
    }
    size_t limit = fit < cap - 1 ? fit : cap - 1, n = 0;
    int first = 1;
    for (int i = 0; i < NSEG && n < limit; i++) {
        if (!on[i]) continue;
        const char *parts[2] = {first ? "" : SEG_SEP, seg[i]};
        first = 0;
        for (int p = 0; p < 2; p++)
            for (const char *c = parts[p]; *c && n < limit; c++)
                out[n++] = (unsigned char)*c < 0x20 || *c == 0x7f ? ' ' : *c;
    }
    out[n] = '\0';
    return n;
}

/* ---- JSON lines ---------------------------------------------------------- */

typedef struct jbuf {
    char *p;
    size_t len;
} jbuf;

/* Appends s whole or not at all; 1 when it fitted below limit bytes. */
static int jput(jbuf *b, const char *s, size_t n, size_t limit) {
    if (b->len + n > limit) return 0;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 1;
}

/* Bytes in the valid UTF-8 sequence at s (n bytes left), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return len;
}

/* Appends s as the body of a JSON string, escaped, while it fits below
 * limit; returns 1 when all of it did. */
static int jstr(jbuf *b, const char *str, size_t limit) {
    const unsigned char *s = (const unsigned char *)str;
    size_t n = strlen(str);
    for (size_t i = 0; i < n;) {
        char esc[8];
        const char *piece = esc;
        size_t len = 0, take = 1;
        unsigned char c = s[i];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c, len = 2;
        } else if (c < 0x20 || c == 0x7f) {
            len = (size_t)snprintf(esc, sizeof esc, "\\u%04x", c);
        } else if (c < 0x80) {
            esc[0] = (char)c, len = 1;
        } else if ((take = utf8_len(s + i, n - i)) > 0) {
            piece = (const char *)s + i, len = take;
        } else {
            piece = "\\ufffd", len = 6, take = 1;
        }
        if (!jput(b, piece, len, limit)) return 0;
        i += take;
    }
    return 1;
}

static int jkey(jbuf *b, const char *key, size_t limit) {
    return jput(b, ",\"", 2, limit) && jstr(b, key, limit) && jput(b, "\":", 2, limit);
}

/* One field, whole or not at all. */
static void jfield(jbuf *b, const peer_ui_field *f, size_t limit) {
    size_t mark = b->len;
    char num[40];
    int ok = jkey(b, f->key ? f->key : "", limit);
    if (ok && f->type == 'i') {
        ok = jput(b, num, (size_t)snprintf(num, sizeof num, "%lld", (long long)f->i), limit);
    } else if (ok && f->type == 'f') {
        if (isfinite(f->f))
            ok = jput(b, num, (size_t)snprintf(num, sizeof num, "%.6g", f->f), limit);
        else
            ok = jput(b, "null", 4, limit);
    } else if (ok && f->s) {
        ok = jput(b, "\"", 1, limit) && jstr(b, f->s, limit) && jput(b, "\"", 1, limit);
    } else if (ok) {
        ok = jput(b, "null", 4, limit);
    }
    if (!ok) b->len = mark;
}

size_t peer_ui_json_line(char *out, size_t cap, const struct timespec *ts, vl_log_level level,
                         const char *program, const char *event, const peer_ui_field *f, size_t nf,
                         const char *msg) {
    static const char *const LEVELS[] = {"debug", "info", "warn", "error"};
    /* What always closes the line: the message's end, the object's, the
     * newline; the NUL is not counted in cap's share. */
    static const char TAIL[] = "\"}\n";
    static const char MSG_KEY[] = ",\"msg\":\"";
    const size_t tail = sizeof TAIL - 1, cut = 3;
    jbuf b = {.p = out, .len = 0};
    struct tm tm;
    gmtime_r(&ts->tv_sec, &tm);
    char head[96];
    int hn = snprintf(head, sizeof head,
                      "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\"",
                      tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                      tm.tm_sec, ts->tv_nsec / 1000000L,
                      LEVELS[level >= LOG_DEBUG && level <= LOG_ERROR ? level : LOG_ERROR]);
    /* Fields stop where only the message's key, a cut mark and the tail
     * would still fit. */
    size_t limit = cap - 1 - tail - cut - (sizeof MSG_KEY - 1);
    if (!jput(&b, head, (size_t)hn, limit)) {
        snprintf(out, cap, "{}\n");
        return strlen(out);
    }
    peer_ui_field meta[2] = {PEER_UI_STR("program", program), PEER_UI_STR("event", event)};
    for (size_t i = 0; i < 2; i++) jfield(&b, &meta[i], limit);
    for (size_t i = 0; i < nf; i++) jfield(&b, &f[i], limit);
    jput(&b, MSG_KEY, sizeof MSG_KEY - 1, cap - 1);
    size_t m = strlen(msg);
    while (m > 0 && msg[m - 1] == '\n') m--;
    char body[4096];
    if (m >= sizeof body) m = sizeof body - 1;
    memcpy(body, msg, m);
    body[m] = '\0';
    if (!jstr(&b, body, cap - 1 - tail - cut)) jput(&b, "...", cut, cap - 1 - tail);
    jput(&b, TAIL, tail, cap - 1);
    out[b.len] = '\0';
    return b.len;
}
