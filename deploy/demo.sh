#!/usr/bin/env bash
# The demo: installs what volley needs, builds it, then runs a coordinator
# and 4 peers on 127.0.0.1 over TLS, training the default byte-level GPT on
# the license texts that every Debian system ships in
# /usr/share/common-licenses, until the run's last version. Prints each
# version's validation loss, stops everything and exits 0 (non-zero if any
# part failed or the model did not learn).
#
# Knobs (environment): VOLLEY_DEMO_PEERS (4), VOLLEY_DEMO_VERSIONS (40),
# VOLLEY_DEMO_STEPS (local steps per task, 20), VOLLEY_DEMO_COMPRESSION
# (the run's "compression" object, {"kind": "none", "dtype": "F32"}),
# VOLLEY_DEMO_OUTER (the "outer" object, {"lr": 0.7, "momentum": 0.9};
# "default" leaves "outer" out of run.json, so the coordinator's own
# default for the compression kind applies),
# VOLLEY_DEMO_MODE (sync or async), VOLLEY_DEMO_UPV (updates_per_version,
# default the number of peers), VOLLEY_DEMO_SEED (the run's seed, 1337),
# VOLLEY_DEMO_CORPUS (a text file, or a folder whose regular files are
# concatenated in name order; default the license texts), VOLLEY_DEMO_SLOW
# (the --slowdown of peer 1, 1: none), VOLLEY_DEMO_EXTRA (more members of
# the run configuration, e.g. '"staleness": {"function": "constant", "max": 8},'),
# VOLLEY_DEMO_CHECK (the run's val_check_tokens, 4096: each version is
# served on a loss check of 4096 held-out bytes and scored in full in the
# background, so the peers train rather than wait for every full score;
# empty leaves it to the coordinator's default for the mode, as
# bench/convergence.sh does), VOLLEY_DEMO_DIR (demo-run), VOLLEY_BUILD_DIR
# (build).
#
# It says what it does as it goes (the build and its seconds, the
# coordinator, the peers, each version's loss as the coordinator logs it),
# so that a newcomer is not left minutes before a silent terminal; the
# per-version table and the summary lines at the end are what
# bench/convergence.sh and the README read.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
peers=${VOLLEY_DEMO_PEERS:-4}
versions=${VOLLEY_DEMO_VERSIONS:-40}
steps=${VOLLEY_DEMO_STEPS:-20}
compression=${VOLLEY_DEMO_COMPRESSION:-'{"kind": "none", "dtype": "F32"}'}
outer=${VOLLEY_DEMO_OUTER:-'{"lr": 0.7, "momentum": 0.9}'}
work=${VOLLEY_DEMO_DIR:-$root/demo-run}
upv=${VOLLEY_DEMO_UPV:-$peers}
seed=${VOLLEY_DEMO_SEED:-1337}
source_corpus=${VOLLEY_DEMO_CORPUS:-/usr/share/common-licenses}
slow=${VOLLEY_DEMO_SLOW:-1}
extra=${VOLLEY_DEMO_EXTRA:-}
check=${VOLLEY_DEMO_CHECK-4096}
[ -n "$check" ] && extra="\"val_check_tokens\": $check, $extra"
build=${VOLLEY_BUILD_DIR:-$root/build}
outer_member="\"outer\": $outer,"
[ "$outer" = default ] && outer_member=""

since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }'; }
echo "demo: system packages (deploy/install-deps.sh)"
bash deploy/install-deps.sh
t0=$(date +%s.%N)
echo "demo: building volley-coordinator and volley-peer in $build (-j$(nproc); about a minute on 2 cores the first time)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target volley-coordinator volley-peer >/dev/null
echo "demo: built in $(since "$t0") s"
coord=$build/coordinator/volley-coordinator
peer=$build/peer/volley-peer

