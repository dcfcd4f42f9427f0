/* coordinator: task long-polls through a real server (the writer and
 * compute threads, libevent's evhttp, the input guard, signed requests;
 * only TLS is left out: clients connect over a Unix socket) in a sync run.
 *
 * The threads are held at chosen points by jobs that wait on a gate, so
 * each request arrives at a known moment of a merge: before it starts,
 * while the compute thread makes the version, and after that but before
 * the writer has committed it. Two more requests are the test's own
 * waiters in the same queue: one, when the version is out, holds the
 * wake-up until the writer has committed the leases it handed out so far
 * (their done callbacks not yet run, as when the loop is slower than the
 * disk), and one at the end records how many leases that wake-up handed
 * out. Checked: every request parked across the merge gets a task of the
 * new version from the wake-up that follows it, in arrival order, and a
 * request arriving later does not take a slot from them; a slot that a
 * lease's deadline frees before the lease timer has run goes to the
 * request parked first, whether the next request arrives then or a later
 * one's wait ends then; and a peer's second request, parked beside its
 * first, holds up nobody, and is answered with its lease even while the
 * requests before it wait. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>

#include "test_util.h"
#include "coordinator/coord.h"
#include "tests/guard_conns.h"
#include "coordinator/cli/cli.h"
#include "coordinator/http/http.h"
#include "coordinator/run/writer.h"
#include "coordinator/sched/schedule.h"
#include "coordinator/server.h"

#define MAX_PEERS 24
#define MAX_CLIENTS 24
#define MAX_PROBES 4
/* Longer than any test runs: a request answered 204 timed out. */
#define WAIT_S 30
/* How long a step may take before the test gives up on it. */
#define STEP_S 10.0

/* ---- the server and its connections --------------------------------------- */

/* A client connection and the first answer it got. */
typedef struct client {
    int fd;
    char buf[8192];
    size_t len;
    int status;   /* 0 until the answer is complete */
    json_t *body; /* a 200's JSON */
} client;

/* One of the test's own waiters (see the top). */
typedef struct probe {
    struct evhttp_request *req;
    void (*at_version)(struct probe *p); /* once, on the first wake-up after version 1 */
    int ran;
    int64_t issuing; /* what the recording probe saw */
} probe;

static struct {
    char *dir;
    char sock[600];
    coord_server *srv;
    guard_conn *conns;
    struct event *tick;
    vcrypto_identity keys[MAX_PEERS];
    int64_t ids[MAX_PEERS];
    int n_peers;
    client clients[MAX_CLIENTS];
    int n_clients;
    probe probes[MAX_PROBES];
    int n_probes;
} H;

static struct bufferevent *make_bev(struct event_base *base, void *arg) {
    (void)arg;
    guard_conn *c = guard_conn_new(base, H.srv, &H.conns);
    assert_non_null(c);
    return c->bev;
}

static int probe_serve(coord_req *cr) {
    for (int i = 0; i < H.n_probes; i++) {
        probe *p = &H.probes[i];
        if (p->req != cr->req || p->ran || cr->srv->run.version < 1) continue;
        p->ran = 1;
        p->at_version(p);
    }
    return COORD_WAITING;
}

/* A test waiter parks in the queue as a long-poll does; it is answered
 * 503 when the server closes. */
static void start_probe(struct evhttp_request *req) {
    probe *p = NULL;
    for (int i = 0; i < H.n_probes && !p; i++)
        if (!H.probes[i].req) p = &H.probes[i];
    assert_non_null(p);
    p->req = req;
    coord_req cr;
    memset(&cr, 0, sizeof cr);
    cr.srv = H.srv;
    cr.req = req;
    cr.t0 = vl_clock_mono_s();
    snprintf(cr.method, sizeof cr.method, "GET");
    snprintf(cr.path, sizeof cr.path, "/test/probe");
    cr.full_path = "/test/probe";
    coord_req_begin(&cr);
    assert_int_equal(coord_waiter_add(&cr, WAIT_S, probe_serve), 0);
}

static void on_request(struct evhttp_request *req, void *arg) {
    guard_conn_watch(req, H.conns);
    if (strcmp(evhttp_request_get_uri(req), "/test/probe") == 0) {
        start_probe(req);
        return;
    }
    coord_dispatch(req, arg);
}

