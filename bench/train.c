/*
 * bench_train: CPU training-step throughput of the GPT at three sizes, as a
 * fraction of what OpenBLAS sgemm achieves on the same machine, in the same
 * run, at the matrix shapes that model's step uses.
 *
 * Model FLOPs per step (stated so the ratio can be checked):
 *   6 * N_mm * B * T          every matmul weight: 2 FLOPs per weight and
 *                             token forward, 4 backward; N_mm = 12 L C^2
 *                             (qkv, attn proj, fc, mlp proj) + V C (tied head)
 * + 6 * L * B * T^2 * C       causal attention: QK^T and PV cost T^2 C
 *                             forward per sequence and layer each half-masked,
 *                             2 T^2 C in all, backward twice that
 * Biases, LayerNorm, GELU, softmax and the optimiser are not counted.
 *
 * The sgemm baseline times the GEMMs one step performs (forward NN, input
 * gradient NT, weight gradient TN for every linear layer, L times, plus
 * the head) and reports their total FLOPs over their total time.
 *
 * Usage: bench_train [--threads N] [--quick]
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/args.h"
#include "bench/train_flops.h"
#include "common/common.h"
#include "kernels/kernels.h"
#include "model/model.h"

typedef struct bench_cfg {
    const char *label;
    model_gpt_config cfg;
    int B;
} bench_cfg;

static double time_gemms(const gemm_shape *s, int ns, double min_seconds, double *flops_out) {
    size_t maxa = 0, maxb = 0, maxc = 0;
    for (int i = 0; i < ns; i++) {
        size_t a = (size_t)s[i].M * s[i].K, b = (size_t)s[i].K * s[i].N,
               c = (size_t)s[i].M * s[i].N;
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxc = c > maxc ? c : maxc;
    }
    float *A = malloc(maxa * sizeof(float)), *Bm = malloc(maxb * sizeof(float)),
          *Cm = calloc(maxc, sizeof(float));
    if (!A || !Bm || !Cm) {
        fprintf(stderr, "bench_train: out of memory\n");
        exit(1);
    }
    vl_rng r;
    vl_rng_seed(&r, 1);
    for (size_t i = 0; i < maxa; i++) A[i] = vl_rng_uniform(&r) - 0.5f;
    for (size_t i = 0; i < maxb; i++) Bm[i] = vl_rng_uniform(&r) - 0.5f;
    double flops = 0, elapsed = 0;
    /* One untimed round warms caches and the BLAS thread pool. */
    for (int round = 0; round == 0 || elapsed < min_seconds; round++) {
        double t0 = vl_clock_mono_s();
        for (int i = 0; i < ns; i++)
            for (int k = 0; k < s[i].count; k++) {
                int lda = s[i].ta ? s[i].M : s[i].K, ldb = s[i].tb ? s[i].K : s[i].N;
                cblas_sgemm(CblasRowMajor, s[i].ta ? CblasTrans : CblasNoTrans,
                            s[i].tb ? CblasTrans : CblasNoTrans, s[i].M, s[i].N, s[i].K, 1.0f, A,
                            lda, Bm, ldb, 1.0f, Cm, s[i].N);
            }
        double dt = vl_clock_mono_s() - t0;
        if (round == 0) continue;
        elapsed += dt;
        for (int i = 0; i < ns; i++) flops += 2.0 * s[i].M * s[i].N * (double)s[i].K * s[i].count;
    }
    free(A), free(Bm), free(Cm);
    *flops_out = flops;
    return elapsed;
}

static void die(const char *what, const vl_error *err) {
    fprintf(stderr, "bench_train: %s: %s\n", what, err->msg);
    exit(1);
}

