#!/usr/bin/env bash
# deploy/make-shards.py: text into llm.c token shards that a run trains on.
#
# 1. Byte-level shards of the license texts: every header reads magic
#    20240520, version 1 and its token count; the shards' tokens, val
#    first, are the input's bytes in order; check --config and init read
#    them as the run's data (the coordinator's own shard reader).
# 2. Two real peers train 3 versions on them over TLS; the validation loss
#    (on the val shard) falls below ln 256.
# 3. Bad input gets one line, exit 2 and no shard: a missing file, a shard
#    size of 0, a validation slice that leaves nothing to train on.
# 4. --tokenizer auto says which tokenizer it took; where GPT-2's loads,
#    its shards hold ids below 50257 and init takes them with that vocab.
source "$(dirname "$0")/lib.sh"
MS=$ROOT/deploy/make-shards.py
it_files
inputs=(/usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0
  /usr/share/common-licenses/LGPL-2.1 /usr/share/common-licenses/MPL-2.0)

# ---- 1. the format
python3 "$MS" --tokenizer bytes --shard-tokens 40000 --val-tokens 16384 --name lic shards \
  "${inputs[@]}" > make.log 2> make.err || fail "make-shards: $(cat make.err)"
grep -q "byte-level tokens, vocab_size 256" make.log || fail "no tokenizer line: $(cat make.log)"
data=$(tail -n1 make.log)
python3 - "$data" "${inputs[@]}" <<'PY' || fail "the shards are not the input's bytes"
import json, struct, sys
d = json.loads(sys.argv[1])
assert d["model"]["vocab_size"] == 256, d
paths = [d["data"]["val"]] + d["data"]["train"]
assert len(d["data"]["train"]) >= 2, paths
toks = bytearray()
for p in paths:
    raw = open(p, "rb").read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    assert (magic, version) == (20240520, 1), (p, magic, version)
    assert raw[12:1024] == bytes(1012), p
    assert len(raw) == 1024 + 2 * n, (p, len(raw), n)
    vals = struct.unpack(f"<{n}H", raw[1024:])
    assert max(vals) < 256, p
    toks += bytes(vals)
want = b"".join(open(p, "rb").read() for p in sys.argv[2:])
assert bytes(toks) == want, (len(toks), len(want))
print(f"make_shards: {len(paths)} shards, {len(toks)} tokens = the input's bytes")
PY
python3 - "$data" <<'PY' > run.json
import json, sys
d = json.loads(sys.argv[1])
print(json.dumps({
    "name": "itmakeshards", "data": d["data"], "seed": 7,
    "model": {"vocab_size": 256, "block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32},
    "updates_per_version": 2, "max_versions": 3,
    "train": {"steps": 20, "batch": 8, "lr": 0.01}, "outer": {"lr": 1.0, "momentum": 0.0},
    "task_tokens": 4096, "lease_s": 120, "max_body_bytes": 4194304, "val_batches": 8}, indent=1))
PY
"$COORD" check --config run.json > check.log 2>&1 || fail "check --config: $(tail -n 3 check.log)"
"$COORD" init --db run.db --config run.json 2> init.log || fail "init: $(cat init.log)"

# ---- 2. a run on them
it_start_coordinator
for i in 1 2; do it_peer "$i"; done
for i in 1 2; do
  "$PEER" run --dir "peer$i" --threads 1 --wait 10 --retries 12 2> "peer$i.log" &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p" || fail "a peer failed"; done
PIDS=()
it_stop_coordinator
[ "$(q 'SELECT status FROM run')" = finished ] || fail "the run did not finish"
loss=$(q "SELECT val_loss FROM versions ORDER BY version DESC LIMIT 1")
awk -v l="$loss" 'BEGIN { exit !(l < 5.5452) }' || fail "validation loss $loss after 3 versions"
echo "make_shards: 3 versions on the shards, validation loss $loss (ln 256 = 5.5452)"

# ---- 3. bad input
refused() {
  local what=$1; shift
  rm -rf bad
  if python3 "$MS" "$@" > bad.out 2> bad.err; then fail "$what was accepted"; else rc=$?; fi
  [ "$rc" = 2 ] || fail "$what: exit $rc, not 2"
  [ "$(wc -l < bad.err)" = 1 ] || fail "$what: not one line: $(cat bad.err)"
  [ -z "$(ls bad 2>/dev/null)" ] || fail "$what left shards: $(ls bad)"
  echo "make_shards: $what refused: $(cat bad.err)"
}
refused "a missing input" --tokenizer bytes bad /nonexistent/text
refused "a shard size of 0" --tokenizer bytes --shard-tokens 0 bad "${inputs[0]}"
refused "a validation slice of the whole text" --tokenizer bytes --val-tokens 100000000 bad "${inputs[0]}"

# ---- 4. auto
python3 "$MS" --val-tokens 4096 --name auto auto "${inputs[0]}" > auto.log 2> auto.err \
  || fail "make-shards auto: $(cat auto.err)"
if grep -q "GPT-2 (" auto.log; then
  python3 - "$(tail -n1 auto.log)" <<'PY' || fail "GPT-2 shards out of range"
import json, struct, sys
d = json.loads(sys.argv[1])
assert d["model"]["vocab_size"] == 50257
for p in [d["data"]["val"]] + d["data"]["train"]:
    raw = open(p, "rb").read()
    n = struct.unpack("<3i", raw[:12])[2]
    assert max(struct.unpack(f"<{n}H", raw[1024:])) < 50257, p
PY
  python3 - "$(tail -n1 auto.log)" > gpt2.json <<'PY'
import json, sys
c = json.load(open("run.json"))
c.update(data=json.loads(sys.argv[1])["data"], name="itmakeshards-gpt2")
c["model"]["vocab_size"] = 50257
print(json.dumps(c))
PY
  "$COORD" init --db gpt2.db --config gpt2.json 2> gpt2.log || fail "init on GPT-2 shards: $(cat gpt2.log)"
  echo "make_shards: $(head -n1 auto.log)"
else
  grep -q "byte-level tokens, vocab_size 256 (no GPT-2 tokenizer" auto.log \
    || fail "auto did not say which tokenizer it took: $(cat auto.log)"
  echo "make_shards: no GPT-2 tokenizer here: $(head -n1 auto.log)"
fi
echo "1 passed, 0 failed"
