/* The nonce journal (nonce_log.h): appends, the once-a-second flush, the
 * rotation once the old file holds nothing live, and reading it back on
 * start. */
#include "coordinator/conn/nonce_log.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "crypto/crypto.h"

/* Pending appends past this are written at once rather than at the tick. */
#define NONCE_LOG_PENDING_MAX ((size_t)1 << 20)
/* A journal file read back is at most this large (a window of requests
 * at a few thousand a second is a few tens of MB). */
#define NONCE_LOG_READ_MAX ((size_t)1 << 28)

struct coord_nonce_log {
    char path[4096], old_path[4096], dir[4096];
    int fd;
    vl_buf pending;
    int64_t started; /* when the current file began (unix s) */
    int64_t window;
    /* The latest timestamp in each file (0: none). A nonce is live until
     * its own timestamp plus the window, and a timestamp may be up to a
     * window ahead of the clock, so a file is dropped only once this has
     * passed, however many windows that takes. */
    int64_t cur_latest, old_latest;
    struct event *timer;
};

static int open_current(coord_nonce_log *l, vl_error *err) {
    l->fd = open(l->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (l->fd < 0)
        return vl_fail(err, VL_EIO, "cannot open the nonce journal %s: %s", l->path,
                       strerror(errno));
    if (fchmod(l->fd, 0600) != 0)
        return vl_fail(err, VL_EIO, "cannot set the mode of %s: %s", l->path, strerror(errno));
    return vl_file_sync_dir(l->dir, err);
}

static int is_hex(const char *s, size_t max) {
    size_t n = 0;
    for (; s[n]; n++)
        if (n >= max || !((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f'))) return 0;
    return n > 0;
}

/* Whether a nonce of timestamp ts can still be accepted at now: the
 * coordinator takes a created as late as now - window. */
static int live(int64_t ts, int64_t now, int64_t window) {
    return ts >= now - window;
}

/* Loads the entries of one journal file still live into the cache, and
 * copies their lines to keep (*latest: the latest timestamp kept). A
 * missing file holds none. */
static int load_file(const char *path, struct vcrypto_nonce_cache *cache, int64_t now,
                     int64_t window, vl_buf *keep, size_t *loaded, int64_t *latest, vl_error *err) {
    vl_buf b;
    vl_buf_init(&b, NONCE_LOG_READ_MAX);
    vl_error re = {0};
    if (access(path, F_OK) != 0) return VL_OK;
    int rc = vl_buf_read_file(&b, path, &re);
    if (rc != VL_OK) {
        vl_buf_free(&b);
        return vl_fail(err, rc, "cannot read the nonce journal: %s", re.msg);
    }
    char *line = (char *)b.data;
    char *end = line + b.len;
    while (rc == VL_OK && line < end) {
        char *nl = memchr(line, '\n', (size_t)(end - line));
        if (!nl) break; /* a torn last line */
        *nl = '\0';
        long long peer, ts;
        char nonce[VCRYPTO_NONCE_HEX + 2];
        int n = 0;
        if (sscanf(line, "%lld %lld %33s%n", &peer, &ts, nonce, &n) == 3 && line[n] == '\0' &&
            is_hex(nonce, VCRYPTO_NONCE_HEX) && live(ts, now, window) && ts <= now + window) {
            int c = vcrypto_nonce_check(cache, (int64_t)peer, nonce, (int64_t)ts, now);
            if (c == VL_OK) {
                (*loaded)++;
                if (ts > *latest) *latest = ts;
                *nl = '\n';
                rc = vl_buf_append(keep, line, (size_t)(nl - line) + 1);
            } else if (c == VL_ETOOBIG) {
                vl_log_warn("nonce journal: the replay cache is full; older entries not loaded");
                break;
            }
        }
        line = nl + 1;
    }
    vl_buf_free(&b);
    if (rc != VL_OK) return vl_fail(err, rc, "out of memory reading the nonce journal");
    return VL_OK;
}

static void tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    vl_error e = {0};
    if (coord_nonce_log_flush(arg, &e) != VL_OK) vl_log_warn("nonce journal: %s", e.msg);
}

int coord_nonce_log_open(const char *db_path, struct vcrypto_nonce_cache *cache,
                         struct event_base *base, coord_nonce_log **out, vl_error *err) {
    return coord_nonce_log_open_at(db_path, cache, base, vl_clock_unix_s(), out, err);
}

int coord_nonce_log_open_at(const char *db_path, struct vcrypto_nonce_cache *cache,
                            struct event_base *base, int64_t now, coord_nonce_log **out,
                            vl_error *err) {
    *out = NULL;
    coord_nonce_log *l = calloc(1, sizeof *l);
    if (!l) return vl_fail(err, VL_ENOMEM, "out of memory");
    l->fd = -1;
    l->window = VCRYPTO_TS_WINDOW_S;
    vl_buf_init(&l->pending, NONCE_LOG_PENDING_MAX * 2);
    char copy[sizeof l->dir];
    int n1 = snprintf(l->path, sizeof l->path, "%s-nonces", db_path);
    int n2 = snprintf(l->old_path, sizeof l->old_path, "%s-nonces.old", db_path);
    int n3 = snprintf(copy, sizeof copy, "%s", db_path);
    if (n1 < 0 || n2 < 0 || n3 < 0 || (size_t)n2 >= sizeof l->old_path ||
        (size_t)n3 >= sizeof copy) {
        free(l);
        return vl_fail(err, VL_EINVAL, "database path too long for its nonce journal");
    }
    snprintf(l->dir, sizeof l->dir, "%s", dirname(copy));
    vl_buf keep;
    vl_buf_init(&keep, NONCE_LOG_READ_MAX);
    size_t loaded = 0;
    int rc = load_file(l->old_path, cache, now, l->window, &keep, &loaded, &l->cur_latest, err);
    if (rc == VL_OK)
        rc = load_file(l->path, cache, now, l->window, &keep, &loaded, &l->cur_latest, err);
    /* One file with all that is live, then appends to it; the old one goes. */
    if (rc == VL_OK)
        rc = vl_file_write_atomic(l->path, keep.data ? keep.data : (uint8_t *)"", keep.len, 0600,
                                  err);
    vl_buf_free(&keep);
    if (rc == VL_OK && unlink(l->old_path) != 0 && errno != ENOENT)
        rc = vl_fail(err, VL_EIO, "cannot remove %s: %s", l->old_path, strerror(errno));
    if (rc == VL_OK) rc = open_current(l, err);
    l->started = now;
    if (rc == VL_OK && base) {
        l->timer = event_new(base, -1, EV_PERSIST, tick, l);
        struct timeval tv = {1, 0};
        if (!l->timer || event_add(l->timer, &tv) != 0)
            rc = vl_fail(err, VL_ENOMEM, "cannot start the nonce journal's timer");
    }
    if (rc != VL_OK) {
        coord_nonce_log_close(l);
        return rc;
    }
    if (loaded)
        vl_log_info("nonce journal: %zu nonces of the last %lld s remembered (each until its "
                    "created + %lld s)",
                    loaded, (long long)(2 * l->window), (long long)l->window);
    *out = l;
    return VL_OK;
}

void coord_nonce_log_add(coord_nonce_log *l, int64_t peer_id, const char *nonce, int64_t ts) {
    if (!l || !is_hex(nonce, VCRYPTO_NONCE_HEX)) return;
    if (vl_buf_printf(&l->pending, "%lld %lld %s\n", (long long)peer_id, (long long)ts, nonce) !=
        VL_OK)
        vl_log_warn("nonce journal: a nonce could not be noted (the journal is behind)");
    else if (ts > l->cur_latest)
        l->cur_latest = ts; /* pending is written to the current file */
    if (l->pending.len >= NONCE_LOG_PENDING_MAX) {
        vl_error e = {0};
        if (coord_nonce_log_flush(l, &e) != VL_OK) vl_log_warn("nonce journal: %s", e.msg);
    }
}

/* The current file becomes the old one, replacing a file none of whose
 * nonces is live any more, and a new one starts. */
static int rotate(coord_nonce_log *l, int64_t now, vl_error *err) {
    close(l->fd);
    l->fd = -1;
    if (rename(l->path, l->old_path) != 0)
        return vl_fail(err, VL_EIO, "cannot rotate %s: %s", l->path, strerror(errno));
    l->old_latest = l->cur_latest;
    l->cur_latest = 0;
    l->started = now;
    return open_current(l, err);
}

int coord_nonce_log_flush(coord_nonce_log *l, vl_error *err) {
    return coord_nonce_log_flush_at(l, vl_clock_unix_s(), err);
}

int coord_nonce_log_flush_at(coord_nonce_log *l, int64_t now, vl_error *err) {
    if (!l) return VL_OK;
    if (l->fd < 0) {
        int rc = open_current(l, err);
        if (rc != VL_OK) return rc;
    }
    size_t done = 0;
    while (done < l->pending.len) {
        ssize_t w = write(l->fd, l->pending.data + done, l->pending.len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return vl_fail(err, VL_EIO, "cannot write %s: %s", l->path,
                           w < 0 ? strerror(errno) : "no progress");
        done += (size_t)w;
    }
    if (done && fdatasync(l->fd) != 0)
        return vl_fail(err, VL_EIO, "cannot sync %s: %s", l->path, strerror(errno));
    vl_buf_reset(&l->pending);
    /* A window after the current file began, and once the old file's
     * latest nonce can no longer pass (a timestamp up to a window ahead
     * keeps it up to two windows): so the current file holds at most
     * about two windows of appends. */
    if (now - l->started >= l->window &&
        (l->old_latest == 0 || !live(l->old_latest, now, l->window)))
        return rotate(l, now, err);
    return VL_OK;
}

void coord_nonce_log_close(coord_nonce_log *l) {
    if (!l) return;
    vl_error e = {0};
    if (l->pending.len && coord_nonce_log_flush(l, &e) != VL_OK)
        vl_log_warn("nonce journal: %s", e.msg);
    if (l->timer) event_free(l->timer);
    if (l->fd >= 0) close(l->fd);
    vl_buf_free(&l->pending);
    free(l);
}
