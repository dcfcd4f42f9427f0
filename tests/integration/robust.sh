#!/usr/bin/env bash
# Hostile peers: 10 real peers over TLS of which 2 (20 %) are hostile
# (hostile_peer.c: the peer's own loop uploading attacks). One sends every
# task's update first with NaN in it, which must be refused (422
# non_finite, nothing stored), then scaled by 100 on the same task, which
# is accepted; the other cycles sign-flipped, random noise (10x the RMS)
# and a replay of its first update. The same run is trained clean,
# attacked with the plain mean, and attacked with each robust rule.
#
# sync (30 versions): every robust rule must end within 5 % of the clean
# run's final validation loss, the plain mean more than 20 % above it; a
# fixed robust.max_norm bound (twice the largest honest norm of the clean
# run, clip) must beat the plain mean. async (20 versions, FedBuff
# buffers of 10, stale updates): its versions swing by several per cent
# even when clean, so the mean validation loss of the last 10 versions is
# compared: trimmed mean (trim 0.4: a buffer's share of hostile updates
# varies) within 15 % of clean. The plain mean must be hurt: its mean
# over all versions over twice the clean run's. (Not its last 10: once
# the honest deltas are small, a scale100 update is a step of about ten
# honest ones in a descent direction, and one run climbed back from
# 56.7 at version 2 to 3.52 over its last 10, 1.22 times clean, while
# its mean over all 20 was 13.8, 4.65 times.) Every figure is printed.
#
# The defaults (no robust section: with 10 updates per version the
# trimmed mean, trim 0.2, and the update-norm bound derived from versions
# 1-3, 4 times their median norm per square root of the local steps,
# beyond which sync clips and async refuses) are run clean and attacked,
# sync and async: attacked, within 5 % (sync) and 15 % (async) of their
# clean runs, and clean within 5 % (sync, whose clean runs of one
# configuration ended 2.44 to 2.50 in three tries) and 10 % (async, whose
# clean runs differ by several per cent between two tries) of the plain
# mean's clean run; async, the scale100 attacks past version 3 refused
# with 422 norm_exceeded (noise ones counted: near the bound, they fall
# either side of it), sync, attacks scaled down to the bound.
#
# The rules are measured on their own: every run but one has
# max_loss_rise 0, so the coordinator refuses only a loss that is not a
# number. That one, the plain mean attacked with the default guard, must
# never serve a version more than 20 % above the best before it.
#
# ROBUST_QUICK=1 (the sanitizer build, where training is about 7 times
# slower) runs the code paths only: 8 versions of the plain mean, trimmed
# mean, norm_clip with a max_norm clip, and an async median, all attacked,
# each robust run ending below the plain mean.
source "$(dirname "$0")/lib.sh"
HOSTILE=${HOSTILE:?}
VERSIONS=30
AVERSIONS=20
PEERS=10
ATTACK_A="nan,scale100"
ATTACK_B="signflip,noise,replay"
# Enough local training that the clean run gets past byte frequencies,
# where an attack has something to undo.
export IT_TRAIN='{"steps": 16, "batch": 8, "lr": 0.01}'
if [ -n "${ROBUST_QUICK:-}" ]; then
  VERSIONS=8
  export IT_TRAIN='{"steps": 8, "batch": 8, "lr": 0.01}'
fi

