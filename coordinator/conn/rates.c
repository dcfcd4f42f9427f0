/* Which per-peer budget a signed request spends, and the split batch
 * routes' own budget. A task is a handful of requests, so the per-peer
 * budget (--peer-rate, 50/s) is far above what an honest peer does on
 * every route but the split batches: a split peer sends one request per
 * batch (two in a U-shaped run), as fast as its batches and the round
 * trip allow, and a GPU peer on a small model over a short link passes
 * 50/s on its own. Counted against the peer budget it was throttled as a
 * hostile client would be, and its batches starved its task and upload
 * requests of tokens. The batches get a bucket of their own instead,
 * sized from the run's split settings; what they cost is bounded apart
 * from it (split.in_flight batches a peer may have at once, the body
 * budget), and the other routes keep the peer budget. */
#include <string.h>

#include "coordinator/coord.h"
#include "coordinator/base/limiter.h"
#include "coordinator/config/config.h"
#include "coordinator/conn/conn.h"
#include "coordinator/conn/limits.h"

coord_rate coord_limits_split_rate(const coord_config *cfg, coord_rate peer, coord_rate asked) {
    if (asked.rate >= 0) return asked; /* --split-rate, 0 included (no limit) */
    if (!coord_config_is_split(cfg) || peer.rate <= 0) return peer; /* --peer-rate 0: none */
    /* An honest peer has at most split.in_flight batches at the
     * coordinator, each one or two requests, and sends the next when an
     * answer is back: at most in_flight x per_batch / round trip requests
     * a second. The default admits a round trip of COORD_SPLIT_RTT_MIN_S
     * (a peer on the same network); the ten seconds' burst covers a
     * peer whose answers come back in a bunch. */
    int in_flight = cfg->split_in_flight > 0 ? cfg->split_in_flight : 1;
    int per_batch = cfg->split_u ? 2 : 1;
    double rate = (double)(in_flight * per_batch) / COORD_SPLIT_RTT_MIN_S;
    if (rate < peer.rate) rate = peer.rate;
    return (coord_rate){.rate = rate, .burst = 10 * rate};
}

int coord_rate_is_split(const coord_server *srv, const char *target) {
    return srv->conns.split_limiter && strncmp(target, "/v1/split/", 10) == 0;
}

double coord_peer_rate_take(coord_server *srv, int64_t peer, const char *target, double now) {
    coord_limiter *l =
        coord_rate_is_split(srv, target) ? srv->conns.split_limiter : srv->conns.peer_limiter;
    return coord_limiter_take(l, &peer, sizeof peer, now);
}
