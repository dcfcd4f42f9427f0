/*
 * bench_compress: throughput of the compressors on one Gaussian vector (with
 * a few heavy coordinates) of d floats, each as a ratio to memcpy of the
 * same 4*d bytes measured in the same run, so the figures carry across
 * machines. Rows: memcpy, Count Sketch encode at r = 1, 3, 5 rows (c =
 * d / (100 r) columns, so every table holds d/100 cells), sketch estimate +
 * top-k (compress_sketch_heavy on the r = 5 table), exact top-k, a full
 * qsort of (|x|, index) pairs as the baseline top-k must beat, Gaussian-k,
 * and the sparse update codec (encode and decode of d/100 F32 pairs).
 *
 * Throughput is input bytes (4*d) over seconds; for memcpy, bytes copied
 * between two distinct pre-faulted buffers; for the codec, pair bytes
 * (8*nnz). Each figure is the best of --reps runs (default 5), or of
 * as many as fit in a quarter second when that is more. Targets (DESIGN.md):
 * top-k >= 0.2x memcpy and >= 20x the sort, Gaussian-k >= 0.5x with its
 * count within 5 % of k, sketch encode (r = 5) >= 0.3x.
 *
 * Usage: bench_compress [--sizes 1e6,1e7,1e8] [--threads N] [--reps N]
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/opts.h"
#include "compress/compress.h"

#define MAX_SIZES 8
/* A sort estimated to take longer than this (per run) is not run. */
#define SORT_LIMIT_S 30.0
#define MIN_TIME_S 0.25

__attribute__((noreturn)) static void die(const char *what, const vl_error *err) {
    fprintf(stderr, "bench_compress: %s: %s\n", what, err ? err->msg : "out of memory");
    exit(1);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("allocation", NULL);
    /* Touch every page so no run pays for first-touch faults. */
    memset(p, 0, n);
    return p;
}

static void cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *p = strchr(line, ':');
            if (p) {
                p++;
                while (*p == ' ' || *p == '\t') p++;
                snprintf(out, cap, "%s", p);
                out[strcspn(out, "\n")] = '\0';
            }
            break;
        }
    }
    fclose(f);
}

/* ---- the baseline sort ----------------------------------------------------- */

typedef struct mag_idx {
    float mag;
    uint32_t idx;
} mag_idx;

static int by_mag_desc(const void *a, const void *b) {
    const mag_idx *p = a, *q = b;
    if (p->mag != q->mag) return p->mag > q->mag ? -1 : 1;
    return (p->idx > q->idx) - (p->idx < q->idx);
}

static void sort_topk(const float *x, size_t d, mag_idx *pairs) {
    for (size_t i = 0; i < d; i++) {
        pairs[i].mag = fabsf(x[i]);
        pairs[i].idx = (uint32_t)i;
    }
    qsort(pairs, d, sizeof *pairs, by_mag_desc);
}

/* ---- the scatter bound ------------------------------------------------------ */

/* Buckets known in advance, reused cyclically: BOUND_W per row. */
#define BOUND_W ((size_t)1 << 16)

/* The table updates of an r-row encode with no hashing at all: the same
 * loads and stores per (row, coordinate) as compress_sketch_encode's inner
 * loop (bucket, value, cell, cell back), buckets read from a precomputed
 * window that stays in cache. No hash can make encode faster than this,
 * so it says what the machine allows. */
static void scatter_range(float *tab, uint32_t rows, uint32_t cols, const uint32_t *bk,
                          const float *x, size_t lo, size_t hi) {
    for (size_t c0 = lo; c0 < hi; c0 += 4096) {
        size_t c1 = hi - c0 < 4096 ? hi : c0 + 4096;
        for (uint32_t j = 0; j < rows; j++) {
            float *row = tab + (size_t)j * cols;
            const uint32_t *b = bk + (size_t)j * BOUND_W;
            for (size_t i = c0; i < c1; i++) row[b[i & (BOUND_W - 1)]] += x[i];
        }
    }
}

/* Same threading as compress_sketch_encode: private tables, summed. */
static void scatter_bound(float *tabs, uint32_t rows, uint32_t cols, const uint32_t *bk,
                          const float *x, size_t d) {
    size_t cells = (size_t)rows * cols;
#pragma omp parallel
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        size_t per = (d + (size_t)n - 1) / (size_t)n;
        size_t lo = per * (size_t)t < d ? per * (size_t)t : d;
        size_t hi = lo + per < d ? lo + per : d;
        float *tab = tabs + (size_t)t * cells;
        memset(tab, 0, cells * sizeof *tab);
        scatter_range(tab, rows, cols, bk, x, lo, hi);
#pragma omp barrier
#pragma omp for schedule(static)
        for (size_t c = 0; c < cells; c++) {
            float a = 0.0f;
            for (int u = 1; u < n; u++) a += tabs[(size_t)u * cells + c];
            tabs[c] += a;
        }
    }
}

