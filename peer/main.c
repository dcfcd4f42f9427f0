/* volley-peer: command-line entry point. Parses arguments, makes `run` a
 * good guest on a shared machine (peer/guest.h: priority, passive waits,
 * the default thread count), installs the signal handlers that let a run
 * stop between steps, and turns every failure into one line on stderr and
 * a stable exit status (peer.h). */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/opts.h"
#include "peer/dirlock.h"
#include "peer/guest.h"
#include "peer/local.h"
#include "peer/peer.h"
#include "peer/progress.h"
#include "peer/ui.h"
#include "common/version.h"

#define PROG "volley-peer"

static const char USAGE[] =
    "usage: volley-peer <command> [options]\n"
    "       " PROG " --version   (the version, the commit, and whether CUDA is compiled in)\n"
    "\n"
    "commands:\n"
    "  keygen [--dir DIR] [--force]\n"
    "      create DIR (default $HOME/.volley, mode 0700) and the Ed25519 key\n"
    "      DIR/peer.key (mode 0600); print the public key\n"
    "  join --coordinator https://HOST:PORT (--token T | --token-file FILE)\n"
    "       [--cacert FILE] [--name NAME] [--dir DIR] [--give-up-after D] [--retries N]\n"
    "      register the key with a join token; write DIR/peer.json; print the peer id\n"
    "  status [--dir DIR] [--offline]\n"
    "      what this peer knows of itself: id, coordinator, run, the run's progress\n"
    "      (versions done of the most, losses: asked of the coordinator, one try,\n"
    "      unless --offline; else what DIR knows, saying which), updates accepted\n"
    "      and dropped, the last task, device, and an upload waiting to be resent.\n"
    "      Only reads DIR, so it runs beside 'run'\n"
    "  rotate-key [--dir DIR] [--give-up-after D] [--retries N]\n"
    "      move the joined peer to a new key (the request is signed with the old\n"
    "      one); the new key replaces DIR/peer.key once the coordinator has it.\n"
    "      Restart a running 'run' afterwards. Print the new public key\n"
    "  device [--device D]\n"
    "      print the device 'run --device D' would train on, and why; exit 1 when\n"
    "      D is cuda and no GPU is usable\n"
    "  run [--dir DIR] [--device D] [--gpu-mem MIB] [--threads N] [--priority P]\n"
    "      [--max-tasks N] [--wait S] [--give-up-after D] [--retries N]\n"
    "      [--step-delay MS] [--slowdown F]\n"
    "      [--max-upload-rate R] [--max-download-rate R] [--overlap] [--log-format F]\n"
    "      [--data IMAGES [--labels FILE] [--partition i/N [--beta B]]]\n"
    "      lease tasks, train, upload updates until the run finishes, N tasks\n"
    "      are done, or SIGINT/SIGTERM. Keeps the optimizer state and residual\n"
    "      in DIR/trainer.st and records each upload in DIR/pending.st before\n"
    "      sending it, so a killed peer started again resumes by itself. On a\n"
    "      terminal a status line below the log shows the task, step, loss,\n"
    "      speed, device, upload and the bytes compression saved\n"
    "\n"
    "options:\n"
    "  --dir DIR        the peer's directory (key and state). keygen, join,\n"
    "                   rotate-key and run hold DIR/peer.lock while they work; a\n"
    "                   second of them on DIR exits 1 naming the process that has\n"
    "                   it. status only reads and runs beside them\n"
    "  --force          replace an existing key (keygen)\n"
    "  --coordinator U  coordinator origin, https only\n"
    "  --token T        join token (visible to other local users; prefer --token-file)\n"
    "  --token-file F   read the join token from the first line of F\n"
    "  --cacert FILE    trust this PEM certificate (a self-signed coordinator)\n"
    "  --name NAME      display name sent at join (default: host name)\n"
    "  --device D       auto, cpu or cuda (default auto: a GPU when one is usable,\n"
    "                   else the CPU; the log says which and why)\n"
    "  --gpu-mem MIB    hold at most MIB MiB of GPU memory for the model, its\n"
    "                   optimizer and compression (default: no cap). Past it a\n"
    "                   task fails as on a full card: under auto the peer moves\n"
    "                   to the CPU, under cuda the task fails\n"
    "  --threads N      training threads (default: the CPUs this process may run\n"
    "                   on: its affinity mask, capped by a cgroup CPU limit)\n"
    "  --priority P     low, idle or normal (default low). low: nice 19, so any\n"
    "                   other program gets a shared core first; idle: SCHED_IDLE,\n"
    "                   train only on CPU time nothing else wants, even niced\n"
    "                   programs; normal: keep the priority it was started with.\n"
    "                   The log says what was applied. OpenMP threads always wait\n"
    "                   passively (volley-peer sets OMP_WAIT_POLICY=passive and\n"
    "                   OPENBLAS_NUM_THREADS=1 unless they are set, and restarts\n"
    "                   itself once so the libraries read them)\n"
    "  --max-tasks N    stop after N tasks (default: no limit)\n"
    "  --wait S         long-poll seconds for a task, 0..60 (default 20)\n"
    "  --give-up-after D  while the coordinator is out of reach (or keeps\n"
    "                   answering 5xx/429) a request is tried again with jittered\n"
    "                   backoff of up to 5 min between tries, for ever by default;\n"
    "                   D (30s, 10m, 2h; 0: never, the default) stops it that long\n"
    "                   after the first failure, with exit status 4. Said once when\n"
    "                   it begins and once when the coordinator answers again\n"
    "  --retries N      instead (or as well), give up after N attempts per\n"
    "                   request, 1..100, waiting at most 30 s between them\n"
    "  --step-delay MS  sleep MS milliseconds after every local training step,\n"
    "                   0..60000 (default 0): simulates a slow volunteer\n"
    "  --slowdown F     make every local step take F times as long, 1..100\n"
    "                   (default 1): after a step the peer sleeps F - 1 times\n"
    "                   what the step took, so it is F times slower than an\n"
    "                   identical peer on any machine\n"
    "  --max-upload-rate R, --max-download-rate R\n"
    "                   share the line: send or receive at most R bytes a second\n"
    "                   on average (k, M, G: thousands; 250k is 2 Mbit/s).\n"
    "                   Transfers of a megabyte or more log their progress\n"
    "  --overlap        in async runs, train the next task while the last update\n"
    "                   uploads (one upload at a time) instead of waiting for it:\n"
    "                   more of the processor's time on a slow uplink, at the\n"
    "                   price of staler updates (off by default)\n"
    "  --data IMAGES    train on this IDX images file (plain or .gz) of the peer's\n"
    "                   own, for runs whose data stay on the peers; nothing of it\n"
    "                   is sent to the coordinator\n"
    "  --labels FILE    its IDX labels (default: the images' name with\n"
    "                   -images-idx3- read as -labels-idx1-)\n"
    "  --partition i/N  train on part i (0-based) of N of --data, the same cut\n"
    "                   on every peer given the same data and seed\n"
    "  --beta B         label skew of the parts: class shares drawn from\n"
    "                   Dirichlet(B) (0.1: a few classes per part; default IID)\n"
    "  --partition-seed S  seed of the cut (default 20240520); peers of one\n"
    "                   federation must agree on it\n"
    "  --log-format F   text or json (default text): json writes each log line and\n"
    "                   event (task_start, task_end, coordinator_unreachable, ...)\n"
    "                   as one JSON object a line, for log collectors; no status\n"
    "                   line then\n"
    "  -v, --verbose    debug logging\n"
    "\n"
    "exit status: 0 done (also: run finished, stopped by a signal), 1 failure,\n"
    "2 usage, 3 refused by the coordinator, 4 coordinator unreachable (only past\n"
    "--give-up-after or --retries: by default the peer waits for it)\n";

