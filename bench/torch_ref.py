#!/usr/bin/env python3
"""PyTorch baselines for volley's GPU benchmarks, on the same card in the same run.

The model is volley's GPT (model/gpt.c) written again in PyTorch: learned
token and position embeddings, pre-LayerNorm blocks with a fused q|k|v
projection, tanh GELU, a final LayerNorm and the output projection tied to
the token embedding; AdamW with the hyper-parameters bench_gpu_train uses.
Mixed precision is autocast to bf16 over fp32 master weights, the closest
PyTorch has to volley's bf16 products on fp32 tensors. A training step is
zero_grad, forward, backward and the optimizer, as bench_gpu_train times it.

The compressors do in PyTorch what volley's do on the device, at the same d:
torch.topk of |x|; Count Sketch encode with volley's hash (splitmix64 of
DESIGN.md, computed in int64 with wrap-around) as one index_add_ per row,
the way FetchSGD's reference code builds its table (the hashes are made
before the clock starts, as that code keeps them in memory); Gaussian-k as
a threshold from the mean and standard deviation and a nonzero; a sparse
scatter-add as index_add_. Each is timed with CUDA events, best of --reps.

Prints one line per figure, `name value unit`, so bench/gpu_vs_torch.sh can
read it. Usage: torch_ref.py [--train] [--compress] [--compile] [--tiny]
  --tiny: a 2-layer, 64-wide model and d = 100 000, on the CPU when there
          is no GPU (a check of the script itself, not a measurement).
"""
import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        shape = (B, T, self.H, C // self.H)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, L, H, C):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        # model_gpt_init_weights: N(0, 0.02) matrices and embeddings, the
        # residual projections N(0, 0.02 / sqrt(2 L)), zero biases, unit gains.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def train(label, cfg, B, dev, compiled, min_s):
    V, T, L, H, C = cfg
    torch.manual_seed(1)
    model = GPT(V, T, L, H, C).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    # fused AdamW is PyTorch's fastest eager optimizer on CUDA.
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=dev.type == "cuda")
    fwd = torch.compile(model) if compiled else model
    idx = torch.randint(0, V, (B, T), device=dev)
    tgt = torch.randint(0, V, (B, T), device=dev)
    use_bf16 = dev.type == "cuda"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss = fwd(idx, tgt)
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):  # warm-up: allocator, cuBLAS heuristics, compilation
        step()
    sync(dev)
    # The host queues steps ahead of the device; the last sync counts them all.
    steps, t0 = 0, time.perf_counter()
    while steps < 3 or (steps < 200 and time.perf_counter() - t0 < min_s):
        loss = step()
        steps += 1
    sync(dev)
    dt = (time.perf_counter() - t0) / steps
    mode = "compile" if compiled else "eager"
    tok = B * T / dt
    # Model FLOPs as bench/train_flops.h counts them.
    flops = 6.0 * (12 * L * C * C + V * C) * B * T + 6.0 * L * B * T * T * C
    print(f"train.{label}.{mode}.params {nparams} count")
    print(f"train.{label}.{mode}.step_ms {dt * 1e3:.3f} ms")
    print(f"train.{label}.{mode}.tok_s {tok:.0f} tok/s")
    print(f"train.{label}.{mode}.tflops {flops / dt / 1e12:.3f} TF/s")
    print(f"train.{label}.{mode}.loss {loss.item():.4f} nats")
    sys.stdout.flush()


def best_of(reps, dev, fn):
    fn()
    sync(dev)
    best = math.inf
    for _ in range(reps):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    return best


def to_i64(u):
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return u - (1 << 64) if u >= (1 << 63) else u


