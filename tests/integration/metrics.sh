#!/usr/bin/env bash
# /metrics on the admin listener, read by Prometheus's own text parser
# (python3-prometheus-client) while a run goes: the figures must agree
# with the database and /v1/status (version, uploads accepted, a refused
# upload under its code, stored updates' staleness and local steps,
# peers by state, loss), the listener must hold to its bearer token, and
# answer anything but GET /metrics with a JSON error. An admin address
# that is not loopback and has no token refuses to start.
source "$(dirname "$0")/lib.sh"
IT_MODE=async IT_OUTER=default it_setup itmetrics 6 2
printf 'an-admin-token-of-32-characters!\n' > admin.token
if "$COORD" serve --db run.db --cert tls/server.pem --key tls/server.key --listen 127.0.0.1:0 \
  --admin-listen 0.0.0.0:0 2> open.log; then
  fail "an admin listener on 0.0.0.0 without a token started"
fi
grep -q "not on a loopback address: give it --admin-token-file" open.log \
  || fail "no reason given: $(tail -n 1 open.log)"
IT_SERVE_ARGS="--admin-listen 127.0.0.1:0 --admin-token-file admin.token" it_start_coordinator
admin="$(it_admin_url)/metrics"
# A refused upload: unsigned, so refused with a code (the metrics must
# count it under that code).
curl -s -o refused.json --cacert tls/ca.pem -X POST -H 'Content-Type: application/octet-stream' \
  --data-binary 'not an update' "$URL/v1/updates"
for i in 1 2; do it_peer "$i"; done
for i in 1 2; do
  "$PEER" run --dir "peer$i" --threads 1 --wait 5 --retries 20 2> "peer$i.log" &
  PIDS+=($!)
done
it_wait_finished 600 "the run did not finish"
it_stop_peers
sleep 0.5
code() { curl -s -o "$2" -w '%{http_code}' "${@:3}" "$1" || true; }
[ "$(code "$admin" noauth.txt)" = 401 ] || fail "/metrics without the token was not 401"
grep -q '"code":"unauthorized"' noauth.txt || fail "401 without a JSON error: $(cat noauth.txt)"
auth=(-H "Authorization: Bearer an-admin-token-of-32-characters!")
[ "$(code "$admin" wrong.txt -H 'Authorization: Bearer an-admin-token-of-32-characters?')" = 401 ] \
  || fail "a wrong token was let in"
[ "$(code "${admin%/metrics}/other" other.txt "${auth[@]}")" = 404 ] || fail "an unknown path was not 404"
[ "$(code "$admin" post.txt "${auth[@]}" -X POST)" = 405 ] || fail "POST /metrics was not 405"
[ "$(code "$admin" metrics.txt "${auth[@]}")" = 200 ] || fail "/metrics with the token: not 200"
curl -s --cacert tls/ca.pem "$URL/v1/status" > status.json
it_stop_coordinator
# Debian's package is for the system Python, which may not be first on PATH.
py=""
for p in /usr/bin/python3 python3; do
  "$p" -c 'import prometheus_client' 2> /dev/null && { py=$p; break; }
done
[ -n "$py" ] || fail "no Python with prometheus_client (deploy/install-deps.sh installs python3-prometheus-client)"
"$py" - metrics.txt status.json "$(q 'SELECT count(*) FROM updates')" \
  "$(q 'SELECT current_version FROM run')" refused.json <<'PY' || fail "the metrics do not agree with the run"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
text = open(sys.argv[1]).read()
status = json.load(open(sys.argv[2]))
stored, version = int(sys.argv[3]), int(sys.argv[4])
fam = {f.name: f for f in text_string_to_metric_families(text)}
def value(name, **labels):
    for s in fam[name].samples:
        if s.name in (name, name + "_total") and all(s.labels.get(k) == v
                                                     for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {name} {labels}")
def sample(name, suffix, **labels):
    for s in fam[name].samples:
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {name}{suffix} {labels}")
assert value("volley_version") == version == status["version"], (value("volley_version"), version)
assert value("volley_run_finished") == 1
assert value("volley_uploads", result="accepted", code="") == stored, stored
refused = json.load(open(sys.argv[5]))["error"]["code"]
assert value("volley_uploads", result="refused", code=refused) == 1, refused
assert fam["volley_staleness"].type == "histogram"
assert sample("volley_staleness", "_count") == stored
assert sample("volley_local_steps", "_count") == stored
assert sample("volley_local_steps", "_bucket", le="+Inf") == stored
assert sample("volley_version_seconds", "_count") == version
assert value("volley_requests", route="/v1/updates", **{"class": "2xx"}) >= stored
assert value("volley_received_bytes", route="/v1/updates") > 0
assert value("volley_sent_bytes", route="/v1/model") > 0
peers = sum(value("volley_peers", state=s) for s in ("active", "idle", "gone", "revoked"))
assert peers == status["peers"] == 2, peers
loss = value("volley_validation_loss")
assert abs(loss - status["versions"][-1]["val_loss"]) < 1e-6, (loss, status["versions"][-1])
assert value("volley_database_bytes", file="db") > 0
print(f"metrics: {len(fam)} families; version {version}, {stored} uploads accepted, "
      f"1 refused ({refused}), validation loss {loss:.4f}")
PY
echo "1 passed, 0 failed"
