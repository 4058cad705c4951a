// The vector instruction sets of the kernels that are compiled once per set and chosen at run
// time (the split-key decode kernel, attention/decode.h, and the tiled attention kernel,
// attention/flash.h, with the bf16 kernels' fp32 SIMD path). Each such kernel is built for
// every set in the same binary, whatever the build's own flags (CABM_NATIVE=OFF included), and
// calls the widest one this CPU and OS run, so that one binary is fast on every x86-64 CPU.
//   kAvx512   AVX-512 F, BW, DQ, VL (16 fp32 lanes)
//   kAvx2     AVX2 + FMA (8 lanes)
//   kPortable plain C++ (the compiler may vectorise it for the build's flags)
// CABM_SIMD_ISA=portable|avx2|avx512 in the environment (read at first use) or
// set_simd_isa_override() pins a set, so tests and benchmarks can compare them; an unknown name
// or a set the CPU lacks is an error (UsageError for the variable).
#pragma once

#include <cstdint>
#include <optional>

namespace cabm {

enum class SimdIsa { kPortable, kAvx2, kAvx512 };

// Whether this CPU and OS run code for `isa` (CPUID and the OS-enabled vector state, as GCC's
// __builtin_cpu_supports reports them), within cpu_isa_cap(). kPortable: always.
bool cpu_supports(SimdIsa isa);

// The most this CPU is taken to have: CABM_MAX_CPU_ISA=portable|avx2|avx512|avx512_bf16|amx_bf16
// in the environment (read at first use; each includes the ones before it) caps what cabm sees of
// the CPU, as ONEDNN_MAX_CPU_ISA does for oneDNN (cabm sets neither library's). cpu_supports() and
// bf16.h's cpu_has_avx512_bf16() and cpu_has_amx_bf16() then answer as on a CPU with no more than
// that, and every choice made from them (the SIMD set, the bf16 units, the tiles) is that CPU's:
// a binary runs here the kernels it runs on an older CPU (scripts/imitated_cpu_check.sh), or keeps
// off a unit. Unset or empty: kNone, no cap. Another value is a UsageError naming the variable.
enum class CpuIsaCap { kPortable, kAvx2, kAvx512, kAvx512Bf16, kAmxBf16, kNone };
CpuIsaCap cpu_isa_cap();
const char* cpu_isa_cap_name(CpuIsaCap cap);  // the variable's value; "none" for kNone

// The widest set cpu_supports(), whatever the override or CABM_SIMD_ISA say.
SimdIsa widest_simd_isa();

// The set the dispatched kernels use now: the override, else CABM_SIMD_ISA, else the widest that
// cpu_supports().
SimdIsa simd_isa();

// Pins the set (nullopt: back to the default). A CABM_CHECK fails for a set the CPU lacks. Not
// meant to be changed while kernels run on other threads.
void set_simd_isa_override(std::optional<SimdIsa> isa);

const char* simd_isa_name(SimdIsa isa);  // "portable", "avx2", "avx512"

// Bytes of one core's L2 cache as the OS reports it (1 MiB where it reports none), read once: the
// kernels that prefetch size what they ask for by it.
int64_t cpu_l2_bytes();
// The same for one core's L1 data cache (32 KiB where the OS reports none).
int64_t cpu_l1d_bytes();

// 512-bit FMAs one core retires per cycle, measured once per machine on the calling core (kept in
// the wisdom file, machine_wisdom.h, as every process must choose the same attention tiles): a
// register-only FMA loop against a chain of dependent integer multiplies, 3 cycles each on every
// x86-64 core (unit_loops.h; best of 8 interleaved rounds of about 0.1 ms). About 2 on cores
// with two 512-bit FMA pipes (the Intel Xeons measured, family 6 models 167 and 207), 1 where a
// 512-bit FMA takes both 256-bit pipes (AMD Zen 4); 0 where the CPU lacks AVX-512.
double avx512_fmas_per_cycle();

}  // namespace cabm
