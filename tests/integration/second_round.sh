#!/usr/bin/env bash
# A sketch run with the Sketched-SGD second round, end to end. Round
# requests before the round opens, while it is open and after it closed
# are refused with their codes and change nothing stored; a peer that
# stays silent is left out of the round's exact mean once the round's
# deadline passes; answers are taken once; real peers answer every round
# of the rest of the run, and the run finishes and learns.
source "$(dirname "$0")/lib.sh"
ATTACK=${ATTACK:?}
VERSIONS=5
it_setup itround $VERSIONS 2 '"compression": {"kind": "sketch", "ratio": 20, "rows": 3, "seed": 99, "second_round": 2, "round_s": 3},'
it_start_coordinator
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
mkdir -p atk
"$ATTACK" prepare "$URL" tls/ca.pem atk "$token" "vlt_$(printf '%064d' 0)" > prepare.log 2>&1 \
  || { cat prepare.log; fail "prepare"; }

# unchanged STAGE: runs that attack stage and checks nothing stored moved.
unchanged() {
  local before after
  before=$(it_snapshot)
  "$ATTACK" values "$URL" tls/ca.pem atk "$1" | tee -a values.log
  [ "${PIPESTATUS[0]}" = 0 ] || fail "a $1 round request got the wrong answer"
  after=$(it_snapshot)
  [ "$before" = "$after" ] || { diff <(echo "$before") <(echo "$after") >&2; fail "$1 round requests changed the database"; }
}
# wait_for SQL VALUE: polls until the query gives VALUE (30 s at most).
wait_for() {
  for _ in $(seq 1 300); do
    [ "$(q "$1")" = "$2" ] && return 0
    sleep 0.1
  done
  fail "waited for '$1' to be $2 (it is $(q "$1"))"
}
one_task() {
  "$PEER" run --dir "peer$1" --wait 5 --retries 3 --max-tasks 1 > "peer$1-$2.out" 2>> "peer$1.log" \
    || fail "peer $1 exited with an error"
}
for i in 1 2; do it_peer $i; done

# Version 0: the attacker's lease and peer 1's. Nothing is open until both
# updates are in.
unchanged early
"$ATTACK" finish "$URL" tls/ca.pem atk | tee finish.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "a valid sketch update was refused"
one_task 1 a
# Peer 1 answered its round before it exited; the attacker has not.
[ "$(q 'SELECT count(*) FROM round_values WHERE version = 0')" = 1 ] || fail "peer 1 did not answer the round"
unchanged open
# The attacker stays silent: the deadline (3 s) makes version 1 from peer
# 1's exact values alone.
wait_for 'SELECT count(*) FROM versions' 2
grep -q "version 1: second round used 1 reported and 1 silent" coordinator.log \
  || fail "the silent update was not left out"
unchanged closed

# Version 1: both answer, the attacker twice (the second is a duplicate).
"$ATTACK" lease "$URL" tls/ca.pem atk > lease.log || { cat lease.log; fail "lease"; }
"$ATTACK" finish "$URL" tls/ca.pem atk >> finish.log || fail "a valid sketch update was refused"
one_task 1 b &
P1=$!
wait_for "SELECT count(*) FROM rounds WHERE version = 1" 1
"$ATTACK" values "$URL" tls/ca.pem atk answer | tee -a values.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "valid round values were refused"
wait "$P1" || fail "peer 1 failed"
wait_for 'SELECT count(*) FROM versions' 3
grep -q "version 2: second round used 2 reported and 0 silent" coordinator.log \
  || fail "version 2 did not use both answers"

# The rest of the run: two real peers answer every round.
for i in 1 2; do
  "$PEER" run --dir "peer$i" --wait 5 --retries 3 > "peer$i.out" 2>> "peer$i.log" &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p" || fail "a peer exited with an error"; done
PIDS=()
[ "$(q 'SELECT count(*) FROM versions')" = $((VERSIONS + 1)) ] || fail "the run did not finish"
for v in 3 4 5; do
  grep -q "version $v: second round used 2 reported and 0 silent" coordinator.log \
    || fail "version $v did not use both peers' values"
done
[ "$(grep -c 'reported [0-9]* exact values' peer1.log peer2.log | awk -F: '{s += $2} END {print s}')" -ge 7 ] \
  || fail "peers did not report their values"
[ "$(q 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
[ "$(q 'SELECT count(*) FROM updates WHERE norm IS NULL')" = 0 ] || fail "an update was stored without its norm"
v0=$(q 'SELECT val_loss FROM versions WHERE version = 0')
vN=$(q "SELECT val_loss FROM versions WHERE version = $VERSIONS")
awk -v a="$v0" -v b="$vN" 'BEGIN { exit !(b < a) }' || fail "validation loss did not fall ($v0 -> $vN)"
it_stop_coordinator
echo "second round: $VERSIONS versions, val_loss $v0 -> $vN"
