/*
 * peer: the volunteer side of volley. A peer keeps an Ed25519 key and a
 * small state file in its directory, joins a run on an HTTPS coordinator,
 * then loops: lease a task, fetch the task's base model (cached between
 * tasks) and its slice of training data, run a few local AdamW steps, and
 * upload the pseudo-gradient delta = theta_base - theta_local as a
 * compressed update. Everything received is validated before use, every
 * response body is read under a hard cap, and transient failures (network
 * errors, 5xx, 429) are retried with capped, jittered exponential backoff,
 * re-signing each attempt. Its local training state and the record of an
 * upload in flight are kept in the directory too, so a peer killed at any
 * moment resumes on its own (resume.c). docs/protocol.md is the contract
 * with the coordinator.
 *
 * Conventions: fallible functions return 0 or a negative code — a VL_E*
 * code from common, or one of the PEER_E* codes below — and leave a
 * one-line message in the vl_error they are given.
 */
#ifndef VOLLEY_PEER_H
#define VOLLEY_PEER_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include <jansson.h>

#include "common/common.h"
#include "compress/compress.h"
#include "crypto/crypto.h"
#include "model/model.h"
#include "peer/http.h"

/* ---- error codes and exit statuses ------------------------------------ */

/* Codes the peer adds to common's VL_E* set, because scripts driving
 * volley-peer must tell "the coordinator said no" from "the coordinator
 * could not be reached" from "this machine has a problem". */
#define PEER_EREFUSED (-64) /* the coordinator refused a request (a 4xx) */
#define PEER_ENETWORK (-65) /* unreachable, or still failing after every retry */
#define PEER_ESTOPPED (-66) /* SIGINT/SIGTERM arrived; the work was abandoned */

/* Exit statuses of volley-peer; stable, for scripts. */
enum {
    PEER_EXIT_OK = 0,      /* done, the run finished, or stopped by a signal */
    PEER_EXIT_FAIL = 1,    /* a local problem or invalid data from the coordinator */
    PEER_EXIT_USAGE = 2,   /* bad command line */
    PEER_EXIT_REFUSED = 3, /* the coordinator refused a request */
    PEER_EXIT_NETWORK = 4, /* the coordinator could not be reached or kept failing */
};

/* Maps a return code of this module to the exit status above. */
int peer_exit_status(int rc);

/* ---- stopping (retry.c) ---------------------------------------------- */

/* Asks every loop, transfer and sleep of the peer to stop at the next
 * check. Async-signal-safe: meant to be called from a SIGINT/SIGTERM
 * handler. */
void peer_stop_request(void);
/* 1 once peer_stop_request has been called. */
int peer_stop_requested(void);
/* Clears the request (tests run several loops in one process). */
void peer_stop_reset(void);
/* Sleeps for s seconds in short slices; returns 1 early if a stop was
 * requested, else 0. */
int peer_sleep(double s);

/* ---- error bodies ------------------------------------------------------ */

/* Extracts error.code and error.message from an error body
 * {"error":{"code":..., "message":...}}. A body that is not that JSON is
 * tolerated: code becomes "" and message the body's first line (or "" for
 * an empty body). Both outputs are NUL-terminated, truncated to their
 * capacity (>= 1) and stripped of control characters, so they are safe to
 * print on one line. */
void peer_error_parse(const uint8_t *body, size_t len, char *code, size_t code_cap, char *msg,
                      size_t msg_cap);
/* Whether the error body's error.code is code (peer_error_parse's). */
int peer_error_code_is(const uint8_t *body, size_t len, const char *code);

/* Records in err the one-line refusal "<what>: <status> <code>: <message>"
 * (parts the body lacks are left out) and returns PEER_EREFUSED. */
int peer_refusal(vl_error *err, const char *what, long status, const uint8_t *body, size_t len);

/* ---- tasks ------------------------------------------------------------- */

/* How a task asks for the delta to be compressed. */
typedef enum {
    PEER_METHOD_NONE = 0, /* dense */
    PEER_METHOD_TOPK,     /* exact top-k with error feedback */
    PEER_METHOD_GAUSSK,   /* Gaussian-k with error feedback */
    PEER_METHOD_SKETCH,   /* Count Sketch of the delta, no local state */
} peer_method;

