#!/usr/bin/env bash
# A client volley did not write can talk to the coordinator: RFC 9421
# signatures and RFC 9530 digests made by the `http-message-signatures`
# Python package over `requests` (tests/interop/httpsig_client.py) join,
# lease a task, download the model and upload an update, and the
# coordinator refuses that client's replayed request and a body changed
# after signing. The package is installed, at a pinned version, into a
# virtual environment under the build directory (VOLLEY_PYENV).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/pyenv.sh"
it_pyenv "http-message-signatures==3.0.0" "http-sf==1.4.0"
it_setup itsig 2 2
it_start_coordinator
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h) || fail "token create"
IT_TOKENS+=("$token")
before=$(q 'SELECT count(*) FROM updates')
"$PYENV/bin/python" "$ROOT/tests/interop/httpsig_client.py" "$URL" tls/ca.pem "$token" \
  > client.log 2>&1 || { cat client.log >&2; fail "the independent client"; }
cat client.log
[ "$(q 'SELECT count(*) FROM updates')" = $((before + 1)) ] \
  || fail "expected exactly the one valid update stored"
[ "$(q "SELECT name FROM peers WHERE name = 'interop'")" = interop ] || fail "the peer is not stored"
it_stop_coordinator
echo "1 passed, 0 failed"
