#!/usr/bin/env bash
# bench/convergence: the demo task (deploy/demo.sh: 4 peers, 40 versions, 20
# local steps, same seeds) once with dense updates and once per compression
# kind and upload ratio. Prints, per run, the final validation loss, the
# loss relative to the dense run of this same invocation, and the bytes
# each peer uploaded and downloaded (model files and deltas; the training
# data is the same for every run and left out), as a Markdown table.
#
# Usage: bash bench/convergence.sh [RATIOS] [KINDS]
#   RATIOS  upload compression against a dense F32 update (default "10 100 1000")
#   KINDS   default "topk gaussk sketch sketch2" (sketch2: sketch with the
#           Sketched-SGD second round, P = 2; its values count as upload)
# Environment: VOLLEY_DEMO_VERSIONS, VOLLEY_DEMO_STEPS, VOLLEY_DEMO_PEERS as
# for the demo; CONV_DTYPE (F16) for the compressed values; CONV_OUTER, the
# outer optimiser of the compressed runs ({"lr": 3.0, "momentum": 0.0}: a
# coordinate sent by one peer of four is averaged down fourfold, so a larger
# step makes up for it, and server momentum on top of error-feedback
# bursts overshoots); CONV_OUT
# (bench-convergence) for the runs' directories. The dense baseline runs
# with the demo's DiLoCo outer step and, for reference, with CONV_OUTER.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ratios=${1:-"10 100 1000"}
kinds=${2:-"topk gaussk sketch sketch2"}
dtype=${CONV_DTYPE:-F16}
comp_outer=${CONV_OUTER:-'{"lr": 3.0, "momentum": 0.0}'}
out=${CONV_OUT:-$root/bench-convergence}
mkdir -p "$out"

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

echo "convergence: demo task, $(nproc) cores, values $dtype; runs in $out" >&2
read -r d_loss d_up d_down d_s < <(run dense '{"kind": "none", "dtype": "F32"}' \
  '{"lr": 0.7, "momentum": 0.9}')
read -r f_loss f_up f_down f_s < <(run dense-outer2 '{"kind": "none", "dtype": "F32"}' \
  "$comp_outer")
printf '| kind | upload ratio | final val loss | vs dense | upload/peer (bytes) | upload vs dense | download/peer (bytes) | wall s |\n'
printf '|---|---|---|---|---|---|---|---|\n'
printf '| none (dense F32, outer 0.7/0.9) | 1 | %.4f | 1.000 | %.0f | 1 | %.0f | %.1f |\n' \
  "$d_loss" "$d_up" "$d_down" "$d_s"
awk -v l="$f_loss" -v dl="$d_loss" -v u="$f_up" -v d="$f_down" -v s="$f_s" -v o="$comp_outer" 'BEGIN {
  printf "| none (dense F32, outer %s) | 1 | %.4f | %.3f | %.0f | 1 | %.0f | %.1f |\n",
         o, l, l / dl, u, d, s }' 
for kind in $kinds; do
  for r in $ratios; do
    extra="" wire=$kind
    if [ "$kind" = sketch2 ]; then extra=', "second_round": 2'; wire=sketch; fi
    read -r loss up down s < <(run "$kind-$r" \
      "{\"kind\": \"$wire\", \"dtype\": \"$dtype\", \"ratio\": $r$extra}" "$comp_outer")
    awk -v k="$kind" -v r="$r" -v l="$loss" -v dl="$d_loss" -v u="$up" -v du="$d_up" \
        -v d="$down" -v s="$s" 'BEGIN {
      printf "| %s | %s | %.4f | %.3f | %.0f | %.0fx less | %.0f | %.1f |\n",
             k, r, l, l / dl, u, du / u, d, s }'
  done
done
