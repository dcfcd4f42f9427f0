#!/usr/bin/env python3
"""docs/openapi.yaml against the coordinator it describes.

  openapi_check.py static ROOT [SPEC]
      The spec (SPEC, default ROOT/docs/openapi.yaml) against the source:
      the route table of coordinator/base/routes.c (with the handlers server.c
      binds to it) and the paths the admin
      listener compares with (both directions), the endpoint headings of
      docs/protocol.md, and the statuses and error codes each handler can
      answer, found by following its calls through coordinator/**/*.c (and
      the decoders in compress/ and common/ that hand codes back). Then,
      over the whole source, every (status, code) pair any handler, the
      input guard or the signature check can send, against the error
      table of docs/protocol.md and the responses of the spec, both ways.

  openapi_check.py probe ROOT URL CAFILE ADMIN_URL [SPEC]
      The spec against a running coordinator: every operation's path and
      method is served (not 404 not_found, not 405), every other method on
      those paths is 405 with Allow naming the spec's, paths the spec does
      not have are 404 not_found, and every answer's status, error code
      and body are what the spec says for it.

Prints one line per finding and exits 1 if there is any.
"""
import http.client
import json
import os
import re
import ssl
import sys
import urllib.parse

import yaml
from jsonschema import Draft202012Validator

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# Answers about a path, not about an operation on it: listed once in the
# spec's description, never under an operation.
PATH_LEVEL = {(404, "not_found"), (405, "method_not_allowed")}
MEDIA = (415, "unsupported_media_type")
# Branches the source walk cannot tell apart from the route kind:
# - a join is signed by the key it registers, so signer_key's peer-id
#   branch (unknown_peer) and reserve_body (kind == COORD_AUTH_PEER only)
#   never answer it;
# - refuse_guarded's 401 fallback is for an authorize refusal without a
#   status, which an unsigned route never gets.
NOT_FOR_KIND = {
    "COORD_AUTH_JOIN": {(401, "unknown_peer"), (503, "overloaded")},
    "COORD_AUTH_NONE": {(401, "unauthorized")},
}
# Functions whose parameters carry the request being answered: following
# calls only into these keeps replies to other requests (waking waiters,
# say) out of a handler's answers.
REQUEST_PARAMS = ("coord_req *", "coord_job *", "coord_guard_refusal *",
                  "struct evhttp_request *")

findings = []


def finding(msg):
    findings.append(msg)
    print("  " + msg)


