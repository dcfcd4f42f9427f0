/* Validation of what the coordinator tells a peer to do: task leases and
 * the model configuration carried in model files. A coordinator is trusted
 * to schedule work, not to size allocations, so every count is bounded
 * here before anything is allocated or fetched. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "common/split_wire.h"
#include "peer/peer.h"

#define TASK_MAX_JSON (1024 * 1024)

/* Field access with the dotted path in every message, so an operator can
 * see at once which part of the lease the peer did not accept. */
static json_t *member(json_t *obj, const char *sect, const char *key, vl_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (sect)
            vl_fail(err, VL_EINVAL, "task: missing field '%s.%s'", sect, key);
        else
            vl_fail(err, VL_EINVAL, "task: missing field '%s'", key);
    }
    return v;
}

static int get_int(json_t *obj, const char *sect, const char *key, int64_t min, int64_t max,
                   int64_t *out, vl_error *err) {
    json_t *v = member(obj, sect, key, err);
    if (!v) return VL_EINVAL;
    const char *dot = sect ? "." : "";
    if (!json_is_integer(v))
        return vl_fail(err, VL_EINVAL, "task: '%s%s%s' must be an integer", sect ? sect : "", dot,
                       key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > max)
        return vl_fail(err, VL_EINVAL, "task: '%s%s%s' = %lld is outside [%lld, %lld]",
                       sect ? sect : "", dot, key, (long long)x, (long long)min, (long long)max);
    *out = (int64_t)x;
    return VL_OK;
}

/* Reals within [min, max]; min_open excludes min itself (lr, eps > 0). */
static int get_real(json_t *obj, const char *sect, const char *key, double min, int min_open,
                    double max, int max_open, double *out, vl_error *err) {
    json_t *v = member(obj, sect, key, err);
    if (!v) return VL_EINVAL;
    if (!json_is_number(v))
        return vl_fail(err, VL_EINVAL, "task: '%s.%s' must be a number", sect, key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < min || (min_open && x == min) || x > max || (max_open && x == max))
        return vl_fail(err, VL_EINVAL, "task: '%s.%s' = %g is outside %c%g, %g%c", sect, key, x,
                       min_open ? '(' : '[', min, max, max_open ? ')' : ']');
    *out = x;
    return VL_OK;
}

static int get_string(json_t *obj, const char *sect, const char *key, char *out, size_t cap,
                      vl_error *err) {
    json_t *v = member(obj, sect, key, err);
    if (!v) return VL_EINVAL;
    const char *dot = sect ? "." : "";
    if (!json_is_string(v))
        return vl_fail(err, VL_EINVAL, "task: '%s%s%s' must be a string", sect ? sect : "", dot,
                       key);
    size_t n = json_string_length(v);
    const char *s = json_string_value(v);
    if (n == 0 || n >= cap)
        return vl_fail(err, VL_EINVAL, "task: '%s%s%s' must be 1 to %zu characters",
                       sect ? sect : "", dot, key, cap - 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            return vl_fail(err, VL_EINVAL, "task: '%s%s%s' contains a control character",
                           sect ? sect : "", dot, key);
    }
    memcpy(out, s, n + 1);
    return VL_OK;
}

static json_t *section(json_t *root, const char *name, int required, vl_error *err) {
    json_t *v = json_object_get(root, name);
    if (!v) {
        if (required) vl_fail(err, VL_EINVAL, "task: missing section '%s'", name);
        return NULL;
    }
    if (!json_is_object(v)) {
        vl_fail(err, VL_EINVAL, "task: '%s' must be an object", name);
        return NULL;
    }
    return v;
}

