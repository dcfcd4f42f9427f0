#!/usr/bin/env bash
# bench/convergence: the demo task (deploy/demo.sh: 4 peers, 40 versions, 20
# local steps) for every configuration on every corpus with every seed.
# Prints, per corpus, a Markdown table of final validation loss (mean over
# the seeds, with the range), upload per update and wall time, each
# against the dense run; then the slow-peer comparison (synchronous against
# asynchronous training with one peer CONV_SLOW times slower); and draws
# the loss curves as PNGs with gnuplot.
#
# Usage: bash bench/convergence.sh [CONFIGURATIONS]
#   CONFIGURATIONS (the table's row labels, in that order; default all of
#   them):
#     dense       sync, {"kind": "none", "dtype": "F32"}, outer
#                 {"lr": 0.7, "momentum": 0.9}: the baseline of "vs dense"
#     topk-R gaussk-R sketch-R
#                 sync, compression {"kind": K, "ratio": R} and nothing else,
#                 the outer step left to the coordinator's default: what is
#                 measured is what a user gets without tuning. A bare kind
#                 (topk) stands for every ratio of CONV_RATIOS.
#     sync-slow   as dense, with peer 1 CONV_SLOW times slower
#     async-slow  mode async, dense updates, default outer step, the same
#                 slow peer, CONV_ASYNC_UPV updates per version and
#                 CONV_ASYNC_SPAN times the merged updates of a sync run
#     async       as async-slow without the slow peer
#
# Environment:
#   CONV_CORPORA   "licenses fortunes": licenses is /usr/share/common-licenses
#                  (the demo's default), fortunes /usr/share/games/fortunes
#                  (deploy/install-deps.sh installs it); any other word is
#                  taken as a path whose base name labels it
#   CONV_SEEDS     "1337 2024": every configuration runs once per seed
#   CONV_RATIOS    "10 30 100": upload ratios of the compressed kinds
#   CONV_VERSIONS  40: versions of a sync run; async runs get
#                  CONV_VERSIONS * 4 * CONV_ASYNC_SPAN / CONV_ASYNC_UPV,
#                  rounded up
#   CONV_ASYNC_SPAN 2: async runs merge this many times the sync run's
#                  updates, so that the time to reach the sync run's final
#                  loss can be measured even when it takes more updates; the
#                  loss at equal merged updates is read off their curves
#   CONV_ASYNC_COMPRESSION  the compression object of the async runs
#                  (default: the dense runs', F32), e.g. '{"kind": "topk",
#                  "ratio": 100}', to measure a compressed async run against
#                  the dense synchronous one
#   CONV_SLOW      4: the --slowdown of peer 1 in the -slow runs
#   CONV_ASYNC_UPV 4: updates_per_version of the async runs (one update
#                  from each peer, as lease_wait, on by default, expects)
#   CONV_OUT       bench-convergence: one folder per corpus, holding each
#                  run's folder (CONFIG-sSEED: the demo's run.db, logs and
#                  curve.tsv, summary.tsv), its demo output (CONFIG-sSEED.log)
#                  and the seed-mean curves (CONFIG.mean.tsv)
#   CONV_PLOTS     docs/results/convergence: CORPUS-updates.png (validation
#                  loss against merged updates, every configuration) and
#                  CORPUS-seconds.png (against wall seconds: dense, sync-slow,
#                  async-slow, async); seed means in both
#   CONV_RESUME    1: keep runs that already have a summary.tsv
#   CONV_EXTRA     more run configuration for every run (VOLLEY_DEMO_EXTRA),
#                  e.g. '"val_tokens": 32768,': the coordinator scores up to
#                  262144 held-out bytes per version, which on fortunes (ten
#                  times the licenses' held-out slice) takes a large share of
#                  the wall time on two cores
#   CONV_PLOT_ONLY 1: run nothing; tables and plots from the runs in CONV_OUT
#                  (their data files remade from run.db where it is kept)
#   VOLLEY_BUILD_DIR, passed to deploy/demo.sh (build)
#
# Wall seconds count from the coordinator's start (its last log line before
# "listening on") to the version's first log line (its val_loss, or its
# check_loss when served on a loss check, "val_check_tokens"); the peers
# join within the first second. Merged updates are versions.num_updates
# summed up to the version. A version served on its check that the
# background left unscored has no point on the curve; the loss at a
# number of updates is read off the line between the nearest scored
# versions. A run that does not finish stops the benchmark; one that
# finishes without learning is a result like any other.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
corpora=${CONV_CORPORA:-"licenses fortunes"}
seeds=${CONV_SEEDS:-"1337 2024"}
ratios=${CONV_RATIOS:-"10 30 100"}
versions=${CONV_VERSIONS:-40}
slow=${CONV_SLOW:-4}
async_upv=${CONV_ASYNC_UPV:-4}
async_span=${CONV_ASYNC_SPAN:-2}
out=${CONV_OUT:-$root/bench-convergence}
plots=${CONV_PLOTS:-$root/docs/results/convergence}
resume=${CONV_RESUME:-0}
plot_only=${CONV_PLOT_ONLY:-0}
extra=${CONV_EXTRA:-}
peers=4
dense_comp='{"kind": "none", "dtype": "F32"}'
async_comp=${CONV_ASYNC_COMPRESSION:-$dense_comp}
dense_outer='{"lr": 0.7, "momentum": 0.9}'

