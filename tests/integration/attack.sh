#!/usr/bin/env bash
# A client sends every kind of bad request; each must get its status and
# JSON error code, and leave the database exactly as it was (checked after
# every case, and for the whole run). Before it: a second peer is revoked
# with the CLI while the server runs, tokens are revoked or left to expire,
# and a third peer rotates its key with volley-peer; the operator's token
# and peer lists are checked to hold no token. Then, on a coordinator
# restarted with tight limits: slow clients and rate limits.
source "$(dirname "$0")/lib.sh"
ATTACK=${ATTACK:?}
it_setup itattack 3 2 '"robust": {"max_norm": 100, "on_excess": "refuse"},'
it_start_coordinator
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
victim_token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
spare=$("$COORD" token create --db run.db --uses 5 --ttl 1h)
revoked=$("$COORD" token create --db run.db --uses 5 --ttl 1h)
expired=$("$COORD" token create --db run.db --uses 5 --ttl 1s)
badtoken="vlt_$(printf '%064d' 0)"
mkdir -p atk
"$ATTACK" prepare "$URL" tls/ca.pem atk "$token" "$badtoken" > prepare.log 2>&1 \
  || { cat prepare.log; fail "prepare"; }
"$ATTACK" setup "$URL" tls/ca.pem atk "$victim_token" > setup.log 2>&1 \
  || { cat setup.log; fail "setup"; }

# A peer that moves to a new key; the old one is kept to be refused.
"$PEER" keygen --dir rot > /dev/null || fail "keygen"
rot_token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
rot_id=$("$PEER" join --dir rot --coordinator "$URL" --token "$rot_token" --cacert tls/ca.pem \
  --name rotating 2> rot.log) || fail "join of the rotating peer"
echo "$rot_id" > atk/rot.id
cp rot/peer.key atk/rot-old.key
new_pk=$("$PEER" rotate-key --dir rot 2>> rot.log) || { cat rot.log; fail "rotate-key"; }
cp rot/peer.key atk/rot-new.key
[ ! -e rot/peer.key.next ] || fail "rotate-key left its pending key behind"
cmp -s atk/rot-old.key atk/rot-new.key && fail "rotate-key did not change the key file"
# As if the answer had been lost: the old key back in place and the new one
# pending. Running it again finds the change made and completes it.
cp atk/rot-old.key rot/peer.key
cp atk/rot-new.key rot/peer.key.next
again=$("$PEER" rotate-key --dir rot 2>> rot.log) || { cat rot.log; fail "rotate-key after a lost answer"; }
[ "$again" = "$new_pk" ] || fail "rotate-key after a lost answer moved to another key"
cmp -s rot/peer.key atk/rot-new.key || fail "rotate-key after a lost answer left the old key"

# The operator's side, all on the database file.
victim=$(cat atk/victim.id)
"$COORD" peer revoke --db run.db --peer "$victim" 2> revoke.log || fail "peer revoke"
"$COORD" peer revoke --db run.db --peer 999 2>> revoke.log && fail "revoking an unknown peer"
hash_of() { printf '%s' "$1" | b2sum -l 256 | cut -c1-12; }
revoked_id=$("$COORD" token list --db run.db | awk -v h="$(hash_of "$revoked")" '$2 == h { print $1 }')
[ -n "$revoked_id" ] || fail "the token list lacks a token"
"$COORD" token revoke --db run.db --token "$revoked_id" 2>> revoke.log || fail "token revoke"
"$COORD" token revoke --db run.db --token 999 2>> revoke.log && fail "revoking an unknown token"
sleep 1.1 # the 1 s token expires
"$COORD" token list --db run.db > tokens.txt
"$COORD" peer list --db run.db > peers.txt
cat tokens.txt peers.txt
state_of() { awk -v h="$(hash_of "$1")" '$2 == h { print $NF }' tokens.txt; }
[ "$(state_of "$token")" = used-up ] || fail "the attacker's token is not listed used-up"
[ "$(state_of "$revoked")" = revoked ] || fail "the revoked token is not listed revoked"
[ "$(state_of "$expired")" = expired ] || fail "the 1 s token is not listed expired"
[ "$(state_of "$spare")" = active ] || fail "the spare token is not listed active"
grep -q "^$victim .* revoked " peers.txt || fail "the peer list does not show the revocation"
grep -q "$new_pk" peers.txt || fail "the peer list does not show the rotated key"
# Only hashes are stored: no token appears in the database or the lists.
for t in "$token" "$victim_token" "$spare" "$revoked" "$expired" "$rot_token"; do
  grep -q -- "$t" tokens.txt peers.txt && fail "a token appears in a list"
  q .dump | grep -q -- "${t#vlt_}" && fail "a token is stored in the database"
done

# One change is made: an upload refused for what it holds ends its
# task's lease (the attacker's), which the snapshots set aside.
before=$(it_snapshot_held)
leased=$(q "SELECT count(*) FROM tasks WHERE state = 'leased'")
ATTACK_DB=run.db "$ATTACK" run "$URL" tls/ca.pem atk "$badtoken" "$spare" "$revoked" "$expired" \
  | tee attack.log
rc=${PIPESTATUS[0]}
after=$(it_snapshot_held)
kill -0 "$CPID" 2>/dev/null || fail "the coordinator died under attack"
it_stop_coordinator
[ "$rc" = 0 ] || fail "some bad requests got the wrong answer"
[ "$before" = "$after" ] || { diff <(echo "$before") <(echo "$after") >&2; fail "bad requests changed the database"; }
[ "$(q "SELECT count(*) FROM tasks WHERE state = 'leased'")" = $((leased - 1)) ] \
  || fail "the refused uploads did not end exactly one lease"

# Tight limits: 2 requests/s per peer (bursts of 4), 20/s per address
# (bursts of 30), 2 s for a head, bodies at 1000 bytes/s.
IT_SERVE_ARGS="--peer-rate 2:4 --addr-rate 20:30 --slow-timeout 2 --min-body-rate 1000" \
  it_start_coordinator
before=$(it_snapshot)
ATTACK_DB=run.db "$ATTACK" limits "$URL" tls/ca.pem atk | tee -a attack.log
rc=${PIPESTATUS[0]}
after=$(it_snapshot)
kill -0 "$CPID" 2>/dev/null || fail "the coordinator died under the limits attack"
it_stop_coordinator
[ "$rc" = 0 ] || fail "some limits did not hold"
[ "$before" = "$after" ] || { diff <(echo "$before") <(echo "$after") >&2; fail "the limits attack changed the database"; }
grep -q 'request head took longer' coordinator.log || fail "no log line for the slow head"
cases=$(grep -c '^| [0-9]' attack.log)
echo "attack: $cases cases, database unchanged"