/* A task lease, as GET /v1/task returns it (docs/protocol.md). */
typedef struct peer_task {
    int64_t task_id;
    char run[64];
    int64_t base_version;
    /* The data range: bytes of the text shard named `shard`, or, with
     * tokens set (data.kind "tokens"), tokens of training shard
     * shard_index of a token-shard run. */
    int tokens;
    /* data.kind "local": the peer trains on its own data (--data); no
     * range, and the offset, length and shard fields stay zero */
    int local;
    int report_accuracy; /* local: score the base version on the peer's data */
    char shard[32];      /* bytes: [A-Za-z0-9_-]+, safe in a URL path */
    int64_t shard_index; /* tokens: the training shard, 0..PEER_MAX_SHARD */
    int64_t offset;      /* first byte (token) of the data range */
    int64_t length;      /* bytes (tokens) in the range, >= context + 1 */
    int steps;           /* H_max: most local steps */
    int batch;
    int context; /* tokens per sequence; <= the model's block size */
    double lr, beta1, beta2, eps, weight_decay;
    int sgd;         /* the inner optimizer: 0 AdamW, 1 SGD with momentum */
    int kfac;        /* 1: K-FAC (model_kfac_gpt); sgd is then 0 */
    double momentum; /* SGD, K-FAC: momentum in [0, 1) */
    int nesterov;    /* SGD: Nesterov momentum */
    /* K-FAC: damping, factor decay, inverse interval and KL clip; with
     * kfac_share the update carries the factors as kfac_dtype, and
     * kfac_factors (>= 0) names the version whose merged factors the peer
     * should start from (-1: none yet). */
    double kfac_damping, kfac_decay, kfac_kl_clip;
    int kfac_inverse_every;
    int kfac_share;
    st_dtype kfac_dtype;
    int64_t kfac_factors;
    double grad_clip;   /* global L2 norm bound; 0: no clipping */
    uint64_t seed;      /* seeds the batch sampler */
    compress_kind kind; /* the wire kind of the update */
    peer_method method;
    st_dtype dtype;                /* F32 or F16 values */
    int64_t comp_k;                /* topk/gaussk: entries to send */
    int64_t comp_block;            /* topk: 0, or k shared out over slices of this size */
    float comp_decay;              /* topk/gaussk: residual decay per task, (0, 1] */
    uint32_t comp_rows, comp_cols; /* sketch shape */
    uint64_t comp_seed;            /* sketch hash seed */
    int second_round;              /* sketch: P > 0 when the run asks for exact values */
    int round_s;                   /* how long a round waits for them, seconds */
    double selsync_delta;          /* SelSync threshold; 0 with h_min == steps: fixed H */
    int h_min;                     /* fewest local steps, 1..steps */
    /* Split learning (the task's "split" object; split_cut 0: none): the
     * peer trains the layers below split_cut and sends their activations,
     * as split_dtype, to POST /v1/split/forward; split_alpha weighs
     * NoPeek's dCor(X, Z). Only with local data. */
    int split_cut;
    int split_u;         /* U-shaped: the head and the loss stay here too */
    int split_in_flight; /* batches sent before the oldest one's answer is back */
    double split_alpha;
    st_dtype split_dtype;
    int64_t deadline; /* lease end, unix seconds */
    /* The run lets the next task start while this one's update uploads
     * (GET /v1/task?uploading=; async runs). */
    int overlap;
} peer_task;

/* Hard limits on what a task may ask of this machine. */
#define PEER_MAX_STEPS 100000
#define PEER_MAX_BATCH 4096
#define PEER_MAX_CONTEXT 65536
#define PEER_MAX_BATCH_TOKENS ((int64_t)1 << 22) /* batch * context */
#define PEER_MAX_DATA_BYTES ((int64_t)1 << 30)   /* one task's data range */
#define PEER_MAX_DATA_TOKENS ((int64_t)1 << 29)  /* one task's tokens (on disk) */
#define PEER_MAX_SHARD ((int64_t)1 << 20)        /* highest training shard index */

/* Parses and validates a task lease (len bytes of JSON). Every field of the
 * protocol's example is required except `selsync` (default: delta 0,
 * h_min = h_max = steps); unknown fields are ignored. On failure err names
 * the offending field and out is unspecified. */
int peer_task_parse(const char *json, size_t len, peer_task *out, vl_error *err) VL_MUST_CHECK;
/* The same for a task already parsed, such as the next_task of an
 * upload's 202 (POST /v1/updates?next=1). obj is only read. */
int peer_task_from_json(json_t *obj, peer_task *out, vl_error *err) VL_MUST_CHECK;

/* One line naming the task's compression ("topk k=2918 F16, blocks of
 * 512, residual decay 0.9"), for the log. */
void peer_task_describe_compression(const peer_task *t, char *out, size_t cap);

/* Checks that a task is for the run the peer joined (VL_EINVAL naming
 * both runs otherwise). */
int peer_task_check_run(const peer_task *t, const char *run, vl_error *err) VL_MUST_CHECK;

/* Checks that a task fits a model: context <= block_size, and for byte
 * data a byte vocabulary (vocab_size >= 256), since the bytes are the
 * tokens (token data are checked against vocab_size when opened). */
int peer_task_check_model(const peer_task *t, const model_gpt_config *cfg,
                          vl_error *err) VL_MUST_CHECK;

/* Parses the model configuration JSON that a model file carries in its
 * `model` metadata: {vocab_size, block_size, n_layer, n_head, n_embd},
 * each a positive integer within sane bounds, n_embd divisible by n_head. */
int peer_model_config_parse(const char *json, model_gpt_config *out, vl_error *err) VL_MUST_CHECK;

/* ---- the peer's directory ------------------------------------------------ */

#define PEER_KEY_FILE "peer.key"
#define PEER_STATE_FILE "peer.json"
#define PEER_PATH_MAX 4096

/* What `join` learned, kept in DIR/peer.json. */
typedef struct peer_state {
    char coordinator[256];      /* origin only: https://HOST[:PORT] */
    int64_t peer_id;            /* > 0 */
    char cacert[PEER_PATH_MAX]; /* absolute path, or "" for the system CAs */
    char run[64];               /* run name at join time */
    char name[64];              /* display name sent at join, may be "" */
} peer_state;

