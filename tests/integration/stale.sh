#!/usr/bin/env bash
# Late and stale uploads through the real server, in sync mode.
#
# Phase 1 (one update per version, leases of 2 s, staleness.max 2): a client
# takes a lease on version 0 and goes quiet. The lease expires and a real
# peer's next task redoes its data. The late upload then still arrives: it
# is accepted as a stale update (staleness 1), merged exactly once into
# the next version together with that version's fresh update, and a second
# copy is refused as a duplicate. A lease on version 2 answered only after
# version 5 (staleness 3 > 2) is refused with 409 stale_update and changes
# nothing stored.
#
# Phase 2 (two updates per version, round_deadline_s 2): one peer alone
# uploads; its version closes at the deadline with the one update it has.
#
# Phase 3: a client holding a lease of a one-version run uploads after
# the run has finished: 410 run_finished, nothing stored.
#
# Phase 4: a new peer sends 8 task requests at once in a run with 8
# slots: one lease is written, and all 8 are answered with it.
#
# Phase 5: a signed request is captured, the coordinator restarts, and the
# request sent again is refused as a replay (the nonce journal).
source "$(dirname "$0")/lib.sh"
ATTACK=${ATTACK:?}

# wait_version V: until the run's current version is at least V.
wait_version() {
  for _ in $(seq 1 300); do
    [ "$(q 'SELECT current_version FROM run')" -ge "$1" ] && return 0
    sleep 0.05
  done
  fail "the run did not reach version $1"
}
# prepare_attacker: the attack client joins and takes a lease (in atk/).
prepare_attacker() {
  local token
  token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
  mkdir -p atk
  "$ATTACK" prepare "$URL" tls/ca.pem atk "$token" "vlt_$(printf '%064d' 0)" > prepare.log 2>&1 \
    || { cat prepare.log; fail "prepare"; }
}
run_peer() { # run_peer TASKS: peer 1 does TASKS tasks and exits
  "$PEER" run --dir peer1 --threads 1 --wait 5 --retries 20 --max-tasks "$1" 2>> peer1.log \
    || fail "peer 1 exited with an error"
}

# ---- phase 1
IT_LEASE_S=2 it_setup itstale 20 1 '"staleness": {"max": 2},'
it_start_coordinator
it_peer 1
prepare_attacker
late_task=$(q "SELECT id FROM tasks WHERE state = 'leased'")
[ -n "$late_task" ] || fail "the client holds no lease"
sleep 2.5 # the lease expires
run_peer 1
wait_version 1
[ "$(q "SELECT count(*) FROM tasks WHERE reissue_of = $late_task")" = 1 ] \
  || fail "the expired task's data was not handed to the peer's task"

"$ATTACK" late "$URL" tls/ca.pem atk 202 | tee late.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "the late upload was not accepted"
[ "$(q "SELECT staleness FROM updates WHERE task_id = $late_task")" = 1 ] \
  || fail "the late upload is not recorded with staleness 1"
run_peer 1
wait_version 2
[ "$(q "SELECT merged_version FROM updates WHERE task_id = $late_task")" = 2 ] \
  || fail "the late update was not merged into version 2"
[ "$(q 'SELECT num_updates FROM versions WHERE version = 2')" = 2 ] \
  || fail "version 2 does not hold its fresh update and the late one"
before=$(it_snapshot)
"$ATTACK" late "$URL" tls/ca.pem atk 409 duplicate_update | tee -a late.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "a second copy of the late upload was not refused as a duplicate"
[ "$before" = "$(it_snapshot)" ] || fail "the refused duplicate changed the database"

# A lease on version 2, answered three versions later.
"$ATTACK" lease "$URL" tls/ca.pem atk > lease.log 2>&1 || { cat lease.log; fail "lease"; }
sleep 2.5
run_peer 3
wait_version 5
before=$(it_snapshot)
"$ATTACK" late "$URL" tls/ca.pem atk 409 stale_update | tee -a late.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "an upload 3 versions stale was not refused"
after=$(it_snapshot)
[ "$before" = "$after" ] || { diff <(echo "$before") <(echo "$after") >&2; fail "the refused upload changed the database"; }
[ "$(q 'SELECT count(*) FROM (SELECT task_id FROM updates GROUP BY task_id HAVING count(*) > 1)')" = 0 ] \
  || fail "a task has two updates"
