/* The run configuration's derived forms: the normalised JSON stored with
 * the run and sent to peers, the model JSON that model files carry, the
 * split of a text corpus, and durations given on the command line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compress/compress.h"

#include "model/mlp_io.h"
#include "coordinator/config/config.h"
#include "coordinator/config/config_internal.h"

static const char *stale_fn_name(coord_stale_fn f) {
    return f == COORD_STALE_HINGE ? "hinge" : f == COORD_STALE_CONSTANT ? "constant" : "polynomial";
}

void coord_config_split(const coord_config *cfg, int64_t corpus_size, int64_t *train_len,
                        int64_t *val_len) {
    int64_t v = (int64_t)floor((double)corpus_size * cfg->val_fraction);
    if (v < 0) v = 0;
    if (v > corpus_size) v = corpus_size;
    *val_len = v;
    *train_len = corpus_size - v;
}

int coord_config_check_corpus(const coord_config *cfg, int64_t corpus_size, vl_error *err) {
    int64_t train_len, val_len;
    coord_config_split(cfg, corpus_size, &train_len, &val_len);
    if (val_len < (int64_t)cfg->model.block_size + 1)
        return vl_fail(err, VL_EINVAL,
                       "config: val_fraction leaves %lld validation bytes of a %lld-byte corpus; "
                       "at least model.block_size + 1 = %d are needed",
                       (long long)val_len, (long long)corpus_size, cfg->model.block_size + 1);
    /* Local data: the file is all held out, and nothing is served. */
    if (!cfg->local && train_len < cfg->task_bytes)
        return vl_fail(err, VL_EINVAL,
                       "config: task_bytes (%lld) exceeds the %lld training bytes of the corpus",
                       (long long)cfg->task_bytes, (long long)train_len);
    return VL_OK;
}

int coord_config_model_json(const coord_config *cfg, char *out, size_t cap) {
    if (cfg->net == COORD_NET_MLP) return model_mlp_config_json(&cfg->mlp, out, cap);
    const model_gpt_config *m = &cfg->model;
    int n = snprintf(out, cap,
                     "{\"vocab_size\":%d,\"block_size\":%d,\"n_layer\":%d,\"n_head\":%d,"
                     "\"n_embd\":%d}",
                     m->vocab_size, m->block_size, m->n_layer, m->n_head, m->n_embd);
    return n < 0 || (size_t)n >= cap ? VL_EINVAL : VL_OK;
}

int coord_config_is_local(const coord_config *cfg) {
    return cfg->local;
}

/* The data fields of the normalised form: a text run's corpus (with_paths
 * only; val_fraction and task_bytes are in the common part), or a shard
 * run's "data" and task_tokens in place of the text fields. Peers get
 * "data" without paths, which name files on this machine. */
static int data_json(const coord_config *cfg, json_t *root, int with_paths) {
    if (coord_config_is_local(cfg)) {
        json_t *data = json_pack("{s:s}", "kind", "local");
        int bad = !data || json_object_del(root, "val_fraction") != 0 ||
                  json_object_del(root, "task_bytes") != 0 ||
                  json_object_del(root, "val_batches") != 0 ||
                  json_object_del(root, "val_check_tokens") != 0;
        if (!bad && with_paths) bad = coord_config_local_json(cfg, data) != VL_OK;
        /* A GPT keeps val_batches (how much of its held-out data to score). */
        if (!bad && cfg->net != COORD_NET_MLP)
            bad = json_object_set_new(root, "val_batches", json_integer(cfg->val_batches)) != 0 ||
                  json_object_set_new(root, "val_check_tokens",
                                      json_integer(cfg->val_check_tokens)) != 0;
        if (bad) {
            json_decref(data);
            return VL_ENOMEM;
        }
        return json_object_set_new(root, "data", data) != 0 ? VL_ENOMEM : VL_OK;
    }
    if (!cfg->shards)
        return with_paths && json_object_set_new(root, "corpus", json_string(cfg->corpus)) != 0
                   ? VL_ENOMEM
                   : VL_OK;
    json_t *data = json_pack("{s:s}", "kind", "shards");
    json_t *train = json_array();
    int bad = !data || !train;
    for (int i = 0; !bad && with_paths && i < cfg->n_train_shards; i++)
        bad = json_array_append_new(train, json_string(cfg->train_shards[i])) != 0;
    if (!bad && with_paths)
        bad = json_object_set_new(data, "train", json_incref(train)) != 0 ||
              json_object_set_new(data, "val", json_string(cfg->val_shard)) != 0;
    json_decref(train);
    bad = bad || json_object_del(root, "val_fraction") != 0 ||
          json_object_del(root, "task_bytes") != 0 ||
          json_object_set_new(root, "task_tokens", json_integer(cfg->task_tokens)) != 0;
    if (bad) {
        json_decref(data);
        return VL_ENOMEM;
    }
    /* set_new takes data over, on failure too. */
    return json_object_set_new(root, "data", data) != 0 ? VL_ENOMEM : VL_OK;
}

