#!/usr/bin/env bash
# Sync against async with one peer 4x slower, on a machine with a core or
# two per peer (the 2-core development machine runs 4 peers on 2 cores):
# the bundle's programs, CPU peers with 2 threads each, the demo task.
# "base" runs sync-slow (outer 0.7/0.9, SYNC_VERSIONS versions of 4) and
# async-slow (the async defaults, 2 updates a version, twice the updates);
# "variants" runs async without dynamic steps and async with 4 updates a
# version and delay 2. Each run's coordinator log and a summary go to
# OUTDIR. CORPUS is a text file (default the bundle's license texts).
# Usage: bash async-check.sh OUTDIR [SYNC_VERSIONS] [base|variants] [CORPUS]
set -u
out=$1; sv=${2:-20}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/volley-ac.XXXXXX)
tar -xzf "$here/volley-gpu.tar.gz" -C "$work" || exit 1
nccl=$(ls -d /opt/torch/.venv/lib/python*/site-packages/nvidia/nccl/lib 2>/dev/null | head -n1)
export LD_LIBRARY_PATH=$work/lib:/usr/local/nvidia/lib64:/usr/local/cuda/lib64${nccl:+:$nccl}
export OPENSSL_CONF=$work/etc/openssl.cnf
export PATH=$work/bin:$PATH
bin=$work/bin
corpus=${4:-$work/share/corpus.txt}
# run NAME MODE UPV VERSIONS EXTRA_JSON (members, each followed by a comma)
run() {
  local d=$work/$1 port="" cpid pids=() t0 t1
  mkdir -p "$d" && cd "$d" || return 1
  bash "$bin/make-cert.sh" tls 127.0.0.1 localhost >/dev/null 2>&1 || { echo "$1: cert failed"; return 1; }
  cat > run.json <<JSON
{"name": "$1", "corpus": "$corpus", "val_fraction": 0.1, "seed": 1337, "val_tokens": 32768,
 "model": {"vocab_size": 256, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 128},
 "mode": "$2", "updates_per_version": $3, "max_versions": $4,
 "train": {"steps": 20, "batch": 8, "optimizer": "adamw", "lr": 0.002, "beta1": 0.9,
           "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0, "grad_clip": 1.0${6:-}},
 $5
 "compression": {"kind": "none", "dtype": "F32"}, "task_bytes": 65536, "lease_s": 120}
JSON
  "$bin/volley-coordinator" init --db run.db --config run.json 2> init.log || { cat init.log; return 1; }
  t0=$(date +%s.%N)
  "$bin/volley-coordinator" serve --db run.db --cert tls/server.pem --key tls/server.key \
    --listen 127.0.0.1:0 --compute-threads 4 2> coordinator.log &
  cpid=$!
  for _ in $(seq 1 100); do
    port=$(grep -o 'listening on 127.0.0.1:[0-9]*' coordinator.log | head -n1 | cut -d: -f2)
    [ -n "$port" ] && break; sleep 0.1
  done
  for i in 1 2 3 4; do
    "$bin/volley-peer" keygen --dir "p$i" >/dev/null
    tok=$("$bin/volley-coordinator" token create --db run.db --uses 1 --ttl 1h)
    "$bin/volley-peer" join --dir "p$i" --coordinator "https://127.0.0.1:$port" --token "$tok" \
      --cacert tls/ca.pem --name "p$i" >/dev/null 2>&1
    s=1; [ "$i" = 1 ] && s=4
    "$bin/volley-peer" run --dir "p$i" --device cpu --threads 2 --wait 20 --slowdown "$s" \
      2> "p$i.log" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  t1=$(date +%s.%N)
  kill -TERM "$cpid"; wait "$cpid"
  cp coordinator.log "$out/$1-coordinator.log"
  awk -v a="$t0" -v b="$t1" -v n="$1" 'BEGIN { printf "%s: %.1f s\n", n, b - a }' | tee -a "$out/summary.txt"
  grep -o 'version [0-9]* val_loss [0-9.]*' coordinator.log | tail -n 1 | tee -a "$out/summary.txt"
}
nproc | tee "$out/summary.txt"
case ${3:-base} in
  base)
    run sync-slow sync 4 "$sv" '"outer": {"lr": 0.7, "momentum": 0.9},'
    run async-slow async 2 $((sv * 4)) '' ;;
  variants)
    run async-nodylu async 2 $((sv * 4)) '' ', "dynamic_steps": false'
    run async-k4n2 async 4 $((sv * 2)) '"outer": {"lr": 0.7, "momentum": 0.9, "delay": 2},' ;;
esac
