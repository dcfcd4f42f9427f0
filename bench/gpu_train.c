/*
 * bench_gpu_train: training throughput of the GPT on a CUDA device
 * (model/gpt_cuda.h: forward, backward and AdamW per step) at sizes up to
 * GPT-2 small (124M), as a fraction of what cuBLAS achieves on the same
 * device, in the same run, for the GEMM shapes that model's step performs
 * (bench/train_flops.h states the FLOP count, the same as bench_train's).
 * Each precision mode is measured against the baseline in the same mode.
 *
 * Without a usable device it prints one line saying so and exits 77.
 *
 * Usage: bench_gpu_train [--quick] [--math fp32|tf32|bf16|all] [--gpt2]
 *                        [--batch B]
 *   (default: fp32 and bf16; --gpt2: only GPT-2 small, e.g. under a
 *   profiler; --batch: B sequences a step instead of each model's own)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/train_flops.h"
#include "common/common.h"
#include "common/opts.h"
#include "kernels/cuda_bf16.h"
#include "kernels/cuda_gate.h"
#include "kernels/cuda_model.h"
#include "kernels/kernels.h"
#include "model/gpt_cuda.h"
#include "model/model.h"

typedef struct bench_cfg {
    const char *label;
    model_gpt_config cfg;
    int B;
} bench_cfg;

static void die(const char *what, const vl_error *err) {
    fprintf(stderr, "bench_gpu_train: %s: %s\n", what, err->msg);
    exit(1);
}

/* Fills n device floats with values in [-0.5, 0.5) (from a repeated host
 * block: the values only need to be non-trivial). */
static void fill_device(float *d, size_t n) {
    enum { BLOCK = 1 << 20 };
    float *h = malloc(BLOCK * sizeof(float));
    if (h == NULL) {
        fprintf(stderr, "bench_gpu_train: out of memory\n");
        exit(1);
    }
    vl_rng r;
    vl_rng_seed(&r, 1);
    for (size_t i = 0; i < BLOCK; i++) h[i] = vl_rng_uniform(&r) - 0.5f;
    vl_error err = {0};
    for (size_t off = 0; off < n; off += BLOCK) {
        size_t len = n - off < BLOCK ? n - off : BLOCK;
        if (kernels_cuda_upload(d + off, h, len * sizeof(float), &err) != 0) die("upload", &err);
    }
    free(h);
}

/* Seconds for rounds of every shape's GEMMs (count times each) in ctx's
 * math mode, after one untimed round; *flops_out gets their FLOPs. In
 * bf16 mode the operands are stored as bfloat16, as the model's step
 * stores them, and the output is float32. Rows are padded to 64 values,
 * as the step pads the vocabulary's, so an odd width (50257) measures the
 * product and not a misaligned fallback. */