static const char HINT[] = "see '" PROG " --help'";

_Static_assert(PEER_EXIT_USAGE == VL_OPTS_EXIT_USAGE, "one exit status for bad usage");

/* What the commands' options fill in; each command's table names the
 * fields it takes, and its variables' values beforehand are the defaults. */
typedef struct args {
    const char *dir, *coordinator, *token, *token_file, *cacert, *name;
    int force, verbose, overlap;
    peer_device_want device;
    peer_guest_priority priority; /* the zero value is the default, low */
    int priority_given;
    peer_log_format log_format; /* the zero value is the default, text */
    int64_t threads, max_tasks, wait_s, retries, step_delay_ms, slowdown, gpu_mem_mib;
    const char *data, *labels, *partition;
    double beta;
    int64_t partition_seed;
    int64_t max_up, max_down;
    double give_up_s;
} args;

/* Every command takes --dir and -v/--verbose besides its own options. */
#define COMMON_OPTS(a) \
    vl_opt_str("dir", &(a)->dir), vl_opt_letter(vl_opt_flag("verbose", &(a)->verbose), 'v')
#define COMMAND_OPTS(command, table) \
    { .prog = (command), .hint = HINT, .usage = USAGE, .opt = (table), .n = VL_OPTS_COUNT(table) }

