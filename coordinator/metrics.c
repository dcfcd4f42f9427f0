/* The coordinator's metrics and the admin listener that serves them and
 * the dashboard.
 * Counting happens on the event loop, where every answer and every
 * committed version passes; the rest is read when a scrape asks, so an
 * idle coordinator pays nothing for being watched. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "coordinator/coord.h"
#include "coordinator/dashboard.h"
#include "crypto/crypto.h"

static const double MERGE_LE[COORD_METRICS_MERGE_BUCKETS] = {0.01, 0.05, 0.1, 0.25, 0.5,
                                                             1,    2.5,  5,   10,   30};

void coord_metrics_request(coord_metrics *m, int route, int status, size_t in, size_t out) {
    if (route < 0 || route >= COORD_METRICS_ROUTES) route = COORD_METRICS_ROUTES - 1;
    int cls = status / 100 - 1;
    if (cls < 0 || cls > 4) cls = 4;
    m->requests[route][cls]++;
    m->bytes_in[route] += in;
    m->bytes_out[route] += out;
}

void coord_metrics_upload(coord_metrics *m, int status, const char *code) {
    if (status >= 200 && status < 300) {
        m->uploads_accepted++;
        return;
    }
    if (!code || !*code) code = "none";
    size_t i = 0;
    while (i < m->n_refused && strcmp(m->refused[i].code, code) != 0) i++;
    if (i == m->n_refused) {
        /* A bounded table: codes are the coordinator's own, but a cap
         * keeps any future one from growing it. */
        if (m->n_refused == COORD_METRICS_CODES) {
            i = COORD_METRICS_CODES - 1;
            snprintf(m->refused[i].code, sizeof m->refused[i].code, "other");
        } else {
            snprintf(m->refused[i].code, sizeof m->refused[i].code, "%s", code);
            m->n_refused++;
        }
    }
    m->refused[i].n++;
}

/* The index of peer_id in the table, or where it would go (-1 - index). */
static long peer_index(const coord_metrics *m, int64_t peer_id) {
    size_t lo = 0, hi = m->n_peers;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->peers[mid].id == peer_id) return (long)mid;
        if (m->peers[mid].id < peer_id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1 - (long)lo;
}

static coord_metrics_peer *peer_entry(coord_metrics *m, int64_t peer_id) {
    long i = peer_index(m, peer_id);
    if (i >= 0) return &m->peers[i];
    if (m->n_peers == COORD_METRICS_PEERS) {
        /* Full: the peer heard from longest ago makes room, so the table
         * holds the peers that are around now. */
        size_t old = 0;
        for (size_t k = 1; k < m->n_peers; k++)
            if (m->peers[k].seen < m->peers[old].seen) old = k;
        memmove(&m->peers[old], &m->peers[old + 1], (m->n_peers - old - 1) * sizeof m->peers[0]);
        m->n_peers--;
        i = peer_index(m, peer_id);
    }
    size_t at = (size_t)(-1 - i);
    memmove(&m->peers[at + 1], &m->peers[at], (m->n_peers - at) * sizeof m->peers[0]);
    m->n_peers++;
    memset(&m->peers[at], 0, sizeof m->peers[at]);
    m->peers[at].id = peer_id;
    return &m->peers[at];
}

const char *coord_request_addr(struct evhttp_request *req) {
    struct evhttp_connection *c = req ? evhttp_request_get_connection(req) : NULL;
    if (!c) return NULL;
    char *addr = NULL;
    ev_uint16_t port = 0;
    evhttp_connection_get_peer(c, &addr, &port);
    return addr;
}

const coord_metrics_peer *coord_metrics_peer_find(const coord_metrics *m, int64_t peer_id) {
    long i = peer_index(m, peer_id);
    return i >= 0 ? &m->peers[i] : NULL;
}

