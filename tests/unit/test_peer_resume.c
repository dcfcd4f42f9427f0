/* The peer's restart files (peer/resume.c): the trainer state's round trip
 * bit for bit, refusal of every kind of bad file without touching the
 * trainer, the atomic 0600 writes, and the settling of a recorded upload
 * after a restart, all without a network. */
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

#include "peer/peer.h"
#include "peer_fixtures.h"
#include "test_util.h"

/* ---- fixtures ------------------------------------------------------------ */

static const model_gpt_config WIDER = {256, 16, 1, 2, 32};
/* The registration the states belong to, and others. */
static const peer_state OWNER = {
    .coordinator = "https://127.0.0.1:8443", .peer_id = 3, .run = "unit"};
static const peer_state OTHER_RUN = {
    .coordinator = "https://127.0.0.1:8443", .peer_id = 3, .run = "other"};
static const peer_state OTHER_PEER = {
    .coordinator = "https://127.0.0.1:8443", .peer_id = 4, .run = "unit"};
static const peer_state OTHER_COORD = {
    .coordinator = "https://127.0.0.1:9443", .peer_id = 3, .run = "unit"};


static void path_of(char *out, const char *dir, const char *file) {
    vl_error e = {0};
    assert_int_equal(peer_path_join(out, PEER_PATH_MAX, dir, file, &e), VL_OK);
}

static int exists(const char *dir, const char *file) {
    char p[PEER_PATH_MAX];
    path_of(p, dir, file);
    struct stat st;
    return lstat(p, &st) == 0;
}

/* The fixtures' task, as a top-k one with a lease. */
static peer_task topk_task(int steps) {
    peer_task t = tiny_task(steps);
    t.task_id = 42;
    t.kind = COMPRESS_TOPK;
    t.method = PEER_METHOD_TOPK;
    t.deadline = 1795000000;
    return t;
}

static compress_update_meta meta_for(const peer_task *k) {
    compress_update_meta m;
    memset(&m, 0, sizeof m);
    snprintf(m.run, sizeof m.run, "%s", k->run);
    m.task = k->task_id;
    m.peer = 1;
    m.kind = k->kind;
    m.num_samples = m.local_steps = 1;
    return m;
}

/* Random delta into t, then one top-k encoding of it into out. */
static void encode_random(peer_trainer *t, const peer_task *k, vl_rng *r, vl_buf *out) {
    for (size_t i = 0; i < t->n_params; i++) t->delta[i] = 0.01f * vl_rng_normal(r);
    compress_update_meta m = meta_for(k);
    vl_error e = {0};
    vl_buf_reset(out);
    assert_int_equal(peer_encode_update(t, k, &m, out, &e), VL_OK);
}

/* A trainer with moments (three steps trained) and a residual (one top-k
 * upload taken out of a random delta). */
static void trained(peer_trainer *t, vl_rng *r) {
    peer_trainer_init(t);
    vl_error e = {0};
    assert_int_equal(peer_trainer_init_model(t, &TINY, 0, &e), VL_OK);
    peer_task k = topk_task(3);
    peer_train_result res;
    assert_int_equal(peer_trainer_run(t, &k, TEXT, 17, &res, &e), VL_OK);
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    k.comp_k = (int64_t)(t->n_params / 20);
    encode_random(t, &k, r, &b);
    vl_buf_free(&b);
    assert_non_null(t->residual);
}

static void assert_empty(const peer_resume *r) {
    assert_int_equal(r->n_params, 0);
    assert_null(r->opt.m);
    assert_null(r->sgd.buf);
    assert_null(r->residual);
    assert_int_equal(r->pending_task, 0);
}

static void read_file(const char *dir, const char *file, vl_buf *b) {
    char p[PEER_PATH_MAX];
    path_of(p, dir, file);
    vl_buf_init(b, VL_BUF_DEFAULT_CAP);
    vl_error e = {0};
    assert_int_equal(vl_buf_read_file(b, p, &e), VL_OK);
}

