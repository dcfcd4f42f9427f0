/* What a run configuration resolves to beyond what it says: sizes from a
 * compression ratio, the defaults each kind and mode get, and what an
 * update of the run may weigh. Split from config.c, which parses. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compress/compress.h"
#include "coordinator/config/config.h"
#include "coordinator/config/config_internal.h"
#include "model/mlp_io.h"

static int64_t dtype_bytes(const char *dtype) {
    return strcmp(dtype, "F16") == 0 ? 2 : 4;
}

const char *coord_config_update_kind(const coord_config *cfg) {
    if (strcmp(cfg->compression_kind, "none") == 0) return "dense";
    if (strcmp(cfg->compression_kind, "sketch") == 0) return "sketch";
    return "topk";
}

void coord_config_spec(const coord_config *cfg, compress_spec *out) {
    memset(out, 0, sizeof *out);
    const char *kind = coord_config_update_kind(cfg);
    out->kind = strcmp(kind, "dense") == 0    ? COMPRESS_DENSE
                : strcmp(kind, "sketch") == 0 ? COMPRESS_SKETCH
                                              : COMPRESS_TOPK;
    out->max_nnz = (size_t)cfg->comp_k;
    if (strcmp(cfg->compression_kind, "gaussk") == 0)
        out->max_nnz = COMPRESS_GAUSSK_CAP((size_t)cfg->comp_k);
    out->rows = (uint32_t)cfg->comp_rows;
    out->cols = (uint32_t)cfg->comp_cols;
    out->seed = (uint64_t)cfg->comp_seed;
}

int64_t coord_config_round_candidates(const coord_config *cfg) {
    if (cfg->second_round <= 0 || strcmp(cfg->compression_kind, "sketch") != 0) return 0;
    int64_t n = (int64_t)coord_config_num_params(cfg);
    int64_t c = cfg->second_round * cfg->apply_k;
    return c < n ? c : n;
}

int coord_config_shares_factors(const coord_config *cfg) {
    return strcmp(cfg->train.optimizer, "kfac") == 0 && cfg->train.kfac.share;
}

int64_t coord_config_factor_bytes(const coord_config *cfg) {
    int64_t elem = dtype_bytes(cfg->train.kfac.dtype), bytes = 0;
    int n = model_gpt_kfac_layer_count(&cfg->model);
    for (int i = 0; i < n; i++) {
        int in = 0, out = 0;
        if (model_gpt_kfac_layer(&cfg->model, i, NULL, 0, &in, &out, NULL) != VL_OK) return 0;
        /* Each tensor's header entry is well under 128 bytes. */
        bytes += ((int64_t)(in + 1) * (in + 1) + (int64_t)out * out) * elem + 256;
    }
    return bytes + (elem == 2 ? 8 * (int64_t)n + 128 : 0);
}

int64_t coord_config_update_data_bytes(const coord_config *cfg) {
    int64_t n = (int64_t)coord_config_num_params(cfg);
    int64_t elem = dtype_bytes(cfg->compression_dtype);
    const char *kind = coord_config_update_kind(cfg);
    if (strcmp(kind, "topk") == 0) {
        int64_t k = cfg->comp_k;
        if (strcmp(cfg->compression_kind, "gaussk") == 0) k = COMPRESS_GAUSSK_CAP(k);
        return k * (4 + elem);
    }
    if (strcmp(kind, "sketch") == 0) return cfg->comp_rows * cfg->comp_cols * elem;
    return n * elem;
}

int64_t coord_config_update_bytes(const coord_config *cfg) {
    int64_t data = coord_config_update_data_bytes(cfg);
    if (coord_config_shares_factors(cfg)) data += coord_config_factor_bytes(cfg);
    return data + 8 + UPDATE_HEADER_SLACK;
}

/* Fills in k, cols and apply_k from what was given. A ratio R means the
 * update is R times smaller than a dense F32 one: topk entries cost an
 * index and a value, sketch cells one value. */
