/*
 * llm.c token shards (format in model.h), read straight from disk. Opening
 * validates the whole file in one sequential pass so that a bad shard fails
 * before training starts, not hours in when a sample happens to land on a
 * bad token; sampling then preads only the windows it needs, so a shard of
 * any size costs a few kilobytes of memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "model/path_fail.h"

/* Token offsets go straight into pread; a 32-bit off_t would wrap on
 * shards past 2 GiB. */
_Static_assert(sizeof(off_t) >= 8, "token shards need a 64-bit off_t");
/* A chunk must hold whole tokens, or the scan would split one across reads. */
_Static_assert(MODEL_SHARD_CHUNK_BYTES % 2 == 0, "shard chunk must hold whole tokens");

struct model_shard {
    int fd;
    int vocab_size;
    int64_t ntok;
    char *path;       /* for messages */
    uint8_t *scratch; /* one window's bytes, grown to the largest T seen */
    size_t scratch_len;
};

/* Records "token shard PATH: DETAIL" (model_path_fail). */
static int shard_fail(vl_error *err, int code, const char *path, const char *fmt, ...)
    VL_PRINTF(4, 5);

static int shard_fail(vl_error *err, int code, const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = model_path_failv(err, code, "token shard ", path, fmt, ap);
    va_end(ap);
    return rc;
}

/* Reads up to n bytes at off, retrying on EINTR and short reads; *got is
 * what was read (less than n only at end of file). Returns 0 or errno. */
static int read_full(int fd, uint8_t *p, size_t n, off_t off, size_t *got) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, p + done, n - done, off + (off_t)done);
        if (r < 0) {
            if (errno == EINTR) continue;
            *got = done;
            return errno;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    *got = done;
    return 0;
}

static int64_t le_i32(const uint8_t *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return u <= INT32_MAX ? (int64_t)u : (int64_t)u - ((int64_t)1 << 32);
}

static unsigned le_u16(const uint8_t *p) {
    return (unsigned)p[0] | (unsigned)p[1] << 8;
}

/* Reads n bytes at off, failing on a read error or a file that ended early
 * (it was validated as long enough, so it must have shrunk since). */
static int read_exact(const model_shard *s, uint8_t *p, size_t n, off_t off, vl_error *err) {
    size_t got;
    int e = read_full(s->fd, p, n, off, &got);
    if (e != 0)
        return shard_fail(err, VL_EIO, s->path, "read at byte %lld: %s", (long long)off,
                          strerror(e));
    if (got < n)
        return shard_fail(err, VL_EIO, s->path,
                          "file ended at byte %lld, expected %zu bytes there: it shrank",
                          (long long)off + (long long)got, n);
    return 0;
}

static int check_header(const model_shard *s, const uint8_t *h, int64_t size, vl_error *err) {
    int64_t magic = le_i32(h), version = le_i32(h + 4), n = le_i32(h + 8);
    if (magic != MODEL_SHARD_MAGIC)
        return shard_fail(err, VL_EINVAL, s->path,
                          "bad magic %lld (expected %d): not an llm.c token shard",
                          (long long)magic, MODEL_SHARD_MAGIC);
    if (version != MODEL_SHARD_VERSION)
        return shard_fail(err, VL_EINVAL, s->path, "unsupported version %lld (expected %d)",
                          (long long)version, MODEL_SHARD_VERSION);
    if (n < 1)
        return shard_fail(err, VL_EINVAL, s->path, "header says %lld tokens (need at least 1)",
                          (long long)n);
    int64_t expect = MODEL_SHARD_HEADER_BYTES + 2 * n;
    if (size != expect)
        return shard_fail(err, VL_EINVAL, s->path,
                          "size %lld bytes, expected %lld (header + %lld tokens): %s",
                          (long long)size, (long long)expect, (long long)n,
                          size < expect ? "truncated" : "trailing bytes");
    return 0;
}

/* The one pass over every token. Whole chunks are read (read_exact loops
 * over short reads), so a token never straddles two reads. */
