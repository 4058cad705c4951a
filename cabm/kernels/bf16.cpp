#include "cabm/kernels/bf16.h"

#include "cabm/core/error.h"
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/machine_wisdom.h"
#include "cabm/kernels/unit_loops.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include "cabm/kernels/x86_intrinsics.h"
#define CABM_X86 1
#endif

namespace cabm {

namespace {

bool detect_avx512_bf16() {
#if defined(CABM_X86)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid(1, eax, ebx, ecx, edx);
  const bool osxsave = (ecx >> 27) & 1u;
  if (!osxsave) return false;
  // XCR0: SSE (1), AVX (2), opmask (5), ZMM_Hi256 (6), Hi16_ZMM (7) state saved by the OS.
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xe6u) != 0xe6u) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const unsigned max_subleaf = eax;
  const bool f = (ebx >> 16) & 1u, bw = (ebx >> 30) & 1u, vl = (ebx >> 31) & 1u;
  if (!(f && bw && vl) || max_subleaf < 1) return false;
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  return (eax >> 5) & 1u;
#else
  return false;
#endif
}

bool detect_amx_bf16() {
#if defined(CABM_X86) && defined(__linux__) && defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid(1, eax, ebx, ecx, edx);
  if (!((ecx >> 27) & 1u)) return false;  // OSXSAVE
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x60000u) != 0x60000u) return false;  // XTILECFG (17), XTILEDATA (18)
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  if (!((edx >> 22) & 1u) || !((edx >> 24) & 1u)) return false;  // AMX-BF16, AMX-TILE
  // Linux enables the 8 KiB tile data state per process, on request (arch/x86/include/uapi/asm/prctl.h).
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
}

bool env_forces_portable() {
  static const bool forced = env_flag("CABM_FORCE_PORTABLE");
  return forced;
}

std::atomic<int> g_override{static_cast<int>(Bf16Isa::kAuto)};
std::atomic<int> g_products_override{static_cast<int>(Bf16Products::kAuto)};

}  // namespace

bool cpu_has_avx512_bf16() {
  static const bool has = cpu_isa_cap() >= CpuIsaCap::kAvx512Bf16 && detect_avx512_bf16();
  return has;
}

bool cpu_has_amx_bf16() {
  // Under a lower cap the tile state is never requested either.
  static const bool has = cpu_isa_cap() >= CpuIsaCap::kAmxBf16 && detect_amx_bf16();
  return has;
}

bool bf16_amx_active() {
  static const bool env_no_amx = env_flag("CABM_NO_AMX");
  const auto isa = static_cast<Bf16Isa>(g_override.load(std::memory_order_relaxed));
  return isa == Bf16Isa::kAuto && !env_no_amx && bf16_active_isa() == Bf16Isa::kAvx512Bf16 && cpu_has_amx_bf16();
}

