/* bench_ingest: how many durable uploads a coordinator takes per second,
 * and how long each waits for its 202, with the disk's bare fsync rate
 * measured in the same run as the baseline that group commit must beat
 * (without batching, ingest could not exceed one upload per fsync).
 *
 *   client  a peer that skips training: it leases tasks and uploads random
 *           sketch updates of the run's shape as fast as the coordinator
 *           answers, through the peer library's own identity, state, HTTP
 *           client and encoder. It outlives coordinator crashes (the crash
 *           test kills the coordinator under it) and, with --log-acks,
 *           records every 202 before the next upload, so a test can check
 *           that nothing acknowledged was lost.
 *   fsync   append a record (4 KiB, or --bytes) and fdatasync it in a loop:
 *           the disk alone.
 *   stats   global percentiles over the latency files of several clients.
 *
 * bench/ingest.sh drives all three against a real coordinator. */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/opts.h"
#include "peer/peer.h"

#define PROG "bench_ingest"
#define JSON_CAP ((size_t)1 << 20)
#define UPLOAD_CAP ((size_t)1 << 30)
#define LAT_CAP ((size_t)1 << 30)
#define LAT_FILE_CAP ((size_t)256 << 20)
#define IDLE_S 30L
#define MAX_SECONDS 1e6
#define MAX_STATUSES 32
#define FSYNC_BLOCK 4096
#define FSYNC_BLOCK_MAX (16L << 20)

/* Exit statuses. */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

static const char USAGE[] =
    "usage:\n"
    "  " PROG " client --dir PEERDIR [--seconds S] --out FILE [--log-acks FILE]\n"
    "      lease tasks and upload random sketch updates for S seconds (default 0:\n"
    "      until SIGTERM/SIGINT); one key=value summary line to FILE, latencies (ms, one\n"
    "      per line) to FILE.lat, and with --log-acks a line 'ACK TASK UPDATE' per 202\n"
    "  " PROG " fsync --dir D [--seconds S] [--bytes N] [--direct]\n"
    "      append N bytes (default 4096, at most 16 MiB) and fdatasync in D for S\n"
    "      seconds (default 1), over and over; prints fsyncs_per_s. --direct writes\n"
    "      with O_DIRECT, padded to 4 KiB blocks, as the coordinator writes update\n"
    "      bodies (through the page cache where the file system refuses it); prints\n"
    "      direct=0 or 1 too\n"
    "  " PROG " stats FILE...\n"
    "      count, p50, p99 and max over the latency files of several clients\n";

static int usage(const char *msg) {
    fprintf(stderr, PROG ": %s (see '" PROG " --help')\n", msg);
    return EXIT_USAGE;
}

static int fail_line(const vl_error *e) {
    fprintf(stderr, PROG ": %s\n", e->msg);
    return EXIT_FAIL;
}

/* ---- latencies ----------------------------------------------------------- */

typedef struct lat_summary {
    size_t n;
    double p50, p99, max;
} lat_summary;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest rank: the smallest value with at least p of the sample at or
 * below it, so p99 of 100 values is the 99th, not an interpolation that
 * no upload actually took. */
static double rank(const double *sorted, size_t n, double p) {
    size_t r = (size_t)(p * (double)n + 0.999999);
    if (r < 1) r = 1;
    if (r > n) r = n;
    return sorted[r - 1];
}

/* Sorts v (n values) in place and summarises it; all zero when n is 0. */
static void summarize(double *v, size_t n, lat_summary *out) {
    memset(out, 0, sizeof *out);
    if (n == 0) return;
    qsort(v, n, sizeof *v, cmp_double);
    out->n = n;
    out->p50 = rank(v, n, 0.50);
    out->p99 = rank(v, n, 0.99);
    out->max = v[n - 1];
}

/* ---- client -------------------------------------------------------------- */

/* Outcomes of one request that the loop handles besides VL_OK. */
enum { STEP_RETRY = 1, STEP_NO_TASK = 2, STEP_FINISHED = 3 };

typedef struct status_count {
    char what; /* 't' task request, 'u' upload */
    long status;
    uint64_t n;
} status_count;

