/* Writes the seed corpora of the fuzz targets: for each target, small
 * valid inputs and near-valid ones (one field wrong), so that fuzzing
 * starts past the first checks. The output is committed under
 * tests/fuzz/corpus/<target>/; run this again after changing a format:
 *
 *   build-fuzz/tests/fuzz/make_seeds tests/fuzz/corpus
 *
 * Files named regress-* in the corpus are inputs of bugs the fuzzers
 * found; this program leaves them alone. */
#include <errno.h>
#include <math.h>
#include <sodium.h>
#include <string.h>
#include <sys/stat.h>

#include "common/split_wire.h"
#include "peer/peer.h"
#include "tests/fuzz/fuzz.h"

static const char *root;

static void fail(const char *what) {
    fprintf(stderr, "make_seeds: %s\n", what);
    exit(1);
}

static void ok(int rc, const char *what) {
    if (rc != VL_OK) fail(what);
}

/* Writes root/target/name: prefix (plen bytes) then data. */
static void put(const char *target, const char *name, const void *prefix, size_t plen,
                const void *data, size_t n) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/%s", root, target);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) fail(dir);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(prefix, 1, plen, f) != plen || fwrite(data, 1, n, f) != n || fclose(f))
        fail(path);
}

/* Text after a selector byte (sel < 0: none). */
static void put_str(const char *target, const char *name, int sel, const char *s) {
    uint8_t pre = (uint8_t)sel;
    put(target, name, &pre, sel < 0 ? 0 : 1, s, strlen(s));
}

/* A file from a hand-written header and data block. */
static void raw_file(vl_buf *out, const char *header, const void *data, size_t n) {
    uint64_t hl = strlen(header);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(hl >> (8 * i));
    vl_buf_reset(out);
    ok(vl_buf_append(out, le, 8) || vl_buf_append(out, header, hl) || vl_buf_append(out, data, n),
       "raw file");
}

static compress_update_meta meta_of(compress_kind kind, int64_t task, int64_t peer, int64_t base,
                                    const char *run) {
    compress_update_meta m;
    memset(&m, 0, sizeof m);
    snprintf(m.run, sizeof m.run, "%s", run);
    m.task = task;
    m.peer = peer;
    m.base_version = base;
    m.kind = kind;
    m.num_samples = 32;
    m.local_steps = 2;
    m.loss = 5.5;
    return m;
}

/* ---- safetensors and updates ------------------------------------------ */