int coord_config_resolve_compression(coord_config *cfg, vl_error *err) {
    const char *kind = cfg->compression_kind;
    /* A compressed update spends its bytes on values: at a given ratio F16
     * carries twice as many, which is worth more than their precision. */
    if (!cfg->compression_dtype[0])
        snprintf(cfg->compression_dtype, sizeof cfg->compression_dtype, "%s",
                 strcmp(kind, "none") == 0 ? "F32" : "F16");
    int64_t n = (int64_t)coord_config_num_params(cfg);
    int64_t elem = dtype_bytes(cfg->compression_dtype);
    double dense = 4.0 * (double)n;
    if (cfg->keep_changes < 0)
        cfg->keep_changes = strcmp(kind, "none") == 0 ? cfg->keep_versions : 1000;
    if (cfg->comp_seed < 0) cfg->comp_seed = cfg->seed;
    /* Block top-k and a decaying residual are what made top-k at 100x
     * match dense (docs/results/convergence.md); a configuration that
     * names only the kind and its ratio gets them. */
    int sparse = strcmp(kind, "topk") == 0 || strcmp(kind, "gaussk") == 0;
    if (cfg->comp_block < 0) cfg->comp_block = strcmp(kind, "topk") == 0 ? COORD_TOPK_BLOCK : 0;
    if (cfg->comp_decay < 0) cfg->comp_decay = sparse ? COORD_SPARSE_DECAY : 1.0;
    if (cfg->second_round < 0 && strcmp(kind, "sketch") == 0 && coord_config_is_async(cfg))
        return vl_fail(err, VL_EINVAL,
                       "config: a sketch run's default second round needs "
                       "mode \"sync\"; an async sketch run must say "
                       "\"second_round\": 0 (estimates applied only where they "
                       "stand out of the collision noise)");
    if (cfg->second_round < 0)
        cfg->second_round = strcmp(kind, "sketch") == 0 ? COORD_SKETCH_SECOND_ROUND : 0;
    if (strcmp(kind, "none") == 0) {
        if (cfg->comp_block > 0 || cfg->comp_decay != 1.0)
            return vl_fail(err, VL_EINVAL,
                           "config: compression.block (topk) and "
                           "compression.decay (topk, gaussk) do not apply to "
                           "uncompressed runs");
        cfg->comp_k = cfg->comp_cols = cfg->apply_k = 0;
        return VL_OK;
    }
    if (strcmp(kind, "sketch") == 0) {
        /* With a second round the upload is the sketch and one value per
         * candidate (both in the run's dtype): the ratio's budget is split
         * between them. */
        double sketch_bytes = dense / cfg->comp_ratio;
        if (cfg->second_round > 0) sketch_bytes *= COORD_SKETCH_SHARE;
        if (cfg->comp_ratio > 0) {
            cfg->comp_cols = (int64_t)floor(sketch_bytes / (double)(cfg->comp_rows * elem));
            if (cfg->second_round > 0 && cfg->apply_k == 0)
                cfg->apply_k = (int64_t)floor((dense / cfg->comp_ratio - sketch_bytes) /
                                              (double)(elem * cfg->second_round));
        }
        if (cfg->comp_cols < 1)
            return vl_fail(err, VL_EINVAL,
                           "config: compression.sketch needs cols >= 1 (give "
                           "compression.cols or a smaller compression.ratio)");
        if (cfg->comp_rows * cfg->comp_cols > (int64_t)COMPRESS_SKETCH_MAX_CELLS)
            return vl_fail(err, VL_EINVAL,
                           "config: compression.rows x compression.cols must "
                           "be at most %llu cells",
                           (unsigned long long)COMPRESS_SKETCH_MAX_CELLS);
        /* Heavy-hitter recovery is reliable for about cols/2 coordinates. */
        if (cfg->comp_k == 0) cfg->comp_k = cfg->comp_cols / 2 > 0 ? cfg->comp_cols / 2 : 1;
        if (cfg->apply_k == 0) cfg->apply_k = cfg->comp_k;
    } else {
        if (cfg->comp_ratio > 0)
            cfg->comp_k = (int64_t)floor(dense / (cfg->comp_ratio * (double)(4 + elem)));
        if (cfg->comp_k < 1)
            return vl_fail(err, VL_EINVAL,
                           "config: compression.%s needs k >= 1 (give "
                           "compression.k or a smaller compression.ratio)",
                           kind);
        if (cfg->apply_k == 0) cfg->apply_k = cfg->comp_k * cfg->updates_per_version;
    }
    if (cfg->comp_k > n)
        return vl_fail(err, VL_EINVAL,
                       "config: compression.k (%lld) exceeds the %lld "
                       "parameters of the model",
                       (long long)cfg->comp_k, (long long)n);
    if (cfg->apply_k > n) cfg->apply_k = n;
    if (cfg->comp_block > 0 && strcmp(kind, "topk") != 0)
        return vl_fail(err, VL_EINVAL,
                       "config: compression.block is for topk runs (this one "
                       "is %s)",
                       kind);
    if (cfg->comp_decay != 1.0 && strcmp(kind, "topk") != 0 && strcmp(kind, "gaussk") != 0)
        return vl_fail(err, VL_EINVAL,
                       "config: compression.decay is for topk and gaussk runs, "
                       "whose peers keep a residual (this one is %s)",
                       kind);
    if (cfg->second_round > 0 && strcmp(kind, "sketch") != 0)
        return vl_fail(err, VL_EINVAL,
                       "config: compression.second_round is for sketch runs "
                       "(this one is %s)",
                       kind);
    /* The ratio is spent: what it resolved to is the configuration, and
     * that is what the normalised form stores. */
    cfg->comp_ratio = 0;
    return VL_OK;
}

