// gemm (fp32) and gemm_bf16 (bf16 operands, fp32 accumulation) against gemm_reference (double
// accumulation) over both transposes, odd sizes, padded leading dimensions, K = 0, alpha and beta.
//
// Tolerance, per element (Higham 2002, §3.1): an fp32 dot product of K terms is off by at most
// γ_K · Σ_k |a_ik||b_kj| with γ_K ≈ K·u, u = 2^-24; alpha, beta and the final add contribute a few
// more u of |alpha|·Σ|a||b| + |beta·c|. bf16 inputs are exactly representable in fp32 and the
// product of two bf16 values is exact in fp32 (8 + 8 significant bits), so the bf16 gemm obeys the
// same bound as the fp32 one on the rounded inputs: nothing in the bound is bf16's epsilon.
#include "cabm/core/threads.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/gemm.h"
#include "cabm/kernels/gemm_route.h"
#include "util/test_util.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace cabm {
namespace {

constexpr double kU = 0x1p-24;

struct Case {
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
  int64_t pad;  // extra leading-dimension elements
};

std::string describe(const Case& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " ta=" + std::to_string(c.ta) + " tb=" + std::to_string(c.tb) + " alpha=" + std::to_string(c.alpha) +
         " beta=" + std::to_string(c.beta) + " pad=" + std::to_string(c.pad);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      out.push_back({7, 13, 29, ta, tb, 1.0f, 0.0f, 0});
      out.push_back({33, 17, 65, ta, tb, 0.5f, 1.0f, 3});
      out.push_back({1, 40, 3, ta, tb, -2.0f, 0.25f, 1});
      out.push_back({50, 1, 77, ta, tb, 1.0f, -1.0f, 0});
      out.push_back({5, 6, 0, ta, tb, 1.0f, 0.5f, 2});  // K = 0: c = beta·c
      out.push_back({64, 48, 128, ta, tb, 1.0f, 0.0f, 5});
    }
  // Aᵀ·B (the weight gradients) with rows 4 KiB apart (ld a multiple of 1024 floats): A's, B's
  // and both.
  out.push_back({24, 40, 300, true, false, 1.0f, 1.0f, 1024 - 24});
  out.push_back({24, 40, 300, true, false, 0.5f, 0.0f, 1024 - 40});
  out.push_back({64, 64, 256, true, false, 1.0f, 0.5f, 1024 - 64});
  out.push_back({24, 40, 255, true, false, -1.0f, 1.0f, 1024 - 24});
  // Products large enough to be routed by timing (gemm_route.h, >= 2^24 multiply-adds) and just
  // below: odd sizes, beta 0 over NaN, and rows 4 KiB apart.
  out.push_back({200, 170, 97, true, false, 1.0f, 0.0f, 3});
  out.push_back({256, 128, 300, true, false, 0.5f, 1.0f, 0});
  out.push_back({181, 181, 65, true, false, -1.0f, 0.25f, 5});
  out.push_back({256, 160, 257, true, false, 1.0f, 0.0f, 1024 - 256});
  out.push_back({255, 129, 1, true, false, 2.0f, -1.0f, 1});
  out.push_back({257, 255, 257, false, true, 1.0f, 0.0f, 2});
  out.push_back({256, 256, 255, false, false, 0.5f, 1.0f, 0});
  out.push_back({300, 260, 256, true, true, 1.0f, 0.0f, 1});
  return out;
}

struct Operands {
  std::vector<float> a, b, c0;
  int64_t lda, ldb, ldc;
};

// Stored matrices: op(a) [M, K] stored as [M, lda] or [K, lda] when transposed; c [M, ldc] with
// NaN in the padding (must stay untouched) and, when beta = 0, NaN in c (must be ignored).
Operands make_operands(const Case& c, uint64_t seed, bool round_to_bf16) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto value = [&] {
    const float x = dist(rng);
    return round_to_bf16 ? bf16_to_float(float_to_bf16(x)) : x;
  };
  Operands o;
  o.lda = (c.ta ? c.M : c.K) + c.pad;
  o.ldb = (c.tb ? c.K : c.N) + c.pad;
  o.ldc = c.N + c.pad;
  o.a.resize(static_cast<size_t>((c.ta ? c.K : c.M) * o.lda));
  o.b.resize(static_cast<size_t>((c.tb ? c.N : c.K) * o.ldb));
  for (auto& x : o.a) x = value();
  for (auto& x : o.b) x = value();
  o.c0.assign(static_cast<size_t>(c.M * o.ldc), NAN);
  if (c.beta != 0.0f)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) o.c0[i * o.ldc + j] = dist(rng);
  return o;
}

