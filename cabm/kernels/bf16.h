// bfloat16 buffers: conversion to and from fp32, and the run-time choice of the instruction set
// the bf16 kernels (conversion, gemm_bf16, attention_flash_bf16) use.
//
// Two paths for the bf16 kernels, bit-for-bit identical for conversions:
//   avx512_bf16  AVX-512 F/BW/VL + BF16 (vcvtne2ps2bf16, vdpbf16ps); compiled with function-level
//                target attributes, so the library builds for any x86-64 (CABM_NATIVE=OFF too),
//                and chosen only when CPUID (and the OS's saved vector state) says it runs.
//   portable     plain C++ on the scalar rules of cabm/core/dtype.h (the compiler may vectorise it).
// Conversions have a third path, avx2 (integer AVX2, chosen without avx512_bf16 when the SIMD set
// of cpu_isa.h is avx2 or wider and the portable path is not forced), equally bit-exact.
// The choice is made once from CPUID; CABM_FORCE_PORTABLE=1 in the environment (read at first
// use) or set_bf16_isa_override() forces the portable path, so tests can compare both.
//
// On CPUs with AMX-BF16 tiles, kernels that have an AMX path (attention_flash_bf16's forward) take
// it under kAuto (bf16_amx_active()); set_bf16_isa_override(kAvx512Bf16) or CABM_NO_AMX=1 keeps
// them on the avx512_bf16 path, so tests and benchmarks can compare the two.
#pragma once

#include "cabm/core/dtype.h"
#include "cabm/core/tensor.h"

#include <cstdint>
#include <string>

namespace cabm {

enum class Bf16Isa { kAuto, kPortable, kAvx512Bf16 };

// Whether this CPU (and OS) can run AVX-512 F/BW/VL/BF16 code: CPUID leaf 7 subleaf 0 EBX bits
// 16/30/31, subleaf 1 EAX bit 5, and XCR0 enabling the opmask and zmm state; false under a
// CABM_MAX_CPU_ISA below avx512_bf16 (cpu_isa.h).
bool cpu_has_avx512_bf16();

// Whether this CPU and OS can run AMX-BF16 tile code: CPUID leaf 7 subleaf 0 EDX bits 22
// (AMX-BF16) and 24 (AMX-TILE), XCR0 bits 17/18 (tile config and data state), and on Linux the
// permission to use the tile data state, requested once per process on the first call
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); refused → false); false, with nothing
// requested, under a CABM_MAX_CPU_ISA below amx_bf16 (cpu_isa.h). Thread-safe.
bool cpu_has_amx_bf16();

// kAuto (the default) selects avx512_bf16 where cpu_has_avx512_bf16() and CABM_FORCE_PORTABLE is
// not set; kPortable forces the portable path; kAvx512Bf16 requests the fast path (a CABM_CHECK
// fails if the CPU lacks it). Not meant to be changed while kernels run on other threads.
void set_bf16_isa_override(Bf16Isa isa);

// The path the bf16 kernels take now (after the override and the environment).
Bf16Isa bf16_active_isa();
// Whether the AMX paths run: the override is kAuto, bf16_active_isa() is kAvx512Bf16,
// cpu_has_amx_bf16(), and CABM_NO_AMX (read at first use) is unset or "0".
bool bf16_amx_active();

