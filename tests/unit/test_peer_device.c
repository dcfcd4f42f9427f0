/* peer: --device. The names parse strictly; cpu is always the CPU; auto and
 * cuda agree on whether this machine has a usable GPU (auto names it, or
 * says why not; cuda without one is refused). A trainer told to use a GPU
 * it cannot use fails the task under cuda and, under auto, moves to the
 * CPU and trains exactly as a CPU trainer would. In a CUDA build a GPU that
 * is present but unusable fails this program: the CPU path passing would
 * otherwise hide a broken driver on a GPU machine. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "peer/peer.h"
#include "peer_fixtures.h"

#if defined(VOLLEY_HAVE_CUDA)
#include "kernels/kernels.h"
#endif

static void test_device_parse(void **state) {
    (void)state;
    peer_device_want w = PEER_DEVICE_WANT_CPU;
    assert_int_equal(peer_device_parse("auto", &w), VL_OK);
    assert_int_equal(w, PEER_DEVICE_WANT_AUTO);
    assert_int_equal(peer_device_parse("cpu", &w), VL_OK);
    assert_int_equal(w, PEER_DEVICE_WANT_CPU);
    assert_int_equal(peer_device_parse("cuda", &w), VL_OK);
    assert_int_equal(w, PEER_DEVICE_WANT_CUDA);
    const char *bad[] = {"gpu", "", "CPU", "cuda ", "cuda0", NULL};
    for (int i = 0; bad[i]; i++) assert_int_equal(peer_device_parse(bad[i], &w), VL_EINVAL);
    assert_int_equal(peer_device_parse(NULL, &w), VL_EINVAL);
}

static void test_device_choose(void **state) {
    (void)state;
    vl_error e = {0};
    peer_device d;
    assert_int_equal(peer_device_choose(PEER_DEVICE_WANT_CPU, &d, &e), VL_OK);
    assert_int_equal(d.kind, PEER_DEVICE_CPU);
    assert_string_equal(d.desc, "the CPU (--device cpu)");

    peer_device a;
    assert_int_equal(peer_device_choose(PEER_DEVICE_WANT_AUTO, &a, &e), VL_OK);
    peer_device c;
    vl_error ce = {0};
    int rc = peer_device_choose(PEER_DEVICE_WANT_CUDA, &c, &ce);
    if (a.kind == PEER_DEVICE_CUDA) {
        assert_int_equal(strncmp(a.desc, "CUDA device 0: ", 15), 0);
        assert_int_equal(rc, VL_OK);
        assert_int_equal(c.kind, PEER_DEVICE_CUDA);
    } else {
        const char *p = "the CPU (no usable GPU: ";
        assert_int_equal(strncmp(a.desc, p, strlen(p)), 0);
        assert_int_equal(rc, VL_EINVAL);
        assert_non_null(strstr(ce.msg, "--device cuda: no usable GPU ("));
        /* The reason is the one auto gave. */
        assert_non_null(strstr(ce.msg, a.desc + strlen(p)));
    }
}

#if defined(VOLLEY_HAVE_CUDA)
/* The probe behind auto: auto's choice and line agree with what it found,
 * and a GPU that is present but unusable fails the test. */
static void test_cuda_probe(void **state) {
    (void)state;
    char why[256];
    int n = -1;
    int st = kernels_cuda_probe(&n, why, sizeof why);
    printf("CUDA probe: %s (%s)\n",
           st == KERNELS_CUDA_OK       ? "OK"
           : st == KERNELS_CUDA_ABSENT ? "absent"
                                       : "BROKEN",
           why);
    assert_true(st == KERNELS_CUDA_OK || st == KERNELS_CUDA_ABSENT || st == KERNELS_CUDA_BROKEN);
    assert_true(st == KERNELS_CUDA_OK ? n > 0 : n == 0);
    assert_int_equal(kernels_cuda_device_count(), n);
    assert_int_equal(kernels_cuda_probe(NULL, NULL, 0), st);
    vl_error e = {0};
    peer_device a;
    assert_int_equal(peer_device_choose(PEER_DEVICE_WANT_AUTO, &a, &e), VL_OK);
    assert_int_equal(a.kind, st == KERNELS_CUDA_OK ? PEER_DEVICE_CUDA : PEER_DEVICE_CPU);
    if (st != KERNELS_CUDA_OK) assert_non_null(strstr(a.desc, why));
    if (st == KERNELS_CUDA_BROKEN) {
        assert_non_null(strstr(a.desc, "present but unusable"));
        fail_msg("CUDA is present but unusable (%s)", why);
    }
}
#endif