// Per-element bound: 2·(K + 4)·u·(|alpha|·Σ|a||b| + |beta·c|), from the reference on |a|, |b|.
std::vector<float> bounds(const Case& c, const Operands& o) {
  std::vector<float> abs_a(o.a.size()), abs_b(o.b.size()), abs_c(o.c0.size(), 0.0f);
  for (size_t i = 0; i < o.a.size(); ++i) abs_a[i] = std::fabs(o.a[i]);
  for (size_t i = 0; i < o.b.size(); ++i) abs_b[i] = std::fabs(o.b[i]);
  gemm_reference({abs_a.data(), c.M, c.K, o.lda, c.ta}, {abs_b.data(), c.K, c.N, o.ldb, c.tb}, abs_c.data(), o.ldc);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      const double beta_c = c.beta == 0.0f ? 0.0 : std::fabs(static_cast<double>(c.beta) * o.c0[i * o.ldc + j]);
      abs_c[i * o.ldc + j] = static_cast<float>(
          2.0 * static_cast<double>(c.K + 4) * kU * (std::fabs(c.alpha) * abs_c[i * o.ldc + j] + beta_c) + 1e-30);
    }
  return abs_c;
}

void expect_within(const Case& c, const Operands& o, const std::vector<float>& got, const std::vector<float>& want,
                   const std::vector<float>& bound, const std::string& what) {
  int failures = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < o.ldc; ++j) {
      const size_t e = static_cast<size_t>(i * o.ldc + j);
      if (j >= c.N) {  // padding untouched
        if (!std::isnan(got[e]) && failures++ < 5) ADD_FAILURE() << what << " wrote padding at " << i << "," << j;
        continue;
      }
      if (!(std::fabs(got[e] - want[e]) <= bound[e]) && failures++ < 5)
        ADD_FAILURE() << what << " " << describe(c) << " at (" << i << "," << j << "): " << got[e] << " vs " << want[e]
                      << " bound " << bound[e];
    }
  }
}

// Every case on each library (pinned) and with the routes decided by timing.
class GemmLibraries : public ::testing::TestWithParam<std::optional<GemmLibrary>> {
 protected:
  void SetUp() override {
    reset_gemm_routes("off");
    set_gemm_library_override(GetParam());
  }
  void TearDown() override { set_gemm_library_override(std::nullopt); }
};

INSTANTIATE_TEST_SUITE_P(Pinned, GemmLibraries,
                         ::testing::Values(std::optional<GemmLibrary>(GemmLibrary::kOneDnn),
                                           std::optional<GemmLibrary>(GemmLibrary::kOpenBlas),
                                           std::optional<GemmLibrary>()),
                         [](const auto& info) { return info.param ? gemm_library_name(*info.param) : "auto"; });

TEST_P(GemmLibraries, Fp32MatchesReference) {
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    const Operands o = make_operands(c, seed++, false);
    std::vector<float> want = o.c0, got = o.c0;
    gemm_reference({o.a.data(), c.M, c.K, o.lda, c.ta}, {o.b.data(), c.K, c.N, o.ldb, c.tb}, want.data(), o.ldc,
                   c.alpha, c.beta);
    gemm({o.a.data(), c.M, c.K, o.lda, c.ta}, {o.b.data(), c.K, c.N, o.ldb, c.tb}, got.data(), o.ldc, c.alpha, c.beta);
    expect_within(c, o, got, want, bounds(c, o), "gemm");
  }
}

void run_bf16_cases(const std::string& label) {
  uint64_t seed = 100;
  for (const Case& c : cases()) {
    const Operands o = make_operands(c, seed++, true);
    std::vector<bf16> a16(o.a.size()), b16(o.b.size());
    float_to_bf16(o.a.data(), a16.data(), static_cast<int64_t>(o.a.size()));
    float_to_bf16(o.b.data(), b16.data(), static_cast<int64_t>(o.b.size()));
    std::vector<float> want = o.c0, got = o.c0, ref16 = o.c0;
    gemm_reference({o.a.data(), c.M, c.K, o.lda, c.ta}, {o.b.data(), c.K, c.N, o.ldb, c.tb}, want.data(), o.ldc,
                   c.alpha, c.beta);
    const MatrixRefBf16 a{a16.data(), c.M, c.K, o.lda, c.ta}, b{b16.data(), c.K, c.N, o.ldb, c.tb};
    gemm_bf16(a, b, got.data(), o.ldc, c.alpha, c.beta);
    // Twice: the second call runs the cached primitive.
    std::vector<float> again = o.c0;
    gemm_bf16(a, b, again.data(), o.ldc, c.alpha, c.beta);
    gemm_bf16_reference(a, b, ref16.data(), o.ldc, c.alpha, c.beta);
    const auto bound = bounds(c, o);
    expect_within(c, o, got, want, bound, "gemm_bf16 [" + label + "]");
    expect_within(c, o, again, want, bound, "gemm_bf16 cached [" + label + "]");
    expect_within(c, o, ref16, want, bound, "gemm_bf16_reference");
    if (c.alpha != 1.0f) continue;
    // With a bias (alpha 1): c = a·b + beta·c + bias[n], against the reference plus the bias; the
    // bound grows by two roundings of |bias|.
    std::vector<float> bias(static_cast<size_t>(c.N));
    for (int64_t j = 0; j < c.N; ++j) bias[static_cast<size_t>(j)] = static_cast<float>((j * 37 % 23) - 11) / 3.0f;
    std::vector<float> want_b = want, got_b = o.c0, bound_b = bound;
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        const size_t e = static_cast<size_t>(i * o.ldc + j);
        want_b[e] += bias[static_cast<size_t>(j)];
        bound_b[e] += 4.0f * kU * (std::fabs(bias[static_cast<size_t>(j)]) + std::fabs(want[e]));
      }
    gemm_bf16(a, b, got_b.data(), o.ldc, 1.0f, c.beta, bias.data());
    expect_within(c, o, got_b, want_b, bound_b, "gemm_bf16 with bias [" + label + "]");
    std::vector<float> ref_b = o.c0;
    gemm_bf16_reference(a, b, ref_b.data(), o.ldc, 1.0f, c.beta, bias.data());
    expect_within(c, o, ref_b, want_b, bound_b, "gemm_bf16_reference with bias");
  }
}