static void tick(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    (void)arg;
}

/* A sync run of upv updates a version and leases of lease_s seconds,
 * served on a Unix socket. */
static void open_run(int upv, int lease_s) {
    memset(&H, 0, sizeof H);
    H.dir = test_temp_dir("/tmp/volley-longpoll.XXXXXX");
    char corpus[600], cfg[600], db[600], text[1400];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", H.dir);
    snprintf(cfg, sizeof cfg, "%s/run.json", H.dir);
    snprintf(db, sizeof db, "%s/run.db", H.dir);
    test_write_corpus(corpus, "every request in its turn. ");
    snprintf(text, sizeof text,
             "{\"name\": \"longpoll\", \"corpus\": \"%s\", \"mode\": \"sync\", \"model\": "
             "{\"vocab_size\": 256, \"block_size\": 16, \"n_layer\": 1, \"n_head\": 2, "
             "\"n_embd\": 16}, \"updates_per_version\": %d, \"max_versions\": 5, "
             "\"task_bytes\": 4096, \"lease_s\": %d, \"max_loss_rise\": 0, "
             "\"outer\": {\"lr\": 1.0, \"momentum\": 0.0}, \"train\": {\"steps\": 4, "
             "\"batch\": 4}}",
             corpus, upv, lease_s);
    test_write_text(cfg, text);
    OK(coord_cmd_init(db, cfg, &e_));
    vl_error serve_err = {0};
    H.srv = guard_conns_serve_unix(db, H.dir, H.sock, sizeof H.sock, 64, make_bev, on_request,
                                   &serve_err);
    if (!H.srv) fail_msg("%s", serve_err.msg);
    H.tick = evtimer_new(H.srv->base, tick, NULL);
    assert_non_null(H.tick);
}

static void close_run(void) {
    for (int i = 0; i < H.n_clients; i++) {
        close(H.clients[i].fd);
        json_decref(H.clients[i].body);
    }
    /* Connections whose close the server was not told of (a long-poll
     * takes the close callback over) are let go with the server. */
    coord_server_close(H.srv);
    guard_conn_release_all(&H.conns, NULL);
    event_free(H.tick);
    test_remove_tree(H.dir);
    free(H.dir);
}

/* One turn of the loop (at most a millisecond idle), then every client
 * reads what has come. */
static void pump(void) {
    struct timeval tv = {0, 1000};
    evtimer_add(H.tick, &tv);
    event_base_loop(H.srv->base, EVLOOP_ONCE);
    for (int i = 0; i < H.n_clients; i++) {
        client *c = &H.clients[i];
        ssize_t r;
        while (c->len < sizeof c->buf - 1 &&
               (r = recv(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len, 0)) > 0)
            c->len += (size_t)r;
        c->buf[c->len] = '\0';
        const char *end = c->status ? NULL : strstr(c->buf, "\r\n\r\n");
        if (!end) continue;
        const char *cl = strstr(c->buf, "Content-Length: ");
        size_t blen = cl && cl < end ? strtoul(cl + 16, NULL, 10) : 0;
        size_t head = (size_t)(end - c->buf) + 4;
        if (c->len < head + blen) continue;
        c->status = atoi(c->buf + 9);
        if (c->status == 200) c->body = json_loadb(c->buf + head, blen, 0, NULL);
    }
}

#define PUMP_UNTIL(cond, what)                                                             \
    do {                                                                                   \
        double end_ = vl_clock_mono_s() + STEP_S;                                          \
        while (!(cond)) {                                                                  \
            if (vl_clock_mono_s() > end_) fail_msg("%s: not within %.0f s", what, STEP_S); \
            pump();                                                                        \
        }                                                                                  \
    } while (0)

/* ---- peers and requests ------------------------------------------------------ */

static int add_peer(void) {
    assert_true(H.n_peers < MAX_PEERS);
    int i = H.n_peers++;
    vcrypto_identity_generate(&H.keys[i]);
    char name[16];
    snprintf(name, sizeof name, "p%d", i);
    OK(storage_peer_insert(H.srv->run.db, H.keys[i].pk, name, "{}", 0, vl_clock_unix_s(), &H.ids[i],
                           &e_));
    return i;
}

