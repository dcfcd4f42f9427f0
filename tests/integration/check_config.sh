#!/usr/bin/env bash
# `volley-coordinator check --config FILE`: a configuration and its data
# checked as init would check them, without a database. A good one prints
# the resolved configuration (JSON, every default filled in) and a summary
# whose figures must agree with it; a bad one gets one line and exit 1;
# a wrong command line exit 2; and nothing is ever written.
source "$(dirname "$0")/lib.sh"
IT_MODE=async IT_OUTER=default it_setup itcheck 5 2 '"compression": {"kind": "topk", "ratio": 100},'
rm -f run.db run.db-* # from it_setup's init: nothing below may make one
"$COORD" check --config run.json > out.txt 2> err.txt || fail "check --config: $(cat err.txt)"
head -n 1 out.txt | python3 -c '
import json, sys
c = json.loads(sys.stdin.readline())
assert c["mode"] == "async" and c["updates_per_version"] == 2, c
assert c["compression"]["kind"] == "topk" and c["compression"]["k"] > 0, c["compression"]
assert c["outer"]["lr"] > 0 and "delay" in c["outer"], c    # filled in
assert "staleness" in c and c["staleness"]["max"] > 0, c
assert c["corpus"].startswith("/"), c["corpus"]   # made absolute
print(c["compression"]["k"])' > k.txt || fail "the resolved configuration: $(head -c 300 out.txt)"
k=$(cat k.txt)
grep -q "^updates: topk, k $k in " out.txt || fail "summary does not name k $k: $(cat out.txt)"
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
echo "check_config: k $k, $n parameters, ${ratio}x smaller than dense F32; 6 bad inputs refused"
echo "1 passed, 0 failed"
