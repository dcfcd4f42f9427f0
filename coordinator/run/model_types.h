/*
 * model_types: the run's model and a classifier's test set as the
 * coordinator holds them (model.h has what is done with them).
 *
 * Contents: coord_model, coord_testset.
 */
#ifndef VOLLEY_COORD_MODEL_TYPES_H
#define VOLLEY_COORD_MODEL_TYPES_H

#include <stdint.h>

#include "model/model.h"

/* The run's model; exactly one of gpt and mlp is set once created. */
typedef struct coord_model {
    model_gpt *gpt;
    model_mlp *mlp;
} coord_model;

/* A classifier run's held-out test set, in memory as the floats the
 * model reads. size and hash (hex BLAKE2b-256 over pixels and labels)
 * identify it in the run record, as a corpus's do. */
typedef struct coord_testset {
    float *x;    /* [n, in_dim] */
    int *labels; /* [n] */
    int n;
    int64_t size; /* bytes of pixels and labels */
    char hash[65];
} coord_testset;

#endif
