#!/usr/bin/env bash
# SIGHUP reloads the coordinator's certificate and key without a restart:
# a new connection gets the new certificate (trusted by a second CA, not
# the first), the coordinator's process stays the same, and a pair that
# does not load (a key that does not match) keeps the one served, with a
# log line saying why. A peer's run over the first certificate is not
# part of this; what a client sees is checked with curl.
source "$(dirname "$0")/lib.sh"
it_setup itreload 2 1
it_start_coordinator
status() { # status CA: the HTTP status of GET /v1/status trusting CA, 000 when TLS fails
  curl -s -o /dev/null -w '%{http_code}' --cacert "$1" "$URL/v1/status" || true
}
[ "$(status tls/ca.pem)" = 200 ] || fail "the first certificate is not served"
bash "$ROOT/deploy/make-cert.sh" tls2 127.0.0.1 localhost > /dev/null
cp tls2/server.pem tls/server.pem
cp tls2/server.key tls/server.key
kill -HUP "$CPID"
for _ in $(seq 1 50); do grep -q 'certificate reloaded' coordinator.log && break; sleep 0.1; done
grep -q 'SIGHUP: certificate reloaded from' coordinator.log || fail "no reload logged"
[ "$(status tls2/ca.pem)" = 200 ] || fail "the new certificate is not served after SIGHUP"
[ "$(status tls/ca.pem)" = 000 ] || fail "the old CA still verifies the served certificate"
kill -0 "$CPID" || fail "the coordinator exited on SIGHUP"
# A key that does not match: the new pair stays in service.
bash "$ROOT/deploy/make-cert.sh" tls3 127.0.0.1 localhost > /dev/null
cp tls3/server.key tls/server.key
kill -HUP "$CPID"
for _ in $(seq 1 50); do grep -q 'certificate not reloaded' coordinator.log && break; sleep 0.1; done
grep -q 'SIGHUP: certificate not reloaded, still serving the old one: the key in' coordinator.log \
  || fail "a mismatched pair was not refused in the log: $(grep SIGHUP coordinator.log)"
[ "$(status tls2/ca.pem)" = 200 ] || fail "the served certificate changed after a bad pair"
kill -0 "$CPID" || fail "the coordinator exited on a bad pair"
it_stop_coordinator
echo "reload: certificate replaced on SIGHUP without a restart; a mismatched key kept the served pair"
echo "1 passed, 0 failed"
