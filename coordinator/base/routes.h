/*
 * routes: the public listener's endpoints as data. Each route names its
 * path, method, the media type its body must have and who must sign it;
 * the layers below the handlers read it (the input guard decides on the
 * head who must have signed, the replies and metrics label a request by
 * its route), and the dispatcher (http/dispatch.c) calls the handler the
 * server bound to each route. No I/O here.
 *
 * Contents: coord_auth_kind, coord_route_id, coord_route; lookups by
 * path and method; method names.
 */
#ifndef VOLLEY_COORD_ROUTES_H
#define VOLLEY_COORD_ROUTES_H

#include <event2/http.h>

/* Who must sign a request to a path: nobody (status, unknown paths), the
 * key a join registers, or a registered peer. */
typedef enum { COORD_AUTH_NONE = 0, COORD_AUTH_JOIN, COORD_AUTH_PEER } coord_auth_kind;

/* Every endpoint of the public listener, in the order of the table. */
typedef enum {
    COORD_ROUTE_JOIN,
    COORD_ROUTE_ROTATE,
    COORD_ROUTE_TASK,
    COORD_ROUTE_MODEL,
    COORD_ROUTE_DELTA,
    COORD_ROUTE_DATA,
    COORD_ROUTE_UPDATES,
    COORD_ROUTE_STATUS,
    COORD_ROUTE_ROUND,
    COORD_ROUTE_ROUND_VALUES,
    COORD_ROUTE_SPLIT_FORWARD,
    COORD_ROUTE_SPLIT_BACKWARD,
    COORD_ROUTE_FACTORS,
    COORD_ROUTE_COUNT
} coord_route_id;

/* Requests are counted per route and one slot more for anything else. */
#define COORD_ROUTE_OTHER COORD_ROUTE_COUNT

typedef struct coord_route {
    const char *path;
    int prefix; /* path is a prefix (/v1/data/...) */
    enum evhttp_cmd_type method;
    const char *media;    /* the Content-Type a body must have; NULL: no body */
    coord_auth_kind auth; /* who must sign it (checked on the head, by the guard) */
    /* Its body may be as large as the run allows (max_body_bytes); else
     * at most COORD_MAX_JSON_BODY. One cap, applied by the guard on the
     * head's Content-Length before a byte of the body is read (a body
     * cannot outgrow it), and named in dispatch's 413. */
    int large;
    /* What a 413 calls its body ("an update is"); NULL: "a request body
     * here is". */
    const char *body_what;
    /* It takes no query: dispatch refuses any (protocol.md, Query
     * strings), so a target has one meaning. 0: the handler reads its
     * query itself. */
    int no_query;
} coord_route;

/* Route i (0 .. COORD_ROUTE_COUNT - 1); NULL outside. */
const coord_route *coord_route_get(int i);
/* Whether path is the route's (exactly, or below it for a prefix route). */
int coord_route_matches(const coord_route *r, const char *path);
/* The index of the first route whose path is path's, whatever its method,
 * or COORD_ROUTE_OTHER for a path no route serves. */
int coord_route_index(const char *path);
/* The route path for index i, "other" for COORD_ROUTE_OTHER. */
const char *coord_route_label(int i);
/* The kind for a request (method, path without its query):
 * COORD_AUTH_NONE when no route takes it, so a wrong method or path gets
 * its 404 or 405 whoever signed it. */
coord_auth_kind coord_route_auth_kind(const char *method, const char *path);
/* The paths of the routes whose bodies may be large, NULL-terminated:
 * the guard's large_paths. */
const char *const *coord_route_large_paths(void);
/* The method's name as in a request line ("GET"); "OTHER" for one
 * libevent does not name. */
const char *coord_method_name(enum evhttp_cmd_type m);

#endif