typedef struct client {
    const char *dir;
    peer_state st;
    vcrypto_identity id;
    peer_http *http;
    peer_response rs;
    vl_buf upload;
    vl_buf lat; /* doubles, ms */
    compress_sketch sk;
    vl_rng r;
    FILE *acks;
    uint64_t uploads, errors, network, no_task, next_tasks;
    status_count statuses[MAX_STATUSES];
    int nstatuses;
    uint64_t other_statuses; /* past MAX_STATUSES distinct ones */
    int have_next;           /* next came with the last 202 */
    peer_task next;
} client;

static void count_status(client *C, char what, long status) {
    C->errors++;
    for (int i = 0; i < C->nstatuses; i++)
        if (C->statuses[i].what == what && C->statuses[i].status == status) {
            C->statuses[i].n++;
            return;
        }
    if (C->nstatuses == MAX_STATUSES) {
        C->other_statuses++;
        return;
    }
    C->statuses[C->nstatuses++] = (status_count){.what = what, .status = status, .n = 1};
}

/* Transport trouble is what a coordinator being killed and restarted looks
 * like from here: each request has only two attempts, so the loop waits a
 * little and goes on by itself instead of ending. Anything else local
 * (memory, signing) would fail the same way again and ends the client. */
static int transient(client *C, int rc, const vl_error *e) {
    if (rc == PEER_ENETWORK || rc == VL_EIO) {
        C->errors++;
        C->network++;
        /* peer_http_do has already logged each failed attempt; a transport
         * error it gave up on at once (VL_EIO: TLS, a broken connection)
         * has not been, and could be a misconfiguration worth seeing. */
        if (rc == VL_EIO) vl_log_warn("%s", e->msg);
        return STEP_RETRY;
    }
    return rc;
}

static int is_run_finished(const peer_response *rs) {
    char code[64], msg[8];
    peer_error_parse(rs->body.data, rs->body.len, code, sizeof code, msg, sizeof msg);
    return rs->status == 410 && strcmp(code, "run_finished") == 0;
}

static int get_task(client *C, peer_task *k, vl_error *err) {
    peer_request rq = {
        .method = "GET", .target = "/v1/task?wait=0", .cap = JSON_CAP, .idle_s = IDLE_S};
    int rc = peer_http_do(C->http, &rq, &C->rs, err);
    if (rc) return transient(C, rc, err);
    if (C->rs.status == 204) {
        C->no_task++;
        return STEP_NO_TASK;
    }
    if (is_run_finished(&C->rs)) return STEP_FINISHED;
    if (C->rs.status != 200) {
        count_status(C, 't', C->rs.status);
        return STEP_RETRY;
    }
    /* A lease this client cannot read would be offered again and again:
     * that is a mismatch with the coordinator, not a passing failure. */
    rc = peer_task_parse((const char *)C->rs.body.data, C->rs.body.len, k, err);
    if (rc) return rc;
    if (k->method != PEER_METHOD_SKETCH)
        return vl_fail(err, VL_EINVAL,
                       "task %lld asks for %s updates; this benchmark needs a "
                       "run with \"compression\": {\"kind\": \"sketch\"}",
                       (long long)k->task_id, compress_kind_name(k->kind));
    return VL_OK;
}

/* The update for k: a sketch of the task's seed and shape filled with small
 * random values. The coordinator only checks shape, seed and finiteness,
 * so encoding a real delta would measure this machine's hashing, not the
 * coordinator's ingest; for the same reason the table is filled once and
 * only a few cells change from one upload to the next. */
static int build_update(client *C, const peer_task *k, vl_error *err) {
    compress_sketch *s = &C->sk;
    if (!s->table || s->rows != k->comp_rows || s->cols != k->comp_cols ||
        s->seed != k->comp_seed) {
        compress_sketch_free(s);
        int rc = compress_sketch_init(s, k->comp_rows, k->comp_cols, k->comp_seed, err);
        if (rc) return rc;
        size_t cells = (size_t)s->rows * s->cols;
        for (size_t i = 0; i < cells; i++) s->table[i] = 1e-3f * (vl_rng_uniform(&C->r) - 0.5f);
    }
    size_t cells = (size_t)s->rows * s->cols;
    for (int i = 0; i < 16; i++)
        s->table[vl_rng_below_u64(&C->r, cells)] = 1e-3f * (vl_rng_uniform(&C->r) - 0.5f);
    compress_update_meta m;
    memset(&m, 0, sizeof m);
    snprintf(m.run, sizeof m.run, "%s", k->run);
    m.task = k->task_id;
    m.peer = C->st.peer_id;
    m.base_version = k->base_version;
    m.kind = COMPRESS_SKETCH;
    m.num_samples = (int64_t)k->batch * k->context;
    m.local_steps = 1;
    m.loss = 5.5 + 0.1 * vl_rng_uniform(&C->r);
    m.seed = k->comp_seed;
    vl_buf_reset(&C->upload);
    return compress_update_encode_sketch(&m, s, k->dtype, &C->upload, err);
}

