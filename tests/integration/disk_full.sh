#!/usr/bin/env bash
# A full disk under a running coordinator, with the fault layer of
# tests/faults loaded into it: for 3 s (from 1 s after its first
# connection) every database and segment write fails with ENOSPC while 2
# real peers train a synchronous run. The log must say so once, as a full
# disk with what is waiting, and once that it has room again, and never
# "no such savepoint" or a merge failing every 5 s; requests that needed
# room get 503 unavailable (a peer joining meanwhile retries and gets in);
# /metrics shows volley_disk_full 1 meanwhile and 0 after, with one
# report; the run then finishes with every version made of exactly its
# updates, each merged once.
source "$(dirname "$0")/lib.sh"
if [ -z "${POWERCUT_LIB:-}" ]; then
  echo "SKIP: the fault layer is not built here (sanitizer builds)"
  exit 77
fi
# About 20 ms a version here: the run is still going when the disk fills.
VERSIONS=300
it_setup itfull "$VERSIONS" 2
VOLLEY_LOG=debug IT_SERVE_ARGS="--admin-listen 127.0.0.1:0" \
  IT_WRAP="env LD_PRELOAD=$POWERCUT_LIB VOLLEY_DISK_FULL_MS=1000:3000" it_start_coordinator
admin=$(it_admin_url)
t0=$(date +%s.%N)
for i in 1 2; do it_peer "$i"; done
for i in 1 2; do
  "$PEER" run --dir "peer$i" --threads 1 --wait 10 2> "peer$i.log" &
  PIDS+=($!)
done
# A third peer joins while the disk is full: refused with 503 until there
# is room, then admitted by its own retries.
sleep "$(awk -v t0="$t0" -v now="$(date +%s.%N)" 'BEGIN { d = 2 - (now - t0); print (d > 0 ? d : 0) }')"
# The metrics say so while it lasts.
curl -s "$admin/metrics" > metrics-full.txt
grep -qx 'volley_disk_full 1' metrics-full.txt \
  || fail "/metrics does not show the full disk: $(grep volley_disk metrics-full.txt)"
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h) || fail "token create beside serve"
IT_TOKENS+=("$token")
"$PEER" keygen --dir peer3 > /dev/null
"$PEER" join --dir peer3 --coordinator "$URL" --token "$token" --cacert tls/ca.pem \
  --name it-peer-3 > /dev/null 2> join3.log || fail "the join during the full disk gave up: $(cat join3.log)"
for p in "${PIDS[@]}"; do
  wait "$p" || fail "a peer exited with an error"
done
PIDS=()
curl -s "$admin/metrics" > metrics-after.txt
grep -qx 'volley_disk_full 0' metrics-after.txt && grep -qx 'volley_disk_full_reports_total 1' \
  metrics-after.txt || fail "/metrics after the full disk: $(grep volley_disk metrics-after.txt)"
it_stop_coordinator

log=coordinator.log
n_full=$(grep -c 'disk full writing run.db: [0-9]* uploads acknowledged and waiting for a merge are safe' "$log" || true)
n_room=$(grep -c 'disk has room again for run.db' "$log" || true)
n_503=$(grep -c "unavailable: the coordinator's disk is full" "$log" || true)
n_enospc=$(sed -n 's/.*diskfault: the disk has room again; \([0-9]*\) writes failed.*/\1/p' "$log")
[ "$n_full" = 1 ] || fail "want one full-disk report, got $n_full: $(grep -i 'disk full' "$log" | head -n 3)"
[ "$n_room" = 1 ] || fail "want one room-again line, got $n_room"
[ "${n_enospc:-0}" -gt 0 ] || fail "the fault layer failed no write: $(grep diskfault "$log")"
[ "$n_503" -gt 0 ] || fail "no request was answered 503 unavailable while the disk was full"
! grep -q 'no such savepoint' "$log" || fail "a savepoint error: $(grep -m1 'no such savepoint' "$log")"
! grep -q 'failed, retrying in' "$log" || fail "a merge failed other than for room: $(grep -m1 'failed, retrying in' "$log")"
[ "$(q 'SELECT count(*) FROM peers')" = 3 ] || fail "the peer that joined during the full disk is not stored"
it_check_run "$VERSIONS" 2
it_check_no_secrets
echo "disk_full: $n_enospc writes failed with ENOSPC; $n_503 requests answered 503 unavailable;" \
  "one report: $(grep -o 'disk full writing run.db: [^;]*' "$log" | head -n 1);" \
  "$(grep -o 'disk has room again for run.db after [0-9]* s and [0-9]* merge retries' "$log");" \
  "$VERSIONS versions of 2 updates each, every update merged once"
echo "1 passed, 0 failed"