[ "$(q 'SELECT count(*) FROM updates WHERE merged_version IS NULL')" = 0 ] || fail "unmerged updates"
it_stop_coordinator
echo "stale: a late upload (staleness 1) merged once into version 2; its copy and a 3-versions-stale upload refused"

# ---- phase 2: a fresh run whose versions wait at most 2 s
mkdir phase1
mv run.db ./*.log peer1 atk phase1/
rm -f run.db-wal run.db-shm
it_setup itdeadline 3 2 '"round_deadline_s": 2,'
it_start_coordinator
it_peer 1
run_peer 1
wait_version 1
# The deadline runs from version 0's birth, which is no earlier than its
# stored time (whole seconds), so version 1 is stored at least 2 s later;
# timing the test's own steps instead raced with a loaded machine.
took=$(q 'SELECT v1.created_at - v0.created_at FROM versions v0, versions v1
          WHERE v0.version = 0 AND v1.version = 1')
[ "$(q 'SELECT num_updates FROM versions WHERE version = 1')" = 1 ] \
  || fail "version 1 did not close at its deadline with the one update it had"
[ "$took" -ge 2 ] || fail "version 1 was stored ${took} s after version 0, before its deadline"
it_stop_coordinator
echo "stale: a sync version with 1 of 2 updates closed at its 2 s deadline (${took} s after version 0)"

# ---- phase 3: an upload after the run's last version is refused with 410
mkdir phase2
mv run.db ./*.log peer1 phase2/
rm -f run.db-wal run.db-shm
it_setup itfinished 1 2 '"round_deadline_s": 2,'
it_start_coordinator
it_peer 1
prepare_attacker
run_peer 1
wait_version 1
[ "$(q 'SELECT status FROM run')" = finished ] || fail "the one-version run did not finish"
before=$(it_snapshot)
"$ATTACK" late "$URL" tls/ca.pem atk 410 run_finished | tee -a late.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "an upload after the last version was not refused with 410"
[ "$before" = "$(it_snapshot)" ] || fail "the refused upload changed the database"
it_stop_coordinator
echo "stale: an upload after the run finished refused with 410 run_finished, nothing stored"

# ---- phase 4: one peer's simultaneous task requests share one lease
mkdir phase3
mv run.db ./*.log peer1 atk phase3/
rm -f run.db-wal run.db-shm
it_setup itburst 2 8
it_start_coordinator
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
mkdir -p atk
"$ATTACK" burst "$URL" tls/ca.pem atk "$token" 8 | tee burst.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "simultaneous task requests of one peer got more than one lease"
[ "$(q 'SELECT count(*) FROM tasks')" = 1 ] || fail "$(q 'SELECT count(*) FROM tasks') leases were written for one peer"
it_stop_coordinator
echo "stale: 8 simultaneous task requests of one peer answered with its one lease"

# ---- phase 5: a request captured before a restart is still a replay after it
mkdir phase4
mv run.db ./*.log atk phase4/
rm -f run.db-wal run.db-shm run.db-nonces run.db-nonces.old
it_setup itreplay 2 2
it_start_coordinator
prepare_attacker
"$ATTACK" capture "$URL" tls/ca.pem atk captured.hdr > capture.log 2>&1 \
  || { cat capture.log; fail "capture"; }
sleep 1.5 # the journal's once-a-second flush
it_stop_coordinator
it_serve_again
"$ATTACK" replay "$URL" tls/ca.pem atk captured.hdr 401 replayed_nonce | tee replay.log
[ "${PIPESTATUS[0]}" = 0 ] || fail "a request captured before the restart was accepted after it"
grep -q "nonces of the last" coordinator.log || fail "the restarted coordinator loaded no nonces"
it_stop_coordinator
echo "stale: a signed request captured before a restart refused after it (401 replayed_nonce)"
echo "1 passed, 0 failed"
