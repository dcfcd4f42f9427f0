/* volley-coordinator: command-line entry point. */
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"

#define PROG "volley-coordinator"

static const char USAGE[] =
    "usage: " PROG " COMMAND [OPTIONS]\n"
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
    "      database, and print it with every default filled in, the model's size\n"
    "      and what an update of the run weighs\n"
    "  sample --db FILE [--version V] --prompt TEXT [--tokens N] [--temperature T]\n"
    "         [--seed S]\n"
    "      print TEXT and N bytes (default 200, at most 4096) the model of version V\n"
    "      (default: the current one) continues it with, drawn at temperature T\n"
    "      (default 0.8; 0: the most likely byte each time) with seed S (default 1);\n"
    "      bytes other than printable ASCII, newline and tab (and backslash) print\n"
    "      as \\xNN. Byte-level models only\n"
    "  serve --db FILE --cert PEM --key PEM [--listen HOST:PORT] [--compute-threads N]\n"
    "        [--peer-rate R[:BURST]] [--addr-rate R[:BURST]]\n"
    "        [--slow-timeout S] [--min-body-rate BYTES] [--body-budget MIB]\n"
    "        [--max-conns N] [--conns-per-addr N] [--idle-first S]\n"
    "        [--admin-listen HOST:PORT|off] [--admin-token-file FILE]\n"
    "      serve the run over HTTPS (default 127.0.0.1:8443; port 0 picks a free one\n"
    "      and the real one is printed as \"listening on HOST:PORT\" on stderr);\n"
    "      Prometheus metrics in plain HTTP at http://ADMIN/metrics (default\n"
    "      127.0.0.1:9464, skipped with a warning when taken; off for none; any\n"
    "      address but a loopback one needs the bearer token in FILE, 16 or more\n"
    "      characters on its first line);\n"
    "      N OpenMP threads make each version (default: every core; 1 leaves more of\n"
    "      a small machine to the requests under heavy upload load).\n"
    "      Requests per second (and bursts) per peer (default 50:500) and per\n"
    "      client address, IPv6 per /64 (default 500:5000), 0 for no limit; a\n"
    "      request head must arrive within S seconds (default 30, 0 for no limit)\n"
    "      and a body within S + its length / BYTES per second (default 16384);\n"
    "      signed bodies being received at once are at most MIB MiB together\n"
    "      (default 256; beyond, 503 overloaded) and one per peer. At most N\n"
    "      connections in all (default: the descriptor limit less 64); a\n"
    "      connection that has sent no request is closed after S seconds (default\n"
    "      10; a tenth of that when over half the connections are open) or when\n"
    "      its address holds more than --conns-per-addr such (default 64)\n"
    "\n"
    "Environment: VOLLEY_LOG=debug|info|warn|error sets the log level.\n";

/* Options of one command: names, and where each value goes. */
typedef struct opt {
    const char *name;
    int required;
    const char *value;
} opt;

static int usage_error(const char *fmt, ...) VL_PRINTF(1, 2);
static int usage_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, PROG ": %s (see '" PROG " help')\n", msg);
    return 2;
}

/* Parses "--name value" pairs into opts; every option takes a value, may
 * appear once, and must be known. Returns 0 or the exit status. */
static int parse_opts(int argc, char **argv, opt *opts, size_t n) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        opt *o = NULL;
        for (size_t j = 0; j < n; j++)
            if (strncmp(a, "--", 2) == 0 && strcmp(a + 2, opts[j].name) == 0) o = &opts[j];
        if (!o) return usage_error("unknown argument '%s'", a);
        if (o->value) return usage_error("option '%s' given twice", a);
        if (i + 1 >= argc || argv[i + 1][0] == '\0')
            return usage_error("option '%s' needs a value", a);
        o->value = argv[++i];
    }
    for (size_t j = 0; j < n; j++)
        if (opts[j].required && !opts[j].value)
            return usage_error("missing required option --%s", opts[j].name);
    return 0;
}

static int fail(const vl_error *err) {
    fprintf(stderr, PROG ": %s\n", err->msg[0] ? err->msg : vl_strerror(err->code));
    return 1;
}

static int cmd_init(int argc, char **argv) {
    opt o[] = {{"db", 1, NULL}, {"config", 1, NULL}};
    int rc = parse_opts(argc, argv, o, 2);
    if (rc) return rc;
    vl_error err = {0};
    if (coord_cmd_init(o[0].value, o[1].value, &err) != VL_OK) return fail(&err);
    return 0;
}

