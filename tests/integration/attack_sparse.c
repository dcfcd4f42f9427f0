/* The attack client's cases for compressed runs (bad sparse and sketch
 * updates, delta requests), the second round's requests, and the valid
 * uploads and leases the test scripts use around them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "tests/integration/attack.h"

/* ---- compressed runs ---------------------------------------------------- */

static compress_update_meta sparse_meta(const ctx *c, compress_kind kind) {
    compress_update_meta m = {0};
    snprintf(m.run, sizeof m.run, "%s", c->run);
    m.task = c->task;
    m.peer = c->peer;
    m.base_version = c->base_version;
    m.kind = kind;
    m.num_samples = 10;
    m.local_steps = 1;
    m.loss = 5.0;
    return m;
}

/* A topk body written by hand, so the indices can break the rules the
 * encoder enforces. */
static void topk_raw(const ctx *c, vl_buf *out, const uint32_t *idx, const float *val, size_t n) {
    compress_update_meta m = sparse_meta(c, COMPRESS_TOPK);
    char v[5][32];
    snprintf(v[0], sizeof v[0], "%lld", (long long)m.task);
    snprintf(v[1], sizeof v[1], "%lld", (long long)m.peer);
    snprintf(v[2], sizeof v[2], "%lld", (long long)m.base_version);
    st_writer w;
    st_writer_init(&w);
    uint64_t shape[1] = {n};
    if (st_writer_meta(&w, "run", m.run) || st_writer_meta(&w, "task", v[0]) ||
        st_writer_meta(&w, "peer", v[1]) || st_writer_meta(&w, "base_version", v[2]) ||
        st_writer_meta(&w, "kind", "topk") || st_writer_meta(&w, "num_samples", "10") ||
        st_writer_meta(&w, "local_steps", "1") || st_writer_meta(&w, "loss", "5") ||
        st_writer_add(&w, "indices", ST_U32, 1, shape, idx, n * 4) ||
        st_writer_add(&w, "values", ST_F32, 1, shape, val, n * 4))
        abort();
    vl_buf_init(out, VL_BUF_DEFAULT_CAP);
    vl_error e;
    if (st_writer_finish(&w, out, &e) != VL_OK) abort();
    st_writer_free(&w);
}

static void sketch_body(const ctx *c, vl_buf *out, uint64_t seed, uint32_t rows, uint32_t cols,
                        float poison) {
    compress_sketch s;
    vl_error e;
    if (compress_sketch_init(&s, rows, cols, seed, &e) != VL_OK) abort();
    float *x = calloc(c->n_params, sizeof *x);
    if (!x) abort();
    for (size_t i = 0; i < c->n_params; i++) x[i] = 1e-4f * (float)(i % 5);
    compress_sketch_encode(&s, x, c->n_params);
    s.table[0] = s.table[0] + poison;
    compress_update_meta m = sparse_meta(c, COMPRESS_SKETCH);
    vl_buf_init(out, VL_BUF_DEFAULT_CAP);
    if (compress_update_encode_sketch(&m, &s, ST_F32, out, &e) != VL_OK) abort();
    compress_sketch_free(&s);
    free(x);
}


