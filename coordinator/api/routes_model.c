/* GET /v1/model and GET /v1/data/...: the bytes peers train from. */
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>

#include "coordinator/coord.h"
#include "coordinator/api/api.h"
#include "coordinator/config/config.h"
#include "coordinator/http/http.h"
#include "coordinator/run/run.h"

/* ---- model ------------------------------------------------------------------ */

/* If-None-Match: a comma-separated list of entity tags (weak ones
 * compared weakly), or "*". */
static int etag_matches(const char *header, const char *etag) {
    if (!header) return 0;
    size_t elen = strlen(etag);
    const char *p = header;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (*p == '*') return 1;
        if (p[0] == 'W' && p[1] == '/') p += 2;
        const char *end = p;
        if (*end == '"') {
            end = strchr(p + 1, '"');
            if (!end) return 0;
            end++;
        } else {
            while (*end && *end != ',') end++;
        }
        if ((size_t)(end - p) == elen && memcmp(p, etag, elen) == 0) return 1;
        p = end;
        while (*p && *p != ',') p++;
    }
    return 0;
}

static int parse_range(const char *h, int64_t total, int64_t *first, int64_t *last);

/* Which part of a model file of total bytes to send: the whole (200), or,
 * for a download that broke off and resumes, the Range asked for (206)
 * when If-Range names this version or is absent. -1 after answering 416
 * for a range outside the file. */
static int model_range(coord_req *cr, const char *etag, int64_t total, int64_t *first,
                       int64_t *last) {
    *first = 0;
    *last = total - 1;
    const char *range = coord_get_header(cr, "Range");
    if (!range) return 200;
    /* If-Range compares strongly: a weak or different tag means the file
     * may have changed, so the whole of it goes. */
    const char *if_range = coord_get_header(cr, "If-Range");
    if (if_range && strcmp(if_range, etag) != 0) return 200;
    if (parse_range(range, total, first, last) != 0) {
        char hdr[64];
        snprintf(hdr, sizeof hdr, "bytes */%lld", (long long)total);
        coord_set_header(cr, "Content-Range", hdr);
        coord_reply_error(cr, 416, "bad_range",
                          "Range must be one range bytes=first-last inside 0-%lld",
                          (long long)(total - 1));
        return COORD_ANSWERED;
    }
    char hdr[96];
    snprintf(hdr, sizeof hdr, "bytes %lld-%lld/%lld", (long long)*first, (long long)*last,
             (long long)total);
    coord_set_header(cr, "Content-Range", hdr);
    return 206;
}

void coord_route_model(coord_req *cr) {
    coord_server *srv = cr->srv;
    const char *const keys[] = {"version", NULL};
    int64_t vals[1] = {0};
    unsigned present = 0;
    int64_t version = 0;
    vl_error e = {0};
    if (coord_req_version(cr, keys, vals, &present, srv->run.version, &version) != 0) return;
    if (coord_req_version_made(cr, version) != 0) return;
    char etag[32];
    snprintf(etag, sizeof etag, "\"%lld\"", (long long)version);
    coord_set_header(cr, "ETag", etag);
    if (etag_matches(coord_get_header(cr, "If-None-Match"), etag)) {
        coord_reply(cr, 304, NULL, NULL);
        return;
    }
    /* A peer trains from the current version or, in a run that takes
     * stale updates, from one at most the staleness bound behind. */
    int64_t oldest = srv->run.cfg.staleness.max > 0 ? srv->run.version - srv->run.cfg.staleness.max
                                                    : srv->run.version;
    if (version < oldest && version != srv->run.version) {
        coord_reply_error(cr, 404, "unknown_version",
                          "version %lld is older than any a peer "
                          "can train from (the oldest is %lld)",
                          (long long)version, (long long)oldest);
        return;
    }
    coord_blob *blob = NULL;
    int rc = coord_model_blob_version(srv, version, &blob, &e);
    if (rc == VL_ENOTFOUND) {
        coord_reply_error(cr, 404, "unknown_version", "%s", e.msg);
        return;
    }
    if (rc == VL_ETOOBIG) {
        coord_set_header(cr, "Retry-After", "2");
        coord_reply_error(cr, 503, "overloaded", "%s; retry shortly", e.msg);
        return;
    }
    if (rc != VL_OK) {
        coord_reply_internal(cr, &e);
        return;
    }
    coord_set_header(cr, "Accept-Ranges", "bytes");
    int64_t first, last;
    int status = model_range(cr, etag, (int64_t)blob->len, &first, &last);
    if (status < 0) {
        coord_blob_unref(blob);
        return;
    }
    coord_reply_blob_part(cr, blob, status, (size_t)first, (size_t)(last - first + 1));
}

