/* The update-norm bound that robust.max_norm "auto" derives from a run's
 * first versions. A bound fixed by hand needs the norms of a clean run,
 * which nobody has before the run starts; one that follows every version
 * (norm_clip) moves with whoever fills that version. This one is learnt
 * once, from the median update norms of versions 1 to auto_versions, and
 * then stays: an attacker would have to fill most of the first versions
 * to raise it (see "What is not protected" in README.md). */
#include <math.h>

#include "coordinator/coord.h"

double coord_norm_bound(const coord_server *srv) {
    if (srv->cfg.robust.max_norm > 0) return srv->cfg.robust.max_norm;
    return srv->cfg.robust.auto_norm ? atomic_load(&srv->norm_bound) : 0;
}

double coord_norm_bound_for(const coord_server *srv, int64_t local_steps) {
    double b = coord_norm_bound(srv);
    if (srv->cfg.robust.max_norm > 0 || b <= 0) return b;
    return b * sqrt((double)(local_steps > 1 ? local_steps : 1));
}

void coord_norm_bound_refresh(coord_server *srv) {
    const coord_robust_config *r = &srv->cfg.robust;
    if (!r->auto_norm || atomic_load(&srv->norm_bound) > 0 || srv->version < r->auto_versions)
        return;
    double med;
    int64_t n;
    vl_error e = {0};
    if (storage_version_norm_median(srv->db, r->auto_versions, &med, &n, &e) != VL_OK) {
        vl_log_warn("robust: the update-norm bound could not be derived yet: %s", e.msg);
        return;
    }
    /* Versions made before the norms were recorded (an older coordinator)
     * have none; with none at all the run goes on without a bound. */
    if (n == 0 || !(med > 0) || !isfinite(med)) return;
    atomic_store(&srv->norm_bound, r->auto_mult * med);
    vl_log_info("robust: updates whose L2 norm over the square root of their local steps "
                "exceeds %.6g (%g times the median of versions 1 to %lld, %.6g) are %s from now "
                "on",
                r->auto_mult * med, r->auto_mult, (long long)r->auto_versions, med,
                r->refuse_excess ? "refused (422 norm_exceeded)" : "scaled down to it when merged");
}