// Where AVX512_BF16 runs without an AMX path, the bf16 kernels (attention_flash_bf16, gemm_bf16)
// multiply either with vdpbf16ps (16 lanes × 2 bf16 pairs per instruction) or with fp32 FMAs on
// the bf16 values widened to fp32 (exact; the same roundings at the same points, so the same
// contract). vdpbf16ps does twice an FMA's multiply-adds per instruction but not per cycle on
// every CPU: the Zen 4 and Zen 5 run it at 2.0× their FMA loop's multiply-adds, the Intel Xeons
// measured (family 6 models 167 and 207) at 0.5×, where the vdpbf16ps attention ran at 0.53–0.80×
// the fp32 kernel's speed and the widened one at 0.85–1.23× (docs/mixed_precision.md, session 34).
//
// vdpbf16ps_to_fma_rate(): multiply-adds per second of vdpbf16ps over fp32 FMAs on the calling
// core (unit_loops.h's loops, best of 8 interleaved rounds of about 0.1 ms each), measured once
// per machine (kept in the wisdom file, machine_wisdom.h: the unit changes the bits of a result,
// so every process must take the same); 0 where the CPU lacks AVX512_BF16.
double vdpbf16ps_to_fma_rate();
// Whether the bf16 kernels take vdpbf16ps. Never where bf16_active_isa() is not kAvx512Bf16; else
// the first that applies: set_bf16_products_override (tests, comparisons); the isa override
// kAvx512Bf16 (yes); bf16_amx_active() (no: the tiles); the environment's CABM_BF16_PRODUCTS,
// read at the first call ("vdpbf16ps" or "fp32"; unset or "auto": go on); vdpbf16ps_to_fma_rate() ≥
// kVdpbf16psMinRate. Another value of the variable throws a UsageError naming it, on every CPU.
inline constexpr double kVdpbf16psMinRate = 1.25;
bool bf16_vdpbf16ps_active();
enum class Bf16Products { kAuto, kVdpbf16ps, kFp32 };
// Not meant to be changed while kernels run on other threads (as set_bf16_isa_override).
void set_bf16_products_override(Bf16Products products);
// One line for `cabm bench`: the unit the bf16 products run on (AMX tiles, vdpbf16ps, fp32 FMAs on
// widened values, or the portable path) and the rule above that chose it.
std::string bf16_products_summary();
// "avx512_bf16" or "portable": for `cabm bench` and benchmark labels.
const char* bf16_path_name();
// The conversions' path: "avx512_bf16", "avx2" or "portable".
const char* bf16_conversion_path_name();
// Whether the portable path is forced: set_bf16_isa_override(kPortable), or CABM_FORCE_PORTABLE=1
// under kAuto. Kernels with a fast path for CPUs without avx512_bf16 (attention_flash_bf16's fp32
// SIMD path) take it only when this is false, so that forced portable always means portable.
bool bf16_portable_forced();

// dst[i] = float_to_bf16(src[i]) bit for bit: round to nearest even, NaN stays NaN (quiet, sign
// and upper payload kept), ±inf stays ±inf, overflow rounds to inf, fp32 subnormals round like
// any other value (the hardware instruction flushes them; the fast path fixes those lanes up).
void float_to_bf16(const float* src, bf16* dst, int64_t n);
// dst[i] = bf16_to_float(src[i]): exact.
void bf16_to_float(const bf16* src, float* dst, int64_t n);

// dst[i] = bf16_to_float(float_to_bf16(src[i])): src rounded to bf16 values kept in fp32, the
// operands of gemm_bf16_widened (cabm/kernels/gemm.h). Bit for bit the two calls above; src == dst
// is allowed (in place).
void round_to_bf16_values(const float* src, float* dst, int64_t n);

// Strided 2-d forms (rows × cols, unit column stride, row strides in elements), for tensor views.
void float_to_bf16_2d(const float* src, int64_t src_ld, bf16* dst, int64_t dst_ld, int64_t rows, int64_t cols);
void bf16_to_float_2d(const bf16* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols);

// Tensor forms, for views of any strides: an F32 tensor rounded to a new contiguous BF16 one, and
// a BF16 tensor widened to a new contiguous F32 one (an F32 tensor is returned as it is).
Tensor rounded_to_bf16(const Tensor& t);
Tensor widened_to_f32(const Tensor& t);

namespace detail {
// The paths themselves, for tests: each works on any n. The avx512 ones may only be called when
// cpu_has_avx512_bf16().
void float_to_bf16_portable(const float* src, bf16* dst, int64_t n);
void bf16_to_float_portable(const bf16* src, float* dst, int64_t n);
void round_to_bf16_values_portable(const float* src, float* dst, int64_t n);
void float_to_bf16_avx512(const float* src, bf16* dst, int64_t n);
void bf16_to_float_avx512(const bf16* src, float* dst, int64_t n);
void round_to_bf16_values_avx512(const float* src, float* dst, int64_t n);
// May only be called when cpu_supports(SimdIsa::kAvx2).
void float_to_bf16_avx2(const float* src, bf16* dst, int64_t n);
void bf16_to_float_avx2(const bf16* src, float* dst, int64_t n);
void round_to_bf16_values_avx2(const float* src, float* dst, int64_t n);
}  // namespace detail

}  // namespace cabm
