/* The token-data endpoint of a run on token shards: the lease's own range
 * comes back as an llm.c shard of exactly its tokens, and every malformed
 * request is refused (and, with ATTACK_DB, changes nothing stored). */
#include <stdio.h>
#include <string.h>

#include "attack.h"

/* llm.c's header: int32 magic 20240520, version 1, the token count. */
static int shard_of(const vl_buf *b, long long len) {
    uint32_t w[3] = {0, 0, 0};
    for (int i = 0; b->len >= 12 && i < 12; i++) w[i / 4] |= (uint32_t)b->data[i] << 8 * (i % 4);
    return b->len == 1024 + 2 * (size_t)len && w[0] == 20240520 && w[1] == 1 &&
           w[2] == (uint32_t)len;
}

/* Saves the served shard as DIR/tokens.bin and prints its range as
 * "tokens range SHARD OFFSET LENGTH", for the script to compare with the
 * shard file. */
void attack_tokens(ctx *c) {
    reply r;
    request(c, "GET", "/v1/task", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    json_t *j = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    json_t *d = json_object_get(j, "data");
    const char *kind = json_string_value(json_object_get(d, "kind"));
    long long shard = json_integer_value(json_object_get(d, "shard"));
    long long off = json_integer_value(json_object_get(d, "offset"));
    long long len = json_integer_value(json_object_get(d, "length"));
    int tokens = kind && strcmp(kind, "tokens") == 0 && len > 0;
    json_decref(j);
    if (!tokens) r.status = -2; /* shown as a failure */
    expect("the same lease again, with tokens", &r, 200, NULL);
    if (!tokens) return;
    char target[160], path[512];
    snprintf(target, sizeof target, "/v1/data/tokens/%lld?offset=%lld&count=%lld", shard, off, len);
    request(c, "GET", target, NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    int ok = shard_of(&r.body, len);
    snprintf(path, sizeof path, "%s/tokens.bin", c->dir);
    FILE *f = fopen(path, "wb");
    ok = ok && f && fwrite(r.body.data, 1, r.body.len, f) == r.body.len;
    if (f && fclose(f) != 0) ok = 0;
    printf("tokens range %lld %lld %lld\n", shard, off, len);
    if (!ok) r.status = -2;
    expect("the lease's tokens, as a shard", &r, 200, NULL);

    request(c, "GET", target, "", NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    expect("tokens without a signature", &r, 401, "unauthorized");
    get(c, "the text shard in a token run", "/v1/data/train", 404, "unknown_shard");
    get(c, "a shard never named", "/v1/data/tokens/99?offset=0&count=8", 404, "unknown_shard");
    get(c, "a shard that is no number", "/v1/data/tokens/x?offset=0&count=8", 404, "unknown_shard");
    get(c, "tokens without a query", "/v1/data/tokens/0", 400, "bad_request");
    get(c, "tokens without a count", "/v1/data/tokens/0?offset=0", 400, "bad_request");
    get(c, "no tokens", "/v1/data/tokens/0?offset=0&count=0", 400, "bad_request");
    get(c, "more tokens than a task", "/v1/data/tokens/0?offset=0&count=100000000", 400,
        "bad_request");
    get(c, "a negative offset", "/v1/data/tokens/0?offset=-1&count=8", 400, "bad_request");
    get(c, "an unknown parameter", "/v1/data/tokens/0?offset=0&count=8&x=1", 400, "bad_request");
    get(c, "tokens past the shard's end", "/v1/data/tokens/0?offset=999999999&count=8", 416,
        "bad_range");
}
