/* The peer's directory: its key file (peer.key) and the state that join
 * leaves for run (peer.json). Both live in a 0700 directory; the state file
 * holds no secret but is written 0600 and atomically all the same, so a
 * crash never leaves a half-written file that `run` would misread. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "peer/peer.h"

#define STATE_MAX_BYTES (64 * 1024)

int peer_dir_default(char *out, size_t cap, vl_error *err) {
    const char *home = getenv("HOME");
    if (!home || !*home) return vl_fail(err, VL_ENOTFOUND, "HOME is not set; pass --dir");
    int n = snprintf(out, cap, "%s/.volley", home);
    if (n < 0 || (size_t)n >= cap) return vl_fail(err, VL_ETOOBIG, "HOME is too long");
    return VL_OK;
}

int peer_dir_create(const char *dir, vl_error *err) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return vl_fail(err, VL_EINVAL, "%s exists and is not a directory", dir);
        return VL_OK;
    }
    if (errno != ENOENT) return vl_fail(err, VL_EIO, "cannot inspect %s: %s", dir, strerror(errno));
    if (mkdir(dir, 0700) != 0) {
        if (errno == EEXIST) return VL_OK; /* created by someone else meanwhile */
        return vl_fail(err, VL_EIO, "cannot create %s: %s", dir, strerror(errno));
    }
    /* mkdir's mode passes through the umask; the key's directory must be
     * exactly owner-only whatever the caller's umask. */
    if (chmod(dir, 0700) != 0)
        return vl_fail(err, VL_EIO, "cannot chmod %s: %s", dir, strerror(errno));
    return VL_OK;
}

int peer_path_join(char *out, size_t cap, const char *dir, const char *file, vl_error *err) {
    int n = snprintf(out, cap, "%s/%s", dir, file);
    if (n < 0 || (size_t)n >= cap)
        return vl_fail(err, VL_ETOOBIG, "path %s/%s is too long", dir, file);
    return VL_OK;
}

/* Host names, IPv4 literals and bracketed IPv6 literals; nothing that could
 * smuggle userinfo, a path or a query into the URL. */
static int host_char_ok(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.';
}

int peer_url_check(const char *url, char *out, size_t cap, vl_error *err) {
    static const char scheme[] = "https://";
    size_t len = strnlen(url, 512);
    if (len >= 256) return vl_fail(err, VL_EINVAL, "coordinator URL is too long");
    if (strncmp(url, scheme, sizeof scheme - 1) != 0)
        return vl_fail(err, VL_EINVAL, "coordinator URL must start with https:// (got '%.80s')",
                       url);
    const char *p = url + sizeof scheme - 1;
    const char *host = p;
    if (*p == '[') {
        p++;
        while (*p && *p != ']') {
            char c = *p;
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
                  c == ':' || c == '.'))
                return vl_fail(err, VL_EINVAL, "coordinator URL has a malformed IPv6 host");
            p++;
        }
        if (*p != ']' || p == host + 1)
            return vl_fail(err, VL_EINVAL, "coordinator URL has a malformed IPv6 host");
        p++;
    } else {
        while (*p && host_char_ok(*p)) p++;
        if (p == host) return vl_fail(err, VL_EINVAL, "coordinator URL has no host");
    }
    if (*p == ':') {
        const char *port = ++p;
        while (*p >= '0' && *p <= '9') p++;
        char digits[8];
        size_t pl = (size_t)(p - port);
        int64_t v;
        if (pl == 0 || pl >= sizeof digits)
            return vl_fail(err, VL_EINVAL, "coordinator URL has a bad port");
        memcpy(digits, port, pl);
        digits[pl] = '\0';
        if (vl_parse_i64(digits, 1, 65535, &v) != VL_OK)
            return vl_fail(err, VL_EINVAL, "coordinator URL port must be 1..65535");
    }
    size_t end = (size_t)(p - url);
    if (*p == '/' && p[1] == '\0') {
        /* tolerated: "https://host:port/" */
    } else if (*p != '\0') {
        return vl_fail(err, VL_EINVAL,
                       "coordinator URL must be https://HOST[:PORT] with no path, query or "
                       "user name");
    }
    if (end + 1 > cap) return vl_fail(err, VL_ETOOBIG, "coordinator URL is too long");
    memcpy(out, url, end);
    out[end] = '\0';
    return VL_OK;
}

