/* Surviving a restart: the trainer state file and the write-ahead record
 * of an upload (the protocol between them is described in peer.h). Both
 * files come from the peer's own disk, but a disk can be full, a file cut
 * short by a crash of an older version, or left from a run with another
 * model, so they are read as strictly as anything from the network: a
 * file that does not check out is ignored, never half applied. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "model/mlp_io.h"
#include "peer/kfac_internal.h"
#include "peer/peer.h"

#define STATE_FORMAT "volley-peer-state"
#define PENDING_FORMAT "volley-peer-pending"
#define FORMAT_VERSION_STR "1"

_Static_assert(PEER_RESUME_FORMAT_VERSION == 1, "FORMAT_VERSION_STR must follow it");

/* The most bytes either file may have for a model of n parameters. */
static size_t file_cap(size_t n) {
    if (n > (SIZE_MAX - PEER_RESUME_HEADER_ALLOWANCE) / PEER_RESUME_BYTES_PER_PARAM)
        return SIZE_MAX;
    return PEER_RESUME_HEADER_ALLOWANCE + PEER_RESUME_BYTES_PER_PARAM * n;
}

/* Room for either model's `model` JSON: a classifier's is the longer. */
#define MODEL_JSON_MAX MODEL_MLP_JSON_MAX

static int cfg_same(const model_gpt_config *a, const model_gpt_config *b) {
    return a->vocab_size == b->vocab_size && a->block_size == b->block_size &&
           a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd;
}

/* The same JSON the coordinator puts in a model file's `model` metadata,
 * so the parsers that read model files (peer_model_config_parse,
 * model_mlp_config_parse) read these too. */
static void cfg_json(const model_gpt_config *c, char *out, size_t cap) {
    snprintf(out, cap,
             "{\"vocab_size\":%d,\"block_size\":%d,\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d}",
             c->vocab_size, c->block_size, c->n_layer, c->n_head, c->n_embd);
}

/* The model r's state belongs to, as that JSON. */
static void shape_json(const peer_resume *r, char *out, size_t cap) {
    if (!r->mlp)
        cfg_json(&r->cfg, out, cap);
    else if (model_mlp_config_json(&r->mlp_cfg, out, cap) != VL_OK)
        snprintf(out, cap, "(a classifier)");
}

/* The parameters of r's model; r's configuration must be valid. */
static size_t shape_params(const peer_resume *r) {
    return r->mlp ? model_mlp_config_num_params(&r->mlp_cfg) : model_gpt_config_num_params(&r->cfg);
}

/* Whether t holds a model of the kind and shape r's state was saved for. */
static int shape_same(const peer_resume *r, const peer_trainer *t) {
    if (r->n_params != t->n_params) return 0;
    if (!r->mlp) return t->gpt && cfg_same(&r->cfg, &t->cfg);
    if (!t->mlp) return 0;
    model_mlp_config have = model_mlp_config_get(t->mlp);
    return model_mlp_config_equal(&have, &r->mlp_cfg);
}

/* Reads the `model` JSON into r's kind, configuration and n_params. */
static int shape_parse(const char *json, peer_resume *r, vl_error *err) {
    if (!json) return vl_fail(err, VL_EINVAL, "metadata lacks 'model'");
    size_t len = strlen(json);
    int rc;
    r->mlp = model_mlp_config_is_mlp(json, len);
    if (r->mlp) {
        rc = model_mlp_config_parse(json, len, &r->mlp_cfg, err);
    } else {
        rc = peer_model_config_parse(json, &r->cfg, err);
        if (!rc) rc = model_gpt_config_validate(&r->cfg, err);
    }
    if (rc) return rc;
    r->n_params = shape_params(r);
    if (r->n_params == 0) return vl_fail(err, VL_EINVAL, "model configuration has no parameters");
    return VL_OK;
}

/* Checks the format and version metadata shared by both files. */
static int check_format(const st_file *f, const char *want, vl_error *err) {
    const char *fmt = st_meta_get(f, "format");
    const char *ver = st_meta_get(f, "format_version");
    if (!fmt || strcmp(fmt, want) != 0)
        return vl_fail(err, VL_EINVAL, "not a %s file (format '%.40s')", want,
                       fmt ? fmt : "(none)");
    if (!ver || strcmp(ver, FORMAT_VERSION_STR) != 0)
        return vl_fail(err, VL_EINVAL, "format_version '%.20s' is not %d", ver ? ver : "(none)",
                       PEER_RESUME_FORMAT_VERSION);
    return VL_OK;
}