void coord_metrics_answer(coord_metrics *m, int route, int status, const char *code,
                          int64_t peer_id, const char *addr, size_t in, int64_t now) {
    if (!code) code = "";
    if (!addr) addr = "";
    int refused = status >= 400;
    int upload = route >= 0 && route < COORD_METRICS_ROUTES &&
                 strcmp(coord_route_label(route), "/v1/updates") == 0;
    if (upload) {
        int64_t minute = now / 60;
        coord_metrics_minute *mm = &m->minutes[minute % COORD_METRICS_MINUTES];
        if (mm->minute != minute) {
            memset(mm, 0, sizeof *mm);
            mm->minute = minute;
        }
        if (status >= 200 && status < 300)
            mm->accepted++;
        else if (refused)
            mm->refused++;
        mm->bytes += in;
    }
    if (peer_id > 0) {
        coord_metrics_peer *p = peer_entry(m, peer_id);
        p->seen = now;
        if (*addr) snprintf(p->addr, sizeof p->addr, "%s", addr);
        if (upload && refused) p->refused++;
    }
    if (refused) {
        coord_metrics_refusal *r = &m->recent[m->n_recent % COORD_METRICS_RECENT];
        m->n_recent++;
        r->at = now;
        r->peer_id = peer_id;
        r->route = route;
        r->status = status;
        snprintf(r->code, sizeof r->code, "%s", code);
        snprintf(r->addr, sizeof r->addr, "%s", addr);
    }
}

void coord_metrics_version(coord_metrics *m, double seconds, double train_loss) {
    size_t b = 0;
    while (b < COORD_METRICS_MERGE_BUCKETS && seconds > MERGE_LE[b]) b++;
    if (b < COORD_METRICS_MERGE_BUCKETS) m->merge_buckets[b]++;
    m->merge_count++;
    m->merge_sum += seconds;
    m->train_loss = train_loss;
}

/* ---- exposition ------------------------------------------------------------ */

static void head(struct evbuffer *b, const char *name, const char *type, const char *help) {
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(struct evbuffer *b, const char *name, const char *help, double v) {
    head(b, name, "gauge", help);
    if (isnan(v))
        evbuffer_add_printf(b, "%s NaN\n", name);
    else
        evbuffer_add_printf(b, "%s %.17g\n", name, v);
}

/* A histogram whose per-bucket counts (not cumulative) were kept at fixed
 * bounds le (n_le of them); total is its count, the +Inf bucket. */
static void hist_fixed(struct evbuffer *b, const char *name, const char *help, const double *le,
                       const uint64_t *counts, size_t n_le, uint64_t total, double sum) {
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < n_le; i++) {
        cum += counts[i];
        evbuffer_add_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, le[i], (unsigned long long)cum);
    }
    evbuffer_add_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name,
                        (unsigned long long)total, name, sum, name, (unsigned long long)total);
}

/* A histogram over whole numbers from the database (value, count pairs),
 * bucketed at the bounds in le (ascending), plus +Inf. */
typedef struct int_hist {
    const int64_t *le;
    size_t n_le;
    uint64_t counts[16]; /* per bucket, not cumulative; [n_le] is +Inf */
    uint64_t total;
    double sum;
} int_hist;

static int hist_add(void *arg, int64_t value, int64_t count) {
    int_hist *h = arg;
    size_t b = 0;
    while (b < h->n_le && value > h->le[b]) b++;
    h->counts[b] += (uint64_t)count;
    h->total += (uint64_t)count;
    h->sum += (double)value * (double)count;
    return VL_OK;
}

static void hist_write(struct evbuffer *b, const char *name, const char *help, const int_hist *h) {
    double le[16];
    for (size_t i = 0; i < h->n_le; i++) le[i] = (double)h->le[i];
    hist_fixed(b, name, help, le, h->counts, h->n_le, h->total, h->sum);
}

typedef struct peer_counts {
    int64_t now, lease_s;
    uint64_t active, idle, gone, revoked;
} peer_counts;

static int count_peer(void *arg, const storage_peer_activity *a) {
    peer_counts *c = arg;
    const char *s = coord_peer_state(a, c->now, c->lease_s);
    if (!strcmp(s, "active"))
        c->active++;
    else if (!strcmp(s, "idle"))
        c->idle++;
    else if (!strcmp(s, "gone"))
        c->gone++;
    else
        c->revoked++;
    return VL_OK;
}

