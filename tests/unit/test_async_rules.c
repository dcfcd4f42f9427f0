/* The rules of asynchronous runs, against values worked by hand: the
 * delayed Nesterov step, lease_wait's bound and the momentum gate, dynamic
 * local steps, and which leases out a waiting peer may count on. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "coordinator/run/aggregator.h"
#include "coordinator/run/factors.h"
#include "coordinator/run/round.h"
#include "coordinator/coord.h"
#include "coordinator/base/sched_rules.h"
#include "test_util.h"
#include "coordinator/base/outer.h"
#include "coordinator/config/config.h"
#include "coordinator/sched/schedule.h"

static void test_delayed_nesterov_by_hand(void **state) {
    (void)state;
    /* delay 2, lr 0.5, mu 0.9, one coordinate; versions 1..4 get d = 0.4,
     * 0.2, 0.2, 0.4. Plain versions (1, 3) step lr*d/2; versions 2 and 4
     * also move momentum by the mean of the cycle and step lr*mu*m:
     *   v1: acc 0.4, s = 0.1
     *   v2: acc 0.6, m = 0.3,  s = 0.05 + 0.5*0.9*0.3  = 0.185, acc 0
     *   v3: acc 0.2, s = 0.05
     *   v4: acc 0.6, m = 0.9*0.3 + 0.3 = 0.57, s = 0.1 + 0.5*0.9*0.57 = 0.3565 */
    const float ds[4] = {0.4f, 0.2f, 0.2f, 0.4f};
    const float want_s[4] = {0.1f, 0.185f, 0.05f, 0.3565f};
    const float want_m[4] = {0, 0.3f, 0.3f, 0.57f};
    float m = 0, acc = 0;
    for (int v = 1; v <= 4; v++) {
        float d = ds[v - 1];
        coord_outer_delayed(&d, &m, &acc, 1, 0.5, 0.9, 2, coord_outer_delay_due(v, 2));
        assert_float_equal(d, want_s[v - 1], 1e-6);
        assert_float_equal(m, want_m[v - 1], 1e-6);
        float want_acc = v % 2 ? ds[v - 1] : 0.0f;
        assert_float_equal(acc, want_acc, 1e-6);
    }
    /* The cycle is a rule of the version number; delay 1 is every version. */
    assert_false(coord_outer_delay_due(1, 4));
    assert_false(coord_outer_delay_due(6, 4));
    assert_true(coord_outer_delay_due(4, 4));
    assert_true(coord_outer_delay_due(8, 4));
    assert_true(coord_outer_delay_due(3, 1));
    /* Delay 1 is the plain Nesterov step of coord_outer_step. */
    enum { N = 64 };
    float th1[N], th2[N], m1[N], m2[N], a2[N], dbar[N], s2[N];
    for (int i = 0; i < N; i++) {
        th1[i] = th2[i] = 0.01f * (float)i;
        m1[i] = m2[i] = 0.5f - 0.01f * (float)i;
        a2[i] = 0;
        dbar[i] = s2[i] = (float)((i * 37) % 11) * 0.1f - 0.5f;
    }
    coord_outer_step(th1, m1, dbar, N, 0.7, 0.9);
    coord_outer_delayed(s2, m2, a2, N, 0.7, 0.9, 1, 1);
    for (int i = 0; i < N; i++) {
        assert_float_equal(th1[i], th2[i] - s2[i], 1e-6);
        assert_float_equal(m1[i], m2[i], 1e-6);
        assert_float_equal(a2[i], 0, 0);
    }
    /* Steady state with a constant d: a whole cycle moves lr*d/(1 - mu),
     * what a synchronous Nesterov step moves. */
    m = 0;
    acc = 0;
    double moved = 0;
    for (int v = 1; v <= 400; v++) {
        float d = 1.0f;
        coord_outer_delayed(&d, &m, &acc, 1, 0.5, 0.8, 4, coord_outer_delay_due(v, 4));
        if (v > 396) moved += d;
    }
    assert_float_equal(moved, 0.5 / (1 - 0.8), 1e-4);
}

