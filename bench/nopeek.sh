#!/usr/bin/env bash
# bench/nopeek: the leakage of split learning with NoPeek on Fashion-MNIST.
# For every alpha of the sweep, a real split run between processes over
# TLS (as tests/integration/split.sh runs one: a coordinator with its own
# certificate authority, peers that keygen, join and train on their share
# of the training images, sending only cut-layer activations and labels),
# then bench_nopeek eval on the finished run's database: test accuracy,
# dCor(X, Z) at the cut and a decoder attack from leaked (X, Z) pairs,
# each beside the same run's mean-image guess and the alpha = 0 run.
# Writes the table and verdict (NOPEEK_DOC), the reconstructions grid and
# the trade-off plot (NOPEEK_PLOTS-reconstructions.png, -tradeoff.png).
#
# Usage: bash bench/nopeek.sh
# Environment (defaults in brackets):
#   VOLLEY_BUILD_DIR  [/tmp/build-me] with coordinator/volley-coordinator,
#                     peer/volley-peer and bench/bench_nopeek built
#   NOPEEK_ALPHAS     ["0 3 10 20 30 100 300 1000"] the sweep; its first value is the
#                     baseline the others are compared with (use 0)
#   NOPEEK_PEERS [3] NOPEEK_VERSIONS [20] NOPEEK_STEPS [50] local steps
#   NOPEEK_BATCH [128] NOPEEK_LR [0.001] NOPEEK_HIDDEN ["256, 128"]
#   NOPEEK_CUT [1]    the run's split.cut
#   NOPEEK_SEEDS ["7 8"] every alpha runs once per seed (the run's seed,
#                     which draws the initial model and the batches, and
#                     the attacker's decoder seed); the table gives means
#   NOPEEK_LEAK [1000] leaked pairs the attacker trains its decoder on
#   NOPEEK_EPOCHS [60] the decoder's epochs over them
#   NOPEEK_THREADS [1] threads of each peer and of the evaluation
#   NOPEEK_OUT        [a new /tmp/volley-nopeek.XXXXXX] runs, logs, lines
#   NOPEEK_DOC        [docs/results/nopeek.md]
#   NOPEEK_PLOTS      [docs/results/nopeek] prefix of the two PNGs
#   NOPEEK_REPORT_ONLY [0] 1: run nothing; the table, pictures and verdict
#                     from the runs an earlier sweep left in NOPEEK_OUT
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${VOLLEY_BUILD_DIR:-/tmp/build-me}
COORD=$BUILD/coordinator/volley-coordinator
PEER=$BUILD/peer/volley-peer
BENCH=$BUILD/bench/bench_nopeek
FM=/usr/share/datasets/fashion-mnist
ALPHAS=${NOPEEK_ALPHAS:-"0 3 10 20 30 100 300 1000"}
PEERS=${NOPEEK_PEERS:-3}
VERSIONS=${NOPEEK_VERSIONS:-20}
STEPS=${NOPEEK_STEPS:-50}
BATCH=${NOPEEK_BATCH:-128}
LR=${NOPEEK_LR:-0.001}
HIDDEN=${NOPEEK_HIDDEN:-"256, 128"}
CUT=${NOPEEK_CUT:-1}
LEAK=${NOPEEK_LEAK:-1000}
EPOCHS=${NOPEEK_EPOCHS:-60}
THREADS=${NOPEEK_THREADS:-1}
DOC=${NOPEEK_DOC:-$ROOT/docs/results/nopeek.md}
PLOTS=${NOPEEK_PLOTS:-$ROOT/docs/results/nopeek}
SEEDS=${NOPEEK_SEEDS:-"7 8"}
OUT=${NOPEEK_OUT:-$(mktemp -d /tmp/volley-nopeek.XXXXXX)}

die() { echo "nopeek: $*" >&2; exit 1; }
for b in "$COORD" "$PEER" "$BENCH"; do
  [ -x "$b" ] || die "$b is not built (VOLLEY_BUILD_DIR=$BUILD)"
done
[ -f "$FM/train-images-idx3-ubyte.gz" ] || die "Fashion-MNIST is not installed ($FM)"
command -v sqlite3 >/dev/null || die "sqlite3 is not installed"
read -r -a alpha_list <<< "$ALPHAS"
[ "${#alpha_list[@]}" -ge 2 ] || die "NOPEEK_ALPHAS needs a baseline and at least one more alpha"
[ "${alpha_list[0]}" = 0 ] || echo "nopeek: the first alpha (${alpha_list[0]}) is the baseline, not 0" >&2

