// `cabm bench attention` and `cabm memory` end to end on tiny cases: the text table, the JSON
// form, the memory estimate against the model's own parameter list, and bad flags (one line on
// stderr, non-zero exit).
#include "cabm/kernels/attention/flash.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/machine_wisdom.h"
#include "cabm/kernels/openblas_core.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/parameters.h"
#include "cabm/train/lm_trainer.h"
#include "cabm/train/train_config.h"
#include "util/test_util.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace cabm {
namespace {

using test::CmdResult;
using test::expect_one_line_error;

CmdResult cabm(const std::string& args) { return test::run_cabm(args); }

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

// The variables that pin the kernels' paths (CABM_SIMD_ISA, CABM_FORCE_PORTABLE, CABM_BF16_PRODUCTS,
// CABM_NO_AMX), cleared for the child processes of a test whose oracle is this CPU's own choice,
// so that it holds under scripts/imitated_cpu_check.sh's profiles and a user's pins.
struct UnpinnedPaths {
  test::ScopedEnv simd{"CABM_SIMD_ISA", nullptr}, portable{"CABM_FORCE_PORTABLE", nullptr},
      products{"CABM_BF16_PRODUCTS", nullptr}, amx{"CABM_NO_AMX", nullptr};
};

TEST(CliBench, AttentionTable) {
  const CmdResult r = cabm("bench attention --n 64 --d 16 --repeats 1 --backward");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "attention kernel: flash (")) << r.out;
  EXPECT_TRUE(contains(r.out, "FMA peak")) << r.out;
  EXPECT_TRUE(contains(r.out, "GFLOP/s")) << r.out;
  for (const char* mask : {"none", "causal", "window", "bigbird"}) EXPECT_TRUE(contains(r.out, mask)) << r.out;
  EXPECT_TRUE(contains(r.out, "backward")) << r.out;
}

TEST(CliBench, AttentionJson) {
  const CmdResult r = cabm("bench attention --n 64,96 --d 16 --masks none,causal --repeats 1 --json --heads 2");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.at("kernel_isa").is_string());
  EXPECT_GT(j.at("peak_gflops").get<double>(), 0.0);
  EXPECT_EQ(j.at("heads").get<int64_t>(), 2);
  EXPECT_EQ(j.at("threads").get<int>(), 2);
  const auto& cases = j.at("cases");
  ASSERT_EQ(cases.size(), 4u);
  for (const auto& c : cases) {
    EXPECT_GT(c.at("gflops").get<double>(), 0.0);
    EXPECT_GT(c.at("time_ms").get<double>(), 0.0);
    EXPECT_GT(c.at("percent_peak").get<double>(), 0.0);
    EXPECT_GE(c.at("memory_bytes").get<int64_t>(), 0);
    EXPECT_EQ(c.at("pass").get<std::string>(), "forward");
    EXPECT_GT(c.at("speedup_vs_reference").get<double>(), 0.0);  // N <= 2048: the reference ran
    const int64_t N = c.at("N").get<int64_t>();
    const double pairs = c.at("mask") == "none" ? double(N) * N : 0.5 * double(N) * (N + 1);
    EXPECT_DOUBLE_EQ(c.at("flops").get<double>(), 4.0 * 1 * 2 * 16 * pairs);
  }
}

// `padding`: an additive [B, 1, 1, N] tensor with the last N/4 keys −inf, credited N·(N − N/4)
// pairs per head; the reference ran on the same mask (speedup defined) and so did bf16.
TEST(CliBench, AttentionPaddingMask) {
  const CmdResult r =
      cabm("bench attention --n 64,97 --d 16 --masks padding --repeats 1 --json --heads 2 --batch 2 --precision both");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const auto& cases = j.at("cases");
  ASSERT_EQ(cases.size(), 2u);
  for (const auto& c : cases) {
    EXPECT_EQ(c.at("mask").get<std::string>(), "padding");
    const int64_t N = c.at("N").get<int64_t>();
    EXPECT_DOUBLE_EQ(c.at("flops").get<double>(), 4.0 * 2 * 2 * 16 * double(N) * double(N - N / 4));
    EXPECT_GT(c.at("speedup_vs_reference").get<double>(), 0.0);
  }
  const CmdResult bad = cabm("bench attention --masks pading");
  EXPECT_NE(bad.status, 0);
  EXPECT_TRUE(contains(bad.err, "padding")) << bad.err;
}