/* ---- data ------------------------------------------------------------------- */

/* Strict decimal, at most 18 digits so it cannot overflow. */
static int parse_pos(const char *s, size_t n, int64_t *out) {
    if (n == 0 || n > 18) return -1;
    int64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        x = x * 10 + (s[i] - '0');
    }
    *out = x;
    return 0;
}

/* One range "bytes=a-b", "bytes=a-" or "bytes=-n" over total bytes. A last
 * position past the end is clipped (RFC 9110); a first position at or past
 * the end, an inverted or empty range, or several ranges are refused. */
static int parse_range(const char *h, int64_t total, int64_t *first, int64_t *last) {
    if (strncmp(h, "bytes=", 6) != 0) return -1;
    const char *spec = h + 6;
    const char *dash = strchr(spec, '-');
    if (!dash || strchr(spec, ',')) return -1;
    size_t a_len = (size_t)(dash - spec);
    const char *b = dash + 1;
    size_t b_len = strlen(b);
    int64_t a = 0, z = 0;
    if (a_len == 0) {
        if (parse_pos(b, b_len, &z) != 0 || z == 0) return -1;
        *first = z >= total ? 0 : total - z;
        *last = total - 1;
        return total > 0 ? 0 : -1;
    }
    if (parse_pos(spec, a_len, &a) != 0 || a >= total) return -1;
    if (b_len == 0) {
        z = total - 1;
    } else {
        if (parse_pos(b, b_len, &z) != 0 || z < a) return -1;
        if (z >= total) z = total - 1;
    }
    *first = a;
    *last = z;
    return 0;
}

/* GET /v1/data/tokens/<i>?offset=O&count=N in a shard run: tokens O to
 * O + N - 1 of training shard i as an llm.c shard of its own (the header
 * says N), which the peer saves and opens as it is. At most task_tokens:
 * no task needs more, and the tokens come from disk by reference, never
 * read into memory here. */
static void serve_tokens(coord_req *cr, const char *name) {
    coord_server *srv = cr->srv;
    const coord_shards *s = &srv->run.shards;
    int64_t idx = -1;
    const char *digits = strncmp(name, "tokens/", 7) == 0 ? name + 7 : NULL;
    if (!digits || parse_pos(digits, strlen(digits), &idx) != 0 || idx >= s->n) {
        coord_reply_error(cr, 404, "unknown_shard",
                          "this run's data are %d token shards: "
                          "/v1/data/tokens/<0-%d>?offset=<token>&count=<tokens>",
                          s->n, s->n - 1);
        return;
    }
    const char *const keys[] = {"offset", "count", NULL};
    int64_t vals[2] = {0, 0};
    unsigned present = 0;
    vl_error e = {0};
    if (coord_req_query(cr, keys, INT64_MAX, vals, &present, NULL) != 0) return;
    int64_t offset = vals[0], count = vals[1], ntok = s->ntok[idx];
    if (present != 3u || count < 1 || count > srv->run.cfg.task_tokens) {
        coord_reply_error(cr, 400, "bad_request",
                          "token data needs offset and count, with "
                          "count from 1 to task_tokens (%lld)",
                          (long long)srv->run.cfg.task_tokens);
        return;
    }
    if (offset >= ntok || count > ntok - offset) {
        coord_reply_error(cr, 416, "bad_range",
                          "tokens %lld to %lld are not inside shard "
                          "%lld, which has %lld",
                          (long long)offset, (long long)(offset + count - 1), (long long)idx,
                          (long long)ntok);
        return;
    }
    if (coord_shards_check(s, (int)idx, &e) != VL_OK) {
        coord_reply_internal(cr, &e);
        return;
    }
    uint8_t header[MODEL_SHARD_HEADER_BYTES];
    struct evbuffer *b = evbuffer_new();
    off_t at = (off_t)(MODEL_SHARD_HEADER_BYTES + 2 * offset), n = (off_t)(2 * count);
    /* Served from the file by reference: the descriptor stays the
     * server's (no close on free) and lives until shutdown. */
    struct evbuffer_file_segment *seg =
        b && model_shard_header(header, count) == VL_OK &&
                evbuffer_add(b, header, sizeof header) == 0
            ? evbuffer_file_segment_new(s->train[idx].fd, at, n, EVBUF_FS_DISABLE_SENDFILE)
            : NULL;
    int ok = seg && evbuffer_add_file_segment(b, seg, 0, n) == 0;
    if (seg) evbuffer_file_segment_free(seg);
    if (!ok) {
        if (b) evbuffer_free(b);
        vl_fail(&e, VL_EIO, "cannot map tokens %lld+%lld of shard %lld", (long long)offset,
                (long long)count, (long long)idx);
        coord_reply_internal(cr, &e);
        return;
    }
    coord_reply(cr, 200, "application/octet-stream", b);
    evbuffer_free(b);
}