def shr(z, s):
    """Logical right shift of int64 bits (PyTorch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def mix64(z):
    """splitmix64 of DESIGN.md on int64 tensors (wrap-around = mod 2^64)."""
    z = z + to_i64(0x9E3779B97F4A7C15)
    z = (z ^ shr(z, 30)) * to_i64(0xBF58476D1CE4E5B9)
    z = (z ^ shr(z, 27)) * to_i64(0x94D049BB133111EB)
    return z ^ shr(z, 31)


def sketch_hashes(d, rows, cols, seed, dev):
    """Per row: the bucket and sign volley's windowed sketch hash gives each
    coordinate (docs/design.md): windows of 2^L coordinates, L = min(10,
    floor(log2 cols)), start at a hashed bucket per row; one hash per
    coordinate gives every row's sign."""
    out = []
    i = torch.arange(d, device=dev, dtype=torch.int64)
    wlog = min(10, cols.bit_length() - 1)
    skey = mix64(torch.tensor([to_i64(seed)], dtype=torch.int64, device=dev))
    sbits = mix64(i ^ skey)
    for r in range(rows):
        key = mix64(torch.tensor([seed ^ (r + 1)], dtype=torch.int64, device=dev))
        h = mix64(shr(i, wlog) ^ key)
        base = (shr(h, 32) * cols) >> 32  # (h >> 32) * cols < 2^63: no overflow
        bucket = (base + (i & ((1 << wlog) - 1))) % cols
        sign = 1.0 - 2.0 * (shr(sbits, r) & 1).to(torch.float32)
        out.append((bucket, sign))
    return out


def gemm_peak(reps, dev):
    """bf16 matrix product at 8192^3: what the card's tensor cores give here."""
    n = 8192 if dev.type == "cuda" else 256
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=dev, dtype=dt)
    b = torch.randn(n, n, device=dev, dtype=dt)
    t = best_of(reps, dev, lambda: a @ b)
    print(f"gemm.bf16_8192.tflops {2.0 * n ** 3 / t / 1e12:.1f} TF/s")
    sys.stdout.flush()


def compress(d, reps, dev):
    torch.manual_seed(7)
    x = torch.randn(d, device=dev)
    y = torch.empty_like(x)
    copy = best_of(reps, dev, lambda: y.copy_(x))
    print(f"compress.copy_ms {copy * 1e3:.4f} ms")
    for div in (1000, 100):
        k = d // div
        t = best_of(reps, dev, lambda: torch.topk(x.abs(), k, sorted=False))
        print(f"compress.topk_d{div}_ms {t * 1e3:.4f} ms")
    rows, cols = 5, max(1, d // 100 // 5)
    hashes = sketch_hashes(d, rows, cols, 42, dev)
    table = torch.zeros(rows, cols, device=dev)

    def encode():
        table.zero_()
        for r, (bucket, sign) in enumerate(hashes):
            table[r].index_add_(0, bucket, sign * x)

    t = best_of(reps, dev, encode)
    print(f"compress.sketch_ms {t * 1e3:.4f} ms")
    del hashes
    k = d // 100
    # The threshold that leaves k of d standard normal values above it.
    z = math.sqrt(2.0) * torch.erfinv(torch.tensor(1.0 - k / d, dtype=torch.float64)).item()

    def gaussk():
        mu, sd = x.mean(), x.std()
        return torch.nonzero(((x - mu).abs() > z * sd)).squeeze(1)

    t = best_of(reps, dev, gaussk)
    print(f"compress.gaussk_ms {t * 1e3:.4f} ms")
    idx = torch.randperm(d, device=dev)[:k].sort().values
    vals = torch.randn(k, device=dev)
    t = best_of(reps, dev, lambda: y.index_add_(0, idx, vals))
    print(f"compress.scatter_ms {t * 1e3:.4f} ms")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--compress", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=3.0)
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args()
    if not a.train and not a.compress:
        a.train = a.compress = True
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu" and not a.tiny:
        print("torch_ref: SKIPPED: no CUDA device for PyTorch", flush=True)
        return 77
    torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    print(f"torch_ref: torch {torch.__version__} on {name}", flush=True)
    cfg = (256, 64, 2, 4, 64) if a.tiny else (50257, 1024, 12, 12, 768)
    label = "tiny" if a.tiny else "gpt2"
    rc = 0
    try:
        gemm_peak(a.reps, dev)
    except Exception as e:
        print(f"torch_ref: GEMM failed: {type(e).__name__}: {e}", flush=True)
        rc = 1
    if a.train:
        for compiled in (False, True) if a.compile else (False,):
            try:
                train(label, cfg, a.batch, dev, compiled, 0.2 if a.tiny else a.min_seconds)
            except Exception as e:  # one failed mode must not hide the others' figures
                print(f"torch_ref: training ({'compile' if compiled else 'eager'}) failed: "
                      f"{type(e).__name__}: {e}", flush=True)
                rc = 1
    if a.compress:
        try:
            compress(100_000 if a.tiny else 124_439_808, a.reps, dev)
        except Exception as e:
            print(f"torch_ref: compressors failed: {type(e).__name__}: {e}", flush=True)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