void attack_sparse(ctx *c) {
    vl_buf b;
    size_t n = c->n_params;
    int is_sketch = strcmp(c->kind, "sketch") == 0;
    uint32_t rows = (uint32_t)(c->rows > 0 ? c->rows : 3);
    uint32_t cols = (uint32_t)(c->cols > 0 ? c->cols : 64);

    update_body(c, &b, c->run, c->base_version, n, 0.0f);
    post(c, "dense update in a compressed run", &b, 422, "wrong_kind");
    if (is_sketch) {
        uint32_t idx[2] = {1, 2};
        float val[2] = {1, 2};
        topk_raw(c, &b, idx, val, 2);
        post(c, "topk update in a sketch run", &b, 422, "wrong_kind");
        sketch_body(c, &b, (uint64_t)c->seed + 1, rows, cols, 0.0f);
        post(c, "sketch of another seed", &b, 422, "wrong_sketch");
        sketch_body(c, &b, (uint64_t)c->seed, rows, cols + 1, 0.0f);
        post(c, "sketch of another width", &b, 422, "wrong_sketch");
        sketch_body(c, &b, (uint64_t)c->seed, rows == 1 ? 2 : rows - 1, cols, 0.0f);
        post(c, "sketch of another depth", &b, 422, "wrong_sketch");
        sketch_body(c, &b, (uint64_t)c->seed, rows, cols, NAN);
        post(c, "NaN in the sketch", &b, 422, "non_finite");
        sketch_body(c, &b, (uint64_t)c->seed, rows, cols, 1e30f);
        post(c, "a sketch cell of 1e30", &b, 422, "out_of_bounds");
    } else {
        uint32_t out_of_range[3] = {1, 2, (uint32_t)n};
        uint32_t descending[3] = {5, 4, 9};
        uint32_t repeated[3] = {3, 3, 9};
        float val[3] = {0.1f, 0.2f, 0.3f};
        topk_raw(c, &b, out_of_range, val, 3);
        post(c, "index beyond the model", &b, 422, "bad_indices");
        topk_raw(c, &b, descending, val, 3);
        post(c, "indices not ascending", &b, 422, "bad_indices");
        topk_raw(c, &b, repeated, val, 3);
        post(c, "index repeated", &b, 422, "bad_indices");
        uint32_t ok_idx[3] = {1, 2, 3};
        float nan_val[3] = {0.1f, NAN, 0.3f};
        topk_raw(c, &b, ok_idx, nan_val, 3);
        post(c, "NaN among the values", &b, 422, "non_finite");
        float inf_val[3] = {0.1f, 0.2f, INFINITY};
        topk_raw(c, &b, ok_idx, inf_val, 3);
        post(c, "Inf among the values", &b, 422, "non_finite");
        float huge_val[3] = {0.1f, -1e30f, 0.3f};
        topk_raw(c, &b, ok_idx, huge_val, 3);
        post(c, "a value of -1e30", &b, 422, "out_of_bounds");
        size_t many = (size_t)c->k + (size_t)c->k / 10 + 8;
        if (many > n) many = n;
        uint32_t *idx = malloc(many * sizeof *idx);
        float *v = malloc(many * sizeof *v);
        if (!idx || !v) abort();
        for (size_t j = 0; j < many; j++) {
            idx[j] = (uint32_t)j;
            v[j] = 1e-3f;
        }
        topk_raw(c, &b, idx, v, many);
        post(c, "more entries than k", &b, 422, "too_many_entries");
        free(idx);
        free(v);
        sketch_body(c, &b, 1, 3, 64, 0.0f);
        post(c, "sketch update in a topk run", &b, 422, "wrong_kind");
    }
    get(c, "delta without since", "/v1/model/delta", 400, "bad_request");
    get(c, "delta since the current version", "/v1/model/delta?since=0", 400, "bad_request");
    get(c, "delta to a version never made", "/v1/model/delta?since=0&version=99", 404,
        "unknown_version");
    get(c, "delta with a negative since", "/v1/model/delta?since=-1", 400, "bad_request");
}

/* A valid update of the run's kind, so the lease is not left hanging. */
void finish(ctx *c, long status, const char *code) {
    vl_buf b;
    if (strcmp(c->kind, "sketch") == 0) {
        sketch_body(c, &b, (uint64_t)c->seed, (uint32_t)c->rows, (uint32_t)c->cols, 0.0f);
    } else if (strcmp(c->kind, "none") == 0) {
        update_body(c, &b, c->run, c->base_version, c->n_params, 0.0f);
    } else {
        uint32_t idx[2] = {0, (uint32_t)c->n_params - 1};
        float val[2] = {1e-4f, -1e-4f};
        compress_update_meta m = sparse_meta(c, COMPRESS_TOPK);
        vl_buf_init(&b, VL_BUF_DEFAULT_CAP);
        vl_error e;
        if (compress_update_encode_topk(&m, idx, val, 2, ST_F32, &b, &e) != VL_OK) abort();
    }
    post(c, "valid update of the run's kind", &b, status, code);
}

