/*
 * The run configuration (docs/protocol.md, "Run configuration"): parsing
 * with defaults, validation that names the offending field, and the
 * normalised JSON form stored in the database and sent to joining peers.
 *
 * Contents: coord_train_config, coord_stale_fn, coord_staleness, coord_rule,
 * coord_robust_config, coord_net_kind, coord_config,
 * coord_staleness_weight, coord_config_is_async, coord_config_update_kind,
 * coord_config_round_candidates, coord_config_spec,
 * coord_config_update_bytes, coord_config_update_data_bytes,
 * coord_config_shares_factors, coord_config_factor_bytes,
 * coord_config_merge_max, coord_config_max_samples, coord_rule_name,
 * coord_config_defaults, coord_config_names_hash, coord_config_parse,
 * coord_config_free, coord_config_check_corpus, coord_config_split,
 * coord_config_to_json, coord_config_parse_stored, coord_config_model_json,
 * coord_config_num_params, coord_config_is_local, coord_config_is_split,
 * coord_parse_duration, coord_config_trim_count.
 */
#ifndef VOLLEY_COORD_CONFIG_H
#define VOLLEY_COORD_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "compress/compress.h"
#include "model/model.h"

#define COORD_NAME_MAX 64
#define COORD_PATH_MAX 4096
/* Largest P of compression.second_round: P * apply_k candidates per round. */
#define COORD_MAX_SECOND_ROUND 64
/* What a sync sketch run gets when its configuration does not say. On
 * pseudo-gradients after many local steps a sketch's estimates are mostly
 * collision noise (docs/results/convergence.md), so a sketch run applies
 * only exact values: the second round is on (P = 1: every candidate's
 * exact value is applied), and a ratio's byte budget goes a tenth to
 * the sketch, which only names the candidates, and the rest to one value
 * per candidate (in the run's dtype, like the sketch's cells). */
#define COORD_SKETCH_SECOND_ROUND 1
#define COORD_SKETCH_SHARE 0.1
/* A second-round run's E decays by this per version, so that what exact
 * values never settle (the updates a coordinate's stand-in value got
 * wrong) fades instead of piling up as noise. */
#define COORD_ROUND_DECAY 0.9f
/* The most versions one exact value may stand for (compress_round_take):
 * a coordinate missed for longer is still moved as if for this many, so
 * a stale value cannot arrive as one large burst. */
#define COORD_ROUND_MAX_GAP 8.0f
/* The outer step of a sketch run whose configuration has no "outer"
 * object: with a second round, DiLoCo's momentum with a smaller step and
 * a shorter memory (the exact values go through the dense step, but a
 * value standing in for several versions arrives as a burst, which a
 * larger step and a longer memory carry on for too long:
 * docs/benchmarks.md, "Figures the code relies on"); without one,
 * FedAvg's, since what passes the noise threshold is already the
 * accumulated error feedback and momentum would apply it again. */
#define COORD_SKETCH_ROUND_LR 0.5
#define COORD_SKETCH_ROUND_MOMENTUM 0.8
#define COORD_SKETCH_LR 1.0
#define COORD_SKETCH_MOMENTUM 0.0
/* Most training shards a run may name. */
#define COORD_MAX_SHARDS 4096
/* Most tokens one task may name: a peer keeps them on disk, 2 bytes each. */
#define COORD_MAX_TASK_TOKENS ((int64_t)1 << 29)
/* Most memory a robust rule other than mean may hold for one version's
 * updates (updates_per_version of them, each as floats). */
#define COORD_ROBUST_MAX_BYTES ((int64_t)16 << 30)

/* Windows per batch of the validation loss (DESIGN.md: val_batches of 8). */
#define COORD_VAL_BATCH 8
/* Held-out tokens a version is scored on when the configuration says
 * nothing: 256 Ki, or all there are when fewer. Scoring only a few
 * kilobytes made one version's loss differ from the next by more than
 * the training changed it. */
