/*
 * status: the run's summary as GET /v1/status and `volley-coordinator
 * status` show it (status.c), and a peer's state by its activity.
 *
 * Contents: coord_peer_state, coord_status_json, coord_cmd_status,
 * COORD_GONE_LEASES, COORD_STATUS_CACHE_S.
 */
#ifndef VOLLEY_COORD_OPS_STATUS_H
#define VOLLEY_COORD_OPS_STATUS_H

#include <stdio.h>

#include "coordinator/coord.h"
#include "coordinator/run/writer.h"
#include "coordinator/config/config.h"

/* A peer silent this many lease lengths (and holding no lease) is gone. */
#define COORD_GONE_LEASES 3
/* GET /v1/status is built at most once per this many seconds; requests in
 * between get the same answer. */
#define COORD_STATUS_CACHE_S 1.0
/* "active", "idle", "gone" or "revoked" for a peer's activity at now. */
const char *coord_peer_state(const storage_peer_activity *a, int64_t now, int64_t lease_s);
/* The run's summary as GET /v1/status answers it, read from db (status.c):
 * cfg, version and finished describe the run; ws (NULL outside a running
 * server) adds the writer's counters and accuracy (NULL: not a
 * classifier) the test accuracy. The caller owns the result (json_decref);
 * NULL with err set on a database error or no memory. */
json_t *coord_status_json(storage *db, const coord_config *cfg, int64_t version, int finished,
                          const coord_writer_stats *ws, const double *accuracy, vl_error *err);
/* `status --db`: the same summary for a stopped coordinator or a copy of
 * its database, printed to out as indented JSON. Reads only. */
int coord_cmd_status(const char *db_path, FILE *out, vl_error *err) VL_MUST_CHECK;

#endif