void delta(ctx *c, const char *since, long status) {
    reply r;
    char target[96];
    snprintf(target, sizeof target, "/v1/model/delta?since=%s", since);
    request(c, "GET", target, NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    if (r.status == 200 && status == 200) {
        st_file f;
        vl_error e;
        const st_tensor *ix = NULL, *vx = NULL;
        int ok = st_parse(r.body.data, r.body.len, &f, &e) == VL_OK;
        if (ok) {
            ix = st_find(&f, "indices");
            vx = st_find(&f, "values");
            ok = ix && vx && ix->dtype == ST_U32 && vx->dtype == ST_F32 && ix->numel == vx->numel &&
                 ix->numel > 0;
            for (size_t j = 1; ok && j < ix->numel; j++) {
                uint32_t a, b;
                memcpy(&a, ix->data + 4 * (j - 1), 4);
                memcpy(&b, ix->data + 4 * j, 4);
                ok = a < b && b < c->n_params;
            }
            printf("delta since %s: %llu entries in %zu bytes\n", since,
                   ix ? (unsigned long long)ix->numel : 0ULL, r.body.len);
            st_free(&f);
        }
        if (!ok) r.status = 0;
    }
    expect(status == 200 ? "delta is a sound sparse file" : "delta answers", &r, status,
           status == 410 ? "version_pruned" : NULL);
}

/* ---- second rounds ------------------------------------------------------ */

/* The values file, with every field under the caller's control. */
static void values_body(const ctx *c, vl_buf *out, const char *run, int64_t version, int64_t task,
                        int64_t peer, size_t n, float poison) {
    float *v = calloc(n ? n : 1, sizeof *v);
    if (!v) abort();
    for (size_t i = 0; i < n; i++) v[i] = 1e-4f * (float)(i % 7);
    if (n) v[n / 2] += poison;
    compress_round_meta m = {.version = version, .task = task, .peer = peer};
    snprintf(m.run, sizeof m.run, "%s", run);
    vl_buf_init(out, VL_BUF_DEFAULT_CAP);
    vl_error e;
    if (compress_round_encode_values(&m, v, n, out, &e) != VL_OK) abort();
    free(v);
    (void)c;
}

static void post_values(const ctx *c, const char *name, vl_buf *b, long status, const char *code) {
    reply r;
    request(c, "POST", "/v1/round/values", NULL, b->data, b->len, NULL, 0, NULL, c->peer, 0, &r);
    expect(name, &r, status, code);
    vl_buf_free(b);
}

/* The round's candidate count, checked for a sound file; 0 when closed. */
static size_t candidates(const ctx *c) {
    reply r;
    char target[96];
    snprintf(target, sizeof target, "/v1/round?version=%lld&wait=5", (long long)c->base_version);
    request(c, "GET", target, NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    size_t n = 0;
    if (r.status == 200) {
        compress_round_meta m;
        uint32_t *idx = NULL;
        vl_error e;
        if (compress_round_decode_candidates(r.body.data, r.body.len, c->n_params, &m, &idx, &n,
                                             &e) != VL_OK ||
            m.version != c->base_version)
            r.status = 0;
        free(idx);
        printf("round of version %lld: %zu candidates\n", (long long)c->base_version, n);
    }
    expect("candidates of an open round", &r, 200, NULL);
    return n;
}

void attack_values(ctx *c, const char *stage) {
    vl_buf b;
    char target[96];
    int64_t v = c->base_version;
    if (strcmp(stage, "early") == 0) {
        get(c, "round without version", "/v1/round", 400, "bad_request");
        get(c, "round with an unknown key", "/v1/round?version=0&x=1", 400, "bad_request");
        get(c, "round waiting too long", "/v1/round?version=0&wait=61", 400, "bad_request");
        snprintf(target, sizeof target, "/v1/round?version=%lld", (long long)v + 5);
        get(c, "round of a version never made", target, 404, "unknown_version");
        snprintf(target, sizeof target, "/v1/round?version=%lld", (long long)v);
        get(c, "round not open yet", target, 204, NULL);
        values_body(c, &b, c->run, v, c->task, c->peer, 4, 0);
        post_values(c, "values before the round opens", &b, 409, "round_not_open");
        reply r;
        request(c, "POST", "/v1/round/values", NULL, "", 0, NULL, 0, NULL, c->peer, 0, &r);
        expect("values with an empty body", &r, 400, "malformed_values");
        vl_buf junk;
        vl_buf_init(&junk, 64);
        if (vl_buf_append(&junk, "not safetensors", 15) != VL_OK) abort();
        post_values(c, "values that do not parse", &junk, 400, "malformed_values");
        values_body(c, &b, "another-run", v, c->task, c->peer, 4, 0);
        post_values(c, "values for another run", &b, 422, "wrong_run");
        values_body(c, &b, c->run, v, c->task, c->peer + 1, 4, 0);
        post_values(c, "values naming another peer", &b, 403, "not_your_task");
        return;
    }
    size_t n = strcmp(stage, "closed") == 0 ? 0 : candidates(c);
    if (strcmp(stage, "open") == 0) {
        values_body(c, &b, c->run, v, c->task, c->peer, n + 1, 0);
        post_values(c, "one value too many", &b, 422, "bad_shape");
        values_body(c, &b, c->run, v, c->task, c->peer, n ? n - 1 : 0, 0);
        post_values(c, "one value too few", &b, 422, "bad_shape");
        values_body(c, &b, c->run, v, c->task, c->peer, n, NAN);
        post_values(c, "NaN among the values", &b, 422, "non_finite");
        values_body(c, &b, c->run, v, c->task, c->peer, n, INFINITY);
        post_values(c, "Inf among the values", &b, 422, "non_finite");
        values_body(c, &b, c->run, v, c->task, c->peer, n, 1e30f);
        post_values(c, "a value of 1e30", &b, 422, "out_of_bounds");
        values_body(c, &b, c->run, v, c->task + 100000, c->peer, n, 0);
        post_values(c, "values for an unknown task", &b, 404, "unknown_task");
        values_body(c, &b, c->run, v + 1, c->task, c->peer, n, 0);
        post_values(c, "values for a later version", &b, 404, "unknown_version");
        /* Task 1 went to the first peer that asked, never to this one. */
        values_body(c, &b, c->run, v, c->task == 1 ? 2 : 1, c->peer, n, 0);
        post_values(c, "values for another peer's task", &b, 403, "not_your_task");
    } else if (strcmp(stage, "answer") == 0) {
        values_body(c, &b, c->run, v, c->task, c->peer, n, 0);
        post_values(c, "valid values", &b, 202, NULL);
        values_body(c, &b, c->run, v, c->task, c->peer, n, 0);
        post_values(c, "the same values again", &b, 409, "duplicate_values");
    } else {
        snprintf(target, sizeof target, "/v1/round?version=%lld", (long long)v);
        get(c, "round after its version was made", target, 410, "round_closed");
        values_body(c, &b, c->run, v, c->task, c->peer, 8, 0);
        post_values(c, "values after the round closed", &b, 410, "round_closed");
    }
}

/* A new lease for the attacker, saved over the old one. */
int lease(ctx *c) {
    reply r;
    request(c, "GET", "/v1/task?wait=30", NULL, NULL, 0, NULL, 0, NULL, c->peer, 0, &r);
    json_t *j = json_loadb((const char *)r.body.data, r.body.len, 0, NULL);
    c->task = json_integer_value(json_object_get(j, "task_id"));
    c->base_version = json_integer_value(json_object_get(j, "base_version"));
    json_t *cmp = json_incref(json_object_get(j, "compression"));
    json_decref(j);
    expect("take another task lease", &r, 200, NULL);
    return save_state(c, cmp);
}