namespace {

#if defined(CABM_X86)
double measure_vdpbf16ps_to_fma_rate() {
  using Clock = std::chrono::steady_clock;
  // About 0.1 ms per loop at 2-3 GHz: 12 FMAs per iteration at two per cycle, 16 vdpbf16ps at one
  // or two. The best of interleaved rounds: a preempted round only looks slower.
  constexpr int64_t kFmaIterations = 40000, kDotIterations = 20000;
  constexpr int kRounds = 8;
  float sink = 0;
  double fma = 0, dot = 0;  // best FLOP/s
  for (int round = 0; round < kRounds; ++round) {
    auto t0 = Clock::now();
    double flops = detail::fma_loop_avx512(kFmaIterations, &sink);
    fma = std::max(fma, flops / std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    flops = detail::vdpbf16ps_loop(kDotIterations, &sink);
    dot = std::max(dot, flops / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return fma > 0 ? dot / fma : 0.0;
}
#endif

// CABM_BF16_PRODUCTS: +1 vdpbf16ps, -1 fp32, 0 measured.
int env_products_pin() {
  const char* value = std::getenv("CABM_BF16_PRODUCTS");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) return 0;
  if (std::strcmp(value, "vdpbf16ps") == 0) return 1;
  if (std::strcmp(value, "fp32") == 0) return -1;
  throw UsageError(fmt::format("CABM_BF16_PRODUCTS={}: expected vdpbf16ps, fp32 or auto", value));
}

int products_pin() {
  static const int pin = env_products_pin();
  return pin;
}

}  // namespace

double vdpbf16ps_to_fma_rate() {
#if defined(CABM_X86)
  // Kept in the wisdom file: which unit the bf16 products run on follows it (choose_products).
  static const double rate =
      cpu_has_avx512_bf16() ? machine_value("vdpbf16ps_to_fma_rate", measure_vdpbf16ps_to_fma_rate) : 0.0;
  return rate;
#else
  return 0.0;
#endif
}

namespace {

// Which unit the bf16 kernels multiply on, and which rule of bf16.h decided it: the one place that
// applies the rules, for both bf16_vdpbf16ps_active() and the summary.
enum class ProductsRule { kNoAvx512Bf16Path, kRequested, kAmx, kEnvironment, kMeasured };
struct ProductsChoice {
  bool vdpbf16ps;
  ProductsRule rule;
};

ProductsChoice choose_products() {
  const int pin = products_pin();  // first: a bad value is an error on every CPU
  if (bf16_active_isa() != Bf16Isa::kAvx512Bf16) return {false, ProductsRule::kNoAvx512Bf16Path};
  const auto products = static_cast<Bf16Products>(g_products_override.load(std::memory_order_relaxed));
  if (products != Bf16Products::kAuto) return {products == Bf16Products::kVdpbf16ps, ProductsRule::kRequested};
  if (static_cast<Bf16Isa>(g_override.load(std::memory_order_relaxed)) == Bf16Isa::kAvx512Bf16)
    return {true, ProductsRule::kRequested};
  if (bf16_amx_active()) return {false, ProductsRule::kAmx};  // the AMX tiles instead
  if (pin != 0) return {pin > 0, ProductsRule::kEnvironment};
  return {vdpbf16ps_to_fma_rate() >= kVdpbf16psMinRate, ProductsRule::kMeasured};
}

}  // namespace

bool bf16_vdpbf16ps_active() {
  return choose_products().vdpbf16ps;
}

void set_bf16_products_override(Bf16Products products) {
  g_products_override.store(static_cast<int>(products), std::memory_order_relaxed);
}

std::string bf16_products_summary() {
  const ProductsChoice choice = choose_products();
  switch (choice.rule) {
    case ProductsRule::kNoAvx512Bf16Path:
      return bf16_portable_forced() ? "portable (the portable path is forced)"
                                    : "fp32 FMAs on widened bf16 (no AVX512_BF16 path)";
    case ProductsRule::kAmx:
      return "AMX tiles (the CPU has AMX-BF16; CABM_NO_AMX=1 turns them off)";
    case ProductsRule::kRequested:
    case ProductsRule::kEnvironment:
    case ProductsRule::kMeasured:
      break;
  }
  std::string why = choice.rule == ProductsRule::kRequested ? "requested" : "CABM_BF16_PRODUCTS";
  if (choice.rule == ProductsRule::kMeasured)
    why = fmt::format("vdpbf16ps {:.2f}x the FMA multiply-adds on one core, {} {:.2f}", vdpbf16ps_to_fma_rate(),
                      choice.vdpbf16ps ? "at least" : "under", kVdpbf16psMinRate);
  return fmt::format("{} ({})", choice.vdpbf16ps ? "vdpbf16ps" : "fp32 FMAs on widened bf16", why);
}

void set_bf16_isa_override(Bf16Isa isa) {
  CABM_CHECK(isa != Bf16Isa::kAvx512Bf16 || cpu_has_avx512_bf16(),
             "AVX-512 BF16 path requested but this CPU does not support avx512_bf16");
  g_override.store(static_cast<int>(isa), std::memory_order_relaxed);
}

Bf16Isa bf16_active_isa() {
  const auto isa = static_cast<Bf16Isa>(g_override.load(std::memory_order_relaxed));
  if (isa != Bf16Isa::kAuto) return isa;
  return !env_forces_portable() && cpu_has_avx512_bf16() ? Bf16Isa::kAvx512Bf16 : Bf16Isa::kPortable;
}

bool bf16_portable_forced() {
  const auto isa = static_cast<Bf16Isa>(g_override.load(std::memory_order_relaxed));
  return isa == Bf16Isa::kAuto ? env_forces_portable() : isa == Bf16Isa::kPortable;
}

const char* bf16_path_name() {
  return bf16_active_isa() == Bf16Isa::kAvx512Bf16 ? "avx512_bf16" : "portable";
}

namespace detail {

void float_to_bf16_portable(const float* src, bf16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = cabm::float_to_bf16(src[i]);
}

void bf16_to_float_portable(const bf16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = cabm::bf16_to_float(src[i]);
}

void round_to_bf16_values_portable(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = cabm::bf16_to_float(cabm::float_to_bf16(src[i]));
}

#if defined(CABM_X86)

#define CABM_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics when
// they are compiled under a target attribute (a known false positive).
#pragma GCC diagnostic push
#ifndef __clang__  // a GCC-only warning group; clang warns about the unknown name
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace {

// 16 floats → 16 bf16. vcvtneps2bf16 rounds to nearest even, but by Intel's definition it flushes
// fp32 subnormal inputs to (signed) zero and its NaN result is only specified as "quiet": lanes
// holding a subnormal or a NaN are redone with the integer rules of cabm/core/dtype.h, so the result is
// bit for bit the scalar one. That branch costs two mask tests per 16 values when not taken.
CABM_AVX512_BF16 inline __m256i convert16(__m512 x) {
  __m256i r = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
  const __m512i u = _mm512_castps_si512(x);
  const __m512i exp_bits = _mm512_set1_epi32(0x7f800000);
  const __mmask16 subnormal = _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(u, exp_bits), u,
                                                          _mm512_set1_epi32(0x007fffff));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __mmask16 special = subnormal | nan;
  if (special != 0) [[unlikely]] {
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
    const __m512i fixed = _mm512_mask_blend_epi32(nan, rounded, quiet);
    r = _mm256_mask_blend_epi16(special, r, _mm512_cvtepi32_epi16(fixed));
  }
  return r;
}

}  // namespace

CABM_AVX512_BF16 void float_to_bf16_avx512(const float* src, bf16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), convert16(_mm512_loadu_ps(src + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm256_mask_storeu_epi16(dst + i, m, convert16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

CABM_AVX512_BF16 void bf16_to_float_avx512(const bf16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
}

// One pass, in registers: the integer rules of cabm/core/dtype.h kept in the high half of each lane
// (u + 0x7fff + lsb, NaN quieted), the low half cleared. Subnormals round by the same rule, so
// there is no lane to redo.
namespace {

CABM_AVX512_BF16 inline __m512 round16_values(__m512 x) {
  const __m512i u = _mm512_castps_si512(x), high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), high);
  const __m512i quiet = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), high);
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), rounded, quiet));
}

}  // namespace