// gemm() may be called from several threads at once (OpenBLAS's OpenMP build does not promise
// that this is safe: gemm.cpp serialises its calls). The weight-gradient form, large enough for the
// OpenBLAS path, from std::threads and from an OpenMP parallel region: every result equals a
// serial call's bit for bit (inside a parallel region the libraries run on one thread, so there
// the serial call runs on one thread too).
TEST(Gemm, ConcurrentCallsFromThreads) {
  const Case c{256, 192, 300, true, false, 1.0f, 0.0f, 4};
  const Operands o = make_operands(c, 11, false);
  auto run = [&](std::vector<float>& out) {
    out = o.c0;
    gemm({o.a.data(), c.M, c.K, o.lda, c.ta}, {o.b.data(), c.K, c.N, o.ldb, c.tb}, out.data(), o.ldc);
  };
  std::vector<float> serial;
  run(serial);
  std::vector<float> serial_one_thread;
  {
    test::ScopedThreads one(1);
    run(serial_one_thread);
  }
  auto differences = [](const std::vector<float>& got, const std::vector<float>& want) {
    int64_t count = 0;
    for (size_t i = 0; i < got.size(); ++i)
      count += !(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])));
    return count;
  };
  constexpr int kThreads = 4, kRepeats = 6;
  std::vector<std::vector<float>> results(kThreads);
  int64_t mismatches = 0;
  for (int rep = 0; rep < kRepeats; ++rep) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) threads.emplace_back([&, t] { run(results[t]); });
    for (auto& t : threads) t.join();
    for (const auto& r : results) mismatches += differences(r, serial);
  }
  EXPECT_EQ(mismatches, 0) << "std::threads";
  mismatches = 0;
#pragma omp parallel for num_threads(kThreads) schedule(static, 1) reduction(+ : mismatches)
  for (int rep = 0; rep < kThreads * kRepeats; ++rep) {
    std::vector<float> got;
    run(got);
    mismatches += differences(got, serial_one_thread);
  }
  EXPECT_EQ(mismatches, 0) << "OpenMP threads";
}

// The count that follows `tag` in gemm_bf16_implementations_used() ("... (N products)"), 0 if absent.
int products_counted(const std::string& tag) {
  const std::string used = gemm_bf16_implementations_used();
  const size_t at = used.find(tag);
  return at == std::string::npos ? 0 : std::stoi(used.substr(at + tag.size()));
}

TEST(GemmBf16, MatchesReferenceOnRoundedInputs) {
  const MatrixRefBf16 probe{nullptr, 64, 64, 64}, probe_b{nullptr, 64, 64, 64};
  std::cout << "gemm_bf16 implementation: " << gemm_bf16_implementation(probe, probe_b, 64) << "\n";
  run_bf16_cases("auto");
  if (!cpu_has_avx512_bf16()) return;
  // oneDNN's bf16 matmul, which the automatic choice may leave for widened operands (bf16.h).
  set_bf16_isa_override(Bf16Isa::kAvx512Bf16);
  std::cout << "requested avx512_bf16: " << gemm_bf16_implementation(probe, probe_b, 64) << "\n";
  run_bf16_cases("avx512_bf16 requested");
  set_bf16_isa_override(Bf16Isa::kAuto);
}

