#!/usr/bin/env bash
# Installs every system package that building, testing and running volley
# needs on Debian 12 (fortunes: the second corpus of the convergence
# benchmark and the tests; gnuplot: its loss curves; Python with venv,
# pip, requests and cryptography: the test that signs requests with an
# RFC 9421 implementation volley did not write; zlib: gzip IDX image
# files; libpng: the leakage benchmark's pictures; dataset-fashion-mnist:
# the labelled images in /usr/share/datasets/fashion-mnist that the image
# reader's test loads; iproute2 and nftables: the emulated wide-area
# network of tests/wan, namespaces, bandwidth and packet loss;
# prometheus-client: its text-format parser checks the /metrics output;
# chromium: the dashboard's test loads the page in a headless browser;
# clang-format: the test that the sources keep .clang-format's layout;
# debootstrap: deploy/package-test.sh's Debian 12 root).
# Non-interactive and idempotent: packages already present
# are left alone, so running it twice is cheap.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config git ca-certificates
  libevent-dev libssl-dev openssl
  libsqlite3-dev sqlite3
  libjansson-dev libsodium-dev
  libcurl4-openssl-dev curl
  libopenblas-dev
  libcmocka-dev
  clang clang-format libclang-rt-14-dev libomp-14-dev
  fortunes-min fortunes gnuplot-nox
  python3 python3-venv python3-pip python3-requests python3-cryptography python3-prometheus-client
  zlib1g-dev libpng-dev dataset-fashion-mnist
  iproute2 nftables
  chromium
  debootstrap
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: must run as root or with sudo available" >&2; exit 1
  fi
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages already installed"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: done"
