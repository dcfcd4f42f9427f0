/* Safetensors parser. Every byte of the input is untrusted (it arrives from
 * peers over the network), so each length, offset and count is checked
 * before it is used, and the tensors must tile the data block exactly.
 *
 * Alignment: a tensor's data must start at a multiple of its element size
 * counted from the first byte of the file (writers pad the header so the
 * data block begins 8-aligned). The check is on offsets, not on host
 * pointers, so parsing a file that sits at an odd address in memory still
 * succeeds; readers must then load elements with memcpy (as
 * st_tensor_to_f32 does) or copy the file to aligned memory first. */
#include "common/common.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[] = {
    [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2},
    [ST_U32] = {"U32", 4}, [ST_I32] = {"I32", 4}, [ST_U16] = {"U16", 2},
    [ST_U8] = {"U8", 1},   [ST_I64] = {"I64", 8}, [ST_F64] = {"F64", 8},
};
#define NDTYPES ((int)(sizeof dtype_info / sizeof dtype_info[0]))

size_t st_dtype_size(st_dtype dt) {
    if ((int)dt < 0 || (int)dt >= NDTYPES) return 0;
    return dtype_info[dt].size;
}

const char *st_dtype_name(st_dtype dt) {
    if ((int)dt < 0 || (int)dt >= NDTYPES) return "?";
    return dtype_info[dt].name;
}

int st_dtype_parse(const char *name, st_dtype *out) {
    if (!name) return VL_EINVAL;
    for (int i = 0; i < NDTYPES; i++) {
        if (!strcmp(name, dtype_info[i].name)) {
            *out = (st_dtype)i;
            return VL_OK;
        }
    }
    return VL_EINVAL;
}

static uint64_t load_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Extent of one tensor in the data block, for the tiling check. */
typedef struct {
    uint64_t begin, end;
    int idx;
} extent;

static int extent_cmp(const void *a, const void *b) {
    const extent *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx - y->idx;
}

static int parse_meta(json_t *m, st_file *out, vl_error *err) {
    if (!json_is_object(m))
        return vl_fail(err, VL_EINVAL, "safetensors: __metadata__ is not an object");
    if (json_object_size(m) > ST_MAX_META)
        return vl_fail(err, VL_ETOOBIG, "safetensors: %zu metadata entries (max %d)",
                       json_object_size(m), ST_MAX_META);
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach(m, key, key_len, val) {
        if (!json_is_string(val))
            return vl_fail(err, VL_EINVAL,
                           "safetensors: metadata value for '%.64s' is not a string", key);
        size_t vlen = json_string_length(val);
        const char *v = json_string_value(val);
        if (key_len >= sizeof out->meta[0].key || strlen(key) != key_len)
            return vl_fail(err, VL_EINVAL, "safetensors: metadata key of %zu bytes (max %zu)",
                           key_len, sizeof out->meta[0].key - 1);
        if (vlen >= sizeof out->meta[0].value || strlen(v) != vlen)
            return vl_fail(err, VL_EINVAL,
                           "safetensors: metadata value for '%s' of %zu bytes (max %zu)", key, vlen,
                           sizeof out->meta[0].value - 1);
        st_meta *e = &out->meta[out->nmeta++];
        memcpy(e->key, key, key_len + 1);
        memcpy(e->value, v, vlen + 1);
    }
    return VL_OK;
}

/* Validates one tensor entry; data_len is the size of the data block and
 * data_start its offset from the start of the file. */
static int parse_entry(const char *name, size_t name_len, json_t *obj, uint64_t data_start,
                       uint64_t data_len, st_tensor *t, extent *ext, vl_error *err) {
    if (name_len == 0 || name_len >= sizeof t->name || strlen(name) != name_len)
        return vl_fail(err, VL_EINVAL, "safetensors: tensor name of %zu bytes (need 1..%zu)",
                       name_len, sizeof t->name - 1);
    memcpy(t->name, name, name_len + 1);
    if (!json_is_object(obj))
        return vl_fail(err, VL_EINVAL, "safetensors: entry '%s' is not an object", name);

    json_t *jd = NULL, *js = NULL, *jo = NULL;
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        if (!strcmp(k, "dtype"))
            jd = v;
        else if (!strcmp(k, "shape"))
            js = v;
        else if (!strcmp(k, "data_offsets"))
            jo = v;
        else
            return vl_fail(err, VL_EINVAL, "safetensors: '%s' has unexpected field '%.32s'", name,
                           k);
    }
    if (!jd || !js || !jo)
        return vl_fail(err, VL_EINVAL, "safetensors: '%s' needs dtype, shape and data_offsets",
                       name);

    if (!json_is_string(jd) || st_dtype_parse(json_string_value(jd), &t->dtype) != VL_OK)
        return vl_fail(err, VL_EINVAL, "safetensors: '%s' has unknown dtype %.16s", name,
                       json_is_string(jd) ? json_string_value(jd) : "(not a string)");
    uint64_t esize = st_dtype_size(t->dtype);

    if (!json_is_array(js))
        return vl_fail(err, VL_EINVAL, "safetensors: '%s' shape is not an array", name);
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return vl_fail(err, VL_EINVAL, "safetensors: '%s' has %zu dims (max %d)", name, nd,
                       ST_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return vl_fail(err, VL_EINVAL,
                           "safetensors: '%s' dim %zu is not a non-negative integer", name, i);
        t->shape[i] = (uint64_t)json_integer_value(d);
        if (__builtin_mul_overflow(numel, t->shape[i], &numel))
            return vl_fail(err, VL_EINVAL, "safetensors: '%s' element count overflows", name);
    }
    t->numel = numel;
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, esize, &nbytes) || nbytes > SIZE_MAX)
        return vl_fail(err, VL_EINVAL, "safetensors: '%s' byte size overflows", name);

    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return vl_fail(err, VL_EINVAL, "safetensors: '%s' data_offsets is not [begin, end]", name);
    json_int_t b = json_integer_value(json_array_get(jo, 0));
    json_int_t e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b)
        return vl_fail(err, VL_EINVAL, "safetensors: '%s' data_offsets [%lld, %lld] invalid", name,
                       (long long)b, (long long)e);
    if ((uint64_t)e > data_len)
        return vl_fail(err, VL_EINVAL,
                       "safetensors: '%s' ends at %lld, past the %llu-byte data block", name,
                       (long long)e, (unsigned long long)data_len);
    if ((uint64_t)(e - b) != nbytes)
        return vl_fail(err, VL_EINVAL,
                       "safetensors: '%s' is %llu bytes by shape but %lld by data_offsets", name,
                       (unsigned long long)nbytes, (long long)(e - b));
    /* Empty tensors are never dereferenced, so their position is irrelevant. */
    if (nbytes > 0 && (data_start + (uint64_t)b) % esize != 0)
        return vl_fail(err, VL_EINVAL,
                       "safetensors: '%s' at file offset %llu is not aligned to %llu bytes", name,
                       (unsigned long long)(data_start + (uint64_t)b), (unsigned long long)esize);
    t->nbytes = (size_t)nbytes;
    ext->begin = (uint64_t)b;
    ext->end = (uint64_t)e;
    return VL_OK;
}

