#!/usr/bin/python3
"""PyTorch's explicit attention, softmax(Q Kᵀ/√d) V, on the cases of `cabm bench attention`,
printing the same columns so the two tables can be put side by side (docs/attention_performance.md).

    /usr/bin/python3 bench/attention_pytorch.py [--n 256,1024] [--d 64] [--masks none,causal,window,bigbird,padding]
        [--heads 8] [--batch 1] [--repeats 5] [--threads 2] [--backward] [--peak-gflops X] [--cabm PATH]

With --cabm (a cabm binary, e.g. build/release/cabm) the same cases first run through
`cabm bench attention --json` in the same process tree, and a side-by-side markdown table
follows PyTorch's (times, the ratio, memory, cabm's % of the FMA peak it measured).

Same conventions as cabm: inputs are head views of one [B, N, 3·H·d] projection; GFLOP/s counts
4·B·H·d·pairs forward and 2.5× that backward, pairs = attended (query, key) pairs only (PyTorch
computes all N² scores whatever the mask: the convention credits it only with the useful ones).
Masks: window = 256 keys, own position included, causal side; bigbird = blocks of 64, one local
block each side, one global block, two random blocks per query block (own random draw: the same
pair count as cabm's layout when 64 divides N). The backward row times forward+backward minus
forward (medians). mem: peak RSS increase during the calls (VmHWM reset via /proc/self/clear_refs),
inputs excluded. %peak needs --peak-gflops (from `cabm bench attention`: "FMA peak").
"""
import argparse
import json
import math
import subprocess
import time

import torch

WINDOW = 256
BLOCK = 64


def rss_field(name):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    return 0


