/* The HTTP side of the Sketched-SGD second round. GET /v1/round long-polls
 * until the round of a version opens and then hands out its candidates;
 * POST /v1/round/values takes a peer's exact values for them, checked in
 * the order of protocol.md, stored in one transaction before the 202. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "coordinator/coord.h"
#include "coordinator/api/api.h"
#include "coordinator/config/config.h"
#include "coordinator/http/http.h"
#include "coordinator/run/run.h"
#include "coordinator/run/writer.h"
#include "coordinator/sched/schedule.h"

static int no_round(coord_req *cr) {
    if (coord_config_round_candidates(&cr->srv->run.cfg) > 0) return 0;
    coord_reply_error(cr, 404, "no_round",
                      "this run has no second round "
                      "(compression.second_round is 0)");
    return 1;
}

/* The version a round request names, parsed again on every try (a waiting
 * request keeps only its coord_req); a bad query is answered 400. Returns
 * 0 or COORD_ANSWERED. */
static int round_query(coord_req *cr, int64_t *version, int64_t *wait) {
    const char *const keys[] = {"version", "wait", NULL};
    int64_t vals[2] = {0, 0};
    unsigned present = 0;
    if (coord_req_version(cr, keys, vals, &present, COORD_VERSION_NEEDED, version) != 0)
        return COORD_ANSWERED;
    if (vals[1] > COORD_MAX_WAIT_S) {
        coord_reply_error(cr, 400, "bad_request", "wait is 0 to %d", COORD_MAX_WAIT_S);
        return COORD_ANSWERED;
    }
    *wait = vals[1];
    return 0;
}

/* Answers with the round's candidates, or 410 once it is over; 0 (keep
 * waiting) while the version still lacks updates. */
static int serve_round(coord_req *cr) {
    coord_server *srv = cr->srv;
    int64_t version = 0, wait = 0;
    vl_error e = {0};
    if (round_query(cr, &version, &wait) != 0) return 1;
    if (version < srv->run.version || srv->run.finished) {
        coord_reply_error(cr, 410, "round_closed",
                          "version %lld has been merged; the current "
                          "version is %lld",
                          (long long)version, (long long)srv->run.version);
        return 1;
    }
    storage_round r;
    int rc = storage_round_get(srv->run.db, version, &r, &e);
    if (rc == VL_ENOTFOUND) return 0;
    if (rc != VL_OK) {
        coord_reply_internal(cr, &e);
        return 1;
    }
    compress_round_meta m = {.version = version, .deadline = r.deadline};
    snprintf(m.run, sizeof m.run, "%s", srv->run.cfg.name);
    vl_buf b;
    vl_buf_init(&b, (size_t)srv->run.cfg.max_body_bytes);
    rc = compress_round_encode_candidates(&m, r.candidates, r.n, &b, &e);
    storage_round_free(&r);
    coord_blob *blob = NULL;
    if (rc == VL_OK) {
        size_t len;
        uint8_t *data = vl_buf_steal(&b, &len);
        blob = coord_blob_wrap(data, len, version);
        if (!blob) rc = vl_fail(&e, VL_ENOMEM, "out of memory sending a round");
    }
    vl_buf_free(&b);
    if (!blob) {
        coord_reply_internal(cr, &e);
        return 1;
    }
    coord_reply_blob(cr, blob);
    return 1;
}

void coord_route_round(coord_req *cr) {
    coord_server *srv = cr->srv;
    int64_t version = 0, wait = 0;
    if (round_query(cr, &version, &wait) != 0) return;
    if (no_round(cr)) return;
    if (srv->draining) {
        coord_reply_error(cr, 503, "draining", "the coordinator is shutting down");
        return;
    }
    if (coord_req_version_made(cr, version) != 0) return;
    if (serve_round(cr)) return;
    if (wait == 0) {
        coord_reply(cr, 204, NULL, NULL);
        return;
    }
    if (coord_waiter_add(cr, wait, serve_round) != 0) {
        coord_reply_oom(cr, "registering a waiter");
    }
}

/* The checks of a values upload that come before its content, in protocol
 * order; answers and returns COORD_ANSWERED on the first failure, else fills in the
 * update's id. */
