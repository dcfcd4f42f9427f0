/* The temporary database, and the rows, that the storage unit tests
 * build on. Include after <cmocka.h> and test_util.h. */
#ifndef VOLLEY_STORAGE_FIXTURES_H
#define VOLLEY_STORAGE_FIXTURES_H

#include <math.h>

#include "storage/storage.h"

/* Commit options as the tests use them: update blobs kept as long as
 * versions, sync leases. */
#define COMMIT_OPTS(kv, kc, fin)                       \
    (&(storage_commit_opts){.keep_versions = (kv),     \
                            .keep_changes = (kc),      \
                            .keep_update_blobs = (kv), \
                            .finished = (fin),         \
                            .expire_old_leases = 1})

typedef struct fixture {
    char dir[64];
    char path[128];
    storage *st;
} fixture;

static inline int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/volley-test-storage-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/run.db", f->dir);
    vl_error e = {0};
    if (storage_open(f->path, 1, &f->st, &e) != VL_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    *state = f;
    return 0;
}

static inline int teardown(void **state) {
    fixture *f = *state;
    storage_close(f->st);
    test_remove_db(f->path);
    rmdir(f->dir);
    free(f);
    return 0;
}

static inline void insert_run(storage *st) {
    storage_run r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "demo");
    r.config = "{\"name\":\"demo\"}";
    r.corpus_path = "/data/corpus.txt";
    r.corpus_size = 12345;
    snprintf(r.corpus_hash, sizeof r.corpus_hash, "%064d", 7);
    r.created_at = 1000;
    vl_error e = {0};
    assert_int_equal(storage_run_insert(st, &r, &e), VL_OK);
}

static inline void commit_version(storage *st, int64_t v, float fill, const int64_t *ids, size_t n,
                                  int64_t keep) {
    float params[4] = {fill, fill + 1, fill + 2, fill + 3};
    float mom[4] = {-fill, 0, 0, 0};
    storage_version ver = {.version = v,
                           .created_at = 2000 + v,
                           .params = params,
                           .momentum = mom,
                           .n = 4,
                           .val_loss = 5.0 - (double)v,
                           .train_loss = v ? 4.0 : NAN,
                           .num_updates = (int64_t)n};
    vl_error e = {0};
    int rc = storage_version_commit(st, &ver, ids, n, COMMIT_OPTS(keep, 0, 0), &e);
    if (rc != VL_OK) fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, VL_OK);
}

/* Stores a sketch update of task for peer whose body is the n bytes at
 * body (the caller's); its id in *id when id is not NULL. */
static inline int insert_update_body(storage *st, int64_t task, int64_t peer, const uint8_t *body,
                                     size_t n, int64_t *id, vl_error *err) {
    storage_update u = {.task_id = task,
                        .peer_id = peer,
                        .kind = "sketch",
                        .num_samples = 8,
                        .local_steps = 1,
                        .loss = 1.0,
                        .nbytes = (int64_t)n,
                        .blob = body,
                        .received_at = 1500};
    return storage_update_insert(st, &u, id, err);
}

static inline int64_t add_peer(storage *st, uint8_t seed) {
    uint8_t pk[STORAGE_PK_BYTES];
    memset(pk, seed, sizeof pk);
    int64_t id = 0;
    vl_error e = {0};
    assert_int_equal(storage_peer_insert(st, pk, "lab", "{\"cpus\":8}", 0, 1000, &id, &e), VL_OK);
    return id;
}

static inline int64_t add_task(storage *st, int64_t peer, int64_t version, int64_t deadline,
                               storage_task_state state) {
    storage_task t = {.peer_id = peer,
                      .base_version = version,
                      .data_offset = 10,
                      .data_length = 100,
                      .seed = 42,
                      .issued_at = 1000,
                      .deadline = deadline,
                      .state = state};
    int64_t id = 0;
    vl_error e = {0};
    assert_int_equal(storage_task_insert(st, &t, &id, &e), VL_OK);
    return id;
}

static inline int64_t add_update(storage *st, int64_t task, int64_t peer, int64_t version) {
    static const uint8_t blob[] = {1, 2, 3, 4, 5};
    storage_update u = {.task_id = task,
                        .peer_id = peer,
                        .base_version = version,
                        .kind = "dense",
                        .num_samples = 64,
                        .local_steps = 10,
                        .loss = 2.5,
                        .nbytes = sizeof blob,
                        .blob = blob,
                        .received_at = 1500};
    int64_t id = 0;
    vl_error e = {0};
    int rc = storage_update_insert(st, &u, &id, &e);
    if (rc != VL_OK) fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, VL_OK);
    return id;
}

#endif