die() { echo "convergence: $*" >&2; exit 2; }
posint() { case $2 in '' | *[!0-9]* | 0*) die "$1 must be a positive integer" ;; esac; }
posint CONV_VERSIONS "$versions"
posint CONV_SLOW "$slow"
posint CONV_ASYNC_UPV "$async_upv"
posint CONV_ASYNC_SPAN "$async_span"
# Rounded up, so that an async run merges at least the updates asked for.
async_versions=$(((versions * peers * async_span + async_upv - 1) / async_upv))

configs=()
for c in ${1:-dense topk gaussk sketch sync-slow async-slow async}; do
  case $c in
    topk | gaussk | sketch) for r in $ratios; do configs+=("$c-$r"); done ;;
    dense | sync-slow | async-slow | async) configs+=("$c") ;;
    topk-* | gaussk-* | sketch-*)
      case ${c#*-} in '' | *[!0-9.]*) die "bad ratio in '$c'" ;; esac
      configs+=("$c") ;;
    *) die "unknown configuration '$c'" ;;
  esac
done

corpus_path() {
  case $1 in
    licenses) echo /usr/share/common-licenses ;;
    fortunes) echo /usr/share/games/fortunes ;;
    *) echo "$1" ;;
  esac
}
corpus_label() { case $1 in licenses | fortunes) echo "$1" ;; *) basename "$1" ;; esac; }

# One training run: CORPUS-PATH SEED CONFIG DIR. Sets the demo's knobs for
# the configuration; everything else stays the demo's.
train() {
  local corpus=$1 seed=$2 c=$3 dir=$4
  local mode=sync comp=$dense_comp outer=$dense_outer pslow=1 upv=$peers v=$versions
  case $c in
    topk-* | gaussk-* | sketch-*)
      comp="{\"kind\": \"${c%%-*}\", \"ratio\": ${c#*-}}" outer=default ;;
    sync-slow) pslow=$slow ;;
    async-slow | async)
      mode=async outer=default upv=$async_upv v=$async_versions comp=$async_comp
      if [ "$c" = async-slow ]; then pslow=$slow; fi ;;
  esac
  VOLLEY_DEMO_DIR=$dir VOLLEY_DEMO_CORPUS=$corpus VOLLEY_DEMO_SEED=$seed \
    VOLLEY_DEMO_MODE=$mode VOLLEY_DEMO_COMPRESSION=$comp VOLLEY_DEMO_OUTER=$outer \
    VOLLEY_DEMO_SLOW=$pslow VOLLEY_DEMO_UPV=$upv VOLLEY_DEMO_VERSIONS=$v \
    VOLLEY_DEMO_PEERS=$peers VOLLEY_DEMO_STEPS=20 VOLLEY_DEMO_EXTRA=$extra VOLLEY_DEMO_CHECK= \
    bash deploy/demo.sh > "$dir.log" 2>&1
}