/* A task of peer i on version 0, inserted as the writer would have. */
static int64_t add_task(int i, storage_task_state state, int64_t deadline) {
    storage_task t = {.peer_id = H.ids[i],
                      .base_version = 0,
                      .data_offset = 0,
                      .data_length = 4096,
                      .seed = 1,
                      .issued_at = vl_clock_unix_s(),
                      .deadline = deadline,
                      .state = state};
    int64_t id = 0;
    OK(storage_task_insert(H.srv->run.db, &t, &id, &e_));
    return id;
}

/* Peer i's task on version 0 is done and its update stored: one of the
 * updates the merge takes. */
static void add_update(int i) {
    int64_t task = add_task(i, STORAGE_TASK_DONE, vl_clock_unix_s() + 600);
    size_t n = H.srv->run.n_params;
    float *d = random_vec(n, 50 + (uint64_t)i);
    for (size_t k = 0; k < n; k++) d[k] *= 1e-3f;
    compress_update_meta m = {.task = task,
                              .peer = H.ids[i],
                              .base_version = 0,
                              .num_samples = 16,
                              .local_steps = 4,
                              .loss = 3.0,
                              .kind = COMPRESS_DENSE};
    snprintf(m.run, sizeof m.run, "longpoll");
    vl_buf b;
    vl_buf_init(&b, 1 << 24);
    OK(compress_update_encode_dense(&m, d, n, ST_F32, &b, &e_));
    storage_update u = {.task_id = task,
                        .peer_id = H.ids[i],
                        .base_version = 0,
                        .num_samples = m.num_samples,
                        .local_steps = m.local_steps,
                        .loss = m.loss,
                        .nbytes = (int64_t)b.len,
                        .blob = b.data,
                        .received_at = vl_clock_unix_s()};
    snprintf(u.kind, sizeof u.kind, "%s", compress_kind_name(COMPRESS_DENSE));
    OK(storage_update_insert(H.srv->run.db, &u, NULL, &e_));
    vl_buf_free(&b);
    free(d);
}

static client *connect_client(void) {
    assert_true(H.n_clients < MAX_CLIENTS);
    client *c = &H.clients[H.n_clients++];
    memset(c, 0, sizeof *c);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    assert_true(c->fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, H.sock, strlen(H.sock) + 1);
    double end = vl_clock_mono_s() + STEP_S;
    while (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        assert_true(errno == EAGAIN || errno == EINTR);
        assert_true(vl_clock_mono_s() < end);
        pump();
    }
    return c;
}

static void send_all(client *c, const char *text) {
    size_t len = strlen(text), off = 0;
    while (off < len) {
        ssize_t w = send(c->fd, text + off, len - off, MSG_NOSIGNAL);
        if (w > 0)
            off += (size_t)w;
        else
            assert_true(w < 0 && (errno == EAGAIN || errno == EINTR));
    }
}

/* GET /v1/task?wait=wait signed by peer i. */
static client *ask_task(int i, int wait) {
    client *c = connect_client();
    char target[64], keyid[24], req[4096];
    snprintf(target, sizeof target, "/v1/task?wait=%d", wait);
    snprintf(keyid, sizeof keyid, "%lld", (long long)H.ids[i]);
    vcrypto_signed_headers sh;
    OK(vcrypto_sign_http(&H.keys[i], keyid, "GET", target, 0, NULL, 0, vl_clock_unix_s(), &sh));
    snprintf(req, sizeof req,
             "GET %s HTTP/1.1\r\nHost: longpoll\r\nSignature-Input: %s\r\nSignature: %s\r\n\r\n",
             target, sh.signature_input, sh.signature);
    send_all(c, req);
    return c;
}

/* Sends a request that may wait wait seconds and returns once it is
 * parked. */
static client *park_task_for(int i, int wait) {
    size_t before = H.srv->sched.n_waiters;
    client *c = ask_task(i, wait);
    PUMP_UNTIL(H.srv->sched.n_waiters == before + 1 || c->status, "a task request to park");
    if (c->status) fail_msg("peer %d was answered %d instead of waiting", i, c->status);
    return c;
}

