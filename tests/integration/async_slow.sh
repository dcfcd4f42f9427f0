#!/usr/bin/env bash
# Async with a slow volunteer, configured as a user would: mode "async" and
# nothing about the outer step, so the coordinator's defaults apply
# (delayed Nesterov, dynamic local steps), with updates_per_version at half
# the peers as they expect. Four real peers, one of them four times slower
# per step. The run must learn: end at least 1 nat below
# the initial validation loss (a model that drifts up or diverges fails).
# Along the way: every version merges exactly updates_per_version
# updates; the slow peer is given fewer local steps than the fast ones;
# staleness stays bounded (the lease waits while a version's worth of
# updates is being merged) and is stored as the merge counted it.
source "$(dirname "$0")/lib.sh"
VERSIONS=${ASYNC_SLOW_VERSIONS:-24}
PER=2
export IT_TRAIN='{"steps": 16, "batch": 4, "lr": 0.003}'
IT_MODE=async IT_OUTER=${ASYNC_SLOW_OUTER:-default} it_setup itasyncslow "$VERSIONS" "$PER"
[ -n "${ASYNC_SLOW_OUTER:-}" ] || grep -q '"delay":2' <(q 'SELECT config FROM run') \
  || fail "async default without outer.delay 2"
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
slow_steps=$(q 'SELECT avg(local_steps) FROM updates WHERE peer_id = 4')
fast_steps=$(q 'SELECT avg(local_steps) FROM updates WHERE peer_id <> 4')
awk -v s="$slow_steps" -v f="$fast_steps" 'BEGIN { exit !(s < 0.6 * f) }' \
  || fail "the slow peer averaged $slow_steps local steps against $fast_steps (dynamic steps)"
echo "async_slow: validation loss $first -> $last over $VERSIONS versions;" \
     "local steps slow $slow_steps, fast $fast_steps; max staleness $maxstale"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b <= a - 1.0) }' \
  || fail "the async run did not learn: $first -> $last"
echo "1 passed, 0 failed"