/* Reads the reply to POST /v1/peers (len bytes of JSON): a positive
 * integer peer_id and the run's name (1 to 63 bytes, no control
 * character) go into st->peer_id and st->run; nothing else of st
 * changes. VL_EINVAL for anything else, VL_ETOOBIG over 1 MiB. */
int peer_join_reply_parse(const uint8_t *body, size_t len, peer_state *st,
                          vl_error *err) VL_MUST_CHECK;
/* Copies the C string s into out (cap >= 1 bytes), dropping control
 * characters and truncating to fit: safe to print on one line. */
void peer_clean_copy(const char *s, char *out, size_t cap);

/* $HOME/.volley into out (cap bytes); VL_ENOTFOUND without $HOME. */
int peer_dir_default(char *out, size_t cap, vl_error *err) VL_MUST_CHECK;
/* Creates dir with mode 0700 if missing (not its parents); an existing
 * directory is left as it is. */
int peer_dir_create(const char *dir, vl_error *err) VL_MUST_CHECK;
/* dir + "/" + file into out, VL_ETOOBIG if it does not fit. */
int peer_path_join(char *out, size_t cap, const char *dir, const char *file,
                   vl_error *err) VL_MUST_CHECK;

/* Checks a coordinator URL: https, a host, an optional port, nothing
 * after (a trailing "/" is tolerated). On success the canonical form
 * without the trailing slash goes to out (cap bytes). */
int peer_url_check(const char *url, char *out, size_t cap, vl_error *err) VL_MUST_CHECK;

/* Writes DIR/peer.json atomically (mode 0600). */
int peer_state_save(const char *dir, const peer_state *s, vl_error *err) VL_MUST_CHECK;
/* Reads and validates DIR/peer.json into s. */
int peer_state_load(const char *dir, peer_state *s, vl_error *err) VL_MUST_CHECK;

/* ---- local training ---------------------------------------------------- */

/* SelSync's significance test (DESIGN.md): after each local step the
 * squared gradient norm g_t is smoothed, g~_t = (1 - w) g~_{t-1} + w g_t
 * with g~_1 = g_1, and the relative change d_t = |g~_t - g~_{t-1}| /
 * g~_{t-1} decides whether the peer stops and uploads (d_t >= delta, never
 * before h_min steps nor after H_max). w is PEER_SELSYNC_EWMA. */
#define PEER_SELSYNC_EWMA 0.1
typedef struct peer_selsync {
    double smoothed; /* g~ of the last step */
    int steps;       /* steps seen */
} peer_selsync;

/* Feeds one step's g2 and returns d_t (0 on the first step, and when the
 * previous smoothed norm is 0). s must start zeroed. */
double peer_selsync_feed(peer_selsync *s, double g2);


/* The model a peer trains, the base parameters it started from (for the
 * delta and for the next task on the same version), and the AdamW state,
 * which survives across tasks while the model's shape stays the same. */
/* ---- device (device.c) ----------------------------------------------- */

/* What --device asked for. */
typedef enum peer_device_want {
    PEER_DEVICE_WANT_AUTO = 0, /* a GPU when one is usable, else the CPU */
    PEER_DEVICE_WANT_CPU,
    PEER_DEVICE_WANT_CUDA /* a GPU, or an error */
} peer_device_want;

typedef enum peer_device_kind { PEER_DEVICE_CPU = 0, PEER_DEVICE_CUDA } peer_device_kind;

/* The device a peer trains on, and a line for the log saying which and,
 * after a fallback to the CPU, why. */
typedef struct peer_device {
    peer_device_kind kind;
    char desc[320];
} peer_device;

/* "auto", "cpu" or "cuda" into *out; VL_EINVAL for anything else. */
int peer_device_parse(const char *s, peer_device_want *out) VL_MUST_CHECK;

/* Resolves want on this machine. auto gives a GPU when the build has CUDA
 * and the driver reports a device, else the CPU with the reason in desc
 * (no GPU, or a GPU that is present but unusable, with the runtime's
 * error); cuda without a usable GPU is VL_EINVAL with the reason in err. */
int peer_device_choose(peer_device_want want, peer_device *out, vl_error *err) VL_MUST_CHECK;

struct model_gpt_cuda_dp;

