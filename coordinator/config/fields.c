/* The run configuration's table of fields and what walks it: defaults,
 * key checks, reading with bounds, writing back (fields.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/split_wire.h"
#include "compress/compress.h"
#include "coordinator/config/config_internal.h"
#include "coordinator/config/fields.h"

/* ---- choices and predicates ---------------------------------------------- */

static const char *const MODES[] = {"sync", "async", "split", NULL};
static const char *const OPTIMIZERS[] = {"adamw", "sgd", "kfac", NULL};
static const char *const SCHEDULES[] = {"constant", "cosine", NULL};
/* "dense" is the older name of "none" (coord_config_get_kind). */
static const char *const KINDS[] = {"none", "dense", "topk", "gaussk", "sketch", NULL};
static const char *const DTYPES[] = {"F32", "F16", NULL};
static const char *const SKETCH_HASHES[] = {COMPRESS_SKETCH_HASH, NULL};
/* In coord_stale_fn order. */
static const char *const STALE_FNS[] = {"polynomial", "hinge", "constant", NULL};
/* refuse_excess 0 and 1. */
static const char *const EXCESS[] = {"clip", "refuse", NULL};

/* Text runs: a corpus the coordinator splits and serves. */
static int is_text(const coord_config *c) {
    return !c->shards && !c->local;
}
static int is_served_shards(const coord_config *c) {
    return c->shards && !c->local;
}
static int is_gpt(const coord_config *c) {
    return c->net != COORD_NET_MLP;
}
static int is_kfac(const coord_config *c) {
    return strcmp(c->train.optimizer, "kfac") == 0;
}
static int is_auto_norm(const coord_config *c) {
    return c->robust.auto_norm;
}

/* ---- the table ------------------------------------------------------------ */

#define AT(member) \
    .offset = offsetof(coord_config, member), .size = sizeof(((coord_config *)0)->member)
#define SECTION(n, ...) \
    { .name = n, .type = COORD_FIELD_SECTION, __VA_ARGS__ }
#define CODE(n, ...) \
    { .name = n, .type = COORD_FIELD_CODE, __VA_ARGS__ }
#define INT(n, m, min, max, def, ...)                                                           \
    {                                                                                           \
        .name = n, .type = COORD_FIELD_INT, AT(m), .imin = (min), .imax = (max), .idef = (def), \
        __VA_ARGS__                                                                             \
    }
/* Bounds as intervals: "[" closed, "(" open. */
#define REAL(n, m, lopen, l, h, hopen, def, ...)                                              \
    {                                                                                         \
        .name = n, .type = COORD_FIELD_REAL, AT(m), .lo = (l), .hi = (h), .lo_open = (lopen), \
        .hi_open = (hopen), .rdef = (def), __VA_ARGS__                                        \
    }
#define BOOL(n, m, def, ...) \
    { .name = n, .type = COORD_FIELD_BOOL, AT(m), .idef = (def), __VA_ARGS__ }
#define STR(n, m, ch, def, ...) \
    { .name = n, .type = COORD_FIELD_STR, AT(m), .choices = (ch), .sdef = (def), __VA_ARGS__ }
#define ENUM(n, m, ch, def, ...) \
    { .name = n, .type = COORD_FIELD_ENUM, AT(m), .choices = (ch), .idef = (def), __VA_ARGS__ }
#define OPEN 1
#define CLOSED 0

/* -1 marks a default chosen once the rest is known: by kind, by mode or
 * from another field (config.c, config_resolve.c say how). */