/* ---- one size ---------------------------------------------------------------- */

typedef struct row {
    char name[48];
    double gbs;    /* GB/s, < 0 when skipped */
    double target; /* ratio to memcpy to reach, 0 for none */
    char note[96];
} row;

typedef struct table {
    row rows[16];
    int n;
} table;

static row *add_row(table *t, const char *name, double bytes, double secs, double target) {
    row *r = &t->rows[t->n++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->gbs = secs > 0 ? bytes / secs / 1e9 : -1;
    r->target = target;
    r->note[0] = '\0';
    return r;
}

static const char *fmt_d(size_t d, char *text, size_t cap) {
    double e = floor(log10((double)d));
    double m = (double)d / pow(10, e);
    if (fabs(m - round(m)) < 1e-9)
        snprintf(text, cap, "%.0fe%.0f", round(m), e);
    else
        snprintf(text, cap, "%zu", d);
    return text;
}

static void run_size(size_t d, int reps, int header) {
    vl_error err = {0};
    size_t k = d / 1000 ? d / 1000 : 1, k100 = d / 100 ? d / 100 : 1;
    double bytes = 4.0 * (double)d;
    float *x = xmalloc(d * sizeof *x), *dst = xmalloc(d * sizeof *dst),
          *scratch = xmalloc(d * sizeof *scratch);
    uint32_t *idx = xmalloc(COMPRESS_GAUSSK_CAP(k100) * sizeof *idx);
    float *val = xmalloc(COMPRESS_GAUSSK_CAP(k100) * sizeof *val);
    vl_rng r;
    vl_rng_seed(&r, 20240607);
    for (size_t i = 0; i < d; i++) x[i] = vl_rng_normal(&r);
    /* A few coordinates far out, as a real update has. */
    for (int h = 0; h < 64; h++)
        x[vl_rng_below(&r, (uint32_t)d)] =
            (vl_rng_uniform(&r) < 0.5f ? -1.0f : 1.0f) * (20.0f + 30.0f * vl_rng_uniform(&r));

    table t = {.n = 0};
    double best, t0;

    /* Best of at least reps runs, more for fast operations (up to a
     * quarter second of runs), so a brief stall on a shared machine does
     * not decide a figure. */
#define TIME(...)                                                                               \
    do {                                                                                        \
        best = INFINITY;                                                                        \
        double start_ = vl_clock_mono_s();                                                      \
        for (int rep_ = 0;                                                                      \
             rep_ < reps || (vl_clock_mono_s() - start_ < MIN_TIME_S && rep_ < 1000); rep_++) { \
            t0 = vl_clock_mono_s();                                                             \
            __VA_ARGS__;                                                                        \
            double s_ = vl_clock_mono_s() - t0;                                                 \
            best = s_ < best ? s_ : best;                                                       \
        }                                                                                       \
    } while (0)

    TIME(memcpy(dst, x, d * sizeof *x));
    double memcpy_gbs = bytes / best / 1e9;
    add_row(&t, "memcpy", bytes, best, 0);

    compress_sketch sk[3];
    static const uint32_t rows_of[3] = {1, 3, 5};
    for (int s = 0; s < 3; s++) {
        uint32_t cols = (uint32_t)(d / (100 * rows_of[s]));
        if (compress_sketch_init(&sk[s], rows_of[s], cols ? cols : 1, 42, &err))
            die("sketch init", &err);
        /* Zeroing sits inside the timing: an encode into a fresh table is
         * the peer's whole job. */
        TIME(compress_sketch_zero(&sk[s]); compress_sketch_encode(&sk[s], x, d));
        char name[48];
        snprintf(name, sizeof name, "sketch encode r=%u", rows_of[s]);
        row *rw = add_row(&t, name, bytes, best, s == 2 ? 0.3 : 0);
        snprintf(rw->note, sizeof rw->note, "%u x %u table", rows_of[s], sk[s].cols);
    }

    {
        uint32_t rows = 5, cols = sk[2].cols;
        uint32_t *bk = xmalloc((size_t)rows * BOUND_W * sizeof *bk);
        float *tabs = xmalloc((size_t)omp_get_max_threads() * rows * cols * sizeof *tabs);
        for (uint32_t j = 0; j < rows; j++)
            for (size_t i = 0; i < BOUND_W; i++)
                bk[(size_t)j * BOUND_W + i] = vl_rng_below(&r, cols);
        TIME(scatter_bound(tabs, rows, cols, bk, x, d));
        row *rb = add_row(&t, "table updates alone r=5", bytes, best, 0);
        snprintf(rb->note, sizeof rb->note, "table updates alone, buckets precomputed");
        free(bk);
        free(tabs);
    }

    size_t nnz = 0;
    TIME(if (compress_sketch_heavy(&sk[2], d, k, scratch, idx, val, &nnz, &err))
             die("sketch heavy", &err));
    row *rw = add_row(&t, "sketch estimate + top-k", bytes, best, 0);
    snprintf(rw->note, sizeof rw->note, "r=5, k=%zu", k);
    for (int s = 0; s < 3; s++) compress_sketch_free(&sk[s]);

    TIME(if (compress_topk(x, d, k, idx, &nnz, &err)) die("topk", &err));
    double topk_s = best;
    rw = add_row(&t, "exact top-k", bytes, best, 0.2);
    snprintf(rw->note, sizeof rw->note, "k=%zu", k);

    /* The sort is estimated from a prefix first: at 1e8 it can run for
     * minutes on a slow machine. */
    mag_idx *pairs = malloc(d * sizeof *pairs);
    double sort_s = -1;
    if (pairs) {
        memset(pairs, 0, d * sizeof *pairs);
        size_t probe = d < 1000000 ? d : 1000000;
        t0 = vl_clock_mono_s();
        sort_topk(x, probe, pairs);
        double ps = vl_clock_mono_s() - t0;
        double est = ps * ((double)d / (double)probe) * (log((double)d) / log((double)probe));
        if (est <= SORT_LIMIT_S) {
            int sreps = est * reps > SORT_LIMIT_S ? 1 : reps;
            best = INFINITY;
            for (int rep = 0; rep < sreps; rep++) {
                t0 = vl_clock_mono_s();
                sort_topk(x, d, pairs);
                double s = vl_clock_mono_s() - t0;
                best = s < best ? s : best;
            }
            sort_s = best;
            rw = add_row(&t, "full sort (qsort)", bytes, sort_s, 0);
            snprintf(rw->note, sizeof rw->note, "(|x|, index) pairs%s",
                     sreps < reps ? ", 1 run" : "");
        } else {
            rw = add_row(&t, "full sort (qsort)", bytes, -1, 0);
            snprintf(rw->note, sizeof rw->note, "skipped (estimated %.0f s)", est);
        }
        free(pairs);
    } else {
        rw = add_row(&t, "full sort (qsort)", bytes, -1, 0);
        snprintf(rw->note, sizeof rw->note, "skipped (no memory)");
    }

    size_t gnnz = 0;
    double thr = 0;
    TIME(if (compress_gaussk(x, d, k, idx, &gnnz, &thr, &err)) die("gaussk", &err));
    rw = add_row(&t, "Gaussian-k", bytes, best, 0.5);
    double dev = 100.0 * ((double)gnnz - (double)k) / (double)k;
    snprintf(rw->note, sizeof rw->note, "k=%zu: count %zu (%+.2f %%%s), thr %.4g", k, gnnz, dev,
             fabs(dev) <= 5.0 ? "" : ", OUT OF BAND", thr);

    if (compress_topk(x, d, k100, idx, &nnz, &err)) die("topk", &err);
    for (size_t j = 0; j < nnz; j++) val[j] = x[idx[j]];
    compress_update_meta meta;
    memset(&meta, 0, sizeof meta);
    snprintf(meta.run, sizeof meta.run, "bench");
    meta.kind = COMPRESS_TOPK;
    meta.task = 1;
    meta.peer = 1;
    meta.num_samples = 1;
    meta.local_steps = 1;
    meta.loss = 1.0;
    vl_buf out;
    vl_buf_init(&out, (size_t)1 << 40);
    if (vl_buf_reserve(&out, 8 * nnz + 4096)) die("codec buffer", NULL);
    TIME(vl_buf_reset(&out); if (compress_update_encode_topk(&meta, idx, val, nnz, ST_F32, &out,
                                                             &err)) die("encode", &err));
    double pair_bytes = 8.0 * (double)nnz;
    rw = add_row(&t, "sparse codec encode", pair_bytes, best, 0);
    snprintf(rw->note, sizeof rw->note, "%zu F32 pairs, GB/s of pair bytes", nnz);
    TIME({
        compress_update u;
        const char *code = NULL;
        if (compress_update_decode(out.data, out.len, d, &u, &code, &err)) die("decode", &err);
        compress_update_free(&u);
    });
    rw = add_row(&t, "sparse codec decode", pair_bytes, best, 0);
    snprintf(rw->note, sizeof rw->note, "%zu F32 pairs, GB/s of pair bytes", nnz);
    vl_buf_free(&out);
#undef TIME

    char ds[32];
    fmt_d(d, ds, sizeof ds);
    if (header) {
        printf("| d | operation | GB/s | x memcpy | target | result | notes |\n");
        printf("|---|---|---:|---:|---|---|---|\n");
    }
    for (int i = 0; i < t.n; i++) {
        const row *q = &t.rows[i];
        char g[32] = "-", ratio[32] = "-", tgt[32] = "", res[16] = "";
        if (q->gbs >= 0) {
            snprintf(g, sizeof g, "%.2f", q->gbs);
            snprintf(ratio, sizeof ratio, "%.2f", q->gbs / memcpy_gbs);
        }
        if (q->target > 0) {
            snprintf(tgt, sizeof tgt, ">= %.1fx", q->target);
            snprintf(res, sizeof res, "%s",
                     q->gbs >= 0 && q->gbs / memcpy_gbs >= q->target ? "PASS" : "MISS");
            if (strcmp(q->name, "Gaussian-k") == 0 && fabs(dev) > 5.0)
                snprintf(res, sizeof res, "MISS");
        }
        printf("| %s | %s | %s | %s | %s | %s | %s |\n", ds, q->name, g, ratio, tgt, res, q->note);
    }
    if (sort_s > 0) {
        double sp = sort_s / topk_s;
        printf("| %s | top-k speed-up over sort | %.0fx | - | >= 20x | %s | %.3f s vs %.4f s |\n",
               ds, sp, sp >= 20 ? "PASS" : "MISS", sort_s, topk_s);
    } else {
        printf("| %s | top-k speed-up over sort | - | - | >= 20x | - | sort skipped |\n", ds);
    }
    fflush(stdout);
    free(x);
    free(dst);
    free(scratch);
    free(idx);
    free(val);
}

/* The sizes to run, for --sizes "1e6,1e7,1e8". */
typedef struct size_list {
    size_t d[MAX_SIZES];
    int n;
} size_list;

/* --sizes: up to MAX_SIZES comma-separated counts from 1 to 4e9, into a
 * size_list (dst), which keeps its defaults when the list is refused. */
static int parse_sizes(const char *s, void *dst) {
    size_list got = {.n = 0};
    char tmp[256];
    if (strlen(s) >= sizeof tmp) return -1;
    snprintf(tmp, sizeof tmp, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t v;
        if (got.n >= MAX_SIZES || vl_opts_parse_size(tok, 1, 4000000000LL, &v) != VL_OK) return -1;
        got.d[got.n++] = (size_t)v;
    }
    if (got.n == 0) return -1;
    *(size_list *)dst = got;
    return 0;
}

static const char USAGE[] =
    "usage: bench_compress [--sizes 1e6,1e7,1e8] [--threads N] [--reps N]\n"
    "  the compressors' throughput as ratios to memcpy of the same vector.\n"
    "  --sizes: vector lengths, up to " VL_STR(
        MAX_SIZES) " (default 1e6,1e7,1e8); --threads:\n"
                   "  OpenMP threads (default: OpenMP's); --reps: runs per figure, the best\n"
                   "  kept (default 5)\n";

int main(int argc, char **argv) {
    size_list sizes = {{1000000, 10000000, 100000000}, 3};
    int64_t reps = 5, threads = 0;
    vl_opt t[] = {
        vl_opt_custom(
            "sizes", parse_sizes, &sizes,
            "a comma-separated list of up to " VL_STR(MAX_SIZES) " whole sizes from 1 to 4e9"),
        vl_opt_int("threads", &threads, 1, 1024),
        vl_opt_int("reps", &reps, 1, 1000),
    };
    vl_opts o = {.prog = "bench_compress", .usage = USAGE, .opt = t, .n = VL_OPTS_COUNT(t)};
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    if (rc) return vl_opts_status(rc);
    if (threads > 0) omp_set_num_threads((int)threads);
    char cpu[160];
    cpu_model(cpu, sizeof cpu);
    printf("bench_compress: %s, %d threads, best of %d runs\n", cpu, omp_get_max_threads(),
           (int)reps);
    printf("GB/s = 4*d input bytes / s (memcpy: bytes copied; codec: 8 bytes per pair); "
           "x memcpy = ratio to the memcpy row of the same d.\n\n");
    for (int i = 0; i < sizes.n; i++) run_size(sizes.d[i], (int)reps, i == 0);
    return 0;
}
