#!/usr/bin/env bash
# bench/federated: federated training of the MLP classifier on Fashion-MNIST
# against one process that trains the same model on all the data.
#
# Every run is real: a coordinator (volley-coordinator serve) over TLS with
# certificates from deploy/make-cert.sh, and peers (volley-peer run --data
# ... --threads 1) as separate processes on 127.0.0.1. The coordinator
# scores every version on the 10,000 test images (data.test_images /
# test_labels); the peers keep the 60,000 training images.
#
#   single         the baseline: ONE peer on all 60,000 training images (no
#                  --partition), updates_per_version 1, FedAvg outer step
#                  (lr 1, momentum 0: each version is the peer's model after
#                  its task, so this is plain sequential AdamW training).
#                  Its task has FED_PEERS times the federated task's steps,
#                  so that each of its versions processes as many samples as
#                  one federated version and the runs end at equal samples.
#   fedavg-iid     FED_PEERS peers, each its own process on --partition i/N
#                  (IID), mode sync, updates_per_version N, dense F32
#                  updates, outer {"lr": 1, "momentum": 0} (FedAvg)
#   fedavg-betaB   the same on label-skewed parts (--beta B: each class cut
#                  among the parts in Dirichlet(B) proportions)
#   default-iid, default-betaB
#                  as the fedavg- runs with no "outer" object: the
#                  coordinator's own outer step for dense sync runs
#                  (Nesterov, lr 0.7, momentum 0.9)
#   ...-noguard    any federated setting with "max_loss_rise": 0: no version
#                  is refused for its loss (only for a loss that is not a
#                  number), e.g. fedavg-beta0.1-noguard
#
# Everything else is the coordinator's default in every run (robust: mean
# with the automatic max_norm bound, clip; max_loss_rise 0.2); the report
# counts what those defences did (refused versions, clipped updates). In a
# run on local data the loss the refusal rule reads is the test set's. The
# coordinator is paused (SIGSTOP) while the peers load their images, so
# that every version is one task of each peer (see run_one).
#
# Prints, next to the baseline measured in the same invocation: final, last-5
# mean and best test accuracy with their differences to the baseline (in
# points, each seed against the baseline of the same seed, then the mean)
# and ratio; samples processed, bytes uploaded per peer and what the
# coordinator's defences did; and the samples each setting needs to reach
# FED_TARGET % against the baseline's. Draws FED_PLOT (gnuplot).
#
# Usage: bash bench/federated.sh [SETTINGS]
#   SETTINGS: default "single fedavg-iid fedavg-beta0.5 fedavg-beta0.1
#   default-iid default-beta0.5 default-beta0.1 fedavg-beta0.1-noguard
#   default-beta0.1-noguard" (27 runs with 3 seeds, about 17 minutes on 2
#   cores). The baseline "single" is always run, first.
#
# Environment:
#   FED_SEEDS     "7 8 9": each setting runs once per seed, which is the run's
#                 "seed" and the peers' --partition-seed
#   FED_VERSIONS  50: versions of every run (max_versions)
#   FED_STEPS     50: local steps of a federated task (the baseline's task:
#                 FED_STEPS x FED_PEERS)
#   FED_BATCH     32
#   FED_LR        0.001 (AdamW, the coordinator's defaults otherwise)
#   FED_HIDDEN    256: hidden widths, comma-separated (e.g. 256,128)
#   FED_CONV      empty: convolution layers before them, as the model's
#                 "conv" list (e.g. '{"channels": 16, "kernel": 5, "stride":
#                 2}, {"channels": 32, "kernel": 5, "stride": 2}'), on the
#                 28x28 images
#   FED_PEERS     4
#   FED_DATA      /usr/share/datasets/fashion-mnist
#   FED_OUT       ${TMPDIR:-/tmp}/volley-bench-federated: one folder per
#                 run (SETTING-sSEED: run.db, logs, curve.tsv, summary.tsv),
#                 the seed-mean curves (SETTING.mean.tsv) and report.md (the
#                 tables printed)
#   FED_PLOT      docs/results/federated-accuracy.png
#   FED_TIMEOUT   900: seconds a run may take before it counts as failed
#   FED_RESUME    1: keep runs that already have a summary.tsv (and the
#                 binaries in FED_OUT/bin they were made with)
#   FED_NICE      0: niceness of every process started
#   FED_TARGET    85: the test accuracy (%) whose samples-to-reach the last
#                 table compares
#   VOLLEY_BUILD_DIR  /tmp/build-me (coordinator/volley-coordinator,
#                 peer/volley-peer; copied into FED_OUT/bin at the start so
#                 a rebuild during the benchmark does not mix binaries)
#
# A run that does not finish is reported on one line and the others go on;
# the exit status is then 1. A run that finishes without learning is a
# result like any other.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${VOLLEY_BUILD_DIR:-/tmp/build-me}
fm=${FED_DATA:-/usr/share/datasets/fashion-mnist}
seeds=${FED_SEEDS:-"7 8 9"}
versions=${FED_VERSIONS:-50}
steps=${FED_STEPS:-50}
batch=${FED_BATCH:-32}
lr=${FED_LR:-0.001}
hidden=${FED_HIDDEN:-256}
conv=${FED_CONV:-}
front=""
[ -n "$conv" ] && front="\"image\": [1, 28, 28], \"conv\": [$conv],"
peers=${FED_PEERS:-4}
out=${FED_OUT:-${TMPDIR:-/tmp}/volley-bench-federated}
plot_png=${FED_PLOT:-$root/docs/results/federated-accuracy.png}
run_timeout=${FED_TIMEOUT:-900}
resume=${FED_RESUME:-0}
niceness=${FED_NICE:-0}
target=${FED_TARGET:-85}

