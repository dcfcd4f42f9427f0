/* The token shards of a shard run: validated in full before anything is
 * served (a bad token found hours into a run would have been trained on
 * by then), hashed so a restart notices changed files, and served from
 * disk range by range. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "coordinator/coord.h"
#include "coordinator/config/config.h"
#include "coordinator/run/run.h"

#define READ_CHUNK ((size_t)1 << 20)

static int64_t mtime_ns(const struct stat *sb) {
    return (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
}

/* Feeds every byte of the open file fd (size bytes) into the hash. */
static int hash_file(int fd, int64_t size, const char *path, uint8_t *chunk,
                     crypto_generichash_state *st, vl_error *err) {
    for (int64_t pos = 0; pos < size;) {
        size_t want = READ_CHUNK;
        if ((int64_t)want > size - pos) want = (size_t)(size - pos);
        ssize_t got = pread(fd, chunk, want, pos);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            return vl_fail(err, VL_EIO, "token shard %s: cannot read: %s", path,
                           got < 0 ? strerror(errno) : "file shrank while reading");
        crypto_generichash_update(st, chunk, (size_t)got);
        pos += got;
    }
    return VL_OK;
}

/* Validates path as a shard of the run (model_shard_open's checks and at
 * least one window of block_size + 1 tokens), then opens it for hashing
 * and serving and records its size and time. *ms, when not NULL, gets the
 * validated shard (for the validation tokens); otherwise it is closed. */
static int open_one(const char *path, const coord_config *cfg, coord_shard *out, int64_t *ntok,
                    model_shard **ms, vl_error *err) {
    model_shard *s = NULL;
    int rc = model_shard_open(path, cfg->model.vocab_size, &s, err);
    if (rc != VL_OK) return rc;
    *ntok = model_shard_tokens(s);
    if (*ntok < (int64_t)cfg->model.block_size + 1) {
        model_shard_close(s);
        return vl_fail(err, VL_EINVAL,
                       "token shard %s: %lld tokens, fewer than one window of "
                       "model.block_size + 1 = %d",
                       path, (long long)*ntok, cfg->model.block_size + 1);
    }
    if (ms)
        *ms = s;
    else
        model_shard_close(s);
    out->fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (out->fd < 0 || fstat(out->fd, &sb) != 0) {
        rc = vl_fail(err, VL_EIO, "token shard %s: cannot open: %s", path, strerror(errno));
    } else if ((int64_t)sb.st_size != MODEL_SHARD_HEADER_BYTES + 2 * *ntok) {
        rc = vl_fail(err, VL_ECONFLICT, "token shard %s changed while it was being opened", path);
    } else {
        out->size = (int64_t)sb.st_size;
        out->mtime_ns = mtime_ns(&sb);
        return VL_OK;
    }
    if (out->fd >= 0) close(out->fd);
    out->fd = -1;
    if (ms) {
        model_shard_close(*ms);
        *ms = NULL;
    }
    return rc;
}

/* The validation shard: validated, hashed, its first tokens loaded. */
static int open_val(coord_shards *s, const coord_config *cfg, uint8_t *chunk,
                    crypto_generichash_state *st, vl_error *err) {
    coord_shard v = {.fd = -1};
    model_shard *ms = NULL;
    int rc = open_one(cfg->val_shard, cfg, &v, &s->val_tokens, &ms, err);
    if (rc != VL_OK) return rc;
    /* One token more than the windows cover: the last target; val_batches
     * 0 scores the whole shard. */
    int64_t want = cfg->val_batches == 0
                       ? s->val_tokens
                       : cfg->val_batches * COORD_VAL_BATCH * (int64_t)cfg->model.block_size + 1;
    s->val_len = (size_t)(want < s->val_tokens ? want : s->val_tokens);
    s->val = malloc(s->val_len * sizeof *s->val);
    if (!s->val) rc = vl_fail(err, VL_ENOMEM, "out of memory for the validation tokens");
    if (rc == VL_OK) rc = model_shard_read(ms, 0, s->val_len, s->val, err);
    if (rc == VL_OK) rc = hash_file(v.fd, v.size, cfg->val_shard, chunk, st, err);
    if (rc == VL_OK) s->size += v.size;
    model_shard_close(ms);
    close(v.fd);
    return rc;
}

