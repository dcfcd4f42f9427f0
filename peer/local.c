/* Training on the peer's own labelled images (peer/local.h). Built on the
 * trainer of train.c (loading a model, preparing a task, clipping, pacing),
 * which calls nothing here: loading a classifier's model file is the
 * trainer's, whatever data it will train on. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/mlp_io.h"
#include "peer/local.h"
#include "peer/train_internal.h"
#include "peer/ui.h"

int peer_local_parse_part(const char *s, int *part, int *parts, vl_error *err) {
    const char *slash = s ? strchr(s, '/') : NULL;
    char a[24];
    int64_t i, n;
    if (!slash || (size_t)(slash - s) >= sizeof a || slash == s)
        return vl_fail(err, VL_EINVAL, "--partition must be i/N, e.g. 0/4");
    memcpy(a, s, (size_t)(slash - s));
    a[slash - s] = '\0';
    if (vl_parse_i64(slash + 1, 1, MODEL_PARTITION_MAX_PARTS, &n) != VL_OK ||
        vl_parse_i64(a, 0, n - 1, &i) != VL_OK)
        return vl_fail(err, VL_EINVAL, "--partition %.40s: need 0 <= i < N <= %d", s,
                       MODEL_PARTITION_MAX_PARTS);
    *part = (int)i;
    *parts = (int)n;
    return VL_OK;
}

/* The labels file beside an MNIST-family images file. */
static int labels_path(const char *images, char *out, size_t cap, vl_error *err) {
    static const char FROM[] = "-images-idx3-", TO[] = "-labels-idx1-";
    const char *at = strstr(images, FROM);
    if (!at)
        return vl_fail(err, VL_EINVAL,
                       "--labels is needed: %.200s is not named like "
                       "NAME-images-idx3-ubyte",
                       images);
    int n = snprintf(out, cap, "%.*s%s%s", (int)(at - images), images, TO, at + sizeof FROM - 1);
    if (n < 0 || (size_t)n >= cap) return vl_fail(err, VL_EINVAL, "--data: path too long");
    return VL_OK;
}

void peer_local_free(peer_local *l) {
    model_images_free(l->images);
    free(l->bytes);
    model_shard_close(l->shard);
    free(l->idx);
    free(l->x);
    free(l->y);
    memset(l, 0, sizeof *l);
}

/* What kind of file --data names: an llm.c token shard starts with the
 * magic 20240520 (int32, little-endian), IDX images with 0x00000803 (or
 * are gzip, which only the image reader takes); anything else is text. */