def load_spec(root, path=None):
    with open(path or os.path.join(root, "docs", "openapi.yaml"), encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    # A plain scalar in a flow mapping that holds ", " splits into a
    # second key with no value: the validator takes it as an unknown
    # keyword, so it is caught here.
    def walk(x, where):
        if isinstance(x, dict):
            for k, v in x.items():
                if v is None:
                    finding(f"spec: {where}/{k} has no value (an unquoted comma?)")
                walk(v, f"{where}/{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{where}/{i}")
    walk(spec, "")
    return spec


def deref(spec, obj):
    while isinstance(obj, dict) and "$ref" in obj and len(obj) == 1:
        node = spec
        for part in obj["$ref"].lstrip("#/").split("/"):
            node = node[part]
        obj = node
    return obj


def operations(spec):
    """(server, METHOD, path template) -> operation; server is 'public' or
    'admin' (a path with servers of its own, over plain HTTP)."""
    ops = {}
    for path, item in spec["paths"].items():
        servers = item.get("servers")
        where = "admin" if servers and servers[0]["url"].startswith("http://") else "public"
        for m in METHODS:
            if m in item:
                ops[(where, m.upper(), path)] = item[m]
    return ops


def response_codes(spec, op):
    """{status: set of codes} of an operation: the error codes its JSON
    body may carry, {None} for a JSON body that is not an Error with
    listed codes, empty for no JSON body."""
    out = {}
    for status, resp in op["responses"].items():
        resp = deref(spec, resp)
        codes = set()
        schema = resp.get("content", {}).get("application/json", {}).get("schema")
        if schema is not None:
            try:
                codes = set(schema["properties"]["error"]["properties"]["code"]["enum"])
            except (KeyError, TypeError):
                codes = {None}
        out[int(status)] = codes
    return out


def template_regex(path):
    return re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$")


# ---- the C source ---------------------------------------------------------------

def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def c_functions(path):
    """name -> {params, body, static, file} for the top-level definitions of
    a C file laid out as this project's are (clang-format: a definition
    starts at column 0 and its body ends at a '}' alone at column 0)."""
    lines = read(path).split("\n")
    funcs = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if (line and not line[0].isspace() and line[0] not in "#/}*" and "(" in line
                and "=" not in line.split("(")[0]):
            j = i
            head = line
            while not head.rstrip().endswith(("{", ";", "}")) and j + 1 < len(lines) and j - i < 8:
                j += 1
                head += " " + lines[j].strip()
            m = re.match(r"^(.*?)\b([A-Za-z_]\w*)\s*\((.*)\)\s*\{$", head.rstrip())
            if m and head.rstrip().endswith("{"):
                k = j + 1
                while k < len(lines) and lines[k] != "}":
                    k += 1
                funcs[m.group(2)] = {"params": m.group(3), "body": "\n".join(lines[j + 1:k]),
                                     "static": "static" in m.group(1).split(), "file": path}
                i = k
        i += 1
    return funcs


def call_args(body, name):
    """The argument lists (as lists of stripped strings) of every call of
    name in body."""
    calls = []
    for m in re.finditer(r"(?<![\w.>])" + re.escape(name) + r"\s*\(", body):
        depth, args, cur, k, quote = 1, [], "", m.end(), None
        while k < len(body) and depth:
            ch = body[k]
            if quote:
                cur += ch
                if ch == "\\":
                    cur += body[k + 1]
                    k += 1
                elif ch == quote:
                    quote = None
            elif ch in "\"'":
                quote = ch
                cur += ch
            elif ch == "(":
                depth += 1
                cur += ch
            elif ch == ")":
                depth -= 1
                if depth:
                    cur += ch
            elif ch == "," and depth == 1:
                args.append(cur.strip())
                cur = ""
            else:
                cur += ch
            k += 1
        args.append(cur.strip())
        calls.append(args)
    return calls


def in_coordinator(path):
    """Whether a source file is the coordinator's (any of its folders)."""
    return (os.sep + "coordinator" + os.sep) in os.path.normpath(path)


class Source:
    def __init__(self, root):
        self.funcs = {}  # (file, name) for statics, name for the others
        for sub in ("coordinator", "compress", "common"):
            for d, dirs, files in sorted(os.walk(os.path.join(root, sub), followlinks=True)):
                dirs.sort()
                for fn in sorted(files):
                    if fn.endswith(".c"):
                        for name, f in c_functions(os.path.join(d, fn)).items():
                            key = (f["file"], name) if f["static"] else name
                            self.funcs[key] = dict(f, name=name)
        self.wrappers = self._wrappers()

    def lookup(self, name, file):
        return self.funcs.get((file, name)) or self.funcs.get(name)

    def _wrappers(self):
        """name -> (status index, code index or None): the functions that
        send (or record for sending) an answer with the status and code
        they are given."""
        w = {"coord_reply": (1, None), "coord_reply_json": (1, None),
             "coord_reply_error": (1, 2), "evhttp_send_reply": (1, None)}
        changed = True
        while changed:
            changed = False
            for f in self.funcs.values():
                if f["name"] in w:
                    continue
                params = [p.strip() for p in f["params"].split(",")]
                names = [re.sub(r".*?(\w+)\s*(\[\])?$", r"\1", p) for p in params]
                if "status" not in names:
                    continue
                si = names.index("status")
                ci = names.index("code") if "code" in names else None
                # A refusal recorded for the answer to send later.
                if re.search(r"->status\s*=\s*status\s*;", f["body"]):
                    w[f["name"]] = (si, ci)
                    changed = True
                    continue
                for callee, (cs, _) in list(w.items()):
                    if any(len(a) > cs and a[cs] == "status" for a in call_args(f["body"], callee)):
                        w[f["name"]] = (si, ci)
                        changed = True
                        break
        return w

    def closure(self, start, file=None, stop=()):
        """The functions a start function reaches through calls (and
        callbacks assigned by name) into functions handed the request,
        not following into the functions named in stop."""
        if file:
            first = self.lookup(start, file)
        else:
            named = [f for f in self.funcs.values() if f["name"] == start]
            first = named[0] if len(named) == 1 else None
        if first is None:
            raise SystemExit(f"openapi_check: no function {start} in the source")
        seen, pending = {}, [first]
        while pending:
            f = pending.pop()
            key = (f["file"], f["name"])
            if key in seen:
                continue
            seen[key] = f
            refs = set(re.findall(r"(?<![\w.>])([A-Za-z_]\w*)\s*\(", f["body"]))
            refs |= set(re.findall(r"=\s*([A-Za-z_]\w*)\s*;", f["body"]))
            for name in refs:
                if name in stop:
                    continue
                g = self.lookup(name, f["file"])
                if (g and any(p in g["params"] for p in REQUEST_PARAMS)
                        and in_coordinator(g["file"])):
                    pending.append(g)
        return list(seen.values())

    def answers(self, funcs):
        """(status, code) pairs the functions answer; code None when it is
        not a literal. Plus the codes handed back through a code
        out-parameter by the decoders they call."""
        pairs, indirect = set(), set()
        for f in funcs:
            body = f["body"]
            for name, (si, ci) in self.wrappers.items():
                for args in call_args(body, name):
                    if len(args) <= si or not re.fullmatch(r"[1-5]\d\d", args[si]):
                        continue
                    code = None
                    if ci is not None and len(args) > ci:
                        lit = re.fullmatch(r'"([a-z_]+)"', args[ci])
                        code = lit.group(1) if lit else None
                    pairs.add((int(args[si]), code))
            for s in re.findall(r"\bstatus\s*=\s*([1-5]\d\d)\b", body):
                pairs.add((int(s), None))
            for s in re.findall(r"\breturn\s+([1-5]\d\d)\s*;", body):
                pairs.add((int(s), None))
            indirect |= self.codes_out(f["name"], f["file"], set(), entry=True)
        return pairs, indirect

    def codes_out(self, name, file, seen, entry=False):
        """The literal codes a function stores through its code
        out-parameter, itself or through the functions it hands a code
        variable to (entry: a handler, which has no such parameter and only
        hands its own on)."""
        f = self.lookup(name, file)
        if f is None or (f["file"], name) in seen:
            return set()
        if not entry and "**code" not in f["params"].replace(" ", ""):
            return set()
        seen.add((f["file"], name))
        out = set() if entry else set(re.findall(r'(?:\*code|\bc)\s*=\s*"([a-z_]+)"', f["body"]))
        for callee in set(re.findall(r"(?<![\w.>])([a-z_]\w*)\s*\(", f["body"])):
            if any(re.fullmatch(r"&?(?:\w*code|c)", a) for args in call_args(f["body"], callee)
                   for a in args):
                out |= self.codes_out(callee, f["file"], seen)
        return out


def route_table(root):
    """The public routes: the table's rows (coordinator/base/routes.c)
    joined with the handler the server binds to each (server.c)."""
    text = read(os.path.join(root, "coordinator", "base", "routes.c"))
    block = re.search(r"static const coord_route ROUTES\[COORD_ROUTE_COUNT\] = \{(.*?)\n\};", text, re.S)
    if not block:
        raise SystemExit("openapi_check: no ROUTES table in coordinator/base/routes.c")
    rows = re.findall(r'\[(COORD_ROUTE_\w+)\]\s*=\s*\{\s*"([^"]+)",\s*([01]),\s*EVHTTP_REQ_(\w+),\s*(\w+),'
                      r'\s*(\w+)\s*,\s*[01]\s*,\s*(?:NULL|"[^"]*")\s*,\s*[01]\s*\}', block.group(1))
    if not rows or len(rows) != block.group(1).count('= {"'):
        raise SystemExit("openapi_check: a row of the ROUTES table did not parse")
    srv = read(os.path.join(root, "coordinator", "server.c"))
    hblock = re.search(r"static const coord_handler HANDLERS\[COORD_ROUTE_COUNT\] = \{(.*?)\n\};", srv,
                       re.S)
    if not hblock:
        raise SystemExit("openapi_check: no HANDLERS table in coordinator/server.c")
    handlers = dict(re.findall(r"\[(COORD_ROUTE_\w+)\]\s*=\s*(\w+)", hblock.group(1)))
    auth = {"PEER": "COORD_AUTH_PEER"}
    out = []
    for rid, p, pre, m, media, a in rows:
        if rid not in handlers:
            raise SystemExit(f"openapi_check: no handler bound to {rid} in coordinator/server.c")
        out.append({"path": p, "prefix": pre == "1", "method": m, "media": media != "NULL",
                    "auth": auth.get(a, a), "fn": handlers[rid]})
    return out


def admin_routes(src):
    """(METHOD, path) the admin listener serves, from the paths and
    methods its callback compares the request with."""
    funcs = src.closure("admin_cb")
    body = "\n".join(f["body"] for f in funcs)
    paths = set(re.findall(r'strn?cmp\(\s*path\s*,\s*"(/[^"]*)"', body))
    methods = set(re.findall(r"EVHTTP_REQ_(\w+)", body)) or {"GET"}
    return {(m, p) for m in methods for p in paths}, funcs


def route_ops(route, ops):
    out = []
    for (where, m, path), op in ops.items():
        if where != "public" or m != route["method"]:
            continue
        if route["prefix"] and path.startswith(route["path"]) and "{" in path[len(route["path"]):]:
            out.append((path, op))
        elif not route["prefix"] and path == route["path"]:
            out.append((path, op))
    return out


def check_codes(label, need, indirect, specd):
    """need: (status, code) pairs the source answers; specd: the
    operations' {status: codes} merged. Both directions, the second by
    status only (the spec's codes of a status whose code the source
    computes cannot be matched one by one)."""
    for status, code in sorted(need, key=lambda p: (p[0], p[1] or "")):
        if status not in specd:
            what = f"{status} {code}" if code else str(status)
            finding(f"{label}: the source answers {what}; the spec has no {status}")
        elif code is not None and code not in specd[status] and None not in specd[status]:
            finding(f"{label}: the source answers {status} {code}; "
                    f"the spec's {status} lists {sorted(specd[status])}")
    listed = set().union(*specd.values()) if specd else set()
    for code in sorted(indirect - listed):
        finding(f"{label}: a decoder it calls answers code {code}, which the spec lists under no status")
    statuses = {s for s, _ in need}
    for status in sorted(set(specd) - statuses):
        finding(f"{label}: the spec lists {status}, which the source never answers")
    # And the codes: a code the spec lists under a status the source
    # answers with literal codes only must be one of them (a decoder's
    # codes, handed back through a variable, count under any status).
    for status in sorted(set(specd) & statuses):
        sent = {c for s, c in need if s == status}
        if None in sent:
            continue
        for code in sorted(c for c in specd[status] - sent - indirect if c is not None):
            finding(f"{label}: the spec's {status} lists {code}, which the source never answers")


def static(root, spec_path=None):
    spec = load_spec(root, spec_path)
    ops = operations(spec)
    src = Source(root)
    routes = route_table(root)
    print(f"route table: {len(routes)} routes; spec: {len(ops)} operations")

    # Routes and operations, both directions.
    for r in routes:
        if not route_ops(r, ops):
            finding(f"served but not in the spec: {r['method']} {r['path']}{'*' if r['prefix'] else ''}")
    for (where, m, path) in ops:
        if where != "public":
            continue
        if not any(m == r["method"] and (path == r["path"] or
                                         (r["prefix"] and path.startswith(r["path"])))
                   for r in routes):
            finding(f"in the spec but not served: {m} {path}")
    served_admin, admin_funcs = admin_routes(src)
    spec_admin = {(m, p) for (w, m, p) in ops if w == "admin"}
    for m, p in sorted(served_admin - spec_admin):
        finding(f"served by the admin listener but not in the spec: {m} {p}")
    for m, p in sorted(spec_admin - served_admin):
        finding(f"in the spec's admin server but not served: {m} {p}")

    # docs/protocol.md's endpoint headings name the same endpoints.
    heads = set()
    protocol = read(os.path.join(root, "docs", "protocol.md"))
    for m, p in re.findall(r"^### `([A-Z]+) (/[^`?\s]*)", protocol, re.M):
        heads.add((m, re.sub(r"<(\w+)>", r"{\1}", p)))
    public = {(m, p) for (w, m, p) in ops if w == "public"}
    for m, p in sorted(heads - public):
        finding(f"docs/protocol.md has a section on {m} {p}, which the spec lacks")
    for m, p in sorted(public - heads):
        finding(f"the spec has {m} {p}, which docs/protocol.md has no section on")

    # Statuses and codes: the handler's own, those of the checks before
    # it (the input guard's refusals, dispatch, the signature) and, for
    # the admin listener, its callback's.
    # Dispatch authenticates the routes that need a peer (the route
    # table's COORD_AUTH_PEER) before their handlers: those answers count
    # for those routes only.
    disp, _ = src.answers(src.closure("coord_dispatch", stop=("coord_authenticate",)))
    peer_auth, _ = src.answers(src.closure("coord_authenticate"))
    auth_file = os.path.join(root, "coordinator", "http", "auth.c")
    head_full, _ = src.answers(src.closure("coord_auth_head"))
    # An unsigned route meets only the checks made before the signature's:
    # those in coord_auth_head itself and the address's rate.
    head_own, _ = src.answers([src.lookup("coord_auth_head", auth_file)])
    head_addr, _ = src.answers(src.closure("address_ok", auth_file))
    disp |= {p for p, _ in record_pairs(src)}
    n_pairs = 0
    for r in routes:
        matched = route_ops(r, ops)
        if not matched:
            continue
        own, indirect = src.answers(src.closure(r["fn"]))
        common = disp | (head_full if r["auth"] != "COORD_AUTH_NONE" else head_own | head_addr)
        if r["auth"] == "COORD_AUTH_PEER":
            common |= peer_auth
        need = {p for p in own | common if p not in PATH_LEVEL}
        if not r["media"]:
            need.discard(MEDIA)
        need -= NOT_FOR_KIND.get(r["auth"], set())
        specd = {}
        for _, op in matched:
            for s, codes in response_codes(spec, op).items():
                specd.setdefault(s, set()).update(codes)
        n_pairs += len(need)
        check_codes(f"{r['method']} {r['path']}{'*' if r['prefix'] else ''} ({r['fn']})",
                    need, indirect, specd)
    admin_need, _ = src.answers(admin_funcs)
    admin_need = {p for p in admin_need if p not in PATH_LEVEL}
    for (w, m, p), op in ops.items():
        if w == "admin":
            check_codes(f"admin {m} {p}", admin_need, set(), response_codes(spec, op))
    print(f"statuses and codes: {n_pairs} (status, code) pairs from the source checked")
    error_table(root, spec, src)


# ---- every code sent, the error table and the spec ---------------------------------

# Calls whose status is not a literal replay pairs collected elsewhere, so
# they are skipped: refuse_guarded (server.c) sends g->refusal, which
# coord_auth_head filled through auth.c's refuse() and refuse_rate(),
# whose literal calls are collected; the wrappers themselves (refuse,
# admin_error, coord_reply_error) pass their own status parameter on.
#
# A code that is not a literal comes through a variable, in a few places:
# - split.c sends the code split_wire_decode_forward (common/split_wire.c)
#   left in its code out-parameter, 400 when it returned VL_EINVAL and 422
#   for VL_ERANGE;
# - routes_updates.c sends 422 with the code of a held refusal, set by
#   held(r, "code", ...), by its own factor checks (*code = "...") or by
#   compress_update_decode (compress/update.c);
# - routes_round.c sends 422 with compress_round_decode_values' code
#   (compress/values.c), "bad_shape" when it left none.
# Each such call's codes are the literals stored through a code pointer
# (*code = "x", ->code = "x") in its file and in the decoders the file
# hands &code to, the literal code arguments of the file's own setters
# (a function taking `code` that stores ->code = code) and any literal
# fallback in the expression (code ? code : "x"). When one file sends
# variable codes under several statuses, a decoder's code goes with the
# status of the VL_E* it returns next (VL_EINVAL 400, VL_ERANGE 422). A
# declaration's initial value (const char *code = "x") is only a default
# a decoder overwrites, and is not counted.
RC_STATUS = {"VL_EINVAL": 400, "VL_ERANGE": 422}


def code_stores(text):
    """[(code, status or None)]: the literals text stores through a code
    pointer, each with the status of the VL_E* returned next."""
    # A decoder may also fill a local (c = "x") that it stores at the end
    # (*code = c), as compress_update_check_spec does.
    store = r'(?:(?<!char )\*\s*code|->code|(?<![\w.>*])c)\s*=\s*'
    out = []
    for m in re.finditer(store + r'"([a-z_]+)"', text):
        nxt = re.search(r"\b(VL_EINVAL|VL_ERANGE)\b|" + store + '"', text[m.end():])
        out.append((m.group(1), RC_STATUS.get(nxt.group(1)) if nxt and nxt.group(1) else None))
    return out


def sent_pairs(root, src):
    """{(status, code): [where]} for every error any coordinator source
    sends, and the number found through a variable code."""
    pairs, variable = {}, 0
    code_wrappers = {n: (si, ci) for n, (si, ci) in src.wrappers.items() if ci is not None}
    by_file = {}
    for f in src.funcs.values():
        by_file.setdefault(f["file"], []).append(f)
    for path in sorted(by_file):
        if not in_coordinator(path):
            continue
        text = read(path)
        base = os.path.basename(path)
        sites = []  # (status, expression) of the calls with a variable code
        for f in by_file[path]:
            for name, (si, ci) in code_wrappers.items():
                for args in call_args(f["body"], name):
                    if len(args) <= max(si, ci) or not re.fullmatch(r"[1-5]\d\d", args[si]):
                        continue
                    lit = re.fullmatch(r'"([a-z_]+)"', args[ci])
                    if lit:
                        pairs.setdefault((int(args[si]), lit.group(1)), []).append(base)
                    else:
                        sites.append((int(args[si]), args[ci]))
        if not sites:
            continue
        # The file's pool of codes that reach those calls.
        pool = code_stores(text)
        for f in by_file[path]:
            params = [p.strip() for p in f["params"].split(",")]
            names = [re.sub(r".*?(\w+)\s*(\[\])?$", r"\1", p) for p in params]
            if "code" in names and re.search(r"->code\s*=\s*code\s*;", f["body"]):
                ci = names.index("code")
                for g in by_file[path]:
                    for args in call_args(g["body"], f["name"]):
                        if len(args) > ci:
                            pool += [(c, None) for c in re.findall(r'"([a-z_]+)"', args[ci])]
        for callee in set(re.findall(r"(?<![\w.>])([a-z_]\w*)\s*\(", text)):
            if not any(a == "&code" for args in call_args(text, callee) for a in args):
                continue
            g = src.lookup(callee, path)
            if g is None:
                continue
            seen = set()
            for fn in [g] + [src.lookup(n, g["file"]) for n in
                             re.findall(r"(?<![\w.>])([a-z_]\w*)\s*\(", read(g["file"]))]:
                if fn and "**code" in fn["params"].replace(" ", "") and fn["file"] not in seen:
                    seen.add(fn["file"])
                    pool += code_stores(read(fn["file"]))
        statuses = sorted({s for s, _ in sites})
        # A code stored before a failure that is not a refusal (VL_ENOMEM:
        # 500 internal) is placed by its other stores, if any.
        placed_elsewhere = {c for c, st in pool if st in statuses}
        for status, expr in sites:
            for fallback in re.findall(r'"([a-z_]+)"', expr):
                pairs.setdefault((status, fallback), []).append(base + " (fallback)")
        for code, rc_status in pool:
            if len(statuses) == 1:
                placed = statuses[0]
            elif rc_status in statuses:
                placed = rc_status
            elif code in placed_elsewhere:
                continue
            else:
                finding(f"{base}: cannot tell which of {statuses} code {code} is sent with")
                continue
            if (placed, code) not in pairs:
                variable += 1
            pairs.setdefault((placed, code), []).append(base + " (variable)")
    for p, base in record_pairs(src):
        pairs.setdefault(p, []).append(base + " (refusal record)")
    return pairs, variable


def record_pairs(src):
    """[((status, code), file)]: the refusals the input guard writes into
    its connection's refusal record itself (snprintf of the code, then the
    status), which refuse_guarded sends for a request on any route."""
    out = []
    for f in src.funcs.values():
        if not in_coordinator(f["file"]):
            continue
        for m in re.finditer(r'snprintf\(\s*([\w.>-]+)\.code\s*,[^;]*?"([a-z_]+)"\s*\);', f["body"]):
            st = re.search(re.escape(m.group(1)) + r"\.status\s*=\s*([1-5]\d\d)\s*;",
                           f["body"][m.end():])
            if st:
                out.append(((int(st.group(1)), m.group(2)), os.path.basename(f["file"])))
    return out


def table_pairs(root):
    """(status, code) pairs of docs/protocol.md's error table: the codes in
    backticks outside parentheses (which explain them)."""
    text = read(os.path.join(root, "docs", "protocol.md"))
    sec = re.search(r"^## Errors\n(.*?)^## ", text, re.S | re.M)
    if not sec:
        raise SystemExit("openapi_check: no '## Errors' section in docs/protocol.md")
    pairs, rows = set(), 0
    for status, cell in re.findall(r"^\|\s*([1-5]\d\d)\s*\|(.*)\|\s*$", sec.group(1), re.M):
        rows += 1
        prev = None
        while prev != cell:
            prev, cell = cell, re.sub(r"\([^()]*\)", "", cell)
        for code in re.findall(r"`([a-z_]+)`", cell):
            pairs.add((int(status), code))
    return pairs, rows


def spec_pairs(spec):
    """(status, code) pairs the spec's responses list, on any operation,
    and the path-level ones its description names (PATH_LEVEL)."""
    desc = re.sub(r"\s+", " ", spec.get("info", {}).get("description", ""))
    out = {p for p in PATH_LEVEL if f"`{p[0]} {p[1]}`" in desc}
    for _, op in operations(spec).items():
        for status, codes in response_codes(spec, op).items():
            out |= {(status, c) for c in codes if c is not None}
    return out


def error_table(root, spec, src):
    sent, variable = sent_pairs(root, src)
    table, rows = table_pairs(root)
    listed = spec_pairs(spec)
    fmt = lambda p: f"{p[0]} {p[1]}"
    for p in sorted(set(sent) - table):
        finding(f"sent by {', '.join(sorted(set(sent[p])))} but not in docs/protocol.md's "
                f"error table: {fmt(p)}")
    for p in sorted(table - set(sent)):
        finding(f"in docs/protocol.md's error table but sent by no source: {fmt(p)}")
    for p in sorted(set(sent) - listed):
        finding(f"sent by {', '.join(sorted(set(sent[p])))} but listed on no operation "
                f"of the spec: {fmt(p)}")
    for p in sorted(listed - set(sent)):
        finding(f"listed in the spec but sent by no source: {fmt(p)}")
    print(f"error table: {rows} rows, {len(table)} (status, code) pairs; source: {len(sent)} "
          f"pairs sent ({variable} codes through variables); spec: {len(listed)} pairs listed")


# ---- a running coordinator --------------------------------------------------------

class Client:
    def __init__(self, url, cafile):
        u = urllib.parse.urlsplit(url)
        self.host, self.port, self.tls = u.hostname, u.port, u.scheme == "https"
        self.ctx = ssl.create_default_context(cafile=cafile) if self.tls else None

    def ask(self, method, target, headers=None):
        """An unsigned request without a body; Content-Length: 0 only
        where a body is expected (the coordinator takes any
        Content-Length for a body that needs a digest)."""
        if self.tls:
            c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=10)
        else:
            c = http.client.HTTPConnection(self.host, self.port, timeout=10)
        hdrs = dict(headers or {})
        body = b"" if method in ("POST", "PUT", "PATCH") else None
        if body is not None:
            hdrs["Content-Length"] = "0"
        c.request(method, target, body=body, headers=hdrs)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def example_path(spec, path, op):
    def value(m):
        for p in op.get("parameters", []):
            p = deref(spec, p)
            if p["in"] == "path" and p["name"] == m.group(1):
                s = p.get("schema", {})
                return str(s.get("const", 0 if s.get("type") == "integer" else "x"))
        return "x"
    return re.sub(r"\{(\w+)\}", value, path)


