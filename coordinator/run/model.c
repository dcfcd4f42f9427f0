/* The run's model whichever its kind (coordinator/run/model.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "coordinator/coord.h"
#include "coordinator/run/model.h"
#include "model/mlp_io.h"
#include "coordinator/config/config.h"
#include "coordinator/run/model_types.h"
#include "coordinator/run/run.h"

int coord_model_create(const coord_config *cfg, coord_model *n, vl_error *err) {
    memset(n, 0, sizeof *n);
    return cfg->net == COORD_NET_MLP ? model_mlp_create(&cfg->mlp, &n->mlp, err)
                                     : model_gpt_create(&cfg->model, &n->gpt, err);
}

void coord_model_free(coord_model *n) {
    model_gpt_free(n->gpt);
    model_mlp_free(n->mlp);
    memset(n, 0, sizeof *n);
}

void coord_model_init_weights(coord_model *n, uint64_t seed) {
    if (n->mlp) model_mlp_init_weights(n->mlp, seed);
    if (n->gpt) model_gpt_init_weights(n->gpt, seed);
}

size_t coord_model_num_params(const coord_model *n) {
    return n->mlp ? model_mlp_num_params(n->mlp) : n->gpt ? model_gpt_num_params(n->gpt) : 0;
}

float *coord_model_params(coord_model *n) {
    return n->mlp ? model_mlp_params(n->mlp) : n->gpt ? model_gpt_params(n->gpt) : NULL;
}

int coord_model_write_tensors(const coord_model *n, st_writer *w) {
    if (n->gpt) return model_gpt_write_safetensors(n->gpt, w);
    const model_tensor *t;
    int nt = model_mlp_tensors(n->mlp, &t);
    return model_tensors_write(t, nt, model_mlp_params(n->mlp), w);
}

/* ---- the test set ---------------------------------------------------------- */

void coord_testset_close(coord_testset *t) {
    free(t->x);
    free(t->labels);
    memset(t, 0, sizeof *t);
}

/* Fills t from the loaded images: floats as the peers compute them
 * (model_images_batch), and the hash over the stored bytes. */
static int fill(coord_testset *t, const model_images *im, const coord_config *cfg, vl_error *err) {
    size_t n = model_images_count(im);
    size_t d = (size_t)model_images_rows(im) * (size_t)model_images_cols(im);
    if (d != (size_t)cfg->mlp.in_dim)
        return vl_fail(err, VL_EINVAL, "test images of %dx%d pixels do not fit model.in_dim %d",
                       model_images_rows(im), model_images_cols(im), cfg->mlp.in_dim);
    if (model_images_classes(im) > cfg->mlp.n_classes)
        return vl_fail(err, VL_EINVAL, "test labels go up to %d; model.classes is %d",
                       model_images_classes(im) - 1, cfg->mlp.n_classes);
    if (n == 0 || n > (size_t)INT32_MAX / 2)
        return vl_fail(err, VL_EINVAL, "the test set holds %zu images", n);
    uint32_t *idx = malloc(n * sizeof *idx);
    t->x = malloc(n * d * sizeof *t->x);
    t->labels = malloc(n * sizeof *t->labels);
    if (!idx || !t->x || !t->labels) {
        free(idx);
        return vl_fail(err, VL_ENOMEM, "out of memory for %zu test images", n);
    }
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
    int rc = model_images_batch(im, idx, (int)n, t->x, t->labels, err);
    free(idx);
    if (rc) return rc;
    t->n = (int)n;
    t->size = (int64_t)(n * d + n);
    uint8_t h[32];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof h);
    crypto_generichash_update(&st, model_images_pixels(im), n * d);
    crypto_generichash_update(&st, model_images_labels(im), n);
    crypto_generichash_final(&st, h, sizeof h);
    vl_hex_encode(h, sizeof h, t->hash);
    return VL_OK;
}

int coord_testset_open(coord_testset *t, const coord_config *cfg, int64_t expect_size,
                       const char *expect_hash, vl_error *err) {
    memset(t, 0, sizeof *t);
    if (!cfg->test_images[0]) return VL_OK;
    model_images *im = NULL;
    int rc = model_images_load(cfg->test_images, cfg->test_labels, &im, err);
    if (!rc) rc = fill(t, im, cfg, err);
    model_images_free(im);
    if (!rc && expect_hash && (t->size != expect_size || strcmp(t->hash, expect_hash) != 0))
        rc = vl_fail(err, VL_ECONFLICT,
                     "the test set %s changed since init (%s); refusing to "
                     "score versions on other data",
                     cfg->test_images,
                     t->size != expect_size ? "its size differs" : "its hash differs");
    if (rc) coord_testset_close(t);
    return rc;
}

int coord_model_score(const coord_config *cfg, const struct coord_corpus *corpus,
                      const struct coord_shards *shards, const coord_testset *test, coord_model *n,
                      float *loss, double *accuracy, vl_error *err) {
    if (accuracy) *accuracy = NAN;
    if (n->gpt) return coord_val_loss(cfg, corpus, shards, n->gpt, cfg->val_batches, loss, err);
    *loss = NAN;
    if (!test || test->n == 0) return VL_OK;
    double l = NAN, a = NAN;
    int rc = model_mlp_evaluate(n->mlp, test->x, test->labels, test->n, &l, &a, err);
    if (rc) return rc;
    *loss = (float)l;
    if (accuracy) *accuracy = a;
    return VL_OK;
}

int coord_model_check(const coord_config *cfg, const struct coord_corpus *corpus,
                      const struct coord_shards *shards, coord_model *n, float *loss,
                      vl_error *err) {
    if (!n->gpt || cfg->val_check_batches <= 0)
        return vl_fail(err, VL_EINVAL, "the loss check is for a GPT run with val_check_tokens");
    return coord_val_loss(cfg, corpus, shards, n->gpt, cfg->val_check_batches, loss, err);
}

void coord_model_log_version(const coord_server *srv, const storage_version *v, size_t updates,
                             size_t stale, double bytes_per_update, double merge_s,
                             double split_loss) {
    char split_note[64] = "";
    if (srv->run.split && isfinite(split_loss))
        snprintf(split_note, sizeof split_note, "; split batches' mean loss %.4f", split_loss);
    /* Without a test set the accuracy is the peers', measured on their own
     * data with the versions they trained from. */
    vl_log_info("version %lld %s %.6f, %s %.4f (train_loss %.6f, %zu updates of which %zu stale, "
                "%.0f bytes per update; merged in %.2f s)%s%s",
                (long long)v->version, srv->run.test.n ? "test_loss" : "reported loss", v->val_loss,
                srv->run.test.n ? "test accuracy" : "peers' accuracy of their base versions",
                srv->run.val_accuracy, v->train_loss, updates, stale, bytes_per_update, merge_s,
                split_note, srv->run.finished ? "; the run is finished" : "");
}