#define LD(n) (((n) + 63) / 64 * 64)
static double time_gemms(kernels_cuda_ctx *ctx, const gemm_shape *s, int ns, double min_seconds,
                         double *flops_out) {
    size_t maxa = 0, maxb = 0, maxc = 0;
    for (int i = 0; i < ns; i++) {
        size_t a = (size_t)(s[i].ta ? s[i].K : s[i].M) * LD(s[i].ta ? s[i].M : s[i].K),
               b = (size_t)(s[i].tb ? s[i].N : s[i].K) * LD(s[i].tb ? s[i].K : s[i].N),
               c = (size_t)s[i].M * LD(s[i].N);
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxc = c > maxc ? c : maxc;
    }
    vl_error err = {0};
    float *A = NULL, *Bm = NULL, *Cm = NULL;
    if (kernels_cuda_alloc((void **)&A, maxa * sizeof(float), &err) != 0 ||
        kernels_cuda_alloc((void **)&Bm, maxb * sizeof(float), &err) != 0 ||
        kernels_cuda_alloc((void **)&Cm, maxc * sizeof(float), &err) != 0)
        die("GEMM buffers", &err);
    fill_device(A, maxa);
    fill_device(Bm, maxb);
    if (kernels_cuda_zero(Cm, maxc * sizeof(float), &err) != 0) die("zero", &err);
    int half = kernels_cuda_ctx_math(ctx) == KERNELS_CUDA_BF16;
    kernels_bf16 *Ah = NULL, *Bh = NULL;
    if (half && (kernels_cuda_alloc((void **)&Ah, maxa * sizeof(kernels_bf16), &err) != 0 ||
                 kernels_cuda_alloc((void **)&Bh, maxb * sizeof(kernels_bf16), &err) != 0 ||
                 kernels_cuda_to_bf16(Ah, A, maxa, &err) != 0 ||
                 kernels_cuda_to_bf16(Bh, Bm, maxb, &err) != 0))
        die("bf16 GEMM buffers", &err);
    double flops = 0, elapsed = 0;
    for (int round = 0; round == 0 || elapsed < min_seconds; round++) {
        if (kernels_cuda_sync(&err) != 0) die("GEMM", &err);
        double t0 = vl_clock_mono_s();
        for (int i = 0; i < ns; i++)
            for (int k = 0; k < s[i].count; k++) {
                int lda = LD(s[i].ta ? s[i].M : s[i].K), ldb = LD(s[i].tb ? s[i].K : s[i].N);
                int rc =
                    half
                        ? kernels_cuda_gemm_bf16(ctx, s[i].ta, s[i].tb, s[i].M, s[i].N, s[i].K,
                                                 1.0f, Ah, lda, Bh, ldb, 1.0f, Cm, LD(s[i].N), &err)
                        : kernels_cuda_gemm(ctx, s[i].ta, s[i].tb, s[i].M, s[i].N, s[i].K, 1.0f, A,
                                            lda, Bm, ldb, 1.0f, Cm, LD(s[i].N), &err);
                if (rc != 0) die("GEMM", &err);
            }
        if (kernels_cuda_sync(&err) != 0) die("GEMM", &err);
        double dt = vl_clock_mono_s() - t0;
        if (round == 0) continue;
        elapsed += dt;
        for (int i = 0; i < ns; i++) flops += 2.0 * s[i].M * s[i].N * (double)s[i].K * s[i].count;
    }
    kernels_cuda_free(A);
    kernels_cuda_free(Bm);
    kernels_cuda_free(Cm);
    kernels_cuda_free(Ah);
    kernels_cuda_free(Bh);
    *flops_out = flops;
    return elapsed;
}

/* Times training steps of one configuration in one mode and prints a row. */
static void bench_one(const bench_cfg *bc, kernels_cuda_math math, double min_s) {
    const model_gpt_config *c = &bc->cfg;
    int B = bc->B, T = c->block_size;
    size_t bt = (size_t)B * T;
    vl_error err = {0};
    model_gpt *host = NULL;
    if (model_gpt_create(c, &host, &err) != 0) die("create", &err);
    model_gpt_init_weights(host, 1);
    model_gpt_cuda *g = NULL;
    if (model_gpt_cuda_create(host, math, &g, &err) != 0) die("create on the device", &err);
    size_t np = model_gpt_num_params(host);
    model_gpt_free(host);
    int *in = malloc(bt * sizeof(int)), *tg = malloc(bt * sizeof(int));
    if (!in || !tg) {
        fprintf(stderr, "bench_gpu_train: out of memory\n");
        exit(1);
    }
    vl_rng r;
    vl_rng_seed(&r, 7);
    double elapsed = 0;
    int steps = 0;
    float loss = 0;
    /* Step 0 is warm-up (allocation, cuBLAS heuristics) and not timed.
     * Each step waits for the device twice: the loss after the forward
     * pass and the end of AdamW. */
    for (int s = 0; s == 0 || (elapsed < min_s && s < 200) || steps < 3; s++) {
        for (size_t i = 0; i < bt; i++) {
            in[i] = (int)vl_rng_below(&r, (uint32_t)c->vocab_size);
            tg[i] = (int)vl_rng_below(&r, (uint32_t)c->vocab_size);
        }
        double t0 = vl_clock_mono_s();
        if (model_gpt_cuda_zero_grad(g, &err) != 0 ||
            model_gpt_cuda_forward(g, in, tg, B, T, &loss, &err) != 0 ||
            model_gpt_cuda_backward(g, &err) != 0 ||
            model_gpt_cuda_adamw_step(g, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, &err) != 0)
            die("step", &err);
        double dt = vl_clock_mono_s() - t0;
        if (s > 0) {
            elapsed += dt;
            steps++;
        }
    }
    free(in);
    free(tg);
    model_gpt_cuda_free(g);

    double step_s = elapsed / steps;
    double mflops = model_flops(c, B, T) / step_s;
    gemm_shape shapes[16];
    int ns = step_gemms(c, B, shapes);
    kernels_cuda_ctx *ctx = NULL;
    if (kernels_cuda_ctx_create(math, &ctx, &err) != 0) die("context", &err);
    double gflops;
    double gsec = time_gemms(ctx, shapes, ns, min_s / 2, &gflops);
    kernels_cuda_ctx_destroy(ctx);
    double gemm = gflops / gsec;
    printf("%-12s %8.2fM %3d %5d %5s %9.2f %10.0f %11.2f %11.2f %6.2f %6.3f\n", bc->label, np / 1e6,
           B, T, kernels_cuda_math_name(math), step_s * 1e3, bt / step_s, mflops / 1e12,
           gemm / 1e12, mflops / gemm, loss);
    fflush(stdout);
}

