/*
 * The coordinator's one database writer: a thread with its own SQLite
 * connection that runs every write the server makes, batching whatever
 * is queued into one transaction (group commit).
 *
 * Why: an upload may be acknowledged only once the transaction holding it
 * has committed, and each commit costs an fsync. One commit per upload
 * would cap ingest at the disk's fsync rate, and a commit on the event
 * loop would stall every other request while the disk works. Here the
 * loop validates a request, queues a job and goes on; the writer takes
 * all queued jobs, runs each inside its own savepoint of a single
 * transaction (a job that fails is undone without touching the others),
 * commits once, and only then hands the jobs back to the loop, which
 * answers them. A job is never told it succeeded before its commit.
 *
 * Reads stay on the loop's own connection (WAL lets them run while the
 * writer writes), and a job's done callback runs after its commit, so
 * what the loop reads then includes it.
 *
 * Long computations that only read (making a version: decoding its
 * updates, the outer step, the validation loss) go to a compute thread
 * with a read connection of its own, so the loop keeps answering while
 * they run; their done callbacks come back to the loop the same way.
 *
 * Contents: coord_job, coord_job_run_fn, coord_job_done_fn, coord_writer,
 * coord_writer_stats, coord_writer_start, coord_writer_submit,
 * coord_writer_settled, coord_writer_compute, coord_writer_background,
 * coord_writer_pending, coord_writer_stats_get, coord_writer_full_fn,
 * coord_writer_set_full_hook, coord_writer_disk_full, coord_writer_stop,
 * coord_writer_run_once, coord_writer_start_sync,
 * COORD_WRITER_BATCH_BUCKETS, COORD_WRITER_COMMIT_BUCKETS,
 * COORD_WRITER_MAX_BATCH.
 */
#ifndef VOLLEY_COORD_WRITER_H
#define VOLLEY_COORD_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "storage/storage.h"

struct event_base;

typedef struct coord_job coord_job;

/* Runs on the writer thread inside the batch's transaction and its own
 * savepoint: returns 0, or a VL_E* code (with err set) to have its
 * writes undone. It must touch nothing but db and its own job. */
typedef int (*coord_job_run_fn)(storage *db, coord_job *job, vl_error *err);
/* Runs on the loop thread once the job's transaction has committed (rc 0)
 * or failed (rc < 0: the job's own error, or the commit's, which undid
 * every job of the batch). The job's memory is the caller's again. */
typedef void (*coord_job_done_fn)(coord_job *job, int rc, const vl_error *err);

/* A unit of writing. Embed it in a struct of your own and recover that in
 * the callbacks; it must stay alive from submit until done has run. */
struct coord_job {
    coord_job_run_fn run;
    coord_job_done_fn done;
    /* Set by the writer. */
    int rc;
    vl_error err;
    uint64_t seq; /* its submission number, given by coord_writer_submit */
    coord_job *next;
};

typedef struct coord_writer coord_writer;

/* Upper bounds of the two histograms' buckets (/metrics): jobs per
 * transaction (COORD_WRITER_MAX_BATCH caps the last) and seconds a commit
 * took, its fsyncs of the body segment and of the WAL included. */
#define COORD_WRITER_BATCH_BUCKETS 10
#define COORD_WRITER_COMMIT_BUCKETS 12
extern const double coord_writer_batch_le[COORD_WRITER_BATCH_BUCKETS];
extern const double coord_writer_commit_le[COORD_WRITER_COMMIT_BUCKETS];

/* Counters since start, for /v1/status, /metrics and the ingest
 * benchmark. */
typedef struct coord_writer_stats {
    uint64_t jobs;        /* jobs run */
    uint64_t commits;     /* transactions committed (one fsync of the WAL each) */
    uint64_t failed;      /* jobs that ended with an error, their own or the commit's */
    uint64_t max_batch;   /* most jobs in one transaction */
    uint64_t queued;      /* jobs waiting now */
    uint64_t checkpoints; /* WAL checkpoints run (each copies pages and syncs the database) */
    /* Per bucket of the bounds above, not cumulative; the extra last one
     * counts what exceeds them all. Every transaction is in batch_hist
     * (its counts sum to the transactions, its jobs to `jobs`), only
     * those that committed in commit_hist (summing to `commits`). */
    uint64_t batch_hist[COORD_WRITER_BATCH_BUCKETS + 1];
    uint64_t commit_hist[COORD_WRITER_COMMIT_BUCKETS + 1];
    double commit_seconds; /* the commits' time together */
} coord_writer_stats;