# Timestamps are UTC (2026-11-26T18:58:01.071Z); seconds since 1970 from
# the civil date, since mawk has no mktime.
awk_secs='
function secs(ts,   y, m, d, e, yoe, doy) {
  y = substr(ts, 1, 4) + 0; m = substr(ts, 6, 2) + 0; d = substr(ts, 9, 2) + 0
  if (m <= 2) y--
  e = int(y / 400); yoe = y - e * 400
  doy = int((153 * (m > 2 ? m - 3 : m + 9) + 2) / 5) + d - 1
  d = e * 146097 + yoe * 365 + int(yoe / 4) - int(yoe / 100) + doy - 719468
  return d * 86400 + substr(ts, 12, 2) * 3600 + substr(ts, 15, 2) * 60 + substr(ts, 18, 6)
}'

# DIR/curve.tsv (version, merged updates, seconds, val_loss, train_loss)
# and DIR/summary.tsv (final val_loss, bytes uploaded per update, wall
# seconds, merged updates, versions) from the run's database, coordinator
# log and peer logs.
extract() {
  local dir=$1
  {
    awk "$awk_secs"'
      /^listening on/ { started = 1; next }
      !/^[0-9][0-9][0-9][0-9]-/ { next }
      !started || t0 == "" { t0 = secs($1) }
      / version [0-9]+ (val_loss|check_loss) / {
        for (i = 2; i < NF; i++) if ($i == "version") { printf "T %d %.3f\n", $(i + 1), secs($1) - t0; break }
      }' "$dir/coordinator.log"
    sqlite3 -separator ' ' "$dir/run.db" \
      "SELECT 'V', version, num_updates, coalesce(val_loss, 'NULL'), coalesce(train_loss, '')
       FROM versions ORDER BY version"
  } | awk '
    $1 == "T" { if (!($2 in t)) t[$2] = $3; next }
    { cum += $3
      if ($4 == "NULL") next
      printf "%d\t%d\t%.3f\t%.6f\t%s\n", $2, cum, ($2 in t) ? t[$2] : 0, $4, $5 }' > "$dir/curve.tsv"
  # Upload per update is what the peers sent in all (their exit lines),
  # over the updates: a sketch run's second-round values are part of it.
  local bytes n_up
  n_up=$(sqlite3 "$dir/run.db" "SELECT count(*) FROM updates")
  bytes=$(cat "$dir"/peer*.log 2>/dev/null | awk -v n="$n_up" '
    /traffic: uploaded/ { for (i = 1; i <= NF; i++) if ($i == "uploaded") up += $(i + 1) }
    END { printf "%.0f", (n > 0 ? up / n : 0) }')
  awk -F '\t' -v b="$bytes" '{ last = $0; l = $4; s = $3; u = $2; v = $1 }
    END { printf "%.6f\t%.0f\t%.3f\t%d\t%d\n", l, b, s, u, v }' "$dir/curve.tsv" > "$dir/summary.tsv"
}

# The per-version mean over the seeds' curves: CORPUS-DIR CONFIG.
mean_curve() {
  local cdir=$1 c=$2 s files=()
  for s in $seeds; do
    if [ -f "$cdir/$c-s$s/curve.tsv" ]; then files+=("$cdir/$c-s$s/curve.tsv"); fi
  done
  [ "${#files[@]}" -gt 0 ] || return 0
  awk -F '\t' '{ n[$1]++; u[$1] += $2; t[$1] += $3; l[$1] += $4; if ($1 > max) max = $1 }
    END { for (v = 0; v <= max; v++) if (v in n)
            printf "%d\t%.1f\t%.3f\t%.6f\t%d\n", v, u[v] / n[v], t[v] / n[v], l[v] / n[v], n[v] }' \
    "${files[@]}" > "$cdir/$c.mean.tsv"
}

# Markdown tables for one corpus from the runs' summary and curve files.
report() {
  local label=$1 cdir=$2 c s
  echo
  echo "### $label"
  echo
  {
    for c in "${configs[@]}"; do
      for s in $seeds; do
        if [ -f "$cdir/$c-s$s/summary.tsv" ]; then
          printf '%s\t%s\t%s\n' "$c" "$s" "$(cat "$cdir/$c-s$s/summary.tsv")"
        fi
      done
    done
  } | awk -F '\t' '
    { if (!($1 in n)) order[++k] = $1
      n[$1]++; l[$1] += $3; b[$1] += $4; w[$1] += $5
      if (!($1 in lo) || $3 < lo[$1]) lo[$1] = $3
      if (!($1 in hi) || $3 > hi[$1]) hi[$1] = $3 }
    END {
      print "| configuration | runs | final val loss, mean (min-max) | vs dense | bytes per update | upload vs dense | wall s, mean |"
      print "|---|---|---|---|---|---|---|"
      dl = ("dense" in n) ? l["dense"] / n["dense"] : 0
      db = ("dense" in n) ? b["dense"] / n["dense"] : 0
      for (i = 1; i <= k; i++) {
        c = order[i]; m = l[c] / n[c]; mb = b[c] / n[c]
        vs = dl > 0 ? sprintf("%.3f", m / dl) : "-"
        up = (db > 0 && mb > 0) ? (mb < db * 0.995 ? sprintf("%.1fx less", db / mb) : "1") : "-"
        printf "| %s | %d | %.4f (%.4f-%.4f) | %s | %.0f | %s | %.1f |\n",
               c, n[c], m, lo[c], hi[c], vs, mb, up, w[c] / n[c] }
      if (k == 0) print "| (no finished runs) | | | | | | |" }'

  local have_sync=0 have_async=0
  for s in $seeds; do
    if [ -f "$cdir/sync-slow-s$s/summary.tsv" ]; then have_sync=1; fi
    if [ -f "$cdir/async-slow-s$s/curve.tsv" ]; then have_async=1; fi
  done
  [ "$have_sync" = 1 ] && [ "$have_async" = 1 ] || return 0
  echo
  {
    for s in $seeds; do
      if [ -f "$cdir/sync-slow-s$s/summary.tsv" ]; then
        printf 'S\t%s\n' "$(cat "$cdir/sync-slow-s$s/summary.tsv")"
      fi
    done
    for s in $seeds; do
      if [ -f "$cdir/async-slow-s$s/curve.tsv" ]; then
        awk -v s="$s" '{ printf "A\t%s\t%s\n", s, $0 }' "$cdir/async-slow-s$s/curve.tsv"
      fi
    done
  } | awk -F '\t' -v slow="$slow" '
    $1 == "S" { ns++; sl += $2; sw += $4; su += $5; next }
    { s = $2; if (!(s in seen)) { seen[s] = 1; order[++k] = s }
      if (!(s in reach) && ns > 0 && $6 <= sl / ns) reach[s] = $5
      # Between two scored versions (an async run served on its loss check
      # may leave some unscored), the loss is read off the line joining them.
      if (!(s in at) && ns > 0 && $4 >= su / ns) {
        at[s] = (s in pu && $4 > su / ns) ? pl[s] + ($6 - pl[s]) * (su / ns - pu[s]) / ($4 - pu[s]) : $6
        atu[s] = $4 }
      pu[s] = $4; pl[s] = $6 }
    END {
      L = sl / ns; W = sw / ns; U = su / ns
      printf "Slow peer (peer 1 %sx slower): sync-slow ends at val loss %.4f after %.1f s and %.0f merged updates (means over %d runs).\n\n",
             slow, L, W, U, ns
      print "| async-slow run | wall s to reach it | vs sync-slow wall | val loss at " sprintf("%.0f", U) " merged updates | vs sync-slow loss |"
      print "|---|---|---|---|---|"
      for (i = 1; i <= k; i++) {
        s = order[i]
        if (s in reach) { rt = sprintf("%.1f", reach[s]); rr = sprintf("%.3f", reach[s] / W); nr++; tr += reach[s] }
        else { rt = "not reached"; rr = "-" }
        if (s in at) { la = sprintf("%.4f", at[s]); lr = sprintf("%.3f", at[s] / L); na++; ta += at[s] }
        else { la = "not reached"; lr = "-" }
        printf "| seed %s | %s | %s | %s | %s |\n", s, rt, rr, la, lr }
      if (k > 1) {
        rt = nr ? sprintf("%.1f", tr / nr) : "not reached"; rr = nr ? sprintf("%.3f", tr / nr / W) : "-"
        if (nr && nr < k) rt = rt sprintf(" (%d of %d reached)", nr, k)
        la = na ? sprintf("%.4f", ta / na) : "not reached"; lr = na ? sprintf("%.3f", ta / na / L) : "-"
        printf "| mean | %s | %s | %s | %s |\n", rt, rr, la, lr }
      printf "\nTargets: async-slow reaches the sync-slow loss in at most half its wall time (%s), within 2%% of its loss at equal merged updates (%s).\n",
             nr == k && tr / nr / W <= 0.5 ? "met" : "not met", na == k && ta / na / L <= 1.02 ? "met" : "not met" }'
}

# Two PNGs per corpus from the seed-mean curves.
plot() {
  local label=$1 cdir=$2 c series x
  command -v gnuplot >/dev/null || { echo "convergence: gnuplot not installed; no plots" >&2; return 0; }
  mkdir -p "$plots"
  local term='pngcairo size 900,560 font ",10"'
  case $(gnuplot -e 'set terminal' 2>&1 || true) in *pngcairo*) ;; *) term='png size 900,560' ;; esac
  for x in updates seconds; do
    series=""
    for c in "${configs[@]}"; do
      [ -f "$cdir/$c.mean.tsv" ] || continue
      if [ "$x" = seconds ]; then
        case $c in dense | sync-slow | async-slow | async) ;; *) continue ;; esac
      fi
      series+="${series:+, }'$cdir/$c.mean.tsv' using $([ "$x" = updates ] && echo 2 || echo 3):4 with linespoints pointsize 0.5 title '$c'"
    done
    [ -n "$series" ] || continue
    gnuplot <<GP