/* Copies a JSON string member into out, which must hold it whole. */
static int get_str(json_t *obj, const char *key, int required, char *out, size_t cap,
                   const char *path, vl_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return vl_fail(err, VL_EINVAL, "%s: missing '%s'", path, key);
        out[0] = '\0';
        return VL_OK;
    }
    if (!json_is_string(v)) return vl_fail(err, VL_EINVAL, "%s: '%s' must be a string", path, key);
    size_t n = json_string_length(v);
    if (n >= cap || strlen(json_string_value(v)) != n)
        return vl_fail(err, VL_EINVAL, "%s: '%s' is too long or contains NUL", path, key);
    memcpy(out, json_string_value(v), n + 1);
    return VL_OK;
}

int peer_state_save(const char *dir, const peer_state *s, vl_error *err) {
    char path[PEER_PATH_MAX];
    int rc = peer_path_join(path, sizeof path, dir, PEER_STATE_FILE, err);
    if (rc) return rc;
    json_t *o = json_pack("{s:s, s:I, s:s?, s:s, s:s}", "coordinator", s->coordinator, "peer_id",
                          (json_int_t)s->peer_id, "cacert", s->cacert[0] ? s->cacert : NULL, "run",
                          s->run, "name", s->name);
    if (!o) return vl_fail(err, VL_ENOMEM, "cannot build %s", path);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    if (!text) return vl_fail(err, VL_ENOMEM, "cannot serialise %s", path);
    size_t n = strlen(text);
    vl_buf b;
    vl_buf_init(&b, STATE_MAX_BYTES);
    rc = vl_buf_append(&b, text, n);
    if (!rc) rc = vl_buf_append(&b, "\n", 1);
    free(text);
    if (rc) {
        vl_buf_free(&b);
        return vl_fail(err, rc, "%s would be too large", path);
    }
    rc = vl_file_write_atomic(path, b.data, b.len, 0600, err);
    vl_buf_free(&b);
    return rc;
}

int peer_state_load(const char *dir, peer_state *s, vl_error *err) {
    char path[PEER_PATH_MAX];
    int rc = peer_path_join(path, sizeof path, dir, PEER_STATE_FILE, err);
    if (rc) return rc;
    vl_buf b;
    vl_buf_init(&b, STATE_MAX_BYTES);
    rc = vl_buf_read_file(&b, path, err);
    if (rc) {
        vl_buf_free(&b);
        if (rc == VL_ENOTFOUND)
            return vl_fail(err, VL_ENOTFOUND, "%s not found; run 'volley-peer join' first", path);
        return rc;
    }
    json_error_t je;
    json_t *o = json_loadb((const char *)b.data, b.len, JSON_REJECT_DUPLICATES, &je);
    vl_buf_free(&b);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return vl_fail(err, VL_EINVAL, "%s is not a JSON object", path);
    }
    memset(s, 0, sizeof *s);
    char url[sizeof s->coordinator];
    rc = get_str(o, "coordinator", 1, url, sizeof url, path, err);
    if (!rc) rc = get_str(o, "cacert", 0, s->cacert, sizeof s->cacert, path, err);
    if (!rc) rc = get_str(o, "run", 0, s->run, sizeof s->run, path, err);
    if (!rc) rc = get_str(o, "name", 0, s->name, sizeof s->name, path, err);
    if (!rc) {
        json_t *id = json_object_get(o, "peer_id");
        if (!json_is_integer(id) || json_integer_value(id) <= 0)
            rc = vl_fail(err, VL_EINVAL, "%s: 'peer_id' must be a positive integer", path);
        else
            s->peer_id = (int64_t)json_integer_value(id);
    }
    json_decref(o);
    if (rc) return rc;
    vl_error uerr = {0};
    if (peer_url_check(url, s->coordinator, sizeof s->coordinator, &uerr) != VL_OK)
        return vl_fail(err, VL_EINVAL, "%s: %s", path, uerr.msg);
    return VL_OK;
}

int peer_keygen(const char *dir, int force, char *pk_b64, vl_error *err) {
    int rc = peer_dir_create(dir, err);
    if (rc) return rc;
    char path[PEER_PATH_MAX];
    rc = peer_path_join(path, sizeof path, dir, PEER_KEY_FILE, err);
    if (rc) return rc;
    vcrypto_identity id;
    vcrypto_identity_generate(&id);
    rc = vcrypto_identity_save(&id, path, force, err);
    if (rc == VL_ECONFLICT)
        rc = vl_fail(err, VL_ECONFLICT, "%s already exists; pass --force to replace it", path);
    if (!rc) vcrypto_pk_encode(id.pk, pk_b64);
    vcrypto_identity_wipe(&id);
    return rc;
}
