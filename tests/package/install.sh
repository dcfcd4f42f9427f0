#!/usr/bin/env bash
# package_install: `cmake --install` of build folder BUILD into a DESTDIR in a
# temporary folder, then what is installed checked where it landed: both
# programs run (--version), both manual pages render with `man -l` without
# a warning, the example configurations are JSON, make-cert.sh is
# executable, and the systemd units name the installed programs.
# `systemd-analyze verify --root` then loads the units inside that DESTDIR,
# beside a copy of the host's own targets, so a path in ExecStart= that is
# not an installed executable fails the test; the same check run again with
# volley-peer taken away must fail, or the verification proves nothing.
# Without systemd-analyze the rest still runs and the test reports itself
# skipped (77) at the end.
#   install.sh BUILD
set -euo pipefail
build=$(cd "${1:?usage: install.sh BUILD}" && pwd)
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")
[ -n "$prefix" ] || { echo "install: no CMAKE_INSTALL_PREFIX in $build/CMakeCache.txt" >&2; exit 1; }
tmp=$(mktemp -d /tmp/volley-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
fail() { echo "install: FAIL: $*" >&2; exit 1; }

DESTDIR=$root cmake --install "$build" > "$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install failed"; }
p=$root$prefix
for f in bin/volley-peer bin/volley-coordinator share/volley/make-cert.sh; do
  [ -x "$p/$f" ] || fail "$prefix/$f is not installed executable"
done
for prog in volley-peer volley-coordinator; do
  "$p/bin/$prog" --version | grep -q "^$prog " || fail "$prog --version"
  page=$p/share/man/man1/$prog.1.gz
  [ -f "$page" ] || fail "no manual page $prefix/share/man/man1/$prog.1.gz"
  MANWIDTH=80 man --warnings -l "$page" > "$tmp/$prog.txt" 2> "$tmp/$prog.err" ||
    fail "man -l $prog.1.gz"
  [ -s "$tmp/$prog.err" ] && { cat "$tmp/$prog.err"; fail "man -l $prog.1.gz warned"; }
  grep -q "^NAME" "$tmp/$prog.txt" && grep -Eq "$prog +- " "$tmp/$prog.txt" &&
    grep -q "^EXIT STATUS" "$tmp/$prog.txt" || fail "$prog's manual page lacks NAME or EXIT STATUS"
done
n=0
for f in "$p"/share/doc/volley/examples/*.example.json; do
  python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$f" || fail "$f is not JSON"
  n=$((n + 1))
done
[ "$n" -ge 1 ] || fail "no example configuration installed"
units=$prefix/lib/systemd/system
for u in volley-peer volley-coordinator; do
  f=$root$units/$u.service
  [ -f "$f" ] || fail "no unit $units/$u.service"
  grep -q "^ExecStart=$prefix/bin/$u " "$f" || fail "$u.service does not start $prefix/bin/$u"
done
echo "install: $prefix: 2 programs, 2 manual pages, $n example configurations, make-cert.sh, 2 units"

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: systemd-analyze not found; the units were not verified"
  exit 77
fi
# The targets and services the units name, and the kill of ExecReload=, as
# the host has them; the installed tree is otherwise left as it is.
host_units=/usr/lib/systemd/system
[ -d "$host_units" ] || host_units=/lib/systemd/system
mkdir -p "$root/usr/lib/systemd/system" "$root/usr/bin" "$root/etc/systemd/system"
find "$host_units" -maxdepth 1 -type f \( -name '*.target' -o -name '*.service' -o -name '*.socket' \
  -o -name '*.mount' -o -name '*.slice' \) -exec cp -n {} "$root/usr/lib/systemd/system/" \;
cp "$(type -P kill)" "$root/usr/bin/kill"
[ -e "$root/bin" ] || ln -s usr/bin "$root/bin"
verify() {
  systemd-analyze verify --root="$root" "$units/volley-peer.service" \
    "$units/volley-coordinator.service" > "$tmp/verify.log" 2>&1
}
verify || { cat "$tmp/verify.log"; fail "systemd-analyze verify"; }
grep -v 'is not a symlink, ignoring' "$tmp/verify.log" || true
mv "$p/bin/volley-peer" "$tmp/volley-peer.away"
if verify; then
  fail "systemd-analyze verify passed with $prefix/bin/volley-peer missing: it checks nothing"
fi
grep -q "volley-peer.service: Command $prefix/bin/volley-peer is not executable" "$tmp/verify.log" ||
  { cat "$tmp/verify.log"; fail "verify without volley-peer did not name it"; }
echo "install: systemd-analyze verify --root passes both units, and names volley-peer once it is missing"
