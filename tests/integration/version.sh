#!/usr/bin/env bash
# --version in both programs: one line with the project's version, the
# commit the binary was built from (12 hex digits, "+changes" when the
# tree differed, or "unknown" outside a checkout) and whether CUDA is
# compiled in, which for the peer must agree with the build (HAVE_CUDA),
# and exit 0. "version" as a command is the same.
set -euo pipefail
want_version=$1 have_cuda=$2
fail() { echo "FAIL: $*"; exit 1; }
commit_re='(unknown|[0-9a-f]{12}(\+changes)?)'
for prog in "$COORD" "$PEER"; do
  name=$(basename "$prog")
  line=$("$prog" --version) || fail "$name --version exited $?"
  [ "$(printf '%s\n' "$line" | wc -l)" = 1 ] || fail "$name --version printed more than one line"
  [ "$("$prog" version)" = "$line" ] || fail "$name version differs from --version"
  if [ "$name" = volley-peer ] && [ "$have_cuda" = ON ]; then
    tail_re="CUDA compiled in for architectures [0-9a-z ]+"
  else
    tail_re="no CUDA"
  fi
  [[ "$line" =~ ^$name\ $want_version\ \(commit\ $commit_re,\ $tail_re\)$ ]] ||
    fail "$name --version: '$line'"
  echo "PASS $line"
done
# The commit is the tree's when it is a git checkout.
if head=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null); then
  [[ "$("$PEER" --version)" == *"commit $head"* ]] || fail "the commit is not HEAD ($head)"
  echo "PASS the commit is HEAD's ($head)"
fi
