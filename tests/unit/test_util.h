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

#endif
