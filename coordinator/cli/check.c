/* `volley-coordinator check`: is the database whole after a crash, a power
 * cut or a disk fault? The server refuses nothing at start for a body the
 * disk lost (the merge sets such an update aside and goes on), so an
 * operator who wants to know before serving again, and the power-cut
 * test after every cut, ask here: SQLite's own integrity check, then every
 * update still waiting for a merge read back and decoded, as the merge
 * would. Merged updates are not looked at: their bodies are pruned. */
#include <inttypes.h>
#include <stdio.h>

#include "compress/compress.h"
#include "coordinator/coord.h"
#include "coordinator/cli/cli.h"

typedef struct {
    FILE *out;
    size_t n_params;
    int64_t checked, problems;
} check_ctx;

static int check_update(void *arg, const storage_update *u) {
    check_ctx *c = arg;
    c->checked++;
    if (!u->blob) {
        c->problems++;
        fprintf(c->out, "update %" PRId64 " (task %" PRId64 ", peer %" PRId64 "): %s\n", u->id,
                u->task_id, u->peer_id, u->lost ? u->lost : "its stored body is gone");
        return VL_OK;
    }
    compress_update cu;
    vl_error e = {0};
    int rc = compress_update_decode(u->blob, (size_t)u->nbytes, c->n_params, &cu, NULL, &e);
    if (rc == VL_ENOMEM) return rc;
    if (rc != VL_OK) {
        c->problems++;
        fprintf(c->out,
                "update %" PRId64 " (task %" PRId64 ", peer %" PRId64
                "): its stored body does not decode: %s\n",
                u->id, u->task_id, u->peer_id, e.msg);
        return VL_OK;
    }
    compress_update_free(&cu);
    return VL_OK;
}

int coord_cmd_check(const char *db_path, FILE *out, int64_t *problems, vl_error *err) {
    *problems = 0;
    storage *db = NULL;
    int rc = coord_open_initialised(db_path, &db, err);
    if (rc != VL_OK) return rc;
    rc = storage_integrity_check(db, err);
    storage_run run = {0};
    storage_version v = {0};
    int have_run = 0, have_version = 0;
    if (rc == VL_OK) {
        rc = storage_run_get(db, &run, err);
        have_run = rc == VL_OK;
    }
    /* The size every update must decode to: the current version's, read
     * whole as the server reads it at start. */
    if (rc == VL_OK) {
        rc = storage_version_get(db, run.current_version, 1, &v, err);
        have_version = rc == VL_OK;
    }
    check_ctx c = {.out = out, .n_params = v.n};
    if (rc == VL_OK) rc = storage_update_each_unmerged(db, check_update, &c, err);
    if (rc == VL_ENOMEM && !err->msg[0]) vl_fail(err, rc, "out of memory decoding an update");
    if (rc == VL_OK) {
        fprintf(out,
                "integrity_check ok; version %" PRId64 "; %" PRId64
                " updates wait for a merge, %" PRId64 " of them cannot be read\n",
                run.current_version, c.checked, c.problems);
        *problems = c.problems;
    }
    if (have_version) storage_version_free(&v);
    if (have_run) storage_run_free(&run);
    storage_close(db);
    return rc;
}
