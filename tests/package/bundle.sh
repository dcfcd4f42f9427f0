#!/usr/bin/env bash
# package_bundle: deploy/peer-bundle.sh packs BUILD's volley-peer, and the
# tarball is unpacked into an otherwise empty root: the bundle in
# /opt, /dev/null and /dev/urandom, /proc, an empty /tmp, and /bin/sh (the
# launcher is a shell script; the shell runs on the bundle's own loader and
# C library, since the root has no other). There, in a mount and PID
# namespace, `volley-peer --version` and `volley-peer keygen` must work,
# every library the loader maps must come from the bundle, and the program
# started without the launcher must fail (no loader in the root), or the
# root was not as empty as it looks. Skipped (77) without root, unshare or
# chroot, and for a CUDA build (the bundle is a CPU peer: cuBLAS and the
# driver are the GPU machine's; deploy/package-test.sh runs this test on
# its CPU build).
#   bundle.sh BUILD
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: bundle.sh BUILD}" && pwd)
fail() { echo "bundle: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "SKIP: the clean root needs root (chroot, mounts)"; exit 77; }
for c in unshare chroot; do
  command -v "$c" >/dev/null 2>&1 || { echo "SKIP: $c not found"; exit 77; }
done
"$build/peer/volley-peer" --version | grep -q 'no CUDA' ||
  { echo "SKIP: $build/peer/volley-peer is a CUDA build; the portable bundle is a CPU peer"; exit 77; }
unshare -m -p -f true 2>/dev/null || { echo "SKIP: no mount and PID namespaces here"; exit 77; }
chroot=$(command -v chroot)
tmp=$(mktemp -d /tmp/volley-bundle.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

bash "$src/deploy/peer-bundle.sh" "$tmp/out" "$build/peer/volley-peer" || fail "peer-bundle.sh"
tarball=$(ls "$tmp"/out/volley-peer-*-linux-x86_64.tar.gz)
root=$tmp/root
mkdir -p "$root/opt" "$root/dev" "$root/proc" "$root/tmp" "$root/bin"
tar -xzf "$tarball" -C "$root/opt"
b=/opt/$(basename "$tarball" .tar.gz)
[ -x "$root$b/volley-peer" ] || fail "no launcher $b/volley-peer in the tarball"
cp "$(readlink -f /bin/sh)" "$root/bin/sh"
touch "$root/dev/null" "$root/dev/urandom"
chmod 1777 "$root/tmp"

# Inside the namespaces: the device files bound, /proc mounted, then each
# check run with an empty environment. Its output is the checks' output.
cat > "$tmp/inside.sh" <<INSIDE
set -eu
mount --bind /dev/null "$root/dev/null"
mount --bind /dev/urandom "$root/dev/urandom"
mount -t proc proc "$root/proc"
# The launcher is started as "sh launcher": a #! line would need the
# kernel to find /bin/sh's own loader at /lib64, which the root lacks.
sh_run() { env -i "$chroot" "$root" "$b/lib/ld-linux-x86-64.so.2" --library-path "$b/lib" /bin/sh "$b/volley-peer" "\$@"; }
echo "== version"; sh_run --version
echo "== keygen"; sh_run keygen --dir /tmp/key
echo "== libraries"; chroot "$root" "$b/lib/ld-linux-x86-64.so.2" --library-path "$b/lib" --list "$b/bin/volley-peer"
echo "== bare"; if env -i "$chroot" "$root" "$b/bin/volley-peer" --version 2>&1; then echo bare-ran; else echo bare-failed; fi
echo "== files"; find "$root" -mindepth 1 -maxdepth 1 | sed "s|^$root||" | sort | tr '\n' ' '; echo
INSIDE
unshare -m -p -f --mount-proc bash "$tmp/inside.sh" > "$tmp/log" 2>&1 || { cat "$tmp/log"; fail "the clean root"; }
cat "$tmp/log"
sed -n '/^== version/,/^== keygen/p' "$tmp/log" | grep -q '^volley-peer [0-9]' || fail "--version in the clean root"
sed -n '/^== keygen/,/^== libraries/p' "$tmp/log" | grep -Eq '^[A-Za-z0-9+/]{43}=$' ||
  fail "keygen printed no public key in the clean root"
[ -f "$root/tmp/key/peer.key" ] || fail "keygen wrote no key"
[ "$(stat -c %a "$root/tmp/key/peer.key")" = 600 ] || fail "the key is not mode 0600"
libs=$(sed -n '/^== libraries/,/^== bare/p' "$tmp/log" | grep '=>' || true)
[ -n "$libs" ] || fail "the loader listed no library"
echo "$libs" | grep -v "=> $b/lib/" && fail "a library came from outside the bundle"
grep -q '^bare-failed' "$tmp/log" || fail "volley-peer ran without the launcher: the root is not clean"
echo "bundle: $(basename "$tarball") ($(($(stat -c %s "$tarball") / 1024)) KiB): --version and keygen" \
  "in a root holding only the bundle, /bin/sh, /dev/null, /dev/urandom and /proc;" \
  "$(echo "$libs" | wc -l) libraries, all from the bundle"
