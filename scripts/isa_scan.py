#!/usr/bin/python3
"""Fails when a portable build's binary holds AVX, AVX2 or AVX-512 code outside cabm's run-time
dispatched variants: code that a CPU without that set would die on (SIGILL) if it ever ran.

A portable build (-DCABM_NATIVE=OFF) compiles for baseline x86-64 (SSE2); only the kernels'
variants are compiled for wider sets, each inside a target region or under a target attribute
(kernels/simd_set_*_begin.h, the CABM_AVX512_BF16 and CABM_AMX attributes), and called after
CPUID said yes. The emulated checks (scripts/emulated_cpu_check.sh) catch a leak only on the
paths their tests run; this reads every function of the binary instead. A leak looks like a
library function (std::, fmt::, a cabm class's inline method) whose body holds VEX or EVEX
instructions: an inline function that a target region instantiated and the linker kept in place
of the baseline copy, or a variant's body called without its dispatch.

It disassembles each binary (objdump -d -C), sorts every function by the widest instructions it
holds (EVEX, i.e. zmm registers, xmm16-31, opmask registers, AVX512_BF16 or AMX instructions; else
VEX), and checks the function's name against the variants' names below. A new kernel variant
whose name has no ISA marker belongs in KNOWN_VARIANTS.

Usage: isa_scan.py BINARY... (e.g. build/portable/cabm build/portable/tests/test_*)
Exit status: 0 when only variants hold such code, 1 when another function does, 2 on an error.
Meaningless on a native build (-march=native puts the CPU's sets everywhere): it says so and
exits 2 when the binary's baseline code (main) holds VEX instructions.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from typing import NoReturn

# EVEX-only operands and instructions; AMX tile instructions.
EVEX = re.compile(r"%zmm|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|%k[0-7]\b|vdpbf16ps|vcvtne2?ps2bf16|"
                  r"tdpbf16ps|tileloadd|tilestored|tilezero|ldtilecfg|sttilecfg|tilerelease")
# Any VEX- or EVEX-encoded instruction: the mnemonics start with v (vzeroupper included).
VEX = re.compile(r"^v[a-z0-9]+\b|%ymm")
# Names of the dispatched variants: an ISA in the name or namespace (the per-set namespaces of
# simd_set_*_begin.h, gelu_avx512::, *_avx2 and *_avx512 functions, the AMX code)...
ISA_MARKER = re.compile(r"avx2|avx512|amx|Avx2|Avx512|Amx|Vdpbf16ps|vdpbf16ps_loop|"
                        r"HardwareTiles|EmulatedTiles")
# ...and the vdpbf16ps kernels whose names do not say it (CABM_AVX512_BF16, bf16_avx512.h and
# flash_bf16_backward.cpp).
KNOWN_VARIANTS = re.compile(r"cabm::detail::(\(anonymous namespace\)::)?(scores_block|pv_block|"
                            r"scores_softmax_block|softmax_rows_nv|softmax_rows_of_kind|pack_row_pairs|"
                            r"tile_gradients)\b")


def fail(message: str) -> NoReturn:
    print(f"isa_scan: {message}", file=sys.stderr)
    sys.exit(2)


def functions(binary: str) -> dict[str, str]:
    """Function name -> 'evex' or 'vex' for every function holding such code."""
    objdump = shutil.which("objdump")
    if objdump is None:
        fail("needs objdump (Debian: binutils)")
    proc = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", binary], capture_output=True, text=True)
    if proc.returncode != 0:
        fail(f"objdump failed on {binary}: {proc.stderr.strip()}")
    widest: dict[str, str] = {}
    name = None
    for line in proc.stdout.splitlines():
        if line.endswith(">:"):
            name = line[line.index("<") + 1:-2]
            continue
        if name is None or "\t" not in line:
            continue
        # The instruction without objdump's comments and symbol names (a call to
        # vdpbf16ps_to_fma_rate() is not a vdpbf16ps).
        insn = re.sub(r"#.*|<[^>]*>", "", line.split("\t", 1)[1]).strip()
        if EVEX.search(insn):
            widest[name] = "evex"
        elif VEX.search(insn) and widest.get(name) != "evex":
            widest[name] = "vex"
    return widest


def main() -> int:
    if len(sys.argv) < 2:
        print(next(line for line in __doc__.splitlines() if line.startswith("Usage:")), file=sys.stderr)
        return 2
    leaks = 0
    for binary in sys.argv[1:]:
        widest = functions(binary)
        if widest.get("main") is not None:
            print(f"isa_scan: {binary}: main() holds {widest['main'].upper()} code: a native build, "
                  "where every function may; scan a -DCABM_NATIVE=OFF build", file=sys.stderr)
            return 2
        counts = Counter(widest.values())
        bad = sorted(f for f in widest if not ISA_MARKER.search(f) and not KNOWN_VARIANTS.search(f))
        print(f"{binary}: {counts['evex']} functions with AVX-512 code, {counts['vex']} with AVX/AVX2 code, "
              f"{len(bad)} outside the variants")
        for f in bad:
            print(f"  {widest[f].upper()} in {f}")
        leaks += len(bad)
    return 1 if leaks else 0


if __name__ == "__main__":
    sys.exit(main())