static void seeds_updates(void) {
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    float x[16];
    for (int i = 0; i < 16; i++) x[i] = 0.25f * (float)(i - 8);
    uint8_t pre[5] = {0, 16, 0, 0, 0}; /* fuzz_update: mode 0, 16 parameters */
    compress_update_meta m = meta_of(COMPRESS_DENSE, 7, 2, 3, "demo");
    vl_error e = {0};

    ok(compress_update_encode_dense(&m, x, 16, ST_F32, &b, &e), "dense");
    put("fuzz_update", "dense-f32", pre, 5, b.data, b.len);
    put("fuzz_safetensors", "update-dense", "", 0, b.data, b.len);
    vl_buf_reset(&b);
    ok(compress_update_encode_dense(&m, x, 16, ST_F16, &b, &e), "dense f16");
    put("fuzz_update", "dense-f16", pre, 5, b.data, b.len);

    uint32_t idx[4] = {1, 4, 9, 15};
    float val[4] = {0.5f, -1.0f, 2.0f, 1e-3f};
    m.kind = COMPRESS_TOPK;
    vl_buf_reset(&b);
    ok(compress_update_encode_topk(&m, idx, val, 4, ST_F32, &b, &e), "topk");
    put("fuzz_update", "topk-f32", pre, 5, b.data, b.len);
    put("fuzz_safetensors", "update-topk", "", 0, b.data, b.len);
    vl_buf_reset(&b);
    ok(compress_update_encode_topk(&m, idx, val, 4, ST_F16, &b, &e), "topk f16");
    put("fuzz_update", "topk-f16", pre, 5, b.data, b.len);

    compress_sketch s;
    ok(compress_sketch_init(&s, 3, 8, 99, &e), "sketch");
    compress_sketch_encode(&s, x, 16);
    m.kind = COMPRESS_SKETCH;
    vl_buf_reset(&b);
    ok(compress_update_encode_sketch(&m, &s, ST_F32, &b, &e), "sketch update");
    put("fuzz_update", "sketch-f32", pre, 5, b.data, b.len);
    put("fuzz_safetensors", "update-sketch", "", 0, b.data, b.len);
    s.table[3] = -3e38f;
    vl_buf_reset(&b);
    ok(compress_update_encode_sketch(&m, &s, ST_F32, &b, &e), "sketch update");
    put("fuzz_update", "sketch-huge", pre, 5, b.data, b.len);
    compress_sketch_free(&s);

    /* Near misses: each breaks one rule. */
    uint32_t back[4] = {1, 9, 4, 15};
    m.kind = COMPRESS_TOPK;
    float nan_val[4] = {0.5f, NAN, 2.0f, 1.0f};
    vl_buf_reset(&b);
    ok(compress_update_encode_topk(&m, idx, nan_val, 4, ST_F32, &b, &e), "topk nan");
    put("fuzz_update", "topk-nan", pre, 5, b.data, b.len);
    {
        uint8_t data[32];
        memcpy(data, back, 16);
        memcpy(data + 16, val, 16);
        raw_file(&b,
                 "{\"__metadata__\":{\"run\":\"demo\",\"task\":\"7\",\"peer\":\"2\","
                 "\"base_version\":\"3\",\"kind\":\"topk\",\"num_samples\":\"32\","
                 "\"local_steps\":\"2\",\"loss\":\"inf\"},\"indices\":{\"dtype\":\"U32\","
                 "\"shape\":[4],\"data_offsets\":[0,16]},\"values\":{\"dtype\":\"F32\","
                 "\"shape\":[4],\"data_offsets\":[16,32]}}",
                 data, sizeof data);
        put("fuzz_update", "topk-unsorted-inf-loss", pre, 5, b.data, b.len);
    }
    /* K-FAC factors of fuzz_update's two layers (A 3 x 3 and 5 x 5, G 4 x 4
     * and 2 x 2), F32 and F16, on a dense update. */
    static const compress_factor_layer fl[2] = {{"h.0.attn.c_attn", 3, 4},
                                                {"h.0.mlp.c_proj", 5, 2}};
    float fa0[9] = {1, 0.5f, 0, 0.5f, 1, 0, 0, 0, 1}, fg0[16] = {0}, fa1[25] = {0},
          fg1[4] = {2e-6f, 1e-6f, 1e-6f, 2e-6f};
    for (int i = 0; i < 4; i++) fg0[i * 5] = 1e-6f;
    for (int i = 0; i < 5; i++) fa1[i * 6] = 1.0f;
    const float *fA[2] = {fa0, fa1}, *fG[2] = {fg0, fg1};
    compress_factors kf = {.layers = fl, .n = 2, .A = fA, .G = fG, .samples = 512, .dtype = ST_F32};
    m = meta_of(COMPRESS_DENSE, 7, 2, 3, "demo");
    m.factors = &kf;
    vl_buf_reset(&b);
    ok(compress_update_encode_dense(&m, x, 16, ST_F32, &b, &e), "dense with factors");
    put("fuzz_update", "dense-kfac-f32", pre, 5, b.data, b.len);
    kf.dtype = ST_F16;
    vl_buf_reset(&b);
    ok(compress_update_encode_dense(&m, x, 16, ST_F32, &b, &e), "dense with f16 factors");
    put("fuzz_update", "dense-kfac-f16", pre, 5, b.data, b.len);
    m.factors = NULL;
    uint8_t pre8[5] = {0, 8, 0, 0, 0}; /* the dense update against 8 parameters */
    m = meta_of(COMPRESS_DENSE, 7, 2, 3, "demo");
    vl_buf_reset(&b);
    ok(compress_update_encode_dense(&m, x, 16, ST_F32, &b, &e), "dense");
    put("fuzz_update", "dense-wrong-size", pre8, 5, b.data, b.len);

    /* Second-round files. */
    compress_round_meta rm = {
        .run = "demo", .version = 3, .task = 7, .peer = 2, .deadline = 1700000000};
    uint8_t pre_c[5] = {1, 16, 0, 0, 0}, pre_v[5] = {2, 4, 0, 0, 0};
    vl_buf_reset(&b);
    ok(compress_round_encode_candidates(&rm, idx, 4, &b, &e), "candidates");
    put("fuzz_update", "candidates", pre_c, 5, b.data, b.len);
    vl_buf_reset(&b);
    ok(compress_round_encode_values(&rm, val, 4, &b, &e), "values");
    put("fuzz_update", "values", pre_v, 5, b.data, b.len);
    vl_buf_reset(&b);
    ok(compress_round_encode_values(&rm, nan_val, 4, &b, &e), "values nan");
    put("fuzz_update", "values-nan", pre_v, 5, b.data, b.len);

    /* Plain safetensors: every dtype, metadata, and hand-made mistakes. */
    st_writer w;
    st_writer_init(&w);
    uint64_t sh1[1] = {4}, sh2[2] = {2, 2};
    int64_t i64[4] = {1, -2, 3, -4};
    uint8_t u8[4] = {1, 2, 3, 4};
    uint16_t half[4] = {0x3c00, 0xbc00, 0x7bff, 0x0001};
    ok(st_writer_meta(&w, "format", "pt") || st_writer_meta(&w, "note", "seed"), "meta");
    ok(st_writer_add(&w, "a", ST_F32, 2, sh2, x, 16) ||
           st_writer_add(&w, "b", ST_I64, 1, sh1, i64, 32) ||
           st_writer_add(&w, "c", ST_U8, 1, sh1, u8, 4) ||
           st_writer_add(&w, "d", ST_F16, 1, sh1, half, 8) ||
           st_writer_add(&w, "e", ST_BF16, 1, sh1, half, 8) ||
           st_writer_add(&w, "empty", ST_F32, 1, (uint64_t[]){0}, NULL, 0),
       "tensors");
    vl_buf_reset(&b);
    ok(st_writer_finish(&w, &b, &e), "finish");
    st_writer_free(&w);
    put("fuzz_safetensors", "dtypes", "", 0, b.data, b.len);
    put("fuzz_safetensors", "truncated", "", 0, b.data, b.len - 1);
    raw_file(&b, "{}", NULL, 0);
    put("fuzz_safetensors", "empty", "", 0, b.data, b.len);
    raw_file(&b,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}  ",
             x, 8);
    put("fuzz_safetensors", "overlap", "", 0, b.data, b.len);
    raw_file(&b, "{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[4,12]}} ", x, 12);
    put("fuzz_safetensors", "gap-misaligned", "", 0, b.data, b.len);
    raw_file(&b,
             "{\"a\":{\"dtype\":\"Q4\",\"shape\":[9223372036854775807,2],"
             "\"data_offsets\":[0,8]}}",
             x, 8);
    put("fuzz_safetensors", "bad-dtype-shape", "", 0, b.data, b.len);
    vl_buf_free(&b);
}

