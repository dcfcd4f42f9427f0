#!/usr/bin/env python3
"""Turns text files into llm.c token shards, the training data of a run
with "data": {"kind": "shards"} (docs/operations.md, "Training on token
shards").

A shard is a header of 256 little-endian int32 (magic 20240520, version 1,
the number of tokens, zeros) and then the tokens as little-endian uint16.
Each input file is one document; with the GPT-2 tokenizer every document
starts with <|endoftext|> (50256), as llm.c's FineWeb shards do. The first
--val-tokens tokens go to NAME_val_000000.bin (never served to peers); the
rest fill NAME_train_000001.bin, ... of at most --shard-tokens each.

Tokenizer: --tokenizer gpt2 needs python3's tiktoken (with its GPT-2
encoding available offline) or transformers' GPT2TokenizerFast (with its
files cached); --tokenizer bytes makes one token per byte (vocab_size 256),
which needs nothing; auto (the default) takes GPT-2 when one loads and
says which it took. The last line printed is the "data" and "model"
vocab_size to put in the run configuration.

Usage: make-shards.py [--tokenizer auto|gpt2|bytes] [--shard-tokens N]
                      [--val-tokens N] [--name NAME] OUT_DIR INPUT...
Exits 0, or 2 with one line on stderr and no shard written.
"""
import argparse
import array
import json
import os
import struct
import sys

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
GPT2_EOT = 50256
GPT2_VOCAB = 50257
# The reader refuses shards of more than INT32_MAX tokens; llm.c writes
# 100 M per shard.
MAX_SHARD_TOKENS = 2**31 - 1
# Text is read and encoded a piece at a time (split at a line end), so a
# large file never sits in memory whole.
READ_BYTES = 1 << 20


def die(msg):
    print(f"make-shards: {msg}", file=sys.stderr)
    sys.exit(2)


def gpt2_encoder():
    """(encode, description) for GPT-2's BPE, or (None, why not)."""
    why = []
    try:
        import tiktoken

        enc = tiktoken.get_encoding("gpt2")
        return (lambda s: enc.encode_ordinary(s)), "GPT-2 (tiktoken)"
    except Exception as e:  # absent, or its encoding cannot be fetched offline
        why.append(f"tiktoken: {type(e).__name__}")
    try:
        from transformers import GPT2TokenizerFast

        tok = GPT2TokenizerFast.from_pretrained("gpt2", local_files_only=True)
        return (lambda s: tok.encode(s)), "GPT-2 (transformers)"
    except Exception as e:
        why.append(f"transformers: {type(e).__name__}")
    return None, "; ".join(why)


class Writer:
    """Cuts the token stream into the validation shard and training
    shards, each written to a temporary name and renamed when complete."""

    def __init__(self, out, name, val_tokens, shard_tokens):
        self.out, self.name = out, name
        self.val_left = val_tokens
        self.shard_tokens = shard_tokens
        self.buf = array.array("H")  # 2 bytes a token, not a Python int's 28
        self.index = 0  # 0: the validation shard
        self.written = []

    def path(self):
        kind = "val" if self.index == 0 else "train"
        return os.path.join(self.out, f"{self.name}_{kind}_{self.index:06d}.bin")

    def limit(self):
        return self.val_left if self.index == 0 else self.shard_tokens

    def add(self, tokens):
        pos = 0
        while pos < len(tokens):
            room = self.limit() - len(self.buf)
            self.buf.extend(tokens[pos:pos + room])
            pos += room
            if len(self.buf) >= self.limit():
                self.flush()

    def flush(self):
        if not self.buf:
            if self.index == 0:
                self.index = 1  # --val-tokens 0: no validation shard
            return
        final = self.path()
        tmp = final + ".part"
        header = struct.pack(f"<{HEADER_INTS}i", MAGIC, VERSION, len(self.buf),
                             *([0] * (HEADER_INTS - 3)))
        with open(tmp, "wb") as f:
            f.write(header)
            if sys.byteorder == "big":
                self.buf.byteswap()
            self.buf.tofile(f)
        os.replace(tmp, final)
        self.written.append((final, len(self.buf)))
        self.buf = array.array("H")
        self.index += 1


def pieces(path):
    """The file's text, READ_BYTES at a time, each piece ending at a line
    end where there is one (so no word is cut between two encodings)."""
    with open(path, "rb") as f:
        rest = b""
        while True:
            chunk = f.read(READ_BYTES)
            if not chunk:
                if rest:
                    yield rest
                return
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                if len(data) < 4 * READ_BYTES:
                    rest = data
                    continue
                cut = len(data)  # one very long line: cut anyway
            yield data[:cut]
            rest = data[cut:]


def main():
    ap = argparse.ArgumentParser(description="text files to llm.c token shards")
    ap.add_argument("--tokenizer", choices=("auto", "gpt2", "bytes"), default="auto")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    ap.add_argument("--val-tokens", type=int, default=1_000_000)
    ap.add_argument("--name", default="text")
    ap.add_argument("out")
    ap.add_argument("inputs", nargs="+")
    a = ap.parse_args()
    if not 1 <= a.shard_tokens <= MAX_SHARD_TOKENS:
        die(f"--shard-tokens {a.shard_tokens} is outside [1, {MAX_SHARD_TOKENS}]")
    if not 0 <= a.val_tokens <= MAX_SHARD_TOKENS:
        die(f"--val-tokens {a.val_tokens} is outside [0, {MAX_SHARD_TOKENS}]")
    if not a.name or "/" in a.name or a.name.startswith("."):
        die(f"--name '{a.name}' must be a plain file-name prefix")
    for p in a.inputs:
        if not os.path.isfile(p):
            die(f"no such file: {p}")
    encode, desc = None, ""
    if a.tokenizer in ("auto", "gpt2"):
        encode, desc = gpt2_encoder()
        if encode is None and a.tokenizer == "gpt2":
            die(f"no GPT-2 tokenizer could be loaded ({desc})")
    if encode is None:
        note = f" (no GPT-2 tokenizer: {desc})" if a.tokenizer == "auto" else ""
        print(f"make-shards: byte-level tokens, vocab_size 256{note}")
        vocab = 256
    else:
        print(f"make-shards: {desc} tokens, vocab_size {GPT2_VOCAB}")
        vocab = GPT2_VOCAB
    os.makedirs(a.out, exist_ok=True)
    w = Writer(a.out, a.name, a.val_tokens, a.shard_tokens)
    total = 0
    for p in a.inputs:
        if encode is not None:
            w.add([GPT2_EOT])
            total += 1
        for piece in pieces(p):
            toks = list(piece) if encode is None else encode(piece.decode("utf-8", "replace"))
            w.add(toks)
            total += len(toks)
    w.flush()
    train = [p for p, _ in w.written if "_train_" in p]
    val = [p for p, _ in w.written if "_val_" in p]
    for p, n in w.written:
        print(f"make-shards: {p}: {n} tokens")
    if not train:
        for p, _ in w.written:
            os.remove(p)
        die(f"{total} tokens: none left for a training shard after --val-tokens {a.val_tokens}")
    print(f"make-shards: {total} tokens from {len(a.inputs)} files into {len(w.written)} shards")
    data = {"kind": "shards", "train": train}
    if val:
        data["val"] = val[0]
    print(json.dumps({"data": data, "model": {"vocab_size": vocab}}))


main()