class MemoryProbe:
    def __enter__(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        self.base = rss_field("VmRSS")
        return self

    def __exit__(self, *exc):
        self.increase = max(0, rss_field("VmHWM") - self.base)


def allowed_mask(name, N):
    """BOOL [N, N], True = may attend (None: no mask)."""
    i = torch.arange(N).unsqueeze(1)
    j = torch.arange(N).unsqueeze(0)
    if name == "none":
        return None
    if name == "causal":
        return j <= i
    if name == "window":
        return (j <= i) & (j > i - WINDOW)
    if name == "bigbird":
        nb = (N + BLOCK - 1) // BLOCK
        blocks = torch.zeros(nb, nb, dtype=torch.bool)
        for qb in range(nb):
            blocks[qb, max(0, qb - 1):qb + 2] = True
        blocks[:, :1] = True
        blocks[:1, :] = True
        gen = torch.Generator().manual_seed(0)
        for qb in range(nb):
            rest = (~blocks[qb]).nonzero().flatten()
            take = min(2, rest.numel())
            if take:
                blocks[qb, rest[torch.randperm(rest.numel(), generator=gen)[:take]]] = True
        return blocks.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:N, :N]
    if name == "padding":  # cabm bench attention's: the last N/4 keys padding
        return (j < N - N // 4).expand(N, N)
    raise SystemExit(f"--masks: unknown mask '{name}' (expected none, causal, window, bigbird or padding)")


def attention(q, k, v, bias):
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if bias is not None:
        s = s + bias
    return torch.matmul(torch.softmax(s, dim=-1), v)


def timed(repeats, call):
    call()  # warm-up
    times = []
    with MemoryProbe() as probe:
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    times.sort()
    n = len(times)
    med = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    return med, probe.increase


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]
    p.add_argument("--n", type=ints, default=[256, 1024])
    p.add_argument("--d", type=ints, default=[64])
    p.add_argument("--masks", type=lambda s: s.split(","), default=["none", "causal", "window", "bigbird"])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--backward", action="store_true")
    p.add_argument("--peak-gflops", type=float, default=0.0)
    p.add_argument("--cabm", default="", help="cabm binary: run its bench on the same cases, print both side by side")
    a = p.parse_args()
    cabm = run_cabm(a) if a.cabm else None
    if cabm and not a.peak_gflops:
        a.peak_gflops = cabm["peak_gflops"]
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    B, H = a.batch, a.heads
    print(f"PyTorch {torch.__version__} explicit attention, threads {torch.get_num_threads()}, B {B}, H {H}, "
          f"repeats {a.repeats} (median)")
    print(f"%peak against {a.peak_gflops:.1f} GFLOP/s (cabm's FMA peak)" if a.peak_gflops else "%peak: pass --peak-gflops")
    print(f"{'N':>6} {'d':>5} {'mask':<8} {'pass':<8} {'time_ms':>10} {'GFLOP/s':>9} {'%peak':>6} {'mem_MiB':>8}")
    torch_rows = []
    for d in a.d:
        for mask in a.masks:
            for N in a.n:
                allowed = allowed_mask(mask, N)
                pairs = (N * N if allowed is None else int(allowed.sum())) * B * H
                bias = None if allowed is None else torch.zeros(N, N).masked_fill(~allowed, float("-inf"))
                qkv = torch.rand(B, N, 3, H, d) * 2 - 1
                q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, N, d] views
                flops = 4.0 * pairs * d
                with torch.no_grad():
                    fwd, fwd_mem = timed(a.repeats, lambda: attention(q, k, v, bias))
                rows = [("forward", flops, fwd, fwd_mem)]
                if a.backward:
                    qkv_g = qkv.clone().requires_grad_(True)
                    qg, kg, vg = (qkv_g[:, :, i].transpose(1, 2) for i in range(3))
                    dout = torch.rand(B, H, N, d) * 2 - 1

                    def step():
                        qkv_g.grad = None
                        attention(qg, kg, vg, bias).backward(dout)

                    both, both_mem = timed(a.repeats, step)
                    rows.append(("backward", 2.5 * flops, max(both - fwd, 1e-9), both_mem))
                for name, fl, sec, mem in rows:
                    pct = f"{100.0 * fl / sec * 1e-9 / a.peak_gflops:.1f}" if a.peak_gflops else "-"
                    print(f"{N:>6} {d:>5} {mask:<8} {name:<8} {sec * 1e3:>10.3f} {fl / sec * 1e-9:>9.2f} {pct:>6} "
                          f"{mem / 2**20:>8.1f}", flush=True)
                    torch_rows.append((N, d, mask, name, sec * 1e3, mem))
    if cabm:
        print_side_by_side(torch_rows, cabm)


def run_cabm(a):
    """`cabm bench attention --json` on the cases of these arguments."""
    cmd = [a.cabm, "bench", "attention", "--n", *map(str, a.n), "--d", *map(str, a.d), "--masks", *a.masks,
           "--heads", str(a.heads), "--batch", str(a.batch), "--repeats", str(a.repeats),
           "--threads", str(a.threads), "--json"] + (["--backward"] if a.backward else [])
    try:
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"--cabm: {' '.join(cmd)} failed: {getattr(e, 'stderr', '') or e}")
    return json.loads(done.stdout)


def print_side_by_side(torch_rows, cabm):
    ours = {(c["N"], c["d"], c["mask"], c["pass"]): c for c in cabm["cases"]}
    print(f"\ncabm ({cabm['kernel_isa']} kernels) beside PyTorch, {cabm['threads']} threads, B {cabm['batch']}, "
          f"H {cabm['heads']}; FMA peak {cabm['peak_gflops']:.1f} GFLOP/s\n")
    print("| N | d | mask | pass | PyTorch ms | cabm ms | speed-up | PyTorch MiB | cabm MiB | cabm % of peak |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for N, d, mask, name, ms, mem in torch_rows:
        c = ours.get((N, d, mask, name))
        if c is None:
            continue
        print(f"| {N} | {d} | {mask} | {name} | {ms:.1f} | {c['time_ms']:.1f} | {ms / c['time_ms']:.2f}x | "
              f"{mem / 2**20:.1f} | {c['memory_bytes'] / 2**20:.1f} | {c['percent_peak']:.1f} |")


if __name__ == "__main__":
    main()