/* ---- the peer's files ---------------------------------------------------- */

static void model_file(const peer_trainer *t, const char *version, const char *cfg, vl_buf *out) {
    st_writer w;
    st_writer_init(&w);
    vl_error e = {0};
    ok(st_writer_meta(&w, "run", "fuzz") || st_writer_meta(&w, "version", version) ||
           st_writer_meta(&w, "model", cfg) || model_gpt_write_safetensors(t->gpt, &w),
       "model file");
    vl_buf_reset(out);
    ok(st_writer_finish(&w, out, &e), "model file");
    st_writer_free(&w);
}

static void delta_file(vl_buf *out, const char *since, const char *version, const uint32_t *idx,
                       const float *val, size_t n) {
    st_writer w;
    st_writer_init(&w);
    uint64_t shape[1] = {n};
    vl_error e = {0};
    ok(st_writer_meta(&w, "run", "fuzz") || st_writer_meta(&w, "since", since) ||
           st_writer_meta(&w, "version", version) ||
           st_writer_add(&w, "indices", ST_U32, 1, shape, idx, n * 4) ||
           st_writer_add(&w, "values", ST_F32, 1, shape, val, n * 4),
       "delta");
    vl_buf_reset(out);
    ok(st_writer_finish(&w, out, &e), "delta");
    st_writer_free(&w);
}