// Where AVX512_BF16 runs without AMX and vdpbf16ps does not outrun fp32 FMAs, the products take
// widened operands and gemm() without a oneDNN plan, counted apart; requesting avx512_bf16 (or
// vdpbf16ps winning) keeps oneDNN where it has a bf16 matmul (not where ONEDNN_MAX_CPU_ISA holds
// it to AVX2, as test_gemm_avx2_libraries does: the converted route then, for its own reason).
TEST(GemmBf16, WidenedWhereVdpbf16psIsNotFaster) {
  std::vector<bf16> a(6, bf16{0x3f80}), b(6, bf16{0x3f80});
  std::vector<float> c(4);
  const MatrixRefBf16 ma{a.data(), 2, 3, 3}, mb{b.data(), 3, 2, 2};
  const std::string reason = "no AMX, vdpbf16ps not faster than FMAs";
  const bool widened =
      !bf16_portable_forced() && cpu_has_avx512_bf16() && !cpu_has_amx_bf16() && !bf16_vdpbf16ps_active();
  EXPECT_EQ(gemm_bf16_implementation(ma, mb, 2).find(reason) != std::string::npos, widened)
      << gemm_bf16_implementation(ma, mb, 2);
  if (bf16_portable_forced()) GTEST_SKIP() << "CABM_FORCE_PORTABLE is set: the products take the portable route";
  if (!widened)
    GTEST_SKIP() << "gemm_bf16 takes oneDNN here (" << bf16_products_summary() << "; AMX "
                 << (cpu_has_amx_bf16() ? "present" : "absent") << ")";
  const auto widened_count = [&] { return products_counted(reason + " ("); };
  const int before = widened_count();
  gemm_bf16(ma, mb, c.data(), 2);
  EXPECT_EQ(c[3], 3.0f);
  EXPECT_EQ(widened_count(), before + 1) << gemm_bf16_implementations_used();
  set_bf16_isa_override(Bf16Isa::kAvx512Bf16);
  const std::string requested = gemm_bf16_implementation(ma, mb, 2);
  EXPECT_EQ(requested.find(reason), std::string::npos) << requested;
  EXPECT_EQ(requested.find("converted") == std::string::npos, !gemm_bf16_widens()) << requested;
  set_bf16_isa_override(Bf16Isa::kAuto);
}

// The summary of what ran names each implementation the cached products use, with the count of
// shapes on it; a new shape adds one to its implementation's count while the cache (64 shapes)
// has room, and the counts never add up to more than it holds.
TEST(GemmBf16, ImplementationsUsedCountsTheShapesThatRan) {
  // Implementation names may hold parentheses themselves ("fp32 sgemm (converted)").
  const std::regex entry(R"((.*?) \((\d+) shapes?\)(, |$))");
  const auto counts = [&](const std::string& summary) {
    std::map<std::string, int> out;
    for (std::sregex_iterator it(summary.begin(), summary.end(), entry), end; it != end; ++it)
      out[(*it)[1]] = std::stoi((*it)[2]);
    return out;
  };
  const auto shapes_on = [&](const std::string& summary, const std::string& impl) { return counts(summary)[impl]; };
  const auto total = [&](const std::string& summary) {
    int sum = 0;
    for (const auto& [name, n] : counts(summary)) sum += n;
    return sum;
  };
  EXPECT_EQ(shapes_on("fp32 sgemm (converted) (3 shapes), x (1 shape)", "fp32 sgemm (converted)"), 3);
  EXPECT_EQ(total("fp32 sgemm (converted) (3 shapes), x (1 shape)"), 4);
  // On the oneDNN plans (the automatic choice may widen products without one: test below).
  if (cpu_has_avx512_bf16()) set_bf16_isa_override(Bf16Isa::kAvx512Bf16);
  if (bf16_portable_forced())
    GTEST_SKIP() << "CABM_FORCE_PORTABLE on a CPU without AVX512_BF16: the products make no plans to count";
  std::vector<bf16> a(37 * 29, bf16{0x3f80}), b(29 * 41, bf16{0x3f80});
  std::vector<float> c(37 * 41);
  const MatrixRefBf16 ma{a.data(), 37, 29, 29}, mb{b.data(), 29, 41, 41};
  gemm_bf16(ma, mb, c.data(), 41, 1.0f, 0.0f);
  EXPECT_EQ(c[0], 29.0f);
  const std::string impl = gemm_bf16_implementation(ma, mb, 41), after = gemm_bf16_implementations_used();
  std::cout << "gemm_bf16 ran on: " << after << "\n";
  EXPECT_GE(shapes_on(after, impl), 1) << after;
  EXPECT_LE(total(after), 64) << after;
  gemm_bf16(ma, mb, c.data(), 41, 0.5f, 0.0f);  // alpha is part of the key: a new shape
  EXPECT_EQ(c[0], 14.5f);
  const std::string again = gemm_bf16_implementations_used();
  EXPECT_LE(total(again), 64) << again;
  if (total(after) < 64) {
    EXPECT_EQ(total(again), total(after) + 1) << after << " then " << again;
    EXPECT_EQ(shapes_on(again, impl), shapes_on(after, impl) + 1) << after << " then " << again;
  }
  set_bf16_isa_override(Bf16Isa::kAuto);
}