#define COORD_VAL_TOKENS_DEFAULT 262144
/* A version more than 20 % above the best validation loss so far is
 * refused: well above how far the versions of runs that learn stray
 * from their best (asynchronous ones, whose single versions are noisier,
 * included), well below where a diverging run goes within a few versions
 * (docs/benchmarks.md, "Figures the code relies on"). */
#define COORD_MAX_LOSS_RISE_DEFAULT 0.2

/* The outer optimiser an async run gets when its configuration has no
 * "outer" object: delayed Nesterov (see coord_outer_delayed), which
 * converges on stale pseudo-gradients where momentum every version
 * diverges. An async run given momentum without a delay gets this delay.
 * A cycle of delay versions should hold about one update per peer (one
 * synchronous round): with updates_per_version at half the peers, 2, the
 * setting that matched the synchronous run where others fell behind
 * (docs/benchmarks.md, "Figures the code relies on"). */
/* What a topk or gaussk run gets when its configuration names only the
 * kind and the ratio: slices of about COORD_TOPK_BLOCK coordinates
 * (topk), a residual decaying by COORD_SPARSE_DECAY per task, and, without
 * an "outer" object, outer lr COORD_SPARSE_OUTER_LR with no momentum: a
 * coordinate one peer of four sends is averaged down fourfold, which the
 * larger step makes up for, and server momentum on error-feedback bursts
 * overshoots (top-k at 100x then matches dense: docs/benchmarks.md). */
#define COORD_TOPK_BLOCK 512
#define COORD_SPARSE_DECAY 0.9
#define COORD_SPARSE_OUTER_LR 3.0

/* The largest mean training loss an update may report, in nats: a model
 * that guesses uniformly over a 50257-token vocabulary scores 10.8. */
#define COORD_MAX_UPDATE_LOSS 1000
/* A sync version merges at most this many times updates_per_version
 * updates: its own and late ones from earlier versions. */
#define COORD_SYNC_MERGE_FACTOR 2

/* The outer step an async run gets when its configuration has none:
 * delayed Nesterov (momentum once per 2 versions) with η 0.5 and μ 0.8.
 * Staleness itself acts as momentum (an update lands after steps it did
 * not see), so the explicit momentum must be lower than a synchronous
 * run's. The values were chosen on the demo task with one peer 4x
 * slower, against larger and smaller steps and memories and against
 * scaling each version's step by its staleness weight (FedBuff's
 * unnormalised mean), which did worse than a constant η
 * (docs/benchmarks.md, "Figures the code relies on"). */
#define COORD_ASYNC_OUTER_LR 0.5
#define COORD_ASYNC_OUTER_MOMENTUM 0.8
#define COORD_ASYNC_OUTER_DELAY 2

/* What an async run's lease_wait is when not given: a peer waits up to one
 * task's time for the version that merges its update, so that its
 * updates arrive fresh; without the wait a peer leases the old version
 * as soon as its update is stored and most updates land a version stale
 * (docs/benchmarks.md, "Figures the code relies on"). */
#define COORD_ASYNC_LEASE_WAIT 1.0
/* The val_check_tokens of an async run that waits, when not given: its
 * peers wait for each version, and so for its score, and a version
 * served on a check comes sooner while the updates stay as fresh, since
 * the peers wait for their own updates' version either way
 * (docs/benchmarks.md, "Figures the code relies on"). A 4 Ki check sees
 * a version that blows up (a 20 % rise is refused) as well as the full
 * score. */
#define COORD_ASYNC_CHECK_TOKENS 4096
/* The outer step of an async run that waits (lease_wait > 0) when its
 * configuration has none: the synchronous run's Nesterov step every
 * version. Its updates are fresh, so momentum needs no delay; a version
 * whose updates are mostly stale all the same (more peers than
 * updates_per_version) takes a plain step (coord_outer_momentum_due). */
#define COORD_ASYNC_WAIT_OUTER_LR 0.7
#define COORD_ASYNC_WAIT_OUTER_MOMENTUM 0.9

