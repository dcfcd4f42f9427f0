/* Counting answers and versions (counters.h). */
#include <stdio.h>
#include <string.h>

#include "coordinator/base/counters.h"
#include "coordinator/base/routes.h"

const double coord_metrics_merge_le[COORD_METRICS_MERGE_BUCKETS] = {0.01, 0.05, 0.1, 0.25, 0.5,
                                                                    1,    2.5,  5,   10,   30};

_Static_assert(COORD_ROUTE_COUNT < COORD_METRICS_ROUTES,
               "the metrics count a slot per route and one more");

void coord_metrics_request(coord_metrics *m, int route, int status, size_t in, size_t out) {
    if (route < 0 || route >= COORD_METRICS_ROUTES) route = COORD_ROUTE_OTHER;
    int cls = status / 100 - 1;
    if (cls < 0 || cls > 4) cls = 4;
    m->requests[route][cls]++;
    m->bytes_in[route] += in;
    m->bytes_out[route] += out;
}

void coord_metrics_upload(coord_metrics *m, int status, const char *code) {
    if (status >= 200 && status < 300) {
        m->uploads_accepted++;
        return;
    }
    if (!code || !*code) code = "none";
    size_t i = 0;
    while (i < m->n_refused && strcmp(m->refused[i].code, code) != 0) i++;
    if (i == m->n_refused) {
        /* A bounded table: codes are the coordinator's own, but a cap
         * keeps any future one from growing it. */
        if (m->n_refused == COORD_METRICS_CODES) {
            i = COORD_METRICS_CODES - 1;
            snprintf(m->refused[i].code, sizeof m->refused[i].code, "other");
        } else {
            snprintf(m->refused[i].code, sizeof m->refused[i].code, "%s", code);
            m->n_refused++;
        }
    }
    m->refused[i].n++;
}

/* The index of peer_id in the table, or where it would go (-1 - index). */
static long peer_index(const coord_metrics *m, int64_t peer_id) {
    size_t lo = 0, hi = m->n_peers;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->peers[mid].id == peer_id) return (long)mid;
        if (m->peers[mid].id < peer_id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1 - (long)lo;
}

static coord_metrics_peer *peer_entry(coord_metrics *m, int64_t peer_id) {
    long i = peer_index(m, peer_id);
    if (i >= 0) return &m->peers[i];
    if (m->n_peers == COORD_METRICS_PEERS) {
        /* Full: the peer heard from longest ago makes room, so the table
         * holds the peers that are around now. */
        size_t old = 0;
        for (size_t k = 1; k < m->n_peers; k++)
            if (m->peers[k].seen < m->peers[old].seen) old = k;
        memmove(&m->peers[old], &m->peers[old + 1], (m->n_peers - old - 1) * sizeof m->peers[0]);
        m->n_peers--;
        i = peer_index(m, peer_id);
    }
    size_t at = (size_t)(-1 - i);
    memmove(&m->peers[at + 1], &m->peers[at], (m->n_peers - at) * sizeof m->peers[0]);
    m->n_peers++;
    memset(&m->peers[at], 0, sizeof m->peers[at]);
    m->peers[at].id = peer_id;
    return &m->peers[at];
}

const coord_metrics_peer *coord_metrics_peer_find(const coord_metrics *m, int64_t peer_id) {
    long i = peer_index(m, peer_id);
    return i >= 0 ? &m->peers[i] : NULL;
}

void coord_metrics_answer(coord_metrics *m, int route, int status, const char *code,
                          int64_t peer_id, const char *addr, size_t in, int64_t now) {
    if (!code) code = "";
    if (!addr) addr = "";
    int refused = status >= 400;
    int upload = route == COORD_ROUTE_UPDATES;
    if (upload) {
        int64_t minute = now / 60;
        coord_metrics_minute *mm = &m->minutes[minute % COORD_METRICS_MINUTES];
        if (mm->minute != minute) {
            memset(mm, 0, sizeof *mm);
            mm->minute = minute;
        }
        if (status >= 200 && status < 300)
            mm->accepted++;
        else if (refused)
            mm->refused++;
        mm->bytes += in;
    }
    if (peer_id > 0) {
        coord_metrics_peer *p = peer_entry(m, peer_id);
        p->seen = now;
        if (*addr) snprintf(p->addr, sizeof p->addr, "%s", addr);
        if (upload && refused) p->refused++;
    }
    if (refused) {
        coord_metrics_refusal *r = &m->recent[m->n_recent % COORD_METRICS_RECENT];
        m->n_recent++;
        r->at = now;
        r->peer_id = peer_id;
        r->route = route;
        r->status = status;
        snprintf(r->code, sizeof r->code, "%s", code);
        snprintf(r->addr, sizeof r->addr, "%s", addr);
    }
}

void coord_metrics_version(coord_metrics *m, double seconds, double train_loss) {
    size_t b = 0;
    while (b < COORD_METRICS_MERGE_BUCKETS && seconds > coord_metrics_merge_le[b]) b++;
    if (b < COORD_METRICS_MERGE_BUCKETS) m->merge_buckets[b]++;
    m->merge_count++;
    m->merge_sum += seconds;
    m->train_loss = train_loss;
}
