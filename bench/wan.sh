#!/usr/bin/env bash
# bench/wan: wall time to a target validation loss on emulated volunteer
# links (tests/wan/), for the methods volley offers against the
# data-parallel baseline. Four peers (by default) on the mixed federation
# (lab, home, far, mobile; tests/wan/profiles.conf), with different
# --slowdown as well, train the demo GPT on the license texts:
#
#   bsp     sync, dense F16 updates, 1 local step a version, plain average
#           (outer lr 1, momentum 0): the baseline. Its first run's final
#           validation loss, after WAN_BSP_VERSIONS versions, is the target
#           of every run.
#   diloco  sync, dense F16, WAN_H local steps, outer Nesterov (0.7, 0.9)
#   topk    sync, top-k at 100x less upload, WAN_H steps, default outer step
#   sketch  sync, Count Sketch at 30x (the highest ratio that met its
#           quality goal in docs/results/convergence.md), WAN_H steps
#   gaussk  sync, Gaussian-k at 100x, WAN_H steps
#   async   async with the defaults (peers wait for their own update's
#           version, staleness weights, the outer step by the version's
#           staleness), as many updates a version as peers, dense F16,
#           WAN_H steps at most with SelSync (delta 0.05, h_min 5) and
#           dynamic steps
#   async-overlap  as async, with the peers' --overlap: each trains its
#           next task while its last update uploads (what that buys, in
#           compute share and time)
#
# Each runs WAN_RUNS times; a run stops at the first version whose
# validation loss is at or below the target, or after WAN_CAP_S seconds.
# Printed per run: wall seconds to the target (from the coordinator's
# start), bytes each peer sent and received, each peer's share of time
# spent training, the final loss; then each configuration's speed-up
# over BSP (the mean of its runs' times against BSP's), and the loss
# curves against wall time go to WAN_PLOT (gnuplot).
#
# Usage (as root, which network namespaces need):
#   bash bench/wan.sh [CONFIGURATIONS]      (default: all, in the order above)
# Environment:
#   WAN_RUNS 2; WAN_PROFILE mixed; WAN_PEERS 4; WAN_SLOWDOWNS "1 2 1 2"
#   (peer i takes the i-th, cycling); WAN_SCALE, WAN_TIME_SCALE 1 (the
#   profiles as they are; docs/wan.md); WAN_BSP_VERSIONS 20; WAN_H 20;
#   WAN_CAP_S 300; WAN_OUT bench-wan (one folder per run);
#   WAN_ASYNC_EXTRA (top-level JSON members, each with its trailing
#   comma, added to the async configurations: '"lease_wait": 0,' runs
#   them without the wait, as before 2026-12-06, best with
#   WAN_ASYNC_UPV at half the peers); WAN_ASYNC_UPV (the async
#   configurations' updates_per_version; default WAN_PEERS);
#   WAN_RUN_FROM 1 (the first run number: 2 runs again only the second
#   runs, beside the first ones kept in WAN_OUT);
#   WAN_PLOT docs/results/wan-loss.png; WAN_TARGET (a loss: skips the
#   target-setting BSP run when given); WAN_REPORT_ONLY 1: runs nothing,
#   prints the table and draws the curves from the runs in WAN_OUT;
#   VOLLEY_BUILD_DIR build.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source "$ROOT/tests/wan/lib.sh"
runs=${WAN_RUNS:-2}
profile=${WAN_PROFILE:-mixed}
npeers=${WAN_PEERS:-4}
read -r -a slowdowns <<< "${WAN_SLOWDOWNS:-1 2 1 2}"
bsp_versions=${WAN_BSP_VERSIONS:-20}
H=${WAN_H:-20}
cap_s=${WAN_CAP_S:-300}
out=${WAN_OUT:-bench-wan}
plot=${WAN_PLOT:-docs/results/wan-loss.png}
build=${VOLLEY_BUILD_DIR:-build}
configs=(${1:-bsp diloco topk sketch gaussk async async-overlap})
die() { echo "wan: $*" >&2; exit 1; }
for c in "${configs[@]}"; do
  case $c in bsp | diloco | topk | sketch | gaussk | async | async-overlap) ;; *) die "unknown configuration '$c'" ;; esac
done
report_only=${WAN_REPORT_ONLY:-}
mkdir -p "$out"
out=$(cd "$out" && pwd)
links=()
members=$(awk -v n="$profile" '$1 == n && $2 == "=" { $1 = ""; $2 = ""; print }' "$WAN_PROFILES")
[ -n "$members" ] || members=$profile
read -r -a names <<< "$members"
for ((i = 1; i <= npeers; i++)); do links+=("${names[$(((i - 1) % ${#names[@]}))]}"); done

