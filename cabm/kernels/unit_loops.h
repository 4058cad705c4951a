// Register-only loops that run one product unit of this CPU flat out: fp32 FMAs in each SIMD set
// of cpu_isa.h, AVX512_BF16's vdpbf16ps and AMX's tdpbf16ps. Each runs `iterations` rounds of
// independent multiply-adds (enough chains to cover latency × pipes), writes a value derived from
// its accumulators to *sink (so that nothing is optimised away) and returns the FLOPs it did
// (2 per multiply-add; bf16 pairs accumulated in fp32 count 2 per pair product).
//
// `cabm bench` times them on every thread for the peaks it prints (cli/bench_util.h); the bf16
// kernels time the FMA and vdpbf16ps loops once per machine (machine_wisdom.h) on one core to choose between their
// vdpbf16ps and widened fp32 products (vdpbf16ps_to_fma_rate() in bf16.h), and the tile rules
// the FMA loop against a multiply chain to count FMA pipes (avx512_fmas_per_cycle(), cpu_isa.h).
// Each loop is compiled for its instruction set by target attribute whatever the build's flags,
// and may only be called where the CPU has that set (cpu_isa.h's cpu_supports,
// cpu_has_avx512_bf16, cpu_has_amx_bf16).
#pragma once

#include <cstdint>

namespace cabm::detail {

double fma_loop_avx512(int64_t iterations, float* sink);
double fma_loop_avx2(int64_t iterations, float* sink);
double fma_loop_scalar(int64_t iterations, float* sink);  // the portable set: a multiply and an add
double vdpbf16ps_loop(int64_t iterations, float* sink);
double amx_loop(int64_t iterations, float* sink);  // needs the tile permission cpu_has_amx_bf16() asks for

// A chain of dependent 64-bit integer multiplies, 3 cycles each on every x86-64 core since the
// Core 2 and the first Zen: a clock to count the other loops' instructions per cycle by
// (cpu_isa.h's avx512_fmas_per_cycle). Returns the cycles it took (3 per multiply). Not adds: a
// chain of add-immediates ran at 4 per cycle on the model 207 Xeon (its renamer folds them).
double imul_chain_cycles(int64_t iterations);

}  // namespace cabm::detail