/* A trainer holding TINY, set to train on kind. */
static void trainer_on(peer_trainer *t, peer_device_kind kind, int fallback) {
    peer_trainer_init(t);
    vl_error e = {0};
    assert_int_equal(peer_trainer_init_model(t, &TINY, 0, &e), VL_OK);
    t->device = kind;
    t->gpu_fallback = fallback;
}

/* One optimizer's case: AdamW tasks run wholly on the device, SGD tasks
 * only their forward and backward. */
static void check_fallback(int sgd, const peer_device *a) {
    vl_error e = {0};
    peer_task task = tiny_task(5);
    if (sgd) {
        task.sgd = 1;
        task.lr = 0.1;
        task.momentum = 0.9;
    }
    peer_train_result cpu_res, res;
    peer_trainer cpu, t;
    trainer_on(&cpu, PEER_DEVICE_CPU, 0);
    assert_int_equal(peer_trainer_run(&cpu, &task, TEXT, 17, &cpu_res, &e), VL_OK);

    trainer_on(&t, PEER_DEVICE_CUDA, 1);
    assert_int_equal(peer_trainer_run(&t, &task, TEXT, 17, &res, &e), VL_OK);
    assert_int_equal(res.steps, cpu_res.steps);
    if (a->kind == PEER_DEVICE_CUDA) {
        /* A real GPU trained it: bf16 products, so close, not equal. */
        assert_int_equal(t.device, PEER_DEVICE_CUDA);
        assert_float_equal(res.first_loss, cpu_res.first_loss, 2e-2);
        assert_true(res.last_loss < res.first_loss);
        /* The device's optimizer state came back for trainer.st. */
        if (!sgd) assert_int_equal(t.opt.step, cpu.opt.step);
    } else {
        /* The GPU failed at the first step; everything ran on the CPU. */
        assert_int_equal(t.device, PEER_DEVICE_CPU);
        assert_null(t.gpu);
        assert_memory_equal(t.delta, cpu.delta, cpu.n_params * sizeof(float));
        assert_true(res.first_loss == cpu_res.first_loss);
        assert_true(res.last_loss == cpu_res.last_loss);
        if (!sgd) {
            assert_int_equal(t.opt.step, cpu.opt.step);
            assert_memory_equal(t.opt.m, cpu.opt.m, cpu.n_params * sizeof(float));
            assert_memory_equal(t.opt.v, cpu.opt.v, cpu.n_params * sizeof(float));
        } else {
            assert_memory_equal(t.sgd.buf, cpu.sgd.buf, cpu.n_params * sizeof(float));
        }
    }
    peer_trainer_free(&t);

    trainer_on(&t, PEER_DEVICE_CUDA, 0);
    vl_error ge = {0};
    int rc = peer_trainer_run(&t, &task, TEXT, 17, &res, &ge);
    if (a->kind == PEER_DEVICE_CUDA) {
        assert_int_equal(rc, VL_OK);
    } else {
        assert_true(rc < 0);
        assert_int_equal(strncmp(ge.msg, "GPU: ", 5), 0);
        assert_int_equal(t.device, PEER_DEVICE_CUDA); /* no fallback under cuda */
        assert_null(t.gpu);
        /* The failed task left the optimizer where the task found it. */
        if (!sgd) assert_int_equal(t.opt.step, 0);
    }
    peer_trainer_free(&t);
    peer_trainer_free(&cpu);
}

static void test_gpu_failure_falls_back_or_fails(void **state) {
    (void)state;
    vl_error e = {0};
    peer_device a;
    assert_int_equal(peer_device_choose(PEER_DEVICE_WANT_AUTO, &a, &e), VL_OK);
    check_fallback(0, &a);
    check_fallback(1, &a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_parse),
        cmocka_unit_test(test_device_choose),
#if defined(VOLLEY_HAVE_CUDA)
        cmocka_unit_test(test_cuda_probe),
#endif
        cmocka_unit_test(test_gpu_failure_falls_back_or_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
