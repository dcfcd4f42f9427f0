/*
 * bench_gpu_compress: the CUDA compressors on one Gaussian vector of d floats
 * (default 124,439,808, GPT-2 small's parameter count) already on the
 * device, each as a ratio to a device-to-device cudaMemcpy of the same 4*d
 * bytes measured in the same run. Throughput is input bytes (4*d) over
 * seconds, for the copy too, so a kernel that reads the vector once and
 * writes little can exceed 1x. Rows: the copy, Count Sketch encode at r = 5
 * with a table of d/100 cells (100x) and of 5 x 8192 cells (the windowed
 * hash's runs of cells added with coalesced reductions), exact top-k at
 * k = d/1000 and d/100, Gaussian-k at k = d/100 (with its count), and a
 * sparse scatter-add of the Gaussian-k selection. Each call includes the
 * synchronisation at its end, as a caller sees it. Scratch comes from the
 * compressors' cached workspace: the first call of a row allocates it (a
 * "cold" figure, that call alone, is printed in the note), the rest reuse
 * it. Each figure is the best of --reps runs (default 5).
 * The design's target for the sketch: >= 0.3x copy bandwidth.
 *
 * Without a CUDA device it prints one line saying so and exits 77.
 *
 * Usage: bench_gpu_compress [--d N] [--reps N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

/* Declares common/ and compress/ too, as C (they have no extern "C" of
 * their own). */
#include "kernels/cuda_compress.h"
#include "common/opts.h"
#include "kernels/cuda_gate.h"
#include "kernels/kernels.h"

static void die(const char *what, const vl_error *err) {
    fprintf(stderr, "bench_gpu_compress: %s: %s\n", what, err ? err->msg : "failed");
    exit(1);
}

static void cuda_check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_gpu_compress: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* Seconds of the best of reps runs of body, timed with events around it. */
#define BEST_OF(reps, secs, body)                                                   \
    do {                                                                            \
        cudaEvent_t a_, b_;                                                         \
        cuda_check(cudaEventCreate(&a_), "cudaEventCreate");                        \
        cuda_check(cudaEventCreate(&b_), "cudaEventCreate");                        \
        (secs) = 1e30;                                                              \
        for (int r_ = 0; r_ < (reps); r_++) {                                       \
            cuda_check(cudaEventRecord(a_, 0), "cudaEventRecord");                  \
            body;                                                                   \
            cuda_check(cudaEventRecord(b_, 0), "cudaEventRecord");                  \
            cuda_check(cudaEventSynchronize(b_), "cudaEventSynchronize");           \
            float ms_ = 0;                                                          \
            cuda_check(cudaEventElapsedTime(&ms_, a_, b_), "cudaEventElapsedTime"); \
            if (ms_ / 1e3 < (secs)) (secs) = ms_ / 1e3;                             \
        }                                                                           \
        cudaEventDestroy(a_);                                                       \
        cudaEventDestroy(b_);                                                       \
    } while (0)

static void row(const char *name, double secs, double bytes, double copy_secs, const char *note) {
    double gbs = bytes / secs / 1e9, ratio = copy_secs / secs;
    printf("%-28s %9.3f ms %9.1f GB/s %7.3fx copy  %s\n", name, secs * 1e3, gbs, ratio, note);
}

static const char USAGE[] =
    "usage: bench_gpu_compress [--d N] [--reps N]\n"
    "  the CUDA compressors on d floats against a device-to-device copy.\n"
    "  --d: the vector's length, 1000 to 4e9 (default 124439808, GPT-2 small);\n"
    "  --reps: runs per figure, the best kept (default 5). Without a usable\n"
    "  device it exits 77\n";

