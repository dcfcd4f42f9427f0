/* `export`: writes one stored version as a Hugging Face GPT-2 checkpoint
 * directory, model.safetensors and config.json, that
 * transformers.GPT2LMHeadModel.from_pretrained(DIR) loads as it is.
 *
 * The model's tensor table already carries GPT-2's names and layout
 * (Conv1D weights stored [in, out] and used as x @ W; c_attn holds q, k, v
 * side by side, each split into heads of n_embd / n_head columns; the LM
 * head is wte, tied), so the parameters are written unchanged: the file
 * holds the same tensors and metadata as GET /v1/model?version=V, and
 * model_gpt_load_safetensors reads it back bit for bit. What this file adds
 * is config.json and all-or-nothing handling of the output directory:
 * everything that can be refused is checked before anything is written,
 * each file appears by rename, and a failure removes what this export put
 * there. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "coordinator/coord.h"
#include "coordinator/cli/cli.h"
#include "coordinator/config/config.h"
#include "coordinator/run/model_types.h"
#include "coordinator/run/run.h"

/* The tanh form of GELU (kernels/cpu/activations.c) is what transformers
 * calls gelu_new; the LayerNorm epsilon is LN_EPS of
 * kernels/cpu/layernorm.c. Change them with those kernels. */
#define EXPORT_ACTIVATION "gelu_new"
#define EXPORT_LN_EPS 1e-5
/* The weight std of model_gpt_init_weights; transformers only uses it to
 * initialise weights a checkpoint lacks. */
#define EXPORT_INIT_RANGE 0.02
/* With bytes as tokens there is no end-of-text token; byte 0 (NUL), which
 * text never holds, stands in. Omitting them would leave GPT2Config's
 * 50256, outside a byte vocabulary, and break generate(). A model over
 * GPT-2's vocabulary (token shards) has the real one, <|endoftext|>, the
 * token llm.c's shards put between documents. */
#define EXPORT_BOS_EOS 0
#define EXPORT_GPT2_VOCAB 50257
#define EXPORT_GPT2_EOT 50256

#define EXPORT_MODEL_FILE "model.safetensors"
#define EXPORT_CONFIG_FILE "config.json"

int coord_load_version(const char *db_path, int64_t *version, coord_config *cfg, model_gpt **gpt,
                       double *val_loss, vl_error *err) {
    storage *db = NULL;
    storage_run run;
    memset(&run, 0, sizeof run);
    storage_version v;
    memset(&v, 0, sizeof v);
    *gpt = NULL;
    int rc = storage_open(db_path, 0, &db, err);
    if (rc != VL_OK) return rc;
    rc = storage_run_get(db, &run, err);
    if (rc != VL_OK) goto out;
    vl_error cerr = {0};
    rc = coord_config_parse_stored(run.config, cfg, &cerr);
    if (rc != VL_OK) {
        rc = vl_fail(err, rc, "the stored run configuration is invalid: %s", cerr.msg);
        goto out;
    }
    /* An export reads no data: the shard paths go now, the rest stays. */
    coord_config_free(cfg);
    if (cfg->net != COORD_NET_GPT) {
        rc = vl_fail(err, VL_EINVAL,
                     "run \"%s\" trains an mlp classifier; export and sample "
                     "are for GPT runs (GET /v1/model serves its versions)",
                     cfg->name);
        goto out;
    }
    if (*version < 0) *version = run.current_version;
    if (*version > run.current_version) {
        rc = vl_fail(err, VL_ENOTFOUND, "version %lld was never made (the current one is %lld)",
                     (long long)*version, (long long)run.current_version);
        goto out;
    }
    rc = storage_version_get(db, *version, 1, &v, err);
    if (rc == VL_ENOTFOUND)
        rc = vl_fail(err, rc, "version %lld was never made (the current one is %lld)",
                     (long long)*version, (long long)run.current_version);
    if (rc != VL_OK) goto out;
    if (!v.params) {
        rc = vl_fail(err, VL_ENOTFOUND,
                     "version %lld is no longer retained (the newest %lld are kept; the current "
                     "one is %lld)",
                     (long long)*version, (long long)cfg->keep_versions,
                     (long long)run.current_version);
        goto out;
    }
    rc = model_gpt_create(&cfg->model, gpt, err);
    if (rc != VL_OK) goto out;
    if (v.n != model_gpt_num_params(*gpt)) {
        rc = vl_fail(err, VL_EDB, "version %lld holds %zu parameters, the run's model %zu",
                     (long long)*version, v.n, model_gpt_num_params(*gpt));
        goto out;
    }
    memcpy(model_gpt_params(*gpt), v.params, v.n * sizeof(float));
    if (val_loss) *val_loss = v.val_loss;
out:
    if (rc != VL_OK) {
        model_gpt_free(*gpt);
        *gpt = NULL;
    }
    storage_version_free(&v);
    storage_run_free(&run);
    storage_close(db);
    return rc;
}

/* config.json for transformers' GPT2Config, 2-space indented. Returns a
 * heap string the caller frees, or NULL when out of memory. */
