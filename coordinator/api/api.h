/*
 * api: the public listener's handlers, one file per route family, and
 * the request bodies they parse. The route table they are bound to is
 * base/routes.h; the binding is the server's (server.c).
 *
 * Contents: join and key rotation bodies; the handlers.
 */
#ifndef VOLLEY_COORD_API_API_H
#define VOLLEY_COORD_API_API_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator/coord.h"

#define COORD_JOIN_NAME_MAX 64
#define COORD_JOIN_HARDWARE_MAX 4096
#define COORD_JOIN_TOKEN_MAX 256

/* A join request body, {public_key, token, name, hardware}. */
typedef struct coord_join_body {
    uint8_t pk[VCRYPTO_PK_BYTES];
    char token[COORD_JOIN_TOKEN_MAX + 1];
    size_t token_len;
    char name[COORD_JOIN_NAME_MAX + 1]; /* printable, non-empty */
    char *hardware; /* compact JSON text of the hardware object ("{}" if absent); owned */
} coord_join_body;

/* Parses and checks a join body (len bytes, NULL when empty) without any
 * connection: an object of only the known fields, public_key base64 of 32
 * bytes, a token of 1 to COORD_JOIN_TOKEN_MAX bytes, a name of printable
 * characters, hardware an object of at most COORD_JOIN_HARDWARE_MAX bytes
 * as compact JSON. VL_ETOOBIG over COORD_MAX_JSON_BODY, VL_EINVAL (the
 * message names the field), VL_ENOMEM. On success the caller frees out
 * with coord_join_body_free; on failure nothing is left to free. */
int coord_join_parse(const uint8_t *body, size_t len, coord_join_body *out,
                     vl_error *err) VL_MUST_CHECK;
/* Frees the hardware text and wipes the token. */
void coord_join_body_free(coord_join_body *b);

/* Parses a key rotation body {"public_key", "proof"} (exactly those two,
 * strings) without any connection: the new key into pk, the proof text
 * (not yet checked; vcrypto_rotation_verify does that) into proof.
 * VL_EINVAL with a message for anything else, a body over
 * COORD_MAX_JSON_BODY included. */
int coord_rotate_parse(const uint8_t *body, size_t len, uint8_t pk[VCRYPTO_PK_BYTES],
                       char proof[VCRYPTO_SIG_B64_LEN + 8], vl_error *err) VL_MUST_CHECK;


void coord_route_join(coord_req *cr);           /* POST /v1/peers */
void coord_route_rotate(coord_req *cr);         /* POST /v1/peers/rotate */
void coord_route_task(coord_req *cr);           /* GET /v1/task */
void coord_route_model(coord_req *cr);          /* GET /v1/model */
void coord_route_delta(coord_req *cr);          /* GET /v1/model/delta */
void coord_route_data(coord_req *cr);           /* GET /v1/data/<shard> */
void coord_route_updates(coord_req *cr);        /* POST /v1/updates */
void coord_route_status(coord_req *cr);         /* GET /v1/status */
void coord_route_round(coord_req *cr);          /* GET /v1/round */
void coord_route_round_values(coord_req *cr);   /* POST /v1/round/values */
void coord_route_split_forward(coord_req *cr);  /* POST /v1/split/forward (split.c) */
void coord_route_split_backward(coord_req *cr); /* POST /v1/split/backward (split.c) */
void coord_route_factors(coord_req *cr);        /* GET /v1/factors */

#endif
