#!/usr/bin/env bash
# Builds volley's Debian packages (cpack, cmake/packaging.cmake) and tries
# them the way a Debian 12 machine gets them: debootstrap makes a minimal
# bookworm root from the Debian mirror, `apt install ./volley-*.deb`
# resolves their dependencies there, and in that root (chroot, with /proc
# and /dev mounted for the run) it checks what postinst did (the volley
# user, the folders, the units enabled), then runs a coordinator as the
# volley user from an installed example configuration, a corpus and a
# certificate from the installed make-cert.sh, serving on loopback, and a
# peer that makes its key, joins with a token and trains one task; the
# peer's update must be accepted. Then it purges both packages and checks
# what is left; last, tests/package/bundle.sh tries the portable peer of
# the same build in an empty root. With nvcc (and VOLLEY_PACKAGE_CUDA not
# 0) it also builds volley-peer-cuda and checks that installing it
# replaces volley-peer.
#
#   deploy/package-test.sh            (as root; several minutes)
#
# Exit 77 (skipped) without root, debootstrap's reach or the mirror.
# Knobs (environment): VOLLEY_PACKAGE_BUILD (build-pkg) the build folder,
# VOLLEY_PACKAGE_MIRROR (http://deb.debian.org/debian), VOLLEY_PACKAGE_CUDA
# (1 when nvcc is found). The bookworm root made once is kept in
# BUILD/package-test/base and copied for every run.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
build=${VOLLEY_PACKAGE_BUILD:-build-pkg}
mirror=${VOLLEY_PACKAGE_MIRROR:-http://deb.debian.org/debian}
say() { echo "package-test: $*"; }
fail() { echo "package-test: FAIL: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || { echo "SKIP: package-test needs root (debootstrap, chroot, mounts)"; exit 77; }
curl -fsS --max-time 30 -o /dev/null "$mirror/dists/bookworm/Release" ||
  { echo "SKIP: package-test: $mirror is not reachable"; exit 77; }
if ! command -v debootstrap >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null ||
    { echo "SKIP: package-test: debootstrap is missing and could not be installed"; exit 77; }
fi

say "building the packages in $build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DVOLLEY_WERROR=ON -DVOLLEY_CUDA=OFF \
  -DCMAKE_INSTALL_PREFIX=/usr > /dev/null
cmake --build "$build" -j"$(nproc)" --target volley_dist > /dev/null
rm -f "$build"/*.deb
(cd "$build" && cpack -G DEB > cpack.log) || { cat "$build/cpack.log"; fail "cpack"; }
debs=("$build"/volley-peer_*.deb "$build"/volley-coordinator_*.deb)
for d in "${debs[@]}"; do [ -f "$d" ] || fail "cpack made no $d"; done
cuda_deb=""
cuda=${VOLLEY_PACKAGE_CUDA:-}
if [ -z "$cuda" ]; then
  cuda=0
  { command -v nvcc || [ -x /usr/local/cuda/bin/nvcc ]; } >/dev/null 2>&1 && cuda=1
fi
if [ "$cuda" = 1 ]; then
  say "building volley-peer-cuda in $build-cuda"
  cmake -S . -B "$build-cuda" -DCMAKE_BUILD_TYPE=Release -DVOLLEY_WERROR=ON -DVOLLEY_CUDA=ON \
    -DCMAKE_INSTALL_PREFIX=/usr > /dev/null
  cmake --build "$build-cuda" -j"$(nproc)" --target volley_dist > /dev/null
  rm -f "$build-cuda"/*.deb
  (cd "$build-cuda" && cpack -G DEB > cpack.log) || { cat "$build-cuda/cpack.log"; fail "cpack (CUDA)"; }
  cuda_deb=$(ls "$build-cuda"/volley-peer-cuda_*.deb)
  dpkg-deb -f "$cuda_deb" Conflicts | grep -qw volley-peer || fail "volley-peer-cuda does not conflict with volley-peer"
fi
for d in "${debs[@]}" $cuda_deb; do say "$(basename "$d"): Depends: $(dpkg-deb -f "$d" Depends)"; done

work=$src/$build/package-test
base=$work/base
root=$work/root
if [ ! -x "$base/usr/bin/apt-get" ]; then
  say "debootstrap bookworm (minbase) from $mirror into $base"
  rm -rf "$base"
  mkdir -p "$work/cache"
  debootstrap --variant=minbase --cache-dir="$work/cache" bookworm "$base" "$mirror" \
    > "$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log"; fail "debootstrap"; }
fi
cleanup() {
  for m in "$root/dev" "$root/proc"; do
    mountpoint -q "$m" 2>/dev/null && umount -l "$m"
  done
  return 0
}
trap cleanup EXIT
cleanup
# rm -rf through a /dev still bound would delete the host's device nodes.
if grep -q " $root/" /proc/self/mounts; then fail "something is still mounted under $root"; fi
rm -rf "$root"
cp -a "$base" "$root"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/tmp/debs"
cp "${debs[@]}" $cuda_deb "$root/tmp/debs/"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }

say "apt install ./volley-peer ./volley-coordinator in the bookworm root"
in_root apt-get update -q > "$work/apt.log" 2>&1 || { tail "$work/apt.log"; fail "apt-get update"; }
in_root sh -c 'cd /tmp/debs && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
  ./volley-peer_*.deb ./volley-coordinator_*.deb' >> "$work/apt.log" 2>&1 ||
  { tail -n 30 "$work/apt.log"; fail "apt install of the packages"; }
say "$(grep -c '^Setting up' "$work/apt.log") packages set up, volley's among them"

# What postinst made.
in_root getent passwd volley | grep -q ':/var/lib/volley:' || fail "no volley system user"
[ "$(in_root stat -c '%a %U' /var/lib/volley)" = "700 volley" ] || fail "/var/lib/volley is not 0700 volley"
[ "$(in_root stat -c '%a %U' /var/lib/volley-peer)" = "700 volley" ] || fail "/var/lib/volley-peer"
[ "$(in_root stat -c '%a %U %G' /etc/volley/tls)" = "750 root volley" ] || fail "/etc/volley/tls"
for u in volley-peer volley-coordinator; do
  [ -L "$root/etc/systemd/system/multi-user.target.wants/$u.service" ] || fail "$u.service not enabled"
  in_root test -x "/usr/bin/$u" || fail "/usr/bin/$u"
  in_root test -f "/usr/share/man/man1/$u.1.gz" || fail "no manual page for $u"
done
say "postinst: volley user, /var/lib/volley, /var/lib/volley-peer, /etc/volley/tls, both units enabled"

cat > "$root/tmp/run.sh" <<'RUN'
#!/bin/sh
# A run on loopback as the volley user: init, certificate, serve, one peer.
set -eu
cd /var/lib/volley
cat /usr/share/common-licenses/* > corpus.txt
sed -e 's/"updates_per_version": [0-9]*/"updates_per_version": 1/' \
    -e 's/"max_versions": [0-9]*/"max_versions": 2/' \
    -e 's/"val_tokens": [0-9]*/"val_tokens": 16384/' \
    /usr/share/doc/volley/examples/coordinator.example.json > run.json
volley-coordinator init --db run.db --config run.json 2> init.log || { cat init.log; exit 1; }
bash /usr/share/volley/make-cert.sh tls 127.0.0.1 localhost > /dev/null
volley-coordinator serve --db run.db --cert tls/server.pem --key tls/server.key \
  --listen 127.0.0.1:0 2> serve.log &
serve=$!
port=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/^listening on 127.0.0.1:\([0-9]*\)$/\1/p' serve.log | head -n 1)
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { cat serve.log; kill "$serve"; exit 1; }
volley-coordinator token create --db run.db --uses 1 --ttl 1h > token
volley-peer keygen --dir peer > /dev/null
volley-peer join --dir peer --coordinator "https://127.0.0.1:$port" --token-file token \
  --cacert tls/ca.pem --name chroot-peer
rc=0
volley-peer run --dir peer --max-tasks 1 --wait 20 --threads 2 2> peer.log || rc=$?
kill -TERM "$serve"
wait "$serve" || true
[ "$rc" -eq 0 ] || { tail -n 20 peer.log; echo "peer exited $rc"; exit 1; }
grep -E 'update [0-9]+ accepted' peer.log | tail -n 1
volley-peer status --dir peer | grep -E '^updates: +1 accepted'
volley-coordinator status --db run.db | head -n 5
RUN
say "a coordinator and a peer in the bookworm root, as the volley user"
in_root runuser -u volley -- /bin/sh /tmp/run.sh > "$work/run.log" 2>&1 ||
  { cat "$work/run.log"; fail "the run in the bookworm root"; }
sed 's/^/  /' "$work/run.log"
grep -Eq 'update [0-9]+ accepted' "$work/run.log" || fail "the peer's update was not accepted"

if [ -n "$cuda_deb" ]; then
  in_root sh -c "cd /tmp/debs && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    ./$(basename "$cuda_deb")" >> "$work/apt.log" 2>&1 || { tail "$work/apt.log"; fail "apt install volley-peer-cuda"; }
  in_root dpkg-query -W -f='${Status}' volley-peer 2>/dev/null | grep -q 'install ok installed' &&
    fail "volley-peer is still installed beside volley-peer-cuda"
  # Its CUDA runtime is not in the root, so the program itself is not run.
  in_root dpkg -S /usr/bin/volley-peer | grep -q '^volley-peer-cuda:' ||
    fail "/usr/bin/volley-peer is not volley-peer-cuda's"
  say "volley-peer-cuda replaced volley-peer"
fi

say "apt purge of both packages"
in_root sh -c 'DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "volley-peer*" volley-coordinator' \
  >> "$work/apt.log" 2>&1 || { tail "$work/apt.log"; fail "apt purge"; }
for u in volley-peer volley-coordinator; do
  [ -e "$root/etc/systemd/system/multi-user.target.wants/$u.service" ] && fail "$u.service still enabled"
  [ -e "$root/usr/bin/$u" ] && fail "/usr/bin/$u left after purge"
  [ -e "$root/var/lib/systemd/deb-systemd-helper-enabled/$u.service.dsh-also" ] && fail "$u: state left"
done
[ -e "$root/var/lib/volley-peer" ] && fail "/var/lib/volley-peer left after purge"
[ -f "$root/var/lib/volley/run.db" ] || fail "purge removed the run database"
say "purge: units disabled and forgotten, programs and /var/lib/volley-peer gone, the run database kept"
say "the portable peer (deploy/peer-bundle.sh) in an empty root"
rc=0
bash tests/package/bundle.sh "$build" > "$work/bundle.log" 2>&1 || rc=$?
tail -n 1 "$work/bundle.log"
[ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || { cat "$work/bundle.log"; fail "tests/package/bundle.sh"; }
say "passed"