static const coord_config_field FIELDS[] = {
    STR("name", name, NULL, "", .get = coord_config_get_name),
    REAL("val_fraction", val_fraction, OPEN, 0, 0.5, CLOSED, 0.1, .written = is_text),
    INT("seed", seed, 0, INT64_MAX, 1337),
    /* A GPT's shape, or an mlp model's own object (kind "mlp"). */
    SECTION("model", .get = coord_config_get_model, .put = coord_config_put_model),
    CODE("model.kind"),
    INT("model.vocab_size", model.vocab_size, 1, MODEL_MAX_VOCAB, 256, .flags = COORD_FIELD_GPT),
    INT("model.block_size", model.block_size, 1, MODEL_MAX_BLOCK, 64, .flags = COORD_FIELD_GPT),
    INT("model.n_layer", model.n_layer, 1, MODEL_MAX_LAYER, 2, .flags = COORD_FIELD_GPT),
    INT("model.n_head", model.n_head, 1, MODEL_MAX_EMBD, 4, .flags = COORD_FIELD_GPT),
    INT("model.n_embd", model.n_embd, 1, MODEL_MAX_EMBD, 128, .flags = COORD_FIELD_GPT),
    STR("mode", mode, MODES, "sync"),
    INT("updates_per_version", updates_per_version, 1, 100000, 4),
    INT("max_versions", max_versions, 1, 100000000, 30),
    SECTION("train"),
    INT("train.steps", train.steps, 1, 100000, 10),
    INT("train.batch", train.batch, 1, 4096, 8),
    STR("train.optimizer", train.optimizer, OPTIMIZERS, "adamw"),
    REAL("train.lr", train.lr, OPEN, 0, 10, CLOSED, 0.001),
    REAL("train.beta1", train.beta1, CLOSED, 0, 1, OPEN, 0.9),
    REAL("train.beta2", train.beta2, CLOSED, 0, 1, OPEN, 0.95),
    REAL("train.eps", train.eps, OPEN, 0, 1, CLOSED, 1e-8),
    REAL("train.weight_decay", train.weight_decay, CLOSED, 0, 10, CLOSED, 0),
    REAL("train.grad_clip", train.grad_clip, CLOSED, 0, 1e6, CLOSED, 1.0),
    BOOL("train.dynamic_steps", train.dynamic_steps, -1),
    STR("train.schedule", train.schedule, SCHEDULES, "constant"),
    INT("train.warmup", train.warmup, 0, 100000000, 0),
    REAL("train.min_lr", train.min_lr, CLOSED, 0, 10, CLOSED, 0),
    REAL("train.momentum", train.momentum, CLOSED, 0, 1, OPEN, 0.9),
    BOOL("train.nesterov", train.nesterov, 0),
    SECTION("train.kfac", .written = is_kfac),
    REAL("train.kfac.damping", train.kfac.damping, OPEN, 0, 1e3, CLOSED, 0,
         .flags = COORD_FIELD_DEF_CODE),
    REAL("train.kfac.decay", train.kfac.decay, CLOSED, 0, 1, OPEN, 0,
         .flags = COORD_FIELD_DEF_CODE),
    INT("train.kfac.inverse_every", train.kfac.inverse_every, 1, 1000000, 0,
        .flags = COORD_FIELD_DEF_CODE),
    REAL("train.kfac.kl_clip", train.kfac.kl_clip, CLOSED, 0, 1e3, CLOSED, 0,
         .flags = COORD_FIELD_DEF_CODE),
    BOOL("train.kfac.share", train.kfac.share, 0),
    STR("train.kfac.dtype", train.kfac.dtype, DTYPES, "F32"),
    SECTION("outer"),
    REAL("outer.lr", outer_lr, OPEN, 0, 10, CLOSED, 0.7),
    REAL("outer.momentum", outer_momentum, CLOSED, 0, 1, OPEN, 0.9),
    INT("outer.delay", outer_delay, 1, 1000, -1),
    SECTION("compression"),
    STR("compression.kind", compression_kind, KINDS, "none", .get = coord_config_get_kind),
    STR("compression.dtype", compression_dtype, DTYPES, ""),
    INT("compression.k", comp_k, 0, UINT32_MAX, 0),
    INT("compression.rows", comp_rows, 1, COMPRESS_SKETCH_MAX_ROWS, 5),
    INT("compression.cols", comp_cols, 0, (int64_t)1 << 28, 0),
    INT("compression.seed", comp_seed, 0, INT64_MAX, -1),
    REAL("compression.ratio", comp_ratio, CLOSED, 1, 1e9, CLOSED, 0,
         .flags = COORD_FIELD_UNWRITTEN),
    INT("compression.apply_k", apply_k, 0, UINT32_MAX, 0),
    INT("compression.second_round", second_round, 0, COORD_MAX_SECOND_ROUND, -1),
    INT("compression.round_s", round_s, 1, 3600, 30),
    INT("compression.block", comp_block, 0, UINT32_MAX, -1),
    REAL("compression.decay", comp_decay, OPEN, 0, 1, CLOSED, -1),
    STR("compression.hash", comp_hash, SKETCH_HASHES, COMPRESS_SKETCH_HASH),
    INT("task_bytes", task_bytes, 2, INT64_MAX / 2, 65536, .written = is_text),
    INT("lease_s", lease_s, 1, 7 * 86400, 120),
    INT("max_body_bytes", max_body_bytes, 1024, (int64_t)1 << 40, 67108864),
    INT("val_batches", val_batches, 0, 1000000, -1, .written = is_gpt),
    INT("val_tokens", val_tokens, 0, (int64_t)1 << 40, COORD_VAL_TOKENS_DEFAULT,
        .flags = COORD_FIELD_UNWRITTEN),
    INT("val_check_tokens", val_check_tokens, 0, (int64_t)1 << 40, 0, .written = is_gpt),
    INT("keep_versions", keep_versions, 1, 100000000, 4),
    INT("keep_changes", keep_changes, 1, 100000000, -1),
    INT("task_tokens", task_tokens, 2, COORD_MAX_TASK_TOKENS, 65536, .written = is_served_shards),
    STR("corpus", corpus, NULL, "", .flags = COORD_FIELD_UNWRITTEN),
    /* Read by config.c (parse_data, config_local.c); written by its put. */
    SECTION("data", .put = coord_config_put_data),
    CODE("data.kind"),
    CODE("data.train"),
    CODE("data.val"),
    CODE("data.val_shard"),
    CODE("data.test_images"),
    CODE("data.test_labels"),
    SECTION("split", .written = coord_config_is_split),
    /* Bounded by the model's layers, too (coord_config_get_split_cut). */
    INT("split.cut", split_cut, 1, MODEL_MLP_MAX_LAYERS, 0, .get = coord_config_get_split_cut),
    REAL("split.alpha", split_alpha, CLOSED, 0, 1e3, CLOSED, 0),
    REAL("split.lr", split_lr, CLOSED, 0, 10, CLOSED, 0, .flags = COORD_FIELD_DEF_CODE),
    STR("split.dtype", split_dtype, DTYPES, "F32"),
    BOOL("split.u_shape", split_u, 0),
    INT("split.in_flight", split_in_flight, 1, SPLIT_WIRE_MAX_IN_FLIGHT, 1),
    SECTION("staleness"),
    ENUM("staleness.function", staleness.fn, STALE_FNS, COORD_STALE_POLYNOMIAL),
    REAL("staleness.a", staleness.a, CLOSED, 0, 100, CLOSED, 0.5),
    INT("staleness.b", staleness.b, 0, 1000000, 4),
    INT("staleness.max", staleness.max, 0, 1000000, 16),
    INT("round_deadline_s", round_deadline_s, 0, 7 * 86400, 0),
    SECTION("selsync"),
    REAL("selsync.delta", selsync_delta, CLOSED, 0, 1e9, CLOSED, 0),
    INT("selsync.h_min", selsync_h_min, 1, 100000, -1),
    INT("keep_update_blobs", keep_update_blobs, 1, 100000000, -1),
    REAL("max_loss_rise", max_loss_rise, CLOSED, 0, 100, CLOSED, COORD_MAX_LOSS_RISE_DEFAULT),
    REAL("lease_wait", lease_wait, CLOSED, 0, 100, CLOSED, -1),
    SECTION("robust"),
    ENUM("robust.rule", robust.rule, coord_rule_names, COORD_RULE_MEAN),
    REAL("robust.trim", robust.trim, OPEN, 0, 0.5, OPEN, 0.2),
    REAL("robust.clip_mult", robust.clip_mult, OPEN, 0, 1e6, CLOSED, 2.0),
    /* A number or "auto" (config.c). */
    REAL("robust.max_norm", robust.max_norm, CLOSED, 0, 1e30, CLOSED, 0,
         .get = coord_config_get_max_norm, .put = coord_config_put_max_norm),
    ENUM("robust.on_excess", robust.refuse_excess, EXCESS, 0),
    REAL("robust.auto_mult", robust.auto_mult, OPEN, 1, 1e6, CLOSED, 4.0, .written = is_auto_norm),
    INT("robust.auto_versions", robust.auto_versions, 1, 1000, 3, .written = is_auto_norm),
};

