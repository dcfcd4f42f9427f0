#!/usr/bin/env bash
# Runs volley's GPU checks from a bundle made by deploy/gpu-bundle.sh, on a
# machine that has (at most) an NVIDIA driver and a CUDA 13 runtime with
# cuBLAS and NCCL somewhere: nothing is built or installed here.
#
#   run.sh OUTDIR [--with-torch]
#
# In one go: the machine's GPU (nvidia-smi), a check that every program's
# libraries resolve to the bundle or to the short list a GPU machine
# provides, every GPU test program, the GPU branch of test_peer_device, a
# coordinator and two `volley-peer --device cuda` over TLS on 127.0.0.1
# training the demo model (the loss must fall), the out-of-memory fallback
# of `--device auto` (forced with --gpu-mem), and the two GPU benchmarks at
# a short setting. Without a GPU every GPU part reports itself skipped and
# the rest (libraries, the CPU half of the tests, the same run on the CPU)
# still has to pass. OUTDIR gets log.txt (everything) and summary.txt (one
# line per check, then "bundle: N passed, N failed, N skipped").
# With --with-torch it then runs bench/gpu_vs_torch.sh (volley's training
# step and compressors against PyTorch eager and torch.compile on the same
# card) with the first python3 that imports torch with CUDA, into
# OUTDIR/torch.txt; that takes a few minutes more.
# Exit status: 0 when nothing failed, 1 otherwise, 2 for bad usage.
#
# Where the libraries a GPU machine provides are looked for, first hit
# wins (the log names each one found):
#   libcuda.so.1 (driver)  LD_LIBRARY_PATH, /usr/local/nvidia/lib64, the
#                          system's paths (ldconfig)
#   libcublas.so.13,       LD_LIBRARY_PATH, /usr/local/cuda*/lib64 and
#   libcublasLt.so.13,     targets/x86_64-linux/lib, then the nvidia/*/lib
#   libnccl.so.2           folders of every Python's site-packages (the
#                          CUDA 13 wheels: nvidia/cu13/lib, nvidia/nccl/lib),
#                          then ldconfig
# The C and C++ runtimes are the system's; everything else comes from the
# bundle's lib/.
# Knobs (environment): VOLLEY_BUNDLE_VERSIONS (6) versions in the training
# run, VOLLEY_BUNDLE_TEST_TIMEOUT (180) seconds per test program,
# VOLLEY_BUNDLE_ONLY (all of them) the parts to run, of: tests train oom
# task bench torch (the library check always runs), for a second try of
# one part when the GPU's time is short.
set -uo pipefail
with_torch=0
if [ $# -eq 2 ] && [ "$2" = --with-torch ]; then with_torch=1
elif [ $# -ne 1 ]; then set -- ""; fi
if [ -z "$1" ]; then
  echo "usage: run.sh OUTDIR [--with-torch]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1" || { echo "run.sh: cannot create $1" >&2; exit 2; }
out=$(cd "$1" && pwd)
log=$out/log.txt
summary=$out/summary.txt
: > "$log"
: > "$summary"
exec > >(tee -a "$log") 2>&1

export PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
test_timeout=${VOLLEY_BUNDLE_TEST_TIMEOUT:-180}
versions=${VOLLEY_BUNDLE_VERSIONS:-6}
only=${VOLLEY_BUNDLE_ONLY:-tests train oom task bench torch}
# want PART: whether PART is to run.
want() { case " $only " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
npass=0 nfail=0 nskip=0
pass() { npass=$((npass + 1)); echo "PASS $*" | tee -a "$summary"; }
fail() { nfail=$((nfail + 1)); echo "FAIL $*" | tee -a "$summary"; }
skip() { nskip=$((nskip + 1)); echo "SKIP $*" | tee -a "$summary"; }
section() { printf '\n==== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
t0=$(date +%s)

work=$(mktemp -d "${TMPDIR:-/tmp}/volley-gpu.XXXXXX") || exit 1
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

section "bundle"
if ! tar -xzf "$here/volley-gpu.tar.gz" -C "$work"; then
  echo "run.sh: $here/volley-gpu.tar.gz does not unpack"
  fail "unpack"
  echo "bundle: 0 passed, 1 failed, 0 skipped" | tee -a "$summary"
  exit 1
fi
cat "$work/BUILD.txt"
bin=$work/bin

# ---- the libraries a GPU machine provides ------------------------------------
py_lib_dirs() {
  local py sp
  for py in python3 /opt/*/.venv/bin/python3 /opt/*/bin/python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" -c 'import site, sys
for p in site.getsitepackages() + [site.getusersitepackages()]: print(p)' 2>/dev/null
  done | sort -u | while read -r sp; do
    for d in "$sp"/nvidia/*/lib; do [ -d "$d" ] && echo "$d"; done
  done
  # The same folders where no Python answers.
  for d in /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
           /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
    [ -d "$d" ] && echo "$d"
  done
}
caller_dirs=${LD_LIBRARY_PATH:-}
cand=()
IFS=: read -r -a cand <<< "$caller_dirs"
cand+=(/usr/local/nvidia/lib64 /usr/local/nvidia/lib)
for c in /usr/local/cuda /usr/local/cuda-13*; do
  cand+=("$c/lib64" "$c/lib" "$c/targets/x86_64-linux/lib")
done
while read -r d; do cand+=("$d"); done < <(py_lib_dirs)
cand+=(/usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu)

find_lib() {
  local d
  for d in "${cand[@]}"; do
    [ -n "$d" ] && [ -e "$d/$1" ] && { echo "$d"; return 0; }
  done
  ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { sub(/\/[^\/]*$/, "", $NF); print $NF; exit }'
}
libpath=$work/lib
for l in libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  d=$(find_lib "$l")
  if [ -n "$d" ]; then
    echo "found $l in $d"
    case ":$libpath:" in *":$d:"*) ;; *) libpath=$libpath:$d ;; esac
  else
    echo "not found: $l"
  fi
done
export LD_LIBRARY_PATH=$libpath${caller_dirs:+:$caller_dirs}
export OPENSSL_CONF=$work/etc/openssl.cnf
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

section "nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi || true
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || true
else
  echo "nvidia-smi: not on this machine"
fi

# ---- every library resolves to the bundle or to what a GPU machine has ------
section "libraries"
# What may come from outside the bundle (etc/machine-libs.regex says why).
allowed=$(grep -v '^#' "$work/etc/machine-libs.regex")
libs_ok=1
for f in "$bin"/* "$work"/lib/*.so*; do
  head -c 4 "$f" 2>/dev/null | grep -q 'ELF' || continue
  while read -r line; do
    name=${line%% *}
    name=${name##*/}
    case "$line" in
      *"not found"*)
        echo "$(basename "$f"): $name not found"; libs_ok=0 ;;
      *"=> $work/"*) ;;
      *)
        if ! [[ "$name" =~ $allowed ]]; then
          echo "$(basename "$f"): $line resolves outside the bundle"; libs_ok=0
        fi ;;
    esac
  done < <(ldd "$f" 2>&1 | sed 's/^[[:space:]]*//')
done
if [ "$libs_ok" = 1 ]; then pass "libraries: every program's libraries resolve"
else fail "libraries: see log.txt"; fi

# ---- is there a GPU? ---------------------------------------------------------
section "device"
gpu=0
if "$bin/volley-peer" device --device cuda; then gpu=1; fi
"$bin/volley-peer" device --device auto || true

# ---- test programs -----------------------------------------------------------
# Exit 0 passes, 77 is ctest's skip (no GPU, or fewer GPUs than the test
# needs), anything else fails; a GPU test that skips on a machine that has
# a GPU is a failure unless it needs more than one device.
run_test() {
  local name=$1 rc s e
  section "$name"
  s=$(date +%s.%N)
  (cd "$work" && OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=1 timeout "$test_timeout" \
    "$bin/$name") 2>&1 | tee "$work/$name.out"
  rc=${PIPESTATUS[0]}
  e=$(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" = 0 ]; then pass "$name (${e} s)"
  elif [ "$rc" = 77 ] && { [ "$gpu" = 0 ] || [ "$name" = test_model_cuda_multi ]; }; then
    skip "$name: $(grep -a 'SKIPPED' "$work/$name.out" | tail -n 1 | cut -c1-160)"
  elif [ "$rc" = 124 ]; then fail "$name: timed out after $test_timeout s"
  else fail "$name: exit $rc"; fi
}
want tests && for t in test_kernels_cuda test_compress_cuda test_model_cuda test_model_cuda_bf16 \
    test_model_cuda_dp test_model_cuda_multi test_gpu_memory test_peer_gpu test_peer_nopeek_gpu \
    test_peer_device; do
  run_test "$t"
done

# ---- a coordinator and two peers over TLS ------------------------------------
# start_coordinator DIR VERSIONS UPDATES [CONFIG]: init and serve a run of
# CONFIG (share/run.json, the demo model) in DIR; sets port and cpid.
start_coordinator() {
  local dir=$1 config=${4:-run.json}
  mkdir -p "$dir" && cd "$dir" || return 1
  bash "$bin/make-cert.sh" tls 127.0.0.1 localhost >/dev/null || return 1
  sed -e "s|@CORPUS@|$work/share/corpus.txt|" -e "s|@VERSIONS@|$2|" -e "s|@UPDATES@|$3|" \
    "$work/share/$config" > run.json
  "$bin/volley-coordinator" init --db run.db --config run.json 2> init.log || {
    cat init.log; return 1; }
  cat init.log
  "$bin/volley-coordinator" serve --db run.db --cert tls/server.pem --key tls/server.key \
    --listen 127.0.0.1:0 2> coordinator.log &
  cpid=$!
  pids+=("$cpid")
  port=""
  for _ in $(seq 1 100); do
    port=$(grep -o 'listening on 127.0.0.1:[0-9]*' coordinator.log | head -n1 | cut -d: -f2)
    [ -n "$port" ] && return 0
    kill -0 "$cpid" 2>/dev/null || { cat coordinator.log; return 1; }
    sleep 0.1
  done
  return 1
}
# join_peer N: a key, a token and a join for peer N of the current run.
join_peer() {
  local token
  "$bin/volley-peer" keygen --dir "peer$1" >/dev/null &&
  token=$("$bin/volley-coordinator" token create --db run.db --uses 1 --ttl 1h) &&
  "$bin/volley-peer" join --dir "peer$1" --coordinator "https://127.0.0.1:$port" \
    --token "$token" --cacert tls/ca.pem --name "bundle-peer-$1" >/dev/null
}
stop_coordinator() {
  kill -TERM "$cpid" 2>/dev/null
  wait "$cpid"
}

train_run() {
  local dev=$1 name="training: coordinator + 2 peers --device $1 over TLS, $versions versions"
  section "$name"
  if ! start_coordinator "$work/run-$dev" "$versions" 2; then
    fail "$name: the coordinator did not start"; return
  fi
  local ppids=() ok=1 i
  for i in 1 2; do
    join_peer "$i" || { fail "$name: peer $i could not join"; stop_coordinator; return; }
    timeout 300 "$bin/volley-peer" run --dir "peer$i" --device "$dev" --threads 4 --wait 20 \
      2> "peer$i.log" &
    ppids+=($!)
  done
  for p in "${ppids[@]}"; do wait "$p" || ok=0; done
  stop_coordinator || ok=0
  tail -n 4 peer1.log peer2.log
  grep -h 'val_loss' init.log coordinator.log
  local first last n
  first=$(grep -ho 'version 0 val_loss [0-9.]*' init.log | awk '{print $4}')
  last=$(grep -ho "version $versions val_loss [0-9.]*" coordinator.log | awk '{print $4}')
  n=$(grep -c 'training on CUDA device' peer1.log peer2.log | awk -F: '{s += $2} END {print s}')
  if [ "$ok" != 1 ]; then fail "$name: a peer or the coordinator exited with an error"
  elif [ "$dev" = cuda ] && [ "$n" != 2 ]; then fail "$name: the peers did not train on the GPU"
  elif grep -q 'training on the CPU from now on' peer1.log peer2.log; then
    fail "$name: a peer left the GPU"
  elif [ -z "$first" ] || [ -z "$last" ]; then fail "$name: the run did not reach version $versions"
  elif awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }'; then
    pass "$name: validation loss $first -> $last"
  else fail "$name: the loss did not fall enough ($first -> $last)"; fi
}
if ! want train; then :
elif [ "$gpu" = 1 ]; then train_run cuda; else
  skip "training on the GPU: no usable GPU"
  train_run cpu
fi

# ---- --device auto falls back to the CPU when the GPU's memory runs out -----
oom_fallback() {
  local name="out-of-memory fallback: --device auto --gpu-mem 1 trains on the CPU"
  section "$name"
  if ! start_coordinator "$work/run-oom" 1 1; then
    fail "$name: the coordinator did not start"; return
  fi
  local ok=1
  join_peer 1 || ok=0
  [ "$ok" = 1 ] && { timeout 300 "$bin/volley-peer" run --dir peer1 --device auto \
    --gpu-mem 1 --threads 8 --wait 20 2> peer1.log || ok=0; }
  stop_coordinator || ok=0
  cat peer1.log
  if [ "$ok" != 1 ]; then fail "$name: the peer or the coordinator failed"
  elif ! grep -q 'training on CUDA device' peer1.log; then fail "$name: the peer did not start on the GPU"
  elif ! grep -q 'cudaErrorMemoryAllocation.*training on the CPU from now on' peer1.log; then
    fail "$name: no out-of-memory fallback in the peer's log"
  elif ! grep -q 'version 1 val_loss' coordinator.log; then
    fail "$name: the CPU-trained update was not merged"
  else pass "$name"; fi
}
if ! want oom; then :
elif [ "$gpu" = 1 ]; then oom_fallback; else skip "out-of-memory fallback: no usable GPU"; fi

# ---- one whole task of a GPT-2-small-sized model -----------------------------
# A 12 x 768 model (85 M parameters, byte vocabulary), 40 local steps of
# 8 x 1024 tokens on the GPU, its Count Sketch (100x) made on the device,
# uploaded to a coordinator on 127.0.0.1: two versions of one update, so
# the second task is a peer's steady state (a delta download, not the
# whole model). Each task's time is split by the peer's own summary line;
# the share spent training is reported against the 90 % target.
whole_task() {
  local name="whole task: 12 x 768 model, 40 steps of 8 x 1024, sketch 100x, --device cuda"
  section "$name"
  if ! start_coordinator "$work/run-task" 2 1 task.json; then
    fail "$name: the coordinator did not start"; return
  fi
  local ok=1
  join_peer 1 || ok=0
  [ "$ok" = 1 ] && { timeout 400 "$bin/volley-peer" run --dir peer1 --device cuda \
    --threads 8 --wait 60 2> peer1.log || ok=0; }
  stop_coordinator || ok=0
  cp peer1.log "$out/task-peer.log"; cp coordinator.log "$out/task-coordinator.log"
  grep -h 'val_loss' init.log coordinator.log
  grep 'time: download' peer1.log
  if [ "$ok" != 1 ] || [ "$(grep -c 'time: download' peer1.log)" -lt 2 ]; then
    tail -n 20 peer1.log; fail "$name: the peer or the coordinator failed"; return
  fi
  grep 'time: download' peer1.log | sed 's/.*time: //' | awk -v out="$out/task.txt" '
    { gsub(/[,s]/, ""); d = $2; t = $4; c = $6; u = $8; all = d + t + c + u
      printf "task %d: download %.3f s, train %.3f s, compress %.3f s, upload %.3f s: training %.1f %% of %.3f s\n",
        NR, d, t, c, u, 100 * t / all, all > out }'
  cat "$out/task.txt"
  pass "$name: $(tail -n 1 "$out/task.txt" | sed 's/.*: training/training/') (target above 90 %)"
}
if ! want task; then :
elif [ "$gpu" = 1 ]; then whole_task; else skip "whole task: no usable GPU"; fi

# ---- the GPU benchmarks, short -----------------------------------------------
run_bench() {
  local name=$1 rc
  shift
  section "$name $*"
  (cd "$work" && timeout 150 "$bin/$name" "$@")
  rc=$?
  if [ "$rc" = 0 ]; then pass "$name $*"
  elif [ "$rc" = 77 ] && [ "$gpu" = 0 ]; then skip "$name: no usable GPU"
  else fail "$name $*: exit $rc"; fi
}
want bench && run_bench bench_gpu_compress --reps 3
want bench && run_bench bench_gpu_train --quick

# ---- against PyTorch on the same card ----------------------------------------
if [ "$with_torch" = 1 ] && want torch; then
  section "against PyTorch (bench/gpu_vs_torch.sh --compile)"
  torch_py=""
  for py in python3 /opt/*/.venv/bin/python3 /opt/*/bin/python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    if env LD_LIBRARY_PATH="$caller_dirs" "$py" -c \
        'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
      torch_py=$py; break
    fi
  done
  if [ "$gpu" = 0 ]; then skip "against PyTorch: no usable GPU"
  elif [ -z "$torch_py" ]; then skip "against PyTorch: no python3 here imports torch with CUDA"
  # Python gets the machine's libraries, not the bundle's older OpenSSL and zlib.
  elif PYTHON="env LD_LIBRARY_PATH=$caller_dirs $torch_py" timeout 420 \
         bash "$bin/gpu_vs_torch.sh" "$bin" --compile \
         > "$out/torch.txt" 2>&1; then
    cat "$out/torch.txt"; pass "against PyTorch: table in torch.txt"
  else cat "$out/torch.txt"; fail "against PyTorch: see torch.txt"; fi
fi

section "summary"
elapsed=$(( $(date +%s) - t0 ))
echo "bundle: ran in $elapsed s" >> "$summary"
echo "bundle: $npass passed, $nfail failed, $nskip skipped" >> "$summary"
cat "$summary"
[ "$nfail" = 0 ]
