/* K-FAC on the peer: the merged factors a task names (fetched, checked
 * and adopted before training), the peer's own factors attached to its
 * update, and the K-FAC part of trainer.st. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer/kfac_internal.h"
#include "peer/peer.h"

/* Merged factors are the model's factor tensors at most, as F32, with
 * their headers. */
#define FACTORS_HEADER_CAP ((size_t)1 << 20)

/* The layers of the trainer's model, on the heap (caller frees). */
static int layers_of(const model_gpt_config *cfg, compress_factor_layer **out, int *n,
                     vl_error *err) {
    int count = model_gpt_kfac_layer_count(cfg);
    *out = count > 0 ? calloc((size_t)count, sizeof **out) : NULL;
    if (!*out) return vl_fail(err, VL_ENOMEM, "out of memory for the K-FAC layers");
    int rc = model_gpt_kfac_factor_layers(cfg, *out, count, err);
    if (rc < 0) {
        free(*out);
        *out = NULL;
        return rc;
    }
    *n = rc;
    return VL_OK;
}

size_t peer_kfac_factor_floats(const model_gpt_config *cfg) {
    size_t total = 0;
    int n = model_gpt_kfac_layer_count(cfg);
    for (int i = 0; i < n; i++) {
        int in = 0, out = 0;
        if (model_gpt_kfac_layer(cfg, i, NULL, 0, &in, &out, NULL)) return 0;
        total += (size_t)(in + 1) * (size_t)(in + 1) + (size_t)out * (size_t)out;
    }
    return total;
}

int peer_trainer_adopt_factors(peer_trainer *t, const peer_task *k, const uint8_t *bytes,
                               size_t len, vl_error *err) {
    if (!k->kfac || k->kfac_factors < 0)
        return vl_fail(err, VL_EINVAL, "task %lld names no merged factors", (long long)k->task_id);
    int rc = peer_trainer_prepare(t, k, err);
    if (rc) return rc;
    st_file f;
    vl_error e = {0};
    if (st_parse(bytes, len, &f, &e) != VL_OK)
        return vl_fail(err, VL_EINVAL, "merged factors: %s", e.msg);
    const char *fmt = st_meta_get(&f, "format"), *run = st_meta_get(&f, "run"),
               *ver = st_meta_get(&f, "version");
    int64_t v = -1;
    if (!fmt || strcmp(fmt, COMPRESS_FACTORS_FORMAT) != 0)
        rc = vl_fail(err, VL_EINVAL, "merged factors: not a %s file", COMPRESS_FACTORS_FORMAT);
    else if (!run || strcmp(run, k->run) != 0)
        rc = vl_fail(err, VL_EINVAL, "merged factors: for run '%.64s', not '%s'",
                     run ? run : "(none)", k->run);
    else if (!ver || vl_parse_i64(ver, 0, INT64_MAX, &v) != VL_OK || v != k->kfac_factors)
        rc = vl_fail(err, VL_EINVAL, "merged factors: version %.24s, the task names %lld",
                     ver ? ver : "(none)", (long long)k->kfac_factors);
    compress_factor_layer *layers = NULL;
    int n = 0;
    if (!rc) rc = layers_of(&t->cfg, &layers, &n, err);
    compress_factors_view view;
    if (!rc && (rc = compress_factors_decode(&f, layers, n, &view, NULL, &e)) != VL_OK)
        rc = vl_fail(err, rc, "merged factors: %s", e.msg);
    if (!rc) {
        /* The merged factors stand for every peer's history; counting them
         * as at least one update keeps the moving average going from them. */
        long updates = t->kfac.layers[0]->updates > 0 ? t->kfac.layers[0]->updates : 1;
        rc = model_kfac_gpt_adopt(&t->kfac, &view, updates, err);
        compress_factors_view_free(&view);
    }
    if (!rc) t->kfac_factors = v;
    free(layers);
    st_free(&f);
    return rc;
}

