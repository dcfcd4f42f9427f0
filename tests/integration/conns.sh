#!/usr/bin/env bash
# Connections that hold descriptors without sending a request.
#
# 1. Per address: 40 silent connections from 127.0.0.1 with
#    --conns-per-addr 8: all but the 8 oldest are closed within seconds,
#    long before the idle limit (60 s here), and those 8 stay open.
# 2. Out of descriptors: the coordinator runs with 96 descriptors and no
#    total cap of its own, and 300 silent connections arrive at once.
#    accept() fails with EMFILE; the coordinator pauses accepting instead
#    of spinning, writes at most a few log lines about it (not one per
#    failure), closes the silent connections (quickly, being under
#    pressure), and a real peer then joins and trains as usual.
source "$(dirname "$0")/lib.sh"
it_setup itconns 1 1

IT_SERVE_ARGS="--conns-per-addr 8 --idle-first 60" it_start_coordinator
out=$(python3 "$ROOT/tests/integration/hold_conns.py" 127.0.0.1 "$PORT" 40 4)
echo "per address: $out"
read -r _ closed _ open _ <<< "$out"
[ "$closed" = 32 ] && [ "$open" = 8 ] || fail "per-address cap: $out (wanted 32 closed, 8 open)"
it_stop_coordinator

# 96 descriptors: the database, its journal, logs and the listener take
# some; the rest fill up with the silent connections.
(ulimit -n 96; exec "$COORD" serve --db run.db --cert tls/server.pem --key tls/server.key \
  --listen "127.0.0.1:$PORT" --max-conns 100000 --conns-per-addr 0 --idle-first 5 \
  2> coordinator-2.log) &
CPID=$!
for _ in $(seq 1 100); do
  grep -q 'listening on' coordinator-2.log && break
  sleep 0.1
done
out=$(python3 "$ROOT/tests/integration/hold_conns.py" 127.0.0.1 "$PORT" 300 30)
echo "out of descriptors: $out"
read -r _ closed _ open _ <<< "$out"
[ "$closed" = 300 ] || fail "silent connections were not all closed: $out"
kill -0 "$CPID" 2>/dev/null || fail "the coordinator died"
fails=$(grep -c 'accept() failed' coordinator-2.log || true)
echo "log lines about accept failures: $fails"
grep -q 'accept() failed' coordinator-2.log || fail "accept() never ran out of descriptors"
[ "$fails" -le 5 ] || fail "$fails log lines about accept failures (the log is not rate-limited)"
URL="https://127.0.0.1:$PORT"
it_peer 1
"$PEER" run --dir peer1 --threads 1 --wait 5 --retries 5 --max-tasks 1 2> peer1.log \
  || fail "a real peer could not train after the flood"
[ "$(q 'SELECT count(*) FROM updates')" = 1 ] || fail "the peer's update is not stored"
it_stop_coordinator
echo "1 passed, 0 failed"