static void write_file(const char *dir, const char *file, const void *data, size_t len) {
    char p[PEER_PATH_MAX];
    path_of(p, dir, file);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* Offset in the file of tensor name's data. */
static size_t data_offset(const vl_buf *file, const char *name) {
    st_file f;
    vl_error e = {0};
    assert_int_equal(st_parse(file->data, file->len, &f, &e), VL_OK);
    const st_tensor *t = st_find(&f, name);
    assert_non_null(t);
    size_t off = (size_t)(t->data - file->data);
    st_free(&f);
    return off;
}

/* ---- the trainer state -------------------------------------------------- */

static void test_state_round_trip(void **state) {
    (void)state;
    char *dir = test_temp_dir("/tmp/test_peer_resume.XXXXXX");
    vl_rng r;
    vl_rng_seed(&r, 5);
    peer_trainer t;
    trained(&t, &r);
    size_t n = t.n_params;
    vl_error e = {0};
    mode_t old = umask(0);
    assert_int_equal(peer_resume_save_trainer(dir, &t, &OWNER, 0, &e), VL_OK);
    umask(old);

    /* Atomic: only the file itself is left, owner-only whatever the umask. */
    char p[PEER_PATH_MAX];
    path_of(p, dir, PEER_TRAINER_FILE);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int entries = 0;
    for (struct dirent *de; (de = readdir(d));)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            assert_string_equal(de->d_name, PEER_TRAINER_FILE);
            entries++;
        }
    closedir(d);
    assert_int_equal(entries, 1);
    /* A replaced file gets 0600 again, even if someone loosened it. */
    assert_int_equal(chmod(p, 0644), 0);
    assert_int_equal(peer_resume_save_trainer(dir, &t, &OWNER, 0, &e), VL_OK);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    peer_resume s;
    assert_int_equal(peer_resume_load(dir, &OWNER, &s, &e), VL_OK);
    assert_int_equal(s.n_params, n);
    assert_string_equal(s.run, "unit");
    assert_string_equal(s.coordinator, OWNER.coordinator);
    assert_int_equal(s.peer_id, 3);
    assert_int_equal(s.pending_task, 0);
    assert_int_equal(s.opt.step, t.opt.step);
    assert_true(s.opt.step == 3);
    assert_true(s.opt.lr == t.opt.lr && s.opt.beta1 == t.opt.beta1 && s.opt.beta2 == t.opt.beta2 &&
                s.opt.eps == t.opt.eps && s.opt.weight_decay == t.opt.weight_decay);
    assert_memory_equal(s.opt.m, t.opt.m, n * sizeof(float));
    assert_memory_equal(s.opt.v, t.opt.v, n * sizeof(float));
    assert_memory_equal(s.residual, t.residual, n * sizeof(float));

    /* Applied to a fresh trainer of the same shape, the next task trains
     * exactly as it would have in the original process. */
    peer_trainer u;
    peer_trainer_init(&u);
    assert_int_equal(peer_trainer_init_model(&u, &TINY, 0, &e), VL_OK);
    assert_int_equal(peer_resume_apply(&u, &s, &e), VL_OK);
    assert_empty(&s);
    assert_true(u.have_opt);
    assert_int_equal(u.opt.step, 3);
    assert_memory_equal(u.residual, t.residual, n * sizeof(float));
    peer_task k = topk_task(2);
    peer_train_result res;
    assert_int_equal(peer_trainer_run(&t, &k, TEXT, 17, &res, &e), VL_OK);
    assert_int_equal(peer_trainer_run(&u, &k, TEXT, 17, &res, &e), VL_OK);
    assert_memory_equal(u.delta, t.delta, n * sizeof(float));
    assert_memory_equal(u.opt.m, t.opt.m, n * sizeof(float));
    assert_int_equal(u.opt.step, 5);

    /* A model that never trained: no moments, no residual, a marker. */
    peer_trainer z;
    peer_trainer_init(&z);
    assert_int_equal(peer_resume_save_trainer(dir, &z, &OWNER, 0, &e), VL_EINVAL);
    assert_int_equal(peer_trainer_init_model(&z, &TINY, 0, &e), VL_OK);
    assert_int_equal(peer_resume_save_trainer(dir, &z, &OWNER, 77, &e), VL_OK);
    assert_int_equal(peer_resume_load(dir, &OWNER, &s, &e), VL_OK);
    assert_null(s.opt.m);
    assert_null(s.residual);
    assert_int_equal(s.pending_task, 77);
    peer_resume_free(&s);

    /* No file: VL_ENOTFOUND, and a quiet fresh start. */
    assert_int_equal(unlink(p), 0);
    assert_int_equal(peer_resume_load(dir, &OWNER, &s, &e), VL_ENOTFOUND);
    assert_empty(&s);
    peer_pending q;
    assert_int_equal(peer_resume_open(dir, &OWNER, &s, &q, &e), VL_OK);
    assert_empty(&s);
    assert_int_equal(q.task_id, 0);
    peer_trainer_free(&z);
    peer_trainer_free(&u);
    peer_trainer_free(&t);
    test_remove_tree(dir);
    free(dir);
}

/* Writes a state file by hand: the standard metadata for TINY with key set
 * to value ("" drops a standard key), and the tensors given. */
typedef struct hand_tensor {
    const char *name;
    st_dtype dtype;
    uint64_t numel;
} hand_tensor;