TEST(CliMemory, EstimateAndMeasurement) {
  const CmdResult r = cabm("memory --layers 2 --d-model 32 --heads 4 --d-ff 64 --vocab 50 --seq-len 16 --batch-size 2");
  ASSERT_EQ(r.status, 0) << r.err;
  TrainConfig config;
  config.layers = 2;
  config.d_model = 32;
  config.heads = 4;
  config.d_ff = 64;
  config.seq_len = 16;
  CausalLMConfig mc = lm_model_config(config);
  mc.vocab_size = 50;
  const CausalLM model = make_causal_lm(mc);
  int64_t count = 0;
  for (const NamedTensor& p : named_parameters(model)) count += p.tensor.numel();
  EXPECT_TRUE(contains(r.out, "parameters: " + std::to_string(count) + " = ")) << r.out;
  for (const char* line :
       {"gradients:", "AdamW state:", "saved activations per layer", "attention scores/weights", "reference path",
        "tiled (flash) path", "estimated step total", "MEASURED", "peak RSS increase:"})
    EXPECT_TRUE(contains(r.out, line)) << line << "\n" << r.out;
}

// CABM_BF16_PRODUCTS pins the bf16 kernels' products (kernels/bf16.h) where the CPU has
// AVX512_BF16 without AMX, and a value it does not know is a one-line error on every CPU.
TEST(CliBench, Bf16ProductsPin) {
  const UnpinnedPaths unpinned;
  const auto bf16_path = [&](const char* pin) {
    const test::ScopedEnv env_pin("CABM_BF16_PRODUCTS", pin);
    const CmdResult r = cabm("bench attention --n 64 --d 16 --masks none --repeats 1 --json --precision both");
    EXPECT_EQ(r.status, 0) << pin << ": " << r.err;
    if (r.status != 0) return std::string();
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const std::string path = j.at("bf16_path").get<std::string>(), products = j.at("bf16_products").get<std::string>();
    // The summary names the unit of the path and, where a pin decided it, the pin.
    const auto starts = [&](const std::string& unit) { return products.rfind(unit, 0) == 0; };
    std::string unit;  // the portable path's line is not checked here
    if (path == "avx512_bf16") unit = "vdpbf16ps (";
    if (path.find("_fp32") != std::string::npos) unit = "fp32 FMAs on widened bf16 (";
    if (path == "amx_bf16") unit = "AMX tiles (";
    EXPECT_TRUE(starts(unit)) << path << ": " << products;
    const bool pinned = std::string(pin) != "auto" && path != "portable";
    if (pinned && cpu_has_avx512_bf16() && !cpu_has_amx_bf16()) {
      EXPECT_NE(products.find("CABM_BF16_PRODUCTS"), std::string::npos) << products;
    }
    return path;
  };
  {
    const test::ScopedEnv bad("CABM_BF16_PRODUCTS", "bf16");
    expect_one_line_error(cabm("bench attention --n 64 --d 16 --masks none --repeats 1 --precision both"),
                          "CABM_BF16_PRODUCTS");
  }
  const std::string automatic = bf16_path("auto"), vdp = bf16_path("vdpbf16ps"), fp32 = bf16_path("fp32");
  if (!cpu_has_avx512_bf16() || cpu_has_amx_bf16()) {
    EXPECT_EQ(vdp, automatic);
    EXPECT_EQ(fp32, automatic);
    GTEST_SKIP() << "the pin chooses nothing on this CPU (AVX512_BF16 " << (cpu_has_avx512_bf16() ? "with" : "without")
                 << " AMX): every run took " << automatic;
  }
  EXPECT_EQ(vdp, "avx512_bf16");
  EXPECT_EQ(fp32, std::string(widest_simd_isa() == SimdIsa::kAvx512 ? "avx512" : "avx2") + "_fp32");
  EXPECT_TRUE(automatic == vdp || automatic == fp32) << automatic;
}