typedef struct peer_trainer {
    model_gpt *gpt; /* owned; NULL until a model is installed */
    model_gpt_config cfg;
    /* owned: the model of a classifier run instead (peer/local.h); at most
     * one of gpt and mlp is set */
    model_mlp *mlp;
    size_t n_params;
    float *base;          /* owned: theta of base_version */
    float *delta;         /* owned: the last task's theta_base - theta_local */
    int64_t base_version; /* -1 when no model is held */
    model_adamw opt;
    int have_opt;
    /* SGD's momentum when the tasks ask for SGD; a trainer holds the state
     * of one optimizer at a time. */
    model_sgd sgd;
    int have_sgd;
    /* K-FAC when the tasks ask for it, and the version whose merged factors
     * it adopted last (-1: none). */
    model_kfac_gpt kfac;
    int have_kfac;
    int64_t kfac_factors;
    int *inputs, *targets; /* owned batch buffers */
    size_t tokens_alloc;
    /* Error feedback (topk, gaussk): what was not sent yet, n_params
     * floats or NULL before the first sparse upload; and the entries of
     * the last upload, to take back if the coordinator drops it. */
    float *residual;
    uint32_t *sel_idx;
    float *sel_val;
    size_t sel_nnz, sel_cap;
    /* Seconds peer_trainer_run sleeps after every step (--step-delay),
     * interruptibly; 0 after peer_trainer_init. */
    double step_delay_s;
    /* Each step then takes this many times as long as it did (--slowdown):
     * the trainer sleeps (slowdown - 1) times the step's own time, delay
     * included; <= 1 after peer_trainer_init means no slowdown. */
    double slowdown;
    /* Where training runs: on PEER_DEVICE_CUDA, AdamW tasks run wholly on
     * the GPU (peer_gpu_begin/step/finish) and SGD tasks do their forward
     * and backward there (peer_gpu_grads); K-FAC tasks stay on the CPU,
     * whose layers they hook. gpu_fallback: whether a GPU failure moves
     * the trainer to the CPU (--device auto) or fails the task (--device
     * cuda). CPU after peer_trainer_init. */
    peer_device_kind device;
    int gpu_fallback;
    /* owned: the device copies, one per visible GPU, made on first use */
    struct model_gpt_cuda_dp *gpu;
    /* Device memory beside the model's (owned, 2 * n_params floats): a
     * GPU task's base, then its residual scratch, then its delta; and
     * whether that delta is the last task's, for peer_gpu_encode. */
    float *gpu_vec;
    int gpu_delta;
} peer_trainer;

/* ---- GPU steps (gpu.c) -----------------------------------------------------
 * Every function here makes t->gpu on first use, frees it on any failure
 * (the next call starts afresh) with what the device reported in err, and
 * gives VL_EINVAL in builds without CUDA. */

/* Runs one step's forward (mean loss into *loss) and backward on the GPU,
 * on the trainer's current parameters, and leaves the gradient in
 * model_gpt_grads(t->gpt), replacing it: two copies of the parameters
 * over PCIe per step, for optimizers that stay on the host. */
int peer_gpu_grads(peer_trainer *t, const int *inputs, const int *targets, int B, int T,
                   float *loss, vl_error *err) VL_MUST_CHECK;

/* An AdamW task on the GPU from start to end. begin copies the host
 * model's parameters (the task's base) and t->opt's moments and step count
 * to the device; step runs one step there on t->inputs and t->targets
 * ([B,T]) with t->opt's hyper-parameters; finish copies the parameters
 * back into the host model and the moments and step count into t->opt.
 * Until finish the host model and t->opt are not touched, so a task given
 * up on the way (a failure, a stop) leaves the host where the task began.
 * Per step only the tokens go to the device and the loss and gradient
 * norm come back.
 *
 * step: forward and backward, global L2 clipping to max_norm (as the CPU
 * path clips), *loss the mean loss and *g2 the squared gradient norm
 * before clipping; the AdamW update only when both are finite (otherwise
 * the caller reports divergence and nothing was applied). t->opt must be
 * initialised (peer_trainer_prepare). */
int peer_gpu_begin(peer_trainer *t, vl_error *err) VL_MUST_CHECK;
int peer_gpu_step(peer_trainer *t, int B, int T, double max_norm, float *loss, double *g2,
                  vl_error *err) VL_MUST_CHECK;
int peer_gpu_finish(peer_trainer *t, vl_error *err) VL_MUST_CHECK;

/* The last task's update compressed on the GPU, where its delta already
 * is (after peer_gpu_finish): a sketch's table comes back instead of the
 * delta being sketched on the host, and for top-k and Gaussian-k the
 * error feedback and the selection run there (the host's residual goes up
 * and comes back, since trainer.st keeps it). The result is the host
 * path's: peer_encode_update uses these. VL_EINVAL when the device holds
 * no delta (the task ran on the CPU) or for a block top-k of more than
 * PEER_GPU_MAX_BLOCKS slices; on any failure the host's residual is as it
 * was (the selection buffers are scratch), so the host can encode instead.
 *
 * sketch: s initialised by the caller (its table is overwritten).
 * select: k's method PEER_METHOD_TOPK or PEER_METHOD_GAUSSK with want =
 * k->comp_k entries; the trainer's residual exists and t->sel_idx and
 * t->sel_val have room for COMPRESS_GAUSSK_CAP(want) (topk: want); fills
 * them and *nnz and updates t->residual, as the host path does. */
#define PEER_GPU_MAX_BLOCKS 64
int peer_gpu_has_delta(const peer_trainer *t);
int peer_gpu_sketch(peer_trainer *t, compress_sketch *s, vl_error *err) VL_MUST_CHECK;
int peer_gpu_select(peer_trainer *t, const peer_task *k, size_t *nnz, vl_error *err) VL_MUST_CHECK;

/* Frees the device copy, if any; t->gpu is NULL after. */
void peer_gpu_free(peer_trainer *t);

/* An empty trainer holding no model (base_version -1). */
void peer_trainer_init(peer_trainer *t);
/* Frees the model, buffers and optimizer state; t is empty again. */
void peer_trainer_free(peer_trainer *t);