#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

const coord_config_field *coord_config_fields(size_t *n_out) {
    *n_out = N_FIELDS;
    return FIELDS;
}

const coord_config_field *coord_config_field_find(const char *name) {
    for (size_t i = 0; i < N_FIELDS; i++)
        if (strcmp(FIELDS[i].name, name) == 0) return &FIELDS[i];
    return NULL;
}

/* ---- a field's storage ---------------------------------------------------- */

static void *slot(const coord_config *cfg, const coord_config_field *f) {
    return (char *)cfg + f->offset;
}

static int64_t get_i(const coord_config *cfg, const coord_config_field *f) {
    if (f->size == sizeof(int64_t)) return *(const int64_t *)slot(cfg, f);
    return *(const int *)slot(cfg, f);
}

static void set_i(coord_config *cfg, const coord_config_field *f, int64_t v) {
    if (f->size == sizeof(int64_t))
        *(int64_t *)slot(cfg, f) = v;
    else
        *(int *)slot(cfg, f) = (int)v;
}

void coord_config_fields_defaults(coord_config *cfg) {
    for (size_t i = 0; i < N_FIELDS; i++) {
        const coord_config_field *f = &FIELDS[i];
        if (f->flags & COORD_FIELD_DEF_CODE) continue;
        switch (f->type) {
        case COORD_FIELD_INT:
        case COORD_FIELD_BOOL:
        case COORD_FIELD_ENUM: set_i(cfg, f, f->idef); break;
        case COORD_FIELD_REAL: *(double *)slot(cfg, f) = f->rdef; break;
        case COORD_FIELD_STR: snprintf(slot(cfg, f), f->size, "%s", f->sdef); break;
        case COORD_FIELD_SECTION:
        case COORD_FIELD_CODE: break;
        }
    }
}