typedef struct coord_train_config {
    int64_t steps;
    int64_t batch;
    char optimizer[16]; /* "adamw", "sgd" (with momentum) or "kfac" */
    double lr, beta1, beta2, eps, weight_decay, grad_clip;
    double momentum; /* sgd, kfac */
    int nesterov;    /* sgd: Nesterov momentum */
    /* kfac (model_kfac_gpt): damping λ, the factors' moving-average decay,
     * inverses every inverse_every steps, the KL clip (0: off); with share
     * set peers attach their factors (as dtype) to their updates and the
     * coordinator serves their average with each version. */
    struct {
        double damping, decay, kl_clip;
        int64_t inverse_every;
        int share;
        char dtype[8];
    } kfac;
    /* The inner learning rate over the run (coord_sched_lr): "constant",
     * or "cosine" from lr down to min_lr at max_versions; either after a
     * linear warm-up over the first `warmup` versions. */
    char schedule[16];
    int64_t warmup;
    double min_lr;
    /* Async runs: each peer's local steps scaled to its measured speed
     * (coord_sched_dynamic_steps), so slow and fast peers' updates arrive
     * at the same pace. */
    int dynamic_steps;
} coord_train_config;

/* s(tau): polynomial (1 + tau)^-a, hinge 1 up to b and 1 / (a (tau - b) + 1)
 * beyond, or constant 1 (FedBuff's choices). */
typedef enum {
    COORD_STALE_POLYNOMIAL = 0,
    COORD_STALE_HINGE = 1,
    COORD_STALE_CONSTANT = 2,
} coord_stale_fn;

typedef struct coord_staleness {
    coord_stale_fn fn;
    double a;
    int64_t b;
    int64_t max; /* tau_max */
} coord_staleness;

/* How a version combines its updates (robust.h has the rules). */
typedef enum {
    COORD_RULE_MEAN = 0,         /* Σ wᵢΔᵢ / Σ wᵢ, DESIGN.md's merge */
    COORD_RULE_TRIMMED_MEAN = 1, /* per coordinate, the extremes cut, the rest averaged */
    COORD_RULE_MEDIAN = 2,       /* per coordinate, the median */
    COORD_RULE_NORM_CLIP = 3,    /* each update clipped to clip_mult × the median norm */
} coord_rule;

/* The run's defences against hostile updates ("robust" in the run
 * configuration). */
typedef struct coord_robust_config {
    coord_rule rule;
    int refuse_excess; /* on_excess "refuse" (else "clip"), see max_norm */
    double trim;       /* trimmed_mean: share of the values cut at each end, (0, 0.5) */
    double clip_mult;  /* norm_clip: the bound as a multiple of the median norm, > 0 */
    /* > 0: an update whose L2 norm (compress_update_norm) exceeds this is
     * refused at upload (refuse_excess) or scaled down to it when merged;
     * 0: no bound. */
    double max_norm;
    /* max_norm "auto": the bound is auto_mult times the median update norm
     * of versions 1 to auto_versions (storage_version_norm_median), set
     * once those versions exist and fixed from then on, so that a later
     * attacker cannot drag it; no bound before them. max_norm is 0. */
    int auto_norm;
    double auto_mult;
    int64_t auto_versions;
    /* Only while parsing: the configuration had no robust section, so
     * the rule is chosen by default_rule (config.c) once the rest is
     * known. */
    int by_default;
} coord_robust_config;

typedef enum coord_net_kind { COORD_NET_GPT = 0, COORD_NET_MLP = 1 } coord_net_kind;

