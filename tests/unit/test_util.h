/* Helpers shared by the cmocka unit tests. Include after <cmocka.h>. */
#ifndef VOLLEY_TEST_UTIL_H
#define VOLLEY_TEST_UTIL_H

#include "common/common.h"

/* Runs a call that returns 0 or a VL_E* code; on failure the test fails
 * with the call's text and the message the call left in e_, which the call
 * names as its vl_error (write `OK(f(x, &e_))`). */
#define OK(call)                                                                                  \
    do {                                                                                          \
        vl_error e_ = {0};                                                                        \
        int rc_ = (call);                                                                         \
        if (rc_ != 0)                                                                             \
            fail_msg("%s failed (%d): %s", #call, rc_, e_.msg);                                   \
    } while (0)

/* d standard-normal floats from seed, on the heap (caller frees). */
static inline float *random_vec(size_t d, uint64_t seed) {
    float *x = malloc((d ? d : 1) * sizeof *x);
    assert_non_null(x);
    rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < d; i++) x[i] = rng_normal(&r);
    return x;
}

#endif