static int cmd_token_create(int argc, char **argv) {
    opt o[] = {{"db", 1, NULL}, {"uses", 0, NULL}, {"ttl", 0, NULL}};
    int rc = parse_opts(argc, argv, o, 3);
    if (rc) return rc;
    int64_t uses = 1, ttl = 7 * 86400;
    if (o[1].value && parse_i64(o[1].value, 1, 1000000000, &uses) != VL_OK)
        return usage_error("--uses must be a whole number from 1 (got '%s')", o[1].value);
    if (o[2].value && coord_parse_duration(o[2].value, &ttl) != VL_OK)
        return usage_error("--ttl must look like 7d, 24h, 30m or 3600s (got '%s')", o[2].value);
    char token[CRYPTO_TOKEN_LEN + 1];
    vl_error err = {0};
    if (coord_cmd_token_create(o[0].value, uses, ttl, token, &err) != VL_OK) return fail(&err);
    printf("%s\n", token);
    fflush(stdout);
    explicit_bzero(token, sizeof token);
    return 0;
}

static int cmd_check(int argc, char **argv) {
    opt o[] = {{"db", 0, NULL}, {"config", 0, NULL}};
    int rc = parse_opts(argc, argv, o, 2);
    if (rc) return rc;
    if (!o[0].value == !o[1].value) return usage_error("check takes one of --db and --config");
    vl_error err = {0};
    if (o[1].value) {
        if (coord_cmd_check_config(o[1].value, stdout, &err) != VL_OK) return fail(&err);
        return 0;
    }
    int64_t problems = 0;
    if (coord_cmd_check(o[0].value, stdout, &problems, &err) != VL_OK) return fail(&err);
    fflush(stdout);
    return problems ? 1 : 0;
}

static int cmd_status(int argc, char **argv) {
    opt o[] = {{"db", 1, NULL}};
    int rc = parse_opts(argc, argv, o, 1);
    if (rc) return rc;
    vl_error err = {0};
    if (coord_cmd_status(o[0].value, stdout, &err) != VL_OK) return fail(&err);
    return 0;
}

/* `list --db FILE`, shared by tokens and peers. */
static int cmd_list(int argc, char **argv, int (*list)(const char *, FILE *, vl_error *)) {
    opt o[] = {{"db", 1, NULL}};
    int rc = parse_opts(argc, argv, o, 1);
    if (rc) return rc;
    vl_error err = {0};
    if (list(o[0].value, stdout, &err) != VL_OK) return fail(&err);
    fflush(stdout);
    return 0;
}

/* `revoke --db FILE --NAME ID`, shared by tokens and peers. */
static int cmd_revoke(int argc, char **argv, const char *name,
                      int (*revoke)(const char *, int64_t, vl_error *)) {
    opt o[] = {{"db", 1, NULL}, {name, 1, NULL}};
    int rc = parse_opts(argc, argv, o, 2);
    if (rc) return rc;
    int64_t id;
    if (parse_i64(o[1].value, 1, INT64_MAX, &id) != VL_OK)
        return usage_error("--%s must be a %s id (got '%s')", name, name, o[1].value);
    vl_error err = {0};
    if (revoke(o[0].value, id, &err) != VL_OK) return fail(&err);
    fprintf(stderr, "%s %lld revoked\n", name, (long long)id);
    return 0;
}

static int cmd_token(int argc, char **argv) {
    const char *sub = argc ? argv[0] : "";
    if (!strcmp(sub, "create")) return cmd_token_create(argc - 1, argv + 1);
    if (!strcmp(sub, "list")) return cmd_list(argc - 1, argv + 1, coord_cmd_token_list);
    if (!strcmp(sub, "revoke"))
        return cmd_revoke(argc - 1, argv + 1, "token", coord_cmd_token_revoke);
    return usage_error("unknown token command '%s' (expected create, list or revoke)", sub);
}

static int cmd_peer(int argc, char **argv) {
    const char *sub = argc ? argv[0] : "";
    if (!strcmp(sub, "list")) return cmd_list(argc - 1, argv + 1, coord_cmd_peer_list);
    if (!strcmp(sub, "revoke"))
        return cmd_revoke(argc - 1, argv + 1, "peer", coord_cmd_peer_revoke);
    return usage_error("unknown peer command '%s' (expected list or revoke)", sub);
}