/* --math: fp32, tf32, bf16 or all, into the three flags of dst (int[3]). */
static int parse_math(const char *m, void *dst) {
    int *modes = dst, all = strcmp(m, "all") == 0;
    int want[3] = {all || strcmp(m, "fp32") == 0, all || strcmp(m, "tf32") == 0,
                   all || strcmp(m, "bf16") == 0};
    if (!want[0] && !want[1] && !want[2]) return -1;
    memcpy(modes, want, sizeof want);
    return 0;
}

static const char USAGE[] =
    "usage: bench_gpu_train [--quick] [--math fp32|tf32|bf16|all] [--gpt2] [--batch B]\n"
    "  GPT training on a CUDA device against cuBLAS at the step's GEMM shapes.\n"
    "  --math: the precision (default: fp32 and bf16); --gpt2: only GPT-2 small;\n"
    "  --batch: B sequences a step instead of each model's own; --quick: shorter\n"
    "  timings. Without a usable device it exits 77\n";

int main(int argc, char **argv) {
    int quick = 0, gpt2_only = 0, modes[3] = {1, 0, 1}; /* fp32, tf32, bf16 */
    int64_t batch = 0;
    vl_opt t[] = {
        vl_opt_flag("quick", &quick),
        vl_opt_custom("math", parse_math, modes, "fp32, tf32, bf16 or all"),
        vl_opt_flag("gpt2", &gpt2_only),
        vl_opt_int("batch", &batch, 1, 4096),
    };
    vl_opts o = {.prog = "bench_gpu_train", .usage = USAGE, .opt = t, .n = VL_OPTS_COUNT(t)};
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    if (rc) return vl_opts_status(rc);
    /* No GPU is a skip; a GPU that CUDA cannot use is a failure. */
    char desc[256];
    kernels_cuda_gate("bench_gpu_train", desc, sizeof desc);
    double min_s = quick ? 0.5 : 3.0;
    bench_cfg cfgs[] = {
        {"default 2x128", {256, 64, 2, 4, 128}, 16},
        {"6x384", {256, 256, 6, 6, 384}, 16},
        {"12x768", {256, 1024, 12, 12, 768}, 8},
        {"GPT-2 124M", {50257, 1024, 12, 12, 768}, 8},
    };
    int ncfg = (int)(sizeof cfgs / sizeof cfgs[0]);
    for (int ci = 0; ci < ncfg && batch > 0; ci++) cfgs[ci].B = (int)batch;
    printf("bench_gpu_train: %s\n", desc);
    printf("model FLOPs/step = 6*(12*L*C^2 + V*C)*B*T + 6*L*B*T^2*C (causal attention); "
           "baseline: cuBLAS on the step's GEMM shapes in the same mode\n");
    printf("%-12s %9s %3s %5s %5s %9s %10s %11s %11s %6s %6s\n", "model", "params", "B", "T",
           "math", "step ms", "tok/s", "model TF/s", "GEMM TF/s", "ratio", "loss");
    const kernels_cuda_math all_modes[3] = {KERNELS_CUDA_FP32, KERNELS_CUDA_TF32,
                                            KERNELS_CUDA_BF16};
    for (int ci = gpt2_only ? ncfg - 1 : 0; ci < ncfg; ci++)
        for (int mi = 0; mi < 3; mi++)
            if (modes[mi]) bench_one(&cfgs[ci], all_modes[mi], min_s);
    return 0;
}
