/* The writer thread and its group commit (writer.h). The loop and the
 * thread share two lists under one mutex: jobs to run and jobs done. The
 * thread wakes the loop through a pipe, which libevent watches, so no
 * callback ever runs on the writer thread.
 *
 * A third thread, with a connection of its own, copies the WAL back into
 * the database file (passive checkpoints). Left to SQLite, a commit that
 * finds the WAL past 1000 pages runs that copy itself, and every job of
 * the batch then waits for it; on its own thread it runs while the writer
 * goes on, on the other core.
 *
 * Two more threads run jobs that only compute (writer.h): the compute
 * thread, whose results the run waits for, and the background thread,
 * whose results nothing waits for, at a lower CPU priority. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <event2/event.h>

#include "coordinator/run/writer.h"

/* A thread that runs jobs outside any transaction, one at a time, in
 * order (coord_writer_compute, coord_writer_background). */
typedef struct lane {
    coord_writer *w;
    storage *db; /* its read connection (NULL: its jobs get none) */
    int has;     /* its thread runs */
    int nice;    /* the nice value its thread sets itself to (0: left as it is) */
    pthread_t thread;
    pthread_cond_t cv;
    coord_job *queue, *tail; /* under the writer's mu */
} lane;

struct coord_writer {
    storage *db;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    coord_job *queue, *queue_tail; /* submitted, not yet taken */
    coord_job *done, *done_tail;   /* run, not yet handed back */
    uint64_t submitted;            /* the last submission number given out (loop thread) */
    uint64_t settled;              /* the last one whose transaction has ended (under mu) */
    int stopping;
    coord_writer_stats stats;
    /* Loop side. */
    int has_thread;
    pthread_t thread;
    int pipe_rd, pipe_wr;
    struct event *ev;
    size_t outstanding; /* submitted and not yet handed back (loop thread only) */
    /* The checkpointer: its connection, and commits not yet checkpointed
     * (under mu, with ckpt_cv to wake it). */
    storage *ckpt_db;
    int has_ckpt;
    lane compute, background;
    pthread_t ckpt_thread;
    pthread_cond_t ckpt_cv;
    uint64_t ckpt_due;
    /* The disk: full since a job failed for want of room, until a
     * commit works again (under mu), with the first such error; the loop
     * side's hook and the state it last reported. */
    int full;
    vl_error full_err;
    coord_writer_full_fn full_hook;
    void *full_arg;
    int full_reported;
};

/* A checkpoint that leaves this many pages behind (the copy could not keep
 * up, or a reader held an old snapshot) is worth a line in the log. */
#define CKPT_WARN_PAGES (256 * 1024)
/* The checkpoint thread runs once the WAL holds this many frames (SQLite's
 * own default). After every commit instead, it copied the same hot pages
 * (the tasks and updates tables' last leaves and their indexes) back and
 * synced the database file once per commit, a visible share of the
 * coordinator's CPU under an upload storm (docs/benchmarks.md). */
#define CKPT_FRAMES 1000

const double coord_writer_batch_le[COORD_WRITER_BATCH_BUCKETS] = {1,  2,  4,   8,   16,
                                                                  32, 64, 128, 256, 512};
const double coord_writer_commit_le[COORD_WRITER_COMMIT_BUCKETS] = {
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5};

static void append(coord_job **head, coord_job **tail, coord_job *first, coord_job *last) {
    if (!first) return;
    if (*tail)
        (*tail)->next = first;
    else
        *head = first;
    *tail = last;
}

/* The error of the first job of jobs that failed for a full disk. */
static vl_error first_full(const coord_job *jobs) {
    for (const coord_job *j = jobs; j; j = j->next)
        if (j->rc == VL_EFULL) return j->err;
    return (vl_error){0};
}