// Two operands of bf16 values, as bf16 and widened (exactly) to fp32: a fixed pattern of integers
// in [-spread/2, spread/2] over scale, rounded to bf16.
struct Bf16Operands {
  std::vector<float> a32, b32;
  std::vector<bf16> a16, b16;
};
Bf16Operands bf16_operands(int64_t a_size, int64_t b_size, int a_spread, float a_scale, int b_spread, float b_scale) {
  Bf16Operands o{std::vector<float>(static_cast<size_t>(a_size)), std::vector<float>(static_cast<size_t>(b_size)),
                 std::vector<bf16>(static_cast<size_t>(a_size)), std::vector<bf16>(static_cast<size_t>(b_size))};
  for (size_t i = 0; i < o.a32.size(); ++i)
    o.a32[i] = static_cast<float>(static_cast<int>(i * 2654435761u % a_spread) - a_spread / 2) / a_scale;
  for (size_t i = 0; i < o.b32.size(); ++i)
    o.b32[i] = static_cast<float>(static_cast<int>(i * 40503u % b_spread) - b_spread / 2) / b_scale;
  float_to_bf16(o.a32.data(), o.a16.data(), a_size);
  float_to_bf16(o.b32.data(), o.b16.data(), b_size);
  bf16_to_float(o.a16.data(), o.a32.data(), a_size);
  bf16_to_float(o.b16.data(), o.b32.data(), b_size);
  return o;
}