int peer_kfac_sync(peer_http *h, peer_response *rs, peer_trainer *t, const peer_task *k,
                   uint64_t *down_bytes, vl_error *err) {
    if (!k->kfac || !k->kfac_share || k->kfac_factors < 0 || k->kfac_factors == t->kfac_factors)
        return VL_OK;
    char target[64];
    snprintf(target, sizeof target, "/v1/factors?version=%lld", (long long)k->kfac_factors);
    size_t cap = 4 * peer_kfac_factor_floats(&t->cfg) + FACTORS_HEADER_CAP;
    peer_request rq = {.method = "GET", .target = target, .cap = cap, .idle_s = 120};
    int rc = peer_http_do(h, &rq, rs, err);
    if (rc) return rc;
    if (rs->status != 200) {
        vl_error e = {0};
        peer_refusal(&e, "factors request refused", rs->status, rs->body.data, rs->body.len);
        vl_log_warn("task %lld: training on this peer's own K-FAC factors: %s",
                    (long long)k->task_id, e.msg);
        return VL_OK;
    }
    *down_bytes += rs->body.len;
    vl_error e = {0};
    if (peer_trainer_adopt_factors(t, k, rs->body.data, rs->body.len, &e) != VL_OK)
        vl_log_warn("task %lld: merged K-FAC factors of version %lld refused, training on this "
                    "peer's own: %s",
                    (long long)k->task_id, (long long)k->kfac_factors, e.msg);
    else
        vl_log_info("K-FAC factors merged into version %lld adopted (%zu bytes)",
                    (long long)k->kfac_factors, rs->body.len);
    vl_buf_free(&rs->body);
    return VL_OK;
}

int peer_kfac_factors(const peer_trainer *t, const peer_task *k, int64_t samples,
                      compress_factor_layer *layers, const float **A, const float **G,
                      compress_factors *out, vl_error *err) {
    if (!t->have_kfac) return vl_fail(err, VL_EINVAL, "no K-FAC state to attach");
    int n = model_gpt_kfac_factor_layers(&t->cfg, layers, t->kfac.n_layers, err);
    if (n < 0) return n;
    int rc = model_kfac_gpt_factors(&t->kfac, A, G, err);
    if (rc) return rc;
    if (samples < 1) samples = 1;
    if (samples > COMPRESS_FACTORS_MAX_SAMPLES) samples = COMPRESS_FACTORS_MAX_SAMPLES;
    *out = (compress_factors){
        .layers = layers, .n = n, .A = A, .G = G, .samples = samples, .dtype = k->kfac_dtype};
    return VL_OK;
}

/* ---- trainer.st ------------------------------------------------------------------ */

static int meta_num(st_writer *w, const char *key, double x, int integer) {
    char v[40];
    if (integer)
        snprintf(v, sizeof v, "%lld", (long long)x);
    else
        snprintf(v, sizeof v, "%.9g", x);
    return st_writer_meta(w, key, v);
}

int peer_kfac_state_write(st_writer *w, const peer_resume *r, void **scratch, vl_error *err) {
    *scratch = NULL;
    if (!r->kfac_momentum) return VL_OK;
    size_t n = r->n_params;
    compress_factor_layer *layers = NULL;
    int nl = 0;
    int rc = layers_of(&r->cfg, &layers, &nl, err);
    if (rc) return rc;
    const float **A = calloc(2 * (size_t)nl, sizeof *A);
    if (!A) {
        free(layers);
        return vl_fail(err, VL_ENOMEM, "out of memory saving K-FAC state");
    }
    const float **G = A + nl;
    size_t at = 0;
    for (int i = 0; i < nl; i++) {
        A[i] = r->kfac_factor_data + at;
        at += (size_t)layers[i].a_dim * layers[i].a_dim;
        G[i] = r->kfac_factor_data + at;
        at += (size_t)layers[i].g_dim * layers[i].g_dim;
    }
    const model_kfac_gpt_config *c = &r->kfac_cfg;
    uint64_t shape[1] = {n};
    rc = meta_num(w, "kfac_step", (double)r->kfac_step, 1);
    if (!rc) rc = meta_num(w, "kfac_updates", (double)r->kfac_updates, 1);
    if (!rc) rc = meta_num(w, "kfac_factors_version", (double)r->kfac_factors, 1);
    if (!rc) rc = meta_num(w, "kfac_lr", c->lr, 0);
    if (!rc) rc = meta_num(w, "kfac_momentum", c->momentum, 0);
    if (!rc) rc = meta_num(w, "kfac_damping", c->damping, 0);
    if (!rc) rc = meta_num(w, "kfac_decay", c->decay, 0);
    if (!rc) rc = meta_num(w, "kfac_inverse_every", c->inverse_every, 1);
    if (!rc) rc = meta_num(w, "kfac_kl_clip", c->kl_clip, 0);
    if (!rc) rc = meta_num(w, "kfac_weight_decay", c->weight_decay, 0);
    if (!rc)
        rc = st_writer_add(w, PEER_KFAC_MOMENTUM, ST_F32, 1, shape, r->kfac_momentum,
                           n * sizeof(float));
    if (rc) rc = vl_fail(err, VL_EINVAL, "trainer state: cannot describe the K-FAC state");
    if (!rc) {
        /* The samples count only matters to the coordinator's average. */
        compress_factors f = {
            .layers = layers, .n = nl, .A = A, .G = G, .samples = 1, .dtype = ST_F32};
        rc = compress_factors_write(w, &f, scratch, err);
    }
    free(A);
    free(layers);
    return rc;
}

