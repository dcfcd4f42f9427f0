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
#include "coordinator/config/fields.h"

void coord_config_defaults(coord_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    coord_config_fields_defaults(cfg);
    /* K-FAC's own defaults, from the optimizer's module. */
    model_kfac_gpt_config k = model_kfac_gpt_config_default();
    cfg->train.kfac.damping = k.damping;
    cfg->train.kfac.decay = k.decay;
    cfg->train.kfac.kl_clip = k.kl_clip;
    cfg->train.kfac.inverse_every = k.inverse_every;
}

static const char *const DATA_KINDS[] = {"shards", NULL};

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
        char field[48], path[COORD_PATH_MAX];
        snprintf(field, sizeof field, "data.train[%zu]", i);
        int rc =
            coord_config_field_str(json_array_get(arr, i), field, path, sizeof path, NULL, err);
        if (rc) return rc;
        if (!(cfg->train_shards[i] = strdup(path)))
            return vl_fail(err, VL_ENOMEM, "config: out of memory");
        cfg->n_train_shards = (int)i + 1;
    }
    return VL_OK;
}

/* Where the data come from: "corpus" (text, with val_fraction and
 * task_bytes) or "data" (token shards, with task_tokens), never both;
 * the fields of the other kind are refused rather than ignored. After
 * coord_config_fields_read, which read the plain fields. */
static int parse_data(json_t *root, coord_config *cfg, vl_error *err) {
    json_t *data = json_object_get(root, "data");
    int rc;
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
    if (text && json_object_get(root, "task_tokens"))
        return vl_fail(err, VL_EINVAL,
                       "config: task_tokens is for token shards (data); a "
                       "text corpus takes task_bytes");
    if (text) return VL_OK;
    for (const char *const *k = TEXT_ONLY; *k; k++)
        if (json_object_get(root, *k))
            return vl_fail(err, VL_EINVAL, "config: %s is for a text corpus; %s", *k,
                           cfg->net == COORD_NET_MLP ? "an mlp run's data stay on the peers"
                                                     : "token shards and local data take "
                                                       "data.val");
    char kind[16] = "";
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
    if ((rc = coord_config_field_str(kind_v, "data.kind", kind, sizeof kind, DATA_KINDS, err)) ||
        (rc = coord_config_field_str(json_object_get(data, "val"), "data.val", cfg->val_shard,
                                     sizeof cfg->val_shard, NULL, err)))
        return rc;
    return parse_train_shards(json_object_get(data, "train"), cfg, err);
}

/* robust.max_norm: a number, or "auto" for the bound derived from the
 * first versions' norms. */
int coord_config_get_max_norm(json_t *v, const coord_config_field *f, coord_config *cfg,
                              vl_error *err) {
    if (!json_is_string(v)) return coord_config_field_read(v, f, cfg, err);
    if (strcmp(json_string_value(v), "auto") != 0)
        return vl_fail(err, VL_EINVAL, "config: robust.max_norm must be a number or \"auto\"");
    cfg->robust.auto_norm = 1;
    return VL_OK;
}

/* The robust section, once its fields are read; checked against the rest
 * in check_robust. */
