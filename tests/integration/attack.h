/* Shared by the files of the attack client (attack.c, attack_kfac.c):
 * the client's state, one request and its checked answer. */
#ifndef VOLLEY_TEST_ATTACK_H
#define VOLLEY_TEST_ATTACK_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "crypto/crypto.h"

typedef struct ctx {
    const char *url, *ca;
    char token[CRYPTO_TOKEN_LEN + 1];
    crypto_identity id;
    int64_t peer, task, base_version;
    size_t n_params;
    char run[64];
    /* The task's compression. */
    char kind[16];
    int64_t k, rows, cols, seed;
} ctx;

typedef struct reply {
    long status;
    char code[64];
    buf body;
} reply;

/* Cases that answered as expected, and the others. */
extern int passed, failed;

/* One request. auth: NULL = sign honestly as peer (with key, or c's own
 * when NULL), "" = none, else the literal header value. sign_body, when
 * given, is what the signature covers instead of the body sent. */
void request(const ctx *c, const char *method, const char *target, const char *auth,
             const void *body, size_t len, const void *sign_body, size_t sign_len,
             const crypto_identity *key, int64_t peer, int64_t ts, reply *r);
/* Prints the case and counts it: status and (when code is given) code. */
void expect(const char *name, reply *r, long status, const char *code);
/* A signed GET that must answer status and code. */
void get(const ctx *c, const char *name, const char *target, long status, const char *code);
/* A dense update of n floats for c's task, value n/2 set to poison. */
void update_body(const ctx *c, buf *out, const char *run, int64_t base, size_t n, float poison);

/* attack kfac: STAGE "bad" or "finish" (attack_kfac.c). */
void attack_kfac(ctx *c, const char *stage);

#endif
