/* The route table (routes.h). */
#include <string.h>

#include "coordinator/base/routes.h"

#define JSON "application/json"
#define BINARY "application/octet-stream"
#define PEER COORD_AUTH_PEER

/* Every endpoint of the public listener. None administers the run: tokens
 * and peers are managed only by the CLI on the database, so no peer key
 * reaches that. The admin listener (ops/admin_http.c, on by default on
 * 127.0.0.1:9464, a token required off loopback) only reads: the
 * dashboard, its figures (peer names, addresses, hardware, refusals, the
 * configuration) and /metrics. Each handler reads its query through
 * coord_req_query, which refuses any parameter it does not list (a route
 * without parameters: any query). */
static const coord_route ROUTES[COORD_ROUTE_COUNT] = {
    [COORD_ROUTE_JOIN] = {"/v1/peers", 0, EVHTTP_REQ_POST, JSON, COORD_AUTH_JOIN, 0, NULL, 1},
    [COORD_ROUTE_ROTATE] = {"/v1/peers/rotate", 0, EVHTTP_REQ_POST, JSON, PEER, 0, NULL, 1},
    [COORD_ROUTE_TASK] = {"/v1/task", 0, EVHTTP_REQ_GET, NULL, PEER, 0, NULL, 0},
    [COORD_ROUTE_MODEL] = {"/v1/model", 0, EVHTTP_REQ_GET, NULL, PEER, 0, NULL, 0},
    [COORD_ROUTE_DELTA] = {"/v1/model/delta", 0, EVHTTP_REQ_GET, NULL, PEER, 0, NULL, 0},
    [COORD_ROUTE_DATA] = {"/v1/data/", 1, EVHTTP_REQ_GET, NULL, PEER, 0, NULL, 0},
    [COORD_ROUTE_UPDATES] = {"/v1/updates", 0, EVHTTP_REQ_POST, BINARY, PEER, 1, "an update is", 0},
    [COORD_ROUTE_STATUS] = {"/v1/status", 0, EVHTTP_REQ_GET, NULL, COORD_AUTH_NONE, 0, NULL, 1},
    [COORD_ROUTE_ROUND] = {"/v1/round", 0, EVHTTP_REQ_GET, NULL, PEER, 0, NULL, 0},
    [COORD_ROUTE_ROUND_VALUES] = {"/v1/round/values", 0, EVHTTP_REQ_POST, BINARY, PEER, 1,
                                  "round values are", 1},
    [COORD_ROUTE_SPLIT_FORWARD] = {"/v1/split/forward", 0, EVHTTP_REQ_POST, BINARY, PEER, 1,
                                   "a batch of activations is", 1},
    [COORD_ROUTE_SPLIT_BACKWARD] = {"/v1/split/backward", 0, EVHTTP_REQ_POST, BINARY, PEER, 1,
                                    "a batch of activations is", 1},
    [COORD_ROUTE_FACTORS] = {"/v1/factors", 0, EVHTTP_REQ_GET, NULL, PEER, 0, NULL, 0},
};

const char *const *coord_route_large_paths(void) {
    /* Every route could be large, and one more slot ends the list. */
    static const char *paths[COORD_ROUTE_COUNT + 1];
    static int made;
    if (!made) {
        int n = 0;
        for (int i = 0; i < COORD_ROUTE_COUNT; i++)
            if (ROUTES[i].large) paths[n++] = ROUTES[i].path;
        paths[n] = NULL;
        made = 1;
    }
    return paths;
}

const coord_route *coord_route_get(int i) {
    return i >= 0 && i < COORD_ROUTE_COUNT ? &ROUTES[i] : NULL;
}

int coord_route_matches(const coord_route *r, const char *path) {
    return r->prefix ? strncmp(path, r->path, strlen(r->path)) == 0 : strcmp(path, r->path) == 0;
}

int coord_route_index(const char *path) {
    for (int i = 0; path && i < COORD_ROUTE_COUNT; i++)
        if (coord_route_matches(&ROUTES[i], path)) return i;
    return COORD_ROUTE_OTHER;
}

const char *coord_route_label(int i) {
    return i >= 0 && i < COORD_ROUTE_COUNT ? ROUTES[i].path : "other";
}

const char *coord_method_name(enum evhttp_cmd_type m) {
    switch (m) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_HEAD: return "HEAD";
    case EVHTTP_REQ_PUT: return "PUT";
    case EVHTTP_REQ_DELETE: return "DELETE";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_TRACE: return "TRACE";
    case EVHTTP_REQ_CONNECT: return "CONNECT";
    case EVHTTP_REQ_PATCH: return "PATCH";
    default: return "OTHER";
    }
}

coord_auth_kind coord_route_auth_kind(const char *method, const char *path) {
    for (int i = 0; i < COORD_ROUTE_COUNT; i++)
        if (coord_route_matches(&ROUTES[i], path) &&
            strcmp(coord_method_name(ROUTES[i].method), method) == 0)
            return ROUTES[i].auth;
    return COORD_AUTH_NONE;
}
