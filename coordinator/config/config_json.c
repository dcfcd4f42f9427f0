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
#include "coordinator/config/fields.h"

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

/* ---- the rows the table leaves to code (fields.c) ------------------------ */

int coord_config_put_model(const coord_config *cfg, json_t *parent, const char *key,
                           int with_paths) {
    (void)with_paths;
    json_t *m = json_object(); /* a GPT's: the table's rows fill it */
    if (cfg->net == COORD_NET_MLP) {
        char mjs[MODEL_MLP_JSON_MAX];
        json_decref(m);
        m = model_mlp_config_json(&cfg->mlp, mjs, sizeof mjs) == VL_OK ? json_loads(mjs, 0, NULL)
                                                                       : NULL;
    }
    return m && json_object_set_new(parent, key, m) == 0 ? VL_OK : VL_ENOMEM;
}

/* A text run's corpus (with_paths only), or the "data" object of token
 * shards and local data. Peers get "data" without paths, which name
 * files on this machine. */
int coord_config_put_data(const coord_config *cfg, json_t *parent, const char *key,
                          int with_paths) {
    if (!cfg->shards && !cfg->local)
        return with_paths && json_object_set_new(parent, "corpus", json_string(cfg->corpus)) != 0
                   ? VL_ENOMEM
                   : VL_OK;
    json_t *data = json_pack("{s:s}", "kind", cfg->local ? "local" : "shards");
    int bad = !data;
    if (!bad && with_paths && cfg->local) bad = coord_config_local_json(cfg, data) != VL_OK;
    if (!bad && with_paths && !cfg->local) {
        json_t *train = json_array();
        bad = !train || json_object_set_new(data, "train", train) != 0;
        for (int i = 0; !bad && i < cfg->n_train_shards; i++)
            bad = json_array_append_new(train, json_string(cfg->train_shards[i])) != 0;
        bad = bad || json_object_set_new(data, "val", json_string(cfg->val_shard)) != 0;
    }
    if (bad) {
        json_decref(data);
        return VL_ENOMEM;
    }
    /* set_new takes data over, on failure too. */
    return json_object_set_new(parent, key, data) != 0 ? VL_ENOMEM : VL_OK;
}

int coord_config_put_max_norm(const coord_config *cfg, json_t *parent, const char *key,
                              int with_paths) {
    (void)with_paths;
    const coord_robust_config *r = &cfg->robust;
    json_t *v = r->auto_norm ? json_string("auto") : json_real(r->max_norm);
    return json_object_set_new(parent, key, v) != 0 ? VL_ENOMEM : VL_OK;
}

int coord_config_names_hash(const char *json) {
    json_t *root = json_loads(json, 0, NULL);
    int named = json_is_string(json_object_get(json_object_get(root, "compression"), "hash"));
    json_decref(root);
    return named;
}

/* Every run stores its sketch hash (compression.hash, a row like the
 * rest), so that a later hash can tell the runs it cannot go on with
 * (coord_state_load). */
char *coord_config_to_json(const coord_config *cfg, int with_corpus) {
    json_t *root = json_object();
    if (!root || coord_config_fields_write(cfg, root, with_corpus) != VL_OK) {
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