/* ---- reading -------------------------------------------------------------- */

int coord_config_fields_keys(json_t *obj, const char *section, vl_error *err) {
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val) {
        char name[128];
        snprintf(name, sizeof name, "%s%s%s", section, *section ? "." : "", key);
        if (strlen(key) > 64 || !coord_config_field_find(name))
            return vl_fail(err, VL_EINVAL, "config: unknown field '%s%s%.64s'", section,
                           *section ? "." : "", key);
    }
    return VL_OK;
}

int coord_config_field_str(json_t *v, const char *field, char *out, size_t cap,
                           const char *const *choices, vl_error *err) {
    if (!json_is_string(v)) return vl_fail(err, VL_EINVAL, "config: %s must be a string", field);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n >= cap || strlen(s) != n)
        return vl_fail(err, VL_EINVAL, "config: %s must be a non-empty string under %zu bytes",
                       field, cap);
    if (choices) {
        int ok = 0;
        for (const char *const *c = choices; *c; c++) ok |= strcmp(s, *c) == 0;
        if (!ok) {
            char list[128] = "";
            for (const char *const *c = choices; *c; c++) {
                size_t used = strlen(list);
                snprintf(list + used, sizeof list - used, "%s\"%s\"", c == choices ? "" : ", ", *c);
            }
            return vl_fail(err, VL_EINVAL, "config: %s must be one of %s (got \"%s\")", field, list,
                           s);
        }
    }
    memcpy(out, s, n + 1);
    return VL_OK;
}