static int scan_tokens(const model_shard *s, vl_error *err) {
    uint8_t *chunk = malloc(MODEL_SHARD_CHUNK_BYTES);
    if (chunk == NULL)
        return shard_fail(err, VL_ENOMEM, s->path, "out of memory for the scan buffer");
    int64_t total = 2 * s->ntok, pos = 0;
    int rc = 0;
    while (rc == 0 && pos < total) {
        size_t want = MODEL_SHARD_CHUNK_BYTES;
        if ((int64_t)want > total - pos) want = (size_t)(total - pos);
        rc = read_exact(s, chunk, want, (off_t)(MODEL_SHARD_HEADER_BYTES + pos), err);
        for (size_t i = 0; rc == 0 && i < want; i += 2) {
            unsigned tok = le_u16(chunk + i);
            if (tok >= (unsigned)s->vocab_size)
                rc =
                    shard_fail(err, VL_EINVAL, s->path, "token %lld is %u, not below vocab_size %d",
                               (long long)((pos + (int64_t)i) / 2), tok, s->vocab_size);
        }
        pos += (int64_t)want;
    }
    free(chunk);
    return rc;
}

int model_shard_header(uint8_t out[MODEL_SHARD_HEADER_BYTES], int64_t ntok) {
    if (ntok < 1 || ntok > INT32_MAX) return VL_EINVAL;
    memset(out, 0, MODEL_SHARD_HEADER_BYTES);
    const uint32_t words[3] = {MODEL_SHARD_MAGIC, MODEL_SHARD_VERSION, (uint32_t)ntok};
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < 4; i++) out[4 * w + i] = (uint8_t)(words[w] >> (8 * i));
    return 0;
}

int model_shard_open(const char *path, int vocab_size, model_shard **out, vl_error *err) {
    if (out != NULL) *out = NULL;
    if (path == NULL || out == NULL)
        return vl_fail(err, VL_EINVAL, "token shard: missing argument");
    if (vocab_size < 1 || vocab_size > MODEL_MAX_VOCAB)
        return shard_fail(err, VL_EINVAL, path, "vocab_size %d is outside [1, %d]", vocab_size,
                          MODEL_MAX_VOCAB);
    model_shard *s = calloc(1, sizeof *s);
    if (s == NULL || (s->path = strdup(path)) == NULL) {
        free(s);
        return shard_fail(err, VL_ENOMEM, path, "out of memory");
    }
    s->fd = -1;
    s->vocab_size = vocab_size;
    int rc;
    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) {
        int e = errno;
        rc = shard_fail(err, e == ENOENT ? VL_ENOTFOUND : VL_EIO, path, "cannot open: %s",
                        strerror(e));
        goto fail;
    }
    struct stat st;
    if (fstat(s->fd, &st) != 0) {
        rc = shard_fail(err, VL_EIO, path, "cannot stat: %s", strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = shard_fail(err, VL_EINVAL, path, "not a regular file");
        goto fail;
    }
    int64_t size = (int64_t)st.st_size;
    if (size < MODEL_SHARD_HEADER_BYTES) {
        rc = shard_fail(err, VL_EINVAL, path, "%s: %lld bytes, shorter than the %d-byte header",
                        size == 0 ? "empty file" : "no header", (long long)size,
                        MODEL_SHARD_HEADER_BYTES);
        goto fail;
    }
    uint8_t header[MODEL_SHARD_HEADER_BYTES];
    if ((rc = read_exact(s, header, sizeof header, 0, err)) != 0 ||
        (rc = check_header(s, header, size, err)) != 0)
        goto fail;
    s->ntok = le_i32(header + 8);
    if ((rc = scan_tokens(s, err)) != 0) goto fail;
    *out = s;
    return 0;

fail:
    model_shard_close(s);
    return rc;
}

int64_t model_shard_tokens(const model_shard *s) {
    return s ? s->ntok : 0;
}

