#!/usr/bin/env bash
# `volley-coordinator check --config FILE`: a configuration and its data
# checked as init would check them, without a database. A good one prints
# the resolved configuration (indented JSON, every default filled in), a
# summary whose figures must agree with it, and one line for each value
# it normalised (what was given, what it became); it says on stderr what
# it reads and how long init will take to score version 0, as init says
# before and after it scores; a bad one gets one line and exit 1; a wrong
# command line exit 2; and nothing is ever written.
source "$(dirname "$0")/lib.sh"
IT_MODE=async IT_OUTER=default it_setup itcheck 5 2 '"compression": {"kind": "topk", "ratio": 100},'
# val_batches 4 of 8 windows of 32 bytes: 1024 held-out bytes scored.
grep -q "scoring version 0 on 1024 held-out bytes (\(about\|less than\) [0-9.]* s on this machine)\.\.\." init.log \
  || fail "init does not say what it scores: $(cat init.log)"
grep -q "scored version 0 in [0-9.]* s (estimated \(about\|less than\) [0-9.]* s)" init.log \
  || fail "init does not say how long scoring took: $(cat init.log)"
grep -q "read and checked corpus $WORK/corpus.txt ([0-9.]* KB) in [0-9.]* s" init.log \
  || fail "init does not say what it read: $(cat init.log)"
# Below 16 MiB the data are named once read, so a refusal stays one line.
! grep -q "reading corpus" init.log || fail "a small corpus announced: $(cat init.log)"
rm -f run.db run.db-* # from it_setup's init: nothing below may make one
"$COORD" check --config run.json > out.txt 2> err.txt || fail "check --config: $(cat err.txt)"
grep -q "read and checked corpus $WORK/corpus.txt ([0-9.]* KB) in [0-9.]* s" err.txt \
  || fail "check does not say what it read: $(cat err.txt)"
grep -q "init will score version 0 on 1024 held-out bytes (\(about\|less than\) [0-9.]* s on this machine)" \
  err.txt || fail "check does not say what init will score: $(cat err.txt)"
sed -n 2p out.txt | grep -q '^  "name": "itcheck",$' || fail "not indented JSON: $(head -n 3 out.txt)"
! grep -q '^normalised' out.txt || fail "nothing was normalised: $(grep '^normalised' out.txt)"
python3 -c '
import json, sys
c, end = json.JSONDecoder().raw_decode(open("out.txt").read())
assert c["mode"] == "async" and c["updates_per_version"] == 2, c
assert c["compression"]["kind"] == "topk" and c["compression"]["k"] > 0, c["compression"]
assert c["outer"]["lr"] > 0 and "delay" in c["outer"], c    # filled in
assert "staleness" in c and c["staleness"]["max"] > 0, c
assert c["corpus"].startswith("/"), c["corpus"]   # made absolute
print(c["compression"]["k"])' > k.txt || fail "the resolved configuration: $(head -c 300 out.txt)"
# A corpus of 16 MiB or more is announced before it is read.
for _ in $(seq 1 80); do cat corpus.txt; done > big.txt
sed "s#$WORK/corpus.txt#$WORK/big.txt#" run.json > big.json
"$COORD" check --config big.json > big.out 2> big.err || fail "big corpus: $(cat big.err)"
grep -q "reading corpus $WORK/big.txt (1[0-9]\.[0-9] MB)\.\.\." big.err \
  || fail "a large corpus is not announced: $(cat big.err)"
[ "$(grep -n 'reading corpus' big.err | cut -d: -f1)" -lt "$(grep -n 'read and checked' big.err | cut -d: -f1)" ] \
  || fail "announced after it was read: $(cat big.err)"
announced=$(grep -o "reading corpus [^ ]* ([^)]*)" big.err)
rm -f big.txt
# The older name of dense updates, and a corpus relative to the file.
sed -e 's/"kind": "topk", "ratio": 100/"kind": "dense"/' -e "s#$WORK/corpus.txt#corpus.txt#" \
  run.json > dense.json
"$COORD" check --config dense.json > dense.out 2> dense.err || fail "dense: $(cat dense.err)"
grep '^normalised' dense.out > notes.txt || true
[ "$(wc -l < notes.txt)" = 2 ] || fail "want 2 normalisations, got: $(cat notes.txt)"
grep -qx 'normalised compression.kind: "dense" became "none"' notes.txt \
  || fail "dense not named: $(cat notes.txt)"
grep -qx "normalised corpus: \"corpus.txt\" became \"$WORK/corpus.txt\"" notes.txt \
  || fail "corpus path not named: $(cat notes.txt)"
k=$(cat k.txt)
grep -q "^updates: topk, k $k in " out.txt || fail "summary does not name k $k: $(cat out.txt)"
# One line per field, from the table: given, a default, or chosen from the rest.
grep -qx 'field mode = "async" (given)' out.txt || fail "mode not listed as given: $(grep '^field' out.txt | head)"
grep -qx "field compression.k = $k (chosen)" out.txt || fail "k not listed as chosen: $(grep '^field comp' out.txt)"
grep -qx 'field train.beta2 = 0.95 (default)' out.txt || fail "beta2 not listed as default: $(grep '^field train' out.txt)"
! grep -q '^field train.kfac' out.txt || fail "K-FAC fields listed for an AdamW run"
[ "$(grep -c '^field ' out.txt)" -gt 50 ] || fail "too few fields listed: $(grep -c '^field ' out.txt)"
n=$(sed -n 's/^model: \([0-9]*\) parameters.*/\1/p' out.txt)
[ "$n" = 21984 ] || fail "model size $n, want 21984"
ratio=$(sed -n 's/.*(\([0-9.]*\)x smaller.*/\1/p' out.txt)
awk -v r="$ratio" 'BEGIN { exit !(r > 95 && r < 105) }' || fail "ratio $ratio for ratio 100"

bad() { # bad LABEL WANT_RC FILE_ARGS...
  local label=$1 want=$2 rc=0
  shift 2
  "$COORD" check "$@" > bad.out 2> bad.err || rc=$?
  [ "$rc" = "$want" ] || fail "$label: exit $rc, want $want ($(cat bad.err))"
  [ "$(wc -l < bad.err)" = 1 ] || fail "$label: want one line, got: $(cat bad.err)"
  [ ! -s bad.out ] || fail "$label printed to stdout: $(cat bad.out)"
}
sed 's/"seed": 7,/"seed": 7, "sede": 1,/' run.json > unknown.json
bad "unknown field" 1 --config unknown.json
grep -q sede bad.err || fail "the unknown field is not named: $(cat bad.err)"
sed "s#$WORK/corpus.txt#$WORK/no-such-corpus.txt#" run.json > nocorpus.json
bad "missing corpus" 1 --config nocorpus.json
grep -q no-such-corpus bad.err || fail "the missing corpus is not named: $(cat bad.err)"
printf '{"name": "tiny", "corpus": "%s"}' "$WORK/tiny.txt" > tiny.json
printf 'too short' > tiny.txt
bad "corpus too small for the model" 1 --config tiny.json
bad "no such file" 1 --config "$WORK/absent.json"
bad "both --db and --config" 2 --config run.json --db run.db
bad "neither" 2
[ -z "$(ls run.db* 2> /dev/null)" ] || fail "check made a database: $(ls run.db*)"
echo "check_config: k $k, $n parameters, ${ratio}x smaller than dense F32; 6 bad inputs refused;" \
  "$(wc -l < notes.txt) normalisations named; $(grep -o 'init will score.*' err.txt);" \
  "$announced"
echo "1 passed, 0 failed"
