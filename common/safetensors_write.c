/* Safetensors writer, and conversion of parsed tensors to float32. */
#include "common/common.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void st_writer_init(st_writer *w) {
    memset(w, 0, sizeof *w);
}

void st_writer_free(st_writer *w) {
    free(w->tensors);
    memset(w, 0, sizeof *w);
}

int st_writer_meta(st_writer *w, const char *key, const char *value) {
    if (!key || !value) return VL_EINVAL;
    size_t kl = strlen(key), vl = strlen(value);
    if (kl >= sizeof w->meta[0].key || vl >= sizeof w->meta[0].value) return VL_ETOOBIG;
    for (int i = 0; i < w->nmeta; i++)
        if (!strcmp(w->meta[i].key, key)) return VL_ECONFLICT;
    if (w->nmeta >= ST_MAX_META) return VL_ETOOBIG;
    memcpy(w->meta[w->nmeta].key, key, kl + 1);
    memcpy(w->meta[w->nmeta].value, value, vl + 1);
    w->nmeta++;
    return VL_OK;
}

int st_writer_add(st_writer *w, const char *name, st_dtype dt, int ndim, const uint64_t *shape,
                  const void *data, size_t nbytes) {
    if (!name) return VL_EINVAL;
    size_t nl = strlen(name);
    /* Mirror the parser's limits so that whatever is written can be read. */
    if (nl == 0 || nl >= sizeof w->tensors[0].name || !strcmp(name, "__metadata__"))
        return VL_EINVAL;
    if (st_dtype_size(dt) == 0 || ndim < 0 || ndim > ST_MAX_DIMS || (ndim > 0 && !shape))
        return VL_EINVAL;
    uint64_t numel = 1, want;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] > (uint64_t)INT64_MAX) /* JSON integers are signed 64-bit */
            return VL_EINVAL;
        if (__builtin_mul_overflow(numel, shape[i], &numel)) return VL_EINVAL;
    }
    if (__builtin_mul_overflow(numel, (uint64_t)st_dtype_size(dt), &want) || want != nbytes)
        return VL_EINVAL;
    if (nbytes > 0 && !data) return VL_EINVAL;
    for (int i = 0; i < w->ntensors; i++)
        if (!strcmp(w->tensors[i].name, name)) return VL_ECONFLICT;
    if (w->ntensors >= ST_MAX_TENSORS) return VL_ETOOBIG;
    if (w->ntensors == w->alloc) {
        int na = w->alloc ? w->alloc * 2 : 16;
        void *p = realloc(w->tensors, (size_t)na * sizeof *w->tensors);
        if (!p) return VL_ENOMEM;
        w->tensors = p;
        w->alloc = na;
    }
    struct st_wtensor *t = &w->tensors[w->ntensors++];
    memset(t, 0, sizeof *t);
    memcpy(t->name, name, nl + 1);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = data;
    t->nbytes = nbytes;
    return VL_OK;
}

/* Data is laid out by decreasing element size (stable, so insertion order
 * within a size): since the block starts 8-aligned and every tensor's size
 * is a multiple of its element size, every tensor then lands aligned without
 * padding, which the parser forbids. The header keeps insertion order. */
