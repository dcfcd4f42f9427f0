/* Run configuration parsing, validation and normalisation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compress/compress.h"
#include "model/mlp_io.h"
#include "coordinator/config/config.h"
#include "coordinator/config/config_internal.h"

void coord_config_defaults(coord_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->val_fraction = 0.1;
    cfg->seed = 1337;
    cfg->model = (model_gpt_config){256, 64, 2, 4, 128};
    snprintf(cfg->mode, sizeof cfg->mode, "sync");
    cfg->updates_per_version = 4;
    cfg->max_versions = 30;
    cfg->train = (coord_train_config){.steps = 10,
                                      .batch = 8,
                                      .lr = 0.001,
                                      .beta1 = 0.9,
                                      .beta2 = 0.95,
                                      .eps = 1e-8,
                                      .weight_decay = 0.0,
                                      .grad_clip = 1.0,
                                      .momentum = 0.9};
    snprintf(cfg->train.optimizer, sizeof cfg->train.optimizer, "adamw");
    model_kfac_gpt_config k = model_kfac_gpt_config_default();
    cfg->train.kfac.damping = k.damping;
    cfg->train.kfac.decay = k.decay;
    cfg->train.kfac.kl_clip = k.kl_clip;
    cfg->train.kfac.inverse_every = k.inverse_every;
    snprintf(cfg->train.kfac.dtype, sizeof cfg->train.kfac.dtype, "F32");
    snprintf(cfg->train.schedule, sizeof cfg->train.schedule, "constant");
    cfg->outer_lr = 0.7;
    cfg->outer_momentum = 0.9;
    cfg->outer_delay = -1;         /* by mode, once it is known */
    cfg->train.dynamic_steps = -1; /* likewise */
    snprintf(cfg->compression_kind, sizeof cfg->compression_kind, "none");
    cfg->compression_dtype[0] = '\0'; /* by kind, see resolve_compression */
    cfg->comp_rows = 5;
    cfg->comp_seed = -1;
    snprintf(cfg->comp_hash, sizeof cfg->comp_hash, "%s", COMPRESS_SKETCH_HASH);
    cfg->comp_block = -1; /* by kind, see resolve_compression */
    cfg->comp_decay = -1;
    cfg->second_round = -1; /* chosen from the run's kind and mode */
    cfg->keep_changes = -1;
    cfg->round_s = 30;
    cfg->staleness = (coord_staleness){.fn = COORD_STALE_POLYNOMIAL, .a = 0.5, .b = 4, .max = 16};
    cfg->selsync_h_min = -1;
    cfg->keep_update_blobs = -1;
    cfg->max_loss_rise = COORD_MAX_LOSS_RISE_DEFAULT;
    cfg->lease_wait = -1; /* by mode, see coord_config_resolve_lease_wait */
    cfg->task_bytes = 65536;
    cfg->task_tokens = 65536;
    cfg->lease_s = 120;
    cfg->max_body_bytes = 67108864;
    cfg->val_batches = -1; /* from val_tokens unless given */
    cfg->val_tokens = COORD_VAL_TOKENS_DEFAULT;
    cfg->keep_versions = 4;
    cfg->robust.rule = COORD_RULE_MEAN;
    cfg->robust.trim = 0.2;
    cfg->robust.clip_mult = 2.0;
    cfg->robust.auto_mult = 4.0;
    cfg->robust.auto_versions = 3;
}

/* ---- field readers: each names the field in its error ------------------- */

static int check_keys(json_t *obj, const char *where, const char *const *allowed, vl_error *err) {
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(key, *a) == 0) ok = 1;
        if (!ok)
            return vl_fail(err, VL_EINVAL, "config: unknown field '%s%s%s'", where,
                           *where ? "." : "", key);
    }
    return VL_OK;
}

static int get_int(json_t *obj, const char *key, const char *field, int64_t min, int64_t max,
                   int64_t *out, vl_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) return VL_OK;
    if (!json_is_integer(v)) return vl_fail(err, VL_EINVAL, "config: %s must be an integer", field);
    json_int_t x = json_integer_value(v);
    if (x < min || x > max)
        return vl_fail(err, VL_EINVAL, "config: %s must be between %lld and %lld (got %lld)", field,
                       (long long)min, (long long)max, (long long)x);
    *out = x;
    return VL_OK;
}

static int get_model_int(json_t *obj, const char *key, int64_t max, int *out, vl_error *err) {
    int64_t x = *out;
    char field[48];
    snprintf(field, sizeof field, "model.%s", key);
    int rc = get_int(obj, key, field, 1, max, &x, err);
    if (rc == VL_OK) *out = (int)x;
    return rc;
}

/* lo_open/hi_open make the bound exclusive. */
static int get_real(json_t *obj, const char *key, const char *field, double lo, int lo_open,
                    double hi, int hi_open, double *out, vl_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) return VL_OK;
    if (!json_is_number(v)) return vl_fail(err, VL_EINVAL, "config: %s must be a number", field);
    double x = json_number_value(v);
    int bad = !isfinite(x) || (lo_open ? x <= lo : x < lo) || (hi_open ? x >= hi : x > hi);
    if (bad)
        return vl_fail(err, VL_EINVAL, "config: %s must be in %s%g, %g%s (got %g)", field,
                       lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]", x);
    *out = x;
    return VL_OK;
}

