/* volley-coordinator: command-line entry point. */
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "coordinator/coord.h"
#include "common/version.h"
#include "coordinator/base/limiter.h"
#include "coordinator/cli/cli.h"
#include "coordinator/config/config.h"
#include "coordinator/conn/limits.h"
#include "coordinator/ops/status.h"
#include "coordinator/server.h"

#define PROG "volley-coordinator"

static const char USAGE[] =
    "usage: " PROG " COMMAND [OPTIONS]\n"
    "       " PROG " --version   (the version, the commit, and whether CUDA is compiled in)\n"
    "\n"
    "  init --db FILE --config FILE\n"
    "      create the run database from a run configuration (docs/protocol.md)\n"
    "  token create --db FILE [--uses N] [--ttl 7d|24h|30m|3600s]\n"
    "      print a new join token (default: 1 use, 7 days); only its hash is stored\n"
    "  token list --db FILE\n"
    "      every token: id, hash prefix, uses left, expiry, creation, peers, state\n"
    "  token revoke --db FILE --token ID\n"
    "      the token admits nobody from now on\n"
    "  peer list --db FILE\n"
    "      every peer: id, public key, joined, last seen, leases, updates, state\n"
    "  peer revoke --db FILE --peer ID\n"
    "      refuse every later request of a peer (403), also on a running server\n"
    "  export --db FILE [--version V] --out DIR [--force]\n"
    "      write version V (default: the current one) as DIR/model.safetensors and\n"
    "      DIR/config.json for transformers.GPT2LMHeadModel; --force exports into a\n"
    "      directory that is not empty\n"
    "  check --db FILE\n"
    "      after a crash, power cut or disk fault: SQLite's integrity_check, and every\n"
    "      update waiting for a merge read back and decoded; exits 1 when either fails\n"
    "  status --db FILE\n"
    "      the run's summary as GET /v1/status gives it (versions and losses, peers\n"
    "      by state, local steps and staleness), read from the database: for a\n"
    "      stopped coordinator or a copy of its database\n"
    "  check --config FILE\n"
    "      validate a run configuration and its data as init would, touching no\n"
    "      database, and print it with every default filled in (indented JSON),\n"
    "      the model's size, what an update of the run weighs, a line for each\n"
    "      value it normalised, and how long init will take to score version 0\n"
    "  sample --db FILE [--version V] --prompt TEXT [--tokens N] [--temperature T]\n"
    "         [--seed S]\n"
    "      print TEXT and N bytes (default 200, at most 4096) the model of version V\n"
    "      (default: the current one) continues it with, drawn at temperature T\n"
    "      (default 0.8; 0: the most likely byte each time) with seed S (default 1);\n"
    "      bytes other than printable ASCII, newline and tab (and backslash) print\n"
    "      as \\xNN. Byte-level models only\n"
    "  serve --db FILE --cert PEM --key PEM [--listen HOST:PORT] [--compute-threads N]\n"
    "        [--peer-rate R[:BURST]] [--addr-rate R[:BURST]] [--split-rate R[:BURST]]\n"
    "        [--slow-timeout S] [--min-body-rate BYTES] [--body-budget MIB]\n"
    "        [--max-conns N] [--conns-per-addr N] [--idle-first S] [--idle-keepalive S]\n"
    "        [--admin-listen HOST:PORT|off] [--admin-token-file FILE]\n"
    "      serve the run over HTTPS (default 127.0.0.1:8443; port 0 picks a free one\n"
    "      and the real one is printed as \"listening on HOST:PORT\" on stderr);\n"
    "      Prometheus metrics in plain HTTP at http://ADMIN/metrics and the live\n"
    "      dashboard at http://ADMIN/ (default 127.0.0.1:9464, skipped with a\n"
    "      warning when taken; off for none; any address but a loopback one needs\n"
    "      the token in FILE, 16 or more characters on its first line);\n"
    "      N OpenMP threads make each version (default: every core; 1 leaves more of\n"
    "      a small machine to the requests under heavy upload load).\n"
    "      Requests per second (and bursts) per peer (default 50:500) and per\n"
    "      client address, IPv6 per /64 (default 500:5000), and a split run's\n"
    "      batches per peer, in place of the peer's (default: 250/s per batch in\n"
    "      flight, twice that U-shaped, bursts of 10 s), 0 for no limit; a\n"
    "      request head must arrive within S seconds (default 30, 0 for no limit)\n"
    "      and a body within S + its length / BYTES per second (default 16384),\n"
    "      at that rate over every 10 s; signed bodies being received hold at most\n"
    "      MIB MiB together by what has arrived of them (default 256; beyond, 503\n"
    "      overloaded, and the slowest is cut off), one per peer. At most N\n"
    "      connections in all (default: the descriptor limit less 64), the admin\n"
    "      listener's 16 included; an idle connection (no request in progress) is\n"
    "      closed when its first head is not complete S seconds after it opened\n"
    "      (--idle-first, default 10), when kept alive S seconds with nothing in\n"
    "      progress (--idle-keepalive, default 30; both a tenth when over half the\n"
    "      connections are open), or when its address holds more than\n"
    "      --conns-per-addr idle connections (default 64)\n"
    "\n"
    "Environment: VOLLEY_LOG=debug|info|warn|error sets the log level.\n";