die() { echo "federated: $*" >&2; exit 2; }
posint() { case $2 in '' | *[!0-9]* | 0*) die "$1 must be a positive integer, not '$2'" ;; esac; }
posint FED_VERSIONS "$versions"
posint FED_STEPS "$steps"
posint FED_BATCH "$batch"
posint FED_PEERS "$peers"
posint FED_TIMEOUT "$run_timeout"
case $niceness in '' | *[!0-9]*) die "FED_NICE must be 0-19" ;; esac
case $lr in '' | *[!0-9.e-]*) die "FED_LR must be a number, not '$lr'" ;; esac
case $target in '' | *[!0-9.]*) die "FED_TARGET must be a percentage, not '$target'" ;; esac
case $hidden in '' | *[!0-9,]* | ,* | *, | *,,*) die "FED_HIDDEN must be widths like 256 or 256,128" ;; esac
for s in $seeds; do case $s in '' | *[!0-9]*) die "FED_SEEDS must be non-negative integers" ;; esac; done
[ -n "$seeds" ] || die "FED_SEEDS is empty"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
         t10k-labels-idx1-ubyte.gz; do
  [ -f "$fm/$f" ] || die "Fashion-MNIST is not in $fm (no $f)"
done
for b in coordinator/volley-coordinator peer/volley-peer; do
  [ -x "$build/$b" ] || die "$build/$b is not built (set VOLLEY_BUILD_DIR)"
done
for t in sqlite3 openssl awk; do command -v "$t" >/dev/null || die "$t is not installed"; done

settings=(single)
defaults="fedavg-iid fedavg-beta0.5 fedavg-beta0.1 default-iid default-beta0.5 default-beta0.1"
defaults+=" fedavg-beta0.1-noguard default-beta0.1-noguard"
for s in ${1:-$defaults}; do
  case ${s%-noguard} in
    single) [ "$s" = single ] || die "the baseline has no -noguard variant"; continue ;;
    fedavg-iid | default-iid) ;;
    fedavg-beta* | default-beta*)
      b=${s%-noguard}
      b=${b#*-beta}
      case $b in '' | *[!0-9.]* | .* | *. | *.*.*) die "bad beta in '$s'" ;; esac ;;
    *) die "unknown setting '$s' (single, fedavg-iid, fedavg-betaB, default-iid, default-betaB, each but single with -noguard)" ;;
  esac
  settings+=("$s")
done

mkdir -p "$out/bin"
if [ "$resume" = 1 ] && [ -x "$out/bin/volley-coordinator" ] && [ -x "$out/bin/volley-peer" ]; then
  # The runs kept were made with these; new ones use them too.
  if ! cmp -s "$build/coordinator/volley-coordinator" "$out/bin/volley-coordinator" \
     || ! cmp -s "$build/peer/volley-peer" "$out/bin/volley-peer"; then
    echo "federated: FED_RESUME: keeping the binaries of the earlier runs ($out/bin), not $build's" >&2
  fi