static int get_str(json_t *obj, const char *key, const char *field, char *out, size_t cap,
                   const char *const *choices, vl_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) return VL_OK;
    if (!json_is_string(v)) return vl_fail(err, VL_EINVAL, "config: %s must be a string", field);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n >= cap || strlen(s) != n)
        return vl_fail(err, VL_EINVAL, "config: %s must be a non-empty string under %zu bytes",
                       field, cap);
    if (choices) {
        int ok = 0;
        for (const char *const *c = choices; *c; c++)
            if (strcmp(s, *c) == 0) ok = 1;
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

static int get_obj(json_t *root, const char *key, json_t **out, vl_error *err) {
    *out = json_object_get(root, key);
    if (*out && !json_is_object(*out))
        return vl_fail(err, VL_EINVAL, "config: %s must be an object", key);
    return VL_OK;
}

/* ---- parse -------------------------------------------------------------- */

static const char *const TOP_KEYS[] = {"name",          "corpus",
                                       "data",          "val_fraction",
                                       "seed",          "model",
                                       "mode",          "updates_per_version",
                                       "max_versions",  "train",
                                       "outer",         "compression",
                                       "task_bytes",    "task_tokens",
                                       "lease_s",       "max_body_bytes",
                                       "val_batches",   "val_tokens",
                                       "keep_versions", "keep_changes",
                                       "staleness",     "round_deadline_s",
                                       "selsync",       "keep_update_blobs",
                                       "robust",        "max_loss_rise",
                                       "split",         "val_check_tokens",
                                       "lease_wait",    NULL};
static const char *const STALENESS_KEYS[] = {"function", "a", "b", "max", NULL};
static const char *const SELSYNC_KEYS[] = {"delta", "h_min", NULL};
static const char *const ROBUST_KEYS[] = {"rule",      "trim",      "clip_mult",     "max_norm",
                                          "on_excess", "auto_mult", "auto_versions", NULL};
/* In coord_rule order. */
static const char *const EXCESS[] = {"clip", "refuse", NULL};
static const char *const STALE_FNS[] = {"polynomial", "hinge", "constant", NULL};
static const char *const MODEL_KEYS[] = {"vocab_size", "block_size", "n_layer",
                                         "n_head",     "n_embd",     NULL};
static const char *const TRAIN_KEYS[] = {
    "steps",        "batch",         "optimizer", "lr",     "beta1",  "beta2",    "eps",
    "weight_decay", "grad_clip",     "schedule",  "warmup", "min_lr", "momentum", "nesterov",
    "kfac",         "dynamic_steps", NULL};
static const char *const KFAC_KEYS[] = {"damping", "decay", "inverse_every", "kl_clip", "share",
                                        "dtype",   NULL};
static const char *const SCHEDULES[] = {"constant", "cosine", NULL};
static const char *const OUTER_KEYS[] = {"lr", "momentum", "delay", NULL};
static const char *const COMPRESSION_KEYS[] = {
    "kind",    "dtype",        "k",       "rows",  "cols",  "seed", "hash", "ratio",
    "apply_k", "second_round", "round_s", "block", "decay", NULL};
static const char *const SKETCH_HASHES[] = {COMPRESS_SKETCH_HASH, NULL};
static const char *const DATA_KEYS[] = {"kind",        "train",       "val", "val_shard",
                                        "test_images", "test_labels", NULL};
static const char *const DATA_KINDS[] = {"shards", NULL};
static const char *const MODES[] = {"sync", "async", "split", NULL};
static const char *const OPTIMIZERS[] = {"adamw", "sgd", "kfac", NULL};
/* "dense" is the older name of "none". */
static const char *const KINDS[] = {"none", "dense", "topk", "gaussk", "sketch", NULL};
static const char *const DTYPES[] = {"F32", "F16", NULL};

static int check_name(const char *name, vl_error *err) {
    for (const char *p = name; *p; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-' || c == '_' || c == '.';
        if (!ok)
            return vl_fail(err, VL_EINVAL,
                           "config: name may hold only letters, digits, '-', '_' and '.'");
    }
    return VL_OK;
}

/* data.train: 1 to COORD_MAX_SHARDS paths, each as corpus is read. */
static int parse_train_shards(json_t *arr, coord_config *cfg, vl_error *err) {
    if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > COORD_MAX_SHARDS)
        return vl_fail(err, VL_EINVAL,
                       "config: data.train must be an array of 1 to %d shard "
                       "paths",
                       COORD_MAX_SHARDS);
    size_t n = json_array_size(arr);
    cfg->train_shards = calloc(n, sizeof *cfg->train_shards);
    if (!cfg->train_shards) return vl_fail(err, VL_ENOMEM, "config: out of memory");
    for (size_t i = 0; i < n; i++) {
        /* Wrapped in an object, the element goes through get_str's checks. */
        json_t *one = json_pack("{s:O}", "p", json_array_get(arr, i));
        char field[48], path[COORD_PATH_MAX];
        snprintf(field, sizeof field, "data.train[%zu]", i);
        int rc = one ? get_str(one, "p", field, path, sizeof path, NULL, err)
                     : vl_fail(err, VL_ENOMEM, "config: out of memory");
        json_decref(one);
        if (rc) return rc;
        if (!(cfg->train_shards[i] = strdup(path)))
            return vl_fail(err, VL_ENOMEM, "config: out of memory");
        cfg->n_train_shards = (int)i + 1;
    }
    return VL_OK;
}