/* The line goes to the kernel before the next upload starts: the crash
 * test kills the coordinator, not this process, so a 202 seen here is
 * never missing from the file when the test reads it. */
static int log_ack(client *C, int64_t task, int64_t update, vl_error *err) {
    if (!C->acks) return VL_OK;
    if (fprintf(C->acks, "ACK %lld %lld\n", (long long)task, (long long)update) < 0 ||
        fflush(C->acks) != 0)
        return vl_fail(err, VL_EIO, "cannot write the acknowledgement log: %s", strerror(errno));
    return VL_OK;
}

/* The next task, when the coordinator leased it with the last upload's
 * 202 (async runs), so the client goes straight on to its next upload. */
static int take_next(client *C, json_t *o, const peer_task *k, vl_error *err) {
    json_t *next = json_object_get(o, "next_task");
    C->have_next = 0;
    if (!next) return VL_OK;
    int rc = peer_task_from_json(next, &C->next, err);
    if (rc != VL_OK)
        return vl_fail(err, rc, "upload of task %lld: bad next_task: %s", (long long)k->task_id,
                       err->msg);
    C->have_next = 1;
    C->next_tasks++;
    return VL_OK;
}

static int send_update(client *C, const peer_task *k, vl_error *err) {
    peer_request rq = {.method = "POST",
                       .target = "/v1/updates?next=1",
                       .content_type = "application/octet-stream",
                       .body = C->upload.data,
                       .body_len = C->upload.len,
                       .cap = JSON_CAP,
                       .idle_s = IDLE_S};
    double t0 = vl_clock_mono_s();
    int rc = peer_http_do(C->http, &rq, &C->rs, err);
    double ms = (vl_clock_mono_s() - t0) * 1e3;
    if (rc) return transient(C, rc, err);
    if (C->rs.status != 202) {
        /* 409 duplicate_update after a crash: an earlier attempt was
         * stored but its 202 never arrived, so it must not be logged. */
        count_status(C, 'u', C->rs.status);
        return is_run_finished(&C->rs) ? STEP_FINISHED : STEP_RETRY;
    }
    json_error_t je;
    json_t *o = json_loadb((const char *)C->rs.body.data, C->rs.body.len, 0, &je);
    json_t *id = json_object_get(o, "update_id");
    int64_t update_id = json_is_integer(id) ? (int64_t)json_integer_value(id) : -1;
    rc = update_id > 0 ? take_next(C, o, k, err)
                       : vl_fail(err, VL_EINVAL,
                                 "upload of task %lld: 202 without an integer "
                                 "update_id",
                                 (long long)k->task_id);
    json_decref(o);
    if (rc != VL_OK) return rc;
    if ((rc = log_ack(C, k->task_id, update_id, err))) return rc;
    if ((rc = vl_buf_append(&C->lat, &ms, sizeof ms)))
        return vl_fail(err, rc, "too many latencies to keep");
    C->uploads++;
    return VL_OK;
}

/* A pause of 50 to 200 ms before trying again, cut short by a stop. */
static int back_off(client *C) {
    return peer_sleep(0.05 + 0.15 * vl_rng_uniform(&C->r)) ? PEER_ESTOPPED : VL_OK;
}

