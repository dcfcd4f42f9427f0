/*
 * bench_kfac: how many steps, and how much training wall time, the MLP
 * classifier needs to reach a target evaluation loss with K-FAC-
 * preconditioned SGD, against AdamW measured in the same run from the same
 * initial weights on the same batch sequence; then the same for the
 * default byte GPT (kfac_gpt.c).
 *
 * Task: model_fed_synth data (several modes per class, so the boundary is
 * nonlinear), peer 0's near-IID stream (alpha 100) as training data, fresh
 * samples every step (batch s is samples [sB, sB+B)), so the comparison is
 * of optimisation speed with no overfitting; a fixed slice of the held-out
 * validation stream is the evaluation set, evaluated every EVAL_EVERY
 * steps. The target is the evaluation loss the best AdamW learning rate
 * reaches after target_at steps (so AdamW reaches it in at most target_at
 * steps by construction; the question is how long K-FAC needs).
 *
 * Both optimisers run the model's own forward/backward (model_mlp_forward
 * and model_mlp_backward); K-FAC reads every layer's input X and output
 * gradient dY through model_mlp_layer_io, and for the sampled Fisher has
 * them recomputed with model_mlp_output_grads. Timing AdamW on the same
 * pass keeps the wall-time ratio about the optimiser alone.
 * Timing covers the training step only (pass, factors, inversions,
 * preconditioning, update); evaluation is excluded for both. Losses,
 * accuracies and step counts are deterministic for a given thread count
 * (checked: the best configurations are rerun and must match bitwise);
 * wall times are the median of those reruns.
 *
 * Usage: bench_kfac [--threads N] [--quick]
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h> /* openblas_get_config, for the header line */

#include "bench/args.h"
#include "bench/kfac.h"
#include "common/common.h"
#include "kernels/kernels.h"
#include "model/model.h"

#define MAXL (MODEL_MLP_MAX_HIDDEN + 1)
#define EVAL_EVERY 10
#define INVERT_EVERY 10
#define RHO 0.95f
#define INIT_SEED 11
#define FISHER_SEED 23
#define MAX_REPEATS 5
#define MAX_CFGS 64 /* the full sweep has 52 */

static void die(const char *what, const vl_error *err) {
    fprintf(stderr, "bench_kfac: %s: %s\n", what, err ? err->msg : "failed");
    exit(1);
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "bench_kfac: out of memory (%zu x %zu bytes)\n", n, size);
        exit(1);
    }
    return p;
}

/* ---- problem and configurations -------------------------------------------- */

typedef struct problem {
    model_fed_synth_config data;
    model_mlp_config net;
    int B, budget, target_at, n_eval, repeats;
    float *xtr; /* [budget*B, D] */
    int *ytr;
    float *xev; /* [n_eval, D] */
    int *yev;
} problem;

enum { OPT_ADAMW, OPT_KFAC };

/* Where a step's time goes, to tell the pass from the optimiser's own cost. */
enum { PART_PASS, PART_FACTORS, PART_INVERT, PART_PRECOND, PART_UPDATE, N_PARTS };
static const char *const part_name[N_PARTS] = {"forward/backward", "factor updates", "inversions",
                                               "precondition + KL clip", "update"};

typedef struct run_cfg {
    int opt;
    float lr;
    float damping, kl_clip, momentum; /* K-FAC only */
    int true_fisher;                  /* K-FAC: 1 model-sampled labels, 0 training labels */
} run_cfg;

typedef struct result {
    int npts;     /* eval points recorded (budget / EVAL_EVERY unless stopped) */
    double *loss; /* eval loss after (k+1)*EVAL_EVERY steps */
    double *acc;
    double *wall;         /* training seconds up to that point */
    char note[96];        /* why a run stopped early; empty when it ran the budget */
    double part[N_PARTS]; /* training seconds by part of the step */
} result;

static void cfg_label(const run_cfg *c, char *out, size_t n) {
    if (c->opt == OPT_ADAMW)
        snprintf(out, n, "lr %g, betas 0.9/0.999, eps 1e-8, wd 0", (double)c->lr);
    else
        snprintf(out, n, "%s Fisher, damping %g, lr %g, momentum %g, KL clip %g",
                 c->true_fisher ? "sampled" : "empirical", (double)c->damping, (double)c->lr,
                 (double)c->momentum, (double)c->kl_clip);
}

/* ---- the shared forward/backward ---------------------------------------------- */