static double file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (double)st.st_size : 0.0;
}

/* The regular files directly in dir (the body store's segments). */
static double dir_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0.0;
    double total = 0;
    char path[COORD_PATH_MAX + 300];
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) total += (double)st.st_size;
    }
    closedir(d);
    return total;
}

int coord_metrics_write(coord_server *srv, struct evbuffer *b, vl_error *err) {
    const coord_metrics *m = &srv->metrics;
    head(b, "volley_requests_total", "counter",
         "Requests answered on the public port, by route and status class.");
    for (int r = 0; r < COORD_METRICS_ROUTES; r++)
        for (int c = 0; c < 5; c++)
            if (m->requests[r][c])
                evbuffer_add_printf(b, "volley_requests_total{route=\"%s\",class=\"%dxx\"} %llu\n",
                                    coord_route_label(r), c + 1,
                                    (unsigned long long)m->requests[r][c]);
    head(b, "volley_received_bytes_total", "counter", "Request body bytes received, by route.");
    for (int r = 0; r < COORD_METRICS_ROUTES; r++)
        if (m->bytes_in[r])
            evbuffer_add_printf(b, "volley_received_bytes_total{route=\"%s\"} %llu\n",
                                coord_route_label(r), (unsigned long long)m->bytes_in[r]);
    head(b, "volley_sent_bytes_total", "counter", "Response body bytes sent, by route.");
    for (int r = 0; r < COORD_METRICS_ROUTES; r++)
        if (m->bytes_out[r])
            evbuffer_add_printf(b, "volley_sent_bytes_total{route=\"%s\"} %llu\n",
                                coord_route_label(r), (unsigned long long)m->bytes_out[r]);
    head(b, "volley_uploads_total", "counter",
         "Uploads answered: accepted, or refused with their error code.");
    evbuffer_add_printf(b, "volley_uploads_total{result=\"accepted\",code=\"\"} %llu\n",
                        (unsigned long long)m->uploads_accepted);
    for (size_t i = 0; i < m->n_refused; i++)
        evbuffer_add_printf(b, "volley_uploads_total{result=\"refused\",code=\"%s\"} %llu\n",
                            m->refused[i].code, (unsigned long long)m->refused[i].n);
    gauge(b, "volley_requests_in_flight", "Requests handed to a handler and not yet answered.",
          (double)srv->inflight);
    gauge(b, "volley_connections", "Open connections on the public port.", (double)srv->n_conns);
    gauge(b, "volley_version", "The current model version.", (double)srv->version);
    gauge(b, "volley_max_versions", "The run's last version.", (double)srv->cfg.max_versions);
    gauge(b, "volley_run_finished", "1 once the run reached its last version.",
          srv->finished ? 1.0 : 0.0);
    gauge(b, "volley_validation_loss", "The current version's validation loss (nats).",
          srv->val_loss);
    gauge(b, "volley_training_loss",
          "The last version's mean training loss over its updates (nats).", m->train_loss);
    hist_fixed(b, "volley_version_seconds",
               "Time to make a version: merge, outer step and validation.", MERGE_LE,
               m->merge_buckets, COORD_METRICS_MERGE_BUCKETS, m->merge_count, m->merge_sum);
    /* From the database: what every stored update recorded. */
    static const int64_t STALE_LE[] = {0, 1, 2, 4, 8, 16, 32, 64};
    static const int64_t STEPS_LE[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000};
    int_hist stale = {.le = STALE_LE, .n_le = sizeof STALE_LE / sizeof STALE_LE[0]};
    int_hist steps = {.le = STEPS_LE, .n_le = sizeof STEPS_LE / sizeof STEPS_LE[0]};
    peer_counts pc = {.now = vl_clock_unix_s(), .lease_s = srv->cfg.lease_s};
    int64_t unmerged = 0;
    int rc = storage_update_histogram(srv->db, STORAGE_HIST_STALENESS, hist_add, &stale, err);
    if (rc == VL_OK)
        rc = storage_update_histogram(srv->db, STORAGE_HIST_LOCAL_STEPS, hist_add, &steps, err);
    if (rc == VL_OK) rc = storage_peer_each(srv->db, pc.now, count_peer, &pc, err);
    if (rc == VL_OK) rc = storage_update_count_unmerged(srv->db, &unmerged, err);
    if (rc != VL_OK) return rc;
    hist_write(b, "volley_staleness", "Staleness of the stored updates (versions).", &stale);
    hist_write(b, "volley_local_steps", "Local steps of the stored updates.", &steps);
    head(b, "volley_peers", "gauge", "Peers by state (active, idle, gone, revoked).");
    evbuffer_add_printf(b,
                        "volley_peers{state=\"active\"} %llu\nvolley_peers{state=\"idle\"} %llu\n"
                        "volley_peers{state=\"gone\"} %llu\nvolley_peers{state=\"revoked\"} %llu\n",
                        (unsigned long long)pc.active, (unsigned long long)pc.idle,
                        (unsigned long long)pc.gone, (unsigned long long)pc.revoked);
    gauge(b, "volley_updates_unmerged", "Stored updates waiting for a version.", (double)unmerged);
    coord_writer_stats ws;
    coord_writer_stats_get(srv->writer, &ws);
    head(b, "volley_writer_jobs_total", "counter", "Jobs the database writer ran.");
    evbuffer_add_printf(b, "volley_writer_jobs_total %llu\n", (unsigned long long)ws.jobs);
    head(b, "volley_writer_commits_total", "counter", "Transactions the writer committed.");
    evbuffer_add_printf(b, "volley_writer_commits_total %llu\n", (unsigned long long)ws.commits);
    head(b, "volley_writer_failed_total", "counter", "Writer jobs that failed.");
    evbuffer_add_printf(b, "volley_writer_failed_total %llu\n", (unsigned long long)ws.failed);
    gauge(b, "volley_writer_max_batch", "The most jobs one commit has carried.",
          (double)ws.max_batch);
    /* The disk's state as the log reports it (schedule.h): for an alert
     * on a full disk before the peers notice. */
    gauge(b, "volley_disk_full", "1 while the disk is full as the coordinator last found it.",
          (double)srv->disk.full);
    head(b, "volley_disk_full_reports_total", "counter", "Times the disk was found full.");
    evbuffer_add_printf(b, "volley_disk_full_reports_total %lld\n", (long long)srv->disk.reports);
    head(b, "volley_merge_room_retries_total", "counter",
         "Merges retried because the disk had no room.");
    evbuffer_add_printf(b, "volley_merge_room_retries_total %lld\n", (long long)srv->disk.retries);
    /* The writer's histograms, copied under its lock with the counters
     * above, so a scrape sees one consistent moment of that thread. */
    uint64_t batches = 0;
    for (size_t i = 0; i <= COORD_WRITER_BATCH_BUCKETS; i++) batches += ws.batch_hist[i];
    hist_fixed(b, "volley_writer_batch_size", "Jobs per database transaction (group commit).",
               coord_writer_batch_le, ws.batch_hist, COORD_WRITER_BATCH_BUCKETS, batches,
               (double)ws.jobs);
    hist_fixed(b, "volley_writer_commit_seconds",
               "Time a commit took, the fsyncs of the update bodies and the WAL included.",
               coord_writer_commit_le, ws.commit_hist, COORD_WRITER_COMMIT_BUCKETS, ws.commits,
               ws.commit_seconds);
    char path[COORD_PATH_MAX + 16];
    head(b, "volley_database_bytes", "gauge", "Size of the SQLite database and its WAL.");
    snprintf(path, sizeof path, "%s", srv->db_path);
    evbuffer_add_printf(b, "volley_database_bytes{file=\"db\"} %.0f\n", file_bytes(path));
    snprintf(path, sizeof path, "%s-wal", srv->db_path);
    evbuffer_add_printf(b, "volley_database_bytes{file=\"wal\"} %.0f\n", file_bytes(path));
    snprintf(path, sizeof path, "%s-bodies", srv->db_path);
    gauge(b, "volley_body_store_bytes", "Size of the stored update bodies' segments.",
          dir_bytes(path));
    return VL_OK;
}