static int client_loop(client *C, double seconds, double *elapsed, vl_error *err) {
    double t0 = vl_clock_mono_s();
    int rc = VL_OK;
    while (!peer_stop_requested() && (seconds == 0 || vl_clock_mono_s() - t0 < seconds)) {
        peer_task k;
        if (C->have_next) {
            k = C->next;
            C->have_next = 0;
            rc = VL_OK;
        } else {
            rc = get_task(C, &k, err);
        }
        if (rc == VL_OK) {
            rc = build_update(C, &k, err);
            if (rc == VL_OK) rc = send_update(C, &k, err);
        }
        if (rc == STEP_NO_TASK)
            rc = peer_sleep(0.01) ? PEER_ESTOPPED : VL_OK;
        else if (rc == STEP_RETRY)
            rc = back_off(C);
        if (rc == STEP_FINISHED) {
            vl_log_info("the run has finished");
            rc = VL_OK;
            break;
        }
        if (rc) break;
    }
    *elapsed = vl_clock_mono_s() - t0;
    return rc == PEER_ESTOPPED ? VL_OK : rc;
}

static int write_results(client *C, const char *out, double elapsed, vl_error *err) {
    size_t n = C->lat.len / sizeof(double);
    double *v = (double *)(void *)C->lat.data;
    char lat_path[PEER_PATH_MAX];
    int w = snprintf(lat_path, sizeof lat_path, "%s.lat", out);
    if (w < 0 || (size_t)w >= sizeof lat_path)
        return vl_fail(err, VL_ETOOBIG, "--out path is too long");
    /* Raw values first, in arrival order, before sorting for the summary. */
    FILE *f = fopen(lat_path, "w");
    if (!f) return vl_fail(err, VL_EIO, "cannot create %s: %s", lat_path, strerror(errno));
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) bad = fprintf(f, "%.3f\n", v[i]) < 0;
    if (fclose(f) != 0 || bad)
        return vl_fail(err, VL_EIO, "cannot write %s: %s", lat_path, strerror(errno));
    lat_summary s;
    summarize(v, n, &s);
    vl_buf line;
    vl_buf_init(&line, 1 << 16);
    int rc = vl_buf_printf(&line,
                           "uploads=%llu errors=%llu seconds=%.3f p50_ms=%.3f p99_ms=%.3f "
                           "max_ms=%.3f network=%llu no_task=%llu next_tasks=%llu",
                           (unsigned long long)C->uploads, (unsigned long long)C->errors, elapsed,
                           s.p50, s.p99, s.max, (unsigned long long)C->network,
                           (unsigned long long)C->no_task, (unsigned long long)C->next_tasks);
    for (int i = 0; i < C->nstatuses && !rc; i++)
        rc = vl_buf_printf(&line, " %s_%ld=%llu", C->statuses[i].what == 't' ? "task" : "upload",
                           C->statuses[i].status, (unsigned long long)C->statuses[i].n);
    if (!rc && C->other_statuses)
        rc = vl_buf_printf(&line, " other_status=%llu", (unsigned long long)C->other_statuses);
    if (!rc) rc = vl_buf_append_str(&line, "\n");
    if (!rc)
        rc = vl_file_write_atomic(out, line.data, line.len, 0644, err);
    else
        rc = vl_fail(err, rc, "summary line too long");
    vl_buf_free(&line);
    return rc;
}

static void on_signal(int sig) {
    (void)sig;
    peer_stop_request();
}

static int client_open(client *C, const char *acks, vl_error *err) {
    if (vcrypto_init() != VL_OK) return vl_fail(err, VL_ERR, "libsodium failed to initialise");
    int rc = peer_state_load(C->dir, &C->st, err);
    if (rc) return rc;
    char key[PEER_PATH_MAX];
    if ((rc = peer_path_join(key, sizeof key, C->dir, PEER_KEY_FILE, err))) return rc;
    if ((rc = vcrypto_identity_load(&C->id, key, err))) return rc;
    /* Few attempts per request: the loop does its own retrying, so a dead
     * coordinator costs a short pause instead of the peer's long backoff. */
    peer_retry_policy pol = {
        .max_attempts = 2, .base_s = 0.05, .factor = 2, .cap_s = 0.2, .retry_after_max_s = 0.2};
    rc =
        peer_http_open(C->st.coordinator, C->st.cacert, &C->id, C->st.peer_id, &pol, &C->http, err);
    if (rc) return rc;
    if (acks) {
        C->acks = fopen(acks, "a");
        if (!C->acks) return vl_fail(err, VL_EIO, "cannot open %s: %s", acks, strerror(errno));
    }
    return VL_OK;
}