static int shard_name_ok(const char *s) {
    for (; *s; s++) {
        char c = *s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* train.momentum and train.kfac of a K-FAC task. */
static int parse_kfac(json_t *tr, peer_task *t, vl_error *err) {
    int64_t v;
    int rc;
    if ((rc = get_real(tr, "train", "momentum", 0, 0, 1, 1, &t->momentum, err))) return rc;
    json_t *k = json_object_get(tr, "kfac");
    if (!json_is_object(k))
        return vl_fail(err, VL_EINVAL,
                       "task: 'train.kfac' must be an object (a K-FAC task's "
                       "settings)");
    if ((rc = get_real(k, "train.kfac", "damping", 0, 1, 1e3, 0, &t->kfac_damping, err)) ||
        (rc = get_real(k, "train.kfac", "decay", 0, 0, 1, 1, &t->kfac_decay, err)) ||
        (rc = get_real(k, "train.kfac", "kl_clip", 0, 0, 1e3, 0, &t->kfac_kl_clip, err)) ||
        (rc = get_int(k, "train.kfac", "inverse_every", 1, 1000000, &v, err)))
        return rc;
    t->kfac_inverse_every = (int)v;
    json_t *share = json_object_get(k, "share");
    if (share && !json_is_boolean(share))
        return vl_fail(err, VL_EINVAL, "task: 'train.kfac.share' must be true or false");
    t->kfac_share = share && json_is_true(share);
    t->kfac_dtype = ST_F32;
    t->kfac_factors = -1;
    if (!t->kfac_share) return VL_OK;
    char dtype[16];
    if ((rc = get_string(k, "train.kfac", "dtype", dtype, sizeof dtype, err))) return rc;
    if (st_dtype_parse(dtype, &t->kfac_dtype) != VL_OK ||
        (t->kfac_dtype != ST_F32 && t->kfac_dtype != ST_F16))
        return vl_fail(err, VL_EINVAL, "task: 'train.kfac.dtype' '%s' must be F32 or F16", dtype);
    if (json_object_get(k, "factors_version") &&
        (rc = get_int(k, "train.kfac", "factors_version", 0, INT64_MAX, &t->kfac_factors, err)))
        return rc;
    return VL_OK;
}

/* The data range: bytes of a named text shard (kind "bytes", or no kind,
 * as coordinators before token shards send it) or tokens of a numbered
 * training shard (kind "tokens"). */
static int parse_data(json_t *data, peer_task *t, vl_error *err) {
    char kind[16] = "bytes";
    int rc;
    if (json_object_get(data, "kind") &&
        (rc = get_string(data, "data", "kind", kind, sizeof kind, err)))
        return rc;
    t->tokens = strcmp(kind, "tokens") == 0;
    t->local = strcmp(kind, "local") == 0;
    if (t->local) {
        /* The peer's own data: nothing more to say, but whether the
         * coordinator, which has no test set, wants the base version's
         * accuracy on them. */
        json_t *ra = json_object_get(data, "report_accuracy");
        if (ra && !json_is_boolean(ra))
            return vl_fail(err, VL_EINVAL, "task: 'data.report_accuracy' must be true or false");
        t->report_accuracy = ra && json_is_true(ra);
        return VL_OK;
    }
    if (!t->tokens && strcmp(kind, "bytes") != 0)
        return vl_fail(err, VL_EINVAL,
                       "task: data kind '%s' is not supported by this peer "
                       "(bytes, tokens, local)",
                       kind);
    int64_t max_len = t->tokens ? PEER_MAX_DATA_TOKENS : PEER_MAX_DATA_BYTES;
    if (t->tokens) {
        if ((rc = get_int(data, "data", "shard", 0, PEER_MAX_SHARD, &t->shard_index, err)))
            return rc;
    } else {
        if ((rc = get_string(data, "data", "shard", t->shard, sizeof t->shard, err))) return rc;
        if (!shard_name_ok(t->shard))
            return vl_fail(err, VL_EINVAL,
                           "task: 'data.shard' may hold only letters, digits, "
                           "'_' and '-'");
    }
    if ((rc = get_int(data, "data", "offset", 0, INT64_MAX - max_len, &t->offset, err))) return rc;
    return get_int(data, "data", "length", 1, max_len, &t->length, err);
}

static int parse_root(json_t *root, peer_task *t, vl_error *err) {
    int64_t v;
    int rc;
    if ((rc = get_int(root, NULL, "task_id", 0, INT64_MAX, &t->task_id, err))) return rc;
    if ((rc = get_string(root, NULL, "run", t->run, sizeof t->run, err))) return rc;
    if ((rc = get_int(root, NULL, "base_version", 0, INT64_MAX, &t->base_version, err))) return rc;
    if ((rc = get_int(root, NULL, "deadline", 0, INT64_MAX, &t->deadline, err))) return rc;

    json_t *data = section(root, "data", 1, err);
    if (!data) return VL_EINVAL;
    if ((rc = parse_data(data, t, err))) return rc;

    json_t *tr = section(root, "train", 1, err);
    if (!tr) return VL_EINVAL;
    if ((rc = get_int(tr, "train", "steps", 1, PEER_MAX_STEPS, &v, err))) return rc;
    t->steps = (int)v;
    if ((rc = get_int(tr, "train", "batch", 1, PEER_MAX_BATCH, &v, err))) return rc;
    t->batch = (int)v;
    if ((rc = get_int(tr, "train", "context", 1, PEER_MAX_CONTEXT, &v, err))) return rc;
    t->context = (int)v;
    char opt[32];
    if ((rc = get_string(tr, "train", "optimizer", opt, sizeof opt, err))) return rc;
    if (strcmp(opt, "adamw") != 0 && strcmp(opt, "sgd") != 0 && strcmp(opt, "kfac") != 0)
        return vl_fail(err, VL_EINVAL,
                       "task: optimizer '%.32s' is not supported (adamw, sgd, "
                       "kfac)",
                       opt);
    t->sgd = strcmp(opt, "sgd") == 0;
    t->kfac = strcmp(opt, "kfac") == 0;
    if ((rc = get_real(tr, "train", "lr", 0, 1, 1e3, 0, &t->lr, err))) return rc;
    if ((rc = get_real(tr, "train", "beta1", 0, 0, 1, 1, &t->beta1, err))) return rc;
    if ((rc = get_real(tr, "train", "beta2", 0, 0, 1, 1, &t->beta2, err))) return rc;
    if ((rc = get_real(tr, "train", "eps", 0, 1, 1, 0, &t->eps, err))) return rc;
    if ((rc = get_real(tr, "train", "weight_decay", 0, 0, 1e3, 0, &t->weight_decay, err)))
        return rc;
    if ((rc = get_real(tr, "train", "grad_clip", 0, 0, 1e9, 0, &t->grad_clip, err))) return rc;
    if (t->sgd) {
        if ((rc = get_real(tr, "train", "momentum", 0, 0, 1, 1, &t->momentum, err))) return rc;
        json_t *nv = json_object_get(tr, "nesterov");
        if (nv && !json_is_boolean(nv))
            return vl_fail(err, VL_EINVAL, "task: 'train.nesterov' must be true or false");
        t->nesterov = nv && json_is_true(nv);
        if (t->nesterov && t->momentum == 0)
            return vl_fail(err, VL_EINVAL, "task: Nesterov momentum needs train.momentum > 0");
    }
    if (t->kfac && (rc = parse_kfac(tr, t, err))) return rc;
    if ((rc = get_int(tr, "train", "seed", 0, INT64_MAX, &v, err))) return rc;
    t->seed = (uint64_t)v;
    if ((int64_t)t->batch * t->context > PEER_MAX_BATCH_TOKENS)
        return vl_fail(err, VL_EINVAL, "task: batch * context = %lld tokens exceeds %lld",
                       (long long)t->batch * t->context, (long long)PEER_MAX_BATCH_TOKENS);
    if (!t->local && t->length < (int64_t)t->context + 1)
        return vl_fail(err, VL_EINVAL,
                       "task: 'data.length' = %lld is shorter than context + 1 = %d",
                       (long long)t->length, t->context + 1);

    json_t *cmp = section(root, "compression", 1, err);
    if (!cmp) return VL_EINVAL;
    char kind[32], dtype[16];
    if ((rc = get_string(cmp, "compression", "kind", kind, sizeof kind, err))) return rc;
    static const struct {
        const char *name;
        peer_method method;
        compress_kind kind;
    } METHODS[] = {{"none", PEER_METHOD_NONE, COMPRESS_DENSE},
                   {"dense", PEER_METHOD_NONE, COMPRESS_DENSE},
                   {"topk", PEER_METHOD_TOPK, COMPRESS_TOPK},
                   {"gaussk", PEER_METHOD_GAUSSK, COMPRESS_TOPK},
                   {"sketch", PEER_METHOD_SKETCH, COMPRESS_SKETCH}};
    int found = 0;
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++) {
        if (strcmp(kind, METHODS[i].name) != 0) continue;
        t->method = METHODS[i].method;
        t->kind = METHODS[i].kind;
        found = 1;
    }
    if (!found)
        return vl_fail(err, VL_EINVAL,
                       "task: compression kind '%s' is not supported by this peer (supported: "
                       "none, topk, gaussk, sketch)",
                       kind);
    if (t->method != PEER_METHOD_NONE) {
        if ((rc = get_int(cmp, "compression", "k", 1, UINT32_MAX, &t->comp_k, err))) return rc;
    }
    /* Optional: without them a peer runs plain top-k and classic error
     * feedback, as coordinators that predate them expect. */
    t->comp_block = 0;
    t->comp_decay = 1.0f;
    if (t->method == PEER_METHOD_TOPK && json_object_get(cmp, "block") &&
        (rc = get_int(cmp, "compression", "block", 0, UINT32_MAX, &t->comp_block, err)))
        return rc;
    if (t->method == PEER_METHOD_TOPK || t->method == PEER_METHOD_GAUSSK) {
        double decay = 1.0;
        if (json_object_get(cmp, "decay") &&
            (rc = get_real(cmp, "compression", "decay", 0, 1, 1, 0, &decay, err)))
            return rc;
        t->comp_decay = (float)decay;
    }
    if (t->method == PEER_METHOD_SKETCH) {
        if ((rc = get_int(cmp, "compression", "rows", 1, COMPRESS_SKETCH_MAX_ROWS, &v, err)))
            return rc;
        t->comp_rows = (uint32_t)v;
        if ((rc = get_int(cmp, "compression", "cols", 1, (int64_t)COMPRESS_SKETCH_MAX_CELLS, &v,
                          err)))
            return rc;
        t->comp_cols = (uint32_t)v;
        if ((uint64_t)t->comp_rows * t->comp_cols > COMPRESS_SKETCH_MAX_CELLS)
            return vl_fail(err, VL_EINVAL, "task: a sketch of %u x %u cells is too large",
                           t->comp_rows, t->comp_cols);
        if ((rc = get_int(cmp, "compression", "seed", 0, INT64_MAX, &v, err))) return rc;
        t->comp_seed = (uint64_t)v;
        /* Coordinators before the windowed hash send none: their runs sum
         * tables of the hash per coordinate, which this peer no longer
         * computes. */
        const char *hash = json_string_value(json_object_get(cmp, "hash"));
        if (!hash || strcmp(hash, COMPRESS_SKETCH_HASH) != 0)
            return vl_fail(err, VL_EINVAL,
                           "task: the coordinator's sketches use the \"%.20s\" hash; this "
                           "volley-peer computes the \"%s\" hash (the coordinator needs the same "
                           "volley release)",
                           hash ? hash : "per coordinate", COMPRESS_SKETCH_HASH);
        /* Optional: coordinators without second rounds leave them out. */
        t->second_round = 0;
        t->round_s = 0;
        json_t *sr = json_object_get(cmp, "second_round");
        if (sr && !json_is_null(sr)) {
            if ((rc = get_int(cmp, "compression", "second_round", 0, 64, &v, err))) return rc;
            t->second_round = (int)v;
            if (t->second_round > 0) {
                if ((rc = get_int(cmp, "compression", "round_s", 1, 3600, &v, err))) return rc;
                t->round_s = (int)v;
            }
        }
    }
    if ((rc = get_string(cmp, "compression", "dtype", dtype, sizeof dtype, err))) return rc;
    if (st_dtype_parse(dtype, &t->dtype) != VL_OK || (t->dtype != ST_F32 && t->dtype != ST_F16))
        return vl_fail(err, VL_EINVAL, "task: compression dtype '%s' must be F32 or F16", dtype);

    json_t *sp = json_object_get(root, "split");
    if (sp && !json_is_null(sp)) {
        if (!json_is_object(sp)) return vl_fail(err, VL_EINVAL, "task: 'split' must be an object");
        if (!t->local)
            return vl_fail(err, VL_EINVAL,
                           "task: split learning needs the peer's own data "
                           "(data.kind \"local\")");
        if ((rc = get_int(sp, "split", "cut", 1, MODEL_MLP_MAX_LAYERS - 1, &v, err))) return rc;
        t->split_cut = (int)v;
        if ((rc = get_real(sp, "split", "alpha", 0, 0, 1e3, 0, &t->split_alpha, err))) return rc;
        char sdt[16];
        if ((rc = get_string(sp, "split", "dtype", sdt, sizeof sdt, err))) return rc;
        if (st_dtype_parse(sdt, &t->split_dtype) != VL_OK ||
            (t->split_dtype != ST_F32 && t->split_dtype != ST_F16))
            return vl_fail(err, VL_EINVAL, "task: split dtype '%s' must be F32 or F16", sdt);
        json_t *u = json_object_get(sp, "u_shape");
        if (u && !json_is_boolean(u))
            return vl_fail(err, VL_EINVAL, "task: 'split.u_shape' must be true or false");
        t->split_u = u && json_is_true(u);
        /* Absent from older coordinators' tasks: one batch at a time. */
        t->split_in_flight = 1;
        if (json_object_get(sp, "in_flight")) {
            if ((rc = get_int(sp, "split", "in_flight", 1, SPLIT_WIRE_MAX_IN_FLIGHT, &v, err)))
                return rc;
            t->split_in_flight = (int)v;
        }
        if (t->split_u && t->split_in_flight > 1)
            return vl_fail(err, VL_EINVAL, "task: a U-shaped split takes one batch at a time");
    }
    /* Absent from sync runs' tasks and older coordinators': the next
     * task waits for this one's upload. */
    json_t *ov = json_object_get(root, "overlap");
    if (ov && !json_is_boolean(ov))
        return vl_fail(err, VL_EINVAL, "task: 'overlap' must be true or false");
    t->overlap = ov && json_is_true(ov);
    /* SelSync is optional: without it the peer runs exactly `steps`. */
    t->selsync_delta = 0;
    t->h_min = t->steps;
    json_t *ss = json_object_get(root, "selsync");
    if (ss && !json_is_null(ss)) {
        if (!json_is_object(ss))
            return vl_fail(err, VL_EINVAL, "task: 'selsync' must be an object");
        if ((rc = get_real(ss, "selsync", "delta", 0, 0, 1e9, 0, &t->selsync_delta, err)))
            return rc;
        if ((rc = get_int(ss, "selsync", "h_max", t->steps, t->steps, &v, err))) return rc;
        if ((rc = get_int(ss, "selsync", "h_min", 1, t->steps, &v, err))) return rc;
        t->h_min = (int)v;
    }
    return VL_OK;
}

int peer_task_parse(const char *json, size_t len, peer_task *out, vl_error *err) {
    memset(out, 0, sizeof *out);
    if (len > TASK_MAX_JSON)
        return vl_fail(err, VL_ETOOBIG, "task: JSON over %d bytes", TASK_MAX_JSON);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return vl_fail(err, VL_EINVAL, "task: not valid JSON (%s)", je.text);
    int rc = peer_task_from_json(root, out, err);
    json_decref(root);
    return rc;
}

int peer_task_check_run(const peer_task *t, const char *run, vl_error *err) {
    if (strcmp(t->run, run) != 0)
        return vl_fail(err, VL_EINVAL, "task %lld is for run '%s'; this peer joined run '%s'",
                       (long long)t->task_id, t->run, run);
    return VL_OK;
}

int peer_task_from_json(json_t *obj, peer_task *out, vl_error *err) {
    memset(out, 0, sizeof *out);
    if (!json_is_object(obj)) return vl_fail(err, VL_EINVAL, "task: not a JSON object");
    return parse_root(obj, out, err);
}

int peer_task_check_model(const peer_task *t, const model_gpt_config *cfg, vl_error *err) {
    size_t n = model_gpt_config_num_params(cfg);
    if ((t->method == PEER_METHOD_TOPK || t->method == PEER_METHOD_GAUSSK) &&
        (uint64_t)t->comp_k > (uint64_t)n)
        return vl_fail(err, VL_EINVAL,
                       "task: compression k %lld exceeds the model's %zu "
                       "parameters",
                       (long long)t->comp_k, n);
    if (t->context > cfg->block_size)
        return vl_fail(err, VL_EINVAL, "task: context %d exceeds the model's block size %d",
                       t->context, (int)cfg->block_size);
    if (!t->tokens && cfg->vocab_size < 256)
        return vl_fail(err, VL_EINVAL,
                       "task: the data is bytes but the model's vocabulary has only %d tokens",
                       (int)cfg->vocab_size);
    return VL_OK;
}

int peer_model_config_parse(const char *json, model_gpt_config *out, vl_error *err) {
    static const struct {
        const char *key;
        int64_t max;
    } F[] = {{"vocab_size", 1 << 20},
             {"block_size", PEER_MAX_CONTEXT},
             {"n_layer", 1024},
             {"n_head", 1024},
             {"n_embd", 1 << 16}};
    int64_t v[5];
    json_error_t je;
    json_t *o = json_loads(json, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return vl_fail(err, VL_EINVAL, "model configuration is not a JSON object");
    }
    int rc = VL_OK;
    for (size_t i = 0; i < 5 && !rc; i++) {
        json_t *x = json_object_get(o, F[i].key);
        if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > F[i].max)
            rc = vl_fail(err, VL_EINVAL,
                         "model configuration: '%s' must be an integer in "
                         "[1, %lld]",
                         F[i].key, (long long)F[i].max);
        else
            v[i] = (int64_t)json_integer_value(x);
    }
    json_decref(o);
    if (rc) return rc;
    if (v[4] % v[3] != 0)
        return vl_fail(err, VL_EINVAL,
                       "model configuration: n_embd %lld is not divisible by "
                       "n_head %lld",
                       (long long)v[4], (long long)v[3]);
    memset(out, 0, sizeof *out);
    out->vocab_size = (int)v[0];
    out->block_size = (int)v[1];
    out->n_layer = (int)v[2];
    out->n_head = (int)v[3];
    out->n_embd = (int)v[4];
    return VL_OK;
}

