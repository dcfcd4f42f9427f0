/* volley-peer: command-line entry point. Parses arguments, makes `run` a
 * good guest on a shared machine (peer/guest.h: priority, passive waits,
 * the default thread count), installs the signal handlers that let a run
 * stop between steps, and turns every failure into one line on stderr and
 * a stable exit status (peer.h). */
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer/guest.h"
#include "peer/local.h"
#include "peer/peer.h"
#include "peer/progress.h"

#define PROG "volley-peer"

static const char USAGE[] =
    "usage: volley-peer <command> [options]\n"
    "\n"
    "commands:\n"
    "  keygen [--dir DIR] [--force]\n"
    "      create DIR (default $HOME/.volley, mode 0700) and the Ed25519 key\n"
    "      DIR/peer.key (mode 0600); print the public key\n"
    "  join --coordinator https://HOST:PORT (--token T | --token-file FILE)\n"
    "       [--cacert FILE] [--name NAME] [--dir DIR] [--retries N]\n"
    "      register the key with a join token; write DIR/peer.json; print the peer id\n"
    "  status [--dir DIR]\n"
    "      what this peer knows of itself: id, coordinator, run, updates accepted\n"
    "      and dropped, the last task, device, and an upload waiting to be resent\n"
    "  rotate-key [--dir DIR] [--retries N]\n"
    "      move the joined peer to a new key (the request is signed with the old\n"
    "      one); the new key replaces DIR/peer.key once the coordinator has it.\n"
    "      Restart a running 'run' afterwards. Print the new public key\n"
    "  device [--device D]\n"
    "      print the device 'run --device D' would train on, and why; exit 1 when\n"
    "      D is cuda and no GPU is usable\n"
    "  run [--dir DIR] [--device D] [--gpu-mem MIB] [--threads N] [--priority P]\n"
    "      [--max-tasks N] [--wait S] [--retries N] [--step-delay MS] [--slowdown F]\n"
    "      [--max-upload-rate R] [--max-download-rate R] [--overlap]\n"
    "      [--data IMAGES [--labels FILE] [--partition i/N [--beta B]]]\n"
    "      lease tasks, train, upload updates until the run finishes, N tasks\n"
    "      are done, or SIGINT/SIGTERM. Keeps the optimizer state and residual\n"
    "      in DIR/trainer.st and records each upload in DIR/pending.st before\n"
    "      sending it, so a killed peer started again resumes by itself\n"
    "\n"
    "options:\n"
    "  --dir DIR        the peer's directory (key and state)\n"
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
    "  --retries N      attempts per request, 1..100 (default 8)\n"
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
    "  -v, --verbose    debug logging\n"
    "\n"
    "exit status: 0 done (also: run finished, stopped by a signal), 1 failure,\n"
    "2 usage, 3 refused by the coordinator, 4 coordinator unreachable\n";

enum { OPT_DIR = 1, OPT_FORCE, OPT_COORD, OPT_TOKEN, OPT_TOKEN_FILE, OPT_CACERT, OPT_NAME,
       OPT_THREADS, OPT_MAX_TASKS, OPT_WAIT, OPT_RETRIES, OPT_STEP_DELAY, OPT_SLOWDOWN, OPT_VERBOSE,
       OPT_DEVICE, OPT_GPU_MEM, OPT_DATA, OPT_LABELS, OPT_PARTITION, OPT_BETA,
       OPT_PARTITION_SEED, OPT_MAX_UP, OPT_MAX_DOWN, OPT_OVERLAP,
       OPT_PRIORITY, OPT_HELP };

