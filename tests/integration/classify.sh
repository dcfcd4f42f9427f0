#!/usr/bin/env bash
# A classification run whose data stay on the peers: three peers each
# train the MLP classifier on their own label-skewed share of
# Fashion-MNIST (--data, --partition i/3, --beta 0.5), the coordinator
# scores every version on its own test images, and is stopped and started
# again mid-run. Accuracy must rise well above chance and above version
# 0's; the coordinator must have received nothing but model updates of
# the model's size (no image or label travels), and served no data.
source "$(dirname "$0")/lib.sh"
FM=/usr/share/datasets/fashion-mnist
[ -f "$FM/train-images-idx3-ubyte.gz" ] || { echo "Fashion-MNIST is not installed ($FM); skipped"; exit 77; }
VERSIONS=8
it_files
cat > run.json <<JSON
{
  "name": "itclassify",
  "seed": 7,
  "model": {"kind": "mlp", "in_dim": 784, "hidden": [64], "classes": 10},
  "data": {"kind": "local", "test_images": "$FM/t10k-images-idx3-ubyte.gz",
           "test_labels": "$FM/t10k-labels-idx1-ubyte.gz"},
  "mode": "sync",
  "updates_per_version": 3,
  "max_versions": $VERSIONS,
  "train": {"steps": 25, "batch": 32, "lr": 0.003},
  "outer": {"lr": 1.0, "momentum": 0.0},
  "lease_s": 60,
  "max_body_bytes": 4194304
}
JSON
"$COORD" init --db run.db --config run.json 2> init.log || fail "init"
grep -q 'mlp classifier' init.log || fail "init did not describe the classifier run"
it_start_coordinator
for i in 1 2 3; do it_peer "$i"; done
for i in 1 2 3; do
  "$PEER" run --dir "peer$i" --threads 1 --wait 10 --retries 12 \
    --data "$FM/train-images-idx3-ubyte.gz" --partition "$((i - 1))/3" --beta 0.5 \
    2> "peer$i.log" &
  PIDS+=($!)
done
it_restart_midway 3
it_stop_coordinator
it_check_run "$VERSIONS" 3
it_check_accuracy 0.6
grep -q 'local data: [0-9]* of 60000 images' peer1.log || fail "peer 1 did not report its share"
# Only updates travelled: each at most a dense F32 delta of the model plus
# its header, and nothing was served from /v1/data.
n=$((784 * 64 + 64 + 64 * 10 + 10))
big=$(q "SELECT count(*) FROM updates WHERE nbytes > $((4 * n + 16384))")
[ "$big" = 0 ] || fail "$big updates are larger than a model delta"
if grep -q '/v1/data' coordinator*.log; then fail "the coordinator served data"; fi
echo "classify: test accuracy $ACC0 at version 0, $ACC at version $VERSIONS"

# The same run without a test set on the coordinator: the peers score the
# versions they train from on their own data, and the coordinator reports
# the mean, which must rise.
rm -rf run.db* peer1 peer2 peer3 coordinator*.log
sed -i -e 's/"name": "itclassify"/"name": "itclassify2"/' \
  -e 's|"data": {"kind": "local", "test_images": .*|"data": {"kind": "local"},|' \
  -e '/"test_labels":/d' -e 's/"max_versions": [0-9]*/"max_versions": 5/' run.json
"$COORD" init --db run.db --config run.json 2> init.log || fail "init without a test set: $(cat init.log)"
it_start_coordinator
for i in 1 2 3; do it_peer "$i"; done
for i in 1 2 3; do
  "$PEER" run --dir "peer$i" --threads 1 --wait 10 \
    --data "$FM/train-images-idx3-ubyte.gz" --partition "$((i - 1))/3" 2> "peer$i.log" &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p" || fail "a peer failed without a test set"; done
PIDS=()
it_stop_coordinator
accs=$(grep -o "peers' accuracy of their base versions [0-9.]*" coordinator.log | awk '{print $NF}')
first=$(echo "$accs" | head -n1)
last=$(echo "$accs" | tail -n1)
[ "$(echo "$accs" | wc -l)" = 5 ] || fail "not every version reported its peers' accuracy"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a < 0.3 && b > 0.6) }' \
  || fail "the peers' accuracy went from $first to $last; expected from chance to above 0.6"
echo "classify: without a test set, the peers' accuracy of their base versions went from $first to $last"
echo "1 passed, 0 failed"
