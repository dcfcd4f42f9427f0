/* The training corpus: hashed once when opened, served from disk, with its
 * held-out validation slice kept in memory for evaluation. */
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

/* Reads the whole file once: every byte goes into the hash, and the bytes
 * of the validation slice are also copied out. */
static int hash_and_load(coord_corpus *c, vl_error *err) {
    uint8_t *chunk = malloc(READ_CHUNK);
    c->val = malloc((size_t)c->val_len + 1);
    if (!chunk || !c->val) {
        free(chunk);
        return vl_fail(err, VL_ENOMEM, "out of memory reading the corpus");
    }
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    int64_t pos = 0;
    while (pos < c->size) {
        size_t want = READ_CHUNK;
        if ((int64_t)want > c->size - pos) want = (size_t)(c->size - pos);
        ssize_t got = pread(c->fd, chunk, want, pos);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            free(chunk);
            return vl_fail(err, VL_EIO, "cannot read the corpus: %s",
                           got < 0 ? strerror(errno) : "file shrank while reading");
        }
        crypto_generichash_update(&st, chunk, (size_t)got);
        /* Copy the part of this chunk that lies in [train_len, size). */
        int64_t lo = pos > c->train_len ? pos : c->train_len;
        int64_t hi = pos + got;
        if (hi > lo) memcpy(c->val + (lo - c->train_len), chunk + (lo - pos), (size_t)(hi - lo));
        pos += got;
    }
    free(chunk);
    uint8_t h[32];
    crypto_generichash_final(&st, h, sizeof h);
    vl_hex_encode(h, sizeof h, c->hash);
    return VL_OK;
}

int coord_corpus_open(coord_corpus *c, const char *path, const coord_config *cfg,
                      int64_t expect_size, const char *expect_hash, vl_error *err) {
    memset(c, 0, sizeof *c);
    c->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (c->fd < 0) return vl_fail(err, VL_EIO, "cannot open corpus %s: %s", path, strerror(errno));
    c->is_open = 1;
    struct stat sb;
    int rc;
    if (fstat(c->fd, &sb) != 0) {
        rc = vl_fail(err, VL_EIO, "cannot stat corpus %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        rc = vl_fail(err, VL_EINVAL, "corpus %s is not a regular file", path);
        goto fail;
    }
    c->size = (int64_t)sb.st_size;
    c->mtime_ns = mtime_ns(&sb);
    c->ino = (uint64_t)sb.st_ino;
    if (expect_hash && c->size != expect_size) {
        rc = vl_fail(err, VL_ECONFLICT,
                     "corpus %s changed since init: %lld bytes, recorded %lld; refusing to serve",
                     path, (long long)c->size, (long long)expect_size);
        goto fail;
    }
    if ((rc = coord_config_check_corpus(cfg, c->size, err)) != VL_OK) goto fail;
    coord_config_split(cfg, c->size, &c->train_len, &c->val_len);
    if ((rc = hash_and_load(c, err)) != VL_OK) goto fail;
    if (expect_hash && strcmp(expect_hash, c->hash) != 0) {
        rc = vl_fail(err, VL_ECONFLICT,
                     "corpus %s changed since init (its hash differs); refusing to serve", path);
        goto fail;
    }
    /* A write while we were hashing would leave hash and contents apart. */
    if ((rc = coord_corpus_check(c, err)) != VL_OK) goto fail;
    return VL_OK;
fail:
    coord_corpus_close(c);
    return rc;
}

int coord_corpus_check(const coord_corpus *c, vl_error *err) {
    struct stat sb;
    if (fstat(c->fd, &sb) != 0) return vl_fail(err, VL_EIO, "cannot stat the corpus");
    if ((int64_t)sb.st_size != c->size || mtime_ns(&sb) != c->mtime_ns)
        return vl_fail(err, VL_ECONFLICT, "the corpus file was modified while serving");
    return VL_OK;
}

void coord_corpus_close(coord_corpus *c) {
    if (c->is_open) close(c->fd);
    free(c->val);
    memset(c, 0, sizeof *c);
}