static void hand_state(const char *dir, const char *key, const char *value, const hand_tensor *ts,
                       int nt) {
    static const char *KEYS[][2] = {
        {"format", "volley-peer-state"},
        {"format_version", "1"},
        {"run", "unit"},
        {"coordinator", "https://127.0.0.1:8443"},
        {"peer", "3"},
        {"model", "{\"vocab_size\":256,\"block_size\":16,\"n_layer\":1,\"n_head\":2,"
                  "\"n_embd\":16}"},
        {"params", NULL},
        {"adam_step", "3"},
        {"adam_lr", "0.01"},
        {"adam_beta1", "0.9"},
        {"adam_beta2", "0.95"},
        {"adam_eps", "1e-08"},
        {"adam_weight_decay", "0"}};
    char params[32];
    snprintf(params, sizeof params, "%zu", model_gpt_config_num_params(&TINY));
    st_writer w;
    st_writer_init(&w);
    int overridden = 0;
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++) {
        const char *v = KEYS[i][1] ? KEYS[i][1] : params;
        if (key && !strcmp(key, KEYS[i][0])) {
            v = value;
            overridden = 1;
        }
        if (*v) assert_int_equal(st_writer_meta(&w, KEYS[i][0], v), VL_OK);
    }
    if (key && !overridden) assert_int_equal(st_writer_meta(&w, key, value), VL_OK);
    void *blobs[8];
    for (int i = 0; i < nt; i++) {
        size_t nb = ts[i].numel * st_dtype_size(ts[i].dtype);
        blobs[i] = calloc(nb ? nb : 1, 1);
        assert_non_null(blobs[i]);
        uint64_t shape[1] = {ts[i].numel};
        assert_int_equal(st_writer_add(&w, ts[i].name, ts[i].dtype, 1, shape, blobs[i], nb), VL_OK);
    }
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    vl_error e = {0};
    assert_int_equal(st_writer_finish(&w, &b, &e), VL_OK);
    st_writer_free(&w);
    for (int i = 0; i < nt; i++) free(blobs[i]);
    write_file(dir, PEER_TRAINER_FILE, b.data, b.len);
    vl_buf_free(&b);
}

/* Loads the state in dir, which must be refused with rc, and checks that
 * `run` would start fresh from it. */
static void refused(const char *dir, const peer_state *run, int rc, const char *needle) {
    peer_resume s;
    peer_pending q;
    vl_error e = {0};
    assert_int_equal(peer_resume_load(dir, run, &s, &e), rc);
    assert_empty(&s);
    if (!strstr(e.msg, needle)) fail_msg("message '%s' lacks '%s'", e.msg, needle);
    assert_non_null(strstr(e.msg, PEER_TRAINER_FILE));
    assert_int_equal(peer_resume_open(dir, run, &s, &q, &e), VL_OK);
    assert_empty(&s);
    assert_int_equal(q.task_id, 0);
}