enum { DATA_TEXT, DATA_TOKENS, DATA_IMAGES };
static int sniff(const char *path, vl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return vl_fail(err, VL_ENOTFOUND, "--data %.200s: cannot open it", path);
    uint8_t h[4] = {0};
    size_t got = fread(h, 1, sizeof h, f);
    fclose(f);
    uint32_t magic =
        (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
    if (got == 4 && magic == MODEL_SHARD_MAGIC) return DATA_TOKENS;
    if (got >= 2 && ((h[0] == 0x1f && h[1] == 0x8b) ||
                     (got == 4 && h[0] == 0 && h[1] == 0 && h[2] == 8 && h[3] == 3)))
        return DATA_IMAGES;
    return DATA_TEXT;
}

/* The largest vocabulary a token shard can hold (uint16 tokens). */
#define SHARD_MAX_VOCAB 65536

static int open_tokens_or_text(peer_local *l, const peer_local_opts *o, int kind, vl_error *err) {
    if (o->parts > 1)
        return vl_fail(err, VL_EINVAL,
                       "--partition cuts labelled images; a text file or token "
                       "shard is the peer's own, whole");
    snprintf(l->path, sizeof l->path, "%s", o->images);
    int rc;
    if (kind == DATA_TOKENS) {
        rc = model_shard_open(o->images, SHARD_MAX_VOCAB, &l->shard, err);
        if (rc) return rc;
        l->shard_vocab = SHARD_MAX_VOCAB;
        vl_log_info("local data: %lld tokens from %s", (long long)model_shard_tokens(l->shard),
                    o->images);
        return VL_OK;
    }
    vl_buf b;
    vl_buf_init(&b, (size_t)PEER_MAX_DATA_BYTES);
    if ((rc = vl_buf_read_file(&b, o->images, err))) {
        vl_buf_free(&b);
        return rc;
    }
    if (b.len < 2) {
        vl_buf_free(&b);
        return vl_fail(err, VL_EINVAL, "--data %.200s holds %zu bytes; nothing to train on",
                       o->images, b.len);
    }
    l->bytes = vl_buf_steal(&b, &l->len);
    vl_log_info("local data: %zu bytes of text from %s", l->len, o->images);
    return VL_OK;
}

int peer_local_open(peer_local *l, const peer_local_opts *o, vl_error *err) {
    memset(l, 0, sizeof *l);
    int kind = o->labels ? DATA_IMAGES : sniff(o->images, err);
    if (kind < 0) return kind;
    if (kind != DATA_IMAGES) {
        int rc = open_tokens_or_text(l, o, kind, err);
        if (rc) peer_local_free(l);
        return rc;
    }
    char derived[4096];
    const char *labels = o->labels;
    int rc = VL_OK;
    if (!labels && (rc = labels_path(o->images, derived, sizeof derived, err))) return rc;
    if (!labels) labels = derived;
    if ((rc = model_images_load(o->images, labels, &l->images, err))) return rc;
    size_t n = model_images_count(l->images);
    rc = model_partition(model_images_labels(l->images), n, model_images_classes(l->images),
                         o->parts, o->part, o->beta, o->seed, &l->idx, &l->n, err);
    if (!rc && l->n == 0)
        rc = vl_fail(err, VL_EINVAL,
                     "part %d of %d of %zu images is empty (beta %g); nothing "
                     "to train on",
                     o->part, o->parts, n, o->beta);
    if (rc) {
        peer_local_free(l);
        return rc;
    }
    vl_log_info("local data: %zu of %zu images (%dx%d, %d classes) from %s, part %d of %d%s", l->n,
                n, model_images_rows(l->images), model_images_cols(l->images),
                model_images_classes(l->images), o->images, o->part, o->parts,
                o->parts > 1 && o->beta > 0 ? ", label-skewed" : "");
    return VL_OK;
}

/* A GPT's local data: text for a byte model, or a token shard checked
 * against the model's vocabulary (reopened once per vocabulary). */
static int check_gpt(const peer_trainer *t, const peer_task *k, peer_local *l, vl_error *err) {
    if (!l || (!l->bytes && !l->shard))
        return vl_fail(err, VL_EINVAL,
                       "task %lld trains a GPT on the peer's own data; start "
                       "the peer with --data TEXT or --data SHARD",
                       (long long)k->task_id);
    if (l->shard && l->shard_vocab != t->cfg.vocab_size) {
        model_shard *s = NULL;
        int rc = model_shard_open(l->path, t->cfg.vocab_size, &s, err);
        /* A refusal of the task, with the shard's own message kept (a
         * message must not be formatted from itself). */
        if (rc) {
            if (err) err->code = VL_EINVAL;
            return VL_EINVAL;
        }
        model_shard_close(l->shard);
        l->shard = s;
        l->shard_vocab = t->cfg.vocab_size;
    }
    if (l->bytes && t->cfg.vocab_size < 256)
        return vl_fail(err, VL_EINVAL,
                       "the local data are text; the model's vocabulary has "
                       "only %d tokens",
                       t->cfg.vocab_size);
    int64_t have = l->shard ? model_shard_tokens(l->shard) : (int64_t)l->len;
    if (have < (int64_t)k->context + 1)
        return vl_fail(err, VL_EINVAL, "the local data hold %lld tokens; a sequence needs %d",
                       (long long)have, k->context + 1);
    return peer_task_check_model(k, &t->cfg, err);
}

int peer_local_check(const peer_trainer *t, const peer_task *k, peer_local *l, vl_error *err) {
    if (t->gpt) return check_gpt(t, k, l, err);
    if (!t->mlp)
        return vl_fail(err, VL_EINVAL, "task %lld: no model to train", (long long)k->task_id);
    if (!l || !l->images)
        return vl_fail(err, VL_EINVAL,
                       "task %lld trains on the peer's own images; start the "
                       "peer with --data IMAGES",
                       (long long)k->task_id);
    model_mlp_config c = model_mlp_config_get(t->mlp);
    int d = model_images_rows(l->images) * model_images_cols(l->images);
    if (d != c.in_dim)
        return vl_fail(err, VL_EINVAL, "the local images have %d pixels; the model takes %d", d,
                       c.in_dim);
    if (model_images_classes(l->images) > c.n_classes)
        return vl_fail(err, VL_EINVAL, "the local labels go up to %d; the model has %d classes",
                       model_images_classes(l->images) - 1, c.n_classes);
    if (k->method != PEER_METHOD_NONE && k->method != PEER_METHOD_SKETCH &&
        (uint64_t)k->comp_k > (uint64_t)t->n_params)
        return vl_fail(err, VL_EINVAL,
                       "task: compression k %lld exceeds the model's %zu "
                       "parameters",
                       (long long)k->comp_k, t->n_params);
    return VL_OK;
}

int peer_local_reserve(peer_local *l, int B, int d, vl_error *err) {
    if (B <= l->cap) return VL_OK;
    float *x = malloc((size_t)B * (size_t)d * sizeof *x);
    int *y = malloc((size_t)B * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        return vl_fail(err, VL_ENOMEM, "out of memory for a batch of %d images", B);
    }
    free(l->x);
    free(l->y);
    l->x = x;
    l->y = y;
    l->cap = B;
    return VL_OK;
}

int peer_local_batch(peer_local *l, int B, vl_rng *r, vl_error *err) {
    if (B < 1 || B > PEER_MAX_BATCH || B > l->cap)
        return vl_fail(err, VL_EINVAL, "a batch of %d images does not fit (reserved %d)", B,
                       l->cap);
    uint32_t idx[PEER_MAX_BATCH];
    for (int b = 0; b < B; b++) idx[b] = l->idx[vl_rng_below_u64(r, l->n)];
    return model_images_batch(l->images, idx, B, l->x, l->y, err);
}

/* One step: loss and gradients of a batch, clipping, the optimizer. */
static int local_step(peer_trainer *t, const peer_task *k, peer_local *l, vl_rng *r, int step,
                      float *loss, double *g2, vl_error *err) {
    const int B = k->batch;
    int rc = peer_local_batch(l, B, r, err);
    if (rc) return rc;
    model_mlp_zero_grad(t->mlp);
    if ((rc = model_mlp_forward(t->mlp, l->x, l->y, B, loss, err))) return rc;
    if (!isfinite(*loss)) return peer_trainer_diverged(t, err, "the loss", *loss, step);
    if ((rc = model_mlp_backward(t->mlp, err))) return rc;
    float *p = model_mlp_params(t->mlp), *g = model_mlp_grads(t->mlp);
    *g2 = peer_clip_grads(g, t->n_params, k->grad_clip);
    if (!isfinite(*g2)) return peer_trainer_diverged(t, err, "the gradient norm", *g2, step);
    if (k->sgd) return model_sgd_step(&t->sgd, p, g, t->n_params, k->weight_decay > 0, err);
    const model_tensor *tensors;
    int nt = model_mlp_tensors(t->mlp, &tensors);
    return model_adamw_step_tensors(&t->opt, tensors, nt, t->n_params, p, g, err);
}

/* Images of the share the base version is scored on: a fixed sample (the
 * share's first), so a peer's figures compare across versions. */
#define ACCURACY_SAMPLE 512

int peer_local_accuracy(peer_trainer *t, const peer_task *k, peer_local *l, peer_train_result *res,
                        vl_error *err) {
    if (!k->report_accuracy || !t->mlp || !l->images) return VL_OK;
    int n = l->n < ACCURACY_SAMPLE ? (int)l->n : ACCURACY_SAMPLE;
    int d = model_images_rows(l->images) * model_images_cols(l->images);
    float *x = malloc((size_t)n * (size_t)d * sizeof *x);
    int *y = malloc((size_t)n * sizeof *y);
    int rc = x && y ? model_images_batch(l->images, l->idx, n, x, y, err)
                    : vl_fail(err, VL_ENOMEM, "out of memory scoring the base version");
    float *params = model_mlp_params(t->mlp);
    if (!rc) memcpy(params, t->base, t->n_params * sizeof *params);
    if (!rc) rc = model_mlp_evaluate(t->mlp, x, y, n, NULL, &res->accuracy, err);
    free(x);
    free(y);
    if (!rc) res->has_accuracy = 1;
    return rc;
}

int peer_trainer_run_local(peer_trainer *t, const peer_task *k, peer_local *l,
                           peer_train_result *res, vl_error *err) {
    memset(res, 0, sizeof *res);
    int rc = peer_local_check(t, k, l, err);
    if (rc) return rc;
    if (k->batch > PEER_MAX_BATCH)
        return vl_fail(err, VL_EINVAL, "task: batch %d over %d", k->batch, PEER_MAX_BATCH);
    model_mlp_config c = model_mlp_config_get(t->mlp);
    if ((rc = peer_local_reserve(l, k->batch, c.in_dim, err))) return rc;
    if ((rc = peer_trainer_prepare(t, k, err))) return rc;
    if ((rc = peer_local_accuracy(t, k, l, res, err))) return rc;
    double t0 = vl_clock_mono_s(), sum = 0;
    float *params = model_mlp_params(t->mlp);
    memcpy(params, t->base, t->n_params * sizeof *params);
    vl_rng r;
    vl_rng_seed(&r, k->seed);
    peer_selsync ss = {0};
    int step = 0;
    while (step < k->steps) {
        if (peer_stop_requested()) return vl_fail(err, PEER_ESTOPPED, "stopped during training");
        double step_t0 = vl_clock_mono_s(), g2 = 0;
        float loss = 0;
        step++;
        if ((rc = local_step(t, k, l, &r, step, &loss, &g2, err))) return rc;
        sum += loss;
        if (step == 1) res->first_loss = loss;
        res->last_loss = loss;
        if ((rc = peer_trainer_pace(t, step_t0, err))) return rc;
        peer_ui_step(step, loss);
        double change = peer_selsync_feed(&ss, g2);
        if (step >= k->h_min && change >= k->selsync_delta) break;
    }
    compress_dense_delta(t->base, params, t->delta, t->n_params);
    if (!compress_all_finite(t->delta, t->n_params))
        return peer_trainer_diverged(t, err, "a parameter", NAN, step);
    res->steps = step;
    res->mean_loss = sum / step;
    res->tokens = (int64_t)step * k->batch;
    res->seconds = vl_clock_mono_s() - t0;
    return VL_OK;
}
