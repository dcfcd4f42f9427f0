/* coordinator export and sample: a run made by `init` on a small corpus, with a few
 * more versions committed (the oldest pruned), exported as a Hugging Face
 * GPT-2 directory. The checks hold the file to GPT-2's names, shapes and
 * dtype as transformers expects them (written out here, not taken from the
 * model's table), read config.json back, load the export into a volley
 * model and compare the loss on a fixed batch, and make sure every
 * refusal leaves nothing behind. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "test_util.h"
#include "coordinator/coord.h"
#include "coordinator/cli/cli.h"
#include "coordinator/config/config.h"

#define V_SIZE 256
#define BLOCK 16
#define LAYERS 2
#define HEADS 2
#define EMBD 16
#define KEEP 2    /* keep_versions: committing version 3 prunes 0 and 1 */
#define CURRENT 3 /* the versions are 0 (init) .. CURRENT */
#define BATCH 4

typedef struct fixture {
    char *dir;
    char db[512];
} fixture;

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* Version v's parameters: version 0's plus noise, so every version differs. */
static void commit_version(storage *st, const float *base, size_t n, int64_t v) {
    float *p = random_vec(n, 1000 + (uint64_t)v);
    for (size_t i = 0; i < n; i++) p[i] = base[i] + 0.01f * p[i];
    storage_version ver = {.version = v,
                           .created_at = 100 + v,
                           .params = p,
                           .n = n,
                           .val_loss = 2.0 + 0.25 * (double)v,
                           .train_loss = NAN};
    storage_commit_opts o = {.keep_versions = KEEP, .keep_changes = 100, .keep_update_blobs = KEEP};
    OK(storage_version_commit(st, &ver, NULL, 0, &o, &e_));
    free(p);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = test_temp_dir("/tmp/volley-test-export-XXXXXX");
    char path[512];
    /* Letters and spaces from the rng: enough bytes for the tasks and the
     * validation windows, and every byte a valid token. */
    size_t len = 40000;
    char *text = malloc(len + 1);
    assert_non_null(text);
    vl_rng r;
    vl_rng_seed(&r, 5);
    for (size_t i = 0; i < len; i++) {
        unsigned k = (unsigned)(vl_rng_uniform(&r) * 27.0f);
        text[i] = k >= 26 ? ' ' : (char)('a' + k);
    }
    text[len] = '\0';
    snprintf(path, sizeof path, "%s/corpus.txt", f->dir);
    write_text(path, text);
    free(text);
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"name\": \"exp\", \"corpus\": \"corpus.txt\", \"seed\": 3, \"model\": "
             "{\"vocab_size\": %d, \"block_size\": %d, \"n_layer\": %d, \"n_head\": %d, "
             "\"n_embd\": %d}, \"task_bytes\": 1024, \"val_batches\": 2, "
             "\"keep_versions\": %d, \"max_body_bytes\": 4194304}",
             V_SIZE, BLOCK, LAYERS, HEADS, EMBD, KEEP);
    snprintf(path, sizeof path, "%s/run.json", f->dir);
    write_text(path, cfg);
    snprintf(f->db, sizeof f->db, "%s/run.db", f->dir);
    OK(coord_cmd_init(f->db, path, &e_));

    storage *st = NULL;
    OK(storage_open(f->db, 0, &st, &e_));
    storage_version v0;
    OK(storage_version_get(st, 0, 1, &v0, &e_));
    assert_non_null(v0.params);
    for (int64_t v = 1; v <= CURRENT; v++) commit_version(st, v0.params, v0.n, v);
    storage_version_free(&v0);
    storage_close(st);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    test_remove_tree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

/* Names in out_dir other than "." and "..", joined by spaces in directory
 * order, or "-" when out_dir does not exist. */
static void list_dir(const char *dir, char *out, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(out, cap, "-");
        return;
    }
    out[0] = '\0';
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s%s", len ? " " : "", e->d_name);
    }
    closedir(d);
}

static int path_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* Stored parameters of version v (the caller frees them). */
static float *stored_params(const fixture *f, int64_t v, size_t *n) {
    storage *st = NULL;
    OK(storage_open(f->db, 0, &st, &e_));
    storage_version ver;
    OK(storage_version_get(st, v, 1, &ver, &e_));
    storage_close(st);
    assert_non_null(ver.params);
    float *p = ver.params;
    *n = ver.n;
    ver.params = NULL;
    storage_version_free(&ver);
    return p;
}

