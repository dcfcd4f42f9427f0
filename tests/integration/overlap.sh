#!/usr/bin/env bash
# An async peer on a slow uplink trains its next task while its last
# update uploads. Two peers with the same upload cap (--max-upload-rate,
# so that an update takes longer to send than a task to train) and the
# same pace: peer 1 overlaps (--overlap), peer 2 waits for each upload
# (the default). The run must finish and learn, every update of both
# must be stored once, peer 1 must have started tasks with an upload in
# flight, and its
# share of time spent computing must clearly beat peer 2's.
source "$(dirname "$0")/lib.sh"
VERSIONS=${OVERLAP_VERSIONS:-6}
# Fixed local steps: dynamic steps would shorten both peers' tasks to
# the pace their uplinks set, where there is nothing left to overlap.
export IT_TRAIN='{"steps": 6, "batch": 4, "lr": 0.003, "dynamic_steps": false}'
# Three updates a version: a lease is held back while the version it
# would miss is about to complete (the upload in flight counts), which
# with one update a version would be every time.
IT_MODE=async IT_OUTER=default it_setup itoverlap "$VERSIONS" 3
it_start_coordinator
for i in 1 2; do it_peer "$i"; done
# About 88 KB an update at 30 kB/s: 3 s of upload against about 3 s of
# training per task (6 steps of 500 ms), where overlapping gains most.
VOLLEY_LOG=debug "$PEER" run --dir peer1 --threads 1 --wait 5 --retries 20 --step-delay 500 \
  --max-upload-rate 30k --overlap 2> peer1.log &
PIDS+=($!)
"$PEER" run --dir peer2 --threads 1 --wait 5 --retries 20 --step-delay 500 \
  --max-upload-rate 30k 2> peer2.log &
PIDS+=($!)
it_wait_finished 1800 "the run did not finish"
it_stop_peers
it_stop_coordinator

[ "$(q 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
[ "$(q 'SELECT count(*) FROM updates GROUP BY task_id HAVING count(*) > 1')" = "" ] \
  || fail "a task has two updates"
n1=$(q 'SELECT count(*) FROM updates WHERE peer_id = 1')
n2=$(q 'SELECT count(*) FROM updates WHERE peer_id = 2')
[ "$n1" -ge 2 ] && [ "$n2" -ge 2 ] || fail "peer updates stored: $n1 and $n2"
grep -q 'under way; the next task starts meanwhile' peer1.log \
  || fail "peer 1 never trained while uploading"
! grep -q 'under way' peer2.log || fail "peer 2 overlapped without --overlap"
share() { grep -o 'compute: .*(\([0-9.]*\) %)' "$1" | sed 's/.*(\([0-9.]*\) %)/\1/'; }
s1=$(share peer1.log) s2=$(share peer2.log)
[ -n "$s1" ] && [ -n "$s2" ] || fail "a peer logged no compute share"
# What each peer says of itself agrees with what was stored (the stop may
# land between a store and the peer hearing of it).
for i in 1 2; do
  "$PEER" status --dir "peer$i" > "status$i.txt" || fail "status of peer $i"
  said=$(sed -n 's/^updates: *\([0-9]*\) accepted.*/\1/p' "status$i.txt")
  stored=$(q "SELECT count(*) FROM updates WHERE peer_id = $i")
  [ -n "$said" ] && [ "$said" -le "$stored" ] && [ "$said" -ge $((stored - 1)) ] \
    || fail "peer $i says $said updates accepted, $stored stored: $(cat "status$i.txt")"
done
grep -q '^run: *itoverlap$' status1.txt || fail "status names no run: $(cat status1.txt)"
first=$(q 'SELECT val_loss FROM versions WHERE version = 0')
last=$(q "SELECT val_loss FROM versions WHERE version = $VERSIONS")
maxstale=$(q 'SELECT max(staleness) FROM updates WHERE merged_version IS NOT NULL')
echo "overlap: compute share $s1 % overlapping against $s2 % waiting ($n1 and $n2 updates);" \
     "validation loss $first -> $last; max staleness $maxstale"
awk -v a="$s1" -v b="$s2" 'BEGIN { exit !(a >= 1.3 * b) }' \
  || fail "overlapping did not raise the compute share: $s1 % against $s2 %"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' \
  || fail "the run did not learn: $first -> $last"
echo "1 passed, 0 failed"
