#!/usr/bin/env bash
# The shipped example configurations, each run as shipped but shorter:
# deploy/coordinator.EXAMPLE.json with its corpus (the license texts) or
# its Fashion-MNIST files, max_versions cut to a few (EX_VERSIONS), and
# as many peers as a version merges updates, 1 thread each. Every peer
# logs at its exit the seconds it spent training against its wall time
# ("compute: T s of W s training (P %)"); the test prints each peer's
# share and fails if their mean is under EX_MIN_SHARE percent (80): an
# example whose peers mostly wait for the coordinator's validation is a
# bad example. The run must finish, and learn (its last validation loss
# under version 0's, or its accuracy above version 0's).
#
# Usage: examples.sh EXAMPLE, one of sync (coordinator.example.json),
# async, federated, split. Without /usr/share/datasets/fashion-mnist
# (Debian's dataset-fashion-mnist) the federated and split runs train on
# synthetic images in the same IDX format, and say so.
source "$(dirname "$0")/lib.sh"
EXAMPLE=${1:?usage: examples.sh sync|async|federated|split}
MIN_SHARE=${EX_MIN_SHARE:-80}
case $EXAMPLE in
  sync) file=coordinator.example.json versions=${EX_VERSIONS:-6} ;;
  async) file=coordinator.async.example.json versions=${EX_VERSIONS:-12} ;;
  federated | split) file=coordinator.$EXAMPLE.example.json versions=${EX_VERSIONS:-8} ;;
  *) fail "unknown example '$EXAMPLE'" ;;
esac
[ "${VOLLEY_LONG_TESTS:-0}" = 1 ] && versions=$((versions * 3))
FM=${EX_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
it_files
data_args=()
if [ "$EXAMPLE" = federated ] || [ "$EXAMPLE" = split ]; then
  if [ ! -f "$FM/train-images-idx3-ubyte.gz" ]; then
    echo "examples: no Fashion-MNIST in $FM (apt-get install dataset-fashion-mnist);" \
      "training on synthetic images in its format"
    FM=$WORK/fm
    python3 "$ROOT/tests/integration/synthetic_idx.py" "$FM" || fail "synthetic images"
  fi
fi
# The example as shipped, with its paths pointed at this machine's data
# and fewer versions; nothing else changed.
python3 - "$ROOT/deploy/$file" run.json "$versions" "$WORK/corpus.txt" "$FM" <<'PY' || fail "config"
import json, sys
src, dst, versions, corpus, fm = sys.argv[1:6]
c = json.load(open(src))
c["max_versions"] = int(versions)
if "corpus" in c:
    c["corpus"] = corpus
d = c.get("data", {})
for k in ("test_images", "test_labels"):
    if k in d:
        d[k] = fm + "/" + d[k].rsplit("/", 1)[1]
json.dump(c, open(dst, "w"), indent=2)
PY
"$COORD" init --db run.db --config run.json 2> init.log || fail "init: $(cat init.log)"
IT_SERVE_ARGS="--compute-threads 1" it_start_coordinator
peers=$(python3 -c 'import json; print(json.load(open("run.json"))["updates_per_version"])')
for i in $(seq 1 "$peers"); do it_peer "$i"; done
start=$(date +%s.%N)
for i in $(seq 1 "$peers"); do
  data_args=()
  case $EXAMPLE in
    federated | split) data_args=(--data "$FM/train-images-idx3-ubyte.gz" --partition "$((i - 1))/$peers") ;;
  esac
  "$PEER" run --dir "peer$i" --threads 1 --wait 10 --retries 20 "${data_args[@]}" \
    2> "peer$i.log" &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p" || fail "a peer failed"; done
PIDS=()
wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
it_stop_coordinator
[ "$(q 'SELECT status FROM run')" = finished ] || fail "the run did not finish"
[ "$(q 'SELECT current_version FROM run')" = "$versions" ] || fail "the run did not reach $versions"

# Learning: loss down, or accuracy up where the run has a test set.
first=$(q "SELECT val_loss FROM versions WHERE version = 0")
last=$(q "SELECT val_loss FROM versions WHERE val_loss IS NOT NULL ORDER BY version DESC LIMIT 1")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' \
  || fail "validation loss $first at version 0, $last at the end: nothing learned"
learned="validation loss $(printf '%.4f -> %.4f' "$first" "$last")"
if [ "$EXAMPLE" = federated ] || [ "$EXAMPLE" = split ]; then
  it_check_accuracy 0.6
  learned="test accuracy $ACC0 -> $ACC"
fi

shares=$(grep -ho 'compute: [0-9.]* s of [0-9.]* s training ([0-9.]* %)' peer*.log || true)
[ "$(echo "$shares" | grep -c compute)" = "$peers" ] || fail "not every peer logged its compute share"
# "compute: T s of W s training (P %)": the share is T / W.
mean=$(echo "$shares" | awk '{ t += 100 * $2 / $5 } END { printf "%.1f", t / NR }')
min=$(echo "$shares" | awk '{ v = 100 * $2 / $5; if (NR == 1 || v < m) m = v } END { printf "%.1f", m }')
echo "examples: $file: $peers peers, $versions versions in $wall s;" \
  "$learned; training share mean $mean %, lowest $min %"
echo "$shares" | sed 's/^/examples:   /'
awk -v m="$mean" -v t="$MIN_SHARE" 'BEGIN { exit !(m >= t) }' \
  || fail "$file: the peers trained $mean % of the time on average, under $MIN_SHARE %"
echo "1 passed, 0 failed"