int coord_config_names_hash(const char *json) {
    json_t *root = json_loads(json, 0, NULL);
    int named = json_is_string(json_object_get(json_object_get(root, "compression"), "hash"));
    json_decref(root);
    return named;
}

char *coord_config_to_json(const coord_config *cfg, int with_corpus) {
    const coord_train_config *t = &cfg->train;
    json_t *root = json_pack(
        "{s:s, s:f, s:I, s:{s:i, s:i, s:i, s:i, s:i}, s:s, s:I, s:I,"
        " s:{s:I, s:I, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:b}, s:{s:f, s:f, s:I},"
        " s:{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f},"
        " s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
        "name", cfg->name, "val_fraction", cfg->val_fraction, "seed", (json_int_t)cfg->seed,
        "model", "vocab_size", cfg->model.vocab_size, "block_size", cfg->model.block_size,
        "n_layer", cfg->model.n_layer, "n_head", cfg->model.n_head, "n_embd", cfg->model.n_embd,
        "mode", cfg->mode, "updates_per_version", (json_int_t)cfg->updates_per_version,
        "max_versions", (json_int_t)cfg->max_versions, "train", "steps", (json_int_t)t->steps,
        "batch", (json_int_t)t->batch, "optimizer", t->optimizer, "lr", t->lr, "beta1", t->beta1,
        "beta2", t->beta2, "eps", t->eps, "weight_decay", t->weight_decay, "grad_clip",
        t->grad_clip, "dynamic_steps", t->dynamic_steps, "outer", "lr", cfg->outer_lr, "momentum",
        cfg->outer_momentum, "delay", (json_int_t)cfg->outer_delay, "compression", "kind",
        cfg->compression_kind, "dtype", cfg->compression_dtype, "k", (json_int_t)cfg->comp_k,
        "rows", (json_int_t)cfg->comp_rows, "cols", (json_int_t)cfg->comp_cols, "seed",
        (json_int_t)cfg->comp_seed, "apply_k", (json_int_t)cfg->apply_k, "second_round",
        (json_int_t)cfg->second_round, "round_s", (json_int_t)cfg->round_s, "block",
        (json_int_t)cfg->comp_block, "decay", cfg->comp_decay, "task_bytes",
        (json_int_t)cfg->task_bytes, "lease_s", (json_int_t)cfg->lease_s, "max_body_bytes",
        (json_int_t)cfg->max_body_bytes, "val_batches", (json_int_t)cfg->val_batches,
        "val_check_tokens", (json_int_t)cfg->val_check_tokens, "keep_versions",
        (json_int_t)cfg->keep_versions, "keep_changes", (json_int_t)cfg->keep_changes);
    if (!root) return NULL;
    /* Every run stores its sketch hash, so that a later hash can tell the
     * runs it cannot go on with (coord_state_load). */
    if (json_object_set_new(json_object_get(root, "compression"), "hash",
                            json_string(cfg->comp_hash)) != 0) {
        json_decref(root);
        return NULL;
    }
    /* A classifier's model object replaces the GPT's fields. */
    char mjs[MODEL_MLP_JSON_MAX];
    if (cfg->net == COORD_NET_MLP &&
        (model_mlp_config_json(&cfg->mlp, mjs, sizeof mjs) != VL_OK ||
         json_object_set_new(root, "model", json_loads(mjs, 0, NULL)) != 0)) {
        json_decref(root);
        return NULL;
    }
    if (data_json(cfg, root, with_corpus) != VL_OK || coord_config_split_json(cfg, root) != VL_OK) {
        json_decref(root);
        return NULL;
    }
    json_t *sched = json_pack("{s:s, s:I, s:f, s:f, s:b}", "schedule", cfg->train.schedule,
                              "warmup", (json_int_t)cfg->train.warmup, "min_lr", cfg->train.min_lr,
                              "momentum", cfg->train.momentum, "nesterov", cfg->train.nesterov);
    if (!sched || json_object_update(json_object_get(root, "train"), sched) != 0) {
        json_decref(sched);
        json_decref(root);
        return NULL;
    }
    json_decref(sched);
    if (strcmp(cfg->train.optimizer, "kfac") == 0) {
        json_t *k =
            json_pack("{s:f, s:f, s:I, s:f, s:b, s:s}", "damping", t->kfac.damping, "decay",
                      t->kfac.decay, "inverse_every", (json_int_t)t->kfac.inverse_every, "kl_clip",
                      t->kfac.kl_clip, "share", t->kfac.share, "dtype", t->kfac.dtype);
        if (!k || json_object_set_new(json_object_get(root, "train"), "kfac", k) != 0) {
            json_decref(root);
            return NULL;
        }
    }
    json_t *merging = json_pack(
        "{s:{s:s, s:f, s:I, s:I}, s:I, s:{s:f, s:I}, s:I, s:f, s:f}", "staleness", "function",
        stale_fn_name(cfg->staleness.fn), "a", cfg->staleness.a, "b", (json_int_t)cfg->staleness.b,
        "max", (json_int_t)cfg->staleness.max, "round_deadline_s",
        (json_int_t)cfg->round_deadline_s, "selsync", "delta", cfg->selsync_delta, "h_min",
        (json_int_t)cfg->selsync_h_min, "keep_update_blobs", (json_int_t)cfg->keep_update_blobs,
        "max_loss_rise", cfg->max_loss_rise, "lease_wait", cfg->lease_wait);
    if (!merging || json_object_update(root, merging) != 0) {
        json_decref(merging);
        json_decref(root);
        return NULL;
    }
    json_decref(merging);
    const coord_robust_config *r = &cfg->robust;
    json_t *rb = json_pack("{s:s, s:f, s:f, s:o, s:s}", "rule", coord_rule_name(r->rule), "trim",
                           r->trim, "clip_mult", r->clip_mult, "max_norm",
                           r->auto_norm ? json_string("auto") : json_real(r->max_norm), "on_excess",
                           r->refuse_excess ? "refuse" : "clip");
    if (rb && r->auto_norm &&
        (json_object_set_new(rb, "auto_mult", json_real(r->auto_mult)) != 0 ||
         json_object_set_new(rb, "auto_versions", json_integer(r->auto_versions)) != 0)) {
        json_decref(rb);
        rb = NULL;
    }
    if (!rb || json_object_set_new(root, "robust", rb) != 0) {
        json_decref(root);
        return NULL;
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(root);
    return s;
}

int coord_parse_duration(const char *s, int64_t *out_s) {
    if (!s || !*s) return VL_EINVAL;
    size_t n = strlen(s);
    int64_t mult = 1;
    char unit = s[n - 1];
    char num[32];
    if (unit >= '0' && unit <= '9') {
        unit = 's';
    } else {
        n--;
        switch (unit) {
        case 's': mult = 1; break;
        case 'm': mult = 60; break;
        case 'h': mult = 3600; break;
        case 'd': mult = 86400; break;
        default: return VL_EINVAL;
        }
    }
    if (n == 0 || n >= sizeof num) return VL_EINVAL;
    memcpy(num, s, n);
    num[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (num[i] < '0' || num[i] > '9') return VL_EINVAL;
    int64_t v;
    const int64_t max_s = (int64_t)10 * 366 * 86400;
    if (vl_parse_i64(num, 1, max_s, &v) != VL_OK || v > max_s / mult) return VL_EINVAL;
    *out_s = v * mult;
    return VL_OK;
}