/* Installs a model file (safetensors as GET /v1/model sends it) as the base
 * of version: its metadata must name run and version, and its `model`
 * configuration must parse. A different configuration replaces the model
 * and resets the optimizer. On failure the trainer is unchanged. bytes are
 * only read during the call. */
int peer_trainer_load(peer_trainer *t, const uint8_t *bytes, size_t len, const char *run,
                      int64_t version, vl_error *err) VL_MUST_CHECK;

/* Installs a freshly initialised model of configuration cfg as the base of
 * version (for tests and local experiments). */
int peer_trainer_init_model(peer_trainer *t, const model_gpt_config *cfg, int64_t version,
                            vl_error *err) VL_MUST_CHECK;

/* What one task's training did, for the update metadata and the log. */
typedef struct peer_train_result {
    int steps;         /* local steps done */
    double mean_loss;  /* mean training loss over those steps */
    double first_loss; /* loss of the first step, before any update */
    double last_loss;
    int64_t tokens; /* steps * batch * context */
    /* A classifier task that asked for it (peer_task.report_accuracy): the
     * base version's top-1 accuracy on a fixed sample of the peer's data. */
    int has_accuracy;
    double accuracy;
    double seconds; /* wall time of the training */
} peer_train_result;

/* Trains one task from the base parameters on batches sampled (with the
 * task's seed) from data, len bytes, the task's range: AdamW with the
 * task's hyper-parameters, gradients clipped to grad_clip, SelSync early
 * stop. Leaves delta = base - local in t->delta (n_params floats).
 * PEER_ESTOPPED when a stop was requested between steps; VL_ERANGE when
 * the loss or the delta stops being finite (the optimizer is reset). */
int peer_trainer_run(peer_trainer *t, const peer_task *task, const uint8_t *data, size_t len,
                     peer_train_result *res, vl_error *err) VL_MUST_CHECK;

/* peer_trainer_run on a token task: batches are drawn from the shard
 * (model_shard_sample, the same draws model_data_sample makes for a byte
 * string as long), which holds the task's range; the shard is only read.
 * The shard's tokens were checked against the model's vocab_size when it
 * was opened. */
int peer_trainer_run_shard(peer_trainer *t, const peer_task *task, model_shard *data,
                           peer_train_result *res, vl_error *err) VL_MUST_CHECK;

/* Applies a delta file (GET /v1/model/delta) to the held base: it must
 * name run, since == t->base_version and version, and hold ascending
 * in-range U32 `indices` with finite F32 `values` that leave every
 * parameter finite; base[indices] += values and the base becomes that
 * version. On failure (VL_EINVAL) the trainer is unchanged. */
int peer_trainer_apply_delta(peer_trainer *t, const uint8_t *bytes, size_t len, const char *run,
                             int64_t version, vl_error *err) VL_MUST_CHECK;

/* ---- K-FAC (kfac.c; peer_trainer_prepare in train.c) --------------------- */

/* Makes the trainer's optimizer the one task k asks for, with k's
 * hyper-parameters, keeping its state when it already is (done by
 * peer_trainer_run too). */
int peer_trainer_prepare(peer_trainer *t, const peer_task *k, vl_error *err) VL_MUST_CHECK;

/* Installs a merged-factors file (GET /v1/factors) for K-FAC task k: it
 * must name k's run and version k->kfac_factors and hold factors for the
 * trainer's model (compress_factors_decode); every layer then starts from
 * them, and t->kfac_factors records the version. On failure nothing
 * changed. */
int peer_trainer_adopt_factors(peer_trainer *t, const peer_task *k, const uint8_t *bytes,
                               size_t len, vl_error *err) VL_MUST_CHECK;

/* Fetches and adopts the merged factors task k names, unless the trainer
 * adopted them already. A coordinator that no longer has them (404) or
 * factors that do not check out are logged and skipped: the peer trains
 * on its own factors then. Errors are transport failures only.
 * *down_bytes grows by what was downloaded. */
int peer_kfac_sync(peer_http *h, peer_response *rs, peer_trainer *t, const peer_task *k,
                   uint64_t *down_bytes, vl_error *err) VL_MUST_CHECK;

/* The factors to attach to task k's update: the trainer's current ones
 * with samples tokens behind them, as k's dtype; layers must have room
 * for model_gpt_kfac_layer_count entries and A, G for as many pointers
 * (all caller-owned, borrowed by *out). */
int peer_kfac_factors(const peer_trainer *t, const peer_task *k, int64_t samples,
                      compress_factor_layer *layers, const float **A, const float **G,
                      compress_factors *out, vl_error *err) VL_MUST_CHECK;

/* ---- compression (encode.c) --------------------------------------------- */

/* Appends to out the update for task k built from t->delta and the meta:
 * dense, a sketch, or the top-k / Gaussian-k of residual + delta with the
 * sent entries taken out of the residual (remembered for
 * peer_encode_unsent). */
int peer_encode_update(peer_trainer *t, const peer_task *k, const compress_update_meta *m,
                       vl_buf *out, vl_error *err) VL_MUST_CHECK;
