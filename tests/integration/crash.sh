#!/usr/bin/env bash
# Crash: three clients upload sketch updates as fast as they can to an async
# run while the coordinator is killed with SIGKILL at random moments, 20
# times, and started again on the same port. After every kill the database
# must pass PRAGMA integrity_check, hold every upload that was answered 202
# (the clients log each acknowledgement as it arrives), and have merged
# each stored update at most once, every version holding exactly the
# updates it says. At the end, with the coordinator stopped cleanly, no
# update that a version was due for is left unmerged.
source "$(dirname "$0")/lib.sh"
INGEST=${INGEST:?}
KILLS=${CRASH_KILLS:-20}
PER=8
it_storm_setup itcrash "$PER" 3
it_storm_clients 3

total_acked=0
for k in $(seq 1 "$KILLS"); do
  # Somewhere in the storm: 0.3 to 1.5 s after the coordinator started.
  sleep "$(awk -v r="$RANDOM" 'BEGIN { printf "%.2f", 0.3 + 1.2 * r / 32767 }')"
  kill -9 "$CPID"
  wait "$CPID" 2>/dev/null || true
  CPID=""
  it_check_acked "after kill $k"
  total_acked=$(wc -l < acked.txt)
  echo "crash: kill $k: $total_acked uploads acknowledged so far, all stored;" \
       "$(q 'SELECT current_version FROM run') versions"
  "$COORD" serve --db run.db --cert tls/server.pem --key tls/server.key \
    --listen "127.0.0.1:$PORT" $IT_SERVE_ARGS 2>> coordinator.log &
  CPID=$!
  for _ in $(seq 1 100); do
    curl -s --cacert tls/ca.pem -o /dev/null "$URL/v1/status" && break
    kill -0 "$CPID" 2>/dev/null || fail "the coordinator did not restart after kill $k"
    sleep 0.05
  done
done
sleep 2
for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${PIDS[@]}"; do wait "$p" || fail "a client exited with an error"; done
PIDS=()
# Let the last merge that the stored updates are due for land.
sleep 1
it_stop_coordinator
it_check_acked "at the end"
total_acked=$(wc -l < acked.txt)
unmerged=$(q 'SELECT count(*) FROM updates WHERE merged_version IS NULL')
[ "$unmerged" -lt "$PER" ] || fail "$unmerged updates are left unmerged (a version needs $PER)"
[ "$total_acked" -ge $((KILLS * 5)) ] || fail "too few uploads were acknowledged ($total_acked)"
restarts=$(grep -c 'listening on' coordinator.log)
# The clients ask for their next task with each upload (?next=1), so most
# leases were written in the same transactions as the updates.
nexts=0
for f in client*.txt; do
  nexts=$((nexts + $(tr ' ' '\n' < "$f" | sed -n 's/^next_tasks=//p')))
done
[ "$nexts" -gt 0 ] || fail "no upload was answered with the next task"
echo "crash: $KILLS kills, $restarts starts, $total_acked acknowledged uploads all stored" \
     "($nexts answered with the next task)," \
     "$(q 'SELECT current_version FROM run') versions, $unmerged left for the next one"
echo "1 passed, 0 failed"
