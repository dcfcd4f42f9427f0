#!/usr/bin/env bash
# Builds the CUDA configuration and packs, into one folder, everything a
# bare GPU machine (an NVIDIA driver and a CUDA 13 runtime, nothing else
# installable) needs to run volley's GPU checks: every GPU test program,
# test_peer_device, bench_gpu_train, bench_gpu_compress, volley-peer,
# volley-coordinator, the certificate script with an openssl to run it, a
# small run configuration and corpus, and the shared libraries those
# programs use that such a machine lacks.
#
#   deploy/gpu-bundle.sh [OUTDIR]        (default: gpu-bundle, git-ignored)
#
# Then, on the GPU machine: bash OUTDIR/run.sh LOGDIR (see run.sh there).
#
# libsodium, SQLite, jansson and libevent are linked statically
# (VOLLEY_STATIC_DEPS); OpenBLAS, libcurl, OpenSSL, cmocka, the CUDA
# runtime and what they pull in travel as shared libraries, found by ldd.
# The C library, the C++ runtime, the NVIDIA driver, cuBLAS and NCCL are
# left to the machine: cuBLAS and NCCL are hundreds of megabytes, and must
# match its driver anyway. Programs and libraries go into one gzip'd tar
# beside run.sh, which unpacks it into a temporary folder: OpenBLAS alone
# is 36 MB unpacked, and the folder has to stay under 60 MiB.
#
# Knobs (environment): VOLLEY_BUNDLE_BUILD (build-bundle) the build folder,
# VOLLEY_SKIP_DEPS=1 to skip deploy/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:-gpu-bundle}
build=${VOLLEY_BUNDLE_BUILD:-build-bundle}
max_bytes=$((60 * 1024 * 1024))

[ "${VOLLEY_SKIP_DEPS:-0}" = 1 ] || bash deploy/install-deps.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "gpu-bundle: nvcc not found (CUDA 13 toolkit)" >&2; exit 1; }

programs=(test_kernels_cuda test_compress_cuda test_model_cuda test_model_cuda_bf16 test_model_cuda_dp
          test_model_cuda_multi test_gpu_memory test_peer_gpu test_peer_nopeek_gpu test_peer_device
          bench_gpu_train bench_gpu_compress volley-peer volley-coordinator)
echo "gpu-bundle: building ${programs[*]} in $build"
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DVOLLEY_WERROR=ON -DVOLLEY_CUDA=ON \
  -DVOLLEY_STATIC_DEPS=ON > "$build/configure.log"
cmake --build "$build" -j"$(nproc)" --target "${programs[@]}" >/dev/null

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,lib,etc,share}
for p in "${programs[@]}"; do
  f=$(find "$build" -type f -name "$p" -perm -u+x | head -n1)
  [ -n "$f" ] || { echo "gpu-bundle: $p was not built" >&2; exit 1; }
  cp "$f" "$stage/bin/"
done
cp "$(command -v openssl)" "$stage/bin/"
cp deploy/make-cert.sh bench/gpu_vs_torch.sh bench/torch_ref.py "$stage/bin/"
cp deploy/gpu-bundle/openssl.cnf deploy/gpu-bundle/machine-libs.regex "$stage/etc/"
cp deploy/gpu-bundle/run.json deploy/gpu-bundle/task.json "$stage/share/"
# The demo's corpus, so the bundle needs no /usr/share/common-licenses.
find /usr/share/common-licenses -maxdepth 1 -type f | LC_ALL=C sort | xargs cat \
  > "$stage/share/corpus.txt"

# Shared libraries: everything ldd resolves for the programs, less what the
# machine provides (machine-libs.regex, which run.sh checks against too).
machine=$(grep -v '^#' deploy/gpu-bundle/machine-libs.regex)
bash deploy/bundle-libs.sh "$stage/lib" "$machine" "$stage"/bin/*
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/* 2>/dev/null || true

{
  echo "volley GPU bundle, commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "nvcc: $(nvcc --version | tail -n 2 | head -n 1)"
  echo "CUDA architectures: $(sed -n 's/^-- volley: CUDA architectures //p' "$build/configure.log")"
  echo "NCCL: $(ldd "$stage/bin/volley-peer" | grep -q libnccl && echo linked || echo not linked)"
  echo "programs: ${programs[*]}"
  echo "libraries: $(cd "$stage/lib" && ls | tr '\n' ' ')"
} > "$stage/BUILD.txt"

rm -rf "$out"
mkdir -p "$out"
tar -czf "$out/volley-gpu.tar.gz" -C "$stage" .
cp deploy/gpu-bundle/run.sh "$out/run.sh"
# Sync against async with a slow peer on the machine's CPU cores.
cp deploy/gpu-bundle/async-check.sh "$out/async-check.sh"
chmod +x "$out/run.sh"
cp "$stage/BUILD.txt" "$out/BUILD.txt"
size=$(du -sb "$out" | cut -f1)
if [ "$size" -gt "$max_bytes" ]; then
  echo "gpu-bundle: $out is $size bytes, over the 60 MiB limit" >&2
  exit 1
fi
echo "gpu-bundle: $out ($((size / 1024 / 1024)) MiB); run it with: bash $out/run.sh LOGDIR"