static void test_state_refused(void **state) {
    (void)state;
    char *dir = test_temp_dir("/tmp/test_peer_resume.XXXXXX");
    vl_rng r;
    vl_rng_seed(&r, 6);
    peer_trainer t;
    trained(&t, &r);
    size_t n = t.n_params;
    vl_error e = {0};
    assert_int_equal(peer_resume_save_trainer(dir, &t, &OWNER, 0, &e), VL_OK);
    vl_buf good;
    read_file(dir, PEER_TRAINER_FILE, &good);
    vl_buf bad;
    vl_buf_init(&bad, VL_BUF_DEFAULT_CAP);
#define WITH_GOOD() \
    (vl_buf_reset(&bad), assert_int_equal(vl_buf_append(&bad, good.data, good.len), 0))

    /* Cut short, anywhere. */
    write_file(dir, PEER_TRAINER_FILE, good.data, good.len / 2);
    refused(dir, &OWNER, VL_EINVAL, "");
    write_file(dir, PEER_TRAINER_FILE, good.data, 5);
    refused(dir, &OWNER, VL_EINVAL, "truncated");
    write_file(dir, PEER_TRAINER_FILE, good.data, 0);
    refused(dir, &OWNER, VL_EINVAL, "truncated");
    /* A damaged header. */
    WITH_GOOD();
    bad.data[9] = '!';
    write_file(dir, PEER_TRAINER_FILE, bad.data, bad.len);
    refused(dir, &OWNER, VL_EINVAL, "");
    /* Non-finite values, and a negative second moment. */
    const float nan = NAN, neg = -1.0f;
    WITH_GOOD();
    memcpy(bad.data + data_offset(&good, "residual") + 4 * (n / 2), &nan, 4);
    write_file(dir, PEER_TRAINER_FILE, bad.data, bad.len);
    refused(dir, &OWNER, VL_ERANGE, "residual");
    WITH_GOOD();
    memcpy(bad.data + data_offset(&good, "adam.m") + 4 * (n - 1), &nan, 4);
    write_file(dir, PEER_TRAINER_FILE, bad.data, bad.len);
    refused(dir, &OWNER, VL_ERANGE, "adam.m");
    WITH_GOOD();
    memcpy(bad.data + data_offset(&good, "adam.v"), &neg, 4);
    write_file(dir, PEER_TRAINER_FILE, bad.data, bad.len);
    refused(dir, &OWNER, VL_ERANGE, "adam.v");
    /* Another run's state. */
    write_file(dir, PEER_TRAINER_FILE, good.data, good.len);
    refused(dir, &OTHER_RUN, VL_ECONFLICT, "run 'other'");
    refused(dir, &OTHER_PEER, VL_ECONFLICT, "peer 4");
    refused(dir, &OTHER_COORD, VL_ECONFLICT, "9443");

    /* Hand-made files, each wrong in one way. */
    hand_tensor ok[3] = {{"adam.m", ST_F32, n}, {"adam.v", ST_F32, n}, {"residual", ST_F32, n}};
    hand_state(dir, NULL, NULL, ok, 3);
    peer_resume s;
    assert_int_equal(peer_resume_load(dir, &OWNER, &s, &e), VL_OK); /* the baseline loads */
    peer_resume_free(&s);
    /* One metadata field set wrong, and what the message must name. */
    static const char *const bad_meta[][3] = {
        {"format_version", "2", "format_version"},
        {"peer", "", "peer"},
        {"format", "volley-peer-pending", "format"},
        {"model", "", "model"},
        {"model", "{\"vocab_size\":256}", "block_size"},
        {"params", "12", "params"},
        {"adam_step", "-1", "adam_step"},
        {"adam_beta2", "nan", "adam_beta2"},
        {"adam_lr", "-1", "AdamW"},
        {"pending_task", "0", "pending_task"},
    };
    for (size_t i = 0; i < sizeof bad_meta / sizeof bad_meta[0]; i++) {
        hand_state(dir, bad_meta[i][0], bad_meta[i][1], ok, 3);
        refused(dir, &OWNER, VL_EINVAL, bad_meta[i][2]);
    }
    hand_tensor short_m[2] = {{"adam.m", ST_F32, n - 1}, {"adam.v", ST_F32, n}};
    hand_state(dir, NULL, NULL, short_m, 2);
    refused(dir, &OWNER, VL_EINVAL, "adam.m");
    hand_tensor f16_res[1] = {{"residual", ST_F16, n}};
    hand_state(dir, NULL, NULL, f16_res, 1);
    refused(dir, &OWNER, VL_EINVAL, "residual");
    hand_tensor lone_m[1] = {{"adam.m", ST_F32, n}};
    hand_state(dir, NULL, NULL, lone_m, 1);
    refused(dir, &OWNER, VL_EINVAL, "together");
    hand_tensor extra[2] = {{"residual", ST_F32, n}, {"delta", ST_F32, n}};
    hand_state(dir, NULL, NULL, extra, 2);
    refused(dir, &OWNER, VL_EINVAL, "delta");
    /* Larger than any state of this shape may be: refused unread. */
    hand_tensor huge[2] = {
        {"residual", ST_F32, n},
        {"x", ST_U8, PEER_RESUME_HEADER_ALLOWANCE + PEER_RESUME_BYTES_PER_PARAM * (uint64_t)n}};
    hand_state(dir, NULL, NULL, huge, 2);
    refused(dir, &OWNER, VL_ETOOBIG, "allowed");
    /* Not a file at all. */
    char p[PEER_PATH_MAX];
    path_of(p, dir, PEER_TRAINER_FILE);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkdir(p, 0700), 0);
    refused(dir, &OWNER, VL_EINVAL, "regular");
    assert_int_equal(rmdir(p), 0);

    /* A state for another model shape is not applied: the trainer keeps
     * its fresh optimizer and no residual. */
    write_file(dir, PEER_TRAINER_FILE, good.data, good.len);
    assert_int_equal(peer_resume_load(dir, &OWNER, &s, &e), VL_OK);
    peer_trainer w;
    peer_trainer_init(&w);
    assert_int_equal(peer_resume_apply(&w, &s, &e), VL_EINVAL); /* no model yet: kept */
    assert_int_equal(s.n_params, n);
    assert_int_equal(peer_trainer_init_model(&w, &WIDER, 0, &e), VL_OK);
    assert_int_equal(peer_resume_apply(&w, &s, &e), VL_ECONFLICT);
    assert_non_null(strstr(e.msg, "\"n_embd\":16"));
    assert_empty(&s);
    assert_false(w.have_opt);
    assert_null(w.residual);
    assert_int_equal(peer_resume_apply(&w, &s, &e), VL_OK); /* empty: nothing to do */
    peer_trainer_free(&w);
