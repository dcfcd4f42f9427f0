#!/usr/bin/env bash
# SIGTERM in the middle of a run: the coordinator drains and exits 0; a new
# one on the same database and port continues from the last committed
# version while the peers ride out the gap with their retries. In the end
# every version exists once, and every acknowledged update is stored and
# merged exactly once.
source "$(dirname "$0")/lib.sh"
VERSIONS=8
it_setup itrestart "$VERSIONS" 3
it_start_coordinator
for i in 1 2 3; do it_peer "$i"; done
for i in 1 2 3; do
  "$PEER" run --dir "peer$i" --threads 1 --wait 10 --retries 12 2> "peer$i.log" &
  PIDS+=($!)
done
for _ in $(seq 1 300); do
  [ "$(q 'SELECT current_version FROM run')" -ge 3 ] && break
  sleep 0.1
done
cut=$(q 'SELECT current_version FROM run')
[ "$cut" -ge 3 ] || fail "the run did not reach version 3"
it_stop_coordinator
mv coordinator.log coordinator-1.log
grep -q 'drained' coordinator-1.log || fail "the coordinator did not drain"
"$COORD" serve --db run.db --cert tls/server.pem --key tls/server.key \
  --listen "127.0.0.1:$PORT" 2> coordinator.log &
CPID=$!
for p in "${PIDS[@]}"; do
  wait "$p" || fail "a peer did not survive the restart"
done
PIDS=()
it_stop_coordinator

it_check_run "$VERSIONS" 3
acked=$(cat peer*.log | grep -c 'accepted' || true)
[ "$acked" = $((3 * VERSIONS)) ] || fail "peers saw $acked acknowledgements, expected $((3 * VERSIONS))"
echo "restart: stopped at version $cut, finished at $VERSIONS"
echo "1 passed, 0 failed"