/* Most jobs one transaction takes; the rest wait for the next. */
#define COORD_WRITER_MAX_BATCH 1024

/* Opens a second connection to the database at db_path and starts the
 * thread; done callbacks are delivered on base's loop. *out is the
 * caller's (coord_writer_stop). */
int coord_writer_start(const char *db_path, struct event_base *base, coord_writer **out,
                       vl_error *err) VL_MUST_CHECK;

/* Queues job (run and done set). Never fails: the job is the writer's
 * until its done callback. Returns its submission number, 1 for the
 * first job and one more for each after it. Loop thread only. */
uint64_t coord_writer_submit(coord_writer *w, coord_job *job);

/* The highest submission number whose transaction has ended (committed,
 * or rolled back): jobs run in submission order, so every job numbered
 * up to it is settled, and what those committed is visible to any
 * connection that starts reading after this call. Their done callbacks
 * may not have run yet: this is how the loop tells a write already in
 * the database from one still on its way, without counting it twice.
 * 0 for NULL. Any thread. */
uint64_t coord_writer_settled(coord_writer *w);

/* Queues job to the compute thread, which runs job->run with its own read
 * connection (db) outside any transaction; a job may only read the
 * database there. done then runs on the loop with its rc. Jobs run one at
 * a time, in order. A writer with no thread runs it at once, on the
 * calling thread, and delivers done at the next coord_writer_run_once.
 * Loop thread only. */
void coord_writer_compute(coord_writer *w, coord_job *job);

/* Queues job to the background thread, which runs job->run with db NULL
 * at a lower CPU priority than the rest of the coordinator (nice +10), for
 * work whose result nothing waits for (scoring a served version on all of
 * the held-out data). Jobs run one at a time, in order, beside the compute
 * thread's; done then runs on the loop. A writer with no thread, or one
 * being stopped, runs it at once on the calling thread. coord_writer_stop
 * runs every queued job before it returns. Loop thread only. */
void coord_writer_background(coord_writer *w, coord_job *job);

/* Jobs submitted (to any thread) and not yet done (the loop waits for
 * 0 to drain). */
size_t coord_writer_pending(const coord_writer *w);

void coord_writer_stats_get(coord_writer *w, coord_writer_stats *out);

/* Told on the loop thread, after the done callbacks of the jobs that
 * showed it, when the disk has filled (full 1: a job or a commit failed
 * with VL_EFULL; err is the first such failure, valid for the call)
 * and when it has room again (full 0: a transaction committed after
 * that). Once per change, however many jobs fail between. */
typedef void (*coord_writer_full_fn)(void *arg, int full, const vl_error *err);
/* Sets the hook (NULL: none) and its argument, borrowed. Loop thread,
 * before the first job is submitted. */
void coord_writer_set_full_hook(coord_writer *w, coord_writer_full_fn fn, void *arg);
/* 1 while the disk is full as the writer last found it (a write failed
 * with VL_EFULL and none has committed since); 0 otherwise and for
 * NULL. Any thread. */
int coord_writer_disk_full(coord_writer *w);

/* Runs every queued job, stops the threads, delivers the remaining done
 * callbacks on the calling (loop) thread (running the writes those submit
 * there too), closes the connections and frees w. NULL is a no-op. */
void coord_writer_stop(coord_writer *w);

/* For tests: processes the current queue on the calling thread as one
 * batch, as the thread would (a writer made by coord_writer_start_sync
 * has no thread). Returns the number of jobs run. */
size_t coord_writer_run_once(coord_writer *w);
/* A writer with no thread and no loop: jobs run when coord_writer_run_once
 * is called, and their done callbacks run right after the batch. */
int coord_writer_start_sync(const char *db_path, coord_writer **out, vl_error *err) VL_MUST_CHECK;

#endif