CABM_AVX512_BF16 void round_to_bf16_values_avx512(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, round16_values(_mm512_loadu_ps(src + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(dst + i, m, round16_values(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

#pragma GCC diagnostic pop

// The same integer rules as the scalar conversion, 8 lanes at a time: round to nearest even by
// adding 0x7fff plus the kept bit, NaN lanes quieted instead. For CPUs with AVX2 and no
// avx512_bf16 (Zen 3, Skylake-X) and for CABM_NATIVE=OFF builds, where the portable loop would
// run on SSE2 (or one value at a time).
#define CABM_AVX2 __attribute__((target("avx2")))

namespace {

CABM_AVX2 inline __m256i round8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x0040));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, quiet, nan);  // 32-bit lanes, each < 2^16
}

}  // namespace

CABM_AVX2 void float_to_bf16_avx2(const float* src, bf16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // packus works within 128-bit halves: (a0 b0 a1 b1) in 64-bit quarters, reordered to (a0 a1 b0 b1).
    const __m256i packed = _mm256_packus_epi32(round8(_mm256_loadu_ps(src + i)), round8(_mm256_loadu_ps(src + i + 8)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_permute4x64_epi64(packed, 0xd8));
  }
  for (; i < n; ++i) dst[i] = cabm::float_to_bf16(src[i]);
}

CABM_AVX2 void round_to_bf16_values_avx2(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(round8(_mm256_loadu_ps(src + i)), 16));
  for (; i < n; ++i) dst[i] = cabm::bf16_to_float(cabm::float_to_bf16(src[i]));
}

CABM_AVX2 void bf16_to_float_avx2(const bf16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  for (; i < n; ++i) dst[i] = cabm::bf16_to_float(src[i]);
}