/* lease_wait's bound and the momentum gate, against hand-worked values. */
static void test_lease_wait_by_hand(void **state) {
    (void)state;
    /* 1.5 times a 2 s task: 3 s from the start. */
    assert_true(fabs(coord_sched_wait_left(100.0, 101.0, 1.5, 2.0) - 2.0) < 1e-12);
    assert_true(coord_sched_wait_left(100.0, 103.5, 1.5, 2.0) == 0);
    /* Off, or no task timed yet: no wait. */
    assert_true(coord_sched_wait_left(100.0, 100.0, 0, 2.0) == 0);
    assert_true(coord_sched_wait_left(100.0, 100.0, 1.0, 0) == 0);
    assert_true(coord_sched_wait_left(100.0, 100.0, 1.0, NAN) == 0);
    /* Momentum only while fewer than half the updates are stale. */
    assert_true(coord_outer_momentum_due(0, 4));
    assert_true(coord_outer_momentum_due(1, 4));
    assert_false(coord_outer_momentum_due(2, 4));
    assert_false(coord_outer_momentum_due(1, 1));
    assert_true(coord_outer_momentum_due(0, 1));
    /* A plain step moves by lr times the mean and leaves no trace in the
     * momentum; the sparse one goes through the residual. */
    float theta[3] = {1, 2, 3}, d[3] = {0.5f, -1, 0};
    coord_outer_plain(theta, d, 3, 0.5);
    assert_float_equal(theta[0], 0.75, 1e-7);
    assert_float_equal(theta[1], 2.5, 1e-7);
    assert_float_equal(theta[2], 3, 1e-7);
    float e[3] = {0, -0.25f, 0};
    uint32_t idx[1];
    size_t nnz = 0;
    OK(coord_outer_plain_sparse(theta, e, d, 3, 0.5, 1, idx, &nnz, &e_));
    /* e = {0.25, -0.75, 0}: the largest is applied and taken out. */
    assert_int_equal(nnz, 1);
    assert_int_equal(idx[0], 1);
    assert_float_equal(theta[1], 3.25, 1e-7);
    assert_float_equal(e[0], 0.25, 1e-7);
    assert_float_equal(e[1], 0, 0);
}

static void test_dynamic_steps_by_hand(void **state) {
    (void)state;
    /* No overheads: the quickest task is 20 steps of 1 s. A peer 4x
     * slower gets a quarter of the steps. */
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 4.0, 0, 20.0), 5);
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 1.0, 0, 20.0), 20);
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 1.5, 0, 20.0), 13);  /* 13.33 */
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 1.6, 0, 20.0), 13);  /* 12.5 up */
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 100.0, 0, 20.0), 2); /* the floor */
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 0.5, 0, 20.0), 20);  /* never above h_max */
    /* Within COORD_DYNAMIC_SNAP (0.15) of the quickest: every step. 20 /
     * 1.17 = 17.09 >= 17 snaps; 20 / 1.2 = 16.67 rounds to 17 and does
     * not, as the snap reads the pace before rounding. */
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 1.05, 0, 20.0), 20);
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 1.17, 0, 20.0), 20);
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 1.2, 0, 20.0), 17);
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 1.0, 2.5, 20.0), 20); /* 17.5 snaps */
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 1.0, 3.5, 20.0), 17); /* 16.5 up */
    /* Transfers that do not shrink with the steps: the quickest task is
     * 20 steps of 1 s and 4 s of transfers (24 s); a peer 4x slower per
     * step with 4 s of transfers gets (24 - 4) / 4 = 5 steps, one with
     * 12 s gets 3, one whose transfers alone outlast the task the floor.
     * (Timing whole tasks per step reaches the same counts only over
     * several tasks, since that pace changes with the steps given.) */
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 4.0, 4.0, 24.0), 5);
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 4.0, 12.0, 24.0), 3);
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 0.5, 30.0, 24.0), 2);
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 1.0, -1.0, 20.0), 20); /* no overhead */
    /* Unknown paces leave h_max. */
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 0, 0, 20.0), 20);
    assert_int_equal(coord_sched_dynamic_steps(20, 2, 3.0, 0, 0), 20);
    assert_int_equal(coord_sched_dynamic_steps(20, 2, NAN, 0, 20.0), 20);
    /* A floor above h_max is h_max; below 1 is 1. */
    assert_int_equal(coord_sched_dynamic_steps(3, 9, 10.0, 0, 3.0), 3);
    assert_int_equal(coord_sched_dynamic_steps(3, 0, 10.0, 0, 3.0), 1);
    assert_int_equal(coord_sched_dynamic_floor(20), 2);
    assert_int_equal(coord_sched_dynamic_floor(5), 1);
    assert_int_equal(coord_sched_dynamic_floor(1), 1);
}

/* The leases a waiting peer counts on: those whose updates the holders'
 * paces say are due within the wait. */