int main(int argc, char **argv) {
    int64_t d64 = 124439808, reps64 = 5;
    vl_opt t[] = {vl_opt_size("d", &d64, 1000, 4000000000LL), vl_opt_int("reps", &reps64, 1, 1000)};
    vl_opts o;
    memset(&o, 0, sizeof o);
    o.prog = "bench_gpu_compress";
    o.usage = USAGE;
    o.opt = t;
    o.n = VL_OPTS_COUNT(t);
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    if (rc) return vl_opts_status(rc);
    /* No GPU is a skip; a GPU that CUDA cannot use is a failure. */
    char desc[256];
    kernels_cuda_gate("bench_gpu_compress", desc, sizeof desc);
    size_t d = (size_t)d64;
    int reps = (int)reps64;
    double bytes = 4.0 * (double)d;
    printf("bench_gpu_compress: d = %zu, best of %d, %s\n", d, reps, desc);

    float *x = (float *)malloc(d * sizeof(float));
    if (!x) die("host allocation", NULL);
    vl_rng r;
    vl_rng_seed(&r, 7);
    for (size_t i = 0; i < d; i++) x[i] = vl_rng_normal(&r);
    float *d_x = NULL, *d_y = NULL, *d_tab = NULL, *d_val = NULL;
    uint32_t *d_idx = NULL;
    size_t kmax = COMPRESS_GAUSSK_CAP(d / 100);
    cuda_check(cudaMalloc((void **)&d_x, d * sizeof(float)), "cudaMalloc");
    cuda_check(cudaMalloc((void **)&d_y, d * sizeof(float)), "cudaMalloc");
    cuda_check(cudaMalloc((void **)&d_idx, kmax * sizeof(uint32_t)), "cudaMalloc");
    cuda_check(cudaMalloc((void **)&d_val, kmax * sizeof(float)), "cudaMalloc");
    cuda_check(cudaMemcpy(d_x, x, d * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    free(x);

    double copy_s;
    BEST_OF(reps, copy_s,
            cuda_check(cudaMemcpy(d_y, d_x, d * sizeof(float), cudaMemcpyDeviceToDevice),
                       "cudaMemcpy"));
    row("cudaMemcpy D2D", copy_s, bytes, copy_s, "baseline");

    vl_error err;
    memset(&err, 0, sizeof err);
    char note[128];
    const uint32_t rows = 5;
    uint32_t cols_of[2] = {(uint32_t)(d / 100 / rows), 8192};
    for (int s = 0; s < 2; s++) {
        uint32_t cols = cols_of[s] ? cols_of[s] : 1;
        size_t cells = (size_t)rows * cols;
        cuda_check(cudaMalloc((void **)&d_tab, cells * sizeof(float)), "cudaMalloc");
        cuda_check(cudaMemset(d_tab, 0, cells * sizeof(float)), "cudaMemset");
        double t;
        BEST_OF(reps, t,
                if (kernels_cuda_sketch_encode(d_tab, rows, cols, 42, d_x, d, &err))
                    die("sketch encode", &err));
        snprintf(note, sizeof note, "%u x %u table (target >= 0.3x)", rows, cols);
        row(s == 0 ? "sketch encode r=5 (100x)" : "sketch encode r=5 (5 x 8192)", t, bytes, copy_s,
            note);
        cudaFree(d_tab);
    }

    size_t ks[2] = {d / 1000, d / 100};
    for (int s = 0; s < 2; s++) {
        size_t nnz = 0;
        double t, cold;
        kernels_cuda_compress_release();
        BEST_OF(1, cold,
                if (kernels_cuda_topk(d_x, d, ks[s], d_idx, &nnz, &err)) die("topk", &err));
        BEST_OF(reps, t,
                if (kernels_cuda_topk(d_x, d, ks[s], d_idx, &nnz, &err)) die("topk", &err));
        snprintf(note, sizeof note, "k = %zu, cold %.3f ms (target >= 0.6x)", ks[s], cold * 1e3);
        row(s == 0 ? "exact top-k, k = d/1000" : "exact top-k, k = d/100", t, bytes, copy_s, note);
    }

    {
        size_t k = d / 100, nnz = 0;
        double t, thr = 0;
        BEST_OF(reps, t,
                if (kernels_cuda_gaussk(d_x, d, k, d_idx, &nnz, &thr, &err)) die("gaussk", &err));
        double off = 100.0 * ((double)nnz - (double)k) / (double)k;
        snprintf(note, sizeof note, "k = %zu, count %zu (%+.2f %% of k), thr %.4g", k, nnz, off,
                 thr);
        row("gaussian-k, k = d/100", t, bytes, copy_s, note);
    }
    {
        /* What a coordinator does per sparse update: k = d/100 values added
         * at ascending indices (the Gaussian-k selection's, just made). */
        size_t k = d / 100, nnz = 0;
        double thr = 0, t;
        if (kernels_cuda_gaussk(d_x, d, k, d_idx, &nnz, &thr, &err) ||
            kernels_cuda_sparse_gather(d_x, d, d_idx, nnz, d_val, &err))
            die("scatter-add setup", &err);
        BEST_OF(reps, t,
                if (kernels_cuda_sparse_scatter_add(d_y, d, d_idx, d_val, nnz, 1.0f, &err))
                    die("scatter-add", &err));
        snprintf(note, sizeof note, "%zu values (bytes: the %zu moved)", nnz,
                 nnz * (sizeof(float) * 3 + sizeof(uint32_t)));
        row("sparse scatter-add, d/100", t, (double)nnz * (sizeof(float) * 3 + sizeof(uint32_t)),
            copy_s, note);
    }
    kernels_cuda_compress_release();
    cudaFree(d_x);
    cudaFree(d_y);
    cudaFree(d_idx);
    cudaFree(d_val);
    return 0;
}