static const char HINT[] = "see '" PROG " help'";

/* The options of one command: its name in messages ("volley-coordinator
 * token create"), this program's hint and usage, and its table. */
#define COMMAND_OPTS(command, table) \
    { .prog = (command), .hint = HINT, .usage = USAGE, .opt = (table), .n = VL_OPTS_COUNT(table) }

static int usage_error(const char *fmt, ...) VL_PRINTF(1, 2);
static int usage_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, PROG ": %s (%s)\n", msg, HINT);
    return VL_OPTS_EXIT_USAGE;
}

static int fail(const vl_error *err) {
    fprintf(stderr, PROG ": %s\n", err->msg[0] ? err->msg : vl_strerror(err->code));
    return 1;
}

/* --ttl: a duration as the run configuration writes them, for the option layer. */
static int opt_duration(const char *s, void *dst) {
    return coord_parse_duration(s, dst);
}

/* "R" or "R:BURST", requests per second; 0 turns the limit off. A burst
 * left out is ten seconds' worth. dst is a coord_rate. */
static int opt_rate(const char *s, void *dst) {
    coord_rate *out = dst;
    char rate[32];
    const char *colon = strchr(s, ':');
    size_t n = colon ? (size_t)(colon - s) : strlen(s);
    if (n == 0 || n >= sizeof rate) return VL_EINVAL;
    memcpy(rate, s, n);
    rate[n] = '\0';
    int64_t r, b;
    if (vl_parse_i64(rate, 0, 1000000, &r) != VL_OK) return VL_EINVAL;
    if (colon) {
        if (vl_parse_i64(colon + 1, 1, 100000000, &b) != VL_OK) return VL_EINVAL;
    } else {
        b = r * 10 > 0 ? r * 10 : 1;
    }
    out->rate = (double)r;
    out->burst = (double)b;
    return VL_OK;
}

#define RATE_EXPECT "R or R:BURST in whole numbers (0: no limit)"

static int cmd_init(int argc, char **argv) {
    const char *db = NULL, *config = NULL;
    vl_opt t[] = {vl_opt_required(vl_opt_str("db", &db)),
                  vl_opt_required(vl_opt_str("config", &config))};
    vl_opts o = COMMAND_OPTS(PROG " init", t);
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    if (rc) return vl_opts_status(rc);
    vl_error err = {0};
    if (coord_cmd_init(db, config, &err) != VL_OK) return fail(&err);
    return 0;
}

static int cmd_token_create(int argc, char **argv) {
    const char *db = NULL;
    int64_t uses = 1, ttl = 7 * 86400;
    vl_opt t[] = {
        vl_opt_required(vl_opt_str("db", &db)), vl_opt_int("uses", &uses, 1, 1000000000),
        vl_opt_custom("ttl", opt_duration, &ttl, "a duration like 7d, 24h, 30m or 3600s")};
    vl_opts o = COMMAND_OPTS(PROG " token create", t);
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    if (rc) return vl_opts_status(rc);
    char token[VCRYPTO_TOKEN_LEN + 1];
    vl_error err = {0};
    if (coord_cmd_token_create(db, uses, ttl, token, &err) != VL_OK) return fail(&err);
    printf("%s\n", token);
    fflush(stdout);
    explicit_bzero(token, sizeof token);
    return 0;
}

static int cmd_check(int argc, char **argv) {
    const char *db = NULL, *config = NULL;
    vl_opt t[] = {vl_opt_str("db", &db), vl_opt_str("config", &config)};
    vl_opts o = COMMAND_OPTS(PROG " check", t);
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    if (rc) return vl_opts_status(rc);
    if (!db == !config) return vl_opts_status(vl_opts_fail(&o, "give one of --db and --config"));
    vl_error err = {0};
    if (config) {
        if (coord_cmd_check_config(config, stdout, &err) != VL_OK) return fail(&err);
        return 0;
    }
    int64_t problems = 0;
    if (coord_cmd_check(db, stdout, &problems, &err) != VL_OK) return fail(&err);
    fflush(stdout);
    return problems ? 1 : 0;
}