static int meta_get(const st_file *f, const char *key, double lo, double hi, double *out,
                    vl_error *err) {
    const char *s = st_meta_get(f, key);
    double x;
    if (!s || vl_parse_f64(s, &x) != VL_OK || !(x >= lo && x <= hi))
        return vl_fail(err, VL_EINVAL, "metadata '%s' must be a number in [%g, %g]", key, lo, hi);
    *out = x;
    return VL_OK;
}

int peer_kfac_state_read(const st_file *f, peer_resume *r, vl_error *err) {
    const st_tensor *mom = st_find(f, PEER_KFAC_MOMENTUM);
    if (!mom) {
        if (compress_factors_present(f))
            return vl_fail(err, VL_EINVAL, "K-FAC factors without the K-FAC momentum");
        return VL_OK;
    }
    size_t n = r->n_params;
    double step = 0, updates = 0, fv = 0, lr = 0, mu = 0, damp = 0, decay = 0, every = 0, kl = 0,
           wd = 0;
    int rc = meta_get(f, "kfac_step", 0, 9e15, &step, err);
    if (!rc) rc = meta_get(f, "kfac_updates", 1, 9e15, &updates, err);
    if (!rc) rc = meta_get(f, "kfac_factors_version", -1, 9e15, &fv, err);
    if (!rc) rc = meta_get(f, "kfac_lr", 0, 1e3, &lr, err);
    if (!rc) rc = meta_get(f, "kfac_momentum", 0, 1, &mu, err);
    if (!rc) rc = meta_get(f, "kfac_damping", 0, 1e3, &damp, err);
    if (!rc) rc = meta_get(f, "kfac_decay", 0, 1, &decay, err);
    if (!rc) rc = meta_get(f, "kfac_inverse_every", 1, 1e6, &every, err);
    if (!rc) rc = meta_get(f, "kfac_kl_clip", 0, 1e3, &kl, err);
    if (!rc) rc = meta_get(f, "kfac_weight_decay", 0, 1e3, &wd, err);
    if (rc) return rc;
    r->kfac_cfg = (model_kfac_gpt_config){.lr = (float)lr,
                                          .momentum = (float)mu,
                                          .damping = (float)damp,
                                          .decay = (float)decay,
                                          .inverse_every = (int)every,
                                          .kl_clip = (float)kl,
                                          .weight_decay = (float)wd};
    vl_error e = {0};
    if (model_kfac_gpt_config_validate(&r->kfac_cfg, &e) != VL_OK || step != (long)step ||
        updates != (long)updates || fv != (int64_t)fv || every != (int)every)
        return vl_fail(err, VL_EINVAL, "K-FAC settings: %s", e.msg[0] ? e.msg : "not integers");
    if (mom->dtype != ST_F32 || mom->ndim != 1 || mom->numel != n)
        return vl_fail(err, VL_EINVAL, "'%s' must be F32 of shape [%zu]", PEER_KFAC_MOMENTUM, n);
    compress_factor_layer *layers = NULL;
    int nl = 0;
    if ((rc = layers_of(&r->cfg, &layers, &nl, err))) return rc;
    compress_factors_view v;
    if ((rc = compress_factors_decode(f, layers, nl, &v, NULL, &e)) != VL_OK) {
        free(layers);
        return vl_fail(err, rc == VL_ENOMEM ? rc : VL_EINVAL, "K-FAC factors: %s", e.msg);
    }
    size_t total = peer_kfac_factor_floats(&r->cfg);
    r->kfac_momentum = malloc(n * sizeof(float));
    r->kfac_factor_data = malloc(total * sizeof(float));
    if (!r->kfac_momentum || !r->kfac_factor_data)
        rc = vl_fail(err, VL_ENOMEM, "out of memory for the K-FAC state");
    if (!rc) rc = st_tensor_to_f32(mom, r->kfac_momentum, n, err);
    for (size_t i = 0; !rc && i < n; i++)
        if (!isfinite(r->kfac_momentum[i]))
            rc = vl_fail(err, VL_ERANGE, "'%s'[%zu] is not finite", PEER_KFAC_MOMENTUM, i);
    size_t at = 0;
    for (int i = 0; !rc && i < nl; i++) {
        size_t na = (size_t)layers[i].a_dim * layers[i].a_dim;
        size_t ng = (size_t)layers[i].g_dim * layers[i].g_dim;
        rc = compress_factors_values(&v, i, 0, r->kfac_factor_data + at, na, err);
        if (!rc) rc = compress_factors_values(&v, i, 1, r->kfac_factor_data + at + na, ng, err);
        at += na + ng;
    }
    compress_factors_view_free(&v);
    free(layers);
    r->kfac_step = (long)step;
    r->kfac_updates = (long)updates;
    r->kfac_factors = (int64_t)fv;
    return rc; /* on failure the caller frees what was allocated */
}