if [ -z "$report_only" ]; then
wan_check || die "cannot emulate links here: $WAN_WHY"
command -v sqlite3 > /dev/null || die "sqlite3 is missing (deploy/install-deps.sh installs it)"

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
nice cmake --build "$build" -j"$(nproc)" --target volley-coordinator volley-peer > /dev/null
COORD=$ROOT/$build/coordinator/volley-coordinator
PEER=$ROOT/$build/peer/volley-peer
[ -x "$COORD" ] || COORD=$build/coordinator/volley-coordinator
[ -x "$PEER" ] || PEER=$build/peer/volley-peer

# The corpus and certificates are shared by every run; the links too, and
# the relays, which reach the coordinator on a fixed port in its own
# namespace whichever run it serves.
find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort | xargs cat > "$out/corpus.txt"
addrs=()
for ((i = 1; i <= npeers; i++)); do addrs+=("10.211.$i.1"); done
rm -rf "$out/tls"
bash deploy/make-cert.sh "$out/tls" 127.0.0.1 "${addrs[@]}" > /dev/null
PORT=8443
wan_start "$npeers"
for ((i = 1; i <= npeers; i++)); do
  wan_shape "$i" "${links[$((i - 1))]}"
  wan_relay "$i" "$PORT"
done
fi

# run.json for configuration $1 into $2.
write_config() {
  local c=$1 f=$2 mode=sync upv=$npeers steps=$H versions=400 outer='"outer": {"lr": 0.7, "momentum": 0.9},'
  local comp='{"kind": "none", "dtype": "F16"}' extra='"dynamic_steps": false'
  case $c in
    bsp) steps=1 versions=$bsp_versions outer='"outer": {"lr": 1.0, "momentum": 0.0},' ;;
    diloco) ;;
    topk) comp='{"kind": "topk", "ratio": 100}' outer="" ;;
    sketch) comp='{"kind": "sketch", "ratio": 30}' outer="" ;;
    gaussk) comp='{"kind": "gaussk", "ratio": 100}' outer="" ;;
    async | async-overlap)
      mode=async upv=${WAN_ASYNC_UPV:-$npeers} outer="" extra='"dynamic_steps": true'
      outer='"selsync": {"delta": 0.05, "h_min": 5},'" ${WAN_ASYNC_EXTRA:-}" ;;
  esac
  cat > "$f" <<JSON
{
  "name": "wan-$c",
  "corpus": "$out/corpus.txt",
  "val_fraction": 0.1,
  "seed": 1337,
  "model": {"vocab_size": 256, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 128},
  "mode": "$mode",
  "updates_per_version": $upv,
  "max_versions": $versions,
  "train": {"steps": $steps, "batch": 8, "optimizer": "adamw", "lr": 0.002,
            "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0, "grad_clip": 1.0,
            $extra},
  $outer
  "compression": $comp,
  "task_bytes": 65536,
  "lease_s": 600,
  "val_tokens": 32768,
  "max_body_bytes": 67108864
}
JSON
}

pids=()
cpid=""
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2> /dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
  pids=()
  if [ -n "$cpid" ]; then
    # A request the relays keep open would hold the drain for its 30 s
    # grace: what is stored is committed, so the rest is not waited for.
    kill -TERM "$cpid" 2> /dev/null || true
    for _ in $(seq 1 50); do kill -0 "$cpid" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$cpid" 2> /dev/null || true
    wait "$cpid" 2> /dev/null || true
  fi
  cpid=""
}
trap 'stop_all; wan_teardown' EXIT

# Per peer of the run in folder $1, from its log: bytes sent, bytes
# received (models, deltas, data, factors) and the share of the time it
# spent training, "SENT RECEIVED SHARE;" each.
peer_figures() {
  local col="" i tr sh
  for ((i = 1; i <= npeers; i++)); do
    tr=$(grep -o 'traffic: uploaded [0-9]* bytes, downloaded [0-9]* bytes of models, [0-9]* bytes of deltas, [0-9]* bytes of data and [0-9]* bytes' "$1/peer$i.log" |
      tail -n 1 | awk '{ print $3, $6 + $10 + $14 + $19 }' || true)
    sh=$(grep -o 'compute: .*(\([0-9.]*\) %)' "$1/peer$i.log" | tail -n 1 |
      sed 's/.*(\([0-9.]*\) %)/\1/' || true)
    col+="${tr:-? ?} ${sh:-?};"
  done
  echo "$col"
}