/* What transformers' GPT2LMHeadModel expects, written out from its
 * modeling code: Conv1D weights are [in, out]; no lm_head (tied to wte)
 * and no attn.bias mask buffers. */
static void check_hf_tensors(const st_file *sf) {
    const size_t C = EMBD;
    struct {
        const char *suffix;
        int ndim;
        size_t d0, d1;
    } per_layer[] = {
        {"ln_1.weight", 1, C, 0},
        {"ln_1.bias", 1, C, 0},
        {"attn.c_attn.weight", 2, C, 3 * C},
        {"attn.c_attn.bias", 1, 3 * C, 0},
        {"attn.c_proj.weight", 2, C, C},
        {"attn.c_proj.bias", 1, C, 0},
        {"ln_2.weight", 1, C, 0},
        {"ln_2.bias", 1, C, 0},
        {"mlp.c_fc.weight", 2, C, 4 * C},
        {"mlp.c_fc.bias", 1, 4 * C, 0},
        {"mlp.c_proj.weight", 2, 4 * C, C},
        {"mlp.c_proj.bias", 1, C, 0},
    };
    const size_t n_per = sizeof per_layer / sizeof per_layer[0];
    struct {
        const char *name;
        int ndim;
        size_t d0, d1;
    } top[] = {{"wte.weight", 2, V_SIZE, C},
               {"wpe.weight", 2, BLOCK, C},
               {"ln_f.weight", 1, C, 0},
               {"ln_f.bias", 1, C, 0}};
    int seen = 0;
    for (size_t i = 0; i < 4 + LAYERS * n_per; i++) {
        char name[128];
        int ndim;
        size_t d0, d1;
        if (i < 4) {
            snprintf(name, sizeof name, "%s", top[i].name);
            ndim = top[i].ndim, d0 = top[i].d0, d1 = top[i].d1;
        } else {
            size_t l = (i - 4) / n_per, k = (i - 4) % n_per;
            snprintf(name, sizeof name, "h.%zu.%s", l, per_layer[k].suffix);
            ndim = per_layer[k].ndim, d0 = per_layer[k].d0, d1 = per_layer[k].d1;
        }
        const st_tensor *t = st_find(sf, name);
        if (!t) fail_msg("tensor %s is missing", name);
        assert_int_equal(t->dtype, ST_F32);
        assert_int_equal(t->ndim, ndim);
        assert_int_equal(t->shape[0], d0);
        if (ndim == 2) assert_int_equal(t->shape[1], d1);
        seen++;
    }
    assert_int_equal(sf->ntensors, seen);
    assert_null(st_find(sf, "lm_head.weight"));
    assert_null(st_find(sf, "h.0.attn.bias"));
    assert_string_equal(st_meta_get(sf, "format"), "pt");
}

static void check_config_json(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *c = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!c) fail_msg("config.json: %s", je.text);
    assert_string_equal(json_string_value(json_object_get(c, "model_type")), "gpt2");
    json_t *arch = json_object_get(c, "architectures");
    assert_int_equal(json_array_size(arch), 1);
    assert_string_equal(json_string_value(json_array_get(arch, 0)), "GPT2LMHeadModel");
    struct {
        const char *key;
        json_int_t want;
    } ints[] = {{"vocab_size", V_SIZE}, {"n_positions", BLOCK}, {"n_ctx", BLOCK},
                {"n_embd", EMBD},       {"n_layer", LAYERS},    {"n_head", HEADS},
                {"bos_token_id", 0},    {"eos_token_id", 0}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        json_t *v = json_object_get(c, ints[i].key);
        if (!json_is_integer(v)) fail_msg("config.json: %s is not an integer", ints[i].key);
        assert_int_equal(json_integer_value(v), ints[i].want);
    }
    /* The tanh GELU of kernels/cpu/activations.c and LN_EPS of
     * kernels/cpu/layernorm.c. */
    assert_string_equal(json_string_value(json_object_get(c, "activation_function")), "gelu_new");
    assert_true(json_is_real(json_object_get(c, "layer_norm_epsilon")));
    assert_true(json_real_value(json_object_get(c, "layer_norm_epsilon")) == 1e-5);
    const char *drop[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(c, drop[i]);
        assert_true(json_is_number(v));
        assert_true(json_number_value(v) == 0.0);
    }
    assert_true(json_is_true(json_object_get(c, "tie_word_embeddings")));
    json_decref(c);
    /* Two-space indentation, as transformers writes it. */
    vl_buf text;
    vl_buf_init(&text, 1 << 16);
    OK(vl_buf_read_file(&text, path, &e_));
    assert_non_null(strstr((const char *)text.data, "{\n  \"architectures\": ["));
    vl_buf_free(&text);
}

