#!/usr/bin/env bash
# A peer that cannot verify the coordinator's certificate says what is
# wrong and what to do, in one line, and exits 1 at once (no retries),
# writing nothing: a --cacert of another CA ("not signed by the CA in
# --cacert FILE"), no --cacert for a private CA ("not signed by a CA this
# system trusts"), a certificate for another name ("does not name
# 127.0.0.1") and an expired one ("has expired"). curl's own text stays
# out of the line. The certificates are made here.
source "$(dirname "$0")/lib.sh"
it_setup tlsadvice 1 1
it_start_coordinator
bash "$ROOT/deploy/make-cert.sh" other 127.0.0.1 > /dev/null
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h) || fail "token create"
IT_TOKENS+=("$token")
"$PEER" keygen --dir peer1 > /dev/null || fail "keygen"

# expect_refusal LOG WORDS ARGS...: join exits 1 within 10 s with one
# line holding WORDS, no curl text, no peer.json.
expect_refusal() {
  local log=$1 words=$2 rc=0 t0
  shift 2
  t0=$(date +%s)
  "$PEER" join --dir peer1 --coordinator "$URL" --token "$token" "$@" > /dev/null 2> "$log" || rc=$?
  [ "$rc" = 1 ] || fail "$log: join exited with $rc, not 1: $(cat "$log")"
  [ $(($(date +%s) - t0)) -le 10 ] || fail "$log: join took more than 10 s"
  [ "$(wc -l < "$log")" = 1 ] || fail "$log: more than one line: $(cat "$log")"
  grep -qF -- "$words" "$log" || fail "$log: '$words' not said: $(cat "$log")"
  ! grep -qi "SSL certificate problem\|unable to get local issuer" "$log" || fail "$log: curl's text"
  [ ! -e peer1/peer.json ] || fail "$log: a refused join wrote peer.json"
}

expect_refusal wrongca.log \
  "the coordinator's certificate is not signed by the CA in --cacert $WORK/other/ca.pem; use the CA file the operator gave you" \
  --cacert other/ca.pem
expect_refusal nocacert.log \
  "the coordinator's certificate is not signed by a CA this system trusts and no --cacert was given; join with --cacert FILE"

# A certificate for another name, from the same CA.
it_stop_coordinator
bash "$ROOT/deploy/make-cert.sh" named coordinator.example.org > /dev/null
serve_with() {
  : > coordinator.log
  "$COORD" serve --db run.db --cert "$1" --key "$2" --listen "127.0.0.1:$PORT" 2> coordinator.log &
  CPID=$!
  for _ in $(seq 1 100); do
    grep -q 'listening on' coordinator.log && return 0
    kill -0 "$CPID" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
serve_with named/server.pem named/server.key || fail "serve with another name's certificate"
expect_refusal wrongname.log \
  "the coordinator's certificate does not name 127.0.0.1; use the address the operator gave you" \
  --cacert named/ca.pem
it_stop_coordinator

# An expired one: valid for no time at all, signed by the test's CA.
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
  -keyout tls/old.key -out tls/old.csr 2> /dev/null
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > tls/old.ext
openssl x509 -req -in tls/old.csr -CA tls/ca.pem -CAkey tls/ca.key -days 0 -extfile tls/old.ext \
  -out tls/old.pem 2> /dev/null
sleep 1.1
if serve_with tls/old.pem tls/old.key; then
  expect_refusal expired.log "the coordinator's certificate has expired; tell its operator" \
    --cacert tls/ca.pem
  it_stop_coordinator
else
  CPID=""
  echo "SKIP part: the coordinator does not serve an expired certificate: $(tail -n 1 coordinator.log)"
fi
it_check_no_secrets
echo "1 passed, 0 failed"
