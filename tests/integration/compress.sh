#!/usr/bin/env bash
# A compressed run end to end (KIND = topk, gaussk or sketch): bad
# compressed updates and delta requests are refused with their codes and
# change nothing; real peers then train the run to its end uploading that
# kind (topk over slices of 256, topk and gaussk with a decaying residual,
# which the peers must report using), catch up by delta instead of downloading the model, and the
# coordinator stores one sparse change per version, pruning old ones.
source "$(dirname "$0")/lib.sh"
ATTACK=${ATTACK:?}
KIND=${1:?usage: compress.sh topk|gaussk|sketch}
VERSIONS=6
case "$KIND" in
  sketch) comp='"compression": {"kind": "sketch", "ratio": 20, "rows": 3, "seed": 99},' ;;
  # topk over slices, both with a decaying residual; the peers must say
  # they use what the run configured.
  topk) comp='"compression": {"kind": "topk", "ratio": 20, "dtype": "F16", "block": 256,
              "decay": 0.9},' ;;
  *) comp="\"compression\": {\"kind\": \"$KIND\", \"ratio\": 20, \"dtype\": \"F16\",
           \"decay\": 0.9}," ;;
esac
it_setup "itcomp-$KIND" $VERSIONS 2 "$comp \"keep_changes\": 3,"
it_start_coordinator
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
mkdir -p atk
"$ATTACK" prepare "$URL" tls/ca.pem atk "$token" "vlt_$(printf '%064d' 0)" > prepare.log 2>&1 \
  || { cat prepare.log; fail "prepare"; }

# A refused update ends its lease; nothing else may change.
before=$(it_snapshot_held)
"$ATTACK" sparse "$URL" tls/ca.pem atk | tee sparse.log
rc=${PIPESTATUS[0]}
after=$(it_snapshot_held)
[ "$rc" = 0 ] || fail "some bad compressed requests got the wrong answer"
[ "$before" = "$after" ] || { diff <(echo "$before") <(echo "$after") >&2; fail "bad requests changed the database"; }
"$ATTACK" finish "$URL" tls/ca.pem atk | tee finish.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "a valid $KIND update was refused"

for i in 1 2; do it_peer $i; done
# Peer 1 leaves the device to the peer (auto), peer 2 asks for the CPU.
device=(auto cpu)
for i in 1 2; do
  "$PEER" run --dir "peer$i" --device "${device[$((i - 1))]}" --wait 5 --retries 3 \
    > "peer$i.out" 2> "peer$i.log" &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p" || fail "a peer exited with an error"; done
PIDS=()
# The attacker's one update took a slot of version 1.
[ "$(q 'SELECT count(*) FROM versions')" = $((VERSIONS + 1)) ] || fail "the run did not finish"
[ "$(q "SELECT count(*) FROM updates WHERE kind <> '$( [ "$KIND" = sketch ] && echo sketch || echo topk)'")" = 0 ] \
  || fail "an update of another kind was stored"
dense=$(grep -o '[0-9]* parameters' peer1.log | head -n1 | cut -d' ' -f1)
maxb=$(q 'SELECT max(nbytes) FROM updates')
[ $((maxb * 10)) -lt $((dense * 4)) ] || fail "updates of $maxb bytes are not compressed (model $dense parameters)"
# Changes: one per version, the oldest pruned (keep_changes 3).
[ "$(q 'SELECT group_concat(version) FROM changes ORDER BY version')" = "4,5,6" ] \
  || fail "stored changes are $(q 'SELECT group_concat(version) FROM changes')"
grep -q "by delta" peer1.log peer2.log || fail "no peer caught up by delta"
# Every delta led to its version's digest: none was refused.
! grep -q "refused (delta" peer1.log peer2.log || fail "a delta did not match its version"
grep -q "training on the CPU (--device cpu)" peer2.log || fail "peer 2 does not say it trains on the CPU"
if grep -q "training on the CPU (no usable GPU: " peer1.log; then
  # Where auto found no GPU, asking for one is refused at once, in one line.
  set +e
  "$PEER" run --dir peer1 --device cuda --wait 1 > cuda.out 2> cuda.log
  rc=$?
  set -e
  [ "$rc" = 1 ] || fail "--device cuda without a GPU exited $rc"
  # Its start-up log lines (priority, waits, threads) are not the error.
  grep -v ' INFO volley-peer: ' cuda.log > cuda.err || true
  [ "$(wc -l < cuda.err)" = 1 ] && grep -q "^volley-peer: --device cuda: no usable GPU (" cuda.err \
    || { cat cuda.log >&2; fail "--device cuda without a GPU did not say so in one line"; }
else
  grep -q "training on CUDA device 0: " peer1.log || fail "peer 1 does not say which device it trains on"
fi
if [ "$KIND" != sketch ]; then
  for i in 1 2; do
    want="compression: $KIND k=[0-9]* F16, residual decay 0.9"
    [ "$KIND" = topk ] && want="compression: topk k=[0-9]* F16, blocks of 256, residual decay 0.9"
    grep -q "$want" "peer$i.log" || fail "peer $i does not use the run's blocks and decay"
  done
fi
v0=$(q 'SELECT val_loss FROM versions WHERE version = 0')
vN=$(q "SELECT val_loss FROM versions WHERE version = $VERSIONS")
awk -v a="$v0" -v b="$vN" 'BEGIN { exit !(b < a) }' || fail "validation loss did not fall ($v0 -> $vN)"
"$ATTACK" delta "$URL" tls/ca.pem atk 0 410 | tee -a sparse.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "a pruned delta was not 410"
"$ATTACK" delta "$URL" tls/ca.pem atk 4 200 | tee -a sparse.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "the delta since version 4 is not sound"
it_stop_coordinator
if [ "$KIND" = sketch ]; then
  # A sketch run stored by a volley from before the windowed hash (its
  # configuration names no hash) is refused at start, in one line, and
  # its database is left as it was.
  grep -q '"hash": *"window"' <(sqlite3 run.db 'SELECT config FROM run') \
    || fail "the stored configuration does not name its sketch hash"
  cp run.db old.db
  sqlite3 old.db "UPDATE run SET config = json_remove(config, '\$.compression.hash')"
  sqlite3 old.db 'PRAGMA wal_checkpoint(TRUNCATE)' > /dev/null
  sum=$(sha256sum old.db)
  if "$COORD" serve --db old.db --cert tls/server.pem --key tls/server.key \
    --listen 127.0.0.1:0 --admin-listen off 2> old.log; then
    fail "a sketch run of the old hash was served"
  fi
  grep -q 'hashed every coordinate on its own' old.log || fail "no reason given: $(tail -n 2 old.log)"
  [ "$(sha256sum old.db)" = "$sum" ] || fail "refusing the old sketch run changed its database"
fi
echo "compress $KIND: $VERSIONS versions, val_loss $v0 -> $vN, largest update $maxb bytes"
