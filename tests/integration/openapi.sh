#!/usr/bin/env bash
# docs/openapi.yaml describes the coordinator as it is. The spec must pass
# openapi-spec-validator (from PyPI, pinned, in the tests' Python
# environment, VOLLEY_PYENV); its endpoints must be exactly the route
# table's (coordinator/server.c), the admin listener's and docs/protocol.md's
# sections; every status and error code the handlers answer (followed
# through their calls in the source) must be listed on the operation; and a
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
# The same spec less an endpoint, a code and a status: each is reported,
# and nothing else.
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
EXPECTED
while IFS= read -r line; do
  grep -qF "$line" reported.txt || { cat pruned.txt; fail "the checker did not report: $line"; }
done < expected.txt
[ "$(wc -l < reported.txt)" = 4 ] || { cat pruned.txt; fail "the checker reported more than the 4 faults"; }
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