/* Runs jobs (a list) as one transaction. */
static void run_batch(coord_writer *w, coord_job *jobs) {
    vl_error e = {0};
    size_t n = 0;
    for (coord_job *j = jobs; j; j = j->next) n++;
    int rc = storage_begin(w->db, &e);
    int broken = rc != VL_OK;
    for (coord_job *j = jobs; j && !broken; j = j->next) {
        memset(&j->err, 0, sizeof j->err);
        if (storage_savepoint(w->db, &j->err) != VL_OK) {
            j->rc = j->err.code ? j->err.code : VL_EDB;
            broken = 1;
            e = j->err;
            break;
        }
        j->rc = j->run(w->db, j, &j->err);
        if (j->rc != VL_OK && j->err.code == 0) j->err.code = j->rc;
        vl_error se = {0};
        if (storage_savepoint_end(w->db, j->rc == VL_OK, &se) != VL_OK) {
            /* The transaction is in no state to commit. A job whose
             * failure rolled it all back (a full disk) is the cause. */
            broken = 1;
            e = j->rc != VL_OK ? j->err : se;
        }
    }
    double commit_s = -1;
    if (!broken) {
        double t0 = vl_clock_mono_s();
        rc = storage_commit(w->db, &e);
        broken = rc != VL_OK;
        if (!broken) commit_s = vl_clock_mono_s() - t0;
    } else {
        storage_rollback(w->db);
    }
    uint64_t failed = 0, last = 0;
    for (coord_job *j = jobs; j; j = j->next) {
        last = j->seq;
        if (broken) {
            /* Nothing of the batch is stored, whatever a job said. */
            j->rc = e.code ? e.code : VL_EDB;
            j->err = e;
        }
        failed += j->rc != VL_OK;
    }
    /* A full disk is reported once by whoever watches the writer
     * (coord_writer_set_full_hook), not on every batch it fails. */
    int full = broken && e.code == VL_EFULL;
    if (broken && !full)
        vl_log_error("database writer: a transaction of %zu jobs failed: %s", n, e.msg);
    if (!broken)
        for (coord_job *j = jobs; j && !full; j = j->next) full = j->rc == VL_EFULL;
    pthread_mutex_lock(&w->mu);
    if (full) {
        if (!w->full) w->full_err = broken ? e : first_full(jobs);
        w->full = 1;
    } else if (!broken) {
        w->full = 0;
    }
    /* Batches are taken from the head of the queue, so the last job of
     * this one is the highest number that has settled. */
    if (last > w->settled) w->settled = last;
    w->stats.jobs += n;
    w->stats.failed += failed;
    size_t b = 0;
    while (b < COORD_WRITER_BATCH_BUCKETS && (double)n > coord_writer_batch_le[b]) b++;
    w->stats.batch_hist[b]++;
    if (!broken) {
        w->stats.commits++;
        b = 0;
        while (b < COORD_WRITER_COMMIT_BUCKETS && commit_s > coord_writer_commit_le[b]) b++;
        w->stats.commit_hist[b]++;
        w->stats.commit_seconds += commit_s;
        if (storage_wal_frames(w->db) >= CKPT_FRAMES) {
            w->ckpt_due++;
            pthread_cond_signal(&w->ckpt_cv);
        }
    }
    if (n > w->stats.max_batch) w->stats.max_batch = n;
    pthread_mutex_unlock(&w->mu);
}

/* Takes up to COORD_WRITER_MAX_BATCH queued jobs; call with mu held. */
static coord_job *take_batch(coord_writer *w, coord_job **last) {
    coord_job *first = w->queue, *j = first;
    size_t n = 1;
    while (j->next && n < COORD_WRITER_MAX_BATCH) {
        j = j->next;
        n++;
    }
    w->queue = j->next;
    if (!w->queue) w->queue_tail = NULL;
    j->next = NULL;
    *last = j;
    w->stats.queued -= n;
    return first;
}

static void notify_loop(coord_writer *w) {
    char b = 1;
    /* A full pipe already holds a wake-up; nothing is lost. */
    while (write(w->pipe_wr, &b, 1) < 0 && errno == EINTR) {}
}