/* ---- the admin listener -------------------------------------------------- */

static void admin_error(struct evhttp_request *req, int status, const char *code, const char *msg) {
    struct evbuffer *b = evbuffer_new();
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    if (b) evbuffer_add_printf(b, "{\"error\":{\"code\":\"%s\",\"message\":\"%s\"}}", code, msg);
    evhttp_send_reply(req, status, code, b);
    if (b) evbuffer_free(b);
}

/* Whether secret is the token, in time that does not depend on where they
 * differ. */
static int token_matches(const coord_server *srv, const char *secret, size_t len) {
    size_t tl = strlen(srv->admin_token);
    return len == tl && crypto_equal(secret, srv->admin_token, tl);
}

/* The token as a bearer token (scrapers, curl), or as the password of
 * Basic credentials (any user name): a browser asks its user for those
 * when a 401 offers Basic, then sends them with every request to the
 * listener, the page's polls included. */
static int authorised(const coord_server *srv, const char *auth) {
    if (!auth) return 0;
    if (strncmp(auth, "Bearer ", 7) == 0) return token_matches(srv, auth + 7, strlen(auth + 7));
    if (strncmp(auth, "Basic ", 6) != 0) return 0;
    const char *b64 = auth + 6;
    size_t n = strlen(b64);
    /* A user name and a token of at most sizeof admin_token fit in far
     * less; anything longer is refused before decoding. */
    char plain[512];
    if (n > 4 * (sizeof plain / 3)) return 0;
    long len = vl_base64_decode(b64, n, (uint8_t *)plain, sizeof plain - 1);
    if (len < 0) return 0;
    const char *colon = memchr(plain, ':', (size_t)len);
    if (!colon) return 0;
    size_t off = (size_t)(colon + 1 - plain);
    return token_matches(srv, colon + 1, (size_t)len - off);
}