/* ---- trainer.st: writing ------------------------------------------------- */

void peer_resume_init(peer_resume *r) {
    memset(r, 0, sizeof *r);
}

void peer_resume_free(peer_resume *r) {
    model_adamw_free(&r->opt);
    model_sgd_free(&r->sgd);
    peer_kfac_state_free(r);
    free(r->residual);
    peer_resume_init(r);
}

static int meta_i64(st_writer *w, const char *key, long long x) {
    char v[32];
    snprintf(v, sizeof v, "%lld", x);
    return st_writer_meta(w, key, v);
}

/* %.9g brings every float back bit for bit. */
static int meta_float(st_writer *w, const char *key, float x) {
    char v[32];
    snprintf(v, sizeof v, "%.9g", (double)x);
    return st_writer_meta(w, key, v);
}

/* Serialises the state from borrowed vectors: st_writer_finish makes the
 * one copy the file needs. */
static int write_state(const char *dir, const peer_resume *r, vl_error *err) {
    size_t n = r->n_params;
    if (n == 0 || n != shape_params(r))
        return vl_fail(err, VL_EINVAL,
                       "trainer state: no model, or a size that does not match "
                       "its shape");
    if (r->opt.m && (r->opt.n != n || !r->opt.v))
        return vl_fail(err, VL_EINVAL,
                       "trainer state: optimizer of %zu parameters for a model "
                       "of %zu",
                       r->opt.n, n);
    if (r->sgd.buf && r->sgd.n != n)
        return vl_fail(err, VL_EINVAL,
                       "trainer state: SGD momentum of %zu parameters for a "
                       "model of %zu",
                       r->sgd.n, n);
    if (r->mlp && r->kfac_momentum)
        return vl_fail(err, VL_EINVAL, "trainer state: K-FAC state for a classifier");
    char path[PEER_PATH_MAX], model[MODEL_JSON_MAX];
    int rc = peer_path_join(path, sizeof path, dir, PEER_TRAINER_FILE, err);
    if (rc) return rc;
    shape_json(r, model, sizeof model);
    st_writer w;
    st_writer_init(&w);
    rc = st_writer_meta(&w, "format", STATE_FORMAT);
    if (!rc) rc = st_writer_meta(&w, "format_version", FORMAT_VERSION_STR);
    if (!rc) rc = st_writer_meta(&w, "coordinator", r->coordinator);
    if (!rc) rc = meta_i64(&w, "peer", (long long)r->peer_id);
    if (!rc) rc = st_writer_meta(&w, "run", r->run);
    if (!rc) rc = st_writer_meta(&w, "model", model);
    if (!rc) rc = meta_i64(&w, "params", (long long)n);
    if (!rc && r->pending_task > 0) rc = meta_i64(&w, "pending_task", (long long)r->pending_task);
    uint64_t shape[1] = {n};
    if (r->opt.m) {
        if (!rc) rc = meta_i64(&w, "adam_step", (long long)r->opt.step);
        if (!rc) rc = meta_float(&w, "adam_lr", r->opt.lr);
        if (!rc) rc = meta_float(&w, "adam_beta1", r->opt.beta1);
        if (!rc) rc = meta_float(&w, "adam_beta2", r->opt.beta2);
        if (!rc) rc = meta_float(&w, "adam_eps", r->opt.eps);
        if (!rc) rc = meta_float(&w, "adam_weight_decay", r->opt.weight_decay);
        if (!rc) rc = st_writer_add(&w, "adam.m", ST_F32, 1, shape, r->opt.m, n * sizeof(float));
        if (!rc) rc = st_writer_add(&w, "adam.v", ST_F32, 1, shape, r->opt.v, n * sizeof(float));
    }
    if (r->sgd.buf) {
        if (!rc) rc = meta_i64(&w, "sgd_step", (long long)r->sgd.step);
        if (!rc) rc = meta_float(&w, "sgd_lr", r->sgd.lr);
        if (!rc) rc = meta_float(&w, "sgd_momentum", r->sgd.momentum);
        if (!rc) rc = meta_float(&w, "sgd_weight_decay", r->sgd.weight_decay);
        if (!rc) rc = meta_i64(&w, "sgd_nesterov", r->sgd.nesterov);
        if (!rc) rc = st_writer_add(&w, "sgd.buf", ST_F32, 1, shape, r->sgd.buf, n * sizeof(float));
    }
    if (!rc && r->residual)
        rc = st_writer_add(&w, "residual", ST_F32, 1, shape, r->residual, n * sizeof(float));
    if (rc) {
        st_writer_free(&w);
        return vl_fail(err, rc, "trainer state: cannot describe the state");
    }
    void *scratch = NULL;
    if ((rc = peer_kfac_state_write(&w, r, &scratch, err))) {
        st_writer_free(&w);
        return rc;
    }
    vl_buf b;
    vl_buf_init(&b, file_cap(n));
    rc = st_writer_finish(&w, &b, err);
    st_writer_free(&w);
    free(scratch);
    if (!rc) rc = vl_file_write_atomic(path, b.data, b.len, 0600, err);
    vl_buf_free(&b);
    return rc;
}