int coord_config_field_read(json_t *v, const coord_config_field *f, coord_config *cfg,
                            vl_error *err) {
    switch (f->type) {
    case COORD_FIELD_INT: {
        if (!json_is_integer(v))
            return vl_fail(err, VL_EINVAL, "config: %s must be an integer", f->name);
        json_int_t x = json_integer_value(v);
        if (x < f->imin || x > f->imax)
            return vl_fail(err, VL_EINVAL, "config: %s must be between %lld and %lld (got %lld)",
                           f->name, (long long)f->imin, (long long)f->imax, (long long)x);
        set_i(cfg, f, x);
        return VL_OK;
    }
    case COORD_FIELD_REAL: {
        if (!json_is_number(v))
            return vl_fail(err, VL_EINVAL, "config: %s must be a number", f->name);
        double x = json_number_value(v);
        int bad = !isfinite(x) || (f->lo_open ? x <= f->lo : x < f->lo) ||
                  (f->hi_open ? x >= f->hi : x > f->hi);
        if (bad)
            return vl_fail(err, VL_EINVAL, "config: %s must be in %s%g, %g%s (got %g)", f->name,
                           f->lo_open ? "(" : "[", f->lo, f->hi, f->hi_open ? ")" : "]", x);
        *(double *)slot(cfg, f) = x;
        return VL_OK;
    }
    case COORD_FIELD_BOOL:
        if (!json_is_boolean(v))
            return vl_fail(err, VL_EINVAL, "config: %s must be true or false", f->name);
        set_i(cfg, f, json_is_true(v));
        return VL_OK;
    case COORD_FIELD_STR:
        return coord_config_field_str(v, f->name, slot(cfg, f), f->size, f->choices, err);
    case COORD_FIELD_ENUM: {
        char s[32];
        int rc = coord_config_field_str(v, f->name, s, sizeof s, f->choices, err);
        for (int i = 0; rc == VL_OK && f->choices[i]; i++)
            if (strcmp(s, f->choices[i]) == 0) set_i(cfg, f, i);
        return rc;
    }
    case COORD_FIELD_SECTION:
    case COORD_FIELD_CODE: break;
    }
    return VL_OK;
}

/* The object that holds the field at dotted path name in root, and the
 * field's own key; NULL where a section on the way is not given. */
static json_t *parent_of(json_t *root, const char *name, const char **key) {
    json_t *obj = root;
    const char *p = name, *dot;
    while (obj && (dot = strchr(p, '.'))) {
        char part[64];
        size_t n = (size_t)(dot - p);
        if (n >= sizeof part) return NULL;
        memcpy(part, p, n);
        part[n] = '\0';
        obj = json_object_get(obj, part);
        p = dot + 1;
    }
    *key = p;
    return json_is_object(obj) ? obj : NULL;
}

int coord_config_fields_read(json_t *root, coord_config *cfg, vl_error *err) {
    for (size_t i = 0; i < N_FIELDS; i++) {
        const coord_config_field *f = &FIELDS[i];
        if (f->type == COORD_FIELD_CODE) continue;
        if ((f->flags & COORD_FIELD_GPT) && cfg->net == COORD_NET_MLP) continue;
        const char *key;
        json_t *parent = parent_of(root, f->name, &key);
        json_t *v = parent ? json_object_get(parent, key) : NULL;
        if (!v) continue;
        int rc;
        if (f->type == COORD_FIELD_SECTION && !json_is_object(v))
            return vl_fail(err, VL_EINVAL, "config: %s must be an object", f->name);
        if (f->get)
            rc = f->get(v, f, cfg, err);
        else if (f->type == COORD_FIELD_SECTION)
            rc = coord_config_fields_keys(v, f->name, err);
        else
            rc = coord_config_field_read(v, f, cfg, err);
        if (rc != VL_OK) return rc;
    }
    return VL_OK;
}

