#!/usr/bin/env bash
# bench/split_flight: split learning over a slow link, one batch at a time
# against several in flight (split.in_flight). Real processes over TLS as
# tests/integration/split.sh runs them, but every peer reaches the
# coordinator through tests/wan/relay.py, which delays each direction by
# half the round trip. For each depth: batches per second through the
# cut (the figure a peer on a far link is held back on), wall time, and
# the last version's test accuracy (batches in flight are sent with
# layers up to depth - 1 steps old, which costs accuracy per batch), and
# the time until a version first reaches FLIGHT_TARGET test accuracy,
# which weighs the two. The baseline is depth 1 in the same run; ratios
# are against it. Writes a table to FLIGHT_DOC.
#
# Usage: bash bench/split_flight.sh
# Environment (defaults in brackets):
#   VOLLEY_BUILD_DIR [/tmp/build-me] with the coordinator and peer built
#   FLIGHT_RTT_MS [100]   round trip the relay adds
#   FLIGHT_DEPTHS ["1 2 4 8"] split.in_flight values; the first is the baseline
#   FLIGHT_PEERS [2] FLIGHT_VERSIONS [12] FLIGHT_STEPS [50] FLIGHT_BATCH [64]
#   FLIGHT_TARGET [0.80]  test accuracy whose time to reach is compared
#   FLIGHT_SEED [7]       the run's seed, the same for every depth
#   FLIGHT_OUT [a new /tmp/volley-flight.XXXXXX]
#   FLIGHT_DOC [docs/results/split_flight.md]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${VOLLEY_BUILD_DIR:-/tmp/build-me}
COORD=$BUILD/coordinator/volley-coordinator
PEER=$BUILD/peer/volley-peer
FM=/usr/share/datasets/fashion-mnist
RTT=${FLIGHT_RTT_MS:-100}
DEPTHS=${FLIGHT_DEPTHS:-"1 2 4 8"}
PEERS=${FLIGHT_PEERS:-2}
VERSIONS=${FLIGHT_VERSIONS:-12}
TARGET=${FLIGHT_TARGET:-0.80}
STEPS=${FLIGHT_STEPS:-50}
BATCH=${FLIGHT_BATCH:-64}
SEED=${FLIGHT_SEED:-7}
DOC=${FLIGHT_DOC:-$ROOT/docs/results/split_flight.md}
OUT=${FLIGHT_OUT:-$(mktemp -d /tmp/volley-flight.XXXXXX)}

die() { echo "split_flight: $*" >&2; exit 1; }
for b in "$COORD" "$PEER"; do [ -x "$b" ] || die "$b is not built (VOLLEY_BUILD_DIR=$BUILD)"; done
[ -f "$FM/train-images-idx3-ubyte.gz" ] || die "Fashion-MNIST is not installed ($FM)"
command -v python3 >/dev/null || die "python3 is not installed"
command -v sqlite3 >/dev/null || die "sqlite3 is not installed"

