#!/usr/bin/env bash
# A run on llm.c token shards with GPT-2's vocabulary (50257), through the
# real coordinator and 2 real peers over TLS. Shards come from the license
# texts (tests/integration/make_shard.c).
#
# 1. init refuses every bad shard with one line naming it and the fault,
#    and creates no database.
# 2. A client takes a lease and checks the token endpoint: its range is
#    served as a shard of exactly the file's tokens, and bad requests are
#    refused with nothing stored changed. In a run with leases of 2 s its
#    lease expires, and the next task takes over the same range
#    (reissue_of) and is served the same tokens.
# 3. A run with long leases: 2 peers train it to its end; every update is
#    merged once, every range is a task's tokens inside one shard, and the
#    validation loss, on the validation shard, falls from about ln 50257.
# 4. serve refuses shards changed since init, in one line.
source "$(dirname "$0")/lib.sh"
ATTACK=${ATTACK:?}
MAKE_SHARD=${MAKE_SHARD:?}
VERSIONS=3
LEASE=120
TASK=4096

it_files
"$MAKE_SHARD" corpus.txt train0.bin 0 100000
"$MAKE_SHARD" corpus.txt train1.bin 100000 60000
"$MAKE_SHARD" corpus.txt val.bin 200000 20000
for m in bad-magic big-token truncated; do "$MAKE_SHARD" corpus.txt "$m.bin" 0 5000 "$m"; done
"$MAKE_SHARD" corpus.txt short.bin 0 20

# write_config SECOND_TRAIN_SHARD [VOCAB [VAL_SHARD]]
write_config() {
  cat > run.json <<JSON
{
  "name": "itshards",
  "data": {"kind": "shards", "train": ["train0.bin", "$1"], "val": "${3:-val.bin}"},
  "seed": 7,
  "model": {"vocab_size": ${2:-50257}, "block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32},
  "updates_per_version": 2,
  "max_versions": $VERSIONS,
  "train": {"steps": 4, "batch": 4, "lr": 0.01},
  "outer": {"lr": 1.0, "momentum": 0.0},
  "task_tokens": $TASK,
  "lease_s": ${LEASE},
  "max_body_bytes": 16777216,
  "val_batches": 4
}
JSON
}

# refused_init WHAT NEEDLE: init fails with one line holding NEEDLE and
# leaves no database behind.
refused_init() {
  if "$COORD" init --db run.db --config run.json 2> refused.log; then fail "init accepted $1"; fi
  [ "$(wc -l < refused.log)" = 1 ] || fail "the refusal of $1 is not one line: $(cat refused.log)"
  grep -qF -- "$2" refused.log || fail "the refusal of $1 lacks '$2': $(cat refused.log)"
  [ ! -e run.db ] || fail "init of $1 left a database behind"
  echo "shards: $1 refused: $(cat refused.log)"
}
# ---- 1. bad shards
write_config bad-magic.bin
refused_init "a shard with a bad magic number" "bad-magic.bin: bad magic"
write_config big-token.bin
refused_init "a token not below vocab_size" "big-token.bin: token 2500 is 50257, not below vocab_size 50257"
write_config truncated.bin
refused_init "a truncated shard" "truncated.bin: size 11023 bytes, expected 11024"
write_config short.bin
refused_init "a shard shorter than one window" "short.bin: 20 tokens, fewer than one window"
write_config train1.bin 256
refused_init "GPT-2 ids under a byte vocabulary" "not below vocab_size 256"
write_config train1.bin 50257 missing.bin
refused_init "a missing validation shard" "missing.bin"

# ---- 2. the token endpoint, then a lease that expires
# new_run [LEASE_S]: a fresh database and coordinator. The last
# coordinator's log is kept aside first: it_start_coordinator must not
# read the old port from it before the new process truncates it.
RUNS=0
new_run() {
  rm -f run.db run.db-wal run.db-shm
  LEASE=${1:-$LEASE} write_config train1.bin
  "$COORD" init --db run.db --config run.json 2> init.log || fail "init: $(cat init.log)"
  RUNS=$((RUNS + 1))
  [ ! -e coordinator.log ] || mv coordinator.log "coordinator-$RUNS.log"
  it_start_coordinator
}
# start_run LEASE_S: new_run, and a client holding a lease.
start_run() {
  new_run "$1"
  token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
  rm -rf atk && mkdir atk
  "$ATTACK" prepare "$URL" tls/ca.pem atk "$token" "vlt_$(printf '%064d' 0)" > prepare.log 2>&1 \
    || { cat prepare.log; fail "prepare"; }
}
# check_tokens LOG: the range the client's lease names (printed in LOG) is
# what the endpoint served, byte for byte as the shard file holds it.
check_tokens() {
  read -r shard off len <<< "$(sed -n 's/^tokens range //p' "$1")"
  [ "$len" = "$TASK" ] || fail "the lease names ${len:-no} tokens, not $TASK"
  dd if="train$shard.bin" of=expect.bin iflag=skip_bytes,count_bytes bs=65536 \
    skip=$((1024 + 2 * off)) count=$((2 * len)) status=none
  [ "$(stat -c %s expect.bin)" = $((2 * len)) ] || fail "the range lies outside train$shard.bin"
  cmp -s -i 1024:0 atk/tokens.bin expect.bin || fail "the served tokens are not the shard's"
}
# Leases long enough that nothing changes the database while it is watched.
start_run 120
ATTACK_DB=run.db "$ATTACK" tokens "$URL" tls/ca.pem atk | tee tokens.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "the token endpoint misbehaved"
check_tokens tokens.log
it_stop_coordinator
# Leases of 2 s: the client's expires, and the next task takes its range.
start_run 2
late=$(q "SELECT min(id) FROM tasks") # the client's, whether or not it expired yet
[ -n "$late" ] || fail "the client holds no lease"
sleep 3
"$ATTACK" lease "$URL" tls/ca.pem atk > lease.log || { cat lease.log; fail "a new lease"; }
"$ATTACK" tokens "$URL" tls/ca.pem atk > tokens2.log || { cat tokens2.log; fail "tokens again"; }
check_tokens tokens2.log
[ "$(q "SELECT count(*) FROM tasks t JOIN tasks o ON t.reissue_of = o.id
        WHERE o.id = $late AND t.data_offset = o.data_offset AND t.data_length = o.data_length")" = 1 ] \
  || fail "the expired lease's range did not go to exactly one later task"
echo "shards: the expired lease's range ($shard $off $len) went to task $(q "SELECT id FROM tasks WHERE reissue_of = $late")"
it_stop_coordinator

# ---- 3. training
new_run
it_peer 1
it_peer 2
for i in 1 2; do
  "$PEER" run --dir "peer$i" --threads 1 --wait 10 2> "peer$i.log" &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p" || fail "a peer exited with an error"; done
PIDS=()
it_stop_coordinator

it_check_run "$VERSIONS" 2
# Shards of 100000 and 60000 tokens laid end to end: no range crosses one.
[ "$(q "SELECT count(*) FROM tasks WHERE data_length <> $TASK OR data_offset + data_length > 160000
        OR (data_offset < 100000 AND data_offset + data_length > 100000)")" = 0 ] \
  || fail "a task's range is not $TASK tokens inside one shard"
[ "$(q 'SELECT count(DISTINCT data_offset < 100000) FROM tasks')" = 2 ] \
  || fail "the tasks did not use both training shards"
first=$(q 'SELECT val_loss FROM versions WHERE version = 0')
last=$(q "SELECT val_loss FROM versions WHERE version = $VERSIONS")
awk -v a="$first" 'BEGIN { exit !(a > 10.6 && a < 11.2) }' || fail "initial loss $first is not about ln 50257"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 2) }' || fail "loss did not fall: $first -> $last"
for i in 1 2; do
  grep -q 'run_finished\|run finished' "peer$i.log" || fail "peer $i did not see the run finish"
  grep -Eq 'downloaded .* [1-9][0-9]* bytes of data' "peer$i.log" || fail "peer $i fetched no data"
  [ ! -e "peer$i/task.tokens" ] || fail "peer $i left its task's tokens behind"
