#!/usr/bin/env bash
# Installs what volley needs, then builds and runs every test twice: an
# optimised build with warnings as errors (CUDA kernels compiled when nvcc
# is present; GPU tests skip themselves without a GPU), and an
# AddressSanitizer + UndefinedBehaviorSanitizer build. With nvcc, it builds
# the GPU bundle and runs it from a clean environment. A ThreadSanitizer
# build runs the coordinator's threaded tests. Last, a clang build
# runs each libFuzzer target of tests/fuzz for VOLLEY_FUZZ_SECONDS (20)
# seconds under ASan and UBSan and prints the executions each made.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# The long mode (VOLLEY_LONG_TESTS=1): 200 simulated power cuts instead
# of 20 (integration_powercut, about 10 minutes more).
if [ -n "${VOLLEY_LONG_TESTS:-}" ]; then export POWERCUT_CUTS=${POWERCUT_CUTS:-200}; fi

bash deploy/install-deps.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"

echo "== release build (-Werror, VOLLEY_CUDA=AUTO)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DVOLLEY_WERROR=ON -DVOLLEY_CUDA=AUTO >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

# The GPU bundle (deploy/gpu-bundle.sh) is built and run the way a bare GPU
# machine runs it: from a clean environment, with only the libraries the
# bundle brings and the short list it may take from the machine. Here,
# without a GPU, its GPU parts report themselves skipped and the rest
# (every library resolving, the same run on the CPU) must pass.
if command -v nvcc >/dev/null 2>&1; then
  echo "== GPU bundle: built, then run under env -i"
  VOLLEY_SKIP_DEPS=1 bash deploy/gpu-bundle.sh gpu-bundle
  env -i PATH=/usr/bin:/bin bash gpu-bundle/run.sh build-bundle/check >/dev/null ||
    { cat build-bundle/check/log.txt; echo "GPU bundle: a check failed" >&2; exit 1; }
  cat build-bundle/check/summary.txt
else
  echo "== GPU bundle: skipped, no nvcc"
fi

echo "== sanitizer build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DVOLLEY_WERROR=ON -DVOLLEY_SANITIZE=ON \
  -DVOLLEY_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"
# ThreadSanitizer on the coordinator's threads (event loop, writer,
# compute, background scoring, nonce journal): its threaded unit tests, and
# the round, attack, stale, connection, crash, split and loss-guard tests (the
# crash test's upload storm is the ingest path; split_flight's peers send
# batches from several threads, overlap's upload from a thread of its own
# while the next task trains; loss_guard's last phase scores versions on
# the background thread).
# Any report aborts the process, which fails the test.
echo "== ThreadSanitizer build (coordinator threads)"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVOLLEY_WERROR=ON -DVOLLEY_TSAN=ON \
  -DVOLLEY_CUDA=OFF >/dev/null
cmake --build build-tsan -j"$jobs" --target test_coordinator test_coord_config test_auth test_merge \
  test_guard test_limits test_async test_longpoll test_writer_full volley-coordinator volley-peer volley_attack \
  volley_make_shard volley_hostile_peer bench_ingest
TSAN_OPTIONS="halt_on_error=1:abort_on_error=1:second_deadlock_stack=1" \
  ctest --test-dir build-tsan --output-on-failure -j"$jobs" \
  -R '^(test_(coordinator|coord_config|auth|merge|guard|limits|async|longpoll|writer_full)|integration_(round|attack|stale|conns|crash|split|split_flight|overlap|loss_guard))$'
echo "== fuzz build (clang, libFuzzer + ASan + UBSan), ${VOLLEY_FUZZ_SECONDS:-20} s per target"
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DVOLLEY_WERROR=ON -DVOLLEY_FUZZ=ON -DVOLLEY_FUZZ_SECONDS="${VOLLEY_FUZZ_SECONDS:-20}" >/dev/null
cmake --build build-fuzz -j"$jobs"
rm -rf build-fuzz/tests/fuzz/fuzz-results
ctest --test-dir build-fuzz --output-on-failure -j"$jobs"
cat build-fuzz/tests/fuzz/fuzz-results/*.txt
# The Debian packages in a debootstrapped bookworm root (deploy/package-test.sh,
# several minutes, the network and root): long mode only; it says SKIP
# where it cannot run.
if [ -n "${VOLLEY_LONG_TESTS:-}" ]; then
  echo "== Debian packages in a fresh Debian 12 root"
  rc=0
  bash deploy/package-test.sh || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || exit "$rc"
fi
echo "== all tests passed in the release, sanitizer and ThreadSanitizer builds, and every fuzz target ran clean"