/* Parses a command's options (argv[0] is the command's word) and applies
 * --verbose; returns vl_opts_parse's answer. */
static int parse(vl_opts *o, int argc, char **argv, const args *a) {
    int rc = vl_opts_parse(o, argc, argv, NULL);
    if (rc == VL_OK && a->verbose) vl_log_set_level(LOG_DEBUG);
    return rc;
}

static int usage_error(const char *fmt, ...) VL_PRINTF(1, 2);
static int usage_error(const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, PROG ": %s (%s)\n", msg, HINT);
    return PEER_EXIT_USAGE;
}

/* What --device and the rate options take, for messages. */
#define DEVICES "auto, cpu or cuda"
#define RATES "bytes per second from 1k to 100G (e.g. 250k)"

/* The values parsed by the peer's own parsers, for the option layer. */
static int opt_device(const char *s, void *dst) {
    return peer_device_parse(s, dst);
}
static int opt_priority(const char *s, void *dst) {
    return peer_guest_priority_parse(s, dst);
}
static int opt_log_format(const char *s, void *dst) {
    return peer_log_format_parse(s, dst);
}

/* --give-up-after into a double of seconds. */
static int opt_duration(const char *s, void *dst) {
    return peer_duration_parse(s, dst);
}
#define DURATIONS "seconds, or a number with s, m or h (0: never)"

/* A rate in bytes per second into an int64_t: digits with an optional k,
 * M or G (thousands), at least 1 kB/s (below that no transfer of a model
 * ends) and at most 100 GB/s. */
static int opt_rate(const char *s, void *dst) {
    char digits[32];
    size_t n = strlen(s);
    int64_t mult = 1;
    if (n > 0 && n < sizeof digits) {
        char last = s[n - 1];
        if (last == 'k' || last == 'K')
            mult = 1000, n--;
        else if (last == 'M')
            mult = 1000000, n--;
        else if (last == 'G')
            mult = 1000000000, n--;
    }
    int64_t v;
    if (n > 0 && n < sizeof digits) {
        memcpy(digits, s, n);
        digits[n] = '\0';
        if (vl_parse_i64(digits, 1, INT64_MAX / 1000000000, &v) == VL_OK && v * mult >= 1000 &&
            v * mult <= 100000000000LL) {
            *(int64_t *)dst = v * mult;
            return VL_OK;
        }
    }
    return VL_EINVAL;
}

/* The line that ends a failed command. The status line goes first; with
 * --log-format json the line is an event like the rest. A refusal or an
 * unreachable coordinator ends `run` for good (a service manager may
 * start it again), which the line says. */
static int fail(const vl_error *e, int rc) {
    peer_ui_stop();
    const char *msg = e->msg[0] ? e->msg : vl_strerror(rc);
    const char *then = rc == PEER_EREFUSED || rc == PEER_ENETWORK ? "; stopping" : "";
    int status = peer_exit_status(rc);
    if (peer_ui_format() == PEER_LOG_JSON) {
        peer_ui_field f[] = {PEER_UI_INT("status", status)};
        peer_ui_event(LOG_ERROR, "exit", f, PEER_UI_NFIELDS(f), "%s%s", msg, then);
    } else {
        fprintf(stderr, PROG ": %s%s\n", msg, then);
    }
    return status;
}

static int resolve_dir(const args *a, char *dir, size_t cap, vl_error *e) {
    if (a->dir && *a->dir) {
        int n = snprintf(dir, cap, "%s", a->dir);
        if (n < 0 || (size_t)n >= cap) return vl_fail(e, VL_ETOOBIG, "--dir is too long");
        return VL_OK;
    }
    return peer_dir_default(dir, cap, e);
}

/* Locks dir for the command that writes it (peer/dirlock.h). The lock is
 * held until the process exits, which releases it. */
