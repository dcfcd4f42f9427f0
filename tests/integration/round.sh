#!/usr/bin/env bash
# The real coordinator and 3 real peers over TLS on 127.0.0.1 for a few
# synchronous versions; then the database must hold every version with its
# updates and validation loss, every update merged exactly once.
source "$(dirname "$0")/lib.sh"
VERSIONS=4
it_setup itround "$VERSIONS" 3
# Debug logging everywhere, so the check for secrets sees every line.
VOLLEY_LOG=debug it_start_coordinator
# Without the run's CA the peer must refuse the coordinator, in one line.
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
"$PEER" keygen --dir nocert > /dev/null
if "$PEER" join --dir nocert --coordinator "$URL" --token "$token" --retries 1 2> nocert.log; then
  fail "join without --cacert succeeded against a private CA"
fi
grep -qi 'certificate' nocert.log || fail "no certificate error: $(cat nocert.log)"
[ "$(wc -l < nocert.log)" = 1 ] || fail "the error is not one line: $(cat nocert.log)"
for i in 1 2 3; do it_peer "$i"; done
for i in 1 2 3; do
  VOLLEY_LOG=debug "$PEER" run --dir "peer$i" --threads 1 --wait 10 2> "peer$i.log" &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do
  wait "$p" || fail "a peer exited with an error"
done
PIDS=()
it_stop_coordinator

it_check_run "$VERSIONS" 3
it_check_no_secrets
[ "$(q 'SELECT count(*) FROM peers')" = 3 ] || fail "expected 3 peers"
first=$(q 'SELECT val_loss FROM versions WHERE version = 0')
last=$(q "SELECT val_loss FROM versions WHERE version = $VERSIONS")
awk -v a="$first" 'BEGIN { exit !(a > 5.4 && a < 5.7) }' || fail "initial loss $first is not about ln 256"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss did not fall: $first -> $last"
for i in 1 2 3; do grep -q 'run_finished\|run finished' "peer$i.log" || fail "peer $i did not see the run finish"; done
# The finished run exported for transformers through the real CLI; a
# second export into the same directory is refused without --force.
"$COORD" export --db run.db --out export 2> export.log || fail "export: $(cat export.log)"
[ -s export/model.safetensors ] || fail "export wrote no model.safetensors"
grep -q '"model_type": "gpt2"' export/config.json || fail "export wrote no GPT-2 config.json"
if "$COORD" export --db run.db --out export 2> export2.log; then
  fail "a second export into a non-empty directory was not refused"
fi
[ "$(wc -l < export2.log)" = 1 ] || fail "the refusal is not one line: $(cat export2.log)"
"$COORD" export --db run.db --out export --version 999 --force 2> export3.log \
  && fail "an unknown version was exported"
echo "round: export: $(ls export | tr '\n' ' '); refused again: $(cat export2.log)"
echo "round: without the CA: $(cat nocert.log)"
echo "round: $VERSIONS versions, loss $first -> $last"
echo "1 passed, 0 failed"
