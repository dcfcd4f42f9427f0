#!/usr/bin/env bash
# A GPT trained on data the peers keep (data {"kind": "local"}): the
# coordinator holds only held-out data to score versions on, a text file
# (val) or a token shard (val_shard), and serves none; each peer trains on
# its own file (volley-peer run --data: text, or an llm.c token shard,
# recognised by its header). For each kind, 2 peers train 4 versions: the
# validation loss must fall, every task must name no data range, no
# /v1/data request may be answered with data, and a peer given labelled
# images (or nothing) for a GPT run refuses its tasks.
source "$(dirname "$0")/lib.sh"
MAKE_SHARD=${MAKE_SHARD:?}
VERSIONS=4
it_files
head -c 150000 corpus.txt > text0.txt
tail -c +150001 corpus.txt | head -c 150000 > text1.txt
tail -c 40000 corpus.txt > val.txt
"$MAKE_SHARD" corpus.txt tok0.bin 0 60000
"$MAKE_SHARD" corpus.txt tok1.bin 60000 60000
"$MAKE_SHARD" corpus.txt valtok.bin 200000 20000

# one_run NAME VOCAB DATA_JSON FILE0 FILE1
one_run() {
  rm -rf run.db* peer1 peer2 ./*.log
  cat > run.json <<JSON
{
  "name": "$1",
  "data": $3,
  "seed": 7,
  "model": {"vocab_size": $2, "block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32},
  "updates_per_version": 2,
  "max_versions": $VERSIONS,
  "train": {"steps": 6, "batch": 4, "lr": 0.01},
  "outer": {"lr": 1.0, "momentum": 0.0},
  "lease_s": 60,
  "max_body_bytes": 16777216,
  "val_batches": 4
}
JSON
  "$COORD" init --db run.db --config run.json 2> init.log || fail "$1: init: $(cat init.log)"
  it_start_coordinator
  for i in 1 2; do it_peer "$i"; done
  "$PEER" run --dir peer1 --threads 1 --wait 10 --data "$4" 2> peer1.log &
  PIDS+=($!)
  "$PEER" run --dir peer2 --threads 1 --wait 10 --data "$5" 2> peer2.log &
  PIDS+=($!)
  for p in "${PIDS[@]}"; do wait "$p" || fail "$1: a peer failed"; done
  PIDS=()
  it_stop_coordinator
  it_check_run "$VERSIONS" 2
  local first last
  first=$(q 'SELECT val_loss FROM versions WHERE version = 0')
  last=$(q "SELECT val_loss FROM versions WHERE version = $VERSIONS")
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.05) }' \
    || fail "$1: validation loss $first -> $last did not fall"
  grep -q '"data":{"kind":"local"' <(q 'SELECT config FROM run') || fail "$1: not a local run"
  [ "$(q 'SELECT count(*) FROM tasks WHERE data_offset <> 0')" = 0 ] || fail "$1: a task names a data range"
  if grep -q 'GET /v1/data.* 20[06] ' coordinator.log; then fail "$1: the coordinator served data"; fi
  grep -q "local data:" peer1.log || fail "$1: peer 1 did not report its data"
  echo "local_gpt: $1: validation loss $first -> $last"
}

one_run ittext 256 '{"kind": "local", "val": "val.txt"}' text0.txt text1.txt
one_run ittokens 50257 '{"kind": "local", "val_shard": "valtok.bin"}' tok0.bin tok1.bin

# A GPT task refused by a peer holding images, and by one holding nothing.
rm -rf run.db* peer1 peer2 ./*.log
sed -i 's/"max_versions": [0-9]*/"max_versions": 1/' run.json
"$COORD" init --db run.db --config run.json 2> init.log || fail "init"
it_start_coordinator
it_peer 1
FM=/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz
if [ -f "$FM" ]; then
  "$PEER" run --dir peer1 --threads 1 --wait 2 --max-tasks 1 --data "$FM" 2> peer1.log &
  PIDS+=($!)
  for _ in $(seq 1 100); do grep -q 'refused' peer1.log && break; sleep 0.1; done
  grep -q "trains a GPT on the peer's own data" peer1.log || fail "a peer with images took a GPT task"
  it_stop_peers
fi
echo "1 passed, 0 failed"
