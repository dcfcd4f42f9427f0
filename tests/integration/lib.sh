# Shared helpers for the integration tests: a work directory with real TLS
# certificates, a small run configuration, and a coordinator process on a
# free port of 127.0.0.1. Sourced by the test scripts. A failing test keeps
# its work directory and prints its logs; IT_KEEP=1 keeps a passing one's.
set -euo pipefail

COORD=${COORD:?}
PEER=${PEER:?}
ROOT=${ROOT:?}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/volley-it.XXXXXX")
PIDS=()
CPID=""

it_cleanup() {
  local rc=$?
  for p in "${PIDS[@]}" $CPID; do kill -9 "$p" 2>/dev/null || true; done
  if [ "$rc" != 0 ]; then
    echo "---- logs from $WORK" >&2
    tail -n 30 "$WORK"/*.log >&2 2>/dev/null || true
  else
    [ -n "${IT_KEEP:-}" ] || rm -rf "$WORK"
  fi
}
trap it_cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# it_files: in $WORK, certificates for 127.0.0.1 made by the test's own CA
# (tls/), and the text corpus (corpus.txt: the license texts).
it_files() {
  cd "$WORK"
  bash "$ROOT/deploy/make-cert.sh" tls 127.0.0.1 localhost >/dev/null
  find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort | xargs cat > corpus.txt
}

# it_setup NAME VERSIONS UPDATES_PER_VERSION [EXTRA]: EXTRA is more
# configuration fields, each followed by a comma. IT_MODE (sync),
# IT_LEASE_S (60) and IT_TRAIN (4 steps of 4 windows) set the mode, the
# lease length and the train object; IT_OUTER (FedAvg: lr 1, momentum 0)
# the outer object, and IT_OUTER=default leaves it out for the
# coordinator's own choice.
it_setup() {
  local train='{"steps": 4, "batch": 4, "lr": 0.003}'
  [ -n "${IT_TRAIN:-}" ] && train=$IT_TRAIN
  local outer='"outer": {"lr": 1.0, "momentum": 0.0},'
  [ -n "${IT_OUTER:-}" ] && outer="\"outer\": $IT_OUTER,"
  [ "${IT_OUTER:-}" = default ] && outer=""
  it_files
  cat > run.json <<JSON
{
  "name": "$1",
  "corpus": "$WORK/corpus.txt",
  "seed": 7,
  "model": {"vocab_size": 256, "block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32},
  "mode": "${IT_MODE:-sync}",
  "updates_per_version": $3,
  "max_versions": $2,
  ${4:-}
  "train": $train,
  $outer
  "task_bytes": 16384,
  "lease_s": ${IT_LEASE_S:-60},
  "max_body_bytes": 4194304,
  "val_batches": 4
}
JSON
  "$COORD" init --db run.db --config run.json 2> init.log || fail "init"
}

# it_start_coordinator: serves run.db on a free port; IT_SERVE_ARGS are more
# serve options (limits), IT_WRAP a command the coordinator runs under
# (e.g. "ip netns exec NS"; it must exec the coordinator, so that CPID is
# the coordinator's).
it_start_coordinator() {
  # shellcheck disable=SC2086 # the options are words on purpose
  ${IT_WRAP:-} "$COORD" serve --db run.db --cert tls/server.pem --key tls/server.key \
    --listen 127.0.0.1:0 ${IT_SERVE_ARGS:-} 2> coordinator.log &
  CPID=$!
  PORT=""
  for _ in $(seq 1 200); do
    PORT=$(grep -o 'listening on 127.0.0.1:[0-9]*' coordinator.log | head -n1 | cut -d: -f2 || true)
    [ -n "$PORT" ] && break
    kill -0 "$CPID" 2>/dev/null || fail "coordinator exited at start"
    sleep 0.1
  done
  [ -n "$PORT" ] || fail "coordinator did not report its port"
  URL="https://127.0.0.1:$PORT"
}

# it_admin_url: the admin listener's http://HOST:PORT (no slash after),
# from the last start the coordinator logged (serve --admin-listen).
it_admin_url() {
  local a=""
  for _ in $(seq 1 50); do
    a=$(grep -o 'admin listener on http://[0-9.]*:[0-9]*' coordinator.log | tail -n1 \
      | sed 's/admin listener on //' || true)
    [ -n "$a" ] && { echo "$a"; return 0; }
    sleep 0.1
  done
  fail "no admin listener in the log"
}

it_stop_coordinator() {
  kill -TERM "$CPID"
  local rc=0
  wait "$CPID" || rc=$?
  CPID=""
  [ "$rc" = 0 ] || fail "coordinator exited with $rc after SIGTERM"
}

# it_serve_again: starts the stopped coordinator again on the same port
# (peers keep its address), its earlier log kept as coordinator-1.log.
it_serve_again() {
  mv coordinator.log coordinator-1.log
  # shellcheck disable=SC2086 # the options are words on purpose
  "$COORD" serve --db run.db --cert tls/server.pem --key tls/server.key \
    --listen "127.0.0.1:$PORT" ${IT_SERVE_ARGS:-} 2> coordinator.log &
  CPID=$!
  for _ in $(seq 1 100); do
    grep -q 'listening on' coordinator.log && return 0
    kill -0 "$CPID" 2>/dev/null || fail "coordinator exited at its restart"
    sleep 0.1
  done
  fail "the restarted coordinator did not listen"
}

# it_peer N: keygen + join peer N (directory peerN). The tokens are kept
# in IT_TOKENS for it_check_no_secrets.
IT_TOKENS=()
it_peer() {
  local token
  token=$("$COORD" token create --db run.db --uses 1 --ttl 1h) || fail "token create"
  IT_TOKENS+=("$token")
  "$PEER" keygen --dir "peer$1" > /dev/null || fail "keygen $1"
  "$PEER" join --dir "peer$1" --coordinator "$URL" --token "$token" --cacert tls/ca.pem \
    --name "it-peer-$1" > /dev/null 2> "join$1.log" || fail "join $1"
}

q() { sqlite3 run.db "$@"; }

# it_wait_finished TENTHS MESSAGE: waits up to TENTHS tenths of a second for
# the run to finish, failing with MESSAGE if it does not.
it_wait_finished() {
  for _ in $(seq 1 "$1"); do
    [ "$(q 'SELECT status FROM run')" = finished ] && return 0
    sleep 0.1
  done
  fail "$2"
}

# it_wait_leased PEER TRIES: waits up to TRIES twentieths of a second for
# peer PEER to hold one lease, failing if it does not.
it_wait_leased() {
  for _ in $(seq 1 "$2"); do
    [ "$(q "SELECT count(*) FROM tasks WHERE state = 'leased' AND peer_id = $1")" = 1 ] && return 0
    sleep 0.05
  done
  fail "peer $1 holds no lease"
}

# it_stop_peers: SIGTERM to every process in PIDS, each waited for.
it_stop_peers() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}

# it_snapshot: a digest of every table's rows (peers' last_seen aside), to
# show that refused requests changed nothing stored.
it_snapshot() {
  for t in $(q "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"); do
    cols=$(q "SELECT group_concat(name, ',') FROM pragma_table_info('$t')
              WHERE name NOT IN ('last_seen')")
    echo "$t $(q "SELECT $cols FROM $t ORDER BY 1" | sha256sum)"
  done
}

# it_snapshot_held: it_snapshot with every expired task shown as leased.
# An update refused for what it holds ends its task's lease, the one
# change a refusal makes; tests comparing snapshots around refused
# uploads set it aside this way (and check the lease ended on their own).
it_snapshot_held() {
  it_snapshot | grep -v '^tasks '
  echo "tasks $(q 'SELECT * FROM tasks ORDER BY id' | sed -E 's/(^|\|)expired(\||$)/\1leased\2/' | sha256sum)"
}

# it_check_run VERSIONS PER_VERSION: the finished run's database is sound,
# holds every version once with its validation loss, every update was
# merged exactly once, into the version after its base, and was stored
# with its norm (the merge uses it rather than computing it again).
it_check_run() {
  local versions=$1 per=$2
  [ "$(q 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
  [ "$(q 'SELECT count(*) FROM versions')" = $((versions + 1)) ] || fail "expected $((versions + 1)) versions"
  [ "$(q 'SELECT count(*) FROM versions WHERE val_loss IS NULL')" = 0 ] || fail "a version lacks its validation loss"
  [ "$(q "SELECT count(*) FROM versions WHERE version > 0 AND num_updates <> $per")" = 0 ] \
    || fail "a version merged other than $per updates"
  [ "$(q 'SELECT count(*) FROM updates')" = $((per * versions)) ] || fail "expected $((per * versions)) updates"
  [ "$(q 'SELECT count(*) FROM updates WHERE merged_version IS NULL OR merged_version <> base_version + 1')" = 0 ] \
    || fail "an update was not merged into the version after its base"
  [ "$(q 'SELECT count(*) FROM (SELECT task_id FROM updates GROUP BY task_id HAVING count(*) > 1)')" = 0 ] \
    || fail "a task has two updates"
  [ "$(q 'SELECT count(*) FROM updates WHERE norm IS NULL')" = 0 ] || fail "an update was stored without its norm"
}

# it_check_no_secrets: no log of the run holds a secret: a join token, a
# peer's secret key (its key file's base64 line, or a 16-character piece
# of it), or a request signature (a Signature or Signature-Input value).
it_check_no_secrets() {
  local logs=("$WORK"/*.log) t k piece
  for t in "${IT_TOKENS[@]}"; do
    ! grep -qF -- "$t" "${logs[@]}" || fail "a join token is in a log"
    ! grep -qF -- "${t#vlt_}" "${logs[@]}" || fail "a join token's hex is in a log"
  done
  for k in "$WORK"/peer*/peer.key; do
    [ -f "$k" ] || continue
    while read -r piece; do
      ! grep -qF -- "$piece" "${logs[@]}" || fail "part of $k is in a log"
    done < <(sed -n 2p "$k" | fold -w 16)
  done
  ! grep -qE 'sig1=:|Signature: |Signature-Input: ' "${logs[@]}" || fail "a request signature is in a log"
}