/* Mean loss of params on a fixed batch of the corpus. */
static float batch_loss(model_gpt *m, const fixture *f) {
    char path[600];
    snprintf(path, sizeof path, "%s/corpus.txt", f->dir);
    vl_buf corpus;
    vl_buf_init(&corpus, 1 << 20);
    OK(vl_buf_read_file(&corpus, path, &e_));
    int in[BATCH * BLOCK], tg[BATCH * BLOCK];
    vl_rng r;
    vl_rng_seed(&r, 99);
    OK(model_data_sample(corpus.data, corpus.len, BATCH, BLOCK, &r, in, tg, &e_));
    vl_buf_free(&corpus);
    float loss = NAN;
    OK(model_gpt_forward(m, in, tg, BATCH, BLOCK, &loss, &e_));
    assert_true(isfinite(loss));
    return loss;
}

/* Exports version v into out (must succeed), then checks the file and
 * that it loads back into the exact stored parameters and loss. */
static void export_and_check(const fixture *f, int64_t v, const char *out) {
    int64_t got = -2;
    OK(coord_cmd_export(f->db, v, out, 0, &got, &e_));
    int64_t want = v < 0 ? CURRENT : v;
    assert_int_equal(got, want);

    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    vl_buf file;
    vl_buf_init(&file, 1 << 26);
    OK(vl_buf_read_file(&file, path, &e_));
    st_file sf;
    OK(st_parse(file.data, file.len, &sf, &e_));
    check_hf_tensors(&sf);
    char vstr[24];
    snprintf(vstr, sizeof vstr, "%lld", (long long)want);
    assert_string_equal(st_meta_get(&sf, "version"), vstr);
    /* The version's validation loss travels with it, in nats and bits. */
    char nats[32], bits[32];
    snprintf(nats, sizeof nats, "%.6f", 2.0 + 0.25 * (double)want);
    snprintf(bits, sizeof bits, "%.6f", (2.0 + 0.25 * (double)want) / M_LN2);
    assert_string_equal(st_meta_get(&sf, "val_loss"), nats);
    assert_string_equal(st_meta_get(&sf, "val_bits_per_byte"), bits);
    check_config_json(out);

    /* volley reads its export back: configuration from the metadata, then
     * the tensors by name (the layout is volley's own, no transposes). */
    model_gpt_config cfg;
    OK(model_gpt_config_from_safetensors(&sf, &cfg, &e_));
    assert_int_equal(cfg.vocab_size, V_SIZE);
    assert_int_equal(cfg.block_size, BLOCK);
    assert_int_equal(cfg.n_layer, LAYERS);
    assert_int_equal(cfg.n_head, HEADS);
    assert_int_equal(cfg.n_embd, EMBD);
    model_gpt *loaded = NULL, *orig = NULL;
    OK(model_gpt_create(&cfg, &loaded, &e_));
    OK(model_gpt_load_safetensors(loaded, &sf, &e_));
    st_free(&sf);
    vl_buf_free(&file);

    size_t n = 0;
    float *p = stored_params(f, want, &n);
    OK(model_gpt_create(&cfg, &orig, &e_));
    assert_int_equal(n, model_gpt_num_params(orig));
    memcpy(model_gpt_params(orig), p, n * sizeof(float));
    free(p);
    assert_memory_equal(model_gpt_params(loaded), model_gpt_params(orig), n * sizeof(float));
    float lo = batch_loss(orig, f), ll = batch_loss(loaded, f);
    assert_true(lo == ll);
    model_gpt_free(loaded);
    model_gpt_free(orig);
}

static void test_export_current(void **state) {
    fixture *f = *state;
    char out[600], names[256];
    snprintf(out, sizeof out, "%s/current", f->dir);
    export_and_check(f, -1, out);
    list_dir(out, names, sizeof names);
    /* Exactly the two files: temp files were renamed, not left. */
    assert_true(!strcmp(names, "model.safetensors config.json") ||
                !strcmp(names, "config.json model.safetensors"));
}

