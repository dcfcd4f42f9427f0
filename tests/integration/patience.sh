#!/usr/bin/env bash
# A peer waits out a coordinator that is not there yet. `join` and then
# `run` are started against a port nobody listens on; the coordinator
# comes up 20 s later on that port. Each command says once that the
# coordinator is unreachable and how it retries, once that it reconnected
# (and after how long), and then does its work: the peer joins, trains and
# the run finishes. While `run` waits, its --dir is locked: join, keygen,
# rotate-key and a second run there exit 1 naming it; status still
# answers. With --give-up-after 3s the peer stops with exit status 4
# within a few seconds instead.
#
# VOLLEY_PEER_BACKOFF_CAP_S=2 lowers the backoff's cap from 5 min to 2 s, so
# that the peer notices the coordinator within seconds of its start; the
# line it prints names the cap it uses.
source "$(dirname "$0")/lib.sh"
export VOLLEY_PEER_BACKOFF_CAP_S=2
WAIT_S=20
it_setup patience 2 1

# A free port: bound, read and let go; nothing listens there until the
# coordinator starts.
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="https://127.0.0.1:$PORT"
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h) || fail "token create"
IT_TOKENS+=("$token")
"$PEER" keygen --dir peer1 > /dev/null || fail "keygen"

# ---- 1. a deadline -------------------------------------------------------------
t0=$(date +%s)
rc=0
"$PEER" join --dir peer1 --coordinator "$URL" --token "$token" --cacert tls/ca.pem \
  --give-up-after 3s > /dev/null 2> giveup.log || rc=$?
took=$(($(date +%s) - t0))
[ "$rc" = 4 ] || fail "join --give-up-after 3s exited with $rc, not 4"
[ "$took" -le 8 ] || fail "join --give-up-after 3s took $took s"
grep -q "coordinator $URL unreachable (connection refused); trying again with backoff up to 2 s; giving up after 3 s" giveup.log \
  || fail "the deadline is not said: $(cat giveup.log)"
tail -n 1 giveup.log | grep -q "gave up after [0-9]* s of trying to reach the coordinator at $URL (--give-up-after" \
  || fail "the last line does not say the peer gave up: $(tail -n 1 giveup.log)"
[ ! -e peer1/peer.json ] || fail "a join that gave up wrote peer.json"
rc=0
"$PEER" join --dir peer1 --coordinator "$URL" --token "$token" --give-up-after 3x 2> bad.log || rc=$?
[ "$rc" = 2 ] || fail "--give-up-after 3x exited with $rc, not 2"
grep -q "give-up-after" bad.log || fail "a bad --give-up-after is not named: $(cat bad.log)"

# The lines said once, whatever the number of tries.
check_patience() {
  local log=$1 n
  n=$(grep -c "coordinator $URL unreachable (connection refused); trying again with backoff up to 2 s; --give-up-after to stop$" "$log" || true)
  [ "$n" = 1 ] || fail "$log: 'unreachable' said $n times, not once: $(cat "$log")"
  n=$(grep -c "reached the coordinator at $URL again; reconnected after [0-9]" "$log" || true)
  [ "$n" = 1 ] || fail "$log: 'reconnected' said $n times, not once"
  grep -q "reconnected after 2[0-9] s$" "$log" \
    || fail "$log: the time out of reach is not about $WAIT_S s: $(grep reconnected "$log")"
  ! grep -q 'retry [0-9]' "$log" || fail "$log: each retry was logged"
}

# ---- 2. join before the coordinator exists --------------------------------------
"$PEER" join --dir peer1 --coordinator "$URL" --token "$token" --cacert tls/ca.pem \
  --name it-peer-1 > join.out 2> join.log &
PIDS+=($!)
sleep "$WAIT_S"
kill -0 "${PIDS[0]}" 2>/dev/null || fail "join did not wait for the coordinator: $(cat join.log)"
: > coordinator.log
it_serve_again
wait "${PIDS[0]}" || fail "join failed once the coordinator was there"
PIDS=()
grep -qx '[0-9][0-9]*' join.out || fail "join printed no peer id"
check_patience join.log

# ---- 3. run before the coordinator is back ---------------------------------------
it_stop_coordinator
"$PEER" run --dir peer1 --threads 1 --wait 5 2> run.log &
PIDS+=($!)
sleep 2
# While run waits, its directory is its own: another writer is refused,
# naming it, and changes nothing; status only reads and answers.
key_before=$(sha256sum < peer1/peer.key)
for cmd in "join --coordinator $URL --token $token" "keygen --force" "rotate-key" "run"; do
  rc=0
  # shellcheck disable=SC2086 # the command's words
  "$PEER" $cmd --dir peer1 > /dev/null 2> locked.log || rc=$?
  [ "$rc" = 1 ] || fail "'$cmd' beside a running run exited with $rc, not 1"
  [ "$(wc -l < locked.log)" = 1 ] || fail "'$cmd' said more than one line: $(cat locked.log)"
  grep -q "^volley-peer: peer1 is in use by process ${PIDS[0]} (volley-peer run); stop it first" locked.log \
    || fail "'$cmd' does not name the run holding peer1: $(cat locked.log)"
done
[ "$(sha256sum < peer1/peer.key)" = "$key_before" ] || fail "a refused keygen changed the key"
"$PEER" status --dir peer1 > status.out 2> status.log || fail "status beside run failed"
grep -q "^progress:    not known: no task done yet (what this directory knows; the coordinator did not answer (" status.out \
  || fail "status does not say the coordinator was out of reach: $(cat status.out)"
sleep $((WAIT_S - 2))
kill -0 "${PIDS[0]}" 2>/dev/null || fail "run did not wait for the coordinator: $(tail -n 3 run.log)"
it_serve_again
wait "${PIDS[0]}" || fail "run failed once the coordinator was back: $(tail -n 3 run.log)"
PIDS=()
it_wait_finished 100 "the run did not finish"
it_check_run 2 1
check_patience run.log
"$PEER" status --dir peer1 > status.out 2> status.log || fail "status after the run failed"
grep -q "^progress:    version 2 of 2 (finished); validation loss [0-9.]* at version 2, [0-9.]* at the start (from the coordinator)$" status.out \
  || fail "status does not show the run's progress: $(cat status.out)"
it_stop_coordinator
it_check_no_secrets
echo "1 passed, 0 failed"
