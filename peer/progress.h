/*
 * progress: what this peer has done for its run, kept across restarts in
 * DIR/progress.json so that `volley-peer status` can answer a volunteer's
 * first question (is it doing anything?) without a coordinator, a log or
 * a running peer. Written atomically after every judged upload; losing
 * the file loses only these counts, never training state.
 */
#ifndef VOLLEY_PEER_PROGRESS_H
#define VOLLEY_PEER_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

#include "common/common.h"

#define PEER_PROGRESS_FILE "progress.json"

typedef struct peer_progress {
    int64_t accepted;     /* updates the coordinator stored */
    int64_t dropped;      /* updates it no longer wanted (stale, expired) */
    int64_t last_task;    /* the last task whose upload was judged; 0: none */
    int64_t last_version; /* that task's base version */
    double last_loss;     /* its mean training loss */
    int64_t last_at;      /* when its answer came, unix seconds */
    int64_t bytes_up;     /* update bytes sent, all runs of this directory */
    char device[96];      /* what the last `run` trained on */
} peer_progress;

/* Reads DIR/progress.json into *p. A missing file is a peer that has done
 * nothing yet: *p zeroed and VL_OK. A file that is not what
 * peer_progress_save writes (not JSON, a negative or non-integer count,
 * an over-long device) is VL_EINVAL naming it; over 64 KiB VL_ETOOBIG. */
int peer_progress_load(const char *dir, peer_progress *p, vl_error *err) VL_MUST_CHECK;

/* Writes *p to DIR/progress.json atomically (mode 0600). */
int peer_progress_save(const char *dir, const peer_progress *p, vl_error *err) VL_MUST_CHECK;

/* `volley-peer status`: prints to out what the peer in dir knows of
 * itself, one fact a line, each whole however long: its id, name,
 * coordinator and run (peer.json), the run's progress (asked of the
 * coordinator when ask, one try of at most 10 s, else or failing that
 * what the directory knows, saying which), what it has done
 * (progress.json), whether an upload waits to be sent again (pending.st)
 * and whether training state is kept (trainer.st). VL_ENOTFOUND when the
 * peer never joined. Writes nothing in dir. */
int peer_status_print(const char *dir, int ask, FILE *out, vl_error *err) VL_MUST_CHECK;

struct peer_response;
/* GET /v1/status of coordinator, signed with dir's key, tried once. 0 with
 * the answer in rs (initialised by the caller, which frees it), or
 * non-zero with why ("did not answer (...)") written. */
int peer_status_fetch(const char *dir, const char *coordinator, const char *cacert, int64_t peer_id,
                      struct peer_response *rs, char *why, size_t cap);

/* The run's progress in words into out: from body, a GET /v1/status
 * answer (NULL or not one: none), "version V of MAX (running);
 * validation loss L at version W, F at the start (from the coordinator)";
 * else what p knows, with why the coordinator's word is missing. */
void peer_status_run_line(const char *body, size_t len, const peer_progress *p, const char *why,
                          char *out, size_t cap);

#endif