static void test_export_older_into_empty_dir(void **state) {
    fixture *f = *state;
    char out[600];
    snprintf(out, sizeof out, "%s/older", f->dir);
    assert_int_equal(mkdir(out, 0755), 0);
    export_and_check(f, CURRENT - 1, out);
}

static void expect_refusal(const fixture *f, const char *db, int64_t v, const char *out, int force,
                           int code, const char *msg_part) {
    vl_error e = {0};
    int64_t got = -7;
    assert_int_equal(coord_cmd_export(db, v, out, force, &got, &e), code);
    if (!strstr(e.msg, msg_part)) fail_msg("message '%s' lacks '%s'", e.msg, msg_part);
    assert_int_equal(got, -7);
    (void)f;
}

static void test_refusals(void **state) {
    fixture *f = *state;
    char out[600], names[256];
    snprintf(out, sizeof out, "%s/refused", f->dir);
    /* Pruned and never made: the directory is not even created. */
    expect_refusal(f, f->db, 0, out, 0, VL_ENOTFOUND, "no longer retained");
    expect_refusal(f, f->db, CURRENT + 1, out, 0, VL_ENOTFOUND, "never made");
    assert_false(path_exists(out));
    /* A missing database is not created by looking at it. */
    char nodb[600];
    snprintf(nodb, sizeof nodb, "%s/none.db", f->dir);
    expect_refusal(f, nodb, -1, out, 1, VL_ENOTFOUND, "does not exist");
    assert_false(path_exists(nodb));
    assert_false(path_exists(out));
    /* A parent that does not exist is not made. */
    char deep[700];
    snprintf(deep, sizeof deep, "%s/no/such", f->dir);
    expect_refusal(f, f->db, -1, deep, 0, VL_EIO, "cannot create");

    /* A directory with something in it needs --force, which leaves the
     * other files alone. */
    assert_int_equal(mkdir(out, 0755), 0);
    char keep[700];
    snprintf(keep, sizeof keep, "%s/notes.txt", out);
    write_text(keep, "mine\n");
    expect_refusal(f, f->db, -1, out, 0, VL_ECONFLICT, "not empty");
    list_dir(out, names, sizeof names);
    assert_string_equal(names, "notes.txt");
    int64_t got = -1;
    OK(coord_cmd_export(f->db, -1, out, 1, &got, &e_));
    assert_int_equal(got, CURRENT);
    assert_true(path_exists(keep));
    /* Once more with --force over an earlier export. */
    OK(coord_cmd_export(f->db, CURRENT - 1, out, 1, &got, &e_));
    assert_int_equal(got, CURRENT - 1);
}

/* A failure after the model file is in place takes it away again: here
 * config.json cannot be renamed into place because a directory holds that
 * name. */
static void test_failure_leaves_nothing(void **state) {
    fixture *f = *state;
    char out[600], blocker[700], inside[800], names[256];
    snprintf(out, sizeof out, "%s/blocked", f->dir);
    snprintf(blocker, sizeof blocker, "%s/config.json", out);
    snprintf(inside, sizeof inside, "%s/x", blocker);
    assert_int_equal(mkdir(out, 0755), 0);
    assert_int_equal(mkdir(blocker, 0755), 0);
    write_text(inside, "x\n");
    vl_error e = {0};
    assert_int_not_equal(coord_cmd_export(f->db, -1, out, 1, NULL, &e), VL_OK);
    list_dir(out, names, sizeof names);
    assert_string_equal(names, "config.json");
    assert_true(path_exists(inside));
}

/* ---- sample: the same stored versions read as text ------------------------------------ */

/* coord_cmd_sample into a string the caller frees. */
static int sample_to(const char *db, int64_t version, const coord_sample_opts *o, char **text,
                     int64_t *got, vl_error *err) {
    size_t len = 0;
    FILE *f = open_memstream(text, &len);
    assert_non_null(f);
    int rc = coord_cmd_sample(db, version, o, f, got, NULL, err);
    assert_int_equal(fclose(f), 0);
    return rc;
}

/* Greedy sampling is the argmax of the model's own logits at every step:
 * with prompt and continuation filling exactly one block, one forward pass
 * over the whole text gives every step's logits, so the loop's windowing
 * and indexing are checked against an independent computation. */
