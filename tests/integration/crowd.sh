#!/usr/bin/env bash
# Crowds with joined keys of their own.
#
# 1. Behind one NAT: 300 peers of 127.0.0.1 each hold a long-poll for a
#    task (a sync run whose only lease is out), and 10 newcomers of the
#    same address finish their TLS handshakes and send their signed heads
#    0.6 s later, as over a WAN. Connections with a request in progress
#    are not counted by the per-address cap (64), so every newcomer is
#    answered.
# 2. Four keys announce bodies as large as the run allows (64 MiB, the
#    whole --body-budget of 256 MiB together), send 1 MiB each and go
#    quiet. An honest 2 MiB upload beside them is read and judged (a body
#    holds the budget by what has arrived of it), and the quiet bodies are
#    cut off once a 10 s window passes below --min-body-rate, not after
#    their length at that rate (68 min). The coordinator's resident memory
#    and the honest upload's time are printed.
#    The first peer's real update is accepted (202) meanwhile.
# 3. A peer revoked while its upload's body arrives gets 403 revoked.
source "$(dirname "$0")/lib.sh"
ATTACK=${ATTACK:?}
it_setup itcrowd 2 1
# Bodies as large as 64 MiB.
sed -i 's/"max_body_bytes": 4194304/"max_body_bytes": 67108864/' run.json
rm -f run.db
"$COORD" init --db run.db --config run.json 2> init.log || fail "init"
IT_SERVE_ARGS="--admin-listen off --body-budget 256" it_start_coordinator
mkdir -p crowd

# A first peer takes the version's only lease and keeps it.
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
"$ATTACK" prepare "$URL" tls/ca.pem crowd "$token" "vlt_$(printf '%064d' 0)" > prepare.log 2>&1 \
  || { cat prepare.log; fail "prepare"; }

many=$("$COORD" token create --db run.db --uses 320 --ttl 1h)
"$ATTACK" nat "$URL" tls/ca.pem crowd "$many" 300 10 > nat.log 2>&1 || { cat nat.log; fail "nat"; }
cat nat.log
kill -0 "$CPID" 2>/dev/null || fail "the coordinator died"

keys=$("$COORD" token create --db run.db --uses 5 --ttl 1h)
"$ATTACK" bodies "$URL" tls/ca.pem crowd "$keys" 4 67108864 1048576 > bodies.log 2>&1 &
APID=$!
PIDS+=("$APID")
sleep 3
rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$CPID/status")
echo "coordinator resident memory with four bodies announced: $((rss / 1024)) MiB"
# The first peer's real update of its lease, while the four bodies hold.
t0=$(date +%s.%N)
"$ATTACK" finish "$URL" tls/ca.pem crowd > finish.log 2>&1 || { cat finish.log; fail "finish"; }
t1=$(date +%s.%N)
echo "an honest update accepted during the attack in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }') s"
rc=0
wait "$APID" || rc=$?
cat bodies.log
[ "$rc" = 0 ] || fail "bodies"
kill -0 "$CPID" 2>/dev/null || fail "the coordinator died"
grep -q 'request body arrived slower' coordinator.log || fail "no quiet body was cut off"

# 3. A peer revoked by the operator while its upload's body arrives is
#    refused when the handler runs (the head was checked before).
one=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
"$ATTACK" revoke-mid-body "$URL" tls/ca.pem crowd "$one" \
  "'$COORD' peer revoke --db run.db --peer" > revoke-body.log 2>&1 \
  || { cat revoke-body.log; fail "revoke-mid-body"; }
cat revoke-body.log
it_stop_coordinator
echo "1 passed, 0 failed"