else
  cp "$build/coordinator/volley-coordinator" "$build/peer/volley-peer" "$out/bin/"
fi
COORD=$out/bin/volley-coordinator
PEER=$out/bin/volley-peer
[ -f "$out/tls/ca.pem" ] || bash "$root/deploy/make-cert.sh" "$out/tls" 127.0.0.1 localhost >/dev/null
nice_cmd=(nice -n "$niceness")

# Processes of the run under way, ended by id on any exit.
PIDS=()
CPID=""
cleanup() {
  local p
  for p in "${PIDS[@]}" $CPID; do kill -9 "$p" 2>/dev/null || true; done
  # Reaped here, so that the shell reports no killed jobs of its own.
  for p in "${PIDS[@]}" $CPID; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

failures=0
# fail_run DIR MESSAGE: the run's one line; its processes are ended.
fail_run() {
  echo "federated: FAIL: $(basename "$1"): $2 (logs in $1)" >&2
  failures=$((failures + 1))
  cleanup
  PIDS=()
  CPID=""
}

last_line() { [ -f "$1" ] && tail -n 1 "$1" | cut -c1-300 || echo "no log"; }

# run_one SETTING SEED DIR: one run; returns 1 after fail_run.
run_one() {
  local setting=$1 seed=$2 dir=$3 i upv=$peers st=$steps outer='"outer": {"lr": 1.0, "momentum": 0.0},'
  local beta="" part=1 guard=""
  case $setting in
    single) upv=1 st=$((steps * peers)) part=0 ;;
    default-*) outer="" ;;
  esac
  case $setting in *-noguard) guard='"max_loss_rise": 0,' ;; esac
  case ${setting%-noguard} in *-beta*) beta=${setting%-noguard} beta=${beta#*-beta} ;; esac
  rm -rf "$dir"
  mkdir -p "$dir"
  cat > "$dir/run.json" <<JSON || { fail_run "$dir" "cannot write run.json"; return 1; }
{
  "name": "federated-$setting-s$seed",
  "seed": $seed,
  "model": {"kind": "mlp", "in_dim": 784, $front "hidden": [$hidden], "classes": 10},
  "data": {"kind": "local", "test_images": "$fm/t10k-images-idx3-ubyte.gz",
           "test_labels": "$fm/t10k-labels-idx1-ubyte.gz"},
  "mode": "sync",
  "updates_per_version": $upv,
  "max_versions": $versions,
  "train": {"steps": $st, "batch": $batch, "lr": $lr},
  $outer
  $guard
  "compression": {"kind": "none", "dtype": "F32"},
  "lease_s": 300,
  "max_body_bytes": 67108864
}
JSON
  "${nice_cmd[@]}" "$COORD" init --db "$dir/run.db" --config "$dir/run.json" 2> "$dir/init.log" \
    || { fail_run "$dir" "init failed: $(last_line "$dir/init.log")"; return 1; }
  local t0
  t0=$(date +%s.%N)
  "${nice_cmd[@]}" "$COORD" serve --db "$dir/run.db" --cert "$out/tls/server.pem" \
    --key "$out/tls/server.key" --listen 127.0.0.1:0 2> "$dir/coordinator.log" &
  CPID=$!
  local port=""
  for _ in $(seq 1 300); do
    port=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$dir/coordinator.log" | head -n1 | cut -d: -f2 || true)
    [ -n "$port" ] && break
    kill -0 "$CPID" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$port" ] || { fail_run "$dir" "the coordinator did not listen: $(last_line "$dir/coordinator.log")"; return 1; }
  local n=$peers
  [ "$setting" = single ] && n=1
  for i in $(seq 1 "$n"); do
    local token
    token=$("$COORD" token create --db "$dir/run.db" --uses 1 --ttl 1h 2>> "$dir/init.log") \
      || { fail_run "$dir" "token create failed: $(last_line "$dir/init.log")"; return 1; }
    "$PEER" keygen --dir "$dir/peer$i" > /dev/null 2>> "$dir/join$i.log" \
      || { fail_run "$dir" "keygen $i failed: $(last_line "$dir/join$i.log")"; return 1; }
    "$PEER" join --dir "$dir/peer$i" --coordinator "https://127.0.0.1:$port" --token "$token" \
      --cacert "$out/tls/ca.pem" --name "fed-$i" > /dev/null 2>> "$dir/join$i.log" \
      || { fail_run "$dir" "join $i failed: $(last_line "$dir/join$i.log")"; return 1; }
  done
  # A sync version takes the first updates_per_version updates based on
  # the version before, whichever peers send them: a peer that asks while
  # the others still load their images would take several of the first
  # version's tasks. The coordinator is paused (SIGSTOP; the peers'
  # connections wait in its listen queue, well inside their 20 s connect
  # timeout) until every peer has its data, so each version is one task of
  # each peer (the report counts versions where that failed).
  kill -STOP "$CPID"
  for i in $(seq 1 "$n"); do
    local data=(--data "$fm/train-images-idx3-ubyte.gz")
    if [ "$part" = 1 ]; then
      data+=(--partition "$((i - 1))/$n" --partition-seed "$seed")
      [ -n "$beta" ] && data+=(--beta "$beta")
    fi
    "${nice_cmd[@]}" "$PEER" run --dir "$dir/peer$i" --threads 1 --wait 10 --retries 12 \
      "${data[@]}" 2> "$dir/peer$i.log" &
    PIDS+=($!)
  done
  local loaded=0
  for _ in $(seq 1 600); do
    loaded=$(cat "$dir"/peer*.log 2>/dev/null | grep -c 'local data: ' || true)
    [ "$loaded" -ge "$n" ] && break
    for i in "${!PIDS[@]}"; do
      kill -0 "${PIDS[$i]}" 2>/dev/null \
        || { fail_run "$dir" "peer $((i + 1)) exited at start: $(last_line "$dir/peer$((i + 1)).log")"; return 1; }
    done
    sleep 0.1
  done
  [ "$loaded" -ge "$n" ] || { fail_run "$dir" "the peers did not load their data within 60 s"; return 1; }
  sleep 0.3
  kill -CONT "$CPID"
  # Peers end with status 0 once the run is finished (410 run_finished).
  # A peer that ends before the run is finished fails the run at once:
  # without it a sync version would wait for the timeout.
  local deadline=$((SECONDS + run_timeout)) alive rc done_peers=()
  while :; do
    alive=0
    for i in "${!PIDS[@]}"; do
      if kill -0 "${PIDS[$i]}" 2>/dev/null; then alive=1; continue; fi
      [ -z "${done_peers[$i]:-}" ] || continue
      rc=0
      wait "${PIDS[$i]}" 2>/dev/null || rc=$?
      done_peers[i]=1
      [ "$rc" = 0 ] || { fail_run "$dir" "peer $((i + 1)) exited with $rc: $(last_line "$dir/peer$((i + 1)).log")"; return 1; }
      [ "$(sqlite3 "$dir/run.db" 'SELECT status FROM run' 2>/dev/null)" = finished ] \
        || { fail_run "$dir" "peer $((i + 1)) ended before the run finished: $(last_line "$dir/peer$((i + 1)).log")"; return 1; }
    done
    [ "$alive" = 0 ] && break
    kill -0 "$CPID" 2>/dev/null \
      || { fail_run "$dir" "the coordinator exited: $(last_line "$dir/coordinator.log")"; return 1; }
    [ "$SECONDS" -lt "$deadline" ] \
      || { fail_run "$dir" "not finished after $run_timeout s (version $(sqlite3 "$dir/run.db" 'SELECT max(version) FROM versions' 2>/dev/null))"; return 1; }
    sleep 0.5
  done
  local t1
  t1=$(date +%s.%N)
  PIDS=()
  kill -TERM "$CPID" 2>/dev/null || true
  rc=0
  wait "$CPID" || rc=$?
  CPID=""
  [ "$rc" = 0 ] || { fail_run "$dir" "the coordinator exited with $rc after SIGTERM: $(last_line "$dir/coordinator.log")"; return 1; }
  [ "$(sqlite3 "$dir/run.db" 'SELECT status FROM run')" = finished ] \
    || { fail_run "$dir" "the peers ended but the run is not finished"; return 1; }
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f\n", b - a }' > "$dir/wall.txt"
}