static void client_close(client *C) {
    if (C->acks) fclose(C->acks);
    peer_http_close(C->http);
    vcrypto_identity_wipe(&C->id);
    compress_sketch_free(&C->sk);
    vl_buf_free(&C->lat);
    vl_buf_free(&C->upload);
    peer_response_free(&C->rs);
}

/* What the subcommands' options fill in; each table names its fields. */
typedef struct args {
    const char *dir, *out, *acks;
    double seconds;
    int64_t bytes; /* fsync: record size */
    int direct;    /* fsync: O_DIRECT */
} args;

/* Parses the options after the subcommand (argv[0]) against t; VL_OK or
 * vl_opts_parse's other answers. */
static int parse_args(const char *prog, vl_opt *t, size_t n, int argc, char **argv) {
    vl_opts o = {.prog = prog, .hint = "see '" PROG " --help'", .usage = USAGE, .opt = t, .n = n};
    return vl_opts_parse(&o, argc, argv, NULL);
}

static int cmd_client(int argc, char **argv) {
    args a = {.seconds = 0};
    vl_opt t[] = {vl_opt_required(vl_opt_str("dir", &a.dir)),
                  vl_opt_f64("seconds", &a.seconds, 0, MAX_SECONDS),
                  vl_opt_required(vl_opt_str("out", &a.out)), vl_opt_str("log-acks", &a.acks)};
    int x = parse_args(PROG " client", t, VL_OPTS_COUNT(t), argc, argv);
    if (x) return vl_opts_status(x);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    client C;
    memset(&C, 0, sizeof C);
    C.dir = a.dir;
    peer_response_init(&C.rs);
    vl_buf_init(&C.upload, UPLOAD_CAP);
    vl_buf_init(&C.lat, LAT_CAP);
    vl_rng_seed(&C.r, (uint64_t)getpid() ^ (uint64_t)(vl_clock_mono_s() * 1e9));
    vl_error e = {0};
    double elapsed = 0;
    int rc = client_open(&C, a.acks, &e);
    if (!rc) {
        vl_log_info("peer %lld uploading to %s (run '%s')%s", (long long)C.st.peer_id,
                    C.st.coordinator, C.st.run, a.seconds > 0 ? "" : " until stopped");
        rc = client_loop(&C, a.seconds, &elapsed, &e);
        /* The figures are written even after a failure: they say how far
         * it got, and the failure itself still sets the exit status. */
        vl_error we = {0};
        int wrc = write_results(&C, a.out, elapsed, &we);
        if (!rc && wrc) {
            rc = wrc;
            e = we;
        }
    }
    if (!rc)
        vl_log_info("%llu uploads in %.2f s, %llu errors", (unsigned long long)C.uploads, elapsed,
                    (unsigned long long)C.errors);
    client_close(&C);
    return rc ? fail_line(&e) : EXIT_OK;
}

/* ---- fsync baseline ------------------------------------------------------ */

/* Each round grows the file, so fdatasync must persist the new size too,
 * as a commit appending to SQLite's WAL does. With *direct set, the file
 * is written with O_DIRECT in whole 4 KiB blocks where the file system
 * allows it; *direct says on return whether it did. */
static int fsync_rate(const char *dir, double seconds, size_t bytes, int *direct, double *rate,
                      vl_error *err) {
    char path[PEER_PATH_MAX];
    int rc = peer_path_join(path, sizeof path, dir, "bench_ingest.fsync", err);
    if (rc) return rc;
    if (*direct) bytes = (bytes + 4095) / 4096 * 4096;
    void *mem = NULL;
    if (posix_memalign(&mem, 4096, bytes) != 0)
        return vl_fail(err, VL_ENOMEM, "out of memory for a %zu-byte record", bytes);
    char *block = mem;
    memset(block, 'v', bytes);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        free(block);
        return vl_fail(err, VL_EIO, "cannot create %s: %s", path, strerror(errno));
    }
    if (*direct) {
        int fl = fcntl(fd, F_GETFL);
        *direct = fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
    }
    uint64_t n = 0;
    off_t off = 0;
    double t0 = vl_clock_mono_s(), t = t0;
    while (rc == VL_OK && (n == 0 || t - t0 < seconds)) {
        ssize_t w = pwrite(fd, block, bytes, off);
        if (w != (ssize_t)bytes)
            rc = vl_fail(err, VL_EIO, "cannot write %s: %s", path,
                         w < 0 ? strerror(errno) : "short write");
        else if (fdatasync(fd) != 0)
            rc = vl_fail(err, VL_EIO, "fdatasync %s: %s", path, strerror(errno));
        off += (off_t)bytes;
        n++;
        t = vl_clock_mono_s();
    }
    close(fd);
    unlink(path);
    free(block);
    if (rc == VL_OK) *rate = (double)n / (t - t0);
    return rc;
}