#undef WITH_GOOD
    vl_buf_free(&bad);
    vl_buf_free(&good);
    peer_trainer_free(&t);
    test_remove_tree(dir);
    free(dir);
}

/* ---- the recorded upload -------------------------------------------------- */

/* A peer training with SGD keeps its momentum across a restart just as
 * with AdamW: the restored trainer's next task is bit for bit the one the
 * original would have trained. */
static void test_sgd_state_round_trip(void **state) {
    (void)state;
    char *dir = test_temp_dir("/tmp/test_peer_resume.XXXXXX");
    vl_error e = {0};
    peer_task k = tiny_task(3);
    k.sgd = 1;
    k.momentum = 0.9;
    k.nesterov = 1;
    peer_trainer t;
    peer_trainer_init(&t);
    assert_int_equal(peer_trainer_init_model(&t, &TINY, 0, &e), VL_OK);
    peer_train_result res;
    assert_int_equal(peer_trainer_run(&t, &k, TEXT, 17, &res, &e), VL_OK);
    assert_true(t.have_sgd && !t.have_opt);
    assert_int_equal(t.sgd.step, 3);
    size_t n = t.n_params;
    assert_int_equal(peer_resume_save_trainer(dir, &t, &OWNER, 0, &e), VL_OK);

    peer_resume s;
    assert_int_equal(peer_resume_load(dir, &OWNER, &s, &e), VL_OK);
    assert_null(s.opt.m);
    assert_non_null(s.sgd.buf);
    assert_int_equal(s.sgd.step, 3);
    assert_true(s.sgd.momentum == t.sgd.momentum && s.sgd.lr == t.sgd.lr && s.sgd.nesterov == 1);
    assert_memory_equal(s.sgd.buf, t.sgd.buf, n * sizeof(float));
    peer_trainer u;
    peer_trainer_init(&u);
    assert_int_equal(peer_trainer_init_model(&u, &TINY, 0, &e), VL_OK);
    assert_int_equal(peer_resume_apply(&u, &s, &e), VL_OK);
    assert_true(u.have_sgd);
    k.steps = k.h_min = 2;
    assert_int_equal(peer_trainer_run(&t, &k, TEXT, 17, &res, &e), VL_OK);
    assert_int_equal(peer_trainer_run(&u, &k, TEXT, 17, &res, &e), VL_OK);
    assert_memory_equal(u.delta, t.delta, n * sizeof(float));
    assert_memory_equal(u.sgd.buf, t.sgd.buf, n * sizeof(float));

    /* Back to AdamW: the SGD state goes, and the file then holds moments. */
    peer_task a = tiny_task(1);
    assert_int_equal(peer_trainer_run(&t, &a, TEXT, 17, &res, &e), VL_OK);
    assert_true(t.have_opt && !t.have_sgd);
    assert_null(t.sgd.buf);

    /* Hand-made files: both optimisers at once, or SGD's vector without
     * its settings. */
    hand_tensor both[3] = {{"adam.m", ST_F32, n}, {"adam.v", ST_F32, n}, {"sgd.buf", ST_F32, n}};
    hand_state(dir, NULL, NULL, both, 3);
    refused(dir, &OWNER, VL_EINVAL, "several optimizers");
    hand_tensor bare[1] = {{"sgd.buf", ST_F32, n}};
    hand_state(dir, NULL, NULL, bare, 1);
    refused(dir, &OWNER, VL_EINVAL, "sgd_lr");
    peer_trainer_free(&t);
    peer_trainer_free(&u);
    test_remove_tree(dir);
    free(dir);
}

static void test_upload_classify(void **state) {
    (void)state;
    assert_int_equal(peer_upload_classify(202, ""), PEER_UPLOAD_STORED);
    assert_int_equal(peer_upload_classify(200, NULL), PEER_UPLOAD_STORED);
    assert_int_equal(peer_upload_classify(409, "duplicate_update"), PEER_UPLOAD_STORED);
    assert_int_equal(peer_upload_classify(409, "stale_update"), PEER_UPLOAD_NOT_TAKEN);
    assert_int_equal(peer_upload_classify(409, "round_not_open"), PEER_UPLOAD_NOT_TAKEN);
    assert_int_equal(peer_upload_classify(404, "unknown_task"), PEER_UPLOAD_NOT_TAKEN);
    assert_int_equal(peer_upload_classify(410, "run_finished"), PEER_UPLOAD_NOT_TAKEN);
    assert_int_equal(peer_upload_classify(422, "non_finite"), PEER_UPLOAD_NOT_TAKEN);
    assert_int_equal(peer_upload_classify(401, NULL), PEER_UPLOAD_NOT_TAKEN);
    assert_int_equal(peer_upload_classify(429, ""), PEER_UPLOAD_UNKNOWN);
    assert_int_equal(peer_upload_classify(503, "draining"), PEER_UPLOAD_UNKNOWN);
    assert_int_equal(peer_upload_classify(204, ""), PEER_UPLOAD_UNKNOWN);
    assert_int_equal(peer_upload_classify(0, ""), PEER_UPLOAD_UNKNOWN);
}

