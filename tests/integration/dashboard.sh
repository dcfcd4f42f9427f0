#!/usr/bin/env bash
# The live dashboard on the admin listener, in a real browser: Debian's
# chromium (headless) loads the page while two peers train and again once
# the run has finished, and the figures the page shows must agree with
# /v1/status, /metrics and the database read at that moment: the version,
# the validation loss and its curve, uploads accepted and refused by code,
# peers by state, each peer's updates, merged updates and bytes, and a
# registered peer's refused upload with its address. The public port
# serves none of it; with a token the page and its JSON answer only to
# it, as a bearer token or as a browser's Basic password. The screenshot
# is left in the work directory (DASHBOARD_SHOTS=DIR copies it there).
# In a 1000 x 900 window the peers and the refusals show without
# scrolling; while the run goes the page estimates when it ends (from the
# latest versions' pace), and says "finished" after; a dense run
# (compression none) gets no compression chart.
source "$(dirname "$0")/lib.sh"
ATTACK=${ATTACK:?}
BROWSER=$(command -v chromium || true)
[ -n "$BROWSER" ] || fail "no chromium on PATH: the dashboard is tested in a real browser (deploy/install-deps.sh installs it)"
# Compressed uploads, so the page has a compression to show, and the
# default robust section (the derived norm bound, refused beyond in an
# async run): a peer whose update exceeds it goes on with its next task
# (judged.sh), so the run finishes with it.
IT_MODE=async IT_OUTER=default it_setup itdash 100 2 \
  '"compression": {"kind": "topk", "ratio": 20, "dtype": "F16"},'
IT_SERVE_ARGS="--admin-listen 127.0.0.1:0" it_start_coordinator

admin="$(it_admin_url)/"

# browse URL OUT [OPTIONS]: the page's DOM after its first polls, as the
# browser rendered it. Its own profile, nothing fetched but the page.
browse() {
  timeout 120 "$BROWSER" --headless --no-sandbox --disable-gpu --no-first-run \
    --disable-extensions --disable-background-networking --disable-sync --disable-default-apps \
    --user-data-dir="$WORK/chromium" --virtual-time-budget=8000 "${@:3}" --dump-dom "$1" \
    > "$2" 2>> chromium.log || fail "chromium could not load $1: $(tail -n 3 chromium.log)"
}
code() { curl -s -o "$2" -w '%{http_code}' "${@:3}" "$1" || true; }

# The public port serves neither the page nor its figures.
[ "$(code "$URL/dashboard.json" pub.json --cacert tls/ca.pem)" = 404 ] \
  || fail "the public port served /dashboard.json"
[ "$(code "$URL/" pub.html --cacert tls/ca.pem)" = 404 ] || fail "the public port served /"
[ "$(code "${admin}nothing" nothing.json)" = 404 ] || fail "an unknown admin path was not 404"
grep -q '"code":"not_found"' nothing.json || fail "404 without a JSON error: $(cat nothing.json)"
[ "$(code "$admin" post.json -X POST)" = 405 ] || fail "POST / was not 405"
grep -q '"code":"method_not_allowed"' post.json || fail "405 without a JSON error"
# Methods libevent knows but would answer itself (501, HTML) get the same.
for m in PATCH OPTIONS PUT DELETE; do
  [ "$(code "${admin}metrics" m.json -X "$m")" = 405 ] || fail "$m /metrics was not 405"
  grep -q '"code":"method_not_allowed"' m.json || fail "$m: 405 without a JSON error: $(cat m.json)"
done

# Refusals: an unsigned upload (no peer to blame), and a registered
# peer's second upload of one task, which must show in its row.
curl -s -o refused.json --cacert tls/ca.pem -X POST -H 'Content-Type: application/octet-stream' \
  --data-binary 'not an update' "$URL/v1/updates"
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
mkdir -p atk
"$ATTACK" prepare "$URL" tls/ca.pem atk "$token" "vlt_$(printf '%064d' 0)" > prepare.log 2>&1 \
  || { cat prepare.log; fail "prepare"; }
"$ATTACK" finish "$URL" tls/ca.pem atk > finish.log 2>&1 || { cat finish.log; fail "finish"; }
"$ATTACK" late "$URL" tls/ca.pem atk 409 duplicate_update > late.log 2>&1 \
  || { cat late.log; fail "the duplicate upload was not refused"; }

for i in 1 2; do it_peer "$i"; done
for i in 1 2; do
  "$PEER" run --dir "peer$i" --threads 1 --wait 5 --retries 20 2> "peer$i.log" &
  PIDS+=($!)
done

# While they train: the page renders, with the run under way.
for _ in $(seq 1 600); do
  [ "$(q 'SELECT current_version FROM run')" -ge 3 ] && break
  sleep 0.1
done
browse "$admin" live.html

it_wait_finished 1800 "the run did not finish"
it_stop_peers
grep -q "robust: updates whose L2 norm .* are refused (422 norm_exceeded)" coordinator.log \
  || fail "no update-norm bound was derived"
