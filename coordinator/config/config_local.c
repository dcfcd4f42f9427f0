/* The parts of a run's configuration for data that stay on the peers:
 * data {"kind": "local"} (a classifier's test set, or a GPT's held-out
 * text or token shard) and split learning (mode "split" and its "split"
 * section {cut, alpha, lr, dtype}). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/split_wire.h"
#include "coordinator/config/config_internal.h"
#include "coordinator/config/config.h"
#include "coordinator/config/fields.h"

int coord_config_is_split(const coord_config *cfg) {
    return strcmp(cfg->mode, "split") == 0;
}

/* A path field of data: a non-empty string that fits out. */
static int get_path(json_t *data, const char *key, char *out, size_t cap, vl_error *err) {
    json_t *v = json_object_get(data, key);
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= cap ||
        strlen(json_string_value(v)) != json_string_length(v))
        return vl_fail(err, VL_EINVAL,
                       "config: data.%s must be a non-empty path under %zu "
                       "bytes",
                       key, cap);
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return VL_OK;
}

/* A classifier: its own held-out set, test_images and test_labels (IDX
 * files, both or neither). */
static int parse_classifier(json_t *data, coord_config *cfg, vl_error *err) {
    if (json_object_get(data, "train") || json_object_get(data, "val") ||
        json_object_get(data, "val_shard"))
        return vl_fail(err, VL_EINVAL,
                       "config: an mlp run trains on the peers' own data and "
                       "scores on data.test_images and data.test_labels");
    int imgs = json_object_get(data, "test_images") != NULL;
    if (imgs != (json_object_get(data, "test_labels") != NULL))
        return vl_fail(err, VL_EINVAL,
                       "config: data.test_images and data.test_labels go "
                       "together");
    if (!imgs) return VL_OK;
    int rc = get_path(data, "test_images", cfg->test_images, sizeof cfg->test_images, err);
    return rc ? rc : get_path(data, "test_labels", cfg->test_labels, sizeof cfg->test_labels, err);
}

/* A GPT: the held-out data it is scored on, a text file (val, every byte
 * of it held out) or a token shard (val_shard); training data are the
 * peers' own. */
static int parse_gpt(json_t *data, coord_config *cfg, vl_error *err) {
    if (json_object_get(data, "train") || json_object_get(data, "test_images") ||
        json_object_get(data, "test_labels"))
        return vl_fail(err, VL_EINVAL,
                       "config: a GPT on local data takes data.val (a text "
                       "file) or data.val_shard (a token shard), nothing else");
    int text = json_object_get(data, "val") != NULL;
    if (text == (json_object_get(data, "val_shard") != NULL))
        return vl_fail(err, VL_EINVAL,
                       "config: a GPT on local data is scored on data.val (a "
                       "text file) or data.val_shard (a token shard): give one");
    if (text) {
        cfg->val_fraction = 1.0;
        return get_path(data, "val", cfg->corpus, sizeof cfg->corpus, err);
    }
    cfg->shards = 1;
    return get_path(data, "val_shard", cfg->val_shard, sizeof cfg->val_shard, err);
}

int coord_config_parse_local(json_t *root, json_t *data, coord_config *cfg, vl_error *err) {
    json_t *kind = json_object_get(data, "kind");
    if (!json_is_string(kind) || strcmp(json_string_value(kind), "local") != 0)
        return vl_fail(err, VL_EINVAL,
                       "config: an mlp model trains on the peers' own data: "
                       "data.kind must be \"local\" (with test_images and "
                       "test_labels for a held-out set)");
    static const char *const NOT_LOCAL[] = {"task_tokens", "task_bytes", "val_fraction", NULL};
    for (const char *const *k = NOT_LOCAL; *k; k++)
        if (json_object_get(root, *k))
            return vl_fail(err, VL_EINVAL,
                           "config: %s is for data the coordinator serves; "
                           "this run's data stay on the peers",
                           *k);
    cfg->local = 1;
    return cfg->net == COORD_NET_MLP ? parse_classifier(data, cfg, err) : parse_gpt(data, cfg, err);
}

int coord_config_local_json(const coord_config *cfg, json_t *data) {
    if (!cfg->local) return VL_OK;
    if (cfg->net == COORD_NET_MLP)
        return cfg->test_images[0] &&
                       (json_object_set_new(data, "test_images", json_string(cfg->test_images)) ||
                        json_object_set_new(data, "test_labels", json_string(cfg->test_labels)))
                   ? VL_ENOMEM
                   : VL_OK;
    return json_object_set_new(data, cfg->shards ? "val_shard" : "val",
                               json_string(cfg->shards ? cfg->val_shard : cfg->corpus))
               ? VL_ENOMEM
               : VL_OK;
}

int coord_config_get_split_cut(json_t *v, const coord_config_field *f, coord_config *cfg,
                               vl_error *err) {
    int rc = coord_config_field_read(v, f, cfg, err);
    /* Without an mlp model coord_config_parse_split refuses the section. */
    if (cfg->net != COORD_NET_MLP || !json_is_integer(v)) return rc;
    /* Every layer but the classifier may be cut after: conv and hidden
     * (the model row, read before this one, gave the layers). */
    const int below_head = model_mlp_config_num_layers(&cfg->mlp) - 1;
    json_int_t cut = json_integer_value(v);
    if (cut < 1 || cut > below_head)
        return vl_fail(err, VL_EINVAL,
                       "config: split.cut must be 1 to %d (the model's conv and "
                       "hidden layers; the peers keep layers below the cut)",
                       below_head);
    return rc;
}

int coord_config_parse_split(json_t *root, coord_config *cfg, vl_error *err) {
    json_t *sp = json_object_get(root, "split");
    int split = coord_config_is_split(cfg);
    if (sp && !split)
        return vl_fail(err, VL_EINVAL, "config: the split section is for mode \"split\"");
    if (!split) return VL_OK;
    if (cfg->net != COORD_NET_MLP)
        return vl_fail(err, VL_EINVAL,
                       "config: mode \"split\" needs an mlp model (model.kind "
                       "\"mlp\")");
    if (!json_is_object(sp) || !json_is_integer(json_object_get(sp, "cut")))
        return vl_fail(err, VL_EINVAL,
                       "config: mode \"split\" needs split.cut, the number of "
                       "layers the peers keep");
    const int below_head = model_mlp_config_num_layers(&cfg->mlp) - 1;
    /* The table read the section's fields and their bounds; the lr is
     * the run's own unless given. */
    if (!json_object_get(sp, "lr")) cfg->split_lr = cfg->train.lr;
    if (cfg->split_u && cfg->split_cut >= below_head)
        return vl_fail(err, VL_EINVAL,
                       "config: a U-shaped split leaves the coordinator the "
                       "layers from split.cut up to the last hidden one: "
                       "split.cut must be below %d",
                       below_head);
    if (cfg->split_u && cfg->split_in_flight > 1)
        return vl_fail(err, VL_EINVAL,
                       "config: split.in_flight above 1 is for plain split runs: "
                       "a U-shaped peer needs each batch's answer for its head "
                       "before the next step");
    if (strcmp(cfg->train.optimizer, "kfac") == 0)
        return vl_fail(err, VL_EINVAL, "config: split runs train with \"adamw\" or \"sgd\"");
    return VL_OK;
}