/* What the loop does before POST /v1/updates: encode (taking the sent
 * entries out of the residual), record the upload, save the state naming
 * it. *before gets residual + delta as the encoder saw it. */
static void write_ahead(const char *dir, peer_trainer *t, const peer_task *k, vl_rng *r,
                        vl_buf *upload, float **before) {
    size_t n = t->n_params;
    *before = malloc(n * sizeof **before);
    assert_non_null(*before);
    for (size_t i = 0; i < n; i++) t->delta[i] = 0.01f * vl_rng_normal(r);
    memcpy(*before, t->residual, n * sizeof **before);
    compress_feedback_add(*before, t->delta, n, k->comp_decay);
    compress_update_meta m = meta_for(k);
    vl_error e = {0};
    vl_buf_reset(upload);
    assert_int_equal(peer_encode_update(t, k, &m, upload, &e), VL_OK);
    peer_pending p;
    peer_pending_init(&p);
    p.task_id = k->task_id;
    p.deadline = k->deadline;
    p.kind = k->kind;
    snprintf(p.run, sizeof p.run, "unit");
    p.bytes = upload->data;
    p.len = upload->len;
    assert_int_equal(peer_pending_save(dir, &p, n, &e), VL_OK);
    assert_int_equal(peer_resume_save_trainer(dir, t, &OWNER, k->task_id, &e), VL_OK);
}

/* A refused sparse upload recorded before a kill: after the restart its
 * values go back, so residual + sent is what the encoder started from. */
static void test_pending_refused(void **state) {
    (void)state;
    for (int f16 = 0; f16 < 2; f16++) {
        char *dir = test_temp_dir("/tmp/test_peer_resume.XXXXXX");
        vl_rng r;
        vl_rng_seed(&r, 8 + (uint64_t)f16);
        peer_trainer t;
        trained(&t, &r);
        size_t n = t.n_params;
        peer_task k = topk_task(2);
        k.comp_k = (int64_t)(n / 10);
        k.dtype = f16 ? ST_F16 : ST_F32;
        vl_buf up;
        vl_buf_init(&up, VL_BUF_DEFAULT_CAP);
        float *before;
        write_ahead(dir, &t, &k, &r, &up, &before);
        char p[PEER_PATH_MAX];
        path_of(p, dir, PEER_PENDING_FILE);
        struct stat st;
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);

        /* The restart. */
        peer_resume s;
        peer_pending q;
        vl_error e = {0};
        assert_int_equal(peer_resume_open(dir, &OWNER, &s, &q, &e), VL_OK);
        assert_int_equal(s.pending_task, 42);
        assert_int_equal(q.task_id, 42);
        assert_int_equal(q.deadline, 1795000000);
        assert_int_equal(q.kind, COMPRESS_TOPK);
        assert_string_equal(q.run, "unit");
        assert_int_equal(q.len, up.len);
        assert_memory_equal(q.bytes, up.data, up.len);
        assert_memory_equal(s.residual, t.residual, n * sizeof(float));

        /* An answer that says nothing changes nothing. */
        peer_upload_outcome out;
        assert_int_equal(peer_pending_settle(&s, &q, 503, "", &out, &e), VL_OK);
        assert_int_equal(out, PEER_UPLOAD_UNKNOWN);
        assert_int_equal(s.pending_task, 42);
        assert_memory_equal(s.residual, t.residual, n * sizeof(float));

        assert_int_equal(peer_pending_settle(&s, &q, 409, "stale_update", &out, &e), VL_OK);
        assert_int_equal(out, PEER_UPLOAD_NOT_TAKEN);
        assert_int_equal(s.pending_task, 0);
        assert_memory_equal(s.residual, before, n * sizeof(float));
        /* The same as the running process would have done. */
        peer_encode_unsent(&t);
        assert_memory_equal(t.residual, before, n * sizeof(float));

        /* Saved, then the record cleared: a second restart finds the
         * entries back and nothing to send. */
        assert_int_equal(peer_resume_save(dir, &s, &e), VL_OK);
        assert_int_equal(peer_pending_clear(dir, &e), VL_OK);
        assert_false(exists(dir, PEER_PENDING_FILE));
        assert_int_equal(peer_pending_clear(dir, &e), VL_OK); /* already gone: fine */
        peer_pending_free(&q);
        peer_resume_free(&s);
        assert_int_equal(peer_resume_open(dir, &OWNER, &s, &q, &e), VL_OK);
        assert_int_equal(q.task_id, 0);
        assert_int_equal(s.pending_task, 0);
        assert_memory_equal(s.residual, before, n * sizeof(float));
        peer_resume_free(&s);
        free(before);
        vl_buf_free(&up);
        peer_trainer_free(&t);
        test_remove_tree(dir);
        free(dir);
    }
}