# it_check_acked WHEN: the invariants of a database a crash or a power cut
# left, for tests whose clients log acknowledgements (acks*.txt, lines
# "ACK task update"): integrity_check ok, every upload answered 202 stored,
# every version holding exactly the updates it counts, no update merged
# into a version that does not exist, no task with two updates, and
# (volley-coordinator check) every update waiting for a merge readable.
# Leaves the acknowledged uploads in acked.txt.
it_check_acked() {
  [ "$(q 'PRAGMA integrity_check')" = ok ] || fail "$1: integrity_check"
  "$COORD" check --db run.db > check.txt 2>&1 || fail "$1: check: $(tail -n 3 check.txt)"
  cat acks*.txt 2>/dev/null | awk '$1 == "ACK" { print $2 "|" $3 }' | sort -u > acked.txt
  q 'SELECT task_id || "|" || id FROM updates' | sort -u > stored.txt
  local lost
  lost=$(comm -23 acked.txt stored.txt | wc -l)
  [ "$lost" = 0 ] || fail "$1: $lost acknowledged uploads are not in the database: $(comm -23 acked.txt stored.txt | head -n 3 | tr '\n' ' ')"
  [ "$(q 'SELECT count(*) FROM versions v WHERE v.version > 0 AND v.num_updates <>
           (SELECT count(*) FROM updates u WHERE u.merged_version = v.version)')" = 0 ] \
    || fail "$1: a version does not hold exactly the updates it counts"
  [ "$(q 'SELECT count(*) FROM updates WHERE merged_version IS NOT NULL AND merged_version NOT IN
           (SELECT version FROM versions)')" = 0 ] || fail "$1: an update is merged into no version"
  [ "$(q 'SELECT count(*) FROM (SELECT task_id FROM updates GROUP BY task_id HAVING count(*) > 1)')" = 0 ] \
    || fail "$1: a task has two updates"
}

# it_storm_setup NAME PER PEERS: an async sketch run for upload storms
# (PER updates a version, no end, no staleness limit, the plain mean
# without a norm bound: the storm's random uploads have no honest norm)
# served without rate limits, since a storm is far above any peer's rate
# on purpose, with PEERS peers joined (peer1...).
it_storm_setup() {
  IT_MODE=async IT_LEASE_S=30 it_setup "$1" 1000000 "$2" \
    '"compression": {"kind": "sketch", "rows": 3, "cols": 2000, "dtype": "F32", "second_round": 0},
     "staleness": {"max": 1000000}, "robust": {"rule": "mean"},'
  IT_SERVE_ARGS="--peer-rate 0 --addr-rate 0"
  it_start_coordinator
  local i
  for i in $(seq 1 "$3"); do it_peer "$i"; done
}

# it_storm_clients N: the upload storm, from peers 1 to N in the
# background (PIDS): the ingest benchmark's client ($INGEST), which logs
# each acknowledgement to acksI.txt as it arrives (it_check_acked).
it_storm_clients() {
  local i
  for i in $(seq 1 "$1"); do
    "$INGEST" client --dir "peer$i" --seconds 0 --out "client$i.txt" --log-acks "acks$i.txt" \
      2> "client$i.log" &
    PIDS+=($!)
  done
}

# it_restart_midway VERSION: once the run has reached VERSION, stops the
# coordinator (SIGTERM) and serves the database again on the same port;
# then waits for every peer in PIDS to finish the run.
it_restart_midway() {
  for _ in $(seq 1 900); do
    [ "$(q 'SELECT current_version FROM run')" -ge "$1" ] && break
    sleep 0.1
  done
  [ "$(q 'SELECT current_version FROM run')" -ge "$1" ] || fail "the run did not reach version $1"
  it_stop_coordinator
  it_serve_again
  for p in "${PIDS[@]}"; do
    wait "$p" || fail "a peer did not survive the restart"
  done
  PIDS=()
}

# it_check_accuracy MIN: a classifier run's test accuracy (from the
# coordinator's logs) rose from version 0's (init.log) to a best of at
# least MIN, and the last version stays 0.3 above the start. A version
# made of one fast peer's skewed updates may dip (peers that backed off
# during a restart come back later), hence the bar on the best. Sets
# ACC0 and ACC.
it_check_accuracy() {
  ACC0=$(grep -o 'accuracy [0-9.]*' init.log | tail -n1 | cut -d' ' -f2)
  ACC=$(grep -o 'test accuracy [0-9.]*' coordinator.log | tail -n1 | cut -d' ' -f3)
  local best
  best=$(cat coordinator*.log | grep -o 'test accuracy [0-9.]*' | cut -d' ' -f3 | sort -g | tail -n1)
  [ -n "$ACC" ] || fail "no version reported its test accuracy"
  awk -v a="$ACC" -v b="$best" -v z="$ACC0" -v m="$1" 'BEGIN { exit !(b >= m && a >= z + 0.3) }' \
    || fail "test accuracy went from $ACC0 to $ACC (best $best); expected a best of at least $1 and a last at least 0.3 above the start"
}