done

# The model exports for transformers with GPT-2's end-of-text token.
"$COORD" export --db run.db --out export 2> export.log || fail "export: $(cat export.log)"
grep -q '"eos_token_id": 50256' export/config.json || fail "the export lacks GPT-2's <|endoftext|>"
grep -q '"vocab_size": 50257' export/config.json || fail "the export's vocabulary is not GPT-2's"

# ---- 4. shards changed since init
refused_serve() {
  if "$COORD" serve --db run.db --cert tls/server.pem --key tls/server.key \
    --listen 127.0.0.1:0 2> serve.log; then fail "serve accepted $1"; fi
  grep -qF -- "$2" serve.log || fail "serving $1: no '$2' in $(cat serve.log)"
  [ "$(grep -c 'volley-coordinator:' serve.log)" = 1 ] || fail "serving $1: not one line: $(cat serve.log)"
  echo "shards: serving $1 refused: $(grep 'volley-coordinator:' serve.log)"
}
cp train1.bin train1.orig
printf '\x01\x00' | dd of=train1.bin bs=1 seek=2000 conv=notrunc 2>/dev/null
refused_serve "a shard changed since init" "changed since init"
printf '\xff\xff' | dd of=train1.bin bs=1 seek=2000 conv=notrunc 2>/dev/null
refused_serve "a shard whose token grew past the vocabulary" "token 488 is 65535, not below vocab_size 50257"
echo "shards: $VERSIONS versions, loss $first -> $last"
echo "1 passed, 0 failed"
