/*
 * The run configuration's fields as one table (fields.c), in the order
 * the normalised JSON writes them. A row gives a field's dotted name, its
 * type, where it lives in coord_config, its bounds or choices and its
 * default; the table drives the defaults, the refusal of unknown keys,
 * the reading and bounds of every plain field, the JSON written back and
 * what `check --config` lists. What a field means beyond its row (a
 * default that depends on the mode, fields that exclude each other, a
 * bound that depends on the model) stays as code: config.c and
 * config_resolve.c. Adding a plain field is one row here and one member
 * of coord_config.
 *
 * Contents:
 *   coord_config_field            one row
 *   coord_config_fields           the table, and its length
 *   coord_config_field_find       a row by its dotted name
 *   coord_config_fields_defaults  every row's default into a configuration
 *   coord_config_fields_keys      unknown keys of one object refused
 *   coord_config_fields_read      every plain field that was given, checked
 *   coord_config_fields_write     the normalised JSON of the table's fields
 *   coord_config_field_read       one value read as its row reads it
 *   coord_config_field_json       one field's value as JSON
 *   coord_config_field_str        a string value read as a plain field is
 *   coord_config_fields_report    check --config's list: each field, its value, whence
 */
#ifndef VOLLEY_COORD_CONFIG_FIELDS_H
#define VOLLEY_COORD_CONFIG_FIELDS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "common/common.h"
#include "coordinator/config/config.h"

typedef enum coord_field_type {
    COORD_FIELD_SECTION, /* an object holding fields */
    COORD_FIELD_INT,     /* a JSON integer into an int64_t or an int (by size) */
    COORD_FIELD_REAL,    /* a JSON number into a double */
    COORD_FIELD_BOOL,    /* true or false into an int */
    COORD_FIELD_STR,     /* a non-empty string into char[size]; one of choices if set */
    COORD_FIELD_ENUM,    /* one of choices, stored as its index in an int-sized field */
    COORD_FIELD_CODE,    /* read by code (config.c); a row so that its key is known */
} coord_field_type;

enum {
    /* Read by the table, not written back by it: resolved into other
     * fields (val_tokens, compression.ratio) or written by code
     * (corpus, in the data row's put). */
    COORD_FIELD_UNWRITTEN = 1 << 0,
    /* A GPT's field: an mlp model's "model" object is its own
     * (model_mlp_config_parse reads it). */
    COORD_FIELD_GPT = 1 << 1,
    /* The default comes from another module (K-FAC's, the split's lr
     * from train.lr) and is set in code. */
    COORD_FIELD_DEF_CODE = 1 << 2,
};

typedef struct coord_config_field {
    const char *name; /* dotted path, "train.kfac.decay" */
    coord_field_type type;
    unsigned flags;
    size_t offset, size; /* the member of coord_config */
    int64_t imin, imax;  /* INT: inclusive bounds */
    double lo, hi;       /* REAL: bounds, inclusive unless lo_open/hi_open */
    unsigned char lo_open, hi_open;
    const char *const *choices; /* STR (optional), ENUM: NULL-terminated */
    int64_t idef;               /* INT, BOOL, ENUM: the default */
    double rdef;                /* REAL */
    const char *sdef;           /* STR */
    /* Reads the field itself from v, the value given, in place of the
     * row's type: a check beyond the row's (the name's characters), an
     * alias, another form ("auto"), or a section whose keys depend on
     * what it holds (the model). */
    int (*get)(json_t *v, const struct coord_config_field *f, coord_config *cfg, vl_error *err);
    /* Written back only where this holds (NULL: always). */
    int (*written)(const coord_config *cfg);
    /* Writes the field itself into parent under key, in place of the
     * row's type (a section whose form depends on the run: the model,
     * the data). with_paths as coord_config_to_json's with_corpus. */
    int (*put)(const coord_config *cfg, json_t *parent, const char *key, int with_paths);
} coord_config_field;

/* The table, in the order the normalised JSON writes it; n_out gets its
 * number of rows. */
const coord_config_field *coord_config_fields(size_t *n_out);

/* The row named name (dotted), or NULL. */
const coord_config_field *coord_config_field_find(const char *name);

/* Every row's default into cfg (which the caller has zeroed); rows
 * flagged COORD_FIELD_DEF_CODE are left to the caller. */
void coord_config_fields_defaults(coord_config *cfg);

/* Refuses a key of obj, the object at the dotted path section ("" for
 * the top level), that names no row: VL_EINVAL "config: unknown field
 * 'section.key'". */
int coord_config_fields_keys(json_t *obj, const char *section, vl_error *err) VL_MUST_CHECK;

/* Reads every field the table reads that root gives, in table order:
 * each section must be an object whose keys name rows, each value its
 * row's type within its bounds or choices; errors name the field. GPT
 * rows are skipped in an mlp run (cfg->net, set before). Fields not
 * given keep what cfg holds. */
int coord_config_fields_read(json_t *root, coord_config *cfg, vl_error *err) VL_MUST_CHECK;

/* Writes the table's fields of cfg into root (an empty object), each
 * where its row's written predicate holds and its section was written,
 * in table order. Returns 0 or VL_ENOMEM. */
int coord_config_fields_write(const coord_config *cfg, json_t *root, int with_paths) VL_MUST_CHECK;

/* Reads v as row f's type reads it, bounds and choices checked, into
 * cfg: what a row's get hook calls for the form it does not handle
 * itself. Errors name the field. */
int coord_config_field_read(json_t *v, const coord_config_field *f, coord_config *cfg,
                            vl_error *err) VL_MUST_CHECK;

/* A new reference to field f's value in cfg as JSON (NULL for a section
 * or a CODE row, or out of memory). */
json_t *coord_config_field_json(const coord_config *cfg, const coord_config_field *f);

/* Reads v as a STR row reads its value: a non-empty string under cap
 * bytes, without NUL, one of choices if set, copied to out; errors name
 * field. For the strings code reads (data.train's paths). */
int coord_config_field_str(json_t *v, const char *field, char *out, size_t cap,
                           const char *const *choices, vl_error *err) VL_MUST_CHECK;

/* Writes one line per field of the table that the run cfg writes back:
 * "field NAME = VALUE (given | default | chosen)", chosen meaning derived
 * from the rest of the configuration (a mode's default, a ratio's k).
 * given is the configuration as written (NULL: none counts as given).
 * Returns the number of lines, or VL_ENOMEM. */
int coord_config_fields_report(const coord_config *cfg, json_t *given, FILE *out);

#endif