int st_parse(const uint8_t *bytes, size_t len, st_file *out, vl_error *err) {
    memset(out, 0, sizeof *out);
    if (!bytes || len < 8)
        return vl_fail(err, VL_EINVAL, "safetensors: %zu bytes is too short for a header length",
                       bytes ? len : 0);
    uint64_t hlen = load_le64(bytes);
    if (hlen > ST_MAX_HEADER)
        return vl_fail(err, VL_ETOOBIG, "safetensors: header length %llu exceeds %zu",
                       (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > len - 8)
        return vl_fail(err, VL_EINVAL,
                       "safetensors: header length %llu runs past the %zu-byte input",
                       (unsigned long long)hlen, len);

    json_error_t jerr;
    json_t *root = json_loadb((const char *)bytes + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return vl_fail(err, VL_EINVAL, "safetensors: bad header JSON at byte %d: %.120s",
                       jerr.position, jerr.text);
    int rc = VL_OK;
    extent *ext = NULL;
    if (!json_is_object(root)) {
        rc = vl_fail(err, VL_EINVAL, "safetensors: header is not a JSON object");
        goto fail;
    }

    uint64_t data_start = 8 + hlen;
    uint64_t data_len = (uint64_t)len - data_start;
    json_t *meta = json_object_get(root, "__metadata__");
    size_t count = json_object_size(root) - (meta ? 1 : 0);
    if (count > ST_MAX_TENSORS) {
        rc = vl_fail(err, VL_ETOOBIG, "safetensors: %zu tensors (max %d)", count, ST_MAX_TENSORS);
        goto fail;
    }
    if (meta && (rc = parse_meta(meta, out, err)) != VL_OK) goto fail;

    if (count > 0) {
        out->tensors = calloc(count, sizeof *out->tensors);
        ext = calloc(count, sizeof *ext);
        if (!out->tensors || !ext) {
            rc = vl_fail(err, VL_ENOMEM, "safetensors: out of memory for %zu tensors", count);
            goto fail;
        }
    }
    const char *key;
    size_t key_len;
    json_t *val;
    int n = 0;
    /* jansson iterates objects in insertion order, so tensors keep file order. */
    json_object_keylen_foreach(root, key, key_len, val) {
        if (val == meta) continue;
        st_tensor *t = &out->tensors[n];
        if ((rc = parse_entry(key, key_len, val, data_start, data_len, t, &ext[n], err)) != VL_OK)
            goto fail;
        t->data = bytes + data_start + ext[n].begin;
        ext[n].idx = n;
        n++;
    }
    out->ntensors = n;

    /* The tensors must cover the data block exactly once: sorted by start,
     * each must begin where the previous one ended. */
    if (n > 0) qsort(ext, (size_t)n, sizeof *ext, extent_cmp);
    uint64_t pos = 0;
    for (int i = 0; i < n; i++) {
        if (ext[i].begin < pos) {
            rc = vl_fail(err, VL_EINVAL, "safetensors: '%s' overlaps the previous tensor",
                         out->tensors[ext[i].idx].name);
            goto fail;
        }
        if (ext[i].begin > pos) {
            rc = vl_fail(err, VL_EINVAL,
                         "safetensors: gap of %llu bytes in the data block before '%s'",
                         (unsigned long long)(ext[i].begin - pos), out->tensors[ext[i].idx].name);
            goto fail;
        }
        pos = ext[i].end;
    }
    if (pos != data_len) {
        rc = vl_fail(err, VL_EINVAL, "safetensors: %llu trailing bytes after the last tensor",
                     (unsigned long long)(data_len - pos));
        goto fail;
    }
    free(ext);
    json_decref(root);
    return VL_OK;

fail:
    free(ext);
    json_decref(root);
    st_free(out);
    return rc;
}

void st_free(st_file *f) {
    if (!f) return;
    free(f->tensors);
    f->tensors = NULL;
    f->ntensors = 0;
    f->nmeta = 0;
}

const st_tensor *st_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->ntensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

const char *st_meta_get(const st_file *f, const char *key) {
    for (int i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta[i].key, key)) return f->meta[i].value;
    return NULL;
}