/* Appends finished jobs to the done list and wakes the loop; call with mu
 * held. */
static void hand_back(coord_writer *w, coord_job *first, coord_job *last) {
    int was_empty = w->done == NULL;
    append(&w->done, &w->done_tail, first, last);
    if (was_empty && w->pipe_wr >= 0) notify_loop(w);
}

static void *thread_main(void *arg) {
    coord_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->queue && !w->stopping) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->queue) break;
        coord_job *last;
        coord_job *batch = take_batch(w, &last);
        pthread_mutex_unlock(&w->mu);
        run_batch(w, batch);
        pthread_mutex_lock(&w->mu);
        hand_back(w, batch, last);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void *ckpt_main(void *arg) {
    coord_writer *w = arg;
    int warned = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->ckpt_due && !w->stopping) pthread_cond_wait(&w->ckpt_cv, &w->mu);
        if (!w->ckpt_due) break;
        w->ckpt_due = 0;
        pthread_mutex_unlock(&w->mu);
        vl_error e = {0};
        int wal = 0, done = 0;
        if (storage_checkpoint(w->ckpt_db, &wal, &done, &e) != VL_OK) {
            vl_log_warn("database checkpoint failed (the WAL keeps growing until one works): %s",
                        e.msg);
        } else if (wal - done > CKPT_WARN_PAGES && !warned) {
            vl_log_warn("database checkpoint is %d pages behind the WAL", wal - done);
            warned = 1;
        }
        pthread_mutex_lock(&w->mu);
        w->stats.checkpoints++;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* The background lane's niceness: its jobs take the CPU that the merges
 * and, on a shared machine, the peers leave. */
#define BACKGROUND_NICE 19

static void *lane_main(void *arg) {
    lane *l = arg;
    coord_writer *w = l->w;
    /* Linux keeps a nice value per thread; elsewhere this may apply to
     * the process or fail, and the lane then runs at the usual priority. */
    if (l->nice) (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), l->nice);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!l->queue && !w->stopping) pthread_cond_wait(&l->cv, &w->mu);
        coord_job *j = l->queue;
        if (!j) break;
        l->queue = j->next;
        if (!l->queue) l->tail = NULL;
        j->next = NULL;
        pthread_mutex_unlock(&w->mu);
        memset(&j->err, 0, sizeof j->err);
        j->rc = j->run(l->db, j, &j->err);
        if (j->rc != VL_OK && j->err.code == 0) j->err.code = j->rc;
        pthread_mutex_lock(&w->mu);
        hand_back(w, j, j);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Queues job to l, or runs it at once where l has no thread (a writer
 * without threads, or one that is stopping). */
static void lane_queue(coord_writer *w, lane *l, storage *db_now, coord_job *job) {
    job->next = NULL;
    job->rc = 0;
    w->outstanding++;
    if (!l->has) {
        memset(&job->err, 0, sizeof job->err);
        job->rc = job->run(db_now, job, &job->err);
        if (job->rc != VL_OK && job->err.code == 0) job->err.code = job->rc;
        pthread_mutex_lock(&w->mu);
        hand_back(w, job, job);
        pthread_mutex_unlock(&w->mu);
        return;
    }
    pthread_mutex_lock(&w->mu);
    append(&l->queue, &l->tail, job, job);
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&w->mu);
}

void coord_writer_compute(coord_writer *w, coord_job *job) {
    lane_queue(w, &w->compute, w->db, job);
}

void coord_writer_background(coord_writer *w, coord_job *job) {
    lane_queue(w, &w->background, NULL, job);
}

static int lane_start(coord_writer *w, lane *l, const char *what, vl_error *err) {
    l->w = w;
    if (pthread_create(&l->thread, NULL, lane_main, l) != 0)
        return vl_fail(err, VL_ERR, "cannot start the %s thread", what);
    l->has = 1;
    return VL_OK;
}