# DIR/curve.tsv (version, samples processed, test accuracy, test loss) and
# DIR/summary.tsv (version-0 accuracy, final accuracy, best accuracy, its
# version, lowest accuracy after version 0, versions below version 0's
# accuracy, samples, uploaded bytes per peer, refused versions, updates
# scaled down to max_norm, versions with two updates from one peer, wall
# seconds, mean accuracy of the last 5 versions) from the run's logs and
# database.
extract() {
  local dir=$1
  {
    grep -o 'version 0 loss [0-9.naif-]*, accuracy [0-9.naif-]*' "$dir/init.log" \
      | awk '{ gsub(",", "", $4); printf "A 0 %s %s\n", $6, $4 }'
    grep -o 'version [0-9]* test_loss [0-9.naif-]*, test accuracy [0-9.naif-]*' "$dir/coordinator.log" \
      | awk '{ gsub(",", "", $4); printf "A %s %s %s\n", $2, $7, $4 }'
    sqlite3 -separator ' ' "$dir/run.db" \
      "SELECT 'S', v.version, (SELECT coalesce(sum(u.num_samples), 0) FROM updates u
                               WHERE u.merged_version <= v.version)
       FROM versions v ORDER BY v.version"
  } | awk '
    $1 == "A" { acc[$2] = $3; loss[$2] = $4; next }
    $1 == "S" { v[++k] = $2; s[$2] = $3 }
    END { for (i = 1; i <= k; i++) if (v[i] in acc)
            printf "%d\t%d\t%.4f\t%.6f\n", v[i], s[v[i]], acc[v[i]], loss[v[i]] }' > "$dir/curve.tsv"
  local up refused clipped dup wall
  up=$(cat "$dir"/peer*.log | awk '
    /traffic: uploaded/ { for (i = 1; i <= NF; i++) if ($i == "uploaded") { t += $(i + 1); n++ } }
    END { printf "%.0f", n ? t / n : 0 }')
  refused=$(grep -c 'version [0-9]* refused:' "$dir/coordinator.log" || true)
  clipped=$(grep -o '[0-9]* scaled down to max_norm' "$dir/coordinator.log" | awk '{ t += $1 } END { print t + 0 }')
  dup=$(sqlite3 "$dir/run.db" "SELECT count(*) FROM (SELECT merged_version FROM updates
        WHERE merged_version IS NOT NULL GROUP BY merged_version
        HAVING count(DISTINCT peer_id) < count(*))")
  wall=$(cat "$dir/wall.txt" 2>/dev/null || echo 0)
  awk -F '\t' -v up="$up" -v r="$refused" -v c="$clipped" -v d="$dup" -v w="$wall" '
    $1 == 0 { a0 = $3; next }
    { n++; last = $3; s = $2; a[n] = $3
      if (n == 1 || $3 > best) { best = $3; bv = $1 }
      if (n == 1 || $3 < lo) lo = $3
      if ($3 < a0) below++ }
    END { for (i = n; i > n - 5 && i > 0; i--) { t5 += a[i]; k5++ }
          printf "%.4f\t%.4f\t%.4f\t%d\t%.4f\t%d\t%d\t%s\t%d\t%d\t%d\t%s\t%.4f\n",
                 a0, last, best, bv, lo, below, s, up, r, c, d, w, k5 ? t5 / k5 : 0 }' "$dir/curve.tsv" > "$dir/summary.tsv"
}