static int cmd_export(int argc, char **argv) {
    /* --force is the one option without a value: take it out at option
     * positions only, so a value spelled "--force" stays a value. */
    int force = 0, n = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--force") == 0) {
            if (force++) return usage_error("option '--force' given twice");
            continue;
        }
        argv[n++] = argv[i];
        if (i + 1 < argc) argv[n++] = argv[++i];
    }
    opt o[] = {{"db", 1, NULL}, {"version", 0, NULL}, {"out", 1, NULL}};
    int rc = parse_opts(n, argv, o, 3);
    if (rc) return rc;
    int64_t version = -1;
    if (o[1].value && parse_i64(o[1].value, 0, INT64_MAX, &version) != VL_OK)
        return usage_error("--version must be a version number (got '%s')", o[1].value);
    vl_error err = {0};
    if (coord_cmd_export(o[0].value, version, o[2].value, force, NULL, &err) != VL_OK)
        return fail(&err);
    return 0;
}

static int cmd_sample(int argc, char **argv) {
    opt o[] = {{"db", 1, NULL},     {"version", 0, NULL},     {"prompt", 1, NULL},
               {"tokens", 0, NULL}, {"temperature", 0, NULL}, {"seed", 0, NULL}};
    int rc = parse_opts(argc, argv, o, 6);
    if (rc) return rc;
    int64_t version = -1, seed = 1;
    coord_sample_opts so = {.prompt = o[2].value, .tokens = 200, .temperature = 0.8};
    if (o[1].value && parse_i64(o[1].value, 0, INT64_MAX, &version) != VL_OK)
        return usage_error("--version must be a version number (got '%s')", o[1].value);
    if (o[3].value && parse_i64(o[3].value, 1, COORD_SAMPLE_MAX_TOKENS, &so.tokens) != VL_OK)
        return usage_error("--tokens must be 1..%d (got '%s')", COORD_SAMPLE_MAX_TOKENS,
                           o[3].value);
    if (o[4].value) {
        if (parse_f64(o[4].value, &so.temperature) != VL_OK ||
            !(so.temperature >= 0 && so.temperature <= COORD_SAMPLE_MAX_TEMP))
            return usage_error("--temperature must be a number in 0..%g (got '%s')",
                               COORD_SAMPLE_MAX_TEMP, o[4].value);
    }
    if (o[5].value && parse_i64(o[5].value, 0, INT64_MAX, &seed) != VL_OK)
        return usage_error("--seed must be a non-negative integer (got '%s')", o[5].value);
    so.seed = (uint64_t)seed;
    if (!so.prompt[0]) return usage_error("--prompt must not be empty");
    vl_error err = {0};
    int64_t got = 0;
    double vloss = NAN;
    if (coord_cmd_sample(o[0].value, version, &so, stdout, &got, &vloss, &err) != VL_OK)
        return fail(&err);
    fprintf(stderr, PROG ": version %lld (validation loss %.4f), temperature %g, seed %lld\n",
            (long long)got, vloss, so.temperature, (long long)seed);
    return 0;
}

/* "R" or "R:BURST", requests per second; 0 turns the limit off. A burst
 * left out is ten seconds' worth. */
static int parse_rate(const char *s, coord_rate *out) {
    char rate[32];
    const char *colon = strchr(s, ':');
    size_t n = colon ? (size_t)(colon - s) : strlen(s);
    if (n == 0 || n >= sizeof rate) return -1;
    memcpy(rate, s, n);
    rate[n] = '\0';
    int64_t r, b;
    if (parse_i64(rate, 0, 1000000, &r) != VL_OK) return -1;
    if (colon) {
        if (parse_i64(colon + 1, 1, 100000000, &b) != VL_OK) return -1;
    } else {
        b = r * 10 > 0 ? r * 10 : 1;
    }
    out->rate = (double)r;
    out->burst = (double)b;
    return 0;
}