/* Where the data come from: "corpus" (text, with val_fraction and
 * task_bytes) or "data" (token shards, with task_tokens), never both;
 * the fields of the other kind are refused rather than ignored. */
static int parse_data(json_t *root, coord_config *cfg, vl_error *err) {
    json_t *data;
    int rc = get_obj(root, "data", &data, err);
    if (rc) return rc;
    int text = json_object_get(root, "corpus") != NULL;
    if (!text && !data)
        return vl_fail(err, VL_EINVAL,
                       cfg->net == COORD_NET_MLP
                           ? "config: data is required: {\"kind\": \"local\"}, "
                             "with test_images and test_labels for a held-out set"
                           : "config: corpus is required (a text file; or data, "
                             "for token shards)");
    if (text && data)
        return vl_fail(err, VL_EINVAL,
                       "config: corpus (a text file) and data (token shards) "
                       "exclude each other");
    if (text && cfg->net == COORD_NET_MLP)
        return vl_fail(err, VL_EINVAL,
                       "config: an mlp model trains on the peers' own data, "
                       "not a corpus: give data {\"kind\": \"local\"}");
    static const char *const TEXT_ONLY[] = {"val_fraction", "task_bytes", NULL};
    if (text) {
        if (json_object_get(root, "task_tokens"))
            return vl_fail(err, VL_EINVAL,
                           "config: task_tokens is for token shards (data); a "
                           "text corpus takes task_bytes");
        if ((rc = get_str(root, "corpus", "corpus", cfg->corpus, sizeof cfg->corpus, NULL, err)) ||
            (rc = get_real(root, "val_fraction", "val_fraction", 0, 1, 0.5, 0, &cfg->val_fraction,
                           err)))
            return rc;
        return get_int(root, "task_bytes", "task_bytes", 2, INT64_MAX / 2, &cfg->task_bytes, err);
    }
    for (const char *const *k = TEXT_ONLY; *k; k++)
        if (json_object_get(root, *k))
            return vl_fail(err, VL_EINVAL, "config: %s is for a text corpus; %s", *k,
                           cfg->net == COORD_NET_MLP ? "an mlp run's data stay on the peers"
                                                     : "token shards and local data take "
                                                       "data.val");
    char kind[16] = "";
    if ((rc = check_keys(data, "data", DATA_KEYS, err))) return rc;
    json_t *kind_v = json_object_get(data, "kind");
    if (cfg->net == COORD_NET_MLP ||
        (json_is_string(kind_v) && strcmp(json_string_value(kind_v), "local") == 0))
        return coord_config_parse_local(root, data, cfg, err);
    if (!json_object_get(data, "kind") || !json_object_get(data, "train") ||
        !json_object_get(data, "val"))
        return vl_fail(err, VL_EINVAL,
                       "config: data needs kind \"shards\", train (an array "
                       "of shard paths) and val (a shard path)");
    if (json_object_get(data, "test_images") || json_object_get(data, "test_labels") ||
        json_object_get(data, "val_shard"))
        return vl_fail(err, VL_EINVAL,
                       "config: data.test_images, test_labels and val_shard "
                       "are for runs whose data stay on the peers (kind "
                       "\"local\"); token shards take data.val");
    cfg->shards = 1;
    if ((rc = get_str(data, "kind", "data.kind", kind, sizeof kind, DATA_KINDS, err)) ||
        (rc = get_str(data, "val", "data.val", cfg->val_shard, sizeof cfg->val_shard, NULL, err)) ||
        (rc = parse_train_shards(json_object_get(data, "train"), cfg, err)))
        return rc;
    return get_int(root, "task_tokens", "task_tokens", 2, COORD_MAX_TASK_TOKENS, &cfg->task_tokens,
                   err);
}

/* The staleness and selsync sections (selsync.h_min is checked against
 * train.steps once both are known). */
static int parse_merging(json_t *root, coord_config *cfg, vl_error *err) {
    int rc;
    json_t *st, *ss;
    if ((rc = get_obj(root, "staleness", &st, err)) || (rc = get_obj(root, "selsync", &ss, err)))
        return rc;
    if (st) {
        char fn[16] = "";
        if ((rc = check_keys(st, "staleness", STALENESS_KEYS, err)) ||
            (rc = get_str(st, "function", "staleness.function", fn, sizeof fn, STALE_FNS, err)) ||
            (rc = get_real(st, "a", "staleness.a", 0, 0, 100, 0, &cfg->staleness.a, err)) ||
            (rc = get_int(st, "b", "staleness.b", 0, 1000000, &cfg->staleness.b, err)) ||
            (rc = get_int(st, "max", "staleness.max", 0, 1000000, &cfg->staleness.max, err)))
            return rc;
        if (fn[0])
            cfg->staleness.fn = strcmp(fn, "hinge") == 0      ? COORD_STALE_HINGE
                                : strcmp(fn, "constant") == 0 ? COORD_STALE_CONSTANT
                                                              : COORD_STALE_POLYNOMIAL;
    }
    if (ss) {
        if ((rc = check_keys(ss, "selsync", SELSYNC_KEYS, err)) ||
            (rc = get_real(ss, "delta", "selsync.delta", 0, 0, 1e9, 0, &cfg->selsync_delta, err)) ||
            (rc = get_int(ss, "h_min", "selsync.h_min", 1, 100000, &cfg->selsync_h_min, err)))
            return rc;
    }
    return get_int(root, "round_deadline_s", "round_deadline_s", 0, 7 * 86400,
                   &cfg->round_deadline_s, err);
}

