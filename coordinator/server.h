/*
 * server: the HTTPS server's life: open (database, state, loop, writer),
 * bind the handlers to the routes, listen, serve, drain on SIGTERM, and
 * close. What each request does is below it (http/, api/).
 *
 * Contents: coord_serve_opts, coord_serve, coord_server_open,
 * coord_server_close.
 */
#ifndef VOLLEY_COORD_SERVER_H
#define VOLLEY_COORD_SERVER_H

#include "coordinator/coord.h"
#include "coordinator/conn/limits.h"
#include "coordinator/conn/limits_types.h"

/* Options of the serve command. */
typedef struct coord_serve_opts {
    const char *db_path;
    const char *cert_path;
    const char *key_path;
    const char *listen; /* HOST:PORT, [V6]:PORT */
    /* The admin listener (plain HTTP, /metrics): HOST:PORT, or NULL for
     * the default 127.0.0.1:9464, which is given up with a warning when
     * taken; "off" for none. admin_token: a bearer token it requires, or
     * NULL (only allowed on a loopback address). */
    const char *admin_listen;
    const char *admin_token;
    coord_limits limits;
    /* OpenMP threads that make a version (the validation loss above all);
     * 0 leaves OpenMP's default (every core). Fewer take less from the
     * loop and the writer: idle OpenMP workers spin between parallel
     * regions, which on a small coordinator under an upload storm costs
     * ingest more than a faster validation gains. */
    int compute_threads;
} coord_serve_opts;

/* Runs the server until SIGTERM/SIGINT has drained it. Returns 0 on a clean
 * shutdown, else a VL_E* code with err set. */
int coord_serve(const coord_serve_opts *opts, vl_error *err) VL_MUST_CHECK;

/* The server without its network side: opens the database at db_path,
 * loads the run's state, and sets up the event loop, the writer thread,
 * the rate limits and slow-client timer of limits (NULL: the defaults)
 * and an evhttp (srv->conns.http) that hands every request to
 * coord_server_dispatch. No TLS, no listening socket, no signal
 * handlers: coord_serve adds those, and test harnesses attach
 * connections of their own. *out is the caller's (coord_server_close). */
int coord_server_open(const char *db_path, const coord_limits *limits, coord_server **out,
                      vl_error *err) VL_MUST_CHECK;
/* Answers waiting requests, stops the writer (queued jobs still commit and
 * are answered), and frees everything srv holds, connections included. */
void coord_server_close(coord_server *srv);

#endif
