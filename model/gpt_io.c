/* GPT checkpoints as safetensors with Hugging Face GPT-2 tensor names. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt_internal.h"
#include "model/model.h"

int model_gpt_write_safetensors(const model_gpt *m, st_writer *w) {
    return model_tensors_write(m->tensors, m->ntensors, m->params, w);
}

static const char *const CONFIG_KEYS[5] = {"volley.vocab_size", "volley.block_size",
                                           "volley.n_layer", "volley.n_head", "volley.n_embd"};

int model_gpt_write_config_meta(const model_gpt *m, st_writer *w) {
    const int vals[5] = {m->cfg.vocab_size, m->cfg.block_size, m->cfg.n_layer, m->cfg.n_head,
                         m->cfg.n_embd};
    int rc = st_writer_meta(w, "format", "pt");
    for (int i = 0; i < 5 && rc == 0; i++) {
        char v[16];
        snprintf(v, sizeof v, "%d", vals[i]);
        rc = st_writer_meta(w, CONFIG_KEYS[i], v);
    }
    return rc;
}

int model_gpt_config_from_safetensors(const st_file *f, model_gpt_config *cfg, vl_error *err) {
    int64_t v[5];
    for (int i = 0; i < 5; i++) {
        const char *s = st_meta_get(f, CONFIG_KEYS[i]);
        if (s == NULL)
            return vl_fail(err, VL_ENOTFOUND, "gpt checkpoint: metadata %s is missing",
                           CONFIG_KEYS[i]);
        if (vl_parse_i64(s, 1, INT32_MAX, &v[i]) != 0)
            return vl_fail(err, VL_EINVAL, "gpt checkpoint: metadata %s = \"%s\" is not a count",
                           CONFIG_KEYS[i], s);
    }
    model_gpt_config c = {(int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4]};
    int rc = model_gpt_config_validate(&c, err);
    if (rc == 0) *cfg = c;
    return rc;
}

int model_gpt_load_safetensors(model_gpt *m, const st_file *f, vl_error *err) {
    int rc = model_tensors_load(m->tensors, m->ntensors, m->num_params, m->params, f,
                                "gpt checkpoint", err);
    if (rc == 0) {
        m->have_output = 0;
        m->can_backward = 0;
    }
    return rc;
}
