#!/usr/bin/env bash
# Makes a portable volley-peer for Linux distributions other than Debian:
# one tarball holding the program, every shared library it loads (the GNU
# C library and its dynamic loader too, so the machine's own glibc, old or
# new, plays no part) and a launcher, deploy/peer-bundle/volley-peer, that
# starts it through that loader with only the bundle's libraries.
#
#   deploy/peer-bundle.sh OUTDIR [PEER]
#
# writes OUTDIR/volley-peer-VERSION-linux-x86_64.tar.gz, which unpacks into
# volley-peer-VERSION-linux-x86_64/ (run ./volley-peer there). PEER is a
# volley-peer already built; without it a CPU build is made in
# VOLLEY_PEER_BUNDLE_BUILD (build-peer-bundle). The machine needs an x86-64
# CPU with x86-64-v2 (SSE4.2, POPCNT: 2009 onwards) and a kernel glibc 2.36
# runs on (3.2 or later). TLS trust: the built-in CA file is Debian's
# /etc/ssl/certs/ca-certificates.crt; elsewhere give --cacert.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: peer-bundle.sh OUTDIR [PEER]}
peer=${2:-}
if [ -z "$peer" ]; then
  build=${VOLLEY_PEER_BUNDLE_BUILD:-build-peer-bundle}
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DVOLLEY_WERROR=ON -DVOLLEY_CUDA=OFF > /dev/null
  cmake --build "$build" -j"$(nproc)" --target volley-peer > /dev/null
  peer=$build/peer/volley-peer
fi
[ -x "$peer" ] || { echo "peer-bundle: $peer is not an executable" >&2; exit 1; }
# The GPU's libraries (cuBLAS, the driver) are the GPU machine's and
# hundreds of megabytes: a CUDA build does not travel this way.
"$peer" --version | grep -q 'no CUDA' ||
  { echo "peer-bundle: $peer is a CUDA build; the bundle holds a CPU peer" >&2; exit 1; }
version=$("$peer" --version | awk 'NR == 1 { print $2 }')
[ -n "$version" ] || { echo "peer-bundle: $peer --version printed no version" >&2; exit 1; }
name=volley-peer-$version-linux-x86_64

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
dir=$stage/$name
mkdir -p "$dir/bin" "$dir/lib"
cp "$peer" "$dir/bin/volley-peer"
cp deploy/peer-bundle/volley-peer "$dir/volley-peer"
chmod 0755 "$dir/volley-peer"
# Only the kernel's vDSO stays behind: it is no file.
bash deploy/bundle-libs.sh "$dir/lib" '^linux-vdso' "$dir/bin/volley-peer"
[ -f "$dir/lib/ld-linux-x86-64.so.2" ] || { echo "peer-bundle: no dynamic loader found" >&2; exit 1; }
strip --strip-unneeded "$dir/bin/volley-peer" "$dir"/lib/* 2>/dev/null || true
{
  "$peer" --version
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "glibc: $(ldd --version | head -n 1)"
  echo "libraries: $(cd "$dir/lib" && ls | tr '\n' ' ')"
} > "$dir/BUILD.txt"
mkdir -p "$out"
tar -czf "$out/$name.tar.gz" --owner=0 --group=0 -C "$stage" "$name"
echo "peer-bundle: $out/$name.tar.gz ($(($(stat -c %s "$out/$name.tar.gz") / 1024 / 1024)) MiB," \
  "$(ls "$dir/lib" | wc -l) libraries)"