typedef struct coord_config {
    char name[COORD_NAME_MAX];
    /* The training data: a UTF-8 text corpus whose bytes are the tokens
     * (corpus; its last val_fraction held out; task_bytes per task), or,
     * with shards set, llm.c token shards (train_shards, val_shard;
     * task_tokens per task). train_shards holds n_train_shards heap
     * strings owned by the configuration (coord_config_free). */
    char corpus[COORD_PATH_MAX];
    double val_fraction;
    int shards;
    char **train_shards;
    int n_train_shards;
    char val_shard[COORD_PATH_MAX];
    int64_t task_tokens;
    int64_t seed;
    /* The run's model: a GPT (net COORD_NET_GPT, model) or an MLP
     * classifier (COORD_NET_MLP, mlp). A classifier's peers train on
     * their own labelled images (data "local"); the coordinator scores
     * versions on test_images/test_labels (IDX files) when it has them,
     * and otherwise on the losses the peers report ("" paths). */
    coord_net_kind net;
    /* data "local": the peers train on their own data (every classifier
     * run; a GPT run scored on corpus, wholly held out, or val_shard) */
    int local;
    model_gpt_config model;
    model_mlp_config mlp;
    char test_images[COORD_PATH_MAX];
    char test_labels[COORD_PATH_MAX];
    /* mode "split" (an mlp run): the peers own the layers below split_cut
     * (1..n_hidden) and send their activations to POST /v1/split/forward;
     * the coordinator owns the rest and steps it with AdamW at split_lr.
     * split_alpha is NoPeek's weight on the peers' dCor(X, Z), and
     * split_dtype (F32/F16) how activations and their gradients travel.
     * split_cut 0: not a split run. */
    int split_cut;
    /* U-shaped (split.u_shape): the peers also keep the classifier layer
     * and the loss, so labels never leave them; the coordinator's layers
     * are those from split_cut up to it (split_cut < n_hidden). */
    int split_u;
    /* split.in_flight: batches a peer may have at the coordinator at once
     * (1..SPLIT_WIRE_MAX_IN_FLIGHT), so a peer on a slow link sends the
     * next batch before the last one's gradient is back; above 1 only for
     * a plain (not U-shaped) split. */
    int split_in_flight;
    double split_alpha, split_lr;
    char split_dtype[8];
    char mode[8];
    int64_t updates_per_version;
    int64_t max_versions;
    /* Async runs: a peer whose last update waits to be merged waits up to
     * lease_wait times a task's time (train.steps at the fastest peer's
     * pace) for the version that merges it before it is leased its next
     * task on the older version (0: never waits; sync runs: 0). With
     * updates_per_version at the number of peers, the peers then start
     * each task from a version that holds their own last update, and the
     * updates arrive fresh (coord_sched_wait_left). */
    double lease_wait;
    coord_train_config train;
    /* The outer step (coord_outer_step; coord_outer_delayed when
     * outer_delay > 1: momentum once per outer_delay versions). */
    double outer_lr, outer_momentum;
    int64_t outer_delay;
    char compression_kind[16]; /* none | topk | gaussk | sketch */
    char compression_dtype[8];
    /* Resolved at parse time from k/rows/cols or from ratio (the upload
     * compression against a dense F32 update): topk/gaussk send k entries;
     * a sketch is rows x cols cells with hash seed comp_seed, from which
     * comp_k coordinates are recovered per version. apply_k bounds the
     * coordinates a version changes in the sparse kinds. */
    int64_t comp_k;
    int64_t comp_rows, comp_cols;
    int64_t comp_seed;
    /* compression.hash: COMPRESS_SKETCH_HASH, the only one there is (a
     * stored sketch run that names none predates it: coord_state_load). */
    char comp_hash[16];
    double comp_ratio; /* as given; 0 once resolved into k/cols */
    int64_t apply_k;
    /* Sketch runs only: with second_round = P > 0, once a version has its
     * updates the P * apply_k heavy hitters become candidates whose exact
     * values the round's peers are asked for, for round_s seconds. */
    int64_t second_round;
    int64_t round_s;
    /* topk: block > 0 shares k out over slices of about block coordinates
     * (compress_topk_blocks); topk and gaussk: the peers' residual decays
     * by comp_decay per task (1: classic error feedback). */
    int64_t comp_block;
    double comp_decay;
    /* Staleness tau = current version - base version on arrival: an
     * update's weight is n_samples * s(tau), and tau > max_staleness is
     * refused (409 stale_update). */
    coord_staleness staleness;
    /* sync: a version with at least one update is made this long after the
     * last one even if fewer than updates_per_version arrived (0: never) */
    int64_t round_deadline_s;
    /* SelSync (DESIGN.md): relative change of the smoothed gradient norm
     * that ends local training early, never before selsync_h_min steps
     * (train.steps is H_max). delta 0 with h_min = steps is a fixed H. */
    double selsync_delta;
    int64_t selsync_h_min;
    int64_t keep_update_blobs; /* versions a merged update's blob is kept */
    int64_t task_bytes;
    int64_t lease_s;
    int64_t max_body_bytes;
    /* Validation scores val_batches batches of COORD_VAL_BATCH windows of
     * the held-out data (0: every window there is). A configuration gives
     * either val_batches or val_tokens, how many held-out tokens (bytes in
     * a text run) to score, rounded up to whole batches (0: all; default
     * COORD_VAL_TOKENS_DEFAULT), from which val_batches is derived; after
     * parsing, val_tokens is val_batches' windows' tokens (0: all). */
    int64_t val_batches;
    int64_t val_tokens;
    /* A version is served once it has passed the loss check on the first
     * val_check_batches batches of the held-out data, and is scored on all
     * val_batches in the background (versions.val_loss is NULL until
     * then); 0: scored in full before it is served. Given as
     * val_check_tokens, rounded up to whole batches; 0 as well when that
     * would cover val_batches. Default COORD_ASYNC_CHECK_TOKENS in an
     * async run that waits (lease_wait > 0), else 0: in an async run that
     * does not wait, the versions it serves sooner are what the peers'
     * next updates are stale against (docs/results/convergence.md). */
    int64_t val_check_tokens;
    int64_t val_check_batches;
    int64_t keep_versions;
    int64_t keep_changes; /* versions whose sparse change stays stored */
    /* A version whose validation loss is more than this fraction above the
     * best version's so far is refused (0: only a loss that is not finite
     * is; see coord_sched_version_refused). */
    double max_loss_rise;
    coord_robust_config robust;
} coord_config;

