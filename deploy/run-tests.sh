#!/usr/bin/env bash
# Installs what volley needs, then builds and runs every test twice: an
# optimised build with warnings as errors (CUDA kernels compiled when nvcc
# is present; GPU tests skip themselves without a GPU), and an
# AddressSanitizer + UndefinedBehaviorSanitizer build. Last, a clang build
# runs each libFuzzer target of tests/fuzz for VOLLEY_FUZZ_SECONDS (20)
# seconds under ASan and UBSan and prints the executions each made.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash deploy/install-deps.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"

echo "== release build (-Werror, VOLLEY_CUDA=AUTO)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DVOLLEY_WERROR=ON -DVOLLEY_CUDA=AUTO >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== sanitizer build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DVOLLEY_WERROR=ON -DVOLLEY_SANITIZE=ON \
  -DVOLLEY_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"
echo "== fuzz build (clang, libFuzzer + ASan + UBSan), ${VOLLEY_FUZZ_SECONDS:-20} s per target"
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DVOLLEY_WERROR=ON -DVOLLEY_FUZZ=ON -DVOLLEY_FUZZ_SECONDS="${VOLLEY_FUZZ_SECONDS:-20}" >/dev/null
cmake --build build-fuzz -j"$jobs"
rm -rf build-fuzz/tests/fuzz/fuzz-results
ctest --test-dir build-fuzz --output-on-failure -j"$jobs"
cat build-fuzz/tests/fuzz/fuzz-results/*.txt
echo "== all tests passed in both builds, and every fuzz target ran clean"