typedef struct work {
    model_mlp *m;
    const model_tensor *t;
    int L, w[MAXL + 1];
    size_t np;
    int *yhat;
    float *nat, *adam_m, *adam_v;
    model_kfac_layer *kf[MAXL];
    model_sgd sgd;
    vl_rng fisher_rng;
} work;

static void work_init(work *wk, const problem *pb) {
    vl_error err = {0};
    memset(wk, 0, sizeof *wk);
    if (model_mlp_create(&pb->net, &wk->m, &err) != 0) die("mlp create", &err);
    model_mlp_init_weights(wk->m, INIT_SEED);
    wk->L = pb->net.n_hidden + 1;
    if (model_mlp_tensors(wk->m, &wk->t) != 2 * wk->L) die("mlp tensors: unexpected count", NULL);
    wk->np = model_mlp_num_params(wk->m);
    wk->w[0] = pb->net.in_dim;
    for (int l = 0; l < pb->net.n_hidden; l++) wk->w[l + 1] = pb->net.hidden[l];
    wk->w[wk->L] = pb->net.n_classes;
    size_t B = (size_t)pb->B;
    wk->yhat = xcalloc(B, sizeof(int));
    wk->nat = xcalloc(wk->np, sizeof(float));
    wk->adam_m = xcalloc(wk->np, sizeof(float));
    wk->adam_v = xcalloc(wk->np, sizeof(float));
    vl_rng_seed(&wk->fisher_rng, FISHER_SEED);
}

static void work_free(work *wk) {
    for (int l = 0; l < wk->L; l++) model_kfac_layer_free(wk->kf[l]);
    free(wk->yhat), free(wk->nat), free(wk->adam_m), free(wk->adam_v);
    model_sgd_free(&wk->sgd);
    model_mlp_free(wk->m);
    memset(wk, 0, sizeof *wk);
}

/* Labels drawn from the model's own predictive distribution: with them the
 * per-example gradients give the true Fisher, which K-FAC approximates,
 * rather than the empirical Fisher of the training labels. */
static void sample_labels(work *wk, int B, int C) {
    const float *probs = model_mlp_probs(wk->m);
    for (int i = 0; i < B; i++) {
        float u = vl_rng_uniform(&wk->fisher_rng), acc = 0.0f;
        wk->yhat[i] = C - 1; /* rounding can leave the cumulative sum below u */
        for (int k = 0; k < C; k++) {
            acc += probs[i * C + k];
            if (u < acc) {
                wk->yhat[i] = k;
                break;
            }
        }
    }
}

/* Forward and backward over one batch through the model itself: its
 * gradient vector gets the mean-loss gradient (overwritten), and every
 * layer's output gradient is left for model_mlp_layer_io, for the training
 * labels or, with sampled set, for labels drawn from the model. */
static void pass(work *wk, const float *x, const int *y, int B, int sampled) {
    vl_error err = {0};
    float loss = 0.0f;
    model_mlp_zero_grad(wk->m);
    if (model_mlp_forward(wk->m, x, y, B, &loss, &err) != 0 || model_mlp_backward(wk->m, &err) != 0)
        die("mlp pass", &err);
    if (!sampled) return;
    sample_labels(wk, B, wk->w[wk->L]);
    if (model_mlp_output_grads(wk->m, wk->yhat, &err) != 0) die("mlp output gradients", &err);
}

/* ---- one training run ------------------------------------------------------------ */