# A peer refused for its norm trained on, and none gave up.
for i in 1 2; do
  n=$(grep -c "422 norm_exceeded.*; going on with the next task" "peer$i.log" || true)
  ! grep -q "giving up after" "peer$i.log" || fail "peer $i gave up: $(grep "giving up" "peer$i.log")"
  echo "dashboard: peer $i: $n updates refused for their norm, each followed by the next task"
done
sleep 0.5
browse "$admin" final.html
browse "$admin" compact.html --window-size=1000,900
timeout 120 "$BROWSER" --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
  --disable-background-networking --user-data-dir="$WORK/chromium" --hide-scrollbars \
  --virtual-time-budget=8000 --window-size=1400,1800 --screenshot="$WORK/dashboard.png" "$admin" \
  2>> chromium.log || fail "chromium could not take the screenshot"
[ -s dashboard.png ] || fail "no screenshot"
curl -s --cacert tls/ca.pem "$URL/v1/status" > status.json
curl -s "${admin}metrics" > metrics.txt
curl -s "${admin}dashboard.json" > dashboard.json
if [ -n "${DASHBOARD_SHOTS:-}" ]; then cp dashboard.png "$DASHBOARD_SHOTS/dashboard.png"; fi

py=""
for p in /usr/bin/python3 python3; do
  "$p" -c 'import prometheus_client' 2> /dev/null && { py=$p; break; }
done
[ -n "$py" ] || fail "no Python with prometheus_client (deploy/install-deps.sh installs python3-prometheus-client)"
"$py" "$ROOT/tests/integration/dashboard_check.py" live.html final.html status.json metrics.txt \
  dashboard.json refused.json coordinator.log compact.html \
  "$(q 'SELECT current_version FROM run')" "$(q 'SELECT count(*) FROM updates')" \
  "$(q 'SELECT count(*) FROM updates WHERE merged_version IS NOT NULL')" \
  "$(q 'SELECT sum(nbytes) FROM updates')" \
  "$(q "SELECT id FROM peers WHERE name NOT LIKE 'it-peer-%'")" \
  || fail "the page does not agree with the run"

# With a token, every admin path wants it: as a bearer token (scrapers)
# or as the password of Basic credentials (what a browser asks for).
it_stop_coordinator
printf 'a-dashboard-token-of-32-characters\n' > admin.token
IT_SERVE_ARGS="--admin-listen 127.0.0.1:0 --admin-token-file admin.token" it_serve_again
admin="$(it_admin_url)/"
tok=a-dashboard-token-of-32-characters
[ "$(code "$admin" noauth.json -D noauth.head)" = 401 ] || fail "/ without the token was not 401"
grep -q '"code":"unauthorized"' noauth.json || fail "401 without a JSON error"
grep -qi '^WWW-Authenticate: Basic' noauth.head || fail "the 401 does not offer Basic to a browser"
[ "$(code "${admin}dashboard.json" wrong.json -u "operator:$tok-wrong")" = 401 ] \
  || fail "a wrong Basic password was let in"
[ "$(code "${admin}dashboard.json" basic.json -u "operator:$tok")" = 200 ] \
  || fail "the token as a Basic password was refused"
[ "$(code "${admin}dashboard.json" bearer.json -H "Authorization: Bearer $tok")" = 200 ] \
  || fail "the bearer token was refused on /dashboard.json"
[ "$(code "$admin" page.html -H "Authorization: Bearer $tok")" = 200 ] || fail "the page was refused"
grep -q 'id="peers"' page.html || fail "/ did not serve the page"
"$py" - basic.json <<'PY' || fail "/dashboard.json with the token lacks its figures"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["status"]["status"] == "finished" and len(d["peers"]) == 3, d["status"]["status"]
PY
# The browser, given the credentials once, sends them with the page's polls.
browse "http://operator:$tok@${admin#http://}" token.html
grep -q 'data-loaded="1"' token.html || fail "with a token the page did not load its figures in the browser"
it_stop_coordinator

# A dense run: its compression is 1x by definition, and the page leaves
# the chart out. Version 0 is enough, the page reads the configuration.
rm -rf run.db run.db-*
sed -i 's/"compression": {[^}]*}/"compression": {"kind": "none", "dtype": "F32"}/' run.json
"$COORD" init --db run.db --config run.json 2> init-dense.log || fail "init of the dense run"
IT_SERVE_ARGS="--admin-listen 127.0.0.1:0" it_serve_again
admin="$(it_admin_url)/"
browse "$admin" dense.html --window-size=1000,900
"$py" - dense.html <<'PY' || fail "the dense run's page shows a compression chart"
import re, sys
t = open(sys.argv[1]).read()
assert 'data-loaded="1"' in t
fig = re.search(r'<figure id="fig-compression"[^>]*>', t).group(0)
assert 'data-shown="0"' in fig and "display: none" in fig, fig
print("dashboard: dense run: no compression chart")
PY
it_stop_coordinator
echo "1 passed, 0 failed"