/* The robust section; checked against the rest in check_robust. */
static int parse_robust(json_t *root, coord_config *cfg, vl_error *err) {
    json_t *rb;
    int rc = get_obj(root, "robust", &rb, err);
    coord_robust_config *r = &cfg->robust;
    if (!rc && !rb) {
        /* No section: the bound derived from the first versions; the rule
         * and what is done beyond the bound are chosen once the rest is
         * known (default_rule). */
        r->by_default = 1;
        r->auto_norm = 1;
    }
    if (rc || !rb) return rc;
    char rule[16] = "", excess[8] = "";
    json_t *mn = json_object_get(rb, "max_norm");
    if (json_is_string(mn)) {
        if (strcmp(json_string_value(mn), "auto") != 0)
            return vl_fail(err, VL_EINVAL, "config: robust.max_norm must be a number or \"auto\"");
        r->auto_norm = 1;
    } else if ((rc = get_real(rb, "max_norm", "robust.max_norm", 0, 0, 1e30, 0, &r->max_norm,
                              err))) {
        return rc;
    }
    if ((rc = check_keys(rb, "robust", ROBUST_KEYS, err)) ||
        (rc = get_str(rb, "rule", "robust.rule", rule, sizeof rule, coord_rule_names, err)) ||
        (rc = get_real(rb, "trim", "robust.trim", 0, 1, 0.5, 1, &r->trim, err)) ||
        (rc = get_real(rb, "clip_mult", "robust.clip_mult", 0, 1, 1e6, 0, &r->clip_mult, err)) ||
        (rc = get_real(rb, "auto_mult", "robust.auto_mult", 1, 1, 1e6, 0, &r->auto_mult, err)) ||
        (rc = get_int(rb, "auto_versions", "robust.auto_versions", 1, 1000, &r->auto_versions,
                      err)) ||
        (rc = get_str(rb, "on_excess", "robust.on_excess", excess, sizeof excess, EXCESS, err)))
        return rc;
    if (!r->auto_norm && (json_object_get(rb, "auto_mult") || json_object_get(rb, "auto_versions")))
        return vl_fail(err, VL_EINVAL,
                       "config: robust.auto_mult and robust.auto_versions are "
                       "for max_norm \"auto\"");
    for (int i = 0; rule[0] && coord_rule_names[i]; i++)
        if (strcmp(rule, coord_rule_names[i]) == 0) r->rule = (coord_rule)i;
    if (excess[0]) r->refuse_excess = strcmp(excess, "refuse") == 0;
    return VL_OK;
}

static int check_robust(const coord_config *cfg, vl_error *err);

/* A run without a robust section gets the trimmed mean (trim 0.2) where
 * it applies: at least 5 updates per version, so that one is cut at each
 * end, no second round, and a version's updates within the rules'
 * memory. Elsewhere the mean; the derived norm bound applies to both.
 * Beyond the bound an async run refuses (the buffer fills from others);
 * a sync run clips, since a refused update leaves its slot leased until
 * the lease ends and every peer would wait that long for the version
 * (the hostile-peer test: 604 s against 13). */
static void default_rule(coord_config *cfg) {
    if (!cfg->robust.by_default) return;
    cfg->robust.by_default = 0; /* the normalised JSON says all of it */
    cfg->robust.refuse_excess = coord_config_is_async(cfg);
    cfg->robust.rule = COORD_RULE_TRIMMED_MEAN;
    cfg->robust.trim = 0.2;
    vl_error ignored = {0};
    if (check_robust(cfg, &ignored) != VL_OK) cfg->robust.rule = COORD_RULE_MEAN;
}

/* What a rule needs of the rest of the run, once compression is resolved. */
static int check_robust(const coord_config *cfg, vl_error *err) {
    const coord_robust_config *r = &cfg->robust;
    int64_t k = cfg->updates_per_version;
    if (r->rule == COORD_RULE_TRIMMED_MEAN && coord_config_trim_count(r->trim, (size_t)k) < 1)
        return vl_fail(err, VL_EINVAL,
                       "config: robust.trim %g of %lld updates per version cuts "
                       "nothing (it cuts floor(trim x updates_per_version) at "
                       "each end)",
                       r->trim, (long long)k);
    if (r->rule == COORD_RULE_MEDIAN && k < 3)
        return vl_fail(err, VL_EINVAL,
                       "config: robust.rule \"median\" needs "
                       "updates_per_version >= 3 (the median of %lld updates is "
                       "their mean)",
                       (long long)k);
    if (r->rule == COORD_RULE_MEAN) return VL_OK;
    if (cfg->second_round > 0)
        return vl_fail(err, VL_EINVAL,
                       "config: robust.rule \"%s\" cannot be combined with "
                       "compression.second_round, whose exact values are "
                       "summed",
                       coord_rule_name(r->rule));
    /* The rules hold every update of a version in memory. */
    k = coord_config_merge_max(cfg);
    int64_t d = (int64_t)coord_config_num_params(cfg);
    const char *kind = coord_config_update_kind(cfg);
    if (strcmp(kind, "sketch") == 0)
        d = cfg->comp_rows * cfg->comp_cols;
    else if (strcmp(kind, "topk") == 0 && k * cfg->comp_k < d)
        d = k * cfg->comp_k;
    if ((double)k * (double)d * 4.0 > (double)COORD_ROBUST_MAX_BYTES)
        return vl_fail(err, VL_EINVAL,
                       "config: robust.rule \"%s\" would hold %lld updates of "
                       "%lld values in memory, over %lld bytes",
                       coord_rule_name(r->rule), (long long)k, (long long)d,
                       (long long)COORD_ROBUST_MAX_BYTES);
    return VL_OK;
}

