/* The input guard: request-head analysis and the hook on a connection's
 * input buffer. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>

#include "coordinator/conn/guard.h"
#include "coordinator/conn/guard_types.h"

static const char *const VERDICT_NAMES[] = {
    [COORD_GUARD_OK] = "ok",
    [COORD_GUARD_TOO_LARGE] = "too_large",
    [COORD_GUARD_HEAD_TOO_LARGE] = "head_too_large",
    [COORD_GUARD_LENGTH_REQUIRED] = "length_required",
    [COORD_GUARD_BAD_LENGTH] = "bad_length",
    [COORD_GUARD_BAD_HEAD] = "bad_head",
    [COORD_GUARD_BAD_METHOD] = "bad_method",
    [COORD_GUARD_HEAD_TIMEOUT] = "head_timeout",
    [COORD_GUARD_BODY_TIMEOUT] = "body_timeout",
    [COORD_GUARD_REFUSED] = "refused",
    [COORD_GUARD_PIPELINED] = "pipelined",
    [COORD_GUARD_BODY_NOT_ALLOWED] = "body_not_allowed",
};

const char *coord_guard_verdict_name(coord_guard_verdict v) {
    if ((unsigned)v < sizeof VERDICT_NAMES / sizeof VERDICT_NAMES[0]) return VERDICT_NAMES[v];
    return "bad_head";
}

coord_guard_verdict coord_guard_verdict_parse(const char *name) {
    for (size_t i = 1; i < sizeof VERDICT_NAMES / sizeof VERDICT_NAMES[0]; i++)
        if (name && strcmp(name, VERDICT_NAMES[i]) == 0) return (coord_guard_verdict)i;
    return COORD_GUARD_BAD_HEAD;
}

/* ---- head analysis ------------------------------------------------------- */

/* The methods libevent 2.1's parser knows; any other is refused here so
 * the error stays JSON. CONNECT is left out too: libevent parses its
 * target as an authority and refuses an origin-form one in HTML. */
static const char *const METHODS[] = {"GET",    "POST",    "HEAD",  "PUT",
                                      "DELETE", "OPTIONS", "TRACE", "PATCH"};