static int kfac_step(work *wk, const run_cfg *c, long step, const float *x, int B, char *note,
                     size_t note_len, double *part) {
    vl_error err = {0};
    double t0 = vl_clock_mono_s(), t1;
    float *P = model_mlp_params(wk->m), *G = model_mlp_grads(wk->m);
    for (int l = 0; l < wk->L; l++) {
        const float *X, *dY;
        int nb = 0;
        if (model_mlp_layer_io(wk->m, l, &X, &dY, &nb, &err) != 0) die("mlp layer io", &err);
        if (model_kfac_update_factors(wk->kf[l], X, dY, nb, RHO, &err) != 0) {
            snprintf(note, note_len, "factor update failed at step %ld", step + 1);
            return -1;
        }
    }
    t1 = vl_clock_mono_s();
    part[PART_FACTORS] += t1 - t0, t0 = t1;
    /* A refused inversion ends the run: that damping is not usable. */
    for (int l = 0; l < wk->L && step % INVERT_EVERY == 0; l++)
        if (model_kfac_invert(wk->kf[l], c->damping, &err) != 0) {
            snprintf(note, note_len, "inversion refused at step %ld", step + 1);
            return -1;
        }
    t1 = vl_clock_mono_s();
    part[PART_INVERT] += t1 - t0, t0 = t1;
    for (int l = 0; l < wk->L; l++) {
        const model_tensor *tw = &wk->t[2 * l], *tb = &wk->t[2 * l + 1];
        if (model_kfac_precondition(wk->kf[l], G + tw->offset, G + tb->offset, wk->nat + tw->offset,
                                    wk->nat + tb->offset, &err) != 0)
            die("kfac precondition", &err);
    }
    /* The tensors tile the flat vector, so one span covers every layer. */
    const float *gs[] = {G}, *ns[] = {wk->nat};
    float nu = model_kfac_kl_scale(gs, ns, &wk->np, 1, c->lr, c->kl_clip);
    if (nu == 0.0f) {
        snprintf(note, note_len, "non-finite step at step %ld", step + 1);
        return -1;
    }
    t1 = vl_clock_mono_s();
    part[PART_PRECOND] += t1 - t0, t0 = t1;
    for (size_t i = 0; i < wk->np; i++) wk->nat[i] *= nu;
    if (model_sgd_step(&wk->sgd, P, wk->nat, wk->np, 0, &err) != 0) die("sgd step", &err);
    part[PART_UPDATE] += vl_clock_mono_s() - t0;
    return 0;
}

static void run_one(const problem *pb, const run_cfg *c, result *res) {
    work wk;
    work_init(&wk, pb);
    vl_error err = {0};
    int D = pb->net.in_dim, B = pb->B, npts_max = pb->budget / EVAL_EVERY;
    if (!res->loss) {
        res->loss = xcalloc((size_t)npts_max, sizeof(double));
        res->acc = xcalloc((size_t)npts_max, sizeof(double));
        res->wall = xcalloc((size_t)npts_max, sizeof(double));
    }
    res->npts = 0;
    res->note[0] = '\0';
    memset(res->part, 0, sizeof res->part);
    if (c->opt == OPT_KFAC) {
        for (int l = 0; l < wk.L; l++)
            if (model_kfac_layer_create(wk.w[l], wk.w[l + 1], &wk.kf[l], &err) != 0)
                die("kfac layer", &err);
        if (model_sgd_init(&wk.sgd, wk.np, c->lr, c->momentum, 0.0f, 0, &err) != 0)
            die("sgd init", &err);
    }
    /* Divergence guard: far above the ln C a uniform predictor scores. */
    double blowup = 10.0 * log((double)pb->net.n_classes);
    double train_s = 0.0;
    for (long s = 0; s < pb->budget; s++) {
        const float *x = pb->xtr + (size_t)s * B * D;
        const int *y = pb->ytr + (size_t)s * B;
        double t0 = vl_clock_mono_s();
        pass(&wk, x, y, B, c->opt == OPT_KFAC && c->true_fisher);
        double t1 = vl_clock_mono_s();
        res->part[PART_PASS] += t1 - t0;
        if (c->opt == OPT_ADAMW) {
            kernels_adamw_hparams hp = {c->lr, 0.9f, 0.999f, 1e-8f, 0.0f, s + 1};
            kernels_adamw_step(model_mlp_params(wk.m), model_mlp_grads(wk.m), wk.adam_m, wk.adam_v,
                               NULL, wk.np, &hp);
            res->part[PART_UPDATE] += vl_clock_mono_s() - t1;
        } else if (kfac_step(&wk, c, s, x, B, res->note, sizeof res->note, res->part) != 0) {
            break;
        }
        train_s += vl_clock_mono_s() - t0;
        if ((s + 1) % EVAL_EVERY == 0) {
            double loss = 0.0, acc = 0.0;
            if (model_mlp_evaluate(wk.m, pb->xev, pb->yev, pb->n_eval, &loss, &acc, &err) != 0)
                die("evaluate", &err);
            int k = res->npts++;
            res->loss[k] = loss, res->acc[k] = acc, res->wall[k] = train_s;
            if (!isfinite(loss) || loss > blowup) {
                snprintf(res->note, sizeof res->note, "diverged by step %ld", s + 1);
                break;
            }
        }
    }
    work_free(&wk);
}

static void result_free(result *r) {
    free(r->loss), free(r->acc), free(r->wall);
    memset(r, 0, sizeof *r);
}

