#!/usr/bin/env bash
# A coordinator is safe to start twice and refuses to start where it cannot
# listen: a second `serve` (or an `init`) on a live database gets one line
# naming the process that holds it, and exits non-zero; the commands made
# for a running server (token create, peer list, status, check) go on
# working beside it; a serve whose public or admin port is taken, or whose
# address is not this machine's, says why in one line and leaves the
# database's bytes as they were (no merge, no expired leases).
source "$(dirname "$0")/lib.sh"
it_setup twice 3 1
IT_SERVE_ARGS="--admin-listen 127.0.0.1:0" it_start_coordinator

# refused LABEL WANT_TEXT ARGS...: exit non-zero, one line on stderr naming
# WANT_TEXT, nothing on stdout.
refused() {
  local label=$1 want=$2 rc=0
  shift 2
  "$COORD" "$@" > ref.out 2> ref.err || rc=$?
  [ "$rc" != 0 ] || fail "$label: exit 0"
  [ "$(wc -l < ref.err)" = 1 ] || fail "$label: want one line, got: $(cat ref.err)"
  grep -qi -- "$want" ref.err || fail "$label: no \"$want\" in: $(cat ref.err)"
  [ ! -s ref.out ] || fail "$label printed to stdout: $(cat ref.out)"
  echo "$label: $(cat ref.err)"
}
serve() { echo serve --db run.db --cert tls/server.pem --key tls/server.key "$@"; }

# shellcheck disable=SC2046 # the words are options
refused "second serve" "in use by process $CPID (.*serve" $(serve --listen 127.0.0.1:0 --admin-listen off)
grep -q "run.db-lock" ref.err || fail "the refusal does not name the lock file: $(cat ref.err)"
refused "init over a live database" "in use by process $CPID" init --db run.db --config run.json
# The first server still answers alone.
curl -fsS --cacert tls/ca.pem "$URL/v1/status" > status.json || fail "the first server stopped answering"
token=$("$COORD" token create --db run.db 2> tok.err) || fail "token create beside serve: $(cat tok.err)"
[ -n "$token" ] || fail "token create printed nothing"
"$COORD" token list --db run.db > /dev/null 2>&1 || fail "token list beside serve"
"$COORD" peer list --db run.db > /dev/null 2>&1 || fail "peer list beside serve"
"$COORD" status --db run.db > /dev/null 2>&1 || fail "status beside serve"
"$COORD" check --db run.db > check.out 2>&1 || fail "check beside serve: $(cat check.out)"
holder=$(tail -n +2 run.db-lock)
CPID_WAS=$CPID
it_stop_coordinator
[ ! -s run.db-lock ] || fail "the lock file still names a stopped server: $(cat run.db-lock)"

# A port taken by another process: the public one, then the admin one.
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
time.sleep(120)' > taken.txt &
HOLDER=$!
PIDS+=("$HOLDER")
for _ in $(seq 1 50); do [ -s taken.txt ] && break; sleep 0.1; done
taken=$(cat taken.txt)
[ -n "$taken" ] || fail "no port to take"
snap() { sha256sum run.db run.db-wal 2> /dev/null; stat -c %Y run.db; sqlite3 run.db 'SELECT count(*), max(version) FROM versions'; }
before=$(snap)
# shellcheck disable=SC2046
refused "public port taken" "cannot listen on 127.0.0.1:$taken: address already in use" \
  $(serve --listen "127.0.0.1:$taken" --admin-listen off)
# shellcheck disable=SC2046
refused "admin port taken" "127.0.0.1:$taken for the admin listener: address already in use" \
  $(serve --listen 127.0.0.1:0 --admin-listen "127.0.0.1:$taken")
# 192.0.2.1 (TEST-NET-1) is nobody's address.
# shellcheck disable=SC2046
refused "foreign address" "cannot assign address" $(serve --listen 192.0.2.1:0 --admin-listen off)
# A port below the unprivileged range, for a user who may not bind it.
low=$(cat /proc/sys/net/ipv4/ip_unprivileged_port_start 2> /dev/null || echo 1024)
denied="not checked (no privileged ports here, or no way to drop root)"
if [ "$(id -u)" != 0 ] && [ "$low" -gt 1 ]; then
  # shellcheck disable=SC2046
  refused "privileged port" "cannot listen on 127.0.0.1:1: permission denied" \
    $(serve --listen 127.0.0.1:1 --admin-listen off)
  denied="refused"
elif [ "$low" -gt 1 ] && command -v setpriv > /dev/null; then
  # As root, the same serve run as nobody, on copies nobody may read and
  # write (the work folder and the build may be root's alone).
  nb=$(mktemp -d /tmp/volley-nobody.XXXXXX)
  chmod 755 "$nb"
  cp "$COORD" run.db tls/server.pem tls/server.key "$nb/"
  chown -R 65534:65534 "$nb"
  nsnap() { sha256sum "$nb/run.db"; }
  nbefore=$(nsnap)
  rc=0
  (cd "$nb" && setpriv --reuid=65534 --regid=65534 --clear-groups ./volley-coordinator serve \
    --db run.db --cert server.pem --key server.key --listen 127.0.0.1:1 --admin-listen off) \
    > ref.out 2> ref.err || rc=$?
  [ "$rc" != 0 ] || fail "privileged port as nobody: exit 0"
  [ "$(wc -l < ref.err)" = 1 ] || fail "privileged port as nobody: want one line, got: $(cat ref.err)"
  grep -qi "cannot listen on 127.0.0.1:1: permission denied" ref.err \
    || fail "privileged port as nobody: $(cat ref.err)"
  [ "$(nsnap)" = "$nbefore" ] || fail "a serve refused its port changed the database"
  echo "privileged port (as nobody): $(cat ref.err)"
  rm -rf "$nb"
  denied="refused (run as nobody)"
fi
[ "$(snap)" = "$before" ] || fail "a refused serve changed the database: $before / $(snap)"
kill "$HOLDER" 2> /dev/null || true
echo "serve_twice: the second serve and init refused, naming process $CPID_WAS ($holder);" \
  "token create, token list, peer list, status and check worked beside it; a taken public and" \
  "admin port and a foreign address refused with the database unchanged; a privileged port" \
  "$denied"
echo "1 passed, 0 failed"