static void test_pending_accepted(void **state) {
    (void)state;
    const char *codes[2] = {"", "duplicate_update"};
    const long statuses[2] = {202, 409};
    for (int c = 0; c < 2; c++) {
        char *dir = test_temp_dir("/tmp/test_peer_resume.XXXXXX");
        vl_rng r;
        vl_rng_seed(&r, 20 + (uint64_t)c);
        peer_trainer t;
        trained(&t, &r);
        size_t n = t.n_params;
        peer_task k = topk_task(2);
        k.comp_k = (int64_t)(n / 10);
        vl_buf up;
        vl_buf_init(&up, VL_BUF_DEFAULT_CAP);
        float *before;
        write_ahead(dir, &t, &k, &r, &up, &before);
        peer_resume s;
        peer_pending q;
        vl_error e = {0};
        assert_int_equal(peer_resume_open(dir, &OWNER, &s, &q, &e), VL_OK);
        peer_upload_outcome out;
        assert_int_equal(peer_pending_settle(&s, &q, statuses[c], codes[c], &out, &e), VL_OK);
        assert_int_equal(out, PEER_UPLOAD_STORED);
        assert_int_equal(s.pending_task, 0);
        /* Stored: the residual stays without the sent entries. */
        assert_memory_equal(s.residual, t.residual, n * sizeof(float));
        assert_int_equal(peer_pending_clear(dir, &e), VL_OK);
        peer_pending_free(&q);
        peer_resume_free(&s);
        /* trainer.st still names task 42, but with its record gone that
         * means settled: nothing is sent again. */
        assert_int_equal(peer_resume_open(dir, &OWNER, &s, &q, &e), VL_OK);
        assert_int_equal(q.task_id, 0);
        assert_int_equal(s.pending_task, 0);
        assert_memory_equal(s.residual, t.residual, n * sizeof(float));
        peer_resume_free(&s);
        free(before);
        vl_buf_free(&up);
        peer_trainer_free(&t);
        test_remove_tree(dir);
        free(dir);
    }
}

/* Records that must not be sent: never named by the state, named by no
 * usable state, not the one named, or damaged. Each is removed and the
 * state is kept as saved. A dense record refused leaves nothing to put
 * back. */
