/* Random training windows from a byte string. */
#include <stdint.h>

#include "model/model.h"

int model_data_sample(const uint8_t *bytes, size_t len, int B, int T, vl_rng *r, int *inputs,
                      int *targets, vl_error *err) {
    if (bytes == NULL || r == NULL || inputs == NULL || targets == NULL)
        return vl_fail(err, VL_EINVAL, "data sample: missing argument");
    if (B < 1 || T < 1)
        return vl_fail(err, VL_EINVAL, "data sample: B=%d T=%d must be positive", B, T);
    if (len < (size_t)T + 1)
        return vl_fail(err, VL_EINVAL,
                       "data sample: %zu bytes is shorter than one window of %d bytes", len, T + 1);
    uint64_t starts = (uint64_t)(len - (size_t)T); /* offsets 0 .. len-T-1 */
    for (int b = 0; b < B; b++) {
        const uint8_t *w = bytes + vl_rng_below_u64(r, starts);
        int *in = inputs + (size_t)b * T, *tg = targets + (size_t)b * T;
        for (int t = 0; t < T; t++) {
            in[t] = w[t];
            tg[t] = w[t + 1];
        }
    }
    return 0;
}
