#!/usr/bin/env bash
# Split learning over TLS between processes: three peers keep the first
# layer of the classifier and their Fashion-MNIST shares, send only the
# cut layer's activations and labels to POST /v1/split/forward, and merge
# their lower layers through ordinary updates; the coordinator owns the
# rest, scores every version on its own test images, and is stopped and
# started again mid-run (its layers come back from the last version).
# Accuracy must rise well above version 0's, and every byte the
# coordinator received must be accounted for as activations and labels
# (by size: B x (q floats + 1 label) and a header) or updates of the
# model's size: never an image.
# With the argument "u" the run is U-shaped: the peers keep the classifier
# layer and the loss too, labels never travel, and each batch is a
# forward request (activations in, the coordinator's output back) and a
# backward one (the activations and the gradient at that output in, the
# gradient at the cut back).
# With "flight" the run is plain but each peer keeps up to three batches
# at the coordinator at once (split.in_flight), over three connections.
# With "conv" the model starts with a convolution (8 channels, 5x5,
# stride 2) and the cut is after it: the peers send 8x14x14 activations.
source "$(dirname "$0")/lib.sh"
SHAPE=${1:-plain}
U=false
[ "$SHAPE" = u ] && U=true
FLIGHT=1
[ "$SHAPE" = flight ] && FLIGHT=3
FM=/usr/share/datasets/fashion-mnist
[ -f "$FM/train-images-idx3-ubyte.gz" ] || { echo "Fashion-MNIST is not installed ($FM); skipped"; exit 77; }
VERSIONS=6
B=32
Q=64
MODEL="{\"kind\": \"mlp\", \"in_dim\": 784, \"hidden\": [$Q, 32], \"classes\": 10}"
# Parameters of the whole model, for the size of an update.
n=$((784 * Q + Q + Q * 32 + 32 + 32 * 10 + 10))
if [ "$SHAPE" = conv ]; then
  Q=$((8 * 14 * 14))
  MODEL='{"kind": "mlp", "in_dim": 784, "image": [1, 28, 28], "conv": [{"channels": 8, "kernel": 5, "stride": 2}], "hidden": [32], "classes": 10}'
  n=$((8 * 25 + 8 + Q * 32 + 32 + 32 * 10 + 10))
fi
ALPHA=${IT_SPLIT_ALPHA:-0.1}
it_files
cat > run.json <<JSON
{
  "name": "itsplit",
  "seed": 7,
  "model": $MODEL,
  "data": {"kind": "local", "test_images": "$FM/t10k-images-idx3-ubyte.gz",
           "test_labels": "$FM/t10k-labels-idx1-ubyte.gz"},
  "mode": "split",
  "split": {"cut": 1, "alpha": $ALPHA, "u_shape": $U, "in_flight": $FLIGHT},
  "updates_per_version": 3,
  "max_versions": $VERSIONS,
  "train": {"steps": 20, "batch": $B, "lr": 0.003},
  "outer": {"lr": 1.0, "momentum": 0.0},
  "lease_s": 120,
  "max_body_bytes": 4194304
}
JSON
"$COORD" init --db run.db --config run.json 2> init.log || fail "init"
it_start_coordinator
# A hostile client first: every malformed batch refused with nothing
# stored and the coordinator's layers unstepped; then its lease's update,
# after which a batch under that finished lease is refused too.
if [ "$SHAPE" = plain ]; then
t1=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
mkdir attacker
"$ATTACK" prepare "$URL" tls/ca.pem attacker "$t1" vlt_0 > attack-prepare.log \
  || fail "attack prepare: $(cat attack-prepare.log)"
before=$(it_snapshot)
ATTACK_DB=run.db "$ATTACK" split "$URL" tls/ca.pem attacker "$Q" "$B" 10 bad > attack.log \
  || fail "bad batches: $(cat attack.log)"
