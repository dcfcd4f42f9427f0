#!/usr/bin/env bash
# The coordinator refuses a version whose validation loss blows up.
#
# An outer step far too large (lr 10, momentum 0.9) drives the model's loss
# up within a version or two. Phase 1, the default max_loss_rise (0.2): no
# served version's loss is more than 20 % above the best before it; the
# versions that would have been are stored as refused, keep their
# predecessor's parameters (an empty change) and record the loss they
# would have had; every update is still merged exactly once; the step
# backs off after each refusal, so later versions are served and the run
# ends below its initial loss. Phase 2 runs
# the same with max_loss_rise 0 (only a loss that is not a number is
# refused) and must go above the initial loss: what phase 1 prevents.
# Phase 3 is phase 1 with the versions served on a loss check
# (val_check_tokens) and scored in full in the background.
source "$(dirname "$0")/lib.sh"
VERSIONS=6
LR=${LOSS_GUARD_LR:-10.0}

run_once() { # run_once NAME EXTRA [nocheck]
  cd "$WORK"
  rm -rf run.db run.db-* peer1 peer2 ./*.log
  IT_OUTER="{\"lr\": $LR, \"momentum\": 0.9}" it_setup "$1" "$VERSIONS" 2 "$2"
  it_start_coordinator
  it_peer 1
  it_peer 2
  for i in 1 2; do
    "$PEER" run --dir "peer$i" --threads 1 --wait 5 --retries 20 2> "peer$i.log" &
    PIDS+=($!)
  done
  it_wait_finished 1200 "$1: the run did not finish"
  it_stop_peers
  it_stop_coordinator
  [ "${3:-}" = nocheck ] || it_check_run "$VERSIONS" 2
}

# ---- phase 1: the default guard
run_once itguard ''
curve=$(q "SELECT group_concat(printf('%d:%.3f%s', version, val_loss,
             CASE WHEN refused THEN printf('(refused %s)', ifnull(printf('%.3f', refused_val_loss), 'nan'))
             ELSE '' END), ' ') FROM versions")
echo "loss_guard: with the guard: $curve"
refused=$(q 'SELECT count(*) FROM versions WHERE refused')
[ "$refused" -ge 1 ] || fail "no version was refused at outer lr $LR: $curve"
[ "$(q 'SELECT count(*) FROM versions v WHERE v.version > 0 AND v.val_loss >
         1.2 * (SELECT min(val_loss) FROM versions w WHERE w.version < v.version) + 1e-9')" = 0 ] \
  || fail "a served version is more than 20% above the best before it: $curve"
[ "$(q 'SELECT count(*) FROM versions v JOIN changes c ON c.version = v.version
         WHERE v.refused AND c.nnz <> 0')" = 0 ] || fail "a refused version changed the parameters"
[ "$(q 'SELECT count(*) FROM versions v WHERE v.refused AND v.refused_val_loss IS NOT NULL AND
         v.refused_val_loss <= 1.2 * (SELECT min(val_loss) FROM versions w
                                      WHERE w.version < v.version)')" = 0 ] \
  || fail "a version was refused though its loss was within the bound"
[ "$(q 'SELECT count(*) FROM versions v WHERE v.refused AND
         v.val_loss <> (SELECT val_loss FROM versions w WHERE w.version = v.version - 1)')" = 0 ] \
  || fail "a refused version does not carry its predecessor's loss"
grep -q "refused: its validation loss" coordinator.log || fail "no refusal in the coordinator's log"
# Each refusal in a row halves the next step, so the run is not held at
# one version: a version after the first refusal is served, and learns.
firstref=$(q 'SELECT min(version) FROM versions WHERE refused')
[ "$(q "SELECT count(*) FROM versions WHERE version > $firstref AND NOT refused")" -ge 1 ] \
  || fail "after the first refusal no version was served: $curve"
grep -q "the next step is scaled by 1/2;" coordinator.log || fail "the step did not back off"
[ "$(q "SELECT val_loss < (SELECT val_loss FROM versions WHERE version = 0) FROM versions
        WHERE version = $VERSIONS")" = 1 ] || fail "the guarded run ended above its start: $curve"

# ---- phase 2: without the rise test the same run blows up
run_once itnoguard '"max_loss_rise": 0,'
first=$(q 'SELECT val_loss FROM versions WHERE version = 0')
worst=$(q 'SELECT max(coalesce(refused_val_loss, val_loss)) FROM versions')
echo "loss_guard: without it: initial $first, worst $worst," \
     "$(q 'SELECT count(*) FROM versions WHERE refused') refused (not a number)"
awk -v a="$first" -v w="$worst" 'BEGIN { exit !(w > a) }' \
  || fail "without the guard the run did not go above its initial loss ($first, worst $worst): the test shows nothing"

# ---- phase 3: the guard on the loss check (val_check_tokens), with the
# full score in the background: the same refusals, made on the check
# loss, and a run that ends below its start with its last version scored
# in full before the run says it is finished.
run_once itcheckguard '"val_check_tokens": 256,' nocheck
[ "$(q 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
grep -q "version 1 check_loss [0-9.]* on 256 held-out bytes" coordinator.log \
  || fail "version 1 was not served on its loss check"
[ "$(q 'SELECT count(*) FROM versions WHERE refused')" -ge 1 ] \
  || fail "no version was refused on its check loss"
grep -q "refused: its validation loss" coordinator.log || fail "no refusal in the coordinator's log"
[ "$(q "SELECT val_loss IS NOT NULL FROM versions WHERE version = $VERSIONS")" = 1 ] \
  || fail "the finishing version has no validation loss"
[ "$(q "SELECT val_loss < (SELECT val_loss FROM versions WHERE version = 0) FROM versions
        WHERE version = $VERSIONS")" = 1 ] || fail "the run guarded on its check ended above its start"
# What was scored in the background is stored: every scored line's loss
# is its version's val_loss.
while read -r v l; do
  [ "$(q "SELECT printf('%.6f', val_loss) FROM versions WHERE version = $v")" = "$l" ] \
    || fail "version $v was scored $l in the background, stored $(q "SELECT val_loss FROM versions WHERE version = $v")"
done < <(sed -n 's/.* version \([0-9]*\) val_loss \([0-9.]*\) .*in the background.*/\1 \2/p' coordinator.log)
echo "loss_guard: on the check: $(q "SELECT group_concat(printf('%d:%s%s', version,
  ifnull(printf('%.3f', val_loss), '-'), CASE WHEN refused THEN '(refused)' ELSE '' END), ' ')
  FROM versions"); $(grep -c 'in the background' coordinator.log) scored in the background"
echo "1 passed, 0 failed"