static int check_round(coord_req *cr, const compress_round_meta *m, int64_t *update_id) {
    coord_server *srv = cr->srv;
    vl_error e = {0};
    storage_task t;
    if (coord_check_task_owner(cr, "the values file", m->run, m->peer, m->task, &t) != 0)
        return COORD_ANSWERED;
    int rc;
    int64_t base = -1, merged = -1;
    rc = storage_update_find(srv->run.db, t.id, update_id, &base, &merged, &e);
    if (rc != VL_OK && rc != VL_ENOTFOUND) {
        coord_reply_internal(cr, &e);
        return COORD_ANSWERED;
    }
    int has_update = rc == VL_OK, dup = 0;
    /* Before the round's state: a retry whose 202 was lost must hear that
     * its values are stored, even once the round has closed. */
    if (has_update && storage_round_values_has(srv->run.db, *update_id, &dup, &e) != VL_OK) {
        coord_reply_internal(cr, &e);
        return COORD_ANSWERED;
    }
    if (dup) {
        coord_reply_error(cr, 409, "duplicate_values", "task %lld already reported its values",
                          (long long)t.id);
        return COORD_ANSWERED;
    }
    if (m->version < srv->run.version || srv->run.finished) {
        coord_reply_error(cr, 410, "round_closed",
                          "version %lld has been merged; the current "
                          "version is %lld",
                          (long long)m->version, (long long)srv->run.version);
        return COORD_ANSWERED;
    }
    if (coord_req_version_made(cr, m->version) != 0) return COORD_ANSWERED;
    storage_round r;
    rc = storage_round_get(srv->run.db, m->version, &r, &e);
    if (rc == VL_ENOTFOUND) {
        coord_reply_error(cr, 409, "round_not_open",
                          "the round of version %lld has not opened "
                          "(it opens when the version has all its updates)",
                          (long long)m->version);
        return COORD_ANSWERED;
    }
    storage_round_free(&r);
    if (rc != VL_OK) {
        coord_reply_internal(cr, &e);
        return COORD_ANSWERED;
    }
    if (!has_update || base != m->version || merged >= 0) {
        coord_reply_error(cr, 422, "not_in_round",
                          "task %lld has no update in the round of "
                          "version %lld",
                          (long long)t.id, (long long)m->version);
        return COORD_ANSWERED;
    }
    return 0;
}

/* Reported values on their way to the database. */
typedef struct values_job {
    coord_job job;
    coord_req cr;
    int64_t update_id, version, task, now;
    float *vals; /* owned */
    size_t n;
} values_job;

static int values_run(storage *db, coord_job *job, vl_error *err) {
    values_job *j = (values_job *)job;
    return storage_round_values_insert(db, j->update_id, j->version, j->vals, j->n, j->now, err);
}

static void values_done(coord_job *job, int rc, const vl_error *err) {
    values_job *j = (values_job *)job;
    coord_req *cr = &j->cr;
    coord_server *srv = cr->srv;
    if (rc == VL_ECONFLICT) {
        coord_reply_error(cr, 409, "duplicate_values", "task %lld already reported its values",
                          (long long)j->task);
    } else if (rc != VL_OK) {
        coord_reply_internal(cr, err);
    } else {
        int64_t have = 0, done = 0;
        vl_error se = {0};
        if (storage_round_values_count(srv->run.db, j->version, &have, &se) != VL_OK ||
            storage_task_count_done(srv->run.db, j->version, &done, &se) != VL_OK) {
            /* Stored all the same; the deadline merges the round. */
            vl_log_error("cannot count round values: %s", se.msg);
            coord_reply_json(cr, 202, json_pack("{s:I}", "version", (json_int_t)j->version));
        } else {
            coord_reply_json(cr, 202,
                             json_pack("{s:I, s:I, s:I}", "version", (json_int_t)j->version,
                                       "reported", (json_int_t)have, "updates", (json_int_t)done));
            if (have >= done) coord_schedule_merge(srv);
        }
    }
    free(j->vals);
    free(j);
}

void coord_route_round_values(coord_req *cr) {
    coord_server *srv = cr->srv;
    size_t len;
    const uint8_t *body = coord_body(cr, &len);
    if (no_round(cr)) return;
    if (!body) {
        coord_reply_error(cr, 400, "malformed_values", "the body is empty");
        return;
    }
    size_t want = (size_t)coord_config_round_candidates(&srv->run.cfg);
    compress_round_meta m;
    float *vals = NULL;
    size_t n = 0;
    const char *code = NULL;
    vl_error e = {0};
    int rc = compress_round_decode_values(body, len, want, &m, &vals, &n, &code, &e);
    if (rc == VL_ENOMEM) {
        coord_reply_internal(cr, &e);
        return;
    }
    if (rc != VL_OK && rc != VL_ERANGE) {
        coord_reply_error(cr, 400, "malformed_values", "%s", e.msg);
        return;
    }
    int64_t update_id = 0;
    if (check_round(cr, &m, &update_id) != 0) {
        free(vals);
        return;
    }
    if (rc == VL_ERANGE) {
        coord_reply_error(cr, 422, code ? code : "bad_shape", "%s", e.msg);
        return;
    }
    values_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(vals);
        coord_reply_oom(cr, "queueing round values");
        return;
    }
    j->job.run = values_run;
    j->job.done = values_done;
    j->cr = *cr;
    j->update_id = update_id;
    j->version = m.version;
    j->task = m.task;
    j->vals = vals;
    j->n = n;
    j->now = vl_clock_unix_s();
    coord_writer_submit(srv->run.writer, &j->job);
}