/* ---- writing -------------------------------------------------------------- */

json_t *coord_config_field_json(const coord_config *cfg, const coord_config_field *f) {
    switch (f->type) {
    case COORD_FIELD_INT: return json_integer(get_i(cfg, f));
    case COORD_FIELD_REAL: return json_real(*(const double *)slot(cfg, f));
    case COORD_FIELD_BOOL: return json_boolean(get_i(cfg, f));
    case COORD_FIELD_STR: return json_string(slot(cfg, f));
    case COORD_FIELD_ENUM: {
        int64_t x = get_i(cfg, f), n = 0;
        while (f->choices[n]) n++;
        return x >= 0 && x < n ? json_string(f->choices[x]) : NULL;
    }
    case COORD_FIELD_SECTION:
    case COORD_FIELD_CODE: break;
    }
    return NULL;
}

int coord_config_fields_write(const coord_config *cfg, json_t *root, int with_paths) {
    for (size_t i = 0; i < N_FIELDS; i++) {
        const coord_config_field *f = &FIELDS[i];
        if (f->flags & COORD_FIELD_UNWRITTEN) continue;
        if ((f->flags & COORD_FIELD_GPT) && cfg->net == COORD_NET_MLP) continue;
        if (f->written && !f->written(cfg)) continue;
        const char *key;
        json_t *parent = parent_of(root, f->name, &key);
        if (!parent) continue; /* its section was not written */
        if (f->put) {
            if (f->put(cfg, parent, key, with_paths) != VL_OK) return VL_ENOMEM;
            continue;
        }
        if (f->type == COORD_FIELD_CODE) continue;
        json_t *v =
            f->type == COORD_FIELD_SECTION ? json_object() : coord_config_field_json(cfg, f);
        if (!v || json_object_set_new(parent, key, v) != 0) return VL_ENOMEM;
    }
    return VL_OK;
}

int coord_config_fields_report(const coord_config *cfg, json_t *given, FILE *out) {
    coord_config d;
    coord_config_defaults(&d);
    int lines = 0;
    for (size_t i = 0; i < N_FIELDS; i++) {
        const coord_config_field *f = &FIELDS[i];
        if (f->type == COORD_FIELD_SECTION || f->type == COORD_FIELD_CODE) continue;
        if (f->flags & COORD_FIELD_UNWRITTEN) continue;
        if ((f->flags & COORD_FIELD_GPT) && cfg->net == COORD_NET_MLP) continue;
        if (f->written && !f->written(cfg)) continue;
        /* A field whose section the run does not write (K-FAC's without
         * K-FAC, the split's in a plain run) is not the run's. */
        const char *dot = strrchr(f->name, '.');
        char section[64] = "";
        if (dot) snprintf(section, sizeof section, "%.*s", (int)(dot - f->name), f->name);
        const coord_config_field *sec = dot ? coord_config_field_find(section) : NULL;
        if (sec && sec->written && !sec->written(cfg)) continue;
        json_t *v = f->put ? NULL : coord_config_field_json(cfg, f);
        if (f->put) {
            json_t *tmp = json_object();
            const char *key = dot ? dot + 1 : f->name;
            if (tmp && f->put(cfg, tmp, key, 1) == VL_OK)
                v = json_incref(json_object_get(tmp, key));
            json_decref(tmp);
        }
        json_t *def = coord_config_field_json(&d, f);
        const char *key;
        json_t *parent = given ? parent_of(given, f->name, &key) : NULL;
        const char *whence = parent && json_object_get(parent, key) ? "given"
                             : def && v && json_equal(def, v)       ? "default"
                                                                    : "chosen";
        char *text =
            v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15)) : NULL;
        json_decref(v);
        json_decref(def);
        if (!text) return VL_ENOMEM;
        fprintf(out, "field %s = %s (%s)\n", f->name, text, whence);
        free(text);
        lines++;
    }
    return lines;
}
