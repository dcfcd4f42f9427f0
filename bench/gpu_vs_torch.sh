#!/usr/bin/env bash
# volley's GPU training step and compressors against PyTorch on the same
# card, in the same run: runs bench_gpu_train (bf16), bench_gpu_compress
# and bench/torch_ref.py (PyTorch eager and, with --compile, torch.compile),
# then prints one table of ratios.
#
#   bench/gpu_vs_torch.sh BINDIR [--compile]
#
# BINDIR holds bench_gpu_train and bench_gpu_compress (build/bench, or a GPU
# bundle's bin/); torch_ref.py is looked for beside this script, then in
# BINDIR. PYTHON (default python3; a command, split on spaces) must import
# torch with CUDA. Model FLOPs
# utilisation is against the card's dense bf16 peak from its datasheet
# (PEAK_TFLOPS, default 989 for the H100 and H200 SXM) and against a bf16
# 8192^3 product measured in the same run.
set -uo pipefail
bin=${1:?usage: gpu_vs_torch.sh BINDIR [--compile]}
shift
here=$(cd "$(dirname "$0")" && pwd)
ref=$here/torch_ref.py
[ -f "$ref" ] || ref=$bin/torch_ref.py
py=${PYTHON:-python3}
peak=${PEAK_TFLOPS:-989}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== bench_gpu_train --math bf16"
"$bin/bench_gpu_train" --math bf16 | tee "$tmp/train.txt"
echo "== bench_gpu_compress"
"$bin/bench_gpu_compress" | tee "$tmp/compress.txt"
echo "== torch_ref.py $*"
# Unquoted: PYTHON may be a command with its environment ("env VAR=... python3").
$py "$ref" "$@" | tee "$tmp/torch.txt"

# torch NAME: the value torch_ref printed for NAME, or empty.
torch() { awk -v k="$1" '$1 == k { print $2 }' "$tmp/torch.txt"; }
# vms NAME: milliseconds of volley's compressor row NAME.
vms() { awk -v k="$1" 'index($0, k "  ") == 1 { for (i = 1; i <= NF; i++) if ($i == "ms") { print $(i-1); exit } }' "$tmp/compress.txt"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "n/a"; else printf "%.2f", a / b }'; }

read -r vstep vtok vtf < <(awk '$1 == "GPT-2" && $6 == "bf16" { print $7, $8, $9 }' "$tmp/train.txt")
gemm=$(torch gemm.bf16_8192.tflops)
echo
echo "| comparison | volley | PyTorch | ratio (volley / PyTorch; for times PyTorch / volley) |"
echo "|---|---|---|---|"
for mode in eager compile; do
  ttok=$(torch "train.gpt2.$mode.tok_s")
  [ -n "$ttok" ] || continue
  echo "| GPT-2 124M bf16, B 8 × T 1024, tokens/s ($mode) | ${vtok:-n/a} | $ttok | $(ratio "${vtok:-}" "$ttok") |"
done
echo "| GPT-2 124M bf16 step, ms | ${vstep:-n/a} | $(torch train.gpt2.eager.step_ms) (eager) | $(ratio "$(torch train.gpt2.eager.step_ms)" "${vstep:-}") |"
mfu() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "n/a"; else printf "%.1f %%", 100 * a / b }'; }
echo "| model FLOPs utilisation, of $peak TF/s datasheet peak | $(mfu "${vtf:-}" "$peak") | $(mfu "$(torch train.gpt2.eager.tflops)" "$peak") (eager) | target ≥ 40 % |"
echo "| model FLOPs utilisation, of the measured bf16 GEMM (${gemm:-n/a} TF/s) | $(mfu "${vtf:-}" "${gemm:-}") | $(mfu "$(torch train.gpt2.eager.tflops)" "${gemm:-}") (eager) | |"
row() { # label, volley row name, torch key
  local v t
  v=$(vms "$2"); t=$(torch "$3")
  echo "| $1, ms | ${v:-n/a} | ${t:-n/a} | $(ratio "$t" "$v")× |"
}
row "exact top-k, k = d/1000 (torch.topk)" "exact top-k, k = d/1000" compress.topk_d1000_ms
row "exact top-k, k = d/100 (torch.topk)" "exact top-k, k = d/100" compress.topk_d100_ms
row "Count Sketch encode, 5 rows, 100× (index_add_)" "sketch encode r=5 (100x)" compress.sketch_ms
row "Gaussian-k, k = d/100" "gaussian-k, k = d/100" compress.gaussk_ms
row "sparse scatter-add, d/100 values (index_add_)" "sparse scatter-add, d/100" compress.scatter_ms
vc=$(vms "cudaMemcpy D2D"); vs=$(vms "sketch encode r=5 (100x)")
echo "| sketch encode against the device copy of d floats | $(ratio "$vc" "$vs")× copy | $(ratio "$(torch compress.copy_ms)" "$(torch compress.sketch_ms)")× copy | target ≥ 0.3× |"