# run_case NAME MODE HOSTILE(0|1) ROBUST_JSON [VERSIONS]: one run to its
# end; its final validation loss goes to LOSS, the mean over its last 10
# versions to LAST10, and its files to the directory NAME. ROBUST_JSON
# "default" leaves the section out.
run_case() {
  local name=$1 mode=$2 hostile=$3 robust=$4 versions=${5:-$VERSIONS} t0=$SECONDS
  local section="\"robust\": $robust," rule
  rule=$(echo "$robust" | grep -o '"rule": "[a-z_]*"' | cut -d'"' -f4 || true)
  if [ "$robust" = default ]; then section=""; rule=trimmed_mean; fi
  IT_MODE=$mode it_setup itrobust "$versions" "$PEERS" \
    "$section \"max_loss_rise\": ${RISE:-0},"
  it_start_coordinator
  for i in $(seq 1 $PEERS); do it_peer "$i"; done
  local honest=$PEERS
  [ "$hostile" = 1 ] && honest=$((PEERS - 2))
  for i in $(seq 1 $honest); do
    "$PEER" run --dir "peer$i" --threads 1 --wait 10 --retries 20 2> "peer$i.log" &
    PIDS+=($!)
  done
  if [ "$hostile" = 1 ]; then
    # The rules bound a hostile minority of each version. Started alone,
    # a hostile peer on a tiny model can fill an async run's first buffers
    # before the honest peers have loaded (it did: 6 of version 1's 10), so
    # the attackers start once every honest peer holds its first lease.
    # (That opening is a weakness of async runs, noted in the docs.)
    for _ in $(seq 1 300); do
      [ "$(grep -c 'GET /v1/task 200' coordinator.log || true)" -ge "$honest" ] && break
      sleep 0.1
    done
    # At the honest peers' priority: volley-peer runs at nice 19 by
    # default, and on two shared cores attackers at normal priority would
    # win the race for the first versions, whose norms set the bound.
    nice -n 19 "$HOSTILE" "peer$((PEERS - 1))" "$ATTACK_A" 11 2> "peer$((PEERS - 1)).log" &
    PIDS+=($!)
    nice -n 19 "$HOSTILE" "peer$PEERS" "$ATTACK_B" 12 2> "peer$PEERS.log" &
    PIDS+=($!)
  fi
  for p in "${PIDS[@]}"; do wait "$p" || fail "$name: a peer exited with an error"; done
  PIDS=()
  it_stop_coordinator
  if [ "$mode" = sync ] && [ "$hostile" = 1 ]; then
    check_attacked_run "$versions" "$PEERS"
  elif [ "$mode" = sync ]; then
    it_check_run "$versions" "$PEERS"
  else
    [ "$(q 'PRAGMA integrity_check')" = ok ] || fail "$name: integrity_check"
    [ "$(q 'SELECT count(*) FROM versions')" = $((versions + 1)) ] || fail "$name: unfinished"
  fi
  LOSS=$(q "SELECT printf('%.4f', val_loss) FROM versions WHERE version = $versions")
  LAST10=$(q "SELECT printf('%.4f', avg(val_loss)) FROM versions WHERE version > 0 AND version > $versions - 10")
  ALL=$(q "SELECT printf('%.4f', avg(val_loss)) FROM versions WHERE version > 0")
  grep -q "version $versions: $rule of" coordinator.log \
    || fail "$name: the coordinator did not merge with the rule asked for"
  mkdir "$name"
  mv run.db ./*.log "$name"/
  mv peer* "$name"/
  rm -f run.db-wal run.db-shm
  echo "robust: $name: final validation loss $LOSS, mean of the last 10 versions $LAST10, of all $ALL" \
       "($((SECONDS - t0)) s)"
  local bounded=0
  [ "$robust" = default ] && [ "$mode" = async ] && bounded=1
  case "$robust" in *'"max_norm": "auto"'*'"on_excess": "refuse"'*) bounded=1 ;; esac
  [ "$hostile" = 1 ] && attacks_seen "$name" "$bounded"
  return 0
}

# attacks_seen NAME BOUNDED(0|1): the NaN uploads were refused and
# nothing of them stored; every other attack was accepted and stored,
# but with BOUNDED (an async run's default bound), where the scale100 and
# noise attacks after version 3 must be refused with 422 norm_exceeded.
attacks_seen() {
  local d=$1 a=$1/peer$((PEERS - 1)).log b=$1/peer$PEERS.log
  grep -q "attack nan on attempt 0" "$a" || fail "$d: no NaN attack was made"
  grep -q "422 non_finite" "$a" || fail "$d: the NaN upload was not refused with 422 non_finite"
  grep -q "attack scale100 on attempt 1" "$a" || fail "$d: no scale100 attack after a refusal"
  for at in signflip noise replay; do grep -q "attack $at" "$b" || fail "$d: no $at attack"; done
  local refused took stored nan bounded=0
  refused=$(cat "$a" "$b" | grep -c "upload refused")
  nan=$(grep -c "upload refused: 422 non_finite" "$a")
  local noise_refused=0
  if [ "$2" = 1 ]; then
    bounded=$(cat "$a" "$b" | grep -c "upload refused: 422 norm_exceeded" || true)
    grep -q "upload refused: 422 norm_exceeded" "$a" || fail "$d: no scale100 attack was refused"
    # Noise at 10 times the delta's RMS has about 10 times the norm of
    # its own short, dynamic-steps task, against a bound of 4 times the
    # median per square root of the local steps: it lands near the bound
    # (refused at 17.4 against 15.7), and in three runs 7 of 9, 0 of 7
    # and 0 of 7 noise attacks were refused. So it is counted, not
    # required.
    noise_refused=$(grep -c "upload refused: 422 norm_exceeded" "$b" || true)
  fi
  [ $((nan + bounded)) = "$refused" ] || fail "$d: an attack was refused that should not be"
  took=$(cat "$a" "$b" | grep -c "accepted")
  stored=$(q_in "$d" "SELECT count(*) FROM updates WHERE peer_id >= $((PEERS - 1))")
  [ "$took" = "$stored" ] || fail "$d: $took attacks accepted, $stored stored"
  # Refused ones count: a hostile peer made an attack a task either way.
  [ $((stored + bounded)) -ge "$(q_in "$d" 'SELECT max(version) FROM versions')" ] \
    || fail "$d: only $stored attacks were stored ($bounded refused over the bound)"
  echo "robust: $d: $stored of $(q_in "$d" 'SELECT count(*) FROM updates') updates stored were attacks;" \
       "$nan NaN uploads refused, $bounded over the norm bound ($noise_refused of them noise)"
}

q_in() { sqlite3 "$1/run.db" "$2"; }

# check_attacked_run VERSIONS PER_VERSION: it_check_run for an attacked
# sync run, where a refused upload ends its lease and its data go to a
# new task at once (a parked peer takes it within milliseconds), while
# the hostile peer's next attack on the same task is still taken, as a
# late update. The version then merges one update more than
# PER_VERSION, or the new task's update arrives after it and is merged,
# stale, into the next (or, after the last version, into none). At most
# one such update per lease so ended; no update merged twice.
check_attacked_run() {
  local versions=$1 per=$2 ended extra stale
  [ "$(q 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
  [ "$(q 'SELECT count(*) FROM versions')" = $((versions + 1)) ] || fail "expected $((versions + 1)) versions"
  [ "$(q 'SELECT count(*) FROM versions WHERE val_loss IS NULL')" = 0 ] || fail "a version lacks its validation loss"
  [ "$(q "SELECT count(*) FROM versions WHERE version > 0 AND num_updates < $per")" = 0 ] \
    || fail "a version merged fewer than $per updates"
  ended=$(grep -c "was refused ([a-z_]*); the lease ends" coordinator.log || true)
  extra=$(( $(q 'SELECT count(*) FROM updates') - per * versions ))
  [ "$extra" -ge 0 ] && [ "$extra" -le "$ended" ] \
    || fail "$extra updates beyond $per a version, with $ended leases ended at a refusal"
  stale=$(q 'SELECT count(*) FROM updates WHERE merged_version IS NULL OR merged_version <> base_version + 1')
  [ "$stale" -le "$ended" ] \
    || fail "$stale updates merged stale or not at all, with $ended leases ended at a refusal"
  [ "$(q 'SELECT count(*) FROM (SELECT task_id FROM updates GROUP BY task_id HAVING count(*) > 1)')" = 0 ] \
    || fail "a task has two updates"
}

# below X Y F: X <= F * Y
below() { awk -v x="$1" -v y="$2" -v f="$3" 'BEGIN { exit !(x <= f * y) }'; }

if [ -n "${ROBUST_QUICK:-}" ]; then
  run_case mean sync 1 '{"rule": "mean"}'
  MEAN=$LOSS
  run_case trimmed_mean sync 1 '{"rule": "trimmed_mean", "trim": 0.2}'
  TRIMMED=$LOSS
  run_case norm_clip sync 1 '{"rule": "norm_clip", "clip_mult": 2, "max_norm": 10}'
  CLIP=$LOSS
  grep -q "[1-9][0-9]* scaled down to max_norm" norm_clip/coordinator.log \
    || fail "norm_clip: no update was scaled down to max_norm"
  run_case async_median async 1 '{"rule": "median"}'
  AMEDIAN=$LOSS
  echo "robust: quick, attacked, final validation loss: mean $MEAN, trimmed_mean $TRIMMED," \
       "norm_clip with max_norm 10 $CLIP, async median $AMEDIAN"
  for r in "trimmed_mean $TRIMMED" "norm_clip $CLIP" "async_median $AMEDIAN"; do
    set -- $r
    below "$2" "$MEAN" 1 || fail "$1 under attack ($2) is not below the plain mean ($MEAN)"
  done
  echo "1 passed, 0 failed"
  exit 0
fi

# ROBUST_EXCESS=1: what a sync run should do beyond the derived bound,
# measured: the defaults' rule and bound (trimmed mean 0.2, 4 times the
# median of versions 1-3) attacked, with on_excess "clip" (the sync
# default) and "refuse" (each refusal ending its lease at once), for
# ROBUST_EXCESS_VERSIONS (default 20) versions each. Prints the final
# validation loss, the mean of the last 10 versions and the wall time of
# each; checks only what every attacked run checks.
if [ -n "${ROBUST_EXCESS:-}" ]; then
  V=${ROBUST_EXCESS_VERSIONS:-20}
  for ex in clip refuse; do
    t0=$SECONDS
    run_case "excess_$ex" sync 1 \
      "{\"rule\": \"trimmed_mean\", \"trim\": 0.2, \"max_norm\": \"auto\", \"on_excess\": \"$ex\"}" "$V"
    echo "robust: excess $ex: final $LOSS, last 10 $LAST10, $((SECONDS - t0)) s," \
         "$(grep -c 'the lease ends' "excess_$ex/coordinator.log" || true) leases ended at a refusal," \
         "$(grep -o '[0-9]* scaled down to max_norm' "excess_$ex/coordinator.log" | awk '{ s += $1 } END { print s + 0 }') updates scaled down"
  done
  echo "1 passed, 0 failed"
  exit 0
fi

run_case clean sync 0 '{"rule": "mean"}'
CLEAN=$LOSS
# The honest norms of the clean run bound the fixed max_norm run.
MAXN=$(grep -o 'norms median [0-9.e+-]* max [0-9.e+-]*' clean/coordinator.log \
       | awk '{ if ($5 > m) m = $5 } END { printf "%.4g", 2 * m }')
run_case mean sync 1 '{"rule": "mean"}'
MEAN=$LOSS
run_case trimmed_mean sync 1 '{"rule": "trimmed_mean", "trim": 0.2}'
TRIMMED=$LOSS
run_case median sync 1 '{"rule": "median"}'
MEDIAN=$LOSS
run_case norm_clip sync 1 '{"rule": "norm_clip", "clip_mult": 2}'
CLIP=$LOSS
run_case max_norm sync 1 "{\"rule\": \"mean\", \"max_norm\": $MAXN, \"on_excess\": \"clip\"}"
BOUND=$LOSS
grep -q "[1-9][0-9]* scaled down to max_norm" max_norm/coordinator.log \
  || fail "max_norm: no update was scaled down to the bound"

RISE=0.2 run_case mean_guarded sync 1 '{"rule": "mean"}'
GUARDED=$LOSS
GUARD_BAD=$(q_in mean_guarded "SELECT count(*) FROM versions v WHERE v.version > 0 AND
            v.val_loss > 1.2 * (SELECT min(val_loss) FROM versions w WHERE w.version < v.version)")
GUARD_REFUSED=$(q_in mean_guarded 'SELECT count(*) FROM versions WHERE refused')

run_case async_clean async 0 '{"rule": "mean"}' "$AVERSIONS"
ACLEAN=$LAST10
ACLEAN_ALL=$ALL
run_case async_mean async 1 '{"rule": "mean"}' "$AVERSIONS"
AMEAN=$LAST10
AMEAN_ALL=$ALL
# A buffer's share of hostile updates varies (4 of 11 happens), so async
# cuts more.
run_case async_trimmed_mean async 1 '{"rule": "trimmed_mean", "trim": 0.4}' "$AVERSIONS"
ATRIMMED=$LAST10

run_case defaults_clean sync 0 default
DCLEAN=$LOSS
run_case defaults sync 1 default
DEFAULTS=$LOSS
run_case async_defaults_clean async 0 default "$AVERSIONS"
ADCLEAN=$LAST10
run_case async_defaults async 1 default "$AVERSIONS"
ADEFAULTS=$LAST10
BOUND_LINE=$(grep -o 'exceeds [0-9.e+-]* (4 times the median of versions 1 to 3, [0-9.e+-]*' \
             defaults/coordinator.log | head -n 1 || true)
[ -n "$BOUND_LINE" ] || fail "defaults: no update-norm bound was derived"
grep -q "[1-9][0-9]* scaled down to max_norm" defaults/coordinator.log \
  || fail "defaults: no attack was scaled down to the derived bound"

echo "robust: defaults (trimmed_mean 0.2, bound from versions 1-3 x 4; sync clips, async refuses):" \
     "sync clean $DCLEAN, attacked $DEFAULTS; async (last 10) clean $ADCLEAN, attacked" \
     "$ADEFAULTS; bound: $BOUND_LINE"
echo "robust: sync final validation loss: clean $CLEAN; attacked: mean $MEAN," \
     "trimmed_mean $TRIMMED, median $MEDIAN, norm_clip $CLIP, mean with max_norm $MAXN $BOUND"
echo "robust: async mean of the last 10 versions: clean $ACLEAN; attacked: mean $AMEAN," \
     "trimmed_mean $ATRIMMED; of all versions: clean $ACLEAN_ALL, attacked mean $AMEAN_ALL"
echo "robust: sync plain mean attacked, with max_loss_rise 0.2: final $GUARDED," \
     "$GUARD_REFUSED of $VERSIONS versions refused"
[ "$GUARD_BAD" = 0 ] || fail "the guarded plain mean served $GUARD_BAD versions over 20 % above the best"
below "$MEAN" "$CLEAN" 1.2 && fail "plain mean under attack ($MEAN) is not 20 % above clean ($CLEAN)"
for r in "trimmed_mean $TRIMMED" "median $MEDIAN" "norm_clip $CLIP"; do
  set -- $r
  below "$2" "$CLEAN" 1.05 || fail "$1 under attack ($2) is over 5 % above clean ($CLEAN)"
done
below "$BOUND" "$MEAN" 1 || fail "max_norm ($BOUND) did not improve on the plain mean ($MEAN)"
below "$AMEAN_ALL" "$ACLEAN_ALL" 2 \
  && fail "async plain mean under attack ($AMEAN_ALL over all versions) is not twice clean ($ACLEAN_ALL)"
below "$ATRIMMED" "$ACLEAN" 1.15 || fail "async trimmed_mean ($ATRIMMED) is over 15 % above clean ($ACLEAN)"
below "$DCLEAN" "$CLEAN" 1.05 || fail "the defaults, clean ($DCLEAN), are over 5 % above the plain mean ($CLEAN)"
below "$DEFAULTS" "$DCLEAN" 1.05 || fail "the defaults under attack ($DEFAULTS) are over 5 % above clean ($DCLEAN)"
below "$ADCLEAN" "$ACLEAN" 1.10 || fail "async defaults, clean ($ADCLEAN), are over 10 % above the plain mean ($ACLEAN)"
below "$ADEFAULTS" "$ADCLEAN" 1.15 || fail "async defaults under attack ($ADEFAULTS) are over 15 % above clean ($ADCLEAN)"
echo "1 passed, 0 failed"
