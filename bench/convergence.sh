#!/usr/bin/env bash
# bench/convergence: the demo task (deploy/demo.sh: 4 peers, 40 versions, 20
# local steps, same seeds) once with dense updates and once per compression
# kind and upload ratio, each repeated. Prints, per configuration, the mean
# final validation loss over the repeats with its range, the mean relative
# to the dense mean of this same invocation, and the bytes each peer
# uploaded and downloaded (model files and deltas; the training data is the
# same for every run and left out), as a Markdown table.
#
# Repeats matter: which peer trains which task depends on timing, so two
# runs of one configuration end a few percent apart (mostly by when the
# run leaves the plateau near 2.8 nats); one run each would compare luck.
#
# Usage: bash bench/convergence.sh [RATIOS] [KINDS]
#   RATIOS  upload compression against a dense F32 update (default "10 100 1000")
#   KINDS   default "topk gaussk topk-plain gaussk-plain sketch sketch-noround":
#           topk selects over slices of CONV_BLOCK coordinates, and topk and
#           gaussk keep a residual decaying by CONV_DECAY per task; the
#           -plain kinds are the classic global selection with undecayed
#           error feedback;
#           sketch is the sketch as a run gets it from its kind and ratio
#           alone (the second round on, its values counting as upload, and
#           the sketch's own outer step); sketch-noround turns the round
#           off (second_round 0), as an async run must
# Environment: CONV_REPEATS (3) runs per configuration; CONV_DTYPE (F16)
# for the compressed values; CONV_BLOCK (512) and CONV_DECAY (0.9);
# CONV_OUTER, the outer optimiser of the compressed runs ({"lr": 3.0,
# "momentum": 0.0}: a coordinate sent by one peer of four is averaged down
# fourfold, so a larger step makes up for it, short of N = 4, which
# overshoots at 10x where peers often send the same coordinates; server
# momentum on top of error-feedback bursts overshoots); CONV_OUT (bench-convergence)
# for the runs' directories. The dense baseline runs with the demo's
# DiLoCo outer step and, once for reference, with CONV_OUTER.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ratios=${1:-"10 100 1000"}
kinds=${2:-"topk gaussk topk-plain gaussk-plain sketch sketch-noround"}
repeats=${CONV_REPEATS:-3}
dtype=${CONV_DTYPE:-F16}
block=${CONV_BLOCK:-512}
decay=${CONV_DECAY:-0.9}
comp_outer=${CONV_OUTER:-'{"lr": 3.0, "momentum": 0.0}'}
out=${CONV_OUT:-$root/bench-convergence}
mkdir -p "$out"
case $repeats in '' | *[!0-9]* | 0) echo "convergence: CONV_REPEATS must be a positive integer" >&2; exit 2 ;; esac

# run NAME COMPRESSION_JSON OUTER_JSON: one demo run; prints "loss up down
# seconds".
run() {
  local dir=$out/$1
  local t0 t1
  t0=$(date +%s.%N)
  VOLLEY_DEMO_DIR=$dir VOLLEY_DEMO_COMPRESSION=$2 VOLLEY_DEMO_OUTER=$3 \
    bash deploy/demo.sh > "$out/$1.log" 2>&1 || true
  # A run that finished but did not learn is a result; anything else is not.
  [ "$(sqlite3 "$dir/run.db" "SELECT status FROM run" 2>/dev/null)" = finished ] \
    || { tail -n 20 "$out/$1.log" >&2; echo "convergence: run $1 failed" >&2; exit 1; }
  t1=$(date +%s.%N)
  local loss
  loss=$(sqlite3 "$dir/run.db" "SELECT val_loss FROM versions ORDER BY version DESC LIMIT 1")
  # Per peer, averaged over the peers.
  grep -h "traffic:" "$dir"/peer*.log | awk -v loss="$loss" -v s="$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" '
    { for (i = 1; i <= NF; i++) {
        if ($i == "uploaded") up += $(i + 1)
        if ($i == "models,") mod += $(i - 3)
        if ($i == "deltas") del += $(i - 3)
      }
      n++ }
    END { printf "%s %.0f %.0f %.1f\n", loss, up / n, (mod + del) / n, s }'
}

# runs NAME REPEATS COMPRESSION_JSON OUTER_JSON: the configuration REPEATS
# times; prints "mean min max up down seconds" (bytes and seconds are means).
runs() {
  local i
  for i in $(seq 1 "$2"); do run "$1-r$i" "$3" "$4"; done | awk '
    { l[NR] = $1; s += $1; u += $2; d += $3; t += $4 }
    END { lo = l[1]; hi = l[1]
          for (i = 2; i <= NR; i++) { if (l[i] < lo) lo = l[i]; if (l[i] > hi) hi = l[i] }
          printf "%.6f %.6f %.6f %.0f %.0f %.1f\n", s / NR, lo, hi, u / NR, d / NR, t / NR }'
}

echo "convergence: demo task, $(nproc) cores, values $dtype, $repeats runs per row;" \
     "runs in $out" >&2
read -r d_loss d_lo d_hi d_up d_down d_s < <(runs dense "$repeats" \
  '{"kind": "none", "dtype": "F32"}' '{"lr": 0.7, "momentum": 0.9}')
read -r f_loss f_lo f_hi f_up f_down f_s < <(runs dense-outer2 1 \
  '{"kind": "none", "dtype": "F32"}' "$comp_outer")
printf '| kind | upload ratio | runs | final val loss, mean (range) | vs dense | upload/peer (bytes) | upload vs dense | download/peer (bytes) | wall s |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
printf '| none (dense F32, outer 0.7/0.9) | 1 | %s | %.4f (%.4f-%.4f) | 1.000 | %.0f | 1 | %.0f | %.1f |\n' \
  "$repeats" "$d_loss" "$d_lo" "$d_hi" "$d_up" "$d_down" "$d_s"
awk -v l="$f_loss" -v dl="$d_loss" -v u="$f_up" -v d="$f_down" -v s="$f_s" -v o="$comp_outer" 'BEGIN {
  printf "| none (dense F32, outer %s) | 1 | 1 | %.4f | %.3f | %.0f | 1 | %.0f | %.1f |\n",
         o, l, l / dl, u, d, s }'
for kind in $kinds; do
  for r in $ratios; do
    extra="" wire=$kind outer=$comp_outer
    case $kind in
      topk) extra=", \"block\": $block, \"decay\": $decay" ;;
      gaussk) extra=", \"decay\": $decay" ;;
      topk-plain | gaussk-plain) wire=${kind%-plain} ;;
      sketch) outer="" ;;
      sketch-noround) extra=', "second_round": 0' wire=sketch outer="" ;;
      *) echo "convergence: unknown kind '$kind'" >&2; exit 2 ;;
    esac
    read -r loss lo hi up down s < <(runs "$kind-$r" "$repeats" \
      "{\"kind\": \"$wire\", \"dtype\": \"$dtype\", \"ratio\": $r$extra}" "$outer")
    awk -v k="$kind" -v r="$r" -v n="$repeats" -v l="$loss" -v lo="$lo" -v hi="$hi" \
        -v dl="$d_loss" -v u="$up" -v du="$d_up" -v d="$down" -v s="$s" 'BEGIN {
      printf "| %s | %s | %s | %.4f (%.4f-%.4f) | %.3f | %.0f | %.0fx less | %.0f | %.1f |\n",
             k, r, n, l, lo, hi, l / dl, u, du / u, d, s }'
  done
done