# The per-version mean of the seeds' curves: SETTING.
mean_curve() {
  local c=$1 s files=()
  for s in $seeds; do
    if [ -f "$out/$c-s$s/summary.tsv" ]; then files+=("$out/$c-s$s/curve.tsv"); fi
  done
  rm -f "$out/$c.mean.tsv"
  [ "${#files[@]}" -gt 0 ] || return 0
  awk -F '\t' '{ n[$1]++; s[$1] += $2; a[$1] += $3; if ($1 > max) max = $1 }
    END { for (v = 0; v <= max; v++) if (v in n)
            printf "%d\t%.0f\t%.4f\t%d\n", v, s[v] / n[v], a[v] / n[v], n[v] }' \
    "${files[@]}" > "$out/$c.mean.tsv"
}

label_of() {
  local c=${1%-noguard} g=""
  [ "$c" = "$1" ] || g=", no guard"
  case $c in
    single) echo "single process, all data" ;;
    fedavg-iid) echo "FedAvg, IID$g" ;;
    fedavg-beta*) echo "FedAvg, beta ${c#fedavg-beta}$g" ;;
    default-iid) echo "default outer 0.7/0.9, IID$g" ;;
    default-beta*) echo "default outer 0.7/0.9, beta ${c#default-beta}$g" ;;
  esac
}