/* `NAME --db FILE`, shared by status and the lists of tokens and peers. */
static int cmd_db_only(int argc, char **argv, const char *name,
                       int (*run)(const char *, FILE *, vl_error *)) {
    const char *db = NULL;
    vl_opt t[] = {vl_opt_required(vl_opt_str("db", &db))};
    char prog[64];
    snprintf(prog, sizeof prog, PROG " %s", name);
    vl_opts o = COMMAND_OPTS(prog, t);
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    if (rc) return vl_opts_status(rc);
    vl_error err = {0};
    if (run(db, stdout, &err) != VL_OK) return fail(&err);
    fflush(stdout);
    return 0;
}

/* `revoke --db FILE --NAME ID`, shared by tokens and peers. */
static int cmd_revoke(int argc, char **argv, const char *name,
                      int (*revoke)(const char *, int64_t, vl_error *)) {
    const char *db = NULL;
    int64_t id = 0;
    vl_opt t[] = {vl_opt_required(vl_opt_str("db", &db)),
                  vl_opt_required(vl_opt_int(name, &id, 1, INT64_MAX))};
    char prog[64];
    snprintf(prog, sizeof prog, PROG " %s revoke", name);
    vl_opts o = COMMAND_OPTS(prog, t);
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    if (rc) return vl_opts_status(rc);
    vl_error err = {0};
    if (revoke(db, id, &err) != VL_OK) return fail(&err);
    fprintf(stderr, "%s %lld revoked\n", name, (long long)id);
    return 0;
}

/* argv[0] is "token", argv[1] the token command. */
static int cmd_token(int argc, char **argv) {
    const char *sub = argc > 1 ? argv[1] : "";
    if (!strcmp(sub, "create")) return cmd_token_create(argc - 1, argv + 1);
    if (!strcmp(sub, "list"))
        return cmd_db_only(argc - 1, argv + 1, "token list", coord_cmd_token_list);
    if (!strcmp(sub, "revoke"))
        return cmd_revoke(argc - 1, argv + 1, "token", coord_cmd_token_revoke);
    return usage_error("unknown token command '%s' (expected create, list or revoke)", sub);
}

static int cmd_peer(int argc, char **argv) {
    const char *sub = argc > 1 ? argv[1] : "";
    if (!strcmp(sub, "list"))
        return cmd_db_only(argc - 1, argv + 1, "peer list", coord_cmd_peer_list);
    if (!strcmp(sub, "revoke"))
        return cmd_revoke(argc - 1, argv + 1, "peer", coord_cmd_peer_revoke);
    return usage_error("unknown peer command '%s' (expected list or revoke)", sub);
}

static int cmd_export(int argc, char **argv) {
    const char *db = NULL, *out = NULL;
    int64_t version = -1;
    int force = 0;
    vl_opt t[] = {vl_opt_required(vl_opt_str("db", &db)),
                  vl_opt_int("version", &version, 0, INT64_MAX),
                  vl_opt_required(vl_opt_str("out", &out)), vl_opt_flag("force", &force)};
    vl_opts o = COMMAND_OPTS(PROG " export", t);
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    if (rc) return vl_opts_status(rc);
    vl_error err = {0};
    if (coord_cmd_export(db, version, out, force, NULL, &err) != VL_OK) return fail(&err);
    return 0;
}

static int cmd_sample(int argc, char **argv) {
    const char *db = NULL;
    int64_t version = -1, seed = 1;
    coord_sample_opts so = {.tokens = 200, .temperature = 0.8};
    vl_opt t[] = {vl_opt_required(vl_opt_str("db", &db)),
                  vl_opt_int("version", &version, 0, INT64_MAX),
                  vl_opt_required(vl_opt_str("prompt", &so.prompt)),
                  vl_opt_int("tokens", &so.tokens, 1, COORD_SAMPLE_MAX_TOKENS),
                  vl_opt_f64("temperature", &so.temperature, 0, COORD_SAMPLE_MAX_TEMP),
                  vl_opt_int("seed", &seed, 0, INT64_MAX)};
    vl_opts o = COMMAND_OPTS(PROG " sample", t);
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    if (rc) return vl_opts_status(rc);
    so.seed = (uint64_t)seed;
    vl_error err = {0};
    int64_t got = 0;
    double vloss = NAN;
    if (coord_cmd_sample(db, version, &so, stdout, &got, &vloss, &err) != VL_OK) return fail(&err);
    char loss[48] = "not scored"; /* a version served on its loss check and skipped */
    if (isfinite(vloss)) snprintf(loss, sizeof loss, "%.4f", vloss);
    fprintf(stderr, PROG ": version %lld (validation loss %s), temperature %g, seed %lld\n",
            (long long)got, loss, so.temperature, (long long)seed);
    return 0;
}