int64_t coord_config_merge_max(const coord_config *cfg) {
    return coord_config_is_async(cfg) ? cfg->updates_per_version
                                      : COORD_SYNC_MERGE_FACTOR * cfg->updates_per_version;
}

int64_t coord_config_max_samples(const coord_config *cfg) {
    /* A classifier's sample is an image; a GPT's is a token. */
    int64_t per = cfg->net == COORD_NET_MLP ? 1 : (int64_t)cfg->model.block_size;
    return cfg->train.steps * cfg->train.batch * per;
}

double coord_staleness_weight(const coord_staleness *s, int64_t tau) {
    if (tau < 0) tau = 0;
    switch (s->fn) {
    case COORD_STALE_CONSTANT: return 1.0;
    case COORD_STALE_HINGE: return tau <= s->b ? 1.0 : 1.0 / (s->a * (double)(tau - s->b) + 1.0);
    case COORD_STALE_POLYNOMIAL: break;
    }
    return pow(1.0 + (double)tau, -s->a);
}

/* train.kfac, and the K-FAC defaults of lr and momentum when the run
 * uses K-FAC without giving them (AdamW's lr would be far too small). */
static int parse_kfac(json_t *train, coord_train_config *t, vl_error *err) {
    json_t *k;
    int rc = get_obj(train, "kfac", &k, err);
    if (rc) return vl_fail(err, VL_EINVAL, "config: train.kfac must be an object");
    int is_kfac = strcmp(t->optimizer, "kfac") == 0;
    if (k && !is_kfac)
        return vl_fail(err, VL_EINVAL,
                       "config: train.kfac is for optimizer \"kfac\" (this run "
                       "uses \"%s\")",
                       t->optimizer);
    if (!is_kfac) return VL_OK;
    model_kfac_gpt_config d = model_kfac_gpt_config_default();
    if (!json_object_get(train, "lr")) t->lr = d.lr;
    if (!json_object_get(train, "momentum")) t->momentum = d.momentum;
    if (!k) return VL_OK;
    if ((rc = check_keys(k, "train.kfac", KFAC_KEYS, err)) ||
        (rc = get_real(k, "damping", "train.kfac.damping", 0, 1, 1e3, 0, &t->kfac.damping, err)) ||
        (rc = get_real(k, "decay", "train.kfac.decay", 0, 0, 1, 1, &t->kfac.decay, err)) ||
        (rc = get_int(k, "inverse_every", "train.kfac.inverse_every", 1, 1000000,
                      &t->kfac.inverse_every, err)) ||
        (rc = get_real(k, "kl_clip", "train.kfac.kl_clip", 0, 0, 1e3, 0, &t->kfac.kl_clip, err)) ||
        (rc = get_str(k, "dtype", "train.kfac.dtype", t->kfac.dtype, sizeof t->kfac.dtype, DTYPES,
                      err)))
        return rc;
    json_t *sh = json_object_get(k, "share");
    if (sh && !json_is_boolean(sh))
        return vl_fail(err, VL_EINVAL, "config: train.kfac.share must be true or false");
    t->kfac.share = sh && json_is_true(sh);
    return VL_OK;
}