/* First eval point at or below target, or -1. */
static int hit_index(const result *r, double target) {
    for (int k = 0; k < r->npts; k++)
        if (r->loss[k] <= target) return k;
    return -1;
}

/* The configuration of one optimiser that reaches the target in the fewest
 * steps, ties going to the lower final loss; -1 when none does. */
static int best_of(const run_cfg *cfgs, const result *res, int nc, int opt, double target) {
    int best = -1;
    for (int i = 0; i < nc; i++) {
        int hi = hit_index(&res[i], target);
        if (cfgs[i].opt != opt || hi < 0) continue;
        if (best < 0) {
            best = i;
            continue;
        }
        int hb = hit_index(&res[best], target);
        double li = res[i].loss[res[i].npts - 1], lb = res[best].loss[res[best].npts - 1];
        if (hi < hb || (hi == hb && li < lb)) best = i;
    }
    return best;
}

static int same_curve(const result *a, const result *b) {
    if (a->npts != b->npts) return 0;
    return memcmp(a->loss, b->loss, (size_t)a->npts * sizeof(double)) == 0 &&
           memcmp(a->acc, b->acc, (size_t)a->npts * sizeof(double)) == 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- output ------------------------------------------------------------------------- */

static void print_header(const problem *pb) {
    printf("| optimiser | hyper-parameters | steps to target | wall s to target | ms/step "
           "| eval loss @%d | accuracy @%d |\n",
           pb->budget, pb->budget);
    printf("|---|---|---:|---:|---:|---:|---:|\n");
}

/* One table row; wall_to and ms_step override the run's own timing when
 * positive (the medians of the reruns). */
static void print_row(const problem *pb, const run_cfg *c, const result *r, double target,
                      double wall_to, double ms_step) {
    char label[160], steps[32], wall[32], ms[32], loss[sizeof r->note], acc[32];
    cfg_label(c, label, sizeof label);
    int k = hit_index(r, target);
    snprintf(steps, sizeof steps, "%s", "not reached");
    snprintf(wall, sizeof wall, "%s", "-");
    if (k >= 0) {
        snprintf(steps, sizeof steps, "%d", (k + 1) * EVAL_EVERY);
        snprintf(wall, sizeof wall, "%.3f", wall_to > 0 ? wall_to : r->wall[k]);
    }
    snprintf(ms, sizeof ms, "%s", "-");
    if (r->npts > 0)
        snprintf(ms, sizeof ms, "%.3f",
                 ms_step > 0 ? ms_step : 1e3 * r->wall[r->npts - 1] / (r->npts * EVAL_EVERY));
    if (r->npts == pb->budget / EVAL_EVERY && !r->note[0]) {
        snprintf(loss, sizeof loss, "%.4f", r->loss[r->npts - 1]);
        snprintf(acc, sizeof acc, "%.4f", r->acc[r->npts - 1]);
    } else {
        snprintf(loss, sizeof loss, "%s", r->note[0] ? r->note : "stopped");
        snprintf(acc, sizeof acc, "%s", "-");
    }
    printf("| %s | %s | %s | %s | %s | %s | %s |\n", c->opt == OPT_ADAMW ? "AdamW" : "K-FAC", label,
           steps, wall, ms, loss, acc);
}

static size_t mlp_params(const model_mlp_config *c) {
    size_t n = 0;
    int in = c->in_dim;
    for (int l = 0; l <= c->n_hidden; l++) {
        int out = l < c->n_hidden ? c->hidden[l] : c->n_classes;
        n += (size_t)(in + 1) * (size_t)out;
        in = out;
    }
    return n;
}

/* ---- main ------------------------------------------------------------------------------ */

static void make_data(problem *pb) {
    vl_error err = {0};
    int D = pb->data.dim;
    size_t ntr = (size_t)pb->budget * pb->B;
    pb->xtr = xcalloc(ntr * D, sizeof(float));
    pb->ytr = xcalloc(ntr, sizeof(int));
    pb->xev = xcalloc((size_t)pb->n_eval * D, sizeof(float));
    pb->yev = xcalloc((size_t)pb->n_eval, sizeof(int));
    /* In chunks: each call regenerates the class centres. */
    for (size_t first = 0; first < ntr; first += 16384) {
        int n = (int)(ntr - first < 16384 ? ntr - first : 16384);
        if (model_fed_synth_peer(&pb->data, 0, first, n, pb->xtr + first * D, pb->ytr + first,
                                 &err) != 0)
            die("training data", &err);
    }
    if (model_fed_synth_validation(&pb->data, 0, pb->n_eval, pb->xev, pb->yev, &err) != 0)
        die("evaluation data", &err);
}

int main(int argc, char **argv) {
    int threads, quick;
    int rc = bench_parse_args("bench_kfac",
                              "usage: bench_kfac [--threads N] [--quick]\n"
                              "  steps and wall time to a target loss with K-FAC against AdamW,\n"
                              "  for the MLP and the default GPT. --threads: training threads\n"
                              "  (default: every processor); --quick: a reduced sweep\n",
                              argc, argv, &threads, &quick);
    if (rc) return vl_opts_status(rc);
    kernels_set_num_threads(threads);

    problem pb;
    memset(&pb, 0, sizeof pb);
    pb.data = model_fed_synth_config_default();
    pb.data.dim = 32, pb.data.n_classes = 10, pb.data.modes = 4, pb.data.alpha = 100.0f;
    pb.data.separation = 1.0f, pb.data.noise = 2.0f, pb.data.seed = 7;
    pb.net = (model_mlp_config){.in_dim = 32, .n_hidden = 2, .hidden = {64, 64}, .n_classes = 10};
    pb.B = 128;
    pb.budget = quick ? 300 : 1200;
    pb.target_at = quick ? 150 : 600;
    pb.n_eval = quick ? 1024 : 4096;
    pb.repeats = quick ? 1 : 3;
    vl_error err = {0};
    if (model_fed_synth_config_validate(&pb.data, &err) != 0 ||
        model_mlp_config_validate(&pb.net, &err) != 0)
        die("configuration", &err);
    make_data(&pb);

    static const float adam_full[] = {1e-3f, 3e-3f, 1e-2f, 3e-2f}, adam_quick[] = {3e-3f, 1e-2f};
    static const float lr_full[] = {0.03f, 0.1f, 0.3f}, lr_quick[] = {0.1f};
    static const float damp_full[] = {1e-3f, 1e-2f}, damp_quick[] = {1e-3f};
    static const float kl_full[] = {1e-2f, 1e-3f};
    const float *adam_lr = quick ? adam_quick : adam_full, *kf_lr = quick ? lr_quick : lr_full;
    const float *damp = quick ? damp_quick : damp_full;
    int n_adam = quick ? 2 : 4, n_lr = quick ? 1 : 3, n_damp = quick ? 1 : 2;
    int n_kl = quick ? 1 : 2, n_mom = quick ? 1 : 2;
    static const float moms[] = {0.0f, 0.9f};

    run_cfg cfgs[MAX_CFGS];
    int nc = 0;
    for (int i = 0; i < n_adam; i++) cfgs[nc++] = (run_cfg){.opt = OPT_ADAMW, .lr = adam_lr[i]};
    for (int f = 0; f < 2; f++)
        for (int d = 0; d < n_damp; d++)
            for (int mo = 0; mo < n_mom; mo++)
                for (int k = 0; k < n_kl; k++)
                    for (int i = 0; i < n_lr; i++)
                        if (nc < MAX_CFGS)
                            cfgs[nc++] = (run_cfg){.opt = OPT_KFAC,
                                                   .lr = kf_lr[i],
                                                   .damping = damp[d],
                                                   .kl_clip = kl_full[k],
                                                   .momentum = moms[mo],
                                                   .true_fisher = f};
    result *res = xcalloc((size_t)nc, sizeof(result));

    printf("bench_kfac: threads %d, %s\n", threads, openblas_get_config());
    printf("task: fed_synth D %d, C %d, modes %d, alpha %g, separation %g, noise %g, seed %llu; "
           "peer 0 stream, batch %d, fresh samples every step; eval on %d validation samples "
           "every %d steps\n",
           pb.data.dim, pb.data.n_classes, pb.data.modes, (double)pb.data.alpha,
           (double)pb.data.separation, (double)pb.data.noise, (unsigned long long)pb.data.seed,
           pb.B, pb.n_eval, EVAL_EVERY);
    printf("model: MLP %d-%d-%d-%d, GELU, %zu params, init seed %d; K-FAC factors every step "
           "(rho %g), inverses every %d steps, SGD on the KL-clipped natural gradient\n",
           pb.net.in_dim, pb.net.hidden[0], pb.net.hidden[1], pb.net.n_classes, mlp_params(&pb.net),
           INIT_SEED, (double)RHO, INVERT_EVERY);
    fflush(stdout);

    for (int i = 0; i < nc; i++) run_one(&pb, &cfgs[i], &res[i]);

    /* The target: the best AdamW evaluation loss after target_at steps. */
    int tk = pb.target_at / EVAL_EVERY - 1, best_a = -1;
    for (int i = 0; i < nc; i++)
        if (cfgs[i].opt == OPT_ADAMW && res[i].npts > tk &&
            (best_a < 0 || res[i].loss[tk] < res[best_a].loss[tk]))
            best_a = i;
    if (best_a < 0) {
        fprintf(stderr, "bench_kfac: no AdamW run reached step %d\n", pb.target_at);
        return 1;
    }
    double target = res[best_a].loss[tk];
    printf("target: eval loss %.4f = best AdamW (lr %g) after %d steps; budget %d steps\n\n",
           target, (double)cfgs[best_a].lr, pb.target_at, pb.budget);
    /* The baseline is then the AdamW run that gets there first, which need
     * not be the one that set the target. */
    best_a = best_of(cfgs, res, nc, OPT_ADAMW, target);
    int best_k = best_of(cfgs, res, nc, OPT_KFAC, target);
    print_header(&pb);
    for (int i = 0; i < nc; i++) print_row(&pb, &cfgs[i], &res[i], target, 0, 0);

    /* Reruns of the two best, interleaved so drift in machine speed hits
     * both alike; each must reproduce its sweep run bit for bit. */
    int best[2] = {best_a, best_k};
    int nb = best_k >= 0 ? 2 : 1;
    double wall_to[2][MAX_REPEATS], ms_step[2][MAX_REPEATS], part[2][N_PARTS];
    for (int r = 0; r < pb.repeats; r++)
        for (int b = 0; b < nb; b++) {
            result again = {0};
            run_one(&pb, &cfgs[best[b]], &again);
            if (!same_curve(&again, &res[best[b]])) {
                fprintf(stderr, "bench_kfac: a rerun differs from its first run (not "
                                "deterministic)\n");
                return 1;
            }
            int k = hit_index(&again, target);
            wall_to[b][r] = again.wall[k];
            ms_step[b][r] = 1e3 * again.wall[again.npts - 1] / (again.npts * EVAL_EVERY);
            for (int q = 0; q < N_PARTS; q++)
                part[b][q] = 1e3 * again.part[q] / (again.npts * EVAL_EVERY);
            result_free(&again);
        }
    double mw[2] = {0, 0}, mm[2] = {0, 0};
    for (int b = 0; b < nb; b++) {
        mw[b] = median(wall_to[b], pb.repeats);
        mm[b] = median(ms_step[b], pb.repeats);
    }
    printf("\nbest of each; wall times are the median of %d rerun%s, each bitwise identical in "
           "loss and accuracy to its sweep run:\n\n",
           pb.repeats, pb.repeats == 1 ? "" : "s");
    print_header(&pb);
    for (int b = 0; b < nb; b++)
        print_row(&pb, &cfgs[best[b]], &res[best[b]], target, mw[b], mm[b]);
    if (best_k >= 0) {
        double sa = (hit_index(&res[best_a], target) + 1) * EVAL_EVERY;
        double sk = (hit_index(&res[best_k], target) + 1) * EVAL_EVERY;
        printf("\nK-FAC / AdamW (baseline, same run): steps to target %.2f, wall to target "
               "%.2f, ms/step %.2f\n",
               sk / sa, mw[1] / mw[0], mm[1] / mm[0]);
    } else {
        printf("\nK-FAC / AdamW: no K-FAC configuration reached the target in %d steps\n",
               pb.budget);
    }
    printf("\nms per step by part (last rerun; inversions amortised over all steps):\n\n");
    printf("| optimiser |");
    for (int q = 0; q < N_PARTS; q++) printf(" %s |", part_name[q]);
    printf("\n|---|");
    for (int q = 0; q < N_PARTS; q++) printf("---:|");
    printf("\n");
    for (int b = 0; b < nb; b++) {
        printf("| %s |", b == 0 ? "AdamW" : "K-FAC");
        for (int q = 0; q < N_PARTS; q++) printf(" %.3f |", part[b][q]);
        printf("\n");
    }
    for (int i = 0; i < nc; i++) result_free(&res[i]);
    free(res), free(pb.xtr), free(pb.ytr), free(pb.xev), free(pb.yev);
    fflush(stdout);
    return bench_kfac_gpt(quick);
}
