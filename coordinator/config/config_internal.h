/* Shared between config.c (parsing) and config_resolve.c (what a parsed
 * configuration resolves to); not for use outside the configuration.
 *
 * Contents: coord_config_resolve_compression,
 * coord_config_resolve_lease_wait, coord_config_resolve_outer,
 * coord_config_resolve_validation, coord_config_parse_local,
 * coord_config_local_json, coord_config_parse_split, coord_config_get_name,
 * coord_config_get_model, coord_config_get_kind, coord_config_get_max_norm,
 * coord_config_get_split_cut, coord_config_put_model,
 * coord_config_put_data, coord_config_put_max_norm, UPDATE_HEADER_SLACK.
 */
#ifndef VOLLEY_COORD_CONFIG_INTERNAL_H
#define VOLLEY_COORD_CONFIG_INTERNAL_H

#include <jansson.h>

#include "common/common.h"
#include "coordinator/config/config.h"

/* Room for an update's safetensors header: the metadata strings and one
 * tensor entry, padded. Generous, because refusing a valid update for a
 * few bytes would stall the run. */
#define UPDATE_HEADER_SLACK 8192

/* Fills in dtype, block, decay, the second round, k, cols and apply_k
 * from what was given (a ratio R: an update R times smaller than a dense
 * F32 one), and refuses settings the kind has no use for. */
int coord_config_resolve_compression(coord_config *cfg, vl_error *err) VL_MUST_CHECK;
/* lease_wait: a number of task times, 0 to 100, above 0 only in an async
 * run; by mode when not given. After the mode is parsed, before
 * coord_config_resolve_validation and coord_config_resolve_outer, whose
 * defaults depend on it. */
int coord_config_resolve_lease_wait(json_t *root, coord_config *cfg, vl_error *err) VL_MUST_CHECK;
/* The outer step, delay and dynamic steps by kind and mode (and
 * lease_wait) when not given, and the async combinations refused because
 * they are known to diverge. After coord_config_resolve_compression. */
int coord_config_resolve_outer(coord_config *cfg, vl_error *err) VL_MUST_CHECK;

/* val_batches from val_tokens (a configuration gives one of them) and
 * val_check_batches from val_check_tokens; a
 * classifier, which scores its whole test set, may give none of them.
 * After the mode and the model are parsed. */
int coord_config_resolve_validation(json_t *root, coord_config *cfg, vl_error *err) VL_MUST_CHECK;

/* data {"kind": "local"} (config_local.c): a classifier's test set or a
 * GPT's held-out data (val: a text file, wholly held out; val_shard: a
 * token shard); refuses the fields of served data. Sets cfg->local. */
int coord_config_parse_local(json_t *root, json_t *data, coord_config *cfg,
                             vl_error *err) VL_MUST_CHECK;
/* Adds the local data's paths to the normalised data object. */
int coord_config_local_json(const coord_config *cfg, json_t *data) VL_MUST_CHECK;
/* The split section and mode "split" (config_local.c): checks the cut
 * against the model, the weights and the dtype, after the model and train
 * sections are parsed. Returns 0 or VL_EINVAL naming the field. */
int coord_config_parse_split(json_t *root, coord_config *cfg, vl_error *err) VL_MUST_CHECK;

/* The table's hooks (fields.h: a row's get and put), for the rows whose
 * form is more than their type. Readers (config.c): the name's
 * characters, the model object (a GPT's shape or an mlp's own),
 * compression.kind's old "dense", robust.max_norm's "auto", split.cut. */
struct coord_config_field;
int coord_config_get_name(json_t *v, const struct coord_config_field *f, coord_config *cfg,
                          vl_error *err) VL_MUST_CHECK;
int coord_config_get_model(json_t *v, const struct coord_config_field *f, coord_config *cfg,
                           vl_error *err) VL_MUST_CHECK;
int coord_config_get_kind(json_t *v, const struct coord_config_field *f, coord_config *cfg,
                          vl_error *err) VL_MUST_CHECK;
int coord_config_get_max_norm(json_t *v, const struct coord_config_field *f, coord_config *cfg,
                              vl_error *err) VL_MUST_CHECK;
/* split.cut against the model's layers (config_local.c). */
int coord_config_get_split_cut(json_t *v, const struct coord_config_field *f, coord_config *cfg,
                               vl_error *err) VL_MUST_CHECK;
/* Writers (config_json.c): the model object, the data (or a text run's
 * corpus), robust.max_norm. Return 0 or VL_ENOMEM. */
int coord_config_put_model(const coord_config *cfg, json_t *parent, const char *key,
                           int with_paths) VL_MUST_CHECK;
int coord_config_put_data(const coord_config *cfg, json_t *parent, const char *key,
                          int with_paths) VL_MUST_CHECK;
int coord_config_put_max_norm(const coord_config *cfg, json_t *parent, const char *key,
                              int with_paths) VL_MUST_CHECK;

/* The robust rules' names, in coord_rule order, NULL after the last
 * (config_resolve.c). */
extern const char *const coord_rule_names[];

#endif