int peer_resume_save(const char *dir, const peer_resume *r, vl_error *err) {
    return write_state(dir, r, err);
}

int peer_resume_save_trainer(const char *dir, const peer_trainer *t, const peer_state *owner,
                             int64_t pending_task, vl_error *err) {
    if (!t->gpt && !t->mlp) return vl_fail(err, VL_EINVAL, "trainer state: no model to save");
    /* A view: the struct borrows t's vectors and is never freed. */
    peer_resume view;
    peer_resume_init(&view);
    view.mlp = t->mlp != NULL;
    if (t->mlp)
        view.mlp_cfg = model_mlp_config_get(t->mlp);
    else
        view.cfg = t->cfg;
    view.n_params = t->n_params;
    snprintf(view.coordinator, sizeof view.coordinator, "%s", owner->coordinator);
    view.peer_id = owner->peer_id;
    snprintf(view.run, sizeof view.run, "%s", owner->run);
    if (t->have_opt) view.opt = t->opt;
    if (t->have_sgd) view.sgd = t->sgd;
    view.residual = t->residual;
    view.pending_task = pending_task;
    int rc = peer_kfac_state_view(&view, t, err);
    if (!rc) rc = write_state(dir, &view, err);
    free(view.kfac_factor_data); /* the view's own copy; the rest is borrowed */
    return rc;
}

/* ---- trainer.st: reading ------------------------------------------------- */