static void test_speed_due_by_hand(void **state) {
    (void)state;
    double now = vl_clock_mono_s();
    coord_speed sp[] = {
        /* the peer that asks: never counted */
        {.peer_id = 1, .task_id = 11, .steps = 20, .leased_at = now - 1, .sec_per_step = 0.1},
        /* 10 steps of 1 s and 2 s of transfers, leased 5 s ago: due in 7 s */
        {.peer_id = 2,
         .task_id = 12,
         .steps = 10,
         .leased_at = now - 5,
         .sec_per_step = 1,
         .overhead_s = 2},
        /* its pace not measured yet: counted whatever the wait */
        {.peer_id = 3, .task_id = 13, .steps = 20, .leased_at = now - 1},
        /* its last update timed, no lease out */
        {.peer_id = 4, .task_id = 14, .steps = 20, .leased_at = 0, .sec_per_step = 0.1},
        /* a 4 s task leased 6 s ago: 2 s late, still counted */
        {.peer_id = 5, .task_id = 15, .steps = 4, .leased_at = now - 6, .sec_per_step = 1},
        /* a 4 s task leased 20 s ago: late by more than a task, not counted */
        {.peer_id = 6, .task_id = 16, .steps = 4, .leased_at = now - 20, .sec_per_step = 1},
    };
    coord_server srv;
    memset(&srv, 0, sizeof srv);
    srv.sched.speeds = sp;
    srv.sched.n_speeds = sizeof sp / sizeof sp[0];
    srv.sched.cap_speeds = srv.sched.n_speeds;
    assert_int_equal(coord_speed_due(&srv, 1, 10.0), 3); /* peers 2, 3, 5 */
    assert_int_equal(coord_speed_due(&srv, 1, 5.0), 2);  /* peer 2 not yet */
    assert_int_equal(coord_speed_due(&srv, 1, 0), 2);
    /* Asked by peer 2, peer 1's 2 s task counts instead. */
    assert_int_equal(coord_speed_due(&srv, 2, 5.0), 3);
}

/* The pace the others' steps are scaled to passes over as many of the
 * quickest peers as the merge rule cuts from each end: a peer answering
 * every lease at once (a hostile one, 0.05 s a step) sets it under the
 * plain mean, not under the trimmed mean or the median. */
static void test_pace_skips_what_the_rule_cuts(void **state) {
    (void)state;
    double now = vl_clock_mono_s();
    coord_speed sp[] = {
        {.peer_id = 1, .sec_per_step = 0.05, .seen = now},
        {.peer_id = 2, .sec_per_step = 1.0, .seen = now},
        {.peer_id = 3, .sec_per_step = 1.0, .seen = now},
        {.peer_id = 4, .sec_per_step = 2.0, .seen = now},
        {.peer_id = 5, .sec_per_step = 4.0, .seen = now},
    };
    coord_server srv;
    memset(&srv, 0, sizeof srv);
    coord_config_defaults(&srv.run.cfg);
    snprintf(srv.run.cfg.mode, sizeof srv.run.cfg.mode, "async");
    srv.run.cfg.train.steps = 20;
    srv.run.cfg.train.dynamic_steps = 1;
    srv.sched.speeds = sp;
    srv.sched.n_speeds = sizeof sp / sizeof sp[0];
    srv.sched.cap_speeds = srv.sched.n_speeds;
    /* The plain mean: T = 20 x 0.05 = 1 s; peer 5 gets 1 / 4 steps, the
     * floor of 2 (20 / 8). */
    srv.run.cfg.robust.rule = COORD_RULE_MEAN;
    assert_int_equal(coord_speed_lease(&srv, 5, 105), 2);
    /* Trimmed mean 0.2 of 5 peers cuts 1: T = 20 x 1.0; peer 5 gets 5,
     * peer 4 10. */
    srv.run.cfg.robust.rule = COORD_RULE_TRIMMED_MEAN;
    srv.run.cfg.robust.trim = 0.2;
    assert_int_equal(coord_speed_lease(&srv, 5, 205), 5);
    assert_int_equal(coord_speed_lease(&srv, 4, 204), 10);
    /* Trim 0.4 cuts 2: still peer 3's 1 s a step. The median keeps the
     * middle one (the third, 1 s): the same. */
    srv.run.cfg.robust.trim = 0.4;
    assert_int_equal(coord_speed_lease(&srv, 5, 305), 5);
    srv.run.cfg.robust.rule = COORD_RULE_MEDIAN;
    assert_int_equal(coord_speed_lease(&srv, 5, 405), 5);
    /* Peer 2 gone quiet (seen 11 minutes ago): of the 4 left, the median
     * passes over 1, so peer 3's 1 s is the pace; trimmed 0.2 of 4 cuts
     * none, so the hostile peer's is. */
    sp[1].seen = now - 660;
    assert_int_equal(coord_speed_lease(&srv, 5, 505), 5);
    srv.run.cfg.robust.rule = COORD_RULE_TRIMMED_MEAN;
    srv.run.cfg.robust.trim = 0.2;
    assert_int_equal(coord_speed_lease(&srv, 5, 605), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_delayed_nesterov_by_hand),
        cmocka_unit_test(test_lease_wait_by_hand),
        cmocka_unit_test(test_dynamic_steps_by_hand),
        cmocka_unit_test(test_speed_due_by_hand),
        cmocka_unit_test(test_pace_skips_what_the_rule_cuts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