static const struct option OPTIONS[] = {
    {"dir", required_argument, NULL, OPT_DIR},
    {"force", no_argument, NULL, OPT_FORCE},
    {"coordinator", required_argument, NULL, OPT_COORD},
    {"token", required_argument, NULL, OPT_TOKEN},
    {"token-file", required_argument, NULL, OPT_TOKEN_FILE},
    {"cacert", required_argument, NULL, OPT_CACERT},
    {"name", required_argument, NULL, OPT_NAME},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"max-tasks", required_argument, NULL, OPT_MAX_TASKS},
    {"wait", required_argument, NULL, OPT_WAIT},
    {"retries", required_argument, NULL, OPT_RETRIES},
    {"step-delay", required_argument, NULL, OPT_STEP_DELAY},
    {"slowdown", required_argument, NULL, OPT_SLOWDOWN},
    {"verbose", no_argument, NULL, OPT_VERBOSE},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"gpu-mem", required_argument, NULL, OPT_GPU_MEM},
    {"data", required_argument, NULL, OPT_DATA},
    {"labels", required_argument, NULL, OPT_LABELS},
    {"partition", required_argument, NULL, OPT_PARTITION},
    {"beta", required_argument, NULL, OPT_BETA},
    {"partition-seed", required_argument, NULL, OPT_PARTITION_SEED},
    {"max-upload-rate", required_argument, NULL, OPT_MAX_UP},
    {"max-download-rate", required_argument, NULL, OPT_MAX_DOWN},
    {"overlap", no_argument, NULL, OPT_OVERLAP},
    {"priority", required_argument, NULL, OPT_PRIORITY},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

typedef struct args {
    const char *dir, *coordinator, *token, *token_file, *cacert, *name;
    int force, verbose, overlap;
    peer_device_want device;
    peer_guest_priority priority; /* the zero value is the default, low */
    int64_t threads, max_tasks, wait_s, retries, step_delay_ms, slowdown, gpu_mem_mib;
    const char *data, *labels, *partition;
    double beta;
    int64_t partition_seed;
    int64_t max_up, max_down;
    unsigned seen; /* bit per OPT_* given, to refuse options a command ignores */
} args;

static int usage_error(const char *fmt, ...) VL_PRINTF(1, 2);
static int usage_error(const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, PROG ": %s (see '" PROG " --help')\n", msg);
    return PEER_EXIT_USAGE;
}

static int number(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out) {
    if (parse_i64(s, min, max, out) == VL_OK) return 0;
    fprintf(stderr, PROG ": %s needs an integer in [%lld, %lld], got '%s'\n", opt,
            (long long)min, (long long)max, s);
    return PEER_EXIT_USAGE;
}

/* A rate in bytes per second: digits with an optional k, M or G
 * (thousands), at least 1 kB/s (below that no transfer of a model ends)
 * and at most 100 GB/s. */
static int rate(const char *opt, const char *s, int64_t *out) {
    char digits[32];
    size_t n = strlen(s);
    int64_t mult = 1;
    if (n > 0 && n < sizeof digits) {
        char last = s[n - 1];
        if (last == 'k' || last == 'K') mult = 1000, n--;
        else if (last == 'M') mult = 1000000, n--;
        else if (last == 'G') mult = 1000000000, n--;
    }
    int64_t v;
    if (n > 0 && n < sizeof digits) {
        memcpy(digits, s, n);
        digits[n] = '\0';
        if (parse_i64(digits, 1, INT64_MAX / 1000000000, &v) == VL_OK && v * mult >= 1000 &&
            v * mult <= 100000000000LL) {
            *out = v * mult;
            return 0;
        }
    }
    fprintf(stderr, PROG ": %s needs bytes per second from 1k to 100G (e.g. 250k), got '%s'\n",
            opt, s);
    return PEER_EXIT_USAGE;
}