rm -rf "$work"
mkdir -p "$work"
cd "$work"
pids=()
cleanup() {
  for p in "${pids[@]}" ${cpid:-} ${fpid:-}; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

bash "$root/deploy/make-cert.sh" tls 127.0.0.1 localhost >/dev/null
# Regular files only: the symlinks (GPL -> GPL-3, ...) would repeat texts;
# fortune's index files (.dat) are binary.
if [ -d "$source_corpus" ]; then
  find "$source_corpus" -maxdepth 1 -type f ! -name '*.dat' | LC_ALL=C sort | xargs cat > corpus.txt
elif [ -f "$source_corpus" ]; then
  cp "$source_corpus" corpus.txt
else
  echo "demo: no corpus at $source_corpus" >&2; exit 1
fi
echo "demo: corpus $(wc -c < corpus.txt) bytes from $source_corpus"

cat > run.json <<JSON
{
  "name": "demo",
  "corpus": "$work/corpus.txt",
  "val_fraction": 0.1,
  "seed": $seed,
  "model": {"vocab_size": 256, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 128},
  "mode": "${VOLLEY_DEMO_MODE:-sync}",
  "updates_per_version": $upv,
  "max_versions": $versions,
  "train": {"steps": $steps, "batch": 8, "optimizer": "adamw", "lr": 0.002,
            "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0, "grad_clip": 1.0},
  $outer_member$extra
  "compression": $compression,
  "task_bytes": 65536,
  "lease_s": 120
}
JSON
"$coord" init --db run.db --config run.json
start=$(date +%s.%N)
# The peers take the cores; a coordinator whose OpenMP threads spin-wait
# beside them spends ten times the CPU on each version's validation.
ct=$(( $(nproc) - peers )); [ "$ct" -ge 1 ] || ct=1
"$coord" serve --db run.db --cert tls/server.pem --key tls/server.key \
  --listen 127.0.0.1:0 --compute-threads "$ct" 2> coordinator.log &
cpid=$!
port=""
for _ in $(seq 1 100); do
  port=$(grep -o 'listening on 127.0.0.1:[0-9]*' coordinator.log | head -n1 | cut -d: -f2 || true)
  [ -n "$port" ] && break
  kill -0 "$cpid" 2>/dev/null || { cat coordinator.log; echo "demo: coordinator died" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "demo: coordinator did not start" >&2; exit 1; }
echo "demo: coordinator on https://127.0.0.1:$port (log: $work/coordinator.log)"
# Each version's loss as it lands, from the coordinator's log; tail stops
# with the coordinator. A version served on its loss check shows its full
# score when the background has it (the check itself is too noisy to show).
# Seconds count from the log's first line, by the log's own timestamps
# (2026-11-26T18:58:01.071Z), however late tail hands the line over.
tail -s 0.5 -n +1 -F --pid="$cpid" coordinator.log 2>/dev/null | awk -v n="$versions" '
  function secs(ts) { return substr(ts, 12, 2) * 3600 + substr(ts, 15, 2) * 60 + substr(ts, 18, 6) }
  $1 ~ /^[0-9][0-9][0-9][0-9]-/ && t0 == "" { t0 = secs($1) }
  / version [0-9]+ val_loss / {
    for (i = 1; i < NF; i++) if ($i == "version" && $(i + 1) ~ /^[0-9]+$/) break
    if (i >= NF) next
    t = secs($1) - t0; if (t < 0) t += 86400
    printf "demo: version %d of %d: %s %.4f (%.0f s)\n", $(i + 1), n, $(i + 2), $(i + 3), t
    fflush()
  }' &
fpid=$!

threads=$(( $(nproc) / peers )); [ "$threads" -ge 1 ] || threads=1
for i in $(seq 1 "$peers"); do
  dir=peer$i
  "$peer" keygen --dir "$dir" >/dev/null
  token=$("$coord" token create --db run.db --uses 1 --ttl 1h)
  "$peer" join --dir "$dir" --coordinator "https://127.0.0.1:$port" --token "$token" \
    --cacert tls/ca.pem --name "demo-peer-$i" >/dev/null 2> "$dir.join.log" \
    || { cat "$dir.join.log" >&2; echo "demo: peer $i could not join" >&2; exit 1; }
  slowdown=1; [ "$i" = 1 ] && slowdown=$slow
  "$peer" run --dir "$dir" --threads "$threads" --wait 20 --slowdown "$slowdown" 2> "$dir.log" &
  pids+=($!)
done
echo "demo: $peers peers training (logs: $work/peer*.log); each version merges $upv updates ($compression)"

fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
pids=()
kill -TERM "$cpid"
wait "$cpid" || { echo "demo: coordinator exited with an error" >&2; fail=1; }
cpid=""
end=$(date +%s.%N)
wait "$fpid" 2>/dev/null || true
fpid=""
[ "$fail" = 0 ] || { tail -n 5 peer*.log coordinator.log >&2; exit 1; }

echo
echo "version  val_loss  train_loss  updates"
sqlite3 -separator ' ' run.db \
  "SELECT version, CASE WHEN val_loss IS NULL THEN '-' ELSE printf('%.4f', val_loss) END, printf('%.4f', coalesce(train_loss, 0)), num_updates
   FROM versions ORDER BY version" | awk '{printf "%7d  %8s  %10s  %7d\n", $1, $2, $3, $4}'
final=$(sqlite3 run.db "SELECT val_loss FROM versions ORDER BY version DESC LIMIT 1")
first=$(sqlite3 run.db "SELECT val_loss FROM versions ORDER BY version LIMIT 1")
up=$(sqlite3 run.db "SELECT count(*), coalesce(avg(nbytes), 0) FROM updates")
echo
printf 'demo: validation loss %.4f -> %.4f (ln 256 = 5.5452) over %s versions in %.1f s\n' \
  "$first" "$final" "$versions" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')"
printf 'demo: %s updates, %.0f bytes each\n' "${up%%|*}" "${up##*|}"
# Each peer logs its traffic when it exits.
grep -h "traffic:" peer*.log | sed 's/^.*traffic:/demo: peer traffic:/' || true
# And the time it spent training, against its wall time.
grep -h "compute:" peer*.log | sed 's/^.*compute:/demo: peer compute:/' || true
awk -v f="$final" 'BEGIN { exit !(f < 3.5) }' || { echo "demo: the model did not learn" >&2; exit 1; }
echo "demo: ok"
