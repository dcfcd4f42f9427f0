#!/usr/bin/env bash
# A peer that cannot record its upload in its directory (a full disk,
# played by VOLLEY_PEER_FAULT=pending-full, which fails the write of
# DIR/pending.st with ENOSPC) hands its task back at once instead of
# holding the lease to its deadline, says why and what to do in its last
# line and exits 1, leaving no record behind; started again with room,
# it trains and its update is accepted.
source "$(dirname "$0")/lib.sh"
it_setup itfulldir 1 1
it_start_coordinator
it_peer 1
rc=0
VOLLEY_PEER_FAULT=pending-full "$PEER" run --dir peer1 --threads 1 --wait 5 --max-tasks 1 \
  2> full.log || rc=$?
[ "$rc" = 1 ] || fail "a peer that cannot record its upload exited with $rc, not 1"
tail -n 1 full.log | grep -q "^volley-peer: cannot record the upload of task [0-9]*: No space left on device (VOLLEY_PEER_FAULT); task [0-9]* handed back for another peer to train; free space in peer1 or make it writable, then start again$" \
  || fail "the last line does not say why and what was done: $(tail -n 1 full.log)"
grep -q "task [0-9]* released: its data go to another peer" full.log || fail "no release said"
[ "$(q "SELECT count(*) FROM tasks WHERE peer_id = 1 AND state = 'leased'")" = 0 ] \
  || fail "the task is still leased: $(q 'SELECT id, state FROM tasks')"
[ "$(q "SELECT count(*) FROM tasks WHERE peer_id = 1 AND state = 'expired'")" = 1 ] \
  || fail "the task was not handed back: $(q 'SELECT id, state FROM tasks')"
[ ! -e peer1/pending.st ] || fail "a record was left behind"
[ "$(q 'SELECT count(*) FROM updates')" = 0 ] || fail "an update was sent"
"$PEER" run --dir peer1 --threads 1 --wait 5 --max-tasks 1 2> again.log \
  || fail "the peer did not train once it had room: $(tail -n 3 again.log)"
[ "$(q 'SELECT count(*) FROM updates')" = 1 ] || fail "no update after the restart"
it_stop_coordinator
echo "1 passed, 0 failed"
