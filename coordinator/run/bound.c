/* The update-norm bound that robust.max_norm "auto" derives from a run's
 * first versions. A bound fixed by hand needs the norms of a clean run,
 * which nobody has before the run starts; one that follows every version
 * (norm_clip) moves with whoever fills that version. This one is learnt
 * once, from the updates merged into versions 1 to auto_versions, and
 * then stays.
 *
 * Each peer counts once: its updates' norms (over the square root of
 * their local steps) count as their median, and the figure is the median
 * of those over the peers. Counting every update, one fast hostile peer
 * filling most of an async run's opening would set the bound for the
 * whole run; counted once, it takes most of the peers that uploaded in
 * the window to raise it. Until the window holds updates of
 * COORD_BOUND_QUORUM peers (fewer when fewer are registered) it grows
 * past auto_versions, so a peer that fills the first versions alone does
 * not set the bound by itself; a run whose window never gets that many
 * is learnt from what it has at COORD_BOUND_WAIT x auto_versions.
 *
 * The figure is stored as the update_norm of the version it was learnt
 * at, the only version that stores one, so a restarted coordinator reads
 * the same bound back. (Databases of older coordinators stored each
 * version's median update norm in every version: their bound is the
 * median of versions 1 to auto_versions, as it was.) The window's
 * updates are held in memory; a coordinator restarted before the bound
 * is learnt starts its window again from the next version. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"
#include "coordinator/base/robust.h"
#include "coordinator/config/config.h"
#include "coordinator/run/run.h"

/* The window's updates: each one's peer and norm over the square root
 * of its local steps. */
typedef struct coord_bound_window {
    int64_t *peers;
    double *units;
    size_t n, cap;
} coord_bound_window;

double coord_norm_bound(const coord_server *srv) {
    if (srv->run.cfg.robust.max_norm > 0) return srv->run.cfg.robust.max_norm;
    return srv->run.cfg.robust.auto_norm ? atomic_load(&srv->run.norm_bound) : 0;
}

double coord_norm_bound_held(const coord_server *srv) {
    double b = coord_norm_bound(srv);
    if (srv->run.cfg.robust.max_norm > 0 || b <= 0) return b;
    int64_t steps = srv->run.cfg.train.steps;
    return b * sqrt((double)(steps > 1 ? steps : 1));
}

static int by_peer(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return (*x > *y) - (*x < *y);
}

double coord_norm_bound_peer_median(const int64_t *peers, const double *units, size_t n,
                                    size_t *n_peers) {
    *n_peers = 0;
    /* (peer, unit) pairs sorted by peer, each peer's run of them reduced
     * to its median. */
    typedef struct {
        int64_t peer;
        double unit;
    } pair;
    pair *p = malloc(n * sizeof *p + 1);
    double *one = malloc(n * sizeof *one + 1);   /* a peer's units */
    double *each = malloc(n * sizeof *each + 1); /* each peer's median */
    double med = NAN;
    if (!p || !one || !each) goto out;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(units[i])) p[k++] = (pair){peers[i], units[i]};
    qsort(p, k, sizeof *p, by_peer);
    size_t m = 0;
    for (size_t i = 0; i < k;) {
        size_t j = i;
        while (j < k && p[j].peer == p[i].peer) j++;
        for (size_t t = i; t < j; t++) one[t - i] = p[t].unit;
        each[m++] = coord_robust_median(one, j - i);
        i = j;
    }
    if (m) med = coord_robust_median(each, m);
    *n_peers = m;
out:
    free(p);
    free(one);
    free(each);
    return med;
}

int64_t coord_norm_bound_quorum(coord_server *srv) {
    const coord_robust_config *r = &srv->run.cfg.robust;
    if (!r->auto_norm || r->max_norm > 0 || atomic_load(&srv->run.norm_bound) > 0) return 0;
    int64_t peers = 0;
    vl_error e = {0};
    if (storage_peer_count(srv->run.db, &peers, &e) != VL_OK) peers = COORD_BOUND_QUORUM;
    if (peers > COORD_BOUND_QUORUM) peers = COORD_BOUND_QUORUM;
    return peers > 1 ? peers : 1;
}