static int parse_sections(json_t *root, coord_config *cfg, vl_error *err) {
    int rc;
    json_t *model, *train, *outer, *comp;
    if ((rc = get_obj(root, "model", &model, err)) || (rc = get_obj(root, "train", &train, err)) ||
        (rc = get_obj(root, "outer", &outer, err)) ||
        (rc = get_obj(root, "compression", &comp, err)) || (rc = parse_merging(root, cfg, err)) ||
        (rc = parse_robust(root, cfg, err)))
        return rc;
    json_t *mk = model ? json_object_get(model, "kind") : NULL;
    if (mk && (!json_is_string(mk) || (strcmp(json_string_value(mk), "gpt") != 0 &&
                                       strcmp(json_string_value(mk), "mlp") != 0)))
        return vl_fail(err, VL_EINVAL, "config: model.kind must be \"gpt\" or \"mlp\"");
    if (mk && strcmp(json_string_value(mk), "mlp") == 0) {
        cfg->net = COORD_NET_MLP;
        char *js = json_dumps(model, JSON_COMPACT);
        vl_error merr = {0};
        rc = js ? model_mlp_config_parse(js, strlen(js), &cfg->mlp, &merr) : VL_ENOMEM;
        free(js);
        if (rc)
            return vl_fail(err, rc, "config: model: %s", merr.msg[0] ? merr.msg : "out of memory");
    } else if (model) {
        if (mk) json_object_del(model, "kind");
        if ((rc = check_keys(model, "model", MODEL_KEYS, err)) ||
            (rc = get_model_int(model, "vocab_size", MODEL_MAX_VOCAB, &cfg->model.vocab_size,
                                err)) ||
            (rc = get_model_int(model, "block_size", MODEL_MAX_BLOCK, &cfg->model.block_size,
                                err)) ||
            (rc = get_model_int(model, "n_layer", MODEL_MAX_LAYER, &cfg->model.n_layer, err)) ||
            (rc = get_model_int(model, "n_head", MODEL_MAX_EMBD, &cfg->model.n_head, err)) ||
            (rc = get_model_int(model, "n_embd", MODEL_MAX_EMBD, &cfg->model.n_embd, err)))
            return rc;
    }
    if (train) {
        coord_train_config *t = &cfg->train;
        if ((rc = check_keys(train, "train", TRAIN_KEYS, err)) ||
            (rc = get_int(train, "steps", "train.steps", 1, 100000, &t->steps, err)) ||
            (rc = get_int(train, "batch", "train.batch", 1, 4096, &t->batch, err)) ||
            (rc = get_str(train, "optimizer", "train.optimizer", t->optimizer, sizeof t->optimizer,
                          OPTIMIZERS, err)) ||
            (rc = get_real(train, "lr", "train.lr", 0, 1, 10, 0, &t->lr, err)) ||
            (rc = get_real(train, "beta1", "train.beta1", 0, 0, 1, 1, &t->beta1, err)) ||
            (rc = get_real(train, "beta2", "train.beta2", 0, 0, 1, 1, &t->beta2, err)) ||
            (rc = get_real(train, "eps", "train.eps", 0, 1, 1, 0, &t->eps, err)) ||
            (rc = get_real(train, "weight_decay", "train.weight_decay", 0, 0, 10, 0,
                           &t->weight_decay, err)) ||
            (rc = get_real(train, "grad_clip", "train.grad_clip", 0, 0, 1e6, 0, &t->grad_clip,
                           err)) ||
            (rc = get_str(train, "schedule", "train.schedule", t->schedule, sizeof t->schedule,
                          SCHEDULES, err)) ||
            (rc = get_int(train, "warmup", "train.warmup", 0, 100000000, &t->warmup, err)) ||
            (rc = get_real(train, "min_lr", "train.min_lr", 0, 0, 10, 0, &t->min_lr, err)) ||
            (rc = get_real(train, "momentum", "train.momentum", 0, 0, 1, 1, &t->momentum, err)))
            return rc;
        json_t *nv = json_object_get(train, "nesterov");
        if (nv && !json_is_boolean(nv))
            return vl_fail(err, VL_EINVAL, "config: train.nesterov must be true or false");
        t->nesterov = nv && json_is_true(nv);
        json_t *ds = json_object_get(train, "dynamic_steps");
        if (ds && !json_is_boolean(ds))
            return vl_fail(err, VL_EINVAL, "config: train.dynamic_steps must be true or false");
        if (ds) t->dynamic_steps = json_is_true(ds);
        if ((rc = parse_kfac(train, t, err))) return rc;
    }
    if (outer) {
        if ((rc = check_keys(outer, "outer", OUTER_KEYS, err)) ||
            (rc = get_real(outer, "lr", "outer.lr", 0, 1, 10, 0, &cfg->outer_lr, err)) ||
            (rc = get_real(outer, "momentum", "outer.momentum", 0, 0, 1, 1, &cfg->outer_momentum,
                           err)) ||
            (rc = get_int(outer, "delay", "outer.delay", 1, 1000, &cfg->outer_delay, err)))
            return rc;
    } else {
        cfg->outer_lr = -1; /* resolve_outer picks it by kind and mode */
    }
    if (comp) {
        if ((rc = check_keys(comp, "compression", COMPRESSION_KEYS, err)) ||
            (rc = get_str(comp, "kind", "compression.kind", cfg->compression_kind,
                          sizeof cfg->compression_kind, KINDS, err)) ||
            (rc = get_str(comp, "dtype", "compression.dtype", cfg->compression_dtype,
                          sizeof cfg->compression_dtype, DTYPES, err)) ||
            (rc = get_int(comp, "k", "compression.k", 0, UINT32_MAX, &cfg->comp_k, err)) ||
            (rc = get_int(comp, "rows", "compression.rows", 1, COMPRESS_SKETCH_MAX_ROWS,
                          &cfg->comp_rows, err)) ||
            (rc = get_int(comp, "cols", "compression.cols", 0, (int64_t)1 << 28, &cfg->comp_cols,
                          err)) ||
            (rc = get_int(comp, "seed", "compression.seed", 0, INT64_MAX, &cfg->comp_seed, err)) ||
            (rc = get_str(comp, "hash", "compression.hash", cfg->comp_hash, sizeof cfg->comp_hash,
                          SKETCH_HASHES, err)) ||
            (rc = get_real(comp, "ratio", "compression.ratio", 1, 0, 1e9, 0, &cfg->comp_ratio,
                           err)) ||
            (rc = get_int(comp, "apply_k", "compression.apply_k", 0, UINT32_MAX, &cfg->apply_k,
                          err)) ||
            (rc = get_int(comp, "second_round", "compression.second_round", 0,
                          COORD_MAX_SECOND_ROUND, &cfg->second_round, err)) ||
            (rc = get_int(comp, "round_s", "compression.round_s", 1, 3600, &cfg->round_s, err)) ||
            (rc = get_int(comp, "block", "compression.block", 0, UINT32_MAX, &cfg->comp_block,
                          err)) ||
            (rc = get_real(comp, "decay", "compression.decay", 0, 1, 1, 0, &cfg->comp_decay, err)))
            return rc;
        if (strcmp(cfg->compression_kind, "dense") == 0)
            snprintf(cfg->compression_kind, sizeof cfg->compression_kind, "none");
        if (json_object_get(comp, "ratio") &&
            (json_object_get(comp, "k") || json_object_get(comp, "cols")))
            return vl_fail(err, VL_EINVAL,
                           "config: compression.ratio excludes compression.k "
                           "and compression.cols");
    }
    return VL_OK;
}

