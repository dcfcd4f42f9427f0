/* Catching up by delta: a peer that holds version b and is handed a task
 * on version v fetches only the parameters that versions b+1..v changed,
 * with their values in v, which in compressed runs is far smaller than
 * the model. Everything in the file is checked before the base is
 * touched, and the result must hash to v's digest in the file: a delta
 * that left a version out cannot go unnoticed. */
#include <string.h>

#include "peer/peer.h"

static int meta_version(const st_file *f, const char *key, int64_t *out, vl_error *err) {
    const char *s = st_meta_get(f, key);
    if (!s || vl_parse_i64(s, 0, INT64_MAX, out) != VL_OK)
        return vl_fail(err, VL_EINVAL, "delta: metadata lacks a valid '%s'", key);
    return VL_OK;
}

static int check_delta(const peer_trainer *t, const st_file *f, const char *run, int64_t version,
                       const st_tensor **idx, const st_tensor **val, vl_error *err) {
    const char *mrun = st_meta_get(f, "run");
    if (run && (!mrun || strcmp(mrun, run) != 0))
        return vl_fail(err, VL_EINVAL, "delta: run '%s' is not the task's run '%s'",
                       mrun ? mrun : "(none)", run);
    int64_t since, to;
    int rc = meta_version(f, "since", &since, err);
    if (!rc) rc = meta_version(f, "version", &to, err);
    if (rc) return rc;
    if (since != t->base_version || to != version)
        return vl_fail(err, VL_EINVAL,
                       "delta: goes from version %lld to %lld; wanted %lld to "
                       "%lld",
                       (long long)since, (long long)to, (long long)t->base_version,
                       (long long)version);
    const char *sha = st_meta_get(f, "sha256");
    uint8_t want[32];
    if (!sha || strlen(sha) != 64 || vl_hex_decode(sha, 64, want, sizeof want) != 0)
        return vl_fail(err, VL_EINVAL, "delta: metadata lacks the version's sha256");
    *idx = st_find(f, "indices");
    *val = st_find(f, "values");
    if (!*idx || !*val || f->ntensors != 2)
        return vl_fail(err, VL_EINVAL, "delta: holds exactly 'indices' and 'values'");
    if ((*idx)->dtype != ST_U32 || (*idx)->ndim != 1 || (*val)->dtype != ST_F32 ||
        (*val)->ndim != 1 || (*idx)->numel != (*val)->numel)
        return vl_fail(err, VL_EINVAL, "delta: 'indices' must be U32 [n] and 'values' F32 [n]");
    size_t n = (size_t)(*idx)->numel;
    if (n > t->n_params)
        return vl_fail(err, VL_EINVAL, "delta: %zu entries for %zu parameters", n, t->n_params);
    uint32_t prev = 0;
    for (size_t j = 0; j < n; j++) {
        uint32_t i;
        float x;
        memcpy(&i, (*idx)->data + 4 * j, 4);
        memcpy(&x, (*val)->data + 4 * j, 4);
        if (i >= t->n_params || (j > 0 && i <= prev))
            return vl_fail(err, VL_EINVAL,
                           "delta: index %zu (%u) is out of range or out of "
                           "order",
                           j, i);
        if (!compress_all_finite(&x, 1))
            return vl_fail(err, VL_EINVAL, "delta: value %zu is not finite", j);
        prev = i;
    }
    return VL_OK;
}

/* Hashes the base as the delta would leave it, without touching it, and
 * compares with the version's digest in the file. */
static int check_result(const peer_trainer *t, const st_file *f, const st_tensor *idx,
                        const st_tensor *val, int64_t version, vl_error *err) {
    uint8_t want[32], got[VCRYPTO_DIGEST_MAX];
    if (vl_hex_decode(st_meta_get(f, "sha256"), 64, want, sizeof want) != 0)
        return vl_fail(err, VL_EINVAL, "delta: metadata lacks the version's sha256");
    vcrypto_digest *d = vcrypto_digest_new(VCRYPTO_DIGEST_SHA256);
    if (!d) return vl_fail(err, VL_ENOMEM, "delta: out of memory");
    size_t at = 0;
    for (size_t j = 0; j < (size_t)idx->numel; j++) {
        uint32_t i;
        memcpy(&i, idx->data + 4 * j, 4);
        vcrypto_digest_update(d, t->base + at, (i - at) * sizeof *t->base);
        vcrypto_digest_update(d, val->data + 4 * j, 4);
        at = (size_t)i + 1;
    }
    vcrypto_digest_update(d, t->base + at, (t->n_params - at) * sizeof *t->base);
    size_t n = vcrypto_digest_final(d, got);
    vcrypto_digest_free(d);
    if (n != 32 || memcmp(got, want, 32) != 0)
        return vl_fail(err, VL_EINVAL,
                       "delta: the result would not match version %lld's "
                       "digest",
                       (long long)version);
    return VL_OK;
}

int peer_trainer_apply_delta(peer_trainer *t, const uint8_t *bytes, size_t len, const char *run,
                             int64_t version, vl_error *err) {
    if ((!t->gpt && !t->mlp) || t->base_version < 0)
        return vl_fail(err, VL_EINVAL, "delta: no base model to apply it to");
    st_file f;
    vl_error e = {0};
    if (st_parse(bytes, len, &f, &e) != VL_OK) return vl_fail(err, VL_EINVAL, "delta: %s", e.msg);
    const st_tensor *idx = NULL, *val = NULL;
    int rc = check_delta(t, &f, run, version, &idx, &val, err);
    if (rc == VL_OK) rc = check_result(t, &f, idx, val, version, err);
    if (rc == VL_OK) {
        for (size_t j = 0; j < (size_t)idx->numel; j++) {
            uint32_t i;
            float x;
            memcpy(&i, idx->data + 4 * j, 4);
            memcpy(&x, val->data + 4 * j, 4);
            t->base[i] = x;
        }
        t->base_version = version;
    }
    st_free(&f);
    return rc;
}