static int cmd_serve(int argc, char **argv) {
    opt o[] = {{"db", 1, NULL},           {"cert", 1, NULL},      {"key", 1, NULL},
               {"listen", 0, NULL},       {"compute-threads", 0, NULL},
               {"peer-rate", 0, NULL},    {"addr-rate", 0, NULL},
               {"slow-timeout", 0, NULL}, {"min-body-rate", 0, NULL},
               {"body-budget", 0, NULL},  {"max-conns", 0, NULL},
               {"conns-per-addr", 0, NULL}, {"idle-first", 0, NULL},
               {"admin-listen", 0, NULL}, {"admin-token-file", 0, NULL}};
    int rc = parse_opts(argc, argv, o, 15);
    if (rc) return rc;
    int64_t threads = 0;
    if (o[4].value && parse_i64(o[4].value, 1, 256, &threads) != VL_OK)
        return usage_error("--compute-threads must be a whole number from 1 to 256 (got '%s')",
                           o[4].value);
    coord_serve_opts so = {.db_path = o[0].value, .cert_path = o[1].value,
                           .key_path = o[2].value,
                           .listen = o[3].value ? o[3].value : "127.0.0.1:8443",
                           .compute_threads = (int)threads};
    coord_limits_default(&so.limits);
    if (o[5].value && parse_rate(o[5].value, &so.limits.peer) != 0)
        return usage_error("--peer-rate must be R or R:BURST, whole numbers (got '%s')",
                           o[5].value);
    if (o[6].value && parse_rate(o[6].value, &so.limits.addr) != 0)
        return usage_error("--addr-rate must be R or R:BURST, whole numbers (got '%s')",
                           o[6].value);
    int64_t v;
    if (o[7].value) {
        if (parse_i64(o[7].value, 0, 3600, &v) != VL_OK)
            return usage_error("--slow-timeout must be 0 to 3600 seconds (got '%s')", o[7].value);
        so.limits.slow_timeout_s = (double)v;
    }
    if (o[8].value) {
        if (parse_i64(o[8].value, 1, (int64_t)1 << 40, &v) != VL_OK)
            return usage_error("--min-body-rate must be a positive number of bytes per second "
                               "(got '%s')", o[8].value);
        so.limits.min_body_rate = (double)v;
    }
    if (o[9].value) {
        if (parse_i64(o[9].value, 1, (int64_t)1 << 20, &v) != VL_OK)
            return usage_error("--body-budget must be 1 to 1048576 MiB (got '%s')", o[9].value);
        so.limits.body_budget = v << 20;
    }
    if (o[10].value) {
        if (parse_i64(o[10].value, 16, (int64_t)1 << 24, &v) != VL_OK)
            return usage_error("--max-conns must be 16 to 16777216 (got '%s')", o[10].value);
        so.limits.max_conns = v;
    }
    if (o[11].value) {
        if (parse_i64(o[11].value, 0, (int64_t)1 << 24, &v) != VL_OK)
            return usage_error("--conns-per-addr must be 0 (no limit) to 16777216 (got '%s')",
                               o[11].value);
        so.limits.conn_per_addr = v;
    }
    if (o[12].value) {
        if (parse_i64(o[12].value, 0, 3600, &v) != VL_OK)
            return usage_error("--idle-first must be 0 (no limit) to 3600 seconds (got '%s')",
                               o[12].value);
        so.limits.idle_first_s = (double)v;
    }
    so.admin_listen = o[13].value;
    /* The admin token: the file's first line, kept out of the process list. */
    char token[192] = "";
    if (o[14].value) {
        FILE *f = fopen(o[14].value, "r");
        if (!f) return usage_error("cannot read --admin-token-file %s", o[14].value);
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
    log_set_program(PROG);
    if (argc < 2) {
        fputs(USAGE, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        fputs(USAGE, stdout);
        return 0;
    }
    if (crypto_init() != VL_OK) {
        fprintf(stderr, PROG ": cannot initialise libsodium\n");
        return 1;
    }
    if (!strcmp(cmd, "init")) return cmd_init(argc - 2, argv + 2);
    if (!strcmp(cmd, "token")) return cmd_token(argc - 2, argv + 2);
    if (!strcmp(cmd, "peer")) return cmd_peer(argc - 2, argv + 2);
    if (!strcmp(cmd, "export")) return cmd_export(argc - 2, argv + 2);
    if (!strcmp(cmd, "sample")) return cmd_sample(argc - 2, argv + 2);
    if (!strcmp(cmd, "check")) return cmd_check(argc - 2, argv + 2);
    if (!strcmp(cmd, "status")) return cmd_status(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 2, argv + 2);
    return usage_error("unknown command '%s'", cmd);
}
