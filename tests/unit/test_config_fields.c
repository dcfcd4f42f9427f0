/* coordinator/config: the table of the run configuration's fields
 * (fields.h). Walks every row: each bound is refused just beyond it with
 * a message naming the field and the bound, and taken at it; each choice
 * list refuses what is not on it; each boolean refuses a number; each
 * row's key is known and a sibling that names no row is refused; every
 * field written back reads back to the same JSON; the defaults are the
 * rows'. Linked against the config layer alone. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coordinator/config/config.h"
#include "coordinator/config/fields.h"

/* A GPT on a text corpus: every row outside the model's other kind
 * (mlp) is read in it, whether or not the run then uses the field. */
#define BASE "{\"name\": \"t\", \"corpus\": \"c.txt\"}"

/* BASE with the field at dotted path name set to value (JSON text). */
static char *with_field(const char *name, const char *value) {
    json_t *root = json_loads(BASE, 0, NULL), *obj = root;
    char path[128];
    snprintf(path, sizeof path, "%s", name);
    char *p = path, *dot;
    while ((dot = strchr(p, '.'))) {
        *dot = '\0';
        json_t *next = json_object_get(obj, p);
        if (!next) {
            next = json_object();
            json_object_set_new(obj, p, next);
        }
        obj = next;
        p = dot + 1;
    }
    json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
    assert_non_null(v);
    json_object_set_new(obj, p, v);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

/* Parses BASE with name = value; returns the code, the message in msg. */
static int try_field(const char *name, const char *value, char *msg, size_t cap) {
    char *js = with_field(name, value);
    coord_config cfg;
    vl_error e = {0};
    int rc = coord_config_parse(js, strlen(js), &cfg, &e);
    snprintf(msg, cap, "%s", e.msg);
    if (rc == VL_OK) coord_config_free(&cfg);
    free(js);
    return rc;
}

static void expect_refused(const char *name, const char *value, const char *needle) {
    char msg[512];
    int rc = try_field(name, value, msg, sizeof msg);
    if (rc != VL_EINVAL || !strstr(msg, needle))
        fprintf(stderr, "%s = %s: rc %d, \"%s\" (wanted \"%s\")\n", name, value, rc, msg, needle);
    assert_int_equal(rc, VL_EINVAL);
    assert_non_null(strstr(msg, needle));
}

/* A value at the bound passes the field's own check: whatever refuses
 * the configuration then (another field's rule) does not name the bound. */
static void expect_bound_taken(const char *name, const char *value, const char *bound_msg) {
    char msg[512];
    if (try_field(name, value, msg, sizeof msg) != VL_OK && strstr(msg, bound_msg)) {
        fprintf(stderr, "%s = %s refused at its own bound: %s\n", name, value, msg);
        fail();
    }
}

/* Every INT and REAL row: just beyond each bound is refused with the
 * row's message, the bound itself is not. */
static void test_every_bound_refused(void **state) {
    (void)state;
    size_t n, checked = 0;
    const coord_config_field *rows = coord_config_fields(&n);
    for (size_t i = 0; i < n; i++) {
        const coord_config_field *f = &rows[i];
        if (f->get) continue; /* its own form and message (tested where it is defined) */
        char msg[256], below[64], above[64], lo[64], hi[64];
        if (f->type == COORD_FIELD_INT) {
            snprintf(msg, sizeof msg, "config: %s must be between %lld and %lld (got ", f->name,
                     (long long)f->imin, (long long)f->imax);
            snprintf(lo, sizeof lo, "%lld", (long long)f->imin);
            snprintf(hi, sizeof hi, "%lld", (long long)f->imax);
            if (f->imin > INT64_MIN) {
                snprintf(below, sizeof below, "%lld", (long long)f->imin - 1);
                expect_refused(f->name, below, msg);
            }
            if (f->imax < INT64_MAX) {
                snprintf(above, sizeof above, "%lld", (long long)f->imax + 1);
                expect_refused(f->name, above, msg);
            }
            expect_bound_taken(f->name, lo, msg);
            expect_bound_taken(f->name, hi, msg);
            expect_refused(f->name, "1.5", "must be an integer");
            expect_refused(f->name, "\"1\"", "must be an integer");
        } else if (f->type == COORD_FIELD_REAL) {
            snprintf(msg, sizeof msg, "config: %s must be in %s%g, %g%s (got ", f->name,
                     f->lo_open ? "(" : "[", f->lo, f->hi, f->hi_open ? ")" : "]");
            double step_lo = fmax(fabs(f->lo) * 1e-3, 1e-6),
                   step_hi = fmax(fabs(f->hi) * 1e-3, 1e-6);
            snprintf(below, sizeof below, "%.17g", f->lo_open ? f->lo : f->lo - step_lo);
            snprintf(above, sizeof above, "%.17g", f->hi_open ? f->hi : f->hi + step_hi);
            expect_refused(f->name, below, msg);
            expect_refused(f->name, above, msg);
            snprintf(lo, sizeof lo, "%.17g", f->lo_open ? f->lo + step_lo : f->lo);
            snprintf(hi, sizeof hi, "%.17g", f->hi_open ? f->hi - step_hi : f->hi);
            expect_bound_taken(f->name, lo, msg);
            expect_bound_taken(f->name, hi, msg);
            expect_refused(f->name, "\"1\"", "must be a number");
        } else {
            continue;
        }
        checked++;
    }
    assert_true(checked >= 60);
}

/* Choices, booleans, strings and sections each refuse what they are not. */
static void test_every_type_refused(void **state) {
    (void)state;
    size_t n;
    const coord_config_field *rows = coord_config_fields(&n);
    for (size_t i = 0; i < n; i++) {
        const coord_config_field *f = &rows[i];
        if (f->get) continue;
        char msg[160];
        switch (f->type) {
        case COORD_FIELD_STR:
        case COORD_FIELD_ENUM:
            snprintf(msg, sizeof msg, "config: %s must be a string", f->name);
            expect_refused(f->name, "7", msg);
            snprintf(msg, sizeof msg, "config: %s must be a non-empty string", f->name);
            expect_refused(f->name, "\"\"", msg);
            if (f->choices) {
                snprintf(msg, sizeof msg, "config: %s must be one of \"%s\"", f->name,
                         f->choices[0]);
                expect_refused(f->name, "\"nope\"", msg);
            }
            break;
        case COORD_FIELD_BOOL:
            snprintf(msg, sizeof msg, "config: %s must be true or false", f->name);
            expect_refused(f->name, "1", msg);
            break;
        case COORD_FIELD_SECTION:
            snprintf(msg, sizeof msg, "config: %s must be an object", f->name);
            expect_refused(f->name, "[]", msg);
            break;
        default: break;
        }
    }
}

/* Every row's key is known where it is; a sibling naming no row is not. */
static void test_keys(void **state) {
    (void)state;
    size_t n;
    const coord_config_field *rows = coord_config_fields(&n);
    for (size_t i = 0; i < n; i++) {
        const coord_config_field *f = &rows[i];
        char msg[256], sib[160];
        /* Any refusal of a known key is about its value, not the key. */
        try_field(f->name, "null", msg, sizeof msg);
        assert_null(strstr(msg, "unknown field"));
        if (f->flags & COORD_FIELD_GPT) continue; /* model.x is the mlp's to refuse as well */
        const char *dot = strrchr(f->name, '.');
        snprintf(sib, sizeof sib, "%.*s%sno_such_key", dot ? (int)(dot - f->name) : 0, f->name,
                 dot ? "." : "");
        if (strncmp(sib, "model.", 6) == 0) continue;
        snprintf(msg, sizeof msg, "config: unknown field '%s'", sib);
        expect_refused(sib, "1", msg);
    }
}

/* The normalised JSON of several runs reads back to itself, and holds
 * every row the run writes. */
static void test_written_reads_back(void **state) {
    (void)state;
    static const char *const runs[] = {
        BASE,
        "{\"name\": \"k\", \"corpus\": \"c.txt\", \"train\": {\"optimizer\": \"kfac\"}}",
        "{\"name\": \"a\", \"corpus\": \"c.txt\", \"mode\": \"async\", \"compression\": "
        "{\"kind\": \"topk\", \"ratio\": 100}, \"robust\": {\"rule\": \"median\", "
        "\"max_norm\": 3}, \"updates_per_version\": 5}",
        "{\"name\": \"s\", \"data\": {\"kind\": \"shards\", \"train\": [\"a.bin\"], \"val\": "
        "\"v.bin\"}, \"compression\": {\"kind\": \"sketch\", \"ratio\": 30}}",
        "{\"name\": \"m\", \"model\": {\"kind\": \"mlp\", \"in_dim\": 16, \"hidden\": [8, 8], "
        "\"classes\": 4}, \"data\": {\"kind\": \"local\"}, \"mode\": \"split\", \"split\": "
        "{\"cut\": 1, \"alpha\": 0.5}}",
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        coord_config cfg, again;
        vl_error e = {0};
        int rc = coord_config_parse(runs[r], strlen(runs[r]), &cfg, &e);
        if (rc != VL_OK) fprintf(stderr, "run %zu: %s\n", r, e.msg);
        assert_int_equal(rc, VL_OK);
        char *js = coord_config_to_json(&cfg, 1);
        assert_non_null(js);
        assert_int_equal(coord_config_parse(js, strlen(js), &again, &e), VL_OK);
        char *js2 = coord_config_to_json(&again, 1);
        assert_string_equal(js, js2);
        json_t *root = json_loads(js, 0, NULL);
        size_t n;
        const coord_config_field *rows = coord_config_fields(&n);
        size_t present = 0;
        for (size_t i = 0; i < n; i++) {
            const coord_config_field *f = &rows[i];
            json_t *o = root;
            char path[128];
            snprintf(path, sizeof path, "%s", f->name);
            for (char *p = strtok(path, "."); p && o; p = strtok(NULL, "."))
                o = json_object_get(o, p);
            int expected = !(f->flags & COORD_FIELD_UNWRITTEN) && f->type != COORD_FIELD_CODE &&
                           !((f->flags & COORD_FIELD_GPT) && cfg.net == COORD_NET_MLP) &&
                           (!f->written || f->written(&cfg));
            /* data's put writes a text run's corpus in its place; corpus
             * and what resolves into other fields are not the table's. */
            if (strcmp(f->name, "data") == 0 || (f->flags & COORD_FIELD_UNWRITTEN) ||
                f->type == COORD_FIELD_CODE)
                continue;
            if (expected && !o && strchr(f->name, '.')) {
                /* Its section was not written (K-FAC's without K-FAC). */
                char sec[128];
                snprintf(sec, sizeof sec, "%.*s", (int)(strrchr(f->name, '.') - f->name), f->name);
                const coord_config_field *s = coord_config_field_find(sec);
                if (s && s->written && !s->written(&cfg)) continue;
            }
            if (expected != (o != NULL)) fprintf(stderr, "run %zu: %s\n", r, f->name);
            assert_int_equal(expected, o != NULL);
            present += o != NULL;
        }
        assert_true(present > 40);
        json_decref(root);
        free(js);
        free(js2);
        coord_config_free(&cfg);
        coord_config_free(&again);
    }
}

/* The defaults are the rows': what coord_config_defaults sets for each
 * plain row is that row's default. */
static void test_defaults_are_the_rows(void **state) {
    (void)state;
    coord_config d;
    coord_config_defaults(&d);
    size_t n;
    const coord_config_field *rows = coord_config_fields(&n);
    for (size_t i = 0; i < n; i++) {
        const coord_config_field *f = &rows[i];
        if (f->flags & COORD_FIELD_DEF_CODE) continue;
        json_t *v = coord_config_field_json(&d, f), *want = NULL;
        switch (f->type) {
        case COORD_FIELD_INT: want = json_integer(f->idef); break;
        case COORD_FIELD_REAL: want = json_real(f->rdef); break;
        case COORD_FIELD_BOOL: want = json_boolean(f->idef); break;
        case COORD_FIELD_STR: want = json_string(f->sdef); break;
        case COORD_FIELD_ENUM: want = json_string(f->choices[f->idef]); break;
        default: break;
        }
        if (want) {
            assert_non_null(v);
            assert_true(json_equal(v, want));
        }
        json_decref(v);
        json_decref(want);
    }
    /* K-FAC's come from the optimizer's module. */
    model_kfac_gpt_config k = model_kfac_gpt_config_default();
    assert_true(d.train.kfac.decay == k.decay && d.train.kfac.inverse_every == k.inverse_every);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_bound_refused),
        cmocka_unit_test(test_every_type_refused),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_written_reads_back),
        cmocka_unit_test(test_defaults_are_the_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