def error_code(data):
    try:
        return json.loads(data)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def probe(root, url, cafile, admin_url, spec_path=None):
    spec = load_spec(root, spec_path)
    ops = operations(spec)
    clients = {"public": Client(url, cafile), "admin": Client(admin_url, None)}
    error_schema = Draft202012Validator(dict(spec, **{"$ref": "#/components/schemas/Error"}))
    n = 0

    def check_answer(label, op, status, headers, data):
        codes = response_codes(spec, op)
        code = error_code(data) if status >= 400 else None
        if status not in codes:
            finding(f"{label}: answered {status} {code or ''}, which the spec does not list")
            return
        if status >= 400:
            try:
                errs = [e.message for e in error_schema.iter_errors(json.loads(data))]
            except ValueError:
                errs = ["not JSON"]
            if errs:
                finding(f"{label}: the {status} body is not the Error schema: {errs[0]}")
            elif None not in codes[status] and code not in codes[status]:
                finding(f"{label}: answered {status} {code}; "
                        f"the spec's {status} lists {sorted(codes[status])}")
        resp = deref(spec, op["responses"][str(status)])
        for ctype, media in resp.get("content", {}).items():
            if not headers.get("content-type", "").startswith(ctype):
                finding(f"{label}: {status} came as {headers.get('content-type')}, "
                        f"the spec says {ctype}")
            elif ctype == "application/json" and status < 300 and "schema" in media:
                schema_ref = media["schema"].get("$ref")
                if schema_ref:
                    v = Draft202012Validator(dict(spec, **{"$ref": schema_ref}))
                    for e in v.iter_errors(json.loads(data)):
                        finding(f"{label}: {status} body breaks {schema_ref}: {e.message}")
                        break

    for (where, method, path), op in sorted(ops.items()):
        target = example_path(spec, path, op)
        client = clients[where]
        headers = {}
        body = deref(spec, op.get("requestBody", {})) if "requestBody" in op else None
        if body:
            headers["Content-Type"] = next(iter(body["content"]))
        status, hdrs, data = client.ask(method, target, headers)
        n += 1
        label = f"{method} {target}"
        if (status, error_code(data)) in PATH_LEVEL:
            finding(f"{label}: in the spec but answered {status} {error_code(data)}")
            continue
        # An unsigned request to a signed operation must be refused for
        # its signature (or, with a body, its digest) and nothing else.
        signed = op.get("security", spec.get("security")) not in ([], None) and where == "public"
        if signed and (status, error_code(data)) not in ((401, "unauthorized"), (400, "bad_digest")):
            finding(f"{label}: unsigned, answered {status} {error_code(data)}; "
                    "expected a refusal for its signature")
        check_answer(label, op, status, hdrs, data)
        # Every other method on the path, on either listener: 405 with
        # Allow naming the spec's.
        allowed = sorted(m for (w, m, p) in ops if w == where and p == path)
        for other in ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
            if other in allowed:
                continue
            st, h, d = client.ask(other, target)
            n += 1
            if (st, error_code(d)) != (405, "method_not_allowed"):
                finding(f"{other} {target}: answered {st} {error_code(d)}, "
                        "expected 405 method_not_allowed")
            elif sorted(a.strip() for a in h.get("allow", "").split(",")) != allowed:
                finding(f"{other} {target}: Allow is {h.get('allow')!r}, the spec has {allowed}")

    # The admin listener is libevent's evhttp without the input guard: a
    # method libevent has no name for and a refused method with a body
    # must still get the JSON 405, not libevent's HTML 501 or 413.
    admin = clients["admin"]
    for method, body in (("BREW", None), ("POST", b"x" * 5), ("PATCH", b"{}")):
        c = http.client.HTTPConnection(admin.host, admin.port, timeout=10)
        c.request(method, "/metrics", body=body)
        r = c.getresponse()
        data, allow = r.read(), r.getheader("Allow", "")
        c.close()
        n += 1
        if (r.status, error_code(data), allow) != (405, "method_not_allowed", "GET"):
            finding(f"admin {method} /metrics{' with a body' if body else ''}: answered "
                    f"{r.status} {error_code(data)} (Allow {allow!r}), expected 405 "
                    "method_not_allowed with Allow: GET")

    # Paths that are not in the spec are not served, on either listener
    # (near misses: paths are matched exactly as sent).
    unknown = [("public", t) for t in ("/", "/v1", "/v1/task/", "/v1/Task", "/v1/%74ask",
                                       "/v1/nothing", "/metrics", "/v1/peers/")]
    unknown += [("admin", t) for t in ("/", "/v1/status", "/metrics/")]
    for where, target in unknown:
        if any(w == where and template_regex(p).match(target) for (w, _, p) in ops):
            continue
        st, _, d = clients[where].ask("GET", target)
        n += 1
        if (st, error_code(d)) != (404, "not_found"):
            finding(f"{where} GET {target}: not in the spec, answered {st} {error_code(d)}; "
                    "expected 404 not_found")
    # The route table's paths answer too, whatever the spec says.
    for r in route_table(root):
        target = r["path"] + ("train" if r["prefix"] else "")
        st, _, d = clients["public"].ask(r["method"], target)
        n += 1
        if (st, error_code(d)) in PATH_LEVEL:
            finding(f"{r['method']} {target}: in the route table, answered {st} {error_code(d)}")
    print(f"probes: {n} requests")


def main(argv):
    if len(argv) in (3, 4) and argv[1] == "static":
        static(*argv[2:])
    elif len(argv) in (6, 7) and argv[1] == "probe":
        probe(*argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    if findings:
        print(f"openapi_check: {len(findings)} finding(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