void peer_task_describe_compression(const peer_task *t, char *out, size_t cap) {
    const char *dt = t->dtype == ST_F16 ? "F16" : "F32";
    switch (t->method) {
    case PEER_METHOD_NONE: snprintf(out, cap, "dense %s", dt); return;
    case PEER_METHOD_SKETCH:
        snprintf(out, cap, "sketch %u x %u %s, seed %llu%s", t->comp_rows, t->comp_cols, dt,
                 (unsigned long long)t->comp_seed, t->second_round ? ", second round" : "");
        return;
    case PEER_METHOD_TOPK:
    case PEER_METHOD_GAUSSK: {
        char blocks[48] = "";
        if (t->comp_block > 0)
            snprintf(blocks, sizeof blocks, ", blocks of %lld", (long long)t->comp_block);
        snprintf(out, cap, "%s k=%lld %s%s, residual decay %g",
                 t->method == PEER_METHOD_TOPK ? "topk" : "gaussk", (long long)t->comp_k, dt,
                 blocks, (double)t->comp_decay);
        return;
    }
    }
    snprintf(out, cap, "unknown");
}

void peer_clean_copy(const char *s, char *out, size_t cap) {
    size_t j = 0;
    for (; *s && j + 1 < cap; s++)
        if ((unsigned char)*s >= 0x20 && *s != 0x7f) out[j++] = *s;
    out[j] = '\0';
}

