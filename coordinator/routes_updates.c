/* POST /v1/updates: validation in the order of protocol.md, one
 * transaction per accepted update, 202 only after it commits. */
#include <stdio.h>
#include <string.h>

#include "compress/compress.h"
#include "coordinator/coord.h"
#include "coordinator/scheduler.h"

/* The metadata of an update that parsed but failed a range check (shape,
 * dtype, finiteness): decoding stopped before filling it in, and the
 * checks that come first in protocol order still need it. */
static int read_meta(const uint8_t *body, size_t len, compress_update_meta *m) {
    st_file f;
    if (st_parse(body, len, &f, NULL) != VL_OK) return -1;
    const char *run = st_meta_get(&f, "run");
    const char *task = st_meta_get(&f, "task");
    const char *peer = st_meta_get(&f, "peer");
    const char *base = st_meta_get(&f, "base_version");
    const char *kind = st_meta_get(&f, "kind");
    int ok = run && strlen(run) < sizeof m->run && task && peer && base && kind &&
             parse_i64(task, 1, INT64_MAX, &m->task) == VL_OK &&
             parse_i64(peer, 1, INT64_MAX, &m->peer) == VL_OK &&
             parse_i64(base, 0, INT64_MAX, &m->base_version) == VL_OK &&
             compress_kind_parse(kind, &m->kind) == VL_OK;
    if (ok) snprintf(m->run, sizeof m->run, "%s", run);
    st_free(&f);
    return ok ? 0 : -1;
}

/* Checks the task side of an update in protocol order; answers and
 * returns -1 on the first failure. */
static int check_task(coord_req *cr, const compress_update_meta *m, storage_task *t,
                      int64_t now) {
    coord_server *srv = cr->srv;
    vl_error e = {0};
    if (coord_check_task_owner(cr, "update", m->run, m->peer, m->task, t) != 0) return -1;
    int exists = 0;
    if (storage_update_exists(srv->db, t->id, &exists, &e) != VL_OK) {
        coord_reply_internal(cr, &e);
        return -1;
    }
    if (exists || t->state == STORAGE_TASK_DONE) {
        coord_reply_error(cr, 409, "duplicate_update", "task %lld already has its update",
                          (long long)t->id);
        return -1;
    }
    if (m->base_version != t->base_version) {
        coord_reply_error(cr, 422, "wrong_version", "update says base version %lld; task %lld "
                          "is based on %lld", (long long)m->base_version, (long long)t->id,
                          (long long)t->base_version);
        return -1;
    }
    if (t->base_version != srv->version) {
        coord_reply_error(cr, 409, "stale_update", "update is based on version %lld; current "
                          "is %lld", (long long)t->base_version, (long long)srv->version);
        return -1;
    }
    if (t->state == STORAGE_TASK_EXPIRED || t->deadline <= now) {
        int64_t slots = 0;
        if (storage_task_count_slots(srv->db, srv->version, now, &slots, &e) != VL_OK) {
            coord_reply_internal(cr, &e);
            return -1;
        }
        if (!coord_sched_accept_late(1, slots, srv->cfg.updates_per_version)) {
            coord_reply_error(cr, 409, "task_expired", "the lease of task %lld ended and its "
                              "slot was given to another task", (long long)t->id);
            return -1;
        }
    }
    const char *want = coord_config_update_kind(&srv->cfg);
    if (strcmp(compress_kind_name(m->kind), want) != 0) {
        coord_reply_error(cr, 422, "wrong_kind", "this run takes \"%s\" updates, not \"%s\"",
                          want, compress_kind_name(m->kind));
        return -1;
    }
    return 0;
}

static int store(coord_server *srv, const compress_update_meta *m, const storage_task *t,
                 const uint8_t *body, size_t len, int64_t now, int64_t *id, vl_error *err) {
    storage_update u = {.task_id = t->id, .peer_id = t->peer_id,
                        .base_version = t->base_version, .num_samples = m->num_samples,
                        .local_steps = m->local_steps, .loss = m->loss, .nbytes = (int64_t)len,
                        .blob = body, .received_at = now};
    snprintf(u.kind, sizeof u.kind, "%s", compress_kind_name(m->kind));
    int rc = storage_begin(srv->db, err);
    if (rc != VL_OK) return rc;
    rc = storage_update_insert(srv->db, &u, id, err);
    if (rc == VL_OK) rc = storage_task_set_state(srv->db, t->id, STORAGE_TASK_DONE, err);
    if (rc == VL_OK) rc = storage_peer_touch(srv->db, t->peer_id, now, err);
    if (rc == VL_OK) return storage_commit(srv->db, err);
    storage_rollback(srv->db);
    return rc;
}

void coord_route_updates(coord_req *cr) {
    coord_server *srv = cr->srv;
    size_t len;
    const uint8_t *body = coord_body(cr, &len);
    if (coord_authenticate(cr, body, len) != 0) return;
    if (len > (uint64_t)srv->cfg.max_body_bytes) {
        coord_reply_error(cr, 413, "too_large", "an update is at most %lld bytes",
                          (long long)srv->cfg.max_body_bytes);
        return;
    }
    if (!body) {
        coord_reply_error(cr, 400, "malformed_update", "the body is empty");
        return;
    }
    compress_update cu;
    vl_error e = {0};
    const char *code = "malformed_update";
    int rc = compress_update_decode(body, len, srv->n_params, &cu, &code, &e);
    compress_update_meta meta;
    memset(&meta, 0, sizeof meta);
    if (rc == VL_OK) {
        meta = cu.meta;
    } else if (rc != VL_ERANGE || read_meta(body, len, &meta) != 0) {
        coord_reply_error(cr, 400, "malformed_update", "%s", e.msg);
        return;
    }
    int64_t now = clock_unix_s();
    storage_task t;
    if (check_task(cr, &meta, &t, now) != 0) {
        if (rc == VL_OK) compress_update_free(&cu);
        return;
    }
    if (rc == VL_ERANGE) {
        coord_reply_error(cr, 422, code ? code : "bad_shape", "%s", e.msg);
        return;
    }
    rc = compress_update_check_spec(&cu, &srv->spec, &code, &e);
    compress_update_free(&cu);
    if (rc != VL_OK) {
        coord_reply_error(cr, 422, code ? code : "wrong_sketch", "%s", e.msg);
        return;
    }
    int64_t id = 0;
    vl_error se = {0};
    rc = store(srv, &meta, &t, body, len, now, &id, &se);
    if (rc == VL_ECONFLICT) {
        coord_reply_error(cr, 409, "duplicate_update", "task %lld already has its update",
                          (long long)t.id);
        return;
    }
    if (rc != VL_OK) {
        coord_reply_internal(cr, &se);
        return;
    }
    coord_reply_json(cr, 202, json_pack("{s:I, s:I}", "update_id", (json_int_t)id, "version",
                                        (json_int_t)t.base_version));
    int64_t done = 0;
    if (storage_task_count_done(srv->db, srv->version, &done, &se) != VL_OK)
        log_error("cannot count updates: %s", se.msg);
    else if (done >= srv->cfg.updates_per_version)
        coord_schedule_merge(srv);
}
