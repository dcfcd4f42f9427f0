#!/usr/bin/env bash
# A volunteer's machine dies: a peer in a top-k run, with its optimizer's
# state (AdamW's moments, with `resume.sh sgd` SGD's momentum, with
# `resume.sh kfac` K-FAC's factors and momentum, sharing factors; with
# `resume.sh classifier` a classifier's AdamW moments, trained on the
# peer's own images) and an error-feedback residual built up over its earlier tasks, is killed with
# SIGKILL in the middle of a task and started again with the same directory
# and no other action. It must restore both from its state file, apply them
# to the model it fetches, take part again with the same key, and the run
# must finish with every update merged exactly once.
source "$(dirname "$0")/lib.sh"
OPT=${1:-adamw}
case $OPT in
  adamw) RESTORED="AdamW moments" ;;
  sgd) RESTORED="SGD momentum"
       export IT_TRAIN='{"steps": 4, "batch": 4, "lr": 0.05, "optimizer": "sgd", "momentum": 0.9}' ;;
  kfac) RESTORED="K-FAC factors and momentum"
        export IT_TRAIN='{"steps": 4, "batch": 4, "optimizer": "kfac", "momentum": 0,
          "kfac": {"inverse_every": 2, "kl_clip": 0.01, "share": true}}' ;;
  classifier) RESTORED="AdamW moments" ;;
  *) fail "unknown optimizer $OPT" ;;
esac
VERSIONS=6
PER=2
DATA=()
if [ "$OPT" = classifier ]; then
  # Synthetic images in Fashion-MNIST's format, so the test needs no
  # data set installed; the peers train on their own copy (--data).
  it_files
  mkdir images
  python3 "$ROOT/tests/integration/synthetic_idx.py" images 1200 200 || fail "synthetic images"
  cat > run.json <<JSON
{
  "name": "itresume",
  "seed": 7,
  "model": {"kind": "mlp", "in_dim": 784, "hidden": [32], "classes": 10},
  "data": {"kind": "local"},
  "mode": "sync",
  "updates_per_version": $PER,
  "max_versions": $VERSIONS,
  "compression": {"kind": "topk", "ratio": 20, "dtype": "F16"},
  "train": {"steps": 4, "batch": 16, "lr": 0.003},
  "outer": {"lr": 1.0, "momentum": 0.0},
  "lease_s": 60,
  "max_body_bytes": 4194304
}
JSON
  "$COORD" init --db run.db --config run.json 2> init.log || fail "init: $(cat init.log)"
  DATA=(--data images/train-images-idx3-ubyte.gz)
else
  it_setup itresume "$VERSIONS" "$PER" \
    '"compression": {"kind": "topk", "ratio": 20, "dtype": "F16"},'
fi
it_start_coordinator
for i in 1 2; do it_peer "$i"; done
start_peer() { # start_peer N DELAY_MS
  "$PEER" run --dir "peer$1" --threads 1 --wait 5 --retries 20 --step-delay "$2" \
    "${DATA[@]}" 2>> "peer$1.log" &
  PIDS[$1]=$!
}
start_peer 1 0
# Peer 2 trains slowly, so it is surely inside a task when it is killed.
start_peer 2 150

for _ in $(seq 1 300); do
  [ "$(q 'SELECT count(*) FROM updates WHERE peer_id = 2')" -ge 2 ] && break
  sleep 0.1
done
[ "$(q 'SELECT count(*) FROM updates WHERE peer_id = 2')" -ge 2 ] \
  || fail "peer 2 did not upload two updates"
it_wait_leased 2 100
kill -9 "${PIDS[2]}"
wait "${PIDS[2]}" 2>/dev/null || true
[ -s peer2/trainer.st ] || fail "peer 2 left no trainer state"
before=$(q 'SELECT count(*) FROM updates WHERE peer_id = 2')
echo "resume: peer 2 killed inside a task after $before updates"

start_peer 2 0
for i in 1 2; do wait "${PIDS[$i]}" || fail "peer $i exited with an error"; done
PIDS=()
it_stop_coordinator

# The second start of peer 2 is what follows its second "working for" line.
restart=$(awk '/working for/ { n++ } n >= 2' peer2.log)
echo "$restart" | grep -q "trainer state restored for [0-9]* parameters: $RESTORED, an error-feedback residual" \
  || fail "peer 2 did not restore its $RESTORED and residual"
echo "$restart" | grep -q 'trainer state applied to model version' \
  || fail "peer 2 did not apply its restored state"
after=$(q "SELECT count(*) FROM updates WHERE peer_id = 2")
[ "$after" -gt "$before" ] || fail "peer 2 uploaded nothing after its restart"
[ "$(q 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
[ "$(q 'SELECT status FROM run')" = finished ] || fail "the run did not finish"
[ "$(q 'SELECT count(*) FROM updates WHERE merged_version IS NULL')" = 0 ] || fail "unmerged updates"
[ "$(q 'SELECT count(*) FROM (SELECT task_id FROM updates GROUP BY task_id HAVING count(*) > 1)')" = 0 ] \
  || fail "a task has two updates"
[ "$(q 'SELECT count(*) FROM versions v WHERE v.version > 0 AND v.num_updates <>
         (SELECT count(*) FROM updates u WHERE u.merged_version = v.version)')" = 0 ] \
  || fail "a version's update count does not match its merged updates"
echo "resume: peer 2 restored its state and uploaded $((after - before)) more updates;" \
     "$(echo "$restart" | grep -o 'trainer state restored.*residual')"
echo "1 passed, 0 failed"