static void seeds_peer_files(void) {
    const model_gpt_config held = FUZZ_PEER_CONFIG;
    peer_trainer t;
    peer_trainer_init(&t);
    vl_error e = {0};
    ok(peer_trainer_init_model(&t, &held, 0, &e), "model");
    char cfg[200], version[24];
    snprintf(cfg, sizeof cfg,
             "{\"vocab_size\":%d,\"block_size\":%d,\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d}",
             held.vocab_size, held.block_size, held.n_layer, held.n_head, held.n_embd);
    snprintf(version, sizeof version, "%d", FUZZ_PEER_NEXT);
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    uint8_t model = 0, delta = 1;
    model_file(&t, version, cfg, &b);
    put("fuzz_peer_files", "model", &model, 1, b.data, b.len);
    put("fuzz_safetensors", "model", "", 0, b.data, b.len);
    model_gpt_params(t.gpt)[5] = NAN;
    model_file(&t, version, cfg, &b);
    put("fuzz_peer_files", "model-nan", &model, 1, b.data, b.len);
    model_gpt_params(t.gpt)[5] = 0;
    model_file(&t, "3", cfg, &b);
    put("fuzz_peer_files", "model-wrong-version", &model, 1, b.data, b.len);
    /* A configuration that claims a model of 1.2e10 parameters (47 GB) in
     * a file of 12 KB: refused before anything that large is allocated. */
    model_file(&t, version,
               "{\"vocab_size\":1048576,\"block_size\":8192,\"n_layer\":4,\"n_head\":8,"
               "\"n_embd\":8192}",
               &b);
    put("fuzz_peer_files", "model-claims-huge", &model, 1, b.data, b.len);
    peer_trainer_free(&t);

    char held_s[24];
    snprintf(held_s, sizeof held_s, "%d", FUZZ_PEER_HELD);
    uint32_t idx[3] = {0, 5, 9};
    float val[3] = {0.5f, -1.0f, 2.0f};
    delta_file(&b, held_s, version, idx, val, 3);
    put("fuzz_peer_files", "delta", &delta, 1, b.data, b.len);
    float nan_val[3] = {0.5f, NAN, 2.0f}, huge[3] = {0.5f, 3e38f, 3e38f};
    delta_file(&b, held_s, version, idx, nan_val, 3);
    put("fuzz_peer_files", "delta-nan", &delta, 1, b.data, b.len);
    uint32_t back[3] = {5, 0, 9};
    delta_file(&b, held_s, version, back, val, 3);
    put("fuzz_peer_files", "delta-unsorted", &delta, 1, b.data, b.len);
    delta_file(&b, "2", version, idx, val, 3);
    put("fuzz_peer_files", "delta-wrong-since", &delta, 1, b.data, b.len);
    /* Two finite additions that carry a parameter past F32's range. */
    uint32_t same[3] = {0, 1, 2};
    delta_file(&b, held_s, version, same, huge, 3);
    put("fuzz_peer_files", "delta-huge", &delta, 1, b.data, b.len);
    vl_buf_free(&b);
}

/* ---- JSON ------------------------------------------------------------------ */

static const char TASK[] =
    "{\"task_id\": 42, \"run\": \"demo\", \"base_version\": 7, \"deadline\": 1700000000,"
    " \"data\": {\"shard\": \"train\", \"offset\": 1024, \"length\": 65536},"
    " \"train\": {\"steps\": 20, \"batch\": 16, \"context\": 64, \"optimizer\": \"adamw\","
    " \"lr\": 0.0003, \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-8, \"weight_decay\": 0.1,"
    " \"grad_clip\": 1.0, \"seed\": 991},"
    " \"compression\": {\"kind\": \"%s\", \"dtype\": \"%s\", \"k\": 2918, \"rows\": 5,"
    " \"cols\": 4096, \"seed\": 3, \"block\": 512, \"decay\": 0.9, \"second_round\": 2,"
    " \"round_s\": 30},"
    " \"selsync\": {\"delta\": 0.05, \"h_min\": 5, \"h_max\": 20}}";