/* What a GPT run's model, batch and data sizes must satisfy; derives
 * val_batches from val_tokens. */
static int check_gpt(json_t *root, coord_config *cfg, vl_error *err) {
    int rc;
    vl_error merr = {0};
    if (model_gpt_config_validate(&cfg->model, &merr) != VL_OK)
        return vl_fail(err, VL_EINVAL, "config: model: %s", merr.msg);
    if (!cfg->shards && cfg->model.vocab_size < 256) {
        rc = vl_fail(err, VL_EINVAL,
                     "config: model.vocab_size must be at least 256 for a "
                     "byte corpus");
        return rc;
    }
    /* Peers refuse leases whose batch of windows would not fit their
     * activation budget (protocol.md, "Task lease"). */
    if (cfg->train.batch * (int64_t)cfg->model.block_size > ((int64_t)1 << 22)) {
        rc = vl_fail(err, VL_EINVAL,
                     "config: train.batch x model.block_size must be at most "
                     "4194304 (got %lld)",
                     (long long)(cfg->train.batch * cfg->model.block_size));
        return rc;
    }
    if ((rc = coord_config_resolve_validation(root, cfg, err)) != VL_OK) return rc;
    int64_t per_task = cfg->shards ? cfg->task_tokens : cfg->task_bytes;
    if (!cfg->local && per_task < (int64_t)cfg->model.block_size + 1) {
        rc = vl_fail(err, VL_EINVAL, "config: %s must be at least model.block_size + 1 (%d)",
                     cfg->shards ? "task_tokens" : "task_bytes", cfg->model.block_size + 1);
        return rc;
    }
    return VL_OK;
}

/* A classifier run scores its whole held-out set and trains with AdamW or
 * SGD (K-FAC's peer side is the GPT's). */
static int check_classifier(json_t *root, coord_config *cfg, vl_error *err) {
    int rc = coord_config_resolve_validation(root, cfg, err);
    if (rc != VL_OK) return rc;
    if (strcmp(cfg->train.optimizer, "kfac") == 0)
        return vl_fail(err, VL_EINVAL,
                       "config: train.optimizer of an mlp run is \"adamw\" or "
                       "\"sgd\"");
    return VL_OK;
}

