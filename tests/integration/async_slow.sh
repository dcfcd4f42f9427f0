#!/usr/bin/env bash
# Async with a slow volunteer, configured as a user would: mode "async" and
# nothing about the outer step or lease_wait, so the coordinator's
# defaults apply (peers wait for the version that merges their own last
# update, the synchronous outer step, dynamic local steps), with
# updates_per_version at the number of peers as lease_wait expects. Four
# real peers, one of them four times slower per step. The run must learn:
# end at least 1 nat below the initial validation loss (a model that
# drifts up or diverges fails). Along the way: every version merges
# exactly updates_per_version updates; the slow peer is given fewer local
# steps than the fast ones; most updates arrive fresh (based on the
# version before the one that merges them: the wait), staleness stays
# bounded and is stored as the merge counted it.
source "$(dirname "$0")/lib.sh"
VERSIONS=${ASYNC_SLOW_VERSIONS:-24}
PER=4
export IT_TRAIN='{"steps": 16, "batch": 4, "lr": 0.003}'
IT_MODE=async IT_OUTER=${ASYNC_SLOW_OUTER:-default} it_setup itasyncslow "$VERSIONS" "$PER"
config=$(q 'SELECT config FROM run')
if [ -z "${ASYNC_SLOW_OUTER:-}" ]; then
  grep -q '"lease_wait":1' <<< "$config" || fail "async default without lease_wait 1"
  grep -q '"momentum":0.9[0-9]*,"delay":1' <<< "$config" \
    || fail "async default with lease_wait but not momentum 0.9 every version"
fi
it_start_coordinator
for i in 1 2 3 4; do it_peer "$i"; done
for i in 1 2 3 4; do
  slow=1
  [ "$i" = 4 ] && slow=4
  "$PEER" run --dir "peer$i" --threads 1 --wait 5 --retries 20 --step-delay 20 \
    --slowdown "$slow" 2> "peer$i.log" &
  PIDS+=($!)
done
it_wait_finished 3000 "the async run did not finish"
it_stop_peers
it_stop_coordinator

[ "$(q 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
first=$(q 'SELECT val_loss FROM versions WHERE version = 0')
last=$(q "SELECT val_loss FROM versions WHERE version = $VERSIONS")
[ "$(q "SELECT count(*) FROM versions WHERE version > 0 AND num_updates <> $PER")" = 0 ] \
  || fail "a version merged other than $PER updates: $(q 'SELECT group_concat(num_updates) FROM versions')"
[ "$(q 'SELECT count(*) FROM updates WHERE merged_version IS NOT NULL AND
         staleness <> merged_version - 1 - base_version')" = 0 ] \
  || fail "a merged update's staleness is not what its merge counted"
maxstale=$(q 'SELECT max(staleness) FROM updates WHERE merged_version IS NOT NULL')
[ "$maxstale" -le 6 ] || fail "staleness reached $maxstale (the lease rule should bound it)"
fresh=$(q 'SELECT round(100.0 * avg(staleness = 0)) FROM updates WHERE merged_version IS NOT NULL')
# Without the wait, the first peers of each version to upload leased the
# old version at once and most updates landed a version stale.
awk -v f="$fresh" 'BEGIN { exit !(f >= 60) }' || fail "only $fresh % of the updates arrived fresh"
slow_steps=$(q 'SELECT avg(local_steps) FROM updates WHERE peer_id = 4')
fast_steps=$(q 'SELECT avg(local_steps) FROM updates WHERE peer_id <> 4')
awk -v s="$slow_steps" -v f="$fast_steps" 'BEGIN { exit !(s < 0.6 * f) }' \
  || fail "the slow peer averaged $slow_steps local steps against $fast_steps (dynamic steps)"
echo "async_slow: validation loss $first -> $last over $VERSIONS versions;" \
     "local steps slow $slow_steps, fast $fast_steps; $fresh % fresh, max staleness $maxstale"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b <= a - 1.0) }' \
  || fail "the async run did not learn: $first -> $last"

# ---- Misconfigured: 2 updates a version for 4 peers. Two peers' updates
# make each version, so the other two's land a version stale whatever the
# wait; momentum every version on them is what diverged. Those versions
# must take plain steps, say so, and the run must still learn.
mkdir first
mv run.db ./*.log peer1 peer2 peer3 peer4 first/
rm -f run.db-wal run.db-shm
V2=12
IT_MODE=async IT_OUTER=default it_setup itasyncfew "$V2" 2
it_start_coordinator
PIDS=()
for i in 1 2 3 4; do
  it_peer "$i"
  "$PEER" run --dir "peer$i" --threads 1 --wait 5 --retries 20 --step-delay 20 \
    2> "peer$i.log" &
  PIDS+=($!)
done
it_wait_finished 3000 "the misconfigured async run did not finish"
it_stop_peers
it_stop_coordinator
plain=$(grep -c 'took its outer step without momentum' coordinator.log || true)
[ "$plain" -ge 1 ] || fail "stale versions of the misconfigured run took momentum steps"
stale_v=$(q 'SELECT count(DISTINCT merged_version) FROM updates WHERE staleness > 0')
first2=$(q 'SELECT val_loss FROM versions WHERE version = 0')
last2=$(q "SELECT val_loss FROM versions WHERE version = $V2")
echo "async_slow: 2 updates a version for 4 peers: $stale_v of $V2 versions had stale updates," \
     "$plain warning(s); validation loss $first2 -> $last2"
awk -v a="$first2" -v b="$last2" 'BEGIN { exit !(b <= a - 0.5) }' \
  || fail "the misconfigured async run did not learn: $first2 -> $last2"
echo "1 passed, 0 failed"
