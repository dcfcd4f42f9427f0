/*
 * dashboard: the operator's live page on the admin listener (metrics.h
 * serves it). GET / is one self-contained page, built into the binary from
 * dashboard/index.html, that draws its charts in SVG and polls GET
 * /dashboard.json every few seconds. That JSON gathers what /v1/status and
 * /metrics are built from, plus what only the operator may see: each
 * peer's name, address, hardware and figures, and the recent refusals
 * with the address they came from. None of it is served on the public
 * port.
 *
 * Contents: coord_dashboard_json.
 */
#ifndef VOLLEY_COORD_DASHBOARD_H
#define VOLLEY_COORD_DASHBOARD_H

#include <stddef.h>

#include <jansson.h>

#include "common/common.h"
#include "coordinator/coord.h"

struct coord_server;

/* The page's bytes (coord_dashboard_html_len of them, then a NUL),
 * generated at build time from dashboard/index.html (dashboard/embed.cmake). */
extern const unsigned char coord_dashboard_html[];
extern const size_t coord_dashboard_html_len;

/* The dashboard's figures (docs/operations.md lists them): "status", the
 * object GET /v1/status answers (coord_status_json); "metrics", the
 * counters /metrics writes; "peers", one object per registered peer;
 * "minutes", the last hour of uploads minute by minute; "refusals", the
 * latest refused requests, newest first; "config", the run's
 * configuration as peers get it; and "dense_update_bytes", what an
 * uncompressed update of the model would take. Read on the loop, from the
 * loop's database connection. The caller owns the result (json_decref);
 * NULL with err set on a database error or no memory. */
json_t *coord_dashboard_json(struct coord_server *srv, vl_error *err);

#endif