// CABM_MAX_CPU_ISA caps what cabm sees of the CPU (cpu_isa.h): under each cap the attention
// kernels and the bf16 path are the ones a CPU with no more than that would take, a cap above the
// CPU changes nothing, and an unknown value, or a CABM_SIMD_ISA above the cap, is a one-line error
// naming the variable. Caps above one this process runs under are left out (its own answers are
// the oracle).
TEST(CliBench, MaxCpuIsaCapsTheKernels) {
  const UnpinnedPaths unpinned;
  const char* ambient = std::getenv("CABM_MAX_CPU_ISA");
  const std::string ambient_name = ambient ? ambient : "";
  const auto run = [&](const char* cap, const char* simd_isa = nullptr) {
    const test::ScopedEnv capped("CABM_MAX_CPU_ISA", cap), pinned("CABM_SIMD_ISA", simd_isa);
    return cabm("bench attention --n 64 --d 16 --masks none --repeats 1 --json --precision both");
  };
  const std::string uncapped_bf16 = [&] {
    const CmdResult r = run(ambient ? ambient_name.c_str() : nullptr);
    EXPECT_EQ(r.status, 0) << r.err;
    if (r.status != 0) return std::string();
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.value("max_cpu_isa", ""), ambient ? ambient_name : std::string("none"));
    return j.value("bf16_path", "");
  }();
  struct Cap {
    const char* name;
    CpuIsaCap cap;
  };
  for (const Cap c :
       {Cap{"portable", CpuIsaCap::kPortable}, Cap{"avx2", CpuIsaCap::kAvx2}, Cap{"avx512", CpuIsaCap::kAvx512},
        Cap{"avx512_bf16", CpuIsaCap::kAvx512Bf16}, Cap{"amx_bf16", CpuIsaCap::kAmxBf16}}) {
    if (c.cap > cpu_isa_cap()) {
      std::printf("skipped: CABM_MAX_CPU_ISA=%s (this process runs under CABM_MAX_CPU_ISA=%s)\n", c.name,
                  ambient_name.c_str());
      continue;
    }
    const CmdResult r = run(c.name);
    EXPECT_EQ(r.status, 0) << c.name << ": " << r.err;
    if (r.status != 0) continue;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.value("max_cpu_isa", ""), c.name);
    SimdIsa isa = widest_simd_isa();
    if (static_cast<int>(c.cap) < static_cast<int>(isa)) isa = static_cast<SimdIsa>(static_cast<int>(c.cap));
    EXPECT_EQ(j.value("kernel_isa", ""), simd_isa_name(isa)) << c.name;
    const std::string bf16 = j.value("bf16_path", "");
    if (c.cap == CpuIsaCap::kAmxBf16) {
      EXPECT_EQ(bf16, uncapped_bf16) << c.name;
    } else if (c.cap == CpuIsaCap::kAvx512Bf16 && cpu_has_avx512_bf16()) {
      EXPECT_TRUE(bf16 == "avx512_bf16" || bf16 == "avx512_fp32") << c.name << ": " << bf16;
    } else {  // no bf16 unit under the cap: the fp32 SIMD path of the capped set, or portable code
      EXPECT_EQ(bf16, isa == SimdIsa::kPortable ? std::string("portable") : std::string(simd_isa_name(isa)) + "_fp32")
          << c.name;
    }
    std::printf("CABM_MAX_CPU_ISA=%s: %s kernels, bf16 path %s\n", c.name, simd_isa_name(isa), bf16.c_str());
  }
  expect_one_line_error(run("avx512bf16"), "CABM_MAX_CPU_ISA");
  if (cpu_supports(SimdIsa::kAvx2)) expect_one_line_error(run("portable", "avx2"), "CABM_SIMD_ISA");
}