static char *build_config_json(const model_gpt_config *m) {
    int eot = m->vocab_size == EXPORT_GPT2_VOCAB ? EXPORT_GPT2_EOT : EXPORT_BOS_EOS;
    json_t *o = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:n, s:s, s:f, s:f, s:f, s:f, s:f, s:b, "
        "s:b, s:i, s:i, s:s}",
        "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "vocab_size", m->vocab_size,
        "n_positions", m->block_size, "n_ctx", m->block_size, "n_embd", m->n_embd, "n_layer",
        m->n_layer, "n_head", m->n_head, "n_inner", "activation_function", EXPORT_ACTIVATION,
        "layer_norm_epsilon", EXPORT_LN_EPS, "resid_pdrop", 0.0, "embd_pdrop", 0.0, "attn_pdrop",
        0.0, "initializer_range", EXPORT_INIT_RANGE, "scale_attn_weights", 1, "tie_word_embeddings",
        1, "bos_token_id", eot, "eos_token_id", eot, "torch_dtype", "float32");
    if (!o) return NULL;
    /* Nine digits print 1e-05 and 0.02 as such rather than as the nearest
     * doubles' 17-digit expansions; they read back as the same doubles. */
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (!s) return NULL;
    size_t len = strlen(s);
    char *nl = realloc(s, len + 2);
    if (!nl) {
        free(s);
        return NULL;
    }
    nl[len] = '\n';
    nl[len + 1] = '\0';
    return nl;
}

/* Sets *exists and *empty for the output directory; a path that exists
 * but is not a directory is refused. */
static int probe_dir(const char *dir, int *exists, int *empty, vl_error *err) {
    *exists = 0;
    *empty = 1;
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (errno == ENOENT) return VL_OK;
        return vl_fail(err, VL_EIO, "%s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) return vl_fail(err, VL_EINVAL, "%s is not a directory", dir);
    *exists = 1;
    DIR *d = opendir(dir);
    if (!d) return vl_fail(err, VL_EIO, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    while (*empty && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) *empty = 0;
    closedir(d);
    return VL_OK;
}

static int join_path(char *out, size_t cap, const char *dir, const char *file, vl_error *err) {
    int n = snprintf(out, cap, "%s/%s", dir, file);
    if (n < 0 || (size_t)n >= cap) return vl_fail(err, VL_EINVAL, "output path too long: %s", dir);
    return VL_OK;
}

int coord_cmd_export(const char *db_path, int64_t version, const char *out_dir, int force,
                     int64_t *exported, vl_error *err) {
    if (!out_dir || !out_dir[0]) return vl_fail(err, VL_EINVAL, "no output directory");
    char model_path[COORD_PATH_MAX], config_path[COORD_PATH_MAX];
    int rc = join_path(model_path, sizeof model_path, out_dir, EXPORT_MODEL_FILE, err);
    if (rc == VL_OK)
        rc = join_path(config_path, sizeof config_path, out_dir, EXPORT_CONFIG_FILE, err);
    if (rc != VL_OK) return rc;
    /* Refusals that need no database come first, and nothing is created
     * until the model is in memory. */
    int exists = 0, empty = 1;
    rc = probe_dir(out_dir, &exists, &empty, err);
    if (rc != VL_OK) return rc;
    if (exists && !empty && !force)
        return vl_fail(err, VL_ECONFLICT,
                       "%s is not empty; refusing to export into it "
                       "(--force overwrites %s and %s)",
                       out_dir, EXPORT_MODEL_FILE, EXPORT_CONFIG_FILE);

    coord_config cfg;
    model_gpt *gpt = NULL;
    char *config_json = NULL;
    int made_dir = 0, wrote_model = 0;
    double val_loss = NAN;
    rc = coord_load_version(db_path, &version, &cfg, &gpt, &val_loss, err);
    if (rc != VL_OK) return rc;
    /* The data block is 4 bytes a parameter; the header stays under
     * ST_MAX_HEADER, so this cap never cuts a valid file short. */
    size_t n = model_gpt_num_params(gpt);
    vl_buf file;
    vl_buf_init(&file, n * sizeof(float) + ST_MAX_HEADER + 64);
    coord_model net = {.gpt = gpt};
    rc = coord_model_file(&cfg, &net, version, val_loss, &file, err);
    model_gpt_free(gpt);
    if (rc == VL_OK && !(config_json = build_config_json(&cfg.model)))
        rc = vl_fail(err, VL_ENOMEM, "out of memory");
    if (rc != VL_OK) goto out;

    if (!exists) {
        if (mkdir(out_dir, 0755) != 0) {
            rc = vl_fail(err, VL_EIO, "cannot create %s: %s", out_dir, strerror(errno));
            goto out;
        }
        made_dir = 1;
    }
    rc = vl_file_write_atomic(model_path, file.data, file.len, 0644, err);
    wrote_model = rc == VL_OK;
    if (rc == VL_OK)
        rc = vl_file_write_atomic(config_path, config_json, strlen(config_json), 0644, err);
    if (rc != VL_OK) {
        /* A half export is worse than none: a model without its config (or
         * the other way round) loads as something else or not at all. */
        if (wrote_model) unlink(model_path);
        if (made_dir) rmdir(out_dir);
        goto out;
    }
    if (exported) *exported = version;
    vl_log_info("exported version %lld of run \"%s\" to %s (%zu parameters)", (long long)version,
                cfg.name, out_dir, n);
out:
    free(config_json);
    vl_buf_free(&file);
    return rc;
}
