#!/usr/bin/env bash
# bench/guest: the peer as a guest on a shared machine. A real run (a
# coordinator and one peer over TLS on 127.0.0.1, training the demo's GPT
# on the license texts, sync, one dense update per version), measured for
# each setting twice: the peer alone, then beside a competitor, a
# single-threaded busy loop started here that wants one core for itself.
#
# For each setting it prints the peer's training speed alone and beside
# the competitor (median tokens/s of its tasks after the first, as its log
# lines "... tok/s ..." give them: training time only), the second as a
# ratio of the first (on 2 cores a fair share is 0.5), and the share of a
# core the competitor got while the peer ran (1.00: the peer took none of
# the competitor's core). The machine may be shared with more than this
# bench: the last column is the CPU that other processes used (or the
# hypervisor stole) during the alone and the with measurement, in cores;
# figures measured beside a busy neighbour say so there.
#
#   before    the old default, reproduced: --priority normal --threads 2
#             (libgomp's count on 2 CPUs), libgomp's own spinning waits
#             (GOMP_SPINCOUNT=300000, its built-in default) and OpenBLAS's
#             thread pool (OPENBLAS_NUM_THREADS=2, its default here)
#   spinning  --priority normal --threads 2 with OMP_WAIT_POLICY=active:
#             threads that spin for the whole of every wait
#   passive   --priority normal: the new passive waits, normal priority
#   default   no option: the new default (priority low, passive waits, a
#             thread per CPU the process may use)
#   idle      --priority idle
#
# Usage: bash bench/guest.sh
# Environment (defaults in brackets):
#   VOLLEY_BUILD_DIR [build] with coordinator/volley-coordinator and
#                    peer/volley-peer built
#   GUEST_ROWS  ["before spinning passive default idle"] the settings, in
#               the order measured
#   GUEST_TASKS [6] tasks per measurement; the first is not counted
#   GUEST_STEPS [40] local steps per task (batch 8 x 64 tokens)
#   GUEST_OUT   [a new /tmp/volley-guest.XXXXXX] the run, logs, lines
set -euo pipefail
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${VOLLEY_BUILD_DIR:-$ROOT/build}
COORD=$BUILD/coordinator/volley-coordinator
PEER=$BUILD/peer/volley-peer
ROWS=${GUEST_ROWS:-"before spinning passive default idle"}
TASKS=${GUEST_TASKS:-6}
STEPS=${GUEST_STEPS:-40}
OUT=${GUEST_OUT:-$(mktemp -d /tmp/volley-guest.XXXXXX)}

die() { echo "guest: $*" >&2; exit 1; }
for b in "$COORD" "$PEER"; do
  [ -x "$b" ] || die "$b is not built (VOLLEY_BUILD_DIR=$BUILD)"
done
[ "$TASKS" -ge 2 ] || die "GUEST_TASKS must be at least 2 (the first task is not counted)"

CPID="" PPID_="" BUSY=""
cleanup() {
  for p in $PPID_ $BUSY $CPID; do kill -9 "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

mkdir -p "$OUT"
cd "$OUT"
bash "$ROOT/deploy/make-cert.sh" tls 127.0.0.1 localhost >/dev/null
find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort | xargs cat > corpus.txt
cat > run.json <<JSON
{
  "name": "guest",
  "corpus": "$OUT/corpus.txt",
  "val_fraction": 0.1,
  "seed": 1337,
  "model": {"vocab_size": 256, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 128},
  "mode": "sync",
  "updates_per_version": 1,
  "max_versions": 100000,
  "train": {"steps": $STEPS, "batch": 8, "optimizer": "adamw", "lr": 0.002,
            "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0, "grad_clip": 1.0},
  "compression": {"kind": "none", "dtype": "F32"},
  "task_bytes": 65536,
  "lease_s": 600
}
JSON
rm -f run.db
"$COORD" init --db run.db --config run.json 2> init.log || die "init: $(tail -n 1 init.log)"
# One compute thread and nice: between two tasks the coordinator merges and
# scores the version, and nothing of that belongs to the peer's figures.
nice "$COORD" serve --db run.db --cert tls/server.pem --key tls/server.key \
  --listen 127.0.0.1:0 --compute-threads 1 2> coordinator.log &
CPID=$!
port=""
for _ in $(seq 1 100); do
  port=$(grep -o 'listening on 127.0.0.1:[0-9]*' coordinator.log | head -n1 | cut -d: -f2 || true)
  [ -n "$port" ] && break
  kill -0 "$CPID" 2>/dev/null || die "the coordinator exited at start: $(tail -n 1 coordinator.log)"
  sleep 0.1
done
[ -n "$port" ] || die "the coordinator did not report its port"
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h) || die "token create"
"$PEER" keygen --dir peer >/dev/null || die "keygen"
"$PEER" join --dir peer --coordinator "https://127.0.0.1:$port" --token "$token" \
  --cacert tls/ca.pem --name guest > /dev/null 2> join.log || die "join: $(tail -n 1 join.log)"

# The environment and options of a setting: "VAR=VALUE ...|OPTIONS".
setting() {
  case $1 in
    before) echo "GOMP_SPINCOUNT=300000 OPENBLAS_NUM_THREADS=2|--priority normal --threads 2" ;;
    spinning) echo "OMP_WAIT_POLICY=active|--priority normal --threads 2" ;;
    passive) echo "|--priority normal" ;;
    default) echo "|" ;;
    idle) echo "|--priority idle" ;;
    *) die "unknown setting '$1' (before, spinning, passive, default, idle)" ;;
  esac
}