PIDS=()
CPID=""
RPID=""
cleanup() { for p in "${PIDS[@]}" $CPID $RPID; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
mkdir -p "$OUT"
bash "$ROOT/deploy/make-cert.sh" "$OUT/tls" 127.0.0.1 localhost >/dev/null

wait_for() { # FILE PID WHAT: waits for FILE to be non-empty
  for _ in $(seq 1 300); do
    [ -s "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || die "$3 exited at start"
    sleep 0.1
  done
  die "$3 did not start"
}

# run_depth D DIR: one split run with split.in_flight D, every peer behind
# the relay. Appends "D seconds batches accuracy seconds-to-target" to
# lines.txt ("-" when the target was not reached).
run_depth() {
  local d=$1 dir=$2 i token port rport t0 t1
  rm -rf "$dir"
  mkdir -p "$dir"
  cat > "$dir/run.json" <<JSON
{
  "name": "flight",
  "seed": $SEED,
  "model": {"kind": "mlp", "in_dim": 784, "hidden": [256, 128], "classes": 10},
  "data": {"kind": "local", "test_images": "$FM/t10k-images-idx3-ubyte.gz",
           "test_labels": "$FM/t10k-labels-idx1-ubyte.gz"},
  "mode": "split",
  "split": {"cut": 1, "alpha": 0, "in_flight": $d},
  "updates_per_version": $PEERS,
  "max_versions": $VERSIONS,
  "train": {"steps": $STEPS, "batch": $BATCH, "lr": 0.001},
  "outer": {"lr": 1.0, "momentum": 0.0},
  "lease_s": 600,
  "max_body_bytes": 16777216
}
JSON
  "$COORD" init --db "$dir/run.db" --config "$dir/run.json" 2> "$dir/init.log" \
    || die "depth $d: init: $(tail -n 1 "$dir/init.log")"
  "$COORD" serve --db "$dir/run.db" --cert "$OUT/tls/server.pem" --key "$OUT/tls/server.key" \
    --listen 127.0.0.1:0 2> "$dir/coordinator.log" &
  CPID=$!
  for _ in $(seq 1 200); do
    port=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$dir/coordinator.log" | head -n1 | cut -d: -f2 || true)
    [ -n "$port" ] && break
    kill -0 "$CPID" 2>/dev/null || die "depth $d: the coordinator exited at start"
    sleep 0.1
  done
  [ -n "$port" ] || die "depth $d: the coordinator did not report its port"
  python3 "$ROOT/tests/wan/relay.py" --port-file "$dir/relay.port" "127.0.0.1:$port" \
    "$(awk -v r="$RTT" 'BEGIN { print r / 2 }')" 2> "$dir/relay.log" &
  RPID=$!
  wait_for "$dir/relay.port" "$RPID" "the relay"
  rport=$(cat "$dir/relay.port")
  for i in $(seq 1 "$PEERS"); do
    token=$("$COORD" token create --db "$dir/run.db" --uses 1 --ttl 1h) || die "token create"
    "$PEER" keygen --dir "$dir/peer$i" > /dev/null || die "keygen $i"
    "$PEER" join --dir "$dir/peer$i" --coordinator "https://127.0.0.1:$rport" --token "$token" \
      --cacert "$OUT/tls/ca.pem" --name "flight-$i" > /dev/null 2> "$dir/join$i.log" \
      || die "depth $d: join $i: $(tail -n 1 "$dir/join$i.log")"
  done
  PIDS=()
  t0=$(date +%s.%N)
  for i in $(seq 1 "$PEERS"); do
    "$PEER" run --dir "$dir/peer$i" --threads 1 --wait 10 --retries 12 \
      --data "$FM/train-images-idx3-ubyte.gz" --partition "$((i - 1))/$PEERS" 2> "$dir/peer$i.log" &
    PIDS+=($!)
  done
  for p in "${PIDS[@]}"; do
    wait "$p" || die "depth $d: a peer failed: $(tail -n 2 "$dir"/peer*.log | tr '\n' ' ')"
  done
  t1=$(date +%s.%N)
  PIDS=()
  kill -TERM "$CPID"
  wait "$CPID" || die "depth $d: the coordinator exited with an error"
  CPID=""
  kill "$RPID" 2>/dev/null || true
  wait "$RPID" 2>/dev/null || true
  RPID=""
  [ "$(sqlite3 "$dir/run.db" 'SELECT current_version FROM run')" = "$VERSIONS" ] \
    || die "depth $d: the run stopped before version $VERSIONS"
  if grep -q too_many_batches "$dir/coordinator.log"; then die "depth $d: a peer went past split.in_flight"; fi
  local batches acc hit="-" ts a
  batches=$(grep -c 'POST /v1/split/forward 200' "$dir/coordinator.log" || true)
  acc=$(grep -o 'test accuracy [0-9.]*' "$dir/coordinator.log" | tail -n1 | cut -d' ' -f3)
  while read -r ts a; do
    if awk -v a="$a" -v t="$TARGET" 'BEGIN { exit !(a >= t) }'; then
      hit=$(awk -v x="$(date -d "$ts" +%s.%N)" -v y="$t0" 'BEGIN { printf "%.2f", x - y }')
      break
    fi
  done < <(grep 'test accuracy' "$dir/coordinator.log" |
           sed -n 's/^\([^ ]*\) .*test accuracy \([0-9.]*\).*/\1 \2/p')
  rm -rf "$dir/run.db-bodies"
  awk -v d="$d" -v a="$t0" -v b="$t1" -v n="$batches" -v c="$acc" -v h="$hit" \
    'BEGIN { printf "%d %.2f %d %s %s\n", d, b - a, n, c, h }' >> "$OUT/lines.txt"
  echo "split_flight: $(tail -n 1 "$OUT/lines.txt") (depth, seconds, batches, accuracy, seconds to $TARGET)" >&2
}

: > "$OUT/lines.txt"
for d in $DEPTHS; do run_depth "$d" "$OUT/depth-$d"; done

table=$(awk '
  NR == 1 { base = $3 / $2; h0 = $5 }
  { rate = $3 / $2
    hit = ($5 == "-") ? "not reached" : sprintf("%.1f", $5)
    vs = ($5 == "-" || h0 == "-") ? "-" : sprintf("%.2f", h0 / $5)
    printf "| %d | %.1f | %d | %.1f | %.2f | %s | %s | %.2f |\n", $1, $2, $3, rate, rate / base, hit, vs, 100 * $4 }
' "$OUT/lines.txt")
{
  echo "# Split learning over a slow link: batches in flight"
  echo
  echo "Produced by \`bench/split_flight.sh\` on $(date -u +%Y-%m-%d) ($(nproc) cores;"
  echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))."
  echo "A plain split run of the classifier 784-256-128-10 cut after the first"
  echo "layer, $PEERS peers on Fashion-MNIST shares, $VERSIONS versions of $STEPS"
  echo "local steps of $BATCH images, real processes over TLS; every peer"
  echo "reaches the coordinator through a relay that adds a ${RTT} ms round trip"
  echo "(\`tests/wan/relay.py\`, no bandwidth limit). The baseline is one batch"
  echo "at a time (\`split.in_flight\` 1), run in the same invocation; ratios are"
  echo "against it (for the time to the target, the depth-1 time over this"
  echo "one's: above 1 is faster). Accuracy is the coordinator's, on the 10,000"
  echo "test images; \"to $TARGET\" is the time from the peers' start until a"
  echo "version first scored at least that, and the last column the last"
  echo "version's accuracy."
  echo
  echo "| in flight | wall s | batches | batches/s | vs 1 in flight | s to $TARGET | vs 1 | last accuracy % |"
  echo "|---|---|---|---|---|---|---|---|"
  echo "$table"
  echo
  echo "With one batch at a time every step waits a whole round trip, so a"
  echo "peer makes at most 1000 / ${RTT} steps a second however fast it is."
  echo "With d in flight it sends the next batches while the oldest answer is"
  echo "on its way; each batch's gradient is taken at the layers it was sent"
  echo "with and steps layers up to d - 1 steps newer (a delayed step). At an"
  echo "equal number of batches that delay costs accuracy (the last column);"
  echo "the time to the target shows whether the faster steps make up for it."
} > "$DOC"
cat "$DOC"