int coord_config_resolve_lease_wait(json_t *root, coord_config *cfg, vl_error *err) {
    json_t *v = json_object_get(root, "lease_wait");
    int async = coord_config_is_async(cfg);
    if (!v) {
        cfg->lease_wait = async ? COORD_ASYNC_LEASE_WAIT : 0;
        return VL_OK;
    }
    /* Read and bounded by the table (fields.c). */
    if (cfg->lease_wait > 0 && !async)
        return vl_fail(err, VL_EINVAL,
                       "config: lease_wait is for async runs (a sync version waits for "
                       "all its tasks anyway)");
    return VL_OK;
}

/* The outer step of a configuration without an "outer" object, by kind
 * and mode (config.h says why each), then the outer delay and dynamic
 * steps by mode, and the async combinations refused because they are
 * known to diverge. */
int coord_config_resolve_outer(coord_config *cfg, vl_error *err) {
    int async = coord_config_is_async(cfg);
    const char *kind = cfg->compression_kind;
    int sketch = strcmp(kind, "sketch") == 0;
    /* Updates that arrive fresh need no delayed momentum. */
    int waits = cfg->lease_wait > 0;
    if (async && cfg->second_round > 0)
        return vl_fail(err, VL_EINVAL,
                       "config: compression.second_round needs a sync run (its "
                       "peers answer for one version's updates together)");
    if (cfg->outer_lr < 0) {
        cfg->outer_delay = 1;
        if (sketch && cfg->second_round > 0) {
            cfg->outer_lr = COORD_SKETCH_ROUND_LR;
            cfg->outer_momentum = COORD_SKETCH_ROUND_MOMENTUM;
        } else if (sketch) {
            cfg->outer_lr = COORD_SKETCH_LR;
            cfg->outer_momentum = COORD_SKETCH_MOMENTUM;
        } else if (strcmp(kind, "none") != 0) {
            cfg->outer_lr = COORD_SPARSE_OUTER_LR;
            cfg->outer_momentum = 0.0;
        } else if (async && waits) {
            cfg->outer_lr = COORD_ASYNC_WAIT_OUTER_LR;
            cfg->outer_momentum = COORD_ASYNC_WAIT_OUTER_MOMENTUM;
        } else if (async) {
            cfg->outer_lr = COORD_ASYNC_OUTER_LR;
            cfg->outer_momentum = COORD_ASYNC_OUTER_MOMENTUM;
            cfg->outer_delay = COORD_ASYNC_OUTER_DELAY;
        } else {
            cfg->outer_lr = 0.7;
            cfg->outer_momentum = 0.9;
        }
    }
    if (cfg->outer_delay < 0)
        cfg->outer_delay =
            async && !waits && cfg->outer_momentum > 0 && !sketch ? COORD_ASYNC_OUTER_DELAY : 1;
    if (cfg->train.dynamic_steps < 0) cfg->train.dynamic_steps = async;
    if (cfg->train.dynamic_steps && !async)
        return vl_fail(err, VL_EINVAL,
                       "config: train.dynamic_steps is for async runs (a sync "
                       "version waits for all its tasks anyway)");
    if (cfg->outer_delay > 1 && sketch)
        return vl_fail(err, VL_EINVAL,
                       "config: outer.delay needs compression none, topk or "
                       "gaussk (a sketch run keeps its momentum in sketch space)");
    /* Nesterov momentum on every version of stale pseudo-gradients drove
     * the demo model from 5.5 to 49.8 nats in 60 versions. A run whose
     * peers wait for their own updates' version gets fresh updates, and
     * momentum only on versions that are (coord_outer_momentum_due). */
    if (async && !waits && cfg->outer_momentum > 0 && cfg->outer_delay == 1)
        return vl_fail(err, VL_EINVAL,
                       "config: outer.momentum %g with outer.delay 1 diverges in "
                       "an async run without lease_wait (momentum on stale updates "
                       "every version); set lease_wait, outer.delay (versions per "
                       "momentum step, e.g. %d) or outer.momentum 0",
                       cfg->outer_momentum, COORD_ASYNC_OUTER_DELAY);
    return VL_OK;
}