int peer_kfac_state_apply(peer_trainer *t, peer_resume *r, vl_error *err) {
    if (!r->kfac_momentum) return VL_OK;
    model_kfac_gpt k;
    int rc = model_kfac_gpt_init(&k, t->gpt, &r->kfac_cfg, err);
    size_t at = 0;
    for (int i = 0; !rc && i < k.n_layers; i++) {
        model_kfac_layer *l = k.layers[i];
        size_t na = (size_t)(l->in + 1) * (l->in + 1), ng = (size_t)l->out * l->out;
        rc = model_kfac_set_factors(l, r->kfac_factor_data + at, r->kfac_factor_data + at + na,
                                    r->kfac_updates, err);
        at += na + ng;
    }
    if (rc) {
        model_kfac_gpt_free(&k);
        return rc;
    }
    memcpy(k.sgd.buf, r->kfac_momentum, t->n_params * sizeof(float));
    k.step = r->kfac_step;
    k.sgd.step = r->kfac_step;
    model_kfac_gpt_free(&t->kfac);
    t->kfac = k;
    t->have_kfac = 1;
    t->kfac_factors = r->kfac_factors;
    return VL_OK;
}

void peer_kfac_state_free(peer_resume *r) {
    free(r->kfac_momentum);
    free(r->kfac_factor_data);
    r->kfac_momentum = NULL;
    r->kfac_factor_data = NULL;
}

int peer_kfac_state_view(peer_resume *view, const peer_trainer *t, vl_error *err) {
    if (!t->have_kfac || t->kfac.n_layers < 1 || t->kfac.layers[0]->updates < 1) return VL_OK;
    size_t total = peer_kfac_factor_floats(&t->cfg), at = 0;
    float *data = malloc(total * sizeof *data + 1);
    if (!data) return vl_fail(err, VL_ENOMEM, "out of memory saving K-FAC state");
    for (int i = 0; i < t->kfac.n_layers; i++) {
        const model_kfac_layer *l = t->kfac.layers[i];
        size_t na = (size_t)(l->in + 1) * (l->in + 1), ng = (size_t)l->out * l->out;
        memcpy(data + at, l->A, na * sizeof *data);
        memcpy(data + at + na, l->G, ng * sizeof *data);
        at += na + ng;
    }
    view->kfac_cfg = t->kfac.cfg;
    view->kfac_step = t->kfac.step;
    view->kfac_updates = t->kfac.layers[0]->updates;
    view->kfac_factors = t->kfac_factors;
    view->kfac_momentum = t->kfac.sgd.buf;
    view->kfac_factor_data = data; /* the caller frees this one, not the momentum */
    return VL_OK;
}