static int cmd_fsync(int argc, char **argv) {
    args a = {.seconds = 1.0, .bytes = FSYNC_BLOCK};
    vl_opt t[] = {vl_opt_required(vl_opt_str("dir", &a.dir)),
                  vl_opt_f64("seconds", &a.seconds, 0, MAX_SECONDS),
                  vl_opt_int("bytes", &a.bytes, 1, FSYNC_BLOCK_MAX),
                  vl_opt_flag("direct", &a.direct)};
    int x = parse_args(PROG " fsync", t, VL_OPTS_COUNT(t), argc, argv);
    if (x) return vl_opts_status(x);
    double seconds = a.seconds;
    size_t bytes = (size_t)a.bytes;
    double rate = 0;
    vl_error e = {0};
    int direct = a.direct;
    if (fsync_rate(a.dir, seconds, bytes, &direct, &rate, &e)) return fail_line(&e);
    printf("fsyncs_per_s=%.0f\n", rate);
    if (a.direct) printf("direct=%d\n", direct);
    return EXIT_OK;
}

/* ---- global percentiles -------------------------------------------------- */

/* Appends the values of one latency file (one number a line) to all. */
static int read_lat_file(const char *path, vl_buf *all, vl_error *err) {
    vl_buf b;
    vl_buf_init(&b, LAT_FILE_CAP);
    int rc = vl_buf_read_file(&b, path, err);
    char *p = (char *)b.data;
    long line = 0;
    while (!rc && p && *p) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        line++;
        double v;
        if (*p && (vl_parse_f64(p, &v) != VL_OK || v < 0))
            rc = vl_fail(err, VL_EINVAL, "%s:%ld: not a latency in ms", path, line);
        else if (*p && vl_buf_append(all, &v, sizeof v) != VL_OK)
            rc = vl_fail(err, VL_ETOOBIG, "too many latencies");
        p = nl ? nl + 1 : NULL;
    }
    vl_buf_free(&b);
    return rc;
}

static int cmd_stats(int argc, char **argv) {
    /* No options, but --help, and "--" before a file named like one. */
    vl_opts o = {.prog = PROG " stats", .hint = "see '" PROG " --help'", .usage = USAGE};
    int first = argc, x = vl_opts_parse(&o, argc, argv, &first);
    if (x) return vl_opts_status(x);
    if (first >= argc) return usage("stats needs at least one latency file");
    vl_buf all;
    vl_buf_init(&all, LAT_CAP);
    vl_error e = {0};
    int rc = VL_OK;
    for (int i = first; i < argc && !rc; i++) rc = read_lat_file(argv[i], &all, &e);
    if (rc) {
        vl_buf_free(&all);
        return fail_line(&e);
    }
    lat_summary s;
    summarize((double *)(void *)all.data, all.len / sizeof(double), &s);
    printf("count=%zu p50_ms=%.3f p99_ms=%.3f max_ms=%.3f\n", s.n, s.p50, s.p99, s.max);
    vl_buf_free(&all);
    return EXIT_OK;
}

int main(int argc, char **argv) {
    vl_log_set_program(PROG);
    if (argc < 2) return usage("a subcommand is needed: client, fsync or stats");
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        fputs(USAGE, stdout);
        return EXIT_OK;
    }
    if (strcmp(cmd, "client") == 0) return cmd_client(argc - 1, argv + 1);
    if (strcmp(cmd, "fsync") == 0) return cmd_fsync(argc - 1, argv + 1);
    if (strcmp(cmd, "stats") == 0) return cmd_stats(argc - 1, argv + 1);
    return usage("unknown subcommand (client, fsync or stats)");
}