/* Hands finished jobs back to their owners, oldest first, then tells the
 * hook when the disk has filled or found room since it last heard. */
static void deliver(coord_writer *w) {
    pthread_mutex_lock(&w->mu);
    coord_job *j = w->done;
    w->done = w->done_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    while (j) {
        coord_job *next = j->next;
        j->next = NULL;
        if (w->outstanding > 0) w->outstanding--;
        j->done(j, j->rc, &j->err);
        j = next;
    }
    pthread_mutex_lock(&w->mu);
    int full = w->full;
    vl_error e = w->full_err;
    pthread_mutex_unlock(&w->mu);
    if (full != w->full_reported && w->full_hook) {
        w->full_reported = full;
        w->full_hook(w->full_arg, full, &e);
    }
}

void coord_writer_set_full_hook(coord_writer *w, coord_writer_full_fn fn, void *arg) {
    w->full_hook = fn;
    w->full_arg = arg;
}

int coord_writer_disk_full(coord_writer *w) {
    if (!w) return 0;
    pthread_mutex_lock(&w->mu);
    int full = w->full;
    pthread_mutex_unlock(&w->mu);
    return full;
}

static void on_pipe(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    char sink[256];
    while (read(fd, sink, sizeof sink) > 0) {}
    deliver(arg);
}

