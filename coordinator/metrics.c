/* The coordinator's metrics and the admin listener that serves them.
 * Counting happens on the event loop, where every answer and every
 * committed version passes; the rest is read when a scrape asks, so an
 * idle coordinator pays nothing for being watched. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "coordinator/coord.h"
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
    if (isnan(v)) evbuffer_add_printf(b, "%s NaN\n", name);
    else evbuffer_add_printf(b, "%s %.17g\n", name, v);
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
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < h->n_le; i++) {
        cum += h->counts[i];
        evbuffer_add_printf(b, "%s_bucket{le=\"%lld\"} %llu\n", name, (long long)h->le[i],
                            (unsigned long long)cum);
    }
    evbuffer_add_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name,
                        (unsigned long long)h->total, name, h->sum, name,
                        (unsigned long long)h->total);
}

typedef struct peer_counts {
    int64_t now, lease_s;
    uint64_t active, idle, gone, revoked;
} peer_counts;

static int count_peer(void *arg, const storage_peer_activity *a) {
    peer_counts *c = arg;
    const char *s = coord_peer_state(a, c->now, c->lease_s);
    if (!strcmp(s, "active")) c->active++;
    else if (!strcmp(s, "idle")) c->idle++;
    else if (!strcmp(s, "gone")) c->gone++;
    else c->revoked++;
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
    head(b, "volley_version_seconds", "histogram",
         "Time to make a version: merge, outer step and validation.");
    uint64_t cum = 0;
    for (size_t i = 0; i < COORD_METRICS_MERGE_BUCKETS; i++) {
        cum += m->merge_buckets[i];
        evbuffer_add_printf(b, "volley_version_seconds_bucket{le=\"%g\"} %llu\n", MERGE_LE[i],
                            (unsigned long long)cum);
    }
    evbuffer_add_printf(b,
                        "volley_version_seconds_bucket{le=\"+Inf\"} %llu\n"
                        "volley_version_seconds_sum %.17g\nvolley_version_seconds_count %llu\n",
                        (unsigned long long)m->merge_count, m->merge_sum,
                        (unsigned long long)m->merge_count);
    /* From the database: what every stored update recorded. */
    static const int64_t STALE_LE[] = {0, 1, 2, 4, 8, 16, 32, 64};
    static const int64_t STEPS_LE[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000};
    int_hist stale = {.le = STALE_LE, .n_le = sizeof STALE_LE / sizeof STALE_LE[0]};
    int_hist steps = {.le = STEPS_LE, .n_le = sizeof STEPS_LE / sizeof STEPS_LE[0]};
    peer_counts pc = {.now = clock_unix_s(), .lease_s = srv->cfg.lease_s};
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
    gauge(b, "volley_updates_unmerged", "Stored updates waiting for a version.",
          (double)unmerged);
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

static void admin_error(struct evhttp_request *req, int status, const char *code,
                        const char *msg) {
    struct evbuffer *b = evbuffer_new();
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "application/json");
    if (b) evbuffer_add_printf(b, "{\"error\":{\"code\":\"%s\",\"message\":\"%s\"}}", code, msg);
    evhttp_send_reply(req, status, code, b);
    if (b) evbuffer_free(b);
}

static void admin_cb(struct evhttp_request *req, void *arg) {
    coord_server *srv = arg;
    if (srv->admin_token[0]) {
        const char *auth =
            evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
        size_t tl = strlen(srv->admin_token);
        if (!auth || strncmp(auth, "Bearer ", 7) != 0 || strlen(auth + 7) != tl ||
            !crypto_equal(auth + 7, srv->admin_token, tl)) {
            evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate",
                              "Bearer");
            admin_error(req, 401, "unauthorized", "this listener needs its bearer token");
            return;
        }
    }
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET");
        admin_error(req, 405, "method_not_allowed", "only GET is served here");
        return;
    }
    if (!path || strcmp(path, "/metrics") != 0) {
        admin_error(req, 404, "not_found", "this listener serves /metrics");
        return;
    }
    struct evbuffer *b = evbuffer_new();
    vl_error e = {0};
    if (!b || coord_metrics_write(srv, b, &e) != VL_OK) {
        if (b) evbuffer_free(b);
        log_error("GET /metrics: %s", e.msg[0] ? e.msg : "out of memory");
        admin_error(req, 500, "internal", "the metrics could not be read");
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4; charset=utf-8");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

int coord_admin_start(coord_server *srv, const char *host, int port, vl_error *err) {
    srv->admin_http = evhttp_new(srv->base);
    if (!srv->admin_http) return vl_fail(err, VL_ENOMEM, "cannot create the admin listener");
    /* Scrapes are small GETs; nothing large is taken here. */
    evhttp_set_max_headers_size(srv->admin_http, 16384);
    evhttp_set_max_body_size(srv->admin_http, 0);
    evhttp_set_timeout(srv->admin_http, 10);
    evhttp_set_gencb(srv->admin_http, admin_cb, srv);
    struct evhttp_bound_socket *bs =
        evhttp_bind_socket_with_handle(srv->admin_http, host, (ev_uint16_t)port);
    if (!bs) {
        evhttp_free(srv->admin_http);
        srv->admin_http = NULL;
        return vl_fail(err, VL_EIO, "cannot listen on %s:%d for the admin listener", host, port);
    }
    int bound_port = coord_bound_port(evhttp_bound_socket_get_fd(bs));
    log_info("admin listener on http://%s:%d/metrics%s", host, bound_port > 0 ? bound_port : port,
             srv->admin_token[0] ? " (bearer token required)" : "");
    return VL_OK;
}