int main(int argc, char **argv) {
    int threads, quick;
    int rc = bench_parse_args("bench_train",
                              "usage: bench_train [--threads N] [--quick]\n"
                              "  GPT training-step FLOP/s at three sizes against OpenBLAS sgemm\n"
                              "  at the same shapes. --threads: training threads (default:\n"
                              "  every processor); --quick: shorter timings\n",
                              argc, argv, &threads, &quick);
    if (rc) return vl_opts_status(rc);
    kernels_set_num_threads(threads);
    double min_s = quick ? 0.3 : 3.0;

    bench_cfg cfgs[] = {
        {"default 2x128", {256, 64, 2, 4, 128}, 16},
        {"4x256", {256, 128, 4, 4, 256}, 8},
        {"6x384", {256, 256, 6, 6, 384}, 4},
    };
    int ncfg = (int)(sizeof(cfgs) / sizeof(cfgs[0]));

    printf("bench_train: threads %d, %s\n", threads, openblas_get_config());
    printf("model FLOPs/step = 6*(12*L*C^2 + V*C)*B*T + 6*L*B*T^2*C (causal attention)\n");
    printf("%-14s %9s %3s %4s %9s %9s %11s %11s %6s %6s\n", "model", "params", "B", "T", "step ms",
           "tok/s", "model GF/s", "sgemm GF/s", "ratio", "loss");

    size_t max_bytes = 1 << 16;
    uint8_t *data = malloc(max_bytes);
    if (!data) return 1;
    vl_rng dr;
    vl_rng_seed(&dr, 99);
    for (size_t i = 0; i < max_bytes; i++)
        data[i] = (uint8_t)(' ' + vl_rng_below(&dr, 64)); /* text-like bytes */

    for (int ci = 0; ci < ncfg; ci++) {
        const model_gpt_config *c = &cfgs[ci].cfg;
        int B = cfgs[ci].B, T = c->block_size;
        vl_error err = {0};
        model_gpt *m = NULL;
        if (model_gpt_create(c, &m, &err) != 0) die("create", &err);
        model_gpt_init_weights(m, 1);
        model_adamw opt;
        if (model_adamw_init(&opt, model_gpt_num_params(m), 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                             &err) != 0)
            die("adamw", &err);
        int *in = malloc((size_t)B * T * sizeof(int)), *tg = malloc((size_t)B * T * sizeof(int));
        if (!in || !tg) return 1;
        vl_rng r;
        vl_rng_seed(&r, 7);
        double elapsed = 0;
        int steps = 0;
        float loss = 0;
        /* Step 0 is warm-up (allocation, page faults) and not timed. */
        for (int s = 0; s == 0 || (elapsed < min_s && s < 200) || steps < 3; s++) {
            if (model_data_sample(data, max_bytes, B, T, &r, in, tg, &err) != 0)
                die("sample", &err);
            double t0 = vl_clock_mono_s();
            if (model_gpt_zero_grad(m, &err) != 0 ||
                model_gpt_forward(m, in, tg, B, T, &loss, &err) != 0 ||
                model_gpt_backward(m, &err) != 0 || model_adamw_step(&opt, m, &err) != 0)
                die("step", &err);
            double dt = vl_clock_mono_s() - t0;
            if (s > 0) {
                elapsed += dt;
                steps++;
            }
        }
        double step_s = elapsed / steps;
        double mflops = model_flops(c, B, T) / step_s;
        gemm_shape shapes[16];
        int ns = step_gemms(c, B, shapes);
        double gflops;
        /* The kernels run OpenBLAS single-threaded inside their own OpenMP
         * team; the baseline gets OpenBLAS's own threading. */
        openblas_set_num_threads(threads);
        double gsec = time_gemms(shapes, ns, quick ? 0.2 : 1.5, &gflops);
        double sgemm = gflops / gsec;
        printf("%-14s %8.2fM %3d %4d %9.2f %9.0f %11.1f %11.1f %6.2f %6.3f\n", cfgs[ci].label,
               model_gpt_num_params(m) / 1e6, B, T, step_s * 1e3, B * T / step_s, mflops / 1e9,
               sgemm / 1e9, mflops / sgemm, loss);
        fflush(stdout);
        free(in), free(tg);
        model_adamw_free(&opt);
        model_gpt_free(m);
    }
    free(data);
    return 0;
}