int coord_config_parse(const char *json, size_t len, coord_config *cfg, vl_error *err) {
    coord_config_defaults(cfg);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return vl_fail(err, VL_EINVAL, "config: invalid JSON at line %d: %s", jerr.line, jerr.text);
    int rc = VL_OK;
    if (!json_is_object(root)) {
        rc = vl_fail(err, VL_EINVAL, "config: the top level must be an object");
        goto out;
    }
    if ((rc = check_keys(root, "", TOP_KEYS, err))) goto out;
    if (!json_object_get(root, "name")) {
        rc = vl_fail(err, VL_EINVAL, "config: name is required");
        goto out;
    }
    if ((rc = get_str(root, "name", "name", cfg->name, sizeof cfg->name, NULL, err)) ||
        (rc = check_name(cfg->name, err)) ||
        (rc = get_int(root, "seed", "seed", 0, INT64_MAX, &cfg->seed, err)) ||
        (rc = get_str(root, "mode", "mode", cfg->mode, sizeof cfg->mode, MODES, err)) ||
        (rc = get_int(root, "updates_per_version", "updates_per_version", 1, 100000,
                      &cfg->updates_per_version, err)) ||
        (rc = get_int(root, "max_versions", "max_versions", 1, 100000000, &cfg->max_versions,
                      err)) ||
        (rc = get_int(root, "lease_s", "lease_s", 1, 7 * 86400, &cfg->lease_s, err)) ||
        (rc = get_int(root, "max_body_bytes", "max_body_bytes", 1024, (int64_t)1 << 40,
                      &cfg->max_body_bytes, err)) ||
        (rc = get_int(root, "val_batches", "val_batches", 0, 1000000, &cfg->val_batches, err)) ||
        (rc = get_int(root, "val_tokens", "val_tokens", 0, (int64_t)1 << 40, &cfg->val_tokens,
                      err)) ||
        (rc = get_int(root, "val_check_tokens", "val_check_tokens", 0, (int64_t)1 << 40,
                      &cfg->val_check_tokens, err)) ||
        (rc = get_int(root, "keep_versions", "keep_versions", 1, 100000000, &cfg->keep_versions,
                      err)) ||
        (rc = get_int(root, "keep_changes", "keep_changes", 1, 100000000, &cfg->keep_changes,
                      err)) ||
        (rc = get_int(root, "keep_update_blobs", "keep_update_blobs", 1, 100000000,
                      &cfg->keep_update_blobs, err)) ||
        (rc = get_real(root, "max_loss_rise", "max_loss_rise", 0, 0, 100, 0, &cfg->max_loss_rise,
                       err)) ||
        (rc = parse_sections(root, cfg, err)) || (rc = parse_data(root, cfg, err)) ||
        (rc = coord_config_parse_split(root, cfg, err)) ||
        (rc = coord_config_resolve_lease_wait(root, cfg, err)))
        goto out;
    if (cfg->net == COORD_NET_MLP) {
        if ((rc = check_classifier(root, cfg, err))) goto out;
    } else if ((rc = check_gpt(root, cfg, err))) {
        goto out;
    }
    if (cfg->selsync_h_min < 0) cfg->selsync_h_min = cfg->train.steps;
    if (cfg->selsync_h_min > cfg->train.steps) {
        rc = vl_fail(err, VL_EINVAL,
                     "config: selsync.h_min (%lld) exceeds train.steps (%lld), "
                     "which is H_max",
                     (long long)cfg->selsync_h_min, (long long)cfg->train.steps);
        goto out;
    }
    if (cfg->train.nesterov &&
        (strcmp(cfg->train.optimizer, "sgd") != 0 || cfg->train.momentum == 0)) {
        rc = vl_fail(err, VL_EINVAL,
                     "config: train.nesterov needs optimizer \"sgd\" with "
                     "train.momentum > 0");
        goto out;
    }
    if (cfg->train.min_lr > cfg->train.lr) {
        rc = vl_fail(err, VL_EINVAL, "config: train.min_lr (%g) exceeds train.lr (%g)",
                     cfg->train.min_lr, cfg->train.lr);
        goto out;
    }
    if (cfg->train.warmup >= cfg->max_versions) {
        rc = vl_fail(err, VL_EINVAL,
                     "config: train.warmup (%lld versions) must be below "
                     "max_versions (%lld)",
                     (long long)cfg->train.warmup, (long long)cfg->max_versions);
        goto out;
    }
    if (cfg->keep_update_blobs < 0) cfg->keep_update_blobs = cfg->keep_versions;
    if (cfg->staleness.fn == COORD_STALE_HINGE && cfg->staleness.b > cfg->staleness.max) {
        rc = vl_fail(err, VL_EINVAL, "config: staleness.b (%lld) exceeds staleness.max (%lld)",
                     (long long)cfg->staleness.b, (long long)cfg->staleness.max);
        goto out;
    }
    if (coord_config_is_async(cfg) && cfg->round_deadline_s > 0) {
        rc = vl_fail(err, VL_EINVAL,
                     "config: round_deadline_s is for sync runs; an async run "
                     "merges every updates_per_version updates");
        goto out;
    }
    if (!(rc = coord_config_resolve_compression(cfg, err))) default_rule(cfg);
    if (rc || (rc = check_robust(cfg, err)) || (rc = coord_config_resolve_outer(cfg, err)))
        goto out;
    int64_t need = coord_config_update_bytes(cfg);
    if (cfg->max_body_bytes < need) {
        rc = vl_fail(err, VL_EINVAL,
                     "config: max_body_bytes (%lld) is smaller than one %s "
                     "%s update of this model%s (%lld bytes)",
                     (long long)cfg->max_body_bytes, cfg->compression_dtype, cfg->compression_kind,
                     coord_config_shares_factors(cfg) ? " with its K-FAC factors" : "",
                     (long long)need);
        goto out;
    }
    /* The values of a second round travel under the same cap. */
    int64_t values = 4 * coord_config_round_candidates(cfg) + 8 + UPDATE_HEADER_SLACK;
    if (cfg->second_round > 0 && cfg->max_body_bytes < values) {
        rc = vl_fail(err, VL_EINVAL,
                     "config: max_body_bytes (%lld) is smaller than the values "
                     "of one second round (%lld bytes)",
                     (long long)cfg->max_body_bytes, (long long)values);
        goto out;
    }
out:
    json_decref(root);
    if (rc != VL_OK) coord_config_free(cfg);
    return rc;
}

void coord_config_free(coord_config *cfg) {
    for (int i = 0; i < cfg->n_train_shards; i++) free(cfg->train_shards[i]);
    free(cfg->train_shards);
    cfg->train_shards = NULL;
    cfg->n_train_shards = 0;
}

int coord_config_parse_stored(const char *json, coord_config *cfg, vl_error *err) {
    json_t *root = json_loads(json, 0, NULL);
    if (!root || !json_is_object(root) || json_object_get(root, "lease_wait")) {
        json_decref(root);
        return coord_config_parse(json, strlen(json), cfg, err);
    }
    char *text = NULL;
    if (json_object_set_new(root, "lease_wait", json_integer(0)) == 0)
        text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) return vl_fail(err, VL_ENOMEM, "out of memory reading the stored configuration");
    int rc = coord_config_parse(text, strlen(text), cfg, err);
    free(text);
    return rc;
}