static int cmd_serve(int argc, char **argv) {
    coord_serve_opts so = {.listen = "127.0.0.1:8443"};
    coord_limits_default(&so.limits);
    int64_t threads = 0, slow = 0, body_rate = 0, budget = 0, conns = 0, per_addr = 0, idle = 0,
            keepalive = 0;
    const char *token_file = NULL;
    vl_opt t[] = {
        vl_opt_required(vl_opt_str("db", &so.db_path)),
        vl_opt_required(vl_opt_str("cert", &so.cert_path)),
        vl_opt_required(vl_opt_str("key", &so.key_path)),
        vl_opt_str("listen", &so.listen),
        vl_opt_int("compute-threads", &threads, 1, 256),
        vl_opt_custom("peer-rate", opt_rate, &so.limits.peer, RATE_EXPECT),
        vl_opt_custom("addr-rate", opt_rate, &so.limits.addr, RATE_EXPECT),
        vl_opt_custom("split-rate", opt_rate, &so.limits.split, RATE_EXPECT),
        vl_opt_int("slow-timeout", &slow, 0, 3600),
        vl_opt_int("min-body-rate", &body_rate, 1, (int64_t)1 << 40),
        vl_opt_int("body-budget", &budget, 1, (int64_t)1 << 20),
        vl_opt_int("max-conns", &conns, 16, (int64_t)1 << 24),
        vl_opt_int("conns-per-addr", &per_addr, 0, (int64_t)1 << 24),
        vl_opt_int("idle-first", &idle, 0, 3600),
        vl_opt_int("idle-keepalive", &keepalive, 0, 3600),
        vl_opt_str("admin-listen", &so.admin_listen),
        vl_opt_str("admin-token-file", &token_file),
    };
    vl_opts o = COMMAND_OPTS(PROG " serve", t);
    int rc = vl_opts_parse(&o, argc, argv, NULL);
    if (rc) return vl_opts_status(rc);
    so.compute_threads = (int)threads;
    if (vl_opts_given(&o, "slow-timeout")) so.limits.slow_timeout_s = (double)slow;
    if (vl_opts_given(&o, "min-body-rate")) so.limits.min_body_rate = (double)body_rate;
    if (vl_opts_given(&o, "body-budget")) so.limits.body_budget = budget << 20;
    if (vl_opts_given(&o, "max-conns")) so.limits.max_conns = conns;
    if (vl_opts_given(&o, "conns-per-addr")) so.limits.conn_per_addr = per_addr;
    if (vl_opts_given(&o, "idle-first")) so.limits.idle_first_s = (double)idle;
    if (vl_opts_given(&o, "idle-keepalive")) so.limits.idle_keepalive_s = (double)keepalive;
    /* The admin token: the file's first line, kept out of the process list. */
    char token[192] = "";
    if (token_file) {
        FILE *f = fopen(token_file, "r");
        if (!f)
            return vl_opts_status(
                vl_opts_fail(&o, "cannot read --admin-token-file %s", token_file));
        if (!fgets(token, sizeof token, f)) token[0] = '\0';
        fclose(f);
        token[strcspn(token, "\r\n")] = '\0';
        so.admin_token = token;
    }
    /* A peer that disconnects mid-reply must not kill the server. */
    signal(SIGPIPE, SIG_IGN);
    /* Every upload passes through buffers of its size (hundreds of KB).
     * glibc would map and unmap each one, or trim the heap after it, and
     * fault its pages in afresh every time: a fifth of the server's CPU
     * under an upload storm. Kept in the heap, they are reused. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    vl_error err = {0};
    if (coord_serve(&so, &err) != VL_OK) return fail(&err);
    return 0;
}

int main(int argc, char **argv) {
    vl_log_set_program(PROG);
    if (argc < 2) {
        fputs(USAGE, stderr);
        return VL_OPTS_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        fputs(USAGE, stdout);
        return 0;
    }
    /* The coordinator runs no CUDA code whatever the build. */
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        vl_version_print(stdout, PROG, NULL);
        return 0;
    }
    if (vcrypto_init() != VL_OK) {
        fprintf(stderr, PROG ": cannot initialise libsodium\n");
        return 1;
    }
    /* Each command parses its own options, argv[0] being its word. */
    int n = argc - 1;
    char **args = argv + 1;
    if (!strcmp(cmd, "init")) return cmd_init(n, args);
    if (!strcmp(cmd, "token")) return cmd_token(n, args);
    if (!strcmp(cmd, "peer")) return cmd_peer(n, args);
    if (!strcmp(cmd, "export")) return cmd_export(n, args);
    if (!strcmp(cmd, "sample")) return cmd_sample(n, args);
    if (!strcmp(cmd, "check")) return cmd_check(n, args);
    if (!strcmp(cmd, "status")) return cmd_db_only(n, args, "status", coord_cmd_status);
    if (!strcmp(cmd, "serve")) return cmd_serve(n, args);
    return usage_error("unknown command '%s'", cmd);
}
