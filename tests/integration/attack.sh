#!/usr/bin/env bash
# A client sends every kind of bad request; each must get its status and
# JSON error code, and the database must be exactly as it was before.
source "$(dirname "$0")/lib.sh"
ATTACK=${ATTACK:?}
it_setup itattack 3 2 '"robust": {"max_norm": 100, "on_excess": "refuse"},'
it_start_coordinator
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
badtoken="vlt_$(printf '%064d' 0)"
mkdir -p atk
"$ATTACK" prepare "$URL" tls/ca.pem atk "$token" "$badtoken" > prepare.log 2>&1 \
  || { cat prepare.log; fail "prepare"; }

before=$(it_snapshot)
"$ATTACK" run "$URL" tls/ca.pem atk "$badtoken" | tee attack.log
rc=${PIPESTATUS[0]}
after=$(it_snapshot)
kill -0 "$CPID" 2>/dev/null || fail "the coordinator died under attack"
it_stop_coordinator
[ "$rc" = 0 ] || fail "some bad requests got the wrong answer"
[ "$before" = "$after" ] || { diff <(echo "$before") <(echo "$after") >&2; fail "bad requests changed the database"; }
echo "attack: database unchanged"
