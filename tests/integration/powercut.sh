#!/usr/bin/env bash
# Power cuts and disk faults: four clients upload sketch updates as fast
# as they can to an async run while the coordinator runs with a layer
# (tests/faults/powercut.c, loaded with LD_PRELOAD) that follows every write to the
# database, its WAL and the update segments. At a random moment the layer
# cuts the power: each file is put back as the disk would hold it, with
# every write not yet synced dropped (or, every other cut, a random half
# of them kept), segments and directories whose entries were never synced
# gone, and the process ends at once. Every third run also fails about one
# database write or sync in fifty and one segment write or sync in ten
# with ENOSPC or EIO, and a failed segment sync
# loses what it was to sync, as on Linux.
#
# After every cut the database must pass PRAGMA integrity_check and hold
# every upload answered 202, every version holding exactly the updates it
# counts. At the end the coordinator runs without the layer until the
# versions the stored updates are due for are made: every acknowledged
# update is merged exactly once, and no stored body is found unreadable.
# POWERCUT_CUTS sets the number of cuts (20; the long mode runs 200).
source "$(dirname "$0")/lib.sh"
INGEST=${INGEST:?}
LAYER=${POWERCUT_LIB:?}
CUTS=${POWERCUT_CUTS:-20}
PER=8
it_storm_setup itcut "$PER" 4
it_stop_coordinator

# serve_cut CUT_MS SKIP KEEP FAULT_RATE: the coordinator on $PORT under the
# layer, in the background (CPID). Segments see a write or two and a sync
# per upload against the database's dozens, so they fail five times as
# often, and the cut comes a few writes after the first segment fault,
# while what that fault put at risk still waits for its merge.
serve_cut() {
  # shellcheck disable=SC2086 # the options are words on purpose
  LD_PRELOAD="$LAYER" VOLLEY_POWERCUT_MS="$1" VOLLEY_POWERCUT_SKIP="$2" \
    VOLLEY_POWERCUT_KEEP="$3" VOLLEY_FAULT_RATE="$4" VOLLEY_POWERCUT_AFTER_FAULT="$4" \
    VOLLEY_FAULT_SEGMENT_RATE="$(awk -v r="$4" 'BEGIN { print 5 * r }')" VOLLEY_FAULT_AFTER_MS=150 \
    VOLLEY_POWERCUT_SEED="$RANDOM$RANDOM" \
    "$COORD" serve --db run.db --cert tls/server.pem --key tls/server.key \
    --listen "127.0.0.1:$PORT" $IT_SERVE_ARGS 2>> coordinator.log &
  CPID=$!
}

serve_cut 400 0 0 0
it_storm_clients 4

faulty=0
for k in $(seq 1 "$CUTS"); do
  rc=0
  # A cut comes at the first write or sync after its moment; the upload
  # storm makes one within milliseconds. Give up on it after 60 s.
  for _ in $(seq 1 600); do
    kill -0 "$CPID" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$CPID" 2>/dev/null && fail "cut $k: no write came for the layer to cut at"
  wait "$CPID" || rc=$?
  CPID=""
  [ "$rc" = 86 ] || fail "cut $k: the coordinator exited with $rc before its power cut"
  it_check_acked "after cut $k"
  echo "powercut: cut $k: $(wc -l < acked.txt) uploads acknowledged so far, all stored;" \
       "$(q 'SELECT current_version FROM run') versions"
  # 0.3 to 1.5 s into the next run, a random 0-39 writes and syncs later.
  ms=$(awk -v r="$RANDOM" 'BEGIN { printf "%d", 300 + 1200 * r / 32767 }')
  keep=0
  [ $((k % 2)) = 0 ] && keep=0.5
  rate=0
  if [ $((k % 3)) = 0 ]; then rate=0.02; faulty=$((faulty + 1)); fi
  serve_cut "$ms" $((RANDOM % 40)) "$keep" "$rate"
done
# The last run under the layer is cut too; then a clean one drains.
for _ in $(seq 1 600); do
  kill -0 "$CPID" 2>/dev/null || break
  sleep 0.1
done
rc=0
wait "$CPID" || rc=$?
CPID=""
[ "$rc" = 86 ] || fail "the last run exited with $rc before its power cut"
it_check_acked "after the last cut"
for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${PIDS[@]}"; do wait "$p" || fail "a client exited with an error"; done
PIDS=()
mv coordinator.log coordinator-cuts.log
touch coordinator.log
it_serve_again
sleep 3
it_stop_coordinator
it_check_acked "at the end"
unmerged=$(q 'SELECT count(*) FROM updates WHERE merged_version IS NULL')
[ "$unmerged" -lt "$PER" ] || fail "$unmerged updates are left unmerged (a version needs $PER)"
acked=$(wc -l < acked.txt)
[ "$acked" -ge $((CUTS * 3)) ] || fail "too few uploads were acknowledged ($acked)"
# A stored body that could not be read would be set aside at its merge.
! grep -h 'is left out of version' coordinator*.log || fail "a stored update's body was lost"
cuts=$(grep -c '^powercut: cut at' coordinator-cuts.log)
[ "$cuts" = $((CUTS + 1)) ] || fail "$cuts cuts logged, $((CUTS + 1)) expected"
sum() { grep '^powercut: cut at' coordinator-cuts.log | sed -n "s/.* \([0-9]*\) $1.*/\1/p" |
        awk '{ s += $1 } END { print s + 0 }'; }
faults=$(grep -c '^diskfault:' coordinator-cuts.log || true)
echo "powercut: $cuts power cuts ($faulty runs with disk faults, $faults faults injected):" \
     "$(sum 'unsynced writes dropped') unsynced writes dropped, $(sum kept) kept," \
     "$(sum 'unsynced directory entries') unsynced directory entries gone;" \
     "$acked acknowledged uploads all stored, $(q 'SELECT current_version FROM run') versions," \
     "$unmerged left for the next one"
echo "1 passed, 0 failed"