int coord_config_resolve_validation(json_t *root, coord_config *cfg, vl_error *err) {
    if (cfg->net == COORD_NET_MLP) {
        if (json_object_get(root, "val_batches") || json_object_get(root, "val_tokens") ||
            json_object_get(root, "val_check_tokens"))
            return vl_fail(err, VL_EINVAL,
                           "config: val_batches, val_tokens and val_check_tokens are for "
                           "text and token runs; an mlp run scores its whole test set");
        cfg->val_batches = cfg->val_tokens = 0;
        cfg->val_check_batches = cfg->val_check_tokens = 0;
        return VL_OK;
    }
    /* val_batches, the exact count, is what the stored configuration
     * keeps; val_tokens is how a person says it. */
    if (json_object_get(root, "val_batches") && json_object_get(root, "val_tokens"))
        return vl_fail(err, VL_EINVAL, "config: give val_tokens or val_batches, not both");
    int64_t per_batch = COORD_VAL_BATCH * (int64_t)cfg->model.block_size;
    /* An async run whose peers wait for their own updates' version waits
     * for each version's score too, so it is served on a check by
     * default. */
    if (!json_object_get(root, "val_check_tokens") && cfg->lease_wait > 0)
        cfg->val_check_tokens = COORD_ASYNC_CHECK_TOKENS;
    if (cfg->val_batches < 0) {
        cfg->val_batches = (cfg->val_tokens + per_batch - 1) / per_batch;
        if (cfg->val_batches > 1000000)
            return vl_fail(err, VL_EINVAL,
                           "config: val_tokens %lld is more than 1000000 batches of "
                           "validation windows",
                           (long long)cfg->val_tokens);
    }
    /* Either way val_tokens ends as the most the batches can score, so a
     * configuration and its stored form compare equal. */
    cfg->val_tokens = cfg->val_batches * per_batch;
    cfg->val_check_batches = (cfg->val_check_tokens + per_batch - 1) / per_batch;
    /* A check as large as the full score is the full score. */
    if (cfg->val_batches > 0 && cfg->val_check_batches >= cfg->val_batches)
        cfg->val_check_batches = 0;
    cfg->val_check_tokens = cfg->val_check_batches * per_batch;
    return VL_OK;
}

size_t coord_config_trim_count(double trim, size_t k) {
    if (!(trim > 0) || k == 0) return 0;
    double x = floor(trim * (double)k + 1e-9);
    size_t b = x > (double)k ? k : (size_t)x;
    size_t most = (k - 1) / 2; /* 2b < k: at least one value stays */
    return b < most ? b : most;
}

/* The robust rules' names, in coord_rule order, NULL after the last. */
const char *const coord_rule_names[] = {"mean", "trimmed_mean", "median", "norm_clip", NULL};

const char *coord_rule_name(coord_rule r) {
    return (unsigned)r < sizeof coord_rule_names / sizeof coord_rule_names[0] - 1
               ? coord_rule_names[r]
               : "unknown";
}

int coord_config_is_async(const coord_config *cfg) {
    return strcmp(cfg->mode, "async") == 0;
}

size_t coord_config_num_params(const coord_config *cfg) {
    return cfg->net == COORD_NET_MLP ? model_mlp_config_num_params(&cfg->mlp)
                                     : model_gpt_config_num_params(&cfg->model);
}
