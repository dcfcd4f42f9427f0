/* When and how long the peer waits: the stop request a signal sets and
 * every loop polls, interruptible sleeps, exit statuses, and the retry
 * policy with its capped, jittered exponential backoff and Retry-After
 * handling. Kept apart from the HTTPS client (http.c), which applies it,
 * since the loop and the trainer wait by the same rules without HTTP. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "peer/peer.h"

/* ---- stopping ---------------------------------------------------------- */

/* Set from a signal handler and read by every thread that sends or
 * trains (an upload in the background among them): a lock-free atomic is
 * safe in both places, where a volatile sig_atomic_t is only safe in the
 * first. */
static atomic_int stop_flag;

void peer_stop_request(void) {
    atomic_store_explicit(&stop_flag, 1, memory_order_relaxed);
}
int peer_stop_requested(void) {
    return atomic_load_explicit(&stop_flag, memory_order_relaxed) != 0;
}
void peer_stop_reset(void) {
    atomic_store_explicit(&stop_flag, 0, memory_order_relaxed);
}

int peer_sleep(double s) {
    double end = vl_clock_mono_s() + (s > 0 ? s : 0);
    for (;;) {
        if (peer_stop_requested()) return 1;
        double left = end - vl_clock_mono_s();
        if (left <= 0) return 0;
        vl_clock_sleep_ms(left > 0.1 ? 100 : (long)(left * 1000) + 1);
    }
}

int peer_exit_status(int rc) {
    switch (rc) {
    case VL_OK:
    case PEER_ESTOPPED: return PEER_EXIT_OK;
    case PEER_EREFUSED: return PEER_EXIT_REFUSED;
    case PEER_ENETWORK: return PEER_EXIT_NETWORK;
    default: return PEER_EXIT_FAIL;
    }
}

/* ---- retries ----------------------------------------------------------- */

void peer_retry_default(peer_retry_policy *p) {
    p->max_attempts = 0;
    p->give_up_s = 0;
    p->base_s = 0.5;
    p->factor = 2.0;
    p->cap_s = PEER_BACKOFF_CAP_S;
    p->retry_after_max_s = 300.0;
    const char *env = getenv("VOLLEY_PEER_BACKOFF_CAP_S");
    char *end;
    double cap = env && *env ? strtod(env, &end) : 0;
    if (env && *env && *end == '\0' && cap >= 0.1 && cap <= PEER_BACKOFF_CAP_S) p->cap_s = cap;
}

void peer_retry_for(peer_retry_policy *p, int retries, double give_up_s) {
    peer_retry_default(p);
    if (retries > 0) {
        p->max_attempts = retries;
        if (p->cap_s > PEER_RETRIES_CAP_S) p->cap_s = PEER_RETRIES_CAP_S;
    }
    if (give_up_s > 0) p->give_up_s = give_up_s;
}

int peer_duration_parse(const char *s, double *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0)) return -1;
    double unit = 1;
    if (*end == 's')
        end++;
    else if (*end == 'm')
        unit = 60, end++;
    else if (*end == 'h')
        unit = 3600, end++;
    if (*end != '\0' || v * unit > 30.0 * 86400) return -1;
    *out = v * unit;
    return 0;
}

double peer_backoff_window(const peer_retry_policy *p, int n) {
    if (n < 1) n = 1;
    double w = p->base_s;
    for (int i = 1; i < n && w < p->cap_s; i++) w *= p->factor;
    return w < p->cap_s ? w : p->cap_s;
}

double peer_backoff_delay(const peer_retry_policy *p, int n, double retry_after_s, double u) {
    if (!(u >= 0)) u = 0;
    if (u >= 1) u = nextafter(1.0, 0.0);
    double d = u * peer_backoff_window(p, n);
    if (retry_after_s >= 0) {
        double ra = retry_after_s < p->retry_after_max_s ? retry_after_s : p->retry_after_max_s;
        if (ra > d) d = ra;
    }
    return d;
}

int peer_status_retryable(long status) {
    return status == 429 || (status >= 500 && status <= 599);
}

double peer_retry_after_parse(const char *value, int64_t now) {
    while (*value == ' ' || *value == '\t') value++;
    char tmp[64];
    size_t n = strnlen(value, sizeof tmp);
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, value, n + 1);
    while (n > 0 && isspace((unsigned char)tmp[n - 1])) tmp[--n] = '\0';
    int64_t secs;
    if (vl_parse_i64(tmp, 0, 1000000000, &secs) == VL_OK) return (double)secs;
    time_t t = curl_getdate(tmp, NULL);
    if (t == (time_t)-1) return -1;
    return (int64_t)t > now ? (double)((int64_t)t - now) : 0.0;
}