int model_shard_sample(model_shard *s, int B, int T, vl_rng *r, int *inputs, int *targets,
                       vl_error *err) {
    if (s == NULL || r == NULL || inputs == NULL || targets == NULL)
        return vl_fail(err, VL_EINVAL, "token shard sample: missing argument");
    if (B < 1 || T < 1)
        return shard_fail(err, VL_EINVAL, s->path, "sample: B=%d T=%d must be positive", B, T);
    if ((int64_t)T + 1 > s->ntok)
        return shard_fail(err, VL_EINVAL, s->path,
                          "sample: %lld tokens is shorter than one window of %lld tokens",
                          (long long)s->ntok, (long long)T + 1);
    size_t need = 2 * ((size_t)T + 1);
    if (need > s->scratch_len) {
        uint8_t *p = realloc(s->scratch, need);
        if (p == NULL)
            return shard_fail(err, VL_ENOMEM, s->path, "sample: out of memory for T=%d", T);
        s->scratch = p;
        s->scratch_len = need;
    }
    uint64_t starts = (uint64_t)(s->ntok - T); /* offsets 0 .. N-T-1 */
    for (int b = 0; b < B; b++) {
        int64_t off = (int64_t)vl_rng_below_u64(r, starts);
        int rc = read_exact(s, s->scratch, need, (off_t)(MODEL_SHARD_HEADER_BYTES + 2 * off), err);
        if (rc != 0) return rc;
        int *in = inputs + (size_t)b * T, *tg = targets + (size_t)b * T;
        for (int t = 0; t <= T; t++) {
            unsigned tok = le_u16(s->scratch + 2 * (size_t)t);
            if (tok >= (unsigned)s->vocab_size)
                return shard_fail(err, VL_EINVAL, s->path,
                                  "token %lld is %u, not below vocab_size %d (changed since "
                                  "it was opened?)",
                                  (long long)(off + t), tok, s->vocab_size);
            if (t < T) in[t] = (int)tok;
            if (t > 0) tg[t - 1] = (int)tok;
        }
    }
    return 0;
}

int model_shard_read(model_shard *s, int64_t offset, size_t n, uint16_t *out, vl_error *err) {
    if (s == NULL || (out == NULL && n > 0))
        return vl_fail(err, VL_EINVAL, "token shard read: missing argument");
    if (offset < 0 || offset > s->ntok || (uint64_t)n > (uint64_t)(s->ntok - offset))
        return shard_fail(err, VL_EINVAL, s->path,
                          "read of %zu tokens at %lld is outside its %lld tokens", n,
                          (long long)offset, (long long)s->ntok);
    /* Through a chunk-sized buffer, so a large read costs no more memory
     * than the output itself. */
    size_t chunk_tok = MODEL_SHARD_CHUNK_BYTES / 2;
    uint8_t *chunk = malloc(n < chunk_tok ? 2 * (n ? n : 1) : MODEL_SHARD_CHUNK_BYTES);
    if (chunk == NULL)
        return shard_fail(err, VL_ENOMEM, s->path, "out of memory for a read buffer");
    int rc = 0;
    for (size_t done = 0; rc == 0 && done < n;) {
        size_t m = n - done < chunk_tok ? n - done : chunk_tok;
        int64_t at = offset + (int64_t)done;
        rc = read_exact(s, chunk, 2 * m, (off_t)(MODEL_SHARD_HEADER_BYTES + 2 * at), err);
        for (size_t i = 0; rc == 0 && i < m; i++) {
            unsigned tok = le_u16(chunk + 2 * i);
            if (tok >= (unsigned)s->vocab_size)
                rc = shard_fail(err, VL_EINVAL, s->path,
                                "token %lld is %u, not below vocab_size %d (changed since it "
                                "was opened?)",
                                (long long)(at + (int64_t)i), tok, s->vocab_size);
            out[done + i] = (uint16_t)tok;
        }
        done += m;
    }
    free(chunk);
    return rc;
}

void model_shard_close(model_shard *s) {
    if (s == NULL) return;
    if (s->fd >= 0) close(s->fd);
    free(s->scratch);
    free(s->path);
    free(s);
}