int coord_shards_open(coord_shards *s, const coord_config *cfg, int64_t expect_size,
                      const char *expect_hash, vl_error *err) {
    memset(s, 0, sizeof *s);
    int n = cfg->n_train_shards;
    /* A run on local data has only its validation shard here. */
    if (!cfg->shards || n < 0 || (n < 1 && !cfg->local))
        return vl_fail(err, VL_EINVAL, "the run has no token shards");
    /* One slot at least, so an empty list is not a failed allocation. */
    size_t slots = n > 0 ? (size_t)n : 1;
    s->train = malloc(slots * sizeof *s->train);
    s->ntok = calloc(slots, sizeof *s->ntok);
    uint8_t *chunk = malloc(READ_CHUNK);
    int rc = VL_OK;
    if (!s->train || !s->ntok || !chunk) rc = vl_fail(err, VL_ENOMEM, "out of memory");
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    for (int i = 0; rc == VL_OK && i < n; i++) {
        const char *path = cfg->train_shards[i];
        rc = open_one(path, cfg, &s->train[i], &s->ntok[i], NULL, err);
        if (rc != VL_OK) break;
        s->n = i + 1;
        s->train_tokens += s->ntok[i];
        s->size += s->train[i].size;
        rc = hash_file(s->train[i].fd, s->train[i].size, path, chunk, &st, err);
    }
    if (rc == VL_OK) rc = open_val(s, cfg, chunk, &st, err);
    free(chunk);
    if (rc == VL_OK) {
        uint8_t h[32];
        crypto_generichash_final(&st, h, sizeof h);
        vl_hex_encode(h, sizeof h, s->hash);
        if (expect_hash && (s->size != expect_size || strcmp(expect_hash, s->hash) != 0))
            rc = vl_fail(err, VL_ECONFLICT,
                         "the token shards changed since init (%s); "
                         "refusing to serve",
                         s->size != expect_size ? "their size differs" : "their hash differs");
    }
    /* A write while we were hashing would leave hash and contents apart. */
    for (int i = 0; rc == VL_OK && i < s->n; i++) rc = coord_shards_check(s, i, err);
    if (rc != VL_OK) coord_shards_close(s);
    return rc;
}

int coord_shards_check(const coord_shards *s, int i, vl_error *err) {
    struct stat sb;
    if (i < 0 || i >= s->n || fstat(s->train[i].fd, &sb) != 0)
        return vl_fail(err, VL_EIO, "cannot stat training shard %d", i);
    if ((int64_t)sb.st_size != s->train[i].size || mtime_ns(&sb) != s->train[i].mtime_ns)
        return vl_fail(err, VL_ECONFLICT, "training shard %d was modified while serving", i);
    return VL_OK;
}

void coord_shards_close(coord_shards *s) {
    for (int i = 0; i < s->n; i++) close(s->train[i].fd);
    free(s->train);
    free(s->ntok);
    free(s->val);
    memset(s, 0, sizeof *s);
}

int64_t coord_val_scored_tokens(const coord_config *cfg, const coord_corpus *corpus,
                                const coord_shards *shards, int64_t batches) {
    int64_t have = cfg->shards ? (int64_t)shards->val_len : corpus->val_len;
    int64_t want = batches * COORD_VAL_BATCH * cfg->model.block_size;
    return batches > 0 && want < have ? want : have;
}

int coord_val_loss(const coord_config *cfg, const coord_corpus *corpus, const coord_shards *shards,
                   model_gpt *m, int64_t batches, float *loss, vl_error *err) {
    if (cfg->shards)
        return model_gpt_eval_tokens(m, shards->val, shards->val_len, COORD_VAL_BATCH,
                                     cfg->model.block_size, (int)batches, loss, err);
    return model_gpt_eval_bytes(m, corpus->val, (size_t)corpus->val_len, COORD_VAL_BATCH,
                                cfg->model.block_size, (int)batches, loss, err);
}