#else

void float_to_bf16_avx512(const float* src, bf16* dst, int64_t n) { float_to_bf16_portable(src, dst, n); }
void bf16_to_float_avx512(const bf16* src, float* dst, int64_t n) { bf16_to_float_portable(src, dst, n); }
void float_to_bf16_avx2(const float* src, bf16* dst, int64_t n) { float_to_bf16_portable(src, dst, n); }
void bf16_to_float_avx2(const bf16* src, float* dst, int64_t n) { bf16_to_float_portable(src, dst, n); }
void round_to_bf16_values_avx512(const float* src, float* dst, int64_t n) {
  round_to_bf16_values_portable(src, dst, n);
}
void round_to_bf16_values_avx2(const float* src, float* dst, int64_t n) {
  round_to_bf16_values_portable(src, dst, n);
}

#endif

}  // namespace detail

namespace {

enum class ConversionPath { kPortable, kAvx2, kAvx512Bf16 };

// avx512_bf16 with the bf16 kernels; else AVX2 where the SIMD set (cpu_isa.h, CABM_SIMD_ISA) is at
// least AVX2, unless the portable bf16 path is forced.
ConversionPath conversion_path() {
  if (bf16_active_isa() == Bf16Isa::kAvx512Bf16) return ConversionPath::kAvx512Bf16;
  if (!bf16_portable_forced() && simd_isa() != SimdIsa::kPortable) return ConversionPath::kAvx2;
  return ConversionPath::kPortable;
}

}  // namespace

const char* bf16_conversion_path_name() {
  switch (conversion_path()) {
    case ConversionPath::kAvx512Bf16: return "avx512_bf16";
    case ConversionPath::kAvx2: return "avx2";
    case ConversionPath::kPortable: break;
  }
  return "portable";
}

void float_to_bf16(const float* src, bf16* dst, int64_t n) {
  switch (conversion_path()) {
    case ConversionPath::kAvx512Bf16: return detail::float_to_bf16_avx512(src, dst, n);
    case ConversionPath::kAvx2: return detail::float_to_bf16_avx2(src, dst, n);
    case ConversionPath::kPortable: return detail::float_to_bf16_portable(src, dst, n);
  }
}

void round_to_bf16_values(const float* src, float* dst, int64_t n) {
  switch (conversion_path()) {
    case ConversionPath::kAvx512Bf16:
      return detail::round_to_bf16_values_avx512(src, dst, n);
    case ConversionPath::kAvx2:
      return detail::round_to_bf16_values_avx2(src, dst, n);
    case ConversionPath::kPortable:
      return detail::round_to_bf16_values_portable(src, dst, n);
  }
}

void bf16_to_float(const bf16* src, float* dst, int64_t n) {
  switch (conversion_path()) {
    case ConversionPath::kAvx512Bf16: return detail::bf16_to_float_avx512(src, dst, n);
    case ConversionPath::kAvx2: return detail::bf16_to_float_avx2(src, dst, n);
    case ConversionPath::kPortable: return detail::bf16_to_float_portable(src, dst, n);
  }
}

Tensor rounded_to_bf16(const Tensor& t) {
  CABM_CHECK(t.dtype() == DType::F32, "rounded_to_bf16: expected an F32 tensor, got {}", dtype_name(t.dtype()));
  const Tensor c = t.contiguous();
  Tensor r = Tensor::empty(c.shape(), DType::BF16);
  float_to_bf16(c.data<float>(), r.data<bf16>(), c.numel());
  return r;
}

Tensor widened_to_f32(const Tensor& t) {
  if (t.dtype() == DType::F32) return t;
  CABM_CHECK(t.dtype() == DType::BF16, "widened_to_f32: expected a BF16 tensor, got {}", dtype_name(t.dtype()));
  const Tensor c = t.contiguous();
  Tensor r = Tensor::empty(c.shape());
  bf16_to_float(c.data<bf16>(), r.data<float>(), c.numel());
  return r;
}

void float_to_bf16_2d(const float* src, int64_t src_ld, bf16* dst, int64_t dst_ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) float_to_bf16(src + r * src_ld, dst + r * dst_ld, cols);
}

void bf16_to_float_2d(const bf16* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) bf16_to_float(src + r * src_ld, dst + r * dst_ld, cols);
}

}  // namespace cabm
