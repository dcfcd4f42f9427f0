"""The coordinator's layers as a checked fact.

Each folder of coordinator/ is a layer; a file may include the headers of
its own layer and of the layers below it, never above (the libraries of
coordinator/CMakeLists.txt make a call upward fail to link; this makes an
include upward fail the tests too). From the bottom:

    config < base < types < conn < run < http < sched < ops < api
           < server | cli < main

`types` are coord.h and every *_types.h: types only, no function
declarations, so that every layer can share them. server (server.c,
server.h) and cli/ sit side by side and include neither the other.
Also checked: no include cycle among the coordinator's files, and every
folder has a README.md saying what it is for.

Usage: check.py ROOT          check the tree at ROOT
       check.py --self-test   plant one fault of each kind in a scratch
                              copy and require that each is reported
"""
import os
import re
import shutil
import sys
import tempfile

RANK = {"config": 0, "base": 1, "types": 2, "conn": 3, "run": 4, "http": 5, "sched": 6,
        "ops": 7, "api": 8, "server": 9, "cli": 9, "main": 10}
FOLDERS = {"config", "base", "conn", "run", "http", "sched", "ops", "api", "cli"}
TOP = {"coord.h": "types", "server.c": "server", "server.h": "server", "main.c": "main"}
# A function declaration at file scope: a return type, a name, a
# parameter list, then ';' (function-pointer typedefs start with typedef).
PROTO = re.compile(r"^(?!typedef|#|\s|/|\*|struct\s+\w+\s*\{|\})[A-Za-z_][\w\s\*]*?\b\w+\s*\([^;{]*\)\s*"
                   r"(?:VL_\w+(?:\([^)]*\))?\s*)*;", re.M)


def layer_of(rel):
    """The layer of a path relative to coordinator/, or None for one that
    belongs to none (a file outside the folders)."""
    parts = rel.split("/")
    name = parts[-1]
    if name.endswith("_types.h"):
        return "types"
    if len(parts) == 1:
        return TOP.get(name)
    return parts[0] if parts[0] in FOLDERS else None


def sources(coord):
    for d, dirs, files in os.walk(coord):
        dirs.sort()
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                yield os.path.relpath(os.path.join(d, f), coord)


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def check(root):
    coord = os.path.join(root, "coordinator")
    faults = []
    includes = {}
    for rel in sources(coord):
        layer = layer_of(rel)
        if layer is None:
            faults.append(f"{rel}: in no layer (put it in one of {', '.join(sorted(FOLDERS))})")
            continue
        text = open(os.path.join(coord, rel), encoding="utf-8").read()
        inc = re.findall(r'^#include "coordinator/([^"]+)"', text, re.M)
        includes[rel] = inc
        for h in inc:
            hl = layer_of(h)
            if hl is None:
                continue
            if RANK[hl] > RANK[layer] or (RANK[hl] == RANK[layer] and hl != layer and
                                          {hl, layer} == {"server", "cli"}):
                faults.append(f"{rel} ({layer}) includes {h} ({hl}), a layer above its own")
        if layer == "types" and rel.endswith(".h"):
            for m in PROTO.finditer(strip_comments(text)):
                line = m.group(0).split("\n")[0].strip()
                faults.append(f"{rel}: a types header declares a function: {line}")
    # Include cycles among the coordinator's own files.
    state = {}

    def visit(f, path):
        state[f] = 1
        for h in includes.get(f, []):
            if h not in includes:
                continue
            if state.get(h) == 1:
                cyc = path[path.index(h):] + [h] if h in path else [f, h]
                faults.append("include cycle: " + " -> ".join(cyc))
            elif h not in state:
                visit(h, path + [h])
        state[f] = 2

    for f in sorted(includes):
        if f not in state:
            visit(f, [f])
    for d in sorted(FOLDERS):
        if not os.path.isfile(os.path.join(coord, d, "README.md")):
            faults.append(f"coordinator/{d}/ has no README.md saying what it is for")
    return faults


def self_test(root):
    """Plants an upward include, a function in a types header, an include
    cycle, a file outside the layers and a folder without its README, and
    requires the check to report each of them and nothing else."""
    tmp = tempfile.mkdtemp(prefix="volley-layering.")
    try:
        shutil.copytree(os.path.join(root, "coordinator"), os.path.join(tmp, "coordinator"))
        c = os.path.join(tmp, "coordinator")
        with open(os.path.join(c, "base", "routes.c"), "a") as f:
            f.write('#include "coordinator/api/api.h"\n')
        with open(os.path.join(c, "run", "model_types.h"), "a") as f:
            f.write("int coord_planted(int x);\n")
        with open(os.path.join(c, "conn", "planted_a.h"), "w") as f:
            f.write('#include "coordinator/conn/planted_b.h"\n')
        with open(os.path.join(c, "conn", "planted_b.h"), "w") as f:
            f.write('#include "coordinator/conn/planted_a.h"\n')
        with open(os.path.join(c, "stray.c"), "w") as f:
            f.write("int x;\n")
        os.remove(os.path.join(c, "ops", "README.md"))
        got = check(tmp)
        want = ["base/routes.c (base) includes api/api.h (api)",
                "run/model_types.h: a types header declares a function: int coord_planted(int x);",
                "include cycle: conn/planted_a.h -> conn/planted_b.h -> conn/planted_a.h",
                "stray.c: in no layer",
                "coordinator/ops/ has no README.md"]
        missing = [w for w in want if not any(g.startswith(w) for g in got)]
        extra = [g for g in got if not any(g.startswith(w) for w in want)]
        for m in missing:
            print(f"layering self-test: not reported: {m}")
        for e in extra:
            print(f"layering self-test: reported besides the planted faults: {e}")
        return 1 if missing or extra else 0
    finally:
        shutil.rmtree(tmp)


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
        rc = self_test(root)
        print("layering self-test: " + ("failed" if rc else "every planted fault reported"))
        return rc
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-4].strip(), file=sys.stderr)
        return 2
    faults = check(sys.argv[1])
    for f in faults:
        print("layering: " + f)
    n = sum(1 for _ in sources(os.path.join(sys.argv[1], "coordinator")))
    print(f"layering: {n} files, {len(faults)} faults")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