/* s(tau) of the run's staleness function; tau >= 0. */
double coord_staleness_weight(const coord_staleness *s, int64_t tau);
/* 1 for an async run. */
int coord_config_is_async(const coord_config *cfg);

/* The wire kind of the updates a run takes ("dense", "topk", "sketch"). */
const char *coord_config_update_kind(const coord_config *cfg);
/* Candidates of a second round: min(second_round * apply_k, n_params);
 * 0 when the run has no second round. */
int64_t coord_config_round_candidates(const coord_config *cfg);
/* What the run's uploads must look like, for compress_update_check_spec. */
void coord_config_spec(const coord_config *cfg, compress_spec *out);
/* Size in bytes of one update of the run's compression, header included
 * (and the K-FAC factors when the run shares them); the body cap must fit
 * it. */
int64_t coord_config_update_bytes(const coord_config *cfg);
/* The bytes of an update's values alone (indices and values, sketch
 * cells, or the dense tensor), without header or K-FAC factors: what the
 * compression ratio is about. */
int64_t coord_config_update_data_bytes(const coord_config *cfg);
/* 1 for a K-FAC run whose peers share their factors. */
int coord_config_shares_factors(const coord_config *cfg);
/* Bytes of the K-FAC factors of the run's model as dtype ("F32"/"F16"),
 * scales included. */
int64_t coord_config_factor_bytes(const coord_config *cfg);

/* The most updates one version merges, so a backlog cannot exhaust the
 * coordinator's memory (the robust rules hold each one): async runs take
 * exactly updates_per_version; sync runs at most COORD_SYNC_MERGE_FACTOR
 * times that, the oldest first, and later ones wait for the next version. */
int64_t coord_config_merge_max(const coord_config *cfg);

/* The most num_samples an update of a task may claim: every window of
 * every step, train.steps x train.batch x block_size tokens. */
int64_t coord_config_max_samples(const coord_config *cfg);