"$ATTACK" finish "$URL" tls/ca.pem attacker >> attack.log || fail "the attacker's update was refused"
"$ATTACK" split "$URL" tls/ca.pem attacker "$Q" "$B" 10 expired >> attack.log \
  || fail "a batch under a finished lease: $(cat attack.log)"
refused=$(grep -c '| PASS |' attack.log || true)
else
refused=0
fi
for i in 1 2 3; do it_peer "$i"; done
for i in 1 2 3; do
  "$PEER" run --dir "peer$i" --threads 1 --wait 10 --retries 12 \
    --data "$FM/train-images-idx3-ubyte.gz" --partition "$((i - 1))/3" 2> "peer$i.log" &
  PIDS+=($!)
done
it_restart_midway 2
it_stop_coordinator
[ "$(q 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
[ "$(q 'SELECT count(*) FROM updates WHERE norm IS NULL')" = 0 ] || fail "an update was stored without its norm"
[ "$(q 'SELECT current_version FROM run')" = "$VERSIONS" ] || fail "the run did not finish"
it_check_accuracy 0.55
batches=$(cat coordinator*.log | grep -c 'POST /v1/split/forward 200' || true)
if [ "$SHAPE" = u ]; then
  back=$(cat coordinator*.log | grep -c 'POST /v1/split/backward 200' || true)
  [ "$back" -ge $((batches - 3)) ] || fail "$batches forward batches but only $back backward"
fi
[ "$batches" -ge $((3 * VERSIONS * 20 / 2)) ] || fail "only $batches batches went through the cut"
# Every byte taken in (requests answered 200 or 202; refused ones changed
# nothing): split requests are B x Q floats, B labels (none when
# U-shaped) and a header, backward ones B x (Q + 32) floats and a header;
# updates are a model's dense delta and a header; the rest is small JSON.
awk -v b=$B -v q=$Q -v n=$n -v u="$([ "$SHAPE" = u ] && echo 1 || echo 0)" '
  / in=[0-9]+B / && / 20[02] / {
    match($0, / in=[0-9]+B /); v = substr($0, RSTART + 4, RLENGTH - 6) + 0
    if ($0 ~ /POST \/v1\/split\/forward/) { if (v > b * (q * 4 + (u ? 0 : 4)) + 1024) bad++; sb += v }
    else if ($0 ~ /POST \/v1\/split\/backward/) {
      if (!u || v > b * (q + 32) * 4 + 1024) bad++; sb += v }
    else if ($0 ~ /POST \/v1\/updates/) { if (v > 4 * n + 16384) bad++ }
    else if (v > 65536) bad++
  }
  END { printf "split bytes in: %d\n", sb; exit bad > 0 }' coordinator*.log \
  || fail "the coordinator received a request larger than its kind allows"
if grep -q '/v1/data' coordinator*.log; then fail "the coordinator served data"; fi
# Honest peers stay within split.in_flight, and the coordinator takes
# that many batch bodies from a peer at once.
if grep -q 'too_many_batches' coordinator*.log peer*.log; then fail "a peer went past split.in_flight"; fi
if grep -q 'POST /v1/split/forward 429' coordinator*.log; then
  fail "a batch was refused for its peer's other bodies: $(grep -h 'already sending' peer*.log | head -n 1)"
fi
# The coordinator's layers came back from the last stored version.
from=$(grep -o "parameters start from version [0-9]*" coordinator.log | head -n1 | awk '{print $NF}')
[ -n "$from" ] && [ "$from" -ge 2 ] || fail "the restarted coordinator's layers did not start from a stored version"
if [ "$SHAPE" != u ]; then
  grep -q "split batches' mean loss" coordinator.log || fail "no version reported its split batches"
fi
[ "$SHAPE" = plain ] && echo "split: $refused attack cases answered as expected"
echo "split ($SHAPE, $FLIGHT in flight): alpha $ALPHA, test accuracy $ACC0 at version 0, $ACC at version $VERSIONS, $batches batches"
echo "1 passed, 0 failed"
