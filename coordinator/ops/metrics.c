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
#include "coordinator/ops/dashboard.h"
#include "crypto/crypto.h"
#include "coordinator/base/counters.h"
#include "coordinator/base/routes.h"
#include "coordinator/config/config.h"
#include "coordinator/ops/metrics.h"
#include "coordinator/ops/status.h"
#include "coordinator/run/writer.h"

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
    const coord_metrics *m = &srv->ops.metrics;
    /* 1. Requests and uploads, as the loop counted them. */
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
    /* 2. The run as the loop holds it. */
    gauge(b, "volley_requests_in_flight", "Requests handed to a handler and not yet answered.",
          (double)srv->conns.inflight);
    gauge(b, "volley_connections", "Open connections on the public port.",
          (double)srv->conns.n_conns);
    gauge(b, "volley_version", "The current model version.", (double)srv->run.version);
    gauge(b, "volley_max_versions", "The run's last version.", (double)srv->run.cfg.max_versions);
    gauge(b, "volley_run_finished", "1 once the run reached its last version.",
          srv->run.finished ? 1.0 : 0.0);
    gauge(b, "volley_validation_loss", "The current version's validation loss (nats).",
          srv->run.val_loss);
    gauge(b, "volley_training_loss",
          "The last version's mean training loss over its updates (nats).", m->train_loss);
    hist_fixed(b, "volley_version_seconds",
               "Time to make a version: merge, outer step and validation.", coord_metrics_merge_le,
               m->merge_buckets, COORD_METRICS_MERGE_BUCKETS, m->merge_count, m->merge_sum);
    /* 3. From the database: what every stored update recorded. */
    static const int64_t STALE_LE[] = {0, 1, 2, 4, 8, 16, 32, 64};
    static const int64_t STEPS_LE[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000};
    int_hist stale = {.le = STALE_LE, .n_le = sizeof STALE_LE / sizeof STALE_LE[0]};
    int_hist steps = {.le = STEPS_LE, .n_le = sizeof STEPS_LE / sizeof STEPS_LE[0]};
    peer_counts pc = {.now = vl_clock_unix_s(), .lease_s = srv->run.cfg.lease_s};
    int64_t unmerged = 0;
    int rc = storage_update_histogram(srv->run.db, STORAGE_HIST_STALENESS, hist_add, &stale, err);
    if (rc == VL_OK)
        rc = storage_update_histogram(srv->run.db, STORAGE_HIST_LOCAL_STEPS, hist_add, &steps, err);
    if (rc == VL_OK) rc = storage_peer_each(srv->run.db, pc.now, count_peer, &pc, err);
    if (rc == VL_OK) rc = storage_update_count_unmerged(srv->run.db, &unmerged, err);
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
    /* 4. The writer and the disk. */
    coord_writer_stats ws;
    coord_writer_stats_get(srv->run.writer, &ws);
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
          (double)srv->sched.disk.full);
    head(b, "volley_disk_full_reports_total", "counter", "Times the disk was found full.");
    evbuffer_add_printf(b, "volley_disk_full_reports_total %lld\n",
                        (long long)srv->sched.disk.reports);
    head(b, "volley_merge_room_retries_total", "counter",
         "Merges retried because the disk had no room.");
    evbuffer_add_printf(b, "volley_merge_room_retries_total %lld\n",
                        (long long)srv->sched.disk.retries);
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
    /* 5. The files the run keeps on disk. */
    char path[COORD_PATH_MAX + 16];
    head(b, "volley_database_bytes", "gauge", "Size of the SQLite database and its WAL.");
    snprintf(path, sizeof path, "%s", srv->run.db_path);
    evbuffer_add_printf(b, "volley_database_bytes{file=\"db\"} %.0f\n", file_bytes(path));
    snprintf(path, sizeof path, "%s-wal", srv->run.db_path);
    evbuffer_add_printf(b, "volley_database_bytes{file=\"wal\"} %.0f\n", file_bytes(path));
    snprintf(path, sizeof path, "%s-bodies", srv->run.db_path);
    gauge(b, "volley_body_store_bytes", "Size of the stored update bodies' segments.",
          dir_bytes(path));
    return VL_OK;
}