/* Name of a merge rule ("mean", "trimmed_mean", "median", "norm_clip"). */
const char *coord_rule_name(coord_rule r);

/* Fills cfg with the defaults of every field (name and corpus empty, a
 * text run). Overwrites cfg without freeing: free a parsed one first. */
void coord_config_defaults(coord_config *cfg);

/* Whether a stored configuration names its sketch hash
 * (compression.hash); runs stored before the windowed hash do not. */
int coord_config_names_hash(const char *json);

/* Parses and validates a configuration from len bytes of JSON: unknown
 * fields, wrong types and out-of-range values are VL_EINVAL with a message
 * naming the field ("config: train.lr must be > 0"). Missing fields take
 * their defaults; name is required, and either corpus (a text file) or
 * data {"kind": "shards", "train": [paths], "val": path}, which exclude
 * each other, as do the fields of the other kind (val_fraction and
 * task_bytes are for text, task_tokens for shards). A text run needs
 * vocab_size >= 256. Files are not opened here. On success cfg owns the
 * shard paths (coord_config_free); on failure it holds nothing to free. */
int coord_config_parse(const char *json, size_t len, coord_config *cfg,
                       vl_error *err) VL_MUST_CHECK;

/* Frees the shard paths a parsed configuration owns; safe to repeat, and
 * on a configuration from coord_config_defaults. */
void coord_config_free(coord_config *cfg);

/* Checks a text run's configuration against a corpus of corpus_size bytes: the
 * validation slice must hold a window of block_size + 1 bytes and the
 * training part a task of task_bytes; the body cap must fit a dense update
 * of the model. VL_EINVAL with the field named otherwise. */
int coord_config_check_corpus(const coord_config *cfg, int64_t corpus_size,
                              vl_error *err) VL_MUST_CHECK;

/* Byte counts of the training part and the held-out validation slice (the
 * last val_fraction of the corpus). */
void coord_config_split(const coord_config *cfg, int64_t corpus_size, int64_t *train_len,
                        int64_t *val_len);

/* The configuration as normalised JSON (every field of the run's data
 * kind present). With with_corpus clear the corpus path or the shard
 * paths, which only matter on this machine, are left out (that is the
 * form peers get; its "data" holds only "kind"). Returns a heap string
 * the caller frees, or NULL when out of memory. */
char *coord_config_to_json(const coord_config *cfg, int with_corpus);
/* Parses a run's stored configuration (the text coord_config_to_json
 * wrote when the run was made) like coord_config_parse, except that a run
 * stored before lease_wait existed goes on without it, as it was made
 * (and so without the loss check that comes with it by default). */
int coord_config_parse_stored(const char *json, coord_config *cfg, vl_error *err) VL_MUST_CHECK;

/* The run's model configuration as the compact JSON object carried in
 * model metadata (a GPT's fields, or model_mlp_config_json's object),
 * written into out (cap bytes, 160 suffice). Returns 0, or VL_EINVAL when
 * it does not fit. */
int coord_config_model_json(const coord_config *cfg, char *out, size_t cap) VL_MUST_CHECK;

/* Parameters of the run's model, whichever kind it is. */
size_t coord_config_num_params(const coord_config *cfg);

/* Whether the run trains the MLP classifier on data the peers keep (its
 * tasks carry no data range). */
int coord_config_is_local(const coord_config *cfg);

/* Whether the run is split learning (mode "split"). */
int coord_config_is_split(const coord_config *cfg);

/* Parses a duration such as "7d", "24h", "30m" or "3600s" (a bare number is
 * seconds) into seconds, between 1 s and 10 years. */
int coord_parse_duration(const char *s, int64_t *out_s) VL_MUST_CHECK;


/* Values trimmed_mean cuts at each end of k: ⌊trim·k⌋ (trim·k rounded to
 * 1e-9 first, so 0.29 of 100 is 29), never so many that nothing is left. */
size_t coord_config_trim_count(double trim, size_t k);

#endif