void coord_norm_bound_window_free(coord_server *srv) {
    coord_bound_window *w = srv->run.bound_window;
    if (!w) return;
    free(w->peers);
    free(w->units);
    free(w);
    srv->run.bound_window = NULL;
}

static int window_add(coord_bound_window *w, const int64_t *peers, const double *units, size_t n) {
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 64;
        while (cap < w->n + n) cap *= 2;
        int64_t *p = realloc(w->peers, cap * sizeof *p);
        if (p) w->peers = p;
        double *u = realloc(w->units, cap * sizeof *u);
        if (u) w->units = u;
        if (!p || !u) return VL_ENOMEM;
        w->cap = cap;
    }
    memcpy(w->peers + w->n, peers, n * sizeof *peers);
    memcpy(w->units + w->n, units, n * sizeof *units);
    w->n += n;
    return VL_OK;
}

double coord_norm_bound_figure(coord_server *srv, int64_t quorum, int64_t version,
                               const int64_t *peers, const double *units, size_t n) {
    const coord_robust_config *r = &srv->run.cfg.robust;
    if (quorum <= 0) {
        coord_norm_bound_window_free(srv);
        return NAN;
    }
    if (!srv->run.bound_window &&
        !(srv->run.bound_window = calloc(1, sizeof *srv->run.bound_window))) {
        vl_log_warn("robust: no memory to hold version %lld's norms for the update-norm bound",
                    (long long)version);
        return NAN;
    }
    coord_bound_window *w = srv->run.bound_window;
    if (window_add(w, peers, units, n) != VL_OK) {
        vl_log_warn("robust: no memory to hold version %lld's norms for the update-norm bound",
                    (long long)version);
        return NAN;
    }
    if (version < r->auto_versions) return NAN;
    size_t got = 0;
    double med = coord_norm_bound_peer_median(w->peers, w->units, w->n, &got);
    if ((int64_t)got < quorum && version < COORD_BOUND_WAIT * r->auto_versions) {
        vl_log_info("robust: the update-norm bound waits for updates of %lld peers (versions "
                    "so far hold %zu)",
                    (long long)quorum, got);
        return NAN;
    }
    if (!(med > 0) || !isfinite(med)) return NAN;
    vl_log_info("robust: the update-norm bound's figure is %.6g, the median over %zu peers of "
                "each one's median norm in %zu updates of versions up to %lld",
                med, got, w->n, (long long)version);
    coord_norm_bound_window_free(srv);
    return med;
}

void coord_norm_bound_refresh(coord_server *srv) {
    const coord_robust_config *r = &srv->run.cfg.robust;
    if (!r->auto_norm || atomic_load(&srv->run.norm_bound) > 0 ||
        srv->run.version < r->auto_versions)
        return;
    double med;
    int64_t n, upto = r->auto_versions;
    vl_error e = {0};
    int rc = storage_version_norm_median(srv->run.db, upto, &med, &n, &e);
    /* A window that grew past auto_versions stored its figure later. */
    if (rc == VL_OK && n == 0 && srv->run.version > upto)
        rc = storage_version_norm_median(srv->run.db, upto = srv->run.version, &med, &n, &e);
    if (rc != VL_OK) {
        vl_log_warn("robust: the update-norm bound could not be derived yet: %s", e.msg);
        return;
    }
    /* Versions made before the norms were recorded (an older coordinator)
     * have none; with none at all the run goes on without a bound. */
    if (n == 0 || !(med > 0) || !isfinite(med)) return;
    atomic_store(&srv->run.norm_bound, r->auto_mult * med);
    vl_log_info("robust: updates whose L2 norm over the square root of their local steps "
                "exceeds %.6g (%g times the median of versions 1 to %lld, %.6g) are %s from now "
                "on",
                r->auto_mult * med, r->auto_mult, (long long)upto, med,
                r->refuse_excess ? "refused (422 norm_exceeded)" : "scaled down to it when merged");
}