static int read_full(int fd, void *p, size_t n) {
    uint8_t *q = p;
    while (n > 0) {
        ssize_t r = read(fd, q, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        q += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Reads only the header of a state file for the model shape it names, so
 * the cap on the whole file can follow from that shape before a byte of
 * the data is read or allocated for. */
static int peek_shape(const char *path, peer_resume *shape, vl_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return vl_fail(err, errno == ENOENT ? VL_ENOTFOUND : VL_EIO, "cannot open: %s",
                       strerror(errno));
    struct stat st;
    uint8_t le[8];
    int rc = VL_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = vl_fail(err, VL_EINVAL, "not a regular file");
    else if (st.st_size < 8 || read_full(fd, le, 8) != 0)
        rc = vl_fail(err, VL_EINVAL, "truncated before its header");
    uint64_t hlen = 0;
    for (int i = 7; !rc && i >= 0; i--) hlen = hlen << 8 | le[i];
    if (!rc && (hlen < 2 || hlen > ST_MAX_HEADER || hlen > (uint64_t)st.st_size - 8))
        rc = vl_fail(err, VL_EINVAL, "header length %llu does not fit the file",
                     (unsigned long long)hlen);
    char *hdr = rc ? NULL : malloc((size_t)hlen);
    if (!rc && !hdr) rc = vl_fail(err, VL_ENOMEM, "out of memory for the header");
    if (!rc && read_full(fd, hdr, (size_t)hlen) != 0)
        rc = vl_fail(err, VL_EINVAL, "truncated in its header");
    close(fd);
    json_t *o = NULL;
    if (!rc) {
        json_error_t je;
        o = json_loadb(hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
        json_t *meta = json_object_get(o, "__metadata__");
        json_t *model = json_object_get(meta, "model");
        if (!json_is_string(model) || strlen(json_string_value(model)) != json_string_length(model))
            rc = vl_fail(err, VL_EINVAL, "header names no model configuration");
        else
            rc = shape_parse(json_string_value(model), shape, err);
    }
    json_decref(o);
    free(hdr);
    size_t n = shape->n_params;
    if (!rc && (uint64_t)st.st_size > file_cap(n))
        rc = vl_fail(err, VL_ETOOBIG, "%lld bytes, over the %zu allowed for %zu parameters",
                     (long long)st.st_size, file_cap(n), n);
    return rc;
}

/* Copies tensor name, which must be F32 [n], into dst and checks that
 * every value is finite (and >= 0 when nonneg). VL_ENOTFOUND when absent. */
static int take_vector(const st_file *f, const char *name, size_t n, float *dst, int nonneg,
                       vl_error *err) {
    const st_tensor *t = st_find(f, name);
    if (!t) return VL_ENOTFOUND;
    if (t->dtype != ST_F32 || t->ndim != 1 || t->shape[0] != n || t->numel != n ||
        t->nbytes != n * sizeof(float))
        return vl_fail(err, VL_EINVAL, "'%s' must be F32 of shape [%zu]", name, n);
    memcpy(dst, t->data, t->nbytes);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dst[i]) || (nonneg && dst[i] < 0))
            return vl_fail(err, VL_ERANGE, "'%s'[%zu] is %g", name, i, (double)dst[i]);
    return VL_OK;
}

static int meta_f32(const st_file *f, const char *key, float *out, vl_error *err) {
    const char *s = st_meta_get(f, key);
    double x;
    if (!s || vl_parse_f64(s, &x) != VL_OK || fabs(x) > 3.0e38)
        return vl_fail(err, VL_EINVAL, "metadata '%s' must be a finite number", key);
    *out = (float)x;
    return VL_OK;
}

static int read_optimizer(const st_file *f, size_t n, model_adamw *opt, vl_error *err) {
    int has_m = st_find(f, "adam.m") != NULL, has_v = st_find(f, "adam.v") != NULL;
    if (has_m != has_v) return vl_fail(err, VL_EINVAL, "adam.m and adam.v come together");
    if (!has_m) return VL_OK;
    float lr = 0, b1 = 0, b2 = 0, eps = 0, wd = 0;
    int64_t step;
    int rc = meta_f32(f, "adam_lr", &lr, err);
    if (!rc) rc = meta_f32(f, "adam_beta1", &b1, err);
    if (!rc) rc = meta_f32(f, "adam_beta2", &b2, err);
    if (!rc) rc = meta_f32(f, "adam_eps", &eps, err);
    if (!rc) rc = meta_f32(f, "adam_weight_decay", &wd, err);
    if (rc) return rc;
    const char *s = st_meta_get(f, "adam_step");
    if (!s || vl_parse_i64(s, 0, LONG_MAX, &step) != VL_OK)
        return vl_fail(err, VL_EINVAL, "metadata 'adam_step' must be an integer >= 0");
    vl_error e = {0};
    if ((rc = model_adamw_init(opt, n, lr, b1, b2, eps, wd, &e)))
        return vl_fail(err, rc == VL_ENOMEM ? rc : VL_EINVAL, "AdamW: %s", e.msg);
    opt->step = (long)step;
    if ((rc = take_vector(f, "adam.m", n, opt->m, 0, err))) return rc;
    return take_vector(f, "adam.v", n, opt->v, 1, err);
}

static int read_sgd(const st_file *f, size_t n, model_sgd *sgd, vl_error *err) {
    if (!st_find(f, "sgd.buf")) return VL_OK;
    float lr = 0, mu = 0, wd = 0;
    int64_t step, nesterov;
    int rc = meta_f32(f, "sgd_lr", &lr, err);
    if (!rc) rc = meta_f32(f, "sgd_momentum", &mu, err);
    if (!rc) rc = meta_f32(f, "sgd_weight_decay", &wd, err);
    if (rc) return rc;
    const char *s = st_meta_get(f, "sgd_step");
    if (!s || vl_parse_i64(s, 0, LONG_MAX, &step) != VL_OK)
        return vl_fail(err, VL_EINVAL, "metadata 'sgd_step' must be an integer >= 0");
    s = st_meta_get(f, "sgd_nesterov");
    if (!s || vl_parse_i64(s, 0, 1, &nesterov) != VL_OK)
        return vl_fail(err, VL_EINVAL, "metadata 'sgd_nesterov' must be 0 or 1");
    vl_error e = {0};
    if ((rc = model_sgd_init(sgd, n, lr, mu, wd, (int)nesterov, &e)))
        return vl_fail(err, rc == VL_ENOMEM ? rc : VL_EINVAL, "SGD: %s", e.msg);
    sgd->step = (long)step;
    return take_vector(f, "sgd.buf", n, sgd->buf, 0, err);
}

/* The registration the state belongs to: moments and a residual built for
 * another run (or another join to a run of the same name) mean nothing to
 * this one. */
static int read_owner(const st_file *f, const peer_state *owner, peer_resume *r, vl_error *err) {
    const char *coord = st_meta_get(f, "coordinator"), *peer = st_meta_get(f, "peer"),
               *run = st_meta_get(f, "run");
    if (!coord || strlen(coord) >= sizeof r->coordinator || !run || strlen(run) >= sizeof r->run ||
        !peer || vl_parse_i64(peer, 1, INT64_MAX, &r->peer_id) != VL_OK)
        return vl_fail(err, VL_EINVAL, "metadata lacks a usable 'coordinator', 'peer' or 'run'");
    if (strcmp(coord, owner->coordinator) != 0 || r->peer_id != owner->peer_id ||
        strcmp(run, owner->run) != 0)
        return vl_fail(err, VL_ECONFLICT,
                       "saved by peer %lld of run '%.64s' at %.80s; this is "
                       "peer %lld of run '%.64s' at %.80s",
                       (long long)r->peer_id, run, coord, (long long)owner->peer_id, owner->run,
                       owner->coordinator);
    snprintf(r->coordinator, sizeof r->coordinator, "%s", coord);
    snprintf(r->run, sizeof r->run, "%s", run);
    return VL_OK;
}

static int read_state(const st_file *f, const peer_state *owner, peer_resume *r, vl_error *err) {
    int rc = check_format(f, STATE_FORMAT, err);
    if (!rc) rc = read_owner(f, owner, r, err);
    if (rc) return rc;
    if ((rc = shape_parse(st_meta_get(f, "model"), r, err))) return rc;
    size_t n = r->n_params;
    const char *s = st_meta_get(f, "params");
    int64_t v;
    if (!s || vl_parse_i64(s, 1, INT64_MAX, &v) != VL_OK || (uint64_t)v != n)
        return vl_fail(err, VL_EINVAL, "metadata 'params' does not match the model's %zu", n);
    if ((s = st_meta_get(f, "pending_task")) && vl_parse_i64(s, 1, INT64_MAX, &r->pending_task))
        return vl_fail(err, VL_EINVAL, "metadata 'pending_task' must be a positive integer");
    size_t np = strlen(COMPRESS_FACTORS_PREFIX);
    for (int i = 0; i < f->ntensors; i++) {
        const char *nm = f->tensors[i].name;
        /* K-FAC factors are checked by their own reader, all of them. */
        if (strcmp(nm, "adam.m") && strcmp(nm, "adam.v") && strcmp(nm, "residual") &&
            strcmp(nm, "sgd.buf") && strcmp(nm, PEER_KFAC_MOMENTUM) &&
            strncmp(nm, COMPRESS_FACTORS_PREFIX, np))
            return vl_fail(err, VL_EINVAL, "unexpected tensor '%.64s'", nm);
    }
    if ((st_find(f, "adam.m") != NULL) + (st_find(f, "sgd.buf") != NULL) +
            (st_find(f, PEER_KFAC_MOMENTUM) != NULL) >
        1)
        return vl_fail(err, VL_EINVAL,
                       "the states of several optimizers (AdamW, SGD, K-FAC); "
                       "a trainer has one");
    if (r->mlp && (st_find(f, PEER_KFAC_MOMENTUM) || compress_factors_present(f)))
        return vl_fail(err, VL_EINVAL, "K-FAC state for a classifier, which K-FAC does not train");
    if ((rc = read_optimizer(f, n, &r->opt, err))) return rc;
    if ((rc = read_sgd(f, n, &r->sgd, err))) return rc;
    if ((rc = peer_kfac_state_read(f, r, err))) return rc;
    if (!st_find(f, "residual")) return VL_OK;
    r->residual = malloc(n * sizeof *r->residual);
    if (!r->residual) return vl_fail(err, VL_ENOMEM, "out of memory for the residual");
    return take_vector(f, "residual", n, r->residual, 0, err);
}

int peer_resume_load(const char *dir, const peer_state *owner, peer_resume *out, vl_error *err) {
    peer_resume_init(out);
    char path[PEER_PATH_MAX];
    int rc = peer_path_join(path, sizeof path, dir, PEER_TRAINER_FILE, err);
    if (rc) return rc;
    vl_error e = {0};
    peer_resume shape;
    peer_resume_init(&shape);
    if ((rc = peek_shape(path, &shape, &e)))
        return vl_fail(err, rc, PEER_TRAINER_FILE ": %s", e.msg);
    vl_buf b;
    vl_buf_init(&b, file_cap(shape.n_params));
    rc = vl_buf_read_file(&b, path, &e);
    st_file f;
    memset(&f, 0, sizeof f);
    if (!rc && (rc = st_parse(b.data, b.len, &f, &e)) != VL_OK) rc = VL_EINVAL;
    if (!rc) rc = read_state(&f, owner, out, &e);
    st_free(&f);
    vl_buf_free(&b);
    if (rc) {
        peer_resume_free(out);
        return vl_fail(err, rc, PEER_TRAINER_FILE ": %s", e.msg);
    }
    return VL_OK;
}

int peer_resume_apply(peer_trainer *t, peer_resume *r, vl_error *err) {
    if (r->n_params == 0) return VL_OK;
    if (!t->gpt && !t->mlp)
        return vl_fail(err, VL_EINVAL, "no model to apply the trainer state to");
    if (!shape_same(r, t)) {
        char want[MODEL_JSON_MAX], have[MODEL_JSON_MAX];
        peer_resume held;
        peer_resume_init(&held);
        held.mlp = t->mlp != NULL;
        if (t->mlp)
            held.mlp_cfg = model_mlp_config_get(t->mlp);
        else
            held.cfg = t->cfg;
        shape_json(r, want, sizeof want);
        shape_json(&held, have, sizeof have);
        peer_resume_free(r);
        return vl_fail(err, VL_ECONFLICT, "saved for model %s, this is %s", want, have);
    }
    if (r->opt.m) {
        model_adamw_free(&t->opt);
        t->opt = r->opt;
        memset(&r->opt, 0, sizeof r->opt);
        t->have_opt = 1;
    }
    if (r->sgd.buf) {
        model_sgd_free(&t->sgd);
        t->sgd = r->sgd;
        memset(&r->sgd, 0, sizeof r->sgd);
        t->have_sgd = 1;
    }
    int rc = peer_kfac_state_apply(t, r, err);
    if (rc) {
        peer_resume_free(r);
        return rc;
    }
    if (r->residual) {
        free(t->residual);
        t->residual = r->residual;
        r->residual = NULL;
        t->sel_nnz = 0;
    }
    peer_resume_free(r);
    return VL_OK;
}

/* ---- pending.st ------------------------------------------------------------ */

void peer_pending_init(peer_pending *p) {
    memset(p, 0, sizeof *p);
}

void peer_pending_free(peer_pending *p) {
    free(p->bytes);
    peer_pending_init(p);
}

int peer_pending_save(const char *dir, const peer_pending *p, size_t n_params, vl_error *err) {
    char path[PEER_PATH_MAX];
    int rc = peer_path_join(path, sizeof path, dir, PEER_PENDING_FILE, err);
    if (rc) return rc;
    if (p->task_id <= 0 || !p->bytes || p->len < 8)
        return vl_fail(err, VL_EINVAL, PEER_PENDING_FILE ": no upload to record");
    size_t cap = file_cap(n_params);
    if (p->len > cap - PEER_RESUME_HEADER_ALLOWANCE)
        return vl_fail(err, VL_ETOOBIG,
                       PEER_PENDING_FILE ": an upload of %zu bytes is over the "
                                         "%zu allowed for %zu parameters",
                       p->len, cap - PEER_RESUME_HEADER_ALLOWANCE, n_params);
    st_writer w;
    st_writer_init(&w);
    uint64_t shape[1] = {p->len};
    rc = st_writer_meta(&w, "format", PENDING_FORMAT);
    if (!rc) rc = st_writer_meta(&w, "format_version", FORMAT_VERSION_STR);
    if (!rc) rc = st_writer_meta(&w, "run", p->run);
    if (!rc) rc = meta_i64(&w, "task", (long long)p->task_id);
    if (!rc) rc = meta_i64(&w, "deadline", (long long)p->deadline);
    if (!rc) rc = st_writer_add(&w, "update", ST_U8, 1, shape, p->bytes, p->len);
    vl_buf b;
    vl_buf_init(&b, cap);
    if (rc)
        rc = vl_fail(err, rc, PEER_PENDING_FILE ": cannot describe the upload");
    else
        rc = st_writer_finish(&w, &b, err);
    st_writer_free(&w);
    if (!rc) rc = vl_file_write_atomic(path, b.data, b.len, 0600, err);
    vl_buf_free(&b);
    return rc;
}

static int read_pending(const st_file *f, const char *run, size_t n_params, peer_pending *p,
                        const st_tensor **upd, vl_error *err) {
    int rc = check_format(f, PENDING_FORMAT, err);
    if (rc) return rc;
    const char *frun = st_meta_get(f, "run"), *task = st_meta_get(f, "task"),
               *deadline = st_meta_get(f, "deadline");
    if (!frun || strlen(frun) >= sizeof p->run || (run && strcmp(frun, run) != 0))
        return vl_fail(err, VL_EINVAL, "recorded for run '%.64s', not this run",
                       frun ? frun : "(none)");
    if (!task || vl_parse_i64(task, 1, INT64_MAX, &p->task_id) != VL_OK)
        return vl_fail(err, VL_EINVAL, "metadata 'task' must be a positive integer");
    if (!deadline || vl_parse_i64(deadline, 0, INT64_MAX, &p->deadline) != VL_OK)
        return vl_fail(err, VL_EINVAL, "metadata 'deadline' must be an integer >= 0");
    snprintf(p->run, sizeof p->run, "%s", frun);
    const st_tensor *t = st_find(f, "update");
    if (f->ntensors != 1 || !t || t->dtype != ST_U8 || t->ndim != 1 || t->numel != t->nbytes ||
        t->nbytes < 8)
        return vl_fail(err, VL_EINVAL, "must hold exactly one U8 vector 'update'");
    compress_update u;
    vl_error e = {0};
    if (compress_update_decode(t->data, t->nbytes, n_params, &u, NULL, &e) != VL_OK)
        return vl_fail(err, VL_EINVAL, "the recorded update does not decode: %s", e.msg);
    if (u.meta.task != p->task_id || strcmp(u.meta.run, p->run) != 0)
        rc = vl_fail(err, VL_EINVAL, "the recorded update is for task %lld of run '%.64s'",
                     (long long)u.meta.task, u.meta.run);
    p->kind = u.meta.kind;
    compress_update_free(&u);
    *upd = t;
    return rc;
}

int peer_pending_load(const char *dir, const char *run, size_t n_params, peer_pending *out,
                      vl_error *err) {
    peer_pending_init(out);
    char path[PEER_PATH_MAX];
    int rc = peer_path_join(path, sizeof path, dir, PEER_PENDING_FILE, err);
    if (rc) return rc;
    vl_error e = {0};
    vl_buf b;
    vl_buf_init(&b, file_cap(n_params));
    rc = vl_buf_read_file(&b, path, &e);
    st_file f;
    memset(&f, 0, sizeof f);
    const st_tensor *upd = NULL;
    if (!rc && (rc = st_parse(b.data, b.len, &f, &e)) != VL_OK) rc = VL_EINVAL;
    if (!rc) rc = read_pending(&f, run, n_params, out, &upd, &e);
    if (!rc) {
        /* The update is the tail of the file: slide it to the front and
         * keep the file's memory rather than copy it. */
        size_t len = upd->nbytes;
        memmove(b.data, upd->data, len);
        b.len = len;
        out->bytes = vl_buf_steal(&b, &out->len);
    }
    st_free(&f);
    vl_buf_free(&b);
    if (rc) {
        peer_pending_init(out);
        return vl_fail(err, rc, PEER_PENDING_FILE ": %s", e.msg);
    }
    return VL_OK;
}

int peer_pending_clear(const char *dir, vl_error *err) {
    char path[PEER_PATH_MAX];
    int rc = peer_path_join(path, sizeof path, dir, PEER_PENDING_FILE, err);
    if (rc) return rc;
    if (unlink(path) != 0) {
        if (errno == ENOENT) return VL_OK;
        return vl_fail(err, VL_EIO, "cannot remove %s: %s", path, strerror(errno));
    }
    /* Without this a crash could bring back a record already settled, and
     * a second retry of an accepted upload might be answered as stale. */
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return vl_fail(err, VL_EIO, "cannot open %s: %s", dir, strerror(errno));
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return vl_fail(err, VL_EIO, "cannot sync %s: %s", dir, strerror(e));
    }
    close(fd);
    return VL_OK;
}

/* ---- settling ------------------------------------------------------------------ */

peer_upload_outcome peer_upload_classify(long status, const char *code) {
    if (status == 200 || status == 201 || status == 202) return PEER_UPLOAD_STORED;
    if (status == 409 && code && strcmp(code, "duplicate_update") == 0) return PEER_UPLOAD_STORED;
    /* "A rejected request changes nothing": every 4xx but a rate limit is
     * a definite no. Anything else may or may not have stored it. */
    if (status >= 400 && status < 500 && !peer_status_retryable(status))
        return PEER_UPLOAD_NOT_TAKEN;
    return PEER_UPLOAD_UNKNOWN;
}

/* residual[indices] += values for the recorded sparse update; the same
 * float additions peer_encode_unsent makes, so the result is bit for bit
 * what it was before the entries were taken out. */
static int put_back(peer_resume *r, const peer_pending *p, vl_error *err) {
    compress_update u;
    vl_error e = {0};
    if (compress_update_decode(p->bytes, p->len, r->n_params, &u, NULL, &e) != VL_OK)
        return vl_fail(err, VL_EINVAL, "recorded upload of task %lld: %s", (long long)p->task_id,
                       e.msg);
    int made = 0, rc = VL_OK;
    if (!r->residual) {
        r->residual = calloc(r->n_params, sizeof *r->residual);
        made = 1;
        if (!r->residual) rc = vl_fail(err, VL_ENOMEM, "out of memory for the residual");
    }
    if (!rc && (rc = compress_update_accumulate(&u, 1.0f, r->residual, r->n_params, &e)))
        rc = vl_fail(err, rc, "recorded upload of task %lld: %s", (long long)p->task_id, e.msg);
    if (rc && made) {
        free(r->residual);
        r->residual = NULL;
    }
    compress_update_free(&u);
    return rc;
}

int peer_pending_settle(peer_resume *r, const peer_pending *p, long status, const char *code,
                        peer_upload_outcome *out, vl_error *err) {
    peer_upload_outcome o = peer_upload_classify(status, code);
    if (o == PEER_UPLOAD_NOT_TAKEN && p->kind == COMPRESS_TOPK) {
        if (r->n_params == 0)
            return vl_fail(err, VL_EINVAL,
                           "no trainer state to put task %lld's entries back "
                           "into",
                           (long long)p->task_id);
        int rc = put_back(r, p, err);
        if (rc) return rc;
    }
    if (o != PEER_UPLOAD_UNKNOWN) r->pending_task = 0;
    *out = o;
    return VL_OK;
}

/* ---- at start -------------------------------------------------------------------- */

static void drop_pending(const char *dir, const char *why) {
    vl_error e = {0};
    if (peer_pending_clear(dir, &e) != VL_OK)
        vl_log_warn("%s %s, but it cannot be removed: %s", PEER_PENDING_FILE, why, e.msg);
}

int peer_resume_open(const char *dir, const peer_state *owner, peer_resume *r, peer_pending *p,
                     vl_error *err) {
    peer_pending_init(p);
    vl_error e = {0};
    int rc = peer_resume_load(dir, owner, r, &e);
    if (rc == VL_ENOMEM) return vl_fail(err, rc, "%s", e.msg);
    if (rc == VL_ENOTFOUND)
        vl_log_info("no trainer state in %s; training starts fresh", dir);
    else if (rc)
        vl_log_warn("trainer state ignored, training starts fresh: %s", e.msg);
    else
        vl_log_info("trainer state restored for %zu parameters: %s, %s residual; it "
                    "applies once a model of that shape is installed",
                    r->n_params,
                    r->opt.m           ? "AdamW moments"
                    : r->sgd.buf       ? "SGD momentum"
                    : r->kfac_momentum ? "K-FAC factors and momentum"
                                       : "no optimizer state",
                    r->residual ? "an error-feedback" : "no");
    if (r->pending_task == 0) {
        /* Recorded, but no usable state names it: either the process died
         * between the two writes, before sending it, or the state it went
         * with is gone, and with it anything to settle it against. */
        char path[PEER_PATH_MAX];
        struct stat st;
        if (peer_path_join(path, sizeof path, dir, PEER_PENDING_FILE, &e) == VL_OK &&
            lstat(path, &st) == 0) {
            vl_log_warn("%s is not named by a usable trainer state, so it was never sent or "
                        "cannot be settled; removing it",
                        PEER_PENDING_FILE);
            drop_pending(dir, "is unusable");
        }
        return VL_OK;
    }
    rc = peer_pending_load(dir, owner->run, r->n_params, p, &e);
    if (rc == VL_ENOMEM) return vl_fail(err, rc, "%s", e.msg);
    if (rc == VL_ENOTFOUND) {
        vl_log_debug("the upload of task %lld was settled before the restart",
                     (long long)r->pending_task);
    } else if (rc || p->task_id != r->pending_task) {
        /* Unreadable, or a newer record that was never sent. Keeping the
         * state as saved can at worst lose that upload's entries; putting
         * anything back without knowing could count them twice. */
        vl_log_warn("recorded upload ignored and removed: %s",
                    rc ? e.msg : "it is not the upload the trainer state names");
        peer_pending_free(p);
        drop_pending(dir, "is unusable");
    }
    if (!p->task_id) r->pending_task = 0;
    return VL_OK;
}