static client *park_task(int i) {
    return park_task_for(i, WAIT_S);
}

static probe *park_probe(void (*at_version)(probe *p)) {
    assert_true(H.n_probes < MAX_PROBES);
    probe *p = &H.probes[H.n_probes++];
    p->at_version = at_version;
    size_t before = H.srv->sched.n_waiters;
    send_all(connect_client(), "GET /test/probe HTTP/1.1\r\nHost: longpoll\r\n\r\n");
    PUMP_UNTIL(H.srv->sched.n_waiters == before + 1, "the test's waiter to park");
    return p;
}

static int all_answered(client *const *c, int n) {
    for (int k = 0; k < n; k++)
        if (!c[k]->status) return 0;
    return 1;
}

/* Turns the loop for up to seconds, or until cond(arg). */
static void pump_for(double seconds, int (*cond)(void *arg), void *arg) {
    double end = vl_clock_mono_s() + seconds;
    while (!cond(arg) && vl_clock_mono_s() < end) pump();
}

static int answered(void *arg) {
    return ((client *)arg)->status != 0;
}

static int64_t task_field(const client *c, const char *key) {
    return (int64_t)json_integer_value(json_object_get(c->body, key));
}

/* ---- gates on the server's threads ---------------------------------------- */

/* A job that, once its thread runs it, holds that thread until opened. */
typedef struct gate {
    coord_job job;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, open;
} gate;

static int gate_run(storage *db, coord_job *job, vl_error *err) {
    (void)db;
    (void)err;
    gate *g = (gate *)job;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    return VL_OK;
}

static void gate_done(coord_job *job, int rc, const vl_error *err) {
    (void)job;
    (void)err;
    assert_int_equal(rc, VL_OK);
}

/* Starts g on the compute thread (compute) or the writer, and returns
 * once that thread is held in it. */