report() {
  local c s
  {
    for c in "${settings[@]}"; do
      for s in $seeds; do
        if [ -f "$out/$c-s$s/summary.tsv" ]; then
          printf '%s\t%s\t%s\n' "$c" "$s" "$(cat "$out/$c-s$s/summary.tsv")"
        fi
      done
    done
  } | awk -F '\t' -v peers="$peers" '
    # 1 setting 2 seed 3 acc0 4 final 5 best 6 best_v 7 lowest 8 below0
    # 9 samples 10 upload/peer 11 refused 12 clipped 13 dup 14 wall 15 last-5
    function pct(x) { return sprintf("%.2f", 100 * x) }
    function diff(x) { return sprintf("%+.2f", 100 * x) }
    { c = $1; if (!(c in n)) order[++k] = c
      n[c]++; f[c] += $4; b[c] += $5; l5[c] += $15; a0[c] += $3
      if (!(c in lo) || $7 < lo[c]) lo[c] = $7
      be[c] += $8; sm[c] = $9; up[c] += $10; rf[c] += $11; cl[c] += $12; du[c] += $13; w[c] += $14
      fs[c] = fs[c] (fs[c] == "" ? "" : ", ") pct($4)
      bs[c] = bs[c] (bs[c] == "" ? "" : ", ") pct($5)
      if (c == "single") { bf[$2] = $4; bb[$2] = $5; bl[$2] = $15 }
      pf[c, $2] = $4; pb[c, $2] = $5; pl[c, $2] = $15; sd[c, ++ns[c]] = $2 }
    END {
      if (!("single" in n)) print "(the single-process baseline did not finish: no differences)\n"
      print "| setting | peers | beta | final test acc. %, mean (per seed) | vs single, points | final / single | mean of last 5 versions % | vs single, points | best % (per seed) | vs single, points |"
      print "|---|---|---|---|---|---|---|---|---|---|"
      for (i = 1; i <= k; i++) {
        c = order[i]
        beta = (c ~ /beta/) ? substr(c, index(c, "beta") + 4) : (c == "single" ? "all data" : "IID")
        sub(/-noguard$/, "", beta)
        np = (c == "single") ? 1 : peers
        # Each seed is set against the baseline of the same seed.
        dn = 0; df = 0; db = 0; dl = 0; rr = 0
        for (j = 1; j <= ns[c]; j++) {
          sdj = sd[c, j]
          if (sdj in bf) { dn++; df += pf[c, sdj] - bf[sdj]; db += pb[c, sdj] - bb[sdj]
                           dl += pl[c, sdj] - bl[sdj]; rr += pf[c, sdj] / bf[sdj] } }
        if (c == "single") { dfs = "baseline"; dbs = "baseline"; dls = "baseline"; rrs = "1" }
        else if (dn) { dfs = diff(df / dn); dbs = diff(db / dn); dls = diff(dl / dn); rrs = sprintf("%.3f", rr / dn) }
        else { dfs = "-"; dbs = "-"; dls = "-"; rrs = "-" }
        printf "| %s | %d | %s | %s (%s) | %s | %s | %s | %s | %s (%s) | %s |\n",
               c, np, beta, pct(f[c] / n[c]), fs[c], dfs, rrs, pct(l5[c] / n[c]), dls,
               pct(b[c] / n[c]), bs[c], dbs
      }
      if (k == 0) print "| (no finished runs) | | | | | | | | | |"
      print ""
      print "| setting | runs | samples processed | bytes uploaded per peer | vs single | version 0 acc. % | lowest acc. after version 0 % | versions below version 0 | refused versions | updates scaled down | versions with 2 updates of a peer | wall s, mean |"
      print "|---|---|---|---|---|---|---|---|---|---|---|---|"
      for (i = 1; i <= k; i++) {
        c = order[i]
        ur = ("single" in n && up["single"] > 0) ? sprintf("%.3f", (up[c] / n[c]) / (up["single"] / n["single"])) : "-"
        printf "| %s | %d | %d | %.0f | %s | %s | %s | %d | %d | %d | %d | %.1f |\n",
               c, n[c], sm[c], up[c] / n[c], ur, pct(a0[c] / n[c]), pct(lo[c]), be[c], rf[c], cl[c],
               du[c], w[c] / n[c]
      }
      if (k == 0) print "| (no finished runs) | | | | | | | | | | | |"
    }'
}

