/* The peer's own record of its work, and the `status` command that reads
 * it with the rest of the peer's directory. */
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>

#include "peer/peer.h"
#include "peer/progress.h"

#define PROGRESS_MAX_BYTES (64 * 1024)

static int get_count(json_t *o, const char *key, int64_t *out, const char *path, vl_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v) {
        *out = 0;
        return VL_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return vl_fail(err, VL_EINVAL, "%s: '%s' must be a whole number >= 0", path, key);
    *out = (int64_t)json_integer_value(v);
    return VL_OK;
}

int peer_progress_load(const char *dir, peer_progress *p, vl_error *err) {
    memset(p, 0, sizeof *p);
    char path[PEER_PATH_MAX];
    int rc = peer_path_join(path, sizeof path, dir, PEER_PROGRESS_FILE, err);
    if (rc) return rc;
    vl_buf b;
    vl_buf_init(&b, PROGRESS_MAX_BYTES);
    rc = vl_buf_read_file(&b, path, err);
    if (rc == VL_ENOTFOUND) {
        vl_buf_free(&b);
        return VL_OK;
    }
    if (rc) {
        vl_buf_free(&b);
        return rc;
    }
    json_error_t je;
    json_t *o = json_loadb((const char *)b.data, b.len, JSON_REJECT_DUPLICATES, &je);
    vl_buf_free(&b);
    if (!json_is_object(o)) {
        json_decref(o);
        return vl_fail(err, VL_EINVAL, "%s is not a JSON object", path);
    }
    rc = get_count(o, "accepted", &p->accepted, path, err);
    if (!rc) rc = get_count(o, "dropped", &p->dropped, path, err);
    if (!rc) rc = get_count(o, "last_task", &p->last_task, path, err);
    if (!rc) rc = get_count(o, "last_version", &p->last_version, path, err);
    if (!rc) rc = get_count(o, "last_at", &p->last_at, path, err);
    if (!rc) rc = get_count(o, "bytes_up", &p->bytes_up, path, err);
    json_t *loss = json_object_get(o, "last_loss");
    if (!rc && loss) {
        if (!json_is_number(loss))
            rc = vl_fail(err, VL_EINVAL, "%s: 'last_loss' must be a number", path);
        else
            p->last_loss = json_number_value(loss);
    }
    json_t *dev = json_object_get(o, "device");
    if (!rc && dev) {
        if (!json_is_string(dev) || json_string_length(dev) >= sizeof p->device)
            rc = vl_fail(err, VL_EINVAL, "%s: 'device' must be a string under %zu bytes", path,
                         sizeof p->device);
        else
            peer_clean_copy(json_string_value(dev), p->device, sizeof p->device);
    }
    json_decref(o);
    if (rc) memset(p, 0, sizeof *p);
    return rc;
}

int peer_progress_save(const char *dir, const peer_progress *p, vl_error *err) {
    char path[PEER_PATH_MAX];
    int rc = peer_path_join(path, sizeof path, dir, PEER_PROGRESS_FILE, err);
    if (rc) return rc;
    json_t *o =
        json_pack("{s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:s}", "accepted", (json_int_t)p->accepted,
                  "dropped", (json_int_t)p->dropped, "last_task", (json_int_t)p->last_task,
                  "last_version", (json_int_t)p->last_version, "last_loss",
                  isfinite(p->last_loss) ? p->last_loss : 0.0, "last_at", (json_int_t)p->last_at,
                  "bytes_up", (json_int_t)p->bytes_up, "device", p->device);
    if (!o) return vl_fail(err, VL_ENOMEM, "cannot build %s", path);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    if (!text) return vl_fail(err, VL_ENOMEM, "cannot serialise %s", path);
    rc = vl_file_write_atomic(path, text, strlen(text), 0600, err);
    free(text);
    return rc;
}

/* "yes (N bytes)" when DIR/name exists, else "no". */
static void describe_file(const char *dir, const char *name, char *out, size_t cap) {
    char path[PEER_PATH_MAX];
    vl_error e = {0};
    struct stat st;
    if (peer_path_join(path, sizeof path, dir, name, &e) == VL_OK && stat(path, &st) == 0)
        snprintf(out, cap, "yes (%lld bytes)", (long long)st.st_size);
    else
        snprintf(out, cap, "no");
}

int peer_status_print(const char *dir, int ask, FILE *out, vl_error *err) {
    peer_state st;
    int rc = peer_state_load(dir, &st, err);
    if (rc) return rc;
    peer_progress p;
    if ((rc = peer_progress_load(dir, &p, err))) return rc;
    char pending[64], trainer[64];
    describe_file(dir, PEER_PENDING_FILE, pending, sizeof pending);
    describe_file(dir, PEER_TRAINER_FILE, trainer, sizeof trainer);
    fprintf(out, "peer:        %lld%s%s%s\n", (long long)st.peer_id, st.name[0] ? " (" : "",
            st.name, st.name[0] ? ")" : "");
    fprintf(out, "coordinator: %s\n", st.coordinator);
    fprintf(out, "run:         %s\n", st.run);
    peer_response rs;
    peer_response_init(&rs);
    char why[sizeof err->msg + 32] = "was not asked (--offline)", line[sizeof why + 256];
    int got = ask && peer_status_fetch(dir, st.coordinator, st.cacert, st.peer_id, &rs, why,
                                       sizeof why) == 0;
    peer_status_run_line(got ? (const char *)rs.body.data : NULL, got ? rs.body.len : 0, &p, why,
                         line, sizeof line);
    peer_response_free(&rs);
    fprintf(out, "progress:    %s\n", line);
    fprintf(out,
            "updates:     %lld accepted, %lld dropped (the coordinator no longer "
            "wanted them); %lld bytes sent\n",
            (long long)p.accepted, (long long)p.dropped, (long long)p.bytes_up);
    if (p.last_task) {
        char when[32] = "?";
        time_t t = (time_t)p.last_at;
        struct tm tm;
        if (gmtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        fprintf(out, "last task:   %lld on version %lld, training loss %.4f, answered %s\n",
                (long long)p.last_task, (long long)p.last_version, p.last_loss, when);
    } else {
        fprintf(out, "last task:   none yet\n");
    }
    fprintf(out, "device:      %s\n", p.device[0] ? p.device : "not run yet");
    fprintf(out, "pending upload (sent again at the next start): %s\n", pending);
    fprintf(out, "training state kept: %s\n", trainer);
    fflush(out);
    return VL_OK;
}
