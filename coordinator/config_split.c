/* The split-learning part of a run's configuration: mode "split" and its
 * "split" section {cut, alpha, lr, dtype}. */
#include <math.h>
#include <string.h>

#include <stdio.h>

#include "coordinator/config_internal.h"

int coord_config_is_split(const coord_config *cfg) {
    return strcmp(cfg->mode, "split") == 0;
}

static int get_number(json_t *o, const char *key, double lo, double hi, double *out,
                      vl_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v) return VL_OK;
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
        return vl_fail(err, VL_EINVAL, "config: split.%s must be a number in [%g, %g]", key, lo,
                       hi);
    *out = json_number_value(v);
    return VL_OK;
}

int coord_config_parse_split(json_t *root, coord_config *cfg, vl_error *err) {
    json_t *sp = json_object_get(root, "split");
    int split = coord_config_is_split(cfg);
    if (sp && !split)
        return vl_fail(err, VL_EINVAL, "config: the split section is for mode \"split\"");
    if (!split) return VL_OK;
    if (cfg->net != COORD_NET_MLP)
        return vl_fail(err, VL_EINVAL, "config: mode \"split\" needs an mlp model (model.kind "
                                       "\"mlp\")");
    if (!json_is_object(sp) || !json_is_integer(json_object_get(sp, "cut")))
        return vl_fail(err, VL_EINVAL, "config: mode \"split\" needs split.cut, the number of "
                                       "layers the peers keep");
    static const char *const KEYS[] = {"cut", "alpha", "lr", "dtype", NULL};
    const char *key;
    json_t *v;
    json_object_foreach(sp, key, v) {
        int known = 0;
        for (const char *const *k = KEYS; *k; k++) known |= strcmp(*k, key) == 0;
        if (!known) return vl_fail(err, VL_EINVAL, "config: unknown key split.%.40s", key);
    }
    json_int_t cut = json_integer_value(json_object_get(sp, "cut"));
    if (cut < 1 || cut > cfg->mlp.n_hidden)
        return vl_fail(err, VL_EINVAL, "config: split.cut must be 1 to %d (the model's hidden "
                                       "layers; the peers keep layers below the cut)",
                       cfg->mlp.n_hidden);
    cfg->split_cut = (int)cut;
    cfg->split_alpha = 0;
    cfg->split_lr = cfg->train.lr;
    snprintf(cfg->split_dtype, sizeof cfg->split_dtype, "F32");
    int rc = get_number(sp, "alpha", 0, 1e3, &cfg->split_alpha, err);
    if (!rc) rc = get_number(sp, "lr", 0, 10, &cfg->split_lr, err);
    if (rc) return rc;
    json_t *dt = json_object_get(sp, "dtype");
    if (dt) {
        if (!json_is_string(dt) || (strcmp(json_string_value(dt), "F32") != 0 &&
                                    strcmp(json_string_value(dt), "F16") != 0))
            return vl_fail(err, VL_EINVAL, "config: split.dtype must be \"F32\" or \"F16\"");
        snprintf(cfg->split_dtype, sizeof cfg->split_dtype, "%s", json_string_value(dt));
    }
    if (strcmp(cfg->train.optimizer, "kfac") == 0)
        return vl_fail(err, VL_EINVAL, "config: split runs train with \"adamw\" or \"sgd\"");
    return VL_OK;
}

int coord_config_split_json(const coord_config *cfg, json_t *root) {
    if (!coord_config_is_split(cfg)) return VL_OK;
    json_t *sp = json_pack("{s:i, s:f, s:f, s:s}", "cut", cfg->split_cut, "alpha",
                           cfg->split_alpha, "lr", cfg->split_lr, "dtype", cfg->split_dtype);
    return !sp || json_object_set_new(root, "split", sp) != 0 ? VL_ENOMEM : VL_OK;
}