static int lock_dir(const char *dir, const char *command, vl_error *e) {
    int fd;
    return peer_dir_lock(dir, command, &fd, e);
}

static int cmd_keygen(int argc, char **argv) {
    args parsed = {0}, *a = &parsed;
    vl_opt t[] = {COMMON_OPTS(a), vl_opt_flag("force", &a->force)};
    vl_opts cl = COMMAND_OPTS(PROG " keygen", t);
    int rc = parse(&cl, argc, argv, a);
    if (rc) return vl_opts_status(rc);
    vl_error e = {0};
    char dir[PEER_PATH_MAX], pk[VCRYPTO_PK_B64_LEN + 1];
    if ((rc = resolve_dir(a, dir, sizeof dir, &e))) return fail(&e, rc);
    if (vcrypto_init() != VL_OK) {
        vl_fail(&e, VL_ERR, "libsodium failed to initialise");
        return fail(&e, VL_ERR);
    }
    if ((rc = peer_dir_create(dir, &e)) || (rc = lock_dir(dir, PROG " keygen", &e)))
        return fail(&e, rc);
    if ((rc = peer_keygen(dir, a->force, pk, &e))) return fail(&e, rc);
    printf("%s\n", pk);
    return PEER_EXIT_OK;
}

/* Reads the first line of a token file, so the secret never appears in
 * the process list. */
static int read_token(const char *path, char *out, size_t cap, vl_error *e) {
    vl_buf b;
    vl_buf_init(&b, 4096);
    int rc = vl_buf_read_file(&b, path, e);
    if (!rc) {
        size_t n = strcspn((const char *)b.data, "\r\n");
        if (n == 0 || n >= cap)
            rc = vl_fail(e, VL_EINVAL, "%s: no token on its first line", path);
        else {
            memcpy(out, b.data, n);
            out[n] = '\0';
        }
    }
    if (b.data) memset(b.data, 0, b.len);
    vl_buf_free(&b);
    return rc;
}

static int cmd_join(int argc, char **argv) {
    args parsed = {0}, *a = &parsed;
    vl_opt t[] = {COMMON_OPTS(a),
                  vl_opt_required(vl_opt_str("coordinator", &a->coordinator)),
                  vl_opt_str("token", &a->token),
                  vl_opt_str("token-file", &a->token_file),
                  vl_opt_str("cacert", &a->cacert),
                  vl_opt_str("name", &a->name),
                  vl_opt_int("retries", &a->retries, 1, 100),
                  vl_opt_custom("give-up-after", opt_duration, &a->give_up_s, DURATIONS)};
    vl_opts cl = COMMAND_OPTS(PROG " join", t);
    int rc = parse(&cl, argc, argv, a);
    if (rc) return vl_opts_status(rc);
    if (!a->token == !a->token_file)
        return vl_opts_status(vl_opts_fail(&cl, "give one of --token, --token-file"));
    vl_error e = {0};
    char dir[PEER_PATH_MAX], token[600];
    if ((rc = resolve_dir(a, dir, sizeof dir, &e))) return fail(&e, rc);
    if ((rc = lock_dir(dir, PROG " join", &e))) return fail(&e, rc);
    if (a->token_file && (rc = read_token(a->token_file, token, sizeof token, &e)))
        return fail(&e, rc);
    peer_join_opts o = {.dir = dir,
                        .coordinator = a->coordinator,
                        .token = a->token ? a->token : token,
                        .cacert = a->cacert,
                        .name = a->name,
                        .retries = (int)a->retries,
                        .give_up_s = a->give_up_s};
    peer_state st;
    rc = peer_join(&o, &st, &e);
    memset(token, 0, sizeof token);
    if (rc) return fail(&e, rc);
    vl_log_info("joined %s as peer %lld (run '%s')", st.coordinator, (long long)st.peer_id, st.run);
    printf("%lld\n", (long long)st.peer_id);
    return PEER_EXIT_OK;
}