/* Puts the entries of the last sparse upload back into the residual, for
 * an upload the coordinator did not take. */
void peer_encode_unsent(peer_trainer *t);
/* Forgets the entries of the last sparse upload, which the coordinator
 * turned down for what they held; with all, the whole residual too (an
 * update that was not finite leaves the rest of its delta there). */
void peer_encode_drop(peer_trainer *t, int all);

/* ---- the commands ------------------------------------------------------ */

/* `volley-peer keygen`: creates dir (0700) and dir/peer.key (0600); refuses
 * to replace a key unless force. The base64 public key goes to pk_b64
 * (VCRYPTO_PK_B64_LEN + 1 bytes). */
int peer_keygen(const char *dir, int force, char *pk_b64, vl_error *err) VL_MUST_CHECK;

/* Options of peer_join; the strings are borrowed for the call. */
typedef struct peer_join_opts {
    const char *dir;
    const char *coordinator;
    const char *token;
    const char *cacert; /* NULL or "" for the system CAs */
    const char *name;   /* NULL or "" for the host name */
    int retries;        /* attempts per request; 0: no limit (peer_retry_for) */
    double give_up_s;   /* stop retrying this long after a failure; 0: never */
} peer_join_opts;

/* `volley-peer join`: POST /v1/peers signed with peer=0, then writes
 * dir/peer.json. The new state goes to out. */
int peer_join(const peer_join_opts *o, peer_state *out, vl_error *err) VL_MUST_CHECK;
/* Loads the peer's key pair from DIR/key (peer_join, peer_run); a missing
 * key is VL_ENOTFOUND with a message naming `volley-peer keygen`. The
 * caller owns *id and wipes it (vcrypto_identity_wipe). */
int peer_load_key(const char *dir, vcrypto_identity *id, vl_error *err) VL_MUST_CHECK;

/* `volley-peer rotate-key`: moves the joined peer in dir to a new key,
 * by POST /v1/peers/rotate signed with the old key and carrying the new
 * key's proof (vcrypto_rotation_sign). The new key waits in
 * dir/peer.key.next until the coordinator has accepted it and then
 * replaces dir/peer.key; after a crash or a lost answer, calling it again
 * completes the change. retries, give_up_s: attempts per request and the
 * deadline after a failure (0: no limit; peer_retry_for).
 * The new public key goes to pk_b64 (VCRYPTO_PK_B64_LEN + 1 bytes). A
 * running `run` keeps signing with the old key, which is refused from
 * then on: restart it. */
int peer_rotate_key(const char *dir, int retries, double give_up_s, char *pk_b64,
                    vl_error *err) VL_MUST_CHECK;

/* Options of peer_run; dir is borrowed for the call. */
typedef struct peer_run_opts {
    const char *dir;
    int threads; /* training threads (OpenMP; OpenBLAS stays single-threaded); 0: leave the defaults */
    int64_t max_tasks;       /* stop after this many tasks; 0: no limit */
    int wait_s;              /* long-poll wait for GET /v1/task, 0..60 */
    int retries;             /* attempts per request; 0: no limit (peer_retry_for) */
    double give_up_s;        /* stop retrying this long after a failure; 0: never */
    int step_delay_ms;       /* sleep after every local step, 0..60000 (a slow volunteer) */
    int slowdown;            /* every step takes this many times as long, 1..100; 0 means 1 */
    peer_device_want device; /* --device; the zero value is auto */
    int64_t gpu_mem_mib;     /* --gpu-mem: cap on device memory in MiB; 0: none */
    /* --max-upload-rate, --max-download-rate: bytes per second; 0: none */
    int64_t max_upload_bps, max_download_bps;
    /* --overlap: where the task allows it (peer_task.overlap), the next
     * task trains while the last update uploads; otherwise each upload is
     * waited for. Off by default: on the mixed federation of
     * docs/results/wan.md the extra, staler updates made the run slower
     * to its target loss. */
    int overlap;
    /* --data and --partition: the peer's own images, for runs whose data
     * stay on the peers (peer/local.h); NULL: none */
    const struct peer_local_opts *local;
} peer_run_opts;

/* Refused tasks in a row after which `run` stops (PEER_EXIT_FAIL). A task
 * is refused, with one warning line, when the lease, its model or its data
 * fails validation (malformed, another run, a shape that does not fit,
 * non-finite values, wrong sizes); the peer keeps the model and state it
 * had, pauses n seconds after the n-th refusal in a row, and asks again. */
#define PEER_MAX_REFUSALS 5

/* `volley-peer run`: the task loop. It first restores DIR/trainer.st and
 * settles an upload left in DIR/pending.st by an earlier process (see
 * resume.c below), and records every upload there before sending it.
 * Returns 0 when max_tasks were done, when the run finished (410
 * run_finished) or when a stop was requested; otherwise the error that
 * ended it. */
int peer_run(const peer_run_opts *o, vl_error *err) VL_MUST_CHECK;

/* ---- the second round (round.c) ------------------------------------------ */

/* The exact values of the last task's delta at the n candidates idx (each
 * below t->n_params, which the caller has checked) into out. */
void peer_round_values(const peer_trainer *t, const uint32_t *idx, size_t n, float *out);