static int layout_cmp(const void *a, const void *b, const st_writer *w) {
    int x = *(const int *)a, y = *(const int *)b;
    size_t sx = st_dtype_size(w->tensors[x].dtype), sy = st_dtype_size(w->tensors[y].dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return x - y;
}

static void layout_sort(int *order, int n, const st_writer *w) {
    /* Insertion sort: qsort has no context argument in C11, and n is small
     * enough (<= ST_MAX_TENSORS) with few distinct keys in practice. */
    for (int i = 1; i < n; i++) {
        int v = order[i], j = i;
        while (j > 0 && layout_cmp(&order[j - 1], &v, w) > 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
}

int st_writer_finish(st_writer *w, vl_buf *out, vl_error *err) {
    int n = w->ntensors;
    int rc = VL_OK;
    int *order = NULL;
    uint64_t *begin = NULL;
    char *hdr = NULL;
    json_t *root = json_object();
    if (!root) return vl_fail(err, VL_ENOMEM, "safetensors: out of memory");
    if (n > 0) {
        order = malloc((size_t)n * sizeof *order);
        begin = malloc((size_t)n * sizeof *begin);
        if (!order || !begin) {
            rc = vl_fail(err, VL_ENOMEM, "safetensors: out of memory");
            goto done;
        }
    }
    for (int i = 0; i < n; i++) order[i] = i;
    layout_sort(order, n, w);
    uint64_t pos = 0;
    for (int i = 0; i < n; i++) {
        begin[order[i]] = pos;
        if (__builtin_add_overflow(pos, (uint64_t)w->tensors[order[i]].nbytes, &pos) ||
            pos > (uint64_t)INT64_MAX) {
            rc = vl_fail(err, VL_ETOOBIG, "safetensors: data block size overflows");
            goto done;
        }
    }
    uint64_t data_len = pos;

    if (w->nmeta > 0) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m) != 0) {
            rc = vl_fail(err, VL_ENOMEM, "safetensors: out of memory");
            goto done;
        }
        for (int i = 0; i < w->nmeta; i++) {
            if (json_object_set_new(m, w->meta[i].key, json_string(w->meta[i].value)) != 0) {
                rc = vl_fail(err, VL_EINVAL, "safetensors: bad metadata '%s' (not UTF-8?)",
                             w->meta[i].key);
                goto done;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        const struct st_wtensor *t = &w->tensors[i];
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        int bad = !e || !shape || !offs;
        for (int d = 0; !bad && d < t->ndim; d++)
            bad = json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) != 0;
        if (!bad)
            bad =
                json_array_append_new(offs, json_integer((json_int_t)begin[i])) != 0 ||
                json_array_append_new(offs, json_integer((json_int_t)(begin[i] + t->nbytes))) != 0;
        if (!bad) bad = json_object_set_new(e, "dtype", json_string(st_dtype_name(t->dtype))) != 0;
        if (!bad) {
            bad = json_object_set_new(e, "shape", shape) != 0;
            shape = NULL;
        }
        if (!bad) {
            bad = json_object_set_new(e, "data_offsets", offs) != 0;
            offs = NULL;
        }
        json_decref(shape);
        json_decref(offs);
        if (bad || json_object_set_new(root, t->name, e) != 0) {
            if (bad) json_decref(e);
            rc = vl_fail(err, VL_EINVAL, "safetensors: cannot encode '%s' (not UTF-8?)", t->name);
            goto done;
        }
    }

    hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!hdr) {
        rc = vl_fail(err, VL_ENOMEM, "safetensors: cannot serialise header");
        goto done;
    }
    size_t hl = strlen(hdr);
    size_t padded = hl + (8 - (8 + hl) % 8) % 8;
    if (padded > ST_MAX_HEADER) {
        rc = vl_fail(err, VL_ETOOBIG, "safetensors: header of %zu bytes exceeds %zu", padded,
                     ST_MAX_HEADER);
        goto done;
    }
    if (data_len > SIZE_MAX - 8 - padded) {
        rc = vl_fail(err, VL_ETOOBIG, "safetensors: file size overflows");
        goto done;
    }
    size_t total = 8 + padded + (size_t)data_len;
    /* Reserve everything first so a failure leaves out untouched. */
    if ((rc = vl_buf_reserve(out, total)) != VL_OK) {
        rc = vl_fail(err, rc, "safetensors: cannot fit %zu bytes in the output buffer", total);
        goto done;
    }
    uint8_t *p = out->data + out->len;
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(p + 8, hdr, hl);
    memset(p + 8 + hl, ' ', padded - hl);
    uint8_t *d = p + 8 + padded;
    for (int i = 0; i < n; i++) {
        const struct st_wtensor *t = &w->tensors[order[i]];
        if (t->nbytes) memcpy(d + begin[order[i]], t->data, t->nbytes);
    }
    out->len += total;
    out->data[out->len] = '\0';

done:
    free(hdr);
    free(order);
    free(begin);
    json_decref(root);
    return rc;
}

int st_tensor_to_f32(const st_tensor *t, float *dst, size_t n, vl_error *err) {
    if (n != t->numel)
        return vl_fail(err, VL_EINVAL, "%s: asked for %zu floats but it has %llu elements", t->name,
                       n, (unsigned long long)t->numel);
    size_t es = st_dtype_size(t->dtype);
    if (es == 0 || n > SIZE_MAX / es || t->nbytes != n * es)
        return vl_fail(err, VL_EINVAL, "%s: byte size does not match its shape", t->name);
        /* Elements are loaded byte-wise (via memcpy) because the file may sit at
     * any address; safetensors data is little-endian, as is every supported
     * host. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "volley assumes a little-endian host"
#endif
    switch (t->dtype) {
    case ST_F32:
        if (n) memcpy(dst, t->data, n * sizeof(float));
        return VL_OK;
    case ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            dst[i] = vl_f16_to_f32(h);
        }
        return VL_OK;
    default:
        return vl_fail(err, VL_EINVAL, "%s: cannot convert %s to F32", t->name,
                       st_dtype_name(t->dtype));
    }
}