static int cmd_rotate_key(int argc, char **argv) {
    args parsed = {0}, *a = &parsed;
    vl_opt t[] = {COMMON_OPTS(a), vl_opt_int("retries", &a->retries, 1, 100),
                  vl_opt_custom("give-up-after", opt_duration, &a->give_up_s, DURATIONS)};
    vl_opts cl = COMMAND_OPTS(PROG " rotate-key", t);
    int rc = parse(&cl, argc, argv, a);
    if (rc) return vl_opts_status(rc);
    vl_error e = {0};
    char dir[PEER_PATH_MAX], pk[VCRYPTO_PK_B64_LEN + 1];
    if ((rc = resolve_dir(a, dir, sizeof dir, &e))) return fail(&e, rc);
    if ((rc = lock_dir(dir, PROG " rotate-key", &e))) return fail(&e, rc);
    if ((rc = peer_rotate_key(dir, (int)a->retries, a->give_up_s, pk, &e))) return fail(&e, rc);
    printf("%s\n", pk);
    return PEER_EXIT_OK;
}

static int cmd_status(int argc, char **argv) {
    args parsed = {0}, *a = &parsed;
    int offline = 0;
    vl_opt t[] = {COMMON_OPTS(a), vl_opt_flag("offline", &offline)};
    vl_opts cl = COMMAND_OPTS(PROG " status", t);
    int rc = parse(&cl, argc, argv, a);
    if (rc) return vl_opts_status(rc);
    vl_error e = {0};
    char dir[PEER_PATH_MAX];
    if ((rc = resolve_dir(a, dir, sizeof dir, &e))) return fail(&e, rc);
    if ((rc = peer_status_print(dir, !offline, stdout, &e))) return fail(&e, rc);
    return PEER_EXIT_OK;
}

static void on_signal(int sig) {
    (void)sig;
    peer_stop_request();
}

static int cmd_device(int argc, char **argv) {
    args parsed = {0}, *a = &parsed;
    vl_opt t[] = {COMMON_OPTS(a), vl_opt_custom("device", opt_device, &a->device, DEVICES)};
    vl_opts cl = COMMAND_OPTS(PROG " device", t);
    int rc = parse(&cl, argc, argv, a);
    if (rc) return vl_opts_status(rc);
    peer_device d;
    vl_error e = {0};
    if ((rc = peer_device_choose(a->device, &d, &e))) return fail(&e, rc);
    printf("%s\n", d.desc);
    return PEER_EXIT_OK;
}

/* Lowers the priority and logs what run will be as a guest: priority,
 * waits and threads. Returns the thread count to train with, or a
 * negative code when a priority the user asked for could not be applied:
 * an owner who said --priority idle relies on it, whereas the default is
 * best effort, so its failure is only a warning. */
static int guest_setup(const args *a, vl_error *e) {
    char line[512];
    int rc = peer_guest_priority_apply(a->priority, line, sizeof line, e);
    if (rc && a->priority_given) return rc;
    if (rc)
        vl_log_warn("%s; going on at the priority it had", e->msg);
    else
        vl_log_info("%s", line);
    peer_guest_waits_describe(line, sizeof line);
    vl_log_info("%s", line);
    peer_guest_cpus cpus;
    peer_guest_cpus_detect(&cpus);
    peer_guest_threads_describe(&cpus, (int)a->threads, line, sizeof line);
    vl_log_info("training with %s", line);
    return a->threads > 0 ? (int)a->threads : cpus.threads;
}