/* After a sketch upload of task k was accepted in a run with a second
 * round: waits (long-polls) for the round of k's base version to open, then
 * reports the delta's exact values at its candidates. Gives up quietly at
 * k's deadline plus the round's length, when the round closes without it,
 * or when the coordinator refuses the values: the coordinator then uses
 * the sketch's estimate, so none of these is an error. Errors are only
 * transport failures and stop requests (PEER_ESTOPPED). *up_bytes grows
 * by what was uploaded; scratch is reused for the upload body. */
int peer_round_answer(peer_http *h, peer_response *rs, const peer_trainer *t, const peer_task *k,
                      int64_t peer_id, vl_buf *scratch, uint64_t *up_bytes,
                      vl_error *err) VL_MUST_CHECK;

/* ---- surviving a restart (resume.c) -------------------------------------- */

/* A peer killed at any instant and started again goes on by itself. Two
 * files in the peer's directory, both safetensors written atomically
 * (temporary file in DIR, fsync, rename, fsync of DIR) with mode 0600:
 *
 * DIR/trainer.st  what local training carries from task to task: the AdamW
 *                 moments, step count and hyper-parameters, the
 *                 error-feedback residual, the model shape and run they
 *                 belong to, and `pending_task`, the task whose upload was
 *                 recorded together with this state (absent: none).
 * DIR/pending.st  the upload of that task exactly as it is POSTed, with the
 *                 task id and its lease deadline.
 *
 * Before POST /v1/updates the peer writes pending.st, then trainer.st with
 * the residual as it is after the sent entries were taken out and
 * pending_task naming the upload. A pending.st that trainer.st does not
 * name was never sent (the process died between the two writes) and is
 * removed. Once the outcome is known the record is settled: accepted (202,
 * or 409 duplicate_update: stored by an earlier attempt) removes
 * pending.st; a refusal puts the entries back into the residual, saves
 * trainer.st without pending_task, then removes pending.st. A trainer.st
 * naming a task whose pending.st is gone therefore means "settled". At
 * start, a recorded upload is POSTed again first, byte for byte, and
 * settled the same way, so an upload is neither lost nor counted twice. */

#define PEER_TRAINER_FILE "trainer.st"
#define PEER_PENDING_FILE "pending.st"
/* The `format_version` both files carry; any other is refused. */
#define PEER_RESUME_FORMAT_VERSION 1
/* Either file may hold at most this many bytes per model parameter plus
 * PEER_RESUME_HEADER_ALLOWANCE. A GPT's K-FAC factors hold at most 3.9
 * floats per parameter (46 C² per block against 12 C² weights), so
 * trainer.st needs at most 24 (K-FAC momentum and factors, or two AdamW
 * moments, and the residual, all F32), an upload at most 20 (a dense F32
 * delta with F32 factors; Gaussian-k alone is 8.4). */
#define PEER_RESUME_BYTES_PER_PARAM 32
#define PEER_RESUME_HEADER_ALLOWANCE ((size_t)1 << 20)

/* The trainer state as read from trainer.st, held until a model of its
 * shape is installed (peer_resume_apply). n_params 0 means empty. The state
 * belongs to one registration (peer.json's coordinator, peer id and run):
 * after a new join, even into a run of the same name, it is not used. The
 * model is a GPT's (mlp 0, cfg) or a classifier's (mlp 1, mlp_cfg), named
 * in the file by the same `model` JSON its model files carry. */
typedef struct peer_resume {
    int mlp;
    model_gpt_config cfg;
    model_mlp_config mlp_cfg;
    size_t n_params;
    char coordinator[256];
    int64_t peer_id;
    char run[64];
    model_adamw opt; /* owned; opt.m NULL when the file had no moments */
    model_sgd sgd;   /* owned; sgd.buf NULL when the file had no SGD momentum */
    /* K-FAC (owned; kfac_momentum NULL when the file had none): its
     * settings, step, factor update count and adopted merged version, the
     * momentum (n_params floats) and every layer's A then G, in layer
     * order, in one allocation. */
    model_kfac_gpt_config kfac_cfg;
    long kfac_step, kfac_updates;
    int64_t kfac_factors;
    float *kfac_momentum, *kfac_factor_data;
    float *residual;      /* owned; n_params floats, or NULL */
    int64_t pending_task; /* the upload recorded with this state; 0: none */
} peer_resume;

/* An empty state. */
void peer_resume_init(peer_resume *r);
/* Frees what r owns; r is empty again. */
void peer_resume_free(peer_resume *r);

/* Writes r to DIR/trainer.st (r is only read). VL_EINVAL when r is empty
 * or inconsistent; VL_EIO when the file cannot be written, in which case
 * the previous file is still there, whole. */
int peer_resume_save(const char *dir, const peer_resume *r, vl_error *err) VL_MUST_CHECK;

/* Writes the state of t (which must hold a model, a GPT or a classifier:
 * VL_EINVAL otherwise) to DIR/trainer.st as belonging to owner's
 * registration, with pending_task (0: none). Reads t's vectors in place,
 * without copying them first. */
int peer_resume_save_trainer(const char *dir, const peer_trainer *t, const peer_state *owner,
                             int64_t pending_task, vl_error *err) VL_MUST_CHECK;