static void test_sample_greedy_is_argmax(void **state) {
    fixture *f = *state;
    coord_sample_opts o = {.prompt = "ab", .tokens = BLOCK - 2, .temperature = 0, .seed = 1};
    char *text = NULL;
    int64_t got = -1;
    OK(sample_to(f->db, -1, &o, &text, &got, &e_));
    assert_int_equal(got, CURRENT);
    coord_config cfg;
    model_gpt *gpt = NULL;
    int64_t v = -1;
    OK(coord_load_version(f->db, &v, &cfg, &gpt, NULL, &e_));
    /* The fixture's model is random: bytes outside printable ASCII come
     * back escaped, so decode what was printed. */
    int toks[BLOCK];
    size_t n = 0;
    for (const char *p = text; *p && *p != '\n' && n < BLOCK;) {
        unsigned b;
        if (p[0] == '\\' && p[1] == 'x' && sscanf(p + 2, "%2x", &b) == 1) {
            toks[n++] = (int)b;
            p += 4;
        } else {
            toks[n++] = (unsigned char)*p++;
        }
    }
    assert_int_equal(n, BLOCK);
    assert_int_equal(toks[0], 'a');
    assert_int_equal(toks[1], 'b');
    OK(model_gpt_forward(gpt, toks, NULL, 1, BLOCK, NULL, &e_));
    const float *logits = model_gpt_output(gpt);
    for (int t = 1; t < BLOCK - 1; t++) {
        const float *l = logits + (size_t)t * V_SIZE;
        int best = 0;
        for (int i = 1; i < V_SIZE; i++)
            if (l[i] > l[best]) best = i;
        assert_int_equal(toks[t + 1], best);
    }
    model_gpt_free(gpt);
    free(text);
}

/* A seed repeats a sample; past one block the window slides; no byte that
 * could drive a terminal is printed raw. */
static void test_sample_seeded_and_safe(void **state) {
    fixture *f = *state;
    coord_sample_opts o = {.prompt = "the ", .tokens = 3 * BLOCK, .temperature = 1.0, .seed = 9};
    char *a = NULL, *b = NULL, *c = NULL;
    OK(sample_to(f->db, CURRENT - 1, &o, &a, NULL, &e_));
    OK(sample_to(f->db, CURRENT - 1, &o, &b, NULL, &e_));
    assert_string_equal(a, b);
    o.seed = 10;
    OK(sample_to(f->db, CURRENT - 1, &o, &c, NULL, &e_));
    assert_string_not_equal(a, c);
    assert_int_equal(strncmp(a, "the ", 4), 0);
    size_t printed = 0; /* bytes, an escape counting one */
    for (const char *p = a; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        assert_true(ch == '\n' || ch == '\t' || (ch >= 0x20 && ch < 0x7f));
        printed++;
        if (ch == '\\') { /* only ever an escape: a backslash byte is one too */
            assert_int_equal(p[1], 'x');
            p += 3;
        }
    }
    assert_int_equal(printed, 4 + 3 * BLOCK + 1); /* prompt, bytes, the final newline */
    free(a), free(b), free(c);
}

static void test_sample_refusals(void **state) {
    fixture *f = *state;
    char *text = NULL;
    coord_sample_opts o = {.prompt = "x", .tokens = 4, .temperature = 0.5, .seed = 1};
    vl_error e = {0};
    assert_int_equal(sample_to(f->db, 0, &o, &text, NULL, &e), VL_ENOTFOUND); /* pruned */
    free(text);
    assert_int_equal(sample_to(f->db, CURRENT + 1, &o, &text, NULL, &e), VL_ENOTFOUND);
    free(text);
    coord_sample_opts bad[] = {
        {.prompt = "", .tokens = 4, .temperature = 0.5},
        {.prompt = "x", .tokens = 0, .temperature = 0.5},
        {.prompt = "x", .tokens = COORD_SAMPLE_MAX_TOKENS + 1, .temperature = 0.5},
        {.prompt = "x", .tokens = 4, .temperature = -0.1},
        {.prompt = "x", .tokens = 4, .temperature = COORD_SAMPLE_MAX_TEMP * 2},
        {.prompt = "x", .tokens = 4, .temperature = NAN},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(sample_to(f->db, -1, &bad[i], &text, NULL, &e), VL_EINVAL);
        assert_string_equal(text, ""); /* refused before writing anything */
        free(text);
    }
}

int main(void) {
    /* Keep init's and export's info lines out of the test output. */
    vl_log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_export_current, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_older_into_empty_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sample_greedy_is_argmax, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sample_seeded_and_safe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sample_refusals, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