static void gate_close(gate *g, int compute) {
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->job.run = gate_run;
    g->job.done = gate_done;
    if (compute)
        coord_writer_compute(H.srv->run.writer, &g->job);
    else
        coord_writer_submit(H.srv->run.writer, &g->job);
    pthread_mutex_lock(&g->mu);
    while (!g->entered) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g) {
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_free(gate *g) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

static size_t writer_queued(void) {
    coord_writer_stats st;
    coord_writer_stats_get(H.srv->run.writer, &st);
    return (size_t)st.queued;
}

/* ---- the probes ------------------------------------------------------------- */

/* Holds the wake-up until the writer has committed every lease handed out
 * so far, whose done callbacks cannot run before this returns: the
 * database then holds them while they are still on their way. */
static void hold_for_commits(probe *p) {
    (void)p;
    coord_server *srv = H.srv;
    assert_true(srv->sched.issuing > 0);
    uint64_t last = 0;
    for (int64_t i = 0; i < srv->sched.issuing; i++)
        if (srv->sched.issuing_leases[i].seq > last) last = srv->sched.issuing_leases[i].seq;
    double end = vl_clock_mono_s() + STEP_S;
    while (coord_writer_settled(srv->run.writer) < last) {
        if (vl_clock_mono_s() > end) fail_msg("the writer did not commit the leases");
        usleep(1000);
    }
    int64_t held = 0;
    OK(storage_task_count_slots(srv->run.db, srv->run.version, vl_clock_unix_s(), &held, &e_));
    assert_int_equal(held, srv->sched.issuing);
}

static void record_issuing(probe *p) {
    p->issuing = H.srv->sched.issuing;
}

/* ---- the tests ---------------------------------------------------------------- */

#define SLOTS 6

/* Six task requests from six peers park across a merge of version 1 in a
 * run of six updates a version: two before it starts, two while the
 * version is computed, two once it is computed and waits for its commit.
 * When it commits, the wake-up gives all six a task of version 1, in the
 * order they asked, while a request that comes after finds every slot
 * taken. */
static void test_waiters_across_merge(void **state) {
    (void)state;
    open_run(SLOTS, 600);
    for (int k = 0; k < SLOTS; k++) add_update(add_peer());
    int w[SLOTS];
    for (int k = 0; k < SLOTS; k++) w[k] = add_peer();
    int late = add_peer();
    client *c[SLOTS];

    c[0] = park_task(w[0]);
    c[1] = park_task(w[1]);
    gate compute, writer;
    gate_close(&compute, 1);
    vl_error e = {0};
    assert_int_equal(coord_merge_if_ready(H.srv, &e), VL_OK);
    assert_true(H.srv->sched.merging);
    c[2] = park_task(w[2]);
    park_probe(hold_for_commits);
    c[3] = park_task(w[3]);
    /* The version computed, its commit queued behind the held writer. */
    gate_close(&writer, 0);
    gate_open(&compute);
    PUMP_UNTIL(writer_queued() == 1, "the version to reach the writer");
    c[4] = park_task(w[4]);
    c[5] = park_task(w[5]);
    probe *rec = park_probe(record_issuing);
    assert_int_equal(H.srv->run.version, 0);

    gate_open(&writer);
    PUMP_UNTIL(all_answered(c, SLOTS), "every parked request to be answered");
    int64_t last_id = 0;
    for (int k = 0; k < SLOTS; k++) {
        if (c[k]->status != 200) fail_msg("request %d was answered %d", k, c[k]->status);
        assert_int_equal(task_field(c[k], "base_version"), 1);
        int64_t id = task_field(c[k], "task_id");
        if (id <= last_id)
            fail_msg("request %d (asked after request %d) got task %lld, before its %lld", k, k - 1,
                     (long long)id, (long long)last_id);
        last_id = id;
    }
    /* In order and all answered, but perhaps by later wake-ups (the done
     * callbacks of the first leases): the one after the version must have
     * handed out every slot itself. A waiter it leaves depends on another
     * wake-up reaching it; before those done callbacks woke the queue,
     * none did until the next version, and a peer asking later took its
     * slot. */
    if (rec->issuing != SLOTS)
        fail_msg("the wake-up after version 1 handed out %lld of its %d free slots to the %d "
                 "requests waiting",
                 (long long)rec->issuing, SLOTS, SLOTS);
    client *z = ask_task(late, 0);
    PUMP_UNTIL(z->status, "the late request");
    if (z->status != 204) fail_msg("a request after the six got %d, not 204", z->status);
    gate_free(&compute);
    gate_free(&writer);
    close_run();
}

/* A run of two slots on version 0, one held by a lease that ends at the
 * next whole second, one by a done task, and a request parked for a slot;
 * the writer is held, so the lease timer's expiry (and the wake-up after
 * it) waits. Returns the parked request's client; *deadline is the
 * lease's, *other a peer with no task yet (registered first: the held
 * writer holds the database's write lock). */
static client *slot_about_to_free(gate *writer, int64_t *deadline, int *other) {
    open_run(2, 600);
    int holder = add_peer(), done = add_peer(), parked = add_peer();
    *other = add_peer();
    /* Early in a second, so that the requests the tests park next are in
     * before the deadline and a wait of one second ends after it. */
    struct timespec ts;
    do {
        usleep(5000);
        clock_gettime(CLOCK_REALTIME, &ts);
    } while (ts.tv_nsec > 100000000L);
    *deadline = vl_clock_unix_s() + 1;
    add_task(holder, STORAGE_TASK_LEASED, *deadline);
    add_task(done, STORAGE_TASK_DONE, vl_clock_unix_s() + 600);
    client *w = park_task(parked);
    gate_close(writer, 0);
    coord_arm_lease_timer(H.srv);
    return w;
}

/* A lease's deadline frees its slot while the lease timer's expiry waits
 * for the writer: a request that arrives then must leave the slot to the
 * one parked before it. */
static void test_expired_slot_goes_to_oldest(void **state) {
    (void)state;
    gate writer;
    int64_t deadline = 0;
    int late = 0;
    client *w = slot_about_to_free(&writer, &deadline, &late);
    PUMP_UNTIL(vl_clock_unix_s() >= deadline && H.srv->sched.expiring, "the lease to run out");
    /* Refused on the loop, with the writer still held, when the slot went
     * to the parked request; answered after the writer when it took it. */
    client *z = ask_task(late, 0);
    pump_for(1.0, answered, z);
    gate_open(&writer);
    PUMP_UNTIL(z->status, "the late request to be answered");
    pump_for(2.0, answered, w);
    if (w->status != 200 || z->status != 204)
        fail_msg("the freed slot went to the request that came later: the parked one got %d, "
                 "the later one %d",
                 w->status, z->status);
    assert_int_equal(task_field(w, "base_version"), 0);
    gate_free(&writer);
    close_run();
}

/* The same freed slot, and a request parked after the first whose wait
 * ends then: its last look must leave the slot to the older request and
 * answer it 204. */
static void test_timeout_leaves_slot_to_oldest(void **state) {
    (void)state;
    gate writer;
    int64_t deadline = 0;
    int other = 0;
    client *w = slot_about_to_free(&writer, &deadline, &other);
    /* Its wait ends a second after it parked, past the lease's deadline. */
    client *s = park_task_for(other, 1);
    pump_for(3.0, answered, s);
    gate_open(&writer);
    PUMP_UNTIL(s->status, "the request whose wait ended to be answered");
    pump_for(2.0, answered, w);
    if (w->status != 200 || s->status != 204)
        fail_msg("the freed slot went to the request whose wait ended: the one parked first "
                 "got %d, that one %d",
                 w->status, s->status);
    gate_free(&writer);
    close_run();
}

/* A peer's second task request, parked beside its first, waits for the
 * lease its first gets, not for a slot: the requests behind it are served
 * by the same wake-up. */
static void test_second_request_holds_up_nobody(void **state) {
    (void)state;
    open_run(2, 600);
    add_update(add_peer());
    add_update(add_peer());
    int twice = add_peer(), other = add_peer();
    client *a = park_task(twice);
    client *b = park_task(twice);
    client *o = park_task(other);
    probe *rec = park_probe(record_issuing);
    vl_error e = {0};
    assert_int_equal(coord_merge_if_ready(H.srv, &e), VL_OK);
    PUMP_UNTIL(H.srv->run.version == 1, "version 1");
    if (rec->issuing != 2)
        fail_msg("the wake-up after version 1 handed out %lld leases to the two peers waiting, "
                 "not 2",
                 (long long)rec->issuing);
    PUMP_UNTIL(a->status && b->status && o->status, "the three requests to be answered");
    assert_int_equal(a->status, 200);
    assert_int_equal(b->status, 200);
    assert_int_equal(o->status, 200);
    assert_int_equal(task_field(a, "task_id"), task_field(b, "task_id"));
    assert_true(task_field(o, "task_id") != task_field(a, "task_id"));
    assert_int_equal(task_field(o, "base_version"), 1);
    close_run();
}

/* A peer's request that parked while its lease was being written is
 * answered with that lease once it is committed, though a request parked
 * before it still waits for a slot. */
static void test_lease_answered_while_queue_waits(void **state) {
    (void)state;
    open_run(1, 600);
    int first = add_peer(), other = add_peer();
    gate writer;
    gate_close(&writer, 0);
    client *a = ask_task(first, WAIT_S);
    PUMP_UNTIL(H.srv->sched.issuing == 1, "the only slot's lease to be on its way");
    client *o = park_task(other);
    client *b = park_task(first);
    gate_open(&writer);
    PUMP_UNTIL(a->status, "the first request to be answered");
    pump_for(3.0, answered, b);
    if (b->status != 200)
        fail_msg("the peer's second request got %d, not its lease, while the request parked "
                 "before it waits for a slot",
                 b->status);
    assert_int_equal(a->status, 200);
    assert_int_equal(task_field(a, "task_id"), task_field(b, "task_id"));
    assert_int_equal(o->status, 0);
    gate_free(&writer);
    close_run();
}

int main(void) {
    vl_log_set_level(LOG_WARN);
    if (vcrypto_init() != VL_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_waiters_across_merge),
        cmocka_unit_test(test_expired_slot_goes_to_oldest),
        cmocka_unit_test(test_timeout_leaves_slot_to_oldest),
        cmocka_unit_test(test_second_request_holds_up_nobody),
        cmocka_unit_test(test_lease_answered_while_queue_waits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