/* Reads and strictly validates DIR/trainer.st into out (initialised here;
 * the caller frees it with peer_resume_free): format and version, owner's
 * coordinator, peer id and run, a model
 * configuration (a GPT's or a classifier's) that validates, the file no larger than the cap its shape
 * allows (checked from the header before the file is read), exactly the
 * tensors adam.m, adam.v (both or neither) and residual (optional), each
 * F32 of shape [n_params] with finite values (second moments >= 0), and
 * usable AdamW hyper-parameters and step. Returns VL_ENOTFOUND when there
 * is no file, VL_ECONFLICT when it belongs to another registration,
 * VL_ETOOBIG over the cap, VL_ERANGE for a non-finite value, VL_EINVAL for
 * anything else malformed, VL_ENOMEM; out is empty on any failure. */
int peer_resume_load(const char *dir, const peer_state *owner, peer_resume *out,
                     vl_error *err) VL_MUST_CHECK;

/* Moves the state in r into t, whose model must already be installed
 * (VL_EINVAL otherwise, r untouched), replacing t's optimizer state and
 * residual, provided the models are of one kind and shape; VL_ECONFLICT
 * when they are not (a classifier's state for a GPT, or another width),
 * t untouched. After VL_OK or VL_ECONFLICT r is empty. An empty r is
 * VL_OK and changes nothing. */
int peer_resume_apply(peer_trainer *t, peer_resume *r, vl_error *err) VL_MUST_CHECK;

/* A recorded upload. */
typedef struct peer_pending {
    int64_t task_id;  /* 0: none */
    int64_t deadline; /* the task's lease end, unix seconds */
    char run[64];
    compress_kind kind; /* set by peer_pending_load from the update itself */
    uint8_t *bytes;     /* the update as sent: owned after peer_pending_load */
    size_t len;
} peer_pending;

/* An empty record. */
void peer_pending_init(peer_pending *p);
/* Frees bytes (only for a record that owns them) and empties p. */
void peer_pending_free(peer_pending *p);

/* Writes p to DIR/pending.st; p and its bytes are only read (they may
 * belong to the caller's upload buffer). VL_ETOOBIG when the upload is
 * over the cap for a model of n_params, VL_EIO when it cannot be written. */
int peer_pending_save(const char *dir, const peer_pending *p, size_t n_params,
                      vl_error *err) VL_MUST_CHECK;

/* Reads DIR/pending.st into out (initialised here; the caller owns
 * out->bytes and frees them with peer_pending_free) and checks it: format
 * and version, run, task and deadline, and an update that
 * compress_update_decode accepts for a model of n_params and whose
 * metadata names the same run and task. VL_ENOTFOUND when there is no
 * file, VL_ETOOBIG over the cap, VL_EINVAL otherwise; out is empty on
 * failure. */
int peer_pending_load(const char *dir, const char *run, size_t n_params, peer_pending *out,
                      vl_error *err) VL_MUST_CHECK;

/* Removes DIR/pending.st (a missing file is fine) and syncs DIR, so the
 * record cannot come back after a crash. */
int peer_pending_clear(const char *dir, vl_error *err) VL_MUST_CHECK;

/* What the final answer to POST /v1/updates says about the update. */
typedef enum {
    PEER_UPLOAD_STORED = 1,    /* 200-202, or 409 duplicate_update */
    PEER_UPLOAD_NOT_TAKEN = 2, /* any other 4xx but 429: nothing was stored */
    PEER_UPLOAD_UNKNOWN = 3,   /* no answer, 429, 5xx, or anything else */
} peer_upload_outcome;

/* Classifies an upload's final HTTP status and error.code (NULL or "" when
 * the body had none). */
peer_upload_outcome peer_upload_classify(long status, const char *code);

/* Settles the recorded upload p in r after its retry was answered with
 * status and code, and says how in *out. NOT_TAKEN: for a sparse update,
 * its values are added back into r->residual at its indices (a zero
 * residual is made when r has none), so residual + sent is again what it
 * was before encoding; dense and sketch updates leave nothing to put back.
 * STORED and NOT_TAKEN clear r->pending_task; UNKNOWN changes nothing. No
 * I/O: the caller saves r and clears the files. VL_EINVAL when p does not
 * decode for r's shape or r is empty, VL_ENOMEM; r is unchanged on
 * failure. */
int peer_pending_settle(peer_resume *r, const peer_pending *p, long status, const char *code,
                        peer_upload_outcome *out, vl_error *err) VL_MUST_CHECK;

/* What `run` does first: loads DIR/trainer.st into r (for owner) and,
 * when it names a recorded upload, DIR/pending.st into p (for owner's run,
 * with r's model size); both are initialised
 * here and owned by the caller. Each problem is logged as one warning
 * line and ignored: a missing, corrupt or mismatched trainer.st leaves r
 * empty (a fresh start); a pending.st that trainer.st does not name, or
 * that is unreadable, is removed, and r->pending_task cleared, leaving p
 * empty. Fails only with VL_ENOMEM. */
int peer_resume_open(const char *dir, const peer_state *owner, peer_resume *r, peer_pending *p,
                     vl_error *err) VL_MUST_CHECK;

#endif
