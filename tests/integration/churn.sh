#!/usr/bin/env bash
# Churn: four real peers train a sync run; two are killed with SIGKILL while
# they hold leases. Their leases expire, the data of their tasks is handed
# to later tasks, the two survivors finish every version, and one killed
# peer, started again with no operator action, takes part again with the
# same key. Then the database must show the reissues, each update merged
# exactly once, and the dead peers as idle or gone.
source "$(dirname "$0")/lib.sh"
VERSIONS=12
PER=4
# SelSync with delta 0 stops every task as soon as allowed: after h_min = 2
# of its 4 steps. Each update must say so, and the status must count them.
IT_LEASE_S=3 it_setup itchurn "$VERSIONS" "$PER" '"selsync": {"delta": 0.0, "h_min": 2},'

it_start_coordinator
for i in 1 2 3 4; do it_peer "$i"; done
start_peer() { # start_peer N DELAY_MS
  "$PEER" run --dir "peer$1" --threads 1 --wait 5 --retries 20 --step-delay "$2" \
    2>> "peer$1.log" &
  PIDS[$1]=$!
}
for i in 1 2; do start_peer "$i" 60; done
# The two that will die train slowly, so they are surely mid-task.
for i in 3 4; do start_peer "$i" 400; done

for _ in $(seq 1 300); do
  [ "$(q 'SELECT current_version FROM run')" -ge 2 ] && break
  sleep 0.1
done
[ "$(q 'SELECT current_version FROM run')" -ge 2 ] || fail "the run did not reach version 2"
for _ in $(seq 1 100); do
  held=$(q "SELECT count(DISTINCT peer_id) FROM tasks WHERE state = 'leased' AND peer_id IN (3, 4)")
  [ "$held" = 2 ] && break
  sleep 0.05
done
[ "$held" = 2 ] || fail "peers 3 and 4 did not both hold a lease"
kill -9 "${PIDS[3]}" "${PIDS[4]}"
wait "${PIDS[3]}" 2>/dev/null || true
wait "${PIDS[4]}" 2>/dev/null || true
killed_at=$(q 'SELECT current_version FROM run')
echo "churn: killed peers 3 and 4 at version $killed_at, each holding a lease"

# Once the coordinator has seen both leases run out, peer 3 comes back on
# its own (same directory, same key).
for _ in $(seq 1 200); do
  [ "$(q "SELECT count(*) FROM tasks WHERE state = 'expired' AND peer_id IN (3, 4)")" -ge 2 ] && break
  sleep 0.05
done
[ "$(q "SELECT count(*) FROM tasks WHERE state = 'expired' AND peer_id IN (3, 4)")" -ge 2 ] \
  || fail "the killed peers' leases did not expire"
start_peer 3 60
for i in 1 2 3; do wait "${PIDS[$i]}" || fail "peer $i exited with an error"; done
PIDS=()
status=$(curl -s --cacert tls/ca.pem "$URL/v1/status" || true)
it_stop_coordinator

[ "$(q 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
[ "$(q 'SELECT status FROM run')" = finished ] || fail "the run did not finish"
[ "$(q 'SELECT count(*) FROM versions')" = $((VERSIONS + 1)) ] || fail "versions missing"
expired=$(q "SELECT count(*) FROM tasks WHERE state = 'expired'")
reissued=$(q 'SELECT count(*) FROM tasks WHERE reissue_of IS NOT NULL')
[ "$expired" -ge 2 ] || fail "expected the killed peers' leases to expire (got $expired)"
[ "$reissued" -ge 1 ] || fail "no expired task's data was reissued"
# A reissue redoes exactly the data of the task it replaces.
[ "$(q 'SELECT count(*) FROM tasks n JOIN tasks o ON n.reissue_of = o.id
         WHERE n.data_offset <> o.data_offset OR n.data_length <> o.data_length
            OR n.seed <> o.seed OR o.state <> '"'expired'"'')" = 0 ] \
  || fail "a reissued task does not redo its predecessor's data"
[ "$(q 'SELECT count(*) FROM (SELECT reissue_of FROM tasks WHERE reissue_of IS NOT NULL
                              GROUP BY reissue_of HAVING count(*) > 1)')" = 0 ] \
  || fail "an expired task was reissued twice"
# Every update merged exactly once, each version holding what it says.
[ "$(q 'SELECT count(*) FROM updates WHERE merged_version IS NULL')" = 0 ] || fail "unmerged updates"
[ "$(q 'SELECT count(*) FROM versions v WHERE v.version > 0 AND v.num_updates <>
         (SELECT count(*) FROM updates u WHERE u.merged_version = v.version)')" = 0 ] \
  || fail "a version's update count does not match its merged updates"
[ "$(q 'SELECT count(*) FROM (SELECT task_id FROM updates GROUP BY task_id HAVING count(*) > 1)')" = 0 ] \
  || fail "a task has two updates"
after=$(q "SELECT count(*) FROM updates WHERE peer_id = 3 AND base_version >= $killed_at")
[ "$after" -ge 1 ] || fail "the restarted peer 3 uploaded nothing after coming back"
grep -q "working for" peer3.log || fail "peer 3 did not start again"
echo "$status" | grep -q '"peer_states"' || fail "status lacks peer states: $status"
[ "$(q 'SELECT group_concat(DISTINCT local_steps) FROM updates')" = 2 ] \
  || fail "SelSync: updates did not all stop after h_min = 2 local steps"
n_updates=$(q 'SELECT count(*) FROM updates')
echo "$status" | grep -Eq "\"local_steps\": *\{ *\"2\": *$n_updates *\}" \
  || fail "status does not report the $n_updates updates' local steps: $status"
# Every scored version's loss is also given in bits (per byte here): nats / ln 2.
pairs=$(echo "$status" | grep -Eo '"val_loss": *[0-9.eE+-]+, *"val_bits": *[0-9.eE+-]+' \
  | sed -E 's/[^0-9.eE+-]+/ /g')
[ "$(echo "$pairs" | grep -c .)" -ge 2 ] || fail "status lacks val_bits beside val_loss: $status"
echo "$pairs" | awk '{ if ($2 < $1 / log(2) - 1e-6 || $2 > $1 / log(2) + 1e-6) exit 1 }' \
  || fail "val_bits is not val_loss / ln 2: $pairs"
state4=$(echo "$status" | grep -o '"id": *4, *"state": *"[a-z]*"' | grep -o '"state": *"[a-z]*"' || true)
echo "$status" | grep -q '"name"' && fail "status shows peer names to anyone: $status"
case "$state4" in *idle* | *gone*) ;; *) fail "killed peer 4 is not idle or gone: $state4" ;; esac
# The same summary from the database of the stopped coordinator.
"$COORD" status --db run.db > offline.json 2> offline.err || fail "status --db: $(cat offline.err)"
echo "$status" > live.json
python3 - live.json offline.json <<'PY' || fail "status --db differs from /v1/status"
import json, sys
live, off = (json.load(open(f)) for f in sys.argv[1:3])
for k in ("run", "mode", "status", "version", "max_versions", "updates", "unmerged", "peers",
          "local_steps", "staleness", "versions"):
    assert live[k] == off[k], (k, live[k], off[k])
assert "writer" in live and "writer" not in off
PY
echo "churn: $expired leases expired, $reissued tasks redid their data; peer 3 uploaded" \
     "$after updates after its restart; peer 4 $state4"
echo "1 passed, 0 failed"
