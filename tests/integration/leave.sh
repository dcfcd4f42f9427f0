#!/usr/bin/env bash
# A peer stopped mid-task ends its lease. In a sync run of one update per
# version and 10-minute leases, peer 1 trains slowly and is sent SIGTERM
# while it holds version 1's only lease: it must exit 0 within a few
# seconds, saying it released the task, and the coordinator must have
# freed it (state expired, nothing stored). Peer 2, started after, must
# then finish the run; had the lease been kept, version 1 would wait
# out its deadline and peer 2's timeout of 60 s would fail the test.
source "$(dirname "$0")/lib.sh"

IT_LEASE_S=600 it_setup itleave 3 1
it_start_coordinator
it_peer 1
it_peer 2

"$PEER" run --dir peer1 --threads 1 --wait 5 --retries 20 --step-delay 1000 2> peer1.log &
P1=$!
PIDS+=("$P1")
it_wait_leased 1 600
task=$(q "SELECT id FROM tasks WHERE state = 'leased' AND peer_id = 1")
# Into its training (a step takes a second): the model and data are in.
sleep 2
t0=$SECONDS
kill -TERM "$P1"
wait "$P1" || fail "peer 1 stopped with status $?"
PIDS=()
[ $((SECONDS - t0)) -le 10 ] || fail "peer 1 took $((SECONDS - t0)) s to stop"
grep -q "task $task released: its data go to another peer" peer1.log \
  || { tail -5 peer1.log; fail "peer 1 did not say it released task $task"; }
grep -q "peer 1 released task $task" coordinator.log || fail "the coordinator did not release task $task"
[ "$(q "SELECT state FROM tasks WHERE id = $task")" = expired ] \
  || fail "task $task is $(q "SELECT state FROM tasks WHERE id = $task"), not freed"
[ "$(q 'SELECT count(*) FROM updates')" = 0 ] || fail "something was stored for the stopped task"

timeout 60 "$PEER" run --dir peer2 --threads 1 --wait 5 --retries 20 2> peer2.log \
  || { tail -5 peer2.log; fail "peer 2 did not finish the run in 60 s"; }
it_stop_coordinator
it_check_run 3 1
echo "leave: peer 1 stopped mid-task in $((SECONDS - t0)) s and released task $task; peer 2 finished the run"
echo "1 passed, 0 failed"