static void seeds_json(void) {
    char t[2048];
    const char *kinds[][2] = {{"none", "F32"},   {"topk", "F16"}, {"gaussk", "F32"},
                              {"sketch", "F16"}, {"zstd", "F32"}, {"topk", "BF16"}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        char name[32];
        snprintf(t, sizeof t, TASK, kinds[i][0], kinds[i][1]);
        snprintf(name, sizeof name, "task-%s-%s", kinds[i][0], kinds[i][1]);
        put_str("fuzz_peer_json", name, 0, t);
    }
    put_str("fuzz_peer_json", "task-sgd", 0,
            "{\"task_id\":1,\"run\":\"r\",\"base_version\":0,\"deadline\":5,\"data\":{\"shard\":"
            "\"train\",\"offset\":0,\"length\":65},\"train\":{\"steps\":1,\"batch\":1,"
            "\"context\":64,\"optimizer\":\"sgd\",\"momentum\":0.9,\"nesterov\":true,\"lr\":0.1,"
            "\"beta1\":0.9,\"beta2\":0.95,\"eps\":1e-8,\"weight_decay\":0,\"grad_clip\":0,"
            "\"seed\":1},\"compression\":{\"kind\":\"none\",\"dtype\":\"F32\"}}");
    put_str("fuzz_peer_json", "task-kfac", 0,
            "{\"task_id\":1,\"run\":\"r\",\"base_version\":0,\"deadline\":5,\"data\":{\"shard\":"
            "\"train\",\"offset\":0,\"length\":65},\"train\":{\"steps\":1,\"batch\":1,"
            "\"context\":64,\"optimizer\":\"kfac\",\"momentum\":0,\"lr\":0.1,\"beta1\":0.9,"
            "\"beta2\":0.95,\"eps\":1e-8,\"weight_decay\":0,\"grad_clip\":1,\"seed\":1,"
            "\"kfac\":{\"damping\":0.001,\"decay\":0.95,\"inverse_every\":1,\"kl_clip\":0.01,"
            "\"share\":true,\"dtype\":\"F16\",\"factors_version\":3}},"
            "\"compression\":{\"kind\":\"none\",\"dtype\":\"F32\"}}");
    put_str("fuzz_peer_json", "join-reply", 1,
            "{\"peer_id\": 3, \"run\": {\"name\": \"demo\", \"mode\": \"sync\"}}");
    put_str("fuzz_peer_json", "join-reply-bad", 1, "{\"peer_id\": 0, \"run\": {}}");
    put_str("fuzz_peer_json", "error-body", 2,
            "{\"error\": {\"code\": \"stale_update\", \"message\": \"update is 17 versions "
            "behind\"}}");
    put_str("fuzz_peer_json", "error-text", 2, "<html>\x1b[31mBad\tGateway\r\n</html>");
    put_str("fuzz_peer_json", "model-config", 3,
            "{\"vocab_size\": 256, \"block_size\": 64, \"n_layer\": 2, \"n_head\": 4,"
            " \"n_embd\": 128}");
    put_str("fuzz_peer_json", "retry-after", 4, "120");
    put_str("fuzz_peer_json", "retry-after-date", 4, "Wed, 21 Oct 2015 07:28:00 GMT");

    put_str("fuzz_json_body", "join", -1,
            "{\"public_key\": \"11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=\", \"token\":"
            " \"vlt_0123\", \"name\": \"lab-gpu-1\", \"hardware\": {\"cpus\": 16, \"gpu\":"
            " \"none\"}}");
    put_str("fuzz_json_body", "join-minimal", -1,
            "{\"public_key\": \"11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=\", \"token\":"
            " \"t\", \"name\": \"n\"}");
    put_str("fuzz_json_body", "join-extra-field", -1,
            "{\"public_key\": \"AAAA\", \"token\": \"\", \"name\": \"a\\u0007b\", \"x\": 1}");
    put_str("fuzz_json_body", "join-not-object", -1, "[1, 2, {\"token\": null}]");
    put_str("fuzz_json_body", "rotate", -1,
            "{\"public_key\": \"11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=\", \"proof\": "
            "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
            "AAAAAAAAAAAAAAAAAAAAAA==\"}");
}

/* ---- request signatures --------------------------------------------------- */