static void send_page(struct evhttp_request *req) {
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", "text/html; charset=utf-8");
    /* The page is self-contained: it may talk only to this listener and
     * load nothing from anywhere. */
    evhttp_add_header(h, "Content-Security-Policy",
                      "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                      "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
                      "frame-ancestors 'none'");
    evhttp_add_header(h, "Referrer-Policy", "no-referrer");
    struct evbuffer *b = evbuffer_new();
    if (!b || evbuffer_add_reference(b, coord_dashboard_html, coord_dashboard_html_len, NULL,
                                     NULL) != 0) {
        if (b) evbuffer_free(b);
        admin_error(req, 500, "internal", "out of memory");
        return;
    }
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static void send_summary(coord_server *srv, struct evhttp_request *req) {
    vl_error e = {0};
    json_t *o = coord_dashboard_json(srv, &e);
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    struct evbuffer *b = text ? evbuffer_new() : NULL;
    if (!b) {
        free(text);
        vl_log_error("GET /dashboard.json: %s", e.msg[0] ? e.msg : "out of memory");
        admin_error(req, 500, "internal", "the dashboard's figures could not be read");
        return;
    }
    evbuffer_add(b, text, strlen(text));
    free(text);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static void send_metrics(coord_server *srv, struct evhttp_request *req) {
    struct evbuffer *b = evbuffer_new();
    vl_error e = {0};
    if (!b || coord_metrics_write(srv, b, &e) != VL_OK) {
        if (b) evbuffer_free(b);
        vl_log_error("GET /metrics: %s", e.msg[0] ? e.msg : "out of memory");
        admin_error(req, 500, "internal", "the metrics could not be read");
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4; charset=utf-8");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

/* The type libevent 2.1 gives a request whose method it has no name for
 * (EVHTTP_REQ_UNKNOWN_ in its http-internal.h, not in the public
 * header). Its evhttp_handle_request answers any type outside the
 * allowed methods with an HTML 501 before a callback runs, so an unknown
 * method reaches admin_cb only with this bit allowed. */
#define ADMIN_UNKNOWN_METHOD (1 << 15)
/* The largest request body the admin listener reads: every request to
 * it is refused unless it is a GET, and a small body should not make
 * the refusal libevent's HTML page. */
#define ADMIN_BODY_MAX 65536

static void admin_cb(struct evhttp_request *req, void *arg) {
    coord_server *srv = arg;
    struct evkeyvalq *out = evhttp_request_get_output_headers(req);
    /* Everything here is the operator's: never cached on the way, never
     * read as another type than it says. */
    evhttp_add_header(out, "Cache-Control", "no-store");
    evhttp_add_header(out, "X-Content-Type-Options", "nosniff");
    if (srv->admin_token[0] &&
        !authorised(srv,
                    evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization"))) {
        evhttp_add_header(out, "WWW-Authenticate", "Bearer");
        evhttp_add_header(out, "WWW-Authenticate",
                          "Basic realm=\"volley admin\", charset=\"UTF-8\"");
        admin_error(req, 401, "unauthorized",
                    "this listener needs its token (bearer, or a browser's password)");
        return;
    }
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
        evhttp_add_header(out, "Allow", "GET");
        admin_error(req, 405, "method_not_allowed", "only GET is served here");
        return;
    }
    if (path && strcmp(path, "/metrics") == 0)
        send_metrics(srv, req);
    else if (path && strcmp(path, "/dashboard.json") == 0)
        send_summary(srv, req);
    else if (path && strcmp(path, "/") == 0)
        send_page(req);
    else
        admin_error(req, 404, "not_found", "this listener serves /, /dashboard.json and /metrics");
}

int coord_admin_start(coord_server *srv, const char *host, int fd, vl_error *err) {
    srv->admin_http = evhttp_new(srv->base);
    if (!srv->admin_http) {
        close(fd);
        return vl_fail(err, VL_ENOMEM, "cannot create the admin listener");
    }
    /* Scrapes are small GETs; nothing large is taken here. A body up to
     * ADMIN_BODY_MAX is read (and ignored), so a POST or PATCH that
     * carries one still reaches admin_cb and gets its JSON 405: with a
     * cap of 0, libevent answers any body with its own HTML 413. */
    evhttp_set_max_headers_size(srv->admin_http, 16384);
    evhttp_set_max_body_size(srv->admin_http, ADMIN_BODY_MAX);
    evhttp_set_timeout(srv->admin_http, 10);
    evhttp_set_gencb(srv->admin_http, admin_cb, srv);
    /* Every method reaches admin_cb, so a wrong one gets its JSON 405;
     * ADMIN_UNKNOWN_METHOD lets in the methods libevent has no name for
     * as well, which it would otherwise answer with an HTML 501. */
    evhttp_set_allowed_methods(srv->admin_http, COORD_HTTP_ALL_METHODS | ADMIN_UNKNOWN_METHOD);
    struct evhttp_bound_socket *bs = evhttp_accept_socket_with_handle(srv->admin_http, fd);
    if (!bs) {
        close(fd);
        evhttp_free(srv->admin_http);
        srv->admin_http = NULL;
        return vl_fail(err, VL_ENOMEM, "cannot serve the admin listener: out of memory");
    }
    int rc = coord_conns_admin(srv, bs, err);
    if (rc != VL_OK) {
        evhttp_free(srv->admin_http);
        srv->admin_http = NULL;
        srv->admin_bound = NULL;
        return rc;
    }
    int bound_port = coord_bound_port(evhttp_bound_socket_get_fd(bs));
    vl_log_info("admin listener on http://%s:%d/metrics, dashboard at http://%s:%d/%s", host,
                bound_port, host, bound_port, srv->admin_token[0] ? " (token required)" : "");
    return VL_OK;
}