// Whether the kernel lists `flag` among the first processor's flags (/proc/cpuinfo).
bool cpu_flag(const std::string& flag) {
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

// oneDNN multiplies bf16 only where its effective ISA has bf16 units (AVX512_BF16 or AMX-BF16).
// Without them (AVX2 CPUs; AVX-512 CPUs without BF16; ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16, as
// test_gemm_avx512_no_bf16 sets) gemm_bf16 widens its operands and runs gemm(), bit for bit,
// and says so, and the modules keep their operands widened (gemm_bf16_widens).
TEST(GemmBf16, WidenedWhereOneDnnHasNoBf16Units) {
  std::string limit = std::getenv("ONEDNN_MAX_CPU_ISA") ? std::getenv("ONEDNN_MAX_CPU_ISA") : "";
  for (char& ch : limit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const bool limited = limit == "SSE41" || limit == "AVX" || limit == "AVX2" || limit == "AVX2_VNNI" ||
                       limit == "AVX512_CORE" || limit == "AVX512_CORE_VNNI";
  // The CPU's own flags, not cpu_has_avx512_bf16(): CABM_MAX_CPU_ISA holds back cabm, not oneDNN
  // (every CPU with AMX-BF16 has AVX512_BF16 too).
  const bool units = cpu_flag("avx512_bf16") && !limited;
  EXPECT_EQ(onednn_multiplies_bf16(), units) << "ONEDNN_MAX_CPU_ISA=" << limit;
  const int64_t M = 33, K = 70, N = 45;
  const Bf16Operands ops = bf16_operands(M * K, K * N, 201, 64, 199, 32);
  const std::vector<float>&a32 = ops.a32, &b32 = ops.b32;
  const MatrixRefBf16 a{ops.a16.data(), M, K, K}, b{ops.b16.data(), K, N, N};
  const std::string impl = gemm_bf16_implementation(a, b, N);
  // Read by scripts/imitated_cpu_check.sh (avx512-no-bf16, avx2-only) to see that the limit it set took.
  std::printf("oneDNN multiplies bf16 here: %s (%s)\n", units ? "yes" : "no", impl.c_str());
  if (units) {
    EXPECT_EQ(impl.rfind("fp32 sgemm (converted)", 0) == 0, gemm_bf16_widens()) << impl;
    GTEST_SKIP() << "oneDNN multiplies bf16 here (" << impl << ")";
  }
  EXPECT_TRUE(gemm_bf16_widens());
  EXPECT_EQ(impl.rfind("fp32 sgemm (converted)", 0), 0u) << impl;
  for (int threads : {1, 2}) {
    test::ScopedThreads scoped(threads);
    std::vector<float> got(static_cast<size_t>(M * N), -7.0f), want(got.size(), -7.0f);
    gemm_bf16(a, b, got.data(), N);
    gemm({a32.data(), M, K, K}, {b32.data(), K, N, N}, want.data(), N);
    EXPECT_EQ(got, want) << threads << " threads";
  }
  EXPECT_EQ(gemm_bf16_implementations_used().find("gemm:jit"), std::string::npos) << gemm_bf16_implementations_used();
}

// Operands widened on several threads in blocks of rows (more than 2^18 values, odd sizes, a
// transposed A): every element written, for 1 and 2 threads the same bits as gemm() of the values
// widened here on the same thread count, and equal to the product of the fp32 values (sums of exact
// products, within the fp32 summation bound). Not the same bits across thread counts: the fp32
// libraries do not promise them (oneDNN's and OpenBLAS's AVX2 kernels sum K in other orders on 1
// and 2 threads at this shape; session 40, natively with ONEDNN_MAX_CPU_ISA=AVX2 and
// OPENBLAS_CORETYPE=Haswell, and on QEMU's Haswell and EPYC-Milan).
TEST(GemmBf16, WidenedOperandsSpanSeveralBlocks) {
  set_bf16_isa_override(Bf16Isa::kPortable);  // the converted route, on every CPU
  const int64_t M = 37, K = 9001, N = 43;     // A and B stored as 9001 rows: two blocks each
  const Bf16Operands ops = bf16_operands(K * M, K * N, 2001, 512, 1999, 256);
  const std::vector<float>&a32 = ops.a32, &b32 = ops.b32;
  const MatrixRefBf16 a{ops.a16.data(), M, K, M, true}, b{ops.b16.data(), K, N, N};
  std::vector<std::vector<float>> got;
  for (int threads : {1, 2}) {
    test::ScopedThreads scoped(threads);
    got.emplace_back(static_cast<size_t>(M * N), -7.0f);
    gemm_bf16(a, b, got.back().data(), N);
    std::vector<float> fp32(static_cast<size_t>(M * N), -7.0f);
    gemm({a32.data(), M, K, M, true}, {b32.data(), K, N, N}, fp32.data(), N);
    EXPECT_EQ(got.back(), fp32) << threads << " threads";
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double want = 0, magnitude = 0;
      for (int64_t k = 0; k < K; ++k) {
        want += double(a32[static_cast<size_t>(k * M + i)]) * b32[static_cast<size_t>(k * N + j)];
        magnitude += std::fabs(double(a32[static_cast<size_t>(k * M + i)]) * b32[static_cast<size_t>(k * N + j)]);
      }
      ASSERT_NEAR(got[0][static_cast<size_t>(i * N + j)], want, 2.0 * K * kU * magnitude + 1e-6) << i << ", " << j;
    }
  set_bf16_isa_override(Bf16Isa::kAuto);
}

TEST(GemmBf16, ForcedPortableAndThreadCounts) {
  set_bf16_isa_override(Bf16Isa::kPortable);
  if (cpu_has_avx512_bf16()) {  // products under forced portable make no plan: counted apart
    std::vector<bf16> a(6, bf16{0x3f80}), b(6, bf16{0x3f80});
    std::vector<float> c(4);
    const MatrixRefBf16 ma{a.data(), 2, 3, 3}, mb{b.data(), 3, 2, 2};
    const auto forced_count = [] { return products_counted("portable forced ("); };
    const int before = forced_count();
    gemm_bf16(ma, mb, c.data(), 2);
    EXPECT_EQ(c[3], 3.0f);
    EXPECT_EQ(forced_count(), before + 1) << gemm_bf16_implementations_used();
  }
  for (int threads : {1, 2}) {
    test::ScopedThreads scoped(threads);
    run_bf16_cases("portable, threads " + std::to_string(threads));
  }
  set_bf16_isa_override(Bf16Isa::kAuto);
}

TEST(GemmBf16, ConcurrentCallsShareTheCache) {
  const Case c{31, 23, 47, false, true, 1.0f, 0.0f, 0};
  const Operands o = make_operands(c, 7, true);
  std::vector<bf16> a16(o.a.size()), b16(o.b.size());
  float_to_bf16(o.a.data(), a16.data(), static_cast<int64_t>(o.a.size()));
  float_to_bf16(o.b.data(), b16.data(), static_cast<int64_t>(o.b.size()));
  std::vector<float> first = o.c0;
  gemm_bf16({a16.data(), c.M, c.K, o.lda, c.ta}, {b16.data(), c.K, c.N, o.ldb, c.tb}, first.data(), o.ldc);
  int mismatches = 0;
#pragma omp parallel for num_threads(2) reduction(+ : mismatches)
  for (int rep = 0; rep < 8; ++rep) {
    std::vector<float> got = o.c0;
    gemm_bf16({a16.data(), c.M, c.K, o.lda, c.ta}, {b16.data(), c.K, c.N, o.ldb, c.tb}, got.data(), o.ldc);
    for (int64_t i = 0; i < c.M * o.ldc; ++i)
      mismatches += !(got[i] == first[i] || (std::isnan(got[i]) && std::isnan(first[i])));
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(GemmBf16, RejectsMismatchedShapes) {
  std::vector<bf16> x(16);
  std::vector<float> y(16);
  EXPECT_THROW(gemm_bf16({x.data(), 2, 3, 3}, {x.data(), 4, 2, 2}, y.data(), 2), Error);
}

}  // namespace
}  // namespace cabm

namespace cabm {
namespace {

int64_t count_lines(const std::string& path) {
  std::ifstream in(path);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// A product large enough to route is timed once, the decision kept for the process and in the
// wisdom file, which a later process (here: the routes forgotten) reads instead of timing again;
// small products are never timed.
TEST(GemmRoute, DecidedOnceKeptInWisdom) {
  const std::string wisdom = test::temp_dir() + "/gemm_routes.tsv";
  std::filesystem::remove(wisdom);
  set_gemm_library_override(std::nullopt);  // timed routes, also where CABM_GEMM pins a library
  reset_gemm_routes(wisdom);
  const Case c{300, 256, 256, true, false, 1.0f, 0.0f, 0};
  const Operands o = make_operands(c, 5, false);
  std::vector<float> out = o.c0;
  const auto run = [&] {
    gemm({o.a.data(), c.M, c.K, o.lda, c.ta}, {o.b.data(), c.K, c.N, o.ldb, c.tb}, out.data(), o.ldc);
  };
  run();
  EXPECT_EQ(gemm_route_trials(), 1);
  run();
  EXPECT_EQ(gemm_route_trials(), 1) << "decided once per shape";
  // Another shape of the same class (M, N, K each within the same power of two, the same leading
  // dimensions: here another row count K of dYᵀ·X) takes that decision; another leading dimension
  // (a wider weight, or padded rows) is another class even within the same power of two.
  const auto run_case = [](const Case& k, uint64_t seed) {
    const Operands p = make_operands(k, seed, false);
    std::vector<float> y = p.c0;
    gemm({p.a.data(), k.M, k.K, p.lda, k.ta}, {p.b.data(), k.K, k.N, p.ldb, k.tb}, y.data(), p.ldc);
  };
  run_case(Case{300, 256, 200, true, false, 1.0f, 0.0f, 0}, 8);
  EXPECT_EQ(gemm_route_trials(), 1) << "one decision per class";
  run_case(Case{400, 256, 256, true, false, 1.0f, 0.0f, 0}, 9);
  EXPECT_EQ(gemm_route_trials(), 2) << "another leading dimension of A is another class";
  run_case(Case{300, 256, 256, true, false, 1.0f, 0.0f, 3}, 10);
  EXPECT_EQ(gemm_route_trials(), 3) << "strided operands are another class";
  EXPECT_EQ(GemmShape({true, false, 300, 256, 200, 300, 256, 256, 2}).key(),
            GemmShape({true, false, 260, 140, 150, 300, 256, 256, 2}).key());
  EXPECT_NE(GemmShape({true, false, 1024, 256, 4096, 1024, 256, 256, 2}).key(),
            GemmShape({true, false, 768, 256, 4096, 768, 256, 256, 2}).key());
  std::filesystem::remove(wisdom);
  reset_gemm_routes(wisdom);
  run();
  EXPECT_EQ(gemm_route_trials(), 1);
  const auto decisions = gemm_route_decisions();
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_FALSE(decisions[0].from_wisdom);
  EXPECT_GT(decisions[0].onednn_seconds, 0);
  EXPECT_GT(decisions[0].openblas_seconds, 0);
  EXPECT_EQ(decisions[0].library,
            decisions[0].openblas_seconds < kGemmRouteOpenBlasMargin * decisions[0].onednn_seconds &&
                    decisions[0].openblas_round_wins >= kGemmRouteOpenBlasRoundWins
                ? GemmLibrary::kOpenBlas
                : GemmLibrary::kOneDnn);
  EXPECT_EQ(count_lines(wisdom), 1);
  {
    // The line names the CPU by family and model too: "AMD EPYC" is both a Zen 3 and a Zen 4.
    std::string line;
    std::getline(std::ifstream(wisdom), line);
    EXPECT_NE(line.find(" (family "), std::string::npos) << line;
#if defined(__x86_64__)  // other CPUs' /proc/cpuinfo has no family and model lines
    EXPECT_EQ(line.find("family ? model ?"), std::string::npos) << line;
#endif
  }
  EXPECT_NE(gemm_route_summary().find("TN M~512 N~256 K~256 ld 300 256 256 t"), std::string::npos)
      << gemm_route_summary();

  reset_gemm_routes(wisdom);  // a new process on the same machine
  run();
  EXPECT_EQ(gemm_route_trials(), 0) << "read from the wisdom file";
  const auto loaded = gemm_route_decisions();
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_TRUE(loaded[0].from_wisdom);
  EXPECT_EQ(loaded[0].library, decisions[0].library);
  EXPECT_EQ(count_lines(wisdom), 1);

  // Another thread count is another decision (2 where the process runs on 1: OMP_NUM_THREADS=1);
  // a small product none.
  {
    test::ScopedThreads other(num_threads() == 1 ? 2 : 1);
    run();
  }
  EXPECT_EQ(gemm_route_trials(), 1);
  const Case small{64, 64, 64, true, false, 1.0f, 0.0f, 0};
  const Operands so = make_operands(small, 6, false);
  std::vector<float> small_out = so.c0;
  gemm({so.a.data(), 64, 64, so.lda, true}, {so.b.data(), 64, 64, so.ldb, false}, small_out.data(), so.ldc);
  EXPECT_EQ(gemm_route_trials(), 1);
  EXPECT_EQ(count_lines(wisdom), 2);

  // A line written for another machine (CPU or library versions) is not used.
  std::filesystem::remove(wisdom);
  std::ofstream(wisdom) << "Some Other CPU | oneDNN 9.9.9 | OpenBLAS x\t" << decisions[0].key << "\tOpenBLAS\t1\t0.5\n";
  reset_gemm_routes(wisdom);
  run();
  EXPECT_EQ(gemm_route_trials(), 1);
  reset_gemm_routes("off");
}

// The decision from scripted trial times: each library's timed calls (every second call; the
// others warm up) return the next value of its list. OpenBLAS needs the better best time and the
// margin in three of the four rounds, so one fast call (or one slowed oneDNN call) does not win.
GemmLibrary decide(const std::vector<double>& onednn_ms, const std::vector<double>& openblas_ms) {
  reset_gemm_routes("off");
  int calls[2] = {0, 0};
  const GemmTrial trial = [&](GemmLibrary library) {
    const int lib = library == GemmLibrary::kOneDnn ? 0 : 1;
    const std::vector<double>& times = lib == 0 ? onednn_ms : openblas_ms;
    const int call = calls[lib]++;
    return call % 2 == 0 ? 1.0 : times.at(static_cast<size_t>(call / 2)) * 1e-3;  // warm-ups: 1 s
  };
  const GemmShape shape{true, false, 1024, 256, 4096, 1024, 256, 256, 2};
  const GemmLibrary library = gemm_route(shape, trial);
  EXPECT_EQ(calls[0], 2 * kGemmRouteRounds);
  EXPECT_EQ(calls[1], 2 * kGemmRouteRounds);
  EXPECT_EQ(gemm_route_trials(), 1);
  const auto decisions = gemm_route_decisions();
  EXPECT_EQ(decisions.size(), 1u);
  reset_gemm_routes("off");
  return library;
}

TEST(GemmRoute, OpenBlasMustWinMostRoundsNotOneCall) {
  EXPECT_EQ(decide({10, 10, 10, 10}, {5, 5, 5, 5}), GemmLibrary::kOpenBlas);
  EXPECT_EQ(decide({10, 10, 10, 10}, {5, 5, 5, 20}), GemmLibrary::kOpenBlas) << "three rounds of four";
  EXPECT_EQ(decide({10, 10, 10, 10}, {5, 20, 20, 20}), GemmLibrary::kOneDnn) << "one lucky call";
  EXPECT_EQ(decide({10, 40, 40, 10}, {20, 20, 20, 20}), GemmLibrary::kOneDnn) << "two slowed oneDNN calls";
  EXPECT_EQ(decide({10, 10, 10, 10}, {9.5, 9.5, 9.5, 9.5}), GemmLibrary::kOneDnn) << "within the margin";
  EXPECT_EQ(decide({10, 10, 10, 10}, {20, 20, 20, 20}), GemmLibrary::kOneDnn);
}

TEST(GemmRoute, PinnedLibraryIsNeverTimed) {
  reset_gemm_routes("off");
  set_gemm_library_override(GemmLibrary::kOpenBlas);
  const Case c{256, 256, 300, false, false, 1.0f, 0.0f, 0};
  const Operands o = make_operands(c, 7, false);
  std::vector<float> out = o.c0;
  gemm({o.a.data(), c.M, c.K, o.lda, c.ta}, {o.b.data(), c.K, c.N, o.ldb, c.tb}, out.data(), o.ldc);
  EXPECT_EQ(gemm_route_trials(), 0);
  EXPECT_NE(gemm_route_summary().find("OpenBLAS (pinned)"), std::string::npos) << gemm_route_summary();
  set_gemm_library_override(std::nullopt);
}

}  // namespace
}  // namespace cabm
