/* A hostile peer for the robust-aggregation test: the real peer loop
 * (peer_run) with a tamper hook that turns each honestly trained delta
 * into an attack before it is uploaded.
 *
 *   hostile_peer DIR ATTACKS [SEED]
 *
 * DIR is a peer directory made by `volley-peer keygen` and `join`. ATTACKS
 * is a comma-separated cycle of
 *
 *   scale100  the honest delta times 100
 *   signflip  minus the honest delta
 *   noise     Gaussian noise with 10 times the delta's RMS per coordinate
 *   nan       the honest delta with every 1000th value NaN (the
 *             coordinator must refuse it: 422 non_finite)
 *   replay    the first honest delta this peer trained, sent again for
 *             every later task (its base long gone)
 *
 * Each upload attempt takes the next attack of the cycle; an attempt the
 * coordinator refuses is followed by the next attack on the same task.
 * Logs one line per attempt ("attack NAME on attempt A") and exits like
 * volley-peer run. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer/peer.h"
#include "peer/tamper.h"

typedef enum { A_SCALE100, A_SIGNFLIP, A_NOISE, A_NAN, A_REPLAY } attack;
static const char *const NAMES[] = {"scale100", "signflip", "noise", "nan", "replay"};
#define N_NAMES (sizeof NAMES / sizeof NAMES[0])
#define MAX_CYCLE 32

typedef struct hostile {
    attack cycle[MAX_CYCLE];
    size_t n, next;
    float *honest; /* this task's honest delta */
    float *first;  /* the first honest delta, for replay */
    size_t n_params;
    vl_rng r;
} hostile;

static int parse_cycle(hostile *h, const char *list) {
    char copy[512];
    if (snprintf(copy, sizeof copy, "%s", list) >= (int)sizeof copy) return -1;
    char *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        size_t a = 0;
        while (a < N_NAMES && strcmp(t, NAMES[a]) != 0) a++;
        if (a == N_NAMES || h->n == MAX_CYCLE) return -1;
        h->cycle[h->n++] = (attack)a;
    }
    return h->n ? 0 : -1;
}

static int tamper(void *arg, int attempt, float *delta, size_t n) {
    hostile *h = arg;
    if (attempt == 0) {
        if (h->n_params != n) {
            free(h->honest);
            free(h->first);
            h->honest = malloc(n * sizeof *h->honest);
            h->first = malloc(n * sizeof *h->first);
            if (!h->honest || !h->first) return -1;
            memcpy(h->first, delta, n * sizeof *delta);
            h->n_params = n;
        }
        memcpy(h->honest, delta, n * sizeof *delta);
    } else {
        memcpy(delta, h->honest, n * sizeof *delta);
    }
    attack a = h->cycle[h->next++ % h->n];
    double ss = 0;
    switch (a) {
    case A_SCALE100:
        for (size_t i = 0; i < n; i++) delta[i] *= 100.0f;
        break;
    case A_SIGNFLIP:
        for (size_t i = 0; i < n; i++) delta[i] = -delta[i];
        break;
    case A_NOISE:
        for (size_t i = 0; i < n; i++) ss += (double)delta[i] * delta[i];
        for (size_t i = 0; i < n; i++)
            delta[i] = (float)(10.0 * sqrt(ss / (double)n)) * vl_rng_normal(&h->r);
        break;
    case A_NAN:
        for (size_t i = 0; i < n; i += 1000) delta[i] = NAN;
        break;
    case A_REPLAY: memcpy(delta, h->first, n * sizeof *delta); break;
    }
    vl_log_info("attack %s on attempt %d", NAMES[a], attempt);
    return 0;
}

static void on_signal(int sig) {
    (void)sig;
    peer_stop_request();
}

int main(int argc, char **argv) {
    vl_log_set_program("hostile_peer");
    hostile h;
    memset(&h, 0, sizeof h);
    int64_t seed = 1;
    if ((argc != 3 && argc != 4) || parse_cycle(&h, argv[2]) != 0 ||
        (argc == 4 && vl_parse_i64(argv[3], 0, INT64_MAX, &seed) != VL_OK)) {
        fprintf(stderr, "usage: hostile_peer DIR scale100|signflip|noise|nan|replay[,...] "
                        "[SEED]\n");
        return PEER_EXIT_USAGE;
    }
    vl_rng_seed(&h.r, (uint64_t)seed);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    peer_run_opts o = {.dir = argv[1], .threads = 1, .wait_s = 10, .retries = 20};
    vl_error e = {0};
    int rc = peer_run_tampered(&o, tamper, &h, &e);
    free(h.honest);
    free(h.first);
    if (rc) {
        fprintf(stderr, "hostile_peer: %s\n", e.msg);
        return peer_exit_status(rc);
    }
    return PEER_EXIT_OK;
}
