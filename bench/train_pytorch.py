#!/usr/bin/env python3
"""PyTorch twin of `cabm train` (task lm), for the side-by-side benchmark in
bench/train_compare.sh (see docs/training.md). Runs on Debian's PyTorch 1.13 or a current one;
--precision bf16 trains under CPU autocast, as `cabm train --precision bf16` does.

Same architecture (token + learned position embeddings -> nn.TransformerEncoder with
batch_first, norm_first, GELU, causal mask, final LayerNorm -> tied head), same
hyper-parameters (AdamW with decay on matrices only, linear warm-up + cosine decay to 0.1 lr,
clip 1.0), same data split (a UTF-8 file, the last 10% held out from a line boundary, as
cabm's load_text_file), same validation windows (up to 64 windows of T + 1 bytes spread
evenly over the held-out text). Training windows are, by default, the very windows `cabm train`
draws for the same --seed (its Philox4x32-10 stream and Lemire's multiply-shift, reimplemented
below), so the two frameworks see the same batches in the same order and differ only in their
arithmetic; --windows torch draws them from torch's generator instead (identically distributed,
different batches).

Writes the initial weights (--init-out, safetensors with cabm's names, so `cabm train --init`
starts from the same point) and prints one JSON line of results.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


MASK32, MASK64 = 0xFFFFFFFF, (1 << 64) - 1


def splitmix64(x):  # cabm/nn/forward_mode.h
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def philox4x32(seed, counter_hi, counter_lo):  # cabm/core/rng.cpp
    c0, c1 = counter_lo & MASK32, counter_lo >> 32
    c2, c3 = counter_hi & MASK32, counter_hi >> 32
    k0, k1 = seed & MASK32, seed >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
        k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
    return c0, c1, c2, c3


class CabmWindows:
    """The training-window offsets of `cabm train`: Rng(data_seed(seed)) of cabm/train/lm_trainer.cpp
    (host stream of cabm/core/rng.h) and sample_windows of cabm/io/text_data.cpp."""

    HOST_STREAM = 0xC0FFEE << 32

    def __init__(self, seed):
        self.seed = splitmix64(seed ^ 0xDA7A5EED)
        self.position = 0

    def next_u32(self):
        p = self.position
        self.position += 1
        return philox4x32(self.seed, self.HOST_STREAM, p // 4)[p % 4]

    def offsets(self, count, n, T):
        return [(self.next_u32() * (n - T)) >> 32 for _ in range(count)]


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu().float()
        data = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(path + ".tmp", path)


class CausalLM(nn.Module):
    def __init__(self, V, T, E, H, L, FF, dropout):
        super().__init__()
        self.embed = nn.Embedding(V, E)
        self.pos_embed = nn.Embedding(T, E)
        self.drop = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(E, H, FF, dropout=dropout, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, L, norm=nn.LayerNorm(E), enable_nested_tensor=False)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos_embed.weight, std=0.02)
        self.register_buffer("mask", torch.triu(torch.full((T, T), float("-inf")), diagonal=1), persistent=False)

    def forward(self, tokens):
        n = tokens.shape[1]
        x = self.drop(self.embed(tokens) + self.pos_embed(torch.arange(n)))
        h = self.encoder(x, mask=self.mask[:n, :n])
        return h @ self.embed.weight.t()


def split_text(data, fraction=0.1):
    """cabm's load_text_file: the last `fraction`, moved to the next line start if near."""
    cut = int(len(data) * (1.0 - fraction))
    nl = data.find(b"\n", cut)
    if nl != -1 and nl + 1 < len(data) and nl + 1 - cut <= int(len(data) * fraction / 4):
        cut = nl + 1
    return data[:cut], data[cut:]


def evaluation_offsets(n, T, max_windows):
    last = n - T - 1
    count = max(1, min(max_windows, last // T + 1))
    return [0] if count == 1 else [i * last // (count - 1) for i in range(count)]


def lr_at(step, lr, warmup, total, min_ratio=0.1):
    if step <= warmup:
        return lr * step / warmup
    if total <= warmup:
        return lr
    progress = min(1.0, (step - warmup) / (total - warmup))
    min_lr = lr * min_ratio
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--d-ff", type=int, default=512)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: the forward and loss under torch.autocast('cpu', torch.bfloat16), the mixed "
                         "precision of `cabm train --precision bf16` (bf16 products, fp32 master weights and "
                         "optimizer); needs a PyTorch whose CPU autocast covers its matmuls (1.10 or newer)")
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--windows", choices=["cabm", "torch"], default="cabm",
                    help="training windows: cabm's for the same --seed (default) or torch's generator")
    ap.add_argument("--log-interval", type=int, default=0, help="print the mean loss every N steps (stderr)")
    ap.add_argument("--init-out", help="write the initial weights here (safetensors, cabm names)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    V, T, B = 256, args.seq_len, args.batch_size
    with open(args.data, "rb") as f:
        train, val = split_text(f.read())
    train_t = torch.frombuffer(bytearray(train), dtype=torch.uint8).long()
    val_t = torch.frombuffer(bytearray(val), dtype=torch.uint8).long()

    model = CausalLM(V, T, args.d_model, args.heads, args.layers, args.d_ff, args.dropout)
    if args.init_out:
        meta = {"model": "CausalLM", "vocab_size": V, "max_seq_len": T, "d_model": args.d_model, "nhead": args.heads,
                "num_layers": args.layers, "dim_feedforward": args.d_ff, "dropout": args.dropout,
                "activation": "gelu", "norm_first": "true", "layer_norm_eps": 1e-5, "tie_head": "true",
                "positional": "learned", "tokenizer": "bytes"}
        write_safetensors(args.init_out, dict(model.state_dict()), meta)

    named = list(model.named_parameters())
    decay = [p for n, p in named if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in named if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr)

    def evaluate():
        model.eval()
        offsets = evaluation_offsets(len(val_t), T, args.eval_windows)
        total = 0.0
        with torch.no_grad():
            for i in range(0, len(offsets), B):
                chunk = offsets[i:i + B]
                x = torch.stack([val_t[o:o + T] for o in chunk])
                y = torch.stack([val_t[o + 1:o + T + 1] for o in chunk])
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                    logits = model(x)
                total += F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1)).item() * len(chunk)
        model.train()
        return total / len(offsets)

    model.train()
    cabm_windows = CabmWindows(args.seed)
    train_seconds, losses = 0.0, []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        if args.windows == "cabm":
            offs = cabm_windows.offsets(B, len(train_t), T)
        else:
            offs = torch.randint(0, len(train_t) - T, (B,))
        x = torch.stack([train_t[o:o + T] for o in offs])
        y = torch.stack([train_t[o + 1:o + T + 1] for o in offs])
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.lr, args.warmup, args.steps)
        opt.step()
        train_seconds += time.perf_counter() - start
        losses.append(loss.item())
        if args.log_interval and step % args.log_interval == 0:
            print(f"step {step}/{args.steps} | loss {sum(losses[-args.log_interval:]) / args.log_interval:.4f}",
                  file=sys.stderr, flush=True)
    val = evaluate()
    print(json.dumps({"framework": "pytorch " + torch.__version__, "threads": args.threads, "steps": args.steps,
                      "precision": args.precision,
                      "tokens_per_second": args.steps * B * T / train_seconds, "train_seconds": train_seconds,
                      "final_train_loss": sum(losses[-10:]) / len(losses[-10:]), "val_loss": val,
                      "val_bits_per_byte": val / math.log(2)}))


if __name__ == "__main__":
    main()