plot() {
  command -v gnuplot >/dev/null || { echo "federated: gnuplot not installed; no plot" >&2; return 0; }
  local c series="" term='pngcairo size 960,640 font ",10"'
  case $(gnuplot -e 'set terminal' 2>&1 || true) in *pngcairo*) ;; *) term='png size 960,640' ;; esac
  for c in "${settings[@]}"; do
    [ -f "$out/$c.mean.tsv" ] || continue
    # Colour by the data's split, dashes for the default outer step,
    # dots for the runs without the loss guard.
    local colour dash=1 lw=1.5
    case ${c%-noguard} in
      single) colour='#000000' lw=2.5 ;;
      *-iid) colour='#1b9e77' ;;
      *-beta0.5) colour='#386cb0' ;;
      *-beta0.1) colour='#d95f02' ;;
      *) colour='#7570b3' ;;
    esac
    case $c in default-*) dash=2 ;; esac
    case $c in *-noguard) dash=3 colour='#e7298a' ;; esac
    case $c in default-*-noguard) dash=4 ;; esac
    series+="${series:+, }'$out/$c.mean.tsv' using (\$2 / 1000):(100 * \$3) with linespoints lc rgb '$colour' dt $dash lw $lw pt 7 pointsize 0.4 title '$(label_of "$c")'"
  done
  [ -n "$series" ] || return 0
  # From a little under the lowest accuracy after version 0: version 0's
  # 10 % would squash the curves.
  local ymin
  ymin=$(cat "$out"/*.mean.tsv | awk '$1 > 0 && (m == "" || $3 < m) { m = $3 }
    END { y = int(100 * m / 5) * 5 - 5; print (y < 0 ? 0 : y) }')
  mkdir -p "$(dirname "$plot_png")"
  gnuplot <<GP
set terminal $term
set output '$plot_png'
set title "Fashion-MNIST MLP [$hidden]: test accuracy, mean over seeds ($seeds)"
set xlabel 'training samples processed, all peers together (thousands)'
set ylabel 'test accuracy (%)'
set yrange [$ymin:*]
set key below maxrows 5
set bmargin 10
set autoscale xfix
set grid
plot $series
GP
  echo "federated: $plot_png" >&2
}

total=$(( ${#settings[@]} * $(echo "$seeds" | wc -w) ))
k=0
echo "federated: $(nproc) cores; settings ${settings[*]}; seeds $seeds; $versions versions;" \
     "$peers peers x $steps steps x batch $batch per version; runs in $out" >&2
for c in "${settings[@]}"; do
  for s in $seeds; do
    k=$((k + 1))
    dir=$out/$c-s$s
    if [ "$resume" = 1 ] && [ -f "$dir/summary.tsv" ]; then continue; fi
    echo "federated: [$k/$total] $c seed $s" >&2
    if run_one "$c" "$s" "$dir"; then
      extract "$dir"
      awk -F '\t' -v c="$c" -v s="$s" '{ printf "federated: %s seed %s: final %.2f%%, best %.2f%% (version 0: %.2f%%), %.1f s\n", c, s, 100 * $2, 100 * $3, 100 * $1, $12 }' "$dir/summary.tsv" >&2
    fi
  done
done
# Samples each setting's seed-mean curve needs to first reach FED_TARGET %
# test accuracy, against the baseline's.
reach() {
  local c line
  echo
  echo "| setting | samples to reach $target % (seed mean) | vs single |"
  echo "|---|---|---|"
  for c in "${settings[@]}"; do
    [ -f "$out/$c.mean.tsv" ] || continue
    line=$(awk -v t="$target" '$1 > 0 && 100 * $3 >= t { print $2; exit }' "$out/$c.mean.tsv")
    printf '%s\t%s\n' "$c" "${line:--}"
  done | awk -F '\t' '
    { c[++k] = $1; v[k] = $2; if ($1 == "single") b = $2 }
    END { for (i = 1; i <= k; i++)
            printf "| %s | %s | %s |\n", c[i], v[i] == "-" ? "not reached" : v[i],
                   (v[i] == "-" || b == "" || b == "-") ? "-" : sprintf("%.2fx", v[i] / b) }'
}

for c in "${settings[@]}"; do mean_curve "$c"; done
{ report; reach; } | tee "$out/report.md"
plot
[ "$failures" = 0 ] || { echo "federated: $failures runs failed" >&2; exit 1; }