# CPU pid has used (user + system), in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# CPU every process of the machine has used, and the hypervisor stole, in
# clock ticks (/proc/stat: user nice system idle iowait irq softirq steal).
machine_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
# CHILD_S: CPU seconds of this shell's waited-for children (the peer
# runs), from the builtin times, which must run in this shell: a subshell
# has no children of its own.
children_s() {
  times > "$OUT/times.txt"
  CHILD_S=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/);
                           printf "%.3f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$OUT/times.txt")
}
TCK=$(getconf CLK_TCK)

# measure ROW MODE: one peer run of TASKS tasks (MODE alone or with the
# competitor); sets TOKS, the median tok/s of the tasks after the first,
# SHARE, the competitor's share of a core ("-" alone), and OTHERS, the
# cores other processes used meanwhile. Not run in a subshell, so that the
# EXIT trap knows every process it starts.
measure() {
  local row=$1 mode=$2 spec envs opts log t0 t1 k0=0 k1=0 m0 m1 c0 c1 p0 p1
  SHARE="-"
  spec=$(setting "$row")
  envs=${spec%%|*}
  opts=${spec#*|}
  log=$OUT/$row-$mode.log
  if [ "$mode" = with ]; then
    bash -c 'while :; do :; done' &
    BUSY=$!
    sleep 1
    k0=$(ticks "$BUSY")
  fi
  children_s
  p0=$CHILD_S
  m0=$(machine_ticks)
  c0=$(ticks "$CPID")
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086 # word splitting of the setting is the point
  env $envs "$PEER" run --dir peer --max-tasks "$TASKS" --wait 20 $opts 2> "$log" &
  PPID_=$!
  wait "$PPID_" || die "$row $mode: the peer failed: $(tail -n 1 "$log")"
  PPID_=""
  t1=$(date +%s.%N)
  m1=$(machine_ticks)
  c1=$(ticks "$CPID")
  [ "$mode" = with ] && k1=$(ticks "$BUSY")
  children_s
  p1=$CHILD_S
  OTHERS=$(awk -v m="$((m1 - m0))" -v c="$((c1 - c0))" -v k="$((k1 - k0))" -v p0="$p0" \
    -v p1="$p1" -v t="$TCK" -v s="$t0" -v e="$t1" \
    'BEGIN { o = ((m - c - k) / t - (p1 - p0)) / (e - s); printf "%.2f", o < 0 ? 0 : o }')
  if [ "$mode" = with ]; then
    kill -9 "$BUSY" 2>/dev/null || true
    wait "$BUSY" 2>/dev/null || true
    BUSY=""
    SHARE=$(awk -v a="$k0" -v b="$k1" -v t="$TCK" -v s="$t0" -v e="$t1" \
      'BEGIN { printf "%.2f", (b - a) / t / (e - s) }')
  fi
  TOKS=$(grep -o '[0-9]* tok/s' "$log" | awk 'NR > 1 { print $1 }' | sort -n |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2];
                              else printf "%.0f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  [ "$TOKS" != "-" ] || die "$row $mode: fewer than two tasks finished (see $log)"
}

cpus=$(nproc)
blas=$(ls -l /etc/alternatives/libopenblas.so.0-x86_64-linux-gnu 2>/dev/null | sed 's/.*-> //' || true)
echo "guest: $cpus CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))," \
  "OpenBLAS ${blas:-unknown}"
echo "guest: $TASKS tasks of $STEPS steps (8 x 64 tokens) per measurement, the first not counted;" \
  "competitor: one busy loop"
printf '%-9s %7s %7s %6s %11s %10s\n' setting "alone" "with" ratio competitor others
for row in $ROWS; do
  spec=$(setting "$row")
  measure "$row" alone
  alone=$TOKS others=$OTHERS
  measure "$row" with
  ratio=$(awk -v a="$alone" -v w="$TOKS" 'BEGIN { printf "%.2f", w / a }')
  printf '%-9s %7s %7s %6s %11s %10s\n' "$row" "$alone" "$TOKS" "$ratio" "$SHARE" \
    "$others/$OTHERS"
done
echo "guest: the settings, as run:"
for row in $ROWS; do
  spec=$(setting "$row")
  printf 'guest:   %-9s %s\n' "$row" "$(echo "${spec%%|*} volley-peer run ${spec#*|}" | sed 's/^ *//')"
done
echo "guest: tok/s: median over tasks; competitor: share of one core its busy loop got;" \
  "others: cores used by other processes, alone/with"
echo "guest: logs in $OUT"
# What the new default applied, as the peer logged it.
[ -f "$OUT/default-with.log" ] &&
  grep -h -E 'priority |OpenMP waits|training with' "$OUT/default-with.log" | sed 's/^[^ ]* /guest: /'
exit 0
