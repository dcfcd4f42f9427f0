#!/usr/bin/env bash
# The tree's C, C++ and CUDA sources are as .clang-format lays them out:
# clang-format (Debian's clang-format package, which deploy/install-deps.sh
# installs) reformats nothing. Lists the files that would change, with the
# first lines of each change, and fails when there are any.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
fmt=""
for c in clang-format clang-format-14; do command -v "$c" > /dev/null && { fmt=$c; break; }; done
[ -n "$fmt" ] || { echo "format: no clang-format (deploy/install-deps.sh installs it)" >&2; exit 1; }
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
else
  mapfile -t files < <(find . -path ./build -prune -o \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print | grep -v '^./build')
fi
bad=0
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! "$fmt" --style=file "$f" | cmp -s - "$f"; then
    echo "format: $f is not as .clang-format lays it out:"
    "$fmt" --style=file "$f" | diff "$f" - | head -n 8
    bad=$((bad + 1))
  fi
done
echo "format: ${#files[@]} files, $bad to reformat (clang-format -i FILE)"
[ "$bad" = 0 ]