/* argv[0] is "run"; whole_argv, the program's own, restarts it. */
static int cmd_run(int argc, char **argv, char **whole_argv) {
    args parsed = {.wait_s = 20, .partition_seed = PEER_PARTITION_SEED}, *a = &parsed;
    vl_opt t[] = {
        COMMON_OPTS(a),
        vl_opt_custom("device", opt_device, &a->device, DEVICES),
        vl_opt_int("gpu-mem", &a->gpu_mem_mib, 1, INT64_C(1) << 30),
        vl_opt_int("threads", &a->threads, 1, 1024),
        vl_opt_custom("priority", opt_priority, &a->priority, "low, idle or normal"),
        vl_opt_int("max-tasks", &a->max_tasks, 1, INT64_MAX),
        vl_opt_int("wait", &a->wait_s, 0, 60),
        vl_opt_int("retries", &a->retries, 1, 100),
        vl_opt_custom("give-up-after", opt_duration, &a->give_up_s, DURATIONS),
        vl_opt_int("step-delay", &a->step_delay_ms, 0, 60000),
        vl_opt_int("slowdown", &a->slowdown, 1, 100),
        vl_opt_custom("max-upload-rate", opt_rate, &a->max_up, RATES),
        vl_opt_custom("max-download-rate", opt_rate, &a->max_down, RATES),
        vl_opt_flag("overlap", &a->overlap),
        vl_opt_custom("log-format", opt_log_format, &a->log_format, "text or json"),
        vl_opt_str("data", &a->data),
        vl_opt_str("labels", &a->labels),
        vl_opt_str("partition", &a->partition),
        vl_opt_f64_above("beta", &a->beta, 0, 1e6),
        vl_opt_int("partition-seed", &a->partition_seed, 0, INT64_MAX),
    };
    vl_opts cl = COMMAND_OPTS(PROG " run", t);
    int rc = parse(&cl, argc, argv, a);
    if (rc) return vl_opts_status(rc);
    a->priority_given = vl_opts_given(&cl, "priority");
    /* Before the first line: every line of run has its format. */
    peer_ui_start(a->log_format, isatty(STDERR_FILENO));
    vl_error e = {0};
    /* First, before any thread exists: on success this process is
     * replaced by one whose OpenMP and OpenBLAS read passive settings. */
    if (peer_guest_reexec(whole_argv, &e))
        vl_log_warn("%s; OpenMP threads will spin for a while in each wait", e.msg);
    memset(&e, 0, sizeof e);
    if (!a->data &&
        (a->labels || a->partition || a->beta > 0 || vl_opts_given(&cl, "partition-seed")))
        return vl_opts_status(
            vl_opts_fail(&cl, "--labels, --partition, --beta and --partition-seed go with --data"));
    if (a->beta > 0 && !a->partition)
        return vl_opts_status(
            vl_opts_fail(&cl, "--beta skews the labels of a --partition; give --partition i/N"));
    peer_local_opts local = {.images = a->data,
                             .labels = a->labels,
                             .part = 0,
                             .parts = 1,
                             .beta = a->beta,
                             .seed = (uint64_t)a->partition_seed};
    if (a->partition && peer_local_parse_part(a->partition, &local.part, &local.parts, &e))
        return vl_opts_status(vl_opts_fail(&cl, "%s", e.msg));
    char dir[PEER_PATH_MAX];
    if ((rc = resolve_dir(a, dir, sizeof dir, &e))) return fail(&e, rc);
    if ((rc = lock_dir(dir, PROG " run", &e))) return fail(&e, rc);
    int threads = guest_setup(a, &e);
    if (threads < 0) return fail(&e, threads);
    /* The first signal asks for a clean stop; SA_RESETHAND lets a second
     * one end a process stuck in a long step the hard way. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    peer_run_opts o = {.dir = dir,
                       .threads = threads,
                       .max_tasks = a->max_tasks,
                       .wait_s = (int)a->wait_s,
                       .retries = (int)a->retries,
                       .give_up_s = a->give_up_s,
                       .step_delay_ms = (int)a->step_delay_ms,
                       .slowdown = (int)a->slowdown,
                       .device = a->device,
                       .gpu_mem_mib = a->gpu_mem_mib,
                       .local = a->data ? &local : NULL,
                       .max_upload_bps = a->max_up,
                       .max_download_bps = a->max_down,
                       .overlap = a->overlap};
    rc = peer_run(&o, &e);
    if (rc) return fail(&e, rc);
    peer_ui_stop();
    return PEER_EXIT_OK;
}

int main(int argc, char **argv) {
    vl_log_set_program(PROG);
    if (argc < 2) {
        fputs(USAGE, stderr);
        return PEER_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(USAGE, stdout);
        return PEER_EXIT_OK;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
#if defined(VOLLEY_CUDA_ARCHS)
        vl_version_print(stdout, PROG, VOLLEY_CUDA_ARCHS);
#else
        vl_version_print(stdout, PROG, NULL);
#endif
        return PEER_EXIT_OK;
    }
    /* Each command parses its own options, argv[0] being its word. */
    int n = argc - 1;
    char **args_ = argv + 1;
    if (!strcmp(cmd, "keygen")) return cmd_keygen(n, args_);
    if (!strcmp(cmd, "join")) return cmd_join(n, args_);
    if (!strcmp(cmd, "run")) return cmd_run(n, args_, argv);
    if (!strcmp(cmd, "device")) return cmd_device(n, args_);
    if (!strcmp(cmd, "status")) return cmd_status(n, args_);
    if (!strcmp(cmd, "rotate-key")) return cmd_rotate_key(n, args_);
    return usage_error("unknown command '%s'", cmd);
}