PIDS=()
CPID=""
cleanup() {
  for p in "${PIDS[@]}" $CPID; do kill -9 "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

mkdir -p "$OUT"
[ "${NOPEEK_REPORT_ONLY:-0}" = 1 ] ||
  bash "$ROOT/deploy/make-cert.sh" "$OUT/tls" 127.0.0.1 localhost >/dev/null

# run_alpha A SEED DIR: one split run at alpha A with run seed SEED in DIR,
# to its last version.
run_alpha() {
  local alpha=$1 seed=$2 dir=$3 i token port=""
  rm -rf "$dir"
  mkdir -p "$dir"
  cat > "$dir/run.json" <<JSON
{
  "name": "nopeek",
  "seed": $seed,
  "model": {"kind": "mlp", "in_dim": 784, "hidden": [$HIDDEN], "classes": 10},
  "data": {"kind": "local", "test_images": "$FM/t10k-images-idx3-ubyte.gz",
           "test_labels": "$FM/t10k-labels-idx1-ubyte.gz"},
  "mode": "split",
  "split": {"cut": $CUT, "alpha": $alpha},
  "updates_per_version": $PEERS,
  "max_versions": $VERSIONS,
  "train": {"steps": $STEPS, "batch": $BATCH, "lr": $LR},
  "outer": {"lr": 1.0, "momentum": 0.0},
  "lease_s": 600,
  "max_body_bytes": 16777216
}
JSON
  "$COORD" init --db "$dir/run.db" --config "$dir/run.json" 2> "$dir/init.log" \
    || die "alpha $alpha: init: $(tail -n 1 "$dir/init.log")"
  nice "$COORD" serve --db "$dir/run.db" --cert "$OUT/tls/server.pem" \
    --key "$OUT/tls/server.key" --listen 127.0.0.1:0 2> "$dir/coordinator.log" &
  CPID=$!
  for _ in $(seq 1 200); do
    port=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$dir/coordinator.log" | head -n1 | cut -d: -f2 || true)
    [ -n "$port" ] && break
    kill -0 "$CPID" 2>/dev/null || die "alpha $alpha: the coordinator exited at start"
    sleep 0.1
  done
  [ -n "$port" ] || die "alpha $alpha: the coordinator did not report its port"
  for i in $(seq 1 "$PEERS"); do
    token=$("$COORD" token create --db "$dir/run.db" --uses 1 --ttl 1h) || die "token create"
    "$PEER" keygen --dir "$dir/peer$i" > /dev/null || die "keygen $i"
    "$PEER" join --dir "$dir/peer$i" --coordinator "https://127.0.0.1:$port" --token "$token" \
      --cacert "$OUT/tls/ca.pem" --name "nopeek-$i" > /dev/null 2> "$dir/join$i.log" \
      || die "alpha $alpha: join $i: $(tail -n 1 "$dir/join$i.log")"
  done
  PIDS=()
  for i in $(seq 1 "$PEERS"); do
    nice "$PEER" run --dir "$dir/peer$i" --threads "$THREADS" --wait 10 --retries 12 \
      --data "$FM/train-images-idx3-ubyte.gz" --partition "$((i - 1))/$PEERS" 2> "$dir/peer$i.log" &
    PIDS+=($!)
  done
  for p in "${PIDS[@]}"; do
    wait "$p" || die "alpha $alpha: a peer failed: $(tail -n 2 "$dir"/peer*.log | tr '\n' ' ')"
  done
  PIDS=()
  kill -TERM "$CPID"
  wait "$CPID" || die "alpha $alpha: the coordinator exited with an error"
  CPID=""
  [ "$(sqlite3 "$dir/run.db" 'SELECT current_version FROM run')" = "$VERSIONS" ] \
    || die "alpha $alpha: the run stopped before version $VERSIONS"
  # The merged updates' bodies (about 1 MB each) are not measured, and a
  # sweep would otherwise leave most of a gigabyte behind.
  rm -rf "$dir/run.db-bodies"
}

if [ "${NOPEEK_REPORT_ONLY:-0}" != 1 ]; then
: > "$OUT/lines.txt"
t_start=$(date +%s)
for alpha in $ALPHAS; do
  for seed in $SEEDS; do
    dir="$OUT/alpha-$alpha-s$seed"
    t0=$(date +%s)
    run_alpha "$alpha" "$seed" "$dir"
    t1=$(date +%s)
    nice "$BENCH" eval --db "$dir/run.db" --train-images "$FM/train-images-idx3-ubyte.gz" \
      --test-images "$FM/t10k-images-idx3-ubyte.gz" --leak "$LEAK" --epochs "$EPOCHS" \
      --show 8 --out "$dir/recon" --threads "$THREADS" --seed "$seed" \
      > "$dir/eval.txt" 2> "$dir/eval.log" || die "alpha $alpha: eval: $(cat "$dir/eval.log")"
    t2=$(date +%s)
    line=$(grep '^nopeek ' "$dir/eval.txt")
    echo "$line seed=$seed run_s=$((t1 - t0)) eval_s=$((t2 - t1))" >> "$OUT/lines.txt"
    echo "nopeek: seed $seed, $(sed -n 2p "$dir/eval.txt") [run $((t1 - t0)) s, eval $((t2 - t1)) s]" >&2
  done
done
echo $(( $(date +%s) - t_start )) > "$OUT/total_s"
fi
[ -s "$OUT/lines.txt" ] || die "no results in $OUT/lines.txt"
total_s=$(cat "$OUT/total_s")

# The table: per alpha, the mean over the seeds (the range in brackets when
# there are several), each against the first alpha's (alpha 0's) runs of
# the same seeds; the ratios are of the means, and each seed's own ratio
# against its own alpha 0 run gives the range. Also writes plot.tsv (x,
# accuracy %, MSE ratio, dCor, alpha; alpha 0 at a tenth of the smallest
# positive alpha, for the log axis), parts.md (which part of the target
# each alpha meets) and hits.txt (the alphas that meet all of it).
rows=$(awk -v out="$OUT" '
  function rng(lo, hi, fmt) { return (lo == hi) ? "" : sprintf(" (" fmt " to " fmt ")", lo, hi) }
  {
    delete f
    for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    a = f["alpha"]; s = f["seed"]
    if (!(a in na)) { order[++nalpha] = a; na[a] = 0 }
    sd[a, ++na[a]] = s
    acc[a, s] = f["accuracy"]; dc[a, s] = f["dcor"]; am[a, s] = f["attack_mse"]
    as[a, s] = f["attack_ssim"]; mm[a, s] = f["mean_mse"]; ms[a, s] = f["mean_ssim"]
  }
  END {
    a0 = order[1]; amin = 0
    for (k = 1; k <= nalpha; k++) if (order[k] > 0 && (amin == 0 || order[k] < amin)) amin = order[k]
    if (amin == 0) amin = 1
    hits = ""; printf "" > (out "/parts.md")
    for (k = 1; k <= nalpha; k++) {
      a = order[k]; n = na[a]
      Macc = Mdc = Mam = Mas = Mmm = Mms = M0acc = M0am = 0; ok = 0
      lo_acc = lo_g = lo_r = 1e9; hi_acc = hi_g = hi_r = -1e9
      for (j = 1; j <= n; j++) {
        s = sd[a, j]
        Macc += acc[a, s] / n; Mdc += dc[a, s] / n; Mam += am[a, s] / n; Mas += as[a, s] / n
        Mmm += mm[a, s] / n; Mms += ms[a, s] / n
        M0acc += acc[a0, s] / n; M0am += am[a0, s] / n
        g = 100 * (acc[a, s] - acc[a0, s]); r = am[a, s] / am[a0, s]
        if (100 * acc[a, s] < lo_acc) lo_acc = 100 * acc[a, s]
        if (100 * acc[a, s] > hi_acc) hi_acc = 100 * acc[a, s]
        if (g < lo_g) lo_g = g
        if (g > hi_g) hi_g = g
        if (r < lo_r) lo_r = r
        if (r > hi_r) hi_r = r
        if (g >= -2 && dc[a, s] < 0.5 && r >= 2) ok++
      }
      gain = 100 * (Macc - M0acc); ratio = Mam / M0am
      if (k == 1) spread0 = hi_acc - lo_acc
      printf "| %s | %.2f%%%s | %+.2f%s | %.3f | %.4f | %.3f | %.2f%s | %.4f | %.2f | %.3f |\n",
        a, 100 * Macc, rng(lo_acc, hi_acc, "%.2f"), gain, rng(lo_g, hi_g, "%+.2f"), Mdc, Mam, Mas,
        ratio, rng(lo_r, hi_r, "%.2f"), Mmm, Mam / Mmm, Mms
      printf "%s\t%.4f\t%.4f\t%.4f\t%s\n", (a > 0) ? a : amin / 10, 100 * Macc, ratio, Mdc, a \
        > (out "/plot.tsv")
      if (k == 1) continue
      met = (gain >= -2 && Mdc < 0.5 && ratio >= 2)
      if (met) hits = hits (hits == "" ? "" : ", ") a
      if (met && ok < n)
        thin = thin sprintf("At alpha %s the whole target holds for %d of the %d seeds on their own. ", a, ok, n)
      printf "- alpha %s: accuracy %s (%+.2f points), dCor %s (%.3f), attack MSE %s (%.2fx alpha 0)%s%s\n",
        a, (gain >= -2) ? "kept" : "lost", gain, (Mdc < 0.5) ? "below 0.5" : "not below 0.5", Mdc,
        (ratio >= 2) ? "doubled" : "not doubled", ratio,
        (n > 1) ? sprintf("; the whole target holds for %d of %d seeds on their own", ok, n) : "",
        (met || 2 * M0am <= Mmm) ? "" : sprintf("; doubling would need MSE %.4f, above the mean image'"'"'s %.4f", 2 * M0am, Mmm) \
        > (out "/parts.md")
    }
    print hits > (out "/hits.txt")
    if (thin != "")
      thin = thin sprintf("The margin is within the run-to-run noise: the alpha = 0 runs alone differ by %.2f points of accuracy between seeds.", spread0)
    print thin > (out "/thin.txt")
  }' "$OUT/lines.txt")
verdict_hits=$(cat "$OUT/hits.txt")
thin=$(cat "$OUT/thin.txt")
parts=$(cat "$OUT/parts.md")

# The reconstructions: originals, then one row per alpha in sweep order.
recons=()
seed1=${SEEDS%% *}
for alpha in $ALPHAS; do recons+=("$OUT/alpha-$alpha-s$seed1/recon.recon.f32"); done
mkdir -p "$(dirname "$PLOTS")"
"$BENCH" grid --out "$PLOTS-reconstructions.png" "$OUT/alpha-${alpha_list[0]}-s$seed1/recon.orig.f32" "${recons[@]}" >&2

# The trade-off: alpha 0 sits at the left edge of a log axis, at a tenth
# of the smallest positive alpha, and is labelled as 0.
if command -v gnuplot >/dev/null; then
  term='pngcairo size 900,560 font ",10"'
  case $(gnuplot -e 'set terminal' 2>&1 || true) in *pngcairo*) ;; *) term='png size 900,560' ;; esac
  tics=$(awk '{ printf "%s\"%s\" %s", (NR > 1) ? ", " : "", $5, $1 }' "$OUT/plot.tsv")
  gnuplot <<GP
set terminal $term
set output '$PLOTS-tradeoff.png'
set title "NoPeek on Fashion-MNIST: accuracy against leakage (split at layer $CUT, $PEERS peers over TLS)"
set logscale x
set xtics ($tics)
set xlabel 'NoPeek alpha (0 drawn at the left edge)'
set ylabel 'test accuracy (%)'
set y2label 'attack MSE / attack MSE at alpha 0;  dCor(X, Z)'
set ytics nomirror
set y2tics
set y2range [0:*]
set key below
set grid
plot '$OUT/plot.tsv' using 1:2 axes x1y1 with linespoints lw 2 pt 7 title 'test accuracy (%)', \\
     '' using 1:3 axes x1y2 with linespoints lw 2 pt 5 title 'attack MSE ratio vs alpha 0', \\
     '' using 1:4 axes x1y2 with linespoints lw 2 pt 9 dt 2 title 'dCor(X, Z)', \\
     '' using 1:(2) axes x1y2 with lines lw 1 dt 3 lc rgb 'gray40' title 'target: attack MSE ratio 2', \\
     '' using 1:(0.5) axes x1y2 with lines lw 1 dt 4 lc rgb 'gray60' title 'target: dCor 0.5'
GP
  echo "nopeek: $PLOTS-tradeoff.png" >&2
else
  echo "nopeek: gnuplot not installed; no trade-off plot" >&2
fi

if [ -n "$verdict_hits" ]; then
  verdict="**Met** at alpha $verdict_hits: accuracy within 2 points of alpha = 0, dCor(X, Z) below 0.5 and the attack's MSE at least twice alpha = 0's.${thin:+ $thin}"
else
  verdict="**Not met** at any alpha of this sweep: no alpha keeps accuracy within 2 points of alpha = 0 while dCor(X, Z) falls below 0.5 and the attack's MSE at least doubles."
fi

mkdir -p "$(dirname "$DOC")"
nseeds=$(wc -w <<< "$SEEDS")
{
  cat <<MD
# Split learning with NoPeek: what the cut leaks (Fashion-MNIST)

Run it (the sweep below took $(( (total_s + 59) / 60 )) minutes on this machine's $(nproc) shared cores):

\`\`\`sh
cmake -S . -B /tmp/build-nopeek -DCMAKE_BUILD_TYPE=Release -DVOLLEY_CUDA=OFF
nice cmake --build /tmp/build-nopeek -j2 --target bench_nopeek volley-coordinator volley-peer
VOLLEY_BUILD_DIR=/tmp/build-nopeek bash bench/nopeek.sh
\`\`\`

\`NOPEEK_ALPHAS\` sets the sweep and \`NOPEEK_SEEDS\` the repetitions; the
header of \`bench/nopeek.sh\` lists the other settings. The script rewrites
this file and its two pictures (\`NOPEEK_REPORT_ONLY=1\` redoes them from a
kept sweep in \`NOPEEK_OUT\` without running anything).

**Setup.** One real split run per alpha and seed, between processes over
TLS as \`tests/integration/split.sh\` runs one: \`volley-coordinator\`
serving with a certificate from \`deploy/make-cert.sh\`'s private
authority, and $PEERS \`volley-peer\` processes that keygen, join with a
one-use token and train on their IID share of the 60000 training images
(\`--data ... --partition i/$PEERS\`). Model \`{"kind": "mlp", "in_dim":
784, "hidden": [$HIDDEN], "classes": 10}\`, \`"mode": "split"\`,
\`"split": {"cut": $CUT, "alpha": A}\`: the peers keep the layers below the
cut and send their GELU output Z (width $(head -n 1 "$OUT/lines.txt" | grep -o ' q=[0-9]*' | cut -d= -f2)) and the labels; NoPeek
adds alpha times the gradient of dCor(X, Z), taken over the batch, to the
coordinator's dL/dZ on every batch. $VERSIONS versions of $PEERS tasks of
$STEPS steps of batch $BATCH (AdamW, lr $LR; the lower layers merged by
FedAvg each version, the upper ones stepped on every batch by the
coordinator): $((VERSIONS * PEERS * STEPS)) batches through the cut,
$(awk -v n=$((VERSIONS * PEERS * STEPS * BATCH)) 'BEGIN { printf "%.1f", n / 60000 }') epochs of the training set. Seeds: $SEEDS (each
alpha runs once per seed; the seed draws the initial model, the peers'
batches and the attacker's decoder).

**Measured** by \`bench_nopeek eval\` on each run's final version, on the
10000 test images: top-1 accuracy of the whole model; dCor(X, Z), the mean
over the ten batches of 1000 test images (so it is comparable across batch
sizes; the peers minimise it on their own batches of $BATCH); and the
reconstruction attack: an attacker holding $LEAK leaked pairs (X, Z) (the
first $LEAK training images and their activations under the final
model) standardises Z's features on them, trains a decoder Z -> 256 GELU
-> 784 sigmoid (\`model/recon.h\`, Adam 1e-3, batch 32, $EPOCHS epochs)
and decodes every test image's Z. Its MSE per pixel and mean SSIM are set
beside **the same run's baseline**, the mean of the leaked images guessed
for every test image ("mean image"), and beside **the alpha = 0 runs of
the same sweep and seeds** (the "vs alpha 0" and ratio columns).

## Results

Measured $(date -u +%Y-%m-%d) on $(nproc) shared cores; $total_s s for the
whole sweep. Means over the $nseeds seeds; in brackets, the range over the
seeds (for the "vs alpha 0" and ratio columns, each seed against its own
alpha = 0 run).

| alpha | test accuracy | vs alpha 0 (points) | dCor(X, Z) | attack MSE | attack SSIM | attack MSE / alpha 0's | mean-image MSE | attack MSE / mean image's | mean-image SSIM |
|---|---|---|---|---|---|---|---|---|---|
$rows

Raw lines of \`bench_nopeek eval\` (with each run's and evaluation's seconds):

\`\`\`
$(cat "$OUT/lines.txt")
\`\`\`

![originals (top row), then the attack's reconstructions at each alpha of the sweep, top to bottom in table order](nopeek-reconstructions.png)

Top row: the first eight test images. Each row below: what the attacker
decodes from their activations, one row per alpha in the table's order
($ALPHAS), from the seed-$seed1 runs.

![test accuracy, attack MSE ratio and dCor against alpha](nopeek-tradeoff.png)

## Verdict

Target: an alpha at which accuracy stays within 2 points of alpha = 0
while dCor(X, Z) falls below 0.5 and the attack's error at least doubles
(judged on the seed means).

$verdict

$parts

## What was tuned, and what was not

Only what belongs to the method moved: the alpha sweep, the batch size
(dCor is a statistic of the batch it is computed on, so NoPeek's gradient
on 32 rows is a noisy, biased estimate of the population's), the width at
the cut, and the length of training (so the layers above the cut can
adapt to the decorrelated Z). The attacker did not change: $LEAK leaked
pairs, the same decoder and epochs for every alpha, and it undoes any
rescaling of Z's features. NoPeek is applied on every batch in every run.
Earlier one-seed sweeps (seed 7) on the way to the defaults, each
reproducible with the settings shown:

| settings | alpha 0 accuracy | best alpha for the target | what failed |
|---|---|---|---|
| NOPEEK_BATCH=32 NOPEEK_STEPS=100 NOPEEK_VERSIONS=10, alphas 0 3 10 30 100 300 | 85.68% | none | alpha 10: -1.72 points, dCor 0.337, MSE 1.40x; alpha 30: -3.12 points, 1.75x; the attack only doubles at alpha 100 (2.50x), where accuracy has fallen to 61.8% |
| NOPEEK_BATCH=128 NOPEEK_STEPS=50 NOPEEK_VERSIONS=10, alphas 0 3 10 30 100 | 86.26% | none | alpha 10: -0.32 points, dCor 0.326, 1.80x; alpha 30: 2.30x but -2.10 points |
| NOPEEK_BATCH=256 NOPEEK_STEPS=25 NOPEEK_VERSIONS=10, alphas 0 3 10 30 100 | 85.03% | 30 (-1.50 points, dCor 0.295, 2.24x) | alpha 10: 1.63x |
| NOPEEK_BATCH=128 NOPEEK_STEPS=50 NOPEEK_HIDDEN="64, 128" (cut width 64), alphas 0 10 30 | 84.27% | none | alpha 10: 1.56x; alpha 30: -3.72 points, 1.96x: a narrower cut leaks nearly as much at alpha 0 (attack MSE 0.0169 against 0.0138 at width 256) and loses more accuracy to NoPeek |
| NOPEEK_BATCH=128 NOPEEK_STEPS=50 NOPEEK_VERSIONS=20, alphas 0 10 20 30 60 | 87.60% | 10 (-0.73, dCor 0.262, 2.02x) and 20 (-1.71, 0.243, 2.22x) | alpha 30: -2.58 points; alpha 60: -3.46 |

Larger batches made NoPeek bite at smaller alphas (dCor at alpha 3 fell
to 0.39 with batches of 128 or 256 against 0.57 with 32), and the longer
run gave it more steps to decorrelate Z (with batches of 128, alpha 10
went from dCor 0.326 and 1.80x at 10 versions to 0.262 and 2.02x at 20,
while alpha 0 gained 1.3 points); the defaults (batch $BATCH, $VERSIONS
versions) come from those two observations. In every sweep the attack's
error grows far more slowly than dCor falls: dCor(X, Z) is below 0.5
already at small alphas while the decoder still recovers the garments'
shapes, so a low dCor alone does not mean that the cut stops leaking.

A run is not bitwise repeatable even with its seed: the coordinator steps
its layers on the peers' batches in the order they arrive
(\`docs/protocol.md\`, \`POST /v1/split/forward\`), so seed 7's alpha = 0
run scored 87.60% in the last tuning sweep above and 87.95% in the first
full sweep of these defaults. Differences of a point between runs are
noise; that is why every alpha runs under two seeds.
MD
} > "$DOC.tmp"
mv "$DOC.tmp" "$DOC"
echo "nopeek: wrote $DOC, $PLOTS-reconstructions.png, $PLOTS-tradeoff.png (runs in $OUT)" >&2
cat "$OUT/lines.txt"
