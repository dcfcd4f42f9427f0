/* Writes an llm.c token shard for the integration tests, from a text file:
 *
 *   make_shard IN OUT FIRST COUNT [ok|bad-magic|big-token|truncated]
 *
 * Bytes FIRST .. FIRST+COUNT-1 of IN become COUNT tokens, byte b becoming
 * token 197·b: text structure, but ids spread over GPT-2's 50257 (so a
 * byte-vocabulary model cannot take them). The other modes spoil the
 * result: a wrong magic number, token 50257 in the middle, or the last
 * byte cut off. Exits 0, or 1 with one line on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static int die(const char *what) {
    fprintf(stderr, "make_shard: %s\n", what);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6)
        return die("usage: make_shard IN OUT FIRST COUNT [ok|bad-magic|big-token|truncated]");
    const char *mode = argc == 6 ? argv[5] : "ok";
    long first = atol(argv[3]), count = atol(argv[4]);
    if (first < 0 || count < 1 || count > (1L << 28)) return die("bad FIRST or COUNT");
    FILE *in = fopen(argv[1], "rb");
    if (!in) return die("cannot open IN");
    uint8_t *text = malloc((size_t)count);
    size_t out_len = MODEL_SHARD_HEADER_BYTES + 2 * (size_t)count;
    uint8_t *shard = malloc(out_len);
    int ok = text && shard && fseek(in, first, SEEK_SET) == 0 &&
             fread(text, 1, (size_t)count, in) == (size_t)count;
    fclose(in);
    if (!ok || model_shard_header(shard, count) != 0) {
        free(text);
        free(shard);
        return die("IN is shorter than FIRST + COUNT");
    }
    for (long i = 0; i < count; i++) {
        unsigned tok = 197u * text[i];
        if (strcmp(mode, "big-token") == 0 && i == count / 2) tok = 50257;
        shard[MODEL_SHARD_HEADER_BYTES + 2 * i] = (uint8_t)(tok & 0xff);
        shard[MODEL_SHARD_HEADER_BYTES + 2 * i + 1] = (uint8_t)(tok >> 8);
    }
    if (strcmp(mode, "bad-magic") == 0) shard[0] ^= 1;
    if (strcmp(mode, "truncated") == 0) out_len--;
    FILE *out = fopen(argv[2], "wb");
    ok = out && fwrite(shard, 1, out_len, out) == out_len;
    if (out && fclose(out) != 0) ok = 0;
    free(text);
    free(shard);
    return ok ? 0 : die("cannot write OUT");
}