// The measurements that choose the attention tiles and the bf16 unit come from the wisdom file
// when it has them for this machine, so that every process computes alike: a planted value
// decides, and the bench names where it came from.
TEST(CliBench, MachineValuesFromTheWisdomFile) {
  const UnpinnedPaths unpinned;
  const std::string file = test::temp_dir() + "/cli_machine_values.tsv";
  const auto run = [&](double fmas, double rate) {
    std::filesystem::remove(file);
    std::ofstream(file) << wisdom::machine() << "\tvalue avx512_fmas_per_cycle\t" << fmas << "\n"
                        << wisdom::machine() << "\tvalue vdpbf16ps_to_fma_rate\t" << rate << "\n";
    const test::ScopedEnv wisdom_file("CABM_GEMM_WISDOM", file.c_str());
    // This process's OpenBLAS kernels for cabm's too: they are part of the machine's name.
    const test::ScopedEnv blas("OPENBLAS_CORETYPE", openblas_core().c_str());
    const CmdResult r = cabm("bench attention --n 64 --d 16 --masks none --repeats 1 --json --precision both");
    EXPECT_EQ(r.status, 0) << r.err;
    return r.status == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
  };
  const nlohmann::json one = run(1, 0.5), two = run(2, 2);
  const std::string values = one.value("machine_values", "");
  EXPECT_TRUE(contains(values, file)) << values;
  // The FMA pipes are read only where they could choose the fp32 tiles: flash.cpp's rule looks at
  // the L1d first, and on a 32 KiB one (Zen 3, Zen 4) the value decides nothing and is not named.
  if (cpu_supports(SimdIsa::kAvx512) && cpu_l1d_bytes() >= kFlashSquareTilesMinL1dBytes) {
    EXPECT_TRUE(contains(values, "avx512_fmas_per_cycle 1 (from the file)")) << values;
    EXPECT_TRUE(contains(two.value("machine_values", ""), "avx512_fmas_per_cycle 2 (from the file)"));
  } else {
    EXPECT_FALSE(contains(values, "avx512_fmas_per_cycle")) << values;
  }
  if (!cpu_has_avx512_bf16() || cpu_has_amx_bf16())
    GTEST_SKIP() << "the vdpbf16ps rate chooses nothing on this CPU (AVX512_BF16 "
                 << (cpu_has_avx512_bf16() ? "with" : "without") << " AMX)";
  EXPECT_TRUE(contains(values, "vdpbf16ps_to_fma_rate 0.5 (from the file)")) << values;
  EXPECT_EQ(one.value("bf16_path", ""),
            std::string(widest_simd_isa() == SimdIsa::kAvx512 ? "avx512" : "avx2") + "_fp32");
  EXPECT_EQ(two.value("bf16_path", ""), "avx512_bf16");
}

// The CLI asks OpenBLAS for the kernels of the CPU's SIMD set where OpenBLAS took its generic
// ones (cli/main.cpp, kernels/openblas_core.h), unless OPENBLAS_CORETYPE is set; the routes line
// names the kernels that ran.
TEST(CliBench, OpenBlasRunsTheKernelsOfTheCpu) {
  const CmdResult r = cabm("bench layer --batch 1 --seq-len 8 --d-model 16 --heads 2 --d-ff 32 --repeats 1");
  ASSERT_EQ(r.status, 0) << r.err;
  const SimdIsa best = widest_simd_isa();
  const char* asked = std::getenv("OPENBLAS_CORETYPE") ? nullptr : openblas_core_to_request(openblas_core(), best);
  const std::string expected = asked != nullptr ? asked : openblas_core();
  EXPECT_TRUE(contains(r.out, "; OpenBLAS runs its " + expected + " kernels")) << r.out;
}

TEST(CliBench, BadFlags) {
  expect_one_line_error(cabm("bench attention --n 0"), "--n");
  expect_one_line_error(cabm("bench attention --masks diagonal"), "diagonal");
  expect_one_line_error(cabm("bench attention --repeats x"), "--repeats");
  expect_one_line_error(cabm("bench"), "error");
  expect_one_line_error(cabm("memory --d-model 30 --heads 4"), "");
  expect_one_line_error(cabm("memory --vocab 0"), "--vocab");
  expect_one_line_error(cabm("memory --layers"), "--layers");
}

}  // namespace
}  // namespace cabm
