#!/usr/bin/env bash
# A stored update whose body the disk lost must not stop the run.
#
# Peer 1 uploads its update for version 0 (stored, waiting for a second).
# The coordinator stops, and the segment file holding the body is cut to
# nothing, as a disk fault would leave it. Restarted, the coordinator
# makes version 1 when peer 2's update comes: peer 1's is set aside with a
# log line naming it and marked merged (never offered again), and the run
# goes on to its end with every update merged exactly once. Before, every
# merge failed on the unreadable body and was retried every 5 s forever.
source "$(dirname "$0")/lib.sh"
VERSIONS=3
it_setup itlost "$VERSIONS" 2
it_start_coordinator
it_peer 1
it_peer 2
"$PEER" run --dir peer1 --threads 1 --wait 5 --retries 20 --max-tasks 1 2> peer1.log \
  || fail "peer 1's first task"
[ "$(q 'SELECT count(*) FROM updates')" = 1 ] || fail "peer 1's update is not stored"
lost=$(q 'SELECT id FROM updates')
it_stop_coordinator
ls run.db-bodies/*.seg > /dev/null || fail "no segment file holds the body"
for f in run.db-bodies/*.seg; do : > "$f"; done

it_serve_again
for i in 1 2; do
  "$PEER" run --dir "peer$i" --threads 1 --wait 5 --retries 20 2>> "peer$i.log" &
  PIDS+=($!)
done
it_wait_finished 600 "the run did not finish past the lost body"
it_stop_peers
it_stop_coordinator
[ "$(q 'PRAGMA integrity_check')" = ok ] || fail "integrity_check"
[ "$(q "SELECT merged_version FROM updates WHERE id = $lost")" = 1 ] \
  || fail "the lost update was not set aside in version 1"
grep -q "update $lost of peer [0-9]* is left out of version 1" coordinator.log \
  || fail "no log line names the set-aside update"
[ "$(q 'SELECT count(*) FROM updates WHERE merged_version IS NULL')" = 0 ] || fail "unmerged updates"
[ "$(q 'SELECT count(*) FROM versions')" = $((VERSIONS + 1)) ] || fail "versions missing"
echo "lost_body: update $lost's body cut from its segment; set aside in version 1, the run finished"
echo "1 passed, 0 failed"