static int open_common(const char *db_path, coord_writer **out, vl_error *err) {
    coord_writer *w = calloc(1, sizeof *w);
    if (!w) return vl_fail(err, VL_ENOMEM, "out of memory for the database writer");
    w->pipe_rd = w->pipe_wr = -1;
    int rc = storage_open(db_path, 0, &w->db, err);
    if (rc != VL_OK) {
        free(w);
        return rc;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_cond_init(&w->ckpt_cv, NULL);
    pthread_cond_init(&w->compute.cv, NULL);
    pthread_cond_init(&w->background.cv, NULL);
    w->compute.w = w->background.w = w;
    w->background.nice = BACKGROUND_NICE;
    *out = w;
    return VL_OK;
}

int coord_writer_start_sync(const char *db_path, coord_writer **out, vl_error *err) {
    return open_common(db_path, out, err);
}

int coord_writer_start(const char *db_path, struct event_base *base, coord_writer **out,
                       vl_error *err) {
    coord_writer *w = NULL;
    int rc = open_common(db_path, &w, err);
    if (rc != VL_OK) return rc;
    int fds[2];
    if (pipe(fds) != 0) {
        rc = vl_fail(err, VL_EIO, "cannot make the writer's pipe: %s", strerror(errno));
        goto fail;
    }
    w->pipe_rd = fds[0];
    w->pipe_wr = fds[1];
    if (fcntl(fds[0], F_SETFL, O_NONBLOCK) != 0 || fcntl(fds[1], F_SETFL, O_NONBLOCK) != 0 ||
        fcntl(fds[0], F_SETFD, FD_CLOEXEC) != 0 || fcntl(fds[1], F_SETFD, FD_CLOEXEC) != 0) {
        rc = vl_fail(err, VL_EIO, "cannot set up the writer's pipe: %s", strerror(errno));
        goto fail;
    }
    w->ev = event_new(base, w->pipe_rd, EV_READ | EV_PERSIST, on_pipe, w);
    if (!w->ev || event_add(w->ev, NULL) != 0) {
        rc = vl_fail(err, VL_ENOMEM, "cannot watch the writer's pipe");
        goto fail;
    }
    if ((rc = storage_open(db_path, 0, &w->ckpt_db, err)) != VL_OK) goto fail;
    if ((rc = storage_set_autocheckpoint(w->db, 0, err)) != VL_OK) goto fail;
    if (pthread_create(&w->ckpt_thread, NULL, ckpt_main, w) != 0) {
        rc = vl_fail(err, VL_ERR, "cannot start the database checkpoint thread");
        goto fail;
    }
    w->has_ckpt = 1;
    if ((rc = storage_open(db_path, 0, &w->compute.db, err)) != VL_OK ||
        (rc = lane_start(w, &w->compute, "compute", err)) != VL_OK ||
        (rc = lane_start(w, &w->background, "background", err)) != VL_OK)
        goto fail;
    if (pthread_create(&w->thread, NULL, thread_main, w) != 0) {
        rc = vl_fail(err, VL_ERR, "cannot start the database writer thread");
        goto fail;
    }
    w->has_thread = 1;
    *out = w;
    return VL_OK;
fail:
    coord_writer_stop(w);
    return rc;
}

uint64_t coord_writer_submit(coord_writer *w, coord_job *job) {
    job->next = NULL;
    job->rc = 0;
    job->seq = ++w->submitted;
    w->outstanding++;
    pthread_mutex_lock(&w->mu);
    append(&w->queue, &w->queue_tail, job, job);
    w->stats.queued++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return job->seq;
}

uint64_t coord_writer_settled(coord_writer *w) {
    if (!w) return 0;
    pthread_mutex_lock(&w->mu);
    uint64_t s = w->settled;
    pthread_mutex_unlock(&w->mu);
    return s;
}

size_t coord_writer_pending(const coord_writer *w) {
    return w ? w->outstanding : 0;
}

void coord_writer_stats_get(coord_writer *w, coord_writer_stats *out) {
    pthread_mutex_lock(&w->mu);
    *out = w->stats;
    pthread_mutex_unlock(&w->mu);
}

size_t coord_writer_run_once(coord_writer *w) {
    pthread_mutex_lock(&w->mu);
    if (!w->queue) {
        pthread_mutex_unlock(&w->mu);
        return 0;
    }
    coord_job *last;
    coord_job *batch = take_batch(w, &last);
    pthread_mutex_unlock(&w->mu);
    size_t n = 0;
    for (coord_job *j = batch; j; j = j->next) n++;
    run_batch(w, batch);
    pthread_mutex_lock(&w->mu);
    append(&w->done, &w->done_tail, batch, last);
    pthread_mutex_unlock(&w->mu);
    deliver(w);
    return n;
}

void coord_writer_stop(coord_writer *w) {
    if (!w) return;
    if (w->has_thread || w->has_ckpt || w->compute.has || w->background.has) {
        pthread_mutex_lock(&w->mu);
        w->stopping = 1;
        pthread_cond_signal(&w->cv);
        pthread_cond_signal(&w->ckpt_cv);
        pthread_cond_signal(&w->compute.cv);
        pthread_cond_signal(&w->background.cv);
        pthread_mutex_unlock(&w->mu);
        /* Each thread finishes its queue before it ends (the writer's
         * commits may still wake the checkpointer, which then ends too). */
        if (w->compute.has) pthread_join(w->compute.thread, NULL);
        if (w->background.has) pthread_join(w->background.thread, NULL);
        if (w->has_thread) pthread_join(w->thread, NULL);
        if (w->has_ckpt) pthread_join(w->ckpt_thread, NULL);
        w->has_thread = w->has_ckpt = w->compute.has = w->background.has = 0;
    }
    /* A delivered computation may submit its writes, and a delivered job
     * queue more computing, which now runs at once; both end up here. */
    for (;;) {
        deliver(w);
        if (coord_writer_run_once(w) > 0) continue;
        pthread_mutex_lock(&w->mu);
        int more = w->done != NULL;
        pthread_mutex_unlock(&w->mu);
        if (!more) break;
    }
    if (w->ev) event_free(w->ev);
    if (w->pipe_rd >= 0) close(w->pipe_rd);
    if (w->pipe_wr >= 0) close(w->pipe_wr);
    storage_close(w->compute.db);
    storage_close(w->ckpt_db);
    storage_close(w->db);
    pthread_cond_destroy(&w->background.cv);
    pthread_cond_destroy(&w->compute.cv);
    pthread_cond_destroy(&w->ckpt_cv);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
