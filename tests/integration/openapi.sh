#!/usr/bin/env bash
# docs/openapi.yaml describes the coordinator as it is. The spec must pass
# openapi-spec-validator (from PyPI, pinned, in the tests' Python
# environment, VOLLEY_PYENV); its endpoints must be exactly the route
# table's (coordinator/base/routes.c), the admin listener's and docs/protocol.md's
# sections; every status and error code the handlers answer (followed
# through their calls in the source) must be listed on the operation, and
# every (status, code) pair sent anywhere must be in docs/protocol.md's
# error table and the spec, and each of theirs sent somewhere; and a
# running coordinator must serve every operation, answer 405 with the
# spec's Allow for every other method on those paths and 404 not_found for
# paths the spec does not have, with bodies of the spec's schemas. The
# validator and the checker are each shown to refuse a spec that is wrong.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/pyenv.sh"
it_pyenv "openapi-spec-validator==0.9.0"
PY="$PYENV/bin/python"
SPEC="$ROOT/docs/openapi.yaml"
CHECK="$ROOT/tests/integration/openapi_check.py"
cd "$WORK"
passed=0

echo "== the spec is valid OpenAPI"
"$PY" -m openapi_spec_validator --schema 3.1 "$SPEC" \
  || fail "docs/openapi.yaml is not a valid OpenAPI 3.1 description"
sed 's|#/components/responses/TooLarge|#/components/responses/NoSuchResponse|' "$SPEC" > dangling.yaml
if "$PY" -m openapi_spec_validator --schema 3.1 dangling.yaml > dangling.txt 2>&1; then
  fail "the validator passed a spec with a dangling \$ref"
fi
passed=$((passed + 1))

echo "== the spec against the source"
"$PY" "$CHECK" static "$ROOT" || fail "docs/openapi.yaml and the coordinator's source disagree"
# The same spec less an endpoint, a code and a status: each is reported
# (the endpoint's and the code's also as codes sent that the spec lists
# nowhere), and nothing else.
"$PY" - "$SPEC" > pruned.yaml <<'PRUNE'
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))
del spec["paths"]["/v1/factors"]
code = spec["paths"]["/v1/updates"]["post"]["responses"]["409"]["content"]["application/json"]
code["schema"]["properties"]["error"]["properties"]["code"]["enum"].remove("stale_update")
del spec["paths"]["/v1/model"]["get"]["responses"]["304"]
print(yaml.safe_dump(spec, sort_keys=False))
PRUNE
if "$PY" "$CHECK" static "$ROOT" pruned.yaml > pruned.txt 2>&1; then
  fail "the checker passed a spec without GET /v1/factors"
fi
grep '^  ' pruned.txt | sed 's/^  //' > reported.txt
cat > expected.txt <<'EXPECTED'
served but not in the spec: GET /v1/factors
docs/protocol.md has a section on GET /v1/factors, which the spec lacks
GET /v1/model (coord_route_model): the source answers 304; the spec has no 304
POST /v1/updates (coord_route_updates): the source answers 409 stale_update
sent by routes_factors.c but listed on no operation of the spec: 404 unknown_factors
sent by routes_updates.c but listed on no operation of the spec: 409 stale_update
EXPECTED
while IFS= read -r line; do
  grep -qF "$line" reported.txt || { cat pruned.txt; fail "the checker did not report: $line"; }
done < expected.txt
[ "$(wc -l < reported.txt)" = 6 ] || { cat pruned.txt; fail "the checker reported more than the 6 faults"; }
passed=$((passed + 1))

echo "== the error table, the spec and the codes sent, both ways"
# A scratch root: the sources linked, docs/ copied. A row in the table
# that nothing sends, a code in the spec that nothing sends (reported
# also on its operation), and a code sent (in a function of its own,
# which no route reaches) that neither lists: each reported, and nothing
# else.
mkdir -p scratch/docs
for d in compress common; do ln -s "$ROOT/$d" "scratch/$d"; done
cp -r "$ROOT/coordinator" scratch/coordinator
cp "$ROOT"/docs/protocol.md "$ROOT"/docs/openapi.yaml scratch/docs/
rm scratch/coordinator/ops/status.c
{ cat "$ROOT/coordinator/ops/status.c"
  printf 'void coord_bogus_teapot(coord_req *cr) {\n'
  printf '    coord_reply_error(cr,\n                      418, "teapot", "short and stout");\n}\n'
} > scratch/coordinator/ops/status.c
"$PY" - scratch/docs/protocol.md <<'ROW'
import sys
p = sys.argv[1]
text = open(p, encoding="utf-8").read()
row = "| 500 | `internal` |"
assert row in text, "no 500 row in the error table"
open(p, "w", encoding="utf-8").write(text.replace(row, row + "\n| 507 | `no_room_here` |", 1))
ROW
"$PY" - scratch/docs/openapi.yaml > bogus.yaml <<'CODE'
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))
code = spec["paths"]["/v1/updates"]["post"]["responses"]["409"]["content"]["application/json"]
code["schema"]["properties"]["error"]["properties"]["code"]["enum"].append("stale_teapot")
print(yaml.safe_dump(spec, sort_keys=False))
CODE
mv bogus.yaml scratch/docs/openapi.yaml
if "$PY" "$CHECK" static scratch > bogus.txt 2>&1; then
  fail "the checker passed a bogus table row, spec code and sent code"
fi
grep '^  ' bogus.txt | sed 's/^  //' > reported.txt
cat > expected.txt <<'EXPECTED'
sent by status.c but not in docs/protocol.md's error table: 418 teapot
in docs/protocol.md's error table but sent by no source: 507 no_room_here
sent by status.c but listed on no operation of the spec: 418 teapot
listed in the spec but sent by no source: 409 stale_teapot
POST /v1/updates (coord_route_updates): the spec's 409 lists stale_teapot, which the source never answers
EXPECTED
while IFS= read -r line; do
  grep -qF "$line" reported.txt || { cat bogus.txt; fail "the checker did not report: $line"; }
done < expected.txt
[ "$(wc -l < reported.txt)" = 5 ] || { cat bogus.txt; fail "the checker reported more than the 5 faults"; }
passed=$((passed + 1))

echo "== the spec against a running coordinator"
it_setup itoapi 2 2
IT_SERVE_ARGS="--admin-listen 127.0.0.1:0" it_start_coordinator
admin=$(it_admin_url)
"$PY" "$CHECK" probe "$ROOT" "$URL" tls/ca.pem "$admin" \
  || fail "the running coordinator does not answer as docs/openapi.yaml says"
# A spec with an endpoint the coordinator does not have, and one under
# the wrong method: both reported.
"$PY" - "$SPEC" > moved.yaml <<'MOVE'
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))
spec["paths"]["/v1/state"] = spec["paths"].pop("/v1/status")
spec["paths"]["/v1/model"] = {"post": spec["paths"]["/v1/model"]["get"]}
print(yaml.safe_dump(spec, sort_keys=False))
MOVE
if "$PY" "$CHECK" probe "$ROOT" "$URL" tls/ca.pem "$admin" moved.yaml > moved.txt 2>&1; then
  fail "the probe passed a spec with GET /v1/state"
fi
grep -qF "GET /v1/state: in the spec but answered 404 not_found" moved.txt \
  || { cat moved.txt; fail "the probe did not report GET /v1/state"; }
grep -qF "POST /v1/model: in the spec but answered 405 method_not_allowed" moved.txt \
  || { cat moved.txt; fail "the probe did not report POST /v1/model"; }
it_stop_coordinator
passed=$((passed + 1))
echo "$passed passed, 0 failed"