static int is_tchar(uint8_t c) {
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int name_is(const uint8_t *p, size_t n, const char *name) {
    return strlen(name) == n && strncasecmp((const char *)p, name, n) == 0;
}

/* A field name the guard reserves: the marker and anything that starts
 * like it (the ticket header). */
static int name_reserved(const uint8_t *p, size_t n) {
    size_t hl = strlen(COORD_GUARD_HEADER);
    return n >= hl && strncasecmp((const char *)p, COORD_GUARD_HEADER, hl) == 0;
}

/* Validates "METHOD SP target SP HTTP/1.x". Returns the verdict for the
 * line, whether the method needs a Content-Length and whether it may have
 * a body at all: libevent reads no body after HEAD or TRACE, so bytes the
 * guard passed on as one would reach it as the next request. */
static coord_guard_verdict check_request_line(const uint8_t *p, size_t n, int *needs_length,
                                              int *no_body) {
    *needs_length = 0;
    *no_body = 0;
    const uint8_t *sp1 = memchr(p, ' ', n);
    if (!sp1 || sp1 == p) return COORD_GUARD_BAD_HEAD;
    size_t mlen = (size_t)(sp1 - p);
    for (size_t i = 0; i < mlen; i++)
        if (!is_tchar(p[i])) return COORD_GUARD_BAD_HEAD;
    const uint8_t *target = sp1 + 1;
    size_t rest = n - mlen - 1;
    const uint8_t *sp2 = memchr(target, ' ', rest);
    /* Origin form only ("/path?query"): the API has no use for absolute,
     * authority or asterisk forms, which libevent parses its own way; it
     * would also read "//host/path" as an authority and a path. */
    if (!sp2 || sp2 == target || target[0] != '/' || (sp2 - target > 1 && target[1] == '/'))
        return COORD_GUARD_BAD_HEAD;
    for (const uint8_t *q = target; q < sp2; q++)
        if (*q < 0x21 || *q > 0x7E) return COORD_GUARD_BAD_HEAD;
    const uint8_t *ver = sp2 + 1;
    size_t vlen = n - (size_t)(ver - p);
    if (vlen != 8 || (memcmp(ver, "HTTP/1.1", 8) != 0 && memcmp(ver, "HTTP/1.0", 8) != 0))
        return COORD_GUARD_BAD_HEAD;
    int known = 0;
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (strlen(METHODS[i]) == mlen && memcmp(p, METHODS[i], mlen) == 0) known = 1;
    if (!known) return COORD_GUARD_BAD_METHOD;
    *needs_length = (mlen == 4 && memcmp(p, "POST", 4) == 0) ||
                    (mlen == 3 && memcmp(p, "PUT", 3) == 0) ||
                    (mlen == 5 && memcmp(p, "PATCH", 5) == 0);
    *no_body =
        (mlen == 4 && memcmp(p, "HEAD", 4) == 0) || (mlen == 5 && memcmp(p, "TRACE", 5) == 0);
    return COORD_GUARD_OK;
}

/* Content-Length: 1 to 19 decimal digits, nothing else (after trimming
 * optional whitespace); anything libevent might read differently is out. */
static int parse_length(const uint8_t *v, size_t n, uint64_t *out) {
    if (n == 0 || n > 19) return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9') return -1;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    *out = x;
    return 0;
}

/* Returns the length of the line at p (without LF and the CR before it) and
 * sets *next past its LF; -1 when no LF is left. */
static long line_at(const uint8_t *p, size_t n, size_t *adv) {
    const uint8_t *lf = memchr(p, '\n', n);
    if (!lf) return -1;
    size_t len = (size_t)(lf - p);
    *adv = len + 1;
    if (len > 0 && p[len - 1] == '\r') len--;
    return (long)len;
}

/* The cap for a request line's target: large_cap for exactly one of
 * large_paths (any query), body_cap for everything else. */
static uint64_t cap_for(const uint8_t *line, size_t n, const coord_guard_caps *caps) {
    if (!caps->large_paths) return caps->body_cap;
    const uint8_t *target = memchr(line, ' ', n);
    if (!target) return caps->body_cap;
    target++;
    size_t tlen = 0;
    while (target + tlen < line + n && target[tlen] != ' ' && target[tlen] != '?') tlen++;
    for (const char *const *p = caps->large_paths; *p; p++) {
        size_t plen = strlen(*p);
        if (tlen == plen && memcmp(target, *p, plen) == 0) return caps->large_cap;
    }
    return caps->body_cap;
}

void coord_guard_parse_head(const uint8_t *head, size_t len, const coord_guard_caps *caps,
                            coord_guard_head *out) {
    memset(out, 0, sizeof *out);
    /* 1. The request line. */
    size_t adv = 0;
    long l = line_at(head, len, &adv);
    if (l <= 0) {
        out->verdict = COORD_GUARD_BAD_HEAD;
        return;
    }
    int needs_length = 0, no_body = 0;
    coord_guard_verdict v = check_request_line(head, (size_t)l, &needs_length, &no_body);
    for (long i = 0; i < l; i++)
        if (head[i] == '\r') v = COORD_GUARD_BAD_HEAD; /* a bare CR inside the line */
    if (v != COORD_GUARD_OK) {
        out->verdict = v;
        return;
    }
    out->reqline_len = (size_t)l;
    uint64_t body_cap = cap_for(head, (size_t)l, caps);
    /* 2. The header fields, a line at a time, to the empty line. */
    int n_cl = 0, has_te = 0, bad_cl = 0, bad_expect = 0;
    uint64_t cl = 0;
    size_t pos = adv;
    for (;;) {
        l = line_at(head + pos, len - pos, &adv);
        if (l < 0) { /* no closing empty line: not a complete head */
            out->verdict = COORD_GUARD_BAD_HEAD;
            return;
        }
        const uint8_t *p = head + pos;
        pos += adv;
        if (l == 0) break;
        /* Folded continuation lines, control bytes and names that are not
         * tokens (e.g. "Content-Length :") could be read two ways. */
        size_t ln = (size_t)l;
        for (size_t i = 0; i < ln; i++)
            if ((p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7F) {
                out->verdict = COORD_GUARD_BAD_HEAD;
                return;
            }
        const uint8_t *colon = memchr(p, ':', ln);
        if (!colon || colon == p) {
            out->verdict = COORD_GUARD_BAD_HEAD;
            return;
        }
        size_t nlen = (size_t)(colon - p);
        for (size_t i = 0; i < nlen; i++)
            if (!is_tchar(p[i])) {
                out->verdict = COORD_GUARD_BAD_HEAD;
                return;
            }
        const uint8_t *val = colon + 1;
        size_t vlen = ln - nlen - 1;
        while (vlen > 0 && (val[0] == ' ' || val[0] == '\t')) val++, vlen--;
        while (vlen > 0 && (val[vlen - 1] == ' ' || val[vlen - 1] == '\t')) vlen--;
        if (name_is(p, nlen, "Content-Length")) {
            n_cl++;
            if (parse_length(val, vlen, &cl) != 0) bad_cl = 1;
        } else if (name_is(p, nlen, "Transfer-Encoding")) {
            has_te = 1;
        } else if (name_reserved(p, nlen)) {
            out->has_marker = 1;
        } else if (name_is(p, nlen, "Expect")) {
            /* libevent answers any other expectation with an HTML 417. */
            if (!(vlen == 12 && strncasecmp((const char *)val, "100-continue", 12) == 0))
                bad_expect = 1;
        }
    }
    /* 3. The verdict on what the fields said. */
    if (pos != len) {
        out->verdict = COORD_GUARD_BAD_HEAD; /* bytes after the closing line */
        return;
    }
    if (bad_expect)
        out->verdict = COORD_GUARD_BAD_HEAD;
    else if (has_te)
        out->verdict = COORD_GUARD_LENGTH_REQUIRED;
    else if (n_cl > 1 || bad_cl)
        out->verdict = COORD_GUARD_BAD_LENGTH;
    else if (n_cl == 1 && cl > 0 && no_body)
        out->verdict = COORD_GUARD_BODY_NOT_ALLOWED;
    else if (n_cl == 1 && cl > body_cap)
        out->verdict = COORD_GUARD_TOO_LARGE;
    else if (n_cl == 0 && needs_length)
        out->verdict = COORD_GUARD_LENGTH_REQUIRED;
    else
        out->verdict = COORD_GUARD_OK;
    out->body_len = n_cl == 1 && !bad_cl ? cl : 0;
}

/* ---- streaming state --------------------------------------------------- */

void coord_guard_init(coord_guard *g, size_t head_cap, const coord_guard_caps *caps) {
    memset(g, 0, sizeof *g);
    g->head_cap = head_cap;
    g->caps = *caps;
    g->state = COORD_GUARD_IN_HEAD;
    g->linger_fd = -1;
    g->created = g->caps.clock ? g->caps.clock() : vl_clock_mono_s();
    vl_buf_init(&g->head, head_cap);
    vl_buf_init(&g->out, head_cap + 256);
}

void coord_guard_free(coord_guard *g) {
    for (int i = 0; i < COORD_GUARD_TICKETS; i++)
        if (g->tickets[i].live && g->caps.release)
            g->caps.release(g->caps.authorize_arg, &g->tickets[i]);
    memset(g->tickets, 0, sizeof g->tickets);
    g->body_owner = NULL;
    vl_buf_free(&g->head);
    vl_buf_free(&g->out);
    vcrypto_digest_free(g->digest);
    g->digest = NULL;
    g->body_ticket = NULL;
}

int coord_guard_idle(const coord_guard *g) {
    return g->state == COORD_GUARD_DISCARD || (g->state == COORD_GUARD_IN_HEAD && g->head.len == 0);
}

/* The head that replaces a refused one: its request line when it had a
 * valid one (so the handler can log the path), an empty body, and the
 * marker. Connection: close makes libevent drop the connection after the
 * answer; the guard discards whatever follows meanwhile. */
static int emit_refusal(coord_guard *g, coord_guard_verdict v, size_t reqline_len, vl_buf *out) {
    int rc;
    if (reqline_len > 0) {
        rc = vl_buf_append(out, g->head.data, reqline_len);
        if (!rc) rc = vl_buf_append_str(out, "\r\n");
    } else {
        rc = vl_buf_append_str(out, "GET / HTTP/1.1\r\n");
    }
    if (!rc)
        rc = vl_buf_printf(out, "Content-Length: 0\r\nConnection: close\r\n%s: %s\r\n\r\n",
                           COORD_GUARD_HEADER, coord_guard_verdict_name(v));
    g->state = COORD_GUARD_DISCARD;
    g->last_verdict = v;
    return rc;
}

/* Copies the head without any client-sent reserved lines; with ticket > 0
 * the ticket header numbering it goes in before the closing empty line. */
static int emit_stripped(coord_guard *g, uint64_t ticket, vl_buf *out) {
    const uint8_t *p = g->head.data;
    size_t n = g->head.len, pos = 0;
    while (pos < n) {
        const uint8_t *lf = memchr(p + pos, '\n', n - pos);
        size_t adv = lf ? (size_t)(lf - (p + pos)) + 1 : n - pos;
        int last = pos + adv >= n;
        const uint8_t *colon = memchr(p + pos, ':', adv);
        int drop = pos > 0 && colon && name_reserved(p + pos, (size_t)(colon - (p + pos)));
        int rc = VL_OK;
        if (last && ticket > 0)
            rc = vl_buf_printf(out, "%s: %llu\r\n", COORD_GUARD_TICKET_HEADER,
                               (unsigned long long)ticket);
        if (!rc && !drop) rc = vl_buf_append(out, p + pos, adv);
        if (rc) return rc;
        pos += adv;
    }
    return VL_OK;
}

int coord_guard_head_field(const uint8_t *head, size_t len, const char *name, char *out,
                           size_t cap) {
    if (cap == 0) return VL_ETOOBIG;
    out[0] = '\0';
    size_t adv = 0, pos = 0, used = 0;
    int found = 0;
    if (line_at(head, len, &adv) < 0) return 0;
    pos = adv; /* past the request line */
    for (;;) {
        long l = line_at(head + pos, len - pos, &adv);
        if (l <= 0) break;
        const uint8_t *p = head + pos;
        pos += adv;
        const uint8_t *colon = memchr(p, ':', (size_t)l);
        if (!colon || !name_is(p, (size_t)(colon - p), name)) continue;
        const uint8_t *val = colon + 1;
        size_t vlen = (size_t)l - (size_t)(colon - p) - 1;
        while (vlen > 0 && (val[0] == ' ' || val[0] == '\t')) val++, vlen--;
        while (vlen > 0 && (val[vlen - 1] == ' ' || val[vlen - 1] == '\t')) vlen--;
        size_t sep = found ? 2 : 0;
        if (used + sep + vlen + 1 > cap) return VL_ETOOBIG;
        if (sep) memcpy(out + used, ", ", 2);
        memcpy(out + used + sep, val, vlen);
        used += sep + vlen;
        out[used] = '\0';
        found++;
    }
    return found;
}

int coord_guard_ticket_take(coord_guard *g, uint64_t seq, coord_guard_ticket *out) {
    coord_guard_ticket *t = &g->tickets[seq % COORD_GUARD_TICKETS];
    if (!t->live || t->seq != seq) return VL_ENOTFOUND;
    if (g->body_ticket == t) g->body_ticket = NULL;
    if (g->body_owner == t) g->body_owner = NULL;
    *out = *t;
    memset(t, 0, sizeof *t);
    return VL_OK;
}

static double now_s(const coord_guard *g) {
    return g->caps.clock ? g->caps.clock() : vl_clock_mono_s();
}

/* Starts hashing the body of an accepted request whose head named a
 * digest; a body of length 0 is judged at once. */
static int start_digest(coord_guard *g, coord_guard_ticket *t, uint64_t body_len) {
    if (t->want.alg == 0) return VL_OK;
    if (!g->digest) g->digest = vcrypto_digest_new(t->want.alg);
    if (!g->digest || vcrypto_digest_reset(g->digest, t->want.alg) != VL_OK) return VL_ENOMEM;
    t->digest = COORD_GUARD_DIGEST_PENDING;
    g->body_ticket = t;
    return VL_OK;
}

static void finish_digest(coord_guard *g) {
    coord_guard_ticket *t = g->body_ticket;
    if (!t) return;
    uint8_t got[VCRYPTO_DIGEST_MAX];
    size_t n = vcrypto_digest_final(g->digest, got);
    t->digest = n == t->want.len && vcrypto_equal(got, t->want.bytes, n)
                    ? COORD_GUARD_DIGEST_OK
                    : COORD_GUARD_DIGEST_MISMATCH;
    g->body_ticket = NULL;
}

/* Body bytes on their way to the parser. */
static void body_passed(coord_guard *g, const void *p, size_t n) {
    if (g->body_ticket && n > 0) vcrypto_digest_update(g->digest, p, n);
}

uint64_t coord_guard_body_arrived(const coord_guard *g) {
    return g->state == COORD_GUARD_IN_BODY ? g->body_len - g->body_left : 0;
}

/* Tells the owner how much of an accepted body has passed, once the
 * bytes are counted off body_left. */
static void body_progress(coord_guard *g) {
    if (g->body_owner && g->caps.progress)
        g->caps.progress(g->caps.authorize_arg, g->body_owner, g->body_len - g->body_left);
}

/* The body is complete: the next bytes start a head. */
static void body_done(coord_guard *g) {
    finish_digest(g);
    g->body_owner = NULL;
    g->state = COORD_GUARD_IN_HEAD;
}

/* The owner's verdict on a head that passed the guard's own checks:
 * COORD_GUARD_OK with *ticket set to its number, or a refusal. */
static coord_guard_verdict authorize_head(coord_guard *g, const coord_guard_head *h,
                                          uint64_t *ticket) {
    uint64_t seq = g->requests;
    coord_guard_ticket *t = &g->tickets[seq % COORD_GUARD_TICKETS];
    if (t->live) return COORD_GUARD_PIPELINED;
    coord_guard_ticket fresh;
    memset(&fresh, 0, sizeof fresh);
    memset(&g->refusal, 0, sizeof g->refusal);
    if (g->caps.authorize(g->caps.authorize_arg, g, g->head.data, g->head.len, &fresh,
                          &g->refusal) != 0)
        return COORD_GUARD_REFUSED;
    fresh.seq = seq;
    fresh.live = 1;
    fresh.digest = COORD_GUARD_DIGEST_NONE;
    *t = fresh;
    if (start_digest(g, t, h->body_len) != VL_OK) {
        memset(t, 0, sizeof *t);
        snprintf(g->refusal.code, sizeof g->refusal.code, "out_of_memory");
        snprintf(g->refusal.msg, sizeof g->refusal.msg, "no memory to check a body");
        g->refusal.status = 503;
        g->refusal.retry_after = 5;
        return COORD_GUARD_REFUSED;
    }
    if (h->body_len == 0) finish_digest(g);
    *ticket = seq;
    return COORD_GUARD_OK;
}

static int finish_head(coord_guard *g, vl_buf *out) {
    coord_guard_head h;
    coord_guard_parse_head(g->head.data, g->head.len, &g->caps, &h);
    g->requests++;
    uint64_t ticket = 0;
    if (h.verdict == COORD_GUARD_OK && g->caps.authorize)
        h.verdict = authorize_head(g, &h, &ticket);
    int rc;
    if (h.verdict != COORD_GUARD_OK) {
        rc = emit_refusal(g, h.verdict, h.reqline_len, out);
    } else {
        rc = h.has_marker || ticket > 0 ? emit_stripped(g, ticket, out)
                                        : vl_buf_append(out, g->head.data, g->head.len);
        g->body_left = h.body_len;
        g->body_len = h.body_len;
        g->body_started = g->window_start = now_s(g);
        g->window_bytes = 0;
        g->body_owner =
            ticket > 0 && h.body_len > 0 ? &g->tickets[ticket % COORD_GUARD_TICKETS] : NULL;
        if (h.body_len > 0 && g->caps.slow_timeout_s > 0)
            g->body_deadline =
                now_s(g) + g->caps.slow_timeout_s + (double)h.body_len / g->caps.min_body_rate;
        g->state = h.body_len > 0 ? COORD_GUARD_IN_BODY : COORD_GUARD_IN_HEAD;
        g->last_verdict = COORD_GUARD_OK;
    }
    vl_buf_reset(&g->head);
    g->line_start = 0;
    return rc;
}

/* Gives up on the head in progress with verdict v: keeps a complete
 * request line for the log, then refuses, since nothing after an
 * unparsed head can be framed. */
static int abandon_head(coord_guard *g, coord_guard_verdict v, vl_buf *out) {
    size_t reqline = 0;
    if (g->line_start > 0) {
        size_t adv;
        long l = line_at(g->head.data, g->head.len, &adv);
        int needs, no_body;
        if (l > 0 &&
            check_request_line(g->head.data, (size_t)l, &needs, &no_body) == COORD_GUARD_OK &&
            !memchr(g->head.data, '\r', (size_t)l))
            reqline = (size_t)l;
    }
    int rc = emit_refusal(g, v, reqline, out);
    vl_buf_reset(&g->head);
    g->line_start = 0;
    g->requests++;
    return rc;
}

size_t coord_guard_feed_head(coord_guard *g, const uint8_t *in, size_t n, vl_buf *out) {
    size_t i = 0;
    if (n > 0 && g->head.len == 0) g->head_started = now_s(g);
    while (i < n) {
        const uint8_t *lf = memchr(in + i, '\n', n - i);
        size_t seg = lf ? (size_t)(lf - (in + i)) + 1 : n - i;
        if (g->head.len + seg > g->head_cap) {
            if (abandon_head(g, COORD_GUARD_HEAD_TOO_LARGE, out) != VL_OK)
                g->state = COORD_GUARD_DISCARD;
            return n;
        }
        if (vl_buf_append(&g->head, in + i, seg) != VL_OK) {
            g->state = COORD_GUARD_DISCARD;
            return n;
        }
        i += seg;
        if (lf) {
            size_t ll = g->head.len - g->line_start;
            int empty = ll == 1 || (ll == 2 && g->head.data[g->line_start] == '\r');
            if (empty) {
                if (finish_head(g, out) != VL_OK) g->state = COORD_GUARD_DISCARD;
                return i;
            }
            g->line_start = g->head.len;
        }
    }
    return i;
}

int coord_guard_feed(coord_guard *g, const uint8_t *in, size_t n, vl_buf *out) {
    size_t i = 0;
    while (i < n) {
        switch (g->state) {
        case COORD_GUARD_DISCARD: return VL_OK;
        case COORD_GUARD_IN_BODY: {
            size_t take = n - i;
            if ((uint64_t)take > g->body_left) take = (size_t)g->body_left;
            int rc = vl_buf_append(out, in + i, take);
            if (rc) return rc;
            body_passed(g, in + i, take);
            i += take;
            g->body_left -= take;
            body_progress(g);
            if (g->body_left == 0) body_done(g);
            break;
        }
        case COORD_GUARD_IN_HEAD: i += coord_guard_feed_head(g, in + i, n - i, out); break;
        }
    }
    return VL_OK;
}

/* ---- slow clients -------------------------------------------------------- */

coord_guard_verdict coord_guard_check_time(const coord_guard *g, double now) {
    if (g->caps.slow_timeout_s <= 0) return COORD_GUARD_OK;
    if (g->state == COORD_GUARD_IN_HEAD && g->head.len > 0 &&
        now - g->head_started > g->caps.slow_timeout_s)
        return COORD_GUARD_HEAD_TIMEOUT;
    if (g->state != COORD_GUARD_IN_BODY) return COORD_GUARD_OK;
    if (now > g->body_deadline) return COORD_GUARD_BODY_TIMEOUT;
    double w = g->caps.body_window_s;
    if (w > 0 && now - g->window_start >= w &&
        (double)(coord_guard_body_arrived(g) - g->window_bytes) <
            g->caps.min_body_rate * (now - g->window_start))
        return COORD_GUARD_BODY_TIMEOUT;
    return COORD_GUARD_OK;
}

void coord_guard_advance_window(coord_guard *g, double now) {
    double w = g->caps.body_window_s;
    if (g->state != COORD_GUARD_IN_BODY || w <= 0 || now - g->window_start < w) return;
    if (coord_guard_check_time(g, now) != COORD_GUARD_OK) return;
    g->window_start = now;
    g->window_bytes = coord_guard_body_arrived(g);
}

int coord_guard_expire_head(coord_guard *g, vl_buf *out) {
    if (g->state != COORD_GUARD_IN_HEAD) return VL_EINVAL;
    return abandon_head(g, COORD_GUARD_HEAD_TIMEOUT, out);
}

/* ---- the bufferevent hook ------------------------------------------------ */

/* Runs on every change of the connection's input buffer, synchronously,
 * before the HTTP parser's read callback. Everything already in the
 * buffer was passed by an earlier call, and new bytes only ever arrive at
 * the end, so the newest n_added bytes are the ones to judge: they are
 * taken out and what the guard lets through is put back in their place. */
static void guard_input(struct evbuffer *input, const struct evbuffer_cb_info *info, void *arg) {
    coord_guard *g = arg;
    if (g->in_callback || info->n_added == 0) return;
    g->in_callback = 1; /* our own edits below re-enter here */
    struct evbuffer *fresh = g->scratch;
    size_t len = evbuffer_get_length(input);
    size_t added = info->n_added < len ? info->n_added : len;
    evbuffer_remove_buffer(input, fresh, len);
    evbuffer_remove_buffer(fresh, input, len - added);
    while (evbuffer_get_length(fresh) > 0) {
        if (g->state == COORD_GUARD_DISCARD) {
            evbuffer_drain(fresh, evbuffer_get_length(fresh));
            break;
        }
        if (g->state == COORD_GUARD_IN_BODY) {
            size_t take = evbuffer_get_length(fresh);
            if ((uint64_t)take > g->body_left) take = (size_t)g->body_left;
            /* Hashed chunk by chunk as it is moved on, without a copy. */
            if (g->body_ticket) {
                struct evbuffer_iovec v;
                if (evbuffer_peek(fresh, -1, NULL, &v, 1) < 1 || v.iov_len == 0) {
                    g->state = COORD_GUARD_DISCARD;
                    continue;
                }
                if (v.iov_len < take) take = v.iov_len;
                body_passed(g, v.iov_base, take);
            }
            int moved = evbuffer_remove_buffer(fresh, input, take);
            if (moved <= 0) {
                g->state = COORD_GUARD_DISCARD;
                continue;
            }
            g->body_left -= (uint64_t)moved;
            body_progress(g);
            if (g->body_left == 0) body_done(g);
            continue;
        }
        struct evbuffer_iovec v;
        if (evbuffer_peek(fresh, -1, NULL, &v, 1) < 1 || v.iov_len == 0) {
            g->state = COORD_GUARD_DISCARD;
            continue;
        }
        size_t used = coord_guard_feed_head(g, v.iov_base, v.iov_len, &g->out);
        evbuffer_drain(fresh, used);
        if (g->state == COORD_GUARD_DISCARD && g->linger_fd < 0 && g->bev) {
            evutil_socket_t fd = bufferevent_getfd(g->bev);
            if (fd >= 0) g->linger_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        }
        if (g->out.len > 0) {
            if (evbuffer_add(input, g->out.data, g->out.len) != 0) g->state = COORD_GUARD_DISCARD;
            vl_buf_reset(&g->out);
        }
    }
    g->in_callback = 0;
}

int coord_guard_attach(coord_guard *g, struct bufferevent *bev) {
    g->scratch = evbuffer_new();
    if (!g->scratch) return VL_ENOMEM;
    g->bev = bev;
    g->input = bufferevent_get_input(bev);
    g->hook = evbuffer_add_cb(g->input, guard_input, g);
    if (!g->hook) {
        evbuffer_free(g->scratch);
        g->scratch = NULL;
        g->input = NULL;
        return VL_ENOMEM;
    }
    return VL_OK;
}

void coord_guard_detach(coord_guard *g) {
    if (g->hook) evbuffer_remove_cb_entry(g->input, g->hook);
    if (g->scratch) evbuffer_free(g->scratch);
    if (g->linger_fd >= 0) close(g->linger_fd);
    g->linger_fd = -1;
    g->hook = NULL;
    g->scratch = NULL;
    g->input = NULL;
    g->bev = NULL;
}

/* Ends the connection from below libevent: it reads end-of-file and drops
 * the connection as it does for a client that went away. */
void coord_guard_shut_down(coord_guard *g) {
    g->state = COORD_GUARD_DISCARD;
    evutil_socket_t fd = g->bev ? bufferevent_getfd(g->bev) : -1;
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
}

coord_guard_verdict coord_guard_enforce_time(coord_guard *g, double now) {
    coord_guard_verdict v = coord_guard_check_time(g, now);
    if (v == COORD_GUARD_OK) coord_guard_advance_window(g, now);
    if (v == COORD_GUARD_OK || !g->bev) return v;
    bufferevent_data_cb readcb = NULL;
    bufferevent_getcb(g->bev, &readcb, NULL, NULL, NULL);
    /* evhttp reads with EV_READ enabled and its read callback set only
     * while it waits for request bytes; while a handler has the previous
     * request it disables reading, and while it writes it unsets the
     * callback. Running its parser at any other time aborts the process. */
    int parser_waiting = readcb && (bufferevent_get_enabled(g->bev) & EV_READ);
    if (v == COORD_GUARD_BODY_TIMEOUT || !parser_waiting) {
        coord_guard_shut_down(g);
        return v;
    }
    g->in_callback = 1; /* our own edit of the input must not re-enter */
    int rc = coord_guard_expire_head(g, &g->out);
    if (rc == VL_OK && evbuffer_add(g->input, g->out.data, g->out.len) != 0) rc = VL_ENOMEM;
    vl_buf_reset(&g->out);
    g->in_callback = 0;
    if (rc != VL_OK) {
        coord_guard_shut_down(g);
        return v;
    }
    if (g->linger_fd < 0) {
        evutil_socket_t fd = bufferevent_getfd(g->bev);
        if (fd >= 0) g->linger_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    }
    bufferevent_trigger(g->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS);
    return v;
}
