#!/usr/bin/env bash
# A peer whose updates the coordinator turns down for what they hold
# (422 norm_exceeded here; non_finite and bad_loss alike) goes on with its
# next task, and stops only after 5 such refusals in a row.
#
# The run (async, top-k, robust.max_norm 1e-9 with on_excess "refuse")
# refuses every update. Phase 1: `--max-tasks 3` ends cleanly after three
# tasks, each update refused and logged as such (before, the first refusal
# ended the peer). Phase 2: the same peer without a task limit gives up
# after the fifth refusal in a row with exit status 3 and says why.
# Nothing refused is stored, and no version is made. Leases last 10
# minutes: the coordinator ends a refused task's lease before it answers
# the refusal, so the peer never waits one out and leaves none behind
# (the peer's own ?release= then finds nothing to release); the peers
# run under a timeout of 2 minutes, so a wait would fail the test.
# Phase 0: a client that never releases anything (volley_attack, one
# upload of a valid update, refused for its norm) leaves its task
# expired at once all the same.
source "$(dirname "$0")/lib.sh"
ATTACK=${ATTACK:?}

IT_MODE=async IT_LEASE_S=600 it_setup itjudged 5 1 \
  '"robust": {"max_norm": 1e-9, "on_excess": "refuse"}, "compression": {"kind": "topk", "ratio": 20},'
it_start_coordinator
it_peer 1
run() { timeout 120 "$PEER" run --dir peer1 --threads 1 --wait 5 --retries 20 "$@"; }
# Leases the coordinator ended at a refusal, and those a peer released.
ended() { grep -c "was refused ([a-z_]*); the lease ends" coordinator.log || true; }
released() { grep -c "released task" coordinator.log || true; }

# ---- phase 0
token=$("$COORD" token create --db run.db --uses 1 --ttl 1h)
mkdir -p atk
"$ATTACK" prepare "$URL" tls/ca.pem atk "$token" "vlt_$(printf '%064d' 0)" > prepare.log 2>&1 \
  || { cat prepare.log; fail "prepare"; }
atask=$(q "SELECT max(id) FROM tasks")
[ "$(q "SELECT state FROM tasks WHERE id = $atask")" = leased ] || fail "phase 0: no lease taken"
"$ATTACK" late "$URL" tls/ca.pem atk 422 norm_exceeded > late.log 2>&1 \
  || { cat late.log; fail "phase 0: the upload was not refused with 422 norm_exceeded"; }
# Answered after the lease ended: nothing to wait for.
[ "$(q "SELECT state FROM tasks WHERE id = $atask")" = expired ] \
  || fail "phase 0: the refused task is $(q "SELECT state FROM tasks WHERE id = $atask"), not expired"
[ "$(ended)" = 1 ] || fail "phase 0: $(ended) leases ended at a refusal, want 1"

# ---- phase 1
run --max-tasks 3 2> peer1a.log || { tail -5 peer1a.log; fail "peer 1 stopped at a refused update"; }
refused=$(grep -c "; going on with the next task" peer1a.log || true)
[ "$refused" = 3 ] || { tail -8 peer1a.log; fail "phase 1: $refused refusals gone past, want 3"; }
grep -q "done: 3 tasks" peer1a.log || fail "phase 1: the peer did not finish its 3 tasks"
# Each refused task's lease ended with its refusal, the third's too.
[ "$(ended)" = 4 ] || fail "phase 1: $(ended) leases ended at a refusal in all, want 4"
[ "$(released)" = 0 ] || fail "phase 1: $(released) leases were still held for the peer to release"
grep -q "task [0-9]* released: its data go to another peer" peer1a.log \
  || fail "phase 1: the peer did not release its last task as it left"

# ---- phase 2
set +e
run 2> peer1b.log
status=$?
set -e
[ "$status" = 3 ] || { tail -5 peer1b.log; fail "phase 2: exit status $status, want 3"; }
grep -q "giving up after 5 updates in a row refused for what they held; the last: upload refused: 422 norm_exceeded" peer1b.log \
  || { tail -3 peer1b.log; fail "phase 2: the peer did not say why it stopped"; }
[ "$(grep -c "; going on with the next task" peer1b.log)" = 4 ] || fail "phase 2: want 4 refusals gone past"
[ "$(ended)" = 9 ] || fail "phase 2: $(ended) leases ended at a refusal in all, want 9"
[ "$(released)" = 0 ] || fail "phase 2: $(released) leases were still held for the peer to release"
[ "$(q "SELECT count(*) FROM tasks WHERE state = 'expired'")" = 9 ] \
  || fail "the released tasks are not freed: $(q 'SELECT group_concat(state) FROM tasks')"

[ "$(q 'SELECT count(*) FROM updates')" = 0 ] || fail "a refused update was stored"
[ "$(q 'SELECT count(*) FROM versions')" = 1 ] || fail "a version was made from nothing"
echo "judged: a refused task expired at once; 3 refused updates gone past, then 5 in a row ended the peer (status 3); each refused lease ended by the coordinator, nothing stored"