static void seeds_auth(void) {
    vcrypto_identity id;
    uint8_t seed[32];
    memset(seed, 7, sizeof seed);
    if (crypto_sign_seed_keypair(id.pk, id.sk, seed) != 0) fail("key");
    vcrypto_signed_headers h;
    ok(vcrypto_sign_http(&id, "12", "POST", "/v1/updates", 1, "x", 1, 1700000000, &h), "sign");
    char two[2 * VCRYPTO_SIG_HEADER_MAX];
    snprintf(two, sizeof two, "%s\n%s", h.signature_input, h.signature);
    put_str("fuzz_auth", "signature", 0, two);
    put_str("fuzz_auth", "signature-rfc9421-b26", 0,
            "sig-b26=(\"date\" \"@method\" \"@path\" \"@authority\" \"content-type\" "
            "\"content-length\");created=1618884473;keyid=\"test-key-ed25519\"\n"
            "sig-b26=:wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQ"
            "v5lIp5WPpBKRCw==:");
    put_str("fuzz_auth", "content-digest", 0, h.content_digest);
    put_str("fuzz_auth", "signature-bad", 0, "sig1=(\"@method\";sf);created=1\nsig1=:AA==:");
    put_str("fuzz_auth", "sign-get", 1, "GET\n/v1/task?wait=20\n");
    put_str("fuzz_auth", "sign-get-no-body", 3, "GET\n/v1/task?wait=20\n");
    put_str("fuzz_auth", "sign-post", 1, "POST\n/v1/updates\n{\"a\": 1}");
    /* Every optional parameter, RFC 8941 whitespace, escapes, an unsigned
     * member before ours and a signature of another length, under a label
     * with no input, beside it. */
    char b64[VCRYPTO_SIG_B64_LEN + 1], many[3 * VCRYPTO_SIG_HEADER_MAX];
    memcpy(b64, h.signature + strlen("sig1=:"), VCRYPTO_SIG_B64_LEN);
    b64[VCRYPTO_SIG_B64_LEN] = '\0';
    snprintf(many, sizeof many,
             "other=(\"@path\";sf \"x\");created=1, sig1=( \"@method\"  \"@target-uri\" "
             "\"@authority\" \"content-digest\");created=1700000000; expires=1700000300;"
             "keyid=\"a\\\"b\";nonce=\"0123456789abcdef_.-+/=\";alg=\"ed25519\";tag=\"volley\"\n"
             "rsa=:AAAA:, sig1=:%s:",
             b64);
    put_str("fuzz_auth", "signature-params", 0, many);
    put_str("fuzz_auth", "content-digest-many", 0,
            "unixsum, md5=\"x\";a=1, sha-512=:WZDPaVn/7XgHaAy8pmojAkGWoRx2UFChF41A2svX+TaPm+"
            "AbwAgBWnrIiYllu7BNNyealdVLvRwEmTHWXvJwew==:, sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoy"
            "WxBf7kbu9DBPE=:");
}

/* ---- HTTP -------------------------------------------------------------------- */

static void http_signed(const char *name, int who, const char *head, const void *body, size_t n) {
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    uint8_t pre[2] = {1, (uint8_t)who};
    ok(vl_buf_append(&b, pre, 2) || vl_buf_append_str(&b, head) || vl_buf_append(&b, body, n),
       "signed");
    put("fuzz_http", name, "", 0, b.data, b.len);
    vl_buf_free(&b);
}