void coord_route_data(coord_req *cr) {
    coord_server *srv = cr->srv;
    const char *shard = cr->full_path + strlen("/v1/data/");
    if (coord_config_is_local(&srv->run.cfg)) {
        coord_reply_error(cr, 404, "no_data",
                          "this run's data stay on the peers; the "
                          "coordinator serves none");
        return;
    }
    if (srv->run.cfg.shards) {
        serve_tokens(cr, shard);
        return;
    }
    if (strcmp(shard, "train") != 0) {
        coord_reply_error(cr, 404, "unknown_shard", "the only shard is \"train\"");
        return;
    }
    /* No parameters here: any query is refused like a bad one elsewhere
     * (protocol.md, Query strings), so a target has one meaning. */
    static const char *const no_keys[] = {NULL};
    unsigned present = 0;
    if (coord_req_query(cr, no_keys, 0, NULL, &present, "this endpoint takes no query") != 0)
        return;
    vl_error e = {0};
    if (coord_corpus_check(&srv->run.corpus, &e) != VL_OK) {
        coord_reply_internal(cr, &e);
        return;
    }
    int64_t total = srv->run.corpus.train_len;
    int64_t first = 0, last = total - 1;
    int status = 200;
    const char *range = coord_get_header(cr, "Range");
    char cr_hdr[96];
    if (range) {
        if (parse_range(range, total, &first, &last) != 0) {
            snprintf(cr_hdr, sizeof cr_hdr, "bytes */%lld", (long long)total);
            coord_set_header(cr, "Content-Range", cr_hdr);
            coord_reply_error(cr, 416, "bad_range",
                              "Range must be one range bytes=first-last inside 0-%lld",
                              (long long)(total - 1));
            return;
        }
        status = 206;
        snprintf(cr_hdr, sizeof cr_hdr, "bytes %lld-%lld/%lld", (long long)first, (long long)last,
                 (long long)total);
        coord_set_header(cr, "Content-Range", cr_hdr);
    }
    coord_set_header(cr, "Accept-Ranges", "bytes");
    struct evbuffer *b = evbuffer_new();
    /* Served from the file by reference: the corpus descriptor stays ours
     * (no close on free) and lives until shutdown. */
    struct evbuffer_file_segment *seg =
        b ? evbuffer_file_segment_new(srv->run.corpus.fd, first, last - first + 1,
                                      EVBUF_FS_DISABLE_SENDFILE)
          : NULL;
    int ok = seg && evbuffer_add_file_segment(b, seg, 0, last - first + 1) == 0;
    if (seg) evbuffer_file_segment_free(seg);
    if (!ok) {
        if (b) evbuffer_free(b);
        vl_fail(&e, VL_EIO, "cannot map the corpus range %lld-%lld", (long long)first,
                (long long)last);
        coord_reply_internal(cr, &e);
        return;
    }
    coord_reply(cr, status, "application/octet-stream", b);
    evbuffer_free(b);
}