int peer_join_reply_parse(const uint8_t *body, size_t len, peer_state *st, vl_error *err) {
    if (len > TASK_MAX_JSON)
        return vl_fail(err, VL_ETOOBIG, "join reply: JSON over %d bytes", TASK_MAX_JSON);
    json_error_t je;
    json_t *o = body ? json_loadb((const char *)body, len, JSON_REJECT_DUPLICATES, &je) : NULL;
    json_t *id = json_object_get(o, "peer_id");
    json_t *run = json_object_get(o, "run");
    json_t *name = json_is_object(run) ? json_object_get(run, "name") : NULL;
    int rc = VL_OK;
    if (!json_is_integer(id) || json_integer_value(id) <= 0)
        rc = vl_fail(err, VL_EINVAL, "join reply lacks a positive integer 'peer_id'");
    else if (!json_is_string(name) || json_string_length(name) == 0 ||
             json_string_length(name) >= sizeof st->run)
        rc = vl_fail(err, VL_EINVAL, "join reply lacks the run's 'name'");
    else {
        /* Refused, not cleaned: leases name the run exactly, and one with
         * a control character in it is refused, so a cleaned name would
         * match none of them (found by fuzz_peer_json: a name of nothing
         * but DEL bytes was accepted as ""). */
        char clean[sizeof st->run];
        peer_clean_copy(json_string_value(name), clean, sizeof clean);
        if (strlen(clean) != json_string_length(name))
            rc = vl_fail(err, VL_EINVAL, "join reply: the run's name has a control character");
        else {
            st->peer_id = (int64_t)json_integer_value(id);
            memcpy(st->run, clean, sizeof clean);
        }
    }
    json_decref(o);
    return rc;
}