static void seeds_http(void) {
    static const char *const raw[][2] = {
        {"status", "GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n"},
        {"unknown-path", "GET /v2/nothing?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"},
        {"wrong-method", "DELETE /v1/task HTTP/1.1\r\n\r\n"},
        {"head", "HEAD /v1/model HTTP/1.1\r\n\r\n"},
        {"unknown-method", "BREW /v1/task HTTP/1.1\r\n\r\n"},
        {"unsigned-task", "GET /v1/task?wait=0 HTTP/1.1\r\nSignature-Input: sig1=(\"@method\" "
                          "\"@path\" \"@query\");created=1;keyid=\"1\";nonce=\"0000000000000000\""
                          "\r\nSignature: sig1=:AAAA:\r\n\r\n"},
        {"chunked", "POST /v1/updates HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "5\r\nhello\r\n0\r\n\r\n"},
        {"too-large", "POST /v1/peers HTTP/1.1\r\nContent-Length: 9999999\r\n\r\n{}"},
        {"two-lengths", "POST /v1/peers HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2"
                        "\r\n\r\n{}"},
        {"no-length", "POST /v1/peers HTTP/1.1\r\n\r\n"},
        {"expect", "POST /v1/peers HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2"
                   "\r\n\r\n{}"},
        {"join-unsigned", "POST /v1/peers HTTP/1.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: 2\r\n\r\n{}"},
        {"marker", "GET /v1/status HTTP/1.1\r\nX-Volley-Guard: too_large\r\n\r\n"},
        {"pipelined", "GET /v1/status HTTP/1.1\r\n\r\nGET /v1/nothing HTTP/1.1\r\n\r\n"
                      "POST /v1/updates HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"},
        {"http10", "GET /v1/status HTTP/1.0\r\n\r\n"},
        {"body-short", "POST /v1/updates HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc"},
        {"bare-lf", "GET /v1/model?version=0 HTTP/1.1\nIf-None-Match: \"0\"\n\n"},
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++)
        put_str("fuzz_http", raw[i][0], 0, raw[i][1]);

    static const char *const gets[][3] = {
        {"task-1", "\x00", "GET /v1/task?wait=0\n\n"},
        {"task-2", "\x01", "GET /v1/task?wait=1\n\n"},
        {"task-unknown-peer", "\x03", "GET /v1/task\n\n"},
        {"model", "\x00", "GET /v1/model\n\n"},
        {"model-etag", "\x01", "GET /v1/model?version=0\nIf-None-Match: W/\"1\", \"0\"\n\n"},
        {"delta", "\x00", "GET /v1/model/delta?since=0&version=1\n\n"},
        {"data", "\x01", "GET /v1/data/train\nRange: bytes=100-355\n\n"},
        {"data-open-range", "\x00", "GET /v1/data/train\nRange: bytes=-20\n\n"},
        {"round", "\x00", "GET /v1/round?version=0&wait=0\n\n"},
        {"status-signed", "\x01", "GET /v1/status\n\n"},
        {"query-twice", "\x00", "GET /v1/model?version=0&version=0\n\n"},
    };
    for (size_t i = 0; i < sizeof gets / sizeof gets[0]; i++)
        http_signed(gets[i][0], gets[i][1][0], gets[i][2], "", 0);

    /* Uploads for the first two tasks (peer 1 gets task 1, peer 2 task
     * 2) of the run fuzz_http sets up: a sketch of 3 x 64, seed 5. */
    vl_buf b;
    vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
    vl_error e = {0};
    float x[96];
    for (int i = 0; i < 96; i++) x[i] = 0.01f * (float)(i % 13 - 6);
    for (int p = 1; p <= 2; p++) {
        compress_sketch s;
        ok(compress_sketch_init(&s, 3, 64, 5, &e), "sketch");
        compress_sketch_encode(&s, x, 96);
        compress_update_meta m = meta_of(COMPRESS_SKETCH, p, p, 0, "fuzz");
        vl_buf_reset(&b);
        ok(compress_update_encode_sketch(&m, &s, ST_F32, &b, &e), "sketch update");
        compress_sketch_free(&s);
        char name[32];
        snprintf(name, sizeof name, "update-%d", p);
        http_signed(name, p - 1, "POST /v1/updates\nContent-Type: application/octet-stream\n\n",
                    b.data, b.len);
        /* The same taking the next lease with the answer. */
        snprintf(name, sizeof name, "update-%d-next", p);
        http_signed(name, p - 1,
                    "POST /v1/updates?next=1\nContent-Type: application/octet-stream\n\n", b.data,
                    b.len);
    }
    /* The same with a cell of 3e38: finite, but a merge of two of them
     * made the model Inf (refused now as out_of_bounds). */
    for (int p = 1; p <= 2; p++) {
        compress_sketch s;
        ok(compress_sketch_init(&s, 3, 64, 5, &e), "sketch");
        s.table[p] = 3e38f;
        compress_update_meta m = meta_of(COMPRESS_SKETCH, p, p, 0, "fuzz");
        vl_buf_reset(&b);
        ok(compress_update_encode_sketch(&m, &s, ST_F32, &b, &e), "sketch update");
        compress_sketch_free(&s);
        char name[32];
        snprintf(name, sizeof name, "update-huge-%d", p);
        http_signed(name, p - 1, "POST /v1/updates\nContent-Type: application/octet-stream\n\n",
                    b.data, b.len);
    }
    compress_round_meta rm = {.run = "fuzz", .version = 0, .task = 1, .peer = 1};
    vl_buf_reset(&b);
    ok(compress_round_encode_values(&rm, x, 32, &b, &e), "values");
    http_signed("round-values", 0,
                "POST /v1/round/values\nContent-Type: application/octet-stream\n\n", b.data, b.len);

    vcrypto_identity joiner;
    uint8_t seed[32];
    memset(seed, FUZZ_HTTP_KEY_SEED(2), sizeof seed);
    if (crypto_sign_seed_keypair(joiner.pk, joiner.sk, seed) != 0) fail("key");
    char pk[VCRYPTO_PK_B64_LEN + 1], body[512];
    vcrypto_pk_encode(joiner.pk, pk);
    snprintf(body, sizeof body,
             "{\"public_key\": \"%s\", \"token\": \"" FUZZ_HTTP_TOKEN "\", \"name\": \"joiner\","
             " \"hardware\": {\"cpus\": 2}}",
             pk);
    http_signed("join", 2, "POST /v1/peers\nContent-Type: application/json\n\n", body,
                strlen(body));
    /* Key rotation without changing any key (later inputs still sign
     * with them): peer 2 "moving" to its own key, which is answered as a
     * retry of a rotation already made, and a move to the joining key
     * with a proof made for another peer, refused. */
    char proof[VCRYPTO_SIG_B64_LEN + 1], own[VCRYPTO_PK_B64_LEN + 1];
    vcrypto_identity peer2;
    memset(seed, FUZZ_HTTP_KEY_SEED(1), sizeof seed);
    if (crypto_sign_seed_keypair(peer2.pk, peer2.sk, seed) != 0) fail("key");
    vcrypto_pk_encode(peer2.pk, own);
    vcrypto_rotation_sign(&peer2, 2, peer2.pk, proof);
    snprintf(body, sizeof body, "{\"public_key\": \"%s\", \"proof\": \"%s\"}", own, proof);
    http_signed("rotate-same", 1, "POST /v1/peers/rotate\nContent-Type: application/json\n\n", body,
                strlen(body));
    vcrypto_rotation_sign(&joiner, 1, peer2.pk, proof);
    snprintf(body, sizeof body, "{\"public_key\": \"%s\", \"proof\": \"%s\"}", pk, proof);
    http_signed("rotate-bad-proof", 1, "POST /v1/peers/rotate\nContent-Type: application/json\n\n",
                body, strlen(body));
    vl_buf_free(&b);
}

/* fuzz_split_wire: a valid batch (F32 and F16), one with a NaN, a valid
 * reply, a U-shaped batch and a backward request. */
static void seeds_split(void) {
    float z[4 * 8], dz[4 * 8];
    int y[4] = {0, 3, 9, 1};
    for (int i = 0; i < 4 * 8; i++) z[i] = dz[i] = 0.125f * (float)(i % 7) - 0.25f;
    uint8_t req = 0, rep = 1;
    vl_buf b;
    vl_error e;
    vl_buf_init(&b, 1 << 20);
    ok(split_wire_encode_forward("fuzz", 1, 2, z, 4, 8, ST_F32, y, &b, &e), "split f32");
    put("fuzz_split_wire", "forward-f32", &req, 1, b.data, b.len);
    b.len = 0;
    ok(split_wire_encode_forward("fuzz", 1, 2, z, 4, 8, ST_F16, y, &b, &e), "split f16");
    put("fuzz_split_wire", "forward-f16", &req, 1, b.data, b.len);
    b.len = 0;
    z[5] = NAN;
    ok(split_wire_encode_forward("fuzz", 1, 2, z, 4, 8, ST_F32, y, &b, &e), "split nan");
    put("fuzz_split_wire", "forward-nan", &req, 1, b.data, b.len);
    b.len = 0;
    ok(split_wire_encode_reply("dz", dz, 4, 8, ST_F32, 1.5, 3, &b, &e), "split reply");
    put("fuzz_split_wire", "reply-f32", &rep, 1, b.data, b.len);
    b.len = 0;
    z[5] = 0.5f;
    uint8_t ufwd = 2, bwd = 3;
    ok(split_wire_encode_forward("fuzz", 1, 2, z, 4, 8, ST_F16, NULL, &b, &e), "split u");
    put("fuzz_split_wire", "forward-u", &ufwd, 1, b.data, b.len);
    b.len = 0;
    ok(split_wire_encode_backward("fuzz", 1, 2, z, dz, 4, 8, 6, ST_F32, &b, &e), "split bwd");
    put("fuzz_split_wire", "backward-f32", &bwd, 1, b.data, b.len);
    vl_buf_free(&b);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds OUTDIR (tests/fuzz/corpus)\n");
        return 2;
    }
    root = argv[1];
    if (vcrypto_init() != VL_OK) fail("libsodium");
    if (mkdir(root, 0755) != 0 && errno != EEXIST) fail(root);
    seeds_updates();
    seeds_peer_files();
    seeds_json();
    seeds_auth();
    seeds_http();
    seeds_split();
    printf("make_seeds: seeds written under %s\n", root);
    return 0;
}