static int parse_args(int argc, char **argv, args *a) {
    memset(a, 0, sizeof *a);
    a->wait_s = 20;
    a->partition_seed = PEER_PARTITION_SEED;
    opterr = 0;
    optind = 1;
    int c, rc = 0;
    while ((c = getopt_long(argc, argv, ":v", OPTIONS, NULL)) != -1 && !rc) {
        if (c == 'v') c = OPT_VERBOSE;
        if (c > 0 && c <= OPT_HELP) a->seen |= 1u << c;
        switch (c) {
        case OPT_DIR: a->dir = optarg; break;
        case OPT_FORCE: a->force = 1; break;
        case OPT_COORD: a->coordinator = optarg; break;
        case OPT_TOKEN: a->token = optarg; break;
        case OPT_TOKEN_FILE: a->token_file = optarg; break;
        case OPT_CACERT: a->cacert = optarg; break;
        case OPT_NAME: a->name = optarg; break;
        case OPT_THREADS: rc = number("--threads", optarg, 1, 1024, &a->threads); break;
        case OPT_MAX_TASKS: rc = number("--max-tasks", optarg, 1, INT64_MAX, &a->max_tasks); break;
        case OPT_WAIT: rc = number("--wait", optarg, 0, 60, &a->wait_s); break;
        case OPT_RETRIES: rc = number("--retries", optarg, 1, 100, &a->retries); break;
        case OPT_STEP_DELAY:
            rc = number("--step-delay", optarg, 0, 60000, &a->step_delay_ms);
            break;
        case OPT_SLOWDOWN: rc = number("--slowdown", optarg, 1, 100, &a->slowdown); break;
        case OPT_MAX_UP: rc = rate("--max-upload-rate", optarg, &a->max_up); break;
        case OPT_MAX_DOWN: rc = rate("--max-download-rate", optarg, &a->max_down); break;
        case OPT_OVERLAP: a->overlap = 1; break;
        case OPT_GPU_MEM:
            rc = number("--gpu-mem", optarg, 1, INT64_C(1) << 30, &a->gpu_mem_mib);
            break;
        case OPT_VERBOSE: a->verbose = 1; break;
        case OPT_DATA: a->data = optarg; break;
        case OPT_LABELS: a->labels = optarg; break;
        case OPT_PARTITION: a->partition = optarg; break;
        case OPT_BETA:
            if (parse_f64(optarg, &a->beta) != VL_OK || !(a->beta > 0) || a->beta > 1e6)
                return usage_error("--beta must be a number in (0, 1e6], not '%s'", optarg);
            break;
        case OPT_PARTITION_SEED:
            rc = number("--partition-seed", optarg, 0, INT64_MAX, &a->partition_seed);
            break;
        case OPT_DEVICE:
            if (peer_device_parse(optarg, &a->device) != VL_OK)
                return usage_error("--device is auto, cpu or cuda, not '%s'", optarg);
            break;
        case OPT_PRIORITY:
            if (peer_guest_priority_parse(optarg, &a->priority) != VL_OK)
                return usage_error("--priority is low, idle or normal, not '%s'", optarg);
            break;
        case OPT_HELP: fputs(USAGE, stdout); exit(PEER_EXIT_OK);
        case ':':
            return usage_error("option %s needs a value", argv[optind - 1]);
        default:
            return usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (rc) return rc;
    if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
    return 0;
}

/* Refuses options that the command would silently ignore. */
static int only(const args *a, const char *cmd, unsigned allowed) {
    allowed |= 1u << OPT_DIR | 1u << OPT_VERBOSE | 1u << OPT_HELP;
    for (int o = 1; o <= OPT_HELP; o++) {
        if ((a->seen & (1u << o)) && !(allowed & (1u << o))) {
            fprintf(stderr, PROG ": %s does not take --%s\n", cmd, OPTIONS[o - 1].name);
            return PEER_EXIT_USAGE;
        }
    }
    return 0;
}

static int fail(const vl_error *e, int rc) {
    fprintf(stderr, PROG ": %s\n", e->msg[0] ? e->msg : vl_strerror(rc));
    return peer_exit_status(rc);
}

static int resolve_dir(const args *a, char *dir, size_t cap, vl_error *e) {
    if (a->dir && *a->dir) {
        int n = snprintf(dir, cap, "%s", a->dir);
        if (n < 0 || (size_t)n >= cap) return vl_fail(e, VL_ETOOBIG, "--dir is too long");
        return VL_OK;
    }
    return peer_dir_default(dir, cap, e);
}

static int cmd_keygen(const args *a) {
    int rc = only(a, "keygen", 1u << OPT_FORCE);
    if (rc) return rc;
    vl_error e = {0};
    char dir[PEER_PATH_MAX], pk[CRYPTO_PK_B64_LEN + 1];
    if ((rc = resolve_dir(a, dir, sizeof dir, &e))) return fail(&e, rc);
    if (crypto_init() != VL_OK) {
        vl_fail(&e, VL_ERR, "libsodium failed to initialise");
        return fail(&e, VL_ERR);
    }
    if ((rc = peer_keygen(dir, a->force, pk, &e))) return fail(&e, rc);
    printf("%s\n", pk);
    return PEER_EXIT_OK;
}

/* Reads the first line of a token file, so the secret never appears in
 * the process list. */
static int read_token(const char *path, char *out, size_t cap, vl_error *e) {
    buf b;
    buf_init(&b, 4096);
    int rc = buf_read_file(&b, path, e);
    if (!rc) {
        size_t n = strcspn((const char *)b.data, "\r\n");
        if (n == 0 || n >= cap) rc = vl_fail(e, VL_EINVAL, "%s: no token on its first line", path);
        else {
            memcpy(out, b.data, n);
            out[n] = '\0';
        }
    }
    if (b.data) memset(b.data, 0, b.len);
    buf_free(&b);
    return rc;
}

static int cmd_join(const args *a) {
    int rc = only(a, "join", 1u << OPT_COORD | 1u << OPT_TOKEN | 1u << OPT_TOKEN_FILE |
                                 1u << OPT_CACERT | 1u << OPT_NAME | 1u << OPT_RETRIES);
    if (rc) return rc;
    if (!a->coordinator) return usage_error("join needs --coordinator");
    if (!a->token == !a->token_file) return usage_error("join needs one of --token, --token-file");
    vl_error e = {0};
    char dir[PEER_PATH_MAX], token[600];
    if ((rc = resolve_dir(a, dir, sizeof dir, &e))) return fail(&e, rc);
    if (a->token_file && (rc = read_token(a->token_file, token, sizeof token, &e)))
        return fail(&e, rc);
    peer_join_opts o = {.dir = dir, .coordinator = a->coordinator,
                        .token = a->token ? a->token : token, .cacert = a->cacert,
                        .name = a->name, .retries = (int)a->retries};
    peer_state st;
    rc = peer_join(&o, &st, &e);
    memset(token, 0, sizeof token);
    if (rc) return fail(&e, rc);
    log_info("joined %s as peer %lld (run '%s')", st.coordinator, (long long)st.peer_id, st.run);
    printf("%lld\n", (long long)st.peer_id);
    return PEER_EXIT_OK;
}

static int cmd_rotate_key(const args *a) {
    int rc = only(a, "rotate-key", 1u << OPT_RETRIES);
    if (rc) return rc;
    vl_error e = {0};
    char dir[PEER_PATH_MAX], pk[CRYPTO_PK_B64_LEN + 1];
    if ((rc = resolve_dir(a, dir, sizeof dir, &e))) return fail(&e, rc);
    if ((rc = peer_rotate_key(dir, (int)a->retries, pk, &e))) return fail(&e, rc);
    printf("%s\n", pk);
    return PEER_EXIT_OK;
}

static int cmd_status(const args *a) {
    int rc = only(a, "status", 0);
    if (rc) return rc;
    vl_error e = {0};
    char dir[PEER_PATH_MAX];
    if ((rc = resolve_dir(a, dir, sizeof dir, &e))) return fail(&e, rc);
    if ((rc = peer_status_print(dir, stdout, &e))) return fail(&e, rc);
    return PEER_EXIT_OK;
}

static void on_signal(int sig) {
    (void)sig;
    peer_stop_request();
}

static int cmd_device(const args *a) {
    int rc = only(a, "device", 1u << OPT_DEVICE);
    if (rc) return rc;
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
    if (rc && (a->seen & (1u << OPT_PRIORITY))) return rc;
    if (rc) log_warn("%s; going on at the priority it had", e->msg);
    else log_info("%s", line);
    peer_guest_waits_describe(line, sizeof line);
    log_info("%s", line);
    peer_guest_cpus cpus;
    peer_guest_cpus_detect(&cpus);
    peer_guest_threads_describe(&cpus, (int)a->threads, line, sizeof line);
    log_info("training with %s", line);
    return a->threads > 0 ? (int)a->threads : cpus.threads;
}

static int cmd_run(const args *a) {
    int rc = only(a, "run", 1u << OPT_THREADS | 1u << OPT_MAX_TASKS | 1u << OPT_WAIT |
                                1u << OPT_RETRIES | 1u << OPT_STEP_DELAY |
                                1u << OPT_SLOWDOWN | 1u << OPT_DEVICE |
                                1u << OPT_GPU_MEM | 1u << OPT_DATA | 1u << OPT_LABELS |
                                1u << OPT_PARTITION | 1u << OPT_BETA |
                                1u << OPT_PARTITION_SEED | 1u << OPT_MAX_UP |
                                1u << OPT_MAX_DOWN | 1u << OPT_OVERLAP |
                                1u << OPT_PRIORITY);
    if (rc) return rc;
    vl_error e = {0};
    if (!a->data && (a->labels || a->partition || a->beta > 0 ||
                     (a->seen & (1u << OPT_PARTITION_SEED))))
        return usage_error("--labels, --partition, --beta and --partition-seed go with --data");
    if (a->beta > 0 && !a->partition)
        return usage_error("--beta skews the labels of a --partition; give --partition i/N");
    peer_local_opts local = {.images = a->data, .labels = a->labels, .part = 0, .parts = 1,
                             .beta = a->beta, .seed = (uint64_t)a->partition_seed};
    if (a->partition && peer_local_parse_part(a->partition, &local.part, &local.parts, &e))
        return usage_error("%s", e.msg);
    char dir[PEER_PATH_MAX];
    if ((rc = resolve_dir(a, dir, sizeof dir, &e))) return fail(&e, rc);
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
    peer_run_opts o = {.dir = dir, .threads = threads, .max_tasks = a->max_tasks,
                       .wait_s = (int)a->wait_s, .retries = (int)a->retries,
                       .step_delay_ms = (int)a->step_delay_ms,
                       .slowdown = (int)a->slowdown, .device = a->device,
                       .gpu_mem_mib = a->gpu_mem_mib, .local = a->data ? &local : NULL,
                       .max_upload_bps = a->max_up, .max_download_bps = a->max_down,
                       .overlap = a->overlap};
    rc = peer_run(&o, &e);
    return rc ? fail(&e, rc) : PEER_EXIT_OK;
}

int main(int argc, char **argv) {
    log_set_program(PROG);
    if (argc < 2) {
        fputs(USAGE, stderr);
        return PEER_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(USAGE, stdout);
        return PEER_EXIT_OK;
    }
    args a;
    int rc = parse_args(argc - 1, argv + 1, &a);
    if (rc) return rc;
    if (a.verbose) log_set_level(LOG_DEBUG);
    if (!strcmp(cmd, "run")) {
        /* First, before any thread exists: on success this process is
         * replaced by one whose OpenMP and OpenBLAS read passive settings. */
        vl_error e = {0};
        if (peer_guest_reexec(argv, &e))
            log_warn("%s; OpenMP threads will spin for a while in each wait", e.msg);
    }
    if (!strcmp(cmd, "keygen")) return cmd_keygen(&a);
    if (!strcmp(cmd, "join")) return cmd_join(&a);
    if (!strcmp(cmd, "run")) return cmd_run(&a);
    if (!strcmp(cmd, "device")) return cmd_device(&a);
    if (!strcmp(cmd, "status")) return cmd_status(&a);
    if (!strcmp(cmd, "rotate-key")) return cmd_rotate_key(&a);
    return usage_error("unknown command '%s'", cmd);
}
