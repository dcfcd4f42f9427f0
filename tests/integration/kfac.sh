#!/usr/bin/env bash
# K-FAC as the peers' inner optimizer, with factor sharing: a real
# coordinator and 2 real peers over TLS for a few synchronous versions.
# First a client's bad factors (missing, NaN, asymmetric, not PSD, without
# the bias 1, another model's shapes) are refused with 422 and change
# nothing stored; then its lease is finished with valid factors. Every
# version must merge the factors its updates carried into one file stored
# with it, the peers must start tasks from those merged factors, and the
# validation loss must fall.
source "$(dirname "$0")/lib.sh"
ATTACK=${ATTACK:?}
VERSIONS=6
IT_TRAIN='{"steps": 4, "batch": 4, "optimizer": "kfac", "lr": 0.1, "momentum": 0,
  "kfac": {"damping": 0.001, "decay": 0.95, "inverse_every": 2, "kl_clip": 0.01,
           "share": true, "dtype": "F16"}}'
it_setup itkfac "$VERSIONS" 2
it_start_coordinator
t1=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
mkdir attacker
"$ATTACK" prepare "$URL" tls/ca.pem attacker "$t1" vlt_0 > attack-prepare.log \
  || fail "attack prepare: $(cat attack-prepare.log)"
grep -q '"optimizer":"kfac"' <(q 'SELECT config FROM run') || fail "the run is not a K-FAC run"
before=$(it_snapshot_held)
ATTACK_DB=run.db "$ATTACK" kfac "$URL" tls/ca.pem attacker bad > attack.log \
  || fail "bad factors: $(cat attack.log)"
[ "$before" = "$(it_snapshot_held)" ] || fail "refused factors changed the database"
"$ATTACK" kfac "$URL" tls/ca.pem attacker finish >> attack.log || fail "valid factors refused"
for i in 1 2; do it_peer "$i"; done
for i in 1 2; do
  "$PEER" run --dir "peer$i" --threads 1 --wait 10 2> "peer$i.log" &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p" || fail "a peer exited with an error"; done
PIDS=()
it_stop_coordinator

it_check_run "$VERSIONS" 2
# Each version carries the merged factors of its 2 updates; versions at or
# below the newest minus keep_versions (4) were pruned, the rest remain.
[ "$(q 'SELECT count(*) FROM factors')" = 4 ] || fail "expected the factors of 4 versions"
[ "$(q 'SELECT min(version) || "-" || max(version) FROM factors')" = "3-$VERSIONS" ] \
  || fail "factors are stored for the wrong versions"
[ "$(q 'SELECT count(*) FROM factors WHERE peers <> 2')" = 0 ] || fail "a version averaged other than 2 updates' factors"
# 4 steps of 4 windows of 32 tokens per update: 512 samples each.
[ "$(q 'SELECT count(*) FROM factors WHERE samples <> 1024')" = 0 ] || fail "wrong sample counts"
[ "$(q "SELECT count(*) FROM factors f JOIN versions v USING (version) WHERE length(f.blob) < 10000")" = 0 ] \
  || fail "a factors file is too small to hold the model's factors"
adopted=$(cat peer1.log peer2.log | grep -c 'K-FAC factors merged into version' || true)
[ "$adopted" -ge 4 ] || fail "the peers adopted merged factors only $adopted times"
grep -q ' [1-9][0-9]* bytes of K-FAC factors' peer1.log \
  || fail "peer 1 reports no factor traffic"
first=$(q 'SELECT val_loss FROM versions WHERE version = 0')
last=$(q "SELECT val_loss FROM versions WHERE version = $VERSIONS")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' || fail "loss did not fall: $first -> $last"
refused=$(grep -c '| PASS |' attack.log)
echo "kfac: $refused factor requests answered as expected; merged factors adopted $adopted times"
echo "kfac: $VERSIONS versions, loss $first -> $last"
echo "1 passed, 0 failed"