static int parse_robust(json_t *root, coord_config *cfg, vl_error *err) {
    json_t *rb = json_object_get(root, "robust");
    coord_robust_config *r = &cfg->robust;
    if (!rb) {
        /* No section: the bound derived from the first versions; the rule
         * and what is done beyond the bound are chosen once the rest is
         * known (default_rule). */
        r->by_default = 1;
        r->auto_norm = 1;
        return VL_OK;
    }
    if (!r->auto_norm && (json_object_get(rb, "auto_mult") || json_object_get(rb, "auto_versions")))
        return vl_fail(err, VL_EINVAL,
                       "config: robust.auto_mult and robust.auto_versions are "
                       "for max_norm \"auto\"");
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
 * (docs/benchmarks.md, "Figures the code relies on"). */
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

/* train.kfac only with optimizer "kfac", and the K-FAC defaults of lr
 * and momentum when the run uses K-FAC without giving them (AdamW's lr
 * would be far too small). */
static int parse_kfac(json_t *root, coord_train_config *t, vl_error *err) {
    json_t *train = json_object_get(root, "train");
    int is_kfac = strcmp(t->optimizer, "kfac") == 0;
    if (json_object_get(train, "kfac") && !is_kfac)
        return vl_fail(err, VL_EINVAL,
                       "config: train.kfac is for optimizer \"kfac\" (this run "
                       "uses \"%s\")",
                       t->optimizer);
    if (!is_kfac) return VL_OK;
    model_kfac_gpt_config d = model_kfac_gpt_config_default();
    if (!json_object_get(train, "lr")) t->lr = d.lr;
    if (!json_object_get(train, "momentum")) t->momentum = d.momentum;
    return VL_OK;
}

int coord_config_get_name(json_t *v, const coord_config_field *f, coord_config *cfg,
                          vl_error *err) {
    int rc = coord_config_field_read(v, f, cfg, err);
    return rc ? rc : check_name(cfg->name, err);
}

int coord_config_get_kind(json_t *v, const coord_config_field *f, coord_config *cfg,
                          vl_error *err) {
    int rc = coord_config_field_read(v, f, cfg, err);
    if (rc == VL_OK && strcmp(cfg->compression_kind, "dense") == 0)
        snprintf(cfg->compression_kind, sizeof cfg->compression_kind, "none");
    return rc;
}

/* The model section: kind "gpt" (the default), whose shape the table's
 * rows read, or "mlp", whose object model_mlp_config_parse reads. */
int coord_config_get_model(json_t *model, const coord_config_field *f, coord_config *cfg,
                           vl_error *err) {
    json_t *mk = json_object_get(model, "kind");
    if (mk && (!json_is_string(mk) || (strcmp(json_string_value(mk), "gpt") != 0 &&
                                       strcmp(json_string_value(mk), "mlp") != 0)))
        return vl_fail(err, VL_EINVAL, "config: model.kind must be \"gpt\" or \"mlp\"");
    if (!mk || strcmp(json_string_value(mk), "mlp") != 0)
        return coord_config_fields_keys(model, f->name, err);
    cfg->net = COORD_NET_MLP;
    char *js = json_dumps(model, JSON_COMPACT);
    vl_error merr = {0};
    int rc = js ? model_mlp_config_parse(js, strlen(js), &cfg->mlp, &merr) : VL_ENOMEM;
    free(js);
    if (rc) return vl_fail(err, rc, "config: model: %s", merr.msg[0] ? merr.msg : "out of memory");
    return VL_OK;
}

/* What the sections say beyond their fields, once they are read. */
static int parse_sections(json_t *root, coord_config *cfg, vl_error *err) {
    int rc;
    if ((rc = parse_robust(root, cfg, err)) || (rc = parse_kfac(root, &cfg->train, err))) return rc;
    if (!json_object_get(root, "outer")) cfg->outer_lr = -1; /* resolve_outer picks it */
    json_t *comp = json_object_get(root, "compression");
    if (json_object_get(comp, "ratio") &&
        (json_object_get(comp, "k") || json_object_get(comp, "cols")))
        return vl_fail(err, VL_EINVAL,
                       "config: compression.ratio excludes compression.k "
                       "and compression.cols");
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

/* The rules between fields of the training and merging sections, and
 * the defaults taken from other fields. */
static int check_rules(coord_config *cfg, vl_error *err) {
    if (cfg->selsync_h_min < 0) cfg->selsync_h_min = cfg->train.steps;
    if (cfg->selsync_h_min > cfg->train.steps) {
        return vl_fail(err, VL_EINVAL,
                       "config: selsync.h_min (%lld) exceeds train.steps (%lld), "
                       "which is H_max",
                       (long long)cfg->selsync_h_min, (long long)cfg->train.steps);
    }
    if (cfg->train.nesterov &&
        (strcmp(cfg->train.optimizer, "sgd") != 0 || cfg->train.momentum == 0)) {
        return vl_fail(err, VL_EINVAL,
                       "config: train.nesterov needs optimizer \"sgd\" with "
                       "train.momentum > 0");
    }
    if (cfg->train.min_lr > cfg->train.lr) {
        return vl_fail(err, VL_EINVAL, "config: train.min_lr (%g) exceeds train.lr (%g)",
                       cfg->train.min_lr, cfg->train.lr);
    }
    if (cfg->train.warmup >= cfg->max_versions) {
        return vl_fail(err, VL_EINVAL,
                       "config: train.warmup (%lld versions) must be below "
                       "max_versions (%lld)",
                       (long long)cfg->train.warmup, (long long)cfg->max_versions);
    }
    if (cfg->keep_update_blobs < 0) cfg->keep_update_blobs = cfg->keep_versions;
    if (cfg->staleness.fn == COORD_STALE_HINGE && cfg->staleness.b > cfg->staleness.max) {
        return vl_fail(err, VL_EINVAL, "config: staleness.b (%lld) exceeds staleness.max (%lld)",
                       (long long)cfg->staleness.b, (long long)cfg->staleness.max);
    }
    if (coord_config_is_async(cfg) && cfg->round_deadline_s > 0) {
        return vl_fail(err, VL_EINVAL,
                       "config: round_deadline_s is for sync runs; an async run "
                       "merges every updates_per_version updates");
    }
    return VL_OK;
}

/* What one upload may weigh against what it must be able to carry. */
static int check_sizes(const coord_config *cfg, vl_error *err) {
    int64_t need = coord_config_update_bytes(cfg);
    if (cfg->max_body_bytes < need) {
        return vl_fail(
            err, VL_EINVAL,
            "config: max_body_bytes (%lld) is smaller than one %s "
            "%s update of this model%s (%lld bytes)",
            (long long)cfg->max_body_bytes, cfg->compression_dtype, cfg->compression_kind,
            coord_config_shares_factors(cfg) ? " with its K-FAC factors" : "", (long long)need);
    }
    /* The values of a second round travel under the same cap. */
    int64_t values = 4 * coord_config_round_candidates(cfg) + 8 + UPDATE_HEADER_SLACK;
    if (cfg->second_round > 0 && cfg->max_body_bytes < values) {
        return vl_fail(err, VL_EINVAL,
                       "config: max_body_bytes (%lld) is smaller than the values "
                       "of one second round (%lld bytes)",
                       (long long)cfg->max_body_bytes, (long long)values);
    }
    return VL_OK;
}

int coord_config_parse(const char *json, size_t len, coord_config *cfg, vl_error *err) {
    /* 1. the defaults, the JSON, its top level */
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
    if ((rc = coord_config_fields_keys(root, "", err))) goto out;
    if (!json_object_get(root, "name")) {
        rc = vl_fail(err, VL_EINVAL, "config: name is required");
        goto out;
    }
    /* 2. every field of the table, then what the sections and the data
     *    say beyond their fields */
    if ((rc = coord_config_fields_read(root, cfg, err)) || (rc = parse_sections(root, cfg, err)) ||
        (rc = parse_data(root, cfg, err)) || (rc = coord_config_parse_split(root, cfg, err)) ||
        (rc = coord_config_resolve_lease_wait(root, cfg, err)))
        goto out;
    /* 3. the model's kind, then the rules between fields */
    rc = cfg->net == COORD_NET_MLP ? check_classifier(root, cfg, err) : check_gpt(root, cfg, err);
    if (rc || (rc = check_rules(cfg, err))) goto out;
    /* 4. what the run resolves to: compression sizes, the robust rule,
     *    the outer step; then what an upload must carry */
    if (!(rc = coord_config_resolve_compression(cfg, err))) default_rule(cfg);
    if (rc || (rc = check_robust(cfg, err)) || (rc = coord_config_resolve_outer(cfg, err)) ||
        (rc = check_sizes(cfg, err)))
        goto out;
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