set terminal $term
set output '$plots/$label-$x.png'
set title "$label: validation loss, mean over seeds ($seeds)"
# Above the initial loss (ln 256) a diverging run would squash the others.
set yrange [*:6]
set xlabel "$([ "$x" = updates ] && echo 'merged updates' || echo 'wall seconds from the coordinator start')"
set ylabel 'validation loss (nats per byte)'
set key top right
set grid
plot $series
GP
    echo "convergence: $plots/$label-$x.png" >&2
  done
}

total=0
for _ in $corpora; do for _ in $seeds; do total=$((total + ${#configs[@]})); done; done
n=0
echo "convergence: $(nproc) cores; ${#configs[@]} configurations x corpora ($corpora) x seeds ($seeds);" \
     "$versions sync versions, $async_versions async; runs in $out" >&2
for corpus in $corpora; do
  label=$(corpus_label "$corpus")
  cdir=$out/$label
  mkdir -p "$cdir"
  for c in "${configs[@]}"; do
    for s in $seeds; do
      n=$((n + 1))
      dir=$cdir/$c-s$s
      if [ "$plot_only" = 1 ]; then
        # The data files are remade where the run is still there, so a
        # change to what is extracted needs no new runs.
        if [ "$(sqlite3 "$dir/run.db" "SELECT status FROM run" 2>/dev/null)" = finished ]; then
          extract "$dir"
        fi
        continue
      fi
      if [ "$resume" = 1 ] && [ -f "$dir/summary.tsv" ]; then continue; fi
      echo "convergence: [$n/$total] $label $c seed $s" >&2
      train "$(corpus_path "$corpus")" "$s" "$c" "$dir" || true
      # Finished but not learned is a result; not finished is a failure.
      if [ "$(sqlite3 "$dir/run.db" "SELECT status FROM run" 2>/dev/null)" != finished ]; then
        tail -n 20 "$dir.log" >&2
        echo "convergence: run $label $c seed $s did not finish (see $dir.log)" >&2
        exit 1
      fi
      extract "$dir"
    done
  done
done

for corpus in $corpora; do
  label=$(corpus_label "$corpus")
  cdir=$out/$label
  [ -d "$cdir" ] || continue
  for c in "${configs[@]}"; do mean_curve "$cdir" "$c"; done
  report "$label" "$cdir"
  plot "$label" "$cdir"
done
