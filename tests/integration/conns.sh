#!/usr/bin/env bash
# Connections that hold descriptors without sending a request.
#
# 1. Per address: 40 silent connections from 127.0.0.1 with
#    --conns-per-addr 8: all but the 8 oldest are closed within seconds,
#    long before the idle limit (60 s here), and those 8 stay open.
# 2. One byte of a head, and kept-alive connections: 50 TLS connections
#    that each sent "G" after their handshake are idle like silent ones
#    (all but 8 closed at once, the rest after --idle-first 6 s); 30 that
#    each asked GET /v1/status and then kept the connection alive with
#    nothing in progress are closed after --idle-keepalive 3 s.
# 3. The admin listener flooded: under 256 descriptors, 600 silent TCP
#    connections to the admin port (before, it took them until accept()
#    failed and then spun on the error: a whole core and 267 MB of log in
#    8 s). It holds at most 16 and leaves the rest in the kernel's
#    backlog, so accept() never spins, the log stays short, the
#    coordinator's CPU stays low, and a TLS request on the public port is
#    answered meanwhile.
# 4. Out of descriptors: the coordinator runs with 96 descriptors and no
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

IT_SERVE_ARGS="--conns-per-addr 8 --idle-first 6 --idle-keepalive 3" it_start_coordinator
flood="$ROOT/tests/integration/flood_conns.py"
out=$(python3 "$flood" 127.0.0.1 "$PORT" 50 1.5 --tls tls/ca.pem --send byte)
echo "one byte of a head, after 1.5 s: $out"
read -r _ closed _ open _ <<< "$out"
[ "$closed" = 42 ] && [ "$open" = 8 ] || fail "one byte of a head: $out (wanted 42 closed, 8 open)"
out=$(python3 "$flood" 127.0.0.1 "$PORT" 50 12 --tls tls/ca.pem --send byte)
echo "one byte of a head, up to 12 s: $out"
read -r _ closed _ <<< "$out"
[ "$closed" = 50 ] || fail "one byte of a head: $out (wanted all 50 closed)"
out=$(python3 "$flood" 127.0.0.1 "$PORT" 30 8 --tls tls/ca.pem --send status)
echo "kept alive after GET /v1/status, up to 8 s: $out"
read -r _ closed _ <<< "$out"
[ "$closed" = 30 ] || fail "kept-alive connections: $out (wanted all 30 closed)"
it_stop_coordinator

(ulimit -n 256; exec "$COORD" serve --db run.db --cert tls/server.pem --key tls/server.key \
  --listen "127.0.0.1:$PORT" --admin-listen 127.0.0.1:0 2> coordinator-admin.log) &
CPID=$!
for _ in $(seq 1 100); do
  grep -q 'admin listener on' coordinator-admin.log && break
  sleep 0.1
done
admin=$(grep -o 'admin listener on http://[0-9.]*:[0-9]*' coordinator-admin.log | head -n1 \
  | sed 's#.*http://##')
[ -n "$admin" ] || fail "no admin listener"
cpu() { awk '{ print $14 + $15 }' "/proc/$CPID/stat"; }
hz=$(getconf CLK_TCK)
c0=$(cpu)
python3 "$flood" "${admin%:*}" "${admin#*:}" 600 6 > admin-flood.txt &
FPID=$!
sleep 2
status=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 --cacert tls/ca.pem \
  "https://127.0.0.1:$PORT/v1/status" || true)
wait "$FPID"
c1=$(cpu)
cat admin-flood.txt
log_bytes=$(wc -c < coordinator-admin.log)
accept_lines=$(grep -c 'accept() failed' coordinator-admin.log || true)
cpu_pct=$(( (c1 - c0) * 100 / hz / 8 ))
echo "admin flood: public /v1/status answered $status; coordinator CPU ${cpu_pct} % of a core" \
  "over 8 s; log $log_bytes bytes, $accept_lines lines about accept()"
[ "$status" = 200 ] || fail "the public port did not answer during the admin flood ($status)"
[ "$accept_lines" -le 5 ] || fail "$accept_lines log lines about accept() under the admin flood"
[ "$log_bytes" -lt 20000 ] || fail "the log grew $log_bytes bytes under the admin flood"
[ "$cpu_pct" -lt 10 ] || fail "the coordinator used $cpu_pct % of a core under the admin flood"
kill -0 "$CPID" 2>/dev/null || fail "the coordinator died"
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