static void test_pending_unusable(void **state) {
    (void)state;
    char *dir = test_temp_dir("/tmp/test_peer_resume.XXXXXX");
    vl_rng r;
    vl_rng_seed(&r, 30);
    peer_trainer t;
    trained(&t, &r);
    size_t n = t.n_params;
    peer_task k = topk_task(2);
    k.comp_k = (int64_t)(n / 10);
    vl_buf up, rec;
    vl_buf_init(&up, VL_BUF_DEFAULT_CAP);
    float *before;
    write_ahead(dir, &t, &k, &r, &up, &before);
    free(before);
    read_file(dir, PEER_PENDING_FILE, &rec);
    peer_resume s;
    peer_pending q;
    vl_error e = {0};

    /* Died between the two writes: the state names no upload. */
    assert_int_equal(peer_resume_save_trainer(dir, &t, &OWNER, 0, &e), VL_OK);
    assert_int_equal(peer_resume_open(dir, &OWNER, &s, &q, &e), VL_OK);
    assert_int_equal(q.task_id, 0);
    assert_false(exists(dir, PEER_PENDING_FILE));
    peer_resume_free(&s);
    /* The state names an older upload, settled since. */
    write_file(dir, PEER_PENDING_FILE, rec.data, rec.len);
    assert_int_equal(peer_resume_save_trainer(dir, &t, &OWNER, 41, &e), VL_OK);
    assert_int_equal(peer_resume_open(dir, &OWNER, &s, &q, &e), VL_OK);
    assert_int_equal(q.task_id, 0);
    assert_int_equal(s.pending_task, 0);
    assert_false(exists(dir, PEER_PENDING_FILE));
    peer_resume_free(&s);
    /* Damaged: ignored, and the state as saved is kept. */
    assert_int_equal(peer_resume_save_trainer(dir, &t, &OWNER, 42, &e), VL_OK);
    write_file(dir, PEER_PENDING_FILE, rec.data, rec.len - 3);
    assert_int_equal(peer_resume_open(dir, &OWNER, &s, &q, &e), VL_OK);
    assert_int_equal(q.task_id, 0);
    assert_int_equal(s.pending_task, 0);
    assert_memory_equal(s.residual, t.residual, n * sizeof(float));
    assert_false(exists(dir, PEER_PENDING_FILE));
    peer_resume_free(&s);
    /* The state is gone: nothing to settle the record against. */
    write_file(dir, PEER_PENDING_FILE, rec.data, rec.len);
    char p[PEER_PATH_MAX];
    path_of(p, dir, PEER_TRAINER_FILE);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(peer_resume_open(dir, &OWNER, &s, &q, &e), VL_OK);
    assert_empty(&s);
    assert_int_equal(q.task_id, 0);
    assert_false(exists(dir, PEER_PENDING_FILE));
    /* Loaded for another run, or for a model of another size. */
    write_file(dir, PEER_PENDING_FILE, rec.data, rec.len);
    assert_int_equal(peer_pending_load(dir, "other", n, &q, &e), VL_EINVAL);
    assert_null(q.bytes);
    assert_int_equal(peer_pending_load(dir, "unit", 10, &q, &e), VL_EINVAL);
    assert_non_null(strstr(e.msg, "decode"));
    assert_int_equal(peer_pending_load(dir, "unit", n, &q, &e), VL_OK);
    peer_pending_free(&q);
    /* Too large to record for the model. */
    peer_pending big = {.task_id = 1, .bytes = up.data, .len = up.len};
    assert_int_equal(peer_pending_save(dir, &big, 1, &e), VL_ETOOBIG);

    /* A dense upload refused: the residual is left alone. */
    k.kind = COMPRESS_DENSE;
    k.method = PEER_METHOD_NONE;
    k.task_id = 43;
    write_ahead(dir, &t, &k, &r, &up, &before);
    free(before);
    assert_int_equal(peer_resume_open(dir, &OWNER, &s, &q, &e), VL_OK);
    assert_int_equal(q.task_id, 43);
    assert_int_equal(q.kind, COMPRESS_DENSE);
    peer_upload_outcome out;
    assert_int_equal(peer_pending_settle(&s, &q, 409, "stale_update", &out, &e), VL_OK);
    assert_int_equal(out, PEER_UPLOAD_NOT_TAKEN);
    assert_memory_equal(s.residual, t.residual, n * sizeof(float));
    /* A sparse record with no state to put it back into is an error. */
    peer_resume none;
    peer_resume_init(&none);
    q.kind = COMPRESS_TOPK;
    assert_int_equal(peer_pending_settle(&none, &q, 409, "stale_update", &out, &e), VL_EINVAL);
    peer_pending_free(&q);
    peer_resume_free(&s);
    vl_buf_free(&rec);
    vl_buf_free(&up);
    peer_trainer_free(&t);
    test_remove_tree(dir);
    free(dir);
}

/* --step-delay and --slowdown: the trainer sleeps after every step. */
static void test_step_delay(void **state) {
    (void)state;
    peer_trainer t;
    peer_trainer_init(&t);
    vl_error e = {0};
    assert_int_equal(peer_trainer_init_model(&t, &TINY, 0, &e), VL_OK);
    t.step_delay_s = 0.05;
    peer_task k = topk_task(3);
    peer_train_result res;
    assert_int_equal(peer_trainer_run(&t, &k, TEXT, 17, &res, &e), VL_OK);
    assert_int_equal(res.steps, 3);
    assert_true(res.seconds >= 0.15);
    /* --slowdown 4: each step, its delay included, then takes four times
     * as long, so three steps of at least 50 ms take at least 600 ms. */
    t.slowdown = 4;
    assert_int_equal(peer_trainer_run(&t, &k, TEXT, 17, &res, &e), VL_OK);
    assert_int_equal(res.steps, 3);
    assert_true(res.seconds >= 0.6);
    peer_trainer_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_round_trip),     cmocka_unit_test(test_state_refused),
        cmocka_unit_test(test_sgd_state_round_trip), cmocka_unit_test(test_upload_classify),
        cmocka_unit_test(test_pending_refused),      cmocka_unit_test(test_pending_accepted),
        cmocka_unit_test(test_pending_unusable),     cmocka_unit_test(test_step_delay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