# One run: configuration $1, run number $2, target loss $3 (empty: run to
# the last version). Leaves curve.tsv (seconds, version, loss),
# result.tsv and the logs in its folder.
one_run() {
  local c=$1 r=$2 target=$3 dir="$out/$1-r$2"
  rm -rf "$dir"
  mkdir -p "$dir"
  cd "$dir"
  write_config "$c" run.json
  "$COORD" init --db run.db --config run.json 2> init.log || { cat init.log; die "init $c"; }
  for ((i = 1; i <= npeers; i++)); do
    "$PEER" keygen --dir "peer$i" > /dev/null
  done
  local ct=1
  # ip netns exec runs the program in place, so the pids are the
  # programs' own and a SIGTERM reaches them.
  ip netns exec "$WAN_NS-c" "$COORD" serve --db run.db --cert "$out/tls/server.pem" --key "$out/tls/server.key" \
    --listen "127.0.0.1:$PORT" --compute-threads "$ct" 2> coordinator.log &
  cpid=$!
  for _ in $(seq 1 100); do
    grep -q 'listening on' coordinator.log && break
    sleep 0.1
  done
  grep -q 'listening on' coordinator.log || die "the coordinator of $c did not start"
  for ((i = 1; i <= npeers; i++)); do
    local token url="https://$(wan_addr "$i"):$(wan_relay_port "$i")"
    token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
    wan_peer "$i" "$PEER" join --dir "peer$i" --coordinator "$url" --token "$token" \
      --cacert "$out/tls/ca.pem" --name "wan-$i" > /dev/null 2> "join$i.log" \
      || die "join $i: $(cat "join$i.log")"
  done
  # The clock starts when the peers do.
  local t0
  t0=$(date +%s.%N)
  for ((i = 1; i <= npeers; i++)); do
    local slow=${slowdowns[$(((i - 1) % ${#slowdowns[@]}))]} peer_opt=()
    [ "$c" = async-overlap ] && peer_opt=(--overlap)
    ip netns exec "$WAN_NS-p$i" "$PEER" run --dir "peer$i" --threads 1 --wait 20 --retries 20 \
      --slowdown "$slow" "${peer_opt[@]}" 2> "peer$i.log" &
    pids+=($!)
  done
  # Watch the versions as they are made.
  : > curve.tsv
  local seen=-1 reached="" now status=
  while :; do
    now=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    while IFS='|' read -r v loss; do
      [ -n "$v" ] || continue
      printf '%s\t%s\t%s\n' "$now" "$v" "$loss" >> curve.tsv
      seen=$v
      if [ -n "$target" ] && [ -z "$reached" ] &&
        awk -v l="$loss" -v t="$target" 'BEGIN { exit !(l <= t) }'; then
        reached=$now
      fi
    done < <(sqlite3 -separator '|' run.db \
      "SELECT version, printf('%.4f', val_loss) FROM versions WHERE version > $seen
       AND val_loss IS NOT NULL ORDER BY version" 2> /dev/null || true)
    [ -n "$reached" ] && break
    # The last versions were read before the status: one more pass.
    [ "$status" = finished ] && break
    status=$(sqlite3 run.db 'SELECT status FROM run' 2> /dev/null || true)
    [ "$status" = finished ] && continue
    # The target-setting run goes to its last version whatever the cap.
    [ -n "$target" ] && awk -v n="$now" -v c="$cap_s" 'BEGIN { exit !(n >= c) }' && break
    sleep 0.5
  done
  local wall=$now
  stop_all
  local last
  last=$(tail -n 1 curve.tsv | cut -f3)
  local peers_col
  peers_col=$(peer_figures .)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$r" "${reached:--}" "$wall" "$last" "$seen" \
    "$peers_col" > result.tsv
  cd "$ROOT"
}

target=${WAN_TARGET:-}
if [ -n "$report_only" ]; then
  [ -n "$target" ] || target=$(cat "$out/target")
else
echo "wan: $npeers peers on '$profile' (${links[*]}), slowdowns ${slowdowns[*]}," \
     "WAN_SCALE $WAN_SCALE, WAN_TIME_SCALE $WAN_TIME_SCALE; runs in $out" >&2
for c in "${configs[@]}"; do
  for ((r = ${WAN_RUN_FROM:-1}; r <= runs; r++)); do
    if [ "$c" = bsp ] && [ "$r" = 1 ] && [ -z "$target" ]; then
      one_run bsp 1 ""
      target=$(tail -n 1 "$out/bsp-r1/curve.tsv" | cut -f3)
      # BSP's first run defines the target, its final loss, and reaches
      # it when its curve first gets there.
      reached=$(awk -F'\t' -v t="$target" '$3 <= t { print $1; exit }' "$out/bsp-r1/curve.tsv")
      awk -F'\t' -v OFS='\t' -v t="$reached" '{ $3 = t; print }' "$out/bsp-r1/result.tsv" \
        > "$out/bsp-r1/r.tmp"
      mv "$out/bsp-r1/r.tmp" "$out/bsp-r1/result.tsv"
      echo "$target" > "$out/target"
      echo "wan: target validation loss $target (BSP after $bsp_versions versions)" >&2
      continue
    fi
    [ -n "$target" ] || die "no target: run bsp first or set WAN_TARGET"
    one_run "$c" "$r" "$target"
    echo "wan: $(cut -f1-6 "$out/$c-r$r/result.tsv")" >&2
  done
done
wan_teardown
trap - EXIT
fi

# The table.
echo
tv=$bsp_versions
[ -f "$out/bsp-r1/result.tsv" ] && tv=$(cut -f6 "$out/bsp-r1/result.tsv")
echo "Target validation loss: $target (BSP's first run, after $tv versions of 1 local step)."
echo "Profile '$profile' (${links[*]}), --slowdown ${slowdowns[*]}, WAN_SCALE $WAN_SCALE," \
     "WAN_TIME_SCALE $WAN_TIME_SCALE; $npeers peers, 1 thread each, on $(nproc) cores."
echo
hdr="| configuration | run | s to target | vs BSP | final loss | versions |"
sep="|---|---|---|---|---|---|"
for ((i = 1; i <= npeers; i++)); do
  hdr+=" peer $i (${links[$((i - 1))]}): sent / received MB, compute % |"
  sep+="---|"
done
echo "$hdr"
echo "$sep"
bsp_mean=$(cat "$out"/bsp-r*/result.tsv 2> /dev/null |
  awk -F'\t' '$3 != "-" { s += $3; n++ } END { if (n) printf "%.2f", s / n }' || true)
for c in "${configs[@]}"; do
  for ((r = 1; r <= runs; r++)); do
    f=$out/$c-r$r/result.tsv
    [ -f "$f" ] || continue
    awk -F'\t' -v b="$bsp_mean" -v pf="$(peer_figures "$out/$c-r$r")" '{
      t = $3 == "-" ? "not reached (" $4 " s)" : sprintf("%.1f", $3)
      v = ($3 == "-" || b == "") ? "-" : sprintf("%.1f×", b / $3)
      line = sprintf("| %s | %s | %s | %s | %s | %s |", $1, $2, t, v, $5, $6)
      n = split(pf, p, ";")
      for (i = 1; i < n; i++) {
        split(p[i], q, " ")
        line = line sprintf(" %.2f / %.2f, %s |", q[1] / 1e6, q[2] / 1e6, q[3])
      }
      print line
    }' "$f"
  done
done
echo
for c in "${configs[@]}"; do
  cat "$out"/"$c"-r*/result.tsv 2> /dev/null | awk -F'\t' -v b="$bsp_mean" -v c="$c" -v R="$runs" '
    $3 != "-" { s += $3; n++ }
    END { if (n == R && b != "") printf "%s: mean %.1f s to the target, %.1f× BSP\n", c, s / n, b / (s / n)
          else printf "%s: %d of %d runs reached the target\n", c, n, R }' || true
done

# Loss against wall time, first run of each configuration.
if command -v gnuplot > /dev/null; then
  mkdir -p "$(dirname "$plot")"
  cmd="set terminal pngcairo size 900,560; set output '$plot'; set logscale x;"
  cmd+=" set xlabel 'wall seconds (log)'; set ylabel 'validation loss (nats)';"
  cmd+=" set title 'mixed federation, $npeers peers: loss against wall time (run 1)';"
  cmd+=" set arrow from graph 0, first $target to graph 1, first $target nohead dt 2;"
  cmd+=" plot"
  sepc=""
  for c in "${configs[@]}"; do
    [ -s "$out/$c-r1/curve.tsv" ] || continue
    cmd+="$sepc '$out/$c-r1/curve.tsv' using (\$1 > 0 ? \$1 : 0.1):3 with linespoints title '$c'"
    sepc=","
  done
  gnuplot -e "$cmd" && echo "loss curves: $plot"
fi
