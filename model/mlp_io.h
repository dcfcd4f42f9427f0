/*
 * mlp_io: the MLP classifier as a run's model. A classification run keeps
 * its model in the same safetensors files as a GPT run, so the
 * coordinator's versions, deltas and updates work unchanged; what differs
 * is the configuration those files carry (the JSON object in the `model`
 * metadata, {"kind":"mlp","in_dim":D,"hidden":[h...],"classes":C}, or with
 * a convolution front end {"kind":"mlp","in_dim":D,"image":[C,H,W],
 * "conv":[{"channels":c,"kernel":k,"stride":s},...],"hidden":[h...],
 * "classes":C}) and the optimiser step, which decays the weights (conv
 * weights included) and not the biases as the GPT's does.
 */
#ifndef VOLLEY_MODEL_MLP_IO_H
#define VOLLEY_MODEL_MLP_IO_H

#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parameters of a model of configuration cfg (weights and biases of
 * every layer, conv and dense), without creating one; cfg must be valid. */
size_t model_mlp_config_num_params(const model_mlp_config *cfg);

/* Room for the longest configuration JSON model_mlp_config_json writes for
 * a valid configuration (four conv layers and four hidden layers, every
 * field at its bound, take about 290 bytes). */
#define MODEL_MLP_JSON_MAX 320

/* Writes cfg as the compact JSON object above into out (cap bytes, at
 * least MODEL_MLP_JSON_MAX), keys in the order shown; "image" and "conv"
 * only when n_conv > 0, so a plain MLP's text is unchanged. Returns 0, or
 * VL_EINVAL when it does not fit. */
int model_mlp_config_json(const model_mlp_config *cfg, char *out, size_t cap) VL_MUST_CHECK;

/* Whether the JSON text js (len bytes) is an object whose "kind" is
 * "mlp": what tells a classifier's configuration from a GPT's, which has
 * no kind. Malformed JSON is not an MLP's. */
int model_mlp_config_is_mlp(const char *js, size_t len);

/* Parses and validates (model_mlp_config_validate) a configuration object
 * as written above; unknown keys (at the top and in each conv layer) are
 * refused, "image" and "conv" must come together, and a conv layer's
 * "stride" may be left out for 1. The text may come from the network:
 * every number is range-checked before use. Returns 0 or VL_EINVAL with
 * the field named. */
int model_mlp_config_parse(const char *js, size_t len, model_mlp_config *out,
                           vl_error *err) VL_MUST_CHECK;

/* Appends the configuration as the `model` metadata and every tensor
 * (F32, names conv.<i>.weight / conv.<i>.bias for the conv layers and
 * fc.<l>.weight / fc.<l>.bias for the dense ones, see model.h) to w; the
 * parameters must stay valid until st_writer_finish. Returns 0 or
 * st_writer's error. */
int model_mlp_write_safetensors(const model_mlp *m, st_writer *w) VL_MUST_CHECK;

/* Loads every tensor of f into m's parameters with model_tensors_load's
 * checks (the model is unchanged on failure). The configuration must
 * already match: read it with model_mlp_config_parse first. */
int model_mlp_load_safetensors(model_mlp *m, const st_file *f, vl_error *err) VL_MUST_CHECK;

/* One AdamW step over a tensor table's parameters with the gradients at
 * the same offsets; weight decay on the 2-D tensors only. opt->n must be
 * num_params. Returns 0 or VL_EINVAL. */
int model_adamw_step_tensors(model_adamw *opt, const model_tensor *tensors, int n,
                             size_t num_params, float *params, const float *grads,
                             vl_error *err) VL_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
