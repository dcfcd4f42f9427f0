/* The device-memory cap (kernels_cuda_set_mem_cap, volley-peer --gpu-mem):
 * what is held is counted and given back, an allocation past the cap
 * fails as one past the card's memory does (VL_ENOMEM, the runtime's
 * cudaErrorMemoryAllocation named), and a trainer that meets it moves to
 * the CPU under --device auto, training exactly as a CPU trainer, or fails
 * the task under --device cuda. Without a usable device the program
 * reports itself skipped (exit 77) before any test runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cuda_model.h"
#include "model/gpt_cuda.h"
#include "peer/peer.h"
#include "cuda_skip.h"
#include "peer_fixtures.h"

static void test_cap_counts_and_refuses(void **state) {
    (void)state;
    vl_error e = {0};
    size_t base = kernels_cuda_mem_in_use();
    void *a = NULL, *b = NULL, *c = NULL;
    kernels_cuda_set_mem_cap(base + (3u << 20));
    assert_int_equal(kernels_cuda_alloc(&a, 1u << 20, &e), VL_OK);
    assert_int_equal(kernels_cuda_alloc(&b, 2u << 20, &e), VL_OK);
    assert_int_equal(kernels_cuda_mem_in_use(), base + (3u << 20));
    /* One byte past the cap is refused, as a full card would refuse it. */
    assert_int_equal(kernels_cuda_alloc(&c, 1, &e), VL_ENOMEM);
    assert_null(c);
    assert_non_null(strstr(e.msg, "cudaErrorMemoryAllocation"));
    /* What a free gives back can be taken again. */
    kernels_cuda_free(a);
    assert_int_equal(kernels_cuda_mem_in_use(), base + (2u << 20));
    assert_int_equal(kernels_cuda_alloc(&c, 1u << 20, &e), VL_OK);
    /* A request larger than the whole cap cannot wrap the arithmetic. */
    assert_int_equal(kernels_cuda_alloc(&a, SIZE_MAX - 8, &e), VL_ENOMEM);
    kernels_cuda_free(b);
    kernels_cuda_free(c);
    assert_int_equal(kernels_cuda_mem_in_use(), base);
    /* No cap: the card's memory is the only bound. */
    kernels_cuda_set_mem_cap(0);
    assert_int_equal(kernels_cuda_alloc(&a, 64u << 20, &e), VL_OK);
    kernels_cuda_free(a);
    assert_int_equal(kernels_cuda_mem_in_use(), base);
}

/* The device model's buffers are counted: under a 1 MiB cap a model with
 * more parameters than that cannot be made, and nothing is left held. */
static void test_model_under_cap(void **state) {
    (void)state;
    vl_error e = {0};
    model_gpt_config cfg = {256, 64, 2, 4, 128};
    model_gpt *cpu = NULL;
    assert_int_equal(model_gpt_create(&cfg, &cpu, &e), VL_OK);
    model_gpt_init_weights(cpu, 1);
    size_t base = kernels_cuda_mem_in_use();
    kernels_cuda_set_mem_cap(1u << 20);
    model_gpt_cuda *g = NULL;
    assert_int_equal(model_gpt_cuda_create(cpu, KERNELS_CUDA_BF16, &g, &e), VL_ENOMEM);
    assert_null(g);
    assert_int_equal(kernels_cuda_mem_in_use(), base);
    kernels_cuda_set_mem_cap(0);
    assert_int_equal(model_gpt_cuda_create(cpu, KERNELS_CUDA_BF16, &g, &e), VL_OK);
    assert_true(kernels_cuda_mem_in_use() > base + (1u << 20));
    model_gpt_cuda_free(g);
    assert_int_equal(kernels_cuda_mem_in_use(), base);
    model_gpt_free(cpu);
}

/* A 5-step task under a 1 MiB cap: auto trains it on the CPU, bit for bit
 * as a CPU trainer does; cuda fails it and leaves the optimizer alone. */
static void test_trainer_under_cap(void **state) {
    (void)state;
    vl_error e = {0};
    peer_task task = tiny_task(5);
    peer_train_result cres, res;
    peer_trainer cpu, t;
    peer_trainer_init(&cpu);
    assert_int_equal(peer_trainer_init_model(&cpu, &TINY, 0, &e), VL_OK);
    assert_int_equal(peer_trainer_run(&cpu, &task, TEXT, 17, &cres, &e), VL_OK);

    kernels_cuda_set_mem_cap(1024);
    peer_trainer_init(&t);
    assert_int_equal(peer_trainer_init_model(&t, &TINY, 0, &e), VL_OK);
    t.device = PEER_DEVICE_CUDA;
    t.gpu_fallback = 1;
    assert_int_equal(peer_trainer_run(&t, &task, TEXT, 17, &res, &e), VL_OK);
    assert_int_equal(t.device, PEER_DEVICE_CPU);
    assert_null(t.gpu);
    assert_memory_equal(t.delta, cpu.delta, cpu.n_params * sizeof(float));
    assert_true(res.last_loss == cres.last_loss);
    assert_int_equal(t.opt.step, cpu.opt.step);
    peer_trainer_free(&t);

    peer_trainer_init(&t);
    assert_int_equal(peer_trainer_init_model(&t, &TINY, 0, &e), VL_OK);
    t.device = PEER_DEVICE_CUDA;
    t.gpu_fallback = 0;
    vl_error ge = {0};
    assert_true(peer_trainer_run(&t, &task, TEXT, 17, &res, &ge) < 0);
    assert_int_equal(strncmp(ge.msg, "GPU: ", 5), 0);
    assert_non_null(strstr(ge.msg, "cudaErrorMemoryAllocation"));
    assert_int_equal(t.device, PEER_DEVICE_CUDA);
    assert_int_equal(t.opt.step, 0);
    peer_trainer_free(&t);
    kernels_cuda_set_mem_cap(0);
    peer_trainer_free(&cpu);
}

int main(void) {
    test_cuda_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cap_counts_and_refuses),
        cmocka_unit_test(test_model_under_cap),
        cmocka_unit_test(test_trainer_under_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
